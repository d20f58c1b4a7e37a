//! `cellgate-bench` (the gateway benchmark): the numbers a change to
//! storage or index maintenance is judged by, measured the same way every
//! time.
//!
//! A local run (the default, or `--database URL`) goes through these steps
//! on a store that starts empty:
//!
//! 1. **load** `--trips` trips (a BASE and a STATUS cell each) through the
//!    Rust API or through `tripsPutCells` of a started server; report
//!    cells/s, the time until every index caught up, and the size and
//!    schema of the store;
//! 2. **cold start**: spawn `cellgate serve` on the loaded store and time
//!    the first `200` of `/readyz`;
//! 3. **workloads over HTTP** (`query`, `rows`, `write`), each with the
//!    statements per request from `/metrics`, and index maintenance
//!    sampled while the writes run; after the reads and before the writes,
//!    the **raw SQL baseline** of the reads (`raw.rs`): cellgate's own
//!    statement for each request on a pool of its own, beside the idle server;
//! 4. the same **workloads through the Rust API**, in-process, after the
//!    server has stopped;
//! 5. the **exact statement probe** (`probe.rs`).
//!
//! With `--url` the target is a gateway that is already running, maybe of
//! another version: loading and the workloads go over HTTP, and the steps
//! that need the store itself (the figures, the cold start, the raw SQL
//! baseline, the Rust path, the probe) are left out. The same client thus
//! measures two binaries.
//!
//! Only one process works on the store at a time, and each waits until the
//! previous one has given up its index maintenance leases
//! (`Database::wait_idle`), so every measured phase starts with one
//! gateway maintaining every shard. All traffic goes to 127.0.0.1 or the
//! given URL; every loop is bounded by a deadline or a count, every
//! request and every wait by a timeout.
//!
//! Files: `dataset.rs` (the trips and the requests), `phase.rs` (a measured
//! phase), `http.rs` (GraphQL and `/metrics`), `server.rs` (the child
//! process), `load.rs`, `maintenance.rs` (samples and drains),
//! `probe.rs`, `database.rs` (emptiness, size, leases), `raw.rs` (the raw
//! SQL baseline), `report.rs` (tables and JSON).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{ArgAction, Args, ValueEnum};
use index_dsl::Definitions;
use serde_json::Value;

use crate::database::Database;
use crate::dataset::{Dataset, Workload, LOAD_BATCH, QUERY};
use crate::http::Gateway;
use crate::load::LoadReport;
use crate::maintenance::{Drained, MaintenanceReport, Sampler, Source, SAMPLE_EVERY};
use crate::phase::Op;
use crate::report::{Parameters, Report, RunReport};
use crate::server::Server;
use crate::workloads::{http_op, rust_op};
use crate::{load_definitions, DEFAULT_DATASTORES};
use cellgate_store::storage::redact_url as redact;
use cellgate_store::{Store, StoreOptions};

/// How the data set is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoadVia {
    /// `Store::put_cells` in-process.
    Rust,
    /// `tripsPutCells` through a started server.
    Graphql,
}

impl LoadVia {
    fn name(self) -> &'static str {
        match self {
            LoadVia::Rust => "rust",
            LoadVia::Graphql => "graphql",
        }
    }
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Seconds each workload runs on each path. Index maintenance is
    /// sampled during the whole write phase, so `--duration 60` measures a
    /// minute of sustained writes per path.
    #[arg(
        long,
        value_name = "SECONDS",
        env = "CELLGATE_BENCH_DURATION",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub duration: u64,

    /// Requests in flight at once: this many HTTP connections, or this many
    /// concurrent calls of the Rust API. Loading runs as many batches at
    /// once.
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_CONCURRENCY",
        default_value_t = 8,
        value_parser = clap::value_parser!(u32).range(1..=1024)
    )]
    pub concurrency: u32,

    /// Trips loaded before the workloads run: a BASE cell each, and a
    /// STATUS cell too unless `--status false` (so 500000 trips are a
    /// million cells).
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_TRIPS",
        default_value_t = 2000,
        value_parser = clap::value_parser!(u32).range(1..=10_000_000)
    )]
    pub trips: u32,

    /// Load a STATUS cell for every trip besides its BASE cell.
    #[arg(
        long,
        value_name = "BOOL",
        env = "CELLGATE_BENCH_STATUS",
        default_value_t = true,
        action = ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub status: bool,

    /// Drivers the loaded trips are spread over; each query asks for one
    /// of them at random.
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_DRIVERS",
        default_value_t = 20,
        value_parser = clap::value_parser!(u32).range(1..=100_000)
    )]
    pub drivers: u32,

    /// New BASE cells per write request (one `tripsPutCells` or one
    /// `put_cells`), and per batch of the statement probe.
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_BATCH",
        default_value_t = 50,
        value_parser = clap::value_parser!(u32).range(1..=1000)
    )]
    pub batch: u32,

    /// How the trips are loaded: `rust` (`put_cells` in-process) or
    /// `graphql` (`tripsPutCells` through a started server, 500 cells per
    /// request). [default: rust; graphql with --url]
    #[arg(long, value_name = "VIA", env = "CELLGATE_BENCH_LOAD_VIA")]
    pub load_via: Option<LoadVia>,

    /// Workloads to run, comma-separated, on each path: `query` (an index
    /// page of 20), `rows` (the same page with each row's BASE body),
    /// `write` (a batch of new cells, with index maintenance sampled).
    #[arg(
        long,
        value_name = "LIST",
        env = "CELLGATE_BENCH_WORKLOADS",
        value_delimiter = ',',
        default_value = "query,rows,write"
    )]
    pub workloads: Vec<Workload>,

    /// Measure index maintenance under sustained writes only: the write
    /// workload on each path (pending cells, lag, apply rate, drain time)
    /// without the other workloads and the statement probe.
    #[arg(
        long,
        env = "CELLGATE_BENCH_LAG",
        conflicts_with = "workloads",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub lag: bool,

    /// Load with index maintenance off, then time a store with it on
    /// applying the whole backlog alone: the apply capacity of the
    /// backend, reported beside the load's write rate. With `--load-via
    /// graphql` the load goes through `tripsPutCells` of a server started
    /// with `indexes.maintain: false`.
    #[arg(
        long,
        env = "CELLGATE_BENCH_BACKLOG",
        conflicts_with = "url",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub backlog: bool,

    /// Run on this MySQL/MariaDB or PostgreSQL database instead of a
    /// temporary SQLite store: `mysql://USER:PASS@HOST/DB`, `mariadb://…`
    /// or `postgres://USER:PASS@HOST/DB`. It must hold no trips; the
    /// benchmark creates the tables and leaves them with the data.
    // The URL may hold a password: `--help` must not print it.
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_BENCH_DATABASE_URL",
        hide_env_values = true,
        conflicts_with = "data"
    )]
    pub database: Option<String>,

    /// Drive the gateway already running at this address
    /// (`http://HOST:PORT`), of any version with `tripsPutCells` and
    /// `trips.driverPartnerIndex`, over HTTP only: the trips are loaded
    /// through GraphQL, and the server start, the Rust API and the
    /// statement probe are left out. Figures its `/metrics` lacks are shown
    /// as `—`. Give it no rate or concurrency limit
    /// (`limits.rate_limit_per_second: 0`, `limits.max_concurrent_requests:
    /// 0`, `limits.max_connections_per_client: 0`), or refused requests
    /// count as errors.
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_BENCH_URL",
        conflicts_with_all = ["database", "data"]
    )]
    pub url: Option<String>,

    /// API token sent as `Authorization: Bearer` to the gateway of
    /// `--url`, for gateways with auth on; it needs `trips:write` (and a
    /// `*` scope for `/metrics`).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "CELLGATE_BENCH_TOKEN",
        hide_env_values = true,
        requires = "url"
    )]
    pub token: Option<String>,

    /// Directory for the benchmark's SQLite store, kept afterwards; it must
    /// not hold trips yet. [default: a temporary directory, removed at the
    /// end]
    #[arg(long, value_name = "DIR", env = "CELLGATE_BENCH_DATA")]
    pub data: Option<PathBuf>,

    /// Directory of the datastore and index definitions. It must define the
    /// `trips` datastore with `BASE` and `STATUS` columns and the
    /// `driver_partner_index` index (driver_partner_uuid, city_uuid,
    /// trip_created_at), as `./datastores` does.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,

    /// Seed of the loaded data set (keys, drivers, bodies): the same seed
    /// loads the same cells. [default: random, printed in the header]
    #[arg(long, value_name = "N", env = "CELLGATE_BENCH_SEED")]
    pub seed: Option<u64>,

    /// Longest wait, in seconds, for the indexes to catch up after loading
    /// and after each write phase; a run that waits longer fails.
    #[arg(
        long,
        value_name = "SECONDS",
        env = "CELLGATE_BENCH_DRAIN_TIMEOUT",
        default_value_t = 600,
        value_parser = clap::value_parser!(u64).range(1..=86_400)
    )]
    pub drain_timeout: u64,

    /// Longest wait, in seconds, for one request (a load batch included);
    /// a request without an answer by then counts as an error, and fails
    /// the load.
    #[arg(
        long,
        value_name = "SECONDS",
        env = "CELLGATE_BENCH_REQUEST_TIMEOUT",
        default_value_t = 30,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub request_timeout: u64,

    /// Also write the results as JSON to FILE, to compare runs.
    #[arg(long, value_name = "FILE", env = "CELLGATE_BENCH_JSON")]
    pub json: Option<PathBuf>,

    /// Run the raw SQL baseline of `query` and `rows` after their HTTP
    /// phases: for each request, the statement cellgate sends for it (built
    /// with the store's `QueryPlan`), on a pool of the
    /// benchmark's own of the gateway's size, at the same concurrency and
    /// duration, every column decoded. Reports transactions/s, p50/p99 and
    /// HTTP req/s ÷ raw tx/s. Needs the database, so not with `--url`.
    /// [default: true, except with --url]
    #[arg(
        long,
        value_name = "BOOL",
        env = "CELLGATE_BENCH_RAW",
        action = ArgAction::Set,
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub raw: Option<bool>,
}

/// Longest wait for an in-process store's index maintenance to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Longest wait for a previous process's index leases (10 s by default)
/// to be released or to expire.
const IDLE_TIMEOUT: Duration = Duration::from_secs(15);

impl BenchArgs {
    /// The workloads to run, in a fixed order.
    fn selected_workloads(&self) -> Vec<Workload> {
        if self.lag {
            return vec![Workload::Write];
        }
        let mut workloads = self.workloads.clone();
        workloads.sort();
        workloads.dedup();
        workloads
    }

    /// Whether the raw SQL baseline runs: on a store of the run's own,
    /// when `query` or `rows` does.
    fn raw_baseline(&self, workloads: &[Workload]) -> bool {
        self.url.is_none()
            && self.raw.unwrap_or(true)
            && workloads
                .iter()
                .any(|w| matches!(w, Workload::Query | Workload::Rows))
    }

    fn drain_timeout(&self) -> Duration {
        Duration::from_secs(self.drain_timeout)
    }

    fn request_timeout(&self) -> Duration {
        Duration::from_secs(self.request_timeout)
    }
}

pub async fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let workloads = args.selected_workloads();
    anyhow::ensure!(
        !workloads.is_empty(),
        "no workload given (--workloads takes query, rows and write)"
    );
    if args.url.is_some() && args.load_via == Some(LoadVia::Rust) {
        anyhow::bail!(
            "--url drives a running gateway over HTTP only, so the trips are loaded through \
             GraphQL (leave out --load-via rust)"
        );
    }
    if args.url.is_some() && args.raw == Some(true) {
        anyhow::bail!(
            "--raw runs cellgate's statements on the database itself, which --url does not \
             give (leave out --raw, or give --database instead of --url)"
        );
    }
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; build with `--release` for meaningful numbers");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let data = Arc::new(Dataset::new(
        u64::from(args.trips),
        args.drivers,
        args.status,
        seed,
        args.batch as usize,
    ));
    let report = match &args.url {
        Some(url) => external(&args, url, &data, &workloads).await?,
        None => match local(&args, &data, &workloads).await? {
            Some(report) => report,
            None => return Ok(ExitCode::FAILURE),
        },
    };
    print!("{}", report.body());
    if let Some(path) = &args.json {
        report.write_json(path)?;
        eprintln!("results written to `{}`", path.display());
    }
    Ok(if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

fn parameters(
    args: &BenchArgs,
    data: &Dataset,
    workloads: &[Workload],
    backend: &'static str,
    target: String,
    via: LoadVia,
    raw_pool_connections: Option<u32>,
) -> Parameters {
    Parameters {
        backend,
        target,
        trips: data.trips,
        cells: data.cells(),
        status_cells: data.status,
        drivers: data.drivers(),
        seed: data.seed,
        load_via: via.name(),
        load_batch: LOAD_BATCH,
        workloads: workloads.iter().map(|w| w.name()).collect(),
        concurrency: args.concurrency,
        duration_seconds: args.duration,
        write_batch: args.batch,
        sample_every_ms: SAMPLE_EVERY.as_millis() as u64,
        request_timeout_seconds: args.request_timeout,
        drain_timeout_seconds: args.drain_timeout,
        raw_pool_connections,
    }
}

/// A run against a gateway this process does not manage.
async fn external(
    args: &BenchArgs,
    url: &str,
    data: &Arc<Dataset>,
    workloads: &[Workload],
) -> anyhow::Result<Report> {
    let gateway = Arc::new(Gateway::authenticated(
        url,
        args.concurrency,
        args.request_timeout(),
        args.token.as_deref(),
    )?);
    let mut report = Report::new(parameters(
        args,
        data,
        workloads,
        "external",
        format!("the gateway at {} (HTTP only)", gateway.base),
        LoadVia::Graphql,
        None,
    ));
    print!("{}", report.header());
    match gateway.readyz(Duration::from_secs(5)).await {
        Ok(200) => {}
        Ok(status) => anyhow::bail!(
            "{}/readyz answered {status}: the gateway is not ready",
            gateway.base
        ),
        Err(e) => anyhow::bail!("cannot reach the gateway at {}: {e}", gateway.base),
    }
    let source = Arc::new(Source::Http(gateway.clone()));
    report.load = Some(
        load_via_graphql(
            data,
            &gateway,
            &source,
            args.concurrency,
            args.request_timeout(),
            args.drain_timeout(),
        )
        .await?,
    );
    run_workloads(&mut report, args, "HTTP", &source, workloads, |w| {
        http_op(w, gateway.clone(), data.clone())
    })
    .await?;
    Ok(report)
}

/// A run on a store of its own; `None` when the definitions are invalid
/// (already printed).
async fn local(
    args: &BenchArgs,
    data: &Arc<Dataset>,
    workloads: &[Workload],
) -> anyhow::Result<Option<Report>> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(None);
    };
    crate::dataset::check_definitions(&defs, args.status)?;
    let work_dir = crate::server::work_dir()?;
    let (database, target) = match (&args.database, &args.data) {
        (Some(url), _) => {
            let database = Database::server(url)?;
            let target = format!("{} database {}", database.backend_name(), redact(url));
            (database, target)
        }
        (None, Some(dir)) => {
            std::fs::create_dir_all(dir)
                .map_err(|e| anyhow::anyhow!("cannot create `{}`: {e}", dir.display()))?;
            let target = format!("SQLite in `{}` (kept)", dir.display());
            (Database::embedded(dir), target)
        }
        (None, None) => {
            let dir = work_dir.path().join("data");
            let target = "SQLite in a temporary directory (removed at the end)".to_string();
            (Database::embedded(&dir), target)
        }
    };
    database.ensure_empty().await?;
    let via = args.load_via.unwrap_or(LoadVia::Rust);
    let raw = args.raw_baseline(workloads);
    let mut report = Report::new(parameters(
        args,
        data,
        workloads,
        database.backend_name(),
        target,
        via,
        raw.then(|| crate::raw::pool_size(&database)),
    ));
    print!("{}", report.header());

    // 1. Load.
    let mut load = match via {
        _ if args.backlog => {
            load_then_apply(args, via, &defs, &database, work_dir.path(), data).await?
        }
        LoadVia::Rust => {
            let store = open_store(&defs, &database).await?;
            let elapsed =
                crate::load::via_rust(&store, data, args.concurrency, args.request_timeout())
                    .await?;
            let started = Instant::now();
            sync(&store, args).await?;
            let report = load_report(via, data, elapsed, Some(started.elapsed()));
            store.shutdown(SHUTDOWN_GRACE).await;
            report
        }
        LoadVia::Graphql => {
            let server = Server::start(
                &database,
                &args.datastores,
                work_dir.path(),
                args.concurrency,
                args.request_timeout(),
                true,
            )
            .await?;
            let source = Arc::new(Source::Http(server.gateway.clone()));
            let loaded = load_via_graphql(
                data,
                &server.gateway,
                &source,
                args.concurrency,
                args.request_timeout(),
                args.drain_timeout(),
            )
            .await;
            drop(source);
            server.stop().await?;
            loaded?
        }
    };
    let loader = match via {
        LoadVia::Rust => "the loading store",
        LoadVia::Graphql => "the loading server",
    };
    settle(&database, loader).await?;
    load.storage = Some(database.figures().await?);
    report.load = Some(load);
    // The index table the raw SQL baseline reads, while no other process
    // uses the store.
    let raw_table = if raw {
        Some(crate::raw::index_table(&defs, &database).await?)
    } else {
        None
    };

    // 2. and 3. Cold start, then HTTP.
    let server = Server::start(
        &database,
        &args.datastores,
        work_dir.path(),
        args.concurrency,
        args.request_timeout(),
        true,
    )
    .await?;
    report.cold_start = Some(server.cold_start);
    eprintln!(
        "server ready on {} after {:.0} ms",
        server.gateway.base, server.cold_start.ready_ms
    );
    let gateway = server.gateway.clone();
    let source = Arc::new(Source::Http(gateway.clone()));
    // The reads, then their raw SQL baseline beside the idle server, on
    // the same data (the writes come last, as in every path).
    let (reads, writes): (Vec<Workload>, Vec<Workload>) =
        workloads.iter().partition(|w| **w != Workload::Write);
    let http = async {
        run_workloads(&mut report, args, "HTTP", &source, &reads, |w| {
            http_op(w, gateway.clone(), data.clone())
        })
        .await?;
        if let Some(table) = &raw_table {
            let baseline = crate::raw::Baseline {
                defs: &defs,
                database: &database,
                table,
                data,
                concurrency: args.concurrency,
                duration: Duration::from_secs(args.duration),
                request_timeout: args.request_timeout(),
            };
            raw_baseline(&mut report, &baseline, &gateway, &reads).await;
        }
        run_workloads(&mut report, args, "HTTP", &source, &writes, |w| {
            http_op(w, gateway.clone(), data.clone())
        })
        .await
    }
    .await;
    drop(source);
    server.stop().await?;
    http?;
    settle(&database, "the server").await?;

    // 4. The Rust API, in-process.
    let store = open_store(&defs, &database).await?;
    sync(&store, args).await?;
    let source = Arc::new(Source::Store(store.clone()));
    run_workloads(&mut report, args, "Rust API", &source, workloads, |w| {
        rust_op(w, store.clone(), data.clone())
    })
    .await?;
    drop(source);
    store.shutdown(SHUTDOWN_GRACE).await;
    settle(&database, "the Rust API store").await?;

    // 5. The exact statement probe.
    if !args.lag {
        match crate::probe::run(&defs, &database, data).await {
            Ok(probe) => report.probe = Some(probe),
            Err(e) => report.problems.push(format!("{e:#}")),
        }
    }
    if let Some(dir) = &args.data {
        eprintln!("the store is kept in `{}`", dir.display());
    }
    Ok(Some(report))
}

/// The raw SQL baseline of the read workloads (`raw.rs`), checked against
/// the pages the server at `gateway` answers. What fails is reported as a
/// problem of the run, which then exits 1; the other phases still run.
async fn raw_baseline(
    report: &mut Report,
    baseline: &crate::raw::Baseline<'_>,
    gateway: &Gateway,
    workloads: &[Workload],
) {
    let outcome = async {
        let pages = crate::raw::http_pages(gateway, baseline.data).await?;
        crate::raw::run(
            baseline,
            workloads,
            &pages,
            &report.runs,
            &mut report.problems,
        )
        .await
    }
    .await;
    match outcome {
        Ok(raw) => report.raw = raw,
        Err(e) => report.problems.push(format!("raw SQL: {e:#}")),
    }
}

async fn open_store(defs: &Definitions, database: &Database) -> anyhow::Result<Store> {
    open_store_with(defs, database, StoreOptions::new(database.storage())).await
}

async fn open_store_with(
    defs: &Definitions,
    database: &Database,
    options: StoreOptions,
) -> anyhow::Result<Store> {
    Store::open(defs.clone(), options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the store ({}): {e}", redact(&database.url)))
}

/// Loads with index maintenance off (through the Rust API, or through
/// `tripsPutCells` of a server that does not maintain indexes), then times
/// a store that maintains the indexes applying the whole backlog with
/// nothing else running.
async fn load_then_apply(
    args: &BenchArgs,
    via: LoadVia,
    defs: &Definitions,
    database: &Database,
    work_dir: &Path,
    data: &Arc<Dataset>,
) -> anyhow::Result<LoadReport> {
    let elapsed = match via {
        LoadVia::Rust => {
            let mut options = StoreOptions::new(database.storage());
            options.maintain_indexes = false;
            let store = open_store_with(defs, database, options).await?;
            let elapsed =
                crate::load::via_rust(&store, data, args.concurrency, args.request_timeout()).await;
            store.shutdown(SHUTDOWN_GRACE).await;
            elapsed?
        }
        LoadVia::Graphql => {
            let server = Server::start(
                database,
                &args.datastores,
                work_dir,
                args.concurrency,
                args.request_timeout(),
                false,
            )
            .await?;
            let elapsed = crate::load::via_graphql(
                &server.gateway,
                data,
                args.concurrency,
                args.request_timeout(),
            )
            .await;
            server.stop().await?;
            elapsed?
        }
    };
    let store = open_store(defs, database).await?;
    let started = Instant::now();
    sync(&store, args).await?;
    let applied = started.elapsed();
    store.shutdown(SHUTDOWN_GRACE).await;
    let mut report = load_figures(via, data, elapsed, None);
    report.backlog_seconds = Some(applied.as_secs_f64());
    eprintln!(
        "loaded {} cells via {} with index maintenance off in {:.1} s; a store applied them in {:.1} s",
        report.cells,
        report.via,
        report.seconds,
        applied.as_secs_f64(),
    );
    Ok(report)
}

/// Waits until every index of `store` has applied every cell, at most
/// `--drain-timeout`.
async fn sync(store: &Store, args: &BenchArgs) -> anyhow::Result<()> {
    match tokio::time::timeout(args.drain_timeout(), store.sync_indexes()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => anyhow::bail!("cannot bring the indexes up to date: {e}"),
        Err(_) => anyhow::bail!(
            "the indexes had not caught up after {} s (--drain-timeout)",
            args.drain_timeout
        ),
    }
}

/// Waits until `previous`, which used the store before, has let go of its
/// index leases.
async fn settle(database: &Database, previous: &str) -> anyhow::Result<()> {
    let waited = database.wait_idle(IDLE_TIMEOUT).await?;
    if waited > Duration::from_secs(1) {
        eprintln!(
            "waited {:.1} s for the index leases of {previous} to expire",
            waited.as_secs_f64()
        );
    }
    Ok(())
}

fn load_report(
    via: LoadVia,
    data: &Dataset,
    elapsed: Duration,
    catch_up: Option<Duration>,
) -> LoadReport {
    let report = load_figures(via, data, elapsed, catch_up);
    eprintln!(
        "loaded {} cells via {} in {:.1} s; indexes caught up {} later",
        report.cells,
        report.via,
        report.seconds,
        catch_up.map_or_else(
            || "an unknown time".to_string(),
            |d| format!("{:.1} s", d.as_secs_f64())
        )
    );
    report
}

fn load_figures(
    via: LoadVia,
    data: &Dataset,
    elapsed: Duration,
    catch_up: Option<Duration>,
) -> LoadReport {
    LoadReport {
        via: via.name(),
        trips: data.trips,
        cells: data.cells(),
        seconds: elapsed.as_secs_f64(),
        cells_per_second: data.cells() as f64 / elapsed.as_secs_f64().max(1e-9),
        catch_up_seconds: catch_up.map(|d| d.as_secs_f64()),
        backlog_seconds: None,
        storage: None,
    }
}

/// Loads through `tripsPutCells` of `gateway`, `concurrency` requests at a
/// time, and waits at most `drain_timeout` for its indexes.
pub async fn load_via_graphql(
    data: &Arc<Dataset>,
    gateway: &Arc<Gateway>,
    source: &Source,
    concurrency: u32,
    request_timeout: Duration,
    drain_timeout: Duration,
) -> anyhow::Result<LoadReport> {
    let before = source.snapshot().await.unwrap_or_default();
    let elapsed = crate::load::via_graphql(gateway, data, concurrency, request_timeout).await?;
    let drained =
        crate::maintenance::drain(source, &before, data.cells(), Instant::now(), drain_timeout)
            .await?;
    if drained.measured && !drained.done {
        anyhow::bail!(
            "the indexes had not caught up {} s after loading (--drain-timeout); pending cells: {}",
            drain_timeout.as_secs(),
            drained.last.describe_pending()
        );
    }
    if !drained.measured {
        // A gateway that reports neither applied nor pending cells: wait
        // until every queried driver has a page, so that the workloads do
        // not count index maintenance still running as errors.
        eprintln!("the gateway reports no index progress; waiting for every driver's page");
        wait_for_pages(gateway, data, drain_timeout).await?;
    }
    Ok(load_report(
        LoadVia::Graphql,
        data,
        elapsed,
        drained.done.then_some(drained.elapsed),
    ))
}

/// Polls the index query of every queried driver until its page has
/// entries, at most `timeout` in all.
async fn wait_for_pages(
    gateway: &Gateway,
    data: &Dataset,
    timeout: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    for driver in data.queried_drivers() {
        loop {
            let answer = gateway
                .graphql(QUERY, data.query_variables(*driver))
                .await
                .map_err(|e| anyhow::anyhow!("cannot query the index: {e}"))?;
            let found = answer
                .pointer("/trips/driverPartnerIndex/edges")
                .and_then(Value::as_array)
                .is_some_and(|edges| !edges.is_empty());
            if found {
                break;
            }
            anyhow::ensure!(
                started.elapsed() < timeout,
                "the index had no entries for driver {driver} {} s after loading (--drain-timeout)",
                timeout.as_secs()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    Ok(())
}

/// Runs every workload on one path, in order; the write phase with index
/// maintenance sampled and drained.
async fn run_workloads(
    report: &mut Report,
    args: &BenchArgs,
    path: &'static str,
    source: &Arc<Source>,
    workloads: &[Workload],
    op: impl Fn(Workload) -> Op,
) -> anyhow::Result<()> {
    let duration = Duration::from_secs(args.duration);
    for &workload in workloads {
        let before = source.snapshot().await.ok();
        let sampler = (workload == Workload::Write)
            .then(|| Sampler::start(source.clone(), duration + Duration::from_secs(60)));
        let label = format!("{} ({path})", workload.name());
        let outcome = crate::phase::run(
            &label,
            args.concurrency,
            duration,
            args.request_timeout(),
            op(workload),
        )
        .await?;
        let after = source.snapshot().await.ok();
        let statements = match (
            before.as_ref().and_then(|b| b.statements),
            after.as_ref().and_then(|a| a.statements),
        ) {
            (Some(before), Some(after)) => Some(after.saturating_sub(before)),
            _ => None,
        };
        report
            .runs
            .push(RunReport::new(workload.name(), path, &outcome, statements));
        let Some(sampler) = sampler else { continue };
        let samples = sampler.stop().await;
        // Without the figures before the phase (a gateway without
        // `/metrics`), maintenance is reported as not measured.
        let drained = match &before {
            Some(before) => {
                crate::maintenance::drain(
                    source,
                    before,
                    outcome.cells,
                    outcome.ended,
                    args.drain_timeout(),
                )
                .await?
            }
            None => Drained::unmeasured(),
        };
        if drained.measured && !drained.done {
            report.problems.push(format!(
                "{path}: the indexes had not applied the written cells {} s after the writes \
                 stopped (--drain-timeout); pending cells: {}",
                args.drain_timeout,
                drained.last.describe_pending()
            ));
        }
        report.maintenance.push(MaintenanceReport::new(
            path,
            outcome.cells,
            outcome.elapsed,
            &before.unwrap_or_default(),
            &samples,
            &drained,
        ));
    }
    Ok(())
}
