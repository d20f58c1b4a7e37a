//! The storage topology a [`crate::Store`] opens: its clusters (a master
//! and replicas each), which shards of each datastore every cluster holds,
//! buffered writes and connection limits. It is the `storage:` section of
//! `cellgate.yaml`, and a Rust user builds it directly (or with
//! [`StorageConfig::embedded`] / [`StorageConfig::single`]).
//!
//! Like every configuration struct, it rejects unknown keys and takes its
//! defaults at struct level.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use index_dsl::Definitions;
use serde::Deserialize;

use crate::error::{Error, Result};
use crate::shards::ShardMap;

/// Storage section of the configuration.
///
/// ```yaml
/// storage:
///   buffer_count: 1
///   clusters:
///     - { name: a, master: "mysql://cellgate@db1/cells" }
///     - { name: b, master: "mysql://cellgate@db2/cells" }
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// How many secondary clusters receive a copy of each write in their
    /// buffer table before the primary master is written. A secondary that
    /// cannot take its copy is replaced by another (see `buffer_shortfall`
    /// for when too few can). A write whose master failed transiently is
    /// answered `BUFFERED` once it has this many copies: not readable until
    /// a gateway replays it into the master, within a second or so of the
    /// master answering again once the copy is 5 s old. Copies live until
    /// the master's replicas have the cells, so a master lost with its disk
    /// and replaced by a promoted replica loses no acknowledged write.
    ///
    /// ```yaml
    /// buffer_count: 0
    /// ```
    pub buffer_count: usize,
    /// What a write does when fewer than `buffer_count` other clusters can
    /// take a copy: `fail` (the default, as Schemaless does) fails it with
    /// `STORAGE_UNAVAILABLE` and removes the copies made; `write_primary`
    /// writes the primary anyway, so a healthy primary still answers
    /// `WRITTEN`, but a write whose primary then fails too is an error,
    /// never `BUFFERED` with fewer copies than promised.
    ///
    /// ```yaml
    /// buffer_shortfall: fail
    /// ```
    pub buffer_shortfall: BufferShortfall,
    /// Storage clusters; the first is the default home of every shard.
    /// Empty: one embedded SQLite cluster in the data directory.
    ///
    /// ```yaml
    /// clusters:
    ///   - { name: main, master: "sqlite://./data/cellgate.db" }
    /// ```
    pub clusters: Vec<ClusterConfig>,
    /// Explicit shard ranges per datastore.
    ///
    /// ```yaml
    /// shards:
    ///   trips: [{ first: 0, last: 4095, cluster: main }]
    /// ```
    pub shards: BTreeMap<String, Vec<ShardRange>>,
    /// Largest number of pooled connections per database.
    ///
    /// ```yaml
    /// max_connections: 16
    /// ```
    pub max_connections: u32,
    /// Connections per database server kept for index maintenance, apart
    /// from `max_connections`: its passes, sweeps and leases never wait for
    /// a connection behind requests, which under many concurrent writers
    /// let the indexes fall seconds behind. 0 shares the request pool.
    /// SQLite, one file with one writer, always shares it.
    ///
    /// ```yaml
    /// maintenance_connections: 4
    /// ```
    pub maintenance_connections: u32,
    /// Longest wait, in milliseconds, for a database server: for a pooled
    /// connection (opening one included) and for the answer to one
    /// statement. Past it the request fails with `STORAGE_UNAVAILABLE`
    /// (retryable) instead of hanging on a database that is down or
    /// unreachable, and a connection that did not answer is closed.
    ///
    /// ```yaml
    /// timeout_ms: 5000
    /// ```
    pub timeout_ms: u64,
    /// Longest time, in milliseconds, `GET /readyz` waits for the masters
    /// to answer (all at once) before it answers 503.
    ///
    /// ```yaml
    /// readiness_timeout_ms: 2000
    /// ```
    pub readiness_timeout_ms: u64,
    /// The circuit breaker in front of each database server (each master,
    /// its maintenance pool included, and each replica): after `failures`
    /// statements in a row find the node unavailable (refused, reset, no
    /// answer within `timeout_ms`), statements to it fail at once with
    /// `STORAGE_UNAVAILABLE` (and writes with buffer copies answer
    /// `BUFFERED` at once) for `open_ms`; then one statement probes the
    /// node: success closes the breaker, failure opens it again for twice
    /// as long, at most `max_open_ms`. SQLite files have none.
    ///
    /// ```yaml
    /// breaker: { enabled: true, failures: 3, open_ms: 500, max_open_ms: 2000 }
    /// ```
    pub breaker: BreakerConfig,
    /// Replicas further behind their master than this, in milliseconds,
    /// serve no `REPLICA` read (those go to another replica or the
    /// master). Reads given a read token check the replica has applied
    /// the token's writes instead, whatever its lag.
    ///
    /// ```yaml
    /// max_replica_lag_ms: 30000
    /// ```
    pub max_replica_lag_ms: u64,
    /// Memory for cells kept by their full key (row, column, ref key), in
    /// bytes of their bodies' JSON text. Cells are immutable, so a kept
    /// cell is never stale: reads by full key, and the bodies of latest
    /// reads (`row { … }` of index pages), whose statements then only look
    /// up each row's latest ref key, are answered from memory. The least
    /// used cells go first when it is full. 0 turns the cache off.
    ///
    /// ```yaml
    /// cell_cache_bytes: 268435456
    /// ```
    pub cell_cache_bytes: u64,
    /// On PostgreSQL, the other gateways are notified of each write once it
    /// has committed (`LISTEN/NOTIFY` on a channel per datastore, one
    /// listening connection per cluster and gateway), so their
    /// subscriptions, triggers and index maintenance go on at once rather
    /// than at their next sweep. The notification is not part of the
    /// write's transaction (a `NOTIFY` there would make every commit of the
    /// database wait for the one before it): each gateway sends at most one
    /// notification statement per cluster at a time, carrying every write
    /// committed since the previous one. Turn it off where the connections
    /// go through a pooler in transaction mode (PgBouncer), which cannot
    /// hold a `LISTEN`: the gateways then poll for other gateways' writes
    /// (`wake_poll_ms`). No effect on MariaDB/MySQL and SQLite, which
    /// always poll.
    ///
    /// ```yaml
    /// notify: true
    /// ```
    pub notify: bool,
    /// Where no notification carries other gateways' writes (MariaDB/MySQL,
    /// SQLite, PostgreSQL with `notify: false`), each gateway reads the sum
    /// of every datastore's shard counters on each cluster's master this
    /// often, in milliseconds, on one connection of its own: one small
    /// statement per datastore and cluster, whatever the number of
    /// subscriptions and triggers. When the sum moved beyond what this
    /// gateway wrote itself, it reads the counters and wakes its followers
    /// and index maintenance for the shards that advanced. 0 turns it off
    /// (the sweeps then find other gateways' writes).
    ///
    /// ```yaml
    /// wake_poll_ms: 50
    /// ```
    pub wake_poll_ms: u64,
}

/// See [`StorageConfig::breaker`].
///
/// ```yaml
/// breaker: { enabled: true, failures: 3, open_ms: 500, max_open_ms: 2000 }
/// ```
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct BreakerConfig {
    /// Put a breaker in front of each database server.
    ///
    /// ```yaml
    /// enabled: true
    /// ```
    pub enabled: bool,
    /// Consecutive failures that open the breaker (at least 1).
    ///
    /// ```yaml
    /// failures: 3
    /// ```
    pub failures: u32,
    /// Milliseconds the breaker stays open after it opens, before a probe.
    ///
    /// ```yaml
    /// open_ms: 500
    /// ```
    pub open_ms: u64,
    /// Longest time, in milliseconds, the breaker stays open after failed
    /// probes double its cool-down (at least `open_ms`). It bounds how late
    /// a node that is back is noticed (buffered writes are replayed into
    /// it within about this time); each probe of a node that still hangs
    /// costs one statement up to `timeout_ms`.
    ///
    /// ```yaml
    /// max_open_ms: 2000
    /// ```
    pub max_open_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            enabled: true,
            failures: 3,
            open_ms: 500,
            max_open_ms: 2_000,
        }
    }
}

impl BreakerConfig {
    /// The breaker settings, or `None` when breakers are turned off; an
    /// error names the setting that cannot work.
    pub fn settings(&self) -> crate::Result<Option<crate::storage::breaker::Settings>> {
        if !self.enabled {
            return Ok(None);
        }
        if self.failures == 0 {
            return Err(crate::Error::Config(
                "storage.breaker.failures must be at least 1".into(),
            ));
        }
        if self.open_ms == 0 {
            return Err(crate::Error::Config(
                "storage.breaker.open_ms must be at least 1".into(),
            ));
        }
        if self.max_open_ms < self.open_ms {
            return Err(crate::Error::Config(format!(
                "storage.breaker.max_open_ms ({}) must be at least open_ms ({})",
                self.max_open_ms, self.open_ms
            )));
        }
        Ok(Some(crate::storage::breaker::Settings {
            failures: self.failures,
            open: std::time::Duration::from_millis(self.open_ms),
            max_open: std::time::Duration::from_millis(self.max_open_ms),
        }))
    }
}

pub use crate::topology::BufferShortfall;

impl Default for StorageConfig {
    fn default() -> Self {
        StorageConfig {
            buffer_count: 0,
            buffer_shortfall: BufferShortfall::Fail,
            max_replica_lag_ms: 30_000,
            cell_cache_bytes: 256 << 20,
            notify: true,
            wake_poll_ms: 50,
            clusters: Vec::new(),
            shards: BTreeMap::new(),
            max_connections: 16,
            maintenance_connections: 4,
            timeout_ms: 5_000,
            readiness_timeout_ms: 2_000,
            breaker: BreakerConfig::default(),
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
///
/// ```yaml
/// { first: 0, last: 2047, cluster: main }
/// ```
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShardRange {
    /// First shard of the range.
    pub first: u32,
    /// Last shard of the range, included.
    pub last: u32,
    /// Name of the cluster that holds the range.
    pub cluster: String,
}

impl StorageConfig {
    /// The timeouts of every database connection (`timeout_ms`).
    pub fn timeouts(&self) -> crate::storage::Timeouts {
        let timeout = std::time::Duration::from_millis(self.timeout_ms);
        crate::storage::Timeouts {
            acquire: timeout,
            statement: timeout,
        }
    }

    /// The settings of the request pools of `cluster`'s databases.
    pub(crate) fn connect_options(&self, cluster: &str) -> crate::storage::ConnectOptions {
        let timeouts = self.timeouts();
        crate::storage::ConnectOptions {
            cluster: cluster.to_string(),
            max_connections: self.max_connections,
            acquire_timeout: timeouts.acquire,
            statement_timeout: timeouts.statement,
            background: false,
        }
    }

    /// How long `GET /readyz` waits (`readiness_timeout_ms`).
    pub fn readiness_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.readiness_timeout_ms)
    }

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

/// The shard map of every datastore from the configured ranges (or an even
/// split over the clusters).
pub(crate) fn shard_maps(
    defs: &Definitions,
    config: &StorageConfig,
) -> Result<HashMap<String, ShardMap>> {
    let cluster_index: HashMap<&str, usize> = config
        .clusters
        .iter()
        .enumerate()
        .map(|(i, c)| (c.name.as_str(), i))
        .collect();
    let mut maps = HashMap::new();
    for def in &defs.datastores {
        let map = match config.shards.get(&def.name) {
            None => ShardMap::even(def.shards, config.clusters.len()),
            Some(ranges) => {
                let mut resolved = Vec::new();
                for range in ranges {
                    let cluster = *cluster_index.get(range.cluster.as_str()).ok_or_else(|| {
                        Error::Config(format!(
                            "shard range of `{}` names unknown cluster `{}`",
                            def.name, range.cluster
                        ))
                    })?;
                    resolved.push((range.first, range.last, cluster));
                }
                ShardMap::from_ranges(def.shards, &resolved)
                    .map_err(|e| Error::Config(format!("datastore `{}`: {e}", def.name)))?
            }
        };
        maps.insert(def.name.clone(), map);
    }
    for name in config.shards.keys() {
        if !maps.contains_key(name) {
            return Err(Error::Config(format!(
                "shard ranges given for unknown datastore `{name}`"
            )));
        }
    }
    Ok(maps)
}
