// `#/triggers`: the trigger consumers running in this gateway, per
// datastore (`<ds> { triggers }`, an admin field): kind, columns followed,
// state, how far each is behind the cell log (per cluster, and the shards
// that lag, most behind first), and its quarantined cells with a button that
// has them delivered again (`<ds>RetryTriggerQuarantine`). Refreshed every
// few seconds; a refresh that changes nothing leaves the page as it is, so
// focus and open details stay.

import { h, replace, tableWrap, uid, errorBox } from '../dom.js';
import { loadCatalog, graphql } from '../api.js';
import { timestamp, plural, clock } from '../format.js';
import { dsHref } from './breadcrumbs.js';

const REFRESH_MS = 5000;
/** Lagging shards and quarantined cells listed per consumer. */
const SHARDS_SHOWN = 20;
const QUARANTINE_SHOWN = 50;

export function triggersQuery(ds) {
  return `query Triggers {
  ${ds.graphqlField} {
    triggers {
      name kind columns state stoppedReason delivered quarantined quarantineLimit heldBuckets
      lag {
        pendingCells laggingShards
        shards(first: ${SHARDS_SHOWN}) { shard cluster pendingCells }
        clusters { cluster pendingCells laggingShards }
      }
      quarantine(first: ${QUARANTINE_SHOWN}) { shard addedId rowKey column refKey attempts error retry quarantinedAt }
    }
  }
}`;
}

export function retryMutation(ds) {
  return `mutation RetryTriggerQuarantine($trigger: String!) {
  ${ds.graphqlField}RetryTriggerQuarantine(trigger: $trigger) { asked }
}`;
}

export async function triggersPage(main, _match, ctx) {
  const catalog = await loadCatalog();
  ctx.setTitle('Triggers');
  const sections = new Map(catalog.datastores.map((ds) => [ds.name, { box: h('div'), last: null }]));
  const updated = h('p', { class: 'hint' });
  const autoId = uid('auto');
  const auto = h('input', { id: autoId, type: 'checkbox', checked: true });
  let timer = null;
  let stopped = false;
  /** What the last retry of each consumer answered, kept across refreshes. */
  const notes = new Map();

  async function refresh() {
    await Promise.all(
      catalog.datastores.map(async (ds) => {
        const section = sections.get(ds.name);
        let key;
        let content;
        try {
          const data = await graphql(triggersQuery(ds), {}, { signal: ctx.signal });
          const consumers = data[ds.graphqlField].triggers;
          key = JSON.stringify(consumers);
          content = () => consumerList(ds, consumers, { ctx, refresh, notes });
        } catch (error) {
          if (error.name === 'AbortError') return;
          key = `error:${error.message}`;
          content = () =>
            error.codes && error.codes.includes('FORBIDDEN')
              ? h('p', {}, `Your token lacks the admin scope on ${ds.name}, which its triggers need (see Settings).`)
              : errorBox(error);
        }
        if (key !== section.last) {
          section.last = key;
          replace(section.box, content());
        }
      }),
    );
    if (!stopped) updated.textContent = `Updated at ${clock()}.`;
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

  replace(
    main,
    h('h1', {}, 'Triggers'),
    h(
      'p',
      { class: 'lead' },
      'The trigger consumers running in this gateway: webhook triggers of the definitions (',
      h('code', {}, 'datastores/<ds>/triggers/*.yaml'),
      ') and consumers started through the Rust API. Lag and quarantine are read from the datastore, so they include the shards other gateways deliver.',
    ),
    h('div', { class: 'check' }, auto, h('label', { for: autoId }, `Refresh every ${REFRESH_MS / 1000} seconds`)),
    updated,
    catalog.datastores.map((ds) => {
      const id = uid('ds');
      return h(
        'section',
        { 'aria-labelledby': id },
        h('h2', { id }, h('a', { href: dsHref(ds) }, ds.name)),
        sections.get(ds.name).box,
      );
    }),
  );
  await refresh();
  schedule();
  return () => {
    stopped = true;
    window.clearTimeout(timer);
  };
}

function consumerList(ds, consumers, page) {
  if (consumers.length === 0) return h('p', {}, `No trigger consumer of ${ds.name} runs in this gateway.`);
  return consumers.map((c) => consumerSection(ds, c, page));
}

function consumerSection(ds, c, page) {
  const id = uid('trigger');
  const running = c.state === 'RUNNING';
  return h(
    'section',
    { class: 'trigger', 'aria-labelledby': id, 'data-trigger': `${ds.name}/${c.name}` },
    h('h3', { id }, `${ds.name}/${c.name}`),
    h(
      'p',
      { class: `state ${running ? 'ok' : 'bad'}` },
      h('strong', {}, running ? 'Running' : 'Stopped'),
      running ? '' : `: ${c.stoppedReason || 'no reason given'}`,
    ),
    h(
      'dl',
      { class: 'facts' },
      fact('Kind', c.kind === 'WEBHOOK' ? 'webhook' : 'Rust handler'),
      fact('Columns', c.columns.length > 0 ? c.columns.join(', ') : 'every column'),
      fact('Behind the log', `${plural(Number(c.lag.pendingCells), 'cell', 'cells')} on ${plural(c.lag.laggingShards, 'shard', 'shards')}`),
      fact('Delivered by this gateway', String(c.delivered)),
      fact('Quarantined', `${c.quarantined} (stops past ${c.quarantineLimit})`),
      fact('Lease buckets held here', String(c.heldBuckets)),
    ),
    lagTables(ds, c),
    quarantineSection(ds, c, page),
  );
}

function fact(term, value) {
  return [h('dt', {}, term), h('dd', {}, value)];
}

function lagTables(ds, c) {
  const clusters = tableWrap(
    `Lag of ${c.name} per cluster`,
    h(
      'table',
      {},
      h('thead', {}, h('tr', {}, ['Cluster', 'Cells behind', 'Lagging shards'].map((t) => h('th', { scope: 'col' }, t)))),
      h(
        'tbody',
        {},
        c.lag.clusters.map((l) =>
          h('tr', {}, h('th', { scope: 'row' }, l.cluster), h('td', {}, String(l.pendingCells)), h('td', {}, String(l.laggingShards))),
        ),
      ),
    ),
  );
  const shards =
    c.lag.shards.length === 0
      ? h('p', {}, 'No shard lags: every cell has been handled.')
      : [
          h(
            'p',
            { class: 'hint' },
            c.lag.laggingShards > c.lag.shards.length
              ? `The ${c.lag.shards.length} shards furthest behind of ${c.lag.laggingShards}:`
              : 'Lagging shards, furthest behind first:',
          ),
          tableWrap(
            `Lagging shards of ${c.name}`,
            h(
              'table',
              {},
              h('thead', {}, h('tr', {}, ['Shard', 'Cluster', 'Cells behind'].map((t) => h('th', { scope: 'col' }, t)))),
              h(
                'tbody',
                {},
                c.lag.shards.map((s) =>
                  h(
                    'tr',
                    {},
                    h('th', { scope: 'row' }, h('a', { href: dsHref(ds, 'log', String(s.shard)) }, String(s.shard))),
                    h('td', {}, s.cluster),
                    h('td', {}, String(s.pendingCells)),
                  ),
                ),
              ),
            ),
          ),
        ];
  return [h('h4', {}, 'Lag'), clusters, shards];
}

function quarantineSection(ds, c, { ctx, refresh, notes }) {
  const heading = h('h4', {}, 'Quarantine');
  const noteKey = `${ds.name}/${c.name}`;
  const result = h('p', { class: 'hint retry-result' }, notes.get(noteKey) || '');
  if (c.quarantine.length === 0) return [heading, h('p', {}, 'No quarantined cells.'), result];
  const button = h('button', { type: 'button' }, `Retry the quarantined cells of ${c.name}`);
  button.addEventListener('click', async () => {
    button.disabled = true;
    try {
      const data = await graphql(retryMutation(ds), { trigger: c.name }, { signal: ctx.signal });
      const asked = data[`${ds.graphqlField}RetryTriggerQuarantine`].asked;
      const text = `${plural(asked, 'cell', 'cells')} asked to be delivered again; those the handler takes leave the quarantine.`;
      notes.set(noteKey, text);
      replace(result, text);
      ctx.announce(text);
    } catch (error) {
      if (error.name !== 'AbortError') replace(result, errorBox(error));
    } finally {
      button.disabled = false;
    }
    // The quarantine shows the retry asked; the note stays across refreshes.
    window.setTimeout(() => refresh(), 1000);
  });
  return [
    heading,
    h(
      'p',
      {},
      `Cells the handler kept refusing, set aside so their shards move on${c.quarantine.length >= QUARANTINE_SHOWN ? ` (the first ${QUARANTINE_SHOWN})` : ''}:`,
    ),
    tableWrap(
      `Quarantined cells of ${c.name}`,
      h(
        'table',
        { class: 'quarantine-table' },
        h(
          'thead',
          {},
          h('tr', {}, ['Shard', 'Added id', 'Row key', 'Column', 'Attempts', 'Error', 'Quarantined', 'Retry asked'].map((t) => h('th', { scope: 'col' }, t))),
        ),
        h(
          'tbody',
          {},
          c.quarantine.map((q) =>
            h(
              'tr',
              {},
              h('td', {}, h('a', { href: dsHref(ds, 'log', String(q.shard)) }, String(q.shard))),
              h('td', {}, String(q.addedId)),
              h('td', {}, h('a', { class: 'mono', href: dsHref(ds, 'row', q.rowKey) }, q.rowKey)),
              h('td', {}, q.column),
              h('td', {}, String(q.attempts)),
              h('td', { class: 'error-text' }, q.error),
              h('td', {}, timestamp(q.quarantinedAt)),
              h('td', {}, q.retry ? 'yes' : 'no'),
            ),
          ),
        ),
      ),
    ),
    h('div', { class: 'actions' }, button),
    result,
  ];
}
