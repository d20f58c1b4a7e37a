//! The store's shard moves (`moves/`): moving a range to another cluster,
//! undoing a move that has not switched, and the stored topology.

use super::*;
use crate::moves::{MoveOptions, MoveProgress, MoveRecord, MoveReport, TopologyStatus};

impl Store {
    /// Moves a shard range to another cluster (see `moves/`), or resumes
    /// the move recorded for it; `progress` follows each phase.
    pub async fn move_shards(
        &self,
        options: &MoveOptions,
        progress: &mut (dyn FnMut(&MoveProgress) + Send),
    ) -> Result<MoveReport> {
        crate::moves::move_shards(&self.inner.topology, &self.inner.storage, options, progress)
            .await
    }

    /// Undoes a move that has not switched yet: the source's counters are
    /// opened again and the target's copy is deleted.
    pub async fn abort_move(&self, datastore: &str) -> Result<MoveRecord> {
        crate::moves::abort_move(&self.inner.topology, datastore).await
    }

    /// The stored topology of `datastore` and its move in progress.
    pub async fn topology_status(&self, datastore: &str) -> Result<TopologyStatus> {
        crate::moves::topology_status(&self.inner.topology, datastore).await
    }
}
