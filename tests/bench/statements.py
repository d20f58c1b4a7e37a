#!/usr/bin/env python3
"""Counts the SQL statements a running cellgate gateway sends PostgreSQL per
request, from the server log with `log_statement = 'all'`.

Works against any gateway version that has `Mutation.tripsPutCells` and
`Query.trips.driverPartnerIndex`, so two binaries can be compared the same
way. The gateway must use a PostgreSQL database of its own (the log lines are
filtered by database name), on a server this script can reach with `psql`
as a superuser (it sets `log_statement` with ALTER SYSTEM for the run and
resets it afterwards).

    python3 tests/bench/statements.py --url http://127.0.0.1:8080 \
        --database cellgate_bench --log /var/log/postgresql/postgresql-15-main.log

For each of `--batches` writes of `--batch` new trips and each of `--pages`
index pages of 20 entries with their BASE bodies, it reports the statements
logged while the request was in flight and, for writes, until the database
went quiet again (the index maintenance the write caused). Standard library
only.
"""

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import time
import urllib.request
import uuid

WRITE = """mutation BenchWrite($cells: [TripsCellInput!]!) {
  tripsPutCells(cells: $cells) { status }
}"""

PAGE = """query BenchRows($driver: UUID!) {
  trips { driverPartnerIndex(driverPartnerUuid: $driver, first: 20) {
    edges { node { rowKey tripCreatedAt row { base { body } } } } } }
}"""


def graphql(url, query, variables):
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(
        url + "/graphql", data=body, headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        answer = json.load(response)
    if answer.get("errors"):
        raise SystemExit(f"GraphQL errors: {answer['errors']}")
    return answer["data"]


def psql(args, sql):
    subprocess.run(
        ["psql", "-h", args.pg_host, "-p", str(args.pg_port), "-U", args.pg_user,
         "-d", "postgres", "-v", "ON_ERROR_STOP=1", "-q", "-c", sql],
        check=True,
    )


def trip(driver, minute):
    return {
        "rowKey": str(uuid.uuid4()),
        "column": "BASE",
        "refKey": 1,
        "body": {
            "driver_partner_uuid": driver,
            "city_uuid": str(uuid.uuid4()),
            "trip_created_at": f"2024-03-01T10:{minute % 60:02d}:00Z",
            "fare": {"total": round(random.uniform(5, 60), 2), "currency": "EUR"},
            "route_polyline": "".join(random.choice("abcdefghij") for _ in range(200)),
        },
    }


class Log:
    """The statements of one database in the server log."""

    def __init__(self, path, database):
        self.path = path
        self.pattern = re.compile(
            rf"@{re.escape(database)} LOG:  (statement|execute [^:]*): "
        )

    def offset(self):
        return os.path.getsize(self.path)

    def count(self, start, end=None):
        with open(self.path, "rb") as f:
            f.seek(start)
            data = f.read() if end is None else f.read(end - start)
        return sum(
            1 for line in data.decode("utf-8", "replace").splitlines()
            if self.pattern.search(line)
        )

    def idle_rate(self, seconds=3.0):
        """Statements per second the gateway sends while idle (sweeps,
        lease renewals)."""
        start = self.offset()
        time.sleep(seconds)
        self.baseline = self.count(start) / seconds
        return self.baseline

    def quiet(self, window=1.0, limit=120):
        """Waits until a `window` of time logs no more than the idle rate;
        returns the offset where that window began."""
        deadline = time.time() + limit
        while time.time() < deadline:
            start = self.offset()
            time.sleep(window)
            if self.count(start) <= self.baseline * window + 1:
                return start
        raise SystemExit("the database never went quiet")


def summary(values):
    return (f"mean {statistics.mean(values):.1f}, median {statistics.median(values)}, "
            f"min {min(values)}, max {max(values)}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the gateway, e.g. http://127.0.0.1:8080")
    parser.add_argument("--database", required=True, help="its PostgreSQL database name")
    parser.add_argument("--log", required=True, help="the PostgreSQL server log file")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--pages", type=int, default=10)
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres")
    args = parser.parse_args()

    log = Log(args.log, args.database)
    driver = str(uuid.uuid4())
    psql(args, "ALTER SYSTEM SET log_statement = 'all'")
    psql(args, "SELECT pg_reload_conf()")
    try:
        # A driver with enough trips for full pages.
        log.idle_rate()
        graphql(args.url, WRITE, {"cells": [trip(driver, i) for i in range(100)]})
        log.quiet()
        in_request, with_maintenance, pages = [], [], []
        for b in range(args.batches):
            start = log.offset()
            began = time.time()
            cells = [trip(str(uuid.uuid4()), i) for i in range(args.batch)]
            graphql(args.url, WRITE, {"cells": cells})
            answered = log.offset()
            settled = log.quiet()
            in_request.append(log.count(start, answered))
            # Minus what the idle gateway sends in the same time.
            background = log.baseline * (time.time() - began - 1.0)
            with_maintenance.append(round(log.count(start, settled) - max(background, 0)))
        for _ in range(args.pages):
            start = log.offset()
            data = graphql(args.url, PAGE, {"driver": driver})
            answered = log.offset()
            edges = data["trips"]["driverPartnerIndex"]["edges"]
            assert len(edges) == 20 and all(e["node"]["row"]["base"] for e in edges)
            pages.append(log.count(start, answered))
            log.quiet(0.5)
    finally:
        psql(args, "ALTER SYSTEM RESET log_statement")
        psql(args, "SELECT pg_reload_conf()")
    print(f"idle gateway: {log.baseline:.1f} statements/s")
    print(f"write of {args.batch} new trips, statements while the request ran: {summary(in_request)}")
    print(f"  with the index maintenance it caused: {summary(with_maintenance)}")
    print(f"index page of 20 with row bodies: {summary(pages)}")


if __name__ == "__main__":
    main()
