//! One storage cluster: its master (and the master again through the
//! maintenance pool), its replicas, and whether it can be used yet.

use std::sync::{Arc, RwLock};

use crate::error::{Error, Result};
use crate::storage::Backend;

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
