//! The topology: definitions, storage clusters and the routing of logical
//! shards to them — the one place the write path, the read path and the
//! index maintainer all depend on.
//!
//! Nothing here runs a statement on behalf of a request. A cluster becomes
//! usable once it is *prepared* (its tables exist and its catalog agrees
//! with the definitions, see `catalog.rs`); until then every operation on it
//! fails with `STORAGE_UNAVAILABLE`, so no read or write ever creates a
//! table. Writers announce what they committed through [`Events`]; the
//! maintainer subscribes to them, so the write path never calls into index
//! maintenance and the dependency arrows run one way:
//! `cells` → `topology` ← `indexes`.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use arc_swap::ArcSwap;

use index_dsl::{Datastore, Definitions, Index};
use tokio::sync::mpsc;

use crate::error::{Error, Result};
use crate::shards::ShardMap;
use crate::storage::{ddl, Backend};

/// Everything the store knows about where data lives.
pub(crate) struct Topology {
    /// The definitions served now, with their runtimes. `Store::reload`
    /// replaces the whole snapshot at once: work that loaded the previous
    /// one (a request, a pass) finishes with it, and later work sees the
    /// new one.
    defined: ArcSwap<Defined>,
    pub(crate) clusters: Vec<Cluster>,
    /// Secondary clusters that receive a copy of each write first.
    pub(crate) buffer_count: usize,
    /// What a write does when fewer secondaries can take a copy.
    pub(crate) buffer_shortfall: crate::options::BufferShortfall,
    /// Replicas further behind than this serve no `REPLICA` read.
    pub(crate) max_replica_lag: std::time::Duration,
    /// The latest lag of every replica.
    pub(crate) lags: crate::replicas::LagBoard,
    /// Largest number of cells in one put.
    pub(crate) max_batch: usize,
    pub(crate) events: Events,
    pub(crate) moves: MoveSignals,
    /// Cells by their full key (`storage.cell_cache_bytes`).
    pub(crate) cell_cache: crate::cells::CellCache,
}

tokio::task_local! {
    /// The snapshot a request runs on (`Store::pinned`): its datastore
    /// lookups find the runtimes of that snapshot, so a request that
    /// started before a reload finishes on the definitions it started
    /// with, whatever the reload removed or replaced meanwhile.
    pub(crate) static PINNED: Arc<Defined>;
}

/// One set of definitions and the runtime of each of its datastores.
pub(crate) struct Defined {
    pub(crate) defs: Arc<Definitions>,
    pub(crate) datastores: HashMap<String, Arc<DatastoreRuntime>>,
}

impl Defined {
    /// The datastores, sorted by name.
    pub(crate) fn sorted(&self) -> Vec<Arc<DatastoreRuntime>> {
        let mut all: Vec<_> = self.datastores.values().cloned().collect();
        all.sort_by(|a, b| a.def.name.cmp(&b.def.name));
        all
    }
}

/// Whether a cluster can be used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClusterState {
    /// Not prepared yet (unreachable so far); the reason is the last error.
    Pending(String),
    /// Tables exist and match the definitions.
    Ready,
    /// Its catalog disagrees with the definitions; it stays unused until a
    /// restart with definitions that agree.
    Refused(String),
}

/// One storage cluster: a master and its replicas.
pub(crate) struct Cluster {
    pub(crate) index: usize,
    pub(crate) name: String,
    pub(crate) master: Arc<dyn Backend>,
    /// The master again, through a pool of its own for index maintenance
    /// (`storage.maintenance_connections`), so maintenance never waits for
    /// a connection behind requests; on SQLite the master's connections,
    /// its write transactions ahead of the requests' queued ones
    /// (`Backend::maintenance_lane`).
    maintenance: Arc<dyn Backend>,
    /// Read by the reads that allow a replica, and by every read while the
    /// master's breaker is open (`replicas.rs`).
    pub(crate) replicas: Vec<Arc<dyn Backend>>,
    state: RwLock<ClusterState>,
}

impl Cluster {
    pub(crate) fn new(
        index: usize,
        name: String,
        master: Arc<dyn Backend>,
        maintenance: Arc<dyn Backend>,
        replicas: Vec<Arc<dyn Backend>>,
    ) -> Cluster {
        Cluster {
            index,
            name,
            master,
            maintenance,
            replicas,
            state: RwLock::new(ClusterState::Pending("not prepared yet".into())),
        }
    }

    pub(crate) fn state(&self) -> ClusterState {
        self.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub(crate) fn set_state(&self, state: ClusterState) {
        *self.state.write().unwrap_or_else(|e| e.into_inner()) = state;
    }

    /// The master, if the cluster is prepared.
    pub(crate) fn master(&self) -> Result<&Arc<dyn Backend>> {
        self.ready(&self.master)
    }

    /// Statements sent through the maintenance pool; 0 when it is the
    /// master's own pool (SQLite), whose count has them.
    pub(crate) fn maintenance_statements(&self) -> u64 {
        if Arc::ptr_eq(&self.master, &self.maintenance) {
            0
        } else {
            self.maintenance.statements()
        }
    }

    /// The master through the maintenance pool, if the cluster is prepared.
    pub(crate) fn maintenance(&self) -> Result<&Arc<dyn Backend>> {
        self.ready(&self.maintenance)
    }

    fn ready<'a>(&self, backend: &'a Arc<dyn Backend>) -> Result<&'a Arc<dyn Backend>> {
        match self.state() {
            ClusterState::Ready => Ok(backend),
            ClusterState::Pending(reason) => Err(Error::ClusterNotReady {
                cluster: self.name.clone(),
                reason,
            }),
            ClusterState::Refused(reason) => Err(Error::ClusterRefused {
                cluster: self.name.clone(),
                reason,
            }),
        }
    }
}

/// One index as the store maintains and serves it: its definition, the
/// version of its table, and whether that table is complete.
pub(crate) struct IndexRuntime {
    pub(crate) def: Index,
    /// Version of the table (`<ds>_ix_<index>` is 1, then `_v2`, …): a new
    /// version is built when the index's fields or shard field change.
    pub(crate) version: u32,
    pub(crate) table: String,
    /// A digest of the definition parts that shape the table.
    pub(crate) signature: String,
    ready: AtomicBool,
    /// Cells still to apply while building, for the error message.
    pending: AtomicI64,
    /// How far a build has come, from the measurements so far.
    progress: std::sync::Mutex<BuildProgress>,
}

/// How long the samples behind a build's rate reach back.
pub(crate) const RATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// The progress of an index build: the log cells its consumers have to
/// read in all (the log heads when measured, once per target cluster) and
/// the `(when, cells done)` measurements of the last [`RATE_WINDOW`].
#[derive(Debug, Default)]
pub(crate) struct BuildProgress {
    total: i64,
    samples: std::collections::VecDeque<(std::time::Instant, i64)>,
}

impl BuildProgress {
    /// Records a measurement: `done` of `total` log cells applied.
    pub(crate) fn record(&mut self, at: std::time::Instant, done: i64, total: i64) {
        if self.samples.back().is_some_and(|(_, d)| *d > done) {
            // Offsets never go back: fewer cells done is a stale
            // measurement (a sweep and `Store::measure_indexes` overlap).
            return;
        }
        self.total = total;
        self.samples.push_back((at, done));
        while self.samples.len() > 2
            && self
                .samples
                .front()
                .is_some_and(|(t, _)| at.duration_since(*t) > RATE_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Log cells to read in all (0 before the first measurement).
    pub(crate) fn total(&self) -> i64 {
        self.total
    }

    /// Cells applied per second over the window; `None` before two
    /// measurements some time apart.
    pub(crate) fn rate(&self) -> Option<f64> {
        let (first, last) = (self.samples.front()?, self.samples.back()?);
        let secs = last.0.duration_since(first.0).as_secs_f64();
        (secs > 0.0).then(|| (last.1 - first.1).max(0) as f64 / secs)
    }

    /// Seconds until `pending` cells are applied at the current rate.
    pub(crate) fn eta_seconds(&self, pending: i64) -> Option<f64> {
        let rate = self.rate()?;
        (rate > 0.0).then(|| pending.max(0) as f64 / rate)
    }
}

impl IndexRuntime {
    pub(crate) fn new(def: Index, version: u32, ready: bool) -> IndexRuntime {
        IndexRuntime {
            table: ddl::index_table(&def.datastore, &def.name, version),
            signature: index_signature(&def),
            def,
            version,
            ready: AtomicBool::new(ready),
            pending: AtomicI64::new(0),
            progress: Default::default(),
        }
    }

    /// The log consumer name of this index version writing to `cluster`.
    pub(crate) fn consumer(&self, cluster: &str) -> String {
        format!("ix:{}:{}:{}", self.def.name, self.version, cluster)
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Cells still to apply while building (from the latest sweep).
    pub(crate) fn pending(&self) -> i64 {
        self.pending.load(Ordering::Relaxed)
    }

    pub(crate) fn set_pending(&self, pending: i64) {
        self.pending.store(pending, Ordering::Relaxed);
    }

    /// Records a measurement of a build: `pending` of `total` log cells
    /// still to apply.
    pub(crate) fn set_build_progress(&self, pending: i64, total: i64) {
        self.set_pending(pending);
        self.progress.lock().expect("progress").record(
            std::time::Instant::now(),
            (total - pending).max(0),
            total,
        );
    }

    /// The build progress measured so far.
    pub(crate) fn build_progress(&self) -> std::sync::MutexGuard<'_, BuildProgress> {
        self.progress.lock().expect("progress")
    }

    /// Fails with `INDEX_BUILDING` while the table is still being filled.
    pub(crate) fn check_ready(&self) -> Result<()> {
        if self.is_ready() {
            return Ok(());
        }
        Err(Error::IndexBuilding {
            datastore: self.def.datastore.clone(),
            index: self.def.name.clone(),
            pending: self.pending.load(Ordering::Relaxed),
        })
    }
}

/// A digest of what shapes an index table and its entries: fields (name,
/// path, type, column), the shard field and the `where:` predicate of a
/// partial index. Descriptions do not count.
pub(crate) fn index_signature(index: &Index) -> String {
    let mut text = format!("shard={};", index.shard_field().name);
    for field in &index.fields {
        text.push_str(&format!(
            "{}={}:{}:{};",
            field.name,
            field.column,
            field.path,
            field.ty.name().to_ascii_lowercase()
        ));
    }
    // The predicate in its qualified form: rewording or respacing it keeps
    // the version, selecting other rows makes a new one.
    if let Some(predicate) = &index.predicate {
        text.push_str(&format!("where={};", predicate.qualified()));
    }
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
}

/// A datastore's definition with its routing and index versions.
pub(crate) struct DatastoreRuntime {
    pub(crate) def: Datastore,
    /// Where its shards live; shared with the runtimes that replace this
    /// one on a reload, and swapped as the stored topology changes
    /// (`moves/follow.rs`), so a request pinned to older definitions
    /// still routes by the newest map.
    pub(crate) routes: Arc<Routes>,
    /// In the order of `def.indexes`; shared with the runtime that
    /// replaces this one on a reload where the index keeps its version.
    pub(crate) indexes: Vec<Arc<IndexRuntime>>,
    /// Cells stored by this process, for metrics. The counters are shared
    /// with the runtimes that replace this one on a reload, so they never
    /// go back.
    pub(crate) cells_written: Arc<AtomicU64>,
    /// Cells found identical to stored ones, for metrics.
    pub(crate) cells_duplicate: Arc<AtomicU64>,
    /// Buffered cells this process delivered to their primary.
    pub(crate) cells_replayed: Arc<AtomicU64>,
    /// Buffered writes this process recorded as conflicts on replay.
    pub(crate) replay_conflicts: Arc<AtomicU64>,
}

impl DatastoreRuntime {
    pub(crate) fn new(def: Datastore, map: ShardMap, indexes: Vec<Arc<IndexRuntime>>) -> Self {
        DatastoreRuntime {
            def,
            routes: Arc::new(Routes::new(map)),
            indexes,
            cells_written: Arc::default(),
            cells_duplicate: Arc::default(),
            cells_replayed: Arc::default(),
            replay_conflicts: Arc::default(),
        }
    }

    /// A runtime for a new definition of this datastore, keeping its
    /// routing and counters.
    pub(crate) fn redefined(&self, def: Datastore, indexes: Vec<Arc<IndexRuntime>>) -> Self {
        DatastoreRuntime {
            def,
            routes: self.routes.clone(),
            indexes,
            cells_written: self.cells_written.clone(),
            cells_duplicate: self.cells_duplicate.clone(),
            cells_replayed: self.cells_replayed.clone(),
            replay_conflicts: self.replay_conflicts.clone(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.def.name
    }

    /// Where requests find each shard now.
    pub(crate) fn map(&self) -> Arc<ShardMap> {
        self.routes.map.load_full()
    }

    /// Which cluster's workers (index maintenance, triggers) follow each
    /// shard's log now: the routing map, but while a moved shard range's
    /// last cells on its old cluster are being applied there.
    pub(crate) fn work_map(&self) -> Arc<ShardMap> {
        self.routes.work.load_full()
    }

    /// Fails with `UNKNOWN_COLUMN`, listing the declared columns, unless
    /// `column` is one of them.
    pub(crate) fn check_column(&self, column: &str) -> Result<()> {
        if self.def.column(column).is_some() {
            return Ok(());
        }
        let expected: Vec<&str> = self.def.columns.iter().map(|c| c.name.as_str()).collect();
        Err(Error::UnknownColumn {
            datastore: self.def.name.clone(),
            column: column.to_string(),
            expected: expected.join(", "),
        })
    }

    /// The index called `name`.
    pub(crate) fn index(&self, name: &str) -> Result<&Arc<IndexRuntime>> {
        self.indexes
            .iter()
            .find(|i| i.def.name == name)
            .ok_or_else(|| Error::UnknownIndex {
                datastore: self.def.name.clone(),
                index: name.to_string(),
            })
    }

    /// Whether the datastore has any index reading `column`.
    pub(crate) fn indexes_column(&self, column: &str) -> bool {
        self.def
            .indexes
            .iter()
            .any(|i| i.columns.iter().any(|c| c == column))
    }
}

/// The shard maps of a datastore and the stored topology version they
/// came from.
pub(crate) struct Routes {
    map: ArcSwap<ShardMap>,
    work: ArcSwap<ShardMap>,
    version: AtomicI64,
    /// Told each new version.
    changed: tokio::sync::watch::Sender<i64>,
    /// The move in progress, if any, as last read.
    moving: std::sync::Mutex<Option<crate::moves::MoveRecord>>,
}

impl Routes {
    pub(crate) fn new(map: ShardMap) -> Routes {
        Routes {
            work: ArcSwap::from_pointee(map.clone()),
            map: ArcSwap::from_pointee(map),
            version: AtomicI64::new(0),
            changed: tokio::sync::watch::channel(0).0,
            moving: std::sync::Mutex::new(None),
        }
    }

    /// The move in progress, if any, as last read.
    pub(crate) fn moving(&self) -> Option<crate::moves::MoveRecord> {
        self.moving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_moving(&self, record: Option<crate::moves::MoveRecord>) {
        *self.moving.lock().unwrap_or_else(|e| e.into_inner()) = record;
    }

    /// Learns of the versions served after this call.
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<i64> {
        self.changed.subscribe()
    }

    /// The stored topology version served now (0 before one was read).
    pub(crate) fn version(&self) -> i64 {
        self.version.load(Ordering::Acquire)
    }

    /// Serves `map` (and `work`) of stored topology `version` from now on.
    pub(crate) fn set(&self, version: i64, map: ShardMap, work: ShardMap) {
        self.map.store(Arc::new(map));
        self.work.store(Arc::new(work));
        self.version.store(version, Ordering::Release);
        self.changed.send_replace(version);
    }
}

/// How the write path waits for a shard move's cut-over.
#[derive(Default)]
pub(crate) struct MoveSignals {
    /// Wakes the topology follower (`moves/follow.rs`) to read the stored
    /// topology at once.
    pub(crate) poke: tokio::sync::Notify,
}

/// How long a write that met a moving shard waits for a new topology
/// version before it tries again anyway.
const MOVE_RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

impl MoveSignals {
    /// Asks for the stored topology to be read now, then waits until a
    /// version newer than `seen`'s is served, [`MOVE_RECHECK`] at most.
    /// False once `deadline` has passed.
    pub(crate) async fn wait(
        &self,
        mut seen: tokio::sync::watch::Receiver<i64>,
        deadline: tokio::time::Instant,
    ) -> bool {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        self.poke.notify_one();
        let until = deadline.min(tokio::time::Instant::now() + MOVE_RECHECK);
        let _ = tokio::time::timeout_at(until, seen.changed()).await;
        tokio::time::Instant::now() < deadline
    }
}

/// Cells committed on one cluster: what the maintainer needs to know.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    pub(crate) datastore: String,
    pub(crate) cluster: usize,
    /// Each touched shard with its new last `added_id`.
    pub(crate) heads: Vec<(u32, i64)>,
}

/// The write notifications of a store: to index maintenance through a
/// channel, and to trigger consumers through a broadcast (a consumer that
/// falls behind it learns so and sweeps instead). Sending never blocks and
/// never fails a write: with no subscriber, events are dropped.
pub(crate) struct Events {
    sender: mpsc::UnboundedSender<Written>,
    broadcast: tokio::sync::broadcast::Sender<Arc<Written>>,
}

/// Write events a broadcast holds for slow receivers.
const BROADCAST_EVENTS: usize = 4096;

impl Events {
    pub(crate) fn new() -> (Events, mpsc::UnboundedReceiver<Written>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let (broadcast, _) = tokio::sync::broadcast::channel(BROADCAST_EVENTS);
        (Events { sender, broadcast }, receiver)
    }

    pub(crate) fn written(&self, event: Written) {
        if self.broadcast.receiver_count() > 0 {
            let _ = self.broadcast.send(Arc::new(event.clone()));
        }
        // The receiver is gone only when maintenance is off or stopping.
        let _ = self.sender.send(event);
    }

    /// The write events from now on.
    pub(crate) fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Written>> {
        self.broadcast.subscribe()
    }
}

impl Topology {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        defined: Defined,
        clusters: Vec<Cluster>,
        buffer_count: usize,
        buffer_shortfall: crate::options::BufferShortfall,
        max_replica_lag: std::time::Duration,
        max_batch: usize,
        events: Events,
        cell_cache: crate::cells::CellCache,
    ) -> Topology {
        Topology {
            defined: ArcSwap::from_pointee(defined),
            clusters,
            buffer_count,
            buffer_shortfall,
            max_replica_lag,
            lags: crate::replicas::LagBoard::default(),
            max_batch,
            events,
            moves: MoveSignals::default(),
            cell_cache,
        }
    }

    /// A topology of the same definitions and clusters whose clusters
    /// reach their masters through `masters` (one per cluster, in order):
    /// the connections of work that must not share the request pools (a
    /// verify on a thread of its own). Each cluster keeps the state it has
    /// now; the copy has no replicas, and nothing listens to its events.
    pub(crate) fn apart(&self, masters: Vec<Arc<dyn Backend>>) -> Topology {
        assert_eq!(masters.len(), self.clusters.len(), "one master per cluster");
        let clusters = self
            .clusters
            .iter()
            .zip(masters)
            .map(|(cluster, master)| {
                let copy = Cluster::new(
                    cluster.index,
                    cluster.name.clone(),
                    master.clone(),
                    master,
                    Vec::new(),
                );
                copy.set_state(cluster.state());
                copy
            })
            .collect();
        Topology {
            defined: ArcSwap::new(self.defined()),
            clusters,
            buffer_count: self.buffer_count,
            buffer_shortfall: self.buffer_shortfall,
            max_replica_lag: self.max_replica_lag,
            lags: crate::replicas::LagBoard::default(),
            max_batch: self.max_batch,
            events: Events::new().0,
            moves: MoveSignals::default(),
            cell_cache: self.cell_cache.clone(),
        }
    }

    /// The definitions served now and their runtimes.
    pub(crate) fn defined(&self) -> Arc<Defined> {
        self.defined.load_full()
    }

    /// The definitions served now.
    pub(crate) fn defs(&self) -> Arc<Definitions> {
        self.defined.load().defs.clone()
    }

    /// Serves `defined` from now on (`Store::reload`).
    pub(crate) fn replace(&self, defined: Defined) {
        self.defined.store(Arc::new(defined));
    }

    /// The runtime of datastore `name`: in the snapshot the current task
    /// is pinned to, if any, else in the one served now.
    pub(crate) fn datastore(&self, name: &str) -> Result<Arc<DatastoreRuntime>> {
        let found = match PINNED.try_with(|pinned| pinned.datastores.get(name).cloned()) {
            Ok(found) => found,
            Err(_) => self.defined.load().datastores.get(name).cloned(),
        };
        found.ok_or_else(|| Error::UnknownDatastore(name.to_string()))
    }

    /// The datastores, sorted by name.
    pub(crate) fn datastores_sorted(&self) -> Vec<Arc<DatastoreRuntime>> {
        self.defined.load().sorted()
    }

    /// Groups items by the cluster of their shard, clusters in order.
    pub(crate) fn by_cluster<T>(
        &self,
        ds: &DatastoreRuntime,
        items: impl IntoIterator<Item = (u32, T)>,
    ) -> BTreeMap<usize, Vec<T>> {
        let mut groups: BTreeMap<usize, Vec<T>> = BTreeMap::new();
        let map = ds.map();
        for (shard, item) in items {
            groups.entry(map.cluster_of(shard)).or_default().push(item);
        }
        groups
    }

    /// Where the shards of `datastore` live: contiguous `(first, last,
    /// cluster name)` ranges, in shard order.
    pub(crate) fn ranges(&self, ds: &DatastoreRuntime) -> Vec<(u32, u32, String)> {
        let map = ds.map();
        let mut ranges: Vec<(u32, u32, String)> = map
            .clusters()
            .into_iter()
            .flat_map(|c| {
                map.ranges_of(c)
                    .into_iter()
                    .map(move |(first, last)| (first, last, c))
            })
            .map(|(first, last, c)| (first, last, self.clusters[c].name.clone()))
            .collect();
        ranges.sort();
        ranges
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::BuildProgress;

    #[test]
    fn build_progress_gives_the_rate_over_the_window_and_the_eta() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut p = BuildProgress::default();
        p.record(at(0), 0, 10_000);
        assert_eq!(
            (p.total(), p.rate(), p.eta_seconds(10_000)),
            (10_000, None, None)
        );
        p.record(at(10), 1_000, 10_000);
        assert_eq!(p.rate(), Some(100.0));
        assert_eq!(p.eta_seconds(9_000), Some(90.0));
        // Samples older than the window stop counting.
        p.record(at(70), 2_000, 10_000);
        p.record(at(80), 5_000, 10_000);
        assert_eq!(p.rate(), Some(300.0));
        // A stalled build has a rate of 0 and no ETA.
        let mut stalled = BuildProgress::default();
        stalled.record(at(0), 500, 1_000);
        stalled.record(at(5), 500, 1_000);
        assert_eq!(
            (stalled.rate(), stalled.eta_seconds(500)),
            (Some(0.0), None)
        );
        // A stale measurement (fewer cells done) changes nothing.
        p.record(at(81), 4_000, 9_000);
        assert_eq!((p.total(), p.rate()), (10_000, Some(300.0)));
    }
}
