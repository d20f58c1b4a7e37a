//! One recording verify per datastore at a time, across gateways.
//!
//! A run that records its progress (every run but a sampled one) writes the
//! datastore's one checkpoint after each chunk. Two such runs at once, in
//! two gateways or a gateway and the command line, would overwrite each
//! other's checkpoint and do the same work twice. So such a run first takes
//! the lease `verify:<datastore>` on the datastore's first cluster
//! (`run_lease.rs`); a second run is refused with `VERIFY_RUNNING`, naming
//! the holder.

use crate::error::{Error, Result};
pub(super) use crate::run_lease::{settle, RunLease};
use crate::topology::{DatastoreRuntime, Topology};

/// Takes the verify lease of `ds`, or fails with `VERIFY_RUNNING`.
pub(super) async fn take(topology: &Topology, ds: &DatastoreRuntime) -> Result<RunLease> {
    let home = ds.map().cluster_of(0);
    let backend = topology.clusters[home].maintenance()?.clone();
    let datastore = ds.name().to_string();
    RunLease::take(backend, format!("verify:{datastore}"), "verify", |row| {
        Error::VerifyRunning {
            datastore: datastore.clone(),
            holder: row.holder,
            until: row.expires_at,
        }
    })
    .await
}
