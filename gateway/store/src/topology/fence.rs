//! A gateway that may have missed a move checks its routes before a read.
//!
//! A move switches a range once every gateway acknowledged the new
//! version, or once a gateway's acknowledgement expired: a gateway cut off
//! from the metadata cluster is passed by. Its writes to a moved range are
//! safe on their own (the source's counters are negated at the fence and
//! deleted at the cleanup, and a write without a usable counter is not
//! written), but its reads would go on reading the old cluster, missing
//! what the new one acknowledged. So once its last acknowledgement is older
//! than [`FENCE_AFTER`](crate::topology::FENCE_AFTER) (the mover's wait is
//! longer), each read first asks the node it reads whether the shards it
//! routes there are still served there: their counters on that cluster
//! exist and are not negated. A range in motion (fenced, switched, cleaned
//! up) fails the read with `TOPOLOGY_STALE`, retryable, and the other
//! ranges keep being served. One statement per read and cluster, only
//! while the topology cannot be read.

use std::collections::BTreeSet;

use crate::error::{Error, Result};
use crate::storage::{ddl, Backend, Sql, Value};
use crate::topology::{DatastoreRuntime, Topology};

/// Fails with [`Error::TopologyStale`] when this gateway's routes may be
/// stale and `node` (of `cluster`) no longer serves every shard of
/// `shards` (all the shards routed to `cluster` when empty).
pub(crate) async fn check(
    topology: &Topology,
    ds: &DatastoreRuntime,
    cluster: usize,
    shards: &BTreeSet<u32>,
    node: &dyn Backend,
) -> Result<()> {
    let Some(since) = topology.moves.stale() else {
        return Ok(());
    };
    let ranges = if shards.is_empty() {
        ds.map().ranges_of(cluster)
    } else {
        ranges_of(shards)
    };
    let expected: i64 = ranges.iter().map(|(a, b)| i64::from(b - a + 1)).sum();
    if expected == 0 {
        return Ok(());
    }
    let mut sql = Sql::new(node.dialect());
    sql.push("SELECT COUNT(*) FROM ")
        .ident(&ddl::shards_table(ds.name()))
        .push(" WHERE ")
        .ident("next_added_id")
        .push(" > 0 AND (");
    for (i, (first, last)) in ranges.iter().enumerate() {
        if i > 0 {
            sql.push(" OR ");
        }
        sql.ident("shard")
            .push(" BETWEEN ")
            .bind(Value::Int(i64::from(*first)))
            .push(" AND ")
            .bind(Value::Int(i64::from(*last)));
    }
    sql.push(")");
    let served = node
        .rows::<(i64,)>(&sql)
        .await?
        .first()
        .map_or(0, |(n,)| *n);
    if served == expected {
        return Ok(());
    }
    Err(Error::TopologyStale {
        datastore: ds.name().to_string(),
        cluster: topology.clusters[cluster].name.clone(),
        since: (since != std::time::Duration::MAX).then_some(since.as_secs()),
    })
}

/// The contiguous ranges of `shards`.
fn ranges_of(shards: &BTreeSet<u32>) -> Vec<(u32, u32)> {
    let mut ranges: Vec<(u32, u32)> = Vec::new();
    for &shard in shards {
        match ranges.last_mut() {
            Some((_, last)) if *last + 1 == shard => *last = shard,
            _ => ranges.push((shard, shard)),
        }
    }
    ranges
}

#[cfg(test)]
mod tests {
    use super::ranges_of;

    #[test]
    fn shards_become_contiguous_ranges() {
        let shards = [0, 1, 2, 5, 7, 8].into_iter().collect();
        assert_eq!(ranges_of(&shards), vec![(0, 2), (5, 5), (7, 8)]);
    }
}
