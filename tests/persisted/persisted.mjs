// Persisted documents, automatic persisted queries and HTTP caching of
// `cellgate serve`, checked with real clients:
//
//   1. graphql-codegen's client preset: every document of its manifest
//      (gen/persisted-documents.json) runs by id over GET, as its text does
//      over POST;
//   2. Apollo Client's persisted-queries link: APQ registration, a hashed
//      GET afterwards, and a manifest document found by its hash;
//   3. undici's cache interceptor in front: an immutable cell read served
//      from the cache, an index page revalidated with a 304;
//   4. `--documents only_persisted`: free documents refused, ids served;
//   5. bad ids and hashes;
//   6. figures (printed, not checked): requests per second and bytes on
//      the wire of one read by text, by id, and answered 304.
//
//   node persisted.mjs /abs/path/to/cellgate     (run.sh runs the codegen first)
//
// One line per check; exits 1 if any fails.
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isDeepStrictEqual } from 'node:util';

import { ApolloClient, HttpLink, InMemoryCache, gql } from '@apollo/client';
import { createPersistedQueryLink } from '@apollo/client/link/persisted-queries';
import { print } from '@apollo/client/utilities';
import { Kind, parse } from 'graphql';
import { createJiti } from 'jiti';
import { Agent, Pool, fetch, interceptors } from 'undici';

import { startServer } from './server.mjs';

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, '../..');
const bin = process.argv[2];
if (!bin) {
  console.error('usage: node persisted.mjs /path/to/cellgate');
  process.exit(2);
}

// A driver of the demo data (gateway/src/demo.rs: its keys are stable).
const DRIVER = '5f0c8a4e-6d1b-4c2e-9a57-3b8e1d2c4f60';
const IMMUTABLE = ['public', 'max-age=31536000', 'immutable'];
const FIGURE_SECONDS = 3;
const FIGURE_CONCURRENCY = 8;

// ---------------------------------------------------------------- checks

let failures = 0;

/** Runs one check and prints one line: `ok   NAME (note)` or `FAIL NAME: why`. */
async function check(name, fn) {
  try {
    const note = await fn();
    console.log(`ok   ${name}${note ? ` (${note})` : ''}`);
  } catch (err) {
    failures++;
    const why = String(err?.message ?? err).split('\n').join('\n       ');
    console.log(`FAIL ${name}: ${why}`);
  }
}

function expect(condition, message) {
  if (!condition) throw new Error(message);
}

function expectEqual(actual, expected, what) {
  expect(isDeepStrictEqual(actual, expected), `${what}: expected ${show(expected)}, got ${show(actual)}`);
}

function show(value, max = 300) {
  const text = typeof value === 'string' ? value : JSON.stringify(value);
  return text === undefined ? 'undefined' : text.length > max ? `${text.slice(0, max)}…` : text;
}

// ------------------------------------------------------- plain HTTP client

// No cache: what the server answers, as it answers it.
const plain = new Agent();

/** One request with undici's fetch; the body is read and parsed when JSON. */
async function http(url, { method = 'GET', headers = {}, body, dispatcher = plain } = {}) {
  const res = await fetch(url, { method, headers, body, dispatcher });
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json, url: String(url) };
}

function describe(res) {
  return `HTTP ${res.status} ${show(res.text)}`;
}

const graphqlUrl = (base, params = {}) => {
  const url = new URL('/graphql', base);
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined) url.searchParams.set(k, typeof v === 'string' ? v : JSON.stringify(v));
  }
  return url;
};

const postJson = (base, payload, headers = {}) =>
  http(graphqlUrl(base), {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(payload),
  });

const postText = (base, query, variables) => postJson(base, { query, variables });
const postById = (base, documentId, variables) => postJson(base, { documentId, variables });
const getById = (base, documentId, variables, headers = {}) =>
  http(graphqlUrl(base, { documentId, variables }), { headers });
const apq = (sha256Hash) => ({ persistedQuery: { version: 1, sha256Hash } });

/** A 200 with data and no errors; returns the data. */
function expectData(res, what) {
  expect(res.status === 200, `${what}: ${describe(res)}`);
  expect(res.json && res.json.data != null && !res.json.errors, `${what}: no data or errors: ${describe(res)}`);
  return res.json.data;
}

/** A GraphQL error with this extensions.code (and HTTP status, when given). */
function expectErrorCode(res, code, status) {
  const codes = (res.json?.errors ?? []).map((e) => e.extensions?.code);
  expect(codes.includes(code), `expected an error with code ${code}: ${describe(res)}`);
  if (status !== undefined) expect(res.status === status, `expected HTTP ${status}: ${describe(res)}`);
  return `HTTP ${res.status}`;
}

function cacheControl(res) {
  return (res.headers.get('cache-control') ?? '').split(',').map((d) => d.trim().toLowerCase()).filter(Boolean);
}

function varyIncludes(res, ...names) {
  const vary = (res.headers.get('vary') ?? '').split(',').map((v) => v.trim().toLowerCase());
  return names.every((n) => vary.includes(n.toLowerCase()));
}

/** The server's count of GraphQL requests (all series of cellgate_graphql_requests_total). */
async function graphqlRequestCount(base) {
  const res = await http(new URL('/metrics', base));
  expect(res.status === 200, `/metrics: HTTP ${res.status}`);
  let total = 0;
  for (const line of res.text.split('\n')) {
    const m = /^cellgate_graphql_requests_total(?:\{[^}]*\})?\s+(\S+)/.exec(line);
    if (m) total += Number(m[1]);
  }
  return total;
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const sha256 = (text) => createHash('sha256').update(text).digest('hex');

// --------------------------------------------------------------- manifest

/** gen/persisted-documents.json as [{ id, text, name }], by operation name. */
function loadManifest() {
  const file = join(here, 'gen/persisted-documents.json');
  const manifest = JSON.parse(readFileSync(file, 'utf8'));
  const docs = {};
  for (const [id, text] of Object.entries(manifest)) {
    const op = parse(text).definitions.find((d) => d.kind === Kind.OPERATION_DEFINITION);
    docs[op.name.value] = { id, text, name: op.name.value };
  }
  return docs;
}

/** The variables each manifest operation runs with, from the keys found in the demo data. */
const variablesFor = {
  DriverTrips: (k) => ({ driver: k.driver, first: 3 }),
  TripCell: (k) => ({ rowKey: k.rowKey, column: 'BASE', refKey: k.baseRefKey }),
  TripBaseVersion: (k) => ({ rowKey: k.rowKey, refKey: k.baseRefKey }),
  TripStatus: (k) => ({ rowKey: k.rowKey }),
};

/** A trip of the demo driver and its BASE cell's ref key, read with DriverTrips over POST. */
async function findKeys(base, docs) {
  const res = await postText(base, docs.DriverTrips.text, { driver: DRIVER, first: 3 });
  const data = expectData(res, 'DriverTrips over POST');
  const node = data.trips.driverPartnerIndex.edges[0]?.node;
  expect(node?.row?.base, `no trip of driver ${DRIVER} with a BASE cell: ${describe(res)}`);
  return { driver: DRIVER, rowKey: node.rowKey, baseRefKey: node.row.base.refKey };
}

// ------------------------------------------------------------ the frontend

/** The documents of src/*.ts as the app has them (TypedDocumentNodes with __meta__.hash). */
async function loadFrontend() {
  const jiti = createJiti(import.meta.url);
  return {
    ...(await jiti.import('./src/trip-cell.ts')),
    ...(await jiti.import('./src/driver-trips.ts')),
    ...(await jiti.import('./src/latest-status.ts')),
  };
}

// A query no manifest has: only APQ can register it.
const TRIP_ROW = gql`
  query TripRowForApq($rowKey: UUID!) {
    trips {
      row(rowKey: $rowKey) {
        rowKey
        base { refKey }
        status { refKey body }
      }
    }
  }
`;

// A write (to the gateway's throw-away demo store).
const WRITE_NOTE = `mutation WriteNote($rowKey: UUID!) {
  tripsPutCells(cells: [{ rowKey: $rowKey, column: NOTES, refKey: 900001, body: { text: "persisted-documents test" } }]) {
    rowKey status
  }
}`;

/**
 * An Apollo Client whose requests go through `createPersistedQueryLink`
 * (hashed GETs) and an HttpLink whose fetch records method, URL, body and
 * status of each request in `log`. A document generated by the client
 * preset is named by its manifest id (`__meta__.hash`), any other by the
 * SHA-256 of the text Apollo sends.
 */
function apolloClient(base, log) {
  const recordingFetch = async (url, init = {}) => {
    const res = await fetch(url, { ...init, dispatcher: plain });
    log.push({ method: init.method ?? 'GET', url: new URL(url), headers: init.headers, body: init.body, status: res.status });
    return res;
  };
  const persisted = createPersistedQueryLink({
    useGETForHashedQueries: true,
    generateHash: (document) => document.__meta__?.hash ?? sha256(print(document)),
  });
  const httpLink = new HttpLink({ uri: graphqlUrl(base).href, fetch: recordingFetch });
  return new ApolloClient({ link: persisted.concat(httpLink), cache: new InMemoryCache() });
}

function summarize(log) {
  return log.map((r) => `${r.method} ${r.status}${r.url.searchParams.has('query') || /"query"/.test(r.body ?? '') ? ' +query' : ''}`).join(', ');
}

/** A hashed GET: no query text, the hash in extensions.persistedQuery. */
function expectHashedGet(request, hash) {
  expect(request.method === 'GET', `expected a GET, got ${request.method}`);
  expect(!request.url.searchParams.has('query'), `the GET sent the query text: ${request.url}`);
  const ext = JSON.parse(request.url.searchParams.get('extensions') ?? '{}');
  if (hash) expectEqual(ext.persistedQuery?.sha256Hash, hash, 'extensions.persistedQuery.sha256Hash');
  else expect(ext.persistedQuery?.sha256Hash, `no persistedQuery hash in ${request.url}`);
}

// ---------------------------------------------------- the caching client

/** An interceptor (inside the cache) recording the requests that reach the network and their status. */
function recordNetwork(log) {
  return (dispatch) => (opts, handler) =>
    dispatch(opts, {
      onRequestStart: (controller, context) => handler.onRequestStart?.(controller, context),
      onRequestUpgrade: (...args) => handler.onRequestUpgrade?.(...args),
      onResponseStart: (controller, status, headers, message) => {
        log.push({ method: opts.method, path: opts.path, status, headers: opts.headers });
        return handler.onResponseStart?.(controller, status, headers, message);
      },
      onResponseData: (controller, chunk) => handler.onResponseData?.(controller, chunk),
      onResponseEnd: (controller, trailers) => handler.onResponseEnd?.(controller, trailers),
      onResponseError: (controller, err) => handler.onResponseError?.(controller, err),
    });
}

// ----------------------------------------------------------------- figures

/** Requests per second and bytes per request of one request, sent by `concurrency` workers for `seconds`. */
async function measure(base, { method = 'GET', path, headers = {}, body }, expectedStatus) {
  const pool = new Pool(base, { connections: FIGURE_CONCURRENCY });
  const requestBytes = Buffer.byteLength(path) + (body ? Buffer.byteLength(body) : 0);
  let requests = 0;
  let responseBytes = 0;
  const statuses = new Map();
  const started = performance.now();
  const end = started + FIGURE_SECONDS * 1000;
  const worker = async () => {
    while (performance.now() < end) {
      const res = await pool.request({ method, path, headers, body });
      const buf = Buffer.from(await res.body.arrayBuffer());
      requests++;
      responseBytes += buf.length;
      statuses.set(res.statusCode, (statuses.get(res.statusCode) ?? 0) + 1);
    }
  };
  await Promise.all(Array.from({ length: FIGURE_CONCURRENCY }, worker));
  const seconds = (performance.now() - started) / 1000;
  await pool.close();
  const unexpected = [...statuses].filter(([s]) => s !== expectedStatus).map(([s, n]) => `${n}× HTTP ${s}`);
  return {
    rps: requests / seconds,
    request: requestBytes,
    response: requests ? responseBytes / requests : 0,
    unexpected,
  };
}

// --------------------------------------------------------------------- run

async function main() {
  const docs = loadManifest();
  const frontend = await loadFrontend();
  const manifestFile = join(here, 'gen/persisted-documents.json');
  const datastores = join(root, 'datastores');
  // No per-client rate limit: the figures send thousands of requests a second.
  const config = join(here, 'cellgate.yaml');

  console.log(`manifest: ${Object.keys(docs).length} documents (${Object.keys(docs).join(', ')})`);
  const started = await Promise.allSettled(
    ['any', 'only_persisted'].map((mode) =>
      startServer({ bin, datastores, args: ['--config', config, '--persisted-documents', manifestFile, '--documents', mode] })),
  );
  const failed = started.filter((s) => s.status === 'rejected');
  if (failed.length) {
    await Promise.all(started.filter((s) => s.status === 'fulfilled').map((s) => s.value.stop()));
    failures++;
    console.log(`FAIL start the gateways: ${failed.map((s) => s.reason.message).join('\n')}`);
    return;
  }
  const [open, trusted] = started.map((s) => s.value);
  try {
    const keys = await findKeys(open.url, docs);
    console.log(`demo trip ${keys.rowKey} (BASE ref key ${keys.baseRefKey}) at ${open.url}, only_persisted at ${trusted.url}`);
    await manifestChecks(open.url, docs, keys);
    await apolloChecks(open.url, docs, frontend, keys);
    await cachingChecks(open.url, docs, keys);
    await trustedChecks(trusted.url, docs, frontend, keys);
    await badInputChecks(open.url, docs, keys);
    await figures(open.url, docs, keys);
  } catch (err) {
    failures++;
    console.log(`FAIL ${err.message}\n--- gateway log (any documents) ---\n${open.log()}`);
  } finally {
    await Promise.all([open.stop(), trusted.stop()]);
  }
}

// 1. graphql-codegen client preset
async function manifestChecks(base, docs, keys) {
  await check('1. manifest ids are "sha256:" + the SHA-256 hex of their text', () => {
    for (const { id, text, name } of Object.values(docs)) {
      expectEqual(id, `sha256:${sha256(text)}`, name);
    }
  });
  for (const doc of Object.values(docs)) {
    await check(`1. ${doc.name}: GET ?documentId= gives the data of POSTing its text`, async () => {
      const vars = variablesFor[doc.name]?.(keys);
      expect(vars, `no variables for ${doc.name}: add it to variablesFor in persisted.mjs`);
      const byId = expectData(await getById(base, doc.id, vars), 'GET by id');
      const byText = expectData(await postText(base, doc.text, vars), 'POST by text');
      expectEqual(byId, byText, 'data');
    });
  }
  const cell = docs.TripCell;
  const vars = variablesFor.TripCell(keys);
  await check('1. TripCell: POST {documentId} and a bare hex id (GET) give the same data', async () => {
    const expected = expectData(await postText(base, cell.text, vars), 'POST by text');
    expectEqual(expectData(await postById(base, cell.id, vars), 'POST by id'), expected, 'POST {documentId}');
    const bare = cell.id.replace(/^sha256:/, '');
    expectEqual(expectData(await getById(base, bare, vars), 'GET by bare hex'), expected, 'GET bare hex');
  });
}

// 2. Apollo Client with the persisted-queries link
async function apolloChecks(base, docs, frontend, keys) {
  const variables = { rowKey: keys.rowKey };
  let adHocHash;
  await check('2. Apollo, a query not in the manifest: hashed GET → PersistedQueryNotFound, then POST with the text', async () => {
    const log = [];
    const result = await apolloClient(base, log).query({ query: TRIP_ROW, variables, fetchPolicy: 'network-only' });
    expect(result.data?.trips?.row?.rowKey === keys.rowKey, `data: ${show(result)}`);
    expect(log.length === 2, `expected 2 requests, got ${summarize(log)}`);
    expectHashedGet(log[0]);
    const retry = log[1].method === 'POST' ? JSON.parse(log[1].body) : {};
    expect(retry.query && log[1].status === 200, `the retry: ${summarize(log)}`);
    // Apollo hashes the text it sends (its own print, __typename added).
    adHocHash = sha256(retry.query);
    expectEqual(retry.extensions?.persistedQuery?.sha256Hash, adHocHash, 'the retry\'s hash');
    expectHashedGet(log[0], adHocHash);
    return `${summarize(log)}; the miss was HTTP ${log[0].status}`;
  });
  await check('2. Apollo, the same query from a new client: one hashed GET, no text', async () => {
    const log = [];
    const result = await apolloClient(base, log).query({ query: TRIP_ROW, variables, fetchPolicy: 'network-only' });
    expect(result.data?.trips?.row?.rowKey === keys.rowKey, `data: ${show(result)}`);
    expect(log.length === 1 && log[0].status === 200, `expected one GET answered 200, got ${summarize(log)}`);
    expectHashedGet(log[0], adHocHash);
    return summarize(log);
  });
  await check('2. Apollo, a client-preset document: found by its manifest hash at the first GET', async () => {
    const log = [];
    const vars = variablesFor.TripCell(keys);
    const result = await apolloClient(base, log).query({ query: frontend.TripCell, variables: vars, fetchPolicy: 'network-only' });
    expect(log.length === 1 && log[0].status === 200, `expected one GET answered 200, got ${summarize(log)}`);
    expectHashedGet(log[0], docs.TripCell.id);
    const byText = expectData(await postText(base, docs.TripCell.text, vars), 'POST by text');
    expectEqual(result.data, byText, 'Apollo data');
    return `${summarize(log)}, sha256Hash ${show(docs.TripCell.id, 20)}`;
  });
}

// 3. HTTP caching: headers, then undici's cache interceptor in front
async function cachingChecks(base, docs, keys) {
  const cellUrl = graphqlUrl(base, { documentId: docs.TripCell.id, variables: variablesFor.TripCell(keys) });
  const pageUrl = graphqlUrl(base, { documentId: docs.DriverTrips.id, variables: variablesFor.DriverTrips(keys) });

  await check('3. full-key cell GET: Cache-Control public, max-age=31536000, immutable; ETag; Vary: Accept, Authorization', async () => {
    const res = await http(cellUrl);
    expectData(res, 'GET');
    expectEqual(cacheControl(res).sort(), [...IMMUTABLE].sort(), 'Cache-Control');
    expect(res.headers.get('etag'), 'no ETag');
    expect(varyIncludes(res, 'accept', 'authorization'), `Vary: ${res.headers.get('vary')}`);
    return `ETag ${res.headers.get('etag')}`;
  });
  await check('3. full-key cell GET with Authorization: private instead of public', async () => {
    const res = await http(cellUrl, { headers: { authorization: 'Bearer not-checked-with-auth-off' } });
    expectData(res, 'GET');
    expectEqual(cacheControl(res).sort(), ['immutable', 'max-age=31536000', 'private'], 'Cache-Control');
  });
  await check('3. index page, latestCell and row GETs: ETag and Cache-Control no-cache', async () => {
    const urls = [
      pageUrl,
      graphqlUrl(base, { documentId: docs.TripStatus.id, variables: variablesFor.TripStatus(keys) }),
      graphqlUrl(base, { query: print(TRIP_ROW), variables: { rowKey: keys.rowKey } }),
    ];
    for (const url of urls) {
      const res = await http(url);
      expectData(res, `GET ${url.search.slice(0, 40)}…`);
      expectEqual(cacheControl(res), ['no-cache'], `Cache-Control of ${url.search.slice(0, 40)}…`);
      expect(res.headers.get('etag'), `no ETag on ${url.search.slice(0, 40)}…`);
    }
  });
  await check('3. POST, a mutation and an answer with errors: Cache-Control no-store', async () => {
    const post = await postText(base, docs.TripCell.text, variablesFor.TripCell(keys));
    expectData(post, 'POST');
    expectEqual(cacheControl(post), ['no-store'], 'Cache-Control of a POST');
    const mutation = await postText(base, WRITE_NOTE, { rowKey: keys.rowKey });
    expectData(mutation, 'mutation');
    expectEqual(cacheControl(mutation), ['no-store'], 'Cache-Control of a mutation');
    // TripCell without its refKey: a variable error.
    const withErrors = await http(graphqlUrl(base, { documentId: docs.TripCell.id, variables: { rowKey: keys.rowKey, column: 'BASE' } }));
    expect(withErrors.json?.errors, `a GET with errors: expected errors, got ${describe(withErrors)}`);
    expectEqual(cacheControl(withErrors), ['no-store'], 'Cache-Control of a GET with errors');
  });
  await check('3. If-None-Match with the ETag of an index page: 304 with an empty body', async () => {
    const first = await http(pageUrl);
    expectData(first, 'GET');
    const etag = first.headers.get('etag');
    expect(etag, 'no ETag');
    const again = await http(pageUrl, { headers: { 'if-none-match': etag } });
    expect(again.status === 304, `expected 304: ${describe(again)}`);
    expect(again.text === '', `the 304 has a body: ${show(again.text)}`);
    return `ETag ${etag}`;
  });

  const network = [];
  const cached = new Agent().compose(recordNetwork(network), interceptors.cache());
  await check('3. undici cache: the second full-key cell GET is served from the cache (the server counts no request)', async () => {
    const before = await graphqlRequestCount(base);
    const first = await http(cellUrl, { dispatcher: cached });
    expectData(first, 'first GET');
    const afterFirst = await settledCount(base, before);
    expect(afterFirst > before, `cellgate_graphql_requests_total did not count the first GET (${before} → ${afterFirst})`);
    const second = await http(cellUrl, { dispatcher: cached });
    expectData(second, 'second GET');
    expectEqual(second.text, first.text, 'cached body');
    await sleep(200);
    const afterSecond = await graphqlRequestCount(base);
    expect(afterSecond === afterFirst, `the server counted the second GET (${afterFirst} → ${afterSecond})`);
    const reached = network.filter((r) => r.path === cellUrl.pathname + cellUrl.search);
    expect(reached.length === 1, `${reached.length} requests reached the network`);
    return `requests counted ${before} → ${afterFirst} → ${afterSecond}`;
  });
  await check('3. undici cache: the second index page GET is revalidated (If-None-Match → 304) and still has the body', async () => {
    const first = await http(pageUrl, { dispatcher: cached });
    expectData(first, 'first GET');
    const second = await http(pageUrl, { dispatcher: cached });
    expect(second.status === 200, `the cached client got ${describe(second)}`);
    expectEqual(second.text, first.text, 'body of the revalidated answer');
    const reached = network.filter((r) => r.path === pageUrl.pathname + pageUrl.search);
    expectEqual(reached.map((r) => r.status), [200, 304], 'statuses on the network');
    const conditional = reached[1].headers?.['if-none-match'];
    expectEqual(conditional, first.headers.get('etag'), 'If-None-Match of the revalidation');
  });
}

/** The request count once it has moved past `before` (it may be recorded just after the response). */
async function settledCount(base, before) {
  let count = before;
  for (let i = 0; i < 20 && count === before; i++) {
    count = await graphqlRequestCount(base);
    if (count === before) await sleep(50);
  }
  return count;
}

// 4. --documents only_persisted
async function trustedChecks(base, docs, frontend, keys) {
  const vars = variablesFor.TripCell(keys);
  await check('4. only_persisted: a free document over POST → 403 PERSISTED_DOCUMENT_REQUIRED', async () =>
    expectErrorCode(await postText(base, print(TRIP_ROW), { rowKey: keys.rowKey }), 'PERSISTED_DOCUMENT_REQUIRED', 403));
  await check('4. only_persisted: APQ registration (text + hash) → 403 PERSISTED_DOCUMENT_REQUIRED', async () => {
    const query = print(TRIP_ROW);
    const res = await postJson(base, { query, variables: { rowKey: keys.rowKey }, extensions: apq(sha256(query)) });
    return expectErrorCode(res, 'PERSISTED_DOCUMENT_REQUIRED', 403);
  });
  await check('4. only_persisted: the manifest document by id → 200 (GET and POST)', async () => {
    const byGet = expectData(await getById(base, docs.TripCell.id, vars), 'GET by id');
    expect(byGet.trips.cell?.rowKey === keys.rowKey, `data: ${show(byGet)}`);
    expectEqual(expectData(await postById(base, docs.TripCell.id, vars), 'POST by id'), byGet, 'POST by id');
  });
  await check('4. only_persisted: Apollo with a client-preset document → one hashed GET, 200', async () => {
    const log = [];
    const result = await apolloClient(base, log).query({ query: frontend.TripCell, variables: vars, fetchPolicy: 'network-only' });
    expect(log.length === 1 && log[0].status === 200, `expected one GET answered 200, got ${summarize(log)}`);
    expect(result.data?.trips?.cell?.rowKey === keys.rowKey, `data: ${show(result)}`);
  });
}

// 5. bad ids and hashes
async function badInputChecks(base, docs, keys) {
  const vars = variablesFor.TripCell(keys);
  await check('5. an unknown documentId → PERSISTED_DOCUMENT_NOT_FOUND', async () =>
    expectErrorCode(await getById(base, `sha256:${sha256('no such document')}`, vars), 'PERSISTED_DOCUMENT_NOT_FOUND'));
  await check('5. a malformed documentId (sha256:xyz) → HTTP 400 BAD_REQUEST', async () =>
    expectErrorCode(await getById(base, 'sha256:xyz', vars), 'BAD_REQUEST', 400));
  await check('5. an unknown APQ hash → PersistedQueryNotFound / PERSISTED_QUERY_NOT_FOUND', async () => {
    const res = await http(graphqlUrl(base, { variables: vars, extensions: apq(sha256('never registered')) }));
    const status = expectErrorCode(res, 'PERSISTED_QUERY_NOT_FOUND');
    expect(res.json.errors.some((e) => e.message === 'PersistedQueryNotFound'), `message: ${describe(res)}`);
    return status;
  });
  await check('5. APQ with a hash that is not the query\'s → PERSISTED_QUERY_HASH_MISMATCH', async () => {
    const res = await postJson(base, { query: print(TRIP_ROW), variables: { rowKey: keys.rowKey }, extensions: apq(sha256('another text')) });
    return expectErrorCode(res, 'PERSISTED_QUERY_HASH_MISMATCH');
  });
  await check('5. a manifest document by its bare-hex APQ hash (GET, no text) → 200', async () => {
    const bare = docs.TripCell.id.replace(/^sha256:/, '');
    expectData(await http(graphqlUrl(base, { variables: vars, extensions: apq(bare) })), 'hashed GET');
  });
}

// 6. figures
async function figures(base, docs, keys) {
  const vars = variablesFor.TripCell(keys);
  const byId = graphqlUrl(base, { documentId: docs.TripCell.id, variables: vars });
  const etag = (await http(byId)).headers.get('etag');
  const path = byId.pathname + byId.search;
  const cases = [
    ['(a) POST by text       ', { method: 'POST', path: '/graphql', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ query: docs.TripCell.text, variables: vars }) }, 200],
    ['(b) GET by id          ', { path }, 200],
    ['(c) GET by id, 304     ', { path, headers: etag ? { 'if-none-match': etag } : {} }, 304],
  ];
  console.log(`6. figures: the TripCell read for ${FIGURE_SECONDS} s each, ${FIGURE_CONCURRENCY} concurrent requests (undici Pool, no cache)`);
  for (const [label, request, status] of cases) {
    const f = await measure(base, request, status);
    const note = f.unexpected.length ? `  (not HTTP ${status}: ${f.unexpected.join(', ')})` : '';
    console.log(`   ${label} ${f.rps.toFixed(0).padStart(6)} req/s  ${(f.request + f.response).toFixed(0).padStart(5)} bytes/request (request ${f.request}, response body ${f.response.toFixed(0)})${note}`);
  }
}

await main();
await plain.close();
console.log(failures ? `${failures} check(s) failed` : 'all checks passed');
process.exit(failures ? 1 : 0);
