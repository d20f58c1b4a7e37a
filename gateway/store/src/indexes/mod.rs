//! Secondary indexes: keeping them up to date from the cell log and
//! answering queries on them.
//!
//! Maintenance: `maintainer/` runs the background workers (leases, sweep,
//! scheduling), `apply.rs` one batched pass over the log, `lag.rs` measures
//! how far behind the offsets are. Queries: `plan.rs` turns a typed query
//! or a filter string into a plan (`filters.rs` keeps parsed filter
//! strings by their text), `query.rs` runs it with one statement
//! per cluster, `cursor.rs` encodes keyset positions. `verify.rs` compares indexes
//! with their cells and repairs the drift. `entry.rs` extracts
//! typed field values from cell bodies.

pub(crate) mod apply;
pub mod cursor;
pub mod entry;
mod explain;
pub mod filters;
mod hook;
pub(crate) mod lag;
pub(crate) mod maintainer;
pub mod plan;
pub(crate) mod quarantine;
pub(crate) mod query;
pub(crate) mod recent;
mod status;
pub(crate) mod verify;

pub(crate) use explain::explain;
pub use explain::{ExplainedStatement, IndexExplain};
#[doc(hidden)]
pub use hook::{PassHook, PassPoint, PassStage};
pub use maintainer::{MaintainerOptions, MaintenanceMetrics};
pub use plan::{IndexQuery, OrderBy, QueryPlan};
pub use quarantine::QuarantinedEntry;
pub use query::{IndexEntry, IndexPage};
pub use verify::{
    Drift, DriftKind, VerifyCheckpoint, VerifyOptions, VerifyProgress, VerifyReport, VerifyState,
    VerifyStatus, VerifyTotals,
};

pub use crate::cells::ShardLag;
pub use status::IndexStatus;
