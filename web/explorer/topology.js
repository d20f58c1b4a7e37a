// Where each datastore's shards live now: the stored topology version the
// gateway serves, the shard ranges per cluster and the shard move recorded
// (`cellgate shard move`), from `Query.datastores`. Unlike the catalog it is
// read again by the pages that show it, since a move changes it while the
// gateway serves. Pure (no fetch, no DOM), so it is tested in Node against a
// running gateway; `api.js` loads it.

export const TOPOLOGY_QUERY = `query ExplorerTopology {
  datastores {
    name
    topologyVersion
    topology { first last cluster }
    move { first last source target phase startedAt cellsCopied keepSource }
  }
}`;

/** Map(datastore name → { version, ranges, move }) from TOPOLOGY_QUERY's data. */
export function buildTopology(data) {
  return new Map(
    data.datastores.map((ds) => [ds.name, { version: ds.topologyVersion, ranges: ds.topology, move: ds.move }]),
  );
}

/**
 * The sentence that tells a recorded shard move, or null without one. A
 * move kept with `--keep-source` stays recorded at phase `done` until it is
 * finished or the range is moved back.
 */
export function moveText(move) {
  if (!move) return null;
  const shards = `shards ${move.first}–${move.last}`;
  // To the second: the gateway gives nanoseconds.
  const started = move.startedAt.replace(/\.\d+Z$/, 'Z');
  if (move.phase === 'done') {
    return `Moved ${shards} from ${move.source} to ${move.target}, keeping the copy on ${move.source} (started ${started}): run the move again without --keep-source to delete it, or move the range back.`;
  }
  const cells = Number(move.cellsCopied);
  const copied = cells > 0 ? `, ${cells} ${cells === 1 ? 'cell' : 'cells'} copied` : '';
  return `Moving ${shards} from ${move.source} to ${move.target}: phase ${move.phase} (started ${started}${copied}).`;
}
