//! The exact statement probe: what one write batch and one page of rows
//! cost the database, with nothing else running.
//!
//! The workloads' statements per request include index maintenance and
//! sweeps running beside them. Here the store is opened without index
//! maintenance and with a sweep interval of an hour, so the statement
//! counter of each cluster moves only with the calls measured; each call
//! runs alone, and its count is the counter's difference around it.

use std::time::Duration;

use serde::Serialize;

use crate::database::Database;
use crate::dataset::{Dataset, BASE, DATASTORE};
use cellgate_store::cells::PutStatus;
use cellgate_store::{Store, StoreOptions};

/// Calls measured of each kind.
const CALLS: usize = 20;

/// Statements per call: least, mean and most over the calls.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Statements {
    pub calls: usize,
    pub min: u64,
    pub mean: f64,
    pub max: u64,
}

impl Statements {
    fn of(counts: &[u64]) -> Statements {
        Statements {
            calls: counts.len(),
            min: counts.iter().copied().min().unwrap_or(0),
            mean: counts.iter().sum::<u64>() as f64 / counts.len().max(1) as f64,
            max: counts.iter().copied().max().unwrap_or(0),
        }
    }
}

/// What the probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// Cells per write batch.
    pub batch_cells: usize,
    /// One `put_cells` of a batch of new cells.
    pub per_batch: Statements,
    /// One index page of 20 (`query_index`) plus the latest BASE cell of
    /// each of its rows (`get_cells_latest`), as the `rows` workload.
    pub per_page: Statements,
}

fn statements(store: &Store) -> u64 {
    store.metrics().clusters.iter().map(|c| c.statements).sum()
}

/// Runs the probe on `database`, which holds the loaded data set.
pub async fn run(
    defs: &index_dsl::Definitions,
    database: &Database,
    data: &Dataset,
) -> anyhow::Result<ProbeReport> {
    let mut options = StoreOptions::new(database.storage());
    options.maintain_indexes = false;
    options.maintenance.sweep_every = Duration::from_secs(3600);
    let store = Store::open(defs.clone(), options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open the store for the statement probe: {e}"))?;

    let mut batches = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let cells = data.write_cells();
        let expected = cells.len();
        let before = statements(&store);
        let results = store
            .put_cells(DATASTORE, cells)
            .await
            .map_err(|e| anyhow::anyhow!("statement probe: a batch failed: {e}"))?;
        batches.push(statements(&store) - before);
        let written = results
            .iter()
            .filter(|r| matches!(r, Ok(PutStatus::Written)))
            .count();
        anyhow::ensure!(
            written == expected,
            "statement probe: {written} of {expected} cells written"
        );
    }

    let mut pages = Vec::with_capacity(CALLS);
    for _ in 0..CALLS {
        let driver = data.random_driver();
        let before = statements(&store);
        let page = store
            .query_index(DATASTORE, &data.index_query(driver))
            .await
            .map_err(|e| anyhow::anyhow!("statement probe: an index query failed: {e}"))?;
        let wanted: Vec<_> = page
            .entries
            .iter()
            .map(|e| (e.row_key, BASE.to_string()))
            .collect();
        let cells = store
            .get_cells_latest(DATASTORE, &wanted)
            .await
            .map_err(|e| anyhow::anyhow!("statement probe: reading rows failed: {e}"))?;
        pages.push(statements(&store) - before);
        anyhow::ensure!(
            !wanted.is_empty() && cells.iter().all(Option::is_some),
            "statement probe: the page of driver {driver} has {} entries and {} rows",
            wanted.len(),
            cells.iter().flatten().count()
        );
    }
    Ok(ProbeReport {
        batch_cells: data.batch,
        per_batch: Statements::of(&batches),
        per_page: Statements::of(&pages),
    })
}
