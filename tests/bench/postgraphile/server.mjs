// Serves graphile.config.mjs over node:http at PGL_HOST:PGL_PORT/graphql.
// Prints `postgraphile listening on http://HOST:PORT/graphql` once ready;
// exits on SIGTERM/SIGINT.
import { createServer } from "node:http";
import { postgraphile } from "postgraphile";
import { grafserv } from "postgraphile/grafserv/node";
import preset from "./graphile.config.mjs";

const pgl = postgraphile(preset);
const serv = pgl.createServ(grafserv);
const server = createServer();
server.on("error", (e) => {
  console.error(`server error: ${e.message}`);
  process.exit(1);
});
// Keep-alive connections for the load tool, as cellgate keeps them.
server.keepAliveTimeout = 60_000;
await serv.addTo(server);
// Build the schema before accepting requests, so the first one is not slow.
await pgl.getSchema();
const { host, port } = preset.grafserv;
// Port 0 picks a free port; the line below names the one bound.
server.listen(port, host, () => {
  const address = server.address();
  console.log(`postgraphile listening on http://${address.address}:${address.port}/graphql`);
});

let stopping = false;
async function stop() {
  if (stopping) return;
  stopping = true;
  server.close();
  server.closeAllConnections?.();
  await pgl.release();
  process.exit(0);
}
process.on("SIGTERM", stop);
process.on("SIGINT", stop);
