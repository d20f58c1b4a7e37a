//! The statements of a write on the primary: the PostgreSQL form that
//! locks, advances and inserts in one statement, and the counter locks and
//! advances of the other backends.

use super::*;

/// On PostgreSQL, a group that fits one `INSERT` commits as a single
/// autocommitted statement: it locks the counter rows in shard order,
/// numbers the cells from the locked counters, advances them and inserts
/// the cells, and returns each shard's next `added_id`, so no round trip to
/// the gateway happens while the locks are held; they are released by the
/// statement's own commit. The counters are locked as [`push_lock_shards`]
/// does, one by one by primary key in shard order.
///
/// ```sql
/// WITH locked AS (SELECT t.shard, t.next_added_id FROM (<rows>) w(shard)
///                 CROSS JOIN LATERAL (SELECT shard, next_added_id FROM <ds>_shards
///                   WHERE shard = w.shard AND next_added_id > 0
///                   OFFSET 0 FOR UPDATE) t),
///      advanced AS (UPDATE <ds>_shards s SET next_added_id = l.next_added_id + v.n
///                   FROM locked l, (<rows>) v(shard, n)
///                   WHERE s.shard = l.shard AND v.shard = l.shard
///                   RETURNING s.shard, s.next_added_id),
///      inserted AS (INSERT INTO <ds>_cells (…)
///                   SELECT v.shard, l.next_added_id + v.k, … FROM (<rows>) v(…)
///                   JOIN locked l ON l.shard = v.shard)
/// SELECT shard, next_added_id FROM advanced
/// ```
///
/// Each `<rows>` is `SELECT * FROM unnest($1::int8[], …)` ([`Sql::rows`]):
/// the statement's text depends on nothing but the datastore, so each
/// connection has PostgreSQL parse it once, however many cells and shards
/// a write has.
///
/// `locked` is read twice, so it is computed once; it returns each
/// counter's latest committed value even when a concurrent writer advanced
/// it after the statement's snapshot (PostgreSQL re-reads a row it had to
/// wait for), and `advanced` updates that same latest version. `None` for
/// the other backends, which have no data-modifying `WITH`, and for groups
/// that need several `INSERT`s.
pub(super) fn one_statement(
    dialect: Dialect,
    datastore: &str,
    cells: &[&Prepared],
    created_at: &Value,
) -> Option<Sql> {
    let chunks = insert_chunks(cells, CELL_ROWS, |c| c.encoded.len());
    if !dialect.has_data_modifying_ctes() || chunks.len() != 1 {
        return None;
    }
    // Cells are sorted by shard: count them per shard, and number each
    // from 0 within its shard.
    let mut counts: Vec<(u32, i64)> = Vec::new();
    let mut numbered: Vec<(&Prepared, i64)> = Vec::with_capacity(cells.len());
    for cell in cells {
        match counts.last_mut() {
            Some((shard, n)) if *shard == cell.shard => {
                numbered.push((cell, *n));
                *n += 1;
            }
            _ => {
                numbered.push((cell, 0));
                counts.push((cell.shard, 1));
            }
        }
    }
    if counts.len() * 3 + cells.len() * 7 > MAX_PARAMS {
        return None;
    }
    let shards_table = ddl::shards_table(datastore);
    let mut sql = Sql::new(dialect);
    sql.push("WITH ").ident("locked").push(" AS (");
    push_lock_shards(
        &mut sql,
        datastore,
        counts.iter().map(|(s, _)| *s),
        Counters::Open,
    );
    sql.push("), ")
        .ident("advanced")
        .push(" AS (UPDATE ")
        .ident(&shards_table)
        .push(" s SET ")
        .ident("next_added_id")
        .push(" = l.")
        .ident("next_added_id")
        .push(" + v.n FROM ")
        .ident("locked")
        .push(" l, (")
        .rows(
            counts
                .iter()
                .map(|(s, n)| vec![Value::Int(i64::from(*s)), Value::Int(*n)]),
        )
        .push(") v (")
        .ident("shard")
        .push(", n) WHERE s.")
        .ident("shard")
        .push(" = l.")
        .ident("shard")
        .push(" AND v.")
        .ident("shard")
        .push(" = l.")
        .ident("shard")
        // The locked shards as an array on the updated table itself, so
        // that it is read by its primary key. Joined only through
        // `locked`, PostgreSQL planned a scan of the whole counter table
        // (the cheaper plan on a freshly vacuumed one) and a prepared
        // statement kept it as the table bloated: one full scan per
        // write. The same shards as an `IN` list were a bitmap scan, a
        // third slower than this on `pgbench`.
        .push(" AND s.")
        .ident("shard")
        .push(" = ANY(ARRAY(SELECT ")
        .ident("shard")
        .push(" FROM ")
        .ident("locked")
        .push("))")
        .push(" RETURNING s.")
        .ident("shard")
        .push(", s.")
        .ident("next_added_id")
        .push("), ")
        .ident("inserted")
        .push(" AS (INSERT INTO ")
        .ident(&ddl::cells_table(datastore))
        .push(" (")
        .idents(crate::cells::read::CELL_COLUMNS)
        .push(") SELECT v.")
        .ident("shard")
        .push(", l.")
        .ident("next_added_id")
        .push(" + v.k");
    for col in &crate::cells::read::CELL_COLUMNS[2..] {
        sql.push(", v.").ident(col);
    }
    sql.push(" FROM (")
        .rows(
            numbered
                .iter()
                .map(|(cell, k)| cell_row(cell, *k, created_at)),
        )
        .push(") v (")
        .ident("shard")
        .push(", k");
    for col in &crate::cells::read::CELL_COLUMNS[2..] {
        sql.push(", ").ident(col);
    }
    // The cells of a shard without a usable counter row (missing, or
    // fenced by a move) are left out; `advanced` does not name the shard.
    sql.push(") JOIN ")
        .ident("locked")
        .push(" l ON l.")
        .ident("shard")
        .push(" = v.")
        .ident("shard")
        .push(")");
    sql.push(" SELECT ")
        .idents(["shard", "next_added_id"])
        .push(" FROM ")
        .ident("advanced");
    Some(sql)
}

/// The values of a cell's row, in [`CELL_COLUMNS`](crate::cells::read::CELL_COLUMNS)
/// order, with `added_id` (or, in [`one_statement`], the cell's number
/// within its shard) as the second.
pub(super) fn cell_row(cell: &Prepared, added_id: i64, created_at: &Value) -> Vec<Value> {
    vec![
        Value::Int(i64::from(cell.shard)),
        Value::Int(added_id),
        Value::Uuid(cell.key.row_key),
        Value::Text(cell.key.column.clone()),
        Value::Int(cell.key.ref_key),
        Value::Bytes(cell.encoded.clone()),
        created_at.clone(),
    ]
}

/// Locks the counter rows of `shards` (sorted) in shard order and returns
/// each one's next `added_id`. SQLite's single writer already serializes
/// write transactions, so there it is a plain read.
pub(super) async fn lock_shards(
    tx: &mut dyn Tx,
    dialect: Dialect,
    datastore: &str,
    shards: &[u32],
) -> Result<HashMap<u32, i64>> {
    let mut next_ids = HashMap::with_capacity(shards.len());
    for chunk in shards.chunks(MAX_PARAMS) {
        let mut sql = Sql::new(dialect);
        push_lock_shards(&mut sql, datastore, chunk.iter().copied(), Counters::All);
        for (shard, next) in tx.rows::<(i64, i64)>(&sql).await? {
            next_ids.insert(shard as u32, next);
        }
    }
    Ok(next_ids)
}

/// Which counter rows [`push_lock_shards`] returns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Counters {
    /// Every one asked for.
    All,
    /// Only those that take writes (`next_added_id > 0`: not fenced by a
    /// shard move).
    Open,
}

/// Appends a `SELECT shard, next_added_id` that locks the counter rows of
/// `shards` (ascending) in that order; SQLite's single writer already
/// serializes write transactions, so there it is a plain read.
///
/// On PostgreSQL each row is found by its primary key, one after the other
/// in the order given (a nested loop over the list, the lock taken inside
/// it). As `shard IN (…) ORDER BY shard FOR UPDATE`, PostgreSQL planned a
/// scan of the whole counter table (4,096 rows and their dead versions)
/// plus a sort whenever it estimated the scan cheaper than fifty index
/// probes: the lock then took a tenth of its CPU under writes, against
/// 7 % this way.
pub(super) fn push_lock_shards(
    sql: &mut Sql,
    datastore: &str,
    shards: impl Iterator<Item = u32>,
    counters: Counters,
) {
    let dialect = sql.dialect();
    let table = ddl::shards_table(datastore);
    let shards = shards.map(|s| Value::Int(i64::from(s)));
    if dialect.binds_arrays() {
        sql.push("SELECT t.")
            .ident("shard")
            .push(", t.")
            .ident("next_added_id")
            .push(" FROM (")
            .rows(shards.map(|s| vec![s]))
            .push(") w (")
            .ident("shard")
            .push(") CROSS JOIN LATERAL (SELECT ")
            .idents(["shard", "next_added_id"])
            .push(" FROM ")
            .ident(&table)
            .push(" WHERE ")
            .ident("shard")
            .push(" = w.")
            .ident("shard");
        if counters == Counters::Open {
            sql.push(" AND ").ident("next_added_id").push(" > 0");
        }
        // OFFSET 0 keeps the subquery apart, so the lock is taken in the
        // loop, row by row in the list's order.
        sql.push(" OFFSET 0").push(dialect.for_update()).push(") t");
        return;
    }
    sql.push("SELECT ")
        .idents(["shard", "next_added_id"])
        .push(" FROM ")
        .ident(&table)
        .push(" WHERE ")
        .ident("shard")
        .in_list(shards);
    if counters == Counters::Open {
        sql.push(" AND ").ident("next_added_id").push(" > 0");
    }
    sql.push(" ORDER BY ")
        .ident("shard")
        .push(dialect.for_update());
}

/// Appends an `UPDATE` that sets the next `added_id` of each shard of
/// `next` (at most [`MAX_PARAMS`]` / 3` of them). On PostgreSQL the pairs
/// are rows joined by primary key ([`Sql::rows`]), a text that does not
/// depend on their number; elsewhere a `CASE` on the shard.
pub(super) fn push_advance(sql: &mut Sql, datastore: &str, next: &[(u32, i64)]) {
    let table = ddl::shards_table(datastore);
    if sql.dialect().binds_arrays() {
        sql.push("UPDATE ")
            .ident(&table)
            .push(" s SET ")
            .ident("next_added_id")
            .push(" = v.n FROM (")
            .rows(
                next.iter()
                    .map(|(s, n)| vec![Value::Int(i64::from(*s)), Value::Int(*n)]),
            )
            .push(") v (")
            .ident("shard")
            .push(", n) WHERE s.")
            .ident("shard")
            .push(" = v.")
            .ident("shard");
        return;
    }
    sql.push("UPDATE ")
        .ident(&table)
        .push(" SET ")
        .ident("next_added_id")
        .push(" = CASE ")
        .ident("shard");
    for (shard, next) in next {
        sql.push(" WHEN ")
            .bind(Value::Int(i64::from(*shard)))
            .push(" THEN ")
            .bind(Value::Int(*next));
    }
    sql.push(" END WHERE ")
        .ident("shard")
        .in_list(next.iter().map(|(s, _)| Value::Int(i64::from(*s))));
}
