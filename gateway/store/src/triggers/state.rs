//! The SQL of trigger consumers: their offsets in `<ds>_offsets`, their
//! quarantine in `<ds>_trigger_quarantine`, and rewinds.
//!
//! Offsets move by compare-and-set: [`commit`] updates the offsets of a
//! batch's shards only where they still hold what the worker read, in one
//! statement, under the fence of the worker's leases. A rewind that landed
//! in between makes the statement match fewer rows than it names; the
//! transaction is then rolled back and the worker reloads its offsets.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{offsets_key, QuarantinedCell};
use crate::cells::{cell_from_row, select_cells, Cell, CellRow, Location};
use crate::error::{Error, Result};
use crate::leases::{self, Lease};
use crate::storage::value::truncate_to_micros;
use crate::storage::{ddl, Backend, Sql, Value, MAX_PARAMS};
use crate::topology::{ClusterState, DatastoreRuntime, Topology};

fn now() -> Value {
    Value::DateTime(truncate_to_micros(Utc::now()))
}

/// Creates the missing offset rows of `key` for `shards`, each at
/// `initial(shard)`.
pub(super) async fn ensure_offsets(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    key: &str,
    shards: &[(u32, i64)],
) -> Result<()> {
    let dialect = backend.dialect();
    let now = now();
    for chunk in shards.chunks(MAX_PARAMS / 4) {
        let mut sql = Sql::new(dialect);
        sql.push(dialect.insert_ignore())
            .ident(&ddl::offsets_table(ds.name()))
            .push(" (")
            .idents(["shard", "consumer", "added_id", "updated_at"])
            .push(") ")
            .rows(chunk.iter().map(|(shard, initial)| {
                vec![
                    Value::Int(i64::from(*shard)),
                    Value::Text(key.to_string()),
                    Value::Int(*initial),
                    now.clone(),
                ]
            }))
            .push(dialect.on_conflict_do_nothing());
        backend.execute(&sql).await?;
    }
    Ok(())
}

/// The stored offsets of `key` for `shards` (absent rows are left out).
pub(super) async fn read_offsets(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    key: &str,
    shards: &[u32],
) -> Result<BTreeMap<u32, i64>> {
    let mut offsets = BTreeMap::new();
    for chunk in shards.chunks(MAX_PARAMS - 1) {
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT ")
            .idents(["shard", "added_id"])
            .push(" FROM ")
            .ident(&ddl::offsets_table(ds.name()))
            .push(" WHERE ")
            .ident("consumer")
            .push(" = ")
            .bind(Value::Text(key.to_string()))
            .push(" AND ")
            .ident("shard")
            .in_list(chunk.iter().map(|s| Value::Int(i64::from(*s))));
        for (shard, added_id) in backend.rows::<(i64, i64)>(&sql).await? {
            offsets.insert(shard as u32, added_id);
        }
    }
    Ok(offsets)
}

/// `UPDATE <ds>_offsets SET added_id = <per shard>, updated_at = now
/// WHERE consumer = key`, for the caller to narrow.
fn update_offsets(
    dialect: crate::storage::Dialect,
    ds: &DatastoreRuntime,
    key: &str,
    offsets: &[(u32, i64)],
) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push("UPDATE ")
        .ident(&ddl::offsets_table(ds.name()))
        .push(" SET ")
        .ident("added_id")
        .push(" = CASE ")
        .ident("shard");
    for (shard, added_id) in offsets {
        sql.push(" WHEN ")
            .bind(Value::Int(i64::from(*shard)))
            .push(" THEN ")
            .bind(Value::Int(*added_id));
    }
    sql.push(" END, ")
        .ident("updated_at")
        .push(" = ")
        .bind(now())
        .push(" WHERE ")
        .ident("consumer")
        .push(" = ")
        .bind(Value::Text(key.to_string()));
    sql
}

/// A cell to quarantine, with its attempts and the handler's last error.
pub(super) struct Quarantine<'a> {
    pub(super) cell: &'a Cell,
    pub(super) attempts: u32,
    pub(super) message: &'a str,
}

/// In one transaction fenced by `held`: moves the offsets of `key` from
/// `old` to `new` per shard (`(shard, old, new)`) and records `quarantine`.
/// False (and nothing written) when an offset no longer holds its `old`
/// value: the consumer was rewound.
pub(super) async fn commit(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    key: &str,
    holder: &str,
    held: &[Lease],
    moves: &[(u32, i64, i64)],
    quarantine: &[Quarantine<'_>],
) -> Result<bool> {
    let dialect = backend.dialect();
    let now = now();
    let mut tx = backend.begin().await?;
    leases::fence(tx.as_mut(), dialect, holder, held).await?;
    for chunk in moves.chunks((MAX_PARAMS - 2) / 5) {
        let new: Vec<(u32, i64)> = chunk.iter().map(|(s, _, new)| (*s, *new)).collect();
        let mut sql = update_offsets(dialect, ds, key, &new);
        sql.push(" AND (");
        let old: Vec<(u32, i64)> = chunk.iter().map(|(s, old, _)| (*s, *old)).collect();
        crate::cells::positions_condition(&mut sql, &old, " = ");
        sql.push(")");
        if tx.execute(&sql).await? != chunk.len() as u64 {
            // Dropping the transaction rolls it back.
            return Ok(false);
        }
    }
    for chunk in quarantine.chunks(MAX_PARAMS / 10) {
        let mut sql = Sql::new(dialect);
        sql.push(dialect.insert_ignore())
            .ident(&ddl::trigger_quarantine_table(ds.name()))
            .push(" (")
            .idents(QUARANTINE_COLUMNS)
            .push(") ")
            .rows(chunk.iter().map(|q| {
                vec![
                    Value::Text(key.to_string()),
                    Value::Int(i64::from(q.cell.shard)),
                    Value::Int(q.cell.added_id),
                    Value::Uuid(q.cell.row_key),
                    Value::Text(q.cell.column.clone()),
                    Value::Int(q.cell.ref_key),
                    Value::Int(i64::from(q.attempts)),
                    Value::Text(q.message.to_string()),
                    Value::Int(0),
                    now.clone(),
                ]
            }))
            .push(dialect.on_conflict_do_nothing());
        tx.execute(&sql).await?;
    }
    tx.commit().await?;
    Ok(true)
}

const QUARANTINE_COLUMNS: [&str; 10] = [
    "consumer",
    "shard",
    "added_id",
    "row_key",
    "column_name",
    "ref_key",
    "attempts",
    "message",
    "retry",
    "quarantined_at",
];

/// A row of [`QUARANTINE_COLUMNS`].
type QuarantineRow = (
    String,
    i64,
    i64,
    Uuid,
    String,
    i64,
    i64,
    String,
    i64,
    DateTime<Utc>,
);

/// The quarantined cells of `key` on one cluster, those asked to be
/// delivered again only with `retry_only`.
pub(super) async fn quarantined(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    key: &str,
    retry_only: bool,
) -> Result<Vec<QuarantinedCell>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(QUARANTINE_COLUMNS)
        .push(" FROM ")
        .ident(&ddl::trigger_quarantine_table(ds.name()))
        .push(" WHERE ")
        .ident("consumer")
        .push(" = ")
        .bind(Value::Text(key.to_string()));
    if retry_only {
        sql.push(" AND ").ident("retry").push(" = 1");
    }
    sql.push(" ORDER BY ").idents(["shard", "added_id"]);
    let name = key.strip_prefix("trig:").unwrap_or(key).to_string();
    Ok(backend
        .rows::<QuarantineRow>(&sql)
        .await?
        .into_iter()
        .map(
            |(_, shard, added_id, row_key, column, ref_key, attempts, message, retry, at)| {
                QuarantinedCell {
                    consumer: name.clone(),
                    shard: shard as u32,
                    added_id,
                    row_key,
                    column,
                    ref_key,
                    attempts,
                    message,
                    retry: retry != 0,
                    quarantined_at: at,
                }
            },
        )
        .collect())
}

/// How many cells of `key` one cluster holds in quarantine.
pub(super) async fn quarantine_count(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    key: &str,
) -> Result<u64> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT COUNT(*) FROM ")
        .ident(&ddl::trigger_quarantine_table(ds.name()))
        .push(" WHERE ")
        .ident("consumer")
        .push(" = ")
        .bind(Value::Text(key.to_string()));
    Ok(backend.first_row::<(i64,)>(&sql).await?.map_or(0, |(n,)| n) as u64)
}

/// Ends the quarantine of a cell delivered again: deleted when the handler
/// took it, else back to waiting with its new attempts and error.
pub(super) async fn resolve(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    key: &str,
    cell: &QuarantinedCell,
    failed: Option<(u32, &str)>,
) -> Result<()> {
    let mut sql = Sql::new(backend.dialect());
    match failed {
        None => {
            sql.push("DELETE FROM ")
                .ident(&ddl::trigger_quarantine_table(ds.name()));
        }
        Some((attempts, message)) => {
            sql.push("UPDATE ")
                .ident(&ddl::trigger_quarantine_table(ds.name()))
                .push(" SET ")
                .ident("retry")
                .push(" = 0, ")
                .ident("attempts")
                .push(" = ")
                .bind(Value::Int(cell.attempts + i64::from(attempts)))
                .push(", ")
                .ident("message")
                .push(" = ")
                .bind(Value::Text(message.to_string()));
        }
    }
    sql.push(" WHERE ")
        .ident("consumer")
        .push(" = ")
        .bind(Value::Text(key.to_string()))
        .push(" AND ")
        .ident("shard")
        .push(" = ")
        .bind(Value::Int(i64::from(cell.shard)))
        .push(" AND ")
        .ident("added_id")
        .push(" = ")
        .bind(Value::Int(cell.added_id));
    backend.execute(&sql).await?;
    Ok(())
}

/// The cell at `(shard, added_id)`, if stored.
pub(super) async fn cell_at(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    shard: u32,
    added_id: i64,
) -> Result<Option<Cell>> {
    let mut sql = Sql::new(backend.dialect());
    select_cells(&mut sql, &ddl::cells_table(ds.name()), None);
    sql.push(" WHERE ")
        .ident("shard")
        .push(" = ")
        .bind(Value::Int(i64::from(shard)))
        .push(" AND ")
        .ident("added_id")
        .push(" = ")
        .bind(Value::Int(added_id));
    let row = backend.first_row::<CellRow>(&sql).await?;
    row.map(cell_from_row).transpose()
}

/// The clusters holding shards of `ds` with their masters; an error when
/// one is not ready.
fn clusters<'t>(
    topology: &'t Topology,
    ds: &DatastoreRuntime,
) -> Result<Vec<(usize, &'t std::sync::Arc<dyn Backend>)>> {
    (0..topology.clusters.len())
        .filter(|c| !ds.map().ranges_of(*c).is_empty() || !ds.work_map().ranges_of(*c).is_empty())
        .map(|c| {
            let cluster = &topology.clusters[c];
            if cluster.state() != ClusterState::Ready {
                return Err(Error::ClusterNotReady {
                    cluster: cluster.name.clone(),
                    reason: "not prepared yet".into(),
                });
            }
            Ok((c, cluster.master()?))
        })
        .collect()
}

/// The quarantined cells of consumer `name` of `datastore`, on every
/// cluster.
pub(crate) async fn list_quarantine(
    topology: &Topology,
    datastore: &str,
    name: &str,
) -> Result<Vec<QuarantinedCell>> {
    let ds = topology.datastore(datastore)?;
    let mut all = Vec::new();
    for (_, backend) in clusters(topology, &ds)? {
        all.extend(quarantined(backend.as_ref(), &ds, &offsets_key(name), false).await?);
    }
    Ok(all)
}

/// Asks for every quarantined cell of consumer `name` to be delivered
/// again (by the gateway holding its shard, at its next sweep); how many.
pub(crate) async fn retry_quarantine(
    topology: &Topology,
    datastore: &str,
    name: &str,
) -> Result<u64> {
    let ds = topology.datastore(datastore)?;
    let mut asked = 0;
    for (_, backend) in clusters(topology, &ds)? {
        let mut sql = Sql::new(backend.dialect());
        sql.push("UPDATE ")
            .ident(&ddl::trigger_quarantine_table(ds.name()))
            .push(" SET ")
            .ident("retry")
            .push(" = 1 WHERE ")
            .ident("consumer")
            .push(" = ")
            .bind(Value::Text(offsets_key(name)));
        asked += backend.execute(&sql).await?;
    }
    Ok(asked)
}

/// Moves every offset of consumer `name` to `to`: an `added_id` (cells
/// after it are delivered again, or skipped if it is ahead), or a time
/// (cells created at or after it are delivered again). A range in the
/// middle of a shard move (routed to its target, still followed on its
/// source until the drain) is rewound on both clusters, so the drain,
/// which hands the source's offsets to the target, keeps the rewind.
pub(crate) async fn rewind(
    topology: &Topology,
    datastore: &str,
    name: &str,
    to: Location,
) -> Result<u64> {
    let ds = topology.datastore(datastore)?;
    let key = offsets_key(name);
    let mut moved = 0;
    for (cluster, backend) in clusters(topology, &ds)? {
        let dialect = backend.dialect();
        let shards: Vec<u32> = ds
            .map()
            .ranges_of(cluster)
            .into_iter()
            .chain(ds.work_map().ranges_of(cluster))
            .flat_map(|(a, b)| a..=b)
            .collect::<std::collections::BTreeSet<u32>>()
            .into_iter()
            .collect();
        let targets: Vec<(u32, i64)> = match to {
            Location::AddedId(id) => shards.iter().map(|s| (*s, id)).collect(),
            Location::Timestamp(at) => before(backend.as_ref(), &ds, &shards, at).await?,
        };
        ensure_offsets(backend.as_ref(), &ds, &key, &targets).await?;
        for chunk in targets.chunks((MAX_PARAMS - 3) / 2) {
            let mut sql = update_offsets(dialect, &ds, &key, chunk);
            sql.push(" AND ")
                .ident("shard")
                .in_list(chunk.iter().map(|(s, _)| Value::Int(i64::from(*s))));
            moved += backend.execute(&sql).await?;
        }
    }
    Ok(moved)
}

/// Per shard, the last `added_id` created before `at` (0 when none), in
/// one statement that reads the cell table (which has no index on
/// `created_at`: a rewind to a time is rare, a write's index insertion is
/// not).
async fn before(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    shards: &[u32],
    at: DateTime<Utc>,
) -> Result<Vec<(u32, i64)>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .ident("shard")
        .push(", MAX(")
        .ident("added_id")
        .push(") FROM ")
        .ident(&ddl::cells_table(ds.name()))
        .push(" WHERE ")
        .ident("created_at")
        .push(" < ")
        .bind(Value::DateTime(at))
        .push(" GROUP BY ")
        .ident("shard");
    let found: BTreeMap<u32, i64> = backend
        .rows::<(i64, Option<i64>)>(&sql)
        .await?
        .into_iter()
        .filter_map(|(shard, added_id)| Some((shard as u32, added_id?)))
        .collect();
    Ok(shards
        .iter()
        .map(|s| (*s, found.get(s).copied().unwrap_or(0)))
        .collect())
}
