#!/usr/bin/env bash
# Persisted documents, automatic persisted queries and HTTP caching of
# `cellgate serve`, with real clients: graphql-codegen's client preset (its
# manifest), Apollo Client's persisted-queries link and undici's cache
# interceptor (see README.md). Starts its own gateways on free ports.
# Usage: tests/persisted/run.sh [path/to/cellgate]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cellgate="${1:-$root/target/debug/cellgate}"
[ -x "$cellgate" ] || { echo "no cellgate binary at $cellgate (cargo build -p cellgate)" >&2; exit 1; }
cellgate="$(cd "$(dirname "$cellgate")" && pwd)/$(basename "$cellgate")"
cd "$here"
npm ci --no-audit --no-fund --loglevel=error
# The manifest (gen/persisted-documents.json) and typed documents from src/.
rm -rf gen
npx --no-install graphql-codegen --config codegen.ts --silent
node persisted.mjs "$cellgate"
