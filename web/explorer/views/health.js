// `#/health`: is the gateway ready (every storage master answers `/readyz`),
// which clusters hold which shards (the topology version each datastore is
// served from, and the shard moves in progress), how far each datastore's indexes lag
// behind its cells, the progress of indexes being built, and the writes buffered while a primary was down
// (`/metrics`, and `Query.datastores` for the topology). Refreshed every few seconds.

import { h, replace, tableWrap, uid, errorBox } from '../dom.js';
import { loadCatalog, loadTopology, getText } from '../api.js';
import { parseMetrics, datastoreHealth, bufferHealth, breakers, replicaLag, indexBuilds, sample } from '../metrics.js';
import { clock, plural } from '../format.js';
import { moveText } from '../topology.js';

const REFRESH_MS = 5000;

export async function healthPage(main, _match, ctx) {
  const catalog = await loadCatalog();
  ctx.setTitle('Health');
  const readiness = h('div');
  const clusters = h('div');
  const moves = h('div');
  const lag = h('div');
  const builds = h('div');
  const buffers = h('div');
  const updated = h('p', { class: 'hint' });
  const autoId = uid('auto');
  const auto = h('input', { id: autoId, type: 'checkbox', checked: true });
  let timer = null;
  let stopped = false;
  let lastReady = null;

  async function refresh() {
    try {
      const [ready, metrics, topology] = await Promise.all([
        getText('readyz', { signal: ctx.signal }),
        getText('metrics', { signal: ctx.signal }),
        loadTopology({ signal: ctx.signal }),
      ]);
      const isReady = ready.ok;
      replace(
        readiness,
        h(
          'p',
          { class: `state ${isReady ? 'ok' : 'bad'}` },
          h('strong', {}, isReady ? 'Ready' : 'Not ready'),
          isReady
            ? ': every storage cluster’s master answers.'
            : `: at least one storage cluster’s master does not answer (readiness check answered HTTP ${ready.status}).`,
        ),
      );
      if (lastReady !== null && lastReady !== isReady) ctx.announce(isReady ? 'The gateway is ready again.' : 'The gateway is not ready.');
      lastReady = isReady;
      replace(moves, topologyTable(catalog, topology));
      if (!metrics.ok) {
        replace(clusters, clusterTable(catalog, topology, isReady, null));
        throw new Error(`/metrics answered HTTP ${metrics.status}`);
      }
      const samples = parseMetrics(metrics.text);
      definitionsLine(readiness, samples);
      replace(clusters, clusterTable(catalog, topology, isReady, samples));
      replace(lag, lagTable(catalog, samples));
      replace(builds, buildsList(samples));
      replace(buffers, bufferTable(catalog, samples));
      updated.textContent = `Updated at ${clock()}.`;
    } catch (error) {
      if (error.name !== 'AbortError') replace(lag, errorBox(error));
    }
  }

  const schedule = () => {
    window.clearTimeout(timer);
    if (stopped || !auto.checked) return;
    timer = window.setTimeout(async () => {
      if (!document.hidden) await refresh();
      schedule();
    }, REFRESH_MS);
  };
  auto.addEventListener('change', schedule);

  const readyId = uid('ready');
  const clustersId = uid('clusters');
  const movesId = uid('moves');
  const lagId = uid('lag');
  const buffersId = uid('buffers');
  const buildsId = uid('builds');
  replace(
    main,
    h('h1', {}, 'Health'),
    h('div', { class: 'check' }, auto, h('label', { for: autoId }, `Refresh every ${REFRESH_MS / 1000} seconds`)),
    updated,
    h('section', { 'aria-labelledby': readyId }, h('h2', { id: readyId }, 'Readiness'), readiness),
    h('section', { 'aria-labelledby': clustersId }, h('h2', { id: clustersId }, 'Storage clusters'), clusters),
    h(
      'section',
      { 'aria-labelledby': movesId },
      h('h2', { id: movesId }, 'Shard topology'),
      h(
        'p',
        { class: 'hint' },
        h('code', {}, 'cellgate shard move'),
        ' moves a range of shards to another cluster while the gateways serve it. Each step it records (a phase, a new route for the range) makes a new topology version, which every gateway follows.',
      ),
      moves,
    ),
    h(
      'section',
      { 'aria-labelledby': lagId },
      h('h2', { id: lagId }, 'Index lag'),
      h('p', { class: 'hint' }, 'Indexes are updated from the cell log after each write. A shard lags while it has writes its indexes have not applied yet.'),
      lag,
    ),
    h(
      'section',
      { 'aria-labelledby': buildsId },
      h('h2', { id: buildsId }, 'Index builds'),
      h('p', { class: 'hint' }, 'A new index, or a new version of a changed one, is filled from the cell log beside live maintenance; a changed index’s previous version keeps answering the queries it can answer until the new one is complete, then the new one answers.'),
      builds,
    ),
    h(
      'section',
      { 'aria-labelledby': buffersId },
      h('h2', { id: buffersId }, 'Buffered writes'),
      h('p', { class: 'hint' }, 'With two or more clusters, a write whose primary is down is kept in another cluster’s buffer (answered BUFFERED) and replayed into the primary once it answers again.'),
      buffers,
    ),
  );
  await refresh();
  schedule();
  return () => {
    stopped = true;
    window.clearTimeout(timer);
  };
}

function clusterTable(catalog, topology, ready, samples) {
  const byCluster = new Map();
  for (const ds of catalog.datastores) {
    const live = topology.get(ds.name);
    for (const range of live ? live.ranges : ds.topology) {
      if (!byCluster.has(range.cluster)) byCluster.set(range.cluster, []);
      byCluster.get(range.cluster).push(`${ds.name} ${range.first}–${range.last}`);
    }
  }
  return tableWrap(
    'Storage clusters',
    h(
      'table',
      {},
      h('thead', {}, h('tr', {}, ['Cluster', 'Shards', 'Reachable', 'Circuit breakers', 'Replica lag'].map((t) => h('th', { scope: 'col' }, t)))),
      h(
        'tbody',
        {},
        [...byCluster].map(([cluster, ranges]) =>
          h(
            'tr',
            {},
            h('th', { scope: 'row' }, cluster),
            h('td', {}, ranges.join(', ')),
            h('td', {}, ready ? 'yes' : byCluster.size === 1 ? 'no' : 'not all clusters (see the gateway’s log)'),
            h('td', {}, breakerText(samples, cluster)),
            h('td', {}, lagText(samples, cluster)),
          ),
        ),
      ),
    ),
  );
}

function topologyTable(catalog, topology) {
  return tableWrap(
    'Topology per datastore',
    h(
      'table',
      {},
      h('thead', {}, h('tr', {}, ['Datastore', 'Topology version', 'Shard move'].map((t) => h('th', { scope: 'col' }, t)))),
      h(
        'tbody',
        {},
        catalog.datastores.map((ds) => {
          const live = topology.get(ds.name);
          return h(
            'tr',
            {},
            h('th', { scope: 'row' }, ds.name),
            h('td', {}, live ? String(live.version) : '–'),
            h('td', {}, (live && moveText(live.move)) || 'none'),
          );
        }),
      ),
    ),
  );
}

function breakerText(samples, cluster) {
  if (samples === null) return '–';
  const nodes = breakers(samples, cluster);
  if (nodes.length === 0) return 'none (a file database)';
  return nodes.map((n) => `${n.node}: ${n.state}`).join(', ');
}

function lagText(samples, cluster) {
  if (samples === null) return '–';
  const replicas = replicaLag(samples, cluster);
  if (replicas.length === 0) return 'no replicas';
  return replicas
    .map((r) => `${r.node}: ${plural(r.cells, 'cell', 'cells')} behind, ${r.seconds === null ? '?' : `${r.seconds.toFixed(1)} s`}`)
    .join(', ');
}

function lagTable(catalog, samples) {
  const rows = datastoreHealth(
    samples,
    catalog.datastores.map((d) => d.name),
  );
  const delay = (q) => sample(samples, 'cellgate_index_delay_microseconds', { quantile: q });
  const p50 = delay('0.5');
  const p99 = delay('0.99');
  return h(
    'div',
    {},
    tableWrap(
      'Index lag per datastore',
      h(
        'table',
        { class: 'lag-table' },
        h(
          'thead',
          {},
          h('tr', {}, ['Datastore', 'Index state', 'Lagging shards', 'Largest lag', 'Cells written since start'].map((t) => h('th', { scope: 'col' }, t))),
        ),
        h(
          'tbody',
          {},
          rows.map((r) =>
            h(
              'tr',
              {},
              h('th', { scope: 'row' }, r.name),
              h('td', {}, r.laggingShards === null ? 'unknown' : r.laggingShards === 0 ? 'up to date' : 'catching up'),
              h('td', {}, r.laggingShards === null ? '–' : String(r.laggingShards)),
              h('td', {}, r.maxLagMs === null ? '–' : `${r.maxLagMs} ms`),
              h('td', {}, r.cellsWritten === null ? '–' : String(r.cellsWritten)),
            ),
          ),
        ),
      ),
    ),
    p50 !== null && p99 !== null
      ? h(
          'p',
          {},
          `Delay from a cell’s commit to its index update since the gateway started: median ${formatMicros(p50)}, 99th percentile ${formatMicros(p99)} (${plural(sample(samples, 'cellgate_index_delay_samples_total') || 0, 'update', 'updates')} measured).`,
        )
      : null,
  );
}

function duration(seconds) {
  const s = Math.ceil(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function buildsList(samples) {
  const builds = indexBuilds(samples);
  if (builds.length === 0) return h('p', {}, 'No index is being built: every index is ready.');
  return h(
    'ul',
    { class: 'builds' },
    builds.map((b) => {
      const id = uid('build');
      const figures =
        b.total === null
          ? `${plural(b.pending, 'cell', 'cells')} to go (total not measured yet)`
          : `${b.done} of ${b.total} cells (${b.total > 0 ? ((b.done * 100) / b.total).toFixed(1) : '100.0'} %)`;
      const speed =
        b.rate === null
          ? 'rate not measured yet'
          : `${Math.round(b.rate)} cells/s, ${b.etaSeconds === null ? 'ETA unknown' : `about ${duration(b.etaSeconds)} left`}`;
      return h(
        'li',
        {},
        h('span', { id }, `${b.datastore}.${b.index}${b.version === null ? '' : ` v${b.version}`}: `),
        b.total === null
          ? h('progress', { 'aria-labelledby': id })
          : h('progress', { 'aria-labelledby': id, max: String(Math.max(b.total, 1)), value: String(b.done) }),
        ` ${figures}; ${speed}.`,
        b.previous === null
          ? ' Queries on it answer INDEX_BUILDING until it is complete.'
          : ` Version ${b.previous} answers the queries it can answer until then.`,
      );
    }),
  );
}

function bufferTable(catalog, samples) {
  const rows = bufferHealth(
    samples,
    catalog.datastores.map((d) => d.name),
  ).flatMap((ds) =>
    ds.clusters.map((c) => ({ ...c, name: ds.name, replayed: ds.replayed, released: ds.released, conflicts: ds.conflicts })),
  );
  if (rows.length === 0) return h('p', {}, 'No buffers: this gateway has one storage cluster.');
  return tableWrap(
    'Buffered writes per datastore and cluster',
    h(
      'table',
      {},
      h(
        'thead',
        {},
        h('tr', {}, ['Datastore', 'Buffer on cluster', 'Waiting cells', 'Of them for replicas', 'Oldest', 'Replayed since start', 'Released since start', 'Conflicts since start'].map((t) => h('th', { scope: 'col' }, t))),
      ),
      h(
        'tbody',
        {},
        rows.map((r) =>
          h(
            'tr',
            {},
            h('th', { scope: 'row' }, r.name),
            h('td', {}, r.cluster),
            h('td', {}, String(r.cells)),
            h('td', {}, r.awaitingReplicas === null ? '–' : String(r.awaitingReplicas)),
            h('td', {}, r.cells > 0 && r.oldestSeconds !== null ? `${r.oldestSeconds} s` : '–'),
            h('td', {}, r.replayed === null ? '–' : String(r.replayed)),
            h('td', {}, r.released === null ? '–' : String(r.released)),
            h('td', {}, r.conflicts === null ? '–' : String(r.conflicts)),
          ),
        ),
      ),
    ),
  );
}

function formatMicros(us) {
  return us >= 1000 ? `${(us / 1000).toFixed(1)} ms` : `${us} µs`;
}

// After a reload that failed, the gateway still serves the previous
// definitions; says so under the readiness line.
function definitionsLine(readiness, samples) {
  if (sample(samples, 'cellgate_definitions_latest') !== 0) return;
  readiness.append(
    h(
      'p',
      { class: 'state bad' },
      h('strong', {}, 'Definitions not reloaded'),
      ': the last reload of the definitions failed, so the gateway still serves the previous ones (the gateway log and the output of cellgate reload say why).',
    ),
  );
}
