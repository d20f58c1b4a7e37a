//! A hook into the passes of index maintenance, for tests that stall a
//! pass at a stage (a lease lost mid-pass, a write racing a pass). It is
//! its own module because both the passes (`apply.rs`) and the
//! maintainer's options (`maintainer/`) name it.

use std::sync::Arc;

/// Where a maintenance pass is, for a [`PassHook`].
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassStage {
    /// Before the log is read.
    Start,
    /// Before a transaction that writes index entries on another cluster
    /// (after the pass checked its lease deadline).
    RemoteWrite { target: String },
    /// Before the transaction on the cell's own cluster (after the pass
    /// checked its lease deadline).
    LocalCommit,
}

/// A pass at one of its stages.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PassPoint {
    pub datastore: String,
    /// The cell cluster the pass reads.
    pub cluster: String,
    /// The consumers (`ix:<index>:<version>:<cluster>`) the pass applies
    /// the log for.
    pub consumers: Vec<String>,
    pub stage: PassStage,
}

/// A hook into the passes of the maintainer's workers (not of
/// `sync_indexes` without maintenance, nor of quarantine retries).
#[doc(hidden)]
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct PassHook(
    pub Arc<dyn Fn(PassPoint) -> futures::future::BoxFuture<'static, ()> + Send + Sync>,
);

impl std::fmt::Debug for PassHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PassHook")
    }
}
