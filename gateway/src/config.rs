//! Storage configuration: the clusters and which shards each one holds.
//!
//! ```yaml
//! storage:
//!   # Secondary clusters a write is buffered to before the primary master
//!   # (0 = no buffering; needs at least two clusters).
//!   buffer_count: 0
//!   clusters:
//!     - name: main
//!       master: sqlite://./data/cellgate.db
//!       replicas: []
//!   # Optional per datastore; default: shards split evenly, in order.
//!   shards:
//!     trips:
//!       - { first: 0, last: 2047, cluster: main }
//! ```
//!
//! With no configuration everything lives in one embedded SQLite cluster
//! under the data directory.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// Storage section of the configuration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// How many secondary clusters receive a copy of each write in their
    /// buffer table before the primary master is written.
    pub buffer_count: usize,
    /// Storage clusters; the first is the default home of every shard.
    pub clusters: Vec<ClusterConfig>,
    /// Explicit shard ranges per datastore.
    pub shards: BTreeMap<String, Vec<ShardRange>>,
    /// Largest number of pooled connections per database.
    pub max_connections: u32,
}

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            buffer_count: 0,
            clusters: Vec::new(),
            shards: BTreeMap::new(),
            max_connections: 16,
        }
    }
}

/// One storage cluster: a master and its read replicas.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Name used in shard ranges, errors and metrics, e.g. `main`.
    pub name: String,
    /// Database URL of the master, e.g. `postgres://cellgate@db1/cells`.
    pub master: String,
    /// Database URLs of replicas ("minions").
    #[serde(default)]
    pub replicas: Vec<String>,
}

/// Shards `first..=last` of a datastore live on `cluster`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShardRange {
    pub first: u32,
    pub last: u32,
    pub cluster: String,
}

impl StorageConfig {
    /// One embedded SQLite cluster in `data_dir`.
    pub fn embedded(data_dir: &Path) -> StorageConfig {
        let file = data_dir.join("cellgate.db");
        StorageConfig {
            clusters: vec![ClusterConfig {
                name: "main".to_string(),
                master: format!("sqlite://{}", file.display()),
                replicas: Vec::new(),
            }],
            ..StorageConfig::default()
        }
    }

    /// A single cluster at `url`.
    pub fn single(url: &str) -> StorageConfig {
        StorageConfig {
            clusters: vec![ClusterConfig {
                name: "main".to_string(),
                master: url.to_string(),
                replicas: Vec::new(),
            }],
            ..StorageConfig::default()
        }
    }
}
