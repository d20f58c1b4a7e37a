//! The statements of a maintenance pass: upserts of index entries that
//! never replace newer ones, forgetting entries, quarantining cells, and
//! the consumers' offsets.

use super::*;
use crate::storage::Assign;

/// A multi-row guarded upsert of entries: each row is its entry where
/// `here` says it lives on this cluster, else a tombstone (shard field and
/// fields NULL) with the entry's ref keys. The guard, on every ref key,
/// keeps the stored row when it was computed from newer cells; a new row is
/// always inserted, so a tombstone is there for a later stale entry to lose
/// to.
pub(super) fn upsert_sql(
    dialect: Dialect,
    runtime: &IndexRuntime,
    rows: &[(Uuid, &Entry, bool)],
    now: &Value,
) -> Sql {
    let index = &runtime.def;
    let refs: Vec<String> = index.columns.iter().map(|c| ddl::ref_column(c)).collect();
    let mut columns: Vec<&str> = vec!["row_key", ddl::INDEX_SHARD_COLUMN];
    columns.extend(index.fields.iter().map(|f| f.name.as_str()));
    columns.push("_updated_at");
    columns.extend(refs.iter().map(String::as_str));
    let mut sql = Sql::new(dialect);
    sql.push("INSERT INTO ")
        .ident(&runtime.table)
        .push(dialect.insert_alias());
    sql.push(" (").idents(columns.iter().copied()).push(") ");
    sql.rows(rows.iter().map(|(row_key, entry, here)| {
        let mut values = vec![Value::Uuid(*row_key)];
        match (here, entry.shard) {
            (true, Some(shard)) => {
                values.push(Value::Int(i64::from(shard)));
                values.extend(entry.fields.iter().cloned());
            }
            _ => {
                values.push(Value::Null(ColType::Int));
                values.extend(index.fields.iter().map(|f| Value::Null(col_type(f.ty))));
            }
        }
        values.push(now.clone());
        values.extend(entry.refs.iter().map(|r| ref_value(*r)));
        values
    }));
    // Every column but the key; the ref columns come last, as MySQL's
    // guard reads the stored refs, which are then still unchanged.
    let assigns: Vec<Assign> = columns[1..].iter().map(|c| Assign::New(c)).collect();
    let guarded: Vec<&str> = refs.iter().map(String::as_str).collect();
    sql.push(&dialect.upsert_with(&["row_key"], &assigns, &guarded));
    sql
}

pub(super) fn ref_value(value: Option<i64>) -> Value {
    value.map_or(Value::Null(ColType::Int), Value::Int)
}

/// Removes the quarantine records `(index name, row key)` of `rows`.
pub(super) fn forget_sql(dialect: Dialect, ds: &DatastoreRuntime, rows: &[(String, Uuid)]) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push("DELETE FROM ")
        .ident(&ddl::quarantine_table(ds.name()))
        .push(" WHERE ");
    for (i, (index, row_key)) in rows.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        sql.push("(")
            .ident("index_name")
            .push(" = ")
            .bind(Value::Text(index.clone()))
            .push(" AND ")
            .ident("row_key")
            .push(" = ")
            .bind(Value::Uuid(*row_key))
            .push(")");
    }
    sql
}

/// Records quarantined entries, having failed `attempts` times (or counts
/// another attempt of entries already there).
pub(super) fn quarantine_sql(
    dialect: Dialect,
    ds: &DatastoreRuntime,
    failures: &[Failure],
    attempts: u32,
    now: chrono::DateTime<Utc>,
) -> Sql {
    let mut unique: BTreeMap<(usize, Uuid), &Failure> = BTreeMap::new();
    for failure in failures {
        unique
            .entry((failure.index, failure.row_key))
            .or_insert(failure);
    }
    let table = ddl::quarantine_table(ds.name());
    let mut sql = Sql::new(dialect);
    sql.push("INSERT INTO ")
        .ident(&table)
        .push(dialect.insert_alias());
    sql.push(" (")
        .idents([
            "index_name",
            "row_key",
            "shard",
            "added_id",
            "code",
            "message",
            "attempts",
            "first_seen",
            "last_seen",
        ])
        .push(") ")
        .rows(unique.values().map(|f| {
            vec![
                Value::Text(ds.indexes[f.index].def.name.clone()),
                Value::Uuid(f.row_key),
                Value::Int(i64::from(f.shard)),
                Value::Int(f.added_id.min(i64::MAX - 1)),
                Value::Text(f.error.code().to_string()),
                Value::Text(f.error.to_string()),
                Value::Int(i64::from(attempts)),
                Value::DateTime(now),
                Value::DateTime(now),
            ]
        }));
    sql.push(&dialect.upsert_with(
        &["index_name", "row_key"],
        &[
            Assign::New("code"),
            Assign::New("message"),
            Assign::New("last_seen"),
            Assign::Increment("attempts"),
        ],
        &[],
    ));
    sql
}

/// Upserts the offsets that moved.
pub(super) async fn write_offsets(
    tx: &mut dyn Tx,
    dialect: Dialect,
    ds: &DatastoreRuntime,
    consumers: &[Consumer],
    before: &BTreeMap<u32, Vec<i64>>,
    after: &BTreeMap<u32, Vec<i64>>,
    now: chrono::DateTime<Utc>,
) -> Result<()> {
    let mut rows = Vec::new();
    for (shard, per) in after {
        let old = &before[shard];
        for (c, consumer) in consumers.iter().enumerate() {
            if per[c] > old[c] {
                rows.push(vec![
                    Value::Int(i64::from(*shard)),
                    Value::Text(consumer.name.clone()),
                    Value::Int(per[c]),
                    Value::DateTime(now),
                ]);
            }
        }
    }
    for chunk in rows.chunks(MAX_PARAMS / 4) {
        let mut sql = Sql::new(dialect);
        sql.push("INSERT INTO ")
            .ident(&ddl::offsets_table(ds.name()))
            .push(" (")
            .idents(["shard", "consumer", "added_id", "updated_at"])
            .push(") ")
            .rows(chunk.iter().cloned())
            .push(&dialect.upsert(&["shard", "consumer"], &["added_id", "updated_at"]));
        tx.execute(&sql).await?;
    }
    Ok(())
}

/// The stored offsets of `consumers` for `shards` (0 when absent), in one
/// statement per chunk of shards.
pub(crate) async fn read_offsets(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    consumers: &[Consumer],
    shards: &[u32],
) -> Result<BTreeMap<u32, Vec<i64>>> {
    let mut offsets: BTreeMap<u32, Vec<i64>> = shards
        .iter()
        .map(|s| (*s, vec![0; consumers.len()]))
        .collect();
    let position: HashMap<&str, usize> = consumers
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    for chunk in shards.chunks(MAX_PARAMS / 2) {
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT ")
            .idents(["shard", "consumer", "added_id"])
            .push(" FROM ")
            .ident(&ddl::offsets_table(ds.name()))
            .push(" WHERE ")
            .ident("shard")
            .in_list(chunk.iter().map(|s| Value::Int(i64::from(*s))));
        for (shard, consumer, added_id) in backend.rows::<(i64, String, i64)>(&sql).await? {
            if let (Some(per), Some(&c)) = (
                offsets.get_mut(&(shard as u32)),
                position.get(consumer.as_str()),
            ) {
                per[c] = added_id;
            }
        }
    }
    Ok(offsets)
}
