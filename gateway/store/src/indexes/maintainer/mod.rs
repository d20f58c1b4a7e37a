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
//! `shard_leases::BUCKETS` contiguous buckets, each a lease (`leases.rs`) on that
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

mod admin;
mod buckets;
mod readiness;
mod worker;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::apply::{self};
use super::hook::PassHook;
use super::lag::ClusterLag;
use crate::topology::{DatastoreRuntime, Topology, Written, WrittenCell};

use self::readiness::*;
use self::worker::*;

pub(crate) use self::admin::apply_all;
pub(crate) use self::readiness::{check_ready, measure, measure_datastore};

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
    /// How often a sampled verify of every datastore's indexes runs in the
    /// background (`None`: never); its drift is counted in the metrics.
    pub verify_every: Option<Duration>,
    /// Shards a scheduled verify compares.
    pub verify_sample: u32,
    /// Awaited by every pass at each [`PassStage`](crate::indexes::PassStage); `None` (always, but in
    /// tests) costs nothing. Tests hold passes with it where a real process
    /// may stall (a pause of the runtime, a slow network), to check what a
    /// stalled pass can still commit.
    #[doc(hidden)]
    pub pass_hook: Option<PassHook>,
}

impl Default for MaintainerOptions {
    fn default() -> Self {
        MaintainerOptions {
            lease_time: Duration::from_secs(10),
            sweep_every: Duration::from_secs(1),
            quarantine_after: 3,
            passes: 0,
            verify_every: Some(Duration::from_secs(6 * 3600)),
            verify_sample: 64,
            pass_hook: None,
        }
    }
}

/// A message to a worker.
enum Msg {
    Written(Vec<(u32, i64)>, Arc<[WrittenCell]>),
    /// Sweep now, then answer.
    Sweep(oneshot::Sender<()>),
}

/// Per-datastore counters.
#[derive(Default)]
struct Counters {
    unstorable: AtomicU64,
    quarantined: AtomicU64,
    applied: AtomicU64,
    bodies_decoded: AtomicU64,
    bodies_reused: AtomicU64,
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
    /// The worker tasks, to wait for them at shutdown or when a reload
    /// replaces a datastore's workers.
    tasks: Mutex<HashMap<(String, usize), tokio::task::JoinHandle<()>>>,
    /// What `start` was given, for the workers `restart` starts later;
    /// `None` until maintenance started.
    started: Mutex<Option<(tokio::sync::watch::Receiver<bool>, bool)>>,
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
    /// Latest cells whose bodies index maintenance decoded, and those
    /// whose bodies it took from this process's own writes instead.
    pub bodies_decoded: u64,
    pub bodies_reused: u64,
    /// Lease buckets this process holds.
    pub buckets_held: usize,
    /// Indexes still being built, with their cells to go and progress.
    pub building: Vec<crate::IndexStatus>,
    /// Every index version served and maintained: the current ones, and
    /// the previous ones that answer queries while a new one is built.
    pub versions: Vec<crate::IndexStatus>,
}

fn histogram() -> hdrhistogram::Histogram<u64> {
    hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

impl Maintainer {
    pub(crate) fn new(options: MaintainerOptions) -> Maintainer {
        Maintainer {
            options,
            holder: crate::leases::new_holder(),
            workers: Mutex::new(HashMap::new()),
            delays_total_us: Mutex::new(histogram()),
            delays_us: Mutex::new(histogram()),
            lag: Mutex::new(HashMap::new()),
            counters: Mutex::new(HashMap::new()),
            held: Mutex::new(HashMap::new()),
            tasks: Mutex::new(HashMap::new()),
            started: Mutex::new(None),
        }
    }

    /// Waits for the workers to end (after a shutdown), at most `grace`.
    pub(crate) async fn join(&self, grace: Duration) {
        let tasks = std::mem::take(&mut *self.tasks.lock().expect("tasks"));
        if tokio::time::timeout(grace, futures::future::join_all(tasks.into_values()))
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
        for cluster in ds.work_map().clusters() {
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
        metrics.bodies_decoded = counters.bodies_decoded.load(Ordering::Relaxed);
        metrics.bodies_reused = counters.bodies_reused.load(Ordering::Relaxed);
        metrics.buckets_held = self
            .held
            .lock()
            .expect("held")
            .iter()
            .filter(|((name, _), _)| name == ds.name())
            .map(|(_, n)| n)
            .sum();
        metrics.versions = ds
            .indexes
            .iter()
            .map(|i| crate::IndexStatus::of(i))
            .collect();
        metrics.building = metrics
            .versions
            .iter()
            .filter(|i| !i.ready)
            .cloned()
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
        counters
            .bodies_decoded
            .fetch_add(result.bodies_decoded, Ordering::Relaxed);
        counters
            .bodies_reused
            .fetch_add(result.bodies_reused, Ordering::Relaxed);
        let mut recent = self.delays_us.lock().expect("histogram");
        let mut total = self.delays_total_us.lock().expect("histogram");
        for delay in &result.delays_us {
            let _ = recent.record(*delay);
            let _ = total.record(*delay);
        }
    }
}

/// Starts the workers of `ds`, one per cluster holding its shards (none
/// without indexes).
fn start_workers(
    topology: &Arc<Topology>,
    maintainer: &Arc<Maintainer>,
    ds: &DatastoreRuntime,
    stopped: &tokio::sync::watch::Receiver<bool>,
    maintain: bool,
) {
    if ds.indexes.is_empty() {
        return;
    }
    for cluster in ds.work_map().clusters() {
        let (sender, receiver) = mpsc::unbounded_channel();
        let key = (ds.name().to_string(), cluster);
        maintainer
            .workers
            .lock()
            .expect("workers")
            .insert(key.clone(), sender);
        let mut worker = Worker::new(
            Arc::downgrade(topology),
            maintainer.clone(),
            ds,
            cluster,
            topology,
        );
        worker.maintain = maintain;
        let task = tokio::spawn(worker.run(receiver, stopped.clone()));
        maintainer.tasks.lock().expect("tasks").insert(key, task);
    }
}

/// Stops the workers of `datastore` and waits until they ended (their
/// passes finished, their leases given up), so that nothing applies the
/// log for the consumers of its previous definition once `Store::reload`
/// serves the new one. Its write events are dropped meanwhile; the sweep
/// of the workers `resume` starts finds that work.
pub(crate) async fn pause(maintainer: &Maintainer, datastore: &str) {
    maintainer
        .workers
        .lock()
        .expect("workers")
        .retain(|(name, _), _| name != datastore);
    let tasks: Vec<_> = {
        let mut tasks = maintainer.tasks.lock().expect("tasks");
        let keys: Vec<_> = tasks
            .keys()
            .filter(|(name, _)| name == datastore)
            .cloned()
            .collect();
        keys.into_iter().filter_map(|k| tasks.remove(&k)).collect()
    };
    futures::future::join_all(tasks).await;
    // The latest sweeps counted the previous consumers.
    maintainer
        .lag
        .lock()
        .expect("lag")
        .retain(|(name, _), _| name != datastore);
}

/// Starts the workers of `ds` as served now, after [`pause`], and marks its
/// index versions that are caught up ready at once (as at start-up).
pub(crate) async fn resume(
    topology: &Arc<Topology>,
    maintainer: &Arc<Maintainer>,
    ds: &Arc<DatastoreRuntime>,
) {
    let started = maintainer.started.lock().expect("started").clone();
    let Some((stopped, maintain)) = started else {
        return;
    };
    check_ready_datastore(topology, maintainer, ds).await;
    start_workers(topology, maintainer, ds, &stopped, maintain);
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
    *maintainer.started.lock().expect("started") = Some((stopped.clone(), maintain));
    for ds in topology.datastores_sorted() {
        start_workers(topology, maintainer, &ds, &stopped, maintain);
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
            // A log that went back is found by the workers' sweeps, which
            // compare the stored offsets with their own.
            if let Some(sender) = sender.filter(|_| !event.went_back) {
                let _ = sender.send(Msg::Written(event.heads, event.cells));
            }
        }
    });
}
