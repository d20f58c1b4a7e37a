//! `cellgate-bench`: measures a cellgate gateway and store the same way
//! every time, through their public surfaces only — the `cellgate` binary
//! it starts (`cellgate serve`), HTTP, and the `cellgate-store` Rust API.
//!
//! With no subcommand it runs the gateway benchmark (`gateway.rs`): load,
//! cold start, index queries and batched writes over HTTP beside the same
//! work through the Rust API, index maintenance under writes, statements
//! per request. `cellgate-bench ids` measures the ID allocator (`ids.rs`),
//! `cellgate-bench buffer` buffered writes and their replay (`buffer.rs`),
//! `cellgate-bench replicas` reads from the master against reads from a
//! replica (`replicas.rs`), `cellgate-bench triggers` a trigger consumer
//! (`triggers.rs`), `cellgate-bench subscriptions` idle graphql-ws
//! subscriptions and their delivery (`subscriptions.rs`), `cellgate-bench verify`
//! an index verify (`verify.rs`), `cellgate-bench lag` the time from a write's
//! acknowledgement to its index entry being visible (`lag.rs`),
//! `cellgate-bench move` an online shard move under writes (`moves.rs`).
//! It lives apart from the server so that a deployment carries none of its
//! code or dependencies (an HTTP client, progress bars, histograms).
//!
//! Files: `dataset.rs` (the trips and the requests), `phase.rs` (a measured
//! phase), `http.rs` (GraphQL and `/metrics`), `server.rs` (the child
//! process), `load.rs`, `maintenance.rs` (samples and drains), `probe.rs`,
//! `database.rs` (emptiness, size, leases), `raw.rs` (the raw SQL
//! baseline), `report.rs` (tables and JSON).

mod buffer;
mod database;
mod dataset;
mod gateway;
mod http;
mod ids;
mod lag;
mod load;
mod maintenance;
mod moves;
mod phase;
mod probe;
mod raw;
mod rebuild;
mod receiver;
mod replicas;
mod report;
mod server;
mod subscriptions;
mod triggers;
mod verify;
mod workloads;

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use index_dsl::Definitions;

// The same allocator as the `cellgate` server, so that the Rust API path
// this process measures and the HTTP path through the server compare like
// with like (glibc's allocator costs the Rust path 7-17% of its throughput).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Default directory of the datastore and index definitions.
const DEFAULT_DATASTORES: &str = "./datastores";

/// Benchmarks of a cellgate gateway and store: index queries and batched
/// writes over HTTP beside the same work through the Rust API, index
/// maintenance, cold start, statements per request (the default), and the
/// ID allocator (`ids`).
///
/// On an empty store (a temporary SQLite store, `--data DIR`, or
/// `--database URL` on MySQL/MariaDB or PostgreSQL): loads `--trips` trips
/// (BASE and STATUS cells) through the Rust API or GraphQL and reports
/// cells/s, the time until the indexes caught up and the size of the store;
/// times `cellgate serve` from spawn to the first 200 of `/readyz`; runs the
/// `query`, `rows` and `write` workloads for `--duration` seconds each at
/// `--concurrency`, over HTTP and then in-process through the Rust API, with
/// p50/p99 latency, statements per request, a raw SQL baseline of `query`
/// and `rows` (cellgate's own statements on a pool of its own; `--raw false` leaves
/// it out), and pending cells, lag, apply
/// rate and drain time of index maintenance during the writes; and ends
/// with an exact count of statements per write batch and per page of rows.
/// With `--url` it drives an already running gateway over HTTP only. Prints
/// the command, parameters and seed first, tables and a summary at the end
/// (`--json FILE` writes them as JSON). Exits 1 if any request failed or
/// the indexes did not catch up.
#[derive(Debug, Parser)]
#[command(
    name = "cellgate-bench",
    version,
    propagate_version = true,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Log filter in `RUST_LOG` syntax. Logs go to stderr. [default: `RUST_LOG`, else `warn`]
    #[arg(long, global = true, env = "CELLGATE_LOG", value_name = "FILTER")]
    log: Option<String>,

    /// The `cellgate` executable to start as the server. [default: the
    /// `cellgate` beside this executable]
    #[arg(long, global = true, env = "CELLGATE_BIN", value_name = "PATH")]
    cellgate: Option<PathBuf>,

    #[command(subcommand)]
    command: Option<Command>,

    #[command(flatten)]
    gateway: gateway::BenchArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure IDs per second in process and over HTTP, with latency
    /// percentiles.
    ///
    /// In process: segment and snowflake IDs taken one at a time and in
    /// batches by two tasks. Over HTTP: `GET /api/segment/get/bench` and
    /// `GET /api/snowflake/get/bench` with `?count=` at each
    /// `--concurrency`, against a `cellgate serve` started on a temporary
    /// SQLite store (or `--database`) or `--url`.
    Ids(ids::IdsBenchArgs),
    /// Measure buffered writes on two clusters: write throughput with
    /// `buffer_count` 0 and 1, and the time from a primary's return until
    /// every cell buffered while it was down is delivered to it.
    Buffer(buffer::BufferBenchArgs),
    /// Measure a trigger consumer (Rust API) on one cluster: one worker's
    /// delivery throughput over a stored backlog, and the time from a
    /// cell's commit to its handler call at steady write rates.
    Triggers(triggers::TriggersBenchArgs),
    /// Measure an index verify on one cluster: a full verify of `--trips`
    /// trips against a plain scan of the cell table (twice, interleaved),
    /// and the p50/p99 of index queries alone and beside a throttled
    /// verify.
    Verify(verify::VerifyBenchArgs),
    /// Measure a changed index's rebuild at scale: index queries and
    /// writes before, during and after the build of its new version, whose
    /// previous version answers meanwhile (Rust API, one cluster).
    Rebuild(rebuild::RebuildBenchArgs),
    /// Measure what idle GraphQL subscriptions cost a gateway and how fast
    /// a commit reaches them.
    ///
    /// Starts `cellgate serve` on a temporary SQLite store (or
    /// `--database`), measures its CPU, RSS and SQL statements over
    /// `--idle` seconds with no subscription and then with
    /// `--subscriptions` idle `tripsCells` subscriptions over graphql-ws,
    /// then writes `--rate` cells per second and reports the time from
    /// commit to a sample of subscribers and whether every subscriber got
    /// every cell. Exits 1 if one did not.
    Subscriptions(subscriptions::SubscriptionsBenchArgs),
    /// Measure pushes across gateways: two `cellgate serve` on one store
    /// (a temporary SQLite file or `--database`), `--rate` cells per second
    /// written through one, `--subscriptions` subscriptions on the other,
    /// and a webhook trigger on both; reports the delay from commit to
    /// subscriber and to webhook POST (p50, p99, max, per delivering
    /// gateway). Exits 1 if a cell did not arrive.
    Push(subscriptions::PushBenchArgs),
    /// Measure index queries and pages of rows read with `consistency:
    /// MASTER` against the same with `consistency: REPLICA`, over HTTP.
    ///
    /// Starts `cellgate serve` on one cluster: `--master`, an empty
    /// MySQL/MariaDB or PostgreSQL database, and `--replica`, the same
    /// database on a server replicating it. Loads `--trips` trips through
    /// `tripsPutCells` (to the master), waits until the master's indexes and
    /// then the replica have caught up (`cellsBehind` 0 in
    /// `Query.datastores`, and each queried page read from the replica equal
    /// to the master's), then runs query MASTER, query REPLICA, rows MASTER,
    /// rows REPLICA and the same in reverse order, `--duration` seconds each
    /// at `--concurrency`. Reports req/s, p50/p99 latency, errors and the
    /// share of answers whose `extensions.servedBy` names a replica per
    /// phase, the medians of the two rounds, and the REPLICA/MASTER ratios.
    /// Exits 1 if a request failed or a REPLICA phase had no answer served
    /// by the replica.
    ///
    /// A master and replica pair on this machine, on free loopback ports,
    /// each with its own data directory:
    ///
    ///   eval "$(gateway/bench/replica-pair.sh start mariadb)"   # or postgres
    ///
    ///   cellgate-bench replicas --master "$master" --replica "$replica"
    ///
    ///   gateway/bench/replica-pair.sh stop "$dir"
    Replicas(replicas::ReplicasBenchArgs),
    /// Measure index lag as a client sees it: the time from a write's
    /// acknowledgement to its entry being visible to an index query.
    ///
    /// Starts `cellgate serve` on a temporary SQLite store (or an empty
    /// `--database`), finds the highest write rate it sustains
    /// (`tripsPutCells` batches from 1, 2, 4, … writers until the
    /// acknowledged cells/s stop growing), then writes at each rate of
    /// `--rates` (default 10 %, 25 % and 50 % of it) for `--duration`
    /// seconds and, for about `--probes` writes a second, polls
    /// `driverPartnerIndex` of the written trip's driver every `--poll-ms`
    /// from the acknowledgement until the row is there: p50/p99/max per
    /// rate. Then it writes at the highest rate for `--max-duration`
    /// seconds (default 60), samples the backlog every second and times its
    /// drain once the writes stop. Exits 1 if a request failed or a
    /// sampled write never became visible.
    ///
    /// A smoke run of a few seconds:
    ///
    ///   cellgate-bench lag --step 0.5 --max-concurrency 4 --duration 1 --max-duration 2
    Lag(lag::LagBenchArgs),
    /// Measure an online shard move under writes: the copy rate, the time
    /// of each phase, and the latency of writes beside it.
    ///
    /// Three clusters of one backend (three SQLite files in a temporary
    /// directory, or three fresh databases on the `--database` server,
    /// dropped at the end): `a` holds shards 0-2047 of `trips`, `b`
    /// 2048-4095, `c` none. Stores `--cells` cells whose rows hash into
    /// shards 0-1023 and a quarter as many elsewhere, waits for the
    /// indexes, then has two in-process gateways take `--rate` writes a
    /// second (one new cell each at a random row key, open loop) while a
    /// third store moves shards 0-1023 from `a` to `c`. Reports the cells
    /// of the range, the copy rate, the time of each phase, the mover's
    /// write pause, and write latency p50/p99/max for `--baseline-secs`
    /// before the move, during the move, and for the writes to the moved
    /// range during the move. Exits 1 if a write or the move failed.
    ///
    /// A smoke run of a few seconds:
    ///
    ///   cellgate-bench move --cells 2000 --rate 50 --baseline-secs 1
    Move(moves::MoveBenchArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.log.as_deref()) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    if let Err(e) = server::set_executable(cli.cellgate.clone()) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let run = async move {
        match cli.command {
            Some(Command::Ids(args)) => ids::run(args).await,
            Some(Command::Buffer(args)) => buffer::run(args).await,
            Some(Command::Triggers(args)) => triggers::run(args).await,
            Some(Command::Subscriptions(args)) => subscriptions::run(args).await,
            Some(Command::Push(args)) => subscriptions::run(args.into()).await,
            Some(Command::Replicas(args)) => replicas::run(args).await,
            Some(Command::Verify(args)) => verify::run(args).await,
            Some(Command::Rebuild(args)) => rebuild::run(args).await,
            Some(Command::Lag(args)) => lag::run(args).await,
            Some(Command::Move(args)) => moves::run(args).await,
            None => gateway::run(cli.gateway).await,
        }
    };
    match runtime.block_on(run) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Sends `tracing` output to stderr, filtered by `filter`, else `RUST_LOG`,
/// else `warn`.
fn init_logging(filter: Option<&str>) -> anyhow::Result<()> {
    use tracing_subscriber::EnvFilter;

    let from_env = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
    let directives = filter
        .map(str::to_string)
        .or(from_env)
        .unwrap_or_else(|| "warn".to_string());
    let filter = EnvFilter::try_new(&directives)
        .with_context(|| format!("invalid log filter `{directives}`"))?;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
    Ok(())
}

/// Loads the definitions under `dir`; invalid ones are printed to stderr,
/// every problem at once, and give `Ok(None)`. `flag` is how the user
/// gives the directory, for the message when it does not exist.
fn load_definitions(dir: &Path, flag: &str) -> anyhow::Result<Option<Definitions>> {
    anyhow::ensure!(
        dir.is_dir(),
        "datastores directory `{}` is not a directory or does not exist (give it with {flag} or CELLGATE_DATASTORES)",
        dir.display()
    );
    match index_dsl::load_dir(dir) {
        Ok(defs) => Ok(Some(defs)),
        Err(diagnostics) => {
            eprintln!("{diagnostics}");
            Ok(None)
        }
    }
}
