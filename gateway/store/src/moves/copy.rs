//! The statements a move runs on the clusters: copying cells, counters,
//! offsets and index entries from the source to the target, fencing and
//! opening counters, and deleting the source's copy.
//!
//! Every copy is idempotent (`INSERT` skipping rows whose key exists, or
//! an upsert keeping the larger offset), so a move killed anywhere runs
//! the same step again harmlessly.

use std::collections::BTreeMap;

use crate::cells::CELL_TYPES;
use crate::error::Result;
use crate::indexes::verify::pause;
use crate::storage::{ddl, Assign, Backend, ColType, Dialect, Sql, Value, MAX_PARAMS};
use crate::topology::DatastoreRuntime;

/// Bytes of bodies per `INSERT` of copied cells.
const INSERT_BYTES: usize = 4 * 1024 * 1024;

use crate::storage::ddl::CELL_COLUMNS;

fn ints(shards: impl IntoIterator<Item = u32>) -> Vec<Value> {
    shards
        .into_iter()
        .map(|s| Value::Int(i64::from(s)))
        .collect()
}

fn between(sql: &mut Sql, column: &str, first: u32, last: u32) {
    sql.ident(column)
        .push(" BETWEEN ")
        .bind(Value::Int(i64::from(first)))
        .push(" AND ")
        .bind(Value::Int(i64::from(last)));
}

/// Each shard's counter in `first..=last` on `backend`, as stored (negative
/// when fenced).
pub(crate) async fn counters(
    backend: &dyn Backend,
    datastore: &str,
    first: u32,
    last: u32,
) -> Result<BTreeMap<u32, i64>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(["shard", "next_added_id"])
        .push(" FROM ")
        .ident(&ddl::shards_table(datastore))
        .push(" WHERE ");
    between(&mut sql, "shard", first, last);
    Ok(backend
        .rows::<(i64, i64)>(&sql)
        .await?
        .into_iter()
        .map(|(shard, added_id)| (shard as u32, added_id))
        .collect())
}

/// The last `added_id` per shard of `first..=last` in `backend`'s cells.
pub(crate) async fn copied_heads(
    backend: &dyn Backend,
    datastore: &str,
    first: u32,
    last: u32,
) -> Result<BTreeMap<u32, i64>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .ident("shard")
        .push(", MAX(")
        .ident("added_id")
        .push(") FROM ")
        .ident(&ddl::cells_table(datastore))
        .push(" WHERE ");
    between(&mut sql, "shard", first, last);
    sql.push(" GROUP BY ").ident("shard");
    Ok(backend
        .rows::<(i64, i64)>(&sql)
        .await?
        .into_iter()
        .map(|(shard, added_id)| (shard as u32, added_id))
        .collect())
}

/// Copies the cells of `first..=last` that the target lacks (every cell
/// past the target's last `added_id` of its shard, up to the source's
/// heads as this pass reads them first), at most `chunk` `added_id`s at a
/// time; `progress(cells)` after each chunk. Returns the cells copied.
///
/// `known` is where the target's copy of each shard stands, if the caller
/// knows it from an earlier pass (else it is read from the target: a scan
/// of the range's keys, kept off the fence's critical path); it is left at
/// the source's heads this pass copied up to.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn copy_cells(
    source: &dyn Backend,
    target: &dyn Backend,
    ds: &DatastoreRuntime,
    (first, last): (u32, u32),
    chunk: usize,
    known: &mut Option<BTreeMap<u32, i64>>,
    duty: f64,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<u64> {
    let counters = counters(source, ds.name(), first, last).await?;
    copy_cells_upto(
        source,
        target,
        ds,
        (first, last),
        chunk,
        known,
        &counters,
        duty,
        progress,
    )
    .await
}

/// [`copy_cells`] up to the source's `counters` as the caller read them.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn copy_cells_upto(
    source: &dyn Backend,
    target: &dyn Backend,
    ds: &DatastoreRuntime,
    (first, last): (u32, u32),
    chunk: usize,
    known: &mut Option<BTreeMap<u32, i64>>,
    counters: &BTreeMap<u32, i64>,
    duty: f64,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<u64> {
    let heads: BTreeMap<u32, i64> = counters
        .iter()
        .map(|(s, next)| (*s, next.abs() - 1))
        .collect();
    let mut from = match known.take() {
        Some(known) => known,
        None => copied_heads(target, ds.name(), first, last).await?,
    };
    let mut reached = from.clone();
    for (shard, head) in &heads {
        let at = reached.entry(*shard).or_insert(0);
        *at = (*at).max(*head);
    }
    // Shards with cells to copy: where each one's copy stands, and its head.
    let mut todo: BTreeMap<u32, (i64, i64)> = heads
        .iter()
        .filter_map(|(shard, head)| {
            let at = from.remove(shard).unwrap_or(0);
            (*head > at).then_some((*shard, (at, *head)))
        })
        .collect();
    let table = ddl::cells_table(ds.name());
    let group = source.dialect().max_or_terms().clamp(1, 64);
    let chunk = chunk.max(1) as i64;
    let mut copied = 0u64;
    while !todo.is_empty() {
        let pieces = next_pieces(&todo, group, chunk);
        let sql = select_pieces(source.dialect(), &table, &pieces, false);
        let started = std::time::Instant::now();
        let rows = source.fetch(&sql, CELL_TYPES).await?;
        insert_cells(target, &table, &rows).await?;
        copied += rows.len() as u64;
        progress(rows.len() as u64);
        // Between chunks, a caller that stops the copy is let in.
        tokio::task::yield_now().await;
        pause(started.elapsed(), duty).await;
        advance(&mut todo, &pieces);
    }
    *known = Some(reached);
    Ok(copied)
}

/// The next chunk of a pass over `todo` (per shard: where the pass stands,
/// and the last `added_id` to read): up to `group` shards and `chunk`
/// `added_id`s, as `(shard, after, upto)`.
fn next_pieces(todo: &BTreeMap<u32, (i64, i64)>, group: usize, chunk: i64) -> Vec<(u32, i64, i64)> {
    let mut pieces = Vec::new();
    let mut budget = chunk;
    for (shard, (at, head)) in todo {
        if pieces.len() >= group || budget <= 0 {
            break;
        }
        let upto = (*head).min(at + budget);
        budget -= upto - at;
        pieces.push((*shard, *at, upto));
    }
    pieces
}

/// Moves `todo` past `pieces`, dropping the shards read to their end.
fn advance(todo: &mut BTreeMap<u32, (i64, i64)>, pieces: &[(u32, i64, i64)]) {
    for (shard, _, upto) in pieces {
        match todo.get_mut(shard) {
            Some((at, head)) if upto < head => *at = *upto,
            _ => {
                todo.remove(shard);
            }
        }
    }
}

/// The cells of `pieces`: each shard's piece an exact key range read by
/// its own branch of a `UNION ALL`, so every database reads it off the
/// primary key whatever its statistics say (an `OR` of open ranges under
/// `ORDER BY … LIMIT`, or one open range, let PostgreSQL scan far more of
/// the table than the chunk). `ordered`: in `(shard, added_id)` order.
fn select_pieces(dialect: Dialect, table: &str, pieces: &[(u32, i64, i64)], ordered: bool) -> Sql {
    let mut sql = Sql::new(dialect);
    for (i, (shard, at, upto)) in pieces.iter().enumerate() {
        if i > 0 {
            sql.push(" UNION ALL ");
        }
        sql.push("SELECT ")
            .idents(CELL_COLUMNS)
            .push(" FROM ")
            .ident(table)
            .push(" WHERE ")
            .ident("shard")
            .push(" = ")
            .bind(Value::Int(i64::from(*shard)))
            .push(" AND ")
            .ident("added_id")
            .push(" > ")
            .bind(Value::Int(*at))
            .push(" AND ")
            .ident("added_id")
            .push(" <= ")
            .bind(Value::Int(*upto));
    }
    if ordered {
        sql.push(" ORDER BY ").idents(["shard", "added_id"]);
    }
    sql
}

async fn insert_cells(target: &dyn Backend, table: &str, rows: &[Vec<Value>]) -> Result<()> {
    let dialect = target.dialect();
    let mut start = 0;
    while start < rows.len() {
        let mut end = start;
        let mut bytes = 0;
        while end < rows.len() && end - start < MAX_PARAMS / 7 {
            let size = match &rows[end][5] {
                Value::Bytes(b) => b.len(),
                _ => 0,
            };
            if end > start && bytes + size > INSERT_BYTES {
                break;
            }
            bytes += size;
            end += 1;
        }
        let mut sql = Sql::new(dialect);
        sql.push(dialect.insert_ignore())
            .ident(table)
            .push(" (")
            .idents(CELL_COLUMNS)
            .push(") ")
            .rows(rows[start..end].iter().cloned())
            .push(dialect.on_conflict_do_nothing());
        target.execute(&sql).await?;
        start = end;
    }
    Ok(())
}

/// Writes the target's counter rows of the moved range: the source's
/// values, fenced (negative) until the cut-over opens them.
pub(crate) async fn copy_counters(
    target: &dyn Backend,
    datastore: &str,
    source_counters: &BTreeMap<u32, i64>,
) -> Result<()> {
    let dialect = target.dialect();
    let rows: Vec<(u32, i64)> = source_counters
        .iter()
        .map(|(s, next)| (*s, -next.abs()))
        .collect();
    for chunk in rows.chunks(MAX_PARAMS / 2) {
        let mut sql = Sql::new(dialect);
        sql.push("INSERT INTO ")
            .ident(&ddl::shards_table(datastore))
            .push(" (")
            .idents(["shard", "next_added_id"])
            .push(") ")
            .rows(
                chunk
                    .iter()
                    .map(|(s, n)| vec![Value::Int(i64::from(*s)), Value::Int(*n)]),
            )
            .push(&dialect.upsert(&["shard"], &["next_added_id"]));
        target.execute(&sql).await?;
    }
    Ok(())
}

/// Negates the counters of `first..=last` that are positive (`fence`) or
/// negative (`open`): a fenced shard takes no writes, and the statement
/// waits for the writes holding its counter locks.
pub(crate) async fn flip_counters(
    backend: &dyn Backend,
    datastore: &str,
    (first, last): (u32, u32),
    fence: bool,
) -> Result<u64> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("UPDATE ")
        .ident(&ddl::shards_table(datastore))
        .push(" SET ")
        .ident("next_added_id")
        .push(" = 0 - ")
        .ident("next_added_id")
        .push(" WHERE ");
    between(&mut sql, "shard", first, last);
    sql.push(" AND ")
        .ident("next_added_id")
        .push(if fence { " > 0" } else { " < 0" });
    backend.execute(&sql).await
}

/// Every offset row of `first..=last` (index consumers and triggers) from
/// the source to the target, keeping the larger where the target has one.
pub(crate) async fn copy_offsets(
    source: &dyn Backend,
    target: &dyn Backend,
    datastore: &str,
    (first, last): (u32, u32),
) -> Result<u64> {
    let table = ddl::offsets_table(datastore);
    let mut sql = Sql::new(source.dialect());
    sql.push("SELECT ")
        .idents(["shard", "consumer", "added_id", "updated_at"])
        .push(" FROM ")
        .ident(&table)
        .push(" WHERE ");
    between(&mut sql, "shard", first, last);
    let rows = source
        .fetch(
            &sql,
            &[ColType::Int, ColType::Text, ColType::Int, ColType::DateTime],
        )
        .await?;
    upsert_offsets(target, &table, &rows).await?;
    Ok(rows.len() as u64)
}

/// The columns of a trigger quarantine row, with their types.
const QUARANTINE: [(&str, ColType); 10] = [
    ("consumer", ColType::Text),
    ("shard", ColType::Int),
    ("added_id", ColType::Int),
    ("row_key", ColType::Uuid),
    ("column_name", ColType::Text),
    ("ref_key", ColType::Int),
    ("attempts", ColType::Int),
    ("message", ColType::Text),
    ("retry", ColType::Int),
    ("quarantined_at", ColType::DateTime),
];

/// Every trigger quarantine row of `first..=last` from the source to the
/// target (kept where the target has it already): the quarantined cells
/// keep their `added_id`s on the target, so the consumers holding the
/// range there list them and retry them as they would have on the source.
pub(crate) async fn copy_trigger_quarantine(
    source: &dyn Backend,
    target: &dyn Backend,
    datastore: &str,
    (first, last): (u32, u32),
) -> Result<u64> {
    let table = ddl::trigger_quarantine_table(datastore);
    let mut sql = Sql::new(source.dialect());
    sql.push("SELECT ")
        .idents(QUARANTINE.map(|(c, _)| c))
        .push(" FROM ")
        .ident(&table)
        .push(" WHERE ");
    between(&mut sql, "shard", first, last);
    let rows = source.fetch(&sql, &QUARANTINE.map(|(_, t)| t)).await?;
    let dialect = target.dialect();
    for chunk in rows.chunks(MAX_PARAMS / QUARANTINE.len()) {
        let mut sql = Sql::new(dialect);
        sql.push(dialect.insert_ignore())
            .ident(&table)
            .push(" (")
            .idents(QUARANTINE.map(|(c, _)| c))
            .push(") ")
            .rows(chunk.iter().cloned())
            .push(dialect.on_conflict_do_nothing());
        target.execute(&sql).await?;
    }
    Ok(rows.len() as u64)
}

/// Upserts offset rows, keeping the larger `added_id`.
async fn upsert_offsets(target: &dyn Backend, table: &str, rows: &[Vec<Value>]) -> Result<()> {
    let dialect = target.dialect();
    for chunk in rows.chunks(MAX_PARAMS / 4) {
        let mut sql = Sql::new(dialect);
        sql.push("INSERT INTO ")
            .ident(table)
            .push(dialect.insert_alias())
            .push(" (")
            .idents(["shard", "consumer", "added_id", "updated_at"])
            .push(") ")
            .rows(chunk.iter().cloned())
            .push(&dialect.upsert_with(
                &["shard", "consumer"],
                &[Assign::Greatest("added_id")],
                &[],
            ));
        target.execute(&sql).await?;
    }
    Ok(())
}

/// On a cell cluster, gives the consumers that will write index entries to
/// `target` the offsets of those writing to `source` (`ix:<index>:<v>:<source>`
/// → `…:<target>`), where they have none yet: the entries the move copies
/// from the source reflect at least those offsets, and the target's
/// consumers apply the log from there.
pub(crate) async fn snapshot_index_offsets(
    cell_cluster: &dyn Backend,
    ds: &DatastoreRuntime,
    source: &str,
    target: &str,
) -> Result<u64> {
    let table = ddl::offsets_table(ds.name());
    let mut copied = 0;
    for index in &ds.indexes {
        let from = index.consumer(source);
        let to = index.consumer(target);
        let mut sql = Sql::new(cell_cluster.dialect());
        sql.push("SELECT ")
            .idents(["shard", "added_id", "updated_at"])
            .push(" FROM ")
            .ident(&table)
            .push(" WHERE ")
            .ident("consumer")
            .push(" = ")
            .bind(Value::Text(from));
        let rows: Vec<Vec<Value>> = cell_cluster
            .fetch(&sql, &[ColType::Int, ColType::Int, ColType::DateTime])
            .await?
            .into_iter()
            .map(|r| {
                vec![
                    r[0].clone(),
                    Value::Text(to.clone()),
                    r[1].clone(),
                    r[2].clone(),
                ]
            })
            .collect();
        let dialect = cell_cluster.dialect();
        for chunk in rows.chunks(MAX_PARAMS / 4) {
            let mut sql = Sql::new(dialect);
            sql.push(dialect.insert_ignore())
                .ident(&table)
                .push(" (")
                .idents(["shard", "consumer", "added_id", "updated_at"])
                .push(") ")
                .rows(chunk.iter().cloned())
                .push(dialect.on_conflict_do_nothing());
            cell_cluster.execute(&sql).await?;
        }
        copied += rows.len() as u64;
    }
    Ok(copied)
}

/// The columns of an index version's table with their types.
fn index_columns(index: &crate::topology::IndexRuntime) -> Vec<(String, ColType)> {
    let mut cols = vec![
        ("row_key".to_string(), ColType::Uuid),
        (ddl::INDEX_SHARD_COLUMN.to_string(), ColType::Int),
    ];
    for field in &index.def.fields {
        cols.push((
            field.name.clone(),
            crate::indexes::entry::col_type(field.ty),
        ));
    }
    for column in &index.def.columns {
        cols.push((ddl::ref_column(column), ColType::Int));
    }
    cols.push(("_updated_at".to_string(), ColType::DateTime));
    cols
}

/// Copies the index entries whose index shard is in `first..=last` from
/// the source's index tables to the target's, `chunk` at a time, skipping
/// rows the target has. Returns the entries copied.
pub(crate) async fn copy_entries(
    source: &dyn Backend,
    target: &dyn Backend,
    ds: &DatastoreRuntime,
    (first, last): (u32, u32),
    chunk: usize,
    duty: f64,
) -> Result<u64> {
    let mut copied = 0;
    for index in &ds.indexes {
        let cols = index_columns(index);
        let names: Vec<&str> = cols.iter().map(|(n, _)| n.as_str()).collect();
        let types: Vec<ColType> = cols.iter().map(|(_, t)| *t).collect();
        let mut after: Option<uuid::Uuid> = None;
        loop {
            let mut sql = Sql::new(source.dialect());
            sql.push("SELECT ")
                .idents(names.iter().copied())
                .push(" FROM ")
                .ident(&index.table)
                .push(" WHERE ");
            between(&mut sql, ddl::INDEX_SHARD_COLUMN, first, last);
            if let Some(after) = after {
                sql.push(" AND ")
                    .ident("row_key")
                    .push(" > ")
                    .bind(Value::Uuid(after));
            }
            sql.push(" ORDER BY ")
                .ident("row_key")
                .push(&format!(" LIMIT {chunk}"));
            let started = std::time::Instant::now();
            let rows = source.fetch(&sql, &types).await?;
            let Some(last_row) = rows.last() else { break };
            after = last_row[0].as_uuid();
            let dialect = target.dialect();
            for part in rows.chunks((MAX_PARAMS / names.len()).max(1)) {
                let mut sql = Sql::new(dialect);
                sql.push(dialect.insert_ignore())
                    .ident(&index.table)
                    .push(" (")
                    .idents(names.iter().copied())
                    .push(") ")
                    .rows(part.iter().cloned())
                    .push(dialect.on_conflict_do_nothing());
                target.execute(&sql).await?;
            }
            copied += rows.len() as u64;
            if rows.len() < chunk {
                break;
            }
            pause(started.elapsed(), duty).await;
        }
    }
    Ok(copied)
}

/// Per shard of `heads`, `(cells, xxh3 of their added ids, keys and
/// bodies)` of its cells up to its head, in `added_id` order: the whole
/// range read in `(shard, added_id)` order as exact key ranges of at most
/// `chunk` `added_id`s a statement.
pub(crate) async fn checksums(
    backend: &dyn Backend,
    datastore: &str,
    heads: &BTreeMap<u32, i64>,
    chunk: usize,
    duty: f64,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<BTreeMap<u32, (u64, u64)>> {
    let mut hashers: BTreeMap<u32, (u64, xxhash_rust::xxh3::Xxh3)> = heads
        .keys()
        .map(|s| (*s, (0, xxhash_rust::xxh3::Xxh3::new())))
        .collect();
    // Cells written on the target after the cut-over (past the heads) do
    // not count: each shard is read up to its head.
    let mut todo: BTreeMap<u32, (i64, i64)> = heads
        .iter()
        .filter(|(_, head)| **head > 0)
        .map(|(shard, head)| (*shard, (0, *head)))
        .collect();
    let table = ddl::cells_table(datastore);
    let group = backend.dialect().max_or_terms().clamp(1, 64);
    let chunk = chunk.max(1) as i64;
    while !todo.is_empty() {
        let pieces = next_pieces(&todo, group, chunk);
        let sql = select_pieces(backend.dialect(), &table, &pieces, true);
        let started = std::time::Instant::now();
        let rows = backend.fetch(&sql, CELL_TYPES).await?;
        for row in &rows {
            let (Some(shard), Some(added)) = (row[0].as_int(), row[1].as_int()) else {
                continue;
            };
            let Some((count, hasher)) = hashers.get_mut(&(shard as u32)) else {
                continue;
            };
            *count += 1;
            hasher.update(&added.to_be_bytes());
            if let Some(key) = row[2].as_uuid() {
                hasher.update(key.as_bytes());
            }
            hasher.update(row[3].as_text().unwrap_or("").as_bytes());
            hasher.update(&row[4].as_int().unwrap_or(0).to_be_bytes());
            if let Value::Bytes(body) = &row[5] {
                hasher.update(body);
            }
        }
        progress(rows.len() as u64);
        advance(&mut todo, &pieces);
        pause(started.elapsed(), duty).await;
    }
    Ok(hashers
        .into_iter()
        .map(|(s, (count, hasher))| (s, (count, hasher.digest())))
        .collect())
}

/// Deletes the rows of `first..=last` from a cluster that no longer holds
/// them: cells (`chunk` shards at a time), counters, offsets, trigger
/// quarantine and the index entries whose index shard is in the range.
pub(crate) async fn delete_range(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    (first, last): (u32, u32),
    duty: f64,
    progress: &mut (dyn FnMut(u64) + Send),
) -> Result<()> {
    let name = ds.name();
    let mut tables: Vec<(String, &str)> = Vec::new();
    for index in &ds.indexes {
        tables.push((index.table.clone(), ddl::INDEX_SHARD_COLUMN));
    }
    tables.push((ddl::offsets_table(name), "shard"));
    tables.push((ddl::trigger_quarantine_table(name), "shard"));
    tables.push((ddl::shards_table(name), "shard"));
    // Cells a few shards at a time, so no statement holds a huge delete.
    let mut shard = first;
    while shard <= last {
        let to = (shard + 15).min(last);
        let mut sql = Sql::new(backend.dialect());
        sql.push("DELETE FROM ")
            .ident(&ddl::cells_table(name))
            .push(" WHERE ")
            .ident("shard")
            .in_list(ints(shard..=to));
        let started = std::time::Instant::now();
        progress(backend.execute(&sql).await?);
        pause(started.elapsed(), duty).await;
        shard = to + 1;
    }
    for (table, column) in tables {
        let mut sql = Sql::new(backend.dialect());
        sql.push("DELETE FROM ").ident(&table).push(" WHERE ");
        between(&mut sql, column, first, last);
        backend.execute(&sql).await?;
    }
    Ok(())
}
