//! One maintenance pass: a page of the cell log of many shards, applied to
//! every index in a handful of statements.
//!
//! A pass on cell cluster C, for a set of shards with their offsets:
//!
//! 1. reads the keys of up to [`PAGE`] log cells after the offsets, all
//!    shards in one statement (`log_keys`);
//! 2. reads the latest cells of the index columns of the touched rows, in
//!    one statement, and computes each touched row's entry per index (a
//!    row outside a partial index's `where:` predicate gets a tombstone);
//! 3. per target cluster T of the index tables, one multi-row guarded
//!    upsert per index: the entries whose shard field hashes to a shard on
//!    T, and a *tombstone* (shard field and fields NULL, ref keys set) for
//!    every other touched row, whether T holds an entry for it or not;
//! 4. advances the offsets of every consumer (index version × target
//!    cluster) with one multi-row upsert.
//!
//! On the cell's own cluster the writes of steps 3 and 4 are one
//! transaction, which first locks the maintainer's lease rows and checks
//! their fencing tokens (`leases::fence`): a process that lost its lease
//! commits nothing there. Index writes to another cluster commit first, in
//! their own transaction; a crash in between only applies the same cells
//! again.
//!
//! Those remote writes are not fenced, so every write is guarded by the
//! entry's source ref keys (stored ref keys never go backwards): a row's
//! entry or tombstone is replaced only by one computed from cells no older
//! than its own, so an older version never overwrites a newer one, whatever
//! order passes commit in. That is why a tombstone is written even where
//! no entry exists: a pass that lost its lease may still insert the row's
//! old entry on that cluster afterwards, and it must find the newer
//! tombstone there and lose to it. A pass also stops before any write once
//! the leases it runs under may have expired ([`Fence::deadline`]), so a
//! stalled process rarely gets that far.
//!
//! An entry that cannot be applied (a corrupt body, a value the database
//! refuses) holds its shard back for a few passes, then goes to the
//! datastore's quarantine table and the shard moves on.

mod statements;

pub(crate) use self::statements::read_offsets;
use self::statements::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use chrono::Utc;
use uuid::Uuid;

use super::entry::{col_type, extract_checked, Extracted};
use super::hook::{PassHook, PassPoint, PassStage};
use super::recent::Recent;
use crate::cells::{codec, latest_cells_with, log_keys, Cell};
use crate::error::{Error, Result};
use crate::leases::{self, Lease};
use crate::shards::value_shard;
use crate::storage::value::truncate_to_micros;
use crate::storage::{ddl, Backend, ColType, Dialect, Sql, Tx, Value, MAX_PARAMS};
use crate::topology::{DatastoreRuntime, IndexRuntime, Topology};

/// Log cells read per pass.
pub(crate) const PAGE: usize = 2000;

/// One consumer of the cell log: an index version writing to the index
/// table on one cluster. Its offsets are kept per cell shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Consumer {
    /// Position of the index in the datastore's indexes.
    pub(crate) index: usize,
    /// The cluster holding the index table it writes.
    pub(crate) target: usize,
    pub(crate) name: String,
}

/// The consumers of a datastore: every index × every cluster of its shards.
pub(crate) fn consumers(topology: &Topology, ds: &DatastoreRuntime) -> Vec<Consumer> {
    let clusters = ds.map().clusters();
    ds.indexes
        .iter()
        .enumerate()
        .flat_map(|(index, runtime)| {
            clusters.iter().map(move |&target| Consumer {
                index,
                target,
                name: runtime.consumer(&topology.clusters[target].name),
            })
        })
        .collect()
}

/// The entry of one row in one index.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Entry {
    pub(crate) fields: Vec<Value>,
    pub(crate) refs: Vec<Option<i64>>,
    /// The index shard; `None` when the shard field is NULL.
    pub(crate) shard: Option<u32>,
}

/// Entries to recompute: (index position, row key) → the row's shard and
/// the first cell of the page that needs the entry.
pub(crate) type Touched = BTreeMap<(usize, Uuid), (u32, i64)>;

/// Who runs the pass, for the fence.
pub(crate) struct Fence<'a> {
    pub(crate) holder: &'a str,
    pub(crate) leases: &'a [Lease],
    /// When the first of `leases` may expire, by this process's monotonic
    /// clock, less a margin: the pass writes nothing after it.
    pub(crate) deadline: Instant,
}

/// What a pass did.
#[derive(Debug, Default)]
pub(crate) struct PassResult {
    /// New offsets per consumer of the shards that moved.
    pub(crate) offsets: BTreeMap<u32, Vec<i64>>,
    /// Shards whose log was applied to its end as of the read.
    pub(crate) complete: BTreeSet<u32>,
    /// Log cells read.
    pub(crate) cells: usize,
    /// Commit-to-apply delays of the indexed cells, in microseconds.
    pub(crate) delays_us: Vec<u64>,
    /// Field values stored as NULL because a backend cannot store them.
    pub(crate) unstorable: u64,
    /// Entries moved to the quarantine by this pass.
    pub(crate) quarantined: u64,
    /// Latest cells read whose bodies were decoded, and those whose bodies
    /// came from this process's writes (`recent.rs`).
    pub(crate) bodies_decoded: u64,
    pub(crate) bodies_reused: u64,
    /// Target clusters that could not be written; their consumers did not
    /// advance.
    pub(crate) failed_targets: Vec<(usize, Error)>,
    /// The pass stopped at its lease deadline: nothing of it committed on
    /// the cell's cluster, and no offset moved.
    pub(crate) abandoned: bool,
}

/// One row's entry that could not be computed or written.
#[derive(Debug)]
struct Failure {
    index: usize,
    row_key: Uuid,
    shard: u32,
    /// The first cell of the page that needs the entry.
    added_id: i64,
    error: Error,
}

/// A pass over some shards of one cell cluster.
pub(crate) struct Pass<'a> {
    pub(crate) topology: &'a Topology,
    pub(crate) ds: &'a DatastoreRuntime,
    pub(crate) cluster: usize,
    pub(crate) consumers: &'a [Consumer],
    pub(crate) fence: Option<Fence<'a>>,
    /// Failed attempts per entry, kept by the caller across passes.
    pub(crate) attempts: &'a mut HashMap<(usize, Uuid), u32>,
    /// Attempts after which an entry goes to the quarantine.
    pub(crate) quarantine_after: u32,
    /// The test hook of the maintainer's passes.
    pub(crate) hook: Option<&'a PassHook>,
    /// Bodies this process wrote, by full key (`recent.rs`).
    pub(crate) recent: Option<&'a Recent>,
}

impl Pass<'_> {
    /// Applies the log after `offsets` (per shard, per consumer).
    pub(crate) async fn run(&mut self, offsets: &BTreeMap<u32, Vec<i64>>) -> Result<PassResult> {
        self.stage(offsets, PassStage::Start).await;
        let backend = self.topology.clusters[self.cluster].maintenance()?.clone();
        let positions: Vec<(u32, i64)> = offsets
            .iter()
            .map(|(shard, per)| (*shard, per.iter().copied().min().unwrap_or(0)))
            .collect();
        let keys = log_keys(backend.as_ref(), self.ds, &positions, PAGE).await?;
        let mut result = PassResult {
            cells: keys.len(),
            ..PassResult::default()
        };
        // With a full page the last shard read may be cut short, and the
        // shards after it were not reached.
        let cut = (keys.len() >= PAGE)
            .then(|| keys.last().map(|k| k.shard))
            .flatten();
        let mut last_read: BTreeMap<u32, i64> = BTreeMap::new();
        for key in &keys {
            last_read.insert(key.shard, key.added_id);
        }
        for (shard, _) in &positions {
            if cut.is_none_or(|c| *shard < c) {
                result.complete.insert(*shard);
            }
        }
        // Which entries to recompute, and the first cell needing each.
        let mut touched: Touched = BTreeMap::new();
        for key in &keys {
            let shard_offsets = &offsets[&key.shard];
            for (c, consumer) in self.consumers.iter().enumerate() {
                let index = &self.ds.indexes[consumer.index].def;
                if shard_offsets[c] < key.added_id && index.columns.contains(&key.column) {
                    touched
                        .entry((consumer.index, key.row_key))
                        .or_insert((key.shard, key.added_id));
                }
            }
        }
        let mut failures = Vec::new();
        let entries = self
            .compute(backend.as_ref(), &touched, &mut failures, &mut result)
            .await?;
        let targets: BTreeSet<usize> = self.consumers.iter().map(|c| c.target).collect();
        let mut written = BTreeSet::new();
        for &target in &targets {
            if target == self.cluster {
                continue;
            }
            if entries.is_empty() {
                written.insert(target);
                continue;
            }
            if self.past_deadline() {
                return Ok(self.abandon(result));
            }
            self.stage(
                offsets,
                PassStage::RemoteWrite {
                    target: self.topology.clusters[target].name.clone(),
                },
            )
            .await;
            match self.write_remote(target, &entries).await {
                Ok(true) => {
                    written.insert(target);
                }
                Ok(false) => return Ok(self.abandon(result)),
                Err(err) if err.is_transient() || err.is_retryable() => {
                    result.failed_targets.push((target, err));
                }
                Err(err) => {
                    tracing::warn!(datastore = %self.ds.name(), error = %err, "index batch refused; applying its entries one by one");
                    let Some(failed) = self.isolate(target, &entries, &touched).await? else {
                        return Ok(self.abandon(result));
                    };
                    failures.extend(failed);
                    written.insert(target);
                }
            }
        }
        let local = targets.contains(&self.cluster);
        if local {
            written.insert(self.cluster);
        }
        let now = truncate_to_micros(Utc::now());
        let (quarantine, retry) = self.classify(failures);
        let advanced = self.advance(offsets, &last_read, &written, &retry);
        if self.past_deadline() {
            return Ok(self.abandon(result));
        }
        self.stage(offsets, PassStage::LocalCommit).await;
        let first = self
            .commit_local(
                backend.as_ref(),
                local.then_some(&entries),
                offsets,
                &advanced,
                &quarantine,
                &[],
                now,
            )
            .await;
        let (quarantine, retry, advanced) = match first {
            Ok(true) => (quarantine, retry, advanced),
            Ok(false) => return Ok(self.abandon(result)),
            Err(err)
                if err.is_transient()
                    || err.is_retryable()
                    || matches!(err, Error::LeaseLost(_)) =>
            {
                return Err(err)
            }
            Err(err) => {
                tracing::warn!(datastore = %self.ds.name(), error = %err, "index batch refused; applying its entries one by one");
                let mut failures = quarantine;
                failures.extend(retry);
                let Some(failed) = self.isolate(self.cluster, &entries, &touched).await? else {
                    return Ok(self.abandon(result));
                };
                failures.extend(failed);
                let (quarantine, retry) = self.classify(failures);
                let advanced = self.advance(offsets, &last_read, &written, &retry);
                let committed = self
                    .commit_local(
                        backend.as_ref(),
                        None,
                        offsets,
                        &advanced,
                        &quarantine,
                        &[],
                        now,
                    )
                    .await?;
                if !committed {
                    return Ok(self.abandon(result));
                }
                (quarantine, retry, advanced)
            }
        };
        result.offsets = advanced;
        for failure in &retry {
            let attempt = self
                .attempts
                .entry((failure.index, failure.row_key))
                .or_insert(0);
            *attempt += 1;
            result.complete.remove(&failure.shard);
            tracing::warn!(datastore = %self.ds.name(), index = %self.ds.indexes[failure.index].def.name, row_key = %failure.row_key, attempt = *attempt, error = %failure.error, "index entry not applied; retrying");
        }
        for failure in &quarantine {
            self.attempts.remove(&(failure.index, failure.row_key));
        }
        result.quarantined = quarantine.len() as u64;
        for failure in &quarantine {
            tracing::error!(datastore = %self.ds.name(), index = %self.ds.indexes[failure.index].def.name, row_key = %failure.row_key, error = %failure.error, "index entry quarantined");
        }
        if !result.failed_targets.is_empty() {
            result.complete.clear();
        }
        let applied = Utc::now();
        for key in &keys {
            if self.ds.indexes_column(&key.column) {
                let delay = (applied - key.created_at)
                    .num_microseconds()
                    .unwrap_or(0)
                    .max(1);
                result.delays_us.push(delay as u64);
            }
        }
        Ok(result)
    }

    /// Recomputes and writes the entries `touched` (index, row → the
    /// shard and a cell position for the quarantine), outside the log: the
    /// retry of quarantined entries. The quarantine records of the entries
    /// applied, and those of `forget` (`(index name, row key)`), are
    /// removed in the transaction that writes the entries on this cluster,
    /// so a retry that fails part-way keeps them; entries that fail again
    /// are recorded again at once. Returns how many were applied.
    pub(crate) async fn reapply(
        &mut self,
        touched: &Touched,
        forget: &[(String, Uuid)],
    ) -> Result<usize> {
        let backend = self.topology.clusters[self.cluster].maintenance()?.clone();
        let mut result = PassResult::default();
        let mut failures = Vec::new();
        let entries = self
            .compute(backend.as_ref(), touched, &mut failures, &mut result)
            .await?;
        let targets: BTreeSet<usize> = self.consumers.iter().map(|c| c.target).collect();
        for &target in &targets {
            if target != self.cluster && !entries.is_empty() {
                self.write_remote(target, &entries).await?;
            }
        }
        let now = truncate_to_micros(Utc::now());
        let local = targets.contains(&self.cluster);
        let nothing = BTreeMap::new();
        let resolved = |failures: &[Failure]| -> Vec<(String, Uuid)> {
            let failed: BTreeSet<(usize, Uuid)> =
                failures.iter().map(|f| (f.index, f.row_key)).collect();
            touched
                .keys()
                .filter(|k| !failed.contains(k))
                .map(|(index, row_key)| (self.ds.indexes[*index].def.name.clone(), *row_key))
                .chain(forget.iter().cloned())
                .collect()
        };
        let first = self
            .commit_local(
                backend.as_ref(),
                local.then_some(&entries),
                &nothing,
                &nothing,
                &failures,
                &resolved(&failures),
                now,
            )
            .await;
        if let Err(err) = first {
            if err.is_transient() || err.is_retryable() {
                return Err(err);
            }
            let isolated = self.isolate(self.cluster, &entries, touched).await?;
            failures.extend(isolated.unwrap_or_default());
            self.commit_local(
                backend.as_ref(),
                None,
                &nothing,
                &nothing,
                &failures,
                &resolved(&failures),
                now,
            )
            .await?;
        }
        let failed: BTreeSet<(usize, Uuid)> =
            failures.iter().map(|f| (f.index, f.row_key)).collect();
        Ok(touched.keys().filter(|k| !failed.contains(k)).count())
    }

    /// What a pass that stopped at its lease deadline reports: the cells
    /// it read, nothing applied.
    fn abandon(&self, result: PassResult) -> PassResult {
        tracing::debug!(datastore = %self.ds.name(), "pass stopped at its lease deadline");
        PassResult {
            abandoned: true,
            offsets: BTreeMap::new(),
            complete: BTreeSet::new(),
            delays_us: Vec::new(),
            quarantined: 0,
            ..result
        }
    }

    /// True once the pass's lease deadline has passed; never for a pass
    /// without leases.
    fn past_deadline(&self) -> bool {
        self.fence
            .as_ref()
            .is_some_and(|fence| Instant::now() >= fence.deadline)
    }

    /// Awaits the test hook, if any, at `stage`.
    async fn stage(&self, offsets: &BTreeMap<u32, Vec<i64>>, stage: PassStage) {
        let Some(hook) = self.hook else {
            return;
        };
        // The consumers the pass applies the log for: those not counted
        // as caught up for it.
        let consumers = self
            .consumers
            .iter()
            .enumerate()
            .filter(|(c, _)| offsets.values().any(|per| per[*c] != i64::MAX))
            .map(|(_, consumer)| consumer.name.clone())
            .collect();
        (hook.0)(PassPoint {
            datastore: self.ds.name().to_string(),
            cluster: self.topology.clusters[self.cluster].name.clone(),
            consumers,
            stage,
        })
        .await;
    }

    /// Splits `failures` into entries to quarantine now (they failed
    /// often enough) and entries to retry, which hold their shard back.
    fn classify(&self, failures: Vec<Failure>) -> (Vec<Failure>, Vec<Failure>) {
        failures.into_iter().partition(|failure| {
            let before = self
                .attempts
                .get(&(failure.index, failure.row_key))
                .copied()
                .unwrap_or(0);
            before + 1 >= self.quarantine_after
        })
    }

    /// The offsets the pass reaches: per shard the last cell read, or just
    /// before the first cell whose entry is retried; only for consumers
    /// whose target was written.
    fn advance(
        &self,
        offsets: &BTreeMap<u32, Vec<i64>>,
        last_read: &BTreeMap<u32, i64>,
        written: &BTreeSet<usize>,
        retry: &[Failure],
    ) -> BTreeMap<u32, Vec<i64>> {
        let mut held_back: BTreeMap<u32, i64> = BTreeMap::new();
        for failure in retry {
            let limit = held_back.entry(failure.shard).or_insert(i64::MAX);
            *limit = (*limit).min(failure.added_id - 1);
        }
        let mut advanced = BTreeMap::new();
        for (shard, per) in offsets {
            let Some(&read) = last_read.get(shard) else {
                continue;
            };
            let reached = held_back.get(shard).map_or(read, |h| read.min(*h));
            let moved: Vec<i64> = self
                .consumers
                .iter()
                .zip(per)
                .map(|(consumer, &old)| {
                    if written.contains(&consumer.target) {
                        old.max(reached)
                    } else {
                        old
                    }
                })
                .collect();
            if moved != *per {
                advanced.insert(*shard, moved);
            }
        }
        advanced
    }

    /// Reads the latest cells of the touched rows and computes their
    /// entries; rows whose cells cannot be decoded become failures.
    async fn compute(
        &self,
        backend: &dyn Backend,
        touched: &Touched,
        failures: &mut Vec<Failure>,
        result: &mut PassResult,
    ) -> Result<BTreeMap<(usize, Uuid), Entry>> {
        let mut entries = BTreeMap::new();
        if touched.is_empty() {
            return Ok(entries);
        }
        let rows: Vec<Uuid> = touched
            .keys()
            .map(|(_, r)| *r)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let columns: Vec<String> = touched
            .keys()
            .flat_map(|(i, _)| self.ds.indexes[*i].def.columns.iter().cloned())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        // Only the members the touched indexes read (fields and predicates) are decoded.
        let members: BTreeSet<String> = touched
            .keys()
            .flat_map(|(i, _)| self.ds.indexes[*i].def.members())
            .map(str::to_owned)
            .collect();
        let decode_members = |body: &[u8]| codec::decode_members(body, &members).map(Arc::new);
        let reused = AtomicU64::new(0);
        let kept = |row_key: Uuid, column: &str, ref_key: i64| {
            let body = self.recent?.take(row_key, column, ref_key, &members)?;
            reused.fetch_add(1, Relaxed);
            Some(body)
        };
        let mut latest: HashMap<(Uuid, String), Cell<Arc<serde_json::Value>>> = HashMap::new();
        // Row key → (column, why its latest cell cannot be read).
        let mut corrupt: HashMap<Uuid, Vec<(String, String)>> = HashMap::new();
        for chunk in rows.chunks(MAX_PARAMS / 2) {
            for cell in
                latest_cells_with(backend, self.ds, chunk, &columns, &decode_members, &kept).await?
            {
                match cell {
                    Ok(cell) => {
                        latest.insert((cell.row_key, cell.column.clone()), cell);
                    }
                    Err(Error::CorruptBody {
                        row_key,
                        column,
                        ref_key,
                        reason,
                    }) => {
                        let why =
                            format!("cell ({row_key}, {column}, {ref_key}) is corrupt: {reason}");
                        corrupt.entry(row_key).or_default().push((column, why));
                    }
                    Err(err) => return Err(err),
                }
            }
        }
        let reused = reused.into_inner();
        result.bodies_reused += reused;
        result.bodies_decoded += (latest.len() as u64).saturating_sub(reused);
        for (&(index, row_key), &(shard, added_id)) in touched {
            let runtime = &self.ds.indexes[index];
            let bad = corrupt
                .get(&row_key)
                .and_then(|bad| bad.iter().find(|(c, _)| runtime.def.columns.contains(c)));
            if let Some((_, why)) = bad {
                failures.push(Failure {
                    index,
                    row_key,
                    shard,
                    added_id,
                    error: Error::Internal(why.clone()),
                });
                continue;
            }
            let entry = compute_entry(runtime, self.ds.def.shards, row_key, &latest, result);
            entries.insert((index, row_key), entry);
        }
        Ok(entries)
    }

    /// Writes the entries to the index tables on another cluster, in one
    /// transaction; false when the lease deadline passed before a retry
    /// (the caller checks it before the first attempt).
    async fn write_remote(
        &self,
        target: usize,
        entries: &BTreeMap<(usize, Uuid), Entry>,
    ) -> Result<bool> {
        let backend = self.topology.clusters[target].maintenance()?;
        let dialect = backend.dialect();
        let mut attempt = 0;
        crate::retry::with_retry("writing index entries", || {
            attempt += 1;
            let retry = attempt > 1;
            async move {
                if retry && self.past_deadline() {
                    return Ok(false);
                }
                let mut tx = backend.begin().await?;
                self.write_entries(tx.as_mut(), dialect, target, entries.iter())
                    .await?;
                tx.commit().await?;
                Ok(true)
            }
        })
        .await
    }

    /// After a batch was refused: writes each entry in its own (fenced)
    /// transaction and returns the ones the database refuses; `None` when
    /// the lease deadline passed first.
    async fn isolate(
        &self,
        target: usize,
        entries: &BTreeMap<(usize, Uuid), Entry>,
        touched: &Touched,
    ) -> Result<Option<Vec<Failure>>> {
        let backend = self.topology.clusters[target].maintenance()?;
        let dialect = backend.dialect();
        let fenced = target == self.cluster;
        let mut failures = Vec::new();
        for (key, entry) in entries {
            if self.past_deadline() {
                return Ok(None);
            }
            let outcome = crate::retry::with_retry("writing an index entry", || async {
                let mut tx = backend.begin().await?;
                if let (true, Some(fence)) = (fenced, &self.fence) {
                    leases::fence(tx.as_mut(), dialect, fence.holder, fence.leases).await?;
                }
                self.write_entries(tx.as_mut(), dialect, target, std::iter::once((key, entry)))
                    .await?;
                tx.commit().await
            })
            .await;
            match outcome {
                Ok(()) => {}
                Err(err) if err.is_transient() || matches!(err, Error::LeaseLost(_)) => {
                    return Err(err)
                }
                Err(err) => {
                    let (shard, added_id) = touched[key];
                    failures.push(Failure {
                        index: key.0,
                        row_key: key.1,
                        shard,
                        added_id,
                        error: err,
                    });
                }
            }
        }
        Ok(Some(failures))
    }

    /// The upserts and tombstones of every index for cluster `target`.
    async fn write_entries<'e>(
        &self,
        tx: &mut dyn Tx,
        dialect: Dialect,
        target: usize,
        entries: impl Iterator<Item = (&'e (usize, Uuid), &'e Entry)>,
    ) -> Result<()> {
        let now = Value::DateTime(truncate_to_micros(Utc::now()));
        // Per index: each row with its entry and whether it lives here
        // (else a tombstone is written).
        let mut rows: Vec<Vec<(Uuid, &Entry, bool)>> = vec![Vec::new(); self.ds.indexes.len()];
        for ((index, row_key), entry) in entries {
            let here = entry
                .shard
                .is_some_and(|s| self.ds.map().cluster_of(s) == target);
            rows[*index].push((*row_key, entry, here));
        }
        for (i, runtime) in self.ds.indexes.iter().enumerate() {
            let per_row = 3 + runtime.def.fields.len() + runtime.def.columns.len();
            for chunk in rows[i].chunks(MAX_PARAMS / per_row) {
                tx.execute(&upsert_sql(dialect, runtime, chunk, &now))
                    .await?;
            }
        }
        Ok(())
    }

    /// The transaction on the cell cluster: the fence, the local index
    /// writes, the quarantine (new records, and `resolved` ones removed)
    /// and the offsets. False when the lease deadline passed before a
    /// retry (the caller checks it before the first attempt).
    #[allow(clippy::too_many_arguments)]
    async fn commit_local(
        &self,
        backend: &dyn Backend,
        entries: Option<&BTreeMap<(usize, Uuid), Entry>>,
        before: &BTreeMap<u32, Vec<i64>>,
        offsets: &BTreeMap<u32, Vec<i64>>,
        quarantine: &[Failure],
        resolved: &[(String, Uuid)],
        now: chrono::DateTime<Utc>,
    ) -> Result<bool> {
        let nothing = entries.is_none_or(BTreeMap::is_empty)
            && offsets.is_empty()
            && quarantine.is_empty()
            && resolved.is_empty();
        if nothing {
            return Ok(true);
        }
        let dialect = backend.dialect();
        let mut attempt = 0;
        crate::retry::with_retry("applying index entries", || {
            attempt += 1;
            let retry = attempt > 1;
            async move {
                if retry && self.past_deadline() {
                    return Ok(false);
                }
                let mut tx = backend.begin().await?;
                if let Some(fence) = &self.fence {
                    leases::fence(tx.as_mut(), dialect, fence.holder, fence.leases).await?;
                }
                if let Some(entries) = entries {
                    self.write_entries(tx.as_mut(), dialect, self.cluster, entries.iter())
                        .await?;
                }
                // As many terms as a retry of the quarantine deleted at once.
                for chunk in resolved.chunks(500) {
                    tx.execute(&forget_sql(dialect, self.ds, chunk)).await?;
                }
                if !quarantine.is_empty() {
                    let sql =
                        quarantine_sql(dialect, self.ds, quarantine, self.quarantine_after, now);
                    tx.execute(&sql).await?;
                }
                write_offsets(
                    tx.as_mut(),
                    dialect,
                    self.ds,
                    self.consumers,
                    before,
                    offsets,
                    now,
                )
                .await?;
                tx.commit().await?;
                Ok(true)
            }
        })
        .await
    }
}

/// The entry of `row_key` in `index` from the latest cells.
pub(crate) fn compute_entry(
    runtime: &IndexRuntime,
    shards: u32,
    row_key: Uuid,
    latest: &HashMap<(Uuid, String), Cell<Arc<serde_json::Value>>>,
    result: &mut PassResult,
) -> Entry {
    entry_from(
        runtime,
        shards,
        |column| {
            latest
                .get(&(row_key, column.to_owned()))
                .map(|cell| (cell.ref_key, &*cell.body))
        },
        result,
    )
}

/// The entry of a row in `index` from its latest cells, given by
/// `latest_of`: the ref key and body of the row's latest cell of a column.
/// The one function the maintainer and the verify compute entries with.
pub(crate) fn entry_from<'a>(
    runtime: &IndexRuntime,
    shards: u32,
    latest_of: impl Fn(&str) -> Option<(i64, &'a serde_json::Value)>,
    result: &mut PassResult,
) -> Entry {
    let index = &runtime.def;
    let refs = index
        .columns
        .iter()
        .map(|column| latest_of(column).map(|(ref_key, _)| ref_key))
        .collect();
    let body_of = |column: &str| latest_of(column).map(|(_, body)| body);
    if !index.predicate.as_ref().is_none_or(|p| p.matches(body_of)) {
        return Entry {
            fields: index
                .fields
                .iter()
                .map(|field| Value::Null(col_type(field.ty)))
                .collect(),
            refs,
            shard: None,
        };
    }
    let fields: Vec<Value> = index
        .fields
        .iter()
        .map(|field| {
            let null = Value::Null(col_type(field.ty));
            match body_of(&field.column) {
                None => null,
                Some(body) => match extract_checked(body, field) {
                    Extracted::Value(value) => value,
                    Extracted::Missing => null,
                    Extracted::Unstorable(_) => {
                        result.unstorable += 1;
                        null
                    }
                },
            }
        })
        .collect();
    let shard = value_shard(&fields[index.shard_field], shards);
    Entry {
        fields,
        refs,
        shard,
    }
}
