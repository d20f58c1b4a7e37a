//! `cellgate-bench lag`: index lag as a client sees it — the time from a
//! write's acknowledgement to its entry being visible to an index query —
//! at steady write rates, and the backlog of index maintenance at the
//! highest write rate the gateway sustains.
//!
//! Everything goes through a `cellgate serve` it starts (default
//! configuration, 4096 shards, index maintenance on) over HTTP, on a
//! temporary SQLite store or an empty `--database`:
//!
//! 0. **A store at a realistic size**: `--prefill` cells (default
//!    100,000) are written first, and the indexes caught up.
//! 1. **The highest write rate**: `tripsPutCells` batches of `--batch` new
//!    BASE trips (random row keys, realistic bodies: `dataset.rs`) from 1,
//!    2, 4, … closed-loop writers, `--step` seconds each, until the
//!    acknowledged cells/s stop growing (two steps in a row under 5 % above
//!    the best) or `--max-concurrency` is reached. The best is the highest
//!    rate; `--max-rate` skips the search.
//! 2. **The backlog at the highest rate** for `--max-duration` seconds
//!    (probes too): each second, the cells acknowledged but not yet applied
//!    (the run's acknowledged cells less `cellgate_index_applied_cells_total`
//!    — exact, unlike the sweep's figure) and the sweep's
//!    `cellgate_index_pending_cells`; their maximum and trend (least-squares
//!    slope), and the drain: the time from the last acknowledgement until
//!    every acknowledged cell is applied. The cells/s acknowledged there are
//!    the highest rate the gateway *sustains*: a short step of the search
//!    can outrun index maintenance for a while, and on SQLite, where both
//!    share one writer, it does by far.
//! 3. **Lag at steady rates**: after index maintenance has caught up,
//!    batches are sent at each rate of `--rates` (shares of the sustained
//!    rate, or cells/s) for `--duration` seconds, open loop. About
//!    `--probes` writes a second are sampled: one trip of the batch belongs
//!    to a driver of its own, and as soon as the write is acknowledged a
//!    task of its own queries `driverPartnerIndex` of that driver every
//!    `--poll-ms` until the answer holds the row. The lag is the time from
//!    the acknowledgement to that answer, so it includes one query's round
//!    trip and up to one poll interval.
//!
//! At the end it prints the server's own delay from a cell's commit to its
//! index update over the whole run (`cellgate_index_delay_microseconds`),
//! which tells the maintainer's share of the lag from the rest.
//!
//! The run exits 1 if a write failed, a sampled write never became visible
//! or the indexes did not catch up; the goals (p99 ≤ 20 ms at half the
//! sustained rate, a bounded backlog, a drain within 2 s) are reported, not
//! enforced, since the machine's load moves them.

mod paced;

use self::paced::paced;
use std::path::PathBuf;
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use serde_json::{json, Value};
use tokio::sync::Semaphore;
use tokio::time::MissedTickBehavior;
use uuid::Uuid;

use crate::database::Database;
use crate::dataset::{cell_input, check_definitions, Dataset, WRITE};
use crate::http::{truncate, Gateway, APPLIED, LAG_MAX_MS, PENDING};
use crate::server::Server;
use crate::{load_definitions, DEFAULT_DATASTORES};
use cellgate_store::storage::redact_url;

/// The index page a probe reads: the sampled trip's driver has no other
/// trip, so the page is empty until the entry is visible.
const PROBE: &str = "query BenchLagProbe($driver: UUID!) { trips { \
    driverPartnerIndex(driverPartnerUuid: $driver, first: 1) { edges { node { rowKey } } } } }";

/// The server's delay from a cell's commit to its index update, by
/// quantile, since it started.
const DELAY_US: &str = "cellgate_index_delay_microseconds";
/// A sampled write not visible after this long counts as never seen.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);
/// Probes under way at once, at most; a write due for sampling while
/// they are all busy is not sampled.
const MAX_PROBES: usize = 64;
/// How often the backlog is sampled.
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How often the applied counter is read while waiting for a drain.
const DRAIN_POLL: Duration = Duration::from_millis(10);
/// Longest wait for the indexes to catch up.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(600);
/// A step of the search counts as growth when it beats the best by this.
const GROWTH: f64 = 1.05;
/// Closed-loop writers filling the store before the measurements.
const PREFILL_WRITERS: usize = 8;
/// The goals of the issue this mode measures.
const GOAL_P99_MS: f64 = 20.0;
const GOAL_DRAIN_S: f64 = 2.0;
/// A backlog is bounded when it grows by less than this share of the
/// write rate (1 %: at most 0.6 s of writes over a minute).
const BOUNDED_SLOPE: f64 = 0.01;

/// A write rate of `--rates`: a share of the highest rate (`25%`) or
/// cells per second (`2000`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Rate {
    Share(f64),
    Cells(f64),
}

impl FromStr for Rate {
    type Err = String;

    fn from_str(text: &str) -> Result<Rate, String> {
        let text = text.trim();
        let (number, share) = match text.strip_suffix('%') {
            Some(number) => (number.trim(), true),
            None => (text, false),
        };
        let value: f64 = number
            .parse()
            .map_err(|_| format!("`{text}` is not a rate (e.g. `25%` or `2000` cells/s)"))?;
        if !(value.is_finite() && value > 0.0) {
            return Err(format!("`{text}`: a rate must be above 0"));
        }
        if share {
            if value > 100.0 {
                return Err(format!(
                    "`{text}`: a share of the highest rate is at most 100%"
                ));
            }
            Ok(Rate::Share(value / 100.0))
        } else {
            Ok(Rate::Cells(value))
        }
    }
}

impl Rate {
    /// Cells per second, given the highest rate.
    fn cells(self, max: f64) -> f64 {
        match self {
            Rate::Share(share) => share * max,
            Rate::Cells(cells) => cells,
        }
    }

    fn label(self) -> String {
        match self {
            Rate::Share(share) => format!("{}%", (share * 1000.0).round() / 10.0),
            Rate::Cells(cells) => format!("{cells:.0}/s"),
        }
    }
}

#[derive(Debug, Args)]
pub struct LagBenchArgs {
    /// An empty MySQL/MariaDB or PostgreSQL database
    /// (`mysql://root@127.0.0.1:3306/lag`, `postgres://…`); it is left
    /// with the data. [default: an SQLite store in a temporary directory]
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_BENCH_DATABASE_URL",
        hide_env_values = true
    )]
    pub database: Option<String>,
    /// Directory of the datastore and index definitions (the `trips`
    /// datastore and its `driver_partner_index`, as in ./datastores).
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,
    /// Write rates of the lag measurement, comma-separated: shares of the
    /// highest rate (`25%`) or cells per second (`2000`).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        default_value = "10%,25%,50%",
        env = "CELLGATE_BENCH_RATES"
    )]
    pub rates: Vec<Rate>,
    /// Seconds each rate of `--rates` runs.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10,
        env = "CELLGATE_BENCH_DURATION",
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub duration: u64,
    /// Seconds of writes at the highest rate, with the backlog sampled
    /// every second.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 60,
        env = "CELLGATE_BENCH_MAX_DURATION",
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub max_duration: u64,
    /// The highest write rate in cells per second, instead of searching
    /// for it.
    #[arg(long, value_name = "CELLS", env = "CELLGATE_BENCH_MAX_RATE")]
    pub max_rate: Option<u32>,
    /// Cells written before anything is measured, so that the rates are
    /// those of a store at a realistic size rather than of an empty one.
    #[arg(
        long,
        value_name = "CELLS",
        default_value_t = 100_000,
        env = "CELLGATE_BENCH_PREFILL"
    )]
    pub prefill: u64,
    /// Seconds per step of the search for the highest rate.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 3.0,
        env = "CELLGATE_BENCH_STEP"
    )]
    pub step: f64,
    /// Most writers of the search (1, 2, 4, … up to this).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 64,
        env = "CELLGATE_BENCH_MAX_CONCURRENCY",
        value_parser = clap::value_parser!(u32).range(1..=1024)
    )]
    pub max_concurrency: u32,
    /// New BASE cells per write (`tripsPutCells`).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 50,
        env = "CELLGATE_BENCH_BATCH",
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    pub batch: u32,
    /// Writes sampled per second for the lag.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 20,
        env = "CELLGATE_BENCH_PROBES",
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    pub probes: u32,
    /// Milliseconds between two index queries of one probe.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 1,
        env = "CELLGATE_BENCH_POLL_MS",
        value_parser = clap::value_parser!(u64).range(0..=1000)
    )]
    pub poll_ms: u64,
    /// `indexes.sweep_interval_ms` of the started server: how often its
    /// maintainer compares every shard's log with the index progress, in
    /// the loop that runs the passes. [default: the server's, 1000]
    #[arg(long, value_name = "MS", env = "CELLGATE_BENCH_SWEEP_INTERVAL_MS")]
    pub sweep_interval_ms: Option<u64>,
    /// Longest wait, in seconds, for one write; a write without an answer
    /// by then counts as failed.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 30,
        env = "CELLGATE_BENCH_REQUEST_TIMEOUT",
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub request_timeout: u64,
}

/// What the run shares between its tasks.
struct Run {
    /// Writes go through one client, probes and `/metrics` through
    /// another, so that a probe never waits for a pooled connection behind
    /// the writes.
    writer: Arc<Gateway>,
    reader: Arc<Gateway>,
    data: Dataset,
    timeout: Duration,
    poll: Duration,
    /// Cells acknowledged `WRITTEN` since the start, every phase.
    acked: AtomicU64,
    errors: AtomicU64,
    first_error: Mutex<Option<String>>,
}

impl Run {
    fn failed(&self, message: String) {
        self.errors.fetch_add(1, Ordering::Relaxed);
        self.first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert(message);
    }

    /// One `tripsPutCells` of a batch of new trips; with `driver`, the
    /// first trip is that driver's. The row key of the first trip and the
    /// moment of the acknowledgement.
    async fn write(&self, driver: Option<Uuid>) -> Result<(Uuid, Instant), String> {
        let mut cells = self.data.write_cells();
        if let Some(driver) = driver {
            cells[0].body["driver_partner_uuid"] = json!(driver.to_string());
        }
        let row_key = cells[0].row_key;
        let input: Vec<Value> = cells.iter().map(cell_input).collect();
        let answer = tokio::time::timeout(
            self.timeout,
            self.writer.graphql(WRITE, json!({ "cells": input })),
        )
        .await
        .map_err(|_| format!("no answer within {:?}", self.timeout))??;
        let acked = Instant::now();
        let results = answer
            .get("tripsPutCells")
            .and_then(Value::as_array)
            .ok_or_else(|| format!("no results in {}", truncate(&answer.to_string(), 200)))?;
        let written = results
            .iter()
            .filter(|r| r.get("status").and_then(Value::as_str) == Some("WRITTEN"))
            .count();
        if written != cells.len() {
            return Err(format!("{written} of {} cells written", cells.len()));
        }
        self.acked.fetch_add(written as u64, Ordering::Relaxed);
        Ok((row_key, acked))
    }

    /// Queries the index page of `driver` until it holds `row_key`: the
    /// time from `acked` to the answer that does, or `None` after
    /// [`PROBE_TIMEOUT`].
    async fn probe(&self, driver: Uuid, row_key: Uuid, acked: Instant) -> Option<Duration> {
        let variables = json!({ "driver": driver.to_string() });
        let row_key = row_key.to_string();
        loop {
            match self.reader.graphql(PROBE, variables.clone()).await {
                Ok(data) => {
                    let edges = data
                        .pointer("/trips/driverPartnerIndex/edges")
                        .and_then(Value::as_array);
                    let seen = edges.is_some_and(|edges| {
                        edges.iter().any(|e| {
                            e.pointer("/node/rowKey").and_then(Value::as_str)
                                == Some(row_key.as_str())
                        })
                    });
                    if seen {
                        return Some(acked.elapsed());
                    }
                }
                Err(message) => self.failed(format!("index query: {message}")),
            }
            if acked.elapsed() >= PROBE_TIMEOUT {
                return None;
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// The gateway's applied cells, pending cells (from its latest sweep)
    /// and lag of the oldest pending cell.
    async fn figures(&self) -> anyhow::Result<(u64, i64, u64)> {
        let metrics = self.reader.metrics().await?;
        let applied = metrics.sum(APPLIED).ok_or_else(|| {
            anyhow::anyhow!("the gateway's /metrics has no `{APPLIED}`: it cannot be measured")
        })?;
        Ok((
            applied as u64,
            metrics.sum(PENDING).unwrap_or(0.0) as i64,
            metrics.max(LAG_MAX_MS).unwrap_or(0.0) as u64,
        ))
    }

    /// Waits until every acknowledged cell is applied; how long it took.
    async fn caught_up(&self) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let mut failures = 0;
        loop {
            match self.figures().await {
                Ok((applied, _, _)) if applied >= self.acked.load(Ordering::Relaxed) => {
                    return Ok(started.elapsed())
                }
                Ok(_) => {}
                Err(e) if failures >= 10 => return Err(e),
                Err(_) => failures += 1,
            }
            anyhow::ensure!(
                started.elapsed() < DRAIN_TIMEOUT,
                "the indexes did not catch up within {DRAIN_TIMEOUT:?}"
            );
            tokio::time::sleep(DRAIN_POLL).await;
        }
    }
}

/// One step of the search.
struct Step {
    concurrency: u32,
    cells_per_second: f64,
    write_p50_ms: f64,
}

/// Closed-loop writes from `concurrency` writers for `duration`.
async fn step(run: &Arc<Run>, concurrency: u32, duration: Duration) -> Step {
    let before = run.acked.load(Ordering::Relaxed);
    let started = Instant::now();
    let deadline = started + duration;
    let writers: Vec<_> = (0..concurrency)
        .map(|_| {
            let run = run.clone();
            tokio::spawn(async move {
                let mut latency = histogram();
                while Instant::now() < deadline {
                    let sent = Instant::now();
                    if let Err(message) = run.write(None).await {
                        run.failed(message);
                    }
                    latency.saturating_record(sent.elapsed().as_micros() as u64);
                }
                latency
            })
        })
        .collect();
    let mut latency = histogram();
    for writer in writers {
        if let Ok(h) = writer.await {
            let _ = latency.add(h);
        }
    }
    let cells = run.acked.load(Ordering::Relaxed) - before;
    Step {
        concurrency,
        cells_per_second: cells as f64 / started.elapsed().as_secs_f64().max(1e-9),
        write_p50_ms: latency.value_at_quantile(0.5) as f64 / 1000.0,
    }
}

/// What one paced phase measured.
struct Phase {
    label: String,
    target: f64,
    achieved: f64,
    write_p50_ms: f64,
    write_p99_ms: f64,
    sampled: u64,
    /// Ack-to-visible of the sampled writes seen, in microseconds.
    lag: Histogram<u64>,
    unseen: u64,
    /// Per second from the start: acknowledged minus applied cells, the
    /// sweep's pending cells, its lag of the oldest pending cell (ms).
    samples: Vec<(f64, i64, i64, u64)>,
    drain: Duration,
}

impl Phase {
    fn lag_ms(&self, quantile: f64) -> Option<f64> {
        (!self.lag.is_empty()).then(|| self.lag.value_at_quantile(quantile) as f64 / 1000.0)
    }

    fn backlog_max(&self) -> i64 {
        self.samples.iter().map(|s| s.1).max().unwrap_or(0)
    }

    fn pending_max(&self) -> i64 {
        self.samples.iter().map(|s| s.2).max().unwrap_or(0)
    }

    /// The backlog's least-squares slope in cells per second.
    fn backlog_slope(&self) -> f64 {
        slope(
            &self
                .samples
                .iter()
                .map(|s| (s.0, s.1 as f64))
                .collect::<Vec<_>>(),
        )
    }
}

/// Least-squares slope of `points`; 0 for fewer than two.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if points.len() < 2 {
        return 0.0;
    }
    let mean_x = points.iter().map(|p| p.0).sum::<f64>() / n;
    let mean_y = points.iter().map(|p| p.1).sum::<f64>() / n;
    let covariance: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
    let variance: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
    if variance == 0.0 {
        0.0
    } else {
        covariance / variance
    }
}

/// Microseconds from 1 µs to 10 minutes, 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "—".to_string(), |v| format!("{v:.1}"))
}

pub async fn run(args: LagBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    check_definitions(&defs, false)?;
    anyhow::ensure!(
        args.step.is_finite() && args.step > 0.0,
        "--step must be a positive number of seconds"
    );
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; build with `--release` for meaningful numbers");
    }
    let dir = crate::server::work_dir()?;
    let database = match &args.database {
        Some(url) => Database::server(url)?,
        None => Database::embedded(&dir.path().join("store")),
    };
    database.ensure_empty().await?;
    database.wait_idle(Duration::from_secs(15)).await?;
    let shards = defs
        .datastore(crate::dataset::DATASTORE)
        .map_or(0, |d| d.shards);
    println!(
        "cellgate-bench lag ({} build): {}; database {} ({}); {} shards; batches of {} new trips; \
         {} probes/s polled every {} ms; rates {} for {} s each, the highest for {} s; sweep every {}; {} cores",
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        },
        std::env::args().collect::<Vec<_>>().join(" "),
        redact_url(&database.url),
        database.backend_name(),
        shards,
        args.batch,
        args.probes,
        args.poll_ms,
        args.rates
            .iter()
            .map(|r| r.label())
            .collect::<Vec<_>>()
            .join(", "),
        args.duration,
        args.max_duration,
        args.sweep_interval_ms
            .map_or_else(|| "1000 ms (default)".to_string(), |ms| format!("{ms} ms")),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let timeout = Duration::from_secs(args.request_timeout);
    let clients = args.max_concurrency * 2 + MAX_PROBES as u32;
    let config = match args.sweep_interval_ms {
        Some(ms) => format!("indexes:\n  sweep_interval_ms: {ms}\n"),
        None => String::new(),
    };
    let server = Server::start_configured(
        &database,
        &config,
        &args.datastores,
        dir.path(),
        clients,
        timeout,
    )
    .await?;
    let outcome = measure(&args, &server, timeout).await;
    server.stop().await?;
    outcome
}

async fn measure(
    args: &LagBenchArgs,
    server: &Server,
    timeout: Duration,
) -> anyhow::Result<ExitCode> {
    let reader = Arc::new(Gateway::new(
        &server.gateway.base,
        MAX_PROBES as u32 + 2,
        timeout,
    )?);
    let run = Arc::new(Run {
        writer: server.gateway.clone(),
        reader,
        data: Dataset::new(0, 1, false, rand::random(), args.batch as usize),
        timeout,
        poll: Duration::from_millis(args.poll_ms),
        acked: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        first_error: Mutex::new(None),
    });
    // The figures must be there before anything is measured.
    run.figures().await?;

    // 0. A store at a realistic size.
    if args.prefill > 0 {
        let started = Instant::now();
        let goal = args.prefill;
        let writers: Vec<_> = (0..PREFILL_WRITERS)
            .map(|_| {
                let run = run.clone();
                tokio::spawn(async move {
                    while run.acked.load(Ordering::Relaxed) < goal {
                        if let Err(message) = run.write(None).await {
                            run.failed(message);
                            return;
                        }
                    }
                })
            })
            .collect();
        for writer in writers {
            let _ = writer.await;
        }
        anyhow::ensure!(
            run.errors.load(Ordering::Relaxed) == 0,
            "writes failed while filling the store: {}",
            run.first_error
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
                .unwrap_or_default()
        );
        let caught_up = run.caught_up().await?;
        println!(
            "filled the store with {} cells in {:.1} s; the indexes caught up {:.2} s later",
            thousands(run.acked.load(Ordering::Relaxed) as f64),
            started.elapsed().as_secs_f64(),
            caught_up.as_secs_f64()
        );
    }

    // 1. The highest rate.
    let (max_rate, concurrency) = match args.max_rate {
        Some(rate) => (f64::from(rate.max(1)), args.max_concurrency),
        None => {
            println!(
                "\nsearch for the highest write rate ({} s per step)",
                args.step
            );
            println!(
                "  {:>7} {:>12} {:>13}",
                "writers", "cells/s", "write p50 ms"
            );
            let mut best: Option<Step> = None;
            let mut flat = 0;
            let mut concurrency = 1;
            loop {
                let step = step(&run, concurrency, Duration::from_secs_f64(args.step)).await;
                println!(
                    "  {:>7} {:>12} {:>13.1}",
                    step.concurrency,
                    thousands(step.cells_per_second),
                    step.write_p50_ms
                );
                let grew = best
                    .as_ref()
                    .is_none_or(|b| step.cells_per_second > b.cells_per_second * GROWTH);
                flat = if grew { 0 } else { flat + 1 };
                if best
                    .as_ref()
                    .is_none_or(|b| step.cells_per_second > b.cells_per_second)
                {
                    best = Some(step);
                }
                if flat >= 2 || concurrency >= args.max_concurrency {
                    break;
                }
                concurrency = (concurrency * 2).min(args.max_concurrency);
            }
            let best = best.expect("one step at least");
            (best.cells_per_second, best.concurrency)
        }
    };
    let caught_up = run.caught_up().await?;
    println!(
        "highest rate: {} cells/s ({} writers); the indexes caught up {:.2} s after the search",
        thousands(max_rate),
        concurrency,
        caught_up.as_secs_f64()
    );
    // Room for the writes of a rate to queue behind a slow one without
    // lowering the rate.
    let in_flight = (concurrency as usize * 2).max(4);

    // 2. The highest rate for `--max-duration`: what the gateway
    // acknowledges there is the highest rate it sustains (a short step of
    // the search can outrun index maintenance for a while); 3. the steady
    // rates, as shares of that.
    eprintln!(
        "highest: {} cells/s for {} s",
        thousands(max_rate),
        args.max_duration
    );
    let top = paced(
        &run,
        "100%".to_string(),
        max_rate,
        Duration::from_secs(args.max_duration),
        in_flight,
        args.probes,
    )
    .await?;
    let sustained = top.achieved.max(1.0);
    run.caught_up().await?;
    println!(
        "sustained: {} cells/s acknowledged at the highest rate; the steady rates are shares of it",
        thousands(sustained)
    );
    let mut phases = Vec::new();
    for rate in &args.rates {
        let cells = rate.cells(sustained);
        eprintln!(
            "{}: {} cells/s for {} s",
            rate.label(),
            thousands(cells),
            args.duration
        );
        phases.push(
            paced(
                &run,
                rate.label(),
                cells,
                Duration::from_secs(args.duration),
                in_flight,
                args.probes,
            )
            .await?,
        );
    }

    println!("\nindex lag: from a write's acknowledgement to an index query that returns it");
    println!(
        "  {:>6} {:>9} {:>9} {:>11} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8}",
        "rate",
        "target",
        "cells/s",
        "write p50/99",
        "probes",
        "lag p50",
        "p99",
        "max ms",
        "backlog",
        "pending",
        "drain s"
    );
    for phase in phases.iter().chain(std::iter::once(&top)) {
        println!(
            "  {:>6} {:>9} {:>9} {:>11} {:>8} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8.2}",
            phase.label,
            thousands(phase.target),
            thousands(phase.achieved),
            format!("{:.0}/{:.0}", phase.write_p50_ms, phase.write_p99_ms),
            phase.sampled,
            ms(phase.lag_ms(0.5)),
            ms(phase.lag_ms(0.99)),
            ms((!phase.lag.is_empty()).then(|| phase.lag.max() as f64 / 1000.0)),
            thousands(phase.backlog_max() as f64),
            thousands(phase.pending_max() as f64),
            phase.drain.as_secs_f64()
        );
    }
    println!(
        "  (write p50/99 in ms; backlog: most cells acknowledged but not applied, pending: \
         most pending cells of a sweep, both sampled each second; drain: from the last \
         acknowledgement to every cell applied)"
    );

    let backlog: Vec<String> = top.samples.iter().map(|s| thousands(s.1 as f64)).collect();
    let half = top.samples.len() / 2;
    let half_max =
        |samples: &[(f64, i64, i64, u64)]| samples.iter().map(|s| s.1).max().unwrap_or(0);
    let growth = top.backlog_slope();
    let bounded = growth <= BOUNDED_SLOPE * top.achieved;
    println!(
        "\nat the highest rate ({} cells/s asked, {} acknowledged) for {} s, the backlog each second: {}",
        thousands(top.target),
        thousands(top.achieved),
        args.max_duration,
        backlog.join(" ")
    );
    println!(
        "  max {} cells (first half {}, second half {}); trend {:+.0} cells/s ({:+.2} % of the write rate); \
         sweep's pending max {}, its oldest pending cell at most {} ms old; drained {:.2} s after the last write",
        thousands(top.backlog_max() as f64),
        thousands(half_max(&top.samples[..half]) as f64),
        thousands(half_max(&top.samples[half..]) as f64),
        growth,
        growth / top.achieved.max(1e-9) * 100.0,
        thousands(top.pending_max() as f64),
        top.samples.iter().map(|s| s.3).max().unwrap_or(0),
        top.drain.as_secs_f64()
    );

    // The maintainer's own share: commit to index update, as the server
    // measures it, over the whole run (every phase, the search included).
    if let Ok(metrics) = run.reader.metrics().await {
        let quantiles = metrics.by_label(DELAY_US, "quantile");
        if !quantiles.is_empty() {
            println!(
                "the server's commit-to-index-update delay over the whole run: {}",
                quantiles
                    .iter()
                    .map(|(q, us)| format!("q{q} {:.1} ms", us / 1000.0))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }

    println!("\ngoals");
    let verdict = |met: bool| if met { "met" } else { "missed" };
    match phases
        .iter()
        .find(|p| (p.target / sustained - 0.5).abs() < 0.005)
    {
        Some(half) => {
            let p99 = half.lag_ms(0.99);
            println!(
                "  p99 lag at half the highest sustained rate ≤ {GOAL_P99_MS} ms: {} ms, {}",
                ms(p99),
                verdict(p99.is_some_and(|p| p <= GOAL_P99_MS))
            );
        }
        None => println!("  p99 lag at half the highest rate: not measured (add 50% to --rates)"),
    }
    println!(
        "  a bounded backlog at the highest rate (trend under {:.0} % of the write rate): {}",
        BOUNDED_SLOPE * 100.0,
        verdict(bounded)
    );
    println!(
        "  drained within {GOAL_DRAIN_S} s: {:.2} s, {}",
        top.drain.as_secs_f64(),
        verdict(top.drain.as_secs_f64() <= GOAL_DRAIN_S)
    );

    let errors = run.errors.load(Ordering::Relaxed);
    let unseen: u64 = phases
        .iter()
        .chain(std::iter::once(&top))
        .map(|p| p.unseen)
        .sum();
    if errors > 0 {
        let first = run
            .first_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_default();
        eprintln!("{errors} requests failed; the first: {first}");
    }
    if unseen > 0 {
        eprintln!("{unseen} sampled writes were not visible within {PROBE_TIMEOUT:?}");
    }
    Ok(if errors > 0 || unseen > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_shares_or_cells_per_second() {
        assert_eq!("25%".parse(), Ok(Rate::Share(0.25)));
        assert_eq!(" 2000 ".parse(), Ok(Rate::Cells(2000.0)));
        assert_eq!(Rate::Share(0.5).cells(3000.0), 1500.0);
        assert_eq!(Rate::Share(0.1).label(), "10%");
        for bad in ["0", "-5", "150%", "fast", "%", "NaN"] {
            assert!(bad.parse::<Rate>().is_err(), "{bad}");
        }
    }

    #[test]
    fn slope_of_a_growing_and_a_flat_backlog() {
        let growing: Vec<(f64, f64)> = (0..10)
            .map(|t| (t as f64, 100.0 * t as f64 + 5.0))
            .collect();
        assert!((slope(&growing) - 100.0).abs() < 1e-9);
        let flat: Vec<(f64, f64)> = (0..10)
            .map(|t| (t as f64, if t % 2 == 0 { 50.0 } else { 70.0 }))
            .collect();
        assert!(slope(&flat).abs() < 3.0);
        assert_eq!(slope(&[(1.0, 4.0)]), 0.0);
    }
}
