//! `cellgate-bench buffer`: what buffered writes cost and how fast a
//! primary that comes back catches up, through the store's Rust API on two
//! clusters `a` and `b`.
//!
//! 1. **Write throughput** with `buffer_count` 0 and 1, one after the other
//!    in the same run, on the same two databases: `--trips` trips (BASE and
//!    STATUS cells, 4096 shards, random row keys) each, `--concurrency`
//!    batches of `--batch` cells at a time.
//! 2. **Replay**: a store whose cluster `b` is unreachable (its master a
//!    closed loopback port) takes batches until `--buffered` cells were
//!    answered `BUFFERED` (kept in `a`'s buffer; the cells of `a`'s shards
//!    fail, since `b` cannot take their copies). Then a store with `b`
//!    reachable opens, as a gateway would once `b` is back, and the clock
//!    runs until every buffered cell was delivered to `b`; every one is then
//!    read back and compared with what was written, and the indexes are
//!    brought up to date.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cellgate_store::cells::{CellKey, NewCell, PutStatus};
use cellgate_store::{ClusterConfig, StorageConfig, Store, StoreOptions};
use clap::Args;
use futures::StreamExt as _;

use crate::dataset::{Dataset, DATASTORE};
use crate::{load_definitions, DEFAULT_DATASTORES};

#[derive(Debug, Args)]
pub struct BufferBenchArgs {
    /// Master of cluster `a`: an empty database. [default: an SQLite file
    /// in a temporary directory]
    #[arg(long, value_name = "URL")]
    pub database_a: Option<String>,
    /// Master of cluster `b`: an empty database. [default: an SQLite file
    /// in a temporary directory]
    #[arg(long, value_name = "URL")]
    pub database_b: Option<String>,
    /// A replica of cluster `b`'s master (e.g. from `replica-pair.sh`):
    /// then a copy of a write whose primary is `b` lives until the replica
    /// has the cell, and the run also reports how soon after the writes
    /// the copies are gone.
    #[arg(long, value_name = "URL")]
    pub replica_b: Option<String>,
    /// Directory of the datastore and index definitions.
    #[arg(long, env = "CELLGATE_DATASTORES", default_value = DEFAULT_DATASTORES)]
    pub datastores: PathBuf,
    /// Trips written per throughput measurement (two cells each).
    #[arg(long, default_value_t = 10_000)]
    pub trips: u64,
    /// Cells to buffer before the primary comes back.
    #[arg(long, default_value_t = 50_000)]
    pub buffered: u64,
    /// Cells per batch.
    #[arg(long, default_value_t = 50)]
    pub batch: usize,
    /// Batches in flight.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,
}

/// The definitions' datastore with two clusters, `b` with `b_replica` if
/// any.
fn two_clusters(a: &str, b: &str, b_replica: Option<&str>, buffer_count: usize) -> StorageConfig {
    let cluster = |name: &str, master: &str, replica: Option<&str>| ClusterConfig {
        name: name.into(),
        master: master.into(),
        replicas: replica.into_iter().map(str::to_string).collect(),
    };
    StorageConfig {
        buffer_count,
        clusters: vec![cluster("a", a, None), cluster("b", b, b_replica)],
        ..StorageConfig::default()
    }
}

/// Buffered copies of the datastore on every cluster, from the latest
/// count.
fn copies(store: &Store) -> i64 {
    store
        .metrics()
        .datastores
        .iter()
        .find(|d| d.name == DATASTORE)
        .map_or(0, |d| d.buffered.iter().map(|b| b.cells).sum())
}

/// Writes every batch of `data`, `concurrency` at a time; returns the
/// keys and bodies of the cells answered `status`, and the number of
/// failed cells.
async fn write_all(
    store: &Store,
    data: &Dataset,
    concurrency: usize,
    wanted: PutStatus,
    stop_after: Option<u64>,
) -> anyhow::Result<(Vec<NewCell>, u64)> {
    let batches = data.load_batches();
    let mut kept = Vec::new();
    let mut failed = 0;
    let mut results = futures::stream::iter(0..batches)
        .map(|number| {
            let cells = data.load_batch(number);
            let store = store.clone();
            async move {
                let results = store.put_cells(DATASTORE, cells.clone()).await;
                (cells, results)
            }
        })
        .buffer_unordered(concurrency);
    while let Some((cells, results)) = results.next().await {
        for (cell, result) in cells.into_iter().zip(results?) {
            match result {
                Ok(status) if status == wanted => kept.push(cell),
                Ok(status) => anyhow::bail!("a cell was {status:?}, expected {wanted:?}"),
                Err(_) => failed += 1,
            }
        }
        if stop_after.is_some_and(|n| kept.len() as u64 >= n) {
            break;
        }
    }
    Ok((kept, failed))
}

pub async fn run(args: BufferBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let dir = crate::server::work_dir()?;
    let sqlite = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
    let a = args.database_a.clone().unwrap_or_else(|| sqlite("a.db"));
    let b = args.database_b.clone().unwrap_or_else(|| sqlite("b.db"));
    let replica = args.replica_b.as_deref();
    println!(
        "cellgate-bench buffer: clusters a = {}, b = {}{}; {} trips per throughput run, {} cells buffered, batches of {} cells, {} in flight",
        cellgate_store::storage::redact_url(&a),
        cellgate_store::storage::redact_url(&b),
        replica.map_or(String::new(), |r| format!(
            " with replica {}",
            cellgate_store::storage::redact_url(r)
        )),
        args.trips,
        args.buffered,
        args.batch,
        args.concurrency
    );
    let open = |storage: StorageConfig| {
        let defs = defs.clone();
        async move {
            Store::open(defs, StoreOptions::new(storage))
                .await
                .context("cannot open the store")
        }
    };

    // 1. Throughput with and without a buffer copy.
    let mut rates = Vec::new();
    for (seed, buffer_count) in [(11, 0), (12, 1)] {
        let store = open(two_clusters(&a, &b, replica, buffer_count)).await?;
        let data = Dataset::new(args.trips, 1000, true, seed, args.batch);
        let start = Instant::now();
        let (written, _) =
            write_all(&store, &data, args.concurrency, PutStatus::Written, None).await?;
        let seconds = start.elapsed().as_secs_f64();
        let rate = written.len() as f64 / seconds;
        println!(
            "buffer_count {buffer_count}: {} cells in {seconds:.2} s, {rate:.0} cells/s",
            written.len()
        );
        rates.push(rate);
        if buffer_count > 0 && replica.is_some() {
            // The copies of `b`'s cells wait for its replica; the count
            // leaves out copies under half a second old.
            let written_at = Instant::now();
            tokio::time::sleep(Duration::from_secs(1)).await;
            let deadline = Instant::now() + Duration::from_secs(600);
            while copies(&store) > 0 {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "copies still wait after 10 minutes"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            println!(
                "buffer_count {buffer_count}: the last copies released {:.2} s after the writes ended",
                written_at.elapsed().as_secs_f64()
            );
        }
        store.shutdown(Duration::from_secs(10)).await;
    }
    println!(
        "write throughput with buffer_count 1: {:.2}x that with buffer_count 0",
        rates[1] / rates[0]
    );

    // 2. Buffer while `b` is down.
    let down = "mysql://cellgate@127.0.0.1:1/down";
    let store = open(two_clusters(&a, down, None, 1)).await?;
    let data = Dataset::new(args.buffered * 2, 1000, true, 13, args.batch);
    let start = Instant::now();
    let (buffered, failed) = write_all(
        &store,
        &data,
        args.concurrency,
        PutStatus::Buffered,
        Some(args.buffered),
    )
    .await?;
    println!(
        "b down: {} cells answered BUFFERED in {:.2} s ({failed} cells of a's shards failed: b could not take their copies)",
        buffered.len(),
        start.elapsed().as_secs_f64()
    );
    store.shutdown(Duration::from_secs(10)).await;
    drop(store);

    // 3. `b` is back: time until every buffered cell is on it.
    let start = Instant::now();
    let store = open(two_clusters(&a, &b, replica, 1)).await?;
    let replayed = |store: &Store| {
        store
            .metrics()
            .datastores
            .iter()
            .find(|d| d.name == DATASTORE)
            .map_or(0, |d| d.cells_replayed)
    };
    let deadline = Instant::now() + Duration::from_secs(600);
    while replayed(&store) < buffered.len() as u64 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {} buffered cells were replayed in 10 minutes",
            replayed(&store),
            buffered.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let replay_seconds = start.elapsed().as_secs_f64();
    println!(
        "b back: {} buffered cells delivered in {replay_seconds:.2} s from the store's opening, {:.0} cells/s",
        buffered.len(),
        buffered.len() as f64 / replay_seconds
    );
    store.sync_indexes().await?;
    println!(
        "b back: indexes up to date {:.2} s after the store's opening",
        start.elapsed().as_secs_f64()
    );
    let buffered = Arc::new(buffered);
    let mut missing = 0;
    for chunk in buffered.chunks(500) {
        let keys: Vec<CellKey> = chunk.iter().map(NewCell::key).collect();
        let found = store.get_cells(DATASTORE, &keys).await?;
        for (cell, stored) in chunk.iter().zip(found) {
            if stored.map(|s| s.body) != Some(cell.body.clone()) {
                missing += 1;
            }
        }
    }
    store.shutdown(Duration::from_secs(10)).await;
    if missing > 0 {
        eprintln!(
            "error: {missing} of {} buffered cells do not read back",
            buffered.len()
        );
        return Ok(ExitCode::FAILURE);
    }
    println!("every buffered cell reads back with its body");
    Ok(ExitCode::SUCCESS)
}
