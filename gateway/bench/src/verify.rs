//! `cellgate-bench verify`: what an index verify costs, on one cluster.
//!
//! 1. `--trips` trips (BASE and STATUS cells, 4096 shards, random row
//!    keys) are stored through the Rust API and the indexes caught up.
//! 2. **Full verify against a plain scan**, twice, interleaved: the plain
//!    scan reads every row of the cell table (all columns, bodies
//!    included, no decoding) in chunks of 64 shards with the store's own
//!    backend; the verify is `Store::verify_indexes` over every index and
//!    shard with `duty` 1 (no pauses), on its own thread at nice 0 (in
//!    this task with `--nice off`). Their ratio is the figure the verify
//!    is held to (at most 2×).
//! 3. **Foreground impact**: index queries of random drivers at
//!    `--concurrency`, in `--rounds` rounds of a `--duration` slice alone
//!    and a slice as long beside a verify with the store's defaults (duty
//!    0.5, nice 19), so that whatever else the machine does weighs on
//!    both alike; p50/p99 of both, the p99 ratio, and the cells per second
//!    the verify got through beside the queries. One verify runs across
//!    the slices: it is polled only in the slices beside the queries, and
//!    in the others waits after its chunk under way.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cellgate_store::cells::CELL_TYPES;
use cellgate_store::indexes::{Drift, VerifyOptions, VerifyProgress};
use cellgate_store::storage::{ddl, Sql, Value};
use cellgate_store::{ClusterConfig, StorageConfig, Store, StoreOptions};
use clap::Args;

use crate::dataset::{Dataset, DATASTORE};
use crate::{load_definitions, DEFAULT_DATASTORES};

#[derive(Debug, Args)]
pub struct VerifyBenchArgs {
    /// An empty database. [default: an SQLite file in a temporary
    /// directory]
    #[arg(long, value_name = "URL", env = "CELLGATE_BENCH_DATABASE")]
    pub database: Option<String>,
    /// Directory of the datastore and index definitions.
    #[arg(long, env = "CELLGATE_DATASTORES", default_value = DEFAULT_DATASTORES)]
    pub datastores: PathBuf,
    /// Trips stored (two cells each).
    #[arg(long, default_value_t = 500_000, env = "CELLGATE_BENCH_TRIPS")]
    pub trips: u64,
    /// Seconds of each foreground slice (alone, or beside a verify).
    #[arg(long, default_value_t = 5, env = "CELLGATE_BENCH_DURATION")]
    pub duration: u64,
    /// Rounds of a slice alone and a slice beside a verify.
    #[arg(long, default_value_t = 3, env = "CELLGATE_BENCH_ROUNDS")]
    pub rounds: u32,
    /// Concurrent foreground queries.
    #[arg(long, default_value_t = 4, env = "CELLGATE_BENCH_CONCURRENCY")]
    pub concurrency: usize,
    /// Duty of the verify beside the foreground queries. [default: the
    /// store's default]
    #[arg(long, value_name = "F")]
    pub duty: Option<f64>,
    /// Nice value of the verify's thread beside the foreground queries, or
    /// `off` to run it in the queries' runtime on the store's connections
    /// (as before it had a thread of its own). [default: the store's
    /// default]
    #[arg(long, value_name = "N|off", value_parser = parse_nice)]
    pub nice: Option<Nice>,
    /// Use the cells `--database` already holds, stored by an earlier run
    /// with the same `--trips`, instead of an empty database.
    #[arg(long, requires = "database")]
    pub reuse: bool,
}

/// `--nice`: a nice value, or `off`.
#[derive(Debug, Clone, Copy)]
pub struct Nice(Option<i32>);

fn parse_nice(text: &str) -> Result<Nice, String> {
    if text == "off" {
        return Ok(Nice(None));
    }
    match text.parse::<i32>() {
        Ok(n) if (-20..=19).contains(&n) => Ok(Nice(Some(n))),
        _ => Err(format!("`{text}` is not a nice value (-20 to 19) or `off`")),
    }
}

pub async fn run(args: VerifyBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let dir = crate::server::work_dir()?;
    let url = args
        .database
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("cellgate.db").display()));
    println!(
        "cellgate-bench verify: database {}; {} trips ({} cells); foreground {} rounds of 2 × {} s at concurrency {}",
        cellgate_store::storage::redact_url(&url),
        args.trips,
        args.trips * 2,
        args.rounds,
        args.duration,
        args.concurrency
    );
    let storage = StorageConfig {
        clusters: vec![ClusterConfig {
            name: "main".into(),
            master: url.clone(),
            replicas: vec![],
        }],
        ..StorageConfig::default()
    };
    let store = Store::open(defs, StoreOptions::new(storage))
        .await
        .context("cannot open the store")?;
    let data = Dataset::new(args.trips, 1000, true, 31, 500);
    if args.reuse {
        anyhow::ensure!(
            store.has_cells(DATASTORE).await?,
            "--reuse: the database holds no cells"
        );
        println!("reusing the cells stored by an earlier run");
    } else {
        anyhow::ensure!(
            !store.has_cells(DATASTORE).await?,
            "the database already holds cells; give an empty one (or --reuse)"
        );
        // 1. Load.
        let written = Instant::now();
        let stored = crate::dataset::load_through_api(&store, &data).await?;
        println!(
            "stored {stored} cells in {:.1} s",
            written.elapsed().as_secs_f64()
        );
    }
    store.sync_indexes().await?;

    // 2. Plain scan against a full verify, twice.
    let connect = cellgate_store::storage::ConnectOptions {
        statement_timeout: Duration::from_secs(600),
        ..Default::default()
    };
    let backend = cellgate_store::storage::connect(&url, &connect)
        .await
        .context("cannot connect for the plain scan")?;
    let shards = store
        .definitions()
        .datastore(DATASTORE)
        .map_or(4096, |d| d.shards);
    // Wall-clock time is the figure; the CPU time of this process (the
    // database included, SQLite being in-process) says what the work
    // costs when other processes share the machine.
    let ticks = crate::subscriptions::clock_ticks().await;
    let pid = std::process::id();
    let cpu =
        || -> anyhow::Result<f64> { Ok(crate::subscriptions::cpu_ticks(pid)? as f64 / ticks) };
    let (mut scans, mut scans_cpu) = (Vec::new(), Vec::new());
    let (mut verifies, mut verifies_cpu) = (Vec::new(), Vec::new());
    for round in 1..=2 {
        let (started, cpu_before) = (Instant::now(), cpu()?);
        let (rows, bytes) = plain_scan(backend.as_ref(), shards).await?;
        let (scan, scan_cpu) = (started.elapsed().as_secs_f64(), cpu()? - cpu_before);
        println!(
            "round {round}: plain scan of {rows} cells ({:.0} MiB of bodies) in {scan:.2} s ({scan_cpu:.2} s CPU)",
            bytes as f64 / 1048576.0
        );
        scans.push(scan);
        scans_cpu.push(scan_cpu);
        let (started, cpu_before) = (Instant::now(), cpu()?);
        // At nice 0: what the run costs, whatever else the machine does
        // (the plain scan runs at the process's priority too); in this
        // task with `--nice off`.
        let nice = match args.nice {
            Some(Nice(None)) => None,
            _ => Some(0),
        };
        let options = VerifyOptions {
            duty: 1.0,
            restart: true,
            nice,
            ..VerifyOptions::default()
        };
        let mut drift = 0u64;
        let report = store
            .verify_indexes(
                DATASTORE,
                &options,
                &mut |_: &VerifyProgress| {},
                &mut |_: &Drift| drift += 1,
            )
            .await?;
        let (took, took_cpu) = (started.elapsed().as_secs_f64(), cpu()? - cpu_before);
        println!(
            "round {round}: full verify of {} cells, {} entries compared, {} drift, in {took:.2} s ({took_cpu:.2} s CPU, {:.0} cells/s)",
            report.progress.cells,
            report.progress.rows,
            drift,
            report.progress.cells as f64 / took
        );
        anyhow::ensure!(drift == 0, "the freshly built indexes drift");
        verifies.push(took);
        verifies_cpu.push(took_cpu);
    }
    let sum = |v: &[f64]| v.iter().sum::<f64>();
    println!(
        "full verify / plain scan: {:.2}× (goal: at most 2×); CPU time {:.2}×",
        sum(&verifies) / sum(&scans),
        sum(&verifies_cpu) / sum(&scans_cpu).max(0.01)
    );

    // 3. Foreground queries in slices alone and beside a verify.
    let defaults = VerifyOptions::default();
    let options = VerifyOptions {
        duty: args.duty.unwrap_or(defaults.duty),
        nice: args.nice.map_or(defaults.nice, |n| n.0),
        ..defaults
    };
    let mut alone = hdrhistogram::Histogram::<u64>::new(3)?;
    let mut beside = hdrhistogram::Histogram::<u64>::new(3)?;
    let (mut cells, mut seconds) = (0u64, 0f64);
    let verified = AtomicU64::new(0);
    let verifying = verify_continuously(&store, &options, &verified);
    let mut verifying = Box::pin(verifying);
    for round in 1..=args.rounds {
        let a = foreground(&store, &data, args.concurrency, args.duration).await?;
        let (started, before) = (Instant::now(), verified.load(Relaxed));
        let b = tokio::select! {
            result = foreground(&store, &data, args.concurrency, args.duration) => result?,
            err = &mut verifying => return Err(err.context("the verify beside the queries failed")),
        };
        seconds += started.elapsed().as_secs_f64();
        let slice = verified.load(Relaxed) - before;
        cells += slice;
        println!(
            "round {round}: p99 alone {:.2} ms, beside a verify {:.2} ms ({:.2}), {slice} cells verified",
            p99_ms(&a),
            p99_ms(&b),
            p99_ms(&b) / p99_ms(&a).max(0.001)
        );
        alone.add(&a)?;
        beside.add(&b)?;
    }
    drop(verifying);
    let line = |what: &str, h: &hdrhistogram::Histogram<u64>| {
        println!(
            "{what}: {} queries, p50 {:.2} ms, p99 {:.2} ms",
            h.len(),
            h.value_at_quantile(0.5) as f64 / 1000.0,
            p99_ms(h)
        )
    };
    line("index queries alone", &alone);
    let nice = options.nice.map_or("off".to_string(), |n| n.to_string());
    line(
        &format!(
            "index queries beside a verify (duty {}, nice {nice})",
            options.duty
        ),
        &beside,
    );
    println!(
        "foreground p99 beside a verify / alone: {:.2} (goal: at most 1.2); the verify beside them: {:.0} cells/s",
        p99_ms(&beside) / p99_ms(&alone).max(0.001),
        cells as f64 / seconds.max(0.001)
    );
    store.shutdown(Duration::from_secs(5)).await;
    Ok(ExitCode::SUCCESS)
}

fn p99_ms(h: &hdrhistogram::Histogram<u64>) -> f64 {
    h.value_at_quantile(0.99) as f64 / 1000.0
}

/// Verifies the datastore over and over (the first run starts over),
/// adding the cells read to `verified`; returns only on an error. It works
/// while it is polled: between the slices beside the queries it waits (on
/// its own thread, for its progress to be taken), its chunk under way
/// finished.
async fn verify_continuously(
    store: &Store,
    options: &VerifyOptions,
    verified: &AtomicU64,
) -> anyhow::Error {
    let options = VerifyOptions {
        restart: true,
        ..options.clone()
    };
    loop {
        let base = verified.load(Relaxed);
        let mut on_progress = |p: &VerifyProgress| verified.store(base + p.cells, Relaxed);
        let mut on_drift = |_: &Drift| {};
        let run = store.verify_indexes(DATASTORE, &options, &mut on_progress, &mut on_drift);
        if let Err(err) = run.await {
            return anyhow::Error::from(err);
        }
    }
}

/// Reads every cell row, bodies included, 64 shards a statement.
async fn plain_scan(
    backend: &dyn cellgate_store::storage::Backend,
    shards: u32,
) -> anyhow::Result<(u64, u64)> {
    let table = ddl::cells_table(DATASTORE);
    let (mut rows, mut bytes) = (0u64, 0u64);
    for first in (0..shards).step_by(64) {
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT ")
            .idents(ddl::CELL_COLUMNS)
            .push(" FROM ")
            .ident(&table)
            .push(" WHERE ")
            .ident("shard")
            .push(" >= ")
            .bind(Value::Int(i64::from(first)))
            .push(" AND ")
            .ident("shard")
            .push(" < ")
            .bind(Value::Int(i64::from(first + 64)));
        for row in backend.fetch(&sql, CELL_TYPES).await? {
            rows += 1;
            if let Some(Value::Bytes(body)) = row.get(5) {
                bytes += body.len() as u64;
            }
        }
    }
    Ok((rows, bytes))
}

/// Index queries of random drivers at `concurrency` for `seconds`.
async fn foreground(
    store: &Store,
    data: &Dataset,
    concurrency: usize,
    seconds: u64,
) -> anyhow::Result<hdrhistogram::Histogram<u64>> {
    let histogram = Arc::new(Mutex::new(hdrhistogram::Histogram::<u64>::new(3)?));
    let until = Instant::now() + Duration::from_secs(seconds);
    let workers = (0..concurrency).map(|_| {
        let histogram = histogram.clone();
        async move {
            while Instant::now() < until {
                let query = data.index_query(data.random_driver());
                let started = Instant::now();
                store.query_index(DATASTORE, &query).await?;
                let us = started.elapsed().as_micros() as u64;
                histogram.lock().expect("histogram").record(us.max(1))?;
            }
            anyhow::Ok(())
        }
    });
    for result in futures::future::join_all(workers).await {
        result?;
    }
    let histogram = histogram.lock().expect("histogram").clone();
    Ok(histogram)
}
