//! How a maintenance worker keeps its lease buckets (`shard_leases.rs`):
//! renewing, taking a fair share, adopting the offsets of buckets it
//! takes, and giving them all up at shutdown.

use std::collections::{BTreeSet, HashMap};

use crate::error::Result;
use crate::indexes::apply::{self};
use crate::topology::{ClusterState, Topology};

use super::worker::Worker;

impl Worker {
    /// Renews held leases, counts the gateways, and takes or gives up
    /// buckets to hold a fair share; true when it holds less than that.
    pub(super) async fn leases(&mut self) -> bool {
        if !self.maintain {
            return false;
        }
        let Some(topology) = self.topology.upgrade() else {
            return false;
        };
        let cluster = &topology.clusters[self.cluster];
        if cluster.state() != ClusterState::Ready {
            return false;
        }
        let Ok(backend) = cluster.maintenance() else {
            return false;
        };
        let backend = backend.clone();
        let short = match self.rebalance(&topology, backend.as_ref()).await {
            Ok(short) => short,
            Err(err) => {
                tracing::warn!(datastore = %self.datastore, cluster = %cluster.name, error = %err, "lease maintenance failed");
                false
            }
        };
        self.shared.held.lock().expect("held").insert(
            (self.datastore.clone(), self.cluster),
            self.leases.held.len(),
        );
        short
    }

    async fn rebalance(
        &mut self,
        topology: &Topology,
        backend: &dyn crate::storage::Backend,
    ) -> Result<bool> {
        // Buckets with a pass in flight are not given up mid-pass.
        let busy: BTreeSet<usize> = self.claimed.keys().copied().collect();
        let changed = self.leases.rebalance_except(backend, &busy).await?;
        for bucket in &changed.lost {
            tracing::warn!(datastore = %self.datastore, bucket, "lease lost to another gateway");
        }
        for bucket in changed.lost.iter().chain(&changed.released) {
            self.forget_shards(*bucket);
            self.unadopted.remove(bucket);
        }
        // A bucket whose offsets cannot be read now is held all the same
        // (giving it up would only move the failure) and adopted at a
        // later round; until then no pass touches its shards.
        self.unadopted.extend(changed.acquired.iter().copied());
        if !self.unadopted.is_empty() {
            let buckets: Vec<usize> = self.unadopted.iter().copied().collect();
            self.adopt(topology, backend, &buckets).await?;
            self.unadopted.clear();
        }
        Ok(changed.short)
    }

    /// Loads the offsets of newly held buckets and marks their shards that
    /// are behind dirty.
    async fn adopt(
        &mut self,
        topology: &Topology,
        backend: &dyn crate::storage::Backend,
        buckets: &[usize],
    ) -> Result<()> {
        let ds = topology.datastore(&self.datastore)?;
        let shards: Vec<u32> = buckets
            .iter()
            .flat_map(|b| self.leases.buckets[*b].shards.iter().copied())
            .collect();
        let offsets = apply::read_offsets(backend, &ds, &self.consumers, &shards).await?;
        let heads: HashMap<u32, i64> = crate::cells::heads(backend, &ds)
            .await?
            .into_iter()
            .collect();
        let building: Vec<bool> = self
            .consumers
            .iter()
            .map(|c| !ds.indexes[c.index].is_ready())
            .collect();
        for (shard, per) in offsets {
            let head = heads.get(&shard).copied().unwrap_or(0);
            for (o, building) in per.iter().zip(&building) {
                if *o < head {
                    if *building {
                        self.building.insert(shard);
                    } else {
                        self.dirty.insert(shard);
                    }
                }
            }
            self.heads.insert(shard, head);
            self.offsets.insert(shard, per);
        }
        tracing::debug!(datastore = %self.datastore, buckets = buckets.len(), "took over shard buckets");
        Ok(())
    }

    /// Gives up every held lease (the store is shutting down), so other
    /// gateways take over at once instead of after the lease time.
    pub(super) async fn release_all(&mut self) {
        if !self.maintain {
            return;
        }
        self.leases.release_all(self.backend.as_ref(), true).await;
    }
}
