//! The write path: validate, encode, buffer, then commit on the primary.
//!
//! A batch is grouped by cluster, and per cluster:
//!
//! 1. look up which keys exist, one statement per chunk, before the
//!    transaction;
//! 2. in one transaction on the cluster's master, lock the counter rows of
//!    the new cells' shards in `<ds>_shards`, in increasing shard order
//!    (`SELECT … ORDER BY shard FOR UPDATE`), so concurrent batches over
//!    overlapping shards queue instead of deadlocking;
//! 3. advance the counters by the number of new cells of each shard, which
//!    allocates their `added_id`s;
//! 4. insert the new cells with multi-row `INSERT`s, and commit.
//!
//! On PostgreSQL, steps 2 to 4 of a group that fits one `INSERT` are one
//! autocommitted statement ([`one_statement`]).
//!
//! The locks are held only for steps 2 to 4: concurrent batches on
//! overlapping shards queue for them, so what runs under them bounds the
//! write rate. A key another writer inserts between steps 1 and 4 fails
//! the `INSERT` on the unique key, and the whole group is retried
//! (`with_retry`), when step 1 finds it.
//!
//! Writers of one shard are serialized by its counter row, so `added_id`s
//! are strictly increasing per shard, have no gaps, and become visible in
//! order: a log reader never skips a cell that commits late. A key that
//! exists with the same body is a duplicate, with another body a per-cell
//! `CELL_CONFLICT`; the rest of the group still commits.
//!
//! Before the primary, each group is copied into the buffer table of
//! `buffer_count` other clusters; if the primary then fails transiently
//! the cells stay buffered, the caller is told `BUFFERED`, and `replay.rs`
//! delivers them once the primary is back. A primary whose catalog was
//! refused is an error at once, never buffered: waiting would not help.
//! After the commit the topology's [`Events`](crate::topology::Events)
//! announce the new shard heads, which is how index maintenance learns
//! about them.

mod statements;

use self::statements::*;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use chrono::Utc;
use rand::seq::SliceRandom;
use uuid::Uuid;

use super::read::{int_list, text_list, uuid_list};
use super::{codec, CellKey, NewCell, PutResult, PutStatus};
use crate::error::{Error, Result};
use crate::replicas::ReadToken;
use crate::retry::with_retry;
use crate::shards::row_shard;
use crate::storage::MAX_PARAMS;
use crate::storage::{ddl, value::truncate_to_micros, Backend, Dialect, Sql, Tx, Value};
use crate::topology::{DatastoreRuntime, Topology, Written, WrittenCell};

/// A validated, encoded cell ready for storage.
pub(super) struct Prepared {
    pub(super) index: usize,
    pub(super) shard: u32,
    pub(super) key: CellKey,
    /// For a column an index reads: the body cut to the members the
    /// indexes read.
    pub(super) indexed: Option<Kept>,
    pub(super) encoded: Vec<u8>,
}

/// Keys per existence lookup.
const LOOKUP_CHUNK: usize = 500;

/// Body bytes per multi-row `INSERT`: far below the 16 MiB packet MySQL
/// and MariaDB accept by default (a single larger body goes alone).
const INSERT_BYTES: usize = 4 * 1024 * 1024;

/// How long a write waits for the cut-over of a moving shard before it
/// fails with `SHARD_MOVING` (a move's cut-over takes a fraction of this).
const MOVE_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Batches at least this large are encoded off the async runtime.
const ENCODE_OFF_RUNTIME: usize = 16;

/// Writes a batch of cells: one transaction per cluster, clusters in
/// parallel. Returns one result per cell, in input order. An `Err` for the
/// whole call means nothing was attempted (unknown datastore, batch too
/// large).
pub(crate) async fn put_cells<B: Body>(
    topology: &Topology,
    datastore: &str,
    cells: Vec<NewCell<B>>,
) -> Result<(Vec<PutResult>, ReadToken)> {
    let ds = topology.datastore(datastore)?;
    if cells.len() > topology.max_batch {
        return Err(Error::LimitExceeded {
            what: format!("a batch of {} cells", cells.len()),
            limit: topology.max_batch,
        });
    }
    let count = cells.len();
    let prepared: Vec<Result<Prepared>> = if count >= ENCODE_OFF_RUNTIME {
        let ds = ds.clone();
        tokio::task::spawn_blocking(move || prepare_all(&ds, cells))
            .await
            .map_err(|e| Error::Internal(format!("encoding task failed: {e}")))?
    } else {
        prepare_all(&ds, cells)
    };
    let mut results: Vec<Option<PutResult>> = vec![None; count];
    // First occurrence of each key in the batch, with a hash of its body.
    let mut first_of: HashMap<CellKey, (usize, u64)> = HashMap::new();
    let mut repeats = Vec::new();
    let mut accepted = Vec::new();
    for (index, prepared) in prepared.into_iter().enumerate() {
        let prepared = match prepared {
            Ok(prepared) => prepared,
            Err(err) => {
                results[index] = Some(Err(Arc::new(err)));
                continue;
            }
        };
        let body_hash = xxhash_rust::xxh3::xxh3_64(&prepared.encoded);
        if let Some(&(first, first_hash)) = first_of.get(&prepared.key) {
            repeats.push((index, first, first_hash == body_hash, prepared.key));
            continue;
        }
        first_of.insert(prepared.key.clone(), (index, body_hash));
        accepted.push((prepared.shard, prepared));
    }
    let mut token = ReadToken {
        datastore: datastore.to_string(),
        ..ReadToken::default()
    };
    // Cells of a shard that is moving are written once the move's cut-over
    // lets them, on the cluster the shard lives on then.
    let mut pending = accepted;
    let deadline = tokio::time::Instant::now() + MOVE_WAIT;
    loop {
        let seen = ds.routes.watch();
        let groups = topology.by_cluster(&ds, pending);
        let writes = groups.into_iter().map(|(cluster, mut group)| {
            group.sort_by_key(|p| (p.shard, p.index));
            write_cluster(topology, &ds, cluster, group)
        });
        let mut moving = Vec::new();
        for (outcome, heads, group) in futures::future::join_all(writes).await {
            let mut retry = std::collections::HashSet::new();
            for (index, result) in outcome {
                if matches!(&result, Err(e) if matches!(**e, Error::ShardMoving { .. })) {
                    retry.insert(index);
                }
                results[index] = Some(result);
            }
            token.extend(heads);
            moving.extend(
                group
                    .into_iter()
                    .filter(|p| retry.contains(&p.index))
                    .map(|p| (p.shard, p)),
            );
        }
        if moving.is_empty() || !topology.moves.wait(seen, deadline).await {
            break;
        }
        pending = moving;
    }
    // A key repeated inside the batch: same body is a duplicate of the
    // first occurrence, a different body a conflict with it.
    for (index, first, same_body, key) in repeats {
        let first_result = results[first]
            .clone()
            .expect("first occurrence has a result");
        results[index] = Some(match (same_body, first_result) {
            (false, _) => Err(Arc::new(Error::CellConflict {
                row_key: key.row_key,
                column: key.column,
                ref_key: key.ref_key,
            })),
            (true, Ok(PutStatus::Buffered)) => Ok(PutStatus::Buffered),
            (true, Ok(_)) => Ok(PutStatus::Duplicate),
            (true, Err(err)) => Err(err),
        });
    }
    Ok((
        results
            .into_iter()
            .map(|r| r.expect("every cell has a result"))
            .collect(),
        token,
    ))
}

fn prepare_all<B: Body>(ds: &DatastoreRuntime, cells: Vec<NewCell<B>>) -> Vec<Result<Prepared>> {
    cells
        .into_iter()
        .enumerate()
        .map(|(index, cell)| prepare(ds, index, cell))
        .collect()
}

/// A body a write takes: a JSON value, or one already read into
/// MessagePack from JSON text ([`codec::Packed`]).
pub(crate) trait Body: Send + 'static {
    /// The stored bytes and, for a column an index reads (`indexed`), the
    /// body cut to the top-level members the indexes read.
    fn encode(
        self,
        ds: &DatastoreRuntime,
        indexed: bool,
    ) -> std::result::Result<(Vec<u8>, Option<Kept>), String>;
}

impl Body for serde_json::Value {
    fn encode(
        self,
        ds: &DatastoreRuntime,
        indexed: bool,
    ) -> std::result::Result<(Vec<u8>, Option<Kept>), String> {
        let encoded = codec::encode(&self)?;
        // Cut here, while the body is fresh in this thread's cache; the
        // rest of it is dropped here too.
        let kept = indexed.then(|| Kept {
            body: Arc::new(members_only(self, &ds.indexed_members)),
            members: ds.indexed_members.clone(),
        });
        Ok((encoded, kept))
    }
}

impl Body for codec::Packed {
    fn encode(
        self,
        _: &DatastoreRuntime,
        indexed: bool,
    ) -> std::result::Result<(Vec<u8>, Option<Kept>), String> {
        // Cut as it was read, to the names asked for then: a reload since
        // may have changed them, and the pass checks what it takes against
        // these (`Recent::take`).
        let (encoded, kept) = codec::Packed::encode(self)?;
        let kept = kept.filter(|_| indexed).map(|(body, members)| Kept {
            body: Arc::new(body),
            members,
        });
        Ok((encoded, kept))
    }
}

/// A written body cut to the top-level members the indexes read, for this
/// process's index maintenance (`indexes/recent.rs`), with the names it
/// was cut to.
pub(crate) struct Kept {
    pub(crate) body: Arc<serde_json::Value>,
    pub(crate) members: Arc<std::collections::BTreeSet<String>>,
}

fn prepare<B: Body>(ds: &DatastoreRuntime, index: usize, cell: NewCell<B>) -> Result<Prepared> {
    ds.check_column(&cell.column)?;
    let indexed = ds.indexes_column(&cell.column);
    let (encoded, indexed) =
        cell.body
            .encode(ds, indexed)
            .map_err(|reason| Error::InvalidBody {
                row_key: cell.row_key,
                column: cell.column.clone(),
                ref_key: cell.ref_key,
                reason,
            })?;
    Ok(Prepared {
        index,
        shard: row_shard(&cell.row_key, ds.def.shards),
        key: CellKey {
            row_key: cell.row_key,
            column: cell.column,
            ref_key: cell.ref_key,
        },
        indexed,
        encoded,
    })
}

/// `body` (an object) with only its top-level `members`.
fn members_only(
    body: serde_json::Value,
    members: &std::collections::BTreeSet<String>,
) -> serde_json::Value {
    match body {
        serde_json::Value::Object(mut all) => {
            serde_json::Value::Object(members.iter().filter_map(|m| all.remove_entry(m)).collect())
        }
        other => other,
    }
}

/// Buffers and commits the group of one cluster; a result per cell, and
/// the shard heads the commit created.
async fn write_cluster(
    topology: &Topology,
    ds: &DatastoreRuntime,
    cluster: usize,
    group: Vec<Prepared>,
) -> (Vec<(usize, PutResult)>, Vec<(u32, i64)>, Vec<Prepared>) {
    let (outcome, heads) = write_group(topology, ds, cluster, &group).await;
    (outcome, heads, group)
}

async fn write_group(
    topology: &Topology,
    ds: &DatastoreRuntime,
    cluster: usize,
    group: &[Prepared],
) -> (Vec<(usize, PutResult)>, Vec<(u32, i64)>) {
    let fail_all = |group: &[Prepared], err: Error| {
        let err = Arc::new(err);
        group
            .iter()
            .map(|p| (p.index, Err(err.clone())))
            .collect::<Vec<_>>()
    };
    let no_heads = Vec::new;
    if let Err(err) = topology.clusters[cluster].master() {
        if !err.is_transient() {
            return (fail_all(group, err), no_heads());
        }
    }
    let buffered = match buffer(topology, ds, cluster, group).await {
        Ok(buffered) => buffered,
        Err(err) => return (fail_all(group, err), no_heads()),
    };
    let primary = async {
        let master = topology.clusters[cluster].master()?;
        with_retry("committing a batch", || {
            commit_primary(master.as_ref(), ds.name(), group)
        })
        .await
    }
    .await;
    match primary {
        Ok((statuses, heads)) => {
            use std::sync::atomic::Ordering::Relaxed;
            let count = |wanted: PutStatus| {
                statuses
                    .iter()
                    .filter(|s| matches!(s, Ok(st) if *st == wanted))
                    .count() as u64
            };
            let written = count(PutStatus::Written);
            ds.cells_written.fetch_add(written, Relaxed);
            ds.cells_duplicate
                .fetch_add(count(PutStatus::Duplicate), Relaxed);
            // Duplicates' heads are in the read token, but wake nobody.
            if written > 0 {
                let cells = group
                    .iter()
                    .zip(&statuses)
                    .filter(|(_, status)| matches!(status, Ok(PutStatus::Written)))
                    .filter_map(|(p, _)| {
                        Some(WrittenCell {
                            shard: p.shard,
                            row_key: p.key.row_key,
                            column: p.key.column.clone(),
                            ref_key: p.key.ref_key,
                            body: p.indexed.as_ref()?.body.clone(),
                            members: p.indexed.as_ref()?.members.clone(),
                        })
                    })
                    .collect();
                let notify = topology.clusters[cluster].master.dialect().has_notify();
                topology.events.committed(
                    Written {
                        datastore: ds.name().to_string(),
                        cluster,
                        heads: heads.clone(),
                        went_back: false,
                        cells,
                    },
                    notify,
                );
            }
            if topology.clusters[cluster].replicas.is_empty() {
                release_buffers(topology, ds, buffered).await;
            } else {
                // The copies stay until the replicas have the cells
                // (`replay.rs` deletes them then): a master lost with its
                // disk before that would otherwise lose them. Copies of
                // cells the primary refused go now.
                let refused: Vec<&CellKey> = group
                    .iter()
                    .zip(&statuses)
                    .filter(|(_, status)| status.is_err())
                    .map(|(p, _)| &p.key)
                    .collect();
                forget_copies(topology, ds, &buffered, &refused).await;
            }
            (group.iter().map(|p| p.index).zip(statuses).collect(), heads)
        }
        Err(err) if err.is_transient() && buffered.len() >= topology.buffer_count.max(1) => {
            tracing::warn!(datastore = %ds.name(), cluster = %topology.clusters[cluster].name, error = %err, "primary unavailable; cells kept in buffer");
            let buffered = group
                .iter()
                .map(|p| (p.index, Ok(PutStatus::Buffered)))
                .collect();
            (buffered, no_heads())
        }
        Err(err) => {
            release_buffers(topology, ds, buffered).await;
            (fail_all(group, err), no_heads())
        }
    }
}

/// Copies the group into the buffer tables of `buffer_count` other
/// clusters, chosen at random; returns `(cluster, batch id)` per copy. A
/// secondary that cannot take its copy is replaced by another; when fewer
/// than `buffer_count` can, the copies made are released and the write
/// fails (as Schemaless's does), with the last secondary's error — or,
/// with `buffer_shortfall: write_primary`, goes on with the copies made.
async fn buffer(
    topology: &Topology,
    ds: &DatastoreRuntime,
    primary: usize,
    group: &[Prepared],
) -> Result<Vec<(usize, Uuid)>> {
    if topology.buffer_count == 0 {
        return Ok(Vec::new());
    }
    let mut secondaries: Vec<usize> = (0..topology.clusters.len())
        .filter(|c| *c != primary)
        .collect();
    secondaries.shuffle(&mut rand::thread_rng());
    let mut copies = Vec::new();
    let mut last_error = None;
    for cluster in secondaries {
        if copies.len() == topology.buffer_count {
            break;
        }
        match buffer_copy(topology, ds, cluster, group).await {
            Ok(batch) => copies.push((cluster, batch)),
            Err(err) => {
                tracing::warn!(datastore = %ds.name(), cluster = %topology.clusters[cluster].name, error = %err, "cannot buffer a batch here; trying another cluster");
                last_error = Some(err);
            }
        }
    }
    if copies.len() < topology.buffer_count
        && topology.buffer_shortfall == crate::options::BufferShortfall::Fail
    {
        release_buffers(topology, ds, copies).await;
        return Err(last_error.unwrap_or_else(|| Error::ClusterNotReady {
            cluster: topology.clusters[primary].name.clone(),
            reason: "too few other clusters to buffer the write".into(),
        }));
    }
    if copies.len() < topology.buffer_count {
        tracing::warn!(datastore = %ds.name(), copies = copies.len(), wanted = topology.buffer_count, "too few clusters took a buffer copy; writing the primary anyway (buffer_shortfall: write_primary)");
    }
    Ok(copies)
}

/// One buffer copy of the group on `cluster`; its batch id.
async fn buffer_copy(
    topology: &Topology,
    ds: &DatastoreRuntime,
    cluster: usize,
    group: &[Prepared],
) -> Result<Uuid> {
    let backend = topology.clusters[cluster].master()?;
    let dialect = backend.dialect();
    let batch = Uuid::new_v4();
    let table = ddl::buffer_table(ds.name());
    let span = tracing::debug_span!(
        "buffer copy",
        cellgate.datastore = ds.name(),
        cellgate.cluster = topology.clusters[cluster].name.as_str(),
        cellgate.cells = group.len(),
    );
    let copied = with_retry("buffering a batch", || async {
        let mut tx = backend.begin().await?;
        for chunk in insert_chunks(group, CELL_ROWS, |c| c.encoded.len()) {
            let mut sql = Sql::new(dialect);
            sql.push("INSERT INTO ")
                .ident(&table)
                .push(" (")
                .idents([
                    "batch_id",
                    "shard",
                    "row_key",
                    "column_name",
                    "ref_key",
                    "body",
                    "created_at",
                ])
                .push(") ")
                // `created_at` by the buffer's server: replay judges a
                // copy's age by the same clock.
                .rows_stamped(chunk.iter().map(|cell| {
                    vec![
                        Value::Uuid(batch),
                        Value::Int(i64::from(cell.shard)),
                        Value::Uuid(cell.key.row_key),
                        Value::Text(cell.key.column.clone()),
                        Value::Int(cell.key.ref_key),
                        Value::Bytes(cell.encoded.clone()),
                    ]
                }));
            tx.execute(&sql).await?;
        }
        tx.commit().await
    });
    tracing::Instrument::instrument(copied, span).await?;
    Ok(batch)
}

/// Deletes buffered copies once the primary has the cells (or refused
/// them for good). Best effort: a leftover copy is replayed harmlessly.
async fn release_buffers(topology: &Topology, ds: &DatastoreRuntime, copies: Vec<(usize, Uuid)>) {
    for (cluster, batch) in copies {
        let Ok(backend) = topology.clusters[cluster].master() else {
            continue;
        };
        let mut sql = Sql::new(backend.dialect());
        sql.push("DELETE FROM ")
            .ident(&ddl::buffer_table(ds.name()))
            .push(" WHERE ")
            .ident("batch_id")
            .push(" = ")
            .bind(Value::Uuid(batch));
        if let Err(err) = backend.execute(&sql).await {
            tracing::warn!(cluster = %backend.cluster(), error = %err, "could not release buffered cells");
        }
    }
}

/// Deletes the copies of `keys` from the buffered batches `copies`: cells
/// the primary refused (a conflict, a shard moving away), which must never
/// be replayed. Best effort: a copy left behind meets its key's stored
/// body on replay and is recorded as a conflict.
async fn forget_copies(
    topology: &Topology,
    ds: &DatastoreRuntime,
    copies: &[(usize, Uuid)],
    keys: &[&CellKey],
) {
    if keys.is_empty() {
        return;
    }
    for (cluster, batch) in copies {
        let Ok(backend) = topology.clusters[*cluster].master() else {
            continue;
        };
        for chunk in keys.chunks(MAX_PARAMS / 4) {
            let mut sql = Sql::new(backend.dialect());
            sql.push("DELETE FROM ")
                .ident(&ddl::buffer_table(ds.name()))
                .push(" WHERE ")
                .ident("batch_id")
                .push(" = ")
                .bind(Value::Uuid(*batch))
                .push(" AND (");
            for (i, key) in chunk.iter().enumerate() {
                if i > 0 {
                    sql.push(" OR ");
                }
                sql.push("(")
                    .ident("row_key")
                    .push(" = ")
                    .bind(Value::Uuid(key.row_key))
                    .push(" AND ")
                    .ident("column_name")
                    .push(" = ")
                    .bind(Value::Text(key.column.clone()))
                    .push(" AND ")
                    .ident("ref_key")
                    .push(" = ")
                    .bind(Value::Int(key.ref_key))
                    .push(")");
            }
            sql.push(")");
            if let Err(err) = backend.execute(&sql).await {
                tracing::warn!(cluster = %backend.cluster(), error = %err, "could not remove the buffer copies of refused cells");
            }
        }
    }
}

/// Splits `items` into runs that fit one multi-row `INSERT` on every
/// backend: at most `max_rows` rows and about [`INSERT_BYTES`] of bodies
/// (a larger body goes alone).
fn insert_chunks<T>(items: &[T], max_rows: usize, bytes_of: impl Fn(&T) -> usize) -> Vec<&[T]> {
    let mut chunks = Vec::new();
    let mut start = 0;
    let mut bytes = 0;
    for (i, item) in items.iter().enumerate() {
        let size = bytes_of(item);
        if i - start >= max_rows || (i > start && bytes + size > INSERT_BYTES) {
            chunks.push(&items[start..i]);
            start = i;
            bytes = 0;
        }
        bytes += size;
    }
    if start < items.len() {
        chunks.push(&items[start..]);
    }
    chunks
}

/// Rows per `INSERT` of cells (7 values each).
const CELL_ROWS: usize = MAX_PARAMS / 7;

/// One cluster transaction on the primary (see the module doc). `group`
/// is sorted by shard. Returns the per-cell statuses and each shard's new
/// last `added_id`.
///
/// Which keys exist is read before the transaction, so that the counter
/// locks are held only for the statements that need them: a key that
/// another writer inserts in between makes the `INSERT` fail on the
/// unique key, and [`with_retry`] runs the whole function again, which
/// then finds it (a duplicate, or a conflict).
pub(super) async fn commit_primary(
    master: &dyn Backend,
    datastore: &str,
    group: &[Prepared],
) -> Result<(Vec<PutResult>, Vec<(u32, i64)>)> {
    let dialect = master.dialect();
    let cells_table = ddl::cells_table(datastore);
    let existing = existing_bodies(master, &cells_table, group, |c| &c.key).await?;
    let mut statuses: Vec<Option<PutResult>> = Vec::with_capacity(group.len());
    let mut new_cells: Vec<&Prepared> = Vec::new();
    // Where each new cell's status goes.
    let mut positions: Vec<usize> = Vec::new();
    // A duplicate's stored cell counts as written by this call for its read
    // token: a retried write must read back like the first attempt.
    let mut duplicates: BTreeMap<u32, i64> = BTreeMap::new();
    for cell in group {
        if let Some(stored) = existing.get(&cell.key) {
            let head = duplicates.entry(stored.shard).or_insert(stored.added_id);
            *head = (*head).max(stored.added_id);
        }
        statuses.push(match existing.get(&cell.key).map(|s| &s.body) {
            Some(stored) if *stored == cell.encoded => Some(Ok(PutStatus::Duplicate)),
            // The same body encoded otherwise (by an earlier encoder):
            // compared as JSON (the encoding round-trips exactly).
            Some(stored) => Some(
                match (codec::decode(stored), codec::decode(&cell.encoded)) {
                    (Ok(stored), Ok(body)) if stored == body => Ok(PutStatus::Duplicate),
                    _ => Err(Arc::new(Error::CellConflict {
                        row_key: cell.key.row_key,
                        column: cell.key.column.clone(),
                        ref_key: cell.key.ref_key,
                    })),
                },
            ),
            None => {
                new_cells.push(cell);
                positions.push(statuses.len());
                None
            }
        });
    }
    let written = |statuses: Vec<Option<PutResult>>| -> Vec<PutResult> {
        statuses
            .into_iter()
            .map(|s| s.unwrap_or(Ok(PutStatus::Written)))
            .collect()
    };
    if new_cells.is_empty() {
        return Ok((written(statuses), duplicates.into_iter().collect()));
    }

    let created_at = Value::DateTime(truncate_to_micros(Utc::now()));
    // A cell of a shard whose counter row is missing or fenced (negative:
    // the shard is moving away, `moves`) is not written here.
    let moving = |statuses: &mut Vec<Option<PutResult>>, shard: u32, position: usize| {
        statuses[position] = Some(Err(Arc::new(Error::ShardMoving {
            datastore: datastore.to_string(),
            shard,
        })));
    };
    if let Some(sql) = one_statement(dialect, datastore, &new_cells, &created_at) {
        let mut heads: Vec<(u32, i64)> = master
            .rows::<(i64, i64)>(&sql)
            .await?
            .into_iter()
            .map(|(shard, next)| (shard as u32, next - 1))
            .collect();
        for (cell, position) in new_cells.iter().zip(&positions) {
            if !heads.iter().any(|(shard, _)| *shard == cell.shard) {
                moving(&mut statuses, cell.shard, *position);
            }
        }
        heads.extend(duplicates);
        return Ok((written(statuses), heads));
    }
    let mut tx = master.begin().await?;
    let shards: Vec<u32> = {
        let mut shards: Vec<u32> = new_cells.iter().map(|c| c.shard).collect();
        shards.dedup();
        shards
    };
    let mut next_ids = lock_shards(tx.as_mut(), dialect, datastore, &shards).await?;
    next_ids.retain(|_, next| *next > 0);
    let mut numbered: Vec<(&Prepared, i64)> = Vec::with_capacity(new_cells.len());
    for (cell, position) in new_cells.into_iter().zip(positions) {
        match next_ids.get_mut(&cell.shard) {
            Some(next) => {
                numbered.push((cell, *next));
                *next += 1;
            }
            None => moving(&mut statuses, cell.shard, position),
        }
    }
    if numbered.is_empty() {
        tx.commit().await?;
        return Ok((written(statuses), duplicates.into_iter().collect()));
    }
    let shards: Vec<u32> = shards
        .into_iter()
        .filter(|s| next_ids.contains_key(s))
        .collect();
    // `shards` is sorted: the group is.
    let advanced: Vec<(u32, i64)> = shards.iter().map(|s| (*s, next_ids[s])).collect();
    let mut heads: Vec<(u32, i64)> = advanced.iter().map(|(s, next)| (*s, next - 1)).collect();
    heads.extend(duplicates);
    for chunk in advanced.chunks(MAX_PARAMS / 3) {
        let mut sql = Sql::new(dialect);
        push_advance(&mut sql, datastore, chunk);
        tx.execute(&sql).await?;
    }
    for chunk in insert_chunks(&numbered, CELL_ROWS, |(c, _)| c.encoded.len()) {
        let mut sql = Sql::new(dialect);
        sql.push("INSERT INTO ")
            .ident(&cells_table)
            .push(" (")
            .idents(super::read::CELL_COLUMNS)
            .push(") ")
            .rows(
                chunk
                    .iter()
                    .map(|(cell, added_id)| cell_row(cell, *added_id, &created_at)),
            );
        tx.execute(&sql).await?;
    }
    tx.commit().await?;
    Ok((written(statuses), heads))
}

/// The stored bodies of those cells of `group` (their keys by `key`) that
/// already exist.
/// A stored cell as the duplicate check reads it.
pub(super) struct Stored {
    pub(super) body: Vec<u8>,
    pub(super) shard: u32,
    pub(super) added_id: i64,
}

pub(super) async fn existing_bodies<T>(
    master: &dyn Backend,
    table: &str,
    group: &[T],
    key: impl Fn(&T) -> &CellKey,
) -> Result<HashMap<CellKey, Stored>> {
    let dialect = master.dialect();
    let mut found = HashMap::new();
    for chunk in group.chunks(LOOKUP_CHUNK) {
        let mut sql = Sql::new(dialect);
        sql.push("SELECT ")
            .idents([
                "row_key",
                "column_name",
                "ref_key",
                "body",
                "shard",
                "added_id",
            ])
            .push(" FROM ")
            .ident(table)
            .push(" WHERE ")
            .ident("row_key")
            .in_list(uuid_list(chunk.iter().map(|c| key(c).row_key)))
            .push(" AND ")
            .ident("column_name")
            .in_list(text_list(chunk.iter().map(|c| key(c).column.as_str())))
            .push(" AND ")
            .ident("ref_key")
            .in_list(int_list(chunk.iter().map(|c| key(c).ref_key)));
        type Row = (Uuid, String, i64, Vec<u8>, i64, i64);
        for (row_key, column, ref_key, body, shard, added_id) in master.rows::<Row>(&sql).await? {
            found.insert(
                CellKey {
                    row_key,
                    column,
                    ref_key,
                },
                Stored {
                    body,
                    shard: shard as u32,
                    added_id,
                },
            );
        }
    }
    let wanted: HashSet<&CellKey> = group.iter().map(key).collect();
    found.retain(|key, _| wanted.contains(key));
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepared(shard: u32, n: i64) -> Prepared {
        Prepared {
            index: 0,
            shard,
            key: CellKey {
                row_key: Uuid::new_v4(),
                column: "BASE".into(),
                ref_key: n,
            },
            indexed: None,
            encoded: vec![1, 2, 3],
        }
    }

    #[test]
    fn a_body_is_cut_to_the_members_the_indexes_read() {
        let members = ["city_uuid", "fare", "status"]
            .map(String::from)
            .into_iter()
            .collect();
        let body = serde_json::json!({"city_uuid": "c", "fare": {"total": 1.5}, "notes": "x"});
        assert_eq!(
            members_only(body, &members),
            serde_json::json!({"city_uuid": "c", "fare": {"total": 1.5}})
        );
    }

    // PostgreSQL parses and plans a statement once per connection and text:
    // a text that changed with the batch (the number of cells and of their
    // shards) was parsed and planned again for almost every write.
    #[test]
    fn the_write_statement_does_not_depend_on_the_batch() {
        let created = Value::DateTime(Utc::now());
        let text = |cells: &[Prepared]| {
            let cells: Vec<&Prepared> = cells.iter().collect();
            one_statement(Dialect::Postgres, "trips", &cells, &created)
                .expect("one statement")
                .text()
                .to_string()
        };
        let one = text(&[prepared(7, 1)]);
        let many: Vec<Prepared> = (0..50).map(|n| prepared(n as u32 / 2, n)).collect();
        assert_eq!(text(&many), one);
        // Seven arrays of cells, two of counts, one of locked shards.
        let cells: Vec<&Prepared> = many.iter().collect();
        let sql = one_statement(Dialect::Postgres, "trips", &cells, &created).unwrap();
        assert_eq!(sql.params().len(), 10);
        assert!(sql.params().iter().all(|p| matches!(p, Value::Array(..))));

        // The counters of a write too large for one statement likewise.
        let advance = |next: &[(u32, i64)]| {
            let mut sql = Sql::new(Dialect::Postgres);
            push_advance(&mut sql, "trips", next);
            sql.text().to_string()
        };
        let many: Vec<(u32, i64)> = (0..50).map(|s| (s, 10)).collect();
        assert_eq!(advance(&[(3, 1)]), advance(&many));
    }
}
