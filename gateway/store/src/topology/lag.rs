//! How far behind its master each replica was when last measured: written
//! by the replica monitor (`replicas.rs`), read by the reads that may go
//! to a replica and by the store's status.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The latest lag measurement of one replica.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaLag {
    pub cluster: String,
    /// `replica<i>`.
    pub node: String,
    /// Cells the master has that the replica has not applied yet, summed
    /// over the datastores.
    pub cells_behind: i64,
    /// How long ago the master had no more cells than the replica has now.
    pub lag_ms: u64,
}

/// A measurement older than this does not vouch for a replica.
const FRESH: Duration = Duration::from_secs(5);

/// Lag state of every replica.
#[derive(Default)]
pub(crate) struct LagBoard {
    /// `(cluster, replica) →` the latest measurement and when it was taken.
    latest: Mutex<HashMap<(usize, usize), (ReplicaLag, Instant)>>,
}

impl LagBoard {
    /// Every replica's latest lag.
    pub(crate) fn all(&self) -> Vec<ReplicaLag> {
        let mut all: Vec<ReplicaLag> = self
            .latest
            .lock()
            .expect("lag")
            .values()
            .map(|(lag, _)| lag.clone())
            .collect();
        all.sort_by(|a, b| (&a.cluster, &a.node).cmp(&(&b.cluster, &b.node)));
        all
    }

    /// Whether `replica` of `cluster` was measured recently within `limit`.
    pub(crate) fn within(&self, cluster: usize, replica: usize, limit: Duration) -> bool {
        self.latest
            .lock()
            .expect("lag")
            .get(&(cluster, replica))
            .is_some_and(|(lag, at)| {
                at.elapsed() < FRESH && Duration::from_millis(lag.lag_ms) <= limit
            })
    }

    /// Records the measurements of `cluster`'s replicas, in order; `None`
    /// forgets a replica that could not be measured.
    pub(crate) fn record(&self, cluster: usize, measured: Vec<Option<ReplicaLag>>) {
        let mut latest = self.latest.lock().expect("lag");
        for (replica, lag) in measured.into_iter().enumerate() {
            match lag {
                Some(lag) => {
                    latest.insert((cluster, replica), (lag, Instant::now()));
                }
                None => {
                    latest.remove(&(cluster, replica));
                }
            }
        }
    }
}
