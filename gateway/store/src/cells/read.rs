//! The read path: a cell by its key, the latest version of a (row, column),
//! their batch forms, and a row's history.
//!
//! Batch reads group their keys by cluster and run one statement per
//! cluster (per chunk of [`READ_CHUNK`] keys), never one per shard or per
//! row. Reads go to the master of the shard's cluster, so a client reads
//! its own writes.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{codec, Cell, CellCache, CellKey};
use crate::error::{Error, Result};
use crate::replicas::{read_on, ReadOptions};
use crate::shards::row_shard;
use crate::storage::{ddl, Backend, ColType, Dialect, FromRow, Row, Sql, Value};
use crate::topology::{DatastoreRuntime, Topology};

/// Keys per statement of a batch read.
pub(crate) const READ_CHUNK: usize = 500;

pub(crate) use ddl::CELL_COLUMNS;

/// A row of [`CELL_COLUMNS`]: shard, added id, row key, column, ref key,
/// encoded body, creation time.
pub(crate) type CellRow = (i64, i64, Uuid, String, i64, Vec<u8>, DateTime<Utc>);

/// The column types of a row of cell columns (shard, added id, row key,
/// column, ref key, encoded body, creation time), as [`latest_cells_sql`]
/// returns them.
pub const CELL_TYPES: &[ColType] = <CellRow as FromRow>::TYPES;

/// Appends `SELECT <cell columns> FROM <table> [alias]` to `sql`.
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

/// Turns a row of the cell columns into a cell, decoding its body.
pub(crate) fn cell_from_row(row: CellRow) -> Result<Cell> {
    cell_of(row, &codec::decode)
}

/// How a read decodes the bodies of the cells it returns.
pub(crate) type Decode<'a, B> = &'a (dyn Fn(&[u8]) -> std::result::Result<B, String> + Sync);

/// [`cell_from_row`], with the body decoded by `decode`.
pub(crate) fn decoded_cell<B>(row: Row, decode: Decode<'_, B>) -> Result<Cell<B>> {
    let Some(row) = CellRow::from_row(row) else {
        return Err(Error::Internal("cell row has unexpected NULLs".into()));
    };
    cell_of(row, decode)
}

/// The cell of a typed row, its body decoded by `decode`.
fn cell_of<B>(row: CellRow, decode: Decode<'_, B>) -> Result<Cell<B>> {
    let body = decode(&row.5).map_err(|reason| Error::CorruptBody {
        row_key: row.2,
        column: row.3.clone(),
        ref_key: row.4,
        reason,
    })?;
    Ok(cell_with(row, body))
}

/// The cell of a typed row with `body` in place of its stored bytes.
fn cell_with<B>(
    (shard, added_id, row_key, column, ref_key, _, created_at): CellRow,
    body: B,
) -> Cell<B> {
    Cell {
        row_key,
        column,
        ref_key,
        body,
        created_at,
        shard: shard as u32,
        added_id,
    }
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

async fn fetch_cells(backend: &dyn Backend, sql: &Sql) -> Result<Vec<Cell>> {
    let rows = backend.rows::<CellRow>(sql).await?;
    rows.into_iter().map(cell_from_row).collect()
}

/// The cell at `key`, if it exists.
pub(crate) async fn get_cell(
    topology: &Topology,
    cache: &CellCache,
    datastore: &str,
    key: &CellKey,
    read: &ReadOptions,
) -> Result<Option<Cell>> {
    Ok(
        get_cells(topology, cache, datastore, std::slice::from_ref(key), read)
            .await?
            .pop()
            .flatten(),
    )
}

/// Versions of `(row_key, column)`, newest first, at most `limit`, with
/// ref keys below `before` when given.
pub(crate) async fn history(
    topology: &Topology,
    datastore: &str,
    row_key: Uuid,
    column: &str,
    limit: u32,
    before: Option<i64>,
    read: &ReadOptions,
) -> Result<Vec<Cell>> {
    let ds = topology.datastore(datastore)?;
    ds.check_column(column)?;
    let shard = row_shard(&row_key, ds.def.shards);
    let cluster = ds.map().cluster_of(shard);
    let shards = std::iter::once(shard).collect();
    let table = ddl::cells_table(ds.name());
    read_on(topology, &ds, cluster, &shards, read, |node| {
        let table = &table;
        async move {
            let mut sql = Sql::new(node.dialect());
            select_cells(&mut sql, table, None);
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
            fetch_cells(node.as_ref(), &sql).await
        }
    })
    .await
}

/// Cells by key; one statement per cluster and chunk for the cells the
/// cache does not hold. Results follow the input order.
pub(crate) async fn get_cells(
    topology: &Topology,
    cache: &CellCache,
    datastore: &str,
    keys: &[CellKey],
    read: &ReadOptions,
) -> Result<Vec<Option<Cell>>> {
    get_cells_json(topology, cache, datastore, keys, read)
        .await?
        .into_iter()
        .map(|cell| cell.map(parsed_cell).transpose())
        .collect()
}

/// A cell with its JSON text body parsed.
fn parsed_cell(cell: Cell<Vec<u8>>) -> Result<Cell> {
    let body = serde_json::from_slice(&cell.body).map_err(|e| Error::CorruptBody {
        row_key: cell.row_key,
        column: cell.column.clone(),
        ref_key: cell.ref_key,
        reason: format!("JSON: {e}"),
    })?;
    Ok(Cell {
        row_key: cell.row_key,
        column: cell.column,
        ref_key: cell.ref_key,
        body,
        created_at: cell.created_at,
        shard: cell.shard,
        added_id: cell.added_id,
    })
}

/// [`get_cells`] with each body as its JSON text: from the cell cache
/// where it holds the cell, else from the database, keeping what it read.
pub(crate) async fn get_cells_json(
    topology: &Topology,
    cache: &CellCache,
    datastore: &str,
    keys: &[CellKey],
    read: &ReadOptions,
) -> Result<Vec<Option<Cell<Vec<u8>>>>> {
    let ds = topology.datastore(datastore)?;
    for key in keys {
        ds.check_column(&key.column)?;
    }
    let mut found: Vec<Option<Cell<Vec<u8>>>> =
        keys.iter().map(|k| cache.get_key(ds.name(), k)).collect();
    cache_span(
        ds.name(),
        found.iter().filter(|c| c.is_some()).count(),
        keys.len(),
    );
    // How many of the keys not found ask for each cell.
    let mut wanted: HashMap<&CellKey, usize> = HashMap::new();
    for (key, cell) in keys.iter().zip(&found) {
        if cell.is_none() {
            *wanted.entry(key).or_default() += 1;
        }
    }
    if wanted.is_empty() {
        return Ok(found);
    }
    let missing: Vec<CellKey> = wanted.keys().map(|&key| key.clone()).collect();
    let mut read_now = fetch_by_key(topology, &ds, &missing, read).await?;
    for cell in read_now.values() {
        cache.insert(ds.name(), cell);
    }
    // Each cell is cloned for all but the last key asking for it, which
    // takes it.
    for (key, slot) in keys.iter().zip(found.iter_mut()) {
        if slot.is_some() {
            continue;
        }
        let Some(left) = wanted.get_mut(key) else {
            continue;
        };
        *left -= 1;
        *slot = if *left == 0 {
            read_now.remove(key)
        } else {
            read_now.get(key).cloned()
        };
    }
    Ok(found)
}

/// The cells at `keys`, bodies as JSON text, read from the database: one
/// statement per cluster and chunk.
async fn fetch_by_key(
    topology: &Topology,
    ds: &DatastoreRuntime,
    keys: &[CellKey],
    read: &ReadOptions,
) -> Result<HashMap<CellKey, Cell<Vec<u8>>>> {
    let table = ddl::cells_table(ds.name());
    let rows = fetch_by_row::<_, CellRow>(
        topology,
        ds,
        keys,
        |k| k.row_key,
        read,
        |dialect, chunk| {
            let mut sql = Sql::new(dialect);
            select_cells(&mut sql, &table, None);
            sql.push(" WHERE ")
                .ident("row_key")
                .in_list(uuid_list(chunk.iter().map(|k| k.row_key)))
                .push(" AND ")
                .ident("column_name")
                .in_list(text_list(chunk.iter().map(|k| k.column.as_str())))
                .push(" AND ")
                .ident("ref_key")
                .in_list(int_list(chunk.iter().map(|k| k.ref_key)));
            sql
        },
    )
    .await?;
    let wanted: HashSet<&CellKey> = keys.iter().collect();
    let mut found = HashMap::new();
    for row in rows {
        let cell = cell_of(row, &codec::decode_json)?;
        let key = CellKey {
            row_key: cell.row_key,
            column: cell.column.clone(),
            ref_key: cell.ref_key,
        };
        // The `IN` lists also match keys that were not asked for.
        if wanted.contains(&key) {
            found.insert(key, cell);
        }
    }
    Ok(found)
}

/// The rows of the statements `sql` builds for `items`, each run on the
/// cluster holding its items' rows (through `read_on`, so as `read`
/// allows), clusters in parallel: one statement per cluster and chunk of
/// [`READ_CHUNK`] items, never one per shard or per row.
async fn fetch_by_row<I: Sync, R: FromRow + Send>(
    topology: &Topology,
    ds: &DatastoreRuntime,
    items: &[I],
    row_key: impl Fn(&I) -> Uuid + Sync,
    read: &ReadOptions,
    sql: impl Fn(Dialect, &[&I]) -> Sql + Sync,
) -> Result<Vec<R>> {
    let shard_of = |item: &I| row_shard(&row_key(item), ds.def.shards);
    let groups = topology.by_cluster(ds, items.iter().map(|item| (shard_of(item), item)));
    let reads = groups.into_iter().map(|(cluster, group)| {
        let (sql, shard_of) = (&sql, &shard_of);
        async move {
            let shards = group.iter().map(|item| shard_of(item)).collect();
            read_on(topology, ds, cluster, &shards, read, |node| {
                let group = &group;
                async move {
                    let mut rows = Vec::new();
                    for chunk in group.chunks(READ_CHUNK) {
                        rows.extend(node.rows::<R>(&sql(node.dialect(), chunk)).await?);
                    }
                    Ok::<_, Error>(rows)
                }
            })
            .await
        }
    });
    Ok(futures::future::try_join_all(reads)
        .await?
        .into_iter()
        .flatten()
        .collect())
}

/// The latest cell of each `(row_key, column)`; one statement per cluster
/// and chunk.
pub(crate) async fn get_cells_latest<B: Clone + Send>(
    topology: &Topology,
    datastore: &str,
    wanted: &[(Uuid, String)],
    decode: Decode<'_, B>,
    read: &ReadOptions,
) -> Result<Vec<Option<Cell<B>>>> {
    let ds = topology.datastore(datastore)?;
    for (_, column) in wanted {
        ds.check_column(column)?;
    }
    let table = ddl::cells_table(ds.name());
    let rows = fetch_by_row::<_, CellRow>(
        topology,
        &ds,
        wanted,
        |pair| pair.0,
        read,
        |dialect, chunk| {
            let rows: Vec<Uuid> = chunk.iter().map(|pair| pair.0).collect();
            let columns: Vec<&str> = chunk.iter().map(|pair| pair.1.as_str()).collect();
            latest_cells_sql(dialect, &table, &rows, &columns)
        },
    )
    .await?;
    let pairs: HashSet<(Uuid, &str)> = wanted
        .iter()
        .map(|(row, column)| (*row, column.as_str()))
        .collect();
    let mut found: HashMap<(Uuid, String), Cell<B>> = HashMap::new();
    for cell in latest_cells_from(rows, &pairs, decode) {
        let cell = cell?;
        found.insert((cell.row_key, cell.column.clone()), cell);
    }
    Ok(hand_out(wanted, found))
}

/// The cell of each pair of `wanted`, in order, from `found`: each cell is
/// moved out for the last pair that asks for it, and copied only for a
/// pair asked for twice.
fn hand_out<B: Clone>(
    wanted: &[(Uuid, String)],
    mut found: HashMap<(Uuid, String), Cell<B>>,
) -> Vec<Option<Cell<B>>> {
    let last: HashMap<&(Uuid, String), usize> =
        wanted.iter().enumerate().map(|(i, key)| (key, i)).collect();
    wanted
        .iter()
        .enumerate()
        .map(|(i, key)| {
            if last[key] == i {
                found.remove(key)
            } else {
                found.get(key).cloned()
            }
        })
        .collect()
}

/// [`get_cells_latest`] with bodies as JSON text, through the cell cache:
/// each pair's latest ref key is read from its cluster (one index-only
/// statement per cluster and chunk), the bodies come from the cache, and
/// the cells it does not keep are read by their full key and kept. A newer
/// version is therefore seen at once. Without the cache, the cells are
/// read whole in one statement per cluster and chunk.
pub(crate) async fn get_cells_latest_json(
    topology: &Topology,
    cache: &CellCache,
    datastore: &str,
    wanted: &[(Uuid, String)],
    read: &ReadOptions,
) -> Result<Vec<Option<Cell<Vec<u8>>>>> {
    if !cache.enabled() {
        return get_cells_latest(topology, datastore, wanted, &codec::decode_json, read).await;
    }
    let ds = topology.datastore(datastore)?;
    for (_, column) in wanted {
        ds.check_column(column)?;
    }
    let keys: Vec<CellKey> = latest_ref_keys(topology, &ds, wanted, read)
        .await?
        .into_iter()
        .map(|((row_key, column), ref_key)| CellKey {
            row_key,
            column,
            ref_key,
        })
        .collect();
    let cells = get_named_cells_json(topology, cache, datastore, &keys, read).await?;
    let found = keys
        .into_iter()
        .zip(cells)
        .filter_map(|(key, cell)| Some(((key.row_key, key.column), cell?)))
        .collect();
    Ok(hand_out(wanted, found))
}

/// [`get_cells_json`] for keys whose ref keys a read just named, perhaps
/// on a replica: a replica other than the one that named a key may not
/// have its cell yet, so the keys a replica read misses are read again on
/// the master, which has every cell it named.
pub(crate) async fn get_named_cells_json(
    topology: &Topology,
    cache: &CellCache,
    datastore: &str,
    keys: &[CellKey],
    read: &ReadOptions,
) -> Result<Vec<Option<Cell<Vec<u8>>>>> {
    let mut cells = get_cells_json(topology, cache, datastore, keys, read).await?;
    if cells.iter().any(Option::is_none) && read.wants_replica() {
        let again: Vec<CellKey> = keys
            .iter()
            .zip(&cells)
            .filter(|(_, cell)| cell.is_none())
            .map(|(key, _)| key.clone())
            .collect();
        let mut from_master =
            get_cells_json(topology, cache, datastore, &again, &ReadOptions::default())
                .await?
                .into_iter();
        for cell in cells.iter_mut().filter(|cell| cell.is_none()) {
            *cell = from_master.next().flatten();
        }
    }
    Ok(cells)
}

/// The latest ref key of each `(row_key, column)` of `wanted` that has a
/// cell: one backward step on the unique key per pair of the chunk's rows
/// and columns ([`latest_ref_key`]); one statement per cluster and chunk.
async fn latest_ref_keys(
    topology: &Topology,
    ds: &DatastoreRuntime,
    wanted: &[(Uuid, String)],
    read: &ReadOptions,
) -> Result<HashMap<(Uuid, String), i64>> {
    let table = ddl::cells_table(ds.name());
    let rows = fetch_by_row::<_, (Uuid, String, Option<i64>)>(
        topology,
        ds,
        wanted,
        |pair| pair.0,
        read,
        |dialect, chunk| {
            let mut sql = Sql::new(dialect);
            sql.push("SELECT r.")
                .ident("row_key")
                .push(", k.")
                .ident("column_name")
                .push(", ");
            latest_ref_key(&mut sql, &table, "r", Column::Of("k"));
            sql.push(" FROM ");
            pairs(
                &mut sql,
                chunk.iter().map(|pair| pair.0),
                chunk.iter().map(|pair| pair.1.as_str()),
            );
            sql
        },
    )
    .await?;
    // The chunk's rows and columns also make pairs that were not asked for.
    let asked: HashSet<(Uuid, &str)> = wanted
        .iter()
        .map(|(row, column)| (*row, column.as_str()))
        .collect();
    let mut latest = HashMap::new();
    for (row_key, column, ref_key) in rows {
        if let (Some(ref_key), true) = (ref_key, asked.contains(&(row_key, column.as_str()))) {
            latest.insert((row_key, column), ref_key);
        }
    }
    Ok(latest)
}

/// The latest cells of `columns` for `rows`, all on the cluster of
/// `backend`, in one statement, with the bodies decoded by `decode` (index
/// maintenance reads only the top-level members it indexes). Bodies are
/// decoded one by one, so a corrupt cell is reported alone. A cell whose
/// body `known` has (by its full key) is not decoded.
pub(crate) async fn latest_cells_with<B>(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    rows: &[Uuid],
    columns: &[String],
    decode: Decode<'_, B>,
    known: &(dyn Fn(Uuid, &str, i64) -> Option<B> + Sync),
) -> Result<Vec<Result<Cell<B>>>> {
    if rows.is_empty() || columns.is_empty() {
        return Ok(Vec::new());
    }
    let columns: Vec<&str> = columns.iter().map(String::as_str).collect();
    let sql = latest_cells_sql(
        backend.dialect(),
        &ddl::cells_table(ds.name()),
        rows,
        &columns,
    );
    let pairs: HashSet<(Uuid, &str)> = rows
        .iter()
        .flat_map(|r| columns.iter().map(move |c| (*r, *c)))
        .collect();
    let fetched = backend.rows::<CellRow>(&sql).await?;
    Ok(fetched
        .into_iter()
        .filter(|row| pairs.contains(&(row.2, row.3.as_str())))
        .map(|row| match known(row.2, &row.3, row.4) {
            Some(body) => Ok(cell_with(row, body)),
            None => cell_of(row, decode),
        })
        .collect())
}

/// The statement of the latest cells of `columns` for `rows` in `table`:
/// for each pair of a row and a column, one backward step on the unique
/// key `(row_key, column_name, ref_key)` finds the latest ref key, so a
/// cell's older versions are never read. PostgreSQL reads each pair's cell
/// in a `LATERAL … LIMIT 1`; MariaDB and SQLite, which have no `LATERAL`,
/// find the pairs' latest ref keys first (`latest_ref_key`) and then
/// read each cell by its full key. The pairs are grouped so that MariaDB
/// materializes them instead of merging them into a scan of every version.
pub fn latest_cells_sql(dialect: Dialect, table: &str, rows: &[Uuid], columns: &[&str]) -> Sql {
    let mut sql = Sql::new(dialect);
    let rows = rows.iter().copied();
    let columns = columns.iter().copied();
    if dialect.has_lateral_joins() {
        sql.push("SELECT c.* FROM ");
        pairs(&mut sql, rows, columns);
        sql.push(" CROSS JOIN ");
        latest_cell_lateral(&mut sql, table, "r");
        return sql;
    }
    sql.push("SELECT ");
    for (i, col) in CELL_COLUMNS.iter().enumerate() {
        sql.push(if i == 0 { "c." } else { ", c." }).ident(col);
    }
    sql.push(" FROM (SELECT r.")
        .ident("row_key")
        .push(", k.")
        .ident("column_name")
        .push(", ");
    latest_ref_key(&mut sql, table, "r", Column::Of("k"));
    sql.push(" AS ").ident("ref_key").push(" FROM ");
    pairs(&mut sql, rows, columns);
    sql.push(" GROUP BY r.")
        .ident("row_key")
        .push(", k.")
        .ident("column_name")
        .push(") l JOIN ")
        .ident(table)
        .push(" c ON c.")
        .ident("row_key")
        .push(" = l.")
        .ident("row_key")
        .push(" AND c.")
        .ident("column_name")
        .push(" = l.")
        .ident("column_name")
        .push(" AND c.")
        .ident("ref_key")
        .push(" = l.")
        .ident("ref_key");
    sql
}

/// `<rows> r CROSS JOIN <columns> k`: every pair of the distinct rows
/// (`r.row_key`) and columns (`k.column_name`), as bound values.
fn pairs<'a>(
    sql: &mut Sql,
    rows: impl Iterator<Item = Uuid>,
    columns: impl Iterator<Item = &'a str>,
) {
    sql.one_column_table("r", "row_key", uuid_list(rows))
        .push(" CROSS JOIN ")
        .one_column_table("k", "column_name", text_list(columns));
}

/// `LATERAL (SELECT <cell columns> FROM <table> m WHERE m.row_key =
/// <outer>.row_key AND m.column_name = k.column_name ORDER BY m.ref_key
/// DESC LIMIT 1) c`: on PostgreSQL, the latest cell of the pair, read with
/// one backward step on the unique key.
fn latest_cell_lateral(sql: &mut Sql, table: &str, outer: &str) {
    sql.push("LATERAL (");
    select_cells(sql, table, Some("m"));
    latest_of_pair(sql, outer, Column::Of("k"));
    sql.push(") c");
}

/// The cells of the rows of [`latest_cells_sql`] that are among `pairs`
/// (an `IN` on rows and one on columns also match pairs that were not
/// asked for), bodies decoded one by one.
fn latest_cells_from<B>(
    rows: Vec<CellRow>,
    pairs: &HashSet<(Uuid, &str)>,
    decode: Decode<'_, B>,
) -> Vec<Result<Cell<B>>> {
    rows.into_iter()
        .map(|row| cell_of(row, decode))
        .filter(|c| match c {
            Ok(c) => pairs.contains(&(c.row_key, c.column.as_str())),
            Err(_) => true,
        })
        .collect()
}

/// Wraps `rows`, a statement whose first column is `row_key`, into one
/// that also returns the latest cell of each of `columns` for each of its
/// rows, all on the same cluster: `SELECT i.*, <cell columns>` with one
/// result row per row and column, whose cell columns are NULL where the
/// row has no cell of the column. The order of `rows` is not kept.
///
/// Each cell is found with one backward step on the unique key, as in
/// [`latest_cells_sql`]: PostgreSQL reads it in a `LATERAL … LIMIT 1`;
/// MariaDB and SQLite join it by its full key, the ref key found by
/// `latest_ref_key`. The `LEFT JOIN` keeps MariaDB from reading the cells
/// before the pairs, which would read every version.
pub fn with_latest_cells(rows: &Sql, table: &str, columns: &[&str]) -> Sql {
    let dialect = rows.dialect();
    let mut sql = Sql::new(dialect);
    sql.push("SELECT i.*");
    for col in CELL_COLUMNS {
        sql.push(", c.").ident(col);
    }
    sql.push(" FROM (")
        .append(rows)
        .push(") i CROSS JOIN ")
        .one_column_table("k", "column_name", text_list(columns.iter().copied()))
        .push(" LEFT JOIN ");
    if dialect.has_lateral_joins() {
        latest_cell_lateral(&mut sql, table, "i");
        sql.push(" ON TRUE");
    } else {
        sql.ident(table)
            .push(" c ON c.")
            .ident("row_key")
            .push(" = i.")
            .ident("row_key")
            .push(" AND c.")
            .ident("column_name")
            .push(" = k.")
            .ident("column_name")
            .push(" AND c.")
            .ident("ref_key")
            .push(" = ");
        latest_ref_key(&mut sql, table, "i", Column::Of("k"));
    }
    sql
}

/// Wraps `rows`, a statement whose first column is `row_key`, into one
/// that adds, for each of `columns`, the ref key of its row's latest cell
/// (NULL for none): `SELECT i.*, (SELECT m.ref_key … LIMIT 1), … FROM
/// (rows) i`, one result row per row of `rows`. Each lookup is one
/// backward step on the unique key `(row_key, column_name, ref_key)` on
/// every backend; the bodies then come from the cell cache or a read by
/// full key. The order of `rows` is not kept.
pub fn with_latest_ref_keys(rows: &Sql, table: &str, columns: &[&str]) -> Sql {
    let mut sql = Sql::new(rows.dialect());
    sql.push("SELECT i.*");
    for column in columns {
        sql.push(", ");
        latest_ref_key(&mut sql, table, "i", Column::Named(column));
    }
    sql.push(" FROM (").append(rows).push(") i");
    sql
}

/// The column whose latest ref key [`latest_ref_key`] looks up.
enum Column<'a> {
    /// This column, bound as a value.
    Named(&'a str),
    /// The `column_name` of the row aliased so.
    Of(&'a str),
}

/// `(SELECT m.ref_key FROM <table> m WHERE m.row_key = <outer>.row_key AND
/// m.column_name = <column> ORDER BY m.ref_key DESC LIMIT 1)`: the ref key
/// of the latest cell, NULL for none, with one backward step on the unique
/// key. Written as a `LIMIT 1` rather than a `MAX`, which MariaDB answers,
/// when correlated, by reading every version of the cell, and PostgreSQL
/// with one more plan node per lookup.
fn latest_ref_key(sql: &mut Sql, table: &str, outer: &str, column: Column<'_>) {
    sql.push("(SELECT m.")
        .ident("ref_key")
        .push(" FROM ")
        .ident(table)
        .push(" m");
    latest_of_pair(sql, outer, column);
    sql.push(")");
}

/// ` WHERE m.row_key = <outer>.row_key AND m.column_name = <column> ORDER
/// BY m.ref_key DESC LIMIT 1`: the latest version of a pair among the
/// cells aliased `m`, one backward step on the unique key.
fn latest_of_pair(sql: &mut Sql, outer: &str, column: Column<'_>) {
    sql.push(" WHERE m.")
        .ident("row_key")
        .push(" = ")
        .push(outer)
        .push(".")
        .ident("row_key")
        .push(" AND m.")
        .ident("column_name")
        .push(" = ");
    match column {
        Column::Named(column) => sql.bind(Value::Text(column.to_string())),
        Column::Of(alias) => sql.push(alias).push(".").ident("column_name"),
    };
    sql.push(" ORDER BY m.")
        .ident("ref_key")
        .push(" DESC LIMIT 1");
}

/// Whether any cluster of the datastore holds a cell; unreachable clusters
/// count as empty.
pub(crate) async fn has_cells(topology: &Topology, ds: &DatastoreRuntime) -> Result<bool> {
    for cluster in ds.map().clusters() {
        let Ok(master) = topology.clusters[cluster].master() else {
            continue;
        };
        let mut sql = Sql::new(master.dialect());
        sql.push("SELECT ")
            .ident("added_id")
            .push(" FROM ")
            .ident(&ddl::cells_table(ds.name()))
            .push(" LIMIT 1");
        if !master.rows::<(i64,)>(&sql).await?.is_empty() {
            return Ok(true);
        }
    }
    Ok(false)
}

/// The distinct items, in first-seen order.
pub(crate) fn unique<T: Eq + std::hash::Hash + Clone>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut seen = HashSet::new();
    items.filter(|item| seen.insert(item.clone())).collect()
}

/// `IN (…)` values of the distinct row keys.
pub(crate) fn uuid_list(keys: impl Iterator<Item = Uuid>) -> Vec<Value> {
    unique(keys).into_iter().map(Value::Uuid).collect()
}

/// `IN (…)` values of the distinct strings.
pub(crate) fn text_list<'a>(texts: impl Iterator<Item = &'a str>) -> Vec<Value> {
    unique(texts)
        .into_iter()
        .map(|t| Value::Text(t.to_string()))
        .collect()
}

/// `IN (…)` values of the distinct integers.
pub(crate) fn int_list(ints: impl Iterator<Item = i64>) -> Vec<Value> {
    unique(ints).into_iter().map(Value::Int).collect()
}

/// A span, for traces, of `looked_up` cells asked of the cell cache and
/// the `hits` it held.
pub(crate) fn cache_span(datastore: &str, hits: usize, looked_up: usize) {
    let _ = tracing::debug_span!(
        "cell cache",
        cellgate.datastore = datastore,
        cellgate.cache.hits = hits,
        cellgate.cache.misses = looked_up - hits,
    );
}
