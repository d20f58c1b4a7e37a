//! Reads from replicas: per-read consistency, read-your-writes tokens, and
//! the replica lag they are judged by.
//!
//! A read is served by its cluster's master unless it allows a replica
//! ([`ReadOptions`]): with [`Consistency::Replica`], or with a
//! [`ReadToken`] from an earlier write. Then `read_on` picks a replica
//! whose circuit breaker is closed and whose lag is within
//! `storage.max_replica_lag_ms`; with a token it also checks, in one
//! statement, that the replica has applied every `added_id` the token
//! names for the cluster's shards (the `<ds>_shards` counters replicate
//! with the cells they number), and otherwise reads the master. So a read
//! given the token of a write never misses that write, however far behind
//! a replica is. A master whose breaker is open fails reads over to a
//! healthy replica at once (possibly stale; the read says so through
//! [`ReadOptions::served`]), and a read the master fails (refused, timed
//! out) is tried once on a replica before its error is returned; a read
//! with a token goes to a replica only if it has applied the token, even
//! then. Index entries are judged by lag only (`ReadOptions::for_index`).
//!
//! **Lag** (`monitor`): every half second, per datastore, the sum of the
//! shard counters on the master and on each replica: the difference is the
//! cells a replica is behind, and the time since the master last had no
//! more than the replica has now is its lag in time.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use rand::seq::SliceRandom;

use crate::error::{Error, Result};
use crate::storage::breaker::BreakerState;
use crate::storage::{ddl, Backend, Sql, Value, MAX_PARAMS};
pub use crate::topology::ReplicaLag;
use crate::topology::{Cluster, DatastoreRuntime, Topology};

/// Where a read may be served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Consistency {
    /// The master (read-your-writes); a replica only when the master's
    /// breaker is open.
    #[default]
    Master,
    /// Any healthy replica within the lag limit; the master when none is.
    Replica,
}

/// What a write created, per touched shard the highest `added_id`: a read
/// given it is served only by a node that has applied all of them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ReadToken {
    pub datastore: String,
    /// `shard → added_id`.
    pub positions: BTreeMap<u32, i64>,
}

const TOKEN_PREFIX: &str = "rt1.";

impl ReadToken {
    /// The opaque text form given to clients.
    pub fn encode(&self) -> String {
        let mut text = self.datastore.clone();
        for (shard, added_id) in &self.positions {
            text.push_str(&format!(" {shard}:{added_id}"));
        }
        format!(
            "{TOKEN_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(text)
        )
    }

    /// Parses [`ReadToken::encode`]'s form; `BAD_USER_INPUT` otherwise.
    pub fn decode(token: &str) -> Result<ReadToken> {
        let bad = || Error::BadInput("readAfter is not a read token of this gateway".into());
        let body = token.strip_prefix(TOKEN_PREFIX).ok_or_else(bad)?;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| bad())?;
        let text = String::from_utf8(bytes).map_err(|_| bad())?;
        let mut parts = text.split(' ');
        let datastore = parts.next().filter(|d| !d.is_empty()).ok_or_else(bad)?;
        let mut positions = BTreeMap::new();
        for part in parts {
            let (shard, added_id) = part.split_once(':').ok_or_else(bad)?;
            positions.insert(
                shard.parse().map_err(|_| bad())?,
                added_id.parse().map_err(|_| bad())?,
            );
        }
        Ok(ReadToken {
            datastore: datastore.to_string(),
            positions,
        })
    }

    /// Adds a write's shard heads.
    pub(crate) fn extend(&mut self, heads: impl IntoIterator<Item = (u32, i64)>) {
        for (shard, added_id) in heads {
            let entry = self.positions.entry(shard).or_insert(added_id);
            *entry = (*entry).max(added_id);
        }
    }
}

/// How one read may be served, and (filled in by the store) which nodes
/// served it.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    pub consistency: Consistency,
    /// A token from an earlier write: the read may go to a replica that
    /// has applied it (and to the master otherwise).
    pub after: Option<ReadToken>,
    /// The replicas that served parts of the read, as `cluster/replica<i>`,
    /// each with whether it may be stale (no token vouched for it).
    pub served: Arc<Mutex<BTreeMap<String, bool>>>,
}

impl ReadOptions {
    /// Reads that may go to a replica.
    pub(crate) fn wants_replica(&self) -> bool {
        self.consistency == Consistency::Replica || self.after.is_some()
    }

    /// Notes a replica that served part of the read. A node that served
    /// several parts may be stale if any of them may be.
    fn record(&self, cluster: &Cluster, replica: usize, stale: bool) {
        *self
            .served
            .lock()
            .expect("served")
            .entry(format!("{}/replica{replica}", cluster.name))
            .or_insert(false) |= stale;
    }

    /// The replicas that served this read (empty: masters only).
    pub fn served_by(&self) -> BTreeMap<String, bool> {
        self.served.lock().expect("served").clone()
    }

    /// The shards of `datastore` the token names: a read that must see
    /// the token's cells whichever rows it finds (one statement reading
    /// index entries and their rows' cells) is routed for all of them.
    pub(crate) fn token_shards(&self, datastore: &str) -> BTreeSet<u32> {
        self.after
            .iter()
            .filter(|token| token.datastore == datastore)
            .flat_map(|token| token.positions.keys().copied())
            .collect()
    }

    /// These options for a read of index entries: the token is left out,
    /// since entries follow their cells after the commit and a token
    /// cannot vouch for them on a replica (on the master they are as fresh
    /// as they get). `Replica` still allows a replica within the lag limit.
    pub(crate) fn for_index(&self) -> ReadOptions {
        ReadOptions {
            consistency: self.consistency,
            after: None,
            served: self.served.clone(),
        }
    }
}

/// How often lag is measured.
const MEASURE_EVERY: Duration = Duration::from_millis(500);
/// How much history of the master's counters is kept to judge lag in time.
const HISTORY: Duration = Duration::from_secs(120);

fn healthy(backend: &Arc<dyn Backend>) -> bool {
    backend
        .breaker()
        .is_none_or(|b| b.state != BreakerState::Open)
}

/// Runs `op` on the node `read` allows for `shards` of `cluster` (see
/// [`route`]); a replica that fails transiently is replaced by the master
/// (whose breaker, if open, fails it at once).
pub(crate) async fn read_on<T, F, Fut>(
    topology: &Topology,
    ds: &DatastoreRuntime,
    cluster: usize,
    shards: &BTreeSet<u32>,
    read: &ReadOptions,
    op: F,
) -> Result<T>
where
    F: Fn(Arc<dyn Backend>) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let node = &topology.clusters[cluster];
    let master = node.master()?;
    // A gateway that may have missed a move checks each node it reads
    // serves the shards first (`topology/fence.rs`).
    let op = |backend: Arc<dyn Backend>| {
        let op = &op;
        async move {
            crate::topology::fence::check(topology, ds, cluster, shards, backend.as_ref()).await?;
            op(backend).await
        }
    };
    let Some((replica, stale)) =
        route(topology, ds, cluster, shards, read, healthy(master)).await?
    else {
        let err = match op(master.clone()).await {
            Err(err) if err.is_transient() && !node.replicas.is_empty() => err,
            done => return done,
        };
        // A read is idempotent: one the master failed is tried once on a
        // replica, as if the master's breaker were open already (a token
        // still has to be applied there).
        let Ok(Some((replica, stale))) = route(topology, ds, cluster, shards, read, false).await
        else {
            return Err(err);
        };
        tracing::debug!(cluster = %node.name, replica, error = %err, "master read failed; reading a replica");
        return match op(node.replicas[replica].clone()).await {
            Ok(found) => {
                read.record(node, replica, stale);
                Ok(found)
            }
            Err(_) => Err(err),
        };
    };
    match op(node.replicas[replica].clone()).await {
        Ok(found) => {
            read.record(node, replica, stale);
            Ok(found)
        }
        // Whatever the replica's trouble (unreachable, a query cancelled by
        // a conflict with recovery, a table it has not replayed yet), the
        // master answers for it.
        Err(err) if err.is_transient() || matches!(err, Error::Storage(_)) => {
            tracing::debug!(cluster = %node.name, replica, error = %err, "replica read failed; reading the master");
            op(master.clone()).await
        }
        Err(err) => Err(err),
    }
}

/// The replica to read `ds` on `cluster` from, for a read touching
/// `shards` of that cluster, with whether it may be stale; `None` for the
/// master.
async fn route(
    topology: &Topology,
    ds: &DatastoreRuntime,
    cluster: usize,
    shards: &BTreeSet<u32>,
    read: &ReadOptions,
    master_healthy: bool,
) -> Result<Option<(usize, bool)>> {
    let node = &topology.clusters[cluster];
    if node.replicas.is_empty() || (master_healthy && !read.wants_replica()) {
        return Ok(None);
    }
    let mut candidates: Vec<usize> = (0..node.replicas.len())
        .filter(|r| healthy(&node.replicas[*r]))
        .collect();
    candidates.shuffle(&mut rand::thread_rng());
    if !master_healthy && !read.wants_replica() {
        // Failover: any replica that answers, stale or not; one whose own
        // breaker is open is tried last (its breaker lets a probe through
        // once its cool-down has passed, else fails at once).
        let first = candidates.first().copied().or_else(|| {
            let all: Vec<usize> = (0..node.replicas.len()).collect();
            all.choose(&mut rand::thread_rng()).copied()
        });
        return Ok(first.map(|replica| (replica, true)));
    }
    let wanted: Vec<(u32, i64)> = read
        .after
        .iter()
        .filter(|token| token.datastore == ds.name())
        .flat_map(|token| token.positions.iter())
        .filter(|(shard, _)| shards.contains(shard))
        .map(|(shard, added_id)| (*shard, *added_id))
        .collect();
    let limit = topology.max_replica_lag;
    for &replica in &candidates {
        let backend = &node.replicas[replica];
        if !wanted.is_empty() {
            match applied(backend.as_ref(), ds.name(), &wanted).await {
                Ok(true) => return Ok(Some((replica, false))),
                Ok(false) => continue,
                Err(err) => {
                    tracing::debug!(cluster = %node.name, replica, error = %err, "replica cannot check a read token");
                    continue;
                }
            }
        }
        if topology.lags.within(cluster, replica, limit) {
            return Ok(Some((replica, true)));
        }
    }
    // A `REPLICA` read whose master is down: lag is measured against the
    // master, so none can be judged, and the master cannot serve it; a
    // replica that answers does, possibly stale. A token still has to be
    // applied where it is read.
    if !master_healthy && read.consistency == Consistency::Replica && wanted.is_empty() {
        return Ok(candidates.first().map(|replica| (*replica, true)));
    }
    Ok(None)
}

/// Whether `replica` has applied every `(shard, added_id)` of `wanted`:
/// its shard counters are past them.
async fn applied(replica: &dyn Backend, datastore: &str, wanted: &[(u32, i64)]) -> Result<bool> {
    let applied = applied_shards(replica, datastore, wanted).await?;
    Ok(wanted.iter().all(|(shard, _)| applied.contains(shard)))
}

/// The shards of `wanted` whose `added_id` `replica` has applied: its
/// counter of the shard is past it (the counters replicate with the cells
/// they number). One statement per [`MAX_PARAMS`] shards.
pub(crate) async fn applied_shards(
    replica: &dyn Backend,
    datastore: &str,
    wanted: &[(u32, i64)],
) -> Result<BTreeSet<u32>> {
    let mut applied = BTreeSet::new();
    for chunk in wanted.chunks(MAX_PARAMS) {
        let next = shard_counters(replica, datastore, chunk).await?;
        applied.extend(
            chunk
                .iter()
                .filter(|(shard, added_id)| {
                    next.get(&i64::from(*shard))
                        .is_some_and(|next| next.abs() > *added_id)
                })
                .map(|(shard, _)| *shard),
        );
    }
    Ok(applied)
}

async fn shard_counters(
    replica: &dyn Backend,
    datastore: &str,
    wanted: &[(u32, i64)],
) -> Result<HashMap<i64, i64>> {
    let mut sql = Sql::new(replica.dialect());
    sql.push("SELECT ")
        .idents(["shard", "next_added_id"])
        .push(" FROM ")
        .ident(&ddl::shards_table(datastore))
        .push(" WHERE ")
        .ident("shard")
        .in_list(wanted.iter().map(|(s, _)| Value::Int(i64::from(*s))));
    Ok(replica
        .rows::<(i64, i64)>(&sql)
        .await?
        .into_iter()
        .collect())
}

/// The sum of `datastore`'s shard counters on one node. (`cells::log_length`
/// reads the same sum less one per shard; `cells` uses this module, so this
/// one keeps its own statement.)
async fn counters(backend: &dyn Backend, datastore: &str) -> Result<i64> {
    let dialect = backend.dialect();
    let integer = dialect.integer_cast();
    let mut sql = Sql::new(dialect);
    // SUM of a BIGINT is a NUMERIC (DECIMAL) on PostgreSQL and MySQL.
    sql.push("SELECT CAST(COALESCE(SUM(ABS(")
        .ident("next_added_id")
        .push(&format!(")), 0) AS {integer}) FROM "))
        .ident(&ddl::shards_table(datastore));
    Ok(backend
        .first_row::<(i64,)>(&sql)
        .await?
        .map_or(0, |(sum,)| sum))
}

/// Measures replica lag until `stopped` (see the module doc).
pub(crate) async fn monitor(
    topology: Arc<Topology>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    // `(cluster, datastore) →` the master's counter sums over time.
    let mut history: HashMap<(usize, String), VecDeque<(Instant, i64)>> = HashMap::new();
    while !*stopped.borrow() {
        for (c, cluster) in topology.clusters.iter().enumerate() {
            if cluster.replicas.is_empty() {
                continue;
            }
            let Ok(master) = cluster.master() else {
                continue;
            };
            let mut behind = vec![(0i64, 0u64, true); cluster.replicas.len()];
            for ds in topology.defined().datastores.values() {
                let head = match counters(master.as_ref(), ds.name()).await {
                    Ok(head) => head,
                    Err(err) => {
                        tracing::debug!(cluster = %cluster.name, error = %err, "cannot read the master's shard counters");
                        // Still ask the replicas: that probes their
                        // breakers, so a replica that is back is found
                        // while the master is down.
                        for replica in &cluster.replicas {
                            let _ = counters(replica.as_ref(), ds.name()).await;
                        }
                        behind.iter_mut().for_each(|b| b.2 = false);
                        continue;
                    }
                };
                let now = Instant::now();
                let past = history.entry((c, ds.name().to_string())).or_default();
                past.push_back((now, head));
                while past.front().is_some_and(|(t, _)| now - *t > HISTORY) {
                    past.pop_front();
                }
                for (r, replica) in cluster.replicas.iter().enumerate() {
                    let applied = match counters(replica.as_ref(), ds.name()).await {
                        Ok(applied) => applied,
                        Err(err) => {
                            tracing::debug!(cluster = %cluster.name, replica = r, error = %err, "cannot measure a replica's lag");
                            behind[r].2 = false;
                            continue;
                        }
                    };
                    let cells = (head - applied).max(0);
                    // The replica has what the master had at the latest
                    // sample whose sum it reaches.
                    let lag = if cells == 0 {
                        Duration::ZERO
                    } else {
                        past.iter()
                            .rev()
                            .find(|(_, sum)| *sum <= applied)
                            .map_or(HISTORY, |(t, _)| now - *t)
                    };
                    behind[r].0 += cells;
                    behind[r].1 = behind[r].1.max(lag.as_millis() as u64);
                }
            }
            let measured = behind
                .into_iter()
                .enumerate()
                .map(|(r, (cells, lag_ms, measured))| {
                    measured.then(|| ReplicaLag {
                        cluster: cluster.name.clone(),
                        node: format!("replica{r}"),
                        cells_behind: cells,
                        lag_ms,
                    })
                })
                .collect();
            topology.lags.record(c, measured);
        }
        tokio::select! {
            _ = tokio::time::sleep(MEASURE_EVERY) => {}
            // A shutdown, or the store dropped.
            _ = stopped.changed() => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_tokens_round_trip_and_refuse_other_text() {
        let mut token = ReadToken {
            datastore: "trips".into(),
            ..ReadToken::default()
        };
        token.extend([(7, 3), (4095, 12), (7, 9), (7, 5)]);
        assert_eq!(token.positions, BTreeMap::from([(7, 9), (4095, 12)]));
        let text = token.encode();
        assert!(text.starts_with("rt1."), "{text}");
        assert_eq!(ReadToken::decode(&text).unwrap(), token);
        for bad in ["", "rt1.", "rt1.!!", "xx.dHJpcHM", &text[..text.len() - 2]] {
            let err = ReadToken::decode(bad).expect_err(bad);
            assert_eq!(err.code(), "BAD_USER_INPUT", "{bad}");
        }
    }
}
