//! Lease buckets: the shards of a datastore on a cluster split into up to
//! [`BUCKETS`] leases, and how a worker renews its leases, counts the
//! gateways and takes or gives up buckets to hold a fair share. Each held
//! lease keeps, by the monotonic clock, until when it is surely held: the
//! time its taking or renewal was sent plus the lease time.

use std::collections::{BTreeSet, HashMap};
use std::time::Instant;

use chrono::Utc;
use rand::seq::SliceRandom;

use crate::error::Result;
use crate::indexes::apply::{self};
use crate::leases::{self, Lease};
use crate::topology::{ClusterState, DatastoreRuntime, Topology};

use super::worker::Worker;
use super::*;

/// A lease this worker holds.
#[derive(Debug, Clone)]
pub(super) struct Held {
    pub(super) lease: Lease,
    /// The monotonic time the statement that took or renewed the lease
    /// was sent, plus the lease time: the lease cannot have expired
    /// before, but for skew between clocks (see `worker.rs`).
    pub(super) until: Instant,
}

/// A lease bucket: a run of the shards of one cluster.
pub(super) struct Bucket {
    pub(super) name: String,
    pub(super) shards: Vec<u32>,
}

/// Splits the shards of `ds` held by `cluster` into lease buckets.
pub(super) fn buckets(ds: &DatastoreRuntime, cluster: usize) -> Vec<Bucket> {
    let shards: Vec<u32> = ds
        .map
        .ranges_of(cluster)
        .into_iter()
        .flat_map(|(a, b)| a..=b)
        .collect();
    let count = BUCKETS.min(shards.len()).max(1);
    let size = shards.len().div_ceil(count).max(1);
    shards
        .chunks(size)
        .enumerate()
        .map(|(i, chunk)| Bucket {
            name: format!("maint:{}:{i}", ds.name()),
            shards: chunk.to_vec(),
        })
        .collect()
}

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
        self.shared
            .held
            .lock()
            .expect("held")
            .insert((self.datastore.clone(), self.cluster), self.held.len());
        short
    }

    async fn rebalance(
        &mut self,
        topology: &Topology,
        backend: &dyn crate::storage::Backend,
    ) -> Result<bool> {
        let ttl = self.shared.options.lease_time;
        let holder = self.shared.holder.clone();
        leases::heartbeat(backend, &holder, ttl).await?;
        let held: Vec<Lease> = self.held.values().map(|h| h.lease.clone()).collect();
        let sent = Instant::now();
        let renewed = leases::renew(backend, &holder, &held, ttl).await?;
        let renewed_names: BTreeSet<&str> = renewed.iter().map(|l| l.name.as_str()).collect();
        let lost: Vec<usize> = self
            .held
            .iter()
            .filter(|(_, h)| !renewed_names.contains(h.lease.name.as_str()))
            .map(|(b, _)| *b)
            .collect();
        for bucket in lost {
            tracing::warn!(datastore = %self.datastore, bucket, "lease lost to another gateway");
            self.drop_bucket(bucket);
        }
        for lease in renewed {
            if let Some((_, held)) = self
                .held
                .iter_mut()
                .find(|(_, h)| h.lease.name == lease.name)
            {
                *held = Held {
                    lease,
                    until: sent + ttl,
                };
            }
        }
        let members = leases::live_members(backend).await?;
        let fair = self.buckets.len().div_ceil(members);
        if self.held.len() > fair {
            let surplus: Vec<usize> = self
                .held
                .keys()
                .rev()
                .take(self.held.len() - fair)
                .copied()
                .collect();
            let names: Vec<String> = surplus
                .iter()
                .map(|b| self.buckets[*b].name.clone())
                .collect();
            for bucket in surplus {
                self.drop_bucket(bucket);
            }
            leases::release(backend, &holder, &names).await?;
            return Ok(false);
        }
        if self.held.len() == fair {
            return Ok(false);
        }
        let prefix = format!("maint:{}:", self.datastore);
        let mut rows = leases::list(backend, &prefix).await?;
        if rows.len() < self.buckets.len() {
            let names: Vec<String> = self.buckets.iter().map(|b| b.name.clone()).collect();
            leases::ensure(backend, &names).await?;
            rows = leases::list(backend, &prefix).await?;
        }
        let now = Utc::now();
        let by_name: HashMap<&str, usize> = self
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b)| (b.name.as_str(), i))
            .collect();
        let mut free: Vec<(usize, leases::LeaseRow)> = rows
            .into_iter()
            .filter(|r| r.expires_at <= now || r.holder.is_empty())
            .filter_map(|r| by_name.get(r.name.as_str()).map(|b| (*b, r)))
            .filter(|(b, _)| !self.held.contains_key(b))
            .collect();
        free.shuffle(&mut rand::thread_rng());
        let mut acquired = Vec::new();
        let wanted = fair - self.held.len();
        if free.len() <= wanted && free.len() <= BUCKETS {
            let rows: Vec<leases::LeaseRow> = free.iter().map(|(_, r)| r.clone()).collect();
            let buckets: HashMap<String, usize> =
                free.iter().map(|(b, r)| (r.name.clone(), *b)).collect();
            let sent = Instant::now();
            for lease in leases::acquire_all(backend, &rows, &holder, ttl, Duration::ZERO).await? {
                let bucket = buckets[&lease.name];
                let until = sent + ttl;
                self.held.insert(bucket, Held { lease, until });
                acquired.push(bucket);
            }
        } else {
            for (bucket, row) in free {
                if self.held.len() >= fair {
                    break;
                }
                let sent = Instant::now();
                if let Some(lease) =
                    leases::acquire(backend, &row, &holder, ttl, Duration::ZERO).await?
                {
                    let until = sent + ttl;
                    self.held.insert(bucket, Held { lease, until });
                    acquired.push(bucket);
                }
            }
        }
        if !acquired.is_empty() {
            self.adopt(topology, backend, &acquired).await?;
        }
        Ok(self.held.len() < fair)
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
            .flat_map(|b| self.buckets[*b].shards.iter().copied())
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
        let mut names: Vec<String> = self.held.values().map(|h| h.lease.name.clone()).collect();
        names.push(leases::member_name(&self.shared.holder));
        let _ = leases::release(self.backend.as_ref(), &self.shared.holder, &names).await;
    }
}
