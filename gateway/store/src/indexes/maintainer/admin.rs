//! Applying the whole log without leases, for admin use when no
//! maintainer runs.

use std::collections::{BTreeSet, HashMap};

use crate::error::{Error, Result};
use crate::indexes::apply::{self, Pass};
use crate::indexes::lag::{self};
use crate::topology::{DatastoreRuntime, Topology};

use super::*;

/// Applies every cell after the stored offsets of `ds` on `cluster`,
/// without leases: for admin use when no maintainer runs (maintenance
/// off), e.g. `sync_indexes` in tests and one-shot repairs.
pub(crate) async fn apply_all(
    topology: &Topology,
    ds: &DatastoreRuntime,
    cluster: usize,
    quarantine_after: u32,
) -> Result<()> {
    let backend = topology.clusters[cluster].master()?.clone();
    let consumers = apply::consumers(topology, ds);
    let mut attempts = HashMap::new();
    loop {
        let behind = lag::behind(backend.as_ref(), ds, &consumers).await?;
        let shards: Vec<u32> = behind
            .iter()
            .map(|b| b.shard)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if shards.is_empty() {
            return Ok(());
        }
        for chunk in shards.chunks(PASS_SHARDS) {
            let offsets = apply::read_offsets(backend.as_ref(), ds, &consumers, chunk).await?;
            let mut pass = Pass {
                topology,
                ds,
                cluster,
                consumers: &consumers,
                fence: None,
                attempts: &mut attempts,
                quarantine_after,
                hook: None,
                recent: None,
            };
            let result = pass.run(&offsets).await?;
            if let Some((target, err)) = result.failed_targets.into_iter().next() {
                return Err(Error::ClusterNotReady {
                    cluster: topology.clusters[target].name.clone(),
                    reason: err.client_message(),
                });
            }
        }
    }
}
