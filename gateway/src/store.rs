//! The [`Store`]: definitions, storage clusters and shard routing put
//! together, and the entry point of the Rust API.
//!
//! A `Store` is cheap to clone. It owns one [`Backend`] per database, knows
//! which cluster holds each shard of each datastore, creates a shard's tables
//! the first time the shard is used (recording it in the cluster's
//! `cellgate_shards` registry with a fingerprint of its DDL, so a new index
//! file adds its tables to existing shards), and runs the index maintainer in
//! the background. Cell reads and writes are in `cells/`, index queries and
//! maintenance in `indexes/`; both are `impl Store` blocks.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use chrono::Utc;
use index_dsl::{Datastore, Definitions};

use crate::config::StorageConfig;
use crate::error::{Error, Result};
use crate::indexes::maintainer::{self, Maintainer};
use crate::shards::ShardMap;
use crate::storage::{self, ddl, Backend, ColType, ConnectOptions, Dialect, Sql, Value};

/// How a store is opened.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    pub storage: StorageConfig,
    /// Run index maintenance in the background (the normal mode). Tests
    /// turn it off to leave cells unindexed, as a crash would.
    pub maintain_indexes: bool,
    /// Largest number of cells in one put.
    pub max_batch: usize,
}

impl StoreOptions {
    pub fn new(storage: StorageConfig) -> StoreOptions {
        StoreOptions {
            storage,
            maintain_indexes: true,
            max_batch: 1000,
        }
    }
}

/// Handle to the cell store.
#[derive(Clone)]
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) defs: Definitions,
    pub(crate) datastores: HashMap<String, Arc<DatastoreRuntime>>,
    pub(crate) clusters: Vec<Cluster>,
    pub(crate) buffer_count: usize,
    pub(crate) max_batch: usize,
    /// Table sets known to exist (and, for shards, to match the
    /// definitions), keyed by datastore, shard, cluster and which set.
    ready: Mutex<HashSet<(String, u32, usize, TableSet)>>,
    /// Serializes DDL in this process: concurrent `CREATE TABLE IF NOT
    /// EXISTS` of one table can fail on PostgreSQL.
    ddl_lock: tokio::sync::Mutex<()>,
    pub(crate) maintainer: Maintainer,
}

/// Counters of one datastore since the process started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatastoreMetrics {
    pub name: String,
    pub cells_written: u64,
    /// Writes answered as duplicates of stored cells.
    pub cells_duplicate: u64,
}

/// A snapshot for monitoring.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreMetrics {
    pub datastores: Vec<DatastoreMetrics>,
    /// Delay from cell commit to index update since start, in microseconds:
    /// `(quantile, value)` for 0.5, 0.9, 0.99 and 1.0, plus the sample count.
    pub index_delay_us: (Vec<(f64, u64)>, u64),
    /// Shards with index work outstanding: datastore, shard, age in ms of
    /// the oldest unapplied write seen by this process.
    pub index_lag_ms: Vec<(String, u32, u64)>,
}

/// Which tables of a shard a cluster holds: all of them on the shard's
/// primary, only the buffer table on a secondary that buffers its writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum TableSet {
    Shard,
    Buffer,
}

/// One storage cluster.
pub(crate) struct Cluster {
    pub(crate) master: Arc<dyn Backend>,
    /// Opened at start-up so a malformed replica URL stops the gateway
    /// there. Reads do not use replicas yet: replica reads and failover to
    /// them are not built.
    #[allow(dead_code)]
    pub(crate) replicas: Vec<Arc<dyn Backend>>,
}

/// A datastore's definition with its routing.
pub(crate) struct DatastoreRuntime {
    pub(crate) def: Datastore,
    pub(crate) map: ShardMap,
    /// Cells stored by this process, for metrics.
    pub(crate) cells_written: std::sync::atomic::AtomicU64,
    /// Cells refused or found identical, for metrics.
    pub(crate) cells_duplicate: std::sync::atomic::AtomicU64,
}

impl DatastoreRuntime {
    /// Fails with `UNKNOWN_COLUMN`, listing the declared columns, unless
    /// `column` is one of them.
    pub(crate) fn check_column(&self, column: &str) -> Result<()> {
        if self.def.column(column).is_some() {
            return Ok(());
        }
        let expected: Vec<&str> = self.def.columns.iter().map(|c| c.name.as_str()).collect();
        Err(Error::UnknownColumn {
            datastore: self.def.name.clone(),
            column: column.to_string(),
            expected: expected.join(", "),
        })
    }
}

impl Store {
    /// Connects to every database of the topology, creates the cluster
    /// tables, and starts index maintenance (which first catches up on any
    /// cells written but not yet indexed, e.g. before a crash).
    pub async fn open(defs: Definitions, options: StoreOptions) -> Result<Store> {
        let config = &options.storage;
        if config.clusters.is_empty() {
            return Err(Error::Config("no storage cluster configured".into()));
        }
        let mut clusters = Vec::new();
        for cluster in &config.clusters {
            let connect = ConnectOptions {
                cluster: cluster.name.clone(),
                max_connections: config.max_connections,
                ..ConnectOptions::default()
            };
            let master = storage::connect(&cluster.master, &connect).await?;
            let mut replicas = Vec::new();
            for url in &cluster.replicas {
                replicas.push(storage::connect(url, &connect).await?);
            }
            clusters.push(Cluster { master, replicas });
        }
        if config.buffer_count > 0 && clusters.len() < 2 {
            return Err(Error::Config(
                "buffer_count > 0 needs at least two clusters".into(),
            ));
        }
        let cluster_index: HashMap<&str, usize> = config
            .clusters
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.as_str(), i))
            .collect();
        let mut datastores = HashMap::new();
        for def in &defs.datastores {
            let map = match config.shards.get(&def.name) {
                None => ShardMap::even(def.shards, clusters.len()),
                Some(ranges) => {
                    let mut resolved = Vec::new();
                    for range in ranges {
                        let cluster =
                            *cluster_index.get(range.cluster.as_str()).ok_or_else(|| {
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
            datastores.insert(
                def.name.clone(),
                Arc::new(DatastoreRuntime {
                    def: def.clone(),
                    map,
                    cells_written: Default::default(),
                    cells_duplicate: Default::default(),
                }),
            );
        }
        for name in config.shards.keys() {
            if !datastores.contains_key(name) {
                return Err(Error::Config(format!(
                    "shard ranges given for unknown datastore `{name}`"
                )));
            }
        }
        let (maintainer, wakeups) = Maintainer::new();
        let inner = Arc::new(Inner {
            defs,
            datastores,
            clusters,
            buffer_count: config.buffer_count,
            max_batch: options.max_batch,
            ready: Mutex::new(HashSet::new()),
            ddl_lock: tokio::sync::Mutex::new(()),
            maintainer,
        });
        let store = Store { inner };
        let existing = store.load_registry().await?;
        if options.maintain_indexes {
            for (datastore, shard) in existing {
                store.inner.maintainer.wake(&datastore, shard);
            }
            let weak: Weak<Inner> = Arc::downgrade(&store.inner);
            tokio::spawn(maintainer::run(weak, wakeups));
        }
        Ok(store)
    }

    /// The definitions the store serves.
    pub fn definitions(&self) -> &Definitions {
        &self.inner.defs
    }

    /// Checks every master answers.
    pub async fn ping(&self) -> Result<()> {
        for cluster in &self.inner.clusters {
            cluster.master.ping().await?;
        }
        Ok(())
    }

    /// A snapshot of the store's counters and index lag, for `/metrics`.
    pub fn metrics(&self) -> StoreMetrics {
        use std::sync::atomic::Ordering::Relaxed;
        let mut datastores: Vec<DatastoreMetrics> = self
            .inner
            .datastores
            .values()
            .map(|ds| DatastoreMetrics {
                name: ds.def.name.clone(),
                cells_written: ds.cells_written.load(Relaxed),
                cells_duplicate: ds.cells_duplicate.load(Relaxed),
            })
            .collect();
        datastores.sort_by(|a, b| a.name.cmp(&b.name));
        let (index_delay_us, index_lag_ms) = self.inner.maintainer.snapshot();
        StoreMetrics {
            datastores,
            index_delay_us,
            index_lag_ms,
        }
    }

    /// Where the shards of `datastore` live: contiguous `(first, last,
    /// cluster name)` ranges. Empty for an unknown datastore.
    pub fn topology(&self, datastore: &str) -> Vec<(u32, u32, String)> {
        let Ok(ds) = self.datastore(datastore) else {
            return Vec::new();
        };
        let mut ranges: Vec<(u32, u32, String)> = Vec::new();
        for shard in 0..ds.def.shards {
            let cluster = self.inner.clusters[ds.map.cluster_of(shard)]
                .master
                .cluster();
            match ranges.last_mut() {
                Some(last) if last.2 == cluster && last.1 + 1 == shard => last.1 = shard,
                _ => ranges.push((shard, shard, cluster.to_string())),
            }
        }
        ranges
    }

    pub(crate) fn datastore(&self, name: &str) -> Result<Arc<DatastoreRuntime>> {
        self.inner
            .datastores
            .get(name)
            .cloned()
            .ok_or_else(|| Error::UnknownDatastore(name.to_string()))
    }

    /// The master of the cluster that holds `shard` of `ds`.
    pub(crate) fn master(&self, ds: &DatastoreRuntime, shard: u32) -> &Arc<dyn Backend> {
        &self.inner.clusters[ds.map.cluster_of(shard)].master
    }

    /// Every shard of a datastore whose tables exist, across the reachable
    /// clusters.
    pub async fn existing_shards(&self, datastore: &str) -> Result<Vec<u32>> {
        let ds = self.datastore(datastore)?;
        let mut shards = Vec::new();
        for (i, cluster) in self.inner.clusters.iter().enumerate() {
            let mut sql = Sql::new(cluster.master.dialect());
            sql.push("SELECT ")
                .ident("shard")
                .push(" FROM ")
                .ident(ddl::REGISTRY_TABLE)
                .push(" WHERE ")
                .ident("datastore")
                .push(" = ")
                .bind(Value::Text(ds.def.name.clone()));
            let rows = match cluster.master.fetch(&sql, &[ColType::Int]).await {
                Ok(rows) => rows,
                Err(err @ Error::Unavailable { .. }) => {
                    tracing::warn!(datastore, error = %err, "skipping an unreachable cluster");
                    continue;
                }
                Err(err) => return Err(err),
            };
            for row in rows {
                let shard = row[0].as_int().unwrap_or(-1);
                if shard >= 0 && ds.map.cluster_of(shard as u32) == i {
                    shards.push(shard as u32);
                }
            }
        }
        shards.sort_unstable();
        Ok(shards)
    }

    /// Creates every reachable cluster's registry and reads it; returns the
    /// shards that exist. An unreachable cluster is logged and skipped: its
    /// shards fail their own requests until it is back, and its registry is
    /// created with its first shard.
    async fn load_registry(&self) -> Result<Vec<(String, u32)>> {
        for (index, cluster) in self.inner.clusters.iter().enumerate() {
            let ready = async {
                self.ensure_registry(cluster.master.as_ref()).await?;
                self.load_ready(index).await
            };
            match ready.await {
                Ok(()) => {}
                Err(err @ Error::Unavailable { .. }) => {
                    tracing::warn!(cluster = %cluster.master.cluster(), error = %err, "storage cluster unreachable at start-up");
                }
                Err(err) => return Err(err),
            }
        }
        let mut existing = Vec::new();
        for ds in self.inner.datastores.values() {
            match self.existing_shards(&ds.def.name).await {
                Ok(shards) => existing.extend(shards.into_iter().map(|s| (ds.def.name.clone(), s))),
                Err(err @ Error::Unavailable { .. }) => {
                    tracing::warn!(datastore = %ds.def.name, error = %err, "cannot list shards; their indexes catch up on the next write");
                }
                Err(err) => return Err(err),
            }
        }
        Ok(existing)
    }

    async fn ensure_registry(&self, backend: &dyn Backend) -> Result<()> {
        for stmt in ddl::cluster_ddl(backend.dialect()) {
            backend.execute(&raw(backend.dialect(), &stmt)).await?;
        }
        Ok(())
    }

    /// Makes sure the tables of `shard` exist on its cluster and match the
    /// current definitions.
    pub(crate) async fn ensure_shard(&self, ds: &DatastoreRuntime, shard: u32) -> Result<()> {
        let cluster = ds.map.cluster_of(shard);
        self.ensure_tables(ds, shard, cluster, false).await
    }

    /// Makes sure `cluster` has the buffer table of `shard`.
    pub(crate) async fn ensure_buffer(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        cluster: usize,
    ) -> Result<()> {
        self.ensure_tables(ds, shard, cluster, true).await
    }

    async fn ensure_tables(
        &self,
        ds: &DatastoreRuntime,
        shard: u32,
        cluster: usize,
        buffer_only: bool,
    ) -> Result<()> {
        let set = if buffer_only {
            TableSet::Buffer
        } else {
            TableSet::Shard
        };
        let key = (ds.def.name.clone(), shard, cluster, set);
        if self.inner.ready.lock().expect("ready set").contains(&key) {
            return Ok(());
        }
        let _guard = self.inner.ddl_lock.lock().await;
        if self.inner.ready.lock().expect("ready set").contains(&key) {
            return Ok(());
        }
        let backend = &self.inner.clusters[cluster].master;
        self.ensure_registry(backend.as_ref()).await?;
        if buffer_only {
            let dialect = backend.dialect();
            for stmt in ddl::buffer_ddl(dialect, &ds.def.name, shard) {
                backend.execute(&raw(dialect, &stmt)).await?;
            }
            self.inner.ready.lock().expect("ready set").insert(key);
        } else {
            self.create_shards(ds, cluster, &[shard]).await?;
        }
        Ok(())
    }

    /// Creates (or completes, after a definition change) the tables of
    /// `shards`, all on `cluster`, in one transaction, and registers them.
    /// One transaction matters on SQLite: every committed schema change makes
    /// each other connection re-read the whole schema.
    async fn create_shards(
        &self,
        ds: &DatastoreRuntime,
        cluster: usize,
        shards: &[u32],
    ) -> Result<()> {
        let backend = &self.inner.clusters[cluster].master;
        let dialect = backend.dialect();
        let fingerprint = shape_fingerprint(dialect, &ds.def);
        let mut tx = backend.begin().await?;
        for &shard in shards {
            for stmt in ddl::shard_ddl(dialect, &ds.def, shard) {
                tx.execute(&raw(dialect, &stmt)).await?;
            }
            let (seed_meta, register) = ddl::shard_seed(dialect, &ds.def.name, shard);
            let seed = vec![Value::Int(1), Value::Int(0)];
            tx.execute(&with_params(dialect, &seed_meta, seed)).await?;
            let registration = vec![
                Value::Text(ds.def.name.clone()),
                Value::Int(i64::from(shard)),
                Value::DateTime(Utc::now()),
            ];
            tx.execute(&with_params(dialect, &register, registration))
                .await?;
            let mut update = Sql::new(dialect);
            update
                .push("UPDATE ")
                .ident(ddl::REGISTRY_TABLE)
                .push(" SET ")
                .ident("schema_hash")
                .push(" = ")
                .bind(Value::Text(fingerprint.clone()))
                .push(" WHERE ")
                .ident("datastore")
                .push(" = ")
                .bind(Value::Text(ds.def.name.clone()))
                .push(" AND ")
                .ident("shard")
                .push(" = ")
                .bind(Value::Int(i64::from(shard)));
            tx.execute(&update).await?;
        }
        tx.commit().await?;
        let mut ready = self.inner.ready.lock().expect("ready set");
        for &shard in shards {
            ready.insert((ds.def.name.clone(), shard, cluster, TableSet::Shard));
        }
        Ok(())
    }

    /// Marks the registered shards whose tables match the definitions as
    /// ready, so they need no DDL.
    async fn load_ready(&self, cluster: usize) -> Result<()> {
        let backend = &self.inner.clusters[cluster].master;
        let dialect = backend.dialect();
        let mut sql = Sql::new(dialect);
        sql.push("SELECT ")
            .ident("datastore")
            .push(", ")
            .ident("shard")
            .push(", ")
            .ident("schema_hash")
            .push(" FROM ")
            .ident(ddl::REGISTRY_TABLE);
        let rows = backend
            .fetch(&sql, &[ColType::Text, ColType::Int, ColType::Text])
            .await?;
        let mut ready = self.inner.ready.lock().expect("ready set");
        for row in rows {
            let (Some(name), Some(shard), Some(hash)) =
                (row[0].as_text(), row[1].as_int(), row[2].as_text())
            else {
                continue;
            };
            if let Some(ds) = self.inner.datastores.get(name) {
                if hash == shape_fingerprint(dialect, &ds.def) {
                    ready.insert((name.to_string(), shard as u32, cluster, TableSet::Shard));
                }
            }
        }
        Ok(())
    }

    /// Creates the tables of every shard of every datastore up front (the
    /// `migrate --all-shards` path), reporting progress through `progress`.
    /// Shards are created in batches, one transaction each.
    pub async fn create_all_shards(&self, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        const BATCH: usize = 64;
        let total: u64 = self
            .inner
            .datastores
            .values()
            .map(|d| u64::from(d.def.shards))
            .sum();
        let mut done = 0;
        let mut names: Vec<_> = self.inner.datastores.keys().cloned().collect();
        names.sort();
        for name in names {
            let ds = self.datastore(&name)?;
            for cluster in 0..self.inner.clusters.len() {
                self.ensure_registry(self.inner.clusters[cluster].master.as_ref())
                    .await?;
                let missing: Vec<u32> = {
                    let ready = self.inner.ready.lock().expect("ready set");
                    (0..ds.def.shards)
                        .filter(|s| ds.map.cluster_of(*s) == cluster)
                        .filter(|s| !ready.contains(&(name.clone(), *s, cluster, TableSet::Shard)))
                        .collect()
                };
                let owned = (0..ds.def.shards)
                    .filter(|s| ds.map.cluster_of(*s) == cluster)
                    .count() as u64;
                done += owned - missing.len() as u64;
                progress(done, total);
                for chunk in missing.chunks(BATCH) {
                    let _guard = self.inner.ddl_lock.lock().await;
                    self.create_shards(&ds, cluster, chunk).await?;
                    done += chunk.len() as u64;
                    progress(done, total);
                }
            }
        }
        Ok(())
    }
}

/// A fingerprint of a datastore's table shapes in a dialect: equal for all
/// shards, different as soon as an index or column type changes.
fn shape_fingerprint(dialect: Dialect, def: &Datastore) -> String {
    let statements = ddl::shard_ddl(dialect, def, 0);
    format!(
        "{:016x}",
        xxhash_rust::xxh3::xxh3_64(statements.join(";").as_bytes())
    )
}

/// A statement without parameters.
pub(crate) fn raw(dialect: Dialect, text: &str) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push(text);
    sql
}

/// A statement whose placeholders are already in `text`, with its values.
pub(crate) fn with_params(dialect: Dialect, text: &str, values: Vec<Value>) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push(text);
    sql.set_params(values);
    sql
}

/// Waits a little before retrying a transaction that lost a race; the
/// delay grows with the attempt and is jittered so racers spread out.
pub(crate) async fn backoff(attempt: u32) {
    use rand::Rng;
    let base = 2u64 << attempt.min(6);
    let jitter = rand::thread_rng().gen_range(0..=base);
    tokio::time::sleep(std::time::Duration::from_millis(base + jitter)).await;
}
