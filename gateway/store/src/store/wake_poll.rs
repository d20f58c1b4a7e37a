//! Wake-ups across gateways where no notification carries other gateways'
//! writes (MariaDB/MySQL, SQLite, PostgreSQL with `storage.notify: false`;
//! PostgreSQL's `LISTEN/NOTIFY` is `topology/wake.rs`).
//!
//! Every `storage.wake_poll_ms` each gateway reads, per datastore, the sum
//! of the shard counters of each cluster's master: one small statement per
//! datastore and cluster on a connection of its own, whatever the number of
//! subscriptions, triggers and indexes it serves. It also folds its own
//! writes' events into the heads it knows, so that the sum moves beyond
//! them only when another gateway (or a move's copy) wrote. Then it reads
//! the counters once and hands the shards that advanced to its followers
//! and index maintenance as the write event a local write makes; they read
//! the new cells at once instead of at their next sweep. The sweeps stay
//! the safety net (the poll's connection lost, a master replaced).

use std::collections::HashMap;
use std::sync::Weak;
use std::time::Duration;

use tokio::sync::broadcast::error::TryRecvError;

use crate::storage::{self, Backend, ConnectOptions};
use crate::topology::{Topology, Written};

/// What the poll knows of one datastore's shards on its cluster.
#[derive(Default)]
struct Known {
    /// Each shard's last `added_id` read or written here.
    heads: HashMap<u32, i64>,
    /// The sum of `heads`, which the counters' sum matches while only this
    /// gateway writes; `None` until the counters were first read.
    sum: Option<i64>,
}

impl Known {
    /// Takes `head` as `shard`'s if it is further; whether it was.
    fn advance(&mut self, shard: u32, head: i64) -> bool {
        // A shard not read yet has no counter row (0 in the sum) or an
        // empty log (head 0).
        let before = self.heads.get(&shard).copied().unwrap_or(0);
        if head <= before {
            return false;
        }
        self.heads.insert(shard, head);
        if let Some(sum) = self.sum.as_mut() {
            *sum += head - before;
        }
        true
    }
}

/// Polls cluster `cluster`'s master (`url`) for other gateways' writes
/// every `every`, until the topology is dropped.
pub(super) async fn poll(
    topology: Weak<Topology>,
    cluster: usize,
    url: String,
    connect: ConnectOptions,
    every: Duration,
) {
    let backend = loop {
        match storage::connect(&url, &connect).await {
            Ok(backend) => break backend,
            Err(err) => {
                tracing::debug!(cluster, error = %err, "cannot poll for other gateways' writes yet");
                tokio::time::sleep(Duration::from_secs(2)).await;
                if topology.strong_count() == 0 {
                    return;
                }
            }
        }
    };
    let Some(mut written) = topology.upgrade().map(|t| t.events.subscribe()) else {
        return;
    };
    let mut known: HashMap<String, Known> = HashMap::new();
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(current) = topology.upgrade() else {
            break;
        };
        // This gateway's own writes are no news.
        loop {
            match written.try_recv() {
                Ok(event) if event.cluster == cluster && !event.went_back => {
                    let entry = known.entry(event.datastore.clone()).or_default();
                    for &(shard, head) in &event.heads {
                        entry.advance(shard, head);
                    }
                }
                Ok(_) => {}
                // Missed events only cost a read of the counters.
                Err(TryRecvError::Lagged(_)) => {}
                Err(TryRecvError::Empty | TryRecvError::Closed) => break,
            }
        }
        for ds in current.datastores_sorted() {
            // A cluster without shards of a datastore has no tables of it.
            if ds.map().ranges_of(cluster).is_empty() {
                continue;
            }
            let entry = known.entry(ds.name().to_string()).or_default();
            if let Err(err) = poll_datastore(backend.as_ref(), &current, cluster, &ds, entry).await
            {
                tracing::debug!(cluster, datastore = ds.name(), error = %err, "polling for other gateways' writes failed");
            }
        }
    }
    backend.close().await;
}

/// One poll of `ds`: wakes this gateway for the shards that advanced
/// beyond `known`.
async fn poll_datastore(
    backend: &dyn Backend,
    topology: &Topology,
    cluster: usize,
    ds: &crate::topology::DatastoreRuntime,
    known: &mut Known,
) -> crate::Result<()> {
    let sum = crate::cells::log_length(backend, ds.name()).await?;
    if known.sum == Some(sum) {
        return Ok(());
    }
    let heads = crate::cells::heads(backend, ds).await?;
    let first = known.sum.is_none();
    let mut advanced = Vec::new();
    for &(shard, head) in &heads {
        // As read, even below what was known: a shard whose counter went
        // back (a replaced master) is the sweeps' to find.
        let before = known.heads.insert(shard, head).unwrap_or(0);
        if head > before && !first {
            advanced.push((shard, head));
        }
    }
    known.sum = Some(heads.iter().map(|(_, head)| head).sum());
    if !advanced.is_empty() {
        topology.events.written(Written {
            datastore: ds.name().to_string(),
            cluster,
            heads: advanced,
            went_back: false,
            ..Written::default()
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Known;

    #[test]
    fn known_heads_keep_their_sum() {
        let mut known = Known::default();
        assert!(known.advance(3, 10));
        known.sum = Some(10);
        assert!(!known.advance(3, 9), "a head never goes back here");
        assert!(known.advance(3, 12));
        assert!(!known.advance(7, 0), "an empty log is no news");
        assert!(known.advance(8, 5));
        assert_eq!(known.sum, Some(17));
    }
}
