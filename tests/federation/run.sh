#!/usr/bin/env bash
# cellgate as an Apollo Federation 2 subgraph in a real supergraph: composed
# with @theguild/federation-composition next to a small Node subgraph
# (reviews.mjs) and served by Hive Gateway (see README.md). Starts its own
# gateways on free ports; on PostgreSQL too when CELLGATE_TEST_POSTGRES_URL
# is set.
# Usage: tests/federation/run.sh [path/to/cellgate]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cellgate="${1:-$root/target/debug/cellgate}"
[ -x "$cellgate" ] || { echo "no cellgate binary at $cellgate (cargo build -p cellgate)" >&2; exit 1; }
cellgate="$(cd "$(dirname "$cellgate")" && pwd)/$(basename "$cellgate")"
cd "$here"
npm ci --no-audit --no-fund --loglevel=error
# The subgraph SDLs and supergraphs, for inspection.
rm -rf gen
node federation.mjs "$cellgate"
