//! `cellgate-bench triggers`: what a trigger consumer (the store's Rust
//! API, `triggers/`) delivers, on one cluster.
//!
//! 1. **Throughput of one worker**: `--cells` cells (BASE and STATUS of
//!    `--cells / 2` trips, 4096 shards, random row keys) are stored with no
//!    consumer running; then a consumer of every column starts and the clock
//!    runs until its handler has taken every one. The handler does nothing
//!    but count, so this is the cost of reading the log, batching, and
//!    moving the offsets.
//! 2. **Delivery lag at steady write rates**: with the consumer running, a
//!    writer stores batches of 10 cells at each rate of `--rates` for
//!    `--duration` seconds; the handler records, per cell, the time from
//!    the cell's `created_at` (taken just before its commit) to the
//!    handler call, and p50, p99 and the maximum are printed per rate.
//!
//! With `--handler-ms`, the handler takes that long for each batch before
//! it acknowledges it (a slow webhook receiver); cells delivered more than
//! once are counted (a batch outliving the consumer's lease must not be
//! redelivered). `--cells 0` skips the throughput part.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use cellgate_store::triggers::{ConsumerOptions, Delivery, Handler};
use cellgate_store::{ClusterConfig, StorageConfig, Store, StoreOptions};
use clap::Args;

use crate::dataset::{Dataset, DATASTORE};
use crate::{load_definitions, DEFAULT_DATASTORES};

#[derive(Debug, Args)]
pub struct TriggersBenchArgs {
    /// An empty database. [default: an SQLite file in a temporary
    /// directory]
    #[arg(long, value_name = "URL", env = "CELLGATE_BENCH_DATABASE")]
    pub database: Option<String>,
    /// Directory of the datastore and index definitions.
    #[arg(long, env = "CELLGATE_DATASTORES", default_value = DEFAULT_DATASTORES)]
    pub datastores: PathBuf,
    /// Cells stored before the consumer starts (throughput).
    #[arg(long, default_value_t = 100_000, env = "CELLGATE_BENCH_CELLS")]
    pub cells: u64,
    /// Write rates in cells per second for the lag measurement,
    /// comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "250,1000",
        env = "CELLGATE_BENCH_RATES"
    )]
    pub rates: Vec<u64>,
    /// Seconds each rate runs.
    #[arg(long, default_value_t = 10, env = "CELLGATE_BENCH_DURATION")]
    pub duration: u64,
    /// Milliseconds the handler takes per batch before acknowledging it.
    #[arg(long, default_value_t = 0)]
    pub handler_ms: u64,
}

/// What the handler saw.
#[derive(Default)]
struct Seen {
    cells: AtomicU64,
    /// Commit-to-handler delays in microseconds, while recording.
    lag_us: Mutex<Option<hdrhistogram::Histogram<u64>>>,
    /// Every cell handed over, by `(shard, added_id)`.
    distinct: Mutex<std::collections::HashSet<(u32, i64)>>,
    /// Cells handed over again.
    repeated: AtomicU64,
}

fn handler(seen: Arc<Seen>, takes: Duration) -> Handler {
    Arc::new(move |delivery: Delivery| {
        let seen = seen.clone();
        Box::pin(async move {
            let now = chrono::Utc::now();
            let mut new = 0u64;
            {
                let mut distinct = seen.distinct.lock().expect("distinct");
                for cell in &delivery.cells {
                    if distinct.insert((cell.shard, cell.added_id)) {
                        new += 1;
                    } else {
                        seen.repeated.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            if let Some(histogram) = seen.lag_us.lock().expect("lag").as_mut() {
                for cell in &delivery.cells {
                    let us = (now - cell.created_at)
                        .num_microseconds()
                        .unwrap_or(0)
                        .max(0);
                    let _ = histogram.record(us as u64);
                }
            }
            // Counted when the handler got them: a slow handler's cells
            // are delivered, and the clock for their lag stops, here.
            seen.cells.fetch_add(new, Ordering::Relaxed);
            tokio::time::sleep(takes).await;
            Ok(())
        })
    })
}

pub async fn run(args: TriggersBenchArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let dir = crate::server::work_dir()?;
    let url = args
        .database
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("cellgate.db").display()));
    println!(
        "cellgate-bench triggers: database {}; {} cells before the consumer starts; rates {:?} cells/s for {} s each; the handler takes {} ms per batch",
        cellgate_store::storage::redact_url(&url),
        args.cells,
        args.rates,
        args.duration,
        args.handler_ms
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

    // 1. Throughput.
    let data = Dataset::new(args.cells.div_ceil(2), 1000, true, 21, 500);
    let written = Instant::now();
    let stored = crate::dataset::load_through_api(&store, &data).await?;
    println!(
        "stored {stored} cells in {:.1} s",
        written.elapsed().as_secs_f64()
    );
    let seen = Arc::new(Seen::default());
    let started = Instant::now();
    let consumer = store.start_consumer(
        ConsumerOptions::new("bench", DATASTORE),
        handler(seen.clone(), Duration::from_millis(args.handler_ms)),
    )?;
    let deadline = Instant::now() + Duration::from_secs(600);
    while seen.cells.load(Ordering::Relaxed) < stored {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the consumer took {} of {stored} cells in 10 minutes",
            seen.cells.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let seconds = started.elapsed().as_secs_f64();
    if stored > 0 {
        println!(
            "one worker: {stored} cells delivered in {seconds:.2} s: {:.0} cells/s",
            stored as f64 / seconds
        );
    }

    // 2. Lag at steady rates.
    let mut failed = false;
    for (i, rate) in args.rates.iter().copied().enumerate() {
        *seen.lag_us.lock().expect("lag") = Some(hdrhistogram::Histogram::new(3)?);
        // Writes of 10 cells (BASE and STATUS of 5 trips), one every
        // 10 / rate seconds.
        let data = Dataset::new(rate * args.duration / 2, 1000, true, 22 + i as u64, 5);
        let cells: Vec<_> = (0..data.load_batches())
            .flat_map(|n| data.load_batch(n))
            .collect();
        let every = Duration::from_secs_f64(10.0 / rate.max(1) as f64);
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let before = seen.cells.load(Ordering::Relaxed);
        let mut sent = 0u64;
        let mut writes = Vec::new();
        for chunk in cells.chunks(10) {
            tick.tick().await;
            let store = store.clone();
            let chunk = chunk.to_vec();
            sent += chunk.len() as u64;
            writes.push(tokio::spawn(async move {
                store.put_cells(DATASTORE, chunk).await
            }));
        }
        for write in writes {
            write.await??;
        }
        let deadline =
            Instant::now() + Duration::from_secs(60) + Duration::from_millis(args.handler_ms) * 10;
        while seen.cells.load(Ordering::Relaxed) < before + sent && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let histogram = seen.lag_us.lock().expect("lag").take();
        let Some(histogram) = histogram else { continue };
        let ms = |q: f64| histogram.value_at_quantile(q) as f64 / 1000.0;
        let took = seen.cells.load(Ordering::Relaxed) - before;
        println!(
            "{rate} cells/s: {took} of {sent} cells delivered; commit to handler p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            ms(0.5),
            ms(0.99),
            histogram.max() as f64 / 1000.0
        );
        failed |= took < sent;
    }
    let repeated = seen.repeated.load(Ordering::Relaxed);
    println!(
        "cells handed over more than once: {repeated} of {}",
        seen.cells.load(Ordering::Relaxed)
    );
    consumer.stop().await;
    store.shutdown(Duration::from_secs(10)).await;
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
