//! Masters replaced behind their address: a replica promoted in place of a
//! lost master answers as the cluster's master with another identity
//! ([`Dialect::master_identity_query`](crate::storage::Dialect::master_identity_query)),
//! and its log of each shard may end before what was read from the old one.
//!
//! Every [`IDENTITY_EVERY`] each cluster's master identity is read, and so
//! are each replica's identity and shard counters (one statement per
//! datastore). When the master's identity changes:
//! - the followers of the cluster's log (log tails, trigger consumers) are
//!   told the floors from where to read again: the counters last read on
//!   the replica that answers with the new identity, else the lowest of
//!   every replica's (a replica only moves forward, so what it had then it
//!   had when it was promoted); a cluster without replicas has no floor
//!   below the new master's heads. Cells the new master numbers anew are
//!   not skipped; cells between a floor and the old positions come again.
//! - every datastore's indexes are verified and repaired: index entries the
//!   lost master held are gone (index maintenance itself goes on from the
//!   stored offsets, which came with the promoted replica).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::*;
use crate::storage::{Backend, Sql};
use crate::topology::{Cluster, Written};

/// How often the masters' and replicas' identities are read.
const IDENTITY_EVERY: Duration = Duration::from_secs(2);

/// What was last read of a cluster.
#[derive(Default)]
struct Seen {
    master: Option<String>,
    replicas: Vec<ReplicaLog>,
}

/// What a replica had when last read.
#[derive(Default, Clone)]
struct ReplicaLog {
    /// Its identity as the master identity query gives it (a standby may
    /// have none).
    identity: Option<String>,
    /// Per datastore, the last `added_id` of each shard it has.
    heads: HashMap<String, BTreeMap<u32, i64>>,
}

/// Watches the clusters' masters for being replaced (see the module doc).
pub(super) async fn watch_masters(inner: std::sync::Weak<Inner>) {
    let mut seen: Vec<Seen> = Vec::new();
    // Datastores whose repair could not start yet (another verify runs).
    let mut pending: BTreeSet<String> = BTreeSet::new();
    let mut tick = tokio::time::interval(IDENTITY_EVERY);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if *inner.shutdown.borrow() {
            return;
        }
        let topology = &inner.topology;
        seen.resize_with(topology.clusters.len(), Seen::default);
        let mut replaced = false;
        for (cluster, seen) in topology.clusters.iter().zip(seen.iter_mut()) {
            let Ok(master) = cluster.maintenance() else {
                continue;
            };
            let Some(identity) = identity(master.as_ref()).await else {
                continue;
            };
            if seen
                .master
                .as_ref()
                .is_some_and(|before| *before != identity)
            {
                tracing::warn!(cluster = %cluster.name, before = ?seen.master, now = %identity, "another server answers as this cluster's master: its log is followed again from what it had, and the indexes are verified and repaired");
                went_back(
                    topology,
                    cluster,
                    &seen.replicas,
                    &identity,
                    master.as_ref(),
                )
                .await;
                replaced = true;
            }
            seen.master = Some(identity);
            seen.replicas
                .resize_with(cluster.replicas.len(), ReplicaLog::default);
            for (replica, log) in cluster.replicas.iter().zip(seen.replicas.iter_mut()) {
                // A replica that does not answer keeps what it had: its log
                // only grows.
                read_replica(topology, replica.as_ref(), log).await;
            }
        }
        if replaced {
            pending.extend(
                topology
                    .datastores_sorted()
                    .iter()
                    .map(|ds| ds.name().to_string()),
            );
        }
        pending.retain(|datastore| repair(&inner, datastore));
    }
}

/// The identity of the server `backend` reaches; `None` for an embedded
/// file or when it cannot be read.
async fn identity(backend: &dyn Backend) -> Option<String> {
    let query = backend.dialect().master_identity_query()?;
    let mut sql = Sql::new(backend.dialect());
    sql.push(query);
    match backend.first_row::<(String,)>(&sql).await {
        Ok(Some((identity,))) => Some(identity),
        _ => None,
    }
}

async fn read_replica(topology: &Topology, replica: &dyn Backend, log: &mut ReplicaLog) {
    log.identity = identity(replica).await.or(log.identity.take());
    for ds in topology.datastores_sorted() {
        if let Ok(heads) = crate::cells::heads(replica, &ds).await {
            log.heads
                .insert(ds.name().to_string(), heads.into_iter().collect());
        }
    }
}

/// Tells the followers of `cluster`'s log, per datastore, the floors of
/// its shards (see the module doc).
async fn went_back(
    topology: &Topology,
    cluster: &Cluster,
    replicas: &[ReplicaLog],
    identity: &str,
    master: &dyn Backend,
) {
    let promoted = replicas
        .iter()
        .find(|r| r.identity.as_deref() == Some(identity));
    for ds in topology.datastores_sorted() {
        let logs: Vec<&BTreeMap<u32, i64>> = match promoted {
            Some(replica) => replica.heads.get(ds.name()).into_iter().collect(),
            None => replicas
                .iter()
                .filter_map(|r| r.heads.get(ds.name()))
                .collect(),
        };
        let now = if logs.is_empty() {
            // No replica was read: nothing known below the new master's
            // heads now.
            match crate::cells::heads(master, &ds).await {
                Ok(heads) => Some(heads.into_iter().collect::<BTreeMap<u32, i64>>()),
                Err(err) => {
                    tracing::warn!(cluster = %cluster.name, datastore = %ds.name(), error = %err, "cannot read the new master's log heads; followers of the log go on from their positions");
                    continue;
                }
            }
        } else {
            None
        };
        let floor = |shard: u32| match &now {
            Some(heads) => heads.get(&shard).copied().unwrap_or(0),
            None => logs
                .iter()
                .map(|heads| heads.get(&shard).copied().unwrap_or(0))
                .min()
                .unwrap_or(0),
        };
        let floors: Vec<(u32, i64)> = ds
            .map()
            .ranges_of(cluster.index)
            .into_iter()
            .flat_map(|(a, b)| a..=b)
            .map(|shard| (shard, floor(shard)))
            .collect();
        topology.events.written(Written {
            datastore: ds.name().to_string(),
            cluster: cluster.index,
            heads: floors,
            went_back: true,
            ..Written::default()
        });
    }
}

/// Starts the verify and repair of `datastore`'s indexes after a master
/// was replaced; whether to try again at a later tick.
fn repair(inner: &Arc<Inner>, datastore: &str) -> bool {
    let options = crate::indexes::VerifyOptions {
        repair: true,
        restart: true,
        ..crate::indexes::VerifyOptions::default()
    };
    match super::indexes_api::start_verify(inner, datastore, options, false) {
        Ok(_) => false,
        // Another run of this gateway (a scheduled sample) goes first; the
        // repair starts at a later tick.
        Err(_)
            if inner
                .verifier
                .status(datastore)
                .is_some_and(|s| s.state == crate::indexes::VerifyState::Running) =>
        {
            true
        }
        Err(err) => {
            tracing::warn!(%datastore, error = %err, "cannot start the repair of the indexes after a master was replaced; run `cellgate index verify --repair`");
            false
        }
    }
}
