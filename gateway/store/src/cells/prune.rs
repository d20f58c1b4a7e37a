//! Retention: deleting old versions of cells, the one operation that ever
//! removes a cell (SPEC §1: an explicit, rare admin operation).
//!
//! **What goes.** A version of a `(row, column)` is deletable when the
//! options allow it — `keep: N` spares the N newest versions of every
//! `(row, column)`, `created_before: T` spares versions stored at or after
//! `T`, and with both only versions *both* allow go — and nothing else
//! needs it:
//! - the latest version (highest ref key) always stays: it is what reads,
//!   index entries (`_ref_<column>`) and triggers' filters see;
//! - a cell past the lowest offset of any log consumer of its shard (index
//!   maintenance `ix:…`, trigger consumers `trig:…`, in `<ds>_offsets`)
//!   has not been read by that consumer yet and stays. The consumers of the
//!   served definitions count even before they have stored an offset (as
//!   offset 0: an index being built, a trigger not started yet), and every
//!   consumer with a stored offset counts, whether the definitions still
//!   name it or not — an index version left behind by a change holds cells
//!   until `cellgate index drop` removes its table and offsets;
//! - a cell a quarantine record names (`<ds>_quarantine`,
//!   `<ds>_trigger_quarantine`) stays, so a retry finds it;
//! - a cell with a copy in another cluster's buffer (`<ds>_buffer`) stays:
//!   copies live until the primary's replicas have the cell, and a copy
//!   whose version were pruned would be replayed as new. Read after the
//!   versions, so a copy made before the cell's commit is seen.
//!
//! **How.** Each cluster's shards are worked through in chunks of shard
//! ranges (a `(row, column)` never spans shards, so a range holds all of
//! its versions), sized so a chunk examines about [`CHUNK_CELLS`] cells.
//! A chunk is a handful of statements: the per-column counts, the
//! versions the options allow (`ROW_NUMBER()` over each `(row, column)`
//! by descending ref key), the offsets and the quarantine records of its
//! shards — then the deletes by primary key, a few thousand cells each.
//!
//! **Safe while gateways write.** The `DELETE` itself is guarded: it
//! removes a cell only if a newer version of its `(row, column)` exists
//! at that moment, no stored offset of its shard is below it (a consumer
//! rewound or started since the offsets were read) and no quarantine
//! record names it. Writes only add versions, so a version deletable when
//! read stays deletable; a new version written meanwhile only makes more
//! versions deletable on a later run. The latest version of a
//! `(row, column)` can never be deleted, whatever runs concurrently: a
//! delete needs a newer version, which then is the latest.
//!
//! A pruned version is gone from `history`, `cell` and the log; written
//! again, it is stored again (as a new, non-latest cell).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use chrono::{DateTime, Utc};

use crate::error::{Error, Result};
use crate::storage::{ddl, Backend, Dialect, Sql, Value};
use crate::topology::{DatastoreRuntime, Topology};

/// Cells a chunk aims to examine; chunks grow and shrink towards it.
const CHUNK_CELLS: u64 = 20_000;
/// Shards of the first chunk of a cluster.
const FIRST_CHUNK: u32 = 16;
const MAX_CHUNK: u32 = 1024;
/// Cells per `DELETE` statement.
const DELETE_BATCH: usize = 2000;
/// Attempts of a chunk that lost a race with writers, after the first.
const CHUNK_RETRIES: u32 = 5;

/// What to delete.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PruneOptions {
    /// Only the versions of this column (default: every column).
    pub column: Option<String>,
    /// Keep the N newest versions of every `(row, column)` (at least 1).
    pub keep: Option<u32>,
    /// Keep the versions stored at or after this time. With `keep` too,
    /// only versions both allow are deleted.
    pub created_before: Option<DateTime<Utc>>,
    /// Count what would be deleted, delete nothing.
    pub dry_run: bool,
}

/// What happened to the versions of one column (or of all).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneCounts {
    /// Cells looked at.
    pub examined: u64,
    /// Cells deleted (with `dry_run`: that would be deleted).
    pub deleted: u64,
    /// Latest versions, which always stay.
    pub kept_latest: u64,
    /// Older versions the options keep (within the newest `keep`, or
    /// stored at or after `created_before`).
    pub kept_recent: u64,
    /// Versions a log consumer has not read yet.
    pub kept_for_consumers: u64,
    /// Versions a quarantine record names.
    pub kept_for_quarantine: u64,
    /// Versions with a copy still in a buffer.
    pub kept_for_buffers: u64,
}

impl PruneCounts {
    fn add(&mut self, other: &PruneCounts) {
        self.examined += other.examined;
        self.deleted += other.deleted;
        self.kept_latest += other.kept_latest;
        self.kept_recent += other.kept_recent;
        self.kept_for_consumers += other.kept_for_consumers;
        self.kept_for_quarantine += other.kept_for_quarantine;
        self.kept_for_buffers += other.kept_for_buffers;
    }
}

/// The outcome of a prune of one datastore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PruneReport {
    pub datastore: String,
    pub dry_run: bool,
    /// Shards worked through.
    pub shards: u32,
    /// Per column that has cells in the shards worked through.
    pub columns: BTreeMap<String, PruneCounts>,
    /// The consumers whose offsets held cells back, with how many: per
    /// shard, the cells past its lowest offset count for the consumer at
    /// that offset.
    pub held_back_by: BTreeMap<String, u64>,
    /// Statements sent to the clusters' masters while the prune ran (their
    /// counters: in a process that also serves requests, theirs count too).
    pub statements: u64,
    pub elapsed_ms: u64,
}

impl PruneReport {
    /// The counts of all columns together.
    pub fn total(&self) -> PruneCounts {
        let mut total = PruneCounts::default();
        for counts in self.columns.values() {
            total.add(counts);
        }
        total
    }
}

/// How far a prune has got, after each chunk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneProgress {
    pub shards_done: u32,
    pub shards_total: u32,
    pub examined: u64,
    pub deleted: u64,
}

/// Deletes the versions of the cells of `ds` that `options` allow and
/// nothing needs (see the module doc), cluster by cluster, chunk by chunk.
pub(crate) async fn prune(
    topology: &Topology,
    ds: &DatastoreRuntime,
    options: &PruneOptions,
    on_progress: &mut (dyn FnMut(&PruneProgress) + Send),
) -> Result<PruneReport> {
    if options.keep.is_none() && options.created_before.is_none() {
        return Err(Error::BadInput(
            "say which versions to delete: keep the newest N, or delete those older than a time"
                .into(),
        ));
    }
    if options.keep == Some(0) {
        return Err(Error::BadInput(
            "keep must be at least 1: the latest version of a cell always stays".into(),
        ));
    }
    if let Some(column) = &options.column {
        ds.check_column(column)?;
    }
    let started = Instant::now();
    let expected = expected_consumers(topology, ds);
    let mut report = PruneReport {
        datastore: ds.name().to_string(),
        dry_run: options.dry_run,
        shards: 0,
        columns: BTreeMap::new(),
        held_back_by: BTreeMap::new(),
        statements: 0,
        elapsed_ms: 0,
    };
    let clusters = ds.map().clusters();
    let ranges: Vec<(usize, Vec<(u32, u32)>)> = clusters
        .iter()
        .map(|&c| (c, ds.map().ranges_of(c)))
        .collect();
    let mut progress = PruneProgress {
        shards_total: ranges
            .iter()
            .flat_map(|(_, r)| r.iter().map(|(a, b)| b - a + 1))
            .sum(),
        ..PruneProgress::default()
    };
    for (cluster, ranges) in ranges {
        let backend = topology.clusters[cluster].master()?.clone();
        // Where copies of this cluster's cells can be buffered.
        let buffers = topology
            .clusters
            .iter()
            .filter(|c| c.index != cluster)
            .map(|c| c.master().cloned())
            .collect::<Result<Vec<_>>>()?;
        let before = backend.statements();
        let mut size = FIRST_CHUNK;
        for (first, last) in ranges {
            let mut from = first;
            while from <= last {
                let to = last.min(from.saturating_add(size - 1));
                let chunk = Chunk {
                    first: from,
                    last: to,
                };
                // A chunk that loses a race with writers (a deadlock, a
                // serialization failure) is examined again: what its first
                // attempt deleted is gone and stays counted.
                let mut attempt = 0;
                let examined = loop {
                    let sources = Sources {
                        backend: backend.as_ref(),
                        buffers: &buffers,
                    };
                    match prune_chunk(sources, ds, options, &expected, chunk, &mut report).await {
                        Err(err) if err.is_retryable() && attempt < CHUNK_RETRIES => {
                            attempt += 1;
                            tracing::debug!(datastore = %ds.name(), attempt, error = %err, "prune chunk retried after a lost race");
                            crate::retry::backoff(attempt).await;
                        }
                        other => break other?,
                    }
                };
                let shards = to - from + 1;
                report.shards += shards;
                progress.shards_done += shards;
                progress.examined = report.columns.values().map(|c| c.examined).sum();
                progress.deleted = report.columns.values().map(|c| c.deleted).sum();
                on_progress(&progress);
                // Aim the next chunk at CHUNK_CELLS, changing its size at
                // most fourfold at a time.
                let wanted = (u64::from(shards) * CHUNK_CELLS / examined.max(1))
                    .clamp(u64::from(shards / 4).max(1), u64::from(shards) * 4);
                size = (wanted as u32).clamp(1, MAX_CHUNK);
                from = to + 1;
            }
        }
        report.statements += backend.statements() - before;
    }
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    Ok(report)
}

/// The log consumers the served definitions have on every shard of `ds`:
/// each index version writing to each cluster, and each trigger.
fn expected_consumers(topology: &Topology, ds: &DatastoreRuntime) -> Vec<String> {
    let mut names: Vec<String> = ds
        .indexes
        .iter()
        .flat_map(|index| {
            ds.map()
                .clusters()
                .into_iter()
                .map(|c| index.consumer(&topology.clusters[c].name))
                .collect::<Vec<_>>()
        })
        .collect();
    names.extend(
        ds.def
            .triggers
            .iter()
            .map(|t| crate::topology::trigger_consumer(&t.name)),
    );
    names
}

/// An inclusive range of shards on one cluster.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    first: u32,
    last: u32,
}

impl Chunk {
    /// Appends `<prefix>shard BETWEEN first AND last`.
    fn condition(&self, sql: &mut Sql, prefix: &str) {
        sql.push(prefix)
            .ident("shard")
            .push(" BETWEEN ")
            .bind(Value::Int(i64::from(self.first)))
            .push(" AND ")
            .bind(Value::Int(i64::from(self.last)));
    }
}

/// A version the options allow to delete.
struct Candidate {
    shard: u32,
    added_id: i64,
    column: String,
    row_key: uuid::Uuid,
    ref_key: i64,
}

/// The master of the cluster being pruned, and those of the clusters whose
/// buffers may hold copies of its cells.
#[derive(Clone, Copy)]
struct Sources<'a> {
    backend: &'a dyn Backend,
    buffers: &'a [std::sync::Arc<dyn Backend>],
}

/// Prunes one chunk into `report`; returns the cells it examined.
async fn prune_chunk(
    sources: Sources<'_>,
    ds: &DatastoreRuntime,
    options: &PruneOptions,
    expected: &[String],
    chunk: Chunk,
    report: &mut PruneReport,
) -> Result<u64> {
    let backend = sources.backend;
    let dialect = backend.dialect();
    let table = ddl::cells_table(ds.name());
    let only_column = |sql: &mut Sql, prefix: &str| {
        if let Some(column) = &options.column {
            sql.push(" AND ")
                .push(prefix)
                .ident("column_name")
                .push(" = ")
                .bind(Value::Text(column.clone()));
        }
    };

    // Per column: the cells, and the (row, column)s, whose latest versions
    // always stay.
    let mut sql = Sql::new(dialect);
    sql.push("SELECT ")
        .ident("column_name")
        .push(", COUNT(*), COUNT(DISTINCT ")
        .ident("row_key")
        .push(") FROM ")
        .ident(&table)
        .push(" WHERE ");
    chunk.condition(&mut sql, "");
    only_column(&mut sql, "");
    sql.push(" GROUP BY ").ident("column_name");
    let mut counts: BTreeMap<String, PruneCounts> = BTreeMap::new();
    let mut examined = 0;
    for (column, cells, latest) in backend.rows::<(String, i64, i64)>(&sql).await? {
        examined += cells as u64;
        counts.insert(
            column,
            PruneCounts {
                examined: cells as u64,
                kept_latest: latest as u64,
                ..PruneCounts::default()
            },
        );
    }
    if examined == 0 {
        return Ok(0);
    }

    // The versions the options allow: past the newest `keep` (or past the
    // latest) of their (row, column), and older than `created_before`.
    let mut sql = Sql::new(dialect);
    sql.push("SELECT ")
        .idents(["shard", "added_id", "column_name", "row_key", "ref_key"])
        .push(" FROM (SELECT ")
        .idents([
            "shard",
            "added_id",
            "column_name",
            "row_key",
            "ref_key",
            "created_at",
        ])
        .push(", ROW_NUMBER() OVER (PARTITION BY ")
        .idents(["row_key", "column_name"])
        .push(" ORDER BY ")
        .ident("ref_key")
        .push(" DESC) AS ")
        .ident("version")
        .push(" FROM ")
        .ident(&table)
        .push(" WHERE ");
    chunk.condition(&mut sql, "");
    only_column(&mut sql, "");
    sql.push(") v WHERE v.")
        .ident("version")
        .push(" > ")
        .bind(Value::Int(i64::from(options.keep.unwrap_or(1))));
    if let Some(before) = options.created_before {
        sql.push(" AND v.")
            .ident("created_at")
            .push(" < ")
            .bind(Value::DateTime(before));
    }
    let candidates: Vec<Candidate> = backend
        .rows::<(i64, i64, String, uuid::Uuid, i64)>(&sql)
        .await?
        .into_iter()
        .map(|(shard, added_id, column, row_key, ref_key)| Candidate {
            shard: shard as u32,
            added_id,
            column,
            row_key,
            ref_key,
        })
        .collect();
    let allowed: HashMap<&str, u64> = candidates.iter().fold(HashMap::new(), |mut m, c| {
        *m.entry(c.column.as_str()).or_default() += 1;
        m
    });
    for (column, c) in counts.iter_mut() {
        let allowed = allowed.get(column.as_str()).copied().unwrap_or(0);
        c.kept_recent = c.examined.saturating_sub(c.kept_latest + allowed);
    }

    let mut deletable: BTreeMap<u32, Vec<(i64, String)>> = BTreeMap::new();
    if !candidates.is_empty() {
        let floors = floors(backend, ds, expected, chunk).await?;
        let quarantined = quarantined(backend, ds, chunk).await?;
        let buffered = buffered(sources.buffers, ds, chunk).await?;
        for candidate in candidates {
            let column = counts.entry(candidate.column.clone()).or_default();
            if quarantined.contains(&(candidate.shard, candidate.added_id)) {
                column.kept_for_quarantine += 1;
                continue;
            }
            let key = (
                candidate.row_key,
                candidate.column.clone(),
                candidate.ref_key,
            );
            if buffered.contains(&key) {
                column.kept_for_buffers += 1;
                continue;
            }
            if let Some((floor, consumer)) = floors.get(&candidate.shard) {
                if candidate.added_id > *floor {
                    column.kept_for_consumers += 1;
                    *report.held_back_by.entry(consumer.clone()).or_default() += 1;
                    continue;
                }
            }
            deletable
                .entry(candidate.shard)
                .or_default()
                .push((candidate.added_id, candidate.column));
        }
    }

    for batch in batches(&deletable, dialect.max_or_terms()) {
        let attempted = batch.iter().map(|(_, ids)| ids.len()).sum::<usize>() as u64;
        let deleted = if options.dry_run {
            attempted
        } else {
            backend.execute(&delete_sql(dialect, ds, &batch)).await?
        };
        let mut still = BTreeSet::new();
        if deleted < attempted {
            // A guard kept some (a consumer rewound or started, a
            // quarantine record written since the reads): find which.
            still = present(backend, ds, &batch).await?;
        }
        for (shard, ids) in &batch {
            for (added_id, column) in ids.iter() {
                let counts = counts.entry(column.clone()).or_default();
                if still.contains(&(*shard, *added_id)) {
                    counts.kept_for_consumers += 1;
                } else {
                    counts.deleted += 1;
                }
            }
        }
    }

    for (column, c) in counts {
        report.columns.entry(column).or_default().add(&c);
    }
    Ok(examined)
}

/// Per shard of `chunk`, the lowest offset of its consumers and the
/// consumer holding it; shards without consumers are left out. Consumers
/// the definitions name count as 0 where they have stored no offset.
async fn floors(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    expected: &[String],
    chunk: Chunk,
) -> Result<BTreeMap<u32, (i64, String)>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(["shard", "consumer", "added_id"])
        .push(" FROM ")
        .ident(&ddl::offsets_table(ds.name()))
        .push(" WHERE ");
    chunk.condition(&mut sql, "");
    let mut stored: BTreeMap<u32, BTreeMap<String, i64>> = BTreeMap::new();
    for (shard, consumer, added_id) in backend.rows::<(i64, String, i64)>(&sql).await? {
        stored
            .entry(shard as u32)
            .or_default()
            .insert(consumer, added_id);
    }
    let mut floors = BTreeMap::new();
    for shard in chunk.first..=chunk.last {
        let mut offsets = stored.remove(&shard).unwrap_or_default();
        for name in expected {
            offsets.entry(name.clone()).or_insert(0);
        }
        if let Some((consumer, offset)) = offsets.into_iter().min_by_key(|(_, o)| *o) {
            floors.insert(shard, (offset, consumer));
        }
    }
    Ok(floors)
}

/// The cells of `chunk` that an index or trigger quarantine record names.
async fn quarantined(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    chunk: Chunk,
) -> Result<BTreeSet<(u32, i64)>> {
    let mut sql = Sql::new(backend.dialect());
    for (i, table) in [
        ddl::quarantine_table(ds.name()),
        ddl::trigger_quarantine_table(ds.name()),
    ]
    .iter()
    .enumerate()
    {
        if i > 0 {
            sql.push(" UNION ALL ");
        }
        sql.push("SELECT ")
            .idents(["shard", "added_id"])
            .push(" FROM ")
            .ident(table)
            .push(" WHERE ");
        chunk.condition(&mut sql, "");
    }
    Ok(backend
        .rows::<(i64, i64)>(&sql)
        .await?
        .into_iter()
        .map(|(shard, added_id)| (shard as u32, added_id))
        .collect())
}

/// The keys of the cells of `chunk` with a copy in one of `buffers`.
async fn buffered(
    buffers: &[std::sync::Arc<dyn Backend>],
    ds: &DatastoreRuntime,
    chunk: Chunk,
) -> Result<HashSet<(uuid::Uuid, String, i64)>> {
    let mut keys = HashSet::new();
    for backend in buffers {
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT ")
            .idents(["row_key", "column_name", "ref_key"])
            .push(" FROM ")
            .ident(&ddl::buffer_table(ds.name()))
            .push(" WHERE ");
        chunk.condition(&mut sql, "");
        keys.extend(backend.rows::<(uuid::Uuid, String, i64)>(&sql).await?);
    }
    Ok(keys)
}

type Batch = Vec<(u32, Vec<(i64, String)>)>;

/// `deletable` split into statements of at most [`DELETE_BATCH`] cells and
/// `max_shards` shards.
fn batches(deletable: &BTreeMap<u32, Vec<(i64, String)>>, max_shards: usize) -> Vec<Batch> {
    let mut batches = Vec::new();
    let mut batch: Batch = Vec::new();
    let mut cells = 0;
    for (shard, ids) in deletable {
        for part in ids.chunks(DELETE_BATCH) {
            if cells + part.len() > DELETE_BATCH || batch.len() >= max_shards {
                batches.push(std::mem::take(&mut batch));
                cells = 0;
            }
            cells += part.len();
            batch.push((*shard, part.to_vec()));
        }
    }
    if !batch.is_empty() {
        batches.push(batch);
    }
    batches
}

/// Appends `(<t>.shard = ? AND <t>.added_id IN (…)) OR …` for `batch`.
fn positions(sql: &mut Sql, t: &str, batch: &Batch) {
    sql.push("(");
    for (i, (shard, ids)) in batch.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        sql.push("(")
            .push(t)
            .push(".")
            .ident("shard")
            .push(" = ")
            .bind(Value::Int(i64::from(*shard)))
            .push(" AND ")
            .push(t)
            .push(".")
            .ident("added_id")
            .in_list(ids.iter().map(|(id, _)| Value::Int(*id)))
            .push(")");
    }
    sql.push(")");
}

/// The guarded `DELETE` of `batch`: only cells with a newer version of
/// their `(row, column)`, below every stored offset of their shard, named
/// by no quarantine record — all judged when the statement runs.
///
/// MySQL refuses a subquery on the table a `DELETE` removes from, so there
/// the newer version is a join of the table with itself.
fn delete_sql(dialect: Dialect, ds: &DatastoreRuntime, batch: &Batch) -> Sql {
    let table = ddl::cells_table(ds.name());
    let quoted = dialect.quote(&table);
    let mut sql = Sql::new(dialect);
    let t = if !dialect.deletes_with_subqueries_on_their_table() {
        sql.push("DELETE c FROM ")
            .ident(&table)
            .push(" c JOIN ")
            .ident(&table)
            .push(" n ON n.")
            .ident("row_key")
            .push(" = c.")
            .ident("row_key")
            .push(" AND n.")
            .ident("column_name")
            .push(" = c.")
            .ident("column_name")
            .push(" AND n.")
            .ident("ref_key")
            .push(" > c.")
            .ident("ref_key")
            .push(" WHERE ");
        "c".to_string()
    } else {
        sql.push("DELETE FROM ")
            .ident(&table)
            .push(" WHERE EXISTS (SELECT 1 FROM ");
        sql.ident(&table)
            .push(" n WHERE n.")
            .ident("row_key")
            .push(&format!(" = {quoted}."))
            .ident("row_key")
            .push(" AND n.")
            .ident("column_name")
            .push(&format!(" = {quoted}."))
            .ident("column_name")
            .push(" AND n.")
            .ident("ref_key")
            .push(&format!(" > {quoted}."))
            .ident("ref_key")
            .push(") AND ");
        quoted
    };
    positions(&mut sql, &t, batch);
    sql.push(" AND NOT EXISTS (SELECT 1 FROM ")
        .ident(&ddl::offsets_table(ds.name()))
        .push(" o WHERE o.")
        .ident("shard")
        .push(&format!(" = {t}."))
        .ident("shard")
        .push(" AND o.")
        .ident("added_id")
        .push(&format!(" < {t}."))
        .ident("added_id")
        .push(")");
    for quarantine in [
        ddl::quarantine_table(ds.name()),
        ddl::trigger_quarantine_table(ds.name()),
    ] {
        sql.push(" AND NOT EXISTS (SELECT 1 FROM ")
            .ident(&quarantine)
            .push(" q WHERE q.")
            .ident("shard")
            .push(&format!(" = {t}."))
            .ident("shard")
            .push(" AND q.")
            .ident("added_id")
            .push(&format!(" = {t}."))
            .ident("added_id")
            .push(")");
    }
    sql
}

/// Which cells of `batch` are still stored.
async fn present(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    batch: &Batch,
) -> Result<BTreeSet<(u32, i64)>> {
    let table = ddl::cells_table(ds.name());
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(["shard", "added_id"])
        .push(" FROM ")
        .ident(&table)
        .push(" WHERE ");
    positions(&mut sql, &backend.dialect().quote(&table), batch);
    Ok(backend
        .rows::<(i64, i64)>(&sql)
        .await?
        .into_iter()
        .map(|(shard, added_id)| (shard as u32, added_id))
        .collect())
}
