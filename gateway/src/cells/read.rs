//! The read path: a cell by its key, the latest version of a (row, column),
//! their batch forms (one query per shard), and a row's history.
//!
//! Reads go to the master of the shard's cluster, so a client reads its own
//! writes.

use std::collections::{BTreeMap, HashMap};

use uuid::Uuid;

use super::{codec, Cell, CellKey};
use crate::error::{Error, Result};
use crate::shards::row_shard;
use crate::storage::{ddl, ColType, Row, Sql, Value};
use crate::store::{DatastoreRuntime, Store};

/// Columns selected by every cell query, in this order.
pub(crate) const CELL_COLUMNS: [&str; 6] = [
    "added_id",
    "row_key",
    "column_name",
    "ref_key",
    "body",
    "created_at",
];
pub(crate) const CELL_TYPES: [ColType; 6] = [
    ColType::Int,
    ColType::Uuid,
    ColType::Text,
    ColType::Int,
    ColType::Bytes,
    ColType::DateTime,
];

/// Appends `SELECT <cell columns> FROM <table>` to `sql`.
pub(crate) fn select_cells(sql: &mut Sql, table: &str, alias: Option<&str>) {
    sql.push("SELECT ");
    for (i, col) in CELL_COLUMNS.iter().enumerate() {
        if i > 0 {
            sql.push(", ");
        }
        if let Some(alias) = alias {
            sql.push(alias).push(".");
        }
        sql.ident(col);
    }
    sql.push(" FROM ").ident(table);
    if let Some(alias) = alias {
        sql.push(" ").push(alias);
    }
}

/// Turns a row of [`CELL_COLUMNS`] into a cell, decoding its body.
pub(crate) fn cell_from_row(row: Row, shard: u32) -> Result<Cell> {
    let mut row = row.into_iter();
    let mut next = || row.next().unwrap_or(Value::Null(ColType::Int));
    let (added_id, row_key, column, ref_key, body, created_at) =
        (next(), next(), next(), next(), next(), next());
    let (
        Value::Int(added_id),
        Value::Uuid(row_key),
        Value::Text(column),
        Value::Int(ref_key),
        Value::Bytes(body),
        Value::DateTime(created_at),
    ) = (added_id, row_key, column, ref_key, body, created_at)
    else {
        return Err(Error::Storage(sqlx::Error::Decode(
            "cell row has unexpected NULLs".into(),
        )));
    };
    let body = codec::decode(&body).map_err(|reason| Error::CorruptBody {
        row_key,
        column: column.clone(),
        ref_key,
        reason,
    })?;
    Ok(Cell {
        row_key,
        column,
        ref_key,
        body,
        created_at,
        shard,
        added_id,
    })
}

fn key_condition(sql: &mut Sql, row_key: Uuid, column: &str) {
    sql.push(" WHERE ")
        .ident("row_key")
        .push(" = ")
        .bind(Value::Uuid(row_key))
        .push(" AND ")
        .ident("column_name")
        .push(" = ")
        .bind(Value::Text(column.to_string()));
}

impl Store {
    async fn fetch_cells(&self, ds: &DatastoreRuntime, shard: u32, sql: &Sql) -> Result<Vec<Cell>> {
        let rows = self.master(ds, shard).fetch(sql, &CELL_TYPES).await?;
        rows.into_iter()
            .map(|row| cell_from_row(row, shard))
            .collect()
    }

    /// The cell at `key`, if it exists.
    pub async fn get_cell(&self, datastore: &str, key: &CellKey) -> Result<Option<Cell>> {
        let ds = self.datastore(datastore)?;
        ds.check_column(&key.column)?;
        let shard = row_shard(&key.row_key, ds.def.shards);
        self.ensure_shard(&ds, shard).await?;
        let master = self.master(&ds, shard);
        let mut sql = Sql::new(master.dialect());
        select_cells(&mut sql, &ddl::cells_table(&ds.def.name, shard), None);
        key_condition(&mut sql, key.row_key, &key.column);
        sql.push(" AND ")
            .ident("ref_key")
            .push(" = ")
            .bind(Value::Int(key.ref_key));
        Ok(self.fetch_cells(&ds, shard, &sql).await?.pop())
    }

    /// The cell of `(row_key, column)` with the highest ref key.
    pub async fn get_cell_latest(
        &self,
        datastore: &str,
        row_key: Uuid,
        column: &str,
    ) -> Result<Option<Cell>> {
        Ok(self
            .history(datastore, row_key, column, 1, None)
            .await?
            .pop())
    }

    /// Versions of `(row_key, column)`, newest first, at most `limit`, with
    /// ref keys below `before` when given.
    pub async fn history(
        &self,
        datastore: &str,
        row_key: Uuid,
        column: &str,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Vec<Cell>> {
        let ds = self.datastore(datastore)?;
        ds.check_column(column)?;
        let shard = row_shard(&row_key, ds.def.shards);
        self.ensure_shard(&ds, shard).await?;
        let master = self.master(&ds, shard);
        let mut sql = Sql::new(master.dialect());
        select_cells(&mut sql, &ddl::cells_table(&ds.def.name, shard), None);
        key_condition(&mut sql, row_key, column);
        if let Some(before) = before {
            sql.push(" AND ")
                .ident("ref_key")
                .push(" < ")
                .bind(Value::Int(before));
        }
        sql.push(" ORDER BY ")
            .ident("ref_key")
            .push(&format!(" DESC LIMIT {}", limit.max(1)));
        self.fetch_cells(&ds, shard, &sql).await
    }

    /// Cells by key; one query per shard. Results follow the input order.
    pub async fn get_cells(&self, datastore: &str, keys: &[CellKey]) -> Result<Vec<Option<Cell>>> {
        let ds = self.datastore(datastore)?;
        let mut by_shard: BTreeMap<u32, Vec<&CellKey>> = BTreeMap::new();
        for key in keys {
            ds.check_column(&key.column)?;
            by_shard
                .entry(row_shard(&key.row_key, ds.def.shards))
                .or_default()
                .push(key);
        }
        let mut found: HashMap<CellKey, Cell> = HashMap::new();
        for (shard, keys) in by_shard {
            self.ensure_shard(&ds, shard).await?;
            let master = self.master(&ds, shard);
            let mut sql = Sql::new(master.dialect());
            select_cells(&mut sql, &ddl::cells_table(&ds.def.name, shard), None);
            sql.push(" WHERE ")
                .ident("row_key")
                .push(" IN ")
                .bind_list(unique(keys.iter().map(|k| Value::Uuid(k.row_key))))
                .push(" AND ")
                .ident("ref_key")
                .push(" IN ")
                .bind_list(unique(keys.iter().map(|k| Value::Int(k.ref_key))));
            for cell in self.fetch_cells(&ds, shard, &sql).await? {
                found.insert(
                    CellKey {
                        row_key: cell.row_key,
                        column: cell.column.clone(),
                        ref_key: cell.ref_key,
                    },
                    cell,
                );
            }
        }
        Ok(keys.iter().map(|k| found.get(k).cloned()).collect())
    }

    /// The latest cell of each `(row_key, column)`; one query per shard.
    pub async fn get_cells_latest(
        &self,
        datastore: &str,
        wanted: &[(Uuid, String)],
    ) -> Result<Vec<Option<Cell>>> {
        let ds = self.datastore(datastore)?;
        let mut by_shard: BTreeMap<u32, Vec<&(Uuid, String)>> = BTreeMap::new();
        for pair in wanted {
            ds.check_column(&pair.1)?;
            by_shard
                .entry(row_shard(&pair.0, ds.def.shards))
                .or_default()
                .push(pair);
        }
        let mut found: HashMap<(Uuid, String), Cell> = HashMap::new();
        for (shard, pairs) in by_shard {
            self.ensure_shard(&ds, shard).await?;
            let rows: Vec<Uuid> = pairs.iter().map(|p| p.0).collect();
            let columns: Vec<String> = pairs.iter().map(|p| p.1.clone()).collect();
            for cell in self.latest_in_shard(&ds, shard, &rows, &columns).await? {
                let cell = cell?;
                found.insert((cell.row_key, cell.column.clone()), cell);
            }
        }
        Ok(wanted.iter().map(|k| found.get(k).cloned()).collect())
    }

    /// The latest cells of `columns` for `rows`, all in `shard`.
    pub(crate) async fn latest_in_shard(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        rows: &[Uuid],
        columns: &[String],
    ) -> Result<Vec<Result<Cell>>> {
        if rows.is_empty() || columns.is_empty() {
            return Ok(Vec::new());
        }
        let master = self.master(ds, shard);
        let table = ddl::cells_table(&ds.def.name, shard);
        let mut sql = Sql::new(master.dialect());
        select_cells(&mut sql, &table, Some("c"));
        sql.push(" WHERE c.")
            .ident("row_key")
            .push(" IN ")
            .bind_list(unique(rows.iter().map(|r| Value::Uuid(*r))))
            .push(" AND c.")
            .ident("column_name")
            .push(" IN ")
            .bind_list(unique(columns.iter().map(|c| Value::Text(c.clone()))))
            .push(" AND c.")
            .ident("ref_key")
            .push(" = (SELECT MAX(m.")
            .ident("ref_key")
            .push(") FROM ")
            .ident(&table)
            .push(" m WHERE m.")
            .ident("row_key")
            .push(" = c.")
            .ident("row_key")
            .push(" AND m.")
            .ident("column_name")
            .push(" = c.")
            .ident("column_name")
            .push(")");
        let wanted: std::collections::HashSet<(Uuid, &str)> = rows
            .iter()
            .flat_map(|r| columns.iter().map(move |c| (*r, c.as_str())))
            .collect();
        // Bodies are decoded one by one: a corrupt cell is reported alone.
        let fetched = master.fetch(&sql, &CELL_TYPES).await?;
        Ok(fetched
            .into_iter()
            .map(|row| cell_from_row(row, shard))
            .filter(|c| match c {
                Ok(c) => wanted.contains(&(c.row_key, c.column.as_str())),
                Err(_) => true,
            })
            .collect())
    }
}

/// The distinct values, in first-seen order.
pub(crate) fn unique(values: impl Iterator<Item = Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for value in values {
        if !out.contains(&value) {
            out.push(value);
        }
    }
    out
}
