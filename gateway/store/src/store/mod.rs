//! The [`Store`]: the entry point of the Rust API, a thin façade over the
//! topology (`topology/`), the cell paths (`cells/`), the index queries
//! and the index maintainer (`indexes/`), the trigger consumers
//! (`triggers/`) and shard moves (`moves/`).
//!
//! Opening a store (`open.rs`) connects to every database of the topology,
//! checks each reachable cluster's catalog against the definitions and
//! prepares its tables (`catalog.rs`), then starts index maintenance and
//! the background work. The store itself holds no logic of its own: each
//! method delegates to the module that owns the concept, one file per
//! concept here (`cells_api.rs`, `indexes_api.rs`, `triggers_api.rs`,
//! `moves_api.rs`, `metrics.rs`), so the modules depend on the topology and
//! never on the store.

mod cells_api;
mod indexes_api;
mod masters;
mod metrics;
mod moves_api;
mod open;
mod triggers_api;
mod wake_poll;

pub use metrics::{ClusterMetrics, DatastoreMetrics, StoreMetrics};

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use index_dsl::Definitions;
use uuid::Uuid;

use crate::catalog;
use crate::cells::{self, codec, Cell, CellKey, Location, LogPage, NewCell, PutResult, PutStatus};
use crate::error::{Error, Result};
use crate::indexes::IndexStatus;
use crate::indexes::{
    lag, maintainer, query, IndexPage, IndexQuery, MaintainerOptions, MaintenanceMetrics,
    QuarantinedEntry, QueryPlan, ShardLag,
};
use crate::replicas::{ReadOptions, ReadToken};
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
    /// Cells by their full key (`storage.cell_cache_bytes`).
    cell_cache: cells::CellCache,
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

impl Store {
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

    /// Records in the first cluster's catalog the definition files this
    /// store serves (`files` by path relative to the definitions
    /// directory, with their `index_dsl::digest`), for `cellgate plan
    /// --base-deployed`; a gateway calls it at start-up and at each reload.
    pub async fn record_deployed(
        &self,
        digest: &str,
        files: BTreeMap<String, String>,
    ) -> Result<()> {
        let deployed = crate::Deployed {
            digest: digest.to_string(),
            recorded_at: chrono::Utc::now(),
            files,
        };
        let backend = self.tokens_backend()?;
        crate::deployed::record(backend.as_ref(), &deployed).await
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

    /// Where the shards of `datastore` live: contiguous `(first, last,
    /// cluster name)` ranges. Empty for an unknown datastore.
    pub fn topology(&self, datastore: &str) -> Vec<(u32, u32, String)> {
        match self.topology_ref().datastore(datastore) {
            Ok(ds) => self.topology_ref().ranges(&ds),
            Err(_) => Vec::new(),
        }
    }
}
