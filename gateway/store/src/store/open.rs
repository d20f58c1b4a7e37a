//! Opening a store, in named steps: check the configuration, connect to
//! every node, read each reachable cluster's catalog, build the topology
//! from the definitions and the stored topology, prepare the clusters,
//! then start the background work (index maintenance, the topology
//! follower, the buffer replay, the replica monitor, the log tails).

use super::*;
use crate::topology::{Cluster, Written};

impl Store {
    /// Connects to every database of the topology, checks and prepares the
    /// reachable clusters, and starts index maintenance (which first
    /// catches up on any cells written but not yet indexed, e.g. before a
    /// crash). Fails when the definitions disagree with a cluster's
    /// catalog; a cluster that cannot be reached is prepared later, in the
    /// background.
    pub async fn open(defs: Definitions, options: StoreOptions) -> Result<Store> {
        let config = &options.storage;
        check_config(config)?;
        let clusters = connect_clusters(config).await?;
        let maps = crate::options::shard_maps(&defs, config)?;
        let catalogs = read_catalogs(&clusters, &options).await?;
        let mut warnings = Vec::new();
        let (topology, written) =
            build_topology(defs, clusters, &maps, &catalogs, &options, &mut warnings).await?;
        prepare_clusters(&topology, &catalogs, &mut warnings).await?;
        for warning in &warnings {
            tracing::warn!("{warning}");
        }
        let (shutdown, stopped) = tokio::sync::watch::channel(false);
        let maintainer = start_maintenance(&topology, &options, written, stopped, &shutdown).await;
        let replayer = start_background_work(&topology, &options, &maintainer, &shutdown);
        let ids = open_ids(&topology, &options).await?;
        let tails = Arc::new(triggers::tail::Tails::new(
            &topology,
            options.tail.clone(),
            shutdown.subscribe(),
        ));
        let store = Store {
            inner: Arc::new(Inner {
                cell_cache: cells::CellCache::new(config.cell_cache_bytes),
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
        if options.maintain_indexes {
            tokio::spawn(super::masters::watch_masters(Arc::downgrade(&store.inner)));
        }
        if !options.converting_v1 {
            // Other gateways switch to a new index version at their next
            // sweep after it is caught up: the previous version stays
            // maintained for five sweeps (at least 5 s, at most the minute
            // `cellgate index drop` waits after the last switch) after it.
            let grace = (options.maintenance.sweep_every * 5)
                .clamp(Duration::from_secs(5), crate::catalog::DROP_GRACE);
            tokio::spawn(super::indexes_api::retire_previous_versions(
                Arc::downgrade(&store.inner),
                grace,
            ));
        }
        if let (true, Some(every)) = (options.maintain_indexes, options.maintenance.verify_every) {
            tokio::spawn(super::indexes_api::scheduled_verifies(
                Arc::downgrade(&store.inner),
                every,
                options.maintenance.verify_sample,
            ));
        }
        Ok(store)
    }
}

/// Refuses a configuration no store can be opened with.
fn check_config(config: &StorageConfig) -> Result<()> {
    if config.clusters.is_empty() {
        return Err(Error::Config("no storage cluster configured".into()));
    }
    if config.buffer_count > 0 && config.clusters.len() < 2 {
        return Err(Error::Config(
            "buffer_count > 0 needs at least two clusters".into(),
        ));
    }
    for cluster in &config.clusters {
        if !index_dsl::is_identifier(&cluster.name) || cluster.name.len() > 32 {
            return Err(Error::Config(format!(
                "cluster name `{}` must be letters, digits and `_` (at most 32)",
                cluster.name
            )));
        }
    }
    Ok(())
}

/// Connects to the master (twice: requests and maintenance), and the
/// replicas of each cluster, each server node behind a circuit breaker of
/// its own when breakers are on.
async fn connect_clusters(config: &StorageConfig) -> Result<Vec<Cluster>> {
    let breakers = config.breaker.settings()?;
    let mut clusters = Vec::new();
    for (index, cluster) in config.clusters.iter().enumerate() {
        let connect = config.connect_options(&cluster.name);
        // One breaker per node: the master's two pools share one.
        let guard = |backend: Arc<dyn storage::Backend>, node: &str| match breakers {
            Some(settings) if !backend.dialect().is_embedded() => {
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
        clusters.push(Cluster::new(
            index,
            cluster.name.clone(),
            master,
            maintenance,
            replicas,
        ));
    }
    Ok(clusters)
}

/// Each cluster's catalog, `None` for a cluster that does not answer now
/// (it is prepared in the background once it does, unless every cluster
/// is required).
async fn read_catalogs(
    clusters: &[Cluster],
    options: &StoreOptions,
) -> Result<Vec<Option<catalog::Catalog>>> {
    let mut catalogs = Vec::new();
    for cluster in clusters {
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
    Ok(catalogs)
}

/// The topology of the definitions: each datastore's runtime with the
/// index versions the catalogs call for and the shard maps of the stored
/// topology (written from `maps` by the first store to open it).
async fn build_topology(
    defs: Definitions,
    clusters: Vec<Cluster>,
    maps: &HashMap<String, crate::shards::ShardMap>,
    catalogs: &[Option<catalog::Catalog>],
    options: &StoreOptions,
    warnings: &mut Vec<String>,
) -> Result<(Arc<Topology>, tokio::sync::mpsc::UnboundedReceiver<Written>)> {
    let config = &options.storage;
    let stored =
        crate::moves::stored::open(&clusters, catalogs[0].is_some(), &defs, maps, warnings).await?;
    let reachable: Vec<&catalog::Catalog> = catalogs.iter().flatten().collect();
    let plans = catalog::plan_indexes(&defs, &reachable, warnings);
    let mut datastores = HashMap::new();
    for def in &defs.datastores {
        let mut indexes: Vec<Arc<IndexRuntime>> = Vec::new();
        let mut previous = Vec::new();
        for index in &def.indexes {
            let plan = &plans[&(def.name.clone(), index.name.clone())];
            indexes.push(Arc::new(IndexRuntime::new(
                index.clone(),
                plan.version,
                plan.ready,
            )));
            if let Some((version, def)) = &plan.previous {
                let runtime = IndexRuntime::new(def.clone(), *version, true);
                runtime.set_serves_until(plan.version);
                previous.push(Arc::new(runtime));
            }
        }
        indexes.extend(previous);
        let runtime = DatastoreRuntime::new(def.clone(), maps[&def.name].clone(), indexes);
        if let Some(served) = stored.get(&def.name) {
            runtime.routes.set_moving(served.moving.clone());
            runtime
                .routes
                .set(served.version, served.map.clone(), served.work.clone());
        }
        datastores.insert(def.name.clone(), Arc::new(runtime));
    }
    let (events, written) = Events::new(options.storage.notify);
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
    ));
    // Other gateways learn of this one's writes after each commit, where
    // the database can tell them (`topology/wake.rs`).
    if topology
        .clusters
        .iter()
        .any(|c| c.master.dialect().has_notify())
    {
        if let Some((origin, outbox)) = topology.events.outbox() {
            tokio::spawn(crate::topology::wake::send(
                Arc::downgrade(&topology),
                outbox.clone(),
                origin.to_string(),
            ));
        }
    }
    Ok((topology, written))
}

/// Checks each reachable cluster's catalog against the definitions and
/// creates what its tables lack; the others are prepared later, in the
/// background.
async fn prepare_clusters(
    topology: &Arc<Topology>,
    catalogs: &[Option<catalog::Catalog>],
    warnings: &mut Vec<String>,
) -> Result<()> {
    for (cluster, found) in topology.clusters.iter().zip(catalogs) {
        let Some(found) = found else { continue };
        catalog::validate(topology, cluster, found, warnings)?;
        catalog::prepare(topology, cluster, found).await?;
    }
    if topology
        .clusters
        .iter()
        .any(|c| matches!(c.state(), ClusterState::Pending(_)))
    {
        tokio::spawn(catalog::prepare_later(
            Arc::downgrade(topology),
            Duration::from_secs(2),
        ));
    }
    Ok(())
}

/// How long opening a store of several clusters waits for its first
/// topology acknowledgement (`moves/follow.rs`) before it serves anyway,
/// its reads checked until then (`topology/fence.rs`).
const FIRST_ACK_WAIT: Duration = Duration::from_secs(2);

/// Index maintenance: readiness first (a catch-up after a crash), then
/// the workers; and the follower of the stored topology.
async fn start_maintenance(
    topology: &Arc<Topology>,
    options: &StoreOptions,
    written: tokio::sync::mpsc::UnboundedReceiver<Written>,
    stopped: tokio::sync::watch::Receiver<bool>,
    shutdown: &tokio::sync::watch::Sender<bool>,
) -> Arc<maintainer::Maintainer> {
    let maintainer = Arc::new(maintainer::Maintainer::new(options.maintenance.clone()));
    if options.converting_v1 {
        return maintainer;
    }
    maintainer::check_ready(topology, &maintainer).await;
    // Other gateways' writes wake this one's followers and maintenance at
    // once: notified on PostgreSQL (`topology/wake.rs`), polled elsewhere
    // (`wake_poll.rs`).
    for (index, cluster) in options.storage.clusters.iter().enumerate() {
        if options.storage.notify && topology.clusters[index].master.dialect().has_notify() {
            tokio::spawn(crate::topology::wake::listen(
                Arc::downgrade(topology),
                index,
                cluster.master.clone(),
            ));
        } else if options.storage.wake_poll_ms > 0 {
            let connect = ConnectOptions {
                max_connections: 1,
                background: true,
                ..options.storage.connect_options(&cluster.name)
            };
            tokio::spawn(super::wake_poll::poll(
                Arc::downgrade(topology),
                index,
                cluster.master.clone(),
                connect,
                Duration::from_millis(options.storage.wake_poll_ms),
            ));
        }
    }
    maintainer::start(
        topology,
        &maintainer,
        written,
        stopped,
        options.maintain_indexes,
    );
    if options.follow_topology && topology.clusters.len() > 1 {
        topology.moves.following();
        tokio::spawn(crate::moves::follow::follow(
            Arc::downgrade(topology),
            maintainer.clone(),
            maintainer.holder.clone(),
            shutdown.subscribe(),
        ));
        // Until its first acknowledgement no mover waits for this store, and
        // its reads are checked against the clusters: with the metadata
        // cluster answering, that takes a round trip or two, so the store
        // serves with trusted routes from its first request.
        if topology.clusters[0].state() == ClusterState::Ready {
            let deadline = std::time::Instant::now() + FIRST_ACK_WAIT;
            while topology.moves.stale().is_some() && std::time::Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }
    maintainer
}

/// The replica monitor (with replicas) and the buffer replay (with more
/// than one cluster); the replayer.
fn start_background_work(
    topology: &Arc<Topology>,
    options: &StoreOptions,
    maintainer: &maintainer::Maintainer,
    shutdown: &tokio::sync::watch::Sender<bool>,
) -> Arc<cells::replay::Replayer> {
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
    replayer
}

/// The ID allocator, on `ids.cluster` (the first cluster by default).
async fn open_ids(topology: &Topology, options: &StoreOptions) -> Result<crate::ids::Ids> {
    let cluster = match &options.ids.cluster {
        None => &topology.clusters[0],
        Some(name) => topology
            .clusters
            .iter()
            .find(|c| c.name == *name)
            .ok_or_else(|| {
                Error::Config(format!("ids.cluster `{name}` is not a configured cluster"))
            })?,
    };
    crate::ids::Ids::open(cluster.master.clone(), options.ids.clone()).await
}
