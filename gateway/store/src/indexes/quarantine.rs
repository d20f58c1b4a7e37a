//! The quarantine: index entries that could not be applied after several
//! attempts (a corrupt body, a value the database refuses), set aside so
//! their shard keeps flowing. Each datastore has a `<ds>_quarantine` table
//! on each cluster, keyed by index and row. Entries are listed, and retried
//! once their cause is fixed (e.g. after a fix of a definition or a
//! backend): a retry recomputes the entry from the row's latest cells and
//! writes it, or records the failure again. A record is removed only by the
//! transaction that writes its entry on the row's cluster, so a retry that
//! fails (a cluster that does not answer) loses nothing: the log offsets
//! have long passed the record's cells, and the record is all that is left
//! of the work.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::apply::{consumers, Pass, Touched};
use crate::error::Result;
use crate::storage::{ddl, Sql};
use crate::topology::{DatastoreRuntime, Topology};

/// One quarantined index entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedEntry {
    pub index: String,
    pub row_key: Uuid,
    /// The row's shard.
    pub shard: u32,
    /// The log cell that needed the entry when it failed.
    pub added_id: i64,
    /// The error code of the last failure.
    pub code: String,
    pub message: String,
    pub first_seen: DateTime<Utc>,
    pub last_seen: DateTime<Utc>,
}

/// Every quarantined entry of `ds` on its reachable clusters, by index and
/// row key.
pub(crate) async fn list(
    topology: &Topology,
    ds: &DatastoreRuntime,
) -> Result<Vec<QuarantinedEntry>> {
    let mut entries = Vec::new();
    for cluster in ds.map().clusters() {
        let backend = topology.clusters[cluster].master()?;
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT ")
            .idents([
                "index_name",
                "row_key",
                "shard",
                "added_id",
                "code",
                "message",
                "first_seen",
                "last_seen",
            ])
            .push(" FROM ")
            .ident(&ddl::quarantine_table(ds.name()));
        type Row = (
            String,
            Uuid,
            i64,
            i64,
            String,
            String,
            DateTime<Utc>,
            DateTime<Utc>,
        );
        for (index, row_key, shard, added_id, code, message, first_seen, last_seen) in
            backend.rows::<Row>(&sql).await?
        {
            entries.push(QuarantinedEntry {
                index,
                row_key,
                shard: shard as u32,
                added_id,
                code,
                message,
                first_seen,
                last_seen,
            });
        }
    }
    entries.sort_by(|a, b| (&a.index, a.row_key).cmp(&(&b.index, b.row_key)));
    Ok(entries)
}

/// Retries the quarantined entries of `ds` (of one index, or all): each
/// leaves the quarantine if it can now be applied, in the transaction that
/// applies it on its row's cluster; a retry that fails keeps the records.
/// Returns `(applied, still quarantined)`.
pub(crate) async fn retry(
    topology: &Topology,
    ds: &DatastoreRuntime,
    index: Option<&str>,
) -> Result<(usize, usize)> {
    if let Some(name) = index {
        ds.index(name)?;
    }
    let all = list(topology, ds).await?;
    let consumers = consumers(topology, ds);
    let mut applied = 0;
    let mut by_cluster: BTreeMap<usize, (Touched, Vec<(String, Uuid)>)> = BTreeMap::new();
    for entry in all {
        if index.is_some_and(|name| name != entry.index) {
            continue;
        }
        let (touched, forget) = by_cluster
            .entry(ds.map().cluster_of(entry.shard))
            .or_default();
        match ds.indexes.iter().position(|i| i.def.name == entry.index) {
            Some(position) => {
                touched.insert((position, entry.row_key), (entry.shard, entry.added_id));
            }
            // An entry of an index no longer defined just leaves.
            None => forget.push((entry.index, entry.row_key)),
        }
    }
    let mut attempts = std::collections::HashMap::new();
    let total: usize = by_cluster.values().map(|(t, _)| t.len()).sum();
    for (cluster, (touched, forget)) in by_cluster {
        let mut pass = Pass {
            topology,
            ds,
            cluster,
            consumers: &consumers,
            fence: None,
            attempts: &mut attempts,
            quarantine_after: 1,
            hook: None,
            recent: None,
        };
        applied += pass.reapply(&touched, &forget).await?;
    }
    Ok((applied, total - applied))
}

/// How many entries of `ds` are quarantined on the cluster of `backend`.
pub(crate) async fn count(
    backend: &dyn crate::storage::Backend,
    ds: &DatastoreRuntime,
) -> Result<i64> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT COUNT(*) FROM ")
        .ident(&ddl::quarantine_table(ds.name()));
    Ok(backend.first_row::<(i64,)>(&sql).await?.map_or(0, |(n,)| n))
}
