//! Verify and repair: compares every index entry with the entry its row's
//! latest cells give, both ways, and fixes exactly the drift found.
//!
//! **What is compared.** Shard by shard (in chunks sized to about half a
//! second of work), a run reads the cells of the index columns of the
//! chunk's shards on their cell cluster (only the columns it needs),
//! computes each row's entry with the maintainer's own function
//! (`apply::entry_from`), and has the index table on every cluster
//! compare: the expected entries go to the database as bound rows, and
//! only the stored rows that differ come back (`verify/bulk.rs`). Reading
//! every stored row back instead cost as much as reading the cells. A
//! row is then *missing* (no live entry where the entry belongs), *stale*
//! (a live entry with other fields or source ref keys) or *extra* (a live
//! entry on a cluster where none belongs). A last phase of a full run
//! looks for live entries of rows that have no cells in the index's
//! columns at all (extra, too): each database joins its index table with
//! its own cell table and returns only the entries without cells, which
//! are then looked for on their row's cell cluster when that is another.
//!
//! **Live traffic.** Index entries follow their cells after the commit, so
//! a row whose cells the maintainer has not applied yet is not drift: the
//! run reads the maintainer's offsets before the cells and skips (counts as
//! *pending*) every row with a cell past them. A mismatch is read again,
//! offsets, cells and entry, before it is reported, so a write that lands
//! between the reads is not reported either.
//!
//! **Repair** goes through the maintainer's guarded writes: a wrong live
//! entry is first deleted by compare-and-delete (only if it is still the
//! row read, by its `_updated_at`), then the row's entry (or tombstone) is
//! recomputed and written with the guarded upsert on every cluster
//! (`Pass::reapply`), so a repair racing live maintenance can never put an
//! older entry over a newer one. It is safe while gateways run.
//!
//! **Resuming and throttling.** A full run records its progress in the
//! catalog of the datastore's first cluster (item `verify`) after every
//! chunk; a run with the same scope resumes after the last chunk done. Each
//! chunk is followed by a pause in proportion to its duration (`duty`), so
//! a run leaves the databases to the foreground most of the time, and by
//! default the run works on a low-priority thread with connections of its
//! own (`verify/thread.rs`), so it takes the CPU only when the foreground
//! leaves it idle.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

mod bulk;
mod chunk;
mod lease;
mod status;
mod thread;

use self::chunk::Chunk;
pub(crate) use self::status::Verifier;
pub use self::status::{VerifyState, VerifyStatus, VerifyTotals};

use super::apply::{
    consumers, entry_from, read_offsets, Consumer, Entry, Pass, PassResult, Touched,
};
use super::entry::col_type;
use crate::cells::codec;
use crate::error::{Error, Result};
use crate::shards::row_shard;
use crate::storage::{ddl, Backend, ColType, Sql, Value, MAX_PARAMS};
use crate::topology::{DatastoreRuntime, IndexRuntime, Topology};
use crate::StorageConfig;

/// Catalog item of a datastore's verify progress.
const CHECKPOINT_ITEM: &str = "verify";
/// Row keys per statement reading stored entries or checking cells.
const KEYS_PER_STATEMENT: usize = 1000;
/// Cells a chunk aims at (a few hundred milliseconds of work).
const CHUNK_CELLS: usize = 8000;
/// Most shards in one chunk.
const MAX_CHUNK: usize = 256;

/// What to verify, and how.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    /// Only these indexes (by name); empty: every index of the datastore.
    pub indexes: Vec<String>,
    /// Only the row shards in this range (inclusive).
    pub shards: Option<(u32, u32)>,
    /// Only this many shards picked at random from the selection; a sampled
    /// run does not look for entries of rows without cells, and is not
    /// resumed.
    pub sample: Option<u32>,
    /// Fix the drift found.
    pub repair: bool,
    /// The share of the time the run works: after a chunk of `t` it pauses
    /// `t × (1 − duty) / duty`. 1 runs flat out.
    pub duty: f64,
    /// Start over even if an unfinished run of the same scope was recorded.
    pub restart: bool,
    /// Run on an OS thread of its own at this nice value (19, the lowest
    /// priority, by default; Linux only, elsewhere the thread keeps the
    /// process's), with connections of its own opened from that thread,
    /// so that on SQLite the database work runs at that priority too.
    /// `None`: in the caller's task, on the store's maintenance
    /// connections.
    pub nice: Option<i32>,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            indexes: Vec::new(),
            shards: None,
            sample: None,
            repair: false,
            duty: 0.5,
            restart: false,
            nice: Some(19),
        }
    }
}

/// How an entry differs from what its row's cells give.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DriftKind {
    /// No live entry where the row's entry belongs.
    Missing,
    /// A live entry with other field values or source ref keys.
    Stale,
    /// A live entry where none belongs.
    Extra,
}

impl DriftKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::Missing => "missing",
            DriftKind::Stale => "stale",
            DriftKind::Extra => "extra",
        }
    }
}

/// One mismatching entry.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Drift {
    pub index: String,
    pub row_key: Uuid,
    /// The row's shard.
    pub shard: u32,
    pub kind: DriftKind,
    /// The cluster whose index table is wrong.
    pub cluster: String,
    /// The entry the cells give (fields by name, and `_shard`), if it
    /// belongs on `cluster`.
    pub expected: Option<serde_json::Value>,
    /// The live entry stored on `cluster`, if any.
    pub stored: Option<serde_json::Value>,
    /// Fixed by this run.
    pub repaired: bool,
}

/// Where a run is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyProgress {
    /// Shards of the selection done (including those of a resumed run).
    pub shards_done: u32,
    pub shards_total: u32,
    /// Rows compared (per index).
    pub rows: u64,
    /// Cells read.
    pub cells: u64,
    /// Rows skipped because the maintainer had not applied their cells.
    pub pending: u64,
    /// Rows whose latest cells cannot be decoded (see the quarantine).
    pub unreadable: u64,
    pub missing: u64,
    pub stale: u64,
    pub extra: u64,
    pub repaired: u64,
}

impl VerifyProgress {
    /// Mismatching entries found.
    pub fn drift(&self) -> u64 {
        self.missing + self.stale + self.extra
    }

    /// Adds the counts of `part` (a chunk's); the total stays.
    fn add(&mut self, part: &VerifyProgress) {
        self.shards_done += part.shards_done;
        self.rows += part.rows;
        self.cells += part.cells;
        self.pending += part.pending;
        self.unreadable += part.unreadable;
        self.missing += part.missing;
        self.stale += part.stale;
        self.extra += part.extra;
        self.repaired += part.repaired;
    }

    fn count(&mut self, kind: DriftKind) {
        match kind {
            DriftKind::Missing => self.missing += 1,
            DriftKind::Stale => self.stale += 1,
            DriftKind::Extra => self.extra += 1,
        }
    }
}

/// The outcome of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyReport {
    pub datastore: String,
    pub indexes: Vec<String>,
    pub progress: VerifyProgress,
    /// The shard a resumed run started from.
    pub resumed_from: Option<u32>,
    pub elapsed_ms: u64,
}

/// A run's record in the catalog: its scope and where it is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VerifyCheckpoint {
    /// The indexes (name:version) and shard range verified.
    pub scope: String,
    pub repair: bool,
    /// The next shard to verify; `None` once the run completed.
    pub next_shard: Option<u32>,
    pub progress: VerifyProgress,
    pub started_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A stored index row: its `_shard` (NULL for a tombstone), fields, ref
/// keys and `_updated_at`.
#[derive(Debug, Clone)]
struct Stored {
    shard: Option<u32>,
    fields: Vec<Value>,
    refs: Vec<Option<i64>>,
    updated_at: Value,
}

/// The cells of one chunk, row by row, in row-key order.
#[derive(Default)]
struct Source {
    /// The columns read (of every index verified), sorted; each row's
    /// vectors follow this order.
    columns: Vec<String>,
    rows: Vec<SourceRow>,
    /// Row key → its position in `rows`.
    at: HashMap<Uuid, usize>,
    cells: u64,
}

/// One row's cells in the columns read, with bodies as `B` (stored
/// bytes while the rows are read, then decoded).
struct SourceRow<B = serde_json::Value> {
    row_key: Uuid,
    shard: u32,
    /// Per column: the ref key and body of the latest cell (`None` without
    /// a cell, or when its body cannot be decoded).
    latest: Vec<Option<(i64, B)>>,
    /// Per column: the highest `added_id` of the row's cells (to tell
    /// pending rows), 0 without a cell.
    newest_added: Vec<i64>,
    /// Per column: the latest cell's body cannot be decoded.
    unreadable: Vec<bool>,
}

impl Source {
    fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c == name)
    }

    fn row(&self, row_key: &Uuid) -> Option<&SourceRow> {
        self.at.get(row_key).map(|&i| &self.rows[i])
    }
}

/// A row's entry as its cells give it.
struct Expected {
    row_key: Uuid,
    shard: u32,
    entry: Entry,
}

/// A candidate mismatch before it is confirmed.
struct Found {
    index: usize,
    row_key: Uuid,
    shard: u32,
    kind: DriftKind,
    target: usize,
    expected: Option<Entry>,
    stored: Option<Stored>,
}

/// Where a run reports what it finds, and has its checkpoints written.
#[async_trait::async_trait]
pub(crate) trait Listener: Send {
    /// A confirmed mismatch.
    fn drift(&mut self, drift: &Drift);

    /// The progress after a chunk (and after the last phase), with the
    /// checkpoint to record first (of a full run). The run goes on once
    /// this returns, and stops with its error.
    async fn progress(
        &mut self,
        progress: &VerifyProgress,
        checkpoint: Option<&VerifyCheckpoint>,
    ) -> Result<()>;
}

/// The caller's callbacks, as the listener of a run; the checkpoints go
/// to `topology`.
pub(crate) struct Callbacks<'a> {
    /// The lease of a run that records its progress.
    lease: Option<&'a lease::RunLease>,
    pub(crate) topology: &'a Topology,
    pub(crate) ds: &'a DatastoreRuntime,
    pub(crate) on_progress: &'a mut (dyn FnMut(&VerifyProgress) + Send),
    pub(crate) on_drift: &'a mut (dyn FnMut(&Drift) + Send),
}

#[async_trait::async_trait]
impl Listener for Callbacks<'_> {
    fn drift(&mut self, drift: &Drift) {
        (self.on_drift)(drift);
    }

    async fn progress(
        &mut self,
        progress: &VerifyProgress,
        checkpoint: Option<&VerifyCheckpoint>,
    ) -> Result<()> {
        if let Some(lease) = self.lease {
            lease.check()?;
        }
        if let Some(checkpoint) = checkpoint {
            let home = self.ds.map().cluster_of(0);
            write_checkpoint(self.topology, self.ds, home, checkpoint).await?;
        }
        (self.on_progress)(progress);
        // A caller that stops the run from its callback (by dropping it)
        // gets the chance before the run goes on: without it, the next
        // chunk's checkpoint could already be sent, and an interrupted
        // run resumed past where its caller saw it stop
        // (`an_interrupted_verify_resumes_where_it_stopped`, PostgreSQL).
        tokio::task::yield_now().await;
        Ok(())
    }
}

/// Runs a verify (and repair) of `ds` as `options` ask: on a thread of its
/// own with `options.nice`, else in this task. Calls `on_progress` after
/// every chunk and `on_drift` for every confirmed mismatch.
pub(crate) async fn run(
    topology: &Arc<Topology>,
    storage: &StorageConfig,
    ds: Arc<DatastoreRuntime>,
    options: &VerifyOptions,
    on_progress: &mut (dyn FnMut(&VerifyProgress) + Send),
    on_drift: &mut (dyn FnMut(&Drift) + Send),
) -> Result<VerifyReport> {
    // A run that records its progress runs alone on the datastore.
    let lease = match options.sample {
        None => Some(lease::take(topology, &ds).await?),
        Some(_) => None,
    };
    let mut callbacks = Callbacks {
        lease: lease.as_ref(),
        topology,
        ds: &ds,
        on_progress,
        on_drift,
    };
    let result = match options.nice {
        None => run_on(topology, &ds, options, &mut callbacks).await,
        Some(nice) => {
            let ds = ds.clone();
            thread::run(topology, storage, ds, options.clone(), nice, &mut callbacks).await
        }
    };
    if let Some(lease) = lease {
        lease.release().await;
    }
    result
}

/// Waits (at most `grace`) until the verify leases of runs dropped before
/// they ended are given up, so a process that exits leaves them free.
pub(crate) async fn settle(grace: Duration) {
    lease::settle(grace).await;
}

/// Runs a verify (and repair) of `ds` on the connections of `topology`.
pub(crate) async fn run_on(
    topology: &Topology,
    ds: &DatastoreRuntime,
    options: &VerifyOptions,
    listener: &mut dyn Listener,
) -> Result<VerifyReport> {
    let started = Instant::now();
    let indexes = selected_indexes(ds, &options.indexes)?;
    let names: Vec<String> = indexes
        .iter()
        .map(|&i| ds.indexes[i].def.name.clone())
        .collect();
    let shards = selected_shards(ds, options)?;
    let scope = scope_text(ds, &indexes, options);
    let home = ds.map().cluster_of(0);
    let mut progress = VerifyProgress {
        shards_total: shards.len() as u32,
        ..VerifyProgress::default()
    };
    let mut resumed_from = None;
    let mut todo: &[u32] = &shards;
    let checkpointed = options.sample.is_none();
    let started_at = Utc::now();
    let mut checkpoint = VerifyCheckpoint {
        scope: scope.clone(),
        repair: options.repair,
        next_shard: shards.first().copied(),
        progress: progress.clone(),
        started_at,
        updated_at: started_at,
    };
    if checkpointed && !options.restart {
        if let Some(previous) = read_checkpoint(topology, ds, home).await? {
            if previous.scope == scope && previous.repair == options.repair {
                if let Some(next) = previous.next_shard {
                    let at = shards.partition_point(|s| *s < next);
                    todo = &shards[at..];
                    progress = VerifyProgress {
                        shards_done: at as u32,
                        shards_total: shards.len() as u32,
                        ..previous.progress.clone()
                    };
                    resumed_from = Some(next);
                    checkpoint.started_at = previous.started_at;
                }
            }
        }
    }
    let consumers = consumers(topology, ds);
    // Chunks of about CHUNK_CELLS cells, each a run of shards on one cell
    // cluster. Without pauses (and without repairs) two run at once (the
    // databases and this process overlap their work); results are taken in
    // order, so the checkpoint only ever covers a prefix of the shards.
    let per_shard = cells_per_shard(topology, ds).await?;
    let chunk = ((CHUNK_CELLS as f64 / per_shard.max(1.0)) as usize).clamp(1, MAX_CHUNK);
    let mut chunks: Vec<Vec<u32>> = Vec::new();
    while !todo.is_empty() {
        let cluster = ds.map().cluster_of(todo[0]);
        let len = todo
            .iter()
            .take(chunk)
            .take_while(|s| ds.map().cluster_of(**s) == cluster)
            .count();
        let (now, rest) = todo.split_at(len);
        chunks.push(now.to_vec());
        todo = rest;
    }
    let parallel = if options.duty >= 1.0 && !options.repair {
        2
    } else {
        1
    };
    let repair = options.repair;
    let (consumers_ref, indexes_ref) = (&consumers, &indexes);
    let mut results = futures::stream::iter(chunks)
        .map(|now| async move {
            let began = Instant::now();
            let mut verify = Chunk {
                topology,
                ds,
                consumers: consumers_ref,
                indexes: indexes_ref,
                cluster: ds.map().cluster_of(now[0]),
            };
            let mut part = VerifyProgress::default();
            let mut drift = Vec::new();
            let found = verify.shards(&now, &mut part).await?;
            verify.settle(found, repair, &mut part, &mut drift).await?;
            part.shards_done = now.len() as u32;
            Ok::<_, Error>((now, part, drift, began.elapsed()))
        })
        .buffered(parallel);
    while let Some(result) = results.next().await {
        let (now, part, drift, took) = result?;
        progress.add(&part);
        for d in &drift {
            listener.drift(d);
        }
        if checkpointed {
            let last = *now.last().expect("a chunk has shards");
            let at = shards.partition_point(|s| *s <= last);
            // Past the last shard: the shards are done, the orphan phase
            // is next.
            checkpoint.next_shard = Some(shards.get(at).copied().unwrap_or(ds.def.shards));
            checkpoint.progress = progress.clone();
            checkpoint.updated_at = Utc::now();
        }
        listener
            .progress(&progress, checkpointed.then_some(&checkpoint))
            .await?;
        pause(took, options.duty).await;
    }
    drop(results);
    if options.sample.is_none() {
        for &index in &indexes {
            let mut verify = Chunk {
                topology,
                ds,
                consumers: &consumers,
                indexes: &indexes,
                cluster: home,
            };
            let mut drift = Vec::new();
            verify
                .orphans(index, &shards, options, &mut progress, &mut drift)
                .await?;
            for d in &drift {
                listener.drift(d);
            }
        }
        // A full run: the sample is `None`.
        checkpoint.next_shard = None;
        checkpoint.progress = progress.clone();
        checkpoint.updated_at = Utc::now();
        listener.progress(&progress, Some(&checkpoint)).await?;
    }
    Ok(VerifyReport {
        datastore: ds.name().to_string(),
        indexes: names,
        progress,
        resumed_from,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// The recorded progress of the latest full run on `ds`, if any.
pub(crate) async fn last_run(
    topology: &Topology,
    ds: &DatastoreRuntime,
) -> Result<Option<VerifyCheckpoint>> {
    read_checkpoint(topology, ds, ds.map().cluster_of(0)).await
}

fn selected_indexes(ds: &DatastoreRuntime, names: &[String]) -> Result<Vec<usize>> {
    if names.is_empty() {
        return Ok((0..ds.indexes.len()).collect());
    }
    names
        .iter()
        .map(|name| {
            ds.indexes
                .iter()
                .position(|i| &i.def.name == name)
                .ok_or_else(|| Error::UnknownIndex {
                    datastore: ds.name().to_string(),
                    index: name.clone(),
                })
        })
        .collect()
}

fn selected_shards(ds: &DatastoreRuntime, options: &VerifyOptions) -> Result<Vec<u32>> {
    let count = ds.def.shards;
    let (first, last) = options.shards.unwrap_or((0, count - 1));
    if first > last || last >= count {
        return Err(Error::BadInput(format!(
            "shards {first}-{last} are not within 0-{} of datastore `{}`",
            count - 1,
            ds.name()
        )));
    }
    let mut shards: Vec<u32> = (first..=last).collect();
    if let Some(sample) = options.sample {
        use rand::seq::SliceRandom;
        shards.shuffle(&mut rand::thread_rng());
        shards.truncate(sample.max(1) as usize);
        shards.sort_unstable();
    }
    Ok(shards)
}

fn scope_text(ds: &DatastoreRuntime, indexes: &[usize], options: &VerifyOptions) -> String {
    let names: Vec<String> = indexes
        .iter()
        .map(|&i| format!("{}:{}", ds.indexes[i].def.name, ds.indexes[i].version))
        .collect();
    let (first, last) = options.shards.unwrap_or((0, ds.def.shards - 1));
    format!("{} shards {first}-{last}", names.join(","))
}

/// After work that took `took`, the pause that makes it `duty` of the
/// time (none at 1 or above; at most 10 s).
pub(crate) async fn pause(took: Duration, duty: f64) {
    if duty > 0.0 && duty < 1.0 {
        let rest = took.mul_f64((1.0 - duty) / duty);
        tokio::time::sleep(rest.min(Duration::from_secs(10))).await;
    }
}

/// The average number of cells per shard of `ds`, from the shard counters
/// (one statement per cluster).
async fn cells_per_shard(topology: &Topology, ds: &DatastoreRuntime) -> Result<f64> {
    let mut cells = 0i64;
    for cluster in ds.map().clusters() {
        let backend = topology.clusters[cluster].maintenance()?;
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT ")
            .ident("next_added_id")
            .push(" FROM ")
            .ident(&ddl::shards_table(ds.name()));
        cells += backend
            .rows::<(i64,)>(&sql)
            .await?
            .into_iter()
            .map(|(next,)| next.abs())
            .sum::<i64>();
    }
    Ok(cells as f64 / f64::from(ds.def.shards.max(1)))
}

async fn read_checkpoint(
    topology: &Topology,
    ds: &DatastoreRuntime,
    cluster: usize,
) -> Result<Option<VerifyCheckpoint>> {
    let backend = topology.clusters[cluster].maintenance()?;
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .ident("value")
        .push(" FROM ")
        .ident(ddl::CATALOG_TABLE)
        .push(" WHERE ")
        .ident("datastore")
        .push(" = ")
        .bind(Value::Text(ds.name().to_string()))
        .push(" AND ")
        .ident("item")
        .push(" = ")
        .bind(Value::Text(CHECKPOINT_ITEM.to_string()));
    Ok(backend
        .first_row::<(String,)>(&sql)
        .await?
        .and_then(|(text,)| serde_json::from_str(&text).ok()))
}

async fn write_checkpoint(
    topology: &Topology,
    ds: &DatastoreRuntime,
    cluster: usize,
    checkpoint: &VerifyCheckpoint,
) -> Result<()> {
    let backend = topology.clusters[cluster].maintenance()?;
    let dialect = backend.dialect();
    let mut sql = Sql::new(dialect);
    sql.push("INSERT INTO ")
        .ident(ddl::CATALOG_TABLE)
        .push(" (")
        .idents(["datastore", "item", "value", "updated_at"])
        .push(") ");
    sql.rows([vec![
        Value::Text(ds.name().to_string()),
        Value::Text(CHECKPOINT_ITEM.to_string()),
        Value::Text(serde_json::to_string(checkpoint).expect("a checkpoint serializes")),
        Value::DateTime(crate::storage::value::truncate_to_micros(Utc::now())),
    ]]);
    sql.push(&dialect.upsert(&["datastore", "item"], &["value", "updated_at"]));
    backend.execute(&sql).await?;
    Ok(())
}
