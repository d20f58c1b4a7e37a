#!/usr/bin/env python3
"""Helpers of run.sh, the cellgate vs PostGraphile benchmark.

Standard library only. Each subcommand does one step and reads or writes
files in the run's work directory (`--work`):

  load       generates the trips from the seed, loads them into cellgate
             (tripsPutCells: a BASE and a STATUS cell per trip, 500 cells per
             request, 4 in flight) and writes the same trips as CSV for COPY
             into plain.trips
  requests   writes the request bodies wrk sends (one JSON body per line)
  catchup    waits until cellgate's indexes have applied the cell log
  check      compares what both APIs return, for a sample of the requests
             of every read workload run
  capture    counts the statements one request of each kind sends, from the
             PostgreSQL log, and turns cellgate's into pgbench scripts
  workloads  validates a --workloads list and prints it in run order
  report     renders the results as a markdown table and JSON, with the CPU
             time per request of each run from the snapshots run.sh took
             around it (<run>.cpu: the gateway process, and PostgreSQL as
             every live postgres process plus the postmaster's reaped
             children, utime + stime from /proc)

The workloads (`--workloads`; reads first, in this order, then the write):

  index      driverPartnerIndex: one driver's first 20 trips created at or
             after a time, ascending, 4 fields
  bodies     the same page with each row's BASE body
  city       cityTripsIndex: one city, tripCreatedAt >= a time and
             fareTotal <= a bound, newest first (DESC, ties by row key
             DESC), 20 rows, 4 fields
  in         driverPartnerIndex with driverPartnerUuidIn (5 drivers), a
             time lower bound, ascending, 20 rows, 4 fields
  bodies2    the `bodies` page with each row's BASE and STATUS bodies
  filter     cityTripsIndex with the filter string argument only
             (`city_uuid = "…" and trip_created_at >= "…" and fare_total >
             X and status = "completed"`), ascending, 20 rows, 4 fields
  write      50 new trips (BASE cells) per request

The report has one row per workload and concurrency: requests per second
of cellgate, PostGraphile and pgbench running cellgate's own statements
(the raw SQL floor), latencies, their ratios, and CPU milliseconds per
request of the gateway process and of PostgreSQL for each.

Every wait is bounded; every failure exits non-zero with a message.
"""

import argparse
import concurrent.futures
import csv
import datetime as dt
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid

EPOCH = dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc)
TRIP_EVERY_MINUTES = 30
CITIES = 5
WRITE_DRIVERS = 200
LOAD_BATCH = 500
LOAD_IN_FLIGHT = 4
PAGE = 20
WRITE_BATCH = 50
# The workloads in the order run.sh runs them: the reads first, on the data
# set as loaded (the write adds trips to the cities the city queries read,
# different ones to each API, so it comes last).
READS = ("index", "bodies", "city", "in", "bodies2", "filter")
WORKLOADS = READS + ("write",)
# Drivers per request of the `in` workload.
IN_DRIVERS = 5
# Fare bounds of the `city` (fare_total <= X) and `filter` (fare_total > X)
# requests: not whole numbers, so no integer parameter (a shard, a limit) is
# ever taken for one in the captured statements.
CITY_FARES = (17.5, 20.5, 22.5, 25.5, 27.5, 30.5, 32.5, 35.5)
FILTER_FARES = (15.5, 17.5, 20.5, 22.5, 25.5, 27.5, 30.5, 32.5)
FILTER_STATUS = "completed"
# STATUS cells: the trip's latest status, drawn with these weights.
STATUSES = (("completed", 14), ("rider_canceled", 3), ("driver_canceled", 2), ("started", 1))
# Request bodies of the write workload: wrk picks one at random and fills in
# new row keys.
WRITE_TEMPLATES = 64
POLYLINE_CHARS = [chr(c) for c in range(ord("?"), ord("~") + 1)]

# The role PostGraphile connects as, so its statements can be told apart
# from cellgate's (which connects as the superuser) in the server log.
PGL_ROLE = "postgraphile_bench"

# ---------------------------------------------------------------------------
# GraphQL documents. Both APIs are asked for the same page: a driver's 20
# first trips created at or after a time, ordered by creation time, ties by
# row key. cellgate orders by row key alone unless told otherwise, so its
# query names the order.

CG_INDEX = (
    "query BenchIndex($driver: UUID!, $since: DateTime!) { trips { driverPartnerIndex("
    "driverPartnerUuid: $driver, where: {tripCreatedAt: {gte: $since}}, "
    "orderBy: [{field: TRIP_CREATED_AT, direction: ASC}], first: 20) "
    "{ edges { node { rowKey driverPartnerUuid cityUuid tripCreatedAt } } } } }"
)
CG_BODIES = (
    "query BenchBodies($driver: UUID!, $since: DateTime!) { trips { driverPartnerIndex("
    "driverPartnerUuid: $driver, where: {tripCreatedAt: {gte: $since}}, "
    "orderBy: [{field: TRIP_CREATED_AT, direction: ASC}], first: 20) "
    "{ edges { node { rowKey driverPartnerUuid cityUuid tripCreatedAt row { base { body } } } } } } }"
)
CG_WRITE = (
    "mutation BenchWrite($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { rowKey status } }"
)
CG_LOAD = (
    "mutation BenchLoad($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }"
)
PGL_INDEX = (
    "query BenchIndex($driver: UUID!, $since: Datetime!) { allTrips(first: 20, "
    "orderBy: [TRIP_CREATED_AT_ASC, ROW_KEY_ASC], filter: {driverPartnerUuid: {equalTo: $driver}, "
    "tripCreatedAt: {greaterThanOrEqualTo: $since}}) "
    "{ edges { node { rowKey driverPartnerUuid cityUuid tripCreatedAt } } } }"
)
PGL_BODIES = (
    "query BenchBodies($driver: UUID!, $since: Datetime!) { allTrips(first: 20, "
    "orderBy: [TRIP_CREATED_AT_ASC, ROW_KEY_ASC], filter: {driverPartnerUuid: {equalTo: $driver}, "
    "tripCreatedAt: {greaterThanOrEqualTo: $since}}) "
    "{ edges { node { rowKey driverPartnerUuid cityUuid tripCreatedAt body } } } }"
)


# The new shapes. `city`: cellgate orders a descending last key's ties by
# row key descending, so PostGraphile is asked for ROW_KEY_DESC.
CG_CITY = (
    "query BenchCity($city: UUID!, $since: DateTime!, $fare: Float!) { trips { cityTripsIndex("
    "cityUuid: $city, where: {tripCreatedAt: {gte: $since}, fareTotal: {lte: $fare}}, "
    "orderBy: [{field: TRIP_CREATED_AT, direction: DESC}], first: 20) "
    "{ edges { node { rowKey cityUuid tripCreatedAt fareTotal } } } } }"
)
PGL_CITY = (
    "query BenchCity($city: UUID!, $since: Datetime!, $fare: Float!) { allTrips(first: 20, "
    "orderBy: [TRIP_CREATED_AT_DESC, ROW_KEY_DESC], filter: {cityUuid: {equalTo: $city}, "
    "tripCreatedAt: {greaterThanOrEqualTo: $since}, fareTotal: {lessThanOrEqualTo: $fare}}) "
    "{ edges { node { rowKey cityUuid tripCreatedAt fareTotal } } } }"
)
CG_IN = (
    "query BenchIn($drivers: [UUID!]!, $since: DateTime!) { trips { driverPartnerIndex("
    "driverPartnerUuidIn: $drivers, where: {tripCreatedAt: {gte: $since}}, "
    "orderBy: [{field: TRIP_CREATED_AT, direction: ASC}], first: 20) "
    "{ edges { node { rowKey driverPartnerUuid cityUuid tripCreatedAt } } } } }"
)
PGL_IN = (
    "query BenchIn($drivers: [UUID!]!, $since: Datetime!) { allTrips(first: 20, "
    "orderBy: [TRIP_CREATED_AT_ASC, ROW_KEY_ASC], filter: {driverPartnerUuid: {in: $drivers}, "
    "tripCreatedAt: {greaterThanOrEqualTo: $since}}) "
    "{ edges { node { rowKey driverPartnerUuid cityUuid tripCreatedAt } } } }"
)
CG_BODIES2 = (
    "query BenchBodies2($driver: UUID!, $since: DateTime!) { trips { driverPartnerIndex("
    "driverPartnerUuid: $driver, where: {tripCreatedAt: {gte: $since}}, "
    "orderBy: [{field: TRIP_CREATED_AT, direction: ASC}], first: 20) "
    "{ edges { node { rowKey driverPartnerUuid cityUuid tripCreatedAt "
    "row { base { body } status { body } } } } } } }"
)
PGL_BODIES2 = (
    "query BenchBodies2($driver: UUID!, $since: Datetime!) { allTrips(first: 20, "
    "orderBy: [TRIP_CREATED_AT_ASC, ROW_KEY_ASC], filter: {driverPartnerUuid: {equalTo: $driver}, "
    "tripCreatedAt: {greaterThanOrEqualTo: $since}}) "
    "{ edges { node { rowKey driverPartnerUuid cityUuid tripCreatedAt body statusBody } } } }"
)
# `filter`: every condition, the shard field's too, in the filter string.
CG_FILTER = (
    "query BenchFilter($filter: String!) { trips { cityTripsIndex(filter: $filter, "
    "orderBy: [{field: TRIP_CREATED_AT, direction: ASC}], first: 20) "
    "{ edges { node { rowKey tripCreatedAt fareTotal status } } } } }"
)
PGL_FILTER = (
    "query BenchFilter($city: UUID!, $since: Datetime!, $fare: Float!, $status: String!) { "
    "allTrips(first: 20, orderBy: [TRIP_CREATED_AT_ASC, ROW_KEY_ASC], filter: {"
    "cityUuid: {equalTo: $city}, tripCreatedAt: {greaterThanOrEqualTo: $since}, "
    "fareTotal: {greaterThan: $fare}, status: {equalTo: $status}}) "
    "{ edges { node { rowKey tripCreatedAt fareTotal status } } } }"
)


def filter_string(p):
    return (f'city_uuid = "{p["city"]}" and trip_created_at >= "{p["since"]}" and '
            f'fare_total > {p["fare"]!r} and status = "{p["status"]}"')


class Read:
    """A read workload: both documents, the index cellgate reads, the fields
    compared, and how a request's parameters become each API's variables."""

    def __init__(self, name, label, cg, pgl, index, fields, bodies=(),
                 cg_vars=None, pgl_vars=None):
        self.name, self.label, self.cg, self.pgl = name, label, cg, pgl
        self.index, self.fields, self.bodies = index, fields, bodies
        self.cg_vars = cg_vars or (lambda p: p)
        self.pgl_vars = pgl_vars or (lambda p: p)

    def cellgate_page(self, url, params):
        return [e["node"] for e in graphql(url, self.cg, self.cg_vars(params))
                ["trips"][self.index]["edges"]]

    def postgraphile_page(self, url, params):
        return [e["node"] for e in graphql(url, self.pgl, self.pgl_vars(params))
                ["allTrips"]["edges"]]


DRIVER_FIELDS = ("driverPartnerUuid", "cityUuid", "tripCreatedAt")
READ_SPECS = {
    "index": Read("index", "index query", CG_INDEX, PGL_INDEX, "driverPartnerIndex",
                  DRIVER_FIELDS),
    "bodies": Read("bodies", "index query + bodies", CG_BODIES, PGL_BODIES,
                   "driverPartnerIndex", DRIVER_FIELDS, bodies=(("base", "body"),)),
    "city": Read("city", "city, fare ≤ X, newest first", CG_CITY, PGL_CITY, "cityTripsIndex",
                 ("cityUuid", "tripCreatedAt", "fareTotal")),
    "in": Read("in", f"{IN_DRIVERS} drivers (In list)", CG_IN, PGL_IN, "driverPartnerIndex",
               DRIVER_FIELDS),
    "bodies2": Read("bodies2", "index query + BASE and STATUS bodies", CG_BODIES2, PGL_BODIES2,
                    "driverPartnerIndex", DRIVER_FIELDS,
                    bodies=(("base", "body"), ("status", "statusBody"))),
    "filter": Read("filter", "filter string (city, fare > X, status)", CG_FILTER, PGL_FILTER,
                   "cityTripsIndex", ("tripCreatedAt", "fareTotal", "status"),
                   cg_vars=lambda p: {"filter": filter_string(p)}),
}
LABELS = dict({name: spec.label for name, spec in READ_SPECS.items()},
              write=f"write {WRITE_BATCH} trips")


def read_params(data, workload, seed):
    """The parameters of every request of a read workload, in a fixed order
    (wrk picks one at random per request; pgbench picks one by number)."""
    since = data["since"]
    drivers = data["queried_drivers"]
    if workload in ("index", "bodies", "bodies2"):
        return [{"driver": d, "since": since} for d in drivers]
    if workload == "in":
        rng = random.Random(seed + 3)
        groups = []
        for d in drivers:
            others = [x for x in rng.sample(drivers, min(len(drivers), IN_DRIVERS + 1)) if x != d]
            groups.append({"drivers": [d] + others[:IN_DRIVERS - 1], "since": since})
        return groups
    if workload == "city":
        return [{"city": c, "since": since, "fare": f} for c in data["city_uuids"]
                for f in CITY_FARES]
    if workload == "filter":
        return [{"city": c, "since": since, "fare": f, "status": FILTER_STATUS}
                for c in data["city_uuids"] for f in FILTER_FARES]
    raise ValueError(workload)


def flat_params(params):
    """A request's parameters as pgbench variables: lists become name1..nameN."""
    flat = {}
    for name, value in params.items():
        if isinstance(value, list):
            stem = name[:-1] if name.endswith("s") else name
            for j, x in enumerate(value):
                flat[f"{stem}{j + 1}"] = x
        else:
            flat[name] = value
    return flat


def workload_list(text):
    names = text.split() if text else list(WORKLOADS)
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        die(f"unknown workloads {unknown}; known: {' '.join(WORKLOADS)}")
    return [w for w in WORKLOADS if w in names]


def pgl_write_document(n):
    params = ", ".join(f"$t{i}: TripInput!" for i in range(n))
    fields = " ".join(
        f"t{i}: createTrip(input: {{trip: $t{i}}}) {{ trip {{ rowKey }} }}" for i in range(n)
    )
    return f"mutation BenchWrite({params}) {{ {fields} }}"


def die(message):
    print(f"FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def rfc3339(t):
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text):
    t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.timezone.utc)
    return t


def read_json(path):
    with open(path) as f:
        return json.load(f)


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")


def graphql(url, query, variables, timeout=60):
    body = json.dumps({"query": query, "variables": variables}).encode()
    request = urllib.request.Request(
        url, data=body, headers={"content-type": "application/json", "accept": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            answer = json.load(response)
    except urllib.error.HTTPError as e:
        die(f"{url} answered HTTP {e.code}: {e.read()[:500]!r}")
    if answer.get("errors"):
        die(f"{url} answered GraphQL errors: {json.dumps(answer['errors'])[:1000]}")
    return answer["data"]


def psql(args, sql, database=None, capture=True):
    command = [
        "psql", "-h", args.pg_host, "-p", str(args.pg_port), "-U", args.pg_user,
        "-d", database or args.database, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At",
    ]
    done = subprocess.run(command, input=sql, text=True, capture_output=True, timeout=600)
    if done.returncode != 0:
        die(f"psql failed: {done.stderr.strip()}\n--- SQL ---\n{sql[:2000]}")
    return done.stdout


# ---------------------------------------------------------------------------
# The data set


def rng_uuid(rng):
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def trip_body(rng, driver, city, created):
    """A BASE body of a trip, ~700 bytes of JSON, shaped as `trip_body` of
    gateway/src/cli/bench/dataset.rs."""
    distance = rng.uniform(1.0, 30.0)
    minutes = rng.uniform(3.0, 60.0)
    total = round((2.5 + distance * 1.1 + minutes * 0.3) * 100.0) / 100.0
    # Coordinates with 6 decimals, as GPS fixes come. (Versions of cellgate
    # before JSON numbers were parsed exactly changed some 17-digit floats
    # by one bit, e.g. -122.36647480579401 into -122.366474805794; rounded
    # coordinates keep the data set the same for every version compared.)
    lat = round(37.77 + rng.uniform(-0.05, 0.05), 6)
    lng = round(-122.42 + rng.uniform(-0.05, 0.05), 6)
    return {
        "driver_partner_uuid": driver,
        "city_uuid": city,
        "rider_uuid": rng_uuid(rng),
        "trip_created_at": created,
        "status": "completed",
        "product": "UberX",
        "pickup": {"lat": lat, "lng": lng, "address": f"{rng.randrange(1, 2000)} Market St"},
        "dropoff": {"lat": round(lat + 0.01, 6), "lng": round(lng + 0.01, 6),
                    "address": f"{rng.randrange(1, 2000)} Valencia St"},
        "fare": {"total": total, "currency": "USD",
                 "distance_km": round(distance * 100.0) / 100.0},
        "vehicle": {"make": "Toyota", "model": "Prius", "plate": f"8ABC{rng.randrange(0, 1000):03d}"},
        "duration_s": round(minutes * 60.0),
        "route_polyline": "".join(rng.choices(POLYLINE_CHARS, k=200)),
    }


class Dataset:
    """Trip i: driver i mod D, city i mod 5, created 30 minutes after trip
    i-1 from 2024-01-01; row keys, drivers, cities and bodies from the seed."""

    def __init__(self, trips, drivers, seed):
        self.trips, self.seed = trips, seed
        rng = random.Random(seed)
        self.drivers = [rng_uuid(rng) for _ in range(drivers)]
        self.write_drivers = [rng_uuid(rng) for _ in range(WRITE_DRIVERS)]
        self.cities = [rng_uuid(rng) for _ in range(CITIES)]
        first_queried = trips // 4
        # Queries ask for trips created from here on: the last three
        # quarters of the loaded trips.
        self.since = rfc3339(EPOCH + dt.timedelta(minutes=first_queried * TRIP_EVERY_MINUTES))
        self.queried = [self.drivers[i % drivers] for i in range(first_queried, trips)][:drivers]
        self.body_rng = random.Random(seed ^ 0x9E3779B97F4A7C15)
        # Its own generator, so the BASE bodies stay those of earlier runs.
        self.status_rng = random.Random(seed ^ 0x5BD1E995)

    def trip(self, i):
        """Trip i, as (row key, driver, city, created, body); call in order."""
        rng = self.body_rng
        driver = self.drivers[i % len(self.drivers)]
        city = self.cities[i % len(self.cities)]
        created = rfc3339(EPOCH + dt.timedelta(minutes=i * TRIP_EVERY_MINUTES))
        row_key = rng_uuid(rng)
        return row_key, driver, city, created, trip_body(rng, driver, city, created)

    def status(self, body):
        """The STATUS body of a trip (call in order after `trip`): its latest
        status, drawn from STATUSES, and when it was set."""
        status = self.status_rng.choices([s for s, _ in STATUSES],
                                         weights=[w for _, w in STATUSES])[0]
        updated = parse_time(body["trip_created_at"]) + dt.timedelta(seconds=body["duration_s"])
        return {"status": status, "is_completed": status == "completed",
                "updated_at": rfc3339(updated)}

    def describe(self):
        return {
            "trips": self.trips,
            "drivers": len(self.drivers),
            "cities": len(self.cities),
            "seed": self.seed,
            "since": self.since,
            "queried_drivers": self.queried,
            "write_drivers": self.write_drivers,
            "city_uuids": self.cities,
        }


def cmd_load(args):
    data = Dataset(args.trips, args.drivers, args.seed)
    trips_after_since = (args.trips - args.trips // 4) // args.drivers
    if trips_after_since < PAGE:
        die(f"{args.trips} trips over {args.drivers} drivers leave {trips_after_since} trips per "
            f"driver since {data.since}: fewer than a page of {PAGE}; use fewer --drivers")
    url = args.cellgate
    started = time.time()
    cells_written = 0
    statuses = {}

    def send(batch):
        answer = graphql(url, CG_LOAD, {"cells": batch}, timeout=300)
        statuses = [r["status"] for r in answer["tripsPutCells"]]
        bad = [s for s in statuses if s != "WRITTEN"]
        if len(statuses) != len(batch) or bad:
            die(f"load: {len(bad)} of {len(batch)} cells not WRITTEN (e.g. {bad[:3]})")
        return len(batch)

    with open(os.path.join(args.work, "trips.csv"), "w", newline="") as out, \
            concurrent.futures.ThreadPoolExecutor(LOAD_IN_FLIGHT) as pool:
        writer = csv.writer(out)
        pending = set()
        batch = []
        for i in range(args.trips):
            row_key, driver, city, created, body = data.trip(i)
            status = data.status(body)
            statuses[status["status"]] = statuses.get(status["status"], 0) + 1
            writer.writerow([row_key, driver, city, created,
                             json.dumps(body, separators=(",", ":")),
                             repr(float(body["fare"]["total"])), status["status"],
                             "true" if status["is_completed"] else "false",
                             json.dumps(status, separators=(",", ":"))])
            batch.append({"rowKey": row_key, "column": "BASE", "refKey": 1, "body": body})
            batch.append({"rowKey": row_key, "column": "STATUS", "refKey": 1, "body": status})
            if len(batch) >= LOAD_BATCH or i == args.trips - 1:
                pending.add(pool.submit(send, batch))
                batch = []
                if len(pending) >= 2 * LOAD_IN_FLIGHT:
                    finished, pending = concurrent.futures.wait(
                        pending, return_when=concurrent.futures.FIRST_COMPLETED)
                    cells_written += sum(f.result() for f in finished)
        for f in concurrent.futures.as_completed(pending):
            cells_written += f.result()
    seconds = time.time() - started
    description = data.describe()
    description["load_seconds"] = round(seconds, 2)
    description["load_cells_per_second"] = round(cells_written / seconds, 1)
    description["load_cells"] = cells_written
    description["statuses"] = dict(sorted(statuses.items()))
    write_json(os.path.join(args.work, "dataset.json"), description)
    print(f"loaded {cells_written} BASE and STATUS cells into cellgate in {seconds:.1f} s "
          f"({cells_written / seconds:.0f} cells/s); CSV for COPY written")


# ---------------------------------------------------------------------------
# Request bodies for wrk


def cmd_requests(args):
    data = read_json(os.path.join(args.work, "dataset.json"))
    out = os.path.join(args.work, "requests")
    os.makedirs(out, exist_ok=True)

    def lines(name, query, make_variables, items):
        with open(os.path.join(out, name), "w") as f:
            for item in items:
                f.write(json.dumps({"query": query, "variables": make_variables(item)},
                                   separators=(",", ":")))
                f.write("\n")

    for name, spec in READ_SPECS.items():
        params = read_params(data, name, args.seed)
        lines(f"cellgate-{name}.txt", spec.cg, spec.cg_vars, params)
        lines(f"postgraphile-{name}.txt", spec.pgl, spec.pgl_vars, params)

    # Writes: the same new trips for both, with `@K@` where wrk puts a new
    # row key. Their drivers are never queried, so reads see the same index.
    rng = random.Random(args.seed + 1)
    templates = []
    for t in range(WRITE_TEMPLATES):
        trips = []
        for i in range(WRITE_BATCH):
            driver = rng.choice(data["write_drivers"])
            city = rng.choice(data["city_uuids"])
            created = rfc3339(dt.datetime(2025, 1, 1, tzinfo=dt.timezone.utc)
                              + dt.timedelta(minutes=t * WRITE_BATCH + i))
            trips.append((driver, city, created, trip_body(rng, driver, city, created)))
        templates.append(trips)
    key = "@K@"
    lines("cellgate-write.txt", CG_WRITE, lambda trips: {"cells": [
        {"rowKey": key, "column": "BASE", "refKey": 1, "body": body}
        for (_, _, _, body) in trips]}, templates)
    document = pgl_write_document(WRITE_BATCH)
    lines("postgraphile-write.txt", document, lambda trips: {
        f"t{i}": {"rowKey": key, "driverPartnerUuid": driver, "cityUuid": city,
                  "tripCreatedAt": created, "body": body}
        for i, (driver, city, created, body) in enumerate(trips)}, templates)
    print(f"request bodies written to {out}")


# ---------------------------------------------------------------------------
# Index catch-up

CATCHUP_SQL = """
WITH c AS (SELECT DISTINCT consumer FROM trips_offsets WHERE consumer LIKE 'ix:%%')
SELECT (SELECT count(*) FROM c WHERE consumer LIKE 'ix:driver_partner_index:%%'),
       (SELECT count(*) || ',' || COALESCE(sum(s.next_added_id - 1 - COALESCE(o.added_id, 0)), 0)
          FROM trips_shards s CROSS JOIN c
          LEFT JOIN trips_offsets o ON o.shard = s.shard AND o.consumer = c.consumer
         WHERE c.consumer LIKE 'ix:driver_partner_index:%%'
           AND s.next_added_id - 1 > COALESCE(o.added_id, 0)),
       (SELECT count(*) FROM c),
       (SELECT count(*) FROM trips_shards s CROSS JOIN c
          LEFT JOIN trips_offsets o ON o.shard = s.shard AND o.consumer = c.consumer
         WHERE s.next_added_id - 1 > COALESCE(o.added_id, 0)),
       (SELECT COALESCE(sum(next_added_id - 1), 0) FROM trips_shards);
"""


class Psql:
    """One psql session kept open, so polls cost a query and no connection."""

    def __init__(self, args):
        self.process = subprocess.Popen(
            ["psql", "-h", args.pg_host, "-p", str(args.pg_port), "-U", args.pg_user,
             "-d", args.database, "-X", "-q", "-At", "-v", "ON_ERROR_STOP=1"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env=dict(os.environ, PGCONNECT_TIMEOUT="10", PGOPTIONS="-c statement_timeout=30s"))

    def query(self, sql):
        sql = sql.strip()
        if not sql.endswith(";"):
            sql += ";"
        self.process.stdin.write(sql + "\n\\echo __END__\n")
        self.process.stdin.flush()
        lines = []
        while True:
            line = self.process.stdout.readline()
            if not line:
                die("psql session ended (see its error above)")
            if line.rstrip("\n") == "__END__":
                return lines
            lines.append(line.rstrip("\n"))

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=10)


def catchup_state(session):
    row = session.query(CATCHUP_SQL.replace("%%", "%"))[0].split("|")
    dpi_behind, dpi_pending = (int(x) for x in row[1].split(","))
    dpi_consumers, consumers, behind, cells = (int(x) for x in (row[0], row[2], row[3], row[4]))
    return dpi_consumers, dpi_behind, dpi_pending, consumers, behind, cells


def index_statuses(args):
    """The indexes of trips as cellgate serves them (name, ready)."""
    data = graphql(args.cellgate, "{ trips { indexStatus { name ready } } }", {})
    return data["trips"]["indexStatus"]


def cmd_catchup(args):
    """Waits until every shard's cell log is applied to driver_partner_index,
    then to every index of trips (polled in SQL: each shard's log head against
    the index consumers' stored offsets). With --wait-for, first waits for
    that file to appear and holds the moment the writes ended (epoch
    seconds); the times count from it."""
    expected = len(index_statuses(args))
    session = Psql(args)
    session.query("SELECT 1")
    if args.wait_for:
        limit = time.time() + args.timeout
        while not os.path.exists(args.wait_for):
            if time.time() > limit:
                die(f"{args.wait_for} did not appear within {args.timeout} s")
            time.sleep(0.005)
        with open(args.wait_for) as f:
            start = float(f.read().strip())
    else:
        start = time.time()
    deadline = time.time() + args.timeout
    driver_done = all_done = None
    polls = 0
    pending_at_start = first_poll = None
    while time.time() < deadline:
        polls += 1
        dpi_consumers, dpi_behind, dpi_pending, consumers, behind, cells = catchup_state(session)
        now = time.time()
        if pending_at_start is None:
            pending_at_start, first_poll = dpi_pending, now
        if driver_done is None and dpi_consumers >= 1 and dpi_behind == 0:
            driver_done = now - start
        if driver_done is not None and consumers >= expected and behind == 0:
            all_done = now - start
            break
        time.sleep(args.poll)
    session.close()
    if all_done is None:
        die(f"cellgate's indexes did not catch up within {args.timeout} s "
            f"(driver_partner_index behind on {dpi_behind} shards, all indexes on {behind})")
    not_ready = [s["name"] for s in index_statuses(args) if not s["ready"]]
    if not_ready:
        die(f"indexes caught up with the log but not ready: {not_ready}")
    result = {"driver_partner_index_seconds": round(driver_done, 3),
              "all_indexes_seconds": round(all_done, 3), "log_cells": cells, "polls": polls,
              "pending_cells_at_first_poll": pending_at_start,
              "first_poll_after_seconds": round(first_poll - start, 3)}
    if args.out:
        write_json(args.out, result)
    print(f"indexes caught up: driver_partner_index after {driver_done:.3f} s, "
          f"all {expected} indexes after {all_done:.3f} s ({cells} cells in the log; "
          f"{pending_at_start} cells pending for driver_partner_index at the first poll, "
          f"{first_poll - start:.3f} s after the start)")


# ---------------------------------------------------------------------------
# Same answers from both


def same_time(a, b):
    return a is not None and b is not None and parse_time(a) == parse_time(b)


def same_value(field, a, b):
    if field == "tripCreatedAt":
        return same_time(a, b)
    if field in ("driverPartnerUuid", "cityUuid"):
        return (a or "").lower() == (b or "").lower()
    # Floats and strings: exactly equal (both sides hold the same doubles).
    return a == b


def compare_pages(spec, where, cg, pgl):
    """Dies unless both pages hold the same PAGE rows in the same order;
    returns the number of rows compared."""
    if len(cg) != PAGE or len(pgl) != PAGE:
        die(f"{where}: cellgate returned {len(cg)} rows, PostGraphile {len(pgl)} "
            f"(expected {PAGE} each)")
    for i, (a, b) in enumerate(zip(cg, pgl)):
        if a["rowKey"].lower() != b["rowKey"].lower():
            die(f"{where}: row {i}: cellgate {a['rowKey']}, PostGraphile {b['rowKey']} "
                f"(cellgate's keys {[n['rowKey'] for n in cg]}, "
                f"PostGraphile's {[n['rowKey'] for n in pgl]})")
        for field in spec.fields:
            if not same_value(field, a[field], b[field]):
                die(f"{where}: row {i} {field}: cellgate {a[field]!r}, PostGraphile {b[field]!r}")
        for column, pgl_field in spec.bodies:
            cell = a["row"][column]
            if cell is None or cell["body"] != b[pgl_field]:
                die(f"{where}: row {i} {column} body differs:\n  cellgate     "
                    f"{json.dumps(cell and cell['body'], sort_keys=True)}\n"
                    f"  PostGraphile {json.dumps(b[pgl_field], sort_keys=True)}")
    return len(cg)


def cmd_check(args):
    """Compares both APIs' pages for a sample of each read workload's
    requests: row keys and order, the selected fields, bodies as JSON.
    `index` and `bodies` are always checked (on the same drivers as
    before); the other reads when selected."""
    data = read_json(os.path.join(args.work, "dataset.json"))
    selected = workload_list(args.workloads)
    rng = random.Random(args.seed)
    drivers = data["queried_drivers"]
    sample = rng.sample(drivers, min(args.sample, len(drivers)))
    per_workload = {}
    compared = rows = 0
    last = None
    for name in READS:
        if name not in ("index", "bodies") and name not in selected:
            continue
        spec = READ_SPECS[name]
        if name in ("index", "bodies"):
            requests = [{"driver": d, "since": data["since"]} for d in sample]
        else:
            params = read_params(data, name, args.seed)
            pick = random.Random(args.seed + 100 + READS.index(name))
            requests = pick.sample(params, min(args.sample, len(params)))
        n = 0
        for params in requests:
            where = f"{name} query, {json.dumps(params)}"
            cg = spec.cellgate_page(args.cellgate, params)
            pgl = spec.postgraphile_page(args.postgraphile, params)
            n += compare_pages(spec, where, cg, pgl)
            last = cg
        per_workload[name] = {"queries": len(requests), "rows": n}
        compared += len(requests)
        rows += n
        print(f"  {name}: {len(requests)} queries, {n} rows the same")
    times = sorted(parse_time(n["tripCreatedAt"]) for n in last)
    print(f"same answers: {compared} queries, {rows} rows (row keys and order, the fields, "
          f"bodies as JSON); last page {rfc3339(times[0])}..{rfc3339(times[-1])}")
    write_json(os.path.join(args.work, "check.json"),
               {"drivers": len(sample), "queries": compared, "rows": rows,
                "workloads": per_workload})


# ---------------------------------------------------------------------------
# Statements per request, from the server log

LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \S+ \[(\d+)\] (?:(\S*)@(\S*) )?"
    r"(LOG|DETAIL|ERROR|STATEMENT|WARNING|NOTICE|HINT|CONTEXT|FATAL):  (.*)$"
)
STATEMENT = re.compile(r"^(statement|execute [^:]*): (.*)$", re.S)
PARAM = re.compile(r"\$(\d+) = (NULL|'(?:[^']|'')*')")


class Log:
    """Statements of one role in one database, from the server log."""

    def __init__(self, path, database):
        self.path, self.database = path, database

    def offset(self):
        return os.path.getsize(self.path)

    def entries(self, start, end=None):
        with open(self.path, "rb") as f:
            f.seek(start)
            data = f.read() if end is None else f.read(end - start)
        entries = []
        for line in data.decode("utf-8", "replace").split("\n"):
            m = LINE.match(line)
            if m:
                entries.append({"pid": m.group(1), "user": m.group(2), "db": m.group(3),
                                "level": m.group(4), "text": m.group(5)})
            elif entries and line:
                entries[-1]["text"] += "\n" + line
        return entries

    def statements(self, start, end, user):
        """[(text, {n: value})] of `user` in our database, in log order."""
        found = []
        last_by_pid = {}
        for e in self.entries(start, end):
            if e["db"] != self.database or e["user"] != user:
                continue
            if e["level"] == "LOG":
                m = STATEMENT.match(e["text"])
                if m:
                    found.append({"kind": m.group(1), "sql": m.group(2).strip(), "params": {}})
                    last_by_pid[e["pid"]] = found[-1]
            elif e["level"] == "DETAIL" and e["text"].startswith("parameters: "):
                target = last_by_pid.get(e["pid"])
                if target is not None:
                    for n, value in PARAM.findall(e["text"]):
                        target["params"][int(n)] = (
                            None if value == "NULL" else value[1:-1].replace("''", "'"))
        return found


def shape(sql):
    """A statement's text without literals and placeholder numbers, to tell
    background statements apart."""
    sql = re.sub(r"\$\d+", "$", sql)
    sql = re.sub(r"'(?:[^']|'')*'", "'…'", sql)
    sql = re.sub(r"\b\d+\b", "N", sql)
    return re.sub(r"\s+", " ", sql).strip()


def set_log_statement(args, value):
    if value is None:
        psql(args, "ALTER SYSTEM RESET log_statement", database="postgres")
    else:
        psql(args, f"ALTER SYSTEM SET log_statement = '{value}'", database="postgres")
    psql(args, "SELECT pg_reload_conf()", database="postgres")


def cmd_log_statement(args):
    set_log_statement(args, None if args.value == "reset" else args.value)


def new_write_cells(data, rng, n):
    cells = []
    for i in range(n):
        driver = rng.choice(data["write_drivers"])
        city = rng.choice(data["city_uuids"])
        created = rfc3339(dt.datetime(2025, 6, 1, tzinfo=dt.timezone.utc) + dt.timedelta(minutes=i))
        cells.append((rng_uuid(rng), driver, city, created, trip_body(rng, driver, city, created)))
    return cells


def cmd_capture(args):
    data = read_json(os.path.join(args.work, "dataset.json"))
    selected = workload_list(args.workloads)
    log = Log(args.log, args.database)
    rng = random.Random(args.seed + 2)
    drivers = rng.sample(data["queried_drivers"], min(args.repeat, len(data["queried_drivers"])))
    results = {}
    set_log_statement(args, "all")
    try:
        time.sleep(1.0)
        # What cellgate sends while idle (sweeps, lease renewals): left out
        # of the per-request counts.
        start = log.offset()
        time.sleep(args.idle)
        idle = log.statements(start, None, args.pg_user)
        background = {shape(s["sql"]) for s in idle}
        idle_rate = len(idle) / args.idle

        def one(name, user, send, quiet=False, warm=False):
            runs = []
            for attempt in range(args.repeat):
                if warm:
                    # The same request once before: cellgate's cell cache
                    # then holds its page's cells, as in the timed runs.
                    send(attempt)
                    time.sleep(0.2)
                start = log.offset()
                detail = send(attempt)
                end = log.offset()
                sent = log.statements(start, end, user)
                if user == args.pg_user:
                    sent = [s for s in sent if shape(s["sql"]) not in background]
                if quiet:
                    # Index maintenance starts at the write's COMMIT and can
                    # log its first read before the answer arrives here.
                    commits = [i for i, s in enumerate(sent) if s["sql"].upper() == "COMMIT"]
                    if commits:
                        sent = sent[:commits[-1] + 1]
                run = {"statements": sent, "count": len(sent), "detail": detail}
                if quiet:
                    # Until the database is quiet again: the index
                    # maintenance the write caused, less the idle rate.
                    began = time.time()
                    settled = wait_quiet(log, user, idle_rate)
                    everything = log.statements(start, settled, user)
                    extra = idle_rate * max(time.time() - began - 1.0, 0)
                    run["with_maintenance"] = max(round(len(everything) - extra), len(sent))
                else:
                    time.sleep(0.2)
                runs.append(run)
            counts = [r["count"] for r in runs]
            median = statistics.median_low(counts)
            chosen = next(r for r in runs if r["count"] == median)
            result = {"counts": counts, "median": median, "statements": chosen["statements"],
                      "detail": chosen["detail"]}
            if quiet:
                result["with_maintenance"] = statistics.median_low(
                    [r["with_maintenance"] for r in runs])
            results[name] = result
            extra = (f", with the index maintenance it caused {result['with_maintenance']}"
                     if quiet else "")
            print(f"  {name}: {median} statements per request (runs: {counts}){extra}")

        def query(name, server):
            spec = READ_SPECS[name]
            if name in ("index", "bodies"):
                requests = [{"driver": d, "since": data["since"]} for d in drivers]
            else:
                params = read_params(data, name, args.seed)
                pick = random.Random(args.seed + 200 + READS.index(name))
                requests = pick.sample(params, min(args.repeat, len(params)))

            def send(attempt):
                params = requests[attempt % len(requests)]
                if server == "cellgate":
                    page = spec.cellgate_page(args.cellgate, params)
                else:
                    page = spec.postgraphile_page(args.postgraphile, params)
                detail = {"params": params, "row_keys": [n["rowKey"] for n in page]}
                if "driver" in params:
                    detail["driver"] = params["driver"]
                return detail
            return send

        for name in READS:
            if name in selected:
                one(f"cellgate/{name}", args.pg_user, query(name, "cellgate"), warm=True)
                one(f"postgraphile/{name}", PGL_ROLE, query(name, "postgraphile"))

        def cg_write(attempt):
            cells = new_write_cells(data, rng, WRITE_BATCH)
            answer = graphql(args.cellgate, CG_WRITE, {"cells": [
                {"rowKey": k, "column": "BASE", "refKey": 1, "body": b}
                for (k, _, _, _, b) in cells]})
            assert all(r["status"] == "WRITTEN" for r in answer["tripsPutCells"])
            return {"cells": len(cells)}

        def pgl_write(attempt):
            cells = new_write_cells(data, rng, WRITE_BATCH)
            graphql(args.postgraphile, pgl_write_document(WRITE_BATCH), {
                f"t{i}": {"rowKey": k, "driverPartnerUuid": d, "cityUuid": c,
                          "tripCreatedAt": t, "body": b}
                for i, (k, d, c, t, b) in enumerate(cells)})
            return {"cells": len(cells)}

        if "write" in selected:
            one("cellgate/write", args.pg_user, cg_write, quiet=True)
            one("postgraphile/write", PGL_ROLE, pgl_write)
    finally:
        set_log_statement(args, None)
    results["idle"] = {"seconds": args.idle, "statements_per_second": round(idle_rate, 2),
                       "shapes": sorted(background)}
    write_json(os.path.join(args.work, "statements.json"), results)
    make_pgbench_scripts(args, data, results)


def wait_quiet(log, user, idle_rate, window=1.0, limit=60):
    deadline = time.time() + limit
    while time.time() < deadline:
        start = log.offset()
        time.sleep(window)
        if len(log.statements(start, None, user)) <= idle_rate * window + 1:
            return start
    die("the database never went quiet after a write")


# ---------------------------------------------------------------------------
# pgbench scripts from cellgate's statements

def make_pgbench_scripts(args, data, results):
    """Turns the statements cellgate sent for one request of each read
    workload into pgbench scripts. Every parameter that is one of the
    request's values (a driver, a city, the time, a fare bound, a status, a
    row key of its page) becomes a variable set per transaction from a table
    of all the workload's requests (one primary-key lookup, \\gset): for
    `index` and `bodies` bench.drivers, as in earlier runs; for the others
    bench.<workload>. Every other parameter is a -D constant."""
    out = os.path.join(args.work, "pgbench")
    os.makedirs(out, exist_ok=True)
    psql(args, "DROP SCHEMA IF EXISTS bench CASCADE; CREATE SCHEMA bench;")
    scripts = {}
    if any(f"cellgate/{kind}" in results for kind in ("index", "bodies")):
        scripts.update(driver_scripts(args, data, results, out))
    for name in READS:
        if name not in ("index", "bodies") and f"cellgate/{name}" in results:
            scripts[name] = generic_script(args, data, results, out, name)
    write_json(os.path.join(out, "scripts.json"), scripts)


def driver_scripts(args, data, results, out):
    """index and bodies: the driver, the time and the page's row keys from
    bench.drivers, built in SQL from cellgate's index table."""
    since = parse_time(data["since"])
    drivers = data["queried_drivers"]
    # The page of each driver, as cellgate's bodies statement asks for it.
    values = ",".join(f"({i + 1},'{d}'::uuid)" for i, d in enumerate(drivers))
    keys = ", ".join(f"k[{j + 1}] AS k{j + 1}" for j in range(PAGE))
    psql(args, f"""
CREATE TABLE bench.drivers AS
SELECT i, driver, '{data['since']}'::timestamptz AS since, {keys}
  FROM (SELECT v.i, v.driver,
               ARRAY(SELECT row_key FROM trips_ix_driver_partner_index x
                      WHERE x.driver_partner_uuid = v.driver
                        AND x.trip_created_at >= '{data['since']}'
                      ORDER BY x.trip_created_at, x.row_key LIMIT {PAGE}) AS k
          FROM (VALUES {values}) AS v(i, driver)) p;
ALTER TABLE bench.drivers ADD PRIMARY KEY (i);
ANALYZE bench.drivers;
""")
    short = psql(args, f"SELECT count(*) FROM bench.drivers WHERE k{PAGE} IS NULL").strip()
    if short != "0":
        die(f"{short} drivers have fewer than {PAGE} trips since {data['since']}")
    scripts = {}
    for kind in ("index", "bodies"):
        if f"cellgate/{kind}" not in results:
            continue
        captured = results[f"cellgate/{kind}"]
        page = [k.lower() for k in captured["detail"]["row_keys"]]
        driver = captured["detail"]["driver"].lower()
        constants = {}
        lines = ["\\set i random(1, %d)" % len(drivers)]
        gset = ["driver", "since"] + ([f"k{j + 1}" for j in range(PAGE)] if kind == "bodies" else [])
        lines.append(f"SELECT {', '.join(gset)} FROM bench.drivers WHERE i = :i \\gset")
        for s, statement in enumerate(captured["statements"]):
            params = statement["params"]

            def variable(match):
                n = int(match.group(1))
                value = params.get(n)
                if value is None:
                    die(f"cellgate/{kind}: no logged value for ${n} of: {statement['sql']}")
                if value.lower() == driver:
                    return ":driver"
                if value.lower() in page:
                    return f":k{page.index(value.lower()) + 1}"
                try:
                    if parse_time(value.replace(" ", "T")) == since:
                        return ":since"
                except ValueError:
                    pass
                name = f"c{s + 1}_{n}"
                constants[name] = value
                return f":{name}"

            sql = re.sub(r"\$(\d+)", variable, statement["sql"])
            lines.append(re.sub(r"\s+", " ", sql) + ";")
        path = os.path.join(out, f"{kind}.sql")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        scripts[kind] = {"script": path, "constants": constants,
                         "statements": len(captured["statements"])}
        print(f"  pgbench script for {kind}: {path} ({len(captured['statements'])} of cellgate's "
              f"statements + 1 driver lookup)")
    return scripts


def param_variable(value, flat, page):
    """The pgbench variable a logged parameter value stands for, or None."""
    low = value.lower()
    for name, x in flat.items():
        if isinstance(x, str) and x.lower() == low:
            return name
    if low in page:
        return f"k{page.index(low) + 1}"
    if "since" in flat:
        try:
            if parse_time(value.replace(" ", "T")) == parse_time(flat["since"]):
                return "since"
        except ValueError:
            pass
    if "fare" in flat:
        try:
            if float(value) == flat["fare"]:
                return "fare"
        except ValueError:
            pass
    return None


def generic_script(args, data, results, out, name):
    """A pgbench script of a read workload other than index and bodies, and
    bench.<name>: one row per request (its parameters as text, and the row
    keys of its page if the statements carry them, from cellgate)."""
    captured = results[f"cellgate/{name}"]
    detail = captured["detail"]
    flat = flat_params(detail["params"])
    page = [k.lower() for k in detail["row_keys"]]
    constants = {}
    used = set()
    lines = []
    for s, statement in enumerate(captured["statements"]):
        params = statement["params"]

        def variable(match):
            n = int(match.group(1))
            value = params.get(n)
            if value is None:
                die(f"cellgate/{name}: no logged value for ${n} of: {statement['sql']}")
            found = param_variable(value, flat, page)
            if found is not None:
                used.add(found)
                return f":{found}"
            constant = f"c{s + 1}_{n}"
            constants[constant] = value
            return f":{constant}"

        sql = re.sub(r"\$(\d+)", variable, statement["sql"])
        lines.append(re.sub(r"\s+", " ", sql) + ";")
    requests = read_params(data, name, args.seed)
    columns = list(flat)
    need_keys = any(v.startswith("k") and v[1:].isdigit() for v in used)
    if need_keys:
        columns += [f"k{j + 1}" for j in range(PAGE)]
    spec = READ_SPECS[name]
    rows = []
    for i, params in enumerate(requests):
        row = [str(x) for x in flat_params(params).values()]
        if need_keys:
            keys = [n["rowKey"] for n in spec.cellgate_page(args.cellgate, params)]
            if len(keys) != PAGE:
                die(f"{name}: {json.dumps(params)} has {len(keys)} rows, not {PAGE}")
            row += keys
        rows.append("(" + ", ".join([str(i + 1)] + [sql_text(x) for x in row]) + ")")
    table = f"bench.{name}"
    psql(args, f"""
CREATE TABLE {table} (i int PRIMARY KEY, {", ".join(f'"{c}" text' for c in columns)});
INSERT INTO {table} VALUES {", ".join(rows)};
ANALYZE {table};
""")
    gset = [c for c in columns if c in used] or ["i AS unused"]
    lines = ["\\set i random(1, %d)" % len(requests),
             f"SELECT {', '.join(gset)} FROM {table} WHERE i = :i \\gset"] + lines
    path = os.path.join(out, f"{name}.sql")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"  pgbench script for {name}: {path} ({len(captured['statements'])} of cellgate's "
          f"statements + 1 lookup in {table}; variables {sorted(used)}, constants "
          f"{sorted(constants)})")
    return {"script": path, "constants": constants, "statements": len(captured["statements"]),
            "variables": sorted(used)}


def sql_text(x):
    return "'" + str(x).replace("'", "''") + "'"


def cmd_workloads(args):
    """Prints the workloads named (all if none), validated, in run order."""
    print(" ".join(workload_list(args.names)))


def cmd_pgbench_args(args):
    """Prints the -D arguments of a script, one per line."""
    scripts = read_json(os.path.join(args.work, "pgbench", "scripts.json"))
    for name, value in scripts[args.kind]["constants"].items():
        print(f"{name}={value}")


# ---------------------------------------------------------------------------
# CPU time, from /proc


def read_cpu(path):
    """The CPU snapshots run.sh took around a run (`<name> <epoch seconds>
    <PostgreSQL ticks> <gateway ticks or ->` per line), by name, in
    seconds."""
    hz = os.sysconf("SC_CLK_TCK")
    snapshots = {}
    with open(path) as f:
        for line in f:
            name, at, pg, gateway = line.split()
            snapshots[name] = {"time": float(at), "pg_seconds": int(pg) / hz}
            if gateway != "-":
                snapshots[name]["gateway_seconds"] = int(gateway) / hz
    return snapshots


def cpu_per_request(path, requests, end="after"):
    """Gateway and PostgreSQL CPU milliseconds per request between the
    `before` and `end` snapshots of a run, and the cores they used."""
    if not os.path.exists(path) or not requests:
        return None
    snaps = read_cpu(path)
    if "before" not in snaps or end not in snaps:
        return None
    a, b = snaps["before"], snaps[end]
    wall = b["time"] - a["time"]
    result = {"seconds": round(wall, 3), "requests": requests,
              "pg_cpu_seconds": round(b["pg_seconds"] - a["pg_seconds"], 2),
              "pg_ms_per_request": round((b["pg_seconds"] - a["pg_seconds"]) * 1000 / requests, 4),
              "pg_cores": round((b["pg_seconds"] - a["pg_seconds"]) / wall, 2) if wall else None}
    if "gateway_seconds" in a and "gateway_seconds" in b:
        g = b["gateway_seconds"] - a["gateway_seconds"]
        result.update({"gateway_cpu_seconds": round(g, 2),
                       "gateway_ms_per_request": round(g * 1000 / requests, 4),
                       "gateway_cores": round(g / wall, 2) if wall else None})
    return result


# ---------------------------------------------------------------------------
# The report

def parse_wrk(path):
    with open(path) as f:
        for line in f:
            if line.startswith("RESULT "):
                return json.loads(line[len("RESULT "):])
    return None


def parse_pgbench(prefix_dir, stem):
    """tps from pgbench's summary, p50/p99 from its per-transaction logs."""
    summary = os.path.join(prefix_dir, f"{stem}.out")
    with open(summary) as f:
        text = f.read()
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", text)
    processed = re.search(r"number of transactions actually processed: (\d+)", text)
    failed = re.search(r"number of failed transactions: (\d+)", text)
    latencies = []
    for name in os.listdir(prefix_dir):
        if name.startswith(stem + ".log"):
            with open(os.path.join(prefix_dir, name)) as f:
                for line in f:
                    parts = line.split()
                    if len(parts) >= 3:
                        latencies.append(int(parts[2]))
    latencies.sort()

    def pct(q):
        if not latencies:
            return None
        return latencies[min(len(latencies) - 1, int(round((len(latencies) - 1) * q)))]

    return {
        "rps": float(tps.group(1)) if tps else None,
        "transactions": int(processed.group(1)) if processed else None,
        "failed": int(failed.group(1)) if failed else (0 if processed else None),
        "p50_us": pct(0.5), "p99_us": pct(0.99),
        "aborted": "aborted" in text or "error" in text.lower(),
    }


def ms(us):
    return "—" if us is None else f"{us / 1000:.2f}"


def num(x):
    return "—" if x is None else f"{x:,.0f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return "—"
    return f"{a / b:.2f}×"


def cpu_ms(cpu, key):
    if cpu is None or cpu.get(key) is None:
        return "—"
    return f"{cpu[key]:.2f}"


def cmd_report(args):
    work = args.work
    meta = read_json(os.path.join(work, "meta.json"))
    data = read_json(os.path.join(work, "dataset.json"))
    statements = read_json(os.path.join(work, "statements.json"))
    concurrency = [int(c) for c in meta["concurrency"].split()]
    workloads = workload_list(meta.get("workloads", "index bodies write"))
    runs = os.path.join(work, "runs")
    failures = []
    rows = []
    json_rows = []
    for workload in workloads:
        for c in concurrency:
            cg = parse_wrk(os.path.join(runs, f"cellgate-{workload}-c{c}.out"))
            pgl = parse_wrk(os.path.join(runs, f"postgraphile-{workload}-c{c}.out"))
            raw = None
            if workload != "write" and os.path.exists(
                    os.path.join(runs, f"pgbench-{workload}-c{c}.out")):
                raw = parse_pgbench(runs, f"pgbench-{workload}-c{c}")
            for name, r in (("cellgate", cg), ("postgraphile", pgl)):
                if r is None:
                    failures.append(f"{name} {workload} c{c}: no result")
                    continue
                errs = r["non2xx"] + r["graphql_errors"] + r["bad_answers"] + sum(
                    r["socket_errors"][k] for k in ("connect", "read", "write", "timeout", "status"))
                r["failures"] = errs
                if r["requests"] == 0:
                    failures.append(f"{name} {workload} c{c}: no request completed within the run "
                                    f"(raise --duration)")
                if errs:
                    failures.append(
                        f"{name} {workload} c{c}: {r['non2xx']} non-2xx, {r['graphql_errors']} "
                        f"GraphQL errors, {r['bad_answers']} bad answers, socket errors "
                        f"{r['socket_errors']}; first: {r['first_failure']}")
            if workload != "write" and raw is None:
                failures.append(f"pgbench {workload} c{c}: no result")
            if raw is not None and (raw["failed"] or raw["rps"] is None):
                failures.append(f"pgbench {workload} c{c}: {raw['failed']} failed transactions")
            # CPU per request: the gateway process and PostgreSQL, between
            # the snapshots taken right before and right after each run.
            cpu = {
                "cellgate": cpu_per_request(os.path.join(runs, f"cellgate-{workload}-c{c}.cpu"),
                                            cg and cg["requests"]),
                "postgraphile": cpu_per_request(
                    os.path.join(runs, f"postgraphile-{workload}-c{c}.cpu"),
                    pgl and pgl["requests"]),
                "raw_sql": cpu_per_request(os.path.join(runs, f"pgbench-{workload}-c{c}.cpu"),
                                           raw and raw["transactions"]),
            }
            catchup = None
            if workload == "write":
                path = os.path.join(runs, f"cellgate-write-c{c}.catchup.json")
                if os.path.exists(path):
                    catchup = read_json(path)
                # cellgate applies the writes to its indexes after the
                # commit: its CPU until the indexes caught up, too.
                cpu["cellgate_with_catchup"] = cpu_per_request(
                    os.path.join(runs, f"cellgate-write-c{c}.cpu"),
                    cg and cg["requests"], end="caught_up")
            cg_st = statements[f"cellgate/{workload}"]
            pgl_st = statements[f"postgraphile/{workload}"]
            cg_count = str(cg_st["median"])
            if workload == "write":
                cg_count += f" (+{cg_st['with_maintenance'] - cg_st['median']} index maintenance)"
            raw_count = "—" if workload == "write" else f"{cg_st['median']} + 1 lookup"
            rows.append([
                LABELS[workload], str(c),
                num(cg and cg["rps"]), ms(cg and cg["p50_us"]), ms(cg and cg["p99_us"]),
                num(pgl and pgl["rps"]), ms(pgl and pgl["p50_us"]), ms(pgl and pgl["p99_us"]),
                num(raw and raw["rps"]), ms(raw and raw["p50_us"]), ms(raw and raw["p99_us"]),
                ratio(cg and cg["rps"], pgl and pgl["rps"]),
                ratio(cg and cg["rps"], raw and raw["rps"]),
                cpu_ms(cpu["cellgate"], "gateway_ms_per_request"),
                cpu_ms(cpu["postgraphile"], "gateway_ms_per_request"),
                cpu_ms(cpu["cellgate"], "pg_ms_per_request"),
                cpu_ms(cpu["postgraphile"], "pg_ms_per_request"),
                cpu_ms(cpu["raw_sql"], "pg_ms_per_request"),
                f"{cg_count} / {pgl_st['median']} / {raw_count}",
                "—" if catchup is None else f"{catchup['driver_partner_index_seconds']:.2f} s",
            ])
            json_rows.append({"workload": workload, "concurrency": c, "cellgate": cg,
                              "postgraphile": pgl, "raw_sql": raw, "catchup": catchup,
                              "cpu": cpu,
                              "statements": {"cellgate": cg_st["median"],
                                             "postgraphile": pgl_st["median"]}})
    header = ["workload", "conc.", "cellgate req/s", "p50 ms", "p99 ms",
              "PostGraphile req/s", "p50 ms", "p99 ms", "raw SQL tx/s", "p50 ms", "p99 ms",
              "cellgate / PostGraphile", "cellgate / raw SQL",
              "cellgate CPU ms/req", "PostGraphile CPU ms/req",
              "PG CPU ms/req: cellgate", "PG CPU ms/req: PostGraphile", "PG CPU ms/req: raw SQL",
              "statements per request (cellgate / PostGraphile / raw)",
              "index caught up after the writes"]
    table = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    table += ["| " + " | ".join(r) + " |" for r in rows]

    load = read_json(os.path.join(work, "load.json"))
    out = []
    out.append(f"# cellgate vs PostGraphile — {meta['started']}")
    out.append("")
    out.append(f"Command: `{meta['command']}`")
    out.append("")
    out.append(f"- Machine: {meta['nproc']} cores, {meta['memory']}; {meta['pg_version']}; "
               f"load average at start {meta['loadavg']}")
    out.append(f"- cellgate: `{meta['cellgate_bin']}` (built {meta.get('cellgate_bin_built', '?')}), "
               f"repository at commit {meta['cellgate_commit']}; "
               f"pool of {meta['pool']} connections; admission limits off (`cellgate.yaml`)")
    out.append(f"- PostGraphile {meta['postgraphile_version']} (Amber preset + connection-filter "
               f"{meta['filter_version']}) on Node {meta['node_version']}, one process, pool of "
               f"{meta['pool']} connections, no GraphiQL/explain/watch, NODE_ENV=production")
    statuses = ", ".join(f"{k} {v:,}" for k, v in data.get("statuses", {}).items())
    out.append(f"- Data: {data['trips']:,} trips (a ~700-byte BASE cell and a ~80-byte STATUS cell "
               f"each; statuses {statuses or '?'}), {data['drivers']:,} drivers, "
               f"{data['cities']} cities, seed {data['seed']}; queries ask for trips since "
               f"{data['since']}: of a random one of {len(data['queried_drivers']):,} drivers "
               f"(index, bodies, bodies2), {IN_DRIVERS} of them (in), or a city and a fare "
               f"bound (city: fare ≤ one of {', '.join(map(str, CITY_FARES))}; filter: status "
               f"{FILTER_STATUS} and fare > one of {', '.join(map(str, FILTER_FARES))})")
    out.append(f"- Load: cellgate {data['load_seconds']} s ({data['load_cells_per_second']:,.0f} "
               f"cells/s through `tripsPutCells`, 500 per request, 4 in flight), its indexes caught up "
               f"{load['catchup']['all_indexes_seconds']} s after; PostGraphile's table by COPY in "
               f"{load['copy_seconds']} s; then VACUUM ANALYZE of both")
    out.append(f"- Each run: {meta['duration']} s after a {meta['warmup']} s warmup, wrk "
               f"{meta['wrk_version']} with {meta['wrk_threads']} threads, one connection per "
               f"concurrent request; pgbench `-M prepared -j 2`, same concurrency and duration; "
               f"workloads in this order: {' '.join(workloads)}")
    out.append("")
    out.extend(table)
    out.append("")
    first_read = next((f"cellgate/{w}" for w in workloads if f"cellgate/{w}" in statements),
                      "cellgate/write")
    out.append("CPU ms/req is CPU time (user + system, from `/proc/<pid>/stat`) divided by the "
               "requests (or pgbench transactions) the run completed, between snapshots taken "
               "right before and right after it: `cellgate CPU` and `PostGraphile CPU` of the "
               "gateway process (for raw SQL there is none: pgbench's own CPU is not counted), "
               "`PG CPU` of PostgreSQL, every live postgres process plus the postmaster's reaped "
               "children (cutime + cstime), so backends that ended during the run count. "
               "PG CPU includes whatever else the server ran meanwhile (cellgate's idle sweeps, "
               "autovacuum, other databases' clients); wrk's CPU is not counted. The clock "
               "ticks are 1/100 s per process, so short runs give coarse figures. For the "
               "writes, cellgate's CPU until its indexes caught up is below.")
    out.append("")
    out.append("Statements per request are counted from the PostgreSQL log (`log_statement = all`), "
               "one request at a time (median of "
               f"{len(statements[first_read]['counts'])}), by role: cellgate as "
               f"`{args.pg_user}`, PostGraphile as `{PGL_ROLE}`; cellgate's idle statements "
               f"(sweeps, leases: {statements['idle']['statements_per_second']}/s) are left out. "
               "cellgate's reads are counted with its cell cache holding the page's cells, as "
               "in the timed runs (the same request is sent once before). "
               "For the write, `+N index maintenance` is what cellgate sent afterwards, until the "
               "database was quiet, to apply the 50 cells to its indexes.")
    out.append("")
    out.append("Raw SQL is pgbench running the statements cellgate sent for one request (below), "
               "with the request's values (driver or drivers, city, time, fare bound, status) and "
               "the page's row keys as variables: each transaction first picks a random request "
               "with `SELECT … FROM bench.drivers WHERE i = :i \\gset` (index, bodies) or "
               "`bench.<workload>` (the others), a primary-key read counted in its latency; "
               "its sessions start with the settings cellgate's connections start with "
               "(`jit=off`, `plan_cache_mode=force_generic_plan`). "
               "The write has no raw SQL row: "
               "every write needs new row keys, their shards (a hash of the key that cellgate "
               "computes) and the cells' encoded bodies, which a pgbench script of the captured "
               "statement's constants would insert once and then fail on the unique key.")
    out.append("")
    if "write" in workloads:
        out.append("PostGraphile's table for the write runs has the indexes of earlier runs "
                   "(primary key, driver + time): the (city, time) index the city and filter "
                   "queries use is dropped before them. Both sides keep the columns and cells "
                   "added for the new reads (fare_total, status, STATUS cells), which the "
                   "written trips do not carry.")
        out.append("")
    catchups = [r for r in json_rows if r["catchup"]]
    if catchups:
        out.append("Index catch-up after the write runs (from the end of the run until every shard's "
                   "log is applied to the index, polled in SQL every 20 ms):")
        out.append("")
        for r in catchups:
            ok = "" if r["catchup"]["driver_partner_index_seconds"] < 1.0 else " (over the 1 s target)"
            written = r["cellgate"]["requests"] * WRITE_BATCH if r["cellgate"] else 0
            with_catchup = r["cpu"].get("cellgate_with_catchup")
            cpu_note = ""
            if with_catchup and with_catchup.get("gateway_ms_per_request") is not None:
                cpu_note = (f"; with the catch-up cellgate used "
                            f"{with_catchup['gateway_ms_per_request']:.2f} ms of gateway CPU and "
                            f"{with_catchup['pg_ms_per_request']:.2f} ms of PG CPU per request")
            out.append(f"- concurrency {r['concurrency']}: driver_partner_index "
                       f"{r['catchup']['driver_partner_index_seconds']:.2f} s{ok}, every index "
                       f"{r['catchup']['all_indexes_seconds']:.2f} s; "
                       f"{r['catchup'].get('pending_cells_at_first_poll', '?')} of the "
                       f"{written:,} cells written were still pending for driver_partner_index "
                       f"when the run ended{cpu_note}")
        out.append("")
    check = read_json(os.path.join(work, "check.json"))
    per = check.get("workloads", {})
    detail = ", ".join(f"{k} {v['queries']}" for k, v in per.items())
    out.append(f"Same answers: {check['queries']} queries compared ({detail or 'index, bodies'}; "
               f"{check['rows']} rows: row keys and order, the selected fields, bodies as JSON).")
    out.append("")
    out.append("## Documents")
    out.append("")
    for workload in workloads:
        if workload == "write":
            out.append(f"- write, cellgate: `{CG_WRITE}`; PostGraphile: {WRITE_BATCH} `createTrip` "
                       f"mutations in one document")
            continue
        spec = READ_SPECS[workload]
        out.append(f"- {workload}, cellgate: `{spec.cg}`")
        out.append(f"- {workload}, PostGraphile: `{spec.pgl}`")
    example = read_params(data, "filter", data["seed"])[0] if "filter" in workloads else None
    if example:
        out.append(f"- filter string, e.g.: `{filter_string(example)}`")
    out.append("")
    out.append("## Statements cellgate sent")
    out.append("")
    for name in (f"cellgate/{w}" for w in workloads):
        s = statements[name]
        out.append(f"### {name.split('/')[1]} ({s['median']} statements)")
        out.append("")
        out.append("```sql")
        for st in s["statements"]:
            text = re.sub(r"\s+", " ", st["sql"]).rstrip(" ;")
            if len(text) > 1500:
                text = text[:1500] + f" … ({len(text)} characters)"
            out.append(text + ";")
            if st["params"]:
                params = sorted(st["params"].items(), key=lambda p: int(p[0]))
                shown = ", ".join(f"${n} = {short(v)}" for n, v in params[:24])
                more = len(st["params"]) - 24
                out.append(f"-- parameters: {shown}" + (f", … ({more} more)" if more > 0 else ""))
        out.append("```")
        out.append("")
    out.append("### PostGraphile")
    out.append("")
    for name in (f"postgraphile/{w}" for w in workloads):
        s = statements[name]
        first = re.sub(r"\s+", " ", s["statements"][0]["sql"]) if s["statements"] else ""
        if len(first) > 600:
            first = first[:600] + " …"
        out.append(f"- {name.split('/')[1]}: {s['median']} statements; first: `{first}`")
    out.append("")
    if failures:
        out.append("## FAILED")
        out.append("")
        out.extend(f"- {f}" for f in failures)
        out.append("")
    text = "\n".join(out)
    with open(args.out, "w") as f:
        f.write(text)
    with open(re.sub(r"\.md$", "", args.out) + "-statements.sql", "w") as f:
        f.write(statements_dump(statements))
    write_json(args.json, {"meta": meta, "dataset": {k: v for k, v in data.items()
                                                     if k not in ("queried_drivers",
                                                                  "write_drivers")},
                           "load": load, "results": json_rows,
                           "statements": statements, "failures": failures})
    print(text)
    if failures:
        print("\nFAILED: " + "; ".join(failures), file=sys.stderr)
        sys.exit(1)


def statements_dump(statements):
    """Every statement of one request of each kind, with all its parameters
    (cell bodies shortened)."""
    out = []
    for name, s in statements.items():
        if "statements" not in s:
            continue
        out.append(f"-- ==== {name}: {s['median']} statements (counts of the runs: {s['counts']})")
        for st in s["statements"]:
            out.append(st["sql"].rstrip().rstrip(";") + ";")
            params = sorted(st["params"].items(), key=lambda p: int(p[0]))
            for n, v in params:
                out.append(f"--   ${n} = {short(v, 120)}")
        out.append("")
    return "\n".join(out) + "\n"


def short(value, limit=60):
    if value is None:
        return "NULL"
    if len(value) > limit:
        return f"'{value[:40]}…' ({len(value)} bytes)"
    return f"'{value}'"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--database", default="cellgate_vs_postgraphile")
    parser.add_argument("--pg-host", default="127.0.0.1")
    parser.add_argument("--pg-port", type=int, default=5432)
    parser.add_argument("--pg-user", default="postgres")
    parser.add_argument("--cellgate", help="cellgate's /graphql URL")
    parser.add_argument("--postgraphile", help="PostGraphile's /graphql URL")
    parser.add_argument("--seed", type=int, default=42)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("load")
    p.add_argument("--trips", type=int, required=True)
    p.add_argument("--drivers", type=int, required=True)
    sub.add_parser("requests")
    p = sub.add_parser("catchup")
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--poll", type=float, default=0.02)
    p.add_argument("--wait-for", help="a file that will hold the end of the writes")
    p.add_argument("--out")
    p = sub.add_parser("check")
    p.add_argument("--sample", type=int, default=50)
    p.add_argument("--workloads", default=" ".join(WORKLOADS))
    p = sub.add_parser("capture")
    p.add_argument("--workloads", default=" ".join(WORKLOADS))
    p.add_argument("--log", required=True)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--idle", type=float, default=3.0)
    p = sub.add_parser("log-statement")
    p.add_argument("value", choices=["all", "reset"])
    p = sub.add_parser("pgbench-args")
    p.add_argument("kind")
    p = sub.add_parser("workloads")
    p.add_argument("names", nargs="?", default="")
    p = sub.add_parser("report")
    p.add_argument("--out", required=True)
    p.add_argument("--json", required=True)
    args = parser.parse_args()
    {"load": cmd_load, "requests": cmd_requests, "catchup": cmd_catchup, "check": cmd_check,
     "capture": cmd_capture, "log-statement": cmd_log_statement,
     "pgbench-args": cmd_pgbench_args, "workloads": cmd_workloads,
     "report": cmd_report}[args.command](args)


if __name__ == "__main__":
    main()
