//! The first look of a verify: the database compares the entries.
//!
//! A chunk's expected entries go to the index table as bound rows, joined
//! to the stored rows by row key, and only the rows that differ come back.
//! Reading every stored row instead cost about as much as reading the
//! cells themselves (most of a read is the driver's work per returned row,
//! not the lookup), so this halves what a full verify reads.
//!
//! The comparison is exact, as `same()` in Rust: column by column with the
//! database's null-safe equality (`IS` on SQLite, `IS NOT DISTINCT FROM` on
//! PostgreSQL, `<=>` on MySQL) against values bound in the column's own
//! type. MySQL gets its rows as a `UNION ALL` of `SELECT`s with every value
//! cast to the column type, since the type of a union column is otherwise
//! inferred from its values (a `DATETIME(6)` could lose its microseconds);
//! SQLite and PostgreSQL take a `VALUES` list. A mismatch found here is only
//! a candidate: the verify reads it again, stored row included, and
//! compares in Rust before it reports anything.
//!
//! Batches have sizes from a short fixed list (1000, then powers of two),
//! so the few statement texts stay in the drivers' statement caches
//! instead of each chunk's tail preparing a new one.

use uuid::Uuid;

use super::super::apply::Entry;
use super::super::entry::col_type;
use crate::storage::{ddl, ColType, Dialect, Sql, Value, MAX_PARAMS};
use crate::topology::IndexRuntime;

/// Most rows one statement compares.
pub(super) const ROWS_PER_STATEMENT: usize = 1000;

/// Splits `n` rows into batches whose sizes come from a fixed list: as
/// many of `largest` as fit, then decreasing powers of two.
pub(super) fn batches(n: usize, largest: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut at = 0;
    while n - at >= largest {
        out.push(at..at + largest);
        at += largest;
    }
    let mut size = largest.next_power_of_two();
    while at < n {
        while size > n - at {
            size /= 2;
        }
        out.push(at..at + size);
        at += size;
    }
    out
}

/// Most rows one statement of `runtime` compares, within the bind limit.
pub(super) fn rows_per_statement(runtime: &IndexRuntime) -> usize {
    let per_row = 2 + runtime.def.fields.len() + runtime.def.columns.len();
    (MAX_PARAMS / per_row).clamp(1, ROWS_PER_STATEMENT)
}

/// The statement returning, of `rows` (each with the entry that belongs on
/// this cluster), those whose stored row is not that entry: the row key
/// and the stored `_shard` (NULL when no live row is stored, a missing
/// entry; else a stale one).
pub(super) fn mismatches(dialect: Dialect, runtime: &IndexRuntime, rows: &[(Uuid, &Entry)]) -> Sql {
    let index = &runtime.def;
    // (stored column, type) in the order of the bound values after the key.
    let mut columns: Vec<(String, ColType)> = vec![(ddl::INDEX_SHARD_COLUMN.into(), ColType::Int)];
    columns.extend(
        index
            .fields
            .iter()
            .map(|f| (f.name.clone(), col_type(f.ty))),
    );
    columns.extend(
        index
            .columns
            .iter()
            .map(|c| (ddl::ref_column(c), ColType::Int)),
    );
    let mut sql = Sql::new(dialect);
    sql.push("SELECT e.column1, t.")
        .ident(ddl::INDEX_SHARD_COLUMN)
        .push(" FROM (");
    for (i, (row_key, entry)) in rows.iter().enumerate() {
        let values = std::iter::once(Value::Uuid(*row_key))
            .chain(std::iter::once(
                entry
                    .shard
                    .map_or(Value::Null(ColType::Int), |s| Value::Int(i64::from(s))),
            ))
            .chain(entry.fields.iter().cloned())
            .chain(
                entry
                    .refs
                    .iter()
                    .map(|r| r.map_or(Value::Null(ColType::Int), Value::Int)),
            );
        if dialect.has_values_tables() {
            sql.push(if i == 0 { "VALUES " } else { ", " });
            sql.bind_list(values);
        } else {
            sql.push(if i == 0 {
                "SELECT "
            } else {
                " UNION ALL SELECT "
            });
            let types = std::iter::once(ColType::Uuid).chain(columns.iter().map(|(_, ty)| *ty));
            for (j, (value, ty)) in values.zip(types).enumerate() {
                if j > 0 {
                    sql.push(", ");
                }
                sql.bind_as(value, ty);
                if i == 0 {
                    sql.push(&format!(" AS column{}", j + 1));
                }
            }
        }
    }
    sql.push(") AS e LEFT JOIN ")
        .ident(&runtime.table)
        .push(" t ON t.")
        .ident("row_key")
        .push(" = e.column1 WHERE NOT (");
    for (j, (column, _)) in columns.iter().enumerate() {
        if j > 0 {
            sql.push(" AND ");
        }
        sql.push("t.").ident(column).push(dialect.null_safe_eq());
        sql.push(&format!("e.column{}", j + 2));
    }
    sql.push(")");
    sql
}

/// The type a MySQL value is cast to, closing the `CAST(`.
/// The statement returning which of `rows` have a live stored row (an
/// extra entry: none of them belongs on this cluster).
pub(super) fn live(dialect: Dialect, runtime: &IndexRuntime, rows: &[Uuid]) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push("SELECT ")
        .ident("row_key")
        .push(" FROM ")
        .ident(&runtime.table)
        .push(" WHERE ")
        .ident("row_key")
        .in_list(rows.iter().map(|r| Value::Uuid(*r)))
        .push(" AND ")
        .ident(ddl::INDEX_SHARD_COLUMN)
        .push(" IS NOT NULL");
    sql
}

#[cfg(test)]
mod tests {
    use super::batches;

    #[test]
    fn batches_cover_every_row_once_in_few_sizes() {
        for n in [0, 1, 2, 7, 999, 1000, 1001, 2730, 4096] {
            let parts = batches(n, 1000);
            let mut next = 0;
            for part in &parts {
                assert_eq!(part.start, next);
                let len = part.len();
                assert!(
                    len == 1000 || (len.is_power_of_two() && len < 1000),
                    "{len}"
                );
                next = part.end;
            }
            assert_eq!(next, n);
        }
        assert_eq!(batches(2730, 1000).len(), 2 + 6);
    }
}
