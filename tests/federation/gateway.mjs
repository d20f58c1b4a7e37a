// Serves a supergraph with Hive Gateway's runtime behind node:http.
//
//   node gateway.mjs --supergraph gen/supergraph.graphql [--port 4000]
//
// Prints `gateway listening on http://127.0.0.1:PORT/graphql` (port 0: a
// free one) and serves until SIGTERM or Ctrl-C. federation.mjs runs it as it
// is written here.
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';
import { parseArgs } from 'node:util';

import { createGatewayRuntime } from '@graphql-hive/gateway-runtime';

const { values } = parseArgs({
  options: {
    supergraph: { type: 'string', default: 'supergraph.graphql' },
    port: { type: 'string', default: '4000' },
    host: { type: 'string', default: '127.0.0.1' },
  },
});

const gateway = createGatewayRuntime({
  // The supergraph SDL (the runtime also takes a path or a URL).
  supergraph: readFileSync(values.supergraph, 'utf8'),
  logging: 'warn',
  // Subgraph errors as the subgraphs wrote them (message, extensions.code).
  maskedErrors: false,
});
const server = createServer(gateway);
server.listen(Number(values.port), values.host, () => {
  console.log(`gateway listening on http://${values.host}:${server.address().port}/graphql`);
});

let stopping = false;
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, async () => {
    if (stopping) return;
    stopping = true;
    server.closeAllConnections();
    server.close();
    await gateway[Symbol.asyncDispose]();
    process.exit(0);
  });
}
