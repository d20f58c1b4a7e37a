//! The cell log: a shard's cells in insertion (`added_id`) order.
//!
//! Clients read it through `cells_for_shard`; index maintenance reads the
//! logs of many shards at once, from each shard's persisted offset, with
//! [`log_keys`] (keys only, so a corrupt body cannot stop it), and learns
//! where each log ends from the shard counters ([`heads`]). A location is
//! either an `added_id` (cells strictly after it) or a timestamp (cells
//! from the first one inserted at or after it).

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::read::{cell_from_row, select_cells, CellRow};
use super::Cell;
use crate::error::{Error, Result};
use crate::replicas::{read_on, ReadOptions};
use crate::storage::{ddl, Backend, Dialect, Sql, Value, MAX_PARAMS};
use crate::topology::{DatastoreRuntime, Topology};

/// A position in a shard's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    /// After this `added_id` (0 = from the beginning).
    AddedId(i64),
    /// From the first cell created at or after this time.
    Timestamp(DateTime<Utc>),
}

/// One page of a shard's log.
#[derive(Debug, Clone, PartialEq)]
pub struct LogPage {
    pub cells: Vec<Cell>,
    /// Where the next page starts; equal to the request's location (as an
    /// `added_id`) when nothing new was found.
    pub next: Location,
}

/// A log entry without its body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct LogKey {
    pub shard: u32,
    pub added_id: i64,
    pub row_key: uuid::Uuid,
    pub column: String,
    pub created_at: DateTime<Utc>,
}

/// Largest page the log hands out.
pub const MAX_LOG_PAGE: u32 = 1000;

/// Up to `limit` cells of `shard` after `location`, in insertion order.
pub(crate) async fn cells_for_shard(
    topology: &Topology,
    datastore: &str,
    shard: u32,
    location: Location,
    limit: u32,
    read: &ReadOptions,
) -> Result<LogPage> {
    let ds = topology.datastore(datastore)?;
    if shard >= ds.def.shards {
        return Err(Error::BadInput(format!(
            "shard {shard} does not exist: datastore `{}` has shards 0-{}",
            ds.name(),
            ds.def.shards - 1
        )));
    }
    let cluster = ds.map().cluster_of(shard);
    let shards = BTreeSet::from([shard]);
    read_on(topology, &ds, cluster, &shards, read, |node| {
        let ds = &ds;
        async move {
            let after = match location {
                Location::AddedId(id) => id,
                Location::Timestamp(at) => added_id_before(node.as_ref(), ds, shard, at).await?,
            };
            let mut sql = Sql::new(node.dialect());
            select_cells(&mut sql, &ddl::cells_table(ds.name()), None);
            sql.push(" WHERE ")
                .ident("shard")
                .push(" = ")
                .bind(Value::Int(i64::from(shard)))
                .push(" AND ")
                .ident("added_id")
                .push(" > ")
                .bind(Value::Int(after))
                .push(" ORDER BY ")
                .ident("added_id")
                .push(&format!(" LIMIT {}", limit.clamp(1, MAX_LOG_PAGE)));
            let cells = node
                .rows::<CellRow>(&sql)
                .await?
                .into_iter()
                .map(cell_from_row)
                .collect::<Result<Vec<_>>>()?;
            let next = Location::AddedId(cells.last().map_or(after, |c| c.added_id));
            Ok(LogPage { cells, next })
        }
    })
    .await
}

/// The `added_id` just before the first cell of `shard` created at or
/// after `at`; the shard's last `added_id` when there is none.
///
/// The cell table has no index on `created_at` (it would cost every write
/// an insertion for this seek alone): the statement reads the shard's
/// cells in `added_id` order from its start and stops at the first one
/// created at or after `at`, so it reads the shard's cells older than
/// that, once per seek; the pages after it read by `added_id`.
async fn added_id_before(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    shard: u32,
    at: DateTime<Utc>,
) -> Result<i64> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .ident("added_id")
        .push(" FROM ")
        .ident(&ddl::cells_table(ds.name()))
        .push(" WHERE ")
        .ident("shard")
        .push(" = ")
        .bind(Value::Int(i64::from(shard)))
        .push(" AND ")
        .ident("created_at")
        .push(" >= ")
        .bind(Value::DateTime(at))
        .push(" ORDER BY ")
        .ident("added_id")
        .push(" LIMIT 1");
    if let Some((id,)) = backend.first_row::<(i64,)>(&sql).await? {
        return Ok(id - 1);
    }
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .ident("next_added_id")
        .push(" FROM ")
        .ident(&ddl::shards_table(ds.name()))
        .push(" WHERE ")
        .ident("shard")
        .push(" = ")
        .bind(Value::Int(i64::from(shard)));
    let next = backend.first_row::<(i64,)>(&sql).await?;
    // A fenced counter (a shard moving away) is negated: its head stays.
    Ok(next.map_or(1, |(next,)| next.abs()) - 1)
}

/// The keys of the cells after each `(shard, after)` position, in shard
/// and insertion order, at most `limit` in all, in one statement. The last
/// shard of a full page may be cut short; the others are complete up to
/// the moment of the read.
pub(crate) async fn log_keys(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    positions: &[(u32, i64)],
    limit: usize,
) -> Result<Vec<LogKey>> {
    let mut keys = Vec::new();
    let terms = backend.dialect().max_or_terms().min(MAX_PARAMS / 2);
    for chunk in positions.chunks(terms) {
        if keys.len() >= limit {
            break;
        }
        let sql = log_keys_sql(backend.dialect(), ds, chunk, limit - keys.len());
        type Row = (i64, i64, Uuid, String, DateTime<Utc>);
        for (shard, added_id, row_key, column, created_at) in backend.rows::<Row>(&sql).await? {
            keys.push(LogKey {
                shard: shard as u32,
                added_id,
                row_key,
                column,
                created_at,
            });
        }
    }
    Ok(keys)
}

/// Up to `limit` whole cells of `columns` (all when empty) after
/// `positions`, in `(shard, added_id)` order: what trigger consumers read.
/// Like [`log_keys`], only the last shard of a full page may be cut short.
pub(crate) async fn log_cells(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    positions: &[(u32, i64)],
    columns: &[String],
    limit: usize,
) -> Result<Vec<Cell>> {
    let mut cells = Vec::new();
    let terms = backend
        .dialect()
        .max_or_terms()
        .min((MAX_PARAMS - columns.len()) / 2);
    for chunk in positions.chunks(terms) {
        if cells.len() >= limit {
            break;
        }
        let sql = log_sql(
            backend.dialect(),
            ds,
            chunk,
            &super::read::CELL_COLUMNS,
            columns,
            limit - cells.len(),
        );
        for row in backend.rows::<CellRow>(&sql).await? {
            cells.push(cell_from_row(row)?);
        }
    }
    Ok(cells)
}

/// The statement of [`log_keys`] for one chunk of positions.
fn log_keys_sql(
    dialect: Dialect,
    ds: &DatastoreRuntime,
    positions: &[(u32, i64)],
    limit: usize,
) -> Sql {
    const COLUMNS: [&str; 5] = ["shard", "added_id", "row_key", "column_name", "created_at"];
    log_sql(dialect, ds, positions, &COLUMNS, &[], limit)
}

/// Selects `select` of the log cells after `positions` (of the `columns`
/// given, all when empty), in `(shard, added_id)` order, at most `limit`.
///
/// PostgreSQL gets a join of the positions with the log, one index range
/// scan per position: given the `OR` form, it either scans the whole
/// primary key in order (seconds on a few hundred thousand cells) or
/// rechecks every term on every row found. MySQL's range optimizer and
/// SQLite's multi-index `OR` turn the `OR` form into one range per
/// position themselves.
fn log_sql(
    dialect: Dialect,
    ds: &DatastoreRuntime,
    positions: &[(u32, i64)],
    select: &[&str],
    columns: &[String],
    limit: usize,
) -> Sql {
    let table = ddl::cells_table(ds.name());
    let only = |sql: &mut Sql| {
        if !columns.is_empty() {
            sql.push(" AND ")
                .ident("column_name")
                .in_list(columns.iter().map(|c| Value::Text(c.clone())));
        }
    };
    let mut sql = Sql::new(dialect);
    if dialect.has_lateral_joins() {
        sql.push("SELECT ");
        for (i, column) in select.iter().enumerate() {
            if i > 0 {
                sql.push(", ");
            }
            sql.push("c.").ident(column);
        }
        sql.push(" FROM (")
            .rows(
                positions
                    .iter()
                    .map(|(shard, after)| vec![Value::Int(i64::from(*shard)), Value::Int(*after)]),
            )
            .push(") AS p(s, a) CROSS JOIN LATERAL (SELECT ")
            .idents(select.iter().copied())
            .push(" FROM ")
            .ident(&table)
            .push(" WHERE ")
            .ident("shard")
            .push(" = p.s AND ")
            .ident("added_id")
            .push(" > p.a");
        only(&mut sql);
        sql.push(" ORDER BY ")
            .ident("added_id")
            .push(&format!(" LIMIT {limit}) AS c ORDER BY c."))
            .ident("shard")
            .push(", c.")
            .ident("added_id");
    } else {
        sql.push("SELECT ")
            .idents(select.iter().copied())
            .push(" FROM ")
            .ident(&table)
            .push(" WHERE (");
        positions_condition(&mut sql, positions, " > ");
        sql.push(")");
        only(&mut sql);
        sql.push(" ORDER BY ").idents(["shard", "added_id"]);
    }
    sql.push(&format!(" LIMIT {limit}"));
    sql
}

/// Appends `(shard = ? AND added_id <op> ?) OR …` for `positions`.
pub(crate) fn positions_condition(sql: &mut Sql, positions: &[(u32, i64)], op: &str) {
    for (i, (shard, added_id)) in positions.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        sql.push("(")
            .ident("shard")
            .push(" = ")
            .bind(Value::Int(i64::from(*shard)))
            .push(" AND ")
            .ident("added_id")
            .push(op)
            .bind(Value::Int(*added_id))
            .push(")");
    }
}

/// The last `added_id` of every shard of `ds` held by the cluster of
/// `backend` (0 for an empty shard), in shard order.
pub(crate) async fn heads(backend: &dyn Backend, ds: &DatastoreRuntime) -> Result<Vec<(u32, i64)>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(["shard", "next_added_id"])
        .push(" FROM ")
        .ident(&ddl::shards_table(ds.name()))
        .push(" ORDER BY ")
        .ident("shard");
    Ok(backend
        .rows::<(i64, i64)>(&sql)
        .await?
        .into_iter()
        .map(|(shard, next)| (shard as u32, next.abs() - 1))
        .collect())
}

/// The cells in the logs of the datastore called `datastore` on the
/// cluster of `backend` (the sum of its shard counters), in one statement.
pub(crate) async fn log_length(backend: &dyn Backend, datastore: &str) -> Result<i64> {
    let dialect = backend.dialect();
    let integer = dialect.integer_cast();
    let mut sql = Sql::new(dialect);
    // SUM of a BIGINT is a NUMERIC (DECIMAL) on PostgreSQL and MySQL.
    sql.push("SELECT CAST(COALESCE(SUM(ABS(")
        .ident("next_added_id")
        .push(&format!(") - 1), 0) AS {integer}) FROM "))
        .ident(&ddl::shards_table(datastore));
    Ok(backend
        .first_row::<(i64,)>(&sql)
        .await?
        .map_or(0, |(sum,)| sum))
}

/// How far one shard's log consumer (its indexes, a trigger) is behind the
/// log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLag {
    pub shard: u32,
    /// Cells written but not yet applied by the consumer.
    pub pending_cells: i64,
}
