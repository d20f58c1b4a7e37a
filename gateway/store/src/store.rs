//! The [`Store`]: the entry point of the Rust API, a thin façade over the
//! topology (`topology.rs`), the cell paths (`cells/`), the index queries
//! and the index maintainer (`indexes/`).
//!
//! Opening a store connects to every database of the topology, checks each
//! reachable cluster's catalog against the definitions and prepares its
//! tables (`catalog.rs`), then starts index maintenance. The store itself
//! holds no logic of its own: each method delegates to the module that owns
//! the concept, so the modules depend on the topology and never on the
//! store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use index_dsl::Definitions;
use uuid::Uuid;

use crate::catalog;
use crate::cells::{self, codec, Cell, CellKey, Location, LogPage, NewCell, PutResult, PutStatus};
use crate::error::{Error, Result};
use crate::indexes::{
    lag, maintainer, query, IndexPage, IndexQuery, MaintainerOptions, MaintenanceMetrics,
    QuarantinedEntry, QueryPlan, ShardLag,
};
use crate::replicas::{ReadOptions, ReadToken};
use crate::shards::ShardMap;
use crate::storage::breaker::BreakerStatus;
use crate::storage::{self, ConnectOptions};
use crate::topology::{ClusterState, DatastoreRuntime, Defined, Events, IndexRuntime, Topology};
use crate::triggers;
use crate::StorageConfig;

/// How a store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub storage: StorageConfig,
    /// Run index maintenance in the background (the normal mode). Without
    /// it the store still measures the index lag; tests turn it off to
    /// leave cells unindexed, as a crash would, and commands that only
    /// manage tables turn it off too.
    pub maintain_indexes: bool,
    /// Largest number of cells in one put.
    pub max_batch: usize,
    /// Leases, sweep and quarantine settings of index maintenance.
    pub maintenance: MaintainerOptions,
    /// Replay buffered writes into their primary in the background (the
    /// normal mode, with more than one cluster); commands that only manage
    /// tables turn it off.
    pub replay_buffers: bool,
    /// Fail when a cluster cannot be reached, instead of preparing it in
    /// the background once it answers (for commands that manage tables).
    pub require_all_clusters: bool,
    /// Open a store that `cellgate migrate --from-v1` is converting (its
    /// indexes stay unbuilt). Only that command sets it.
    #[doc(hidden)]
    pub converting_v1: bool,
    /// ID allocation (segments, snowflake worker lease).
    pub ids: crate::ids::IdsOptions,
    /// The shared log tails of followers (GraphQL subscriptions).
    pub tail: triggers::tail::TailOptions,
    /// Follow the stored topology and acknowledge the versions served (the
    /// normal mode, with more than one cluster: every process that routes
    /// requests must). `cellgate shard move` turns it off for itself.
    pub follow_topology: bool,
}

impl StoreOptions {
    pub fn new(storage: StorageConfig) -> StoreOptions {
        StoreOptions {
            storage,
            maintain_indexes: true,
            max_batch: 1000,
            maintenance: MaintainerOptions::default(),
            replay_buffers: true,
            require_all_clusters: false,
            converting_v1: false,
            ids: crate::ids::IdsOptions {
                snowflake: false,
                ..crate::ids::IdsOptions::default()
            },
            tail: triggers::tail::TailOptions::default(),
            follow_topology: true,
        }
    }
}

/// Handle to the cell store; cheap to clone.
#[derive(Clone)]
pub struct Store {
    inner: Arc<Inner>,
}

struct Inner {
    topology: Arc<Topology>,
    maintainer: Arc<maintainer::Maintainer>,
    replayer: Arc<cells::replay::Replayer>,
    maintaining: bool,
    /// Opened by `migrate --from-v1`: no maintenance, no reload.
    converting_v1: bool,
    /// Definition changes worth a warning (superseded or removed indexes).
    warnings: Vec<String>,
    /// Set (or dropped with the store) to stop the maintenance workers.
    shutdown: tokio::sync::watch::Sender<bool>,
    ids: crate::ids::Ids,
    /// The trigger consumers started on this store.
    consumers: std::sync::Mutex<Vec<Arc<triggers::ConsumerState>>>,
    /// The shared log tails of followers.
    tails: Arc<triggers::tail::Tails>,
    /// Index verify runs started in this process.
    verifier: Arc<crate::indexes::verify::Verifier>,
    /// The storage configuration, for the shard maps of datastores a
    /// reload adds.
    storage: StorageConfig,
    /// One reload at a time.
    reloading: tokio::sync::Mutex<()>,
}

/// The definitions a store serves at one moment, with their runtimes
/// (index versions, readiness): what [`Store::pinned`] runs a request on.
/// Cheap to clone.
#[derive(Clone)]
pub struct Snapshot(Arc<Defined>);

impl Snapshot {
    /// The definitions of the snapshot.
    pub fn definitions(&self) -> Arc<Definitions> {
        self.0.defs.clone()
    }
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Snapshot").finish_non_exhaustive()
    }
}

/// Counters of one datastore.
#[derive(Debug, Clone, PartialEq)]
pub struct DatastoreMetrics {
    pub name: String,
    /// Cells stored by this process.
    pub cells_written: u64,
    /// Writes answered as duplicates of stored cells.
    pub cells_duplicate: u64,
    /// Buffered writes, per cluster holding them, from the latest count.
    pub buffered: Vec<cells::Backlog>,
    /// Buffered cells this process delivered to their primary.
    pub cells_replayed: u64,
    /// Buffered writes this process recorded as conflicts on replay.
    pub replay_conflicts: u64,
    /// Index maintenance figures (lag from the latest sweep).
    pub maintenance: MaintenanceMetrics,
    /// Index verify runs of this process and the drift they found.
    pub verify: crate::indexes::VerifyTotals,
    /// The stored topology version this process serves (0: none read).
    pub topology_version: i64,
    /// The shard move in progress, as last read from the stored topology.
    pub moving: Option<crate::moves::MoveRecord>,
}

/// The state of one index as the store serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexStatus {
    pub name: String,
    /// Version of its table; a new version is built when the index's
    /// fields or shard field change.
    pub version: u32,
    pub table: String,
    /// Complete and queryable (otherwise still being built).
    pub ready: bool,
    /// Cells still to apply while building.
    pub pending_cells: i64,
    /// While building: the log cells the build reads in all, done and
    /// pending (the log heads when last measured, once per cluster the
    /// index is written to; it grows with the writes during the build).
    /// `None` when ready or not measured yet.
    pub build_total_cells: Option<i64>,
    /// While building: cells applied per second over the last 10 s of
    /// measurements; `None` before two measurements.
    pub build_rate: Option<f64>,
    /// While building: seconds until the pending cells are applied at
    /// [`build_rate`](Self::build_rate); `None` while no rate is known.
    pub build_eta_seconds: Option<f64>,
}

impl IndexStatus {
    pub(crate) fn of(i: &crate::topology::IndexRuntime) -> IndexStatus {
        let ready = i.is_ready();
        // A ready index was caught up when it became ready; what it has
        // to apply since is index lag, not a build's.
        let pending_cells = if ready { 0 } else { i.pending() };
        let progress = i.build_progress();
        let building = !ready && progress.total() > 0;
        IndexStatus {
            name: i.def.name.clone(),
            version: i.version,
            table: i.table.clone(),
            ready,
            pending_cells,
            build_total_cells: building.then(|| progress.total()),
            build_rate: progress.rate().filter(|_| building),
            build_eta_seconds: progress.eta_seconds(pending_cells).filter(|_| building),
        }
    }

    /// While building: the log cells applied so far.
    pub fn build_done_cells(&self) -> Option<i64> {
        self.build_total_cells
            .map(|total| (total - self.pending_cells).max(0))
    }
}

/// A snapshot for monitoring.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreMetrics {
    pub datastores: Vec<DatastoreMetrics>,
    /// Delay from cell commit to index update since start, in microseconds:
    /// `(quantile, value)` for 0.5, 0.9, 0.99 and 1.0, plus the sample count.
    pub index_delay_us: (Vec<(f64, u64)>, u64),
    pub clusters: Vec<ClusterMetrics>,
    /// The latest lag of every replica (measured twice a second).
    pub replica_lag: Vec<crate::replicas::ReplicaLag>,
    /// The cells kept by their full key (`storage.cell_cache_bytes`).
    pub cell_cache: crate::cells::CellCacheMetrics,
}

/// One storage cluster, for monitoring.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterMetrics {
    pub name: String,
    /// Prepared and serving.
    pub ready: bool,
    /// Statements this process sent to its master, `BEGIN` and `COMMIT`
    /// included.
    pub statements: u64,
    /// Statements sent to the master through the maintenance pool (index
    /// maintenance, trigger consumers, subscription tails and their
    /// sweeps); 0 on SQLite, where they go through the master's pool and
    /// count in `statements`.
    pub maintenance_statements: u64,
    /// The circuit breaker of each server node, the master first, then the
    /// replicas in configuration order; empty on SQLite or with
    /// `storage.breaker.enabled: false`.
    pub breakers: Vec<BreakerStatus>,
    /// The latest lag of each replica, in configuration order.
    pub replicas: Vec<crate::replicas::ReplicaLag>,
}

impl Store {
    /// Connects to every database of the topology, checks and prepares the
    /// reachable clusters, and starts index maintenance (which first
    /// catches up on any cells written but not yet indexed, e.g. before a
    /// crash). Fails when the definitions disagree with a cluster's
    /// catalog; a cluster that cannot be reached is prepared later, in the
    /// background.
    pub async fn open(defs: Definitions, options: StoreOptions) -> Result<Store> {
        let config = &options.storage;
        if config.clusters.is_empty() {
            return Err(Error::Config("no storage cluster configured".into()));
        }
        if config.buffer_count > 0 && config.clusters.len() < 2 {
            return Err(Error::Config(
                "buffer_count > 0 needs at least two clusters".into(),
            ));
        }
        let breakers = config.breaker.settings()?;
        let mut clusters = Vec::new();
        for (index, cluster) in config.clusters.iter().enumerate() {
            if !index_dsl::is_identifier(&cluster.name) || cluster.name.len() > 32 {
                return Err(Error::Config(format!(
                    "cluster name `{}` must be letters, digits and `_` (at most 32)",
                    cluster.name
                )));
            }
            let connect = config.connect_options(&cluster.name);
            // One breaker per node: the master's two pools share one.
            let guard = |backend: Arc<dyn storage::Backend>, node: &str| match breakers {
                Some(settings) if backend.dialect() != storage::Dialect::Sqlite => {
                    let breaker = storage::breaker::Breaker::new(&cluster.name, node, settings);
                    (
                        storage::breaker::guard(backend, breaker.clone()),
                        Some(breaker),
                    )
                }
                _ => (backend, None),
            };
            let (master, master_breaker) =
                guard(storage::connect(&cluster.master, &connect).await?, "master");
            let maintenance = if let Some(lane) = master.maintenance_lane() {
                lane
            } else if config.maintenance_connections == 0 {
                master.clone()
            } else {
                let connect = ConnectOptions {
                    max_connections: config.maintenance_connections,
                    ..connect.clone()
                };
                let pool = storage::connect(&cluster.master, &connect).await?;
                match master_breaker {
                    Some(breaker) => storage::breaker::guard(pool, breaker),
                    None => pool,
                }
            };
            let mut replicas = Vec::new();
            for (i, url) in cluster.replicas.iter().enumerate() {
                let replica = storage::connect(url, &connect).await?;
                replicas.push(guard(replica, &format!("replica{i}")).0);
            }
            clusters.push(crate::topology::Cluster::new(
                index,
                cluster.name.clone(),
                master,
                maintenance,
                replicas,
            ));
        }
        let maps = shard_maps(&defs, config)?;
        let mut catalogs = Vec::new();
        for cluster in &clusters {
            match catalog::open_cluster(cluster.master.as_ref(), options.converting_v1).await {
                Ok(found) => catalogs.push(Some(found)),
                Err(err) if err.is_transient() && !options.require_all_clusters => {
                    tracing::warn!(cluster = %cluster.name, error = %err, "storage cluster unreachable at start-up; its shards are unavailable until it answers");
                    cluster.set_state(ClusterState::Pending(err.client_message()));
                    catalogs.push(None);
                }
                Err(err) => return Err(err),
            }
        }
        let mut warnings = Vec::new();
        let stored = crate::moves::stored::open(
            &clusters,
            catalogs[0].is_some(),
            &defs,
            &maps,
            &mut warnings,
        )
        .await?;
        let reachable: Vec<&catalog::Catalog> = catalogs.iter().flatten().collect();
        let plans = catalog::plan_indexes(&defs, &reachable, &mut warnings);
        let mut datastores = HashMap::new();
        for def in &defs.datastores {
            let indexes = def
                .indexes
                .iter()
                .map(|index| {
                    let plan = plans[&(def.name.clone(), index.name.clone())];
                    Arc::new(IndexRuntime::new(index.clone(), plan.version, plan.ready))
                })
                .collect();
            let map = maps[&def.name].clone();
            let runtime = DatastoreRuntime::new(def.clone(), map, indexes);
            if let Some(served) = stored.get(&def.name) {
                runtime.routes.set_moving(served.moving.clone());
                runtime
                    .routes
                    .set(served.version, served.map.clone(), served.work.clone());
            }
            datastores.insert(def.name.clone(), Arc::new(runtime));
        }
        let (events, written) = Events::new();
        let topology = Arc::new(Topology::new(
            Defined {
                defs: Arc::new(defs),
                datastores,
            },
            clusters,
            config.buffer_count,
            config.buffer_shortfall,
            Duration::from_millis(config.max_replica_lag_ms),
            options.max_batch,
            events,
            crate::cells::CellCache::new(config.cell_cache_bytes),
        ));
        for (cluster, found) in topology.clusters.iter().zip(&catalogs) {
            let Some(found) = found else { continue };
            catalog::validate(&topology, cluster, found, &mut warnings)?;
            catalog::prepare(&topology, cluster, found).await?;
        }
        if topology
            .clusters
            .iter()
            .any(|c| matches!(c.state(), ClusterState::Pending(_)))
        {
            tokio::spawn(catalog::prepare_later(
                Arc::downgrade(&topology),
                Duration::from_secs(2),
            ));
        }
        for warning in &warnings {
            tracing::warn!("{warning}");
        }
        let maintainer = Arc::new(maintainer::Maintainer::new(options.maintenance.clone()));
        if !options.converting_v1 {
            maintainer::check_ready(&topology, &maintainer).await;
        }
        let (shutdown, stopped) = tokio::sync::watch::channel(false);
        if !options.converting_v1 {
            maintainer::start(
                &topology,
                &maintainer,
                written,
                stopped,
                options.maintain_indexes,
            );
        }
        if options.follow_topology && topology.clusters.len() > 1 && !options.converting_v1 {
            tokio::spawn(crate::moves::follow::follow(
                Arc::downgrade(&topology),
                maintainer.clone(),
                maintainer.holder.clone(),
                shutdown.subscribe(),
            ));
        }
        let replayer = Arc::new(cells::replay::Replayer::new(
            maintainer.holder.clone(),
            options.maintenance.lease_time,
        ));
        if topology.clusters.iter().any(|c| !c.replicas.is_empty()) {
            tokio::spawn(crate::replicas::monitor(
                topology.clone(),
                shutdown.subscribe(),
            ));
        }
        if options.replay_buffers && topology.clusters.len() > 1 {
            replayer.start(topology.clone(), shutdown.subscribe());
        }
        let ids_cluster = match &options.ids.cluster {
            None => &topology.clusters[0],
            Some(name) => topology
                .clusters
                .iter()
                .find(|c| c.name == *name)
                .ok_or_else(|| {
                    Error::Config(format!("ids.cluster `{name}` is not a configured cluster"))
                })?,
        };
        let ids = crate::ids::Ids::open(ids_cluster.master.clone(), options.ids.clone()).await?;
        let tails = Arc::new(triggers::tail::Tails::new(
            &topology,
            options.tail.clone(),
            shutdown.subscribe(),
        ));
        let store = Store {
            inner: Arc::new(Inner {
                topology,
                maintainer,
                replayer,
                maintaining: options.maintain_indexes,
                converting_v1: options.converting_v1,
                warnings,
                shutdown,
                ids,
                consumers: std::sync::Mutex::new(Vec::new()),
                tails,
                verifier: Arc::default(),
                storage: options.storage.clone(),
                reloading: tokio::sync::Mutex::new(()),
            }),
        };
        if let (true, Some(every)) = (options.maintain_indexes, options.maintenance.verify_every) {
            tokio::spawn(scheduled_verifies(
                Arc::downgrade(&store.inner),
                every,
                options.maintenance.verify_sample,
            ));
        }
        Ok(store)
    }

    fn topology_ref(&self) -> &Topology {
        &self.inner.topology
    }

    pub(crate) fn topology_arc(&self) -> Arc<Topology> {
        self.inner.topology.clone()
    }

    /// The ID allocator (segments, snowflake and tagged IDs).
    pub fn ids(&self) -> &crate::ids::Ids {
        &self.inner.ids
    }

    /// The logical shard of `row_key` in `datastore` (the stable hash of
    /// `shards.rs`), e.g. to tag an ID with it.
    pub fn row_shard(&self, datastore: &str, row_key: &Uuid) -> Result<u32> {
        let ds = self.topology_ref().datastore(datastore)?;
        Ok(crate::shards::row_shard(row_key, ds.def.shards))
    }

    /// The definitions the store serves now (`reload` replaces them).
    pub fn definitions(&self) -> Arc<Definitions> {
        self.inner.topology.defs()
    }

    /// Serves `defs` from now on, without a restart: new and changed
    /// indexes get their tables and are built from the cell log, removed
    /// ones are no longer served (their tables stay), new datastores get
    /// their tables. Requests under way finish with the definitions they
    /// started with. A change a running store cannot make (a datastore or
    /// column removed, a new shard count, one a cluster's catalog refuses)
    /// fails with [`Error::ReloadRefused`] or [`Error::Catalog`] and
    /// nothing is served differently. Reloads run one at a time.
    pub async fn reload(&self, defs: Definitions) -> Result<crate::ReloadReport> {
        let _one = self.inner.reloading.lock().await;
        if self.inner.converting_v1 {
            return Err(Error::ReloadRefused(
                "a store being converted from the per-shard layout cannot reload".into(),
            ));
        }
        crate::reload::reload(
            &self.inner.topology,
            &self.inner.maintainer,
            &self.inner.storage,
            defs,
        )
        .await
    }

    /// The definitions served now, to pin a request to with
    /// [`Store::pinned`].
    pub fn snapshot(&self) -> Snapshot {
        Snapshot(self.inner.topology.defined())
    }

    /// Runs `work` with the datastore lookups of this task pinned to
    /// `snapshot`: a request that started before a reload reads its indexes
    /// as they were when it started (removed or replaced index versions
    /// keep their tables until `cellgate index drop`), and its writes
    /// check columns against its own definitions. Tasks that `work`
    /// spawns are not pinned.
    pub async fn pinned<F: std::future::Future>(snapshot: Snapshot, work: F) -> F::Output {
        crate::topology::PINNED.scope(snapshot.0, work).await
    }

    /// Warnings about the definitions found at start-up (superseded or
    /// removed indexes whose tables stay).
    pub fn warnings(&self) -> &[String] {
        &self.inner.warnings
    }

    /// Pings the master of every cluster, all at once, each for at most
    /// `timeout`; returns the clusters that are not serving or did not
    /// answer, with why. A probe must answer within its own timeout even
    /// when a database hangs, and one dead cluster must not add its wait to
    /// the others'.
    pub async fn unready_clusters(&self, timeout: Duration) -> Vec<(String, Error)> {
        let pings = self
            .topology_ref()
            .clusters
            .iter()
            .map(|cluster| async move {
                let name = cluster.name.clone();
                let master = match cluster.master() {
                    Ok(master) => master,
                    Err(error) => return Some((name, error)),
                };
                match tokio::time::timeout(timeout, master.ping()).await {
                    Ok(Ok(())) => None,
                    Ok(Err(error)) => Some((name, error)),
                    Err(_) => {
                        let source = crate::storage::no_answer(timeout);
                        Some((name.clone(), Error::from_sqlx(&name, source)))
                    }
                }
            });
        futures::future::join_all(pings)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The master of the first cluster, which holds the API tokens.
    pub fn tokens_backend(&self) -> Result<Arc<dyn crate::storage::Backend>> {
        match self.topology_ref().clusters.first() {
            Some(cluster) => cluster.master().cloned(),
            None => Err(Error::Config(
                "no storage cluster is configured".to_string(),
            )),
        }
    }

    /// Checks every master answers and is prepared.
    pub async fn ping(&self) -> Result<()> {
        for cluster in &self.topology_ref().clusters {
            cluster.master()?.ping().await?;
        }
        Ok(())
    }

    /// Stops index maintenance and waits (at most `grace`) until the
    /// workers and the buffer replayer have given up their leases, so other
    /// gateways take their work over at once rather than after the lease time; then closes
    /// every connection, waiting for them to close (an embedded store
    /// copies its WAL into the database file), so the next process opens
    /// the store without waiting on this one. The store answers nothing
    /// afterwards.
    pub async fn shutdown(&self, grace: Duration) {
        crate::indexes::verify::settle(grace).await;
        self.inner.ids.shutdown().await;
        let consumers: Vec<Arc<triggers::ConsumerState>> =
            std::mem::take(&mut *self.inner.consumers.lock().expect("consumers"));
        futures::future::join_all(consumers.iter().map(|c| c.join(grace))).await;
        let _ = self.inner.shutdown.send(true);
        self.inner.maintainer.join(grace).await;
        self.inner.replayer.join(grace).await;
        let backends = self
            .topology_ref()
            .clusters
            .iter()
            .flat_map(|c| std::iter::once(&c.master).chain(&c.replicas));
        futures::future::join_all(backends.map(|b| b.close())).await;
    }

    /// A snapshot of the store's counters and index maintenance, for
    /// `/metrics`.
    pub fn metrics(&self) -> StoreMetrics {
        use std::sync::atomic::Ordering::Relaxed;
        let topology = self.topology_ref();
        let datastores = topology
            .datastores_sorted()
            .into_iter()
            .map(|ds| DatastoreMetrics {
                name: ds.name().to_string(),
                cells_written: ds.cells_written.load(Relaxed),
                cells_duplicate: ds.cells_duplicate.load(Relaxed),
                buffered: self.inner.replayer.backlog(ds.name()),
                cells_replayed: ds.cells_replayed.load(Relaxed),
                replay_conflicts: ds.replay_conflicts.load(Relaxed),
                maintenance: self.inner.maintainer.metrics(&ds),
                verify: self.inner.verifier.totals(ds.name()),
                topology_version: ds.routes.version(),
                moving: ds.routes.moving(),
            })
            .collect();
        let replica_lag = topology.lags.all();
        StoreMetrics {
            datastores,
            index_delay_us: self.inner.maintainer.delay_quantiles(),
            clusters: topology
                .clusters
                .iter()
                .map(|c| ClusterMetrics {
                    name: c.name.clone(),
                    ready: c.state() == ClusterState::Ready,
                    statements: c.master.statements(),
                    maintenance_statements: c.maintenance_statements(),
                    breakers: std::iter::once(&c.master)
                        .chain(&c.replicas)
                        .filter_map(|b| b.breaker())
                        .collect(),
                    replicas: replica_lag
                        .iter()
                        .filter(|lag| lag.cluster == c.name)
                        .cloned()
                        .collect(),
                })
                .collect(),
            replica_lag,
            cell_cache: topology.cell_cache.metrics(),
        }
    }

    /// Where the shards of `datastore` live: contiguous `(first, last,
    /// cluster name)` ranges. Empty for an unknown datastore.
    pub fn topology(&self, datastore: &str) -> Vec<(u32, u32, String)> {
        match self.topology_ref().datastore(datastore) {
            Ok(ds) => self.topology_ref().ranges(&ds),
            Err(_) => Vec::new(),
        }
    }

    /// The indexes of `datastore` with their table versions and state.
    pub fn indexes(&self, datastore: &str) -> Result<Vec<IndexStatus>> {
        let ds = self.topology_ref().datastore(datastore)?;
        Ok(ds.indexes.iter().map(|i| IndexStatus::of(i)).collect())
    }

    /// [`indexes`](Self::indexes), measured now: the log heads and
    /// offsets of `datastore` are read (one statement each per cluster)
    /// and building indexes that caught up are marked ready. For a store
    /// opened without maintenance; successive calls give the build rate.
    pub async fn measure_indexes(&self, datastore: &str) -> Result<Vec<IndexStatus>> {
        let topology = self.topology_ref();
        let ds = topology.datastore(datastore)?;
        maintainer::measure_datastore(topology, &self.inner.maintainer, &ds).await?;
        self.indexes(datastore)
    }

    /// Whether any reachable cluster holds a cell of `datastore`.
    pub async fn has_cells(&self, datastore: &str) -> Result<bool> {
        let ds = self.topology_ref().datastore(datastore)?;
        cells::has_cells(self.topology_ref(), &ds).await
    }

    /// Writes one cell.
    pub async fn put_cell(&self, datastore: &str, cell: NewCell) -> Result<PutStatus> {
        let mut results = self.put_cells(datastore, vec![cell]).await?;
        results
            .pop()
            .expect("one result per cell")
            .map_err(Error::unshare)
    }

    /// Writes a batch of cells: one transaction per cluster, clusters in
    /// parallel. Returns one result per cell, in input order. An `Err` for
    /// the whole call means nothing was attempted (unknown datastore, batch
    /// too large).
    pub async fn put_cells(&self, datastore: &str, cells: Vec<NewCell>) -> Result<Vec<PutResult>> {
        Ok(self.put_cells_with_token(datastore, cells).await?.0)
    }

    /// [`Store::put_cells`], with the read token of what it wrote: a read
    /// given it ([`ReadOptions::after`]) sees these cells, even from a
    /// replica.
    pub async fn put_cells_with_token(
        &self,
        datastore: &str,
        cells: Vec<NewCell>,
    ) -> Result<(Vec<PutResult>, ReadToken)> {
        cells::write::put_cells(self.topology_ref(), datastore, cells).await
    }

    /// The cell at `key`, if it exists.
    pub async fn get_cell(&self, datastore: &str, key: &CellKey) -> Result<Option<Cell>> {
        self.get_cell_with(datastore, key, &ReadOptions::default())
            .await
    }

    /// [`Store::get_cell`], served as `read` allows (a replica, see
    /// [`crate::replicas`]).
    pub async fn get_cell_with(
        &self,
        datastore: &str,
        key: &CellKey,
        read: &ReadOptions,
    ) -> Result<Option<Cell>> {
        cells::get_cell(self.topology_ref(), datastore, key, read).await
    }

    /// The cell of `(row_key, column)` with the highest ref key.
    pub async fn get_cell_latest(
        &self,
        datastore: &str,
        row_key: Uuid,
        column: &str,
    ) -> Result<Option<Cell>> {
        Ok(self
            .history(datastore, row_key, column, 1, None)
            .await?
            .pop())
    }

    /// Deletes old versions of the cells of `datastore` (retention): those
    /// `options` allow — beyond the newest `keep` of each `(row, column)`,
    /// stored before `created_before`, or both — except the latest version
    /// of every `(row, column)`, cells a log consumer (index maintenance,
    /// triggers) has not read yet and cells a quarantine record names.
    /// Works shard range by shard range on each cluster, a handful of
    /// statements per chunk, calling `on_progress` after each; safe while
    /// gateways write (the deletes are guarded, see
    /// [`cells::PruneOptions`] and the `cells::prune` module). Afterwards
    /// `history` and the log no longer return the deleted versions.
    pub async fn prune_cells(
        &self,
        datastore: &str,
        options: &cells::PruneOptions,
        on_progress: &mut (dyn FnMut(&cells::PruneProgress) + Send),
    ) -> Result<cells::PruneReport> {
        let ds = self.topology_ref().datastore(datastore)?;
        cells::prune(self.topology_ref(), &ds, options, on_progress).await
    }

    /// Versions of `(row_key, column)`, newest first, at most `limit`, with
    /// ref keys below `before` when given.
    pub async fn history(
        &self,
        datastore: &str,
        row_key: Uuid,
        column: &str,
        limit: u32,
        before: Option<i64>,
    ) -> Result<Vec<Cell>> {
        self.history_with(
            datastore,
            row_key,
            column,
            limit,
            before,
            &ReadOptions::default(),
        )
        .await
    }

    /// [`Store::history`], served as `read` allows.
    pub async fn history_with(
        &self,
        datastore: &str,
        row_key: Uuid,
        column: &str,
        limit: u32,
        before: Option<i64>,
        read: &ReadOptions,
    ) -> Result<Vec<Cell>> {
        cells::history(
            self.topology_ref(),
            datastore,
            row_key,
            column,
            limit,
            before,
            read,
        )
        .await
    }

    /// Cells by key; one statement per cluster. Results follow the input
    /// order.
    pub async fn get_cells(&self, datastore: &str, keys: &[CellKey]) -> Result<Vec<Option<Cell>>> {
        self.get_cells_with(datastore, keys, &ReadOptions::default())
            .await
    }

    /// [`Store::get_cells`], served as `read` allows.
    pub async fn get_cells_with(
        &self,
        datastore: &str,
        keys: &[CellKey],
        read: &ReadOptions,
    ) -> Result<Vec<Option<Cell>>> {
        cells::get_cells(self.topology_ref(), datastore, keys, read).await
    }

    /// The latest cell of each `(row_key, column)`; one statement per
    /// cluster.
    pub async fn get_cells_latest(
        &self,
        datastore: &str,
        wanted: &[(Uuid, String)],
    ) -> Result<Vec<Option<Cell>>> {
        self.get_cells_latest_with(datastore, wanted, &ReadOptions::default())
            .await
    }

    /// [`Store::get_cells_latest`], served as `read` allows.
    pub async fn get_cells_latest_with(
        &self,
        datastore: &str,
        wanted: &[(Uuid, String)],
        read: &ReadOptions,
    ) -> Result<Vec<Option<Cell>>> {
        cells::get_cells_latest(self.topology_ref(), datastore, wanted, &codec::decode, read).await
    }

    /// [`Store::get_cells_latest`] with each body as its JSON text,
    /// transcoded from storage without building a JSON value. With the
    /// cell cache on (`storage.cell_cache_bytes`), only each pair's latest
    /// ref key is read from the database and the bodies the cache keeps
    /// come from it. Served as `read` allows.
    pub async fn get_cells_latest_json(
        &self,
        datastore: &str,
        wanted: &[(Uuid, String)],
        read: &ReadOptions,
    ) -> Result<Vec<Option<Cell<Vec<u8>>>>> {
        cells::get_cells_latest_json(self.topology_ref(), datastore, wanted, read).await
    }

    /// Up to `limit` cells of `shard` after `location`, in insertion order.
    pub async fn cells_for_shard(
        &self,
        datastore: &str,
        shard: u32,
        location: Location,
        limit: u32,
    ) -> Result<LogPage> {
        self.cells_for_shard_with(datastore, shard, location, limit, &ReadOptions::default())
            .await
    }

    /// [`Store::cells_for_shard`], served as `read` allows.
    pub async fn cells_for_shard_with(
        &self,
        datastore: &str,
        shard: u32,
        location: Location,
        limit: u32,
        read: &ReadOptions,
    ) -> Result<LogPage> {
        cells::cells_for_shard(self.topology_ref(), datastore, shard, location, limit, read).await
    }

    /// Answers an index query.
    pub async fn query_index(&self, datastore: &str, query: &IndexQuery) -> Result<IndexPage> {
        self.query_index_with(datastore, query, &ReadOptions::default())
            .await
    }

    /// [`Store::query_index`], served as `read` allows: a replica with
    /// [`Consistency::Replica`](crate::replicas::Consistency::Replica);
    /// a read token alone does not send index reads to a replica, since
    /// index entries follow their cells after the commit.
    pub async fn query_index_with(
        &self,
        datastore: &str,
        query: &IndexQuery,
        read: &ReadOptions,
    ) -> Result<IndexPage> {
        query::query_index(self.topology_ref(), datastore, query, read).await
    }

    /// Answers an index query together with the latest cells of `columns`
    /// for the rows of its page, bodies as JSON text, in one statement,
    /// when one cluster holds every shard of the datastore. `None` when the
    /// cells are spread over clusters: then [`Store::query_index`] and
    /// [`Store::get_cells_latest_json`] answer it.
    pub async fn query_index_with_cells_json(
        &self,
        datastore: &str,
        query: &IndexQuery,
        columns: &[&str],
        read: &ReadOptions,
    ) -> Result<Option<(IndexPage, Vec<Cell<Vec<u8>>>)>> {
        let topology = self.topology_ref();
        let plan = QueryPlan::build(&topology.datastore(datastore)?.def, query)?;
        query::run_plan_with_cells(topology, &plan, columns, read).await
    }

    /// Runs a plan built by [`QueryPlan::build`].
    pub async fn run_plan(&self, plan: &QueryPlan) -> Result<IndexPage> {
        query::run_plan(self.topology_ref(), plan, &ReadOptions::default()).await
    }

    /// The table an index query reads (its current version), for tools
    /// that inspect the SQL of a plan.
    pub fn index_table(&self, datastore: &str, index: &str) -> Result<String> {
        let ds = self.topology_ref().datastore(datastore)?;
        Ok(ds.index(index)?.table.clone())
    }

    /// Returns when every index has applied the cell log as it was at the
    /// call, on every cluster. With maintenance running, the workers (of
    /// this and other gateways) do the work and this waits for them;
    /// without, the work is done here.
    pub async fn sync_indexes(&self) -> Result<()> {
        let topology = self.topology_ref();
        if !self.inner.maintaining {
            for ds in topology.datastores_sorted() {
                if ds.indexes.is_empty() {
                    continue;
                }
                for cluster in ds.map().clusters() {
                    maintainer::apply_all(
                        topology,
                        &ds,
                        cluster,
                        self.inner.maintainer.options.quarantine_after,
                    )
                    .await?;
                }
            }
            maintainer::check_ready(topology, &self.inner.maintainer).await;
            return Ok(());
        }
        let mut targets: BTreeMap<(String, usize), HashMap<u32, i64>> = BTreeMap::new();
        for ds in topology.datastores_sorted() {
            if ds.indexes.is_empty() {
                continue;
            }
            for cluster in ds.map().clusters() {
                let backend = topology.clusters[cluster].master()?;
                let heads = cells::heads(backend.as_ref(), &ds).await?;
                targets.insert(
                    (ds.name().to_string(), cluster),
                    heads.into_iter().collect(),
                );
            }
        }
        loop {
            self.inner.maintainer.sweep_all().await;
            let mut done = true;
            for ((name, cluster), heads) in &targets {
                let ds = topology.datastore(name)?;
                let backend = topology.clusters[*cluster].master()?;
                let consumers = crate::indexes::apply::consumers(topology, &ds);
                let behind = lag::behind(backend.as_ref(), &ds, &consumers).await?;
                if behind
                    .iter()
                    .any(|b| heads.get(&b.shard).is_some_and(|h| b.offset < *h))
                {
                    done = false;
                    break;
                }
            }
            if done {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How far each shard's indexes are behind its log, measured now from
    /// the log heads and stored offsets of every cluster.
    pub async fn index_lag(&self, datastore: &str) -> Result<Vec<ShardLag>> {
        let topology = self.topology_ref();
        let ds = topology.datastore(datastore)?;
        let mut lags = Vec::new();
        for (_, measured) in maintainer::measure(topology, &ds).await? {
            lags.extend(
                measured
                    .shards
                    .into_iter()
                    .map(|(shard, pending_cells)| ShardLag {
                        shard,
                        pending_cells,
                    }),
            );
        }
        lags.sort_by_key(|l| l.shard);
        Ok(lags)
    }

    /// Delay between a cell's commit and its index update, as
    /// `(p50, p99, samples)` in microseconds since the last call.
    pub fn take_index_delays(&self) -> (u64, u64, u64) {
        self.inner.maintainer.take_delays()
    }

    /// Buffered writes of `datastore` that lost to another body of their
    /// key when they were replayed, newest first, at most `limit`.
    /// Starts a trigger consumer (see [`crate::triggers`]): from now on
    /// this gateway delivers its fair share of the datastore's shards to
    /// `handler`, until [`triggers::Consumer::stop`] or the store's
    /// shutdown.
    pub fn start_consumer(
        &self,
        options: triggers::ConsumerOptions,
        handler: triggers::Handler,
    ) -> Result<triggers::Consumer> {
        let mut consumers = self.inner.consumers.lock().expect("consumers");
        consumers.retain(|c| !c.is_finished());
        if consumers.iter().any(|c| {
            c.options.name == options.name
                && c.options.datastore == options.datastore
                && !c.is_finished()
        }) {
            return Err(Error::BadInput(format!(
                "consumer `{}` of `{}` already runs in this gateway",
                options.name, options.datastore
            )));
        }
        let (consumer, state) = triggers::start(
            &self.inner.topology,
            &self.inner.maintainer.holder,
            options,
            handler,
            self.inner.shutdown.subscribe(),
        )?;
        consumers.push(state);
        Ok(consumer)
    }

    /// A follower of `datastore`'s log (see [`triggers::tail`]): the cells
    /// of its columns and shards after its positions, or from now, read
    /// once per commit for all followers of the datastore.
    pub fn follow(
        &self,
        datastore: &str,
        options: triggers::tail::FollowOptions,
    ) -> Result<triggers::tail::Follower> {
        self.inner.tails.follow(datastore, options)
    }

    /// Log reads and followers of the shared tails.
    pub fn tail_metrics(&self) -> triggers::tail::TailMetrics {
        self.inner.tails.metrics()
    }

    /// The status of every trigger consumer running in this gateway.
    pub fn consumers(&self) -> Vec<triggers::ConsumerStatus> {
        self.inner
            .consumers
            .lock()
            .expect("consumers")
            .iter()
            .map(|c| c.status())
            .collect()
    }

    /// How far consumer `name` of `datastore` is behind the log, per
    /// cluster holding its shards: each shard's head in `<ds>_shards`
    /// against the consumer's stored offset (none counts as 0, where a
    /// consumer starting at the beginning would start), one statement per
    /// cluster. Like the index lag it is measured, so every gateway reports
    /// the same figures, whichever holds the shards.
    pub async fn trigger_lag(
        &self,
        datastore: &str,
        name: &str,
    ) -> Result<Vec<triggers::ConsumerLag>> {
        let topology = self.topology_ref();
        let ds = topology.datastore(datastore)?;
        let consumer = [crate::indexes::apply::Consumer {
            index: 0,
            target: 0,
            name: triggers::offsets_key(name),
        }];
        let mut out = Vec::new();
        for cluster in ds.map().clusters() {
            let backend = topology.clusters[cluster].master()?;
            let mut shards: Vec<ShardLag> = lag::behind(backend.as_ref(), &ds, &consumer)
                .await?
                .into_iter()
                .filter(|b| b.shard < ds.map().shards() && ds.map().cluster_of(b.shard) == cluster)
                .map(|b| ShardLag {
                    shard: b.shard,
                    pending_cells: b.head - b.offset,
                })
                .collect();
            shards.sort_by_key(|l| l.shard);
            out.push(triggers::ConsumerLag {
                cluster: topology.clusters[cluster].name.clone(),
                pending_cells: shards.iter().map(|l| l.pending_cells).sum(),
                shards,
            });
        }
        Ok(out)
    }

    /// The cells consumer `name` of `datastore` quarantined, on every
    /// cluster, in shard and `added_id` order.
    pub async fn trigger_quarantine(
        &self,
        datastore: &str,
        name: &str,
    ) -> Result<Vec<triggers::QuarantinedCell>> {
        triggers::list_quarantine(self.topology_ref(), datastore, name).await
    }

    /// Asks for every quarantined cell of consumer `name` to be delivered
    /// again by the gateway holding its shard (at its next sweep); a cell
    /// its handler takes leaves the quarantine. Returns how many were asked.
    pub async fn retry_trigger_quarantine(&self, datastore: &str, name: &str) -> Result<u64> {
        triggers::retry_quarantine(self.topology_ref(), datastore, name).await
    }

    /// Moves every offset of consumer `name` of `datastore` to `to`: the
    /// cells after an `added_id`, or from a time on, are delivered again
    /// (running workers take the new offsets at their next write or sweep).
    /// Returns the shards moved.
    pub async fn rewind_consumer(&self, datastore: &str, name: &str, to: Location) -> Result<u64> {
        triggers::rewind(self.topology_ref(), datastore, name, to).await
    }

    pub async fn buffer_conflicts(
        &self,
        datastore: &str,
        limit: usize,
    ) -> Result<Vec<cells::Conflict>> {
        cells::replay::list_conflicts(self.topology_ref(), datastore, limit).await
    }

    /// The index entries of `datastore` set aside in the quarantine.
    pub async fn quarantine(&self, datastore: &str) -> Result<Vec<QuarantinedEntry>> {
        let ds = self.topology_ref().datastore(datastore)?;
        crate::indexes::quarantine::list(self.topology_ref(), &ds).await
    }

    /// Retries the quarantined entries of `datastore` (of one index, or
    /// all); returns `(applied, still quarantined)`.
    pub async fn retry_quarantine(
        &self,
        datastore: &str,
        index: Option<&str>,
    ) -> Result<(usize, usize)> {
        let ds = self.topology_ref().datastore(datastore)?;
        crate::indexes::quarantine::retry(self.topology_ref(), &ds, index).await
    }

    /// Compares the indexes of `datastore` with the entries their rows'
    /// latest cells give, both ways, and with `options.repair` fixes the
    /// drift found through the maintainer's guarded writes (safe while
    /// gateways run). `on_progress` is called after every chunk of shards,
    /// `on_drift` for every mismatching entry. A full run resumes where an
    /// unfinished run of the same scope stopped. With `options.nice` (the
    /// default) the run works on a thread of its own, at that priority,
    /// with connections of its own; the callbacks are called on this task.
    pub async fn verify_indexes(
        &self,
        datastore: &str,
        options: &crate::indexes::VerifyOptions,
        on_progress: &mut (dyn FnMut(&crate::indexes::VerifyProgress) + Send),
        on_drift: &mut (dyn FnMut(&crate::indexes::Drift) + Send),
    ) -> Result<crate::indexes::VerifyReport> {
        let ds = self.topology_ref().datastore(datastore)?;
        crate::indexes::verify::run(
            &self.inner.topology,
            &self.inner.storage,
            ds,
            options,
            on_progress,
            on_drift,
        )
        .await
    }

    /// Starts a verify (and repair) of `datastore` in the background;
    /// [`Store::verify_status`] follows it. Refused while one runs.
    pub fn start_verify(
        &self,
        datastore: &str,
        options: crate::indexes::VerifyOptions,
    ) -> Result<crate::indexes::VerifyStatus> {
        start_verify(&self.inner, datastore, options, false)
    }

    /// The verify run of `datastore` started in this process (running or
    /// the latest), if any.
    pub fn verify_status(&self, datastore: &str) -> Option<crate::indexes::VerifyStatus> {
        self.inner.verifier.status(datastore)
    }

    /// The recorded state of the latest full verify of `datastore`.
    pub async fn last_verify(
        &self,
        datastore: &str,
    ) -> Result<Option<crate::indexes::VerifyCheckpoint>> {
        let ds = self.topology_ref().datastore(datastore)?;
        crate::indexes::verify::last_run(self.topology_ref(), &ds).await
    }

    /// Drops the table of an index that is no longer defined (or of an
    /// older `version` of a defined one) on every cluster, with its
    /// progress; returns what was dropped as `cluster: table`.
    pub async fn drop_index(
        &self,
        datastore: &str,
        index: &str,
        version: Option<u32>,
    ) -> Result<Vec<String>> {
        catalog::drop_index(self.topology_ref(), datastore, index, version).await
    }
}

/// The shard map of every datastore from the configured ranges (or an even
/// split over the clusters).
pub(crate) fn shard_maps(
    defs: &Definitions,
    config: &StorageConfig,
) -> Result<HashMap<String, ShardMap>> {
    let cluster_index: HashMap<&str, usize> = config
        .clusters
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    let mut maps = HashMap::new();
    for def in &defs.datastores {
        let map = match config.shards.get(&def.name) {
            None => ShardMap::even(def.shards, config.clusters.len()),
            Some(ranges) => {
                let mut resolved = Vec::new();
                for range in ranges {
                    let cluster = *cluster_index.get(range.cluster.as_str()).ok_or_else(|| {
                        Error::Config(format!(
                            "shard range of `{}` names unknown cluster `{}`",
                            def.name, range.cluster
                        ))
                    })?;
                    resolved.push((range.first, range.last, cluster));
                }
                ShardMap::from_ranges(def.shards, &resolved)
                    .map_err(|e| Error::Config(format!("datastore `{}`: {e}", def.name)))?
            }
        };
        maps.insert(def.name.clone(), map);
    }
    for name in config.shards.keys() {
        if !maps.contains_key(name) {
            return Err(Error::Config(format!(
                "shard ranges given for unknown datastore `{name}`"
            )));
        }
    }
    Ok(maps)
}

/// Starts a verify run of `datastore` on a task of its own.
fn start_verify(
    inner: &Arc<Inner>,
    datastore: &str,
    options: crate::indexes::VerifyOptions,
    scheduled: bool,
) -> Result<crate::indexes::VerifyStatus> {
    let ds = inner.topology.datastore(datastore)?;
    if let Some(index) = options.indexes.iter().find(|i| ds.index(i).is_err()) {
        return Err(Error::UnknownIndex {
            datastore: datastore.to_string(),
            index: index.clone(),
        });
    }
    let verifier = inner.verifier.clone();
    if !verifier.begin(datastore, &options, scheduled) {
        return Err(Error::BadInput(format!(
            "a verify of `{datastore}` is already running in this gateway"
        )));
    }
    let status = verifier.status(datastore).expect("just begun");
    let store = Store {
        inner: inner.clone(),
    };
    let name = datastore.to_string();
    let mut stopped = inner.shutdown.subscribe();
    tokio::spawn(async move {
        let mut on_progress = |p: &crate::indexes::VerifyProgress| verifier.progress(&name, p);
        let mut on_drift = |d: &crate::indexes::Drift| verifier.drift(&name, d);
        let run = store.verify_indexes(&name, &options, &mut on_progress, &mut on_drift);
        let outcome = tokio::select! {
            outcome = run => outcome,
            _ = stopped.wait_for(|s| *s) => Err(Error::Internal("the gateway stopped".into())),
        };
        verifier.finish(&name, &outcome);
        if let Ok(report) = &outcome {
            tracing::info!(
                datastore = %name,
                scheduled,
                shards = report.progress.shards_done,
                rows = report.progress.rows,
                drift = report.progress.drift(),
                repaired = report.progress.repaired,
                "index verify done"
            );
        }
    });
    Ok(status)
}

/// Every `every`, a sampled verify of each datastore with indexes.
async fn scheduled_verifies(inner: std::sync::Weak<Inner>, every: Duration, sample: u32) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if *inner.shutdown.borrow() {
            return;
        }
        for ds in inner.topology.datastores_sorted() {
            if ds.indexes.iter().all(|i| !i.is_ready()) {
                continue;
            }
            let options = crate::indexes::VerifyOptions {
                indexes: ds
                    .indexes
                    .iter()
                    .filter(|i| i.is_ready())
                    .map(|i| i.def.name.clone())
                    .collect(),
                sample: Some(sample.max(1)),
                ..crate::indexes::VerifyOptions::default()
            };
            if let Err(err) = start_verify(&inner, ds.name(), options, true) {
                tracing::debug!(datastore = %ds.name(), error = %err, "no scheduled verify");
            }
        }
    }
}
