//! The cellgate cell store as a library: immutable, versioned JSON cells
//! in fixed logical shards on SQL databases (embedded SQLite, MySQL/MariaDB,
//! PostgreSQL), with secondary indexes declared in YAML ([`index_dsl`]) and
//! maintained from the cell log.
//!
//! Open a [`Store`] from the definitions and a [`StorageConfig`], then put
//! and read cells ([`cells`]), read a shard's log, query indexes
//! ([`indexes`]) and take IDs ([`ids`]). This crate knows nothing of
//! GraphQL, HTTP or the command line: the `cellgate` gateway builds on its
//! public API alone.
//!
//! ```
//! # tokio::runtime::Runtime::new().unwrap().block_on(async {
//! use cellgate_store::cells::{NewCell, PutStatus};
//! use cellgate_store::indexes::IndexQuery;
//! use cellgate_store::{StorageConfig, Store, StoreOptions};
//! use index_dsl::Literal;
//!
//! // A datastore of trips with an index by driver, as files in git hold them.
//! let definitions = index_dsl::load_files(
//!     std::path::Path::new("datastores"),
//!     [
//!         ("trips/datastore.yaml", "name: trips\ncolumns:\n  - name: BASE\n"),
//!         (
//!             "trips/indexes/by_driver.yaml",
//!             "table: by_driver\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: driver, type: UUID }\n      - { field: fare, type: float }\n",
//!         ),
//!     ],
//! )
//! .expect("valid definitions");
//!
//! // An embedded SQLite store in a directory of its own.
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(definitions, StoreOptions::new(StorageConfig::embedded(dir.path())))
//!     .await
//!     .unwrap();
//!
//! let driver = uuid::Uuid::new_v4();
//! let cell = NewCell {
//!     row_key: uuid::Uuid::new_v4(),
//!     column: "BASE".into(),
//!     ref_key: 1,
//!     body: serde_json::json!({ "driver": driver.to_string(), "fare": 12.5 }),
//! };
//! assert_eq!(store.put_cell("trips", cell.clone()).await.unwrap(), PutStatus::Written);
//! // Writing the same cell again is a no-op.
//! assert_eq!(store.put_cell("trips", cell.clone()).await.unwrap(), PutStatus::Duplicate);
//!
//! // Index entries follow the cell log; wait until this one is applied.
//! store.sync_indexes().await.unwrap();
//! let page = store
//!     .query_index(
//!         "trips",
//!         &IndexQuery {
//!             index: "by_driver".into(),
//!             shard_values: vec![Literal::String(driver.to_string())],
//!             ..IndexQuery::default()
//!         },
//!     )
//!     .await
//!     .unwrap();
//! assert_eq!(page.entries.len(), 1);
//! assert_eq!(page.entries[0].row_key, cell.row_key);
//! store.shutdown(std::time::Duration::from_secs(1)).await;
//! # });
//! ```

mod catalog;
pub mod cells;
mod deployed;
mod error;
pub mod ids;
pub mod indexes;
pub mod leases;
pub mod moves;
mod options;
mod reload;
pub mod replicas;
mod retry;
mod run_lease;
mod shard_leases;
pub mod shards;
pub mod storage;
mod store;
pub mod tokens;
mod topology;
pub mod triggers;
pub mod upgrade;

pub use catalog::Built;
pub use deployed::{inspect, ClusterInspection, Deployed, Inspection};
pub use error::{Error, Result};
pub use indexes::IndexStatus;
pub use options::{BreakerConfig, ClusterConfig, ShardRange, StorageConfig};
pub use reload::ReloadReport;
pub use store::{ClusterMetrics, DatastoreMetrics, Snapshot, Store, StoreMetrics, StoreOptions};
pub use topology::index_signature;
