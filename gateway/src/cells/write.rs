//! The write path: validate, encode, buffer, then commit on the primary.
//!
//! Cells of a batch are grouped by shard and each shard group is one
//! transaction on the shard's primary master, so a failed batch never leaves
//! a partial shard transaction behind and the per-cell results say exactly
//! what was written. Before the primary, each group is written to the buffer
//! table of `buffer_count` secondary clusters (none with one cluster); if the
//! primary is then unreachable the cells stay buffered and the caller is told
//! so. A write transaction first locks the shard's `_meta` row: writers of
//! one shard are serialized, so `added_id`s become visible in increasing
//! order and a log reader can never skip a cell that commits late.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use chrono::Utc;
use futures::StreamExt;
use rand::seq::SliceRandom;

use super::read::unique;
use super::{codec, CellKey, NewCell, PutResult, PutStatus};
use crate::error::{Error, Result};
use crate::shards::row_shard;
use crate::storage::{ddl, value::truncate_to_micros, Backend, ColType, Sql, Tx, Value};
use crate::store::{DatastoreRuntime, Store};

/// A validated, encoded cell ready for storage.
struct Prepared {
    index: usize,
    key: CellKey,
    body: serde_json::Value,
    encoded: Vec<u8>,
}

/// Keys per `IN (…)` list when looking up existing cells.
const LOOKUP_CHUNK: usize = 200;

impl Store {
    /// Writes one cell.
    pub async fn put_cell(&self, datastore: &str, cell: NewCell) -> Result<PutStatus> {
        let mut results = self.put_cells(datastore, vec![cell]).await?;
        results
            .pop()
            .expect("one result per cell")
            .map_err(Error::unshare)
    }

    /// Writes a batch of cells: one transaction per shard, shards in
    /// parallel. Returns one result per cell, in input order. An `Err` for
    /// the whole call means nothing was attempted (unknown datastore, batch
    /// too large).
    pub async fn put_cells(&self, datastore: &str, cells: Vec<NewCell>) -> Result<Vec<PutResult>> {
        let ds = self.datastore(datastore)?;
        if cells.len() > self.inner.max_batch {
            return Err(Error::LimitExceeded {
                what: format!("a batch of {} cells", cells.len()),
                limit: self.inner.max_batch,
            });
        }
        let mut results: Vec<Option<PutResult>> = vec![None; cells.len()];
        // First occurrence of each key in the batch, with a hash of its body.
        let mut first_of: HashMap<CellKey, (usize, u64)> = HashMap::new();
        let mut repeats = Vec::new();
        let mut groups: BTreeMap<u32, Vec<Prepared>> = BTreeMap::new();
        for (index, cell) in cells.into_iter().enumerate() {
            let prepared = match prepare(&ds, index, cell) {
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
            let shard = row_shard(&prepared.key.row_key, ds.def.shards);
            groups.entry(shard).or_default().push(prepared);
        }
        let concurrency = if self.inner.clusters.len() > 1 { 8 } else { 4 };
        let outcomes: Vec<Vec<(usize, PutResult)>> = futures::stream::iter(groups)
            .map(|(shard, group)| self.write_shard(&ds, shard, group))
            .buffer_unordered(concurrency)
            .collect()
            .await;
        for (index, result) in outcomes.into_iter().flatten() {
            results[index] = Some(result);
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
        Ok(results
            .into_iter()
            .map(|r| r.expect("every cell has a result"))
            .collect())
    }

    async fn write_shard(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        group: Vec<Prepared>,
    ) -> Vec<(usize, PutResult)> {
        let fail_all = |group: &[Prepared], err: Error| {
            let err = Arc::new(err);
            group
                .iter()
                .map(|p| (p.index, Err(err.clone())))
                .collect::<Vec<_>>()
        };
        let buffered = match self.buffer(ds, shard, &group).await {
            Ok(buffered) => buffered,
            Err(err) => return fail_all(&group, err),
        };
        let primary = async {
            self.ensure_shard(ds, shard).await?;
            let master = self.master(ds, shard);
            let mut attempt = 0;
            loop {
                match commit_primary(master.as_ref(), &ds.def.name, shard, &group).await {
                    Err(err) if err.is_retryable() && attempt < 8 => {
                        attempt += 1;
                        crate::store::backoff(attempt).await;
                    }
                    other => return other,
                }
            }
        }
        .await;
        match primary {
            Ok(statuses) => {
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
                if written > 0 {
                    self.inner.maintainer.note_write(&ds.def.name, shard);
                    self.inner.maintainer.wake(&ds.def.name, shard);
                }
                self.release_buffers(ds, shard, buffered).await;
                group.iter().map(|p| p.index).zip(statuses).collect()
            }
            Err(err @ Error::Unavailable { .. }) if !buffered.is_empty() => {
                tracing::warn!(datastore = %ds.def.name, shard, error = %err, "primary unavailable; cells kept in buffer");
                group
                    .iter()
                    .map(|p| (p.index, Ok(PutStatus::Buffered)))
                    .collect()
            }
            Err(err) => {
                self.release_buffers(ds, shard, buffered).await;
                fail_all(&group, err)
            }
        }
    }

    /// Writes the group into the buffer tables of randomly chosen secondary
    /// clusters; returns `(cluster, buffer ids)` per copy.
    async fn buffer(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        group: &[Prepared],
    ) -> Result<Vec<(usize, Vec<i64>)>> {
        if self.inner.buffer_count == 0 {
            return Ok(Vec::new());
        }
        let primary = ds.map.cluster_of(shard);
        let mut secondaries: Vec<usize> = (0..self.inner.clusters.len())
            .filter(|c| *c != primary)
            .collect();
        secondaries.shuffle(&mut rand::thread_rng());
        secondaries.truncate(self.inner.buffer_count);
        let created_at = Value::DateTime(truncate_to_micros(Utc::now()));
        let mut copies = Vec::new();
        for cluster in secondaries {
            self.ensure_buffer(ds, shard, cluster).await?;
            let backend = &self.inner.clusters[cluster].master;
            let table = ddl::buffer_table(&ds.def.name, shard);
            let mut tx = backend.begin().await?;
            let mut ids = Vec::new();
            for cell in group {
                let sql = insert_cell_sql(backend.dialect(), &table, cell, created_at.clone());
                ids.push(tx.insert_returning_id(&sql, "buffer_id").await?);
            }
            tx.commit().await?;
            copies.push((cluster, ids));
        }
        Ok(copies)
    }

    /// Deletes buffered copies once the primary has the cells (or refused
    /// them for good). Best effort: a leftover copy is replayed harmlessly.
    async fn release_buffers(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        copies: Vec<(usize, Vec<i64>)>,
    ) {
        for (cluster, ids) in copies {
            let backend = &self.inner.clusters[cluster].master;
            let mut sql = Sql::new(backend.dialect());
            sql.push("DELETE FROM ")
                .ident(&ddl::buffer_table(&ds.def.name, shard))
                .push(" WHERE ")
                .ident("buffer_id")
                .push(" IN ")
                .bind_list(ids.into_iter().map(Value::Int));
            if let Err(err) = backend.execute(&sql).await {
                tracing::warn!(cluster = %backend.cluster(), error = %err, "could not release buffered cells");
            }
        }
    }
}

fn prepare(ds: &DatastoreRuntime, index: usize, cell: NewCell) -> Result<Prepared> {
    ds.check_column(&cell.column)?;
    let encoded = codec::encode(&cell.body).map_err(|reason| Error::InvalidBody {
        row_key: cell.row_key,
        column: cell.column.clone(),
        ref_key: cell.ref_key,
        reason,
    })?;
    Ok(Prepared {
        index,
        key: CellKey {
            row_key: cell.row_key,
            column: cell.column,
            ref_key: cell.ref_key,
        },
        body: cell.body,
        encoded,
    })
}

fn insert_cell_sql(
    dialect: crate::storage::Dialect,
    table: &str,
    cell: &Prepared,
    created_at: Value,
) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push("INSERT INTO ")
        .ident(table)
        .push(" (")
        .ident("row_key")
        .push(", ")
        .ident("column_name")
        .push(", ")
        .ident("ref_key")
        .push(", ")
        .ident("body")
        .push(", ")
        .ident("created_at")
        .push(") VALUES (")
        .bind(Value::Uuid(cell.key.row_key))
        .push(", ")
        .bind(Value::Text(cell.key.column.clone()))
        .push(", ")
        .bind(Value::Int(cell.key.ref_key))
        .push(", ")
        .bind(Value::Bytes(cell.encoded.clone()))
        .push(", ")
        .bind(created_at)
        .push(")");
    sql
}

/// One shard transaction on the primary: lock the shard, find which cells
/// exist, insert the new ones. Conflicting cells are reported and skipped;
/// the rest commit.
async fn commit_primary(
    master: &dyn Backend,
    datastore: &str,
    shard: u32,
    group: &[Prepared],
) -> Result<Vec<PutResult>> {
    let dialect = master.dialect();
    let mut tx = master.begin().await?;
    let mut lock = Sql::new(dialect);
    lock.push("UPDATE ")
        .ident(&ddl::meta_table(datastore, shard))
        .push(" SET ")
        .ident("writes")
        .push(" = ")
        .ident("writes")
        .push(" + 1 WHERE ")
        .ident("id")
        .push(" = 1");
    tx.execute(&lock).await?;
    let cells_table = ddl::cells_table(datastore, shard);
    let existing = existing_bodies(tx.as_mut(), dialect, &cells_table, group).await?;
    let created_at = Value::DateTime(truncate_to_micros(Utc::now()));
    let mut statuses = Vec::with_capacity(group.len());
    for cell in group {
        let status = match existing.get(&cell.key) {
            Some(stored) if *stored == cell.encoded => Ok(PutStatus::Duplicate),
            Some(stored) => match codec::decode(stored) {
                Ok(body) if body == cell.body => Ok(PutStatus::Duplicate),
                _ => Err(Arc::new(Error::CellConflict {
                    row_key: cell.key.row_key,
                    column: cell.key.column.clone(),
                    ref_key: cell.key.ref_key,
                })),
            },
            None => {
                let sql = insert_cell_sql(dialect, &cells_table, cell, created_at.clone());
                tx.execute(&sql).await?;
                Ok(PutStatus::Written)
            }
        };
        statuses.push(status);
    }
    tx.commit().await?;
    Ok(statuses)
}

/// The stored bodies of those cells of `group` that already exist.
async fn existing_bodies(
    tx: &mut dyn Tx,
    dialect: crate::storage::Dialect,
    table: &str,
    group: &[Prepared],
) -> Result<HashMap<CellKey, Vec<u8>>> {
    let mut found = HashMap::new();
    for chunk in group.chunks(LOOKUP_CHUNK) {
        let mut sql = Sql::new(dialect);
        sql.push("SELECT ")
            .ident("row_key")
            .push(", ")
            .ident("column_name")
            .push(", ")
            .ident("ref_key")
            .push(", ")
            .ident("body")
            .push(" FROM ")
            .ident(table)
            .push(" WHERE ")
            .ident("row_key")
            .push(" IN ")
            .bind_list(unique(chunk.iter().map(|c| Value::Uuid(c.key.row_key))))
            .push(" AND ")
            .ident("ref_key")
            .push(" IN ")
            .bind_list(unique(chunk.iter().map(|c| Value::Int(c.key.ref_key))));
        let cols = [ColType::Uuid, ColType::Text, ColType::Int, ColType::Bytes];
        for row in tx.fetch(&sql, &cols).await? {
            let mut row = row.into_iter();
            let (
                Some(Value::Uuid(row_key)),
                Some(Value::Text(column)),
                Some(Value::Int(ref_key)),
                Some(Value::Bytes(body)),
            ) = (row.next(), row.next(), row.next(), row.next())
            else {
                continue;
            };
            found.insert(
                CellKey {
                    row_key,
                    column,
                    ref_key,
                },
                body,
            );
        }
    }
    let wanted: std::collections::HashSet<&CellKey> = group.iter().map(|c| &c.key).collect();
    found.retain(|key, _| wanted.contains(key));
    Ok(found)
}
