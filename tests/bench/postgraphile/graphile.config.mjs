// PostGraphile v5 as the benchmark serves it: the Amber preset with the
// connection-filter preset, production settings (no GraphiQL, no explain,
// no watch mode), the `plain` schema of the benchmark database.
//
// Read by server.mjs; the database URL, the pool size and the port come
// from the environment run.sh sets.
import { makePgService } from "postgraphile/adaptors/pg";
import { PostGraphileAmberPreset } from "postgraphile/presets/amber";
import { PostGraphileConnectionFilterPreset } from "postgraphile-plugin-connection-filter";

const env = (name, fallback) => process.env[name] ?? fallback;

/** @type {GraphileConfig.Preset} */
const preset = {
  extends: [PostGraphileAmberPreset, PostGraphileConnectionFilterPreset],
  pgServices: [
    makePgService({
      connectionString: env("PGL_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/cellgate_vs_postgraphile"),
      schemas: ["plain"],
      // The same pool size as cellgate's storage.max_connections.
      poolConfig: { max: Number(env("PGL_POOL_MAX", "16")) },
    }),
  ],
  grafserv: {
    host: env("PGL_HOST", "127.0.0.1"),
    port: Number(env("PGL_PORT", "0")),
    graphqlPath: "/graphql",
    graphiql: false,
    graphqlOverGET: false,
    watch: false,
    websockets: false,
    // A write of 50 trips is ~40 kB; loads never go through PostGraphile.
    maxRequestLength: 4 * 1024 * 1024,
  },
  grafast: {
    explain: false,
  },
};

export default preset;
