//! What a store reports for monitoring.

use super::*;

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
    /// Buffer copies this process deleted once their cells were on the
    /// primary's master and every replica of it.
    pub copies_released: u64,
    /// Index maintenance figures (lag from the latest sweep).
    pub maintenance: MaintenanceMetrics,
    /// Index verify runs of this process and the drift they found.
    pub verify: crate::indexes::VerifyTotals,
    /// The stored topology version this process serves (0: none read).
    pub topology_version: i64,
    /// The shard move in progress, as last read from the stored topology.
    pub moving: Option<crate::moves::MoveRecord>,
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
                copies_released: ds.copies_released.load(Relaxed),
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
            cell_cache: self.inner.cell_cache.metrics(),
        }
    }
}
