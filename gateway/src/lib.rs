//! cellgate: a sharded, append-only cell store on SQL databases, with
//! secondary indexes declared in YAML (see `ARCHITECTURE.md`).
//!
//! The library is the Rust API: open a [`Store`] from [`index_dsl`]
//! definitions and a [`config::StorageConfig`], then put and read cells,
//! read a shard's log, and query indexes. The `cellgate` binary wraps it.

pub mod auth;
mod catalog;
pub mod cells;
pub mod cli;
pub mod config;
pub mod demo;
mod error;
pub mod graphql;
pub mod http;
pub mod ids;
pub mod indexes;
mod leases;
mod retry;
pub mod shards;
pub mod storage;
mod store;
mod topology;
pub mod upgrade;

pub use error::{Error, Result};
pub use store::{ClusterMetrics, DatastoreMetrics, IndexStatus, Store, StoreMetrics, StoreOptions};
