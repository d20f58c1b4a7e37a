//! `cellgate-bench replicas`: what reads from a replica give, over HTTP,
//! against a `cellgate serve` whose one cluster is a master and its replica
//! (MySQL/MariaDB or PostgreSQL replication, set up outside the benchmark;
//! `gateway/bench/replica-pair.sh` starts a pair on this machine).
//!
//! 1. **Load**: `--trips` trips (a BASE and a STATUS cell each, random row
//!    keys over the datastore's shards, realistic bodies: `dataset.rs`)
//!    through `tripsPutCells` of the started server, which writes to the
//!    master only; then the wait until the master's indexes have applied
//!    every cell, and until the replica has caught up: `cellsBehind` 0 for
//!    every replica in `Query.datastores`, and every queried driver's page
//!    read with `consistency: REPLICA` served by the replica and equal to
//!    the master's page. The second check is needed because index entries
//!    are written after their cells: a replica with every cell may still
//!    miss entries.
//! 2. **Phases**: the `query` and `rows` requests of the gateway benchmark
//!    with `consistency: MASTER` and with `consistency: REPLICA`, each for
//!    `--duration` seconds at `--concurrency`, in the order query MASTER,
//!    query REPLICA, rows MASTER, rows REPLICA, then once more in reverse
//!    order, so that a drift of the machine over the run (caches warming,
//!    other load) weighs on both sides alike. Each phase counts the answers
//!    whose `extensions.servedBy` names a replica.
//! 3. **Report**: every phase, the median of the two rounds per workload and
//!    consistency, and the REPLICA/MASTER ratios; `--json FILE` writes the
//!    same as JSON.
//!
//! The run exits 1 if any request failed, or if a REPLICA phase had no
//! answer served by the replica: it would then have measured the master
//! twice. The data stays in the databases.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;
use serde::Serialize;
use serde_json::{json, Value};

use crate::database::Database;
use crate::dataset::Workload;
use crate::dataset::{
    Dataset, DATASTORE, LOAD_BATCH, QUERY_MASTER, QUERY_REPLICA, ROWS_MASTER, ROWS_REPLICA,
};
use crate::http::{truncate, Gateway};
use crate::load::LoadReport;
use crate::maintenance::Source;
use crate::phase::Op;
use crate::report::{build_profile, command_line, environment, opt, RunReport};
use crate::server::Server;
use crate::workloads::check_page;
use crate::{load_definitions, DEFAULT_DATASTORES};
use cellgate_store::replicas::Consistency;
use cellgate_store::storage::redact_url as redact;

/// Drivers the trips are spread over, as in the gateway benchmark.
const DRIVERS: u32 = 20;
/// Rounds of the four phases; the second runs them in reverse order.
const ROUNDS: u32 = 2;
/// Longest wait for one request (a load batch included).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for the master's indexes, and then for the replica, after
/// loading.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(600);
/// How often the replica's lag is polled while waiting for it.
const POLL_EVERY: Duration = Duration::from_millis(200);
/// The name of the one cluster, as `servedBy` shows it (`main/replica0`).
const CLUSTER: &str = "main";

/// The lag of every replica of every datastore's clusters.
const LAG: &str = "query BenchReplicaLag { datastores { name clusters { name \
    replicas { node cellsBehind lagMs } } } }";

#[derive(Debug, Args)]
pub struct ReplicasBenchArgs {
    /// The master: an empty MySQL/MariaDB or PostgreSQL database,
    /// `mysql://USER:PASS@HOST:PORT/DB` or `postgres://…`. The server writes
    /// to it only.
    // The URL may hold a password: `--help` must not print it.
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_BENCH_MASTER_URL",
        hide_env_values = true
    )]
    pub master: String,

    /// The same database on a server that replicates the master
    /// (MariaDB/MySQL replication, a PostgreSQL streaming standby).
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_BENCH_REPLICA_URL",
        hide_env_values = true
    )]
    pub replica: String,

    /// Trips loaded before the phases: a BASE and a STATUS cell each.
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_TRIPS",
        default_value_t = 100_000,
        value_parser = clap::value_parser!(u32).range(1..=10_000_000)
    )]
    pub trips: u32,

    /// Seconds each phase runs.
    #[arg(
        long,
        value_name = "SECONDS",
        env = "CELLGATE_BENCH_DURATION",
        default_value_t = 10,
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub duration: u64,

    /// Requests in flight at once (HTTP connections); loading runs as many
    /// batches at once.
    #[arg(
        long,
        value_name = "N",
        env = "CELLGATE_BENCH_CONCURRENCY",
        default_value_t = 8,
        value_parser = clap::value_parser!(u32).range(1..=1024)
    )]
    pub concurrency: u32,

    /// Seed of the loaded data set (keys, drivers, bodies). [default:
    /// random, printed in the header]
    #[arg(long, value_name = "N", env = "CELLGATE_BENCH_SEED")]
    pub seed: Option<u64>,

    /// Directory of the datastore and index definitions, with the `trips`
    /// datastore and its `driver_partner_index` as in `./datastores`.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,

    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE", env = "CELLGATE_BENCH_JSON")]
    pub json: Option<PathBuf>,
}

/// One measured phase.
#[derive(Debug, Clone, Serialize)]
struct PhaseReport {
    /// 1 or 2.
    round: u32,
    /// `MASTER` or `REPLICA`.
    consistency: &'static str,
    /// Answers without error whose `extensions.servedBy` named a replica.
    served_by_replica: u64,
    /// Their share of the answers without error, in percent.
    served_by_replica_percent: f64,
    /// `path` is the consistency; statements are those sent to the master.
    run: RunReport,
}

/// The median over the rounds of one workload and consistency.
#[derive(Debug, Clone, Serialize)]
struct MedianReport {
    workload: &'static str,
    consistency: &'static str,
    requests_per_second: f64,
    p50_ms: f64,
    p99_ms: f64,
    /// Summed over the rounds.
    errors: u64,
    served_by_replica_percent: f64,
    master_statements_per_request: Option<f64>,
}

/// REPLICA against MASTER for one workload, from the medians.
#[derive(Debug, Clone, Serialize)]
struct RatioReport {
    workload: &'static str,
    throughput: f64,
    p50: f64,
    p99: f64,
}

/// Everything a run measured.
#[derive(Debug, Clone, Serialize)]
struct ReplicasReport {
    version: &'static str,
    /// `release` or `debug`.
    build: &'static str,
    command: String,
    /// `CELLGATE_*` variables that set flags of this run.
    environment: Vec<String>,
    /// `mysql` or `postgres`.
    backend: &'static str,
    /// The URLs, passwords hidden.
    master: String,
    replica: String,
    shards: u32,
    trips: u64,
    cells: u64,
    drivers: usize,
    seed: u64,
    duration_seconds: u64,
    concurrency: u32,
    rounds: u32,
    load: Option<LoadReport>,
    /// From the master's indexes caught up until the replica had caught up.
    replica_catch_up_seconds: Option<f64>,
    phases: Vec<PhaseReport>,
    medians: Vec<MedianReport>,
    ratios: Vec<RatioReport>,
    /// What went wrong besides failed requests; any makes the exit code 1.
    problems: Vec<String>,
}

/// `MASTER` or `REPLICA`, as GraphQL spells it.
fn consistency_name(consistency: Consistency) -> &'static str {
    match consistency {
        Consistency::Master => "MASTER",
        Consistency::Replica => "REPLICA",
    }
}

/// The document of a phase. Only `query` and `rows` are phases here;
/// everything but `query` reads rows.
fn document(workload: Workload, consistency: Consistency) -> &'static str {
    match (workload, consistency) {
        (Workload::Query, Consistency::Master) => QUERY_MASTER,
        (Workload::Query, Consistency::Replica) => QUERY_REPLICA,
        (_, Consistency::Master) => ROWS_MASTER,
        (_, Consistency::Replica) => ROWS_REPLICA,
    }
}

/// The phases in the order they run: query MASTER, query REPLICA, rows
/// MASTER, rows REPLICA, and the same in reverse for the second round.
fn schedule() -> Vec<(u32, Workload, Consistency)> {
    let round = [
        (Workload::Query, Consistency::Master),
        (Workload::Query, Consistency::Replica),
        (Workload::Rows, Consistency::Master),
        (Workload::Rows, Consistency::Replica),
    ];
    (1..=ROUNDS)
        .flat_map(|number| {
            let mut phases: Vec<_> = round.iter().map(|&(w, c)| (number, w, c)).collect();
            if number % 2 == 0 {
                phases.reverse();
            }
            phases
        })
        .collect()
}

/// Whether an answer's `extensions` say a replica served (part of) it.
fn served_by_replica(extensions: &Value) -> bool {
    extensions
        .get("servedBy")
        .and_then(Value::as_array)
        .is_some_and(|nodes| !nodes.is_empty())
}

/// The median; of an even count, the mean of the middle two.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

pub async fn run(args: ReplicasBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    crate::dataset::check_definitions(&defs, true)?;
    let master = Database::server(&args.master)?;
    let replica = Database::server(&args.replica)?;
    anyhow::ensure!(
        master.backend_name() != "sqlite" && master.dialect == replica.dialect,
        "--master and --replica must both be MySQL/MariaDB or both PostgreSQL URLs"
    );
    anyhow::ensure!(
        args.master != args.replica,
        "--master and --replica are the same URL"
    );
    if cfg!(debug_assertions) {
        eprintln!("warning: this is a debug build; build with `--release` for meaningful numbers");
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let data = Arc::new(Dataset::new(
        u64::from(args.trips),
        DRIVERS,
        true,
        seed,
        // Cells per write request: this benchmark writes only to load.
        1,
    ));
    let shards = defs.datastore(DATASTORE).map_or(0, |d| d.shards);
    let mut report = ReplicasReport {
        version: env!("CARGO_PKG_VERSION"),
        build: build_profile(),
        command: command_line(),
        environment: environment(),
        backend: master.backend_name(),
        master: redact(&args.master),
        replica: redact(&args.replica),
        shards,
        trips: data.trips,
        cells: data.cells(),
        drivers: data.drivers(),
        seed,
        duration_seconds: args.duration,
        concurrency: args.concurrency,
        rounds: ROUNDS,
        load: None,
        replica_catch_up_seconds: None,
        phases: Vec::new(),
        medians: Vec::new(),
        ratios: Vec::new(),
        problems: Vec::new(),
    };
    print!("{}", report.header());
    master.ensure_empty().await?;
    replica.ensure_empty().await?;

    let work_dir = crate::server::work_dir()?;
    let storage = format!(
        "storage:\n  clusters:\n    - name: {CLUSTER}\n      master: {}\n      replicas: [{}]\n",
        // JSON strings are YAML strings, quoted and escaped.
        Value::from(args.master.as_str()),
        Value::from(args.replica.as_str()),
    );
    let server = Server::start_with_storage(
        &storage,
        &args.datastores,
        work_dir.path(),
        args.concurrency,
        REQUEST_TIMEOUT,
    )
    .await?;
    eprintln!(
        "server ready on {} after {:.0} ms",
        server.gateway.base, server.cold_start.ready_ms
    );
    let measured = measure(&mut report, &args, &data, &server.gateway).await;
    server.stop().await?;
    measured?;

    report.summarize();
    print!("{}", report.body());
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).context("cannot encode the results")?;
        std::fs::write(path, text + "\n")
            .with_context(|| format!("cannot write `{}`", path.display()))?;
        eprintln!("results written to `{}`", path.display());
    }
    Ok(if report.failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// Loads, waits for the replica, and runs every phase.
async fn measure(
    report: &mut ReplicasReport,
    args: &ReplicasBenchArgs,
    data: &Arc<Dataset>,
    gateway: &Arc<Gateway>,
) -> anyhow::Result<()> {
    let source = Source::Http(gateway.clone());
    report.load = Some(
        crate::gateway::load_via_graphql(
            data,
            gateway,
            &source,
            args.concurrency,
            REQUEST_TIMEOUT,
            CATCH_UP_TIMEOUT,
        )
        .await?,
    );
    let started = Instant::now();
    wait_for_replica(gateway, data).await?;
    let caught_up = started.elapsed();
    eprintln!(
        "the replica caught up {:.1} s after the master's indexes",
        caught_up.as_secs_f64()
    );
    report.replica_catch_up_seconds = Some(caught_up.as_secs_f64());

    let duration = Duration::from_secs(args.duration);
    for (round, workload, consistency) in schedule() {
        let served = Arc::new(AtomicU64::new(0));
        let op = read_op(gateway, data, workload, consistency, &served);
        let label = format!(
            "{} {} ({round})",
            workload.name(),
            consistency_name(consistency)
        );
        let before = source.snapshot().await.ok().and_then(|s| s.statements);
        let outcome =
            crate::phase::run(&label, args.concurrency, duration, REQUEST_TIMEOUT, op).await?;
        let after = source.snapshot().await.ok().and_then(|s| s.statements);
        let statements = before.zip(after).map(|(b, a)| a.saturating_sub(b));
        let served = served.load(Ordering::Relaxed);
        let answered = outcome.requests.saturating_sub(outcome.errors);
        report.phases.push(PhaseReport {
            round,
            consistency: consistency_name(consistency),
            served_by_replica: served,
            served_by_replica_percent: percent(served, answered),
            run: RunReport::new(
                workload.name(),
                consistency_name(consistency),
                &outcome,
                statements,
            ),
        });
    }
    Ok(())
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// One request of a phase: a random driver's page, checked, with the
/// answers a replica served counted in `served`.
fn read_op(
    gateway: &Arc<Gateway>,
    data: &Arc<Dataset>,
    workload: Workload,
    consistency: Consistency,
    served: &Arc<AtomicU64>,
) -> Op {
    let document = document(workload, consistency);
    let (gateway, data, served) = (gateway.clone(), data.clone(), served.clone());
    Arc::new(move || {
        let (gateway, data, served) = (gateway.clone(), data.clone(), served.clone());
        Box::pin(async move {
            let driver = data.random_driver();
            let answer = gateway
                .graphql_answer(document, data.query_variables(driver))
                .await?;
            check_page(workload, driver, &answer.data)?;
            if served_by_replica(&answer.extensions) {
                served.fetch_add(1, Ordering::Relaxed);
            }
            Ok(0)
        })
    })
}

/// The lag of every replica of the `trips` datastore's clusters, as
/// `(cluster/node, cells behind)`.
async fn replica_lag(gateway: &Gateway) -> Result<Vec<(String, i64)>, String> {
    let answer = gateway.graphql(LAG, json!({})).await?;
    let datastore = answer
        .get("datastores")
        .and_then(Value::as_array)
        .and_then(|all| all.iter().find(|d| d["name"] == DATASTORE))
        .ok_or_else(|| format!("no `{DATASTORE}` in {}", truncate(&answer.to_string(), 300)))?;
    let mut lag = Vec::new();
    for cluster in datastore["clusters"].as_array().into_iter().flatten() {
        for replica in cluster["replicas"].as_array().into_iter().flatten() {
            // Int64 is a string in JSON.
            let behind = match &replica["cellsBehind"] {
                Value::String(text) => text.parse().ok(),
                other => other.as_i64(),
            }
            .ok_or_else(|| format!("no cellsBehind in {replica}"))?;
            lag.push((
                format!(
                    "{}/{}",
                    cluster["name"].as_str().unwrap_or("?"),
                    replica["node"].as_str().unwrap_or("?")
                ),
                behind,
            ));
        }
    }
    Ok(lag)
}

/// Waits until every replica has every cell of the master (`cellsBehind`
/// 0), then until every queried driver's page read with `REPLICA` is served
/// by the replica and equals the master's; at most [`CATCH_UP_TIMEOUT`].
async fn wait_for_replica(gateway: &Gateway, data: &Dataset) -> anyhow::Result<()> {
    let deadline = Instant::now() + CATCH_UP_TIMEOUT;
    let mut last: Result<Vec<(String, i64)>, String> = Err("not asked yet".to_string());
    loop {
        if let Ok(lag) = &last {
            if !lag.is_empty() && lag.iter().all(|(_, behind)| *behind == 0) {
                break;
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the replica had not caught up {} s after loading (replicas and cells behind: {last:?})",
            CATCH_UP_TIMEOUT.as_secs()
        );
        tokio::time::sleep(POLL_EVERY).await;
        last = replica_lag(gateway).await;
    }
    for driver in data.queried_drivers() {
        let variables = data.query_variables(*driver);
        loop {
            let on_master = gateway
                .graphql(QUERY_MASTER, variables.clone())
                .await
                .map_err(|e| anyhow::anyhow!("cannot read a page from the master: {e}"))?;
            let on_replica = gateway
                .graphql_answer(QUERY_REPLICA, variables.clone())
                .await
                .map_err(|e| anyhow::anyhow!("cannot read a page with REPLICA: {e}"))?;
            let differs = if !served_by_replica(&on_replica.extensions) {
                "it was not served by the replica"
            } else if on_replica.data != on_master {
                "it differs from the master's"
            } else {
                break;
            };
            anyhow::ensure!(
                Instant::now() < deadline,
                "the page of driver {driver} read with REPLICA is not the master's page {} s \
                 after loading: {differs}",
                CATCH_UP_TIMEOUT.as_secs()
            );
            tokio::time::sleep(POLL_EVERY).await;
        }
    }
    Ok(())
}

impl ReplicasReport {
    /// The medians over the rounds and the REPLICA/MASTER ratios.
    fn summarize(&mut self) {
        for workload in [Workload::Query, Workload::Rows] {
            for consistency in [Consistency::Master, Consistency::Replica] {
                let phases: Vec<&PhaseReport> = self
                    .phases
                    .iter()
                    .filter(|p| {
                        p.run.workload == workload.name()
                            && p.consistency == consistency_name(consistency)
                    })
                    .collect();
                if phases.is_empty() {
                    continue;
                }
                let of =
                    |f: &dyn Fn(&PhaseReport) -> f64| median(phases.iter().map(|p| f(p)).collect());
                let statements: Option<Vec<f64>> = phases
                    .iter()
                    .map(|p| p.run.statements_per_request)
                    .collect();
                self.medians.push(MedianReport {
                    workload: workload.name(),
                    consistency: consistency_name(consistency),
                    requests_per_second: of(&|p| p.run.requests_per_second),
                    p50_ms: of(&|p| p.run.p50_ms),
                    p99_ms: of(&|p| p.run.p99_ms),
                    errors: phases.iter().map(|p| p.run.errors).sum(),
                    served_by_replica_percent: of(&|p| p.served_by_replica_percent),
                    master_statements_per_request: statements.map(median),
                });
            }
            let find = |consistency| {
                self.medians.iter().find(|m| {
                    m.workload == workload.name() && m.consistency == consistency_name(consistency)
                })
            };
            if let (Some(master), Some(replica)) =
                (find(Consistency::Master), find(Consistency::Replica))
            {
                let ratio = |r: f64, m: f64| r / m.max(1e-9);
                let line = RatioReport {
                    workload: workload.name(),
                    throughput: ratio(replica.requests_per_second, master.requests_per_second),
                    p50: ratio(replica.p50_ms, master.p50_ms),
                    p99: ratio(replica.p99_ms, master.p99_ms),
                };
                self.ratios.push(line);
            }
        }
        for phase in &self.phases {
            if phase.consistency == "REPLICA" && phase.served_by_replica == 0 {
                self.problems.push(format!(
                    "{} REPLICA (round {}): no answer was served by the replica, so the phase \
                     measured the master",
                    phase.run.workload, phase.round
                ));
            }
        }
    }

    fn failed(&self) -> bool {
        !self.problems.is_empty() || self.phases.iter().any(|p| p.run.failed())
    }

    /// How to repeat this run.
    fn header(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "cellgate-bench replicas {} ({} build)",
            self.version, self.build
        );
        let _ = writeln!(out, "command:     {}", self.command);
        for variable in &self.environment {
            let _ = writeln!(out, "environment: {variable}");
        }
        let _ = writeln!(
            out,
            "target:      {} master {} and its replica {}, one cluster `{CLUSTER}`",
            self.backend, self.master, self.replica
        );
        let _ = writeln!(
            out,
            "data:        {} trips of {} drivers, {} cells (BASE + STATUS) over {} shards, seed {}",
            self.trips, self.drivers, self.cells, self.shards, self.seed
        );
        let _ = writeln!(
            out,
            "load:        via graphql, {LOAD_BATCH} cells per request, concurrency {}",
            self.concurrency
        );
        let _ = writeln!(
            out,
            "phases:      query and rows with consistency MASTER and REPLICA, {} rounds (the \
             second in reverse order), {} s each, concurrency {}",
            self.rounds, self.duration_seconds, self.concurrency
        );
        out
    }

    /// The tables and the ratios.
    fn body(&self) -> String {
        let mut out = String::new();
        if let Some(load) = &self.load {
            let _ = writeln!(out, "\nload");
            let _ = writeln!(
                out,
                "  {} cells via {} in {:.1} s ({:.0} cells/s); the master's indexes caught up {} s \
                 later, the replica {} s after that",
                load.cells,
                load.via,
                load.seconds,
                load.cells_per_second,
                opt(load.catch_up_seconds, 1),
                opt(self.replica_catch_up_seconds, 1)
            );
        }
        let header = format!(
            "  {:<5} {:<6} {:<11} {:>9} {:>9} {:>8} {:>8} {:>7} {:>10} {:>14}",
            "round",
            "",
            "consistency",
            "requests",
            "req/s",
            "p50 ms",
            "p99 ms",
            "errors",
            "servedBy %",
            "master stmts"
        );
        let _ = writeln!(out, "\nphases, in the order they ran");
        let _ = writeln!(out, "{header}");
        for p in &self.phases {
            let _ = writeln!(
                out,
                "  {:<5} {:<6} {:<11} {:>9} {:>9.1} {:>8.2} {:>8.2} {:>7} {:>10.1} {:>14}",
                p.round,
                p.run.workload,
                p.consistency,
                p.run.requests,
                p.run.requests_per_second,
                p.run.p50_ms,
                p.run.p99_ms,
                p.run.errors,
                p.served_by_replica_percent,
                opt(p.run.statements_per_request, 2)
            );
        }
        if !self.medians.is_empty() {
            let _ = writeln!(out, "\nmedians of {} rounds", self.rounds);
            let _ = writeln!(
                out,
                "  {:<6} {:<11} {:>9} {:>8} {:>8} {:>7} {:>10} {:>14}",
                "",
                "consistency",
                "req/s",
                "p50 ms",
                "p99 ms",
                "errors",
                "servedBy %",
                "master stmts"
            );
            for m in &self.medians {
                let _ = writeln!(
                    out,
                    "  {:<6} {:<11} {:>9.1} {:>8.2} {:>8.2} {:>7} {:>10.1} {:>14}",
                    m.workload,
                    m.consistency,
                    m.requests_per_second,
                    m.p50_ms,
                    m.p99_ms,
                    m.errors,
                    m.served_by_replica_percent,
                    opt(m.master_statements_per_request, 2)
                );
            }
            let _ = writeln!(
                out,
                "  servedBy %: answers whose extensions.servedBy names a replica; master stmts: \
                 statements sent to the master per request, index maintenance and lag \
                 measurement included"
            );
        }
        if !self.ratios.is_empty() {
            let _ = writeln!(out, "\nREPLICA/MASTER");
            for r in &self.ratios {
                let _ = writeln!(
                    out,
                    "  {}: throughput {:.2}x, p50 {:.2}x, p99 {:.2}x",
                    r.workload, r.throughput, r.p50, r.p99
                );
            }
        }
        for p in &self.phases {
            if p.consistency == "MASTER" && p.served_by_replica > 0 {
                let _ = writeln!(
                    out,
                    "\nwarning: {} MASTER (round {}): {} answers were served by a replica (the \
                     master's circuit breaker was open)",
                    p.run.workload, p.round, p.served_by_replica
                );
            }
            if let Some(error) = &p.run.first_error {
                let _ = writeln!(
                    out,
                    "\n{} {} (round {}): {} errors, the first: {error}",
                    p.run.workload, p.consistency, p.round, p.run.errors
                );
            }
        }
        for problem in &self.problems {
            let _ = writeln!(out, "\nproblem: {problem}");
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_second_round_runs_the_phases_in_reverse() {
        let phases = schedule();
        assert_eq!(phases.len(), 8);
        let (first, second) = phases.split_at(4);
        assert_eq!(
            first.iter().map(|p| (p.1, p.2)).collect::<Vec<_>>(),
            second.iter().rev().map(|p| (p.1, p.2)).collect::<Vec<_>>()
        );
        assert_eq!(first[0], (1, Workload::Query, Consistency::Master));
        assert_eq!(first[1], (1, Workload::Query, Consistency::Replica));
        assert!(second.iter().all(|p| p.0 == 2));
    }

    fn phase(round: u32, workload: Workload, consistency: Consistency, rate: f64) -> PhaseReport {
        let served = if consistency == Consistency::Replica {
            100
        } else {
            0
        };
        PhaseReport {
            round,
            consistency: consistency_name(consistency),
            served_by_replica: served,
            served_by_replica_percent: served as f64,
            run: RunReport {
                workload: workload.name(),
                path: consistency_name(consistency),
                requests: 100,
                errors: 0,
                seconds: 1.0,
                requests_per_second: rate,
                p50_ms: 1.0,
                p99_ms: 2.0,
                cells_written: 0,
                statements_per_request: None,
                first_error: None,
            },
        }
    }

    fn report(phases: Vec<PhaseReport>) -> ReplicasReport {
        ReplicasReport {
            version: "0",
            build: "test",
            command: String::new(),
            environment: Vec::new(),
            backend: "mysql",
            master: String::new(),
            replica: String::new(),
            shards: 4096,
            trips: 1,
            cells: 2,
            drivers: 1,
            seed: 1,
            duration_seconds: 1,
            concurrency: 1,
            rounds: ROUNDS,
            load: None,
            replica_catch_up_seconds: None,
            phases,
            medians: Vec::new(),
            ratios: Vec::new(),
            problems: Vec::new(),
        }
    }

    #[test]
    fn ratios_come_from_the_medians_and_an_unserved_replica_phase_fails() {
        let phases = schedule()
            .into_iter()
            .map(|(round, w, c)| {
                let rate = match (w, c, round) {
                    (Workload::Query, Consistency::Master, 1) => 100.0,
                    (Workload::Query, Consistency::Master, _) => 300.0,
                    (Workload::Query, Consistency::Replica, _) => 100.0,
                    (_, Consistency::Master, _) => 50.0,
                    (_, Consistency::Replica, _) => 75.0,
                };
                phase(round, w, c, rate)
            })
            .collect();
        let mut run = report(phases);
        run.summarize();
        assert!(!run.failed(), "{:?}", run.problems);
        assert_eq!(run.medians.len(), 4);
        assert_eq!(run.medians[0].requests_per_second, 200.0);
        assert_eq!(run.ratios[0].workload, "query");
        assert_eq!(run.ratios[0].throughput, 0.5);
        assert_eq!(run.ratios[1].throughput, 1.5);

        let mut unserved = report(run.phases.clone());
        unserved.phases[1].served_by_replica = 0;
        unserved.summarize();
        assert!(unserved.failed());
        assert_eq!(unserved.problems.len(), 1, "{:?}", unserved.problems);
        let mut failing = report(run.phases.clone());
        failing.phases[0].run.errors = 1;
        failing.summarize();
        assert!(failing.failed());
    }

    #[test]
    fn medians_and_served_by() {
        assert_eq!(median(vec![]), 0.0);
        assert_eq!(median(vec![3.0]), 3.0);
        assert_eq!(median(vec![4.0, 2.0]), 3.0);
        assert_eq!(median(vec![5.0, 1.0, 2.0]), 2.0);
        assert!(served_by_replica(
            &json!({"servedBy": [{"node": "main/replica0", "possiblyStale": true}]})
        ));
        assert!(!served_by_replica(&json!({"servedBy": []})));
        assert!(!served_by_replica(&Value::Null));
        assert_eq!(document(Workload::Rows, Consistency::Replica), ROWS_REPLICA);
    }
}
