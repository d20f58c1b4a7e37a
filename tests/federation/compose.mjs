// Composes a Federation 2 supergraph from running subgraphs with
// @theguild/federation-composition: fetches each subgraph's SDL with
// `{ _service { sdl } }` and writes the supergraph SDL to --out.
//
//   node compose.mjs --out gen/supergraph.graphql \
//     cellgate=http://127.0.0.1:8080/graphql reviews=http://127.0.0.1:4002/graphql
//
// Exits 1 with the composition errors (one a line, with their code) if it
// does not compose. federation.mjs runs it as it is written here.
import { mkdirSync, writeFileSync } from 'node:fs';
import { dirname } from 'node:path';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

import { composeServices } from '@theguild/federation-composition';
import { parse } from 'graphql';

/** A subgraph's SDL, from `{ _service { sdl } }` POSTed to its URL. */
export async function fetchSubgraphSdl(url) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ query: '{ _service { sdl } }' }),
  }).catch((err) => {
    throw new Error(`${url}: ${err.message}${err.cause ? ` (${err.cause.message ?? err.cause})` : ''}`);
  });
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    throw new Error(`${url}: HTTP ${res.status} ${text.slice(0, 300)}`);
  }
  const sdl = json?.data?._service?.sdl;
  if (typeof sdl !== 'string') {
    throw new Error(`${url}: no _service { sdl }: HTTP ${res.status} ${JSON.stringify(json.errors ?? json).slice(0, 500)}`);
  }
  return sdl;
}

/**
 * Composes [{ name, url, sdl }]: { supergraphSdl } or { errors: [string] }.
 */
export function compose(subgraphs) {
  const result = composeServices(subgraphs.map(({ name, url, sdl }) => ({ name, url, typeDefs: parse(sdl) })));
  if (result.errors?.length) {
    return { errors: result.errors.map((e) => `${e.extensions?.code ?? 'ERROR'}: ${e.message}`) };
  }
  return { supergraphSdl: result.supergraphSdl };
}

// `node compose.mjs --out FILE name=url …`
if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const { values, positionals } = parseArgs({
    options: { out: { type: 'string', default: 'supergraph.graphql' } },
    allowPositionals: true,
  });
  const subgraphs = positionals.map((arg) => {
    const m = /^([A-Za-z_][A-Za-z0-9_-]*)=(https?:\/\/\S+)$/.exec(arg);
    if (!m) {
      console.error(`not NAME=URL: ${arg}\nusage: node compose.mjs --out FILE NAME=URL…`);
      process.exit(2);
    }
    return { name: m[1], url: m[2] };
  });
  if (!subgraphs.length) {
    console.error('usage: node compose.mjs --out FILE NAME=URL…');
    process.exit(2);
  }
  for (const s of subgraphs) {
    try {
      s.sdl = await fetchSubgraphSdl(s.url);
    } catch (err) {
      console.error(`no SDL from ${s.name}: ${err.message}`);
      process.exit(1);
    }
  }
  const { supergraphSdl, errors } = compose(subgraphs);
  if (errors) {
    console.error(`composition failed (${errors.length} errors):\n${errors.join('\n')}`);
    process.exit(1);
  }
  mkdirSync(dirname(values.out), { recursive: true });
  writeFileSync(values.out, supergraphSdl);
  console.log(`supergraph of ${subgraphs.map((s) => s.name).join(', ')} written to ${values.out}`);
}
