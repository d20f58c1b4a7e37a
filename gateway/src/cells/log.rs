//! The cell log: a shard's cells in insertion (`added_id`) order.
//!
//! Index maintenance and triggers read it from a persisted offset; clients
//! read it through `cells_for_shard`. A location is either an `added_id`
//! (cells strictly after it) or a timestamp (cells from the first one
//! inserted at or after it).

use chrono::{DateTime, Utc};

use super::read::select_cells;
use super::Cell;
use crate::error::{Error, Result};
use crate::storage::{ddl, ColType, Sql, Value};
use crate::store::{DatastoreRuntime, Store};

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
    pub added_id: i64,
    pub row_key: uuid::Uuid,
    pub column: String,
    pub created_at: DateTime<Utc>,
}

/// Largest page the log hands out.
pub const MAX_LOG_PAGE: u32 = 1000;

impl Store {
    /// Up to `limit` cells of `shard` after `location`, in insertion order.
    pub async fn cells_for_shard(
        &self,
        datastore: &str,
        shard: u32,
        location: Location,
        limit: u32,
    ) -> Result<LogPage> {
        let ds = self.datastore(datastore)?;
        if shard >= ds.def.shards {
            return Err(Error::BadInput(format!(
                "shard {shard} does not exist: datastore `{}` has shards 0-{}",
                ds.def.name,
                ds.def.shards - 1
            )));
        }
        self.ensure_shard(&ds, shard).await?;
        let after = match location {
            Location::AddedId(id) => id,
            Location::Timestamp(at) => self.added_id_before(&ds, shard, at).await?,
        };
        let cells = self
            .log_after(&ds, shard, after, limit.clamp(1, MAX_LOG_PAGE))
            .await?;
        let next = Location::AddedId(cells.last().map_or(after, |c| c.added_id));
        Ok(LogPage { cells, next })
    }

    /// Cells of `shard` with `added_id > after`, oldest first.
    pub(crate) async fn log_after(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        after: i64,
        limit: u32,
    ) -> Result<Vec<Cell>> {
        let master = self.master(ds, shard);
        let mut sql = Sql::new(master.dialect());
        select_cells(&mut sql, &ddl::cells_table(&ds.def.name, shard), None);
        page_after(&mut sql, after, limit);
        let rows = master.fetch(&sql, &super::read::CELL_TYPES).await?;
        rows.into_iter()
            .map(|row| super::read::cell_from_row(row, shard))
            .collect()
    }

    /// The `added_id` just before the first cell created at or after `at`.
    async fn added_id_before(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        at: DateTime<Utc>,
    ) -> Result<i64> {
        let master = self.master(ds, shard);
        let table = ddl::cells_table(&ds.def.name, shard);
        let mut sql = Sql::new(master.dialect());
        sql.push("SELECT MIN(")
            .ident("added_id")
            .push(") FROM ")
            .ident(&table)
            .push(" WHERE ")
            .ident("created_at")
            .push(" >= ")
            .bind(Value::DateTime(at));
        let first = master.fetch(&sql, &[ColType::Int]).await?;
        match first.first().and_then(|row| row[0].as_int()) {
            Some(id) => Ok(id - 1),
            None => self.max_added_id(ds, shard).await,
        }
    }

    /// The keys of the cells of `shard` with `added_id > after`, oldest
    /// first, without their bodies: what index maintenance needs, and a
    /// corrupt body cannot stop it.
    pub(crate) async fn log_keys_after(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        after: i64,
        limit: u32,
    ) -> Result<Vec<LogKey>> {
        let master = self.master(ds, shard);
        let mut sql = Sql::new(master.dialect());
        sql.push("SELECT ")
            .ident("added_id")
            .push(", ")
            .ident("row_key")
            .push(", ")
            .ident("column_name")
            .push(", ")
            .ident("created_at")
            .push(" FROM ")
            .ident(&ddl::cells_table(&ds.def.name, shard));
        page_after(&mut sql, after, limit);
        let types = [
            ColType::Int,
            ColType::Uuid,
            ColType::Text,
            ColType::DateTime,
        ];
        let rows = master.fetch(&sql, &types).await?;
        Ok(rows
            .into_iter()
            .filter_map(|row| {
                let mut row = row.into_iter();
                match (row.next()?, row.next()?, row.next()?, row.next()?) {
                    (
                        Value::Int(added_id),
                        Value::Uuid(row_key),
                        Value::Text(column),
                        Value::DateTime(created_at),
                    ) => Some(LogKey {
                        added_id,
                        row_key,
                        column,
                        created_at,
                    }),
                    _ => None,
                }
            })
            .collect())
    }

    /// The highest `added_id` of a shard (0 when empty).
    pub(crate) async fn max_added_id(&self, ds: &DatastoreRuntime, shard: u32) -> Result<i64> {
        let master = self.master(ds, shard);
        let mut sql = Sql::new(master.dialect());
        sql.push("SELECT MAX(")
            .ident("added_id")
            .push(") FROM ")
            .ident(&ddl::cells_table(&ds.def.name, shard));
        let rows = master.fetch(&sql, &[ColType::Int]).await?;
        Ok(rows.first().and_then(|row| row[0].as_int()).unwrap_or(0))
    }
}

/// Appends the log-page condition: cells after `after`, in insertion order,
/// at most `limit`.
fn page_after(sql: &mut Sql, after: i64, limit: u32) {
    sql.push(" WHERE ")
        .ident("added_id")
        .push(" > ")
        .bind(Value::Int(after))
        .push(" ORDER BY ")
        .ident("added_id")
        .push(&format!(" LIMIT {limit}"));
}
