//! Followers of the shared log tail (`triggers/tail.rs`), what GraphQL
//! subscriptions stand on: many followers cost one log read per commit, a
//! follower resuming from a cursor gets everything after it exactly once,
//! and a follower that lagged the broadcast catches up from the log.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cellgate_store::cells::NewCell;
use cellgate_store::triggers::tail::{decode_cursor, encode_cursor, FollowOptions, Follower};
use cellgate_store::Store;
use serde_json::json;
use uuid::Uuid;

use crate::harness::{through, Env, Gate};

/// Writes `rows` new rows with a BASE and a STATUS cell each, in one put.
async fn write(store: &Store, rows: usize) {
    let mut cells = Vec::new();
    for _ in 0..rows {
        let row = Uuid::new_v4();
        for column in ["BASE", "STATUS"] {
            cells.push(NewCell {
                row_key: row,
                column: column.into(),
                ref_key: 1,
                body: json!({"n": 1}),
            });
        }
    }
    store.put_cells("trips", cells).await.expect("put");
}

/// Takes `n` cells from `follower` (failing after 20 s).
async fn take(follower: &mut Follower, n: usize) -> Vec<(u32, i64, String)> {
    let mut cells = Vec::new();
    while cells.len() < n {
        let cell = tokio::time::timeout(Duration::from_secs(20), follower.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} cells arrived", cells.len()))
            .expect("next");
        cells.push((cell.shard, cell.added_id, cell.column.clone()));
    }
    cells
}

fn base_only() -> FollowOptions {
    FollowOptions {
        columns: vec!["BASE".into()],
        ..FollowOptions::default()
    }
}

pub async fn many_followers_cost_one_log_read_per_commit(env: Arc<Env>) {
    let store = env
        .open_tuned(|o| o.tail.sweep_every = Duration::from_secs(60))
        .await;
    const FOLLOWERS: usize = 100;
    let mut followers = Vec::new();
    for _ in 0..FOLLOWERS {
        let mut follower = store.follow("trips", base_only()).expect("follow");
        follower.start().await.expect("start");
        followers.push(follower);
    }
    let before = store.tail_metrics();
    assert_eq!(before.followers, FOLLOWERS);
    let statements_before: u64 = store.metrics().clusters.iter().map(|c| c.statements).sum();
    write(&store, 20).await;
    let tasks: Vec<_> = followers
        .into_iter()
        .map(|mut f| tokio::spawn(async move { take(&mut f, 20).await }))
        .collect();
    let mut seen = Vec::new();
    for task in tasks {
        seen.push(task.await.expect("follower"));
    }
    assert!(seen.windows(2).all(|w| w[0] == w[1]), "followers disagree");
    assert!(seen[0].iter().all(|(_, _, c)| c == "BASE"));
    let after = store.tail_metrics();
    let reads = after.tail_reads - before.tail_reads;
    assert!(
        (1..=3).contains(&reads),
        "{reads} tail reads for one commit"
    );
    assert_eq!(after.catch_up_reads, before.catch_up_reads);
    let statements: u64 = store
        .metrics()
        .clusters
        .iter()
        .map(|c| c.statements)
        .sum::<u64>()
        - statements_before;
    assert!(
        statements < FOLLOWERS as u64 / 2,
        "{statements} statements for one commit to {FOLLOWERS} followers"
    );
}

pub async fn a_follower_resuming_from_a_cursor_gets_everything_after_it(env: Arc<Env>) {
    let store = env.open().await;
    write(&store, 30).await;
    // From the beginning of every shard: an empty cursor.
    let mut first = store
        .follow(
            "trips",
            FollowOptions {
                after: Some(BTreeMap::new()),
                ..base_only()
            },
        )
        .expect("follow");
    let handled = take(&mut first, 12).await;
    let cursor = encode_cursor(&first.positions());
    drop(first);
    write(&store, 25).await;
    let mut resumed = store
        .follow(
            "trips",
            FollowOptions {
                after: Some(decode_cursor(&cursor).expect("cursor")),
                ..base_only()
            },
        )
        .expect("follow");
    let rest = take(&mut resumed, 30 + 25 - 12).await;
    let mut all: Vec<(u32, i64, String)> = handled.iter().chain(&rest).cloned().collect();
    let count = all.len();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), count, "a cell came twice");
    assert!(all.iter().all(|(_, _, c)| c == "BASE"));
    // Nothing more: every BASE cell was handed out once.
    let more = tokio::time::timeout(Duration::from_millis(500), resumed.next()).await;
    assert!(more.is_err(), "an extra cell: {more:?}");
    // In per-shard order.
    let mut last: BTreeMap<u32, i64> = BTreeMap::new();
    for (shard, added_id, _) in handled.iter().chain(&rest) {
        let previous = last.insert(*shard, *added_id).unwrap_or(0);
        assert!(*added_id > previous, "shard {shard} out of order");
    }
}

pub async fn a_follower_that_lags_the_broadcast_catches_up_from_the_log(env: Arc<Env>) {
    let store = env
        .open_tuned(|o| {
            o.tail.buffer = 2;
            o.tail.page = 7;
        })
        .await;
    let mut slow = store.follow("trips", base_only()).expect("follow");
    slow.start().await.expect("start");
    let mut written = 0;
    for _ in 0..10 {
        write(&store, 10).await;
        written += 10;
    }
    // Let the tail broadcast far more batches than the buffer holds.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got = take(&mut slow, written).await;
    let distinct: BTreeSet<_> = got.iter().collect();
    assert_eq!(distinct.len(), written, "cells missing or repeated");
    let metrics = store.tail_metrics();
    assert!(metrics.catch_up_reads > 0, "it never lagged");
    let trips = metrics
        .datastores
        .iter()
        .find(|d| d.datastore == "trips")
        .expect("the tail of trips");
    assert!(trips.lagged > 0, "no lag counted: {trips:?}");
    assert_eq!(trips.catch_up_reads, metrics.catch_up_reads);
    assert_eq!(trips.delivered_cells, written as u64);
    assert_eq!(trips.followers, 1);
    let more = tokio::time::timeout(Duration::from_millis(500), slow.next()).await;
    assert!(more.is_err(), "an extra cell: {more:?}");
}

/// The delay from a cell's write (its `created_at`, taken before the
/// commit) to its arrival at a follower, while cells are written at about
/// 1,000 per second in puts of 10; the bound is loose for debug builds on a
/// busy machine, the figures are printed.
pub async fn followers_see_commits_quickly_at_a_thousand_cells_per_second(env: Arc<Env>) {
    let store = env.open().await;
    let mut follower = store
        .follow("trips", FollowOptions::default())
        .expect("follow");
    follower.start().await.expect("start");
    let writer = store.clone();
    let writing = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(10));
        for _ in 0..300 {
            tick.tick().await;
            write(&writer, 5).await;
        }
    });
    let mut delays = Vec::with_capacity(3000);
    while delays.len() < 3000 {
        let cell = tokio::time::timeout(Duration::from_secs(20), follower.next())
            .await
            .expect("a cell within 20 s")
            .expect("next");
        let delay = chrono::Utc::now() - cell.created_at;
        delays.push(delay.num_microseconds().unwrap_or(i64::MAX));
    }
    writing.await.expect("writer");
    delays.sort_unstable();
    let p = |q: f64| delays[((delays.len() as f64 * q) as usize).min(delays.len() - 1)] / 1000;
    eprintln!(
        "write-to-event delay at ~1000 cells/s on {:?}: p50 {} ms, p99 {} ms, max {} ms",
        env.kind,
        p(0.5),
        p(0.99),
        p(1.0)
    );
    assert!(p(0.99) < 1000, "p99 {} ms", p(0.99));
}

/// A row key whose cells live on the first (`true`) or second half of the
/// shards: cluster `a` or `b`.
fn row_on_a(a: bool) -> Uuid {
    loop {
        let key = Uuid::new_v4();
        let shard = cellgate_store::shards::row_shard(&key, crate::harness::TRIP_SHARDS);
        if (shard < crate::harness::TRIP_SHARDS / 2) == a {
            return key;
        }
    }
}

/// Puts a BASE cell of each of `rows`, retrying while its cluster is away.
async fn put_rows(store: &Store, rows: &[Uuid]) {
    let cells: Vec<NewCell> = rows
        .iter()
        .map(|row| NewCell {
            row_key: *row,
            column: "BASE".into(),
            ref_key: 1,
            body: json!({"n": 1}),
        })
        .collect();
    for _ in 0..300 {
        if let Ok(results) = store.put_cells("trips", cells.clone()).await {
            if results.iter().all(|r| r.is_ok()) {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the cells could not be written within 30 s");
}

// Regression: one cluster that did not answer hung every new subscription
// of the datastore (the tail never got its start positions), and with the
// tail running, clusters after a failing one were not read. Here cluster
// `b` is behind a closed port when the store opens: a follower from now
// starts at once, gets `a`'s cells and names `b` as not followed; once `b`
// answers, its cells come too, and a follower resumed from a cursor made
// while `b` was away reads `b`'s log from its beginning.
pub async fn a_cluster_that_is_away_delays_only_its_own_shards(env: Arc<Env>) {
    if env.kind == crate::harness::Kind::Sqlite {
        eprintln!("skipped on SQLite: a database file cannot be away");
        return;
    }
    let urls = env.urls();
    let (_, target) = through(&urls[1], "");
    let gate = Gate::start(target).await;
    let (b_url, _) = through(&urls[1], &format!("127.0.0.1:{}", gate.port));
    // b's tables exist (made through the open gate by a first store).
    let mut storage = env.storage();
    storage.clusters[1].master = b_url;
    storage.timeout_ms = 1000;
    gate.open();
    let first = env
        .open_custom(crate::harness::DEFINITIONS, storage.clone(), false)
        .await
        .expect("store opens");
    first.shutdown(Duration::from_secs(5)).await;
    drop(first);
    gate.shut();
    let store = env
        .open_custom(crate::harness::DEFINITIONS, storage, false)
        .await
        .expect("a store opens with a cluster away");
    let mut now = store
        .follow("trips", base_only())
        .expect("a follower from now");
    tokio::time::timeout(Duration::from_secs(15), now.start())
        .await
        .expect("a follower starts while a cluster is away")
        .expect("started");
    assert_eq!(*now.unfollowed(), vec!["b".to_string()]);
    let on_a: Vec<Uuid> = (0..5).map(|_| row_on_a(true)).collect();
    put_rows(&store, &on_a).await;
    let got: BTreeSet<Uuid> = take_rows("a's cells", &mut now, 5).await;
    assert_eq!(got, on_a.iter().copied().collect());
    let cursor = now.positions();
    let mut resumed = store
        .follow(
            "trips",
            FollowOptions {
                after: Some(cursor),
                ..base_only()
            },
        )
        .unwrap();
    resumed.start().await.expect("a resumed follower starts");

    gate.open();
    // A follower from now starts b's shards where b stands when the tail
    // first reaches it.
    for _ in 0..300 {
        if now.unfollowed().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(now.unfollowed().is_empty(), "b is followed again");
    let on_b: Vec<Uuid> = (0..5).map(|_| row_on_a(false)).collect();
    put_rows(&store, &on_b).await;
    let got: BTreeSet<Uuid> = take_rows("b's cells from now", &mut now, 5).await;
    assert_eq!(
        got,
        on_b.iter().copied().collect(),
        "b's cells after it answered"
    );
    // From b's beginning: the cells of b the first store wrote (none) and these.
    let got: BTreeSet<Uuid> = take_rows("b's cells resumed", &mut resumed, 5).await;
    assert_eq!(got, on_b.iter().copied().collect());
    store.shutdown(Duration::from_secs(5)).await;
}

/// The rows of the next `n` cells of `follower` (failing after 20 s).
async fn take_rows(what: &str, follower: &mut Follower, n: usize) -> BTreeSet<Uuid> {
    let mut rows = BTreeSet::new();
    for _ in 0..n {
        let cell = tokio::time::timeout(Duration::from_secs(20), follower.next())
            .await
            .unwrap_or_else(|_| panic!("{what}: only {} of {n} cells arrived", rows.len()))
            .expect("next");
        rows.insert(cell.row_key);
    }
    rows
}

/// On PostgreSQL a write notifies the other gateways once it has
/// committed: every shard it advanced, in as many notifications as the
/// payload limit needs (a write of 1,000 cells advances far more shards
/// than one notification names), and each head is readable when its
/// notification arrives. Other backends have no notifications (they poll).
pub async fn a_write_notifies_other_gateways_of_every_shard_after_its_commit(env: Arc<Env>) {
    if env.kind != crate::harness::Kind::Postgres {
        return;
    }
    let store = env.open().await;
    let mut listener = sqlx::postgres::PgListener::connect(&env.url)
        .await
        .expect("listen");
    listener.listen("cellgate_trips").await.expect("listen");
    write(&store, 500).await;

    let mut reader = <sqlx::PgConnection as sqlx::Connection>::connect(&env.url)
        .await
        .expect("connect");
    let written: BTreeMap<i64, i64> =
        sqlx::query_as("SELECT shard, MAX(added_id) FROM trips_cells GROUP BY shard")
            .fetch_all(&mut reader)
            .await
            .expect("shards")
            .into_iter()
            .collect();
    assert!(written.len() > 360, "{} shards", written.len());
    let mut notified: BTreeMap<i64, i64> = BTreeMap::new();
    let mut notifications = 0;
    while notified != written {
        let notification = tokio::time::timeout(Duration::from_secs(10), listener.recv())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} notifications named {} of the {} shards written",
                    notifications,
                    notified.len(),
                    written.len()
                )
            })
            .expect("notification");
        notifications += 1;
        let (_, heads) = notification.payload().split_once(';').expect("origin");
        for pair in heads.split(',') {
            let (shard, head) = pair.split_once(':').expect("shard:head");
            let (shard, head): (i64, i64) = (shard.parse().unwrap(), head.parse().unwrap());
            let visible: i64 = sqlx::query_scalar(
                "SELECT COUNT(*) FROM trips_cells WHERE shard = $1 AND added_id = $2",
            )
            .bind(shard)
            .bind(head)
            .fetch_one(&mut reader)
            .await
            .expect("read");
            assert_eq!(
                visible, 1,
                "shard {shard} head {head} notified before its commit"
            );
            notified.insert(shard, head);
        }
    }
    assert!(notifications >= 2, "{notifications} notifications");
    drop(store);
}
