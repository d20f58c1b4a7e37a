//! `cellgate-bench rebuild`: a changed index answering from its previous
//! version while the new one is built, at scale, through the Rust API.
//!
//! 1. `--trips` trips (BASE and STATUS cells, 4096 shards, random row
//!    keys: 1,000,000 cells by default) are stored and the indexes caught
//!    up.
//! 2. **Before**: `--duration` seconds of index queries of random drivers
//!    (`driver_partner_index`, fields both versions have) at
//!    `--concurrency`, beside one writer storing batches of `--batch` new
//!    trips back to back: query p50/p99, failed queries, written cells/s.
//! 3. **During the build**: `driver_partner_index` gains a field
//!    (`fare.total`) by `Store::reload`; the same workloads run until the
//!    new version is ready: the build time, and the same figures.
//! 4. **After**: `--duration` seconds again, on the new version.
//!
//! Exits 1 if a query failed (the previous version answers every query of
//! the workload while the new one is built).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cellgate_store::{ClusterConfig, StorageConfig, Store, StoreOptions};
use clap::Args;
use index_dsl::Definitions;

use crate::dataset::{Dataset, DATASTORE, INDEX};
use crate::{load_definitions, DEFAULT_DATASTORES};

#[derive(Debug, Args)]
pub struct RebuildBenchArgs {
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
    /// Seconds of the phases before and after the build.
    #[arg(long, default_value_t = 20, env = "CELLGATE_BENCH_DURATION")]
    pub duration: u64,
    /// Concurrent index queries.
    #[arg(long, default_value_t = 8, env = "CELLGATE_BENCH_CONCURRENCY")]
    pub concurrency: usize,
    /// Trips per write of the writer.
    #[arg(long, default_value_t = 50, env = "CELLGATE_BENCH_BATCH")]
    pub batch: usize,
}

/// What one phase measured.
struct Phase {
    name: &'static str,
    seconds: f64,
    queries: hdrhistogram::Histogram<u64>,
    failed: u64,
    first_failure: Option<String>,
    cells_written: u64,
}

impl Phase {
    fn line(&self) -> String {
        let q = &self.queries;
        format!(
            "{:<18} {:>7.1} s {:>9} queries {:>8.0}/s  p50 {:>6.2} ms  p99 {:>6.2} ms  failed {:>5}  writes {:>8.0} cells/s",
            self.name,
            self.seconds,
            q.len(),
            q.len() as f64 / self.seconds,
            q.value_at_quantile(0.5) as f64 / 1000.0,
            q.value_at_quantile(0.99) as f64 / 1000.0,
            self.failed,
            self.cells_written as f64 / self.seconds,
        )
    }
}

pub async fn run(args: RebuildBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let changed = with_a_field_added(&args.datastores)?;
    let dir = crate::server::work_dir()?;
    let url = args
        .database
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("cellgate.db").display()));
    println!(
        "cellgate-bench rebuild: database {}; {} trips ({} cells); queries at concurrency {}, one writer of {} trips per write; {} s before and after the build",
        cellgate_store::storage::redact_url(&url),
        args.trips,
        args.trips * 2,
        args.concurrency,
        args.batch,
        args.duration
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
    anyhow::ensure!(
        !store.has_cells(DATASTORE).await?,
        "the database already holds cells; give an empty one"
    );
    let data = Arc::new(Dataset::new(args.trips, 1000, true, 37, args.batch));
    let loading = Instant::now();
    let stored = crate::dataset::load_through_api(&store, &data).await?;
    println!(
        "stored {stored} cells in {:.1} s",
        loading.elapsed().as_secs_f64()
    );
    store.sync_indexes().await?;

    let before = measure(&store, &data, &args, "before", Until::Elapsed).await?;
    println!("{}", before.line());
    let reloaded = Instant::now();
    let report = store.reload(changed).await.context("the reload failed")?;
    for change in &report.changes {
        println!("reload: {change}");
    }
    let during = measure(&store, &data, &args, "during the build", Until::Built).await?;
    let build = reloaded.elapsed().as_secs_f64();
    println!("{}", during.line());
    let after = measure(&store, &data, &args, "after", Until::Elapsed).await?;
    println!("{}", after.line());
    let built = store
        .indexes(DATASTORE)?
        .into_iter()
        .find(|i| i.name == INDEX && i.serves_until.is_none())
        .context("the index is served")?;
    println!(
        "\nversion {} of {INDEX} built in {build:.1} s beside the workloads; during the build against before: query p99 {:.2}x, queries/s {:.2}x, written cells/s {:.2}x",
        built.version,
        during.queries.value_at_quantile(0.99) as f64
            / before.queries.value_at_quantile(0.99).max(1) as f64,
        (during.queries.len() as f64 / during.seconds)
            / (before.queries.len() as f64 / before.seconds).max(f64::MIN_POSITIVE),
        (during.cells_written as f64 / during.seconds)
            / (before.cells_written as f64 / before.seconds).max(f64::MIN_POSITIVE),
    );
    store.shutdown(Duration::from_secs(10)).await;
    let failed = before.failed + during.failed + after.failed;
    if failed > 0 {
        for phase in [&before, &during, &after] {
            if let Some(failure) = &phase.first_failure {
                eprintln!("{}: {failure}", phase.name);
            }
        }
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The definitions of `dir` with `driver_partner_index` given the field
/// `fare.total`.
fn with_a_field_added(dir: &std::path::Path) -> anyhow::Result<Definitions> {
    let (_, files) = index_dsl::load_dir_with_files(dir)
        .map_err(|e| anyhow::anyhow!("cannot read {}:\n{e}", dir.display()))?;
    let file = PathBuf::from("trips/indexes/driver_partner_index.yaml");
    let mut found = false;
    let files: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|(path, text)| {
            if path != file {
                return (path, text);
            }
            found = true;
            let marker = "      - { field: trip_created_at, type: datetime}\n";
            let added = "      - { field: fare.total, name: fare_total, type: float }\n";
            (path, text.replace(marker, &format!("{marker}{added}")))
        })
        .collect();
    anyhow::ensure!(found, "{} has no {}", dir.display(), file.display());
    let defs = index_dsl::load_files(dir, files)
        .map_err(|e| anyhow::anyhow!("the changed definitions do not load:\n{e}"))?;
    let index = defs
        .datastore(DATASTORE)
        .and_then(|d| d.index(INDEX))
        .context("no driver_partner_index")?;
    anyhow::ensure!(
        index.field("fare_total").is_some(),
        "{} does not have the expected field list",
        file.display()
    );
    Ok(defs)
}

enum Until {
    /// `--duration` seconds.
    Elapsed,
    /// The new version of the index is ready.
    Built,
}

/// Runs the queries and the writer until `until`.
async fn measure(
    store: &Store,
    data: &Arc<Dataset>,
    args: &RebuildBenchArgs,
    name: &'static str,
    until: Until,
) -> anyhow::Result<Phase> {
    let stop = Arc::new(AtomicBool::new(false));
    let histogram = Arc::new(Mutex::new(hdrhistogram::Histogram::<u64>::new(3)?));
    let failed = Arc::new(AtomicU64::new(0));
    let first_failure = Arc::new(Mutex::new(None));
    let written = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..args.concurrency {
        let (store, data, stop, histogram, failed, first_failure) = (
            store.clone(),
            data.clone(),
            stop.clone(),
            histogram.clone(),
            failed.clone(),
            first_failure.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut local = hdrhistogram::Histogram::<u64>::new(3).expect("histogram");
            while !stop.load(Relaxed) {
                let query = data.index_query(data.random_driver());
                let sent = Instant::now();
                match store.query_index(DATASTORE, &query).await {
                    Ok(_) => {
                        let _ = local.record(sent.elapsed().as_micros() as u64);
                    }
                    Err(err) => {
                        failed.fetch_add(1, Relaxed);
                        first_failure
                            .lock()
                            .unwrap()
                            .get_or_insert_with(|| err.to_string());
                    }
                }
            }
            histogram.lock().unwrap().add(&local).expect("same bounds");
        }));
    }
    let writer = {
        let (store, data, stop, written) =
            (store.clone(), data.clone(), stop.clone(), written.clone());
        tokio::spawn(async move {
            while !stop.load(Relaxed) {
                let cells = data.write_cells();
                let n = cells.len() as u64;
                if let Ok(results) = store.put_cells(DATASTORE, cells).await {
                    if results.iter().all(|r| r.is_ok()) {
                        written.fetch_add(n, Relaxed);
                    }
                }
            }
        })
    };
    match until {
        Until::Elapsed => tokio::time::sleep(Duration::from_secs(args.duration)).await,
        Until::Built => loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let ready = store
                .indexes(DATASTORE)?
                .iter()
                .any(|i| i.name == INDEX && i.serves_until.is_none() && i.ready);
            if ready {
                break;
            }
        },
    }
    stop.store(true, Relaxed);
    let seconds = start.elapsed().as_secs_f64();
    for task in tasks {
        task.await?;
    }
    writer.await?;
    let queries = histogram.lock().unwrap().clone();
    let first_failure = first_failure.lock().unwrap().clone();
    Ok(Phase {
        name,
        seconds,
        queries,
        failed: failed.load(Relaxed),
        first_failure,
        cells_written: written.load(Relaxed),
    })
}
