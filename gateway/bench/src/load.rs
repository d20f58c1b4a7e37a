//! Loading the data set: batches of 500 cells, `--concurrency` at a time, through the Rust API or through `tripsPutCells`.
//!
//! Loading is not a measured phase but a precondition: the first failed
//! batch stops it with an error. Every batch is bounded by the request
//! timeout, and every cell must come back `WRITTEN` (a duplicate means the
//! store already held the data set, e.g. the same `--seed` against a
//! gateway that was loaded before).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{json, Value};

use crate::database::StorageFigures;
use crate::dataset::{cell_input, Dataset, DATASTORE, LOAD};
use crate::http::{truncate, Gateway};
use crate::phase::progress_bar;
use cellgate_store::cells::{NewCell, PutStatus};
use cellgate_store::Store;

/// What loading took.
#[derive(Debug, Clone, Serialize)]
pub struct LoadReport {
    /// `rust` or `graphql`.
    pub via: &'static str,
    pub trips: u64,
    pub cells: u64,
    pub seconds: f64,
    pub cells_per_second: f64,
    /// From the last write until every index had applied every cell;
    /// `None` when it could not be measured.
    pub catch_up_seconds: Option<f64>,
    /// With `--backlog`: the load ran without index maintenance, and a
    /// store then applied every cell in this many seconds, alone.
    pub backlog_seconds: Option<f64>,
    /// The store afterwards (local runs).
    pub storage: Option<StorageFigures>,
}

impl LoadReport {
    /// With `--backlog`: the apply rate of the backlog against the load's
    /// write rate.
    pub fn backlog_line(&self) -> Option<String> {
        let seconds = self.backlog_seconds?;
        let rate = self.cells as f64 / seconds.max(1e-9);
        Some(format!(
            "backlog: {} cells applied in {seconds:.2} s by a store alone, {rate:.0} cells/s, \
             {:.2}x the load's write rate",
            self.cells,
            rate / self.cells_per_second.max(1e-9)
        ))
    }
}

/// Writes one batch; `Err` says why it failed.
type Put = Arc<
    dyn Fn(Vec<NewCell>) -> Pin<Box<dyn Future<Output = Result<(), String>> + Send>> + Send + Sync,
>;

/// Loads the data set through `store.put_cells`; how long it took.
pub async fn via_rust(
    store: &Store,
    data: &Arc<Dataset>,
    concurrency: u32,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let store = store.clone();
    let put: Put = Arc::new(move |cells| {
        let store = store.clone();
        Box::pin(async move {
            let expected = cells.len();
            let results = store
                .put_cells(DATASTORE, cells)
                .await
                .map_err(|e| e.to_string())?;
            let mut written = 0;
            for result in results {
                match result {
                    Ok(PutStatus::Written) => written += 1,
                    Ok(_) => {}
                    Err(e) => return Err(e.to_string()),
                }
            }
            check_written(written, expected)
        })
    });
    load(data, concurrency, timeout, put).await
}

/// Loads the data set through `tripsPutCells`; how long it took.
pub async fn via_graphql(
    gateway: &Arc<Gateway>,
    data: &Arc<Dataset>,
    concurrency: u32,
    timeout: Duration,
) -> anyhow::Result<Duration> {
    let gateway = gateway.clone();
    let put: Put = Arc::new(move |cells| {
        let gateway = gateway.clone();
        Box::pin(async move {
            let expected = cells.len();
            let input: Vec<Value> = cells.iter().map(cell_input).collect();
            let data = gateway.graphql(LOAD, json!({ "cells": input })).await?;
            let results = data
                .get("tripsPutCells")
                .and_then(Value::as_array)
                .ok_or_else(|| format!("no results in {}", truncate(&data.to_string(), 200)))?;
            let written = results
                .iter()
                .filter(|r| r.get("status").and_then(Value::as_str) == Some("WRITTEN"))
                .count();
            check_written(written, expected)
        })
    });
    load(data, concurrency, timeout, put).await
}

fn check_written(written: usize, expected: usize) -> Result<(), String> {
    if written == expected {
        Ok(())
    } else {
        Err(format!(
            "{written} of {expected} cells written; the others were refused or already \
             stored (the store must not hold this data set yet)"
        ))
    }
}

async fn load(
    data: &Arc<Dataset>,
    concurrency: u32,
    timeout: Duration,
    put: Put,
) -> anyhow::Result<Duration> {
    let batches = data.load_batches();
    let bar = progress_bar(
        data.cells(),
        "{prefix:<26} {bar:30} {pos}/{len} cells {elapsed:>3}",
        "load".to_string(),
    );
    let next = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicBool::new(false));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency.min(batches.max(1) as u32) {
        let (data, put, next, failed, first_error, bar) = (
            data.clone(),
            put.clone(),
            next.clone(),
            failed.clone(),
            first_error.clone(),
            bar.clone(),
        );
        workers.push(tokio::spawn(async move {
            // Each worker takes the next batch number until none is left;
            // the batch count bounds the loop.
            while !failed.load(Ordering::Relaxed) {
                let number = next.fetch_add(1, Ordering::Relaxed);
                if number >= batches {
                    break;
                }
                let cells = data.load_batch(number);
                let count = cells.len() as u64;
                let result = match tokio::time::timeout(timeout, put(cells)).await {
                    Ok(result) => result,
                    Err(_) => Err(format!("no answer within {timeout:?} (--request-timeout)")),
                };
                match result {
                    Ok(()) => bar.inc(count),
                    Err(message) => {
                        failed.store(true, Ordering::Relaxed);
                        first_error
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .get_or_insert(format!("batch {number}: {message}"));
                    }
                }
            }
        }));
    }
    for worker in workers {
        worker
            .await
            .map_err(|e| anyhow::anyhow!("a load worker failed: {e}"))?;
    }
    let elapsed = started.elapsed();
    bar.finish();
    if let Some(message) = first_error.lock().unwrap_or_else(|e| e.into_inner()).take() {
        anyhow::bail!("cannot load the trips: {message}");
    }
    Ok(elapsed)
}
