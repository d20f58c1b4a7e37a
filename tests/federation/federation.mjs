// cellgate as an Apollo Federation 2 subgraph in a real supergraph:
//
//   a. composition: cellgate's `_service { sdl }` and a small Node subgraph
//      (reviews.mjs: `Review.trip: TripsRow!`, TripsRow referenced by its
//      key) compose with @theguild/federation-composition (compose.mjs);
//   b. through Hive Gateway (gateway.mjs), a query joining both: every
//      review's trip has the BASE cell cellgate itself returns for its row;
//   c. the 100 representations of that query cost cellgate a bounded number
//      of SQL statements (cellgate_storage_statements_total);
//   d. `_entities` on cellgate directly: unknown keys, malformed
//      representations, the 1000-representation limit;
//   e. figures (printed, not checked): `_entities` of 1, 100 and 1000
//      representations, median latency and statements per request.
//
// On the embedded SQLite store, and also on PostgreSQL (a fresh database,
// dropped afterwards) when CELLGATE_TEST_POSTGRES_URL is set.
//
//   node federation.mjs /abs/path/to/cellgate     (run by run.sh)
//
// One line per check; exits 1 if any fails.
import { execFile } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isDeepStrictEqual, promisify } from 'node:util';

import pg from 'pg';

import { fetchSubgraphSdl } from './compose.mjs';
import { findRowKeys } from './reviews.mjs';
import { startProcess, startServer } from './server.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../..');
const bin = process.argv[2];
if (!bin) {
  console.error('usage: node federation.mjs /path/to/cellgate');
  process.exit(2);
}

const REVIEWS = 100;
const MAX_STATEMENTS = 10;
const LIMIT = 1000;
const FIGURE_RUNS = 20;

// ---------------------------------------------------------------- checks

let failures = 0;

/** Runs one check and prints one line: `ok   NAME (note)` or `FAIL NAME: why`. */
async function check(name, fn) {
  try {
    const note = await fn();
    console.log(`ok   ${name}${note ? ` (${note})` : ''}`);
    return true;
  } catch (err) {
    failures++;
    const why = String(err?.message ?? err).split('\n').join('\n       ');
    console.log(`FAIL ${name}: ${why}`);
    return false;
  }
}

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

function expectEqual(actual, expected, what) {
  expect(isDeepStrictEqual(actual, expected), `${what}: expected ${show(expected)}, got ${show(actual)}`);
}

function show(value, max = 400) {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  return text === undefined ? 'undefined' : text.length > max ? `${text.slice(0, max)}…` : text;
}

// ------------------------------------------------------------ HTTP client

/** POSTs a GraphQL request; { status, json, text, ms }. */
async function post(url, query, variables) {
  const started = performance.now();
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', accept: 'application/json' },
    body: JSON.stringify({ query, variables }),
  });
  const text = await res.text();
  const ms = performance.now() - started;
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json, text, ms };
}

function describe(res) {
  return `HTTP ${res.status} ${show(res.text)}`;
}

/** A 200 with data and no errors; returns the data. */
function expectData(res, what) {
  expect(res.status === 200, `${what}: ${describe(res)}`);
  expect(res.json && res.json.data != null && !res.json.errors, `${what}: no data or errors: ${describe(res)}`);
  return res.json.data;
}

/** cellgate's SQL statements so far: the sum of cellgate_storage_statements_total's series. */
async function statements(base) {
  const res = await fetch(`${base}/metrics`);
  const text = await res.text();
  expect(res.status === 200, `/metrics: HTTP ${res.status}`);
  let total = 0;
  let seen = false;
  for (const line of text.split('\n')) {
    const m = /^cellgate_storage_statements_total(?:\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m) {
      total += Number(m[1]);
      seen = true;
    }
  }
  expect(seen, '/metrics has no cellgate_storage_statements_total');
  return total;
}

/** The statements `fn` cost cellgate (the counter is read again until it has been still for 50 ms). */
async function costOf(base, fn) {
  const before = await statements(base);
  const result = await fn();
  let after = await statements(base);
  for (let i = 0; i < 10; i++) {
    await sleep(50);
    const again = await statements(base);
    if (again === after) break;
    after = again;
  }
  return { result, statements: after - before };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

// ------------------------------------------------------- child processes

const run = promisify(execFile);

/** `node compose.mjs --out FILE cellgate=URL reviews=URL`, as README.md has it. */
async function composeCommand(out, subgraphs) {
  const args = ['compose.mjs', '--out', out, ...subgraphs.map(({ name, url }) => `${name}=${url}`)];
  try {
    const { stdout } = await run(process.execPath, args, { cwd: here, timeout: 120_000 });
    return { ok: true, output: stdout.trim(), command: `node ${args.join(' ')}` };
  } catch (err) {
    return { ok: false, output: `${err.stdout ?? ''}${err.stderr ?? err.message}`.trim(), command: `node ${args.join(' ')}` };
  }
}

/** `node gateway.mjs --supergraph FILE --port 0`, as README.md has it (with port 0). */
function gatewayCommand(supergraph) {
  return startProcess({
    name: 'gateway',
    command: process.execPath,
    args: ['gateway.mjs', '--supergraph', supergraph, '--port', '0'],
    listening: /gateway listening on (http:\/\/\S+)/,
    options: { cwd: here },
  });
}

/** `node reviews.mjs --cellgate URL --port 0`, as README.md has it (with port 0). */
function reviewsCommand(cellgateGraphql) {
  return startProcess({
    name: 'reviews subgraph',
    command: process.execPath,
    args: ['reviews.mjs', '--cellgate', cellgateGraphql, '--port', '0'],
    listening: /reviews subgraph listening on (http:\/\/\S+)/,
    options: { cwd: here },
  });
}

/**
 * A pass-through proxy in front of cellgate's /graphql for the gateway: it
 * records each GraphQL request (the query and the number of
 * representations) so the checks can say what the gateway sent.
 */
async function startRecorder(target) {
  const requests = [];
  const server = createServer(async (req, res) => {
    const chunks = [];
    for await (const chunk of req) chunks.push(chunk);
    const body = Buffer.concat(chunks);
    try {
      const json = JSON.parse(body.toString('utf8'));
      for (const r of Array.isArray(json) ? json : [json]) {
        requests.push({ query: r.query ?? '', variables: r.variables, representations: r.variables?.representations?.length });
      }
    } catch {
      requests.push({ query: '(not JSON)' });
    }
    try {
      const headers = { ...req.headers };
      delete headers.host;
      delete headers['content-length'];
      delete headers.connection;
      const upstream = await fetch(`${target}${req.url}`, {
        method: req.method,
        headers,
        body: req.method === 'GET' || req.method === 'HEAD' ? undefined : body,
      });
      const out = Buffer.from(await upstream.arrayBuffer());
      const outHeaders = {};
      upstream.headers.forEach((v, k) => {
        if (!['content-encoding', 'content-length', 'transfer-encoding', 'connection'].includes(k)) outHeaders[k] = v;
      });
      res.writeHead(upstream.status, outHeaders);
      res.end(out);
    } catch (err) {
      res.writeHead(502, { 'content-type': 'text/plain' });
      res.end(String(err));
    }
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    requests,
    stop: () => new Promise((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }),
  };
}

// ------------------------------------------------------------- documents

const JOIN = `{ reviews(count: ${REVIEWS}) { id stars trip { rowKey base { refKey body } } } }`;

const DIRECT_ROWS = `query Rows($rowKeys: [UUID!]!) {
  trips { rows(rowKeys: $rowKeys) { rowKey base { refKey body } } }
}`;

const ENTITIES = `query Entities($representations: [_Any!]!) {
  _entities(representations: $representations) {
    __typename
    ... on TripsRow { rowKey base { refKey body } }
    ... on PaymentsRow { rowKey order { refKey } }
  }
}`;

const trip = (rowKey) => ({ __typename: 'TripsRow', rowKey });
const payment = (rowKey) => ({ __typename: 'PaymentsRow', rowKey });

/** The errors of a response whose path is ['_entities', i]. */
const errorsAt = (res, i) => (res.json?.errors ?? []).filter((e) => e.path?.[0] === '_entities' && e.path?.[1] === i);
const codesOf = (errors) => errors.map((e) => e.extensions?.code ?? '(no code)').join(', ');

// --------------------------------------------------------------------- run

async function main() {
  const datastores = join(root, 'datastores');
  const config = join(here, 'cellgate.yaml');
  mkdirSync(join(here, 'gen'), { recursive: true });

  await backend('sqlite', { bin, datastores, args: ['--config', config] });

  const pgUrl = process.env.CELLGATE_TEST_POSTGRES_URL;
  if (!pgUrl) {
    console.log('(CELLGATE_TEST_POSTGRES_URL is not set: no PostgreSQL run)');
    return;
  }
  const name = `cg_fed_${randomBytes(6).toString('hex')}`;
  const admin = new pg.Client({ connectionString: pgUrl });
  let created = false;
  const ready = await check(`[postgres] create database ${name}`, async () => {
    await admin.connect();
    await admin.query(`CREATE DATABASE ${name}`);
    created = true;
  });
  try {
    if (ready) {
      const url = new URL(pgUrl);
      url.pathname = `/${name}`;
      await backend('postgres', { bin, datastores, args: ['--config', config, '--database', url.href] });
    }
  } finally {
    if (created) {
      await check(`[postgres] drop database ${name}`, async () => {
        await admin.query(`DROP DATABASE IF EXISTS ${name} WITH (FORCE)`);
      });
    }
    await admin.end().catch(() => {});
  }
}

/** Everything on one cellgate: its own reviews subgraph, supergraph and gateway. */
async function backend(label, { bin, datastores, args }) {
  const gen = join(here, 'gen', label);
  mkdirSync(gen, { recursive: true });
  const stops = [];
  let cellgate;
  try {
    try {
      cellgate = await startServer({ bin, datastores, args });
    } catch (err) {
      failures++;
      console.log(`FAIL [${label}] start cellgate: ${err.message.split('\n').join('\n       ')}`);
      return;
    }
    stops.push(() => cellgate.stop());
    const base = cellgate.url;
    const graphqlUrl = `${base}/graphql`;

    const tripKeys = await findRowKeys(graphqlUrl, 'trips', 'BASE', LIMIT);
    const paymentKeys = await findRowKeys(graphqlUrl, 'payments', 'ORDER', 10);
    expect(tripKeys.length && paymentKeys.length, `no demo rows found: ${tripKeys.length} trips, ${paymentKeys.length} payments`);
    console.log(`[${label}] cellgate at ${base}: ${tripKeys.length} demo trips, ${paymentKeys.length}+ payments`);

    // cellgate's own SDL, kept for inspection.
    let sdl;
    const served = await check(`a. [${label}] cellgate answers _service { sdl }: federation v2 @link, TripsRow and PaymentsRow @key(fields: "rowKey"), PageInfo @shareable`, async () => {
      sdl = await fetchSubgraphSdl(graphqlUrl);
      writeFileSync(join(gen, 'cellgate.graphql'), sdl);
      const link = /@link\(\s*url:\s*"https:\/\/specs\.apollo\.dev\/federation\/(v2\.\d+)"/.exec(sdl);
      expect(link, `no @link(url: "https://specs.apollo.dev/federation/v2.x") in the SDL (gen/${label}/cellgate.graphql)`);
      for (const type of ['TripsRow', 'PaymentsRow']) {
        expect(new RegExp(`type ${type}\\s+@key\\(fields:\\s*"rowKey"\\)`).test(sdl), `no "type ${type} @key(fields: \\"rowKey\\")" in the SDL`);
      }
      expect(/type PageInfo\s+@shareable/.test(sdl), 'no "type PageInfo @shareable" in the SDL');
      const leaked = ['_Service', '_Any', '_Entity', '_entities', '_service'].filter((n) => new RegExp(`\\b${n}\\b`).test(sdl));
      return `federation ${link[1]}, ${sdl.length} characters${leaked.length ? `; the SDL also names ${leaked.join(', ')}` : ''}`;
    });
    if (!served) return;

    // The gateway reaches cellgate through a recording proxy.
    const recorder = await startRecorder(base);
    stops.push(() => recorder.stop());
    const reviews = await reviewsCommand(graphqlUrl);
    stops.push(() => reviews.stop());

    const supergraph = join('gen', label, 'supergraph.graphql');
    const composed = await check(`a. [${label}] the supergraph composes (compose.mjs: @theguild/federation-composition); TripsRow @join__type(graph: CELLGATE, key: "rowKey")`, async () => {
      const subgraphs = [{ name: 'cellgate', url: `${recorder.url}/graphql` }, { name: 'reviews', url: reviews.url }];
      const result = await composeCommand(supergraph, subgraphs);
      expect(result.ok, `${result.command}\n${result.output}`);
      const sdlOut = readFileSync(join(here, supergraph), 'utf8');
      const tripsRow = /^type TripsRow .*$/m.exec(sdlOut)?.[0] ?? '(no type TripsRow)';
      expect(/@join__type\(graph: CELLGATE, key: "rowKey"\)/.test(tripsRow), `TripsRow in the supergraph: ${tripsRow}`);
      expect(/@join__type\(graph: REVIEWS, key: "rowKey", resolvable: false\)/.test(tripsRow), `TripsRow in the supergraph: ${tripsRow}`);
      expect(/^type PaymentsRow @join__type\(graph: CELLGATE, key: "rowKey"\)/m.test(sdlOut), 'PaymentsRow is no entity of CELLGATE in the supergraph');
      return `${supergraph}, ${sdlOut.length} characters`;
    });
    if (!composed) return;

    let gateway;
    try {
      gateway = await gatewayCommand(supergraph);
    } catch (err) {
      failures++;
      console.log(`FAIL [${label}] start the gateway: ${err.message.split('\n').join('\n       ')}`);
      return;
    }
    stops.push(() => gateway.stop());

    await joinChecks(label, { base, graphqlUrl, gatewayUrl: gateway.url, recorder, gen });
    await entityChecks(label, { base, graphqlUrl, tripKeys, paymentKeys });
    await figures(label, { base, graphqlUrl, tripKeys });
  } catch (err) {
    failures++;
    console.log(`FAIL [${label}] ${err.message}${cellgate ? `\n--- cellgate log ---\n${cellgate.log()}` : ''}`);
  } finally {
    for (const stop of stops.reverse()) await stop();
  }
}

// b, c: through the gateway
async function joinChecks(label, { base, graphqlUrl, gatewayUrl, recorder, gen }) {
  let cold;
  await check(`b. [${label}] through the gateway, ${REVIEWS} reviews with their trips: each trip's base as cellgate returns it for its row key`, async () => {
    recorder.requests.length = 0;
    const { result: res, statements: cost } = await costOf(base, () => post(gatewayUrl, JOIN));
    cold = { cost, requests: [...recorder.requests] };
    // What the gateway asked cellgate, for inspection.
    writeFileSync(join(gen, 'gateway-to-cellgate.json'), `${JSON.stringify(cold.requests, null, 2)}\n`);
    const data = expectData(res, 'the gateway');
    expect(data.reviews.length === REVIEWS, `${data.reviews.length} reviews`);
    const keys = [...new Set(data.reviews.map((r) => r.trip.rowKey))];
    const direct = expectData(await post(graphqlUrl, DIRECT_ROWS, { rowKeys: keys }), 'cellgate, trips.rows');
    const byKey = new Map(direct.trips.rows.map((row) => [row.rowKey, row.base]));
    for (const review of data.reviews) {
      expect(review.trip.base, `review ${review.id}: trip ${review.trip.rowKey} has no base: ${show(review)}`);
      expectEqual(review.trip.base, byKey.get(review.trip.rowKey), `review ${review.id}, trip ${review.trip.rowKey}`);
    }
    return `${keys.length} distinct trips; ${summarize(cold.requests)}; ${cold.cost} statements`;
  });
  await check(`c. [${label}] the same query again: cellgate ran at most ${MAX_STATEMENTS} SQL statements for its representations`, async () => {
    recorder.requests.length = 0;
    const { result: res, statements: cost } = await costOf(base, () => post(gatewayUrl, JOIN));
    expectData(res, 'the gateway');
    const sent = summarize(recorder.requests);
    expect(cost <= MAX_STATEMENTS, `${cost} statements (${sent})`);
    return `${cost} statements; ${sent}; the first run: ${cold?.cost ?? '?'}`;
  });
}

/** What the gateway sent cellgate: `N requests, _entities with R representations`. */
function summarize(requests) {
  const entities = requests.filter((r) => /_entities/.test(r.query));
  const reps = entities.map((r) => r.representations ?? '?');
  return `the gateway sent cellgate ${requests.length} request(s)${entities.length ? `, _entities with ${reps.join(' + ')} representations` : ''}`;
}

// d: _entities directly on cellgate
async function entityChecks(label, { base, graphqlUrl, tripKeys, paymentKeys }) {
  const [t0, t1] = tripKeys;
  const p0 = paymentKeys[0];

  await check(`d. [${label}] _entities: a trip and a payment resolve (rowKey, cells), in the order asked`, async () => {
    const data = expectData(await post(graphqlUrl, ENTITIES, { representations: [trip(t0), payment(p0), trip(t1)] }), '_entities');
    expectEqual(data._entities.map((e) => e?.__typename), ['TripsRow', 'PaymentsRow', 'TripsRow'], '__typename');
    expectEqual(data._entities.map((e) => e?.rowKey), [t0, p0, t1], 'rowKey');
    expect(data._entities[0].base && data._entities[2].base && data._entities[1].order, `cells: ${show(data)}`);
  });
  await check(`d. [${label}] _entities: an unknown rowKey → its row with null cells (as row(rowKey)), no errors`, async () => {
    const unknown = randomUUID();
    const other = randomUUID();
    const res = await post(graphqlUrl, ENTITIES, { representations: [trip(t0), trip(unknown), payment(other)] });
    const data = expectData(res, '_entities');
    expectEqual(data._entities.length, 3, 'entries');
    expect(data._entities[0]?.rowKey === t0, `entry 0: ${show(data._entities[0])}`);
    expectEqual(data._entities.map((e) => e?.rowKey), [t0, unknown, other], 'rowKey');
    expect(data._entities[1].base === null && data._entities[2].order === null, `cells of unknown rows: ${show(data)}`);
  });

  // async-graphql resolves `[_Entity]` items only to typed values, so a bad
  // representation fails the field as a whole, naming its position.
  const malformed = [
    ['a representation without rowKey', { __typename: 'TripsRow' }, 'needs its `rowKey`'],
    ['a rowKey that is not a UUID', { __typename: 'TripsRow', rowKey: 'not-a-uuid' }, 'must be a UUID'],
    ['a rowKey that is a number', { __typename: 'PaymentsRow', rowKey: 42 }, 'must be a UUID'],
    ['__typename "Nope"', { __typename: 'Nope', rowKey: t1 }, 'is not an entity'],
    ['__typename "Cell" (a type, not an entity)', { __typename: 'Cell', rowKey: t1 }, 'is not an entity'],
  ];
  for (const [what, rep, said] of malformed) {
    await check(`d. [${label}] _entities: ${what} → BAD_REQUEST naming representation 1, and cellgate still answers`, async () => {
      const res = await post(graphqlUrl, ENTITIES, { representations: [trip(t0), rep, payment(p0)] });
      const errors = res.json?.errors ?? [];
      const problems = [];
      if (errors.length !== 1) problems.push(`${errors.length} errors`);
      else {
        if (errors[0].extensions?.code !== 'BAD_REQUEST') problems.push(`code ${errors[0].extensions?.code}`);
        if (!errors[0].message.includes('representation 1:') || !errors[0].message.includes(said)) problems.push(`message ${show(errors[0].message)}`);
      }
      if (res.json?.data?._entities) problems.push('entities answered despite the error');
      expect(!problems.length, `${problems.join('; ')}\n${describe(res)}`);
      const after = expectData(await post(graphqlUrl, ENTITIES, { representations: [trip(t0)] }), '_entities');
      expect(after._entities[0]?.rowKey === t0, `afterwards: ${show(after)}`);
      return `${errors[0].extensions.code}: ${show(errors[0].message, 120)}`;
    });
  }

  await check(`d. [${label}] _entities: ${LIMIT} representations → no error`, async () => {
    const reps = Array.from({ length: LIMIT }, (_, i) => trip(tripKeys[i % tripKeys.length]));
    const data = expectData(await post(graphqlUrl, ENTITIES, { representations: reps }), `${LIMIT} representations`);
    expect(data._entities.length === LIMIT && data._entities.every((e) => e?.rowKey), `${show(data, 200)}`);
  });
  await check(`d. [${label}] _entities: ${LIMIT + 1} representations → an error (LIMIT_EXCEEDED), and cellgate still answers`, async () => {
    const reps = Array.from({ length: LIMIT + 1 }, (_, i) => trip(tripKeys[i % tripKeys.length]));
    const res = await post(graphqlUrl, ENTITIES, { representations: reps });
    expect(res.json?.errors?.length, `no error: ${describe(res)}`);
    const codes = codesOf(res.json.errors);
    const after = expectData(await post(graphqlUrl, ENTITIES, { representations: [trip(t0)] }), 'a request afterwards');
    expect(after._entities[0]?.rowKey === t0, `afterwards: ${show(after)}`);
    const health = await fetch(`${base}/healthz`);
    expect(health.ok, `/healthz afterwards: HTTP ${health.status}`);
    return `HTTP ${res.status}, code ${codes}${/LIMIT_EXCEEDED/.test(codes) ? '' : ' (not LIMIT_EXCEEDED)'}: ${show(res.json.errors[0].message, 120)}`;
  });
}

// e: figures
async function figures(label, { base, graphqlUrl, tripKeys }) {
  console.log(`e. [${label}] figures: _entities posted to cellgate (rowKey base { refKey body }; ${tripKeys.length} distinct trips, repeated), ${FIGURE_RUNS} runs each after one more`);
  for (const n of [1, 100, 1000]) {
    const reps = Array.from({ length: n }, (_, i) => trip(tripKeys[i % tripKeys.length]));
    const ms = [];
    const costs = [];
    let errors = 0;
    for (let i = 0; i <= FIGURE_RUNS; i++) {
      const before = await statements(base);
      const res = await post(graphqlUrl, ENTITIES, { representations: reps });
      const cost = (await statements(base)) - before;
      if (res.status !== 200 || res.json?.errors) errors++;
      ms.push(res.ms);
      costs.push(cost);
    }
    const first = costs[0];
    ms.shift();
    costs.shift();
    const note = errors ? `  (${errors} answers with errors)` : '';
    console.log(`   ${String(n).padStart(4)} representations: median ${median(ms).toFixed(1).padStart(6)} ms, statements/request median ${median(costs)} (max ${Math.max(...costs)}, first run ${first})${note}`);
  }
}

await main();
console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
