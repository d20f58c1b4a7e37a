#!/usr/bin/env bash
# Runs the graphql-http GraphQL-over-HTTP server audit against a freshly
# started `cellgate serve` (embedded SQLite in a temp dir, the repository's
# datastores). Exits non-zero if any MUST-level audit fails.
#
#   tests/graphql-http-audit.sh            # uses target/debug/cellgate, builds it if missing
#   CELLGATE_BIN=path/to/cellgate tests/graphql-http-audit.sh
#
# Needs node (>= 18, for fetch) and npm with access to the npm registry.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${CELLGATE_BIN:-$root/target/debug/cellgate}"
if [[ ! -x "$bin" ]]; then
  (cd "$root" && cargo build -p cellgate)
fi

work="$(mktemp -d)"
server_pid=""
cleanup() {
  if [[ -n "$server_pid" ]]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# The audit client, in its own directory so its imports resolve there.
cp "$root/tests/graphql-http-audit.mjs" "$work/audit.mjs"
(cd "$work" && echo '{"private": true, "type": "module"}' > package.json \
  && npm install --no-audit --no-fund --silent graphql-http@1 graphql@16)

"$bin" serve --listen 127.0.0.1:0 --data "$work/data" --datastores "$root/datastores" \
  >"$work/stdout.log" 2>"$work/stderr.log" &
server_pid=$!

url=""
for _ in $(seq 1 600); do
  line="$(grep -m1 '^cellgate listening on ' "$work/stdout.log" || true)"
  if [[ -n "$line" ]]; then
    url="$(awk '{print $4}' <<<"$line")"
    break
  fi
  if ! kill -0 "$server_pid" 2>/dev/null; then
    echo "cellgate serve exited before listening:" >&2
    cat "$work/stderr.log" >&2
    exit 1
  fi
  sleep 0.1
done
if [[ -z "$url" ]]; then
  echo "cellgate serve did not print its address within 60 s:" >&2
  cat "$work/stderr.log" >&2
  exit 1
fi

node "$work/audit.mjs" "$url/graphql"
