//! `cellgate-bench move`: what an online shard move costs the writes that
//! go on beside it, and how fast it copies, at a realistic size.
//!
//! Three clusters of one backend (three SQLite files in a temporary
//! directory, or three fresh databases on the `--database` server, dropped
//! at the end): `a` holds shards 0–2047 of `trips`, `b` 2048–4095, `c`
//! none (for 4096 shards; a quarter and halves of the count otherwise).
//!
//! 1. **Prefill**: `--cells` BASE cells whose rows hash into the moved range
//!    (0–1023), plus a quarter as many elsewhere, with trip bodies
//!    (`dataset.rs`), in batches of 500 through the Rust API of one of the
//!    two gateways; then the indexes catch up (`sync_indexes`).
//! 2. **Load**: two in-process stores, as two gateways would be (index
//!    maintenance on, following the stored topology), take `--rate` writes
//!    a second between them, alternating: each one `put_cell` of a new trip
//!    at a random row key over all shards. The schedule is open loop: write
//!    `k` is due at `k / rate` seconds and its latency runs from then, so a
//!    stall shows as latency, never as fewer writes. After a one-second
//!    warm-up (not counted), `--baseline-secs` of writes before the move
//!    are the baseline.
//! 3. **Move**: a third store (no index maintenance, no buffer replay, not
//!    following the topology, as `cellgate shard move` opens it) moves
//!    shards 0–1023 from `a` to `c` with `Store::move_shards`. The load goes
//!    on until the move returns.
//!
//! The report: the cells of the range, the copy rate (of the copy phase,
//! and of the whole move), each phase's time, the mover's `write_pause`,
//! and write latency p50/p99/max for the baseline, every write during the
//! move, and the writes to the moved range during the move, with the
//! writes over 100 ms and 250 ms and the failed ones; one line per phase
//! with the writes issued in it. The goal (p99 under 100 ms, max under
//! 250 ms for writes to the moved range at 500 writes/s) is reported, not
//! enforced; the run exits 1 if a write failed or the move did.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cellgate_store::cells::{NewCell, PutStatus};
use cellgate_store::moves::{MoveOptions, MoveProgress, Phase};
use cellgate_store::shards::row_shard;
use cellgate_store::storage::{self, redact_url, ConnectOptions, Sql};
use cellgate_store::{ClusterConfig, ShardRange, StorageConfig, Store, StoreOptions};
use clap::Args;
use futures::StreamExt as _;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::SeedableRng as _;
use serde::Serialize;

use crate::dataset::{check_definitions, random_uuid, Dataset, DATASTORE};
use crate::{load_definitions, DEFAULT_DATASTORES};

/// Cells per prefill batch, and batches in flight.
const PREFILL_BATCH: u64 = 500;
const PREFILL_IN_FLIGHT: usize = 4;
/// Writes before the baseline that are not counted: the first writes of a
/// store open its connections.
const WARM_UP: Duration = Duration::from_secs(1);
/// Latency thresholds counted per window.
const SLOW_MS: [u64; 2] = [100, 250];
/// The goal the mode measures, for writes to the moved range.
const GOAL_P99_MS: f64 = 100.0;
const GOAL_MAX_MS: f64 = 250.0;
/// The steps of the fence, as its progress counts them.
const FENCE_STEPS: [&str; 2] = ["counters fenced", "last cells and counters copied"];
/// Pooled connections per database of each store when the three clusters
/// are databases of one server: about a third of the store's defaults (16
/// and 4), so that the two gateways and the mover need at most some 80
/// connections there, as they would of each of three servers.
const SERVER_CONNECTIONS: u32 = 6;
const SERVER_MAINTENANCE_CONNECTIONS: u32 = 2;
/// The cluster the range moves from, and to.
const SOURCE: &str = "a";
const TARGET: &str = "c";

#[derive(Debug, Args)]
pub struct MoveBenchArgs {
    /// A MySQL/MariaDB or PostgreSQL server (`postgres://…/postgres`,
    /// `mysql://root@127.0.0.1:3306/test`): three fresh databases are
    /// created on it for the clusters and dropped at the end. The user
    /// needs the right to create databases. [default: three SQLite files
    /// in a temporary directory]
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_BENCH_DATABASE_URL",
        hide_env_values = true
    )]
    pub database: Option<String>,
    /// Directory of the datastore and index definitions (the `trips`
    /// datastore, as in ./datastores).
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,
    /// Cells stored in the moved range before the move; a quarter as many
    /// are stored in the other shards.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1_000_000,
        env = "CELLGATE_BENCH_CELLS",
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub cells: u64,
    /// Writes per second during the baseline and the move (one new cell
    /// each, alternating the two gateways).
    #[arg(
        long,
        value_name = "N",
        default_value_t = 500.0,
        env = "CELLGATE_BENCH_RATE"
    )]
    pub rate: f64,
    /// Seconds of writes measured before the move starts.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 10,
        env = "CELLGATE_BENCH_BASELINE_SECS",
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub baseline_secs: u64,
    /// Cells per copy statement of the move. [default: the store's, 1000]
    #[arg(long, value_name = "N", env = "CELLGATE_BENCH_CHUNK")]
    pub chunk: Option<usize>,
    /// Share of the time the move's copy, verify and cleanup work (as
    /// `cellgate shard move --duty`). [default: the store's, 0.5]
    #[arg(long, value_name = "F", env = "CELLGATE_BENCH_DUTY")]
    pub duty: Option<f64>,
    /// Pooled connections per database of each of the three stores
    /// (`max_connections`). [default: the store's, 16, on SQLite; on a
    /// `--database` server 6, with 2 for index maintenance instead of 4:
    /// the three clusters share the one server, which would otherwise need
    /// up to 180 connections, and PostgreSQL allows 100 by default]
    #[arg(long, value_name = "N", env = "CELLGATE_BENCH_MAX_CONNECTIONS")]
    pub max_connections: Option<u32>,
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
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE", env = "CELLGATE_BENCH_JSON")]
    pub json: Option<PathBuf>,
}

/// The three clusters' databases, and the server databases to drop.
struct Clusters {
    /// `(name, URL)` of `a`, `b`, `c`.
    urls: Vec<(&'static str, String)>,
    /// The `--database` URL and the databases created on it.
    created: Option<(String, Vec<String>)>,
}

impl Clusters {
    /// Three SQLite files in `dir`, or three new databases on `server`.
    async fn create(server: Option<&str>, dir: &Path) -> anyhow::Result<Clusters> {
        let names = ["a", "b", "c"];
        let Some(server) = server else {
            let urls = names
                .iter()
                .map(|n| {
                    (
                        *n,
                        format!("sqlite://{}", dir.join(format!("{n}.db")).display()),
                    )
                })
                .collect();
            return Ok(Clusters {
                urls,
                created: None,
            });
        };
        let scheme = server.split(':').next().unwrap_or_default();
        anyhow::ensure!(
            matches!(scheme, "mysql" | "mariadb" | "postgres" | "postgresql"),
            "--database must be a MySQL/MariaDB or PostgreSQL server URL, not `{}`",
            redact_url(server)
        );
        let prefix = format!("cellgate_bench_move_{}", std::process::id());
        let mut clusters = Clusters {
            urls: Vec::new(),
            created: Some((server.to_string(), Vec::new())),
        };
        for name in names {
            let database = format!("{prefix}_{name}");
            if let Err(e) = admin(server, "CREATE DATABASE", &database).await {
                clusters.drop_all().await;
                return Err(e);
            }
            if let Some((_, created)) = clusters.created.as_mut() {
                created.push(database.clone());
            }
            clusters
                .urls
                .push((name, with_database(server, &database)?));
        }
        Ok(clusters)
    }

    /// The storage configuration: `a` holds the first half of the shards,
    /// `b` the second, `c` none.
    fn storage(&self, shards: u32) -> StorageConfig {
        let range = |first, last, cluster: &str| ShardRange {
            first,
            last,
            cluster: cluster.into(),
        };
        let half = shards / 2;
        StorageConfig {
            clusters: self
                .urls
                .iter()
                .map(|(name, url)| ClusterConfig {
                    name: (*name).into(),
                    master: url.clone(),
                    replicas: vec![],
                })
                .collect(),
            shards: [(
                DATASTORE.to_string(),
                vec![range(0, half - 1, "a"), range(half, shards - 1, "b")],
            )]
            .into_iter()
            .collect(),
            ..StorageConfig::default()
        }
    }

    /// Drops the databases created on the server; problems are printed.
    async fn drop_all(&mut self) {
        let Some((server, created)) = self.created.take() else {
            return;
        };
        for database in created {
            if let Err(e) = admin(&server, "DROP DATABASE IF EXISTS", &database).await {
                eprintln!("warning: cannot drop the database `{database}`: {e:#}");
            }
        }
    }
}

/// Runs `CREATE DATABASE name` or `DROP DATABASE IF EXISTS name` on the
/// server at `url`, through a connection of its own.
async fn admin(url: &str, statement: &str, name: &str) -> anyhow::Result<()> {
    let options = ConnectOptions {
        cluster: "admin".to_string(),
        max_connections: 1,
        ..ConnectOptions::default()
    };
    let backend = storage::connect(url, &options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to {}: {e}", redact_url(url)))?;
    let mut sql = Sql::new(backend.dialect());
    sql.push(statement).push(" ").ident(name);
    // Connections of stores that did not shut down (an error, Ctrl-C)
    // would keep a PostgreSQL database from being dropped.
    if statement.starts_with("DROP") && backend.dialect() == storage::Dialect::Postgres {
        sql.push(" WITH (FORCE)");
    }
    let outcome = backend
        .execute(&sql)
        .await
        .map_err(|e| anyhow::anyhow!("`{statement} {name}` failed: {e}"));
    backend.close().await;
    outcome.map(|_| ())
}

/// `url` with its database replaced by `name`.
fn with_database(url: &str, name: &str) -> anyhow::Result<String> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| anyhow::anyhow!("`{}` is not a URL", redact_url(url)))?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let query = path
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    Ok(format!("{scheme}://{authority}/{name}{query}"))
}

/// One write of the load.
#[derive(Debug, Clone, Copy)]
struct Write {
    /// When it was due, from the start of the load.
    due: Duration,
    /// From when it was due to its answer, in microseconds.
    latency_us: u64,
    /// Its row is in the moved range.
    in_range: bool,
    /// Answered `WRITTEN` in time.
    ok: bool,
}

/// Latencies of the writes due in one window.
#[derive(Debug, Clone, Serialize)]
pub struct WindowReport {
    pub label: String,
    pub writes: u64,
    pub failed: u64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
    pub over_100_ms: u64,
    pub over_250_ms: u64,
}

impl WindowReport {
    /// The figures of `writes` (failed ones are counted, not timed).
    fn of<'a>(label: &str, writes: impl Iterator<Item = &'a Write>) -> WindowReport {
        let mut latency = histogram();
        let (mut count, mut failed) = (0, 0);
        let mut over = [0u64; 2];
        for write in writes {
            count += 1;
            if !write.ok {
                failed += 1;
                continue;
            }
            latency.saturating_record(write.latency_us.max(1));
            for (n, limit) in over.iter_mut().zip(SLOW_MS) {
                *n += u64::from(write.latency_us > limit * 1000);
            }
        }
        let ms = |us: u64| us as f64 / 1000.0;
        let timed = !latency.is_empty();
        WindowReport {
            label: label.to_string(),
            writes: count,
            failed,
            p50_ms: timed.then(|| ms(latency.value_at_quantile(0.5))),
            p99_ms: timed.then(|| ms(latency.value_at_quantile(0.99))),
            max_ms: timed.then(|| ms(latency.max())),
            over_100_ms: over[0],
            over_250_ms: over[1],
        }
    }
}

/// One phase of the move, and the writes due while it ran.
#[derive(Debug, Clone, Serialize)]
pub struct PhaseReport {
    pub phase: &'static str,
    pub seconds: f64,
    pub writes: WindowReport,
    pub range_writes: WindowReport,
}

/// Everything a run measured, as printed and as `--json` writes it.
#[derive(Debug, Clone, Serialize)]
pub struct MoveBenchReport {
    pub version: &'static str,
    pub build: &'static str,
    pub command: String,
    pub backend: &'static str,
    pub clusters: Vec<String>,
    pub shards: u32,
    pub moved_shards: (u32, u32),
    pub source: &'static str,
    pub target: &'static str,
    pub prefill_in_range: u64,
    pub prefill_elsewhere: u64,
    pub prefill_seconds: f64,
    pub prefill_cells_per_second: f64,
    pub index_catch_up_seconds: f64,
    pub rate: f64,
    pub baseline_seconds: u64,
    /// The range's cells on the source when the move planned.
    pub cells_in_range: u64,
    pub cells_copied: u64,
    pub entries_copied: u64,
    pub copy_phase_cells: u64,
    pub copy_phase_cells_per_second: Option<f64>,
    pub move_cells_per_second: f64,
    pub move_seconds: f64,
    pub write_pause_ms: Option<f64>,
    /// The fence's steps, in milliseconds each: the source's counters
    /// fenced, the last cells copied, the counters copied.
    pub fence_steps_ms: Vec<f64>,
    pub verified_shards: u64,
    pub index_drift: u64,
    pub phases: Vec<PhaseReport>,
    pub baseline: WindowReport,
    pub during_move: WindowReport,
    pub range_during_move: WindowReport,
    /// Writes due per second during the move, as scheduled.
    pub achieved_rate: f64,
    pub failed_writes: u64,
    pub first_error: Option<String>,
    pub goal_met: bool,
}

/// Microseconds from 1 µs to 10 minutes, 3 significant digits.
fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}

pub async fn run(args: MoveBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    check_definitions(&defs, false)?;
    anyhow::ensure!(
        args.rate.is_finite() && args.rate > 0.0,
        "--rate must be a positive number of writes per second"
    );
    let shards = defs.datastore(DATASTORE).map_or(0, |d| d.shards);
    anyhow::ensure!(
        shards >= 4,
        "`{DATASTORE}` needs at least 4 shards to split over the clusters"
    );
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; build with `--release` for meaningful numbers");
    }
    let dir = crate::server::work_dir()?;
    let mut clusters = Clusters::create(args.database.as_deref(), dir.path()).await?;
    let outcome = tokio::select! {
        outcome = measure(&args, defs, shards, &clusters) => outcome,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    clusters.drop_all().await;
    outcome
}

/// The shared state of the load.
struct Load {
    gateways: [Store; 2],
    data: Dataset,
    shards: u32,
    /// Last shard of the moved range (the first is 0).
    last: u32,
    timeout: Duration,
    writes: Mutex<Vec<Write>>,
    first_error: Mutex<Option<String>>,
    stop: tokio::sync::watch::Sender<bool>,
}

impl Load {
    /// Writes at `rate` a second, open loop, until `stop`, then waits for
    /// the writes under way; sends its start through `started` first.
    async fn run(self: Arc<Self>, rate: f64, started: tokio::sync::oneshot::Sender<Instant>) {
        let mut stopped = self.stop.subscribe();
        let mut rng = StdRng::from_entropy();
        let mut under_way = tokio::task::JoinSet::new();
        let start = tokio::time::Instant::now();
        let _ = started.send(start.into_std());
        for k in 0u64.. {
            let due = Duration::from_secs_f64(k as f64 / rate);
            tokio::select! {
                _ = tokio::time::sleep_until(start + due) => {}
                _ = stopped.changed() => break,
            }
            if *stopped.borrow() {
                break;
            }
            while under_way.try_join_next().is_some() {}
            let row_key = random_uuid(&mut rng);
            let cell = self.data.new_trip(&mut rng, row_key);
            let load = self.clone();
            under_way.spawn(async move {
                let due_at = start + due;
                let in_range = row_shard(&row_key, load.shards) <= load.last;
                let store = &load.gateways[(k % 2) as usize];
                let outcome =
                    tokio::time::timeout(load.timeout, store.put_cell(DATASTORE, cell)).await;
                let latency_us = due_at.elapsed().as_micros() as u64;
                let error = match outcome {
                    Ok(Ok(PutStatus::Written)) => None,
                    Ok(Ok(status)) => Some(format!("a write was answered {status:?}")),
                    Ok(Err(e)) => Some(format!("a write failed: {e}")),
                    Err(_) => Some(format!("a write got no answer within {:?}", load.timeout)),
                };
                if let Some(error) = &error {
                    load.first_error
                        .lock()
                        .expect("first error")
                        .get_or_insert_with(|| error.clone());
                }
                load.writes.lock().expect("writes").push(Write {
                    due,
                    latency_us,
                    in_range,
                    ok: error.is_none(),
                });
            });
        }
        while under_way.join_next().await.is_some() {}
    }
}

async fn measure(
    args: &MoveBenchArgs,
    defs: index_dsl::Definitions,
    shards: u32,
    clusters: &Clusters,
) -> anyhow::Result<ExitCode> {
    let mut storage = clusters.storage(shards);
    if clusters.created.is_some() {
        storage.max_connections = SERVER_CONNECTIONS;
        storage.maintenance_connections = SERVER_MAINTENANCE_CONNECTIONS;
    }
    if let Some(n) = args.max_connections {
        storage.max_connections = n.max(1);
    }
    let last = shards / 4 - 1;
    let elsewhere = args.cells / 4;
    let backend = match clusters.urls[0].1.split(':').next() {
        Some("sqlite") => "sqlite",
        Some("postgres" | "postgresql") => "postgres",
        _ => "mysql",
    };
    println!(
        "cellgate-bench move ({} build): {}",
        crate::report::build_profile(),
        crate::report::command_line()
    );
    println!(
        "clusters: {}; {shards} shards: a 0-{}, b {}-{}, c none; moving 0-{last} from a to c",
        clusters
            .urls
            .iter()
            .map(|(n, u)| format!("{n} = {}", redact_url(u)))
            .collect::<Vec<_>>()
            .join(", "),
        shards / 2 - 1,
        shards / 2,
        shards - 1
    );
    println!(
        "prefill: {} cells in the range, {} elsewhere; load: {} writes/s over two gateways, baseline {} s; {} cores",
        thousands(args.cells as f64),
        thousands(elsewhere as f64),
        args.rate,
        args.baseline_secs,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );

    // Two gateways, then the mover (which needs the stored topology the
    // gateways create).
    let gateway = || {
        let (defs, storage) = (defs.clone(), storage.clone());
        async move {
            Store::open(defs, StoreOptions::new(storage))
                .await
                .context("cannot open a gateway's store")
        }
    };
    let gateways = [gateway().await?, gateway().await?];
    let mut options = StoreOptions::new(storage.clone());
    options.maintain_indexes = false;
    options.replay_buffers = false;
    options.require_all_clusters = true;
    options.follow_topology = false;
    let mover = Store::open(defs, options)
        .await
        .context("cannot open the mover's store")?;
    let data = Dataset::new(0, 1, false, rand::random(), 1);

    // 1. Prefill.
    let started = Instant::now();
    let stored = prefill(&gateways[0], &data, shards, last, args.cells, elsewhere).await?;
    let prefill_seconds = started.elapsed().as_secs_f64();
    let synced = Instant::now();
    gateways[0].sync_indexes().await?;
    let index_catch_up_seconds = synced.elapsed().as_secs_f64();
    println!(
        "prefilled {} cells in {prefill_seconds:.1} s ({} cells/s); the indexes caught up {index_catch_up_seconds:.1} s later",
        thousands(stored as f64),
        thousands(stored as f64 / prefill_seconds.max(1e-9))
    );

    // 2. Load, warm-up and baseline.
    let (stop, _) = tokio::sync::watch::channel(false);
    let load = Arc::new(Load {
        gateways: [gateways[0].clone(), gateways[1].clone()],
        data,
        shards,
        last,
        timeout: Duration::from_secs(args.request_timeout),
        writes: Mutex::new(Vec::new()),
        first_error: Mutex::new(None),
        stop,
    });
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let load_task = tokio::spawn(load.clone().run(args.rate, started_tx));
    let load_start = started_rx.await.context("the load did not start")?;
    eprintln!(
        "writing {} writes/s: {} s of warm-up, {} s of baseline",
        args.rate,
        WARM_UP.as_secs(),
        args.baseline_secs
    );
    tokio::time::sleep(WARM_UP + Duration::from_secs(args.baseline_secs)).await;

    // 3. The move.
    let mut move_options = MoveOptions::new(DATASTORE, (0, last), TARGET);
    if let Some(chunk) = args.chunk {
        move_options.chunk = chunk.max(1);
    }
    if let Some(duty) = args.duty {
        anyhow::ensure!(
            duty > 0.0 && duty <= 1.0,
            "--duty must be within (0, 1], not {duty}"
        );
        move_options.duty = duty;
    }
    let bar = crate::phase::progress_bar(
        0,
        "{prefix} {msg:<9} {bar:30} {pos}/{len} {elapsed:>4}",
        "move".to_string(),
    );
    let mut starts: Vec<(Phase, Instant)> = Vec::new();
    let mut copy_done = 0u64;
    // When each step of the fence ended (its progress counts them).
    let mut fence_steps: Vec<Instant> = Vec::new();
    let mut on_progress = |p: &MoveProgress| {
        if starts.last().map(|s| s.0) != Some(p.phase) {
            starts.push((p.phase, Instant::now()));
            bar.set_position(0);
            bar.set_message(p.phase.name());
        }
        if p.phase == Phase::Copy {
            copy_done = p.done;
        }
        if p.phase == Phase::Fence && p.done > fence_steps.len() as u64 {
            fence_steps.push(Instant::now());
        }
        bar.set_length(p.total.max(p.done));
        bar.set_position(p.done);
    };
    let move_start = Instant::now();
    let moved = mover.move_shards(&move_options, &mut on_progress).await;
    let move_end = Instant::now();
    bar.finish_and_clear();
    load.stop.send_replace(true);
    load_task.await.context("the load failed")?;
    let report = moved.map_err(|e| anyhow::anyhow!("the move failed: {e}"))?;
    let status = mover.topology_status(DATASTORE).await?;
    let moved_to_target = status.moving.is_none()
        && status
            .ranges
            .iter()
            .any(|(first, l, cluster)| (*first, *l, cluster.as_str()) == (0, last, TARGET));

    for store in gateways.iter().chain([&mover]) {
        store.shutdown(Duration::from_secs(5)).await;
    }

    // 4. The figures.
    let writes = std::mem::take(&mut *load.writes.lock().expect("writes"));
    let since = |at: Instant| at.saturating_duration_since(load_start);
    let (baseline_from, move_from, move_to) = (
        since(move_start).saturating_sub(Duration::from_secs(args.baseline_secs)),
        since(move_start),
        since(move_end),
    );
    let baseline = WindowReport::of("baseline", due(&writes, baseline_from, move_from));
    let during_move = WindowReport::of("during the move", due(&writes, move_from, move_to));
    let range_during_move = WindowReport::of(
        "to the range during the move",
        due(&writes, move_from, move_to).filter(|w| w.in_range),
    );
    let mut phases = Vec::new();
    for (i, (phase, seconds)) in report.phases.iter().enumerate() {
        let from = starts
            .iter()
            .find(|s| s.0 == *phase)
            .map_or(move_from, |s| since(s.1));
        let to = starts
            .iter()
            .find(|s| Some(s.0) == report.phases.get(i + 1).map(|p| p.0))
            .map_or(move_to, |s| since(s.1));
        phases.push(PhaseReport {
            phase: phase.name(),
            seconds: seconds.as_secs_f64(),
            writes: WindowReport::of(phase.name(), due(&writes, from, to)),
            range_writes: WindowReport::of(
                phase.name(),
                due(&writes, from, to).filter(|w| w.in_range),
            ),
        });
    }
    let fence_steps_ms = match starts.iter().find(|s| s.0 == Phase::Fence) {
        Some((_, start)) => std::iter::once(*start)
            .chain(fence_steps.iter().copied())
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| (w[1] - w[0]).as_secs_f64() * 1000.0)
            .collect(),
        None => Vec::new(),
    };
    let copy_seconds = report
        .phases
        .iter()
        .find(|p| p.0 == Phase::Copy)
        .map(|p| p.1.as_secs_f64());
    let move_seconds = report.elapsed.as_secs_f64();
    let failed_writes = writes.iter().filter(|w| !w.ok).count() as u64;
    let goal_met = range_during_move.failed == 0
        && range_during_move.p99_ms.is_some_and(|p| p < GOAL_P99_MS)
        && range_during_move.max_ms.is_some_and(|m| m < GOAL_MAX_MS);
    let result = MoveBenchReport {
        version: env!("CARGO_PKG_VERSION"),
        build: crate::report::build_profile(),
        command: crate::report::command_line(),
        backend,
        clusters: clusters
            .urls
            .iter()
            .map(|(n, u)| format!("{n} = {}", redact_url(u)))
            .collect(),
        shards,
        moved_shards: (0, last),
        source: SOURCE,
        target: TARGET,
        prefill_in_range: args.cells,
        prefill_elsewhere: elsewhere,
        prefill_seconds,
        prefill_cells_per_second: stored as f64 / prefill_seconds.max(1e-9),
        index_catch_up_seconds,
        rate: args.rate,
        baseline_seconds: args.baseline_secs,
        cells_in_range: report.plan.cells,
        cells_copied: report.cells_copied,
        entries_copied: report.entries_copied,
        copy_phase_cells: copy_done,
        copy_phase_cells_per_second: copy_seconds.map(|s| copy_done as f64 / s.max(1e-9)),
        move_cells_per_second: report.cells_copied as f64 / move_seconds.max(1e-9),
        move_seconds,
        write_pause_ms: report.write_pause.map(|p| p.as_secs_f64() * 1000.0),
        fence_steps_ms,
        verified_shards: report.verified_shards,
        index_drift: report.index_drift,
        phases,
        baseline,
        during_move,
        range_during_move,
        achieved_rate: due(&writes, move_from, move_to).count() as f64
            / (move_to - move_from).as_secs_f64().max(1e-9),
        failed_writes,
        first_error: load.first_error.lock().expect("first error").clone(),
        goal_met,
    };
    print(&result);
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&result).context("cannot encode the results")?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write `{}`", path.display()))?;
    }
    let mut failed = false;
    if failed_writes > 0 {
        eprintln!(
            "error: {failed_writes} writes failed; the first: {}",
            result.first_error.clone().unwrap_or_default()
        );
        failed = true;
    }
    if !moved_to_target {
        eprintln!(
            "error: after the move the stored topology does not route shards 0-{last} to {TARGET}"
        );
        failed = true;
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The writes due from `from` (included) to `to`.
fn due(writes: &[Write], from: Duration, to: Duration) -> impl Iterator<Item = &Write> {
    writes.iter().filter(move |w| w.due >= from && w.due < to)
}

/// Stores `in_range` new trips whose rows hash into shards 0-`last` and
/// `elsewhere` whose rows do not, in batches through `store`; returns the
/// cells stored.
async fn prefill(
    store: &Store,
    data: &Dataset,
    shards: u32,
    last: u32,
    in_range: u64,
    elsewhere: u64,
) -> anyhow::Result<u64> {
    let total = in_range + elsewhere;
    let bar = crate::phase::progress_bar(
        total,
        "{prefix} {bar:30} {pos}/{len} {per_sec} {eta}",
        "prefill".to_string(),
    );
    // Batches of rows in the range first, then the others.
    let batches = |cells: u64, inside: bool| {
        (0..cells.div_ceil(PREFILL_BATCH)).map(move |n| {
            let count = (cells - n * PREFILL_BATCH).min(PREFILL_BATCH);
            (count, inside)
        })
    };
    let mut puts = futures::stream::iter(batches(in_range, true).chain(batches(elsewhere, false)))
        .map(|(count, inside)| {
            let store = store.clone();
            let mut rng = StdRng::from_entropy();
            let cells: Vec<NewCell> = (0..count)
                .map(|_| {
                    let row_key = loop {
                        let row = random_uuid(&mut rng);
                        if (row_shard(&row, shards) <= last) == inside {
                            break row;
                        }
                    };
                    data.new_trip(&mut rng, row_key)
                })
                .collect();
            async move { store.put_cells(DATASTORE, cells).await }
        })
        .buffer_unordered(PREFILL_IN_FLIGHT);
    let mut stored = 0u64;
    while let Some(results) = puts.next().await {
        let results = results.context("a prefill batch failed")?;
        let written = results
            .iter()
            .filter(|r| matches!(r, Ok(PutStatus::Written)))
            .count();
        if let Some(Err(e)) = results.iter().find(|r| r.is_err()) {
            anyhow::bail!("a prefill cell failed: {e}");
        }
        stored += written as u64;
        bar.inc(results.len() as u64);
    }
    bar.finish_and_clear();
    Ok(stored)
}

fn print(r: &MoveBenchReport) {
    println!(
        "\nmove of shards {}-{} from {} to {}: {} cells in the range ({} copied, {} index entries)",
        r.moved_shards.0,
        r.moved_shards.1,
        r.source,
        r.target,
        thousands(r.cells_in_range as f64),
        thousands(r.cells_copied as f64),
        thousands(r.entries_copied as f64)
    );
    println!(
        "  total {:.1} s; copy {} cells/s (copy phase: {} cells), {} cells/s over the whole move",
        r.move_seconds,
        r.copy_phase_cells_per_second
            .map_or_else(|| "—".to_string(), thousands),
        thousands(r.copy_phase_cells as f64),
        thousands(r.move_cells_per_second)
    );
    println!(
        "  write pause at the cut-over (the mover's, fence to open counters): {} ms; {} shards verified, {} index entries repaired",
        crate::report::opt(r.write_pause_ms, 1),
        r.verified_shards,
        r.index_drift
    );
    if r.fence_steps_ms.len() == FENCE_STEPS.len() {
        let steps: Vec<String> = FENCE_STEPS
            .iter()
            .zip(&r.fence_steps_ms)
            .map(|(step, ms)| format!("{step} {ms:.1} ms"))
            .collect();
        println!("  fence: {}", steps.join(", "));
    }
    println!(
        "\n  {:<9} {:>8} {:>8} {:>13} {:>9} {:>9} {:>9}",
        "phase", "seconds", "writes", "range writes", "p99 ms", "max ms", "range max"
    );
    for phase in &r.phases {
        println!(
            "  {:<9} {:>8.2} {:>8} {:>13} {:>9} {:>9} {:>9}",
            phase.phase,
            phase.seconds,
            phase.writes.writes,
            phase.range_writes.writes,
            crate::report::opt(phase.writes.p99_ms, 1),
            crate::report::opt(phase.writes.max_ms, 1),
            crate::report::opt(phase.range_writes.max_ms, 1)
        );
    }
    println!(
        "\nwrite latency, from when each write was due ({} writes/s asked, {:.0}/s due during the move)",
        r.rate, r.achieved_rate
    );
    println!(
        "  {:<30} {:>8} {:>7} {:>8} {:>8} {:>9} {:>9} {:>9}",
        "writes", "count", "failed", "p50 ms", "p99 ms", "max ms", ">100 ms", ">250 ms"
    );
    for window in [&r.baseline, &r.during_move, &r.range_during_move] {
        println!(
            "  {:<30} {:>8} {:>7} {:>8} {:>8} {:>9} {:>9} {:>9}",
            window.label,
            window.writes,
            window.failed,
            crate::report::opt(window.p50_ms, 1),
            crate::report::opt(window.p99_ms, 1),
            crate::report::opt(window.max_ms, 1),
            window.over_100_ms,
            window.over_250_ms
        );
    }
    println!(
        "\ngoal: writes to the moved range during the move p99 < {GOAL_P99_MS} ms, max < {GOAL_MAX_MS} ms, none failed: {}",
        if r.goal_met { "met" } else { "missed" }
    );
    println!("failed writes: {}", r.failed_writes);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn write(due_ms: u64, latency_ms: u64, in_range: bool, ok: bool) -> Write {
        Write {
            due: Duration::from_millis(due_ms),
            latency_us: latency_ms * 1000,
            in_range,
            ok,
        }
    }

    #[test]
    fn a_window_counts_slow_and_failed_writes_and_times_only_the_answered() {
        let writes = [
            write(0, 2, true, true),
            write(1, 120, true, true),
            write(2, 300, false, true),
            write(3, 5000, true, false),
        ];
        let window = WindowReport::of("w", writes.iter());
        assert_eq!((window.writes, window.failed), (4, 1));
        assert_eq!((window.over_100_ms, window.over_250_ms), (2, 1));
        assert!((window.max_ms.unwrap() - 300.0).abs() < 1.0);
        let empty = WindowReport::of("e", [].iter());
        assert_eq!((empty.writes, empty.p99_ms), (0, None));
    }

    #[test]
    fn a_server_url_gets_another_database() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x_a").unwrap(),
            "postgres://postgres@127.0.0.1:5432/x_a"
        );
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306/test?ssl-mode=disabled", "x_b").unwrap(),
            "mysql://root@127.0.0.1:3306/x_b?ssl-mode=disabled"
        );
        assert_eq!(
            with_database("mysql://root@127.0.0.1:3306", "x_c").unwrap(),
            "mysql://root@127.0.0.1:3306/x_c"
        );
    }

    #[test]
    fn the_clusters_split_the_shards_in_halves() {
        let clusters = Clusters {
            urls: vec![
                ("a", "sqlite://a".into()),
                ("b", "sqlite://b".into()),
                ("c", "sqlite://c".into()),
            ],
            created: None,
        };
        let storage = clusters.storage(4096);
        let ranges: Vec<(u32, u32, &str)> = storage.shards[DATASTORE]
            .iter()
            .map(|r| (r.first, r.last, r.cluster.as_str()))
            .collect();
        assert_eq!(ranges, vec![(0, 2047, "a"), (2048, 4095, "b")]);
        assert_eq!(storage.clusters.len(), 3);
    }
}
