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
mod lease;
mod thread;

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
        None => Some(lease::RunLease::take(topology, &ds).await?),
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

struct Chunk<'a> {
    topology: &'a Topology,
    ds: &'a DatastoreRuntime,
    consumers: &'a [Consumer],
    indexes: &'a [usize],
    /// The cell cluster of the rows.
    cluster: usize,
}

impl Chunk<'_> {
    fn cell_backend(&self, cluster: usize) -> Result<&std::sync::Arc<dyn Backend>> {
        self.topology.clusters[cluster].maintenance()
    }

    fn columns(&self) -> Vec<String> {
        self.indexes
            .iter()
            .flat_map(|&i| self.ds.indexes[i].def.columns.iter().cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Compares the entries of every row of `shards`; returns the
    /// mismatches (not yet confirmed).
    async fn shards(
        &mut self,
        shards: &[u32],
        progress: &mut VerifyProgress,
    ) -> Result<Vec<Found>> {
        let backend = self.cell_backend(self.cluster)?.clone();
        let offsets = read_offsets(backend.as_ref(), self.ds, self.consumers, shards).await?;
        let source = self
            .read_source(backend.as_ref(), Selection::Shards(shards))
            .await?;
        progress.cells += source.cells;
        self.compare_bulk(&offsets, &source, progress).await
    }

    /// Reads the cells of the index columns of the selected rows: only the
    /// columns a verify needs, every version (for the pending check), the
    /// body of the latest version of each column decoded.
    async fn read_source(&self, backend: &dyn Backend, selection: Selection<'_>) -> Result<Source> {
        let columns = self.columns();
        let table = ddl::cells_table(self.ds.name());
        let keys: Vec<Value> = match selection {
            Selection::Shards(shards) => shards.iter().map(|s| Value::Int(i64::from(*s))).collect(),
            Selection::Rows(rows) => rows.iter().map(|r| Value::Uuid(*r)).collect(),
        };
        let by = match selection {
            Selection::Shards(_) => "shard",
            Selection::Rows(_) => "row_key",
        };
        let types = [
            ColType::Uuid,
            ColType::Text,
            ColType::Int,
            ColType::Int,
            ColType::Bytes,
        ];
        let mut at: HashMap<Uuid, usize> = HashMap::new();
        let mut raw: Vec<SourceRow<Vec<u8>>> = Vec::new();
        let shards = self.ds.def.shards;
        let mut cells = 0u64;
        for part in keys.chunks(MAX_PARAMS / 2) {
            let mut sql = Sql::new(backend.dialect());
            sql.push("SELECT ")
                .idents(["row_key", "column_name", "ref_key", "added_id", "body"])
                .push(" FROM ")
                .ident(&table)
                .push(" WHERE ")
                .ident(by)
                .in_list(part.iter().cloned())
                .push(" AND ")
                .ident("column_name")
                .in_list(columns.iter().map(|c| Value::Text(c.clone())));
            for row in backend.fetch(&sql, &types).await? {
                let mut row = row.into_iter();
                let (
                    Some(Value::Uuid(row_key)),
                    Some(Value::Text(column)),
                    Some(Value::Int(ref_key)),
                    Some(Value::Int(added_id)),
                    Some(Value::Bytes(body)),
                ) = (row.next(), row.next(), row.next(), row.next(), row.next())
                else {
                    return Err(Error::Internal("cell row has unexpected NULLs".into()));
                };
                let Some(c) = columns.iter().position(|name| *name == column) else {
                    continue;
                };
                cells += 1;
                let i = *at.entry(row_key).or_insert_with(|| {
                    raw.push(SourceRow {
                        row_key,
                        shard: row_shard(&row_key, shards),
                        latest: vec![None; columns.len()],
                        newest_added: vec![0; columns.len()],
                        unreadable: vec![false; columns.len()],
                    });
                    raw.len() - 1
                });
                let SourceRow {
                    latest,
                    newest_added: newest,
                    ..
                } = &mut raw[i];
                newest[c] = newest[c].max(added_id);
                if latest[c].as_ref().is_none_or(|(kept, _)| *kept < ref_key) {
                    latest[c] = Some((ref_key, body));
                }
            }
        }
        // Only the members the indexes read (fields and predicates) are decoded.
        let members: BTreeSet<String> = self
            .indexes
            .iter()
            .flat_map(|&i| self.ds.indexes[i].def.members())
            .map(str::to_string)
            .collect();
        let mut rows: Vec<SourceRow> = raw
            .into_iter()
            .map(|row| {
                let mut unreadable = row.unreadable;
                let latest = row
                    .latest
                    .into_iter()
                    .enumerate()
                    .map(|(c, cell)| {
                        let (ref_key, body) = cell?;
                        match codec::decode_members(&body, &members) {
                            Ok(body) => Some((ref_key, body)),
                            Err(_) => {
                                unreadable[c] = true;
                                None
                            }
                        }
                    })
                    .collect();
                SourceRow {
                    row_key: row.row_key,
                    shard: row.shard,
                    latest,
                    newest_added: row.newest_added,
                    unreadable,
                }
            })
            .collect();
        // In row-key order: reports come out sorted, and the databases
        // look the stored rows up in key order.
        rows.sort_unstable_by_key(|r| r.row_key);
        let at = rows
            .iter()
            .enumerate()
            .map(|(i, r)| (r.row_key, i))
            .collect();
        Ok(Source {
            columns,
            rows,
            at,
            cells,
        })
    }

    /// The entries of `index` that the source's rows (or only those of
    /// `only`) give; rows the maintainer has not caught up with are counted
    /// as pending, rows with an undecodable latest cell as unreadable.
    fn expected(
        &self,
        index: usize,
        offsets: &BTreeMap<u32, Vec<i64>>,
        source: &Source,
        only: Option<&BTreeSet<(usize, Uuid)>>,
        progress: &mut VerifyProgress,
    ) -> Vec<Expected> {
        let runtime = &self.ds.indexes[index];
        let columns: Vec<usize> = runtime
            .def
            .columns
            .iter()
            .filter_map(|c| source.column(c))
            .collect();
        // The lowest offset among the index's consumers, per shard.
        let applied = |shard: u32| -> i64 {
            offsets.get(&shard).map_or(0, |per| {
                self.consumers
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| c.index == index)
                    .map(|(i, _)| per[i])
                    .min()
                    .unwrap_or(0)
            })
        };
        let mut out = Vec::new();
        for row in &source.rows {
            if only.is_some_and(|o| !o.contains(&(index, row.row_key))) {
                continue;
            }
            let newest = columns
                .iter()
                .map(|&c| row.newest_added[c])
                .max()
                .unwrap_or(0);
            if newest > applied(row.shard) {
                progress.pending += 1;
                continue;
            }
            if columns.iter().any(|&c| row.unreadable[c]) {
                progress.unreadable += 1;
                continue;
            }
            progress.rows += 1;
            let mut scratch = PassResult::default();
            let entry = entry_from(
                runtime,
                self.ds.def.shards,
                |column| {
                    let c = source.column(column)?;
                    row.latest[c].as_ref().map(|(r, body)| (*r, body))
                },
                &mut scratch,
            );
            out.push(Expected {
                row_key: row.row_key,
                shard: row.shard,
                entry,
            });
        }
        out
    }

    /// The first look at a chunk: each index's expected entries are
    /// compared by the databases (`bulk`), which return only the rows that
    /// differ. The mismatches are candidates for [`Chunk::settle`].
    async fn compare_bulk(
        &self,
        offsets: &BTreeMap<u32, Vec<i64>>,
        source: &Source,
        progress: &mut VerifyProgress,
    ) -> Result<Vec<Found>> {
        let targets = self.ds.map().clusters();
        let expected: Vec<(usize, Vec<Expected>)> = self
            .indexes
            .iter()
            .map(|&index| (index, self.expected(index, offsets, source, None, progress)))
            .collect();
        // Per index and target cluster: the rows whose entry belongs there
        // (compared), and the others (any live row there is extra).
        let mut lists: Vec<(usize, usize, Vec<&Expected>, Vec<&Expected>)> = Vec::new();
        for (index, rows) in &expected {
            for &target in &targets {
                let (here, elsewhere) = rows.iter().partition(|e| {
                    e.entry.shard.map(|s| self.ds.map().cluster_of(s)) == Some(target)
                });
                lists.push((*index, target, here, elsewhere));
            }
        }
        let mut reads: Vec<futures::future::BoxFuture<'_, Result<Vec<Found>>>> = Vec::new();
        for (index, target, here, elsewhere) in &lists {
            let runtime = &self.ds.indexes[*index];
            for part in bulk::batches(here.len(), bulk::rows_per_statement(runtime)) {
                reads.push(Box::pin(self.bulk_mismatches(*index, *target, &here[part])));
            }
            for part in elsewhere.chunks(KEYS_PER_STATEMENT) {
                reads.push(Box::pin(self.bulk_extra(*index, *target, part)));
            }
        }
        // One statement at a time: a run keeps at most two in flight (two
        // chunks at once when it runs flat out), so most of the
        // maintenance pool stays free for the maintainer's passes and
        // leases.
        let mut found = Vec::new();
        for read in reads {
            found.extend(read.await?);
        }
        found.sort_by_key(|f| (f.index, f.row_key, f.target));
        Ok(found)
    }

    /// The rows of `rows` (whose entries belong on `target`) whose stored
    /// row on `target` is missing or stale.
    async fn bulk_mismatches(
        &self,
        index: usize,
        target: usize,
        rows: &[&Expected],
    ) -> Result<Vec<Found>> {
        let runtime = &self.ds.indexes[index];
        let backend = self.topology.clusters[target].maintenance()?;
        let pairs: Vec<(Uuid, &Entry)> = rows.iter().map(|e| (e.row_key, &e.entry)).collect();
        let sql = bulk::mismatches(backend.dialect(), runtime, &pairs);
        let by_key: HashMap<Uuid, &Expected> = rows.iter().map(|e| (e.row_key, *e)).collect();
        let mut found = Vec::new();
        for row in backend.fetch(&sql, &[ColType::Uuid, ColType::Int]).await? {
            let Some(Value::Uuid(row_key)) = row.first() else {
                continue;
            };
            let Some(e) = by_key.get(row_key) else {
                continue;
            };
            let live = row.get(1).is_some_and(|v| !v.is_null());
            found.push(Found {
                index,
                row_key: *row_key,
                shard: e.shard,
                kind: if live {
                    DriftKind::Stale
                } else {
                    DriftKind::Missing
                },
                target,
                expected: Some(e.entry.clone()),
                stored: None,
            });
        }
        Ok(found)
    }

    /// The rows of `rows` (whose entries belong elsewhere, or nowhere) that
    /// have a live stored row on `target`.
    async fn bulk_extra(
        &self,
        index: usize,
        target: usize,
        rows: &[&Expected],
    ) -> Result<Vec<Found>> {
        let runtime = &self.ds.indexes[index];
        let backend = self.topology.clusters[target].maintenance()?;
        let keys: Vec<Uuid> = rows.iter().map(|e| e.row_key).collect();
        let sql = bulk::live(backend.dialect(), runtime, &keys);
        let by_key: HashMap<Uuid, &Expected> = rows.iter().map(|e| (e.row_key, *e)).collect();
        Ok(backend
            .fetch(&sql, &[ColType::Uuid])
            .await?
            .into_iter()
            .filter_map(|row| match row.first() {
                Some(Value::Uuid(row_key)) => by_key.get(row_key).map(|e| Found {
                    index,
                    row_key: *row_key,
                    shard: e.shard,
                    kind: DriftKind::Extra,
                    target,
                    expected: None,
                    stored: None,
                }),
                _ => None,
            })
            .collect())
    }

    /// The second look at candidate mismatches (the rows of `only`): the
    /// stored rows are read and compared with the expected entries in Rust
    /// ([`same`]).
    async fn compare_exact(
        &self,
        offsets: &BTreeMap<u32, Vec<i64>>,
        source: &Source,
        only: &BTreeSet<(usize, Uuid)>,
        progress: &mut VerifyProgress,
    ) -> Result<Vec<Found>> {
        let mut found = Vec::new();
        let targets = self.ds.map().clusters();
        for &index in self.indexes {
            let expected = self.expected(index, offsets, source, Some(only), progress);
            if expected.is_empty() {
                continue;
            }
            let runtime = &self.ds.indexes[index];
            let rows: Vec<Uuid> = expected.iter().map(|e| e.row_key).collect();
            let stored = read_stored(self.topology, runtime, &targets, &rows).await?;
            for e in expected {
                let home = e.entry.shard.map(|s| self.ds.map().cluster_of(s));
                for &target in &targets {
                    let live = stored
                        .get(&(target, e.row_key))
                        .filter(|s| s.shard.is_some());
                    let kind = match (home == Some(target), live) {
                        (true, None) => Some(DriftKind::Missing),
                        (true, Some(s)) if !same(&e.entry, s) => Some(DriftKind::Stale),
                        (false, Some(_)) => Some(DriftKind::Extra),
                        _ => None,
                    };
                    if let Some(kind) = kind {
                        found.push(Found {
                            index,
                            row_key: e.row_key,
                            shard: e.shard,
                            kind,
                            target,
                            expected: (home == Some(target)).then(|| e.entry.clone()),
                            stored: live.cloned(),
                        });
                    }
                }
            }
        }
        Ok(found)
    }

    /// Reads the mismatches again and reports (and repairs) those that
    /// remain.
    async fn settle(
        &mut self,
        found: Vec<Found>,
        repair: bool,
        progress: &mut VerifyProgress,
        out: &mut Vec<Drift>,
    ) -> Result<()> {
        if found.is_empty() {
            return Ok(());
        }
        let only: BTreeSet<(usize, Uuid)> = found.iter().map(|f| (f.index, f.row_key)).collect();
        let rows: Vec<Uuid> = only
            .iter()
            .map(|(_, r)| *r)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let backend = self.cell_backend(self.cluster)?.clone();
        let shards: Vec<u32> = found
            .iter()
            .map(|f| f.shard)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let offsets = read_offsets(backend.as_ref(), self.ds, self.consumers, &shards).await?;
        let source = self
            .read_source(backend.as_ref(), Selection::Rows(&rows))
            .await?;
        // The second look counts nothing but the drift it confirms.
        let mut again = VerifyProgress::default();
        let mut confirmed = self
            .compare_exact(&offsets, &source, &only, &mut again)
            .await?;
        progress.pending += again.pending;
        // Rows with no cells left in the index columns: whatever is live is extra.
        let first: HashMap<(usize, Uuid, usize), &Found> = found
            .iter()
            .map(|f| ((f.index, f.row_key, f.target), f))
            .collect();
        confirmed.retain(|f| first.contains_key(&(f.index, f.row_key, f.target)));
        let missing_rows: Vec<&Found> = found
            .iter()
            .filter(|f| source.row(&f.row_key).is_none() && f.kind == DriftKind::Extra)
            .collect();
        for f in missing_rows {
            let runtime = &self.ds.indexes[f.index];
            let stored = read_stored(self.topology, runtime, &[f.target], &[f.row_key]).await?;
            if let Some(live) = stored
                .get(&(f.target, f.row_key))
                .filter(|s| s.shard.is_some())
            {
                confirmed.push(Found {
                    stored: Some(live.clone()),
                    expected: None,
                    ..*f
                });
            }
        }
        self.report(confirmed, repair, progress, out).await
    }

    async fn report(
        &mut self,
        confirmed: Vec<Found>,
        repair: bool,
        progress: &mut VerifyProgress,
        out: &mut Vec<Drift>,
    ) -> Result<()> {
        if confirmed.is_empty() {
            return Ok(());
        }
        let repaired = if repair {
            self.repair(&confirmed).await?
        } else {
            HashSet::new()
        };
        for f in &confirmed {
            progress.count(f.kind);
            let runtime = &self.ds.indexes[f.index];
            let fixed = repaired.contains(&(f.index, f.row_key));
            if fixed {
                progress.repaired += 1;
            }
            out.push(Drift {
                index: runtime.def.name.clone(),
                row_key: f.row_key,
                shard: f.shard,
                kind: f.kind,
                cluster: self.topology.clusters[f.target].name.clone(),
                expected: f
                    .expected
                    .as_ref()
                    .map(|e| entry_json(runtime, e.shard, &e.fields, &e.refs)),
                stored: f
                    .stored
                    .as_ref()
                    .map(|s| entry_json(runtime, s.shard, &s.fields, &s.refs)),
                repaired: fixed,
            });
        }
        Ok(())
    }

    /// Deletes the wrong live entries that are still as read, then writes
    /// every drifting row's entry with the maintainer's guarded upsert.
    /// Returns the (index, row) pairs written.
    async fn repair(&mut self, confirmed: &[Found]) -> Result<HashSet<(usize, Uuid)>> {
        for f in confirmed {
            if let Some(stored) = &f.stored {
                let runtime = &self.ds.indexes[f.index];
                let backend = self.topology.clusters[f.target].maintenance()?;
                let mut sql = Sql::new(backend.dialect());
                sql.push("DELETE FROM ")
                    .ident(&runtime.table)
                    .push(" WHERE ")
                    .ident("row_key")
                    .push(" = ")
                    .bind(Value::Uuid(f.row_key))
                    .push(" AND ")
                    .ident(ddl::INDEX_SHARD_COLUMN)
                    .push(" = ")
                    .bind(Value::Int(i64::from(stored.shard.unwrap_or(0))))
                    .push(" AND ")
                    .ident("_updated_at")
                    .push(" = ")
                    .bind(stored.updated_at.clone());
                backend.execute(&sql).await?;
            }
        }
        let mut by_cluster: BTreeMap<usize, Touched> = BTreeMap::new();
        for f in confirmed {
            by_cluster
                .entry(self.ds.map().cluster_of(f.shard))
                .or_default()
                .insert((f.index, f.row_key), (f.shard, 0));
        }
        let mut written = HashSet::new();
        let mut attempts = HashMap::new();
        for (cluster, touched) in by_cluster {
            let mut pass = Pass {
                topology: self.topology,
                ds: self.ds,
                cluster,
                consumers: self.consumers,
                fence: None,
                attempts: &mut attempts,
                quarantine_after: 1,
                hook: None,
            };
            pass.reapply(&touched, &[]).await?;
            written.extend(touched.keys().copied());
        }
        Ok(written)
    }

    /// Finds live entries of `index` whose rows have no cells in the
    /// index's columns (so the shard scan never met them).
    async fn orphans(
        &mut self,
        index: usize,
        shards: &[u32],
        options: &VerifyOptions,
        progress: &mut VerifyProgress,
        out: &mut Vec<Drift>,
    ) -> Result<()> {
        let runtime = &self.ds.indexes[index];
        let selected: HashSet<u32> = shards.iter().copied().collect();
        for target in self.ds.map().clusters() {
            let backend = self.topology.clusters[target].maintenance()?.clone();
            let mut after: Option<Uuid> = None;
            loop {
                // A page of up to ORPHAN_PAGE keys of the index table, ending
                // at `upper` (the last page has none), whose live entries
                // the database checks against its own cells: only those
                // without a cell here come back, to be looked for on the
                // row's cell cluster (another one in a multi-cluster
                // datastore).
                let upper = page_end(backend.as_ref(), &runtime.table, after).await?;
                let page = live_without_local_cells(
                    backend.as_ref(),
                    runtime,
                    &ddl::cells_table(self.ds.name()),
                    after,
                    upper,
                )
                .await?;
                let mut by_cluster: BTreeMap<usize, Vec<Uuid>> = BTreeMap::new();
                for row_key in &page {
                    let shard = row_shard(row_key, self.ds.def.shards);
                    if selected.contains(&shard) {
                        by_cluster
                            .entry(self.ds.map().cluster_of(shard))
                            .or_default()
                            .push(*row_key);
                    }
                }
                for (cell_cluster, rows) in by_cluster {
                    let mut have = HashSet::new();
                    if cell_cluster != target {
                        for part in rows.chunks(KEYS_PER_STATEMENT) {
                            have.extend(self.rows_with_cells(cell_cluster, runtime, part).await?);
                        }
                    }
                    let lonely: Vec<Found> = rows
                        .iter()
                        .filter(|r| !have.contains(r))
                        .map(|r| Found {
                            index,
                            row_key: *r,
                            shard: row_shard(r, self.ds.def.shards),
                            kind: DriftKind::Extra,
                            target,
                            expected: None,
                            stored: None,
                        })
                        .collect();
                    if !lonely.is_empty() {
                        self.cluster = cell_cluster;
                        self.settle(lonely, options.repair, progress, out).await?;
                    }
                }
                match upper {
                    Some(upper) => after = Some(upper),
                    None => break,
                }
            }
        }
        Ok(())
    }

    /// Which of `rows` have a cell in one of the index's columns.
    async fn rows_with_cells(
        &self,
        cluster: usize,
        runtime: &IndexRuntime,
        rows: &[Uuid],
    ) -> Result<HashSet<Uuid>> {
        let backend = self.cell_backend(cluster)?;
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT DISTINCT ")
            .ident("row_key")
            .push(" FROM ")
            .ident(&ddl::cells_table(self.ds.name()))
            .push(" WHERE ")
            .ident("row_key")
            .in_list(rows.iter().map(|r| Value::Uuid(*r)))
            .push(" AND ")
            .ident("column_name")
            .in_list(runtime.def.columns.iter().map(|c| Value::Text(c.clone())));
        Ok(backend
            .fetch(&sql, &[ColType::Uuid])
            .await?
            .into_iter()
            .filter_map(|row| match row.into_iter().next() {
                Some(Value::Uuid(u)) => Some(u),
                _ => None,
            })
            .collect())
    }
}

#[derive(Clone, Copy)]
enum Selection<'a> {
    Shards(&'a [u32]),
    Rows(&'a [Uuid]),
}

/// Index rows a page of the orphan phase covers: sized so that a page
/// is one short statement even on a server's statement timeout.
const ORPHAN_PAGE: usize = 10_000;

/// The key that ends the page of `table` after `after`: the
/// [`ORPHAN_PAGE`]th key, or `None` when fewer keys are left.
async fn page_end(backend: &dyn Backend, table: &str, after: Option<Uuid>) -> Result<Option<Uuid>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .ident("row_key")
        .push(" FROM ")
        .ident(table);
    if let Some(after) = after {
        sql.push(" WHERE ")
            .ident("row_key")
            .push(" > ")
            .bind(Value::Uuid(after));
    }
    sql.push(" ORDER BY ")
        .ident("row_key")
        .push(&format!(" LIMIT 1 OFFSET {}", ORPHAN_PAGE - 1));
    Ok(backend
        .fetch(&sql, &[ColType::Uuid])
        .await?
        .into_iter()
        .next()
        .and_then(|row| row.into_iter().next())
        .and_then(|v| v.as_uuid()))
}

/// The live entries of `runtime` with keys in (`after`, `upper`] whose row
/// has no cell in the index's columns in this database.
async fn live_without_local_cells(
    backend: &dyn Backend,
    runtime: &IndexRuntime,
    cells_table: &str,
    after: Option<Uuid>,
    upper: Option<Uuid>,
) -> Result<Vec<Uuid>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT t.")
        .ident("row_key")
        .push(" FROM ")
        .ident(&runtime.table)
        .push(" t WHERE t.")
        .ident(ddl::INDEX_SHARD_COLUMN)
        .push(" IS NOT NULL");
    if let Some(after) = after {
        sql.push(" AND t.")
            .ident("row_key")
            .push(" > ")
            .bind(Value::Uuid(after));
    }
    if let Some(upper) = upper {
        sql.push(" AND t.")
            .ident("row_key")
            .push(" <= ")
            .bind(Value::Uuid(upper));
    }
    sql.push(" AND NOT EXISTS (SELECT 1 FROM ")
        .ident(cells_table)
        .push(" c WHERE c.")
        .ident("row_key")
        .push(" = t.")
        .ident("row_key")
        .push(" AND c.")
        .ident("column_name")
        .in_list(runtime.def.columns.iter().map(|c| Value::Text(c.clone())))
        .push(")");
    Ok(backend
        .fetch(&sql, &[ColType::Uuid])
        .await?
        .into_iter()
        .filter_map(|row| row.into_iter().next().and_then(|v| v.as_uuid()))
        .collect())
}

/// The stored rows of `rows` in `runtime`'s table on each of `targets`.
async fn read_stored(
    topology: &Topology,
    runtime: &IndexRuntime,
    targets: &[usize],
    rows: &[Uuid],
) -> Result<HashMap<(usize, Uuid), Stored>> {
    let index = &runtime.def;
    let mut names: Vec<String> = vec!["row_key".into(), ddl::INDEX_SHARD_COLUMN.into()];
    names.extend(index.fields.iter().map(|f| f.name.clone()));
    names.extend(index.columns.iter().map(|c| ddl::ref_column(c)));
    names.push("_updated_at".into());
    let mut types = vec![ColType::Uuid, ColType::Int];
    types.extend(index.fields.iter().map(|f| col_type(f.ty)));
    types.extend(index.columns.iter().map(|_| ColType::Int));
    types.push(ColType::DateTime);
    let mut pages = Vec::new();
    for &target in targets {
        for part in rows.chunks(KEYS_PER_STATEMENT) {
            pages.push(read_page(topology, &runtime.table, &names, &types, target, part).await?);
        }
    }
    let mut stored = HashMap::new();
    for (target, page) in pages {
        for row in page {
            let mut row = row.into_iter();
            let Some(Value::Uuid(row_key)) = row.next() else {
                continue;
            };
            let shard = row.next().and_then(|v| v.as_int()).map(|s| s as u32);
            let fields: Vec<Value> = row.by_ref().take(index.fields.len()).collect();
            let refs: Vec<Option<i64>> = row
                .by_ref()
                .take(index.columns.len())
                .map(|v| v.as_int())
                .collect();
            let updated_at = row.next().unwrap_or(Value::Null(ColType::DateTime));
            stored.insert(
                (target, row_key),
                Stored {
                    shard,
                    fields,
                    refs,
                    updated_at,
                },
            );
        }
    }
    Ok(stored)
}

/// The rows of `part` in `table` on cluster `target`.
async fn read_page(
    topology: &Topology,
    table: &str,
    names: &[String],
    types: &[ColType],
    target: usize,
    part: &[Uuid],
) -> Result<(usize, Vec<crate::storage::Row>)> {
    let backend = topology.clusters[target].maintenance()?;
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(names.iter().map(String::as_str))
        .push(" FROM ")
        .ident(table)
        .push(" WHERE ")
        .ident("row_key")
        .in_list(part.iter().map(|r| Value::Uuid(*r)));
    Ok((target, backend.fetch(&sql, types).await?))
}

/// Whether a live stored row is the expected entry.
fn same(expected: &Entry, stored: &Stored) -> bool {
    expected.shard == stored.shard
        && expected.refs == stored.refs
        && expected.fields.len() == stored.fields.len()
        && expected
            .fields
            .iter()
            .zip(&stored.fields)
            .all(|(a, b)| same_value(a, b))
}

fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Null(_), Value::Null(_)) => true,
        _ => a == b,
    }
}

/// An entry as JSON for the report: its fields by name, `_shard` and the
/// source ref keys as `_ref_<column>`.
fn entry_json(
    runtime: &IndexRuntime,
    shard: Option<u32>,
    fields: &[Value],
    refs: &[Option<i64>],
) -> serde_json::Value {
    let mut object = serde_json::Map::new();
    object.insert("_shard".into(), shard.into());
    for (field, value) in runtime.def.fields.iter().zip(fields) {
        object.insert(field.name.clone(), value_json(value));
    }
    for (column, r) in runtime.def.columns.iter().zip(refs) {
        object.insert(ddl::ref_column(column), r.map(|r| r.to_string()).into());
    }
    serde_json::Value::Object(object)
}

fn value_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::Null(_) => J::Null,
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::String(i.to_string()),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Value::Text(s) => J::String(s.clone()),
        Value::Bytes(b) => J::String(hex_text(b)),
        Value::Uuid(u) => J::String(u.to_string()),
        Value::DateTime(t) => J::String(t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)),
        Value::Array(_, values) => J::Array(values.iter().map(value_json).collect()),
    }
}

fn hex_text(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
        let rows = backend.fetch(&sql, &[ColType::Int]).await?;
        cells += rows
            .iter()
            .filter_map(|r| r.first().and_then(Value::as_int))
            .map(i64::abs)
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
    let rows = backend.fetch(&sql, &[ColType::Text]).await?;
    Ok(rows
        .into_iter()
        .next()
        .and_then(|row| row.into_iter().next())
        .and_then(|v| v.as_text().and_then(|t| serde_json::from_str(t).ok())))
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

/// Mismatches a [`VerifyStatus`] keeps (all of them go to the run's
/// callback and the log).
pub(crate) const KEPT_DRIFT: usize = 100;

/// Where a verify run started in this process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyState {
    Running,
    Done,
    Failed,
}

/// A verify run started in this process (by the admin API or the
/// schedule), as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyStatus {
    pub datastore: String,
    pub state: VerifyState,
    /// Started by the schedule (a sampled verify), not by a person.
    pub scheduled: bool,
    pub repair: bool,
    pub sample: Option<u32>,
    pub progress: VerifyProgress,
    /// The first 100 mismatches.
    pub drift: Vec<Drift>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

/// Verify counters of one datastore in this process, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyTotals {
    /// Runs finished (scheduled or asked for).
    pub runs: u64,
    /// Runs that stopped on an error.
    pub failed: u64,
    pub missing: u64,
    pub stale: u64,
    pub extra: u64,
    pub repaired: u64,
    /// Mismatches found by the latest finished run.
    pub last_drift: u64,
}

/// The verify runs of this process: at most one per datastore at a time.
#[derive(Default)]
pub(crate) struct Verifier {
    runs: std::sync::Mutex<HashMap<String, VerifyStatus>>,
    totals: std::sync::Mutex<HashMap<String, VerifyTotals>>,
}

impl Verifier {
    /// Records a new run of `datastore`; false when one is running.
    pub(crate) fn begin(&self, datastore: &str, options: &VerifyOptions, scheduled: bool) -> bool {
        let mut runs = self.runs.lock().expect("verify runs");
        if runs
            .get(datastore)
            .is_some_and(|r| r.state == VerifyState::Running)
        {
            return false;
        }
        runs.insert(
            datastore.to_string(),
            VerifyStatus {
                datastore: datastore.to_string(),
                state: VerifyState::Running,
                scheduled,
                repair: options.repair,
                sample: options.sample,
                progress: VerifyProgress::default(),
                drift: Vec::new(),
                started_at: Utc::now(),
                finished_at: None,
                error: None,
            },
        );
        true
    }

    pub(crate) fn progress(&self, datastore: &str, progress: &VerifyProgress) {
        if let Some(run) = self.runs.lock().expect("verify runs").get_mut(datastore) {
            run.progress = progress.clone();
        }
    }

    pub(crate) fn drift(&self, datastore: &str, drift: &Drift) {
        tracing::warn!(
            datastore,
            index = %drift.index,
            row_key = %drift.row_key,
            shard = drift.shard,
            cluster = %drift.cluster,
            repaired = drift.repaired,
            "index entry {}",
            drift.kind.as_str()
        );
        if let Some(run) = self.runs.lock().expect("verify runs").get_mut(datastore) {
            if run.drift.len() < KEPT_DRIFT {
                run.drift.push(drift.clone());
            }
        }
    }

    pub(crate) fn finish(&self, datastore: &str, outcome: &Result<VerifyReport>) {
        let mut totals = self.totals.lock().expect("verify totals");
        let total = totals.entry(datastore.to_string()).or_default();
        total.runs += 1;
        if let Some(run) = self.runs.lock().expect("verify runs").get_mut(datastore) {
            run.finished_at = Some(Utc::now());
            match outcome {
                Ok(report) => {
                    run.state = VerifyState::Done;
                    run.progress = report.progress.clone();
                    let p = &report.progress;
                    total.missing += p.missing;
                    total.stale += p.stale;
                    total.extra += p.extra;
                    total.repaired += p.repaired;
                    total.last_drift = p.drift();
                }
                Err(err) => {
                    run.state = VerifyState::Failed;
                    run.error = Some(err.client_message());
                    total.failed += 1;
                }
            }
        }
    }

    pub(crate) fn status(&self, datastore: &str) -> Option<VerifyStatus> {
        self.runs
            .lock()
            .expect("verify runs")
            .get(datastore)
            .cloned()
    }

    pub(crate) fn totals(&self, datastore: &str) -> VerifyTotals {
        self.totals
            .lock()
            .expect("verify totals")
            .get(datastore)
            .cloned()
            .unwrap_or_default()
    }
}
