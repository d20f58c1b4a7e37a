//! `cellgate bench`: how much the HTTP gateway costs over the Rust API.
//!
//! One run prepares a fresh embedded SQLite store, loads a set of trips,
//! starts the real server (this binary, `cellgate serve`) as a child process
//! on a free port of 127.0.0.1, and drives two workloads through it at a
//! fixed concurrency for a fixed time:
//!
//! - **index query**: `trips.driverPartnerIndex` of a random driver, with a
//!   `where` on `tripCreatedAt` and a page of 20 (`rowKey`, `tripCreatedAt`);
//! - **batched write**: `tripsPutCells` with a batch of new BASE cells.
//!
//! Then the server is stopped and the same work runs in-process through
//! [`Store::query_index`] and [`Store::put_cells`], and a table compares the
//! two paths. Only one process writes the SQLite file at a time: the loading
//! store is closed before the server starts, and the in-process store is
//! opened after the server is gone.
//!
//! Row keys, drivers and cities are drawn so that they hash into the first
//! `--live-shards` shards of `trips`, whose tables are created before the
//! runs: otherwise most writes would pay for creating shard tables (there
//! are thousands of shards), which measures DDL rather than the gateway.
//!
//! Every loop is bounded by the deadline and by a request count, every
//! request by a timeout, and all traffic goes to 127.0.0.1.

use std::future::Future;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use hdrhistogram::Histogram;
use index_dsl::{CompareOp, Condition, Definitions, Literal};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::Rng;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use uuid::Uuid;

use crate::cells::{Location, NewCell};
use crate::config::StorageConfig;
use crate::indexes::IndexQuery;
use crate::{Store, StoreOptions};

use super::{load_definitions, DEFAULT_DATASTORES};

/// The datastore, column and index the workloads use.
const DATASTORE: &str = "trips";
const COLUMN: &str = "BASE";
const INDEX: &str = "driver_partner_index";
const DRIVER_FIELD: &str = "driver_partner_uuid";
const CREATED_FIELD: &str = "trip_created_at";
const CITY_FIELD: &str = "city_uuid";

/// Page size of the index query.
const PAGE: u32 = 20;
/// Cells per `put_cells` while loading the data set.
const LOAD_BATCH: usize = 200;
/// Cities the trips are spread over.
const CITIES: usize = 5;
/// Drivers of the trips written by the write workload (never queried, so
/// the queried part of the index is the same for both paths).
const WRITE_DRIVERS: usize = 200;
/// Upper bound on the requests of one worker in one phase.
const MAX_REQUESTS_PER_WORKER: u64 = 10_000_000;
/// Longest wait for one request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the server's start-up line.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Loaded trips are created every this many minutes from [`EPOCH`]; the
/// query asks for trips created from [`SINCE`] on, about 3/4 of them.
const EPOCH: &str = "2024-01-01T00:00:00Z";
const TRIP_EVERY_MINUTES: i64 = 30;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Seconds each workload runs on each path (4 runs in all).
    #[arg(
        long,
        value_name = "SECONDS",
        env = "CELLGATE_BENCH_DURATION",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub duration: u64,

    /// Requests in flight at once: this many HTTP connections, or this many
    /// concurrent calls of the Rust API.
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_CONCURRENCY",
        default_value_t = 8,
        value_parser = clap::value_parser!(u32).range(1..=1024)
    )]
    pub concurrency: u32,

    /// Directory of the datastore and index definitions. It must define the
    /// `trips` datastore with a `BASE` column and the
    /// `driver_partner_index` index (driver_partner_uuid, city_uuid,
    /// trip_created_at), as `./datastores` does.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,

    /// Directory for the benchmark's SQLite database, kept afterwards. It
    /// must not hold a database yet (the benchmark writes thousands of
    /// trips). [default: a temporary directory, removed at the end]
    #[arg(long, value_name = "DIR", env = "CELLGATE_BENCH_DATA")]
    pub data: Option<PathBuf>,

    /// Trips loaded before the runs.
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_TRIPS",
        default_value_t = 2000,
        value_parser = clap::value_parser!(u32).range(1..=1_000_000)
    )]
    pub trips: u32,

    /// Drivers the loaded trips are spread over; each index query asks for
    /// one of them at random.
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_DRIVERS",
        default_value_t = 20,
        value_parser = clap::value_parser!(u32).range(1..=100_000)
    )]
    pub drivers: u32,

    /// New BASE cells per write request (one `tripsPutCells` or one
    /// `put_cells` call).
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_BATCH",
        default_value_t = 50,
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    pub batch: u32,

    /// Shards of `trips` that receive data: keys are drawn to hash into
    /// shards 0..N, whose tables are created before the runs.
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_LIVE_SHARDS",
        default_value_t = 64,
        value_parser = clap::value_parser!(u32).range(1..=4096)
    )]
    pub live_shards: u32,
}

/// Draws keys that hash into the live shards.
#[derive(Debug, Clone, Copy)]
struct Keys {
    shards: u32,
    live: u32,
}

impl Keys {
    fn uuid(&self, rng: &mut impl Rng) -> Uuid {
        loop {
            let uuid = uuid::Builder::from_random_bytes(rng.gen()).into_uuid();
            if crate::shards::row_shard(&uuid, self.shards) < self.live {
                return uuid;
            }
        }
    }
}

/// The data set and everything a request needs, shared by the workers.
struct Workload {
    keys: Keys,
    drivers: Vec<Uuid>,
    write_drivers: Vec<Uuid>,
    cities: Vec<Uuid>,
    since: String,
    batch: usize,
}

impl Workload {
    fn new(args: &BenchArgs, shards: u32) -> Workload {
        let keys = Keys {
            shards,
            live: args.live_shards.min(shards),
        };
        let mut rng = rand::thread_rng();
        let mut draw = |n: usize| (0..n).map(|_| keys.uuid(&mut rng)).collect::<Vec<_>>();
        let drivers = draw(args.drivers as usize);
        let write_drivers = draw(WRITE_DRIVERS);
        let cities = draw(CITIES);
        // A quarter into the loaded span: about 3/4 of a driver's trips match.
        let span = i64::from(args.trips) * TRIP_EVERY_MINUTES;
        Workload {
            keys,
            drivers,
            write_drivers,
            cities,
            since: created_at(span / 4),
            batch: args.batch as usize,
        }
    }

    fn random_driver(&self) -> Uuid {
        self.drivers[rand::thread_rng().gen_range(0..self.drivers.len())]
    }

    /// The loaded trips, in order of creation.
    fn load_cells(&self, trips: u32) -> Vec<NewCell> {
        let mut rng = rand::thread_rng();
        (0..i64::from(trips))
            .map(|i| {
                let driver = self.drivers[i as usize % self.drivers.len()];
                let city = self.cities[i as usize % self.cities.len()];
                NewCell {
                    row_key: self.keys.uuid(&mut rng),
                    column: COLUMN.into(),
                    ref_key: 1,
                    body: trip_body(&mut rng, driver, city, &created_at(i * TRIP_EVERY_MINUTES)),
                }
            })
            .collect()
    }

    /// A batch of new trips for the write workload.
    fn write_cells(&self) -> Vec<NewCell> {
        let mut rng = rand::thread_rng();
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        (0..self.batch)
            .map(|_| {
                let driver = self.write_drivers[rng.gen_range(0..self.write_drivers.len())];
                let city = self.cities[rng.gen_range(0..self.cities.len())];
                NewCell {
                    row_key: self.keys.uuid(&mut rng),
                    column: COLUMN.into(),
                    ref_key: 1,
                    body: trip_body(&mut rng, driver, city, &now),
                }
            })
            .collect()
    }

    /// The Rust-API twin of [`QUERY`].
    fn index_query(&self, driver: Uuid) -> IndexQuery {
        IndexQuery {
            index: INDEX.into(),
            shard_values: vec![Literal::String(driver.to_string())],
            conditions: vec![Condition {
                field: CREATED_FIELD.into(),
                op: CompareOp::Ge,
                values: vec![Literal::String(self.since.clone())],
                column: 1,
            }],
            // What the GraphQL resolver asks for when `rowKey` and
            // `tripCreatedAt` are selected.
            fields: vec![CREATED_FIELD.into()],
            first: Some(PAGE),
            ..IndexQuery::default()
        }
    }
}

/// The index query of the HTTP path.
const QUERY: &str = "query BenchIndex($driver: UUID!, $since: DateTime!) { trips { \
    driverPartnerIndex(driverPartnerUuid: $driver, where: {tripCreatedAt: {gte: $since}}, first: 20) \
    { edges { node { rowKey tripCreatedAt } } } } }";

/// The write of the HTTP path.
const MUTATION: &str = "mutation BenchWrite($cells: [TripsCellInput!]!) { \
    tripsPutCells(cells: $cells) { rowKey status } }";

/// An RFC 3339 time `minutes` after [`EPOCH`].
fn created_at(minutes: i64) -> String {
    let epoch = chrono::DateTime::parse_from_rfc3339(EPOCH).expect("valid epoch");
    (epoch + chrono::Duration::minutes(minutes))
        .with_timezone(&chrono::Utc)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A BASE body of a trip, about 700 bytes of JSON.
fn trip_body(rng: &mut impl Rng, driver: Uuid, city: Uuid, created_at: &str) -> Value {
    let distance: f64 = rng.gen_range(1.0..30.0);
    let minutes: f64 = rng.gen_range(3.0..60.0);
    let total = ((2.5 + distance * 1.1 + minutes * 0.3) * 100.0).round() / 100.0;
    let lat = 37.77 + rng.gen_range(-0.05..0.05);
    let lng = -122.42 + rng.gen_range(-0.05..0.05);
    json!({
        "driver_partner_uuid": driver.to_string(),
        "city_uuid": city.to_string(),
        "rider_uuid": Uuid::from_bytes(rng.gen()).to_string(),
        "trip_created_at": created_at,
        "status": "completed",
        "product": "UberX",
        "pickup": {"lat": lat, "lng": lng, "address": format!("{} Market St", rng.gen_range(1..2000))},
        "dropoff": {"lat": lat + 0.01, "lng": lng + 0.01, "address": format!("{} Valencia St", rng.gen_range(1..2000))},
        "fare": {"total": total, "currency": "USD", "distance_km": (distance * 100.0).round() / 100.0},
        "vehicle": {"make": "Toyota", "model": "Prius", "plate": format!("8ABC{:03}", rng.gen_range(0..1000))},
        "duration_s": (minutes * 60.0).round() as i64,
        "route_polyline": (0..200).map(|_| char::from(rng.gen_range(b'?'..=b'~'))).collect::<String>(),
    })
}

/// Checks that the definitions have what the workloads use; returns the
/// shard count of `trips`.
fn check_definitions(defs: &Definitions) -> anyhow::Result<u32> {
    let ds = defs.datastore(DATASTORE).with_context(|| {
        format!("the benchmark needs a `{DATASTORE}` datastore (as in ./datastores)")
    })?;
    anyhow::ensure!(
        ds.column(COLUMN).is_some(),
        "the benchmark needs a `{COLUMN}` column in `{DATASTORE}`"
    );
    let index = ds
        .index(INDEX)
        .with_context(|| format!("the benchmark needs the `{INDEX}` index of `{DATASTORE}`"))?;
    anyhow::ensure!(
        index.shard_field().name == DRIVER_FIELD
            && index.field(CREATED_FIELD).is_some()
            && index.field(CITY_FIELD).is_some(),
        "the `{INDEX}` index must be sharded by `{DRIVER_FIELD}` and have `{CREATED_FIELD}` and `{CITY_FIELD}`"
    );
    Ok(ds.shards)
}

/// One request of a workload; `Err` describes what went wrong.
type Op = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync>;

/// What one workload did on one path.
struct Outcome {
    workload: &'static str,
    path: &'static str,
    requests: u64,
    errors: u64,
    elapsed: Duration,
    /// Latencies of every request, in microseconds.
    latency: Histogram<u64>,
    first_error: Option<String>,
}

impl Outcome {
    fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn ms(&self, quantile: f64) -> f64 {
        self.latency.value_at_quantile(quantile) as f64 / 1000.0
    }
}

/// Runs `op` from `concurrency` workers until `duration` has passed.
async fn run_phase(
    workload: &'static str,
    path: &'static str,
    concurrency: u32,
    duration: Duration,
    op: Op,
) -> anyhow::Result<Outcome> {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(
            Some(duration.as_millis() as u64),
            ProgressDrawTarget::stderr(),
        )
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix:<26} {bar:30} {elapsed:>3} {msg}")
            .expect("valid template"),
    );
    bar.set_prefix(format!("{workload} ({path})"));

    let requests = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = Vec::with_capacity(concurrency as usize);
    for _ in 0..concurrency {
        let op = op.clone();
        let (requests, errors, first_error) =
            (requests.clone(), errors.clone(), first_error.clone());
        workers.push(tokio::spawn(async move {
            let mut latency = new_histogram();
            let mut done = 0u64;
            while Instant::now() < deadline && done < MAX_REQUESTS_PER_WORKER {
                let sent = Instant::now();
                let result = match tokio::time::timeout(REQUEST_TIMEOUT, op()).await {
                    Ok(result) => result,
                    Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
                };
                latency.saturating_record(sent.elapsed().as_micros() as u64);
                done += 1;
                requests.fetch_add(1, Ordering::Relaxed);
                if let Err(message) = result {
                    errors.fetch_add(1, Ordering::Relaxed);
                    let mut first = first_error.lock().expect("first error");
                    if first.is_none() {
                        *first = Some(message);
                    }
                }
            }
            latency
        }));
    }

    let ticker = {
        let (bar, requests, errors) = (bar.clone(), requests.clone(), errors.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                bar.set_position(started.elapsed().as_millis() as u64);
                bar.set_message(format!(
                    "{} requests, {} errors",
                    requests.load(Ordering::Relaxed),
                    errors.load(Ordering::Relaxed)
                ));
            }
        })
    };

    let mut latency = new_histogram();
    let mut failure = None;
    for worker in workers {
        match worker.await {
            Ok(h) => latency.add(h).expect("histograms of the same bounds"),
            Err(e) => failure = Some(e),
        }
    }
    let elapsed = started.elapsed();
    ticker.abort();
    let (requests, errors) = (
        requests.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    bar.set_position(duration.as_millis() as u64);
    bar.finish_with_message(format!("{requests} requests, {errors} errors"));
    if let Some(e) = failure {
        anyhow::bail!("a {workload} worker ({path}) failed: {e}");
    }
    let first_error = first_error.lock().expect("first error").take();
    if let Some(message) = &first_error {
        eprintln!("{workload} ({path}): first error: {message}");
    }
    Ok(Outcome {
        workload,
        path,
        requests,
        errors,
        elapsed,
        latency,
        first_error,
    })
}

/// Microseconds from 1 µs to 10 minutes, 3 significant digits.
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

/// Sends one GraphQL request; `Ok` holds `data` of an answer without errors.
async fn post_graphql(
    client: &reqwest::Client,
    url: &str,
    query: &str,
    variables: Value,
) -> Result<Value, String> {
    let response = client
        .post(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status();
    let body = response
        .bytes()
        .await
        .map_err(|e| format!("reading the answer failed: {e}"))?;
    if status != reqwest::StatusCode::OK {
        let text = String::from_utf8_lossy(&body);
        return Err(format!("HTTP {status}: {}", truncate(&text, 300)));
    }
    let mut answer: Value =
        serde_json::from_slice(&body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    if let Some(errors) = answer.get("errors").filter(|e| !e.is_null()) {
        return Err(format!(
            "GraphQL errors: {}",
            truncate(&errors.to_string(), 300)
        ));
    }
    Ok(answer
        .get_mut("data")
        .map(Value::take)
        .unwrap_or(Value::Null))
}

fn truncate(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

fn http_query_op(client: reqwest::Client, url: Arc<str>, work: Arc<Workload>) -> Op {
    Arc::new(move || {
        let (client, url, work) = (client.clone(), url.clone(), work.clone());
        Box::pin(async move {
            let driver = work.random_driver();
            let variables = json!({ "driver": driver.to_string(), "since": work.since });
            let data = post_graphql(&client, &url, QUERY, variables).await?;
            let edges = data
                .pointer("/trips/driverPartnerIndex/edges")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("no edges in {}", truncate(&data.to_string(), 200)))?;
            if edges.is_empty() {
                return Err(format!("no index entries for driver {driver}"));
            }
            Ok(())
        })
    })
}

fn http_write_op(client: reqwest::Client, url: Arc<str>, work: Arc<Workload>) -> Op {
    Arc::new(move || {
        let (client, url, work) = (client.clone(), url.clone(), work.clone());
        Box::pin(async move {
            let cells: Vec<Value> = work
                .write_cells()
                .into_iter()
                .map(|c| {
                    json!({
                        "rowKey": c.row_key.to_string(),
                        "column": c.column,
                        "refKey": c.ref_key,
                        "body": c.body,
                    })
                })
                .collect();
            let data = post_graphql(&client, &url, MUTATION, json!({ "cells": cells })).await?;
            let results = data
                .get("tripsPutCells")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("no results in {}", truncate(&data.to_string(), 200)))?;
            let written = results
                .iter()
                .filter(|r| r.get("status").and_then(Value::as_str) == Some("WRITTEN"))
                .count();
            if written != work.batch {
                return Err(format!("{written} of {} cells written", work.batch));
            }
            Ok(())
        })
    })
}

fn rust_query_op(store: Store, work: Arc<Workload>) -> Op {
    Arc::new(move || {
        let (store, work) = (store.clone(), work.clone());
        Box::pin(async move {
            let driver = work.random_driver();
            let page = store
                .query_index(DATASTORE, &work.index_query(driver))
                .await
                .map_err(|e| e.to_string())?;
            if page.entries.is_empty() {
                return Err(format!("no index entries for driver {driver}"));
            }
            Ok(())
        })
    })
}

fn rust_write_op(store: Store, work: Arc<Workload>) -> Op {
    Arc::new(move || {
        let (store, work) = (store.clone(), work.clone());
        Box::pin(async move {
            let results = store
                .put_cells(DATASTORE, work.write_cells())
                .await
                .map_err(|e| e.to_string())?;
            let mut written = 0;
            for result in results {
                match result {
                    Ok(crate::cells::PutStatus::Written) => written += 1,
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            if written != work.batch {
                return Err(format!("{written} of {} cells written", work.batch));
            }
            Ok(())
        })
    })
}

/// The `cellgate serve` child process.
struct Server {
    child: tokio::process::Child,
    address: String,
}

impl Server {
    /// Starts `serve` on a free port of 127.0.0.1 and waits for its
    /// start-up line. Logs go to `log`.
    async fn start(data: &Path, datastores: &Path, work_dir: &Path) -> anyhow::Result<Server> {
        // No rate or concurrency limit: the benchmark is the only client.
        let config = work_dir.join("serve.yaml");
        std::fs::write(
            &config,
            "limits:\n  rate_limit_per_second: 0\n  max_concurrent_requests: 0\n",
        )
        .with_context(|| format!("cannot write `{}`", config.display()))?;
        let log = work_dir.join("serve.log");
        let log_file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create `{}`", log.display()))?;
        let exe = std::env::current_exe().context("cannot find the cellgate executable")?;
        let mut command = tokio::process::Command::new(&exe);
        // The caller's CELLGATE_* variables (a database URL, a config file,
        // demo data) must not redirect the server; flags give everything.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("CELLGATE_") {
                command.env_remove(name);
            }
        }
        command
            .arg("--log")
            .arg("warn")
            .arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data")
            .arg(data)
            .arg("--datastores")
            .arg(datastores)
            .arg("--config")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .kill_on_drop(true);
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start `{} serve`", exe.display()))?;
        let stdout = child.stdout.take().context("no stdout of the server")?;
        let mut lines = BufReader::new(stdout).lines();
        let found = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await? {
                if let Some(rest) = line.strip_prefix("cellgate listening on http://") {
                    let address = rest.split_whitespace().next().unwrap_or_default();
                    return Ok::<_, std::io::Error>(Some(address.to_string()));
                }
            }
            Ok(None)
        })
        .await;
        let address = match found {
            Ok(Ok(Some(address))) if !address.is_empty() => address,
            Ok(Ok(_)) => {
                let status = child.wait().await.ok();
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                anyhow::bail!(
                    "the server stopped before listening ({}): {}",
                    status.map_or("unknown status".into(), |s| s.to_string()),
                    truncate(tail.trim(), 2000)
                );
            }
            Ok(Err(e)) => return Err(e).context("cannot read the server's output"),
            Err(_) => anyhow::bail!(
                "the server did not start within {START_TIMEOUT:?} (log: {})",
                log.display()
            ),
        };
        // Keep reading so the server never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        Ok(Server { child, address })
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        // SQLite in WAL mode survives a kill; cells not yet indexed are
        // picked up by the next store that opens the file.
        self.child.kill().await.context("cannot stop the server")?;
        Ok(())
    }
}

async fn open_store(defs: &Definitions, data: &Path) -> anyhow::Result<Store> {
    Store::open(
        defs.clone(),
        StoreOptions::new(StorageConfig::embedded(data)),
    )
    .await
    .map_err(|e| anyhow::anyhow!("cannot open the store in `{}`: {e}", data.display()))
}

/// Opens a fresh store in `data`, creates the live shards and loads the
/// trips, with their index entries.
async fn prepare(
    defs: &Definitions,
    data: &Path,
    args: &BenchArgs,
    work: &Workload,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let store = open_store(defs, data).await?;
    for shard in 0..work.keys.live {
        store
            .cells_for_shard(DATASTORE, shard, Location::AddedId(0), 1)
            .await
            .map_err(|e| anyhow::anyhow!("cannot create shard {shard}: {e}"))?;
    }
    eprintln!(
        "created the tables of {} shards of `{DATASTORE}` in {:.1} s",
        work.keys.live,
        started.elapsed().as_secs_f64()
    );
    let started = Instant::now();
    let cells = work.load_cells(args.trips);
    for batch in cells.chunks(LOAD_BATCH) {
        for result in store
            .put_cells(DATASTORE, batch.to_vec())
            .await
            .map_err(|e| anyhow::anyhow!("cannot load trips: {e}"))?
        {
            result.map_err(|e| anyhow::anyhow!("cannot load a trip: {e}"))?;
        }
    }
    store
        .sync_indexes()
        .await
        .map_err(|e| anyhow::anyhow!("cannot index the trips: {e}"))?;
    eprintln!(
        "loaded {} trips of {} drivers in {:.1} s",
        args.trips,
        args.drivers,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let shards = check_definitions(&defs)?;
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; build with `--release` for meaningful numbers");
    }

    let work_dir = tempfile::Builder::new()
        .prefix("cellgate-bench-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    let data = match &args.data {
        Some(dir) => {
            anyhow::ensure!(
                !dir.join("cellgate.db").exists(),
                "`{}` already holds a database; the benchmark needs a fresh one \
                 (give an empty directory, or leave out --data)",
                dir.join("cellgate.db").display()
            );
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create `{}`", dir.display()))?;
            dir.clone()
        }
        None => work_dir.path().join("data"),
    };
    let duration = Duration::from_secs(args.duration);
    let work = Arc::new(Workload::new(&args, shards));

    prepare(&defs, &data, &args, &work).await?;

    // HTTP: the real server, alone on the database.
    let server = Server::start(&data, &args.datastores, work_dir.path()).await?;
    eprintln!("server listening on http://{}", server.address);
    let url: Arc<str> = format!("http://{}/graphql", server.address).into();
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(args.concurrency as usize)
        .tcp_nodelay(true)
        .timeout(REQUEST_TIMEOUT)
        .build()
        .context("cannot build the HTTP client")?;
    let http = async {
        let query = http_query_op(client.clone(), url.clone(), work.clone());
        let a = run_phase("index query", "HTTP", args.concurrency, duration, query).await?;
        let write = http_write_op(client.clone(), url.clone(), work.clone());
        let b = run_phase("batched write", "HTTP", args.concurrency, duration, write).await?;
        anyhow::Ok((a, b))
    }
    .await;
    drop(client);
    server.stop().await?;
    let (http_query, http_write) = http?;

    // Rust API: in-process, after the server is gone. Index entries of the
    // HTTP writes are brought up to date first, so that catching up does
    // not run during the measurements.
    let store = open_store(&defs, &data).await?;
    store
        .sync_indexes()
        .await
        .map_err(|e| anyhow::anyhow!("cannot index the written trips: {e}"))?;
    let query = rust_query_op(store.clone(), work.clone());
    let rust_query =
        run_phase("index query", "Rust API", args.concurrency, duration, query).await?;
    let write = rust_write_op(store.clone(), work.clone());
    let rust_write = run_phase(
        "batched write",
        "Rust API",
        args.concurrency,
        duration,
        write,
    )
    .await?;
    drop(store);

    let outcomes = [http_query, rust_query, http_write, rust_write];
    print_report(&args, &outcomes);
    if args.data.is_some() {
        eprintln!("the store is kept in `{}`", data.display());
    }
    let failed = outcomes.iter().any(|o| o.errors > 0 || o.requests == 0);
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn print_report(args: &BenchArgs, outcomes: &[Outcome]) {
    println!(
        "cellgate bench: {} trips of {} drivers, {} cells per write, concurrency {}, {} s per run{}",
        args.trips,
        args.drivers,
        args.batch,
        args.concurrency,
        args.duration,
        if cfg!(debug_assertions) {
            " (debug build)"
        } else {
            ""
        }
    );
    println!();
    println!(
        "{:<14} {:<9} {:>9} {:>10} {:>9} {:>9} {:>7}",
        "workload", "path", "requests", "req/s", "p50 ms", "p99 ms", "errors"
    );
    for o in outcomes {
        println!(
            "{:<14} {:<9} {:>9} {:>10.1} {:>9.2} {:>9.2} {:>7}",
            o.workload,
            o.path,
            o.requests,
            o.per_second(),
            o.ms(0.5),
            o.ms(0.99),
            o.errors
        );
    }
    println!();
    for workload in ["index query", "batched write"] {
        let find = |path| {
            outcomes
                .iter()
                .find(|o| o.workload == workload && o.path == path)
        };
        if let (Some(http), Some(rust)) = (find("HTTP"), find("Rust API")) {
            println!(
                "{workload}: HTTP/Rust throughput {:.2}x, p50 {:.2}x, p99 {:.2}x",
                http.per_second() / rust.per_second().max(1e-9),
                http.ms(0.5) / rust.ms(0.5).max(1e-9),
                http.ms(0.99) / rust.ms(0.99).max(1e-9),
            );
        }
    }
    for o in outcomes.iter().filter(|o| o.first_error.is_some()) {
        println!(
            "{} ({}): {} errors, the first: {}",
            o.workload,
            o.path,
            o.errors,
            o.first_error.as_deref().unwrap_or_default()
        );
    }
}
