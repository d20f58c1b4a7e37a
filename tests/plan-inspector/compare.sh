#!/usr/bin/env bash
# For every golden pair of gateway/tests/plan: the SDL of both sides
# (`cellgate schema`), the plan (`cellgate plan --format json`), and
# graphql-inspector's diff of the two SDLs, compared by compare.mjs.
# Usage: tests/plan-inspector/compare.sh [path/to/cellgate]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cellgate="${1:-$root/target/debug/cellgate}"
[ -x "$cellgate" ] || { echo "no cellgate binary at $cellgate (cargo build -p cellgate)" >&2; exit 1; }
cellgate="$(cd "$(dirname "$cellgate")" && pwd)/$(basename "$cellgate")"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$here" && npm ci --no-audit --no-fund --loglevel=error)
triples=()
for case in "$root"/gateway/tests/plan/*/; do
  name="$(basename "$case")"
  "$cellgate" schema --datastores "$case/before" --out "$work/$name.old.graphql" >/dev/null
  "$cellgate" schema --datastores "$case/after" --out "$work/$name.new.graphql" >/dev/null
  (cd "$case" && "$cellgate" plan after --base-dir before --format json >"$work/$name.plan.json") || true
  triples+=("$work/$name.old.graphql" "$work/$name.new.graphql" "$work/$name.plan.json")
done
node "$here/compare.mjs" "${triples[@]}"
