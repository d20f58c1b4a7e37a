// Reads the gateway's `/metrics` (OpenMetrics text) into samples. Pure, so
// it is unit-tested in Node.

/**
 * Returns Map(metric name → [{ labels, value }]). Comment lines (# HELP,
 * # TYPE, # EOF) are skipped; label values are unescaped.
 */
export function parseMetrics(text) {
  const samples = new Map();
  for (const raw of text.split('\n')) {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) continue;
    const match = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!match) continue;
    const [, name, , labelText, valueText] = match;
    const labels = labelText ? parseLabels(labelText) : {};
    const value = Number(valueText);
    if (!samples.has(name)) samples.set(name, []);
    samples.get(name).push({ labels, value });
  }
  return samples;
}

function parseLabels(text) {
  const labels = {};
  const re = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?\s*/g;
  let match;
  while ((match = re.exec(text)) !== null) {
    labels[match[1]] = match[2].replace(/\\(.)/g, (_, c) => (c === 'n' ? '\n' : c));
  }
  return labels;
}

/** The value of the sample of `name` whose labels include `labels`, or null. */
export function sample(samples, name, labels = {}) {
  const found = (samples.get(name) || []).find((s) =>
    Object.entries(labels).every(([k, v]) => s.labels[k] === v),
  );
  return found ? found.value : null;
}

/**
 * The indexes being built from the cell log: per datastore and index, the
 * cells pending, the total the build reads (null before it is measured),
 * the cells done, the rate (cells/s over the last 10 s) and the ETA in
 * seconds (null while unknown), the version built and the previous version
 * answering queries meanwhile (null when there is none).
 */
export function indexBuilds(samples) {
  return (samples.get('cellgate_index_building_pending_cells') || []).map(({ labels, value }) => {
    const key = { datastore: labels.datastore, index: labels.index };
    const total = sample(samples, 'cellgate_index_building_total_cells', key);
    return {
      ...key,
      version: sample(samples, 'cellgate_index_version', { ...key, state: 'building' }),
      previous: sample(samples, 'cellgate_index_version', { ...key, state: 'previous' }),
      pending: value,
      total,
      done: total === null ? null : Math.max(0, total - value),
      rate: sample(samples, 'cellgate_index_building_rate_cells_per_second', key),
      etaSeconds: sample(samples, 'cellgate_index_building_eta_seconds', key),
    };
  });
}

/**
 * Per datastore: lagging shards, the largest lag, cells written and
 * duplicates since the gateway started.
 */
export function datastoreHealth(samples, names) {
  return names.map((name) => ({
    name,
    laggingShards: sample(samples, 'cellgate_index_lagging_shards', { datastore: name }),
    maxLagMs: sample(samples, 'cellgate_index_lag_max_ms', { datastore: name }),
    cellsWritten: sample(samples, 'cellgate_cells_written_total', { datastore: name }),
    duplicates: sample(samples, 'cellgate_cells_duplicate_total', { datastore: name }),
  }));
}

/**
 * Per datastore and cluster holding buffered writes: the cells waiting for
 * their primary (or for its replicas) and the age of the oldest (from the
 * latest count), those of them waiting for replicas only, and per
 * datastore the cells replayed, the copies released and the conflicts
 * recorded since the gateway started. Empty `clusters` with one storage
 * cluster.
 */
export function bufferHealth(samples, names) {
  const byDatastore = (name) =>
    (samples.get('cellgate_buffered_cells') || [])
      .filter((s) => s.labels.datastore === name)
      .map((s) => ({
        cluster: s.labels.cluster,
        cells: s.value,
        oldestSeconds: sample(samples, 'cellgate_buffered_oldest_seconds', { datastore: name, cluster: s.labels.cluster }),
        awaitingReplicas: sample(samples, 'cellgate_buffered_awaiting_replicas', { datastore: name, cluster: s.labels.cluster }),
      }));
  return names.map((name) => ({
    name,
    clusters: byDatastore(name),
    replayed: sample(samples, 'cellgate_buffer_replayed_cells_total', { datastore: name }),
    released: sample(samples, 'cellgate_buffer_released_copies_total', { datastore: name }),
    conflicts: sample(samples, 'cellgate_buffer_conflicts_total', { datastore: name }),
  }));
}

const BREAKER_STATES = ['closed', 'half-open', 'open'];

/**
 * The lag of each replica of `cluster`: `{ node, cells, seconds }`, the
 * cells it has not applied yet and how long ago the master had no more.
 * Empty without replicas.
 */
export function replicaLag(samples, cluster) {
  const seconds = samples.get('cellgate_replica_lag_seconds') || [];
  return (samples.get('cellgate_replica_lag_cells') || [])
    .filter((s) => s.labels.cluster === cluster)
    .map((s) => ({
      node: s.labels.node,
      cells: s.value,
      seconds: (seconds.find((t) => t.labels.cluster === cluster && t.labels.node === s.labels.node) || { value: null }).value,
    }));
}

/**
 * The circuit breaker of each database server of `cluster`: `{ node,
 * state }` with state `closed`, `half-open` or `open`. Empty for SQLite
 * files, which have none.
 */
export function breakers(samples, cluster) {
  return (samples.get('cellgate_node_breaker_state') || [])
    .filter((s) => s.labels.cluster === cluster)
    .map((s) => ({ node: s.labels.node, state: BREAKER_STATES[s.value] || 'unknown' }));
}
