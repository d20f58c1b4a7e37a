// A second, tiny subgraph next to cellgate: reviews of trips. `Review` is its
// own entity; `TripsRow` is cellgate's entity, referenced by its key only
// (`resolvable: false`): the gateway fetches the trips' fields from cellgate
// with `_entities`. Served by graphql-yoga with @apollo/subgraph's
// buildSubgraphSchema.
//
//   node reviews.mjs --cellgate http://127.0.0.1:8080/graphql [--port 4002]
//
// reviews its first 100 demo trips (found in cellgate's cell logs). The test
// (federation.mjs) imports startReviews and findRowKeys instead.
import { createServer } from 'node:http';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

import { buildSubgraphSchema } from '@apollo/subgraph';
import { parse } from 'graphql';
import { createYoga } from 'graphql-yoga';

export const REVIEWS_SDL = `
extend schema @link(url: "https://specs.apollo.dev/federation/v2.5", import: ["@key"])

scalar UUID

type Review @key(fields: "id") {
  id: ID!
  stars: Int!
  trip: TripsRow!
}

# cellgate's trip row, referenced by its key: its fields come from cellgate.
type TripsRow @key(fields: "rowKey", resolvable: false) {
  rowKey: UUID!
}

type Query {
  # count reviews, of the trips found at start-up in turn
  reviews(count: Int!): [Review!]!
}
`;

/** The i-th review (0-based): its trip is tripKeys[i mod their count]. */
function review(tripKeys, i) {
  return { id: `review-${i + 1}`, stars: 1 + (i % 5), trip: { rowKey: tripKeys[i % tripKeys.length] } };
}

/**
 * Serves the reviews subgraph on host:port (0: a free port); resolves to
 * { url, typeDefs, stop } once it listens.
 *
 * @param {object} o
 * @param {string[]} o.tripKeys row keys of trips stored in cellgate
 */
export async function startReviews({ tripKeys, port = 0, host = '127.0.0.1' }) {
  if (!tripKeys.length) throw new Error('startReviews: no trip row keys');
  const resolvers = {
    Query: {
      reviews: (_, { count }) => Array.from({ length: Math.max(0, count) }, (_, i) => review(tripKeys, i)),
    },
    Review: {
      __resolveReference: ({ id }) => {
        const i = Number(/^review-(\d+)$/.exec(id)?.[1]) - 1;
        return Number.isInteger(i) && i >= 0 ? review(tripKeys, i) : null;
      },
    },
  };
  const schema = buildSubgraphSchema({ typeDefs: parse(REVIEWS_SDL), resolvers });
  const yoga = createYoga({ schema, graphqlEndpoint: '/graphql', logging: false, landingPage: false });
  const server = createServer(yoga);
  await new Promise((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, resolve);
  });
  const url = `http://${host}:${server.address().port}/graphql`;
  const stop = () => new Promise((resolve) => {
    server.closeAllConnections();
    server.close(() => resolve());
  });
  return { url, typeDefs: REVIEWS_SDL, stop };
}

/** POSTs a query to a GraphQL endpoint; the data, or throws with the errors. */
async function graphql(url, query, variables) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ query, variables }),
  });
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    throw new Error(`${url}: HTTP ${res.status} ${text.slice(0, 300)}`);
  }
  if (json.errors || !json.data) throw new Error(`${url}: ${JSON.stringify(json.errors ?? json).slice(0, 500)}`);
  return json.data;
}

/**
 * Row keys of a datastore of cellgate that have a cell of `column`, read
 * from the shards' cell logs (`cellsForShard`, 32 shards a request: the
 * alias limit; 200 cells a shard: the complexity limit), several requests at a time, until `want` distinct keys are
 * found or every shard is read. In the order found (by shard).
 *
 * @param {string} url cellgate's /graphql
 * @param {string} datastore the datastore's GraphQL field (`trips`)
 * @param {string} column the column's name (`BASE`)
 */
export async function findRowKeys(url, datastore, column, want) {
  const { datastores } = await graphql(url, '{ datastores { graphqlField shards } }');
  const shards = datastores.find((d) => d.graphqlField === datastore)?.shards;
  if (!shards) throw new Error(`cellgate has no datastore ${datastore}`);
  const PER_REQUEST = 32;
  const CONCURRENCY = 8;
  const batches = [];
  for (let first = 0; first < shards; first += PER_REQUEST) {
    batches.push(Array.from({ length: Math.min(PER_REQUEST, shards - first) }, (_, i) => first + i));
  }
  const found = new Map(); // shard → row keys
  const distinct = new Set();
  let next = 0;
  const worker = async () => {
    while (next < batches.length && distinct.size < want) {
      const batch = batches[next++];
      const fields = batch.map((s) => `s${s}: cellsForShard(shard: ${s}, limit: 200) { cells { rowKey column } }`);
      const data = await graphql(url, `{ ${datastore} { ${fields.join(' ')} } }`);
      for (const s of batch) {
        const keys = data[datastore][`s${s}`].cells.filter((c) => c.column === column).map((c) => c.rowKey);
        found.set(s, keys);
        for (const k of keys) distinct.add(k);
      }
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  const ordered = [...found.entries()].sort(([a], [b]) => a - b).flatMap(([, keys]) => keys);
  return [...new Set(ordered)].slice(0, want);
}

// `node reviews.mjs --cellgate URL [--port N]`
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const { values } = parseArgs({
    options: {
      cellgate: { type: 'string', default: 'http://127.0.0.1:8080/graphql' },
      port: { type: 'string', default: '4002' },
      host: { type: 'string', default: '127.0.0.1' },
    },
  });
  const tripKeys = await findRowKeys(values.cellgate, 'trips', 'BASE', 100);
  const { url } = await startReviews({ tripKeys, port: Number(values.port), host: values.host });
  console.log(`reviews subgraph listening on ${url} (${tripKeys.length} trips of ${values.cellgate})`);
}
