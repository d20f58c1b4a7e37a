#!/usr/bin/env bash
# A database master and its read replica on 127.0.0.1, for `cellgate-bench replicas`.
#
#   replica-pair.sh start mariadb|postgres   prints dir=…, master=URL and replica=URL
#   replica-pair.sh stop DIR                 stops both servers and removes DIR
#
# `eval "$(gateway/bench/replica-pair.sh start mariadb)"` sets $dir, $master and $replica.
#
# Each server has its own data directory under a new temporary directory and its own free
# loopback port; both hold an empty database `cellgate`, created on the master and
# replicated, so a started pair is known to replicate.
#   mariadb:  a master with binary logging (ROW) and a replica following it with GTID-based
#             asynchronous replication (MASTER_USE_GTID=slave_pos); user root, no password.
#   postgres: a primary and a hot standby made with `pg_basebackup -R`, streaming through a
#             physical replication slot; user postgres, trust authentication. Run as root,
#             the servers run as the `postgres` user.
# Both keep their data in memory (a 1 GiB buffer pool / shared_buffers) and commit to the
# OS, not the disk (innodb_flush_log_at_trx_commit=2, fsync=off): the pair is for
# measurements, and its data goes away with `stop`.
set -euo pipefail

WAIT_SECONDS=60

die() { echo "replica-pair: $*" >&2; exit 1; }

# A port of 127.0.0.1 nothing listens on.
free_port() {
  local port
  for _ in $(seq 1 100); do
    port=$((20000 + RANDOM % 40000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  die "no free port found"
}

# Runs "$@" until it succeeds, at most WAIT_SECONDS; fails with $what.
wait_for() {
  local what=$1; shift
  for _ in $(seq 1 $((WAIT_SECONDS * 10))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "$what within ${WAIT_SECONDS} s"
}

# --- MariaDB ---------------------------------------------------------------

mariadb_sql() { mariadb --no-defaults -uroot -h127.0.0.1 -P"$1" -N -e "$2"; }

mariadb_node() { # name port server-specific arguments…
  local name=$1 port=$2 node="$dir/$1"; shift 2
  mkdir -p "$node"
  TMPDIR="$node" mariadb-install-db --no-defaults --datadir="$node/data" --user="$(id -un)" \
    --auth-root-authentication-method=normal --skip-test-db --innodb-log-file-size=16M \
    >"$node/install.log" 2>&1 || die "mariadb-install-db failed for the $name: see $node/install.log"
  setsid mariadbd --no-defaults --datadir="$node/data" --port="$port" --bind-address=127.0.0.1 \
    --socket="$node/mysqld.sock" --pid-file="$node/mysqld.pid" --tmpdir="$node" \
    --log-error="$node/error.log" --user="$(id -un)" --skip-name-resolve \
    --innodb-log-file-size=16M --innodb-buffer-pool-size=1G --innodb-flush-log-at-trx-commit=2 \
    --max-connections=500 --binlog-format=ROW --log-bin=mysql-bin --gtid-strict-mode=ON "$@" \
    </dev/null >/dev/null 2>&1 &
  wait_for "the $name did not answer on port $port (see $node/error.log)" mariadb_sql "$port" "SELECT 1"
}

start_mariadb() {
  command -v mariadbd >/dev/null && command -v mariadb-install-db >/dev/null \
    || die "MariaDB (mariadbd, mariadb-install-db) is not installed"
  local mport rport
  mport=$(free_port)
  mariadb_node master "$mport" --server-id=1
  rport=$(free_port)
  mariadb_node replica "$rport" --server-id=2 --read-only=ON --relay-log=relay-bin \
    --log-slave-updates=ON
  mariadb_sql "$rport" "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT=$mport, \
    MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, \
    MASTER_CONNECT_RETRY=1; START SLAVE"
  mariadb_sql "$mport" "CREATE DATABASE cellgate"
  wait_for "the replica did not replicate the database cellgate" \
    mariadb_sql "$rport" "USE cellgate"
  master="mysql://root@127.0.0.1:$mport/cellgate"
  replica="mysql://root@127.0.0.1:$rport/cellgate"
}

stop_mariadb() {
  local pid
  for name in replica master; do
    [ -f "$dir/$name/mysqld.pid" ] || continue
    pid=$(cat "$dir/$name/mysqld.pid")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 1 $((WAIT_SECONDS * 10))); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  done
}

# --- PostgreSQL ------------------------------------------------------------

# The newest installed server programs (initdb, postgres, pg_ctl, pg_basebackup).
postgres_bin() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
  [ -n "$bin" ] || bin=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
  [ -x "$bin/initdb" ] && [ -x "$bin/pg_ctl" ] && [ -x "$bin/pg_basebackup" ] \
    || die "PostgreSQL server programs (initdb, pg_ctl, pg_basebackup) are not installed"
  echo "$bin"
}

# PostgreSQL refuses to run as root: then the servers run as `postgres`.
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

postgres_sql() { psql -h 127.0.0.1 -p "$1" -U postgres -d postgres -Atq -v ON_ERROR_STOP=1 -c "$2"; }

postgres_node() { # name port
  local name=$1 port=$2
  as_owner "$bin/pg_ctl" -D "$dir/$name" -l "$dir/$name.log" -w -t "$WAIT_SECONDS" -o \
    "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$dir \
     -c fsync=off -c shared_buffers=1GB -c max_connections=300 \
     -c wal_retrieve_retry_interval=200ms" start >/dev/null \
    || die "the $name did not start: see $dir/$name.log"
  wait_for "the $name did not answer on port $port" postgres_sql "$port" "SELECT 1"
}

start_postgres() {
  command -v psql >/dev/null || die "psql is not installed"
  bin=$(postgres_bin)
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root without a postgres user"
    chown postgres "$dir"
  fi
  local pport rport
  as_owner "$bin/initdb" -D "$dir/primary" -U postgres --auth=trust -E UTF8 --no-sync \
    >"$dir/initdb.log" 2>&1 || die "initdb failed: see $dir/initdb.log"
  pport=$(free_port)
  postgres_node primary "$pport"
  postgres_sql "$pport" "CREATE DATABASE cellgate"
  as_owner "$bin/pg_basebackup" -h 127.0.0.1 -p "$pport" -U postgres -D "$dir/standby" \
    -R -X stream -c fast -N -C -S cellgate_replica >"$dir/basebackup.log" 2>&1 \
    || die "pg_basebackup failed: see $dir/basebackup.log"
  rport=$(free_port)
  postgres_node standby "$rport"
  wait_for "the standby did not replicate the database cellgate" \
    postgres_sql "$rport" "SELECT 1 FROM pg_database WHERE datname = 'cellgate' AND pg_is_in_recovery()"
  master="postgres://postgres@127.0.0.1:$pport/cellgate"
  replica="postgres://postgres@127.0.0.1:$rport/cellgate"
}

stop_postgres() {
  bin=$(postgres_bin)
  for name in standby primary; do
    [ -f "$dir/$name/postmaster.pid" ] || continue
    as_owner "$bin/pg_ctl" -D "$dir/$name" -m fast -w -t "$WAIT_SECONDS" stop >/dev/null 2>&1 || true
  done
}

# ---------------------------------------------------------------------------

case "${1:-}" in
  start)
    kind=${2:-}
    case "$kind" in mariadb | postgres) ;; *) die "usage: $0 start mariadb|postgres" ;; esac
    dir=$(mktemp -d "${TMPDIR:-/tmp}/cellgate-pair.XXXXXX")
    echo "$kind" >"$dir/kind"
    # A pair that did not start completely is stopped; its logs stay for a look.
    trap 'if [ $? -ne 0 ]; then "stop_$kind"; echo "replica-pair: logs kept in $dir (remove it with: $0 stop $dir)" >&2; fi' EXIT
    "start_$kind"
    echo "dir=$dir"
    echo "master=$master"
    echo "replica=$replica"
    ;;
  stop)
    dir=${2:-}
    [ -n "$dir" ] && [ -f "$dir/kind" ] || die "usage: $0 stop DIR (the dir= that start printed)"
    kind=$(cat "$dir/kind")
    case "$kind" in mariadb | postgres) ;; *) die "$dir is not a pair of this script" ;; esac
    "stop_$kind"
    rm -rf "$dir"
    ;;
  *)
    die "usage: $0 start mariadb|postgres, or $0 stop DIR"
    ;;
esac
