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

mod cluster;
mod events;
pub(crate) mod fence;
mod lag;
mod outbox;
mod routes;
mod runtime;
pub(crate) mod wake;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use arc_swap::ArcSwap;

use index_dsl::Definitions;

use crate::error::{Error, Result};
use crate::storage::Backend;

pub(crate) use cluster::{Cluster, ClusterState};
pub(crate) use events::{Events, Written, WrittenCell};
pub(crate) use lag::LagBoard;
pub use lag::ReplicaLag;
pub use routes::{MoveRecord, Phase};
pub(crate) use routes::{MoveSignals, FENCE_AFTER};
pub use runtime::index_signature;
pub(crate) use runtime::{trigger_consumer, DatastoreRuntime, IndexRuntime};

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
    pub(crate) buffer_shortfall: BufferShortfall,
    /// Replicas further behind than this serve no `REPLICA` read.
    pub(crate) max_replica_lag: std::time::Duration,
    /// The latest lag of every replica.
    pub(crate) lags: LagBoard,
    /// Largest number of cells in one put.
    pub(crate) max_batch: usize,
    pub(crate) events: Events,
    pub(crate) moves: MoveSignals,
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

/// What a write does when fewer secondary clusters than `buffer_count`
/// can take a copy (`StorageConfig::buffer_shortfall`).
#[derive(Debug, Clone, Copy, Default, serde::Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum BufferShortfall {
    /// Fail the write.
    #[default]
    Fail,
    /// Write the primary with the copies there are.
    WritePrimary,
}

impl Topology {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        defined: Defined,
        clusters: Vec<Cluster>,
        buffer_count: usize,
        buffer_shortfall: BufferShortfall,
        max_replica_lag: std::time::Duration,
        max_batch: usize,
        events: Events,
    ) -> Topology {
        Topology {
            defined: ArcSwap::from_pointee(defined),
            clusters,
            buffer_count,
            buffer_shortfall,
            max_replica_lag,
            lags: LagBoard::default(),
            max_batch,
            events,
            moves: MoveSignals::default(),
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
            lags: LagBoard::default(),
            max_batch: self.max_batch,
            events: Events::new(false).0,
            moves: MoveSignals::default(),
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
