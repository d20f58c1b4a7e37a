//! Cells: the immutable, versioned values the store holds.
//!
//! A cell is addressed by `(row_key, column, ref_key)`; its body is a JSON
//! object. `write.rs` puts cells (buffer step, then one transaction per
//! cluster on the primary), `replay.rs` delivers buffered writes to their
//! primary once it is back, `read.rs` gets them by key, latest version or
//! history, and `log.rs` reads shards' cells in insertion order, the feed
//! that index maintenance and triggers consume. `prune.rs` deletes old
//! versions (retention), the one operation that removes cells. All of them
//! work on the topology (`topology.rs`); the `Store` is their façade.

mod cache;
pub mod codec;
mod log;
mod prune;
mod read;
pub(crate) mod replay;
#[cfg(test)]
#[path = "../../tests/support/bodies.rs"]
pub(crate) mod testing;
pub(crate) mod write;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub(crate) use cache::CellCache;
pub use cache::CellCacheMetrics;
pub use log::{Location, LogPage, ShardLag, MAX_LOG_PAGE};
pub use prune::{PruneCounts, PruneOptions, PruneProgress, PruneReport};
pub use read::{latest_cells_sql, with_latest_cells, with_latest_ref_keys, CELL_TYPES};
pub use replay::{Backlog, Conflict, UndecodableCopy};

// What the rest of the store uses of reading cells: `Store` delegates its
// reads here, and index maintenance and index queries build on the log and
// latest-cell reads. `read.rs` and `log.rs` stay private to `cells`.
pub(crate) use log::{
    cells_for_shard, heads, log_cells, log_keys, log_length, positions_condition,
};
pub(crate) use prune::prune;
pub(crate) use read::{
    cache_span, cell_from_row, decoded_cell, get_cell, get_cells, get_cells_latest,
    get_cells_latest_json, get_named_cells_json, has_cells, history, latest_cells_with,
    select_cells, CellRow,
};

/// The full address of a cell.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CellKey {
    pub row_key: Uuid,
    pub column: String,
    pub ref_key: i64,
}

/// A cell to write. Its body is a JSON value, or one read from JSON text
/// straight into MessagePack (`B = codec::Packed`, see
/// [`Store::put_packed_cells_with_token`]), which is stored exactly as the
/// value the text parses to.
///
/// [`Store::put_packed_cells_with_token`]: crate::Store::put_packed_cells_with_token
#[derive(Debug, Clone, PartialEq)]
pub struct NewCell<B = serde_json::Value> {
    pub row_key: Uuid,
    pub column: String,
    pub ref_key: i64,
    /// Any JSON object.
    pub body: B,
}

impl<B> NewCell<B> {
    pub fn key(&self) -> CellKey {
        CellKey {
            row_key: self.row_key,
            column: self.column.clone(),
            ref_key: self.ref_key,
        }
    }
}

/// A stored cell with its location in the shard's log. Its body is a JSON
/// value, or in reads that only pass it on, its JSON text (`B = Vec<u8>`).
#[derive(Debug, Clone, PartialEq)]
pub struct Cell<B = serde_json::Value> {
    pub row_key: Uuid,
    pub column: String,
    pub ref_key: i64,
    pub body: B,
    pub created_at: DateTime<Utc>,
    pub shard: u32,
    pub added_id: i64,
}

/// What happened to one cell of a put.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutStatus {
    /// Stored now.
    Written,
    /// An identical cell was already stored; nothing changed.
    Duplicate,
    /// The primary master was unreachable; the cell is safe in a buffer on a
    /// secondary cluster and becomes readable once replayed.
    Buffered,
}

impl PutStatus {
    /// Whether the cell can be read back right away.
    pub fn readable(self) -> bool {
        !matches!(self, PutStatus::Buffered)
    }
}

/// The outcome of one cell of a batch; errors are shared because one failed
/// shard transaction fails all of its cells.
pub type PutResult = Result<PutStatus, std::sync::Arc<crate::Error>>;
