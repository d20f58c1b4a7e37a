//! Replica reads through the store's Rust API on real replication: a
//! MariaDB master with a GTID replica, then a PostgreSQL primary with a
//! streaming standby (`support/replication.rs`).
//!
//! With the replica's apply delayed, a read given the token of a write
//! never misses that write (it goes to the master), while a `REPLICA` read
//! without a token does read the stale replica; once the replica caught up,
//! token reads are served by it. A killed replica leaves `REPLICA` reads to
//! the master, and a killed master fails every read over to the replica,
//! `REPLICA` reads too (their lag cannot be measured without the master).
//!
//! A differential test runs the same index page with its rows' cells
//! through the one-statement (compiled) read and through the executor's
//! two reads, given a write's token on a delayed replica: both must return
//! the written bodies, and `possiblyStale` is the OR of every read behind
//! a response. Waits are bounded outcomes, never speed assertions.

#[path = "support/mariadb.rs"]
mod mariadb;
#[path = "support/postgres.rs"]
mod postgres;
#[path = "support/replication.rs"]
mod replication;
#[path = "support/servers.rs"]
mod servers;

use std::path::Path;
use std::time::{Duration, Instant};

use cellgate_store::cells::{NewCell, PutStatus};
use cellgate_store::indexes::IndexQuery;
use cellgate_store::replicas::{Consistency, ReadOptions, ReadToken};
use cellgate_store::{ClusterConfig, StorageConfig, Store, StoreOptions};
use replication::{MariaDbPair, Pair, PostgresPair};
use serde_json::json;
use uuid::Uuid;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replica_reads_on_mariadb_never_miss_a_tokened_write() {
    match MariaDbPair::start().await {
        Ok(pair) => replica_reads("MariaDB", pair).await,
        Err(why) => servers::skip("replica_reads_on_mariadb_never_miss_a_tokened_write", &why),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replica_reads_on_postgres_never_miss_a_tokened_write() {
    match PostgresPair::start().await {
        Ok(pair) => replica_reads("PostgreSQL", pair).await,
        Err(why) => servers::skip("replica_reads_on_postgres_never_miss_a_tokened_write", &why),
    }
}

fn note(row: Uuid, n: usize) -> NewCell {
    NewCell {
        row_key: row,
        column: "NOTES".into(),
        ref_key: 1,
        body: json!({"note": format!("note {n}"), "row": row.to_string()}),
    }
}

/// Reads the latest NOTES cell of `row` as `read` allows.
async fn latest(store: &Store, row: Uuid, read: &ReadOptions) -> Option<serde_json::Value> {
    store
        .get_cells_latest_with("trips", &[(row, "NOTES".to_string())], read)
        .await
        .expect("the read succeeds")
        .pop()
        .flatten()
        .map(|cell| cell.body)
}

fn by_replica(read: &ReadOptions) -> bool {
    !read.served_by().is_empty()
}

async fn replica_reads(kind: &str, mut pair: impl Pair) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let defs = index_dsl::load_dir(&root.join("datastores")).expect("the example definitions");
    let storage = StorageConfig {
        clusters: vec![ClusterConfig {
            name: "main".into(),
            master: pair.master_url(),
            replicas: vec![pair.replica_url()],
        }],
        timeout_ms: 2_000,
        ..StorageConfig::default()
    };
    let mut options = StoreOptions::new(storage);
    options.maintain_indexes = false;
    let store = Store::open(defs, options).await.expect("the store opens");

    // Caught up: a REPLICA read is served by the replica.
    let rows: Vec<Uuid> = (0..50).map(|_| Uuid::new_v4()).collect();
    let cells: Vec<NewCell> = rows.iter().enumerate().map(|(n, r)| note(*r, n)).collect();
    for result in store.put_cells("trips", cells).await.unwrap() {
        assert_eq!(result.unwrap(), PutStatus::Written);
    }
    pair.wait_replica_caught_up().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lag = store.metrics().replica_lag;
        if lag.len() == 1 && lag[0].cells_behind == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica's lag is measured: {lag:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let replica = ReadOptions {
        consistency: Consistency::Replica,
        ..ReadOptions::default()
    };
    assert_eq!(
        latest(&store, rows[0], &replica).await,
        Some(note(rows[0], 0).body)
    );
    assert!(
        by_replica(&replica),
        "a caught-up replica serves REPLICA reads"
    );
    let master = ReadOptions::default();
    latest(&store, rows[0], &master).await;
    assert!(!by_replica(&master), "MASTER reads stay on the master");

    // Delayed: tokened reads see every write, token-less ones may not.
    pair.set_replica_delay(60).await;
    let (mut stale_without, mut stale_with, mut replica_served) = (0, 0, 0);
    let writes = 200;
    let mut tokens: Vec<(Uuid, usize, ReadToken)> = Vec::new();
    for n in 0..writes {
        let row = Uuid::new_v4();
        let (results, token) = store
            .put_cells_with_token("trips", vec![note(row, n)])
            .await
            .unwrap();
        assert_eq!(results[0].as_ref().unwrap(), &PutStatus::Written);
        let read = ReadOptions {
            consistency: Consistency::Replica,
            after: Some(ReadToken::decode(&token.encode()).unwrap()),
            ..ReadOptions::default()
        };
        if latest(&store, row, &read).await != Some(note(row, n).body) {
            stale_with += 1;
        }
        replica_served += usize::from(by_replica(&read));
        let plain = ReadOptions {
            consistency: Consistency::Replica,
            ..ReadOptions::default()
        };
        if latest(&store, row, &plain).await != Some(note(row, n).body) {
            stale_without += 1;
        }
        tokens.push((row, n, token));
    }
    eprintln!(
        "{kind}: replica delayed 60 s: {writes} reads with a write's token: {stale_with} stale, \
         {replica_served} served by the replica; {stale_without} of {writes} REPLICA reads without one were stale"
    );
    assert_eq!(
        stale_with, 0,
        "a read given a write's token never misses it"
    );
    assert!(
        stale_without > 0,
        "the delayed replica served REPLICA reads without a token, so they could miss writes"
    );

    // Caught up again: the same tokens are now served by the replica.
    pair.set_replica_delay(0).await;
    pair.wait_replica_caught_up().await;
    let mut served = 0;
    for (row, n, token) in &tokens[tokens.len() - 50..] {
        let read = ReadOptions {
            consistency: Consistency::Replica,
            after: Some(token.clone()),
            ..ReadOptions::default()
        };
        assert_eq!(latest(&store, *row, &read).await, Some(note(*row, *n).body));
        served += usize::from(by_replica(&read));
    }
    eprintln!("{kind}: replica caught up: {served} of 50 tokened reads served by the replica");
    assert!(
        served > 0,
        "a replica that applied a token serves its reads"
    );

    // A killed replica leaves REPLICA reads to the master.
    pair.kill_replica();
    for (n, row) in rows.iter().enumerate().take(20) {
        let read = ReadOptions {
            consistency: Consistency::Replica,
            ..ReadOptions::default()
        };
        assert_eq!(latest(&store, *row, &read).await, Some(note(*row, n).body));
        assert!(!by_replica(&read));
    }
    pair.restart_replica().await;
    pair.wait_replica_caught_up().await;
    // The replica's breaker, opened while it was down, closes at its next
    // probe (the lag monitor's, twice a second).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let breakers = &store.metrics().clusters[0].breakers;
        if breakers.iter().all(|b| b.state.as_str() == "closed") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replica's breaker closes: {breakers:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A killed master: every read fails over to the replica, the first ones
    // after the master refused them, later ones at once (its breaker open).
    pair.kill_master();
    let (mut failed, mut failed_over) = (0, None);
    for attempt in 0..200 {
        let read = ReadOptions::default();
        match store
            .get_cells_latest_with("trips", &[(rows[1], "NOTES".to_string())], &read)
            .await
        {
            Ok(mut found) => {
                let body = found.pop().flatten().map(|c| c.body);
                assert_eq!(body, Some(note(rows[1], 1).body));
                assert_eq!(
                    read.served_by().into_values().collect::<Vec<_>>(),
                    vec![true],
                    "served by the replica, possibly stale"
                );
                failed_over = Some(attempt);
                break;
            }
            Err(err) => {
                assert_eq!(err.code(), "STORAGE_UNAVAILABLE", "{err}");
                failed += 1;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let attempt = failed_over.expect("reads fail over to the replica");
    eprintln!(
        "{kind}: master killed: {failed} reads failed before the failover (attempt {attempt})"
    );
    assert_eq!(
        failed, 0,
        "a read the master refuses is served by the replica"
    );
    for _ in 0..10 {
        let read = ReadOptions::default();
        let found = store
            .get_cells_latest_with("trips", &[(rows[2], "NOTES".to_string())], &read)
            .await
            .expect("reads go on from the replica");
        assert_eq!(
            found[0].as_ref().map(|c| &c.body),
            Some(&note(rows[2], 2).body)
        );
        assert!(by_replica(&read));
    }
    // REPLICA reads too: their lag is measured against the master, which
    // is gone, yet the replica answers them (possibly stale).
    for (n, row) in rows.iter().enumerate().take(20) {
        let read = ReadOptions {
            consistency: Consistency::Replica,
            ..ReadOptions::default()
        };
        let found = store
            .get_cells_latest_with("trips", &[(*row, "NOTES".to_string())], &read)
            .await
            .expect("a REPLICA read is served while the master is down");
        assert_eq!(
            found[0].as_ref().map(|c| &c.body),
            Some(&note(*row, n).body)
        );
        assert_eq!(
            read.served_by().into_values().collect::<Vec<_>>(),
            vec![true],
            "served by the replica, possibly stale"
        );
    }
    store.shutdown(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compiled_and_executor_index_reads_honour_a_token_on_mariadb() {
    match MariaDbPair::start().await {
        Ok(pair) => compiled_and_executor("MariaDB", pair).await,
        Err(why) => servers::skip(
            "compiled_and_executor_index_reads_honour_a_token_on_mariadb",
            &why,
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compiled_and_executor_index_reads_honour_a_token_on_postgres() {
    match PostgresPair::start().await {
        Ok(pair) => compiled_and_executor("PostgreSQL", pair).await,
        Err(why) => servers::skip(
            "compiled_and_executor_index_reads_honour_a_token_on_postgres",
            &why,
        ),
    }
}

fn trip(row: Uuid, driver: Uuid, version: i64) -> NewCell {
    NewCell {
        row_key: row,
        column: "BASE".into(),
        ref_key: version,
        body: json!({
            "driver_partner_uuid": driver.to_string(),
            "city_uuid": Uuid::from_u128(7).to_string(),
            "version": version,
        }),
    }
}

/// Each row of a driver's index page with the `version` of its latest
/// `BASE` body, through the compiled read (one statement for the page and
/// the cells) and through the executor's (the page, then the cells).
async fn pages(
    store: &Store,
    driver: Uuid,
    read: &ReadOptions,
) -> (Vec<(Uuid, i64)>, Vec<(Uuid, i64)>) {
    let query = IndexQuery {
        index: "driver_partner_index".into(),
        shard_values: vec![index_dsl::Literal::String(driver.to_string())],
        first: Some(100),
        ..Default::default()
    };
    let version = |body: &serde_json::Value| body["version"].as_i64().unwrap_or(-1);
    let (page, cells) = store
        .query_index_with_cells_json("trips", &query, &["BASE"], read)
        .await
        .expect("the compiled read")
        .expect("one cluster holds every shard");
    let mut compiled: Vec<(Uuid, i64)> = page
        .entries
        .iter()
        .map(|entry| {
            let cell = cells
                .iter()
                .find(|c| c.row_key == entry.row_key)
                .expect("each row of the page has its cell");
            let body: serde_json::Value = serde_json::from_slice(&cell.body).unwrap();
            (entry.row_key, version(&body))
        })
        .collect();
    let page = store
        .query_index_with("trips", &query, read)
        .await
        .expect("the executor's page");
    let wanted: Vec<(Uuid, String)> = page
        .entries
        .iter()
        .map(|e| (e.row_key, "BASE".to_string()))
        .collect();
    let mut executor: Vec<(Uuid, i64)> = store
        .get_cells_latest_with("trips", &wanted, read)
        .await
        .expect("the executor's cells")
        .into_iter()
        .zip(&wanted)
        .map(|(cell, (row, _))| (*row, cell.map_or(-1, |c| version(&c.body))))
        .collect();
    compiled.sort();
    executor.sort();
    (compiled, executor)
}

async fn compiled_and_executor(kind: &str, pair: impl Pair) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let defs = index_dsl::load_dir(&root.join("datastores")).expect("the example definitions");
    let storage = StorageConfig {
        clusters: vec![ClusterConfig {
            name: "main".into(),
            master: pair.master_url(),
            replicas: vec![pair.replica_url()],
        }],
        timeout_ms: 2_000,
        ..StorageConfig::default()
    };
    let store = Store::open(defs, StoreOptions::new(storage))
        .await
        .expect("the store opens");
    let driver = Uuid::new_v4();
    let rows: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
    let first: Vec<NewCell> = rows.iter().map(|r| trip(*r, driver, 1)).collect();
    for result in store.put_cells("trips", first).await.unwrap() {
        assert_eq!(result.unwrap(), PutStatus::Written);
    }
    store.sync_indexes().await.unwrap();
    pair.wait_replica_caught_up().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while store.metrics().replica_lag.first().map(|l| l.cells_behind) != Some(0) {
        assert!(Instant::now() < deadline, "the replica's lag is measured");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Version 2 of every row, on the master only.
    pair.set_replica_delay(60).await;
    let second: Vec<NewCell> = rows.iter().map(|r| trip(*r, driver, 2)).collect();
    let (results, token) = store.put_cells_with_token("trips", second).await.unwrap();
    assert!(results
        .iter()
        .all(|r| r.as_ref().unwrap() == &PutStatus::Written));
    store.sync_indexes().await.unwrap();
    let expected: Vec<(Uuid, i64)> = {
        let mut rows: Vec<(Uuid, i64)> = rows.iter().map(|r| (*r, 2)).collect();
        rows.sort();
        rows
    };

    // Without the token the delayed replica answers: the test can tell.
    let plain = ReadOptions {
        consistency: Consistency::Replica,
        ..ReadOptions::default()
    };
    let (compiled, _) = pages(&store, driver, &plain).await;
    assert!(
        compiled.iter().all(|(_, version)| *version == 1),
        "a REPLICA read without a token reads the delayed replica: {compiled:?}"
    );
    for consistency in [Consistency::Replica, Consistency::Master] {
        let read = ReadOptions {
            consistency,
            after: Some(token.clone()),
            ..ReadOptions::default()
        };
        let (compiled, executor) = pages(&store, driver, &read).await;
        assert_eq!(
            compiled, executor,
            "{kind} {consistency:?}: the compiled and the executor's reads agree"
        );
        assert_eq!(
            compiled, expected,
            "{kind} {consistency:?}: a read given the write's token sees it"
        );
    }

    // One response, two reads on the replica: one its lag allowed (stale
    // maybe), one the token vouched for. It may be stale as a whole.
    pair.set_replica_delay(0).await;
    pair.wait_replica_caught_up().await;
    let other = Uuid::new_v4();
    let (_, other_token) = store
        .put_cells_with_token("trips", vec![note(other, 0)])
        .await
        .unwrap();
    pair.wait_replica_caught_up().await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let by_lag = ReadOptions {
            consistency: Consistency::Replica,
            ..ReadOptions::default()
        };
        latest(&store, rows[0], &by_lag).await;
        if by_lag.served_by().into_values().collect::<Vec<_>>() != vec![true] {
            assert!(
                Instant::now() < deadline,
                "the replica serves REPLICA reads again"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        // Alone, the token's read is vouched for: not stale.
        let alone = ReadOptions {
            consistency: Consistency::Replica,
            after: Some(other_token.clone()),
            ..ReadOptions::default()
        };
        latest(&store, other, &alone).await;
        if alone.served_by().into_values().collect::<Vec<_>>() != vec![false] {
            assert!(
                Instant::now() < deadline,
                "the replica serves the token's read"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        // The same response's record, read on with the token.
        let by_token = ReadOptions {
            consistency: Consistency::Replica,
            after: Some(other_token.clone()),
            served: by_lag.served.clone(),
        };
        assert_eq!(
            latest(&store, other, &by_token).await,
            Some(note(other, 0).body)
        );
        assert_eq!(
            by_token.served_by().into_values().collect::<Vec<_>>(),
            vec![true],
            "{kind}: a response one part of which may be stale is possibly stale"
        );
        break;
    }
    store.shutdown(Duration::from_secs(5)).await;
}
