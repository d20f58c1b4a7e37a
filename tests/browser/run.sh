#!/usr/bin/env bash
# Browser tests of the playground (/) and the web explorer (/ui/): Node's
# test runner drives Debian's Chromium (never a downloaded browser) through
# playwright-core against real `cellgate serve --demo` processes, each on a
# free port with its own temp data directory.
#
#   tests/browser/run.sh                  # builds target/debug/cellgate first
#   CELLGATE_BIN=path/to/cellgate tests/browser/run.sh
#   CELLGATE_UPDATE_SCREENSHOTS=1 tests/browser/run.sh   # also refresh web/screenshots/
#
# Offline is proven three ways: the tests run in a network namespace that has
# only the loopback interface (when the machine allows creating one), the
# browser resolves no host name but 127.0.0.1, and every request to anything
# else is aborted and fails the test that made it.
#
# Needs: /usr/bin/chromium (or CHROMIUM=…), Node >= 20 and npm with access
# to the npm registry (for `npm ci`, before the network is cut).
# Screenshots at 1280 and 390 px: target/browser-artifacts/.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target="${CARGO_TARGET_DIR:-$root/target}"

export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"
if [[ ! -x "$CHROMIUM" ]]; then
  echo "no Chromium at $CHROMIUM: apt-get install chromium (or set CHROMIUM)" >&2
  exit 1
fi

if [[ -z "${CELLGATE_BIN:-}" ]]; then
  # Always build: the pages are embedded in the binary, so a stale binary
  # would test stale pages.
  (cd "$root" && cargo build -q -p cellgate)
  CELLGATE_BIN="$target/debug/cellgate"
fi
export CELLGATE_BIN

(cd "$here" && npm ci --no-audit --no-fund --loglevel=error)

export BROWSER_ARTIFACTS="$target/browser-artifacts"
rm -rf "$BROWSER_ARTIFACTS"
mkdir -p "$BROWSER_ARTIFACTS"

tests=(modules.test.mjs playground.test.mjs explorer.test.mjs triggers.test.mjs auth.test.mjs)
run_tests=(node --test --test-reporter=spec --test-concurrency=1 "${tests[@]}")

cd "$here"
if command -v unshare >/dev/null && command -v ip >/dev/null && unshare --net true 2>/dev/null; then
  echo "browser tests: in a network namespace with only the loopback interface"
  unshare --net bash -c 'ip link set lo up && exec "$@"' bash "${run_tests[@]}"
else
  echo "browser tests: cannot create a network namespace; the browser blocks all but 127.0.0.1"
  "${run_tests[@]}"
fi

if [[ "${CELLGATE_UPDATE_SCREENSHOTS:-}" == 1 ]]; then
  mkdir -p "$root/web/screenshots"
  cp "$BROWSER_ARTIFACTS/explorer.png" "$root/web/screenshots/explorer.png"
  echo "updated web/screenshots/explorer.png"
fi
