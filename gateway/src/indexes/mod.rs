//! Secondary indexes: keeping them up to date from the cell log
//! (`maintainer.rs`) and answering queries on them (`plan.rs` turns a typed
//! query or a filter string into a plan, `query.rs` runs it shard by shard,
//! `cursor.rs` encodes keyset positions).

pub mod cursor;
pub mod entry;
pub(crate) mod maintainer;
pub mod plan;
mod query;

pub use maintainer::ShardLag;
pub use plan::{IndexQuery, OrderBy, QueryPlan};
pub use query::{IndexEntry, IndexPage};
