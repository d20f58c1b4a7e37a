//! Indexes that earlier versions created on a datastore's tables and this
//! one does not use ([`ddl::superseded_indexes`]), dropped when a gateway
//! starts: in a transaction of their own, after the tables are prepared,
//! waiting a bounded time for the table's lock.

use std::sync::Arc;
use std::time::Duration;

use crate::error::Result;
use crate::storage::{ddl, Backend};
use crate::topology::{Cluster, DatastoreRuntime};

/// How long a start waits for the table lock that dropping an index of
/// an earlier version takes, while the statements of other gateways on
/// the table queue behind it.
const DROP_LOCK_WAIT: Duration = Duration::from_secs(2);

/// Drops the indexes of the datastores' tables on `cluster` that earlier
/// versions created and this one does not use
/// ([`ddl::superseded_indexes`]). One that cannot be dropped now (a
/// transaction on the table held the lock longer than [`DROP_LOCK_WAIT`],
/// or the database failed) stays, costing writes what it did before, and
/// the next start tries again.
pub(super) async fn drop_superseded(datastores: &[Arc<DatastoreRuntime>], cluster: &Cluster) {
    let backend = cluster.master.as_ref();
    for ds in datastores {
        if ds.map().ranges_of(cluster.index).is_empty() {
            continue;
        }
        for index in ddl::superseded_indexes(ds.name()) {
            match drop_one(backend, &index).await {
                Ok(true) => tracing::info!(
                    cluster = %cluster.name,
                    datastore = %ds.name(),
                    "dropped an index of an earlier version that this one does not use"
                ),
                Ok(false) => {}
                Err(err) => tracing::warn!(
                    cluster = %cluster.name,
                    datastore = %ds.name(),
                    error = %err,
                    "an index of an earlier version could not be dropped now (a transaction on \
                     its table held the lock); the next start tries again"
                ),
            }
        }
    }
}

/// Drops `index` if it exists; true when it did.
async fn drop_one(backend: &dyn Backend, index: &ddl::Superseded) -> Result<bool> {
    let dialect = backend.dialect();
    let mut tx = backend.begin().await?;
    let found = tx.first_row::<(i64,)>(&index.exists(dialect)).await?;
    if found.is_none_or(|(n,)| n <= 0) {
        tx.commit().await?;
        return Ok(false);
    }
    let mut outcome = Ok(0);
    for sql in index.drop(dialect, DROP_LOCK_WAIT) {
        outcome = tx.execute(&sql).await;
        if outcome.is_err() {
            break;
        }
    }
    if let Some(restore) = index.restore(dialect) {
        tx.execute(&restore).await?;
    }
    outcome?;
    tx.commit().await?;
    Ok(true)
}
