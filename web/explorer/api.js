// Talks to the gateway: `POST /graphql` for everything, `/metrics` and
// `/readyz` for the health page. Values always travel as GraphQL variables.

import { requestHeaders } from './settings.js';
import { CATALOG_QUERY, buildCatalog } from './catalog.js';
import { TOPOLOGY_QUERY, buildTopology } from './topology.js';

const base = new URL('../', window.location.href);

/** An error a request ended with: GraphQL errors (with their codes) or HTTP. */
export class ApiError extends Error {
  constructor(message, codes = []) {
    super(message);
    this.name = 'ApiError';
    this.codes = codes;
  }
}

/**
 * Runs one GraphQL operation and returns its `data`; throws ApiError when
 * the response has errors.
 */
export async function graphql(query, variables = {}, { signal } = {}) {
  let response;
  try {
    response = await fetch(new URL('graphql', base), {
      method: 'POST',
      headers: {
        ...requestHeaders(),
        'Content-Type': 'application/json',
        Accept: 'application/graphql-response+json, application/json',
      },
      body: JSON.stringify({ query, variables }),
      signal,
    });
  } catch (error) {
    if (error.name === 'AbortError') throw error;
    throw new ApiError('the gateway did not answer');
  }
  let body = null;
  try {
    body = await response.json();
  } catch {
    throw new ApiError(`the gateway answered HTTP ${response.status} without a GraphQL response`);
  }
  if (body.errors && body.errors.length > 0) {
    const codes = [...new Set(body.errors.map((e) => e.extensions && e.extensions.code).filter(Boolean))];
    throw new ApiError(body.errors.map((e) => e.message).join('; '), codes);
  }
  if (!response.ok || !body.data) {
    throw new ApiError(`the gateway answered HTTP ${response.status}`);
  }
  return body.data;
}

/** GET a plain-text endpoint of the gateway (`metrics`, `readyz`). */
export async function getText(path, { signal } = {}) {
  let response;
  try {
    response = await fetch(new URL(path, base), { headers: requestHeaders(), signal });
  } catch (error) {
    if (error.name === 'AbortError') throw error;
    throw new ApiError('the gateway did not answer');
  }
  return { status: response.status, ok: response.ok, text: await response.text() };
}

/** The playground's address with an operation to open in a tab. */
export function playgroundLink(query, variables) {
  const url = new URL(base);
  url.searchParams.set('query', query);
  if (variables && Object.keys(variables).length > 0) {
    url.searchParams.set('variables', JSON.stringify(variables, null, 2));
  }
  return url.href;
}

let catalog = null;

/** The catalog (see catalog.js), loaded once per page load. */
export function loadCatalog() {
  if (!catalog) {
    catalog = graphql(CATALOG_QUERY).then(buildCatalog);
    catalog.catch(() => {
      catalog = null;
    });
  }
  return catalog;
}

/** Each datastore's topology as served now (see topology.js), read at each call. */
export async function loadTopology({ signal } = {}) {
  return buildTopology(await graphql(TOPOLOGY_QUERY, {}, { signal }));
}
