//! How far index maintenance is behind the cell log, computed from the
//! database: each shard's log head (its counter row) against the stored
//! offset of each consumer. Nothing here depends on what this process has
//! seen since it started, so the figures survive restarts and agree
//! between gateways.

use chrono::{DateTime, Utc};

use super::apply::Consumer;
use crate::error::Result;
use crate::storage::{ddl, Backend, Sql, Value, MAX_PARAMS};
use crate::topology::DatastoreRuntime;

/// A consumer that has not applied a shard's log to its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Behind {
    pub(crate) shard: u32,
    /// The shard's last `added_id`.
    pub(crate) head: i64,
    /// Position of the consumer in the consumer list.
    pub(crate) consumer: usize,
    /// Its stored offset (0 when it has none).
    pub(crate) offset: i64,
}

/// Every `(shard, consumer)` of `ds` on the cluster of `backend` whose
/// offset is below the shard's head, in one statement.
pub(crate) async fn behind(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    consumers: &[Consumer],
) -> Result<Vec<Behind>> {
    if consumers.is_empty() {
        return Ok(Vec::new());
    }
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT s.")
        .ident("shard")
        .push(", ABS(s.")
        .ident("next_added_id")
        .push("), c.")
        .ident("consumer")
        .push(", o.")
        .ident("added_id")
        .push(" FROM ")
        .ident(&ddl::shards_table(ds.name()))
        .push(" s CROSS JOIN (");
    for (i, consumer) in consumers.iter().enumerate() {
        if i > 0 {
            sql.push(" UNION ALL ");
        }
        sql.push("SELECT ")
            .bind(Value::Text(consumer.name.clone()))
            .push(" AS ")
            .ident("consumer");
    }
    sql.push(") c LEFT JOIN ")
        .ident(&ddl::offsets_table(ds.name()))
        .push(" o ON o.")
        .ident("shard")
        .push(" = s.")
        .ident("shard")
        .push(" AND o.")
        .ident("consumer")
        .push(" = c.")
        .ident("consumer")
        .push(" WHERE ABS(s.")
        .ident("next_added_id")
        .push(") - 1 > COALESCE(o.")
        .ident("added_id")
        .push(", 0)");
    Ok(backend
        .rows::<(i64, i64, String, Option<i64>)>(&sql)
        .await?
        .into_iter()
        .filter_map(|(shard, next, consumer, offset)| {
            Some(Behind {
                shard: shard as u32,
                head: next - 1,
                consumer: consumers.iter().position(|c| c.name == consumer)?,
                offset: offset.unwrap_or(0),
            })
        })
        .collect())
}

/// The creation time of the oldest of the given cells `(shard, added_id)`,
/// in one statement per chunk.
pub(crate) async fn oldest(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    cells: &[(u32, i64)],
) -> Result<Option<DateTime<Utc>>> {
    let mut oldest: Option<DateTime<Utc>> = None;
    let terms = backend.dialect().max_or_terms().min(MAX_PARAMS / 2);
    for chunk in cells.chunks(terms) {
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT MIN(")
            .ident("created_at")
            .push(") FROM ")
            .ident(&ddl::cells_table(ds.name()))
            .push(" WHERE ");
        crate::cells::positions_condition(&mut sql, chunk, " = ");
        if let Some((Some(found),)) = backend.first_row::<(Option<DateTime<Utc>>,)>(&sql).await? {
            oldest = Some(oldest.map_or(found, |o| o.min(found)));
        }
    }
    Ok(oldest)
}

/// Lag of one datastore on one cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ClusterLag {
    /// Cells not yet applied, summed over shards (the furthest-behind
    /// consumer of each shard).
    pub(crate) pending_cells: i64,
    /// Shards with unapplied cells, and how many each has.
    pub(crate) shards: Vec<(u32, i64)>,
    /// Age of the oldest unapplied cell, in milliseconds.
    pub(crate) oldest_ms: u64,
    /// Per consumer: cells still to apply.
    pub(crate) pending_by_consumer: Vec<i64>,
    /// Entries in the quarantine.
    pub(crate) quarantined: i64,
    /// Cells in the log of the cluster's shards (the sum of their heads);
    /// measured only while an index of the datastore is building, as the
    /// total a build reads.
    pub(crate) log_cells: Option<i64>,
}

/// The cells in the log of the shards of `ds` on the cluster of `backend`
/// (the sum of their heads), in one statement.
pub(crate) async fn log_cells(backend: &dyn Backend, ds: &DatastoreRuntime) -> Result<i64> {
    crate::cells::log_length(backend, ds.name()).await
}

/// Measures the lag of `ds` on one cluster: which shards are behind, by
/// how many cells, and the age of the oldest unapplied cell (looked up for
/// the [`OLDEST_SAMPLE`] shards furthest behind). Also returns the rows of
/// [`behind`] it was computed from.
pub(crate) async fn measure(
    backend: &dyn Backend,
    ds: &DatastoreRuntime,
    consumers: &[Consumer],
) -> Result<(ClusterLag, Vec<Behind>)> {
    let rows = behind(backend, ds, consumers).await?;
    let mut lag = ClusterLag {
        pending_by_consumer: vec![0; consumers.len()],
        ..ClusterLag::default()
    };
    let mut per_shard: std::collections::BTreeMap<u32, (i64, i64)> = Default::default();
    for row in &rows {
        lag.pending_by_consumer[row.consumer] += row.head - row.offset;
        let entry = per_shard.entry(row.shard).or_insert((row.head, row.offset));
        entry.1 = entry.1.min(row.offset);
    }
    lag.shards = per_shard
        .iter()
        .map(|(shard, (head, offset))| (*shard, head - offset))
        .collect();
    lag.pending_cells = lag.shards.iter().map(|(_, n)| n).sum();
    let mut furthest: Vec<(u32, i64, i64)> = per_shard
        .iter()
        .map(|(shard, (head, offset))| (*shard, head - offset, *offset))
        .collect();
    furthest.sort_by_key(|(_, pending, _)| std::cmp::Reverse(*pending));
    furthest.truncate(OLDEST_SAMPLE);
    let firsts: Vec<(u32, i64)> = furthest.iter().map(|(s, _, o)| (*s, o + 1)).collect();
    if let Some(oldest) = oldest(backend, ds, &firsts).await? {
        lag.oldest_ms = (Utc::now() - oldest).num_milliseconds().max(0) as u64;
    }
    lag.quarantined = super::quarantine::count(backend, ds).await?;
    if ds.indexes.iter().any(|i| !i.is_ready()) {
        lag.log_cells = Some(log_cells(backend, ds).await?);
    }
    Ok((lag, rows))
}

/// Shards whose oldest unapplied cell is looked up by [`measure`].
pub(crate) const OLDEST_SAMPLE: usize = 256;
