//! Index maintenance in the background: per datastore and cell cluster, a
//! worker that keeps the indexes up to date with the cell log.
//!
//! **Work.** A worker knows which of its shards are *dirty* (have cells
//! its offsets have not reached) from three sources: the write events of
//! this process ([`Written`]), a periodic *sweep* that compares every
//! shard's log head with the stored offsets (so work written by other
//! gateways, lost wake-ups and clusters that were down are all picked up),
//! and the shards of leases it just acquired. It applies dirty shards in
//! batched passes (`apply.rs`): one pass covers up to [`PASS_SHARDS`]
//! shards and [`apply::PAGE`] cells in a handful of statements.
//!
//! **Leases.** The shards of a datastore on a cluster are split into up to
//! [`BUCKETS`] contiguous buckets, each a lease (`leases.rs`) on that
//! cluster. Gateways announce themselves with member leases and each takes
//! a fair share of the buckets; a gateway that stops renewing loses its
//! buckets when they expire and the others take them over. Every pass
//! commits under a fence on the leases of the shards it touched.
//!
//! **Down clusters.** A target cluster of index entries that cannot be
//! written is skipped for a while: entries routed to healthy clusters keep
//! flowing, and the sweep finds the skipped work once it is back. A cell
//! cluster that cannot be read backs its worker off.
//!
//! **Readiness.** The sweep also tells, per index, whether every shard is
//! caught up; an index being built becomes ready (and queryable) the first
//! time all clusters of its datastore report it so.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use chrono::Utc;
use rand::seq::SliceRandom;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::apply::{self, Consumer, Fence, Pass};
use super::lag::{self, ClusterLag};
use crate::cells::log;
use crate::error::{Error, Result};
use crate::leases::{self, Lease};
use crate::topology::{ClusterState, DatastoreRuntime, Topology, Written};

/// Most lease buckets per datastore and cluster.
pub(crate) const BUCKETS: usize = 64;

/// Most shards one pass reads from.
pub(crate) const PASS_SHARDS: usize = 1024;

/// How maintenance runs.
#[derive(Debug, Clone)]
pub struct MaintainerOptions {
    /// Lease time of a bucket of shards: how long a gateway that stopped
    /// keeps its shards before others take them over.
    pub lease_time: Duration,
    /// How often every shard's log head is compared with the offsets.
    pub sweep_every: Duration,
    /// Failed attempts after which an index entry is quarantined.
    pub quarantine_after: u32,
    /// Passes a worker runs at once over disjoint buckets of shards;
    /// 0 picks by backend (2 on SQLite, 4 on a server).
    pub passes: usize,
}

impl Default for MaintainerOptions {
    fn default() -> Self {
        MaintainerOptions {
            lease_time: Duration::from_secs(10),
            sweep_every: Duration::from_secs(1),
            quarantine_after: 3,
            passes: 0,
        }
    }
}

/// A message to a worker.
enum Msg {
    Written(Vec<(u32, i64)>),
    /// Sweep now, then answer.
    Sweep(oneshot::Sender<()>),
}

/// Per-datastore counters.
#[derive(Default)]
struct Counters {
    unstorable: AtomicU64,
    quarantined: AtomicU64,
    applied: AtomicU64,
}

/// Maintenance state shared by the workers and read by metrics.
pub(crate) struct Maintainer {
    pub(crate) options: MaintainerOptions,
    /// Identifies this process in lease tables.
    pub(crate) holder: String,
    workers: Mutex<HashMap<(String, usize), mpsc::UnboundedSender<Msg>>>,
    /// Apply delays since start, and since the last `take_delays`.
    delays_total_us: Mutex<hdrhistogram::Histogram<u64>>,
    delays_us: Mutex<hdrhistogram::Histogram<u64>>,
    /// The latest sweep of each (datastore, cluster).
    lag: Mutex<HashMap<(String, usize), ClusterLag>>,
    counters: Mutex<HashMap<String, Arc<Counters>>>,
    /// Buckets held per (datastore, cluster), for metrics.
    held: Mutex<HashMap<(String, usize), usize>>,
    /// The worker tasks, to wait for them at shutdown.
    tasks: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

/// The maintenance figures of one datastore, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MaintenanceMetrics {
    /// Cells not yet applied to every index, from the latest sweep.
    pub pending_cells: i64,
    /// Shards with cells not yet applied.
    pub lagging_shards: usize,
    /// Age of the oldest unapplied cell, in milliseconds.
    pub lag_max_ms: u64,
    /// Field values stored as NULL because a backend cannot store them.
    pub unstorable_values: u64,
    /// Entries this process moved to the quarantine.
    pub quarantined: u64,
    /// Entries in the quarantine now, from the latest sweep.
    pub quarantine_size: i64,
    /// Log cells this process applied.
    pub applied_cells: u64,
    /// Lease buckets this process holds.
    pub buckets_held: usize,
    /// Indexes still being built, with their cells to go.
    pub building: Vec<(String, i64)>,
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

impl Maintainer {
    pub(crate) fn new(options: MaintainerOptions) -> Maintainer {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_string());
        let holder = format!(
            "{host}:{}:{}",
            std::process::id(),
            &Uuid::new_v4().simple().to_string()[..8]
        );
        Maintainer {
            options,
            holder,
            workers: Mutex::new(HashMap::new()),
            delays_total_us: Mutex::new(histogram()),
            delays_us: Mutex::new(histogram()),
            lag: Mutex::new(HashMap::new()),
            counters: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            tasks: Mutex::new(Vec::new()),
        }
    }

    /// Waits for the workers to end (after a shutdown), at most `grace`.
    pub(crate) async fn join(&self, grace: Duration) {
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("tasks"));
        if tokio::time::timeout(grace, futures::future::join_all(tasks))
            .await
            .is_err()
        {
            tracing::warn!(
                "index maintenance did not stop in time; its leases expire on their own"
            );
        }
    }

    fn counters(&self, datastore: &str) -> Arc<Counters> {
        self.counters
            .lock()
            .expect("counters")
            .entry(datastore.to_string())
            .or_default()
            .clone()
    }

    /// Delay quantiles `(quantile, microseconds)` since start and the
    /// sample count.
    pub(crate) fn delay_quantiles(&self) -> (Vec<(f64, u64)>, u64) {
        let histogram = self.delays_total_us.lock().expect("histogram");
        let quantiles = [0.5, 0.9, 0.99, 1.0]
            .into_iter()
            .map(|q| (q, histogram.value_at_quantile(q)))
            .collect();
        (quantiles, histogram.len())
    }

    /// `(p50, p99, samples)` of apply delays in microseconds since the last
    /// call.
    pub(crate) fn take_delays(&self) -> (u64, u64, u64) {
        let mut histogram = self.delays_us.lock().expect("histogram");
        let result = (
            histogram.value_at_quantile(0.5),
            histogram.value_at_quantile(0.99),
            histogram.len(),
        );
        histogram.reset();
        result
    }

    /// The maintenance figures of `ds` from the latest sweeps.
    pub(crate) fn metrics(&self, ds: &DatastoreRuntime) -> MaintenanceMetrics {
        let lag = self.lag.lock().expect("lag");
        let mut metrics = MaintenanceMetrics::default();
        for cluster in ds.map.clusters() {
            if let Some(l) = lag.get(&(ds.name().to_string(), cluster)) {
                metrics.pending_cells += l.pending_cells;
                metrics.lagging_shards += l.shards.len();
                metrics.lag_max_ms = metrics.lag_max_ms.max(l.oldest_ms);
                metrics.quarantine_size += l.quarantined;
            }
        }
        let counters = self.counters(ds.name());
        metrics.unstorable_values = counters.unstorable.load(Ordering::Relaxed);
        metrics.quarantined = counters.quarantined.load(Ordering::Relaxed);
        metrics.applied_cells = counters.applied.load(Ordering::Relaxed);
        metrics.buckets_held = self
            .held
            .lock()
            .expect("held")
            .iter()
            .filter(|((name, _), _)| name == ds.name())
            .map(|(_, n)| n)
            .sum();
        metrics.building = ds
            .indexes
            .iter()
            .filter(|i| !i.is_ready())
            .map(|i| (i.def.name.clone(), i.pending()))
            .collect();
        metrics
    }

    /// Asks every worker to sweep now and waits until they did.
    pub(crate) async fn sweep_all(&self) {
        let senders: Vec<_> = self
            .workers
            .lock()
            .expect("workers")
            .values()
            .cloned()
            .collect();
        let mut replies = Vec::new();
        for sender in senders {
            let (tx, rx) = oneshot::channel();
            if sender.send(Msg::Sweep(tx)).is_ok() {
                replies.push(rx);
            }
        }
        for reply in replies {
            let _ = reply.await;
        }
    }

    fn record(&self, ds: &str, result: &apply::PassResult) {
        let counters = self.counters(ds);
        counters
            .unstorable
            .fetch_add(result.unstorable, Ordering::Relaxed);
        counters
            .quarantined
            .fetch_add(result.quarantined, Ordering::Relaxed);
        counters
            .applied
            .fetch_add(result.cells as u64, Ordering::Relaxed);
        let mut recent = self.delays_us.lock().expect("histogram");
        let mut total = self.delays_total_us.lock().expect("histogram");
        for delay in &result.delays_us {
            let _ = recent.record(*delay);
            let _ = total.record(*delay);
        }
    }
}

/// Starts a worker per datastore and cluster, and the task that routes
/// write events to them. Everything stops when the topology is dropped.
pub(crate) fn start(
    topology: &Arc<Topology>,
    maintainer: &Arc<Maintainer>,
    mut events: mpsc::UnboundedReceiver<Written>,
    stopped: tokio::sync::watch::Receiver<bool>,
    maintain: bool,
) {
    for ds in topology.datastores_sorted() {
        if ds.indexes.is_empty() {
            continue;
        }
        for cluster in ds.map.clusters() {
            let (sender, receiver) = mpsc::unbounded_channel();
            maintainer
                .workers
                .lock()
                .expect("workers")
                .insert((ds.name().to_string(), cluster), sender);
            let mut worker = Worker::new(
                Arc::downgrade(topology),
                maintainer.clone(),
                &ds,
                cluster,
                topology,
            );
            worker.maintain = maintain;
            let task = tokio::spawn(worker.run(receiver, stopped.clone()));
            maintainer.tasks.lock().expect("tasks").push(task);
        }
    }
    let maintainer = Arc::downgrade(maintainer);
    tokio::spawn(async move {
        while let Some(event) = events.recv().await {
            let Some(maintainer) = maintainer.upgrade() else {
                return;
            };
            let sender = maintainer
                .workers
                .lock()
                .expect("workers")
                .get(&(event.datastore.clone(), event.cluster))
                .cloned();
            if let Some(sender) = sender {
                let _ = sender.send(Msg::Written(event.heads));
            }
        }
    });
}

/// A lease bucket: a run of the shards of one cluster.
struct Bucket {
    name: String,
    shards: Vec<u32>,
}

/// Splits the shards of `ds` held by `cluster` into lease buckets.
fn buckets(ds: &DatastoreRuntime, cluster: usize) -> Vec<Bucket> {
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

struct Worker {
    /// Apply the log (hold leases); without, the worker only measures lag.
    maintain: bool,
    topology: Weak<Topology>,
    /// The cell cluster's master, kept to release the leases at shutdown.
    backend: Arc<dyn crate::storage::Backend>,
    shared: Arc<Maintainer>,
    datastore: String,
    cluster: usize,
    consumers: Vec<Consumer>,
    buckets: Vec<Bucket>,
    bucket_of: HashMap<u32, usize>,
    held: BTreeMap<usize, Lease>,
    /// Offsets per consumer of the shards of held buckets.
    offsets: BTreeMap<u32, Vec<i64>>,
    /// Latest known log head per held shard.
    heads: HashMap<u32, i64>,
    dirty: BTreeSet<u32>,
    /// Where the next pass starts in `dirty`, so every shard gets a turn.
    cursor: u32,
    attempts: HashMap<(usize, Uuid), u32>,
    /// Target clusters skipped until the given time.
    down: HashMap<usize, (Instant, u32)>,
    /// No passes until then (the cell cluster failed, or leases are due
    /// for renewal).
    backoff: Option<Instant>,
    /// Passes failed in a row, for the backoff.
    failures: u32,
}

impl Worker {
    fn new(
        topology: Weak<Topology>,
        shared: Arc<Maintainer>,
        ds: &DatastoreRuntime,
        cluster: usize,
        full: &Topology,
    ) -> Worker {
        let buckets = buckets(ds, cluster);
        let bucket_of = buckets
            .iter()
            .enumerate()
            .flat_map(|(i, b)| b.shards.iter().map(move |s| (*s, i)))
            .collect();
        Worker {
            maintain: true,
            topology,
            backend: full.clusters[cluster].master.clone(),
            shared,
            datastore: ds.name().to_string(),
            cluster,
            consumers: apply::consumers(full, ds),
            buckets,
            bucket_of,
            held: BTreeMap::new(),
            offsets: BTreeMap::new(),
            heads: HashMap::new(),
            dirty: BTreeSet::new(),
            cursor: 0,
            attempts: HashMap::new(),
            down: HashMap::new(),
            backoff: None,
            failures: 0,
        }
    }

    async fn run(
        mut self,
        mut messages: mpsc::UnboundedReceiver<Msg>,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        let options = self.shared.options.clone();
        let mut next_lease_round = Instant::now();
        // The first sweep after one interval: a maintaining worker finds
        // its work when it takes its leases.
        let sweep_every = options.sweep_every.max(Duration::from_millis(10));
        let mut sweep_tick =
            tokio::time::interval_at(tokio::time::Instant::now() + sweep_every, sweep_every);
        sweep_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let waiting = self.backoff;
            let can_work = !self.dirty.is_empty() && waiting.is_none();
            tokio::select! {
                biased;
                _ = stopped.changed() => break,
                message = messages.recv() => match message {
                    None => break,
                    Some(Msg::Written(heads)) => self.written(heads),
                    Some(Msg::Sweep(reply)) => {
                        if self.topology.strong_count() == 0 {
                            break;
                        }
                        self.sweep().await;
                        let _ = reply.send(());
                    }
                },
                _ = tokio::time::sleep_until(next_lease_round.into()) => {
                    if self.topology.strong_count() == 0 {
                        break;
                    }
                    let short = self.leases().await;
                    // Short of a fair share: buckets are changing hands
                    // (a gateway stopped or started); look again soon.
                    // Renewal needs a quarter of the lease time; gateways
                    // that come and go are noticed within two seconds.
                    let every = (options.lease_time / 4).min(Duration::from_secs(2));
                    let wait = if short { every.min(Duration::from_millis(250)) } else { every };
                    next_lease_round = Instant::now() + wait.max(Duration::from_millis(20));
                }
                _ = sweep_tick.tick() => {
                    if self.topology.strong_count() == 0 {
                        break;
                    }
                    self.sweep().await;
                }
                _ = tokio::time::sleep_until(waiting.unwrap_or_else(Instant::now).into()), if waiting.is_some() => {
                    self.backoff = None;
                }
                _ = std::future::ready(()), if can_work => {
                    self.pass().await;
                }
            }
        }
        self.release_all().await;
    }

    fn written(&mut self, heads: Vec<(u32, i64)>) {
        for (shard, head) in heads {
            let known = self.heads.entry(shard).or_insert(0);
            *known = (*known).max(head);
            if self.offsets.contains_key(&shard) {
                self.dirty.insert(shard);
            }
        }
    }

    fn targets_down(&self) -> BTreeSet<usize> {
        let now = Instant::now();
        self.down
            .iter()
            .filter(|(_, (until, _))| *until > now)
            .map(|(t, _)| *t)
            .collect()
    }

    /// Runs a round of passes: up to `passes` at once, each over whole
    /// lease buckets of dirty shards (so no two lock the same lease row or
    /// touch the same index entries), at most [`PASS_SHARDS`] shards each.
    async fn pass(&mut self) {
        let Some(topology) = self.topology.upgrade() else {
            self.dirty.clear();
            return;
        };
        let Ok(ds) = topology.datastore(&self.datastore) else {
            self.dirty.clear();
            return;
        };
        let batches = self.batches(&topology);
        if batches.is_empty() {
            // Dirty shards whose leases are about to lapse wait for renewal.
            self.backoff = Some(Instant::now() + Duration::from_millis(100));
            return;
        }
        let down = self.targets_down();
        let holder = self.shared.holder.clone();
        let consumers: Vec<Consumer> = self.consumers.clone();
        let quarantine_after = self.shared.options.quarantine_after;
        let mut work = Vec::with_capacity(batches.len());
        for batch in &batches {
            // Consumers of skipped targets count as caught up for this pass.
            let offsets: BTreeMap<u32, Vec<i64>> = batch
                .iter()
                .map(|s| {
                    let per = self.offsets[s]
                        .iter()
                        .zip(&self.consumers)
                        .map(|(o, c)| {
                            if down.contains(&c.target) {
                                i64::MAX
                            } else {
                                *o
                            }
                        })
                        .collect();
                    (*s, per)
                })
                .collect();
            let leases: Vec<Lease> = batch
                .iter()
                .filter_map(|s| self.bucket_of.get(s))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .filter_map(|b| self.held.get(b).cloned())
                .collect();
            // The failed attempts of this batch's rows travel with it.
            let shards: BTreeSet<u32> = batch.iter().copied().collect();
            let attempts: HashMap<(usize, Uuid), u32> = self
                .attempts
                .iter()
                .filter(|((_, row), _)| {
                    shards.contains(&crate::shards::row_shard(row, ds.def.shards))
                })
                .map(|(k, v)| (*k, *v))
                .collect();
            work.push((offsets, leases, attempts));
        }
        let runs = work.iter_mut().map(|(offsets, leases, attempts)| {
            let (topology, ds, consumers, holder) = (&topology, &ds, &consumers, &holder);
            let cluster = self.cluster;
            async move {
                let mut pass = Pass {
                    topology,
                    ds,
                    cluster,
                    consumers,
                    fence: Some(Fence { holder, leases }),
                    attempts,
                    quarantine_after,
                };
                pass.run(offsets).await
            }
        });
        let results = futures::future::join_all(runs).await;
        for ((batch, (_, _, attempts)), result) in batches.iter().zip(work).zip(results) {
            let shards: BTreeSet<u32> = batch.iter().copied().collect();
            self.attempts.retain(|(_, row), _| {
                !shards.contains(&crate::shards::row_shard(row, ds.def.shards))
            });
            self.attempts.extend(attempts);
            self.settle(&topology, batch, &down, result);
        }
    }

    /// Picks the batches of the next round: whole buckets of dirty shards
    /// under comfortably valid leases, from the rotating cursor on.
    fn batches(&mut self, topology: &Topology) -> Vec<Vec<u32>> {
        let margin = chrono::Duration::from_std(self.shared.options.lease_time / 4)
            .unwrap_or(chrono::Duration::seconds(2));
        let now = Utc::now();
        let valid: BTreeSet<usize> = self
            .held
            .iter()
            .filter(|(_, l)| l.expires_at - margin > now)
            .map(|(b, _)| *b)
            .collect();
        let mut by_bucket: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for shard in self
            .dirty
            .range(self.cursor..)
            .chain(self.dirty.range(..self.cursor))
        {
            if let Some(bucket) = self.bucket_of.get(shard).filter(|b| valid.contains(b)) {
                by_bucket.entry(*bucket).or_default().push(*shard);
            }
        }
        // Buckets in rotation order from the cursor.
        let start = self.bucket_of.get(&self.cursor).copied().unwrap_or(0);
        let mut order: Vec<usize> = by_bucket.keys().copied().collect();
        order.sort_by_key(|b| (*b < start, *b));
        let passes = self.passes(topology);
        let (mut batches, last_bucket) =
            group_buckets(&order, &by_bucket, passes, |s| self.pending(s));
        if let Some(bucket) = last_bucket {
            self.cursor = self.buckets[bucket].shards.last().map_or(0, |s| s + 1);
        }
        for batch in &mut batches {
            batch.sort_unstable();
        }
        batches
    }

    /// The cells of `shard` the slowest consumer has yet to apply, as far
    /// as this worker knows the log head (at least 1, at most a page).
    fn pending(&self, shard: u32) -> usize {
        let from = self
            .offsets
            .get(&shard)
            .and_then(|o| o.iter().min().copied())
            .unwrap_or(0);
        self.heads.get(&shard).map_or(1, |head| {
            usize::try_from(head.saturating_sub(from)).map_or(1, |n| n.clamp(1, apply::PAGE))
        })
    }

    /// Passes run at once: a server database takes concurrent writers,
    /// SQLite's single writer only lets one pass read while another writes.
    fn passes(&self, topology: &Topology) -> usize {
        match self.shared.options.passes {
            0 => match topology.clusters[self.cluster].master.dialect() {
                crate::storage::Dialect::Sqlite => 2,
                _ => 4,
            },
            n => n,
        }
    }

    /// Takes in the outcome of one pass.
    fn settle(
        &mut self,
        topology: &Topology,
        batch: &[u32],
        down: &BTreeSet<usize>,
        result: Result<apply::PassResult>,
    ) {
        match result {
            Ok(result) => {
                self.failures = 0;
                for (shard, per) in &result.offsets {
                    let stored = self.offsets.get_mut(shard).expect("held shard");
                    for (c, value) in per.iter().enumerate() {
                        if *value != i64::MAX {
                            stored[c] = stored[c].max(*value);
                        }
                    }
                }
                for (target, err) in &result.failed_targets {
                    let (_, failures) = self
                        .down
                        .get(target)
                        .copied()
                        .unwrap_or((Instant::now(), 0));
                    let delay = Duration::from_millis(500 << failures.min(5));
                    tracing::warn!(datastore = %self.datastore, cluster = %topology.clusters[*target].name, error = %err, "index entries for this cluster wait until it is back");
                    self.down
                        .insert(*target, (Instant::now() + delay, failures + 1));
                }
                if result.failed_targets.is_empty() {
                    self.down.retain(|_, (until, _)| *until > Instant::now());
                }
                for shard in batch {
                    let caught_up = self.heads.get(shard).is_none_or(|head| {
                        self.offsets.get(shard).is_some_and(|offsets| {
                            offsets
                                .iter()
                                .zip(&self.consumers)
                                .all(|(o, c)| down.contains(&c.target) || o >= head)
                        })
                    });
                    if result.complete.contains(shard) && caught_up {
                        self.dirty.remove(shard);
                    }
                }
                self.shared.record(&self.datastore, &result);
            }
            Err(Error::LeaseLost(name)) => {
                tracing::warn!(datastore = %self.datastore, lease = %name, "lease lost; leaving its shards to their new holder");
                if let Some((bucket, _)) = self.held.iter().find(|(_, l)| l.name == name) {
                    let bucket = *bucket;
                    self.drop_bucket(bucket);
                }
            }
            Err(err) => {
                self.failures += 1;
                let delay = Duration::from_millis(100 << self.failures.min(6));
                if err.is_transient() {
                    tracing::warn!(datastore = %self.datastore, error = %err, "index maintenance waits for its cluster");
                } else {
                    tracing::error!(datastore = %self.datastore, error = %err, "index maintenance pass failed; retrying");
                }
                self.backoff = Some(Instant::now() + delay);
            }
        }
    }

    /// Forgets a bucket's shards (another process holds it now).
    fn drop_bucket(&mut self, bucket: usize) {
        self.held.remove(&bucket);
        for shard in &self.buckets[bucket].shards {
            self.offsets.remove(shard);
            self.dirty.remove(shard);
            self.heads.remove(shard);
        }
    }

    /// Compares log heads with offsets: marks held shards that are behind
    /// dirty, publishes the lag, and marks indexes that caught up ready.
    async fn sweep(&mut self) {
        let Some(topology) = self.topology.upgrade() else {
            return;
        };
        let Ok(ds) = topology.datastore(&self.datastore) else {
            return;
        };
        let cluster = &topology.clusters[self.cluster];
        let Ok(backend) = cluster.maintenance() else {
            return;
        };
        let (lag, behind) = match lag::measure(backend.as_ref(), &ds, &self.consumers).await {
            Ok(measured) => measured,
            Err(err) => {
                tracing::debug!(datastore = %self.datastore, error = %err, "sweep failed");
                return;
            }
        };
        let down = self.targets_down();
        for row in behind {
            if down.contains(&self.consumers[row.consumer].target) {
                continue;
            }
            if let Some(per) = self.offsets.get(&row.shard) {
                let known = self.heads.entry(row.shard).or_insert(0);
                *known = (*known).max(row.head);
                if per[row.consumer] < row.head {
                    self.dirty.insert(row.shard);
                }
            }
        }
        self.shared
            .lag
            .lock()
            .expect("lag")
            .insert((self.datastore.clone(), self.cluster), lag);
        mark_ready_indexes(&topology, &self.shared, &ds).await;
    }

    /// Renews held leases, counts the gateways, and takes or gives up
    /// buckets to hold a fair share; true when it holds less than that.
    async fn leases(&mut self) -> bool {
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
        let held: Vec<Lease> = self.held.values().cloned().collect();
        let renewed = leases::renew(backend, &holder, &held, ttl).await?;
        let renewed_names: BTreeSet<&str> = renewed.iter().map(|l| l.name.as_str()).collect();
        let lost: Vec<usize> = self
            .held
            .iter()
            .filter(|(_, l)| !renewed_names.contains(l.name.as_str()))
            .map(|(b, _)| *b)
            .collect();
        for bucket in lost {
            tracing::warn!(datastore = %self.datastore, bucket, "lease lost to another gateway");
            self.drop_bucket(bucket);
        }
        for lease in renewed {
            if let Some((_, held)) = self.held.iter_mut().find(|(_, l)| l.name == lease.name) {
                *held = lease;
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
            for lease in leases::acquire_all(backend, &rows, &holder, ttl).await? {
                let bucket = buckets[&lease.name];
                self.held.insert(bucket, lease);
                acquired.push(bucket);
            }
        } else {
            for (bucket, row) in free {
                if self.held.len() >= fair {
                    break;
                }
                if let Some(lease) = leases::acquire(backend, &row, &holder, ttl).await? {
                    self.held.insert(bucket, lease);
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
        let heads: HashMap<u32, i64> = log::heads(backend, &ds).await?.into_iter().collect();
        for (shard, per) in offsets {
            let head = heads.get(&shard).copied().unwrap_or(0);
            if per.iter().any(|o| *o < head) {
                self.dirty.insert(shard);
            }
            self.heads.insert(shard, head);
            self.offsets.insert(shard, per);
        }
        tracing::debug!(datastore = %self.datastore, buckets = buckets.len(), "took over shard buckets");
        Ok(())
    }

    /// Gives up every held lease (the store is shutting down), so other
    /// gateways take over at once instead of after the lease time.
    async fn release_all(&mut self) {
        if !self.maintain {
            return;
        }
        let mut names: Vec<String> = self.held.values().map(|l| l.name.clone()).collect();
        names.push(leases::member_name(&self.shared.holder));
        let _ = leases::release(self.backend.as_ref(), &self.shared.holder, &names).await;
    }
}

/// Marks the building indexes of `ds` ready once every cluster's latest
/// sweep shows them caught up.
/// Groups the dirty shards of `by_bucket`, whole buckets in `order`, into
/// at most `passes` batches of at most [`PASS_SHARDS`] shards, each ended
/// once the cells `pending` expects of its shards fill a page: the log read
/// of a pass gets cheaper with every shard it need not look at. Returns the
/// batches and the last bucket taken.
fn group_buckets(
    order: &[usize],
    by_bucket: &BTreeMap<usize, Vec<u32>>,
    passes: usize,
    pending: impl Fn(u32) -> usize,
) -> (Vec<Vec<u32>>, Option<usize>) {
    let mut batches: Vec<Vec<u32>> = Vec::new();
    let mut current: Vec<u32> = Vec::new();
    let mut cells = 0;
    let mut last_bucket = None;
    for &bucket in order {
        let shards = &by_bucket[&bucket];
        if !current.is_empty()
            && (current.len() + shards.len() > PASS_SHARDS || cells >= apply::PAGE)
        {
            batches.push(std::mem::take(&mut current));
            cells = 0;
            if batches.len() == passes {
                break;
            }
        }
        current.extend(shards);
        cells += shards.iter().map(|s| pending(*s)).sum::<usize>();
        last_bucket = Some(bucket);
    }
    if !current.is_empty() && batches.len() < passes {
        batches.push(current);
    }
    (batches, last_bucket)
}

async fn mark_ready_indexes(topology: &Topology, shared: &Maintainer, ds: &DatastoreRuntime) {
    let consumers = apply::consumers(topology, ds);
    let caught_up: Vec<(usize, i64, bool)> = {
        let lag = shared.lag.lock().expect("lag");
        ds.indexes
            .iter()
            .enumerate()
            .filter(|(_, i)| !i.is_ready())
            .map(|(position, _)| {
                let mut pending = 0;
                let mut complete = true;
                for cluster in ds.map.clusters() {
                    match lag.get(&(ds.name().to_string(), cluster)) {
                        None => complete = false,
                        Some(l) => {
                            for (c, consumer) in consumers.iter().enumerate() {
                                if consumer.index == position {
                                    pending += l.pending_by_consumer.get(c).copied().unwrap_or(0);
                                }
                            }
                        }
                    }
                }
                (position, pending, complete && pending == 0)
            })
            .collect()
    };
    for (position, pending, ready) in caught_up {
        let index = &ds.indexes[position];
        let was_building = index.pending() > 0;
        index.set_pending(pending);
        if ready {
            match crate::catalog::mark_ready(topology, ds, index).await {
                Ok(()) => {
                    index.set_ready();
                    if was_building {
                        tracing::info!(datastore = %ds.name(), index = %index.def.name, version = index.version, "index built and ready");
                    } else {
                        tracing::debug!(datastore = %ds.name(), index = %index.def.name, version = index.version, "index ready");
                    }
                }
                Err(err) => {
                    tracing::warn!(datastore = %ds.name(), index = %index.def.name, error = %err, "cannot record a ready index yet")
                }
            }
        } else {
            tracing::info!(datastore = %ds.name(), index = %index.def.name, pending, "index building");
        }
    }
}

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

/// The lag of every cluster of `ds`, measured now.
pub(crate) async fn measure(
    topology: &Topology,
    ds: &DatastoreRuntime,
) -> Result<Vec<(usize, ClusterLag)>> {
    let consumers = apply::consumers(topology, ds);
    let mut out = Vec::new();
    for cluster in ds.map.clusters() {
        let backend = topology.clusters[cluster].master()?;
        out.push((
            cluster,
            lag::measure(backend.as_ref(), ds, &consumers).await?.0,
        ));
    }
    Ok(out)
}

/// Marks the indexes of every datastore ready that are caught up now; used
/// at start-up so a fresh store's indexes are queryable at once.
pub(crate) async fn check_ready(topology: &Topology, shared: &Maintainer) {
    for ds in topology.datastores_sorted() {
        if ds.indexes.iter().all(|i| i.is_ready()) {
            continue;
        }
        if let Ok(measured) = measure(topology, &ds).await {
            {
                let mut lag = shared.lag.lock().expect("lag");
                for (cluster, l) in measured {
                    lag.insert((ds.name().to_string(), cluster), l);
                }
            }
            mark_ready_indexes(topology, shared, &ds).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 64 buckets of 64 shards, as 4,096 shards split over 64 leases.
    fn buckets() -> (Vec<usize>, BTreeMap<usize, Vec<u32>>) {
        let by_bucket: BTreeMap<usize, Vec<u32>> = (0..64)
            .map(|b| (b, (b as u32 * 64..(b as u32 + 1) * 64).collect()))
            .collect();
        (by_bucket.keys().copied().collect(), by_bucket)
    }

    #[test]
    fn a_backlog_fills_a_batch_with_a_page_of_cells_not_with_shards() {
        let (order, by_bucket) = buckets();
        // 49 cells behind on every shard: one bucket holds 3,136.
        let (batches, last) = group_buckets(&order, &by_bucket, 4, |_| 49);
        assert_eq!(batches.len(), 4);
        assert!(
            batches.iter().all(|b| b.len() == 64),
            "{:?}",
            batches.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert_eq!(last, Some(3));
    }

    #[test]
    fn shards_a_cell_behind_fill_a_batch_up_to_the_shard_limit() {
        let (order, by_bucket) = buckets();
        let (batches, last) = group_buckets(&order, &by_bucket, 2, |_| 1);
        assert_eq!(batches.len(), 2);
        assert!(batches.iter().all(|b| b.len() == PASS_SHARDS));
        assert_eq!(last, Some(31));
        // Fewer dirty buckets than a round can take: one batch of all.
        let (batches, last) = group_buckets(&order[..3], &by_bucket, 4, |_| 1);
        assert_eq!(batches, vec![(0..192).collect::<Vec<u32>>()]);
        assert_eq!(last, Some(2));
    }
}
