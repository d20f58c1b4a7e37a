//! Replica reads through the store's Rust API on real replication: a
//! MariaDB master with a GTID replica, then a PostgreSQL primary with a
//! streaming standby (`support/replication.rs`).
//!
//! With the replica's apply delayed, a read given the token of a write
//! never misses that write (it goes to the master), while a `REPLICA` read
//! without a token does read the stale replica; once the replica caught up,
//! token reads are served by it. A killed replica leaves `REPLICA` reads to
//! the master, and a killed master fails every read over to the replica.
//! Waits are bounded outcomes, never speed assertions.

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
    store.shutdown(Duration::from_secs(5)).await;
}
