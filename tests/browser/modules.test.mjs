// The explorer's pure modules (catalog, topology, query builders, metrics parser) in
// Node against a real gateway: every document they build must be valid for
// the real schema and return what the same query written by hand returns.

import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { startServer, gql, DEMO_DRIVER, DEMO_CITY } from './harness.mjs';
import { CATALOG_QUERY, buildCatalog, findDatastore, findIndex, typeText } from '../../web/explorer/catalog.js';
import {
  indexPageQuery,
  operatorsFor,
  rowQuery,
  olderVersionsQuery,
  cellLogQuery,
  typedValue,
  splitList,
  valueAtPath,
} from '../../web/explorer/queries.js';
import { TOPOLOGY_QUERY, buildTopology, moveText } from '../../web/explorer/topology.js';
import { parseMetrics, sample, datastoreHealth, bufferHealth, breakers, replicaLag, indexBuilds } from '../../web/explorer/metrics.js';
import { parseHeaderLines, formatHeaderLines } from '../../web/explorer/settings.js';

let server;
let catalog;

before(async () => {
  server = await startServer();
  catalog = buildCatalog(await gql(server.url, CATALOG_QUERY));
});

after(async () => {
  await server?.stop();
});

/** A valid value of an index field type, as typed into the form. */
const SAMPLE = {
  UUID: '00000000-0000-4000-8000-000000000001',
  string: 'completed',
  int: '1200',
  float: '30.5',
  bool: 'true',
  datetime: '2024-03-05T00:00:00Z',
};

test('the catalog joins the definitions with the schema', () => {
  const names = catalog.datastores.map((d) => d.name).sort();
  assert.deepEqual(names, ['payments', 'trips']);
  const trips = findDatastore(catalog, 'trips');
  assert.equal(trips.queryType, 'TripsQuery');
  assert.equal(trips.columnEnum, 'TripsColumn');
  const index = findIndex(trips, 'driver_partner_index');
  assert.equal(index.api.shardArg.name, 'driverPartnerUuid');
  assert.equal(index.api.shardArg.type, 'UUID');
  assert.equal(index.api.shardInArg.type, '[UUID!]');
  assert.equal(index.api.where.type, 'TripsDriverPartnerIndexWhere');
  assert.equal(index.api.orderBy.type, '[TripsDriverPartnerIndexOrder!]');
  assert.equal(index.api.orderValues.get('tripCreatedAt'), 'TRIP_CREATED_AT');
  assert.deepEqual(
    operatorsFor(index, index.fields.find((f) => f.name === 'trip_created_at')).map((o) => o.op),
    ['eq', 'ne', 'gt', 'gte', 'lt', 'lte', 'in', 'isNull', 'notNull'],
  );
  const city = findIndex(trips, 'city_trips_index');
  const bool = city.fields.find((f) => f.type === 'bool');
  assert.deepEqual(
    operatorsFor(city, bool).map((o) => o.op),
    ['eq', 'ne', 'in', 'isNull', 'notNull'],
    'bool fields have no range operators',
  );
  assert.equal(typeText({ kind: 'NON_NULL', ofType: { kind: 'LIST', ofType: { kind: 'NON_NULL', ofType: { kind: 'SCALAR', name: 'X' } } } }), '[X!]!');
});

test('every operator of every field of every index builds a query the gateway accepts', async () => {
  let built = 0;
  for (const ds of catalog.datastores) {
    for (const index of ds.indexes) {
      for (const field of index.fields.filter((f) => f.name !== index.shardField)) {
        for (const operator of operatorsFor(index, field)) {
          const value = operator.needs === 'list' ? `${SAMPLE[field.type]}, ${SAMPLE[field.type]}` : SAMPLE[field.type];
          const state = {
            shard: SAMPLE[index.shard.type],
            conditions: { [field.graphqlName]: { op: operator.op, value } },
            // Fields stored without a b-tree (`sort: false`) filter but do not order.
            order: index.api.orderValues.has(field.graphqlName) ? field.graphqlName : '',
            direction: 'DESC',
            first: '5',
            show: null,
          };
          const { query, variables } = indexPageQuery(ds, index, state);
          const data = await gql(server.url, query, variables);
          assert.ok(Array.isArray(data[ds.graphqlField][index.graphqlField].edges), `${index.name}.${field.name} ${operator.op}`);
          built += 1;
        }
      }
    }
  }
  assert.ok(built > 50, `${built} queries`);
  // The order choices follow the b-trees: `city_trips_index` orders by
  // trip_created_at, not by its `sort: false` fields.
  const city = findIndex(findDatastore(catalog, 'trips'), 'city_trips_index');
  assert.ok(city.api.orderValues.has('tripCreatedAt'));
  for (const stored of ['fareTotal', 'status', 'isCompleted']) {
    assert.ok(!city.api.orderValues.has(stored), `${stored} is offered as an order`);
  }
});

test('an index query with a range filter and an order matches the hand-written query, page by page', async () => {
  const trips = findDatastore(catalog, 'trips');
  const index = findIndex(trips, 'driver_partner_index');
  const bound = '2024-03-05T00:00:00Z';
  const all = (
    await gql(
      server.url,
      `query($d: UUID, $w: TripsDriverPartnerIndexWhere) { trips { driverPartnerIndex(driverPartnerUuid: $d, where: $w, orderBy: [{ field: TRIP_CREATED_AT, direction: DESC }], first: 1000) { edges { node { rowKey tripCreatedAt } } } } }`,
      { d: DEMO_DRIVER, w: { tripCreatedAt: { gte: bound } } },
    )
  ).trips.driverPartnerIndex.edges.map((e) => e.node);
  assert.ok(all.length >= 3, 'the demo driver has at least three trips after the bound');

  const state = {
    shard: DEMO_DRIVER,
    conditions: { tripCreatedAt: { op: 'gte', value: bound } },
    order: 'tripCreatedAt',
    direction: 'DESC',
    first: '2',
    show: ['tripCreatedAt'],
  };
  const seen = [];
  let after = null;
  for (;;) {
    const { query, variables, shown } = indexPageQuery(trips, index, state, after);
    assert.deepEqual(shown, ['tripCreatedAt']);
    assert.ok(!query.includes(DEMO_DRIVER) && !query.includes(bound), 'values travel as variables');
    const page = (await gql(server.url, query, variables)).trips.driverPartnerIndex;
    seen.push(...page.edges.map((e) => e.node));
    if (!page.pageInfo.hasNextPage) break;
    after = page.pageInfo.endCursor;
  }
  assert.deepEqual(seen, all);
  assert.ok(seen.every((n) => n.tripCreatedAt >= bound));
});

test('several shard field values use the list argument', async () => {
  const trips = findDatastore(catalog, 'trips');
  const index = findIndex(trips, 'city_trips_index');
  const other = '00000000-0000-4000-8000-000000000002';
  const { query, variables } = indexPageQuery(trips, index, { shard: `${DEMO_CITY}, ${other}`, conditions: {}, first: '1000' });
  assert.deepEqual(variables.cityUuidIn, [DEMO_CITY, other]);
  const edges = (await gql(server.url, query, variables)).trips.cityTripsIndex.edges;
  assert.ok(edges.length > 0);
  assert.ok(edges.every((e) => e.node.cityUuid === DEMO_CITY));
});

test('form input that is not a valid query is refused with a message naming the field', () => {
  const trips = findDatastore(catalog, 'trips');
  const index = findIndex(trips, 'city_trips_index');
  const base = { shard: DEMO_CITY, conditions: {}, first: '20' };
  const refuse = (state, message) => assert.throws(() => indexPageQuery(trips, index, { ...base, ...state }), { message });
  refuse({ shard: '' }, /city_uuid: the shard field needs a value/);
  refuse({ shard: 'nope' }, /city_uuid: "nope" is not a UUID/);
  refuse({ conditions: { fareTotal: { op: 'lt', value: 'cheap' } } }, /fare_total: "cheap" is not a number/);
  refuse({ conditions: { tripCreatedAt: { op: 'gte', value: 'monday' } } }, /trip_created_at: "monday" is not an RFC 3339 time/);
  refuse({ conditions: { isCompleted: { op: 'gt', value: 'true' } } }, /is_completed: no operator "gt"/);
  refuse({ conditions: { status: { op: 'in', value: ' , ' } } }, /status: enter at least one value/);
  refuse({ first: '0' }, /page size/);
  refuse({ first: '1001' }, /page size/);
  assert.equal(typedValue('int', ' 9007199254740993 ', 'n'), '9007199254740993', 'Int64 stays exact');
  assert.deepEqual(splitList('a, b\nc  d,,'), ['a', 'b', 'c', 'd']);
  assert.equal(valueAtPath({ fare: { total: 3 } }, 'fare.total'), 3);
  assert.equal(valueAtPath({ fare: null }, 'fare.total'), undefined);
});

test('row, history and cell log documents return the stored cells', async () => {
  const trips = findDatastore(catalog, 'trips');
  const rowKey = (
    await gql(server.url, `{ trips { driverPartnerIndex(driverPartnerUuid: "${DEMO_DRIVER}", first: 1) { edges { node { rowKey } } } } }`)
  ).trips.driverPartnerIndex.edges[0].node.rowKey;

  const { query, first } = rowQuery(trips, 1);
  const row = (await gql(server.url, query, { rowKey, first })).trips;
  assert.deepEqual(Object.keys(row).sort(), trips.columns.map((c) => c.graphqlName).sort());
  const status = row.status;
  assert.equal(status.length, 1, 'first: 1 version per column');
  const older = (await gql(server.url, olderVersionsQuery(trips), { rowKey, column: 'STATUS', first: 20, before: status[0].refKey })).trips
    .history;
  assert.ok(older.length >= 1, 'the demo trips have an older status');
  assert.ok(older.every((c) => BigInt(c.refKey) < BigInt(status[0].refKey)));

  const log = (await gql(server.url, cellLogQuery(trips), { shard: status[0].shard, limit: 1000 })).trips.cellsForShard;
  assert.ok(log.cells.some((c) => c.rowKey === rowKey && c.column === 'STATUS'));
});

test('the metrics parser reads the gateway’s /metrics', async () => {
  const text = await (await fetch(`${server.url}/metrics`)).text();
  const samples = parseMetrics(text);
  const health = datastoreHealth(samples, ['trips', 'payments']);
  for (const ds of health) {
    assert.equal(typeof ds.laggingShards, 'number', `${ds.name} lagging shards`);
    assert.equal(typeof ds.maxLagMs, 'number', `${ds.name} max lag`);
    assert.ok(ds.cellsWritten > 0, `${ds.name} cells written`);
  }
  // The demo gateway has one cluster: no buffers.
  assert.deepEqual(bufferHealth(samples, ['trips']).map((d) => d.clusters), [[]]);
  const buffered = parseMetrics(
    '# TYPE cellgate_buffered_cells gauge\ncellgate_buffered_cells{datastore="trips",cluster="a"} 7\n' +
      'cellgate_buffered_oldest_seconds{datastore="trips",cluster="a"} 3\n' +
      'cellgate_buffered_awaiting_replicas{datastore="trips",cluster="a"} 5\n' +
      'cellgate_buffer_replayed_cells_total{datastore="trips"} 40\ncellgate_buffer_released_copies_total{datastore="trips"} 900\n' +
      'cellgate_buffer_conflicts_total{datastore="trips"} 1\n',
  );
  assert.deepEqual(bufferHealth(buffered, ['trips']), [
    { name: 'trips', clusters: [{ cluster: 'a', cells: 7, oldestSeconds: 3, awaitingReplicas: 5 }], replayed: 40, released: 900, conflicts: 1 },
  ]);
  assert.deepEqual(breakers(samples, 'main'), [], 'SQLite has no breaker');
  const nodes = parseMetrics(
    '# TYPE cellgate_node_breaker_state gauge\ncellgate_node_breaker_state{cluster="a",node="master"} 2\n' +
      'cellgate_node_breaker_state{cluster="a",node="replica0"} 0\ncellgate_node_breaker_state{cluster="b",node="master"} 1\n',
  );
  assert.deepEqual(breakers(nodes, 'a'), [
    { node: 'master', state: 'open' },
    { node: 'replica0', state: 'closed' },
  ]);
  assert.deepEqual(breakers(nodes, 'b'), [{ node: 'master', state: 'half-open' }]);
  assert.deepEqual(replicaLag(samples, 'main'), [], 'no replicas');
  const lagging = parseMetrics(
    '# TYPE cellgate_replica_lag_cells gauge\ncellgate_replica_lag_cells{cluster="a",node="replica0"} 12\n' +
      'cellgate_replica_lag_cells{cluster="a",node="replica1"} 0\n' +
      '# TYPE cellgate_replica_lag_seconds gauge\ncellgate_replica_lag_seconds{cluster="a",node="replica0"} 1.5\n' +
      'cellgate_replica_lag_seconds{cluster="a",node="replica1"} 0\n',
  );
  assert.deepEqual(replicaLag(lagging, 'a'), [
    { node: 'replica0', cells: 12, seconds: 1.5 },
    { node: 'replica1', cells: 0, seconds: 0 },
  ]);
  assert.deepEqual(replicaLag(lagging, 'b'), []);
  assert.deepEqual(indexBuilds(samples), [], 'every demo index is ready');
  const building = parseMetrics(
    '# TYPE cellgate_index_building_pending_cells gauge\n' +
      'cellgate_index_building_pending_cells{datastore="trips",index="by_city"} 300\n' +
      'cellgate_index_building_pending_cells{datastore="trips",index="fresh"} 50\n' +
      'cellgate_index_building_total_cells{datastore="trips",index="by_city"} 1000\n' +
      'cellgate_index_building_rate_cells_per_second{datastore="trips",index="by_city"} 70\n' +
      'cellgate_index_building_eta_seconds{datastore="trips",index="by_city"} 4.5\n' +
      'cellgate_index_version{datastore="trips",index="by_city",state="building"} 2\n' +
      'cellgate_index_version{datastore="trips",index="by_city",state="previous"} 1\n' +
      'cellgate_index_version{datastore="trips",index="fresh",state="building"} 1\n',
  );
  assert.deepEqual(indexBuilds(building), [
    { datastore: 'trips', index: 'by_city', version: 2, previous: 1, pending: 300, total: 1000, done: 700, rate: 70, etaSeconds: 4.5 },
    { datastore: 'trips', index: 'fresh', version: 1, previous: null, pending: 50, total: null, done: null, rate: null, etaSeconds: null },
  ]);
  const escaped = parseMetrics('# TYPE x gauge\nx{a="q\\"uote",b="back\\\\slash"} 2.5\nx{a="other"} 1\n# EOF\n');
  assert.equal(sample(escaped, 'x', { a: 'q"uote' }), 2.5);
  assert.equal(sample(escaped, 'x', { b: 'back\\slash' }), 2.5);
  assert.equal(sample(escaped, 'x', { a: 'other' }), 1);
  assert.equal(sample(escaped, 'x', { a: 'missing' }), null);
});

test('the topology is read as served, and a recorded move reads as one line', async () => {
  const topology = buildTopology(await gql(server.url, TOPOLOGY_QUERY));
  assert.deepEqual([...topology.keys()].sort(), ['payments', 'trips']);
  const text = await (await fetch(`${server.url}/metrics`)).text();
  for (const [name, ds] of topology) {
    assert.equal(ds.version, sample(parseMetrics(text), 'cellgate_topology_version', { datastore: name }), name);
    assert.equal(ds.move, null, `${name}: no move recorded`);
    assert.deepEqual(ds.ranges, findDatastore(catalog, name).topology, name);
  }
  assert.equal(moveText(null), null);
  const move = { first: 0, last: 1023, source: 'a', target: 'c', phase: 'drain', startedAt: '2024-03-05T07:40:00Z', cellsCopied: '0', keepSource: false };
  assert.equal(moveText(move), 'Moving shards 0–1023 from a to c: phase drain (started 2024-03-05T07:40:00Z).');
  assert.equal(
    moveText({ ...move, phase: 'catch_up', cellsCopied: '1200', startedAt: '2024-03-05T07:40:00.102398160Z' }),
    'Moving shards 0–1023 from a to c: phase catch_up (started 2024-03-05T07:40:00Z, 1200 cells copied).',
  );
  assert.match(moveText({ ...move, phase: 'done', keepSource: true }), /^Moved shards 0–1023 from a to c, keeping the copy on a /);
});

test('request header lines parse and print', () => {
  assert.deepEqual(parseHeaderLines('Authorization: Bearer a:b\n\n X-Trace : 1 '), {
    headers: { Authorization: 'Bearer a:b', 'X-Trace': '1' },
  });
  assert.deepEqual(parseHeaderLines('ok: 1\nno colon'), { error: 'line 2: expected "Name: value"' });
  assert.deepEqual(parseHeaderLines('bad name: 1'), { error: 'line 1: expected "Name: value"' });
  assert.equal(formatHeaderLines({ A: '1', B: '2' }), 'A: 1\nB: 2');
});
