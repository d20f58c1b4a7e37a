//! Wake-ups across gateways on PostgreSQL: after a write commits, the
//! writing gateway notifies the channel of its datastore
//! (`cellgate_<datastore>`) with the shards' new log heads, and every
//! gateway listening on that cluster turns the notification into the write
//! event a local write makes (`events.rs`), so its followers
//! (subscriptions, triggers) and index maintenance go on at once instead of
//! at their next sweep. One connection per cluster and gateway listens,
//! whatever the number of followers; the sweeps stay the safety net (a
//! notification lost with a dropped connection or with a gateway that
//! stopped between a commit and its notification, a master that changed).
//!
//! **Sending.** A `NOTIFY` inside the write's own transaction would take
//! PostgreSQL's database-wide notification lock at the commit and hold it
//! through the commit's WAL flush: every writing transaction of the
//! database would commit one after the other, each waiting for its own
//! flush, with the shard counters it locked held meanwhile. So writes only
//! post their new heads to an [`Outbox`] once committed, and one task per
//! store ([`send`]) empties it: one statement per cluster, on its
//! maintenance connections (background work, not a request's), all the
//! heads posted since the last one (the highest per shard), committed without
//! waiting for its flush (`synchronous_commit` off for that statement: a
//! notification is not data, and is delivered at once either way). While a
//! statement runs, what writes post meanwhile waits for the next one, so a
//! gateway sends at most one notification statement per cluster at a time,
//! whatever its write rate.
//!
//! Payload: `<origin>;<shard>:<head>,<shard>:<head>…`, at most
//! [`MAX_SHARDS`] shards (more go in further notifications of the same
//! statement), where `origin` names the writing store, which skips its own.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::postgres::PgListener;

use super::outbox::Outbox;
use super::{Topology, Written};
use crate::storage::{Dialect, Sql, Value};

/// Most shards a notification names: PostgreSQL's payload is at most 8,000
/// bytes, and a shard and its head take at most 21.
pub(crate) const MAX_SHARDS: usize = 360;

/// Sends what the store's writes post to `outbox` (see the module doc),
/// as `origin`, until the topology is dropped.
pub(crate) async fn send(topology: Weak<Topology>, outbox: Arc<Outbox>, origin: String) {
    loop {
        // Wakes at least once a second to see a dropped store.
        if tokio::time::timeout(Duration::from_secs(1), outbox.posted())
            .await
            .is_err()
        {
            if topology.strong_count() == 0 {
                return;
            }
            continue;
        }
        let mut by_cluster: BTreeMap<usize, Vec<(String, String)>> = BTreeMap::new();
        for ((cluster, datastore), heads) in outbox.take() {
            let heads: Vec<String> = heads
                .into_iter()
                .map(|(shard, head)| format!("{shard}:{head}"))
                .collect();
            let notifications = by_cluster.entry(cluster).or_default();
            for chunk in heads.chunks(MAX_SHARDS) {
                notifications.push((channel(&datastore), format!("{origin};{}", chunk.join(","))));
            }
        }
        let Some(current) = topology.upgrade() else {
            return;
        };
        let sends = by_cluster.into_iter().filter_map(|(cluster, notifications)| {
            // Background work: the maintenance pool, not the requests'.
            let master = current.clusters.get(cluster)?.maintenance().ok()?.clone();
            Some(async move {
                let sql = notify_statement(master.dialect(), &notifications);
                if let Err(err) = master.execute(&sql).await {
                    // The other gateways find these writes at their sweeps.
                    tracing::debug!(cluster, error = %err, "could not notify other gateways of writes");
                }
            })
        });
        futures::future::join_all(sends).await;
    }
}

/// One autocommitted statement sending `notifications` (channel, payload),
/// committed without waiting for its WAL flush.
fn notify_statement(dialect: Dialect, notifications: &[(String, String)]) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push("SELECT set_config('synchronous_commit', 'off', true), pg_notify(n.c, n.p) FROM (")
        .rows(
            notifications
                .iter()
                .map(|(c, p)| vec![Value::Text(c.clone()), Value::Text(p.clone())]),
        )
        .push(") AS n (c, p)");
    sql
}

/// The channel of `datastore`'s writes.
pub(crate) fn channel(datastore: &str) -> String {
    format!("cellgate_{datastore}")
}

/// Listens on cluster `cluster`'s master (`url`) for the writes of other
/// gateways, until the topology is dropped.
pub(crate) async fn listen(topology: Weak<Topology>, cluster: usize, url: String) {
    let origin = match topology
        .upgrade()
        .and_then(|t| t.events.outbox().map(|(origin, _)| origin.to_string()))
    {
        Some(origin) => origin,
        None => return,
    };
    let mut listener = loop {
        match PgListener::connect(&url).await {
            Ok(listener) => break listener,
            Err(err) => {
                tracing::debug!(cluster, error = %err, "cannot listen for other gateways' writes yet");
                tokio::time::sleep(Duration::from_secs(2)).await;
                if topology.strong_count() == 0 {
                    return;
                }
            }
        }
    };
    let mut listening: HashSet<String> = HashSet::new();
    loop {
        let Some(current) = topology.upgrade() else {
            return;
        };
        let wanted: Vec<String> = current
            .datastores_sorted()
            .iter()
            .map(|ds| channel(ds.name()))
            .filter(|c| !listening.contains(c))
            .collect();
        drop(current);
        if !wanted.is_empty() {
            match listener.listen_all(wanted.iter().map(String::as_str)).await {
                Ok(()) => listening.extend(wanted),
                Err(err) => {
                    tracing::debug!(cluster, error = %err, "cannot listen for other gateways' writes");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            }
        }
        // Wakes at least once a second to see a dropped store or new
        // datastores.
        let received = tokio::time::timeout(Duration::from_secs(1), listener.try_recv()).await;
        let notification = match received {
            Err(_) => continue,
            // The connection was lost and is being made again (with the
            // channels listened to again): what was sent meanwhile is
            // lost, and found by the sweeps. While the master is down,
            // `try_recv` waits in its pool to connect again and the
            // timeout above cancels the wait; a later call connects,
            // listens again and goes on without returning `None`
            // (`tests/wake.rs` kills and restarts the master).
            Ok(Ok(None)) => continue,
            Ok(Err(err)) => {
                tracing::debug!(cluster, error = %err, "listening for other gateways' writes failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            Ok(Ok(Some(notification))) => notification,
        };
        let Some(datastore) = notification.channel().strip_prefix("cellgate_") else {
            continue;
        };
        let Some((from, heads)) = parse(notification.payload()) else {
            continue;
        };
        if from == origin || heads.is_empty() {
            continue;
        }
        let Some(current) = topology.upgrade() else {
            return;
        };
        current.events.written(Written {
            datastore: datastore.to_string(),
            cluster,
            heads,
            went_back: false,
            ..Written::default()
        });
    }
}

/// `origin;shard:head,…` → `(origin, heads)`.
fn parse(payload: &str) -> Option<(&str, Vec<(u32, i64)>)> {
    let (origin, list) = payload.split_once(';')?;
    let mut heads = Vec::new();
    for pair in list.split(',').filter(|p| !p.is_empty()) {
        let (shard, head) = pair.split_once(':')?;
        heads.push((shard.parse().ok()?, head.parse().ok()?));
    }
    Some((origin, heads))
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn payloads_parse_or_are_ignored() {
        assert_eq!(
            parse("a1b2;12:40,4095:7"),
            Some(("a1b2", vec![(12, 40), (4095, 7)]))
        );
        assert_eq!(parse("a1b2;"), Some(("a1b2", vec![])));
        assert_eq!(parse("no separator"), None);
        assert_eq!(parse("a;12:x"), None);
    }
}
