//! Index maintenance, driven by the cell log.
//!
//! Index entries are written after the cell commit, never in the same
//! transaction. Per cell shard, each index has a persisted offset (the last
//! `added_id` applied, in the shard's `_offsets` table under the consumer
//! name `index:<name>`). The maintainer reads the log after the smallest
//! offset, recomputes the entries of the rows it touched from the *latest*
//! cells of the index's columns, writes them, and then advances locators and
//! offsets in one transaction on the cell shard. A crash anywhere in between
//! leaves the offset behind, so the same cells are applied again on restart;
//! every step is idempotent. A new index starts at offset 0 and so backfills
//! itself from the log.
//!
//! An entry carries the ref key of each column's cell it came from, and an
//! update is applied only if no ref key goes backwards, so an older version
//! never overwrites a newer one even with several maintainers running. Each
//! row's `_locator` entry (kept in the row's own cell shard) records the
//! index shard that holds its entry: when a new version changes the shard
//! field, the entry is deleted from the old shard and written to the new one.
//!
//! Writes wake the maintainer with the shard they touched; on start every
//! existing shard is checked, which is how a crash is repaired.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::Utc;
use index_dsl::Index;
use tokio::sync::mpsc;
use uuid::Uuid;

use super::entry::{col_type, extract};
use crate::cells::{Cell, LogKey};
use crate::error::Result;
use crate::shards::value_shard;
use crate::storage::{ddl, ColType, Sql, Tx, Value};
use crate::store::{DatastoreRuntime, Inner, Store};

/// Cells read from the log per step.
const PAGE: u32 = 500;

/// Shards maintained at once.
const CONCURRENCY: usize = 4;

/// How far behind the log one shard's indexes are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLag {
    pub shard: u32,
    /// Cells written but not yet applied to every index.
    pub pending_cells: i64,
    /// Age of the oldest unapplied cell, in milliseconds (0 when caught up).
    pub lag_ms: u64,
}

/// Delay quantiles `(quantile, microseconds)` and the sample count.
pub(crate) type DelayQuantiles = (Vec<(f64, u64)>, u64);

/// Held while one cell shard is being maintained in this process.
type ShardLock = Arc<tokio::sync::Mutex<()>>;

/// The maintainer's shared state: its wake-up queue, per-shard locks, and a
/// histogram of apply delays.
pub(crate) struct Maintainer {
    wake: mpsc::UnboundedSender<(String, u32)>,
    /// Shards sent to the task and not yet started.
    queued: Mutex<std::collections::HashSet<(String, u32)>>,
    locks: Mutex<HashMap<(String, u32), ShardLock>>,
    /// Per shard, when the oldest write not yet applied was noted.
    pending: Mutex<HashMap<(String, u32), chrono::DateTime<Utc>>>,
    /// Apply delays since start, for metrics.
    delays_total_us: Mutex<hdrhistogram::Histogram<u64>>,
    delays_us: Mutex<hdrhistogram::Histogram<u64>>,
}

impl Maintainer {
    pub(crate) fn new() -> (Maintainer, mpsc::UnboundedReceiver<(String, u32)>) {
        let (wake, wakeups) = mpsc::unbounded_channel();
        let maintainer = Maintainer {
            wake,
            queued: Mutex::new(std::collections::HashSet::new()),
            locks: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            delays_total_us: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                    .expect("valid histogram bounds"),
            ),
            delays_us: Mutex::new(
                hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3)
                    .expect("valid histogram bounds"),
            ),
        };
        (maintainer, wakeups)
    }

    /// Asks the background task to bring `shard` up to date.
    pub(crate) fn wake(&self, datastore: &str, shard: u32) {
        let key = (datastore.to_string(), shard);
        if self.queued.lock().expect("queued set").insert(key.clone()) {
            // The receiver is gone only while the store shuts down.
            let _ = self.wake.send(key);
        }
    }

    /// Records that `shard` has a committed write the indexes have not seen.
    pub(crate) fn note_write(&self, datastore: &str, shard: u32) {
        self.pending
            .lock()
            .expect("pending map")
            .entry((datastore.to_string(), shard))
            .or_insert_with(Utc::now);
    }

    /// Forgets the pending mark of `shard` if it is older than `caught_up`,
    /// the moment the maintainer found the log empty.
    fn caught_up(&self, datastore: &str, shard: u32, caught_up: chrono::DateTime<Utc>) {
        let mut pending = self.pending.lock().expect("pending map");
        let key = (datastore.to_string(), shard);
        if pending.get(&key).is_some_and(|noted| *noted <= caught_up) {
            pending.remove(&key);
        }
    }

    /// Delay quantiles since start and the currently lagging shards.
    pub(crate) fn snapshot(&self) -> (DelayQuantiles, Vec<(String, u32, u64)>) {
        let histogram = self.delays_total_us.lock().expect("histogram");
        let quantiles = [0.5, 0.9, 0.99, 1.0]
            .into_iter()
            .map(|q| (q, histogram.value_at_quantile(q)))
            .collect();
        let now = Utc::now();
        let mut lagging: Vec<(String, u32, u64)> = self
            .pending
            .lock()
            .expect("pending map")
            .iter()
            .map(|((ds, shard), since)| {
                (
                    ds.clone(),
                    *shard,
                    (now - *since).num_milliseconds().max(0) as u64,
                )
            })
            .collect();
        lagging.sort();
        ((quantiles, histogram.len()), lagging)
    }

    fn dequeue(&self, datastore: &str, shard: u32) {
        self.queued
            .lock()
            .expect("queued set")
            .remove(&(datastore.to_string(), shard));
    }

    fn lock(&self, datastore: &str, shard: u32) -> ShardLock {
        self.locks
            .lock()
            .expect("maintainer locks")
            .entry((datastore.to_string(), shard))
            .or_default()
            .clone()
    }
}

/// The background task: one worker per woken shard, at most
/// [`CONCURRENCY`] at a time, until the store is dropped. A shard woken
/// again while it is queued is not queued twice; one woken while it is being
/// maintained runs once more afterwards and picks up the new cells.
pub(crate) async fn run(store: Weak<Inner>, mut wakeups: mpsc::UnboundedReceiver<(String, u32)>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(CONCURRENCY));
    while let Some((datastore, shard)) = wakeups.recv().await {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let Some(inner) = store.upgrade() else { return };
        let weak = store.clone();
        tokio::spawn(async move {
            let _permit = permit;
            inner.maintainer.dequeue(&datastore, shard);
            let handle = Store { inner };
            if let Err(err) = handle.maintain_shard(&datastore, shard).await {
                tracing::warn!(%datastore, shard, error = %err, "index maintenance failed; retrying");
                drop(handle);
                tokio::time::sleep(Duration::from_secs(1)).await;
                if let Some(inner) = weak.upgrade() {
                    inner.maintainer.wake(&datastore, shard);
                }
            }
        });
    }
}

fn consumer(index: &Index) -> String {
    format!("index:{}", index.name)
}

/// A computed index entry for one row.
struct Entry {
    fields: Vec<Value>,
    refs: Vec<Option<i64>>,
}

/// What to do in one index shard.
#[derive(Default)]
struct ShardWork {
    deletes: Vec<(usize, Uuid)>,
    upserts: Vec<(usize, Uuid, Entry)>,
}

impl Store {
    /// Applies every unindexed cell of every existing shard; returns when
    /// all indexes have caught up with the log as it was at the call.
    pub async fn sync_indexes(&self) -> Result<()> {
        let mut names: Vec<String> = self.inner.datastores.keys().cloned().collect();
        names.sort();
        for name in names {
            for shard in self.existing_shards(&name).await? {
                self.maintain_shard(&name, shard).await?;
            }
        }
        Ok(())
    }

    /// How far each existing shard's indexes are behind its log.
    pub async fn index_lag(&self, datastore: &str) -> Result<Vec<ShardLag>> {
        let ds = self.datastore(datastore)?;
        let mut lags = Vec::new();
        if ds.def.indexes.is_empty() {
            return Ok(lags);
        }
        for shard in self.existing_shards(datastore).await? {
            let offsets = self.read_offsets(&ds, shard).await?;
            let applied = offsets.iter().copied().min().unwrap_or(0);
            let head = self.max_added_id(&ds, shard).await?;
            let lag_ms = if head > applied {
                let oldest = self.log_keys_after(&ds, shard, applied, 1).await?;
                oldest.first().map_or(0, |c| {
                    (Utc::now() - c.created_at).num_milliseconds().max(0) as u64
                })
            } else {
                0
            };
            lags.push(ShardLag {
                shard,
                pending_cells: (head - applied).max(0),
                lag_ms,
            });
        }
        Ok(lags)
    }

    /// Delay between a cell's commit and its index update, as
    /// `(p50, p99, samples)` in microseconds since the last call.
    pub fn take_index_delays(&self) -> (u64, u64, u64) {
        let mut histogram = self.inner.maintainer.delays_us.lock().expect("histogram");
        let result = (
            histogram.value_at_quantile(0.5),
            histogram.value_at_quantile(0.99),
            histogram.len(),
        );
        histogram.reset();
        result
    }

    /// Brings the indexes of one cell shard up to date with its log.
    pub(crate) async fn maintain_shard(&self, datastore: &str, shard: u32) -> Result<()> {
        let ds = self.datastore(datastore)?;
        if ds.def.indexes.is_empty() {
            return Ok(());
        }
        let lock = self.inner.maintainer.lock(datastore, shard);
        let _guard = lock.lock().await;
        self.ensure_shard(&ds, shard).await?;
        let mut offsets = self.read_offsets(&ds, shard).await?;
        loop {
            let from = offsets.iter().copied().min().unwrap_or(0);
            let started = Utc::now();
            let cells = self.log_keys_after(&ds, shard, from, PAGE).await?;
            let Some(last) = cells.last().map(|c| c.added_id) else {
                self.inner.maintainer.caught_up(datastore, shard, started);
                return Ok(());
            };
            self.apply_page(&ds, shard, &offsets, &cells).await?;
            for offset in offsets.iter_mut() {
                *offset = (*offset).max(last);
            }
            let now = Utc::now();
            let mut delays = self.inner.maintainer.delays_us.lock().expect("histogram");
            let indexed =
                |c: &&LogKey| ds.def.indexes.iter().any(|i| i.columns.contains(&c.column));
            let mut totals = self
                .inner
                .maintainer
                .delays_total_us
                .lock()
                .expect("histogram");
            for cell in cells.iter().filter(indexed) {
                let delay = (now - cell.created_at)
                    .num_microseconds()
                    .unwrap_or(0)
                    .max(1) as u64;
                let _ = delays.record(delay);
                let _ = totals.record(delay);
            }
        }
    }

    /// The applied offset of each index of `ds` in `shard` (0 when absent).
    async fn read_offsets(&self, ds: &DatastoreRuntime, shard: u32) -> Result<Vec<i64>> {
        let master = self.master(ds, shard);
        let mut sql = Sql::new(master.dialect());
        sql.push("SELECT ")
            .ident("consumer")
            .push(", ")
            .ident("added_id")
            .push(" FROM ")
            .ident(&ddl::offsets_table(&ds.def.name, shard));
        let rows = master.fetch(&sql, &[ColType::Text, ColType::Int]).await?;
        let stored: HashMap<String, i64> = rows
            .into_iter()
            .filter_map(|row| Some((row[0].as_text()?.to_string(), row[1].as_int()?)))
            .collect();
        Ok(ds
            .def
            .indexes
            .iter()
            .map(|index| stored.get(&consumer(index)).copied().unwrap_or(0))
            .collect())
    }

    /// Applies one page of log cells to the indexes still behind them.
    async fn apply_page(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        offsets: &[i64],
        cells: &[LogKey],
    ) -> Result<()> {
        let indexes = &ds.def.indexes;
        let mut affected: BTreeSet<(usize, Uuid)> = BTreeSet::new();
        for cell in cells {
            for (i, index) in indexes.iter().enumerate() {
                if offsets[i] < cell.added_id && index.columns.contains(&cell.column) {
                    affected.insert((i, cell.row_key));
                }
            }
        }
        let last = cells.last().map_or(0, |c| c.added_id);
        let mut locator_changes: Vec<(usize, Uuid, Option<u32>)> = Vec::new();
        let mut work: BTreeMap<u32, ShardWork> = BTreeMap::new();
        if !affected.is_empty() {
            let rows: Vec<Uuid> = affected
                .iter()
                .map(|(_, r)| *r)
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let columns: Vec<String> = affected
                .iter()
                .flat_map(|(i, _)| indexes[*i].columns.iter().cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            let mut latest: HashMap<(Uuid, String), Cell> = HashMap::new();
            for cell in self.latest_in_shard(ds, shard, &rows, &columns).await? {
                match cell {
                    Ok(cell) => {
                        latest.insert((cell.row_key, cell.column.clone()), cell);
                    }
                    Err(err) => {
                        tracing::error!(datastore = %ds.def.name, shard, error = %err, "cell skipped by index maintenance");
                    }
                }
            }
            let located = self.read_locators(ds, shard, &rows).await?;
            for &(i, row) in &affected {
                let index = &indexes[i];
                let entry = compute_entry(index, row, &latest);
                let target = value_shard(&entry.fields[index.shard_field], ds.def.shards);
                let previous = located.get(&(index.name.clone(), row)).copied();
                if let Some(old) = previous.filter(|old| Some(*old) != target) {
                    work.entry(old).or_default().deletes.push((i, row));
                }
                if let Some(target) = target {
                    work.entry(target)
                        .or_default()
                        .upserts
                        .push((i, row, entry));
                }
                if previous != target {
                    locator_changes.push((i, row, target));
                }
            }
            for &index_shard in work.keys() {
                self.ensure_shard(ds, index_shard).await?;
            }
        }
        let master = self.master(ds, shard);
        let cluster = ds.map.cluster_of(shard);
        if work.keys().all(|s| ds.map.cluster_of(*s) == cluster) {
            // Everything lives on the cell shard's database (always, with one
            // cluster): entries, locators and offsets commit together.
            let mut attempt = 0;
            loop {
                let mut tx = master.begin().await?;
                let mut result = Ok(());
                for (&index_shard, shard_work) in &work {
                    result =
                        apply_in_tx(tx.as_mut(), master.dialect(), ds, index_shard, shard_work)
                            .await;
                    if result.is_err() {
                        break;
                    }
                }
                if result.is_ok() {
                    result = write_progress(
                        tx.as_mut(),
                        master.dialect(),
                        ds,
                        shard,
                        &locator_changes,
                        offsets,
                        last,
                    )
                    .await;
                }
                match result {
                    Ok(()) => return tx.commit().await,
                    Err(err) if err.is_retryable() && attempt < 8 => {
                        attempt += 1;
                        crate::store::backoff(attempt).await;
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        for (&index_shard, shard_work) in &work {
            self.apply_shard_work(ds, index_shard, shard_work).await?;
        }
        // Locators and offsets move together, on the cell shard.
        let mut tx = master.begin().await?;
        write_progress(
            tx.as_mut(),
            master.dialect(),
            ds,
            shard,
            &locator_changes,
            offsets,
            last,
        )
        .await?;
        tx.commit().await
    }

    /// Which index shard holds each row's entry, per index name.
    async fn read_locators(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        rows: &[Uuid],
    ) -> Result<HashMap<(String, Uuid), u32>> {
        let master = self.master(ds, shard);
        let mut located = HashMap::new();
        for chunk in rows.chunks(200) {
            let mut sql = Sql::new(master.dialect());
            sql.push("SELECT ")
                .ident("index_name")
                .push(", ")
                .ident("row_key")
                .push(", ")
                .ident("index_shard")
                .push(" FROM ")
                .ident(&ddl::locator_table(&ds.def.name, shard))
                .push(" WHERE ")
                .ident("row_key")
                .push(" IN ")
                .bind_list(chunk.iter().map(|r| Value::Uuid(*r)));
            let cols = [ColType::Text, ColType::Uuid, ColType::Int];
            for row in master.fetch(&sql, &cols).await? {
                if let (Some(name), Some(row_key), Some(target)) =
                    (row[0].as_text(), row[1].as_uuid(), row[2].as_int())
                {
                    located.insert((name.to_string(), row_key), target as u32);
                }
            }
        }
        Ok(located)
    }

    /// Deletes and upserts entries in one index shard, in one transaction.
    async fn apply_shard_work(
        &self,
        ds: &DatastoreRuntime,
        index_shard: u32,
        work: &ShardWork,
    ) -> Result<()> {
        self.ensure_shard(ds, index_shard).await?;
        let master = self.master(ds, index_shard);
        let mut attempt = 0;
        loop {
            let mut tx = master.begin().await?;
            let result = apply_in_tx(tx.as_mut(), master.dialect(), ds, index_shard, work).await;
            match result {
                Ok(()) => return tx.commit().await,
                Err(err) if err.is_retryable() && attempt < 8 => {
                    attempt += 1;
                    crate::store::backoff(attempt).await;
                }
                Err(err) => return Err(err),
            }
        }
    }
}

/// Records the new locators and advances the offsets of the indexes that
/// were behind `last`, inside the caller's transaction on the cell shard.
async fn write_progress(
    tx: &mut dyn Tx,
    dialect: crate::storage::Dialect,
    ds: &DatastoreRuntime,
    shard: u32,
    locator_changes: &[(usize, Uuid, Option<u32>)],
    offsets: &[i64],
    last: i64,
) -> Result<()> {
    let indexes = &ds.def.indexes;
    let locator = ddl::locator_table(&ds.def.name, shard);
    for &(i, row, target) in locator_changes {
        let name = Value::Text(indexes[i].name.clone());
        let mut delete = Sql::new(dialect);
        delete
            .push("DELETE FROM ")
            .ident(&locator)
            .push(" WHERE ")
            .ident("index_name")
            .push(" = ")
            .bind(name.clone())
            .push(" AND ")
            .ident("row_key")
            .push(" = ")
            .bind(Value::Uuid(row));
        tx.execute(&delete).await?;
        if let Some(target) = target {
            let mut insert = Sql::new(dialect);
            insert
                .push("INSERT INTO ")
                .ident(&locator)
                .push(" (")
                .ident("index_name")
                .push(", ")
                .ident("row_key")
                .push(", ")
                .ident("index_shard")
                .push(") VALUES (")
                .bind(name)
                .push(", ")
                .bind(Value::Uuid(row))
                .push(", ")
                .bind(Value::Int(i64::from(target)))
                .push(")");
            tx.execute(&insert).await?;
        }
    }
    let offsets_table = ddl::offsets_table(&ds.def.name, shard);
    for (i, index) in indexes.iter().enumerate() {
        if offsets[i] >= last {
            continue;
        }
        write_offset(tx, dialect, &offsets_table, &consumer(index), last).await?;
    }
    Ok(())
}

fn compute_entry(index: &Index, row: Uuid, latest: &HashMap<(Uuid, String), Cell>) -> Entry {
    let fields = index
        .fields
        .iter()
        .map(|field| match latest.get(&(row, field.column.clone())) {
            Some(cell) => extract(&cell.body, field),
            None => Value::Null(col_type(field.ty)),
        })
        .collect();
    let refs = index
        .columns
        .iter()
        .map(|column| latest.get(&(row, column.clone())).map(|c| c.ref_key))
        .collect();
    Entry { fields, refs }
}

/// True when no ref key of `new` is older than the stored one.
fn not_older(new: &[Option<i64>], stored: &[Option<i64>]) -> bool {
    new.iter().zip(stored).all(|(n, s)| n >= s)
}

async fn apply_in_tx(
    tx: &mut dyn Tx,
    dialect: crate::storage::Dialect,
    ds: &DatastoreRuntime,
    index_shard: u32,
    work: &ShardWork,
) -> Result<()> {
    let indexes = &ds.def.indexes;
    for &(i, row) in &work.deletes {
        let mut sql = Sql::new(dialect);
        sql.push("DELETE FROM ")
            .ident(&ddl::index_table(
                &ds.def.name,
                index_shard,
                &indexes[i].name,
            ))
            .push(" WHERE ")
            .ident("row_key")
            .push(" = ")
            .bind(Value::Uuid(row));
        tx.execute(&sql).await?;
    }
    let now = Value::DateTime(crate::storage::value::truncate_to_micros(Utc::now()));
    for (i, row, entry) in &work.upserts {
        let index = &indexes[*i];
        let table = ddl::index_table(&ds.def.name, index_shard, &index.name);
        let ref_columns: Vec<String> = index.columns.iter().map(|c| ddl::ref_column(c)).collect();
        let mut select = Sql::new(dialect);
        select.push("SELECT ");
        for (j, col) in ref_columns.iter().enumerate() {
            if j > 0 {
                select.push(", ");
            }
            select.ident(col);
        }
        select
            .push(" FROM ")
            .ident(&table)
            .push(" WHERE ")
            .ident("row_key")
            .push(" = ")
            .bind(Value::Uuid(*row))
            .push(dialect.for_update());
        let types = vec![ColType::Int; ref_columns.len()];
        let stored = tx.fetch(&select, &types).await?;
        let mut sql = Sql::new(dialect);
        match stored.first() {
            Some(stored) => {
                let stored: Vec<Option<i64>> = stored.iter().map(Value::as_int).collect();
                if !not_older(&entry.refs, &stored) {
                    continue;
                }
                sql.push("UPDATE ").ident(&table).push(" SET ");
                for (field, value) in index.fields.iter().zip(&entry.fields) {
                    sql.ident(&field.name)
                        .push(" = ")
                        .bind(value.clone())
                        .push(", ");
                }
                for (col, value) in ref_columns.iter().zip(&entry.refs) {
                    sql.ident(col)
                        .push(" = ")
                        .bind(ref_value(*value))
                        .push(", ");
                }
                sql.ident("_updated_at")
                    .push(" = ")
                    .bind(now.clone())
                    .push(" WHERE ")
                    .ident("row_key")
                    .push(" = ")
                    .bind(Value::Uuid(*row));
            }
            None => {
                sql.push("INSERT INTO ")
                    .ident(&table)
                    .push(" (")
                    .ident("row_key");
                for field in &index.fields {
                    sql.push(", ").ident(&field.name);
                }
                for col in &ref_columns {
                    sql.push(", ").ident(col);
                }
                sql.push(", ").ident("_updated_at").push(") VALUES (");
                sql.bind(Value::Uuid(*row));
                for value in &entry.fields {
                    sql.push(", ").bind(value.clone());
                }
                for value in &entry.refs {
                    sql.push(", ").bind(ref_value(*value));
                }
                sql.push(", ").bind(now.clone()).push(")");
            }
        }
        tx.execute(&sql).await?;
    }
    Ok(())
}

fn ref_value(value: Option<i64>) -> Value {
    value.map_or(Value::Null(ColType::Int), Value::Int)
}

async fn write_offset(
    tx: &mut dyn Tx,
    dialect: crate::storage::Dialect,
    table: &str,
    consumer: &str,
    added_id: i64,
) -> Result<()> {
    let now = Value::DateTime(crate::storage::value::truncate_to_micros(Utc::now()));
    let mut update = Sql::new(dialect);
    update
        .push("UPDATE ")
        .ident(table)
        .push(" SET ")
        .ident("added_id")
        .push(" = ")
        .bind(Value::Int(added_id))
        .push(", ")
        .ident("updated_at")
        .push(" = ")
        .bind(now.clone())
        .push(" WHERE ")
        .ident("consumer")
        .push(" = ")
        .bind(Value::Text(consumer.to_string()));
    if tx.execute(&update).await? == 0 {
        let mut insert = Sql::new(dialect);
        insert
            .push("INSERT INTO ")
            .ident(table)
            .push(" (")
            .ident("consumer")
            .push(", ")
            .ident("added_id")
            .push(", ")
            .ident("updated_at")
            .push(") VALUES (")
            .bind(Value::Text(consumer.to_string()))
            .push(", ")
            .bind(Value::Int(added_id))
            .push(", ")
            .bind(now)
            .push(")");
        tx.execute(&insert).await?;
    }
    Ok(())
}
