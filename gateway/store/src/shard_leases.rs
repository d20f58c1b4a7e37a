//! Shards shared between gateways through leases: the shards of a
//! datastore on one cluster split into up to [`BUCKETS`] contiguous
//! buckets, each a lease (`leases.rs`) on that cluster, and the
//! rebalancing by which every gateway holds a fair share of them. Index
//! maintenance (`indexes/maintainer/`) and trigger consumers (`triggers/`)
//! each keep one [`ShardLeases`] per datastore and cluster, under their own
//! lease name prefix.
//!
//! Gateways announce themselves with member leases; each takes free (or
//! expired) buckets up to its fair share and gives up a surplus, so a
//! gateway that stops renewing loses its buckets when they expire and the
//! others take them over. Each held lease keeps, by the monotonic clock,
//! until when it is surely held: the time its taking or renewal was sent
//! plus the lease time.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use chrono::Utc;
use rand::seq::SliceRandom;

use crate::error::Result;
use crate::leases::{self, Lease};
use crate::storage::Backend;
use crate::topology::DatastoreRuntime;

/// Most lease buckets per datastore and cluster.
pub(crate) const BUCKETS: usize = 64;

/// A lease held, and until when surely.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) lease: Lease,
    /// The monotonic time the statement that took or renewed the lease
    /// was sent, plus the lease time: the lease cannot have expired
    /// before, but for skew between clocks.
    pub(crate) until: Instant,
}

/// A lease bucket: a run of the shards of one cluster.
pub(crate) struct Bucket {
    pub(crate) name: String,
    pub(crate) shards: Vec<u32>,
}

/// What a [`ShardLeases::rebalance`] changed.
#[derive(Debug, Default)]
pub(crate) struct Rebalanced {
    /// Buckets another gateway took (no longer held).
    pub(crate) lost: Vec<usize>,
    /// Buckets given up as a surplus (no longer held).
    pub(crate) released: Vec<usize>,
    /// Buckets taken now.
    pub(crate) acquired: Vec<usize>,
    /// Still holding less than a fair share.
    pub(crate) short: bool,
}

/// The bucket of each shard: a dense table, since a maintainer looks up
/// every dirty shard's bucket on each round (a hash lookup per shard was a
/// visible share of its CPU under write load).
pub(crate) struct BucketOf(Vec<usize>);

impl BucketOf {
    fn new(buckets: &[Bucket]) -> BucketOf {
        let end = buckets
            .iter()
            .flat_map(|b| b.shards.iter())
            .max()
            .map_or(0, |s| *s as usize + 1);
        let mut table = vec![usize::MAX; end];
        for (i, bucket) in buckets.iter().enumerate() {
            for shard in &bucket.shards {
                table[*shard as usize] = i;
            }
        }
        BucketOf(table)
    }

    /// The bucket of `shard`; `None` for a shard of no bucket.
    pub(crate) fn get(&self, shard: &u32) -> Option<&usize> {
        self.0
            .get(*shard as usize)
            .filter(|bucket| **bucket != usize::MAX)
    }
}

/// One gateway's leases on the shards of a datastore on one cluster.
pub(crate) struct ShardLeases {
    /// Lease names are the prefix and the bucket number.
    prefix: String,
    pub(crate) buckets: Vec<Bucket>,
    pub(crate) bucket_of: BucketOf,
    pub(crate) held: BTreeMap<usize, Held>,
    holder: String,
    pub(crate) ttl: Duration,
}

impl ShardLeases {
    /// Every shard of the buckets, in order.
    pub(crate) fn shards(&self) -> Vec<u32> {
        self.buckets
            .iter()
            .flat_map(|b| b.shards.iter().copied())
            .collect()
    }

    /// The buckets of the shards of `ds` held by `cluster`, leases named
    /// `<prefix><n>`, none held yet.
    pub(crate) fn new(
        ds: &DatastoreRuntime,
        cluster: usize,
        prefix: String,
        holder: String,
        ttl: Duration,
    ) -> ShardLeases {
        let shards: Vec<u32> = ds
            .work_map()
            .ranges_of(cluster)
            .into_iter()
            .flat_map(|(a, b)| a..=b)
            .collect();
        let count = BUCKETS.min(shards.len()).max(1);
        let size = shards.len().div_ceil(count).max(1);
        let buckets: Vec<Bucket> = shards
            .chunks(size)
            .enumerate()
            .map(|(i, chunk)| Bucket {
                name: format!("{prefix}{i}"),
                shards: chunk.to_vec(),
            })
            .collect();
        let bucket_of = BucketOf::new(&buckets);
        ShardLeases {
            prefix,
            buckets,
            bucket_of,
            held: BTreeMap::new(),
            holder,
            ttl,
        }
    }

    /// The leases covering `shards`, and until when all of them are surely
    /// held; `None` when one of them is not held.
    pub(crate) fn covering(
        &self,
        shards: impl IntoIterator<Item = u32>,
    ) -> Option<(Vec<Lease>, Instant)> {
        let buckets: BTreeSet<usize> = shards
            .into_iter()
            .map(|s| self.bucket_of.get(&s).copied())
            .collect::<Option<_>>()?;
        let mut leases = Vec::new();
        let mut until: Option<Instant> = None;
        for bucket in buckets {
            let held = self.held.get(&bucket)?;
            leases.push(held.lease.clone());
            until = Some(until.map_or(held.until, |u| u.min(held.until)));
        }
        Some((leases, until.unwrap_or_else(Instant::now)))
    }

    /// The held buckets whose leases are comfortably valid: a quarter of
    /// the lease time left, by the clock of the expiry written and by the
    /// monotonic clock since the lease was last taken or renewed.
    pub(crate) fn valid(&self) -> BTreeSet<usize> {
        let quarter = self.ttl / 4;
        let margin = chrono::Duration::from_std(quarter).unwrap_or(chrono::Duration::seconds(2));
        let now = Utc::now();
        let soon = Instant::now() + quarter;
        self.held
            .iter()
            .filter(|(_, h)| h.lease.expires_at - margin > now && h.until > soon)
            .map(|(b, _)| *b)
            .collect()
    }

    /// Forgets the bucket of the lease `name` (lost to another gateway);
    /// the bucket, if it was held.
    pub(crate) fn forget(&mut self, name: &str) -> Option<usize> {
        let bucket = *self.held.iter().find(|(_, h)| h.lease.name == name)?.0;
        self.held.remove(&bucket);
        Some(bucket)
    }

    /// Renews the held leases and the gateway's member heartbeat; the
    /// buckets whose leases were lost meanwhile, which are held no more.
    pub(crate) async fn renew(&mut self, backend: &dyn Backend) -> Result<Vec<usize>> {
        let ttl = self.ttl;
        leases::heartbeat(backend, &self.holder, ttl).await?;
        let held: Vec<Lease> = self.held.values().map(|h| h.lease.clone()).collect();
        let sent = Instant::now();
        let renewed = leases::renew(backend, &self.holder, &held, ttl).await?;
        let renewed_names: BTreeSet<&str> = renewed.iter().map(|l| l.name.as_str()).collect();
        let lost: Vec<usize> = self
            .held
            .iter()
            .filter(|(_, h)| !renewed_names.contains(h.lease.name.as_str()))
            .map(|(b, _)| *b)
            .collect();
        for bucket in &lost {
            self.held.remove(bucket);
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
        Ok(lost)
    }

    /// Renews the held leases, counts the gateways, and takes or gives up
    /// buckets to hold a fair share.
    pub(crate) async fn rebalance(&mut self, backend: &dyn Backend) -> Result<Rebalanced> {
        self.rebalance_except(backend, &BTreeSet::new()).await
    }

    /// [`rebalance`](Self::rebalance), but never gives up the `busy`
    /// buckets (work on them is under way) to even out the shares; others
    /// are given up instead, or at a later round.
    pub(crate) async fn rebalance_except(
        &mut self,
        backend: &dyn Backend,
        busy: &BTreeSet<usize>,
    ) -> Result<Rebalanced> {
        let mut changed = Rebalanced::default();
        let ttl = self.ttl;
        let holder = self.holder.clone();
        changed.lost = self.renew(backend).await?;
        let members = leases::live_members(backend).await?;
        let fair = self.buckets.len().div_ceil(members);
        if self.held.len() > fair {
            changed.released = self
                .held
                .keys()
                .rev()
                .filter(|b| !busy.contains(b))
                .take(self.held.len() - fair)
                .copied()
                .collect();
            let names: Vec<String> = changed
                .released
                .iter()
                .map(|b| self.buckets[*b].name.clone())
                .collect();
            for bucket in &changed.released {
                self.held.remove(bucket);
            }
            leases::release(backend, &holder, &names).await?;
            return Ok(changed);
        }
        if self.held.len() == fair {
            return Ok(changed);
        }
        let mut rows = leases::list(backend, &self.prefix).await?;
        if rows.len() < self.buckets.len() {
            let names: Vec<String> = self.buckets.iter().map(|b| b.name.clone()).collect();
            leases::ensure(backend, &names).await?;
            rows = leases::list(backend, &self.prefix).await?;
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
        let wanted = fair - self.held.len();
        if free.len() <= wanted && free.len() <= BUCKETS {
            let rows: Vec<leases::LeaseRow> = free.iter().map(|(_, r)| r.clone()).collect();
            let buckets: HashMap<String, usize> =
                free.iter().map(|(b, r)| (r.name.clone(), *b)).collect();
            let sent = Instant::now();
            for lease in leases::acquire_all(backend, &rows, &holder, ttl, Duration::ZERO).await? {
                let bucket = buckets[&lease.name];
                self.held.insert(
                    bucket,
                    Held {
                        lease,
                        until: sent + ttl,
                    },
                );
                changed.acquired.push(bucket);
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
                    self.held.insert(
                        bucket,
                        Held {
                            lease,
                            until: sent + ttl,
                        },
                    );
                    changed.acquired.push(bucket);
                }
            }
        }
        changed.short = self.held.len() < fair;
        Ok(changed)
    }

    /// Gives up every held lease (and the gateway's member lease with
    /// `member`), so other gateways take over at once instead of after the
    /// lease time.
    pub(crate) async fn release_all(&mut self, backend: &dyn Backend, member: bool) {
        let mut names: Vec<String> = self.held.values().map(|h| h.lease.name.clone()).collect();
        if member {
            names.push(leases::member_name(&self.holder));
        }
        self.held.clear();
        let _ = leases::release(backend, &self.holder, &names).await;
    }
}
