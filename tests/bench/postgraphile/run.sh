#!/usr/bin/env bash
# cellgate vs PostGraphile v5, side by side on the same local PostgreSQL.
#
#   tests/bench/postgraphile/run.sh [--trips N] [--duration S] [--seed N]
#       [--concurrency "8 32"] [--drivers N] [--workloads "index bodies ..."]
#       [--keep] [--smoke]
#
# Loads the same trips into cellgate (through tripsPutCells: a BASE and a
# STATUS cell each) and into a plain table served by PostGraphile (COPY),
# checks that both APIs answer the same rows for every read workload, then
# drives both with the same wrk script, one workload after another (reads
# first, then the write; --workloads picks some, default all):
#   index    driverPartnerIndex: 20 trips of one driver since a time, 4 fields
#   bodies   the same page with each row's BASE body
#   city     cityTripsIndex: one city, since a time, fareTotal <= X, newest
#            first, 20 rows, 4 fields
#   in       driverPartnerIndex with driverPartnerUuidIn (5 drivers)
#   bodies2  the `bodies` page with each row's BASE and STATUS bodies
#   filter   cityTripsIndex with the filter string argument (city, time,
#            fare_total > X, status = "completed")
#   write    50 new trips per request
# pgbench runs the SQL cellgate sent for each read as a floor. Around every
# timed run it reads the CPU time of the gateway process and of PostgreSQL
# (all postgres processes plus the postmaster's reaped children) from /proc.
# Prints a markdown table (req/s, latencies, ratios, gateway and PostgreSQL
# CPU ms per request, statements per request, index catch-up) and writes
# it, with a JSON twin, to tests/bench/postgraphile/results/<timestamp>.{md,json}.
#
# Needs PostgreSQL at 127.0.0.1:5432 (user postgres, trust auth) with its
# log at $PG_LOG and its data directory readable (the postmaster's pid);
# installs Node 22 and PostGraphile from npm into node_modules here, and wrk
# from Debian if missing. cellgate is $CELLGATE_BIN (default
# <repo>/target/release/cellgate, built with cargo if missing) serving
# $BENCH_DATASTORES (default <repo>/datastores). Exits
# non-zero on any failed request, mismatch or timeout.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../../.." && pwd)"

TRIPS=200000
DRIVERS=1000
DURATION=10
WARMUP=2
SEED=42
CONCURRENCY="8 32"
CONCURRENCY_SET=0
WORKLOADS=""
KEEP=0
SMOKE=0
DB="${BENCH_DATABASE:-cellgate_vs_postgraphile}"
PG_HOST=127.0.0.1
PG_PORT=5432
PG_USER=postgres
PG_LOG="${PG_LOG:-/var/log/postgresql/postgresql-15-main.log}"
POOL=16
PGL_ROLE=postgraphile_bench
CELLGATE_BIN="${CELLGATE_BIN:-$REPO/target/release/cellgate}"
# The definitions cellgate serves (another checkout's, to compare releases).
DATASTORES="${BENCH_DATASTORES:-$REPO/datastores}"
# The command as run, for the report: arguments with spaces (a workload
# list) quoted so it can be pasted back.
COMMAND="$0"
for arg in "$@"; do
  case "$arg" in *[[:space:]]*|"") COMMAND+=" \"$arg\"" ;; *) COMMAND+=" $arg" ;; esac
done

usage() { sed -n '2,34p' "$0" | sed 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
  case "$1" in
    --trips) TRIPS="$2"; shift 2 ;;
    --drivers) DRIVERS="$2"; shift 2 ;;
    --duration) DURATION="$2"; shift 2 ;;
    --seed) SEED="$2"; shift 2 ;;
    --concurrency) CONCURRENCY="$2"; CONCURRENCY_SET=1; shift 2 ;;
    --workloads) WORKLOADS="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --smoke) SMOKE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
  esac
done
if [ "$SMOKE" = 1 ]; then
  # Tiny: checks the answers and that every tool works, not the numbers.
  # At concurrency 32 PostGraphile's writes take longer than a 2 s run.
  TRIPS=2000 DRIVERS=50 DURATION=2 WARMUP=1
  [ "$CONCURRENCY_SET" = 1 ] || CONCURRENCY=8
fi
# Validated, in run order (reads first, then the write).
WORKLOADS="$(python3 "$HERE/bench.py" --work "$HERE" workloads "$WORKLOADS")" || exit 2

STAMP="$(date -u +%Y%m%dT%H%M%SZ)"
WORK="$HERE/work/$STAMP"
RESULTS="$HERE/results"
mkdir -p "$WORK/runs" "$RESULTS"
PG_URL="postgres://$PG_USER@$PG_HOST:$PG_PORT/$DB"

log() { printf '\n== %s  %s\n' "$(date -u +%H:%M:%S)" "$*"; }
fail() { echo "FAILED: $*" >&2; exit 1; }
psql_db() {
  PGCONNECT_TIMEOUT=10 timeout 900 psql -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -X -q \
    -v ON_ERROR_STOP=1 "$@"
}
bench() {
  python3 "$HERE/bench.py" --work "$WORK" --database "$DB" --pg-host "$PG_HOST" \
    --pg-port "$PG_PORT" --pg-user "$PG_USER" --seed "$SEED" \
    ${CG_URL:+--cellgate "$CG_URL/graphql"} ${PGL_URL:+--postgraphile "$PGL_URL"} "$@"
}

# --- clean-up -------------------------------------------------------------
CG_PID=""
PGL_PID=""
POLLER_PID=""
LOGGING=0
stop_pid() {
  local pid="$1" i
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 150); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}
cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ "$LOGGING" = 1 ]; then
    psql_db -d postgres -c "ALTER SYSTEM RESET log_statement" -c "SELECT pg_reload_conf()" \
      >/dev/null 2>&1 || echo "warning: could not reset log_statement" >&2
  fi
  stop_pid "$POLLER_PID"
  if [ "$KEEP" = 1 ]; then
    echo "--keep: left running: cellgate ${CG_URL:-—} (pid ${CG_PID:-—}), PostGraphile" \
      "${PGL_URL:-—} (pid ${PGL_PID:-—}); database $DB; work files in $WORK"
  else
    stop_pid "$CG_PID"
    stop_pid "$PGL_PID"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits (at most $2 seconds) for a line matching $3 in file $1; prints the
# first URL on it.
wait_for_url() {
  local file="$1" limit="$2" pattern="$3" pid="$4" end=$((SECONDS + $2)) line
  while [ "$SECONDS" -lt "$end" ]; do
    line="$(grep -m1 -E "$pattern" "$file" 2>/dev/null || true)"
    if [ -n "$line" ]; then
      grep -oE 'http://[0-9.:]+' <<<"$line" | head -1
      return 0
    fi
    kill -0 "$pid" 2>/dev/null || { cat "$file" >&2; fail "the server exited (log: $file)"; }
    sleep 0.1
  done
  cat "$file" >&2
  fail "no '$pattern' within $limit s (log: $file)"
}

# --- setup ------------------------------------------------------------------
log "setup"
command -v python3 >/dev/null || fail "python3 is needed"
command -v psql >/dev/null || fail "psql is needed"
command -v pgbench >/dev/null || fail "pgbench is needed"
if ! command -v wrk >/dev/null; then
  echo "installing wrk from Debian"
  timeout 600 apt-get install -y wrk >/dev/null 2>&1 \
    || { timeout 600 apt-get update >/dev/null && timeout 600 apt-get install -y wrk >/dev/null; } \
    || fail "cannot install wrk"
fi
NODE="$HERE/node_modules/node/bin/node"
if ! "$NODE" --version 2>/dev/null | grep -q '^v22\.' \
    || [ ! -f "$HERE/node_modules/postgraphile/package.json" ] \
    || [ ! -f "$HERE/node_modules/postgraphile-plugin-connection-filter/package.json" ] \
    || [ "$HERE/package-lock.json" -nt "$HERE/node_modules/.package-lock.json" ]; then
  echo "installing Node 22 and PostGraphile (npm ci)"
  (cd "$HERE" && timeout 600 npm ci --no-audit --no-fund --loglevel=error)
fi
"$NODE" --version | grep -q '^v22\.' || fail "$NODE is not Node 22"
if [ ! -x "$CELLGATE_BIN" ]; then
  echo "$CELLGATE_BIN is missing: cargo build --release -p cellgate"
  (cd "$REPO" && timeout 3600 cargo build --release -p cellgate)
  CELLGATE_BIN="$REPO/target/release/cellgate"
fi
psql_db -d postgres -c "SELECT 1" >/dev/null \
  || fail "PostgreSQL does not answer at $PG_HOST:$PG_PORT as $PG_USER"
[ -r "$PG_LOG" ] || fail "cannot read the PostgreSQL log $PG_LOG (set PG_LOG)"
# The postmaster, whose children (and their reaped CPU time) are the
# PostgreSQL side of the CPU figures.
PG_DATA="$(psql_db -d postgres -At -c 'SHOW data_directory')"
PG_POSTMASTER="$(head -1 "$PG_DATA/postmaster.pid" 2>/dev/null || true)"
[ -n "$PG_POSTMASTER" ] && [ -r "/proc/$PG_POSTMASTER/stat" ] \
  || fail "cannot read the postmaster's pid from $PG_DATA/postmaster.pid"
command -v pgrep >/dev/null || fail "pgrep is needed (procps)"

echo "cellgate: $CELLGATE_BIN; node $("$NODE" --version); $(wrk --version 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "trips $TRIPS, drivers $DRIVERS, seed $SEED, duration $DURATION s, concurrency $CONCURRENCY"
echo "workloads: $WORKLOADS; postmaster pid $PG_POSTMASTER"
echo "work files: $WORK"

# --- database ---------------------------------------------------------------
log "database $DB (dropped and created)"
psql_db -d postgres <<SQL
DROP DATABASE IF EXISTS "$DB" WITH (FORCE);
CREATE DATABASE "$DB";
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PGL_ROLE') THEN
    CREATE ROLE $PGL_ROLE LOGIN;
  END IF;
END \$\$;
SQL
psql_db -d "$DB" <<SQL
CREATE SCHEMA plain;
-- fare_total (from body.fare.total), status, is_completed and status_body
-- (the STATUS cell) mirror cellgate's city_trips_index and STATUS column;
-- the written trips leave them NULL, as cellgate's writes carry no STATUS.
CREATE TABLE plain.trips (
  row_key uuid PRIMARY KEY,
  driver_partner_uuid uuid NOT NULL,
  city_uuid uuid NOT NULL,
  trip_created_at timestamptz NOT NULL,
  body jsonb NOT NULL,
  fare_total double precision,
  status text,
  is_completed boolean,
  status_body jsonb
);
CREATE INDEX trips_driver_created ON plain.trips (driver_partner_uuid, trip_created_at, row_key);
-- For the city and filter queries: one city, in time order either way, the
-- other conditions checked on the rows (as cellgate's
-- (city_uuid, trip_created_at, row_key) index on its index table serves
-- them). Dropped before the write runs, whose table keeps the indexes of
-- earlier runs.
CREATE INDEX trips_city_created ON plain.trips (city_uuid, trip_created_at, row_key);
-- PostGraphile offers filters only on indexed columns unless told.
COMMENT ON COLUMN plain.trips.fare_total IS E'@behavior +filterBy';
COMMENT ON COLUMN plain.trips.status IS E'@behavior +filterBy';
COMMENT ON COLUMN plain.trips.is_completed IS E'@behavior +filterBy';
GRANT USAGE ON SCHEMA plain TO $PGL_ROLE;
GRANT SELECT, INSERT ON plain.trips TO $PGL_ROLE;
SQL

# --- cellgate ----------------------------------------------------------------
log "cellgate serve"
"$CELLGATE_BIN" serve --log warn --config "$HERE/cellgate.yaml" --listen 127.0.0.1:0 \
  --database "$PG_URL" --datastores "$DATASTORES" --data "$WORK/cellgate-data" \
  >"$WORK/cellgate.log" 2>&1 &
CG_PID=$!
CG_URL="$(wait_for_url "$WORK/cellgate.log" 120 'listening on http://' "$CG_PID")"
end=$((SECONDS + 60))
until curl -fsS -o /dev/null "$CG_URL/readyz"; do
  [ "$SECONDS" -lt "$end" ] || fail "cellgate at $CG_URL not ready within 60 s"
  sleep 0.2
done
echo "cellgate at $CG_URL (pid $CG_PID)"

# --- data -------------------------------------------------------------------
log "loading $TRIPS trips"
bench load --trips "$TRIPS" --drivers "$DRIVERS"
start_ns=$(date +%s%N)
psql_db -d "$DB" -c "\\copy plain.trips (row_key, driver_partner_uuid, city_uuid, trip_created_at, body, fare_total, status, is_completed, status_body) FROM '$WORK/trips.csv' WITH (FORMAT csv)"
copy_ms=$(( ($(date +%s%N) - start_ns) / 1000000 ))
echo "COPY into plain.trips: $copy_ms ms"
[ "$KEEP" = 1 ] || rm -f "$WORK/trips.csv"
echo "waiting for cellgate's indexes"
bench catchup --timeout 900 --out "$WORK/load-catchup.json"
rows="$(psql_db -d "$DB" -At -c "SELECT (SELECT count(*) FROM plain.trips) || ' ' ||
  (SELECT count(*) FROM plain.trips WHERE status IS NOT NULL) || ' ' ||
  (SELECT count(*) FROM trips_ix_driver_partner_index) || ' ' ||
  (SELECT count(*) FROM trips_ix_city_trips_index) || ' ' ||
  (SELECT count(*) FROM trips_ix_city_trips_index WHERE status IS NOT NULL AND fare_total IS NOT NULL)")"
[ "$rows" = "$TRIPS $TRIPS $TRIPS $TRIPS $TRIPS" ] \
  || fail "expected $TRIPS rows (plain.trips, with a status; driver_partner_index; city_trips_index, with status and fare), found $rows"
echo "VACUUM ANALYZE (autovacuum may be off; both sides get the same treatment)"
psql_db -d "$DB" -c "VACUUM (ANALYZE)"
python3 - "$WORK" "$copy_ms" <<'PY'
import json, sys
work, copy_ms = sys.argv[1], int(sys.argv[2])
catchup = json.load(open(f"{work}/load-catchup.json"))
json.dump({"copy_seconds": round(copy_ms / 1000, 2), "catchup": catchup},
          open(f"{work}/load.json", "w"), indent=2)
PY

# --- PostGraphile -----------------------------------------------------------
log "PostGraphile"
(cd "$HERE" && NODE_ENV=production PGL_DATABASE_URL="postgres://$PGL_ROLE@$PG_HOST:$PG_PORT/$DB" \
  PGL_HOST=127.0.0.1 PGL_PORT=0 PGL_POOL_MAX="$POOL" exec "$NODE" server.mjs) \
  >"$WORK/postgraphile.log" 2>&1 &
PGL_PID=$!
PGL_URL="$(wait_for_url "$WORK/postgraphile.log" 120 'listening on http://' "$PGL_PID")/graphql"
echo "PostGraphile at $PGL_URL (pid $PGL_PID)"

# --- same answers -----------------------------------------------------------
log "checking that both answer the same rows"
bench requests
bench check --workloads "$WORKLOADS" --sample "$([ "$SMOKE" = 1 ] && echo 20 || echo 50)"

# --- statements per request -------------------------------------------------
log "statements per request (log_statement = all for a moment)"
LOGGING=1
bench capture --workloads "$WORKLOADS" --log "$PG_LOG"
LOGGING=0
bench catchup --timeout 300 >/dev/null

# --- metadata ---------------------------------------------------------------
commit="unknown"
if top="$(git -C "$(dirname "$CELLGATE_BIN")" rev-parse --show-toplevel 2>/dev/null)"; then
  commit="$(git -C "$top" rev-parse --short HEAD)"
  if [ -n "$(git -C "$top" status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    commit="$commit (working tree with uncommitted changes)"
  fi
fi
export META_COMMAND="$COMMAND" META_BIN="$CELLGATE_BIN" META_COMMIT="$commit" \
  META_PG="$(psql_db -d postgres -At -c 'SHOW server_version')" \
  META_NODE="$("$NODE" --version)" META_WRK="$(wrk --version 2>&1 | head -1 | cut -d' ' -f2)" \
  META_CONC="$CONCURRENCY" META_DURATION="$DURATION" META_WARMUP="$WARMUP" META_POOL="$POOL" \
  META_WORKLOADS="$WORKLOADS" \
  META_STAMP="$STAMP" META_HERE="$HERE"
python3 - "$WORK/meta.json" <<'PY'
import json, os, sys
e = os.environ
pkg = lambda name: json.load(open(f"{e['META_HERE']}/node_modules/{name}/package.json"))["version"]
mem_kb = int(next(l for l in open("/proc/meminfo") if l.startswith("MemTotal")).split()[1])
meta = {
    "started": e["META_STAMP"], "command": e["META_COMMAND"], "nproc": os.cpu_count(),
    "memory": f"{mem_kb / 1024 / 1024:.0f} GiB", "loadavg": " ".join(open("/proc/loadavg").read().split()[:3]),
    "pg_version": "PostgreSQL " + e["META_PG"], "cellgate_bin": e["META_BIN"],
    "cellgate_bin_built": __import__("datetime").datetime.fromtimestamp(
        os.path.getmtime(e["META_BIN"]), __import__("datetime").timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "cellgate_commit": e["META_COMMIT"], "node_version": e["META_NODE"],
    "postgraphile_version": pkg("postgraphile"),
    "filter_version": pkg("postgraphile-plugin-connection-filter"),
    "wrk_version": e["META_WRK"], "concurrency": e["META_CONC"], "duration": int(e["META_DURATION"]),
    "warmup": int(e["META_WARMUP"]), "pool": int(e["META_POOL"]), "wrk_threads": 2,
    "workloads": e["META_WORKLOADS"],
}
json.dump(meta, open(sys.argv[1], "w"), indent=2)
PY

# --- workloads ----------------------------------------------------------------
RUN_NO=0
# wrk against $1 (cellgate|postgraphile) for workload $2 at concurrency $3
# for $4 seconds, output to $5.
wrk_run() {
  local server="$1" workload="$2" c="$3" seconds="$4" out="$5" url bad="" must='"rowKey"' threads=2
  RUN_NO=$((RUN_NO + 1))
  if [ "$server" = cellgate ]; then url="$CG_URL/graphql"; else url="$PGL_URL"; fi
  if [ "$workload" = write ] && [ "$server" = cellgate ]; then bad="DUPLICATE"; must="WRITTEN"; fi
  [ "$c" -lt "$threads" ] && threads="$c"
  timeout $((seconds + 60)) wrk -t "$threads" -c "$c" -d "${seconds}s" --timeout 10s --latency \
    -s "$HERE/wrk/graphql.lua" "$url" -- "$WORK/requests/$server-$workload.txt" \
    "$((SEED * 1000 + RUN_NO))" "$bad" "$must" >"$out" 2>&1 \
    || { cat "$out" >&2; fail "wrk $server $workload c$c"; }
  grep -q '^RESULT ' "$out" || { cat "$out" >&2; fail "wrk $server $workload c$c printed no result"; }
}
pgbench_run() {
  local workload="$1" c="$2" seconds="$3" stem="$4" log=("${@:5}") defines=() line
  while IFS= read -r line; do defines+=(-D "$line"); done \
    < <(bench pgbench-args "$workload")
  # The session settings cellgate's own connections start with
  # (gateway/store/src/storage/postgres.rs).
  PGOPTIONS="-c jit=off -c plan_cache_mode=force_generic_plan" \
    timeout $((seconds + 120)) pgbench -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -n -M prepared \
    -c "$c" -j 2 -T "$seconds" "${defines[@]}" "${log[@]}" \
    -f "$WORK/pgbench/$workload.sql" "$DB" >"$stem.out" 2>&1 \
    || { cat "$stem.out" >&2; fail "pgbench $workload c$c"; }
}

# CPU time so far, appended to $1.cpu as "<name> <epoch seconds>
# <PostgreSQL ticks> <gateway ticks>": PostgreSQL is the postmaster and
# every live child of it (utime + stime, fields 14-15 of /proc/<pid>/stat)
# plus the postmaster's reaped children (cutime + cstime, fields 16-17), so
# backends that ended meanwhile (pgbench's) still count; the gateway ($3,
# none for pgbench) is cellgate's or node's process. Builtins but one
# pgrep, so a snapshot takes milliseconds and hugs the run it brackets.
cpu_snapshot() {
  local out="$1" name="$2" gateway="${3:-}" now="$EPOCHREALTIME" pg gw="-" pid line f
  read -r line <"/proc/$PG_POSTMASTER/stat" || fail "the postmaster ($PG_POSTMASTER) is gone"
  read -r -a f <<<"${line##*) }"
  pg=$((f[11] + f[12] + f[13] + f[14]))
  for pid in $(pgrep -P "$PG_POSTMASTER"); do
    { read -r line <"/proc/$pid/stat"; } 2>/dev/null || continue
    read -r -a f <<<"${line##*) }"
    pg=$((pg + f[11] + f[12]))
  done
  if [ -n "$gateway" ]; then
    read -r line <"/proc/$gateway/stat" || fail "the gateway ($gateway) is gone"
    read -r -a f <<<"${line##*) }"
    gw=$((f[11] + f[12]))
  fi
  echo "$name $now $pg $gw" >>"$out.cpu"
}

for workload in $WORKLOADS; do
  if [ "$workload" = write ]; then
    # The write runs on the indexes PostGraphile's table had in earlier runs.
    psql_db -d "$DB" -c "DROP INDEX IF EXISTS plain.trips_city_created"
  fi
  for c in $CONCURRENCY; do
    for server in cellgate postgraphile; do
      log "$workload, concurrency $c: $server"
      if [ "$server" = cellgate ]; then pid="$CG_PID"; else pid="$PGL_PID"; fi
      wrk_run "$server" "$workload" "$c" "$WARMUP" "$WORK/runs/$server-$workload-c$c.warmup.out"
      if [ "$workload" = write ] && [ "$server" = cellgate ]; then
        bench catchup --timeout 300 >/dev/null
      fi
      out="$WORK/runs/$server-$workload-c$c"
      if [ "$workload" = write ] && [ "$server" = cellgate ]; then
        # The index catch-up is polled from the moment wrk ends, by a poller
        # connected before the run.
        bench catchup --timeout $((DURATION + 300)) --wait-for "$out.ended" \
          --out "$out.catchup.json" &
        POLLER_PID=$!
      fi
      cpu_snapshot "$out" before "$pid"
      wrk_run "$server" "$workload" "$c" "$DURATION" "$out.out"
      if [ -n "$POLLER_PID" ]; then
        date +%s.%N >"$out.ended.tmp" && mv "$out.ended.tmp" "$out.ended"
      fi
      cpu_snapshot "$out" after "$pid"
      if [ -n "$POLLER_PID" ]; then
        wait "$POLLER_PID" || { POLLER_PID=""; fail "index catch-up after the writes"; }
        POLLER_PID=""
        cpu_snapshot "$out" caught_up "$pid"
      fi
      grep '^RESULT ' "$out.out" | cut -c1-240
    done
    if [ "$workload" != write ]; then
      log "$workload, concurrency $c: raw SQL (pgbench)"
      pgbench_run "$workload" "$c" "$WARMUP" "$WORK/runs/pgbench-$workload-c$c.warmup"
      rm -f "$WORK/runs/pgbench-$workload-c$c".log*
      cpu_snapshot "$WORK/runs/pgbench-$workload-c$c" before
      pgbench_run "$workload" "$c" "$DURATION" "$WORK/runs/pgbench-$workload-c$c" \
        -l --log-prefix="$WORK/runs/pgbench-$workload-c$c.log"
      cpu_snapshot "$WORK/runs/pgbench-$workload-c$c" after
      grep -E '^(tps|number of (failed|transactions))' "$WORK/runs/pgbench-$workload-c$c.out" || true
    fi
  done
done

# --- report -------------------------------------------------------------------
log "results"
bench report --out "$RESULTS/$STAMP.md" --json "$RESULTS/$STAMP.json"
echo
echo "written: $RESULTS/$STAMP.md and $RESULTS/$STAMP.json"
