//! Store behaviour that needs a specific setup: corrupt bodies, clusters
//! that are down, the buffer step, the SQL plan of index queries, and
//! property tests of latest-version and index maintenance semantics.

#[path = "contract/harness.rs"]
#[allow(dead_code)]
mod harness;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use cellgate_store::cells::{NewCell, PutStatus};
use cellgate_store::indexes::{IndexQuery, QueryPlan};
use cellgate_store::{ClusterConfig, StorageConfig};
use cellgate_store::{Store, StoreOptions};
use index_dsl::{CompareOp, Condition, Literal};
use proptest::prelude::*;
use serde_json::json;
use sqlx::Connection;
use uuid::Uuid;

fn cell(row_key: Uuid, column: &str, ref_key: i64, body: serde_json::Value) -> NewCell {
    NewCell {
        row_key,
        column: column.into(),
        ref_key,
        body,
    }
}

async fn open(dir: &Path, maintain: bool) -> Store {
    let mut options = StoreOptions::new(StorageConfig::embedded(dir));
    options.maintain_indexes = maintain;
    Store::open(harness::definitions(), options).await.unwrap()
}

async fn sqlite(dir: &Path) -> sqlx::SqliteConnection {
    let url = format!("sqlite://{}", dir.join("cellgate.db").display());
    sqlx::SqliteConnection::connect(&url).await.unwrap()
}

#[tokio::test]
async fn a_read_token_names_what_a_write_stored_duplicates_included() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), false).await;
    let a = Uuid::new_v4();
    let b = std::iter::repeat_with(Uuid::new_v4)
        .find(|b| store.row_shard("trips", b).unwrap() != store.row_shard("trips", &a).unwrap())
        .unwrap();
    let first = vec![cell(a, "BASE", 1, json!({"n": 1}))];
    let (results, token) = store
        .put_cells_with_token("trips", first.clone())
        .await
        .unwrap();
    assert_eq!(results[0].as_ref().unwrap(), &PutStatus::Written);
    let stored = store
        .get_cell(
            "trips",
            &cellgate_store::cells::CellKey {
                row_key: a,
                column: "BASE".into(),
                ref_key: 1,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(token.datastore, "trips");
    assert_eq!(
        token.positions,
        BTreeMap::from([(stored.shard, stored.added_id)])
    );
    let decoded = cellgate_store::replicas::ReadToken::decode(&token.encode()).unwrap();
    assert_eq!(decoded, token);

    // A retry of the same write is a duplicate, and its token still names
    // the stored cell: a read given it must see what the first attempt wrote.
    let mut again = first;
    again.push(cell(b, "BASE", 1, json!({"n": 2})));
    let (results, token) = store.put_cells_with_token("trips", again).await.unwrap();
    assert_eq!(results[0].as_ref().unwrap(), &PutStatus::Duplicate);
    assert_eq!(results[1].as_ref().unwrap(), &PutStatus::Written);
    assert!(
        token.positions.get(&stored.shard) >= Some(&stored.added_id),
        "{token:?} misses the duplicate's cell {} at {}",
        stored.shard,
        stored.added_id
    );
    assert_eq!(token.positions.len(), 2, "{token:?}");
    for text in ["", "rt1.", "rt1.!!!", "rt2.dHJpcHM", "rt1.dHJpcHMgeDox"] {
        assert_eq!(
            cellgate_store::replicas::ReadToken::decode(text)
                .unwrap_err()
                .code(),
            "BAD_USER_INPUT",
            "{text}"
        );
    }
    store.shutdown(std::time::Duration::from_secs(5)).await;
}

#[tokio::test]
async fn corrupt_body_is_an_error_naming_the_cell() {
    let dir = tempfile::tempdir().unwrap();
    // Maintenance off: the corrupt cell is still unindexed when sync runs.
    let store = open(dir.path(), false).await;
    let row = Uuid::new_v4();
    let driver = Uuid::new_v4();
    store
        .put_cell(
            "trips",
            cell(
                row,
                "BASE",
                1,
                json!({"driver_partner_uuid": driver.to_string()}),
            ),
        )
        .await
        .unwrap();
    let mut conn = sqlite(dir.path()).await;
    for garbage in [&b"\x01\xff\xfe"[..], &b""[..], &b"\x07abc"[..]] {
        sqlx::query("UPDATE trips_cells SET body = ? WHERE row_key = ?")
            .bind(garbage)
            .bind(row.as_bytes().as_slice())
            .execute(&mut conn)
            .await
            .unwrap();
        let err = store
            .get_cell_latest("trips", row, "BASE")
            .await
            .unwrap_err();
        assert_eq!(err.code(), "CORRUPT_BODY");
        assert!(err.to_string().contains(&row.to_string()), "{err}");
    }
    // Index maintenance quarantines the entries instead of stalling the
    // shard: both indexes of `trips` read BASE.
    store
        .put_cell(
            "trips",
            cell(row, "NOTES", 1, json!({"after": "corruption"})),
        )
        .await
        .unwrap();
    store.sync_indexes().await.unwrap();
    let lag = store.index_lag("trips").await.unwrap();
    assert!(lag.is_empty(), "{lag:?}");
    let quarantined = store.quarantine("trips").await.unwrap();
    let names: Vec<&str> = quarantined.iter().map(|q| q.index.as_str()).collect();
    assert_eq!(names, vec!["city_trips_index", "driver_partner_index"]);
    assert!(quarantined
        .iter()
        .all(|q| q.row_key == row && q.code == "INTERNAL"));
    assert!(
        quarantined[0].message.contains("is corrupt"),
        "{}",
        quarantined[0].message
    );
    // Retrying changes nothing while the latest cell stays corrupt...
    assert_eq!(store.retry_quarantine("trips", None).await.unwrap(), (0, 2));
    // ...and applies both once a new version of the cell is readable.
    store
        .put_cell(
            "trips",
            cell(
                row,
                "BASE",
                2,
                json!({"driver_partner_uuid": driver.to_string()}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(store.retry_quarantine("trips", None).await.unwrap(), (2, 0));
    assert!(store.quarantine("trips").await.unwrap().is_empty());
    store.sync_indexes().await.unwrap();
    let page = store
        .query_index(
            "trips",
            &IndexQuery {
                index: "driver_partner_index".into(),
                shard_values: vec![Literal::String(driver.to_string())],
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(page.entries.len(), 1);
}

/// `shutdown` closes the connections and waits for them: the last one
/// copies the WAL back, so the next process neither replays it nor waits
/// for another process's closing checkpoint.
#[tokio::test]
async fn shutdown_leaves_the_embedded_store_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), true).await;
    let rows: Vec<Uuid> = (0..300).map(|_| Uuid::new_v4()).collect();
    let cells = rows
        .iter()
        .map(|r| {
            cell(
                *r,
                "BASE",
                1,
                json!({"driver_partner_uuid": Uuid::new_v4().to_string(), "pad": "x".repeat(500)}),
            )
        })
        .collect();
    for result in store.put_cells("trips", cells).await.unwrap() {
        result.unwrap();
    }
    let wal = dir.path().join("cellgate.db-wal");
    assert!(
        std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0) > 0,
        "writes went to the WAL"
    );
    store.shutdown(std::time::Duration::from_secs(5)).await;
    let left = std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0);
    assert_eq!(left, 0, "the WAL was copied back and truncated at shutdown");

    let reopened = open(dir.path(), false).await;
    for row in &rows {
        let cell = reopened
            .get_cell_latest("trips", *row, "BASE")
            .await
            .unwrap();
        assert!(cell.is_some(), "row {row} reads back after the restart");
    }
}

/// Two clusters: an SQLite file and a server that is not there.
fn split_topology(dir: &Path, buffer_count: usize) -> StorageConfig {
    StorageConfig {
        buffer_count,
        clusters: vec![
            ClusterConfig {
                name: "up".into(),
                master: format!("sqlite://{}", dir.join("up.db").display()),
                replicas: vec![],
            },
            ClusterConfig {
                name: "down".into(),
                master: "mysql://root@127.0.0.1:1/nothing".into(),
                replicas: vec![],
            },
        ],
        ..StorageConfig::default()
    }
}

#[tokio::test]
async fn a_down_cluster_fails_only_its_shards() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        harness::definitions(),
        StoreOptions::new(split_topology(dir.path(), 0)),
    )
    .await
    .expect("the gateway starts while a cluster is down");
    let rows: Vec<Uuid> = (0..24).map(|_| Uuid::new_v4()).collect();
    let batch = rows
        .iter()
        .map(|r| cell(*r, "NOTES", 1, json!({"n": 1})))
        .collect();
    let results = store.put_cells("trips", batch).await.unwrap();
    for (row, result) in rows.iter().zip(&results) {
        // The first half of the shards live on `up`, the rest on `down`.
        if cellgate_store::shards::row_shard(row, harness::TRIP_SHARDS) < harness::TRIP_SHARDS / 2 {
            assert_eq!(result.as_ref().unwrap(), &PutStatus::Written);
            assert!(store
                .get_cell_latest("trips", *row, "NOTES")
                .await
                .unwrap()
                .is_some());
        } else {
            let err = result.as_ref().unwrap_err();
            assert_eq!(err.code(), "STORAGE_UNAVAILABLE");
            assert_eq!(
                err.client_message(),
                "storage cluster `down` is unavailable"
            );
        }
    }
}

#[tokio::test]
async fn writes_are_buffered_while_their_primary_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        harness::definitions(),
        StoreOptions::new(split_topology(dir.path(), 1)),
    )
    .await
    .unwrap();
    let rows: Vec<Uuid> = (0..24).map(|_| Uuid::new_v4()).collect();
    let batch = rows
        .iter()
        .map(|r| cell(*r, "NOTES", 1, json!({"n": 1})))
        .collect();
    let results = store.put_cells("trips", batch).await.unwrap();
    let mut buffered = 0;
    for (row, result) in rows.iter().zip(&results) {
        if cellgate_store::shards::row_shard(row, harness::TRIP_SHARDS) < harness::TRIP_SHARDS / 2 {
            // Its buffer copy would go to the down cluster: refused.
            assert_eq!(result.as_ref().unwrap_err().code(), "STORAGE_UNAVAILABLE");
        } else {
            assert_eq!(result.as_ref().unwrap(), &PutStatus::Buffered);
            assert!(!PutStatus::Buffered.readable());
            buffered += 1;
        }
    }
    let on_down = format!("shard >= {}", harness::TRIP_SHARDS / 2);
    let stored = buffered_rows(&dir.path().join("up.db"), &on_down).await;
    assert_eq!(
        stored, buffered,
        "every buffered cell is kept on the secondary"
    );
}

/// Three clusters, a third of the shards each: two SQLite files and a
/// server that is not there.
fn three_clusters(dir: &Path, buffer_count: usize) -> StorageConfig {
    let sqlite = |name: &str| ClusterConfig {
        name: name.into(),
        master: format!("sqlite://{}", dir.join(format!("{name}.db")).display()),
        replicas: vec![],
    };
    StorageConfig {
        buffer_count,
        clusters: vec![
            sqlite("one"),
            sqlite("two"),
            ClusterConfig {
                name: "down".into(),
                master: "mysql://root@127.0.0.1:1/nothing".into(),
                replicas: vec![],
            },
        ],
        ..StorageConfig::default()
    }
}

/// Rows of `trips_buffer` matching `filter` in the SQLite file `db`.
async fn buffered_rows(db: &Path, filter: &str) -> i64 {
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
        .await
        .unwrap();
    let (rows,): (i64,) =
        sqlx::query_as(&format!("SELECT COUNT(*) FROM trips_buffer WHERE {filter}"))
            .fetch_one(&mut conn)
            .await
            .unwrap();
    rows
}

// Regression: a buffer copy that went to a down secondary failed the
// whole group although its primary and another secondary were up.
#[tokio::test]
async fn a_down_secondary_is_replaced_by_another() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        harness::definitions(),
        StoreOptions::new(three_clusters(dir.path(), 1)),
    )
    .await
    .unwrap();
    // Shards are split evenly, in order: the last third lives on `down`.
    let on_up = |shard: u32| u64::from(shard) * 3 < 2 * u64::from(harness::TRIP_SHARDS);
    let (mut written, mut buffered) = (0, 0);
    // Each call buffers each cluster's group once, on a random secondary:
    // over 20 calls the down one is picked many times.
    for _ in 0..20 {
        let rows: Vec<Uuid> = (0..12).map(|_| Uuid::new_v4()).collect();
        let batch = rows
            .iter()
            .map(|r| cell(*r, "NOTES", 1, json!({"n": 1})))
            .collect();
        let results = store.put_cells("trips", batch).await.unwrap();
        for (row, result) in rows.iter().zip(&results) {
            let shard = cellgate_store::shards::row_shard(row, harness::TRIP_SHARDS);
            let status = result.as_ref().expect("every write succeeds");
            if on_up(shard) {
                assert_eq!(status, &PutStatus::Written, "shard {shard}");
                written += 1;
            } else {
                // Its primary is down: kept on one of the two others.
                assert_eq!(status, &PutStatus::Buffered, "shard {shard}");
                buffered += 1;
            }
        }
    }
    assert!(written > 0 && buffered > 0);
    let kept = buffered_rows(&dir.path().join("one.db"), "1 = 1").await
        + buffered_rows(&dir.path().join("two.db"), "1 = 1").await;
    assert_eq!(kept, buffered, "written cells leave no copy behind");
}

// Regression: when a later secondary failed, the copies already made on
// others stayed in their buffers although the write was refused.
#[tokio::test]
async fn a_write_that_cannot_be_buffered_enough_leaves_no_copy() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        harness::definitions(),
        StoreOptions::new(three_clusters(dir.path(), 2)),
    )
    .await
    .unwrap();
    let on_up = |shard: u32| u64::from(shard) * 3 < 2 * u64::from(harness::TRIP_SHARDS);
    for _ in 0..10 {
        let rows: Vec<Uuid> = (0..12).map(|_| Uuid::new_v4()).collect();
        let batch = rows
            .iter()
            .map(|r| cell(*r, "NOTES", 1, json!({"n": 1})))
            .collect();
        let results = store.put_cells("trips", batch).await.unwrap();
        for (row, result) in rows.iter().zip(&results) {
            let shard = cellgate_store::shards::row_shard(row, harness::TRIP_SHARDS);
            if on_up(shard) {
                // Two copies are needed and only one other cluster is up:
                // refused, as Schemaless refuses a write it cannot buffer.
                assert_eq!(result.as_ref().unwrap_err().code(), "STORAGE_UNAVAILABLE");
            } else {
                // The two up clusters both take a copy.
                assert_eq!(result.as_ref().unwrap(), &PutStatus::Buffered);
            }
        }
    }
    for name in ["one", "two"] {
        let on_up = format!("shard * 3 < {}", 2 * harness::TRIP_SHARDS);
        let stray = buffered_rows(&dir.path().join(format!("{name}.db")), &on_up).await;
        assert_eq!(stray, 0, "a refused write left a copy on `{name}`");
    }
}

/// Buffered cells of `trips` per holding cluster, from the latest count.
fn buffered_now(store: &Store) -> i64 {
    let metrics = store.metrics();
    let trips = metrics
        .datastores
        .iter()
        .find(|d| d.name == "trips")
        .unwrap();
    trips.buffered.iter().map(|b| b.cells).sum()
}

/// Polls `done` every 50 ms for at most `secs` seconds.
async fn eventually(secs: u64, mut done: impl FnMut() -> bool) -> bool {
    for _ in 0..secs * 20 {
        if done() {
            return true;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    done()
}

// Writes answered BUFFERED while their primary was down are delivered to it
// by a later process once it answers: every one reads back with its body,
// is indexed, and leaves no buffer row; of two bodies buffered for one key
// exactly one is stored and the other is listed as a conflict.
#[tokio::test]
async fn buffered_writes_are_replayed_into_their_primary_once_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        harness::definitions(),
        StoreOptions::new(three_clusters(dir.path(), 1)),
    )
    .await
    .unwrap();
    let on_down = |row: &Uuid| {
        let shard = cellgate_store::shards::row_shard(row, harness::TRIP_SHARDS);
        u64::from(shard) * 3 >= 2 * u64::from(harness::TRIP_SHARDS)
    };
    let rows: Vec<Uuid> = std::iter::repeat_with(Uuid::new_v4)
        .filter(|r| on_down(r))
        .take(60)
        .collect();
    let driver = Uuid::new_v4();
    let body = |n: usize| json!({"driver_partner_uuid": driver.to_string(), "city_uuid": Uuid::from_u128(7).to_string(), "n": n});
    let batch = rows
        .iter()
        .enumerate()
        .map(|(n, r)| cell(*r, "BASE", 1, body(n)))
        .collect();
    for result in store.put_cells("trips", batch).await.unwrap() {
        assert_eq!(result.unwrap(), PutStatus::Buffered);
    }
    // The same cell again (a client retrying), and another body for the
    // key of row 0: both buffered too.
    let again = store
        .put_cell("trips", cell(rows[1], "BASE", 1, body(1)))
        .await;
    assert_eq!(again.unwrap(), PutStatus::Buffered);
    let rival = json!({"driver_partner_uuid": driver.to_string(), "n": "rival"});
    let other = store
        .put_cell("trips", cell(rows[0], "BASE", 1, rival.clone()))
        .await;
    assert_eq!(other.unwrap(), PutStatus::Buffered);
    // Not readable while the primary is down.
    let read = store.get_cell_latest("trips", rows[2], "BASE").await;
    assert_eq!(read.unwrap_err().code(), "STORAGE_UNAVAILABLE");
    assert!(
        eventually(10, || buffered_now(&store) == 62).await,
        "the buffered cells are counted: {:?}",
        store.metrics().datastores
    );
    store.shutdown(std::time::Duration::from_secs(5)).await;
    drop(store);

    // The primary answers again (here: the cluster `down` is now a file).
    let mut config = three_clusters(dir.path(), 1);
    config.clusters[2].master = format!("sqlite://{}", dir.path().join("down.db").display());
    let store = Store::open(harness::definitions(), StoreOptions::new(config))
        .await
        .unwrap();
    let mut drained = false;
    for _ in 0..600 {
        if buffered_rows(&dir.path().join("one.db"), "1 = 1").await
            + buffered_rows(&dir.path().join("two.db"), "1 = 1").await
            == 0
        {
            drained = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(drained, "the buffers drain once the primary answers");
    for (n, row) in rows.iter().enumerate().skip(1) {
        let stored = store.get_cell_latest("trips", *row, "BASE").await.unwrap();
        assert_eq!(stored.expect("replayed").body, body(n), "row {n}");
    }
    // Row 0: exactly one of its two bodies won; the other is a conflict.
    let stored = store
        .get_cell_latest("trips", rows[0], "BASE")
        .await
        .unwrap()
        .expect("one body wins")
        .body;
    let conflicts = store.buffer_conflicts("trips", 10).await.unwrap();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    let conflict = &conflicts[0];
    assert_eq!(conflict.key.row_key, rows[0]);
    assert_eq!(
        (conflict.key.column.as_str(), conflict.key.ref_key),
        ("BASE", 1)
    );
    let loser = if stored == rival {
        body(0)
    } else {
        rival.clone()
    };
    assert!(stored == rival || stored == body(0));
    assert_eq!(conflict.body, loser);
    assert_ne!(conflict.body_hash, conflict.stored_hash);
    let trips = store.metrics();
    let trips = trips.datastores.iter().find(|d| d.name == "trips").unwrap();
    assert_eq!(trips.replay_conflicts, 1);
    assert_eq!(trips.cells_replayed, 61, "60 cells and one duplicate");
    // Replayed cells are indexed like any other.
    store.sync_indexes().await.unwrap();
    let query = IndexQuery {
        index: "driver_partner_index".into(),
        shard_values: vec![Literal::String(driver.to_string())],
        first: Some(100),
        ..Default::default()
    };
    let page = store.query_index("trips", &query).await.unwrap();
    let indexed: BTreeSet<Uuid> = page.entries.iter().map(|e| e.row_key).collect();
    assert_eq!(indexed, rows.iter().copied().collect::<BTreeSet<_>>());
}

// Two gateways come up once the primary is back: each buffer is replayed by
// one of them at a time (a lease), and when the one replaying stops
// mid-way the other takes over; every buffered cell is delivered exactly
// once (a cell replayed twice would count twice, as a duplicate).
#[tokio::test]
async fn replay_runs_on_one_gateway_at_a_time_and_another_takes_it_over() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(
        harness::definitions(),
        StoreOptions::new(three_clusters(dir.path(), 1)),
    )
    .await
    .unwrap();
    let on_down = |row: &Uuid| {
        let shard = cellgate_store::shards::row_shard(row, harness::TRIP_SHARDS);
        u64::from(shard) * 3 >= 2 * u64::from(harness::TRIP_SHARDS)
    };
    let mut cells = Vec::new();
    for _ in 0..8 {
        let batch: Vec<NewCell> = std::iter::repeat_with(Uuid::new_v4)
            .filter(|r| on_down(r))
            .take(500)
            .map(|r| cell(r, "NOTES", 1, json!({"note": r.to_string()})))
            .collect();
        for result in store.put_cells("trips", batch.clone()).await.unwrap() {
            assert_eq!(result.unwrap(), PutStatus::Buffered);
        }
        cells.extend(batch);
    }
    store.shutdown(std::time::Duration::from_secs(5)).await;
    drop(store);

    let mut config = three_clusters(dir.path(), 1);
    config.clusters[2].master = format!("sqlite://{}", dir.path().join("down.db").display());
    let open = || Store::open(harness::definitions(), StoreOptions::new(config.clone()));
    let (first, second) = (open().await.unwrap(), open().await.unwrap());
    let replayed = |store: &Store| {
        store
            .metrics()
            .datastores
            .iter()
            .find(|d| d.name == "trips")
            .unwrap()
            .cells_replayed
    };
    // Both run; once a third of the cells are delivered, stop the gateway
    // that delivered more of them.
    let mut stopped = None;
    for _ in 0..4000 {
        let (a, b) = (replayed(&first), replayed(&second));
        if a + b >= cells.len() as u64 / 3 {
            stopped = Some((a.max(b), if a >= b { &first } else { &second }));
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
    let (_, holder) = stopped.expect("one gateway replays");
    holder.shutdown(std::time::Duration::from_secs(10)).await;
    let stopped_at = replayed(holder);
    let other = if std::ptr::eq(holder, &first) {
        &second
    } else {
        &first
    };
    let mut drained = false;
    for _ in 0..1200 {
        if buffered_rows(&dir.path().join("one.db"), "1 = 1").await
            + buffered_rows(&dir.path().join("two.db"), "1 = 1").await
            == 0
        {
            drained = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(drained, "the other gateway finishes the replay");
    assert_eq!(
        stopped_at + replayed(other),
        cells.len() as u64,
        "every buffered cell is delivered once ({stopped_at} by the gateway that stopped)"
    );
    for chunk in cells.chunks(500) {
        let keys: Vec<_> = chunk.iter().map(NewCell::key).collect();
        let stored = other.get_cells("trips", &keys).await.unwrap();
        for (cell, stored) in chunk.iter().zip(stored) {
            assert_eq!(stored.expect("delivered").body, cell.body);
        }
    }
    eprintln!(
        "{stopped_at} of {} cells replayed before the first gateway stopped",
        cells.len()
    );
}

// Regression: a write to a cluster whose catalog was refused came back
// BUFFERED although waiting could not help. The cluster is a MariaDB
// database behind a port that is closed at start-up (so the cluster waits
// to be prepared) and later forwards to a database whose catalog holds
// `trips` with another shard count (so it is refused).
#[tokio::test]
async fn a_refused_cluster_is_an_error_not_a_buffered_write() {
    let Ok(base) = std::env::var("CELLGATE_TEST_MYSQL_URL") else {
        eprintln!("skipped: CELLGATE_TEST_MYSQL_URL is not set");
        return;
    };
    let (name, mut admin) = scratch_mysql_database(&base, "refused").await;
    let (server, _) = base.rsplit_once('/').unwrap();
    let mut defs = harness::definitions();
    for ds in &mut defs.datastores {
        ds.shards *= 2;
    }
    let mut options = StoreOptions::new(StorageConfig::single(&format!("{server}/{name}")));
    options.maintain_indexes = false;
    let other = Store::open(defs, options).await.unwrap();
    other.shutdown(std::time::Duration::from_secs(5)).await;

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let mut config = three_clusters(dir.path(), 1);
    config.clusters[2].master = format!("mysql://root@127.0.0.1:{port}/{name}");
    let store = Store::open(harness::definitions(), StoreOptions::new(config))
        .await
        .unwrap();
    let target = server.rsplit_once('@').unwrap().1.to_string();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut db) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut db).await;
                }
            });
        }
    });
    let row = std::iter::repeat_with(Uuid::new_v4)
        .find(|r| {
            let shard = cellgate_store::shards::row_shard(r, harness::TRIP_SHARDS);
            u64::from(shard) * 3 >= 2 * u64::from(harness::TRIP_SHARDS)
        })
        .unwrap();
    let mut refused = None;
    for _ in 0..200 {
        match store
            .put_cell("trips", cell(row, "NOTES", 1, json!({"n": 1})))
            .await
        {
            Err(err) if err.code() == "CATALOG_MISMATCH" => {
                refused = Some(err);
                break;
            }
            Ok(PutStatus::Buffered) | Err(_) => {}
            Ok(other) => panic!("a write to the refused cluster was {other:?}"),
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let refused = refused.expect("the cluster is refused once it answers");
    assert!(!refused.is_transient());
    assert!(
        !refused.client_message().contains(&name),
        "{}",
        refused.client_message()
    );
    store.shutdown(std::time::Duration::from_secs(5)).await;
    let _ = sqlx::query(&format!("DROP DATABASE {name}"))
        .execute(&mut admin)
        .await;
}

#[test]
fn filter_string_and_typed_where_compile_to_one_plan() {
    let defs = harness::definitions();
    let items = defs.datastore("items").unwrap();
    let typed = IndexQuery {
        index: "items_index".into(),
        conditions: vec![
            Condition {
                field: "s".into(),
                op: CompareOp::In,
                values: vec![Literal::String("a".into()), Literal::String("b".into())],
                column: 1,
            },
            Condition {
                field: "owner".into(),
                op: CompareOp::Eq,
                values: vec![Literal::String("alice".into())],
                column: 1,
            },
            Condition {
                field: "t".into(),
                op: CompareOp::Ge,
                values: vec![Literal::String("2024-01-01T01:00:00+01:00".into())],
                column: 1,
            },
            Condition {
                field: "x".into(),
                op: CompareOp::Lt,
                values: vec![Literal::Int(30)],
                column: 1,
            },
            Condition {
                field: "b".into(),
                op: CompareOp::Ne,
                values: vec![Literal::Bool(true)],
                column: 1,
            },
        ],
        ..Default::default()
    };
    let text = IndexQuery {
        index: "items_index".into(),
        filter: Some(r#"b != true and x < 30.0 and owner = "alice" and t >= "2024-01-01T00:00:00Z" and s in ("a", "b")"#.into()),
        ..Default::default()
    };
    let a = QueryPlan::build(items, &typed).unwrap();
    let b = QueryPlan::build(items, &text).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.predicates.len(), 4);
}

/// The writes of a property test: row, column, ref key, body choice.
fn ops() -> impl Strategy<Value = Vec<(usize, bool, i64, usize)>> {
    prop::collection::vec((0usize..5, any::<bool>(), 0i64..6, 0usize..4), 1..40)
}

fn rows() -> Vec<Uuid> {
    (1..=5).map(|i| Uuid::from_u128(0x1000 + i)).collect()
}

fn drivers() -> Vec<Uuid> {
    (1..=3).map(|i| Uuid::from_u128(0xd000 + i)).collect()
}

/// Body choice 3 has no driver: the row leaves the index.
fn base_body(choice: usize) -> serde_json::Value {
    match drivers().get(choice) {
        Some(driver) => {
            json!({"driver_partner_uuid": driver.to_string(), "city_uuid": Uuid::from_u128(0xc000 + choice as u128).to_string()})
        }
        None => json!({"note": "no driver"}),
    }
}

fn status_body(choice: usize) -> serde_json::Value {
    let status = ["requested", "accepted", "completed", "canceled"][choice];
    json!({ "status": status })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the order of writes, the latest cell is the one with the
    /// highest ref key, the first body written for a key wins, and retries
    /// are reported as duplicates or conflicts.
    #[test]
    fn latest_is_the_highest_ref_key(ops in ops()) {
        runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let store = open(dir.path(), false).await;
            let rows = rows();
            let mut model: BTreeMap<(usize, i64), usize> = BTreeMap::new();
            for (row, _, ref_key, body) in &ops {
                let result = store.put_cell("trips", cell(rows[*row], "NOTES", *ref_key, json!({"b": body}))).await;
                match model.get(&(*row, *ref_key)) {
                    None => { prop_assert_eq!(result.unwrap(), PutStatus::Written); model.insert((*row, *ref_key), *body); }
                    Some(first) if first == body => prop_assert_eq!(result.unwrap(), PutStatus::Duplicate),
                    Some(_) => prop_assert_eq!(result.unwrap_err().code(), "CELL_CONFLICT"),
                }
            }
            for (i, row) in rows.iter().enumerate() {
                let expected = model.range((i, i64::MIN)..=(i, i64::MAX)).next_back();
                let latest = store.get_cell_latest("trips", *row, "NOTES").await.unwrap();
                match (expected, latest) {
                    (None, None) => {}
                    (Some(((_, ref_key), body)), Some(cell)) => {
                        prop_assert_eq!(cell.ref_key, *ref_key);
                        prop_assert_eq!(cell.body, json!({"b": body}));
                    }
                    (e, l) => prop_assert!(false, "expected {:?}, got {:?}", e, l),
                }
                let history = store.history("trips", *row, "NOTES", 100, None).await.unwrap();
                let refs: Vec<i64> = history.iter().map(|c| c.ref_key).collect();
                let want: Vec<i64> = model.range((i, i64::MIN)..=(i, i64::MAX)).rev().map(|((_, r), _)| *r).collect();
                prop_assert_eq!(refs, want);
            }
            Ok(())
        })?;
    }

    /// After random writes, with the process "crashing" between cell
    /// commits and index writes part-way, the indexes equal a from-scratch
    /// recomputation from the latest cells.
    #[test]
    fn indexes_equal_a_recomputation(ops in ops(), crash_at in 0usize..40, resume_at in 0usize..40) {
        runtime().block_on(async {
            let dir = tempfile::tempdir().unwrap();
            let rows = rows();
            let (crash_at, resume_at) = (crash_at.min(ops.len()), resume_at.min(ops.len()).max(crash_at.min(ops.len())));
            let mut first_body: BTreeMap<(usize, bool, i64), usize> = BTreeMap::new();
            // Phases: indexed normally, then cells only (maintenance "dead"), then indexed again.
            for (phase, range) in [(true, 0..crash_at), (false, crash_at..resume_at), (true, resume_at..ops.len())] {
                let store = open(dir.path(), phase).await;
                for (row, is_base, ref_key, body) in &ops[range] {
                    let (column, value) = if *is_base { ("BASE", base_body(*body)) } else { ("STATUS", status_body(*body)) };
                    let _ = store.put_cell("trips", cell(rows[*row], column, *ref_key, value)).await;
                    first_body.entry((*row, *is_base, *ref_key)).or_insert(*body);
                }
            }
            let store = open(dir.path(), true).await;
            store.sync_indexes().await.unwrap();
            // The model: latest body choice per (row, column).
            let latest = |row: usize, base: bool| first_body.range((row, base, i64::MIN)..=(row, base, i64::MAX)).next_back().map(|(_, b)| *b);
            for (d, driver) in drivers().iter().enumerate() {
                let expected: BTreeSet<Uuid> = (0..rows.len()).filter(|r| latest(*r, true) == Some(d)).map(|r| rows[r]).collect();
                let query = IndexQuery { index: "driver_partner_index".into(), shard_values: vec![Literal::String(driver.to_string())], first: Some(100), ..Default::default() };
                let page = store.query_index("trips", &query).await.unwrap();
                let got: BTreeSet<Uuid> = page.entries.iter().map(|e| e.row_key).collect();
                prop_assert_eq!(&got, &expected, "driver_partner_index for driver {}", d);
                // city_trips_index joins BASE (city) and STATUS (status).
                let city = Uuid::from_u128(0xc000 + d as u128);
                let query = IndexQuery { index: "city_trips_index".into(), shard_values: vec![Literal::String(city.to_string())], first: Some(100), ..Default::default() };
                let page = store.query_index("trips", &query).await.unwrap();
                let got: BTreeMap<Uuid, cellgate_store::storage::Value> = page.entries.iter().map(|e| (e.row_key, e.fields.iter().find(|f| &*f.0 == "status").unwrap().1.clone())).collect();
                let want: BTreeMap<Uuid, cellgate_store::storage::Value> = expected.iter().map(|row| {
                    let r = rows.iter().position(|x| x == row).unwrap();
                    let status = latest(r, false).map_or(cellgate_store::storage::Value::Null(cellgate_store::storage::ColType::Text), |s| cellgate_store::storage::Value::Text(status_body(s)["status"].as_str().unwrap().into()));
                    (*row, status)
                }).collect();
                prop_assert_eq!(got, want, "city_trips_index for city {}", d);
            }
            Ok(())
        })?;
    }
}

// A buffered copy that cannot be decoded (damage on disk) is left in the
// buffer by replay; it is listed, and set aside on request into the
// conflicts table of its primary with its bytes, after which the buffer is
// empty and the conflict listed.
#[tokio::test]
async fn an_undecodable_buffered_copy_is_listed_and_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = three_clusters(dir.path(), 1);
    config.clusters.truncate(2);
    let store = Store::open(harness::definitions(), StoreOptions::new(config))
        .await
        .unwrap();
    // A row whose primary is `two`; its copy sits in `one`'s buffer.
    let row = std::iter::repeat_with(Uuid::new_v4)
        .find(|r| {
            let shard = cellgate_store::shards::row_shard(r, harness::TRIP_SHARDS);
            u64::from(shard) * 2 >= u64::from(harness::TRIP_SHARDS)
        })
        .unwrap();
    let shard = cellgate_store::shards::row_shard(&row, harness::TRIP_SHARDS);
    let one = dir.path().join("one.db");
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", one.display()))
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO trips_buffer (batch_id, shard, row_key, column_name, ref_key, body, created_at) VALUES (?, ?, ?, 'NOTES', 1, ?, 0)",
    )
    .bind(Uuid::new_v4().as_bytes().as_slice())
    .bind(i64::from(shard))
    .bind(row.as_bytes().as_slice())
    .bind(vec![0xffu8, 1, 2, 3])
    .execute(&mut conn)
    .await
    .unwrap();
    // Replay passes leave it where it is.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(buffered_rows(&one, "1 = 1").await, 1);
    let copies = store.buffer_undecodable("trips").await.unwrap();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let copy = &copies[0];
    assert_eq!(
        (copy.cluster.as_str(), copy.key.row_key, copy.bytes),
        ("one", row, 4)
    );

    // A copy that is not there, or on another cluster, is refused.
    let missing = store.buffer_set_aside("trips", "two", copy.buffer_id).await;
    assert_eq!(missing.unwrap_err().code(), "BAD_USER_INPUT");
    let key = store
        .buffer_set_aside("trips", "one", copy.buffer_id)
        .await
        .unwrap();
    assert_eq!(key.row_key, row);
    assert_eq!(buffered_rows(&one, "1 = 1").await, 0);
    assert!(store.buffer_undecodable("trips").await.unwrap().is_empty());
    let conflicts = store.buffer_conflicts("trips", 10).await.unwrap();
    assert_eq!(conflicts.len(), 1, "{conflicts:?}");
    assert_eq!(conflicts[0].key.row_key, row);
    assert_eq!(conflicts[0].body_hash, "undecodable");
    assert_eq!(conflicts[0].buffered_on, "one");
    store.shutdown(std::time::Duration::from_secs(5)).await;
}

// A version with a copy still in a buffer (its primary's replicas do not
// have it yet, or its delete failed) is not pruned: replay would bring it
// back as a new cell. Once the copy is gone, the next prune deletes it.
#[tokio::test]
async fn prune_keeps_a_version_while_a_buffer_copy_of_it_waits() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = three_clusters(dir.path(), 1);
    config.clusters.truncate(2);
    let mut options = StoreOptions::new(config);
    // No replay pass may release the copy under the test.
    options.replay_buffers = false;
    let store = Store::open(harness::definitions(), options).await.unwrap();
    let row = std::iter::repeat_with(Uuid::new_v4)
        .find(|r| {
            let shard = cellgate_store::shards::row_shard(r, harness::TRIP_SHARDS);
            u64::from(shard) * 2 >= u64::from(harness::TRIP_SHARDS)
        })
        .unwrap();
    let shard = cellgate_store::shards::row_shard(&row, harness::TRIP_SHARDS);
    for version in 1..=2 {
        let written = store
            .put_cell(
                "trips",
                cell(row, "NOTES", version, json!({ "v": version })),
            )
            .await
            .unwrap();
        assert_eq!(written, PutStatus::Written);
    }
    store.sync_indexes().await.unwrap();
    // A copy of version 1 waits in `one`'s buffer.
    let one = dir.path().join("one.db");
    let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", one.display()))
        .await
        .unwrap();
    let encoded = cellgate_store::cells::codec::encode(&json!({ "v": 1 })).unwrap();
    sqlx::query(
        "INSERT INTO trips_buffer (batch_id, shard, row_key, column_name, ref_key, body, created_at) VALUES (?, ?, ?, 'NOTES', 1, ?, 0)",
    )
    .bind(Uuid::new_v4().as_bytes().as_slice())
    .bind(i64::from(shard))
    .bind(row.as_bytes().as_slice())
    .bind(encoded)
    .execute(&mut conn)
    .await
    .unwrap();
    let prune = cellgate_store::cells::PruneOptions {
        keep: Some(1),
        ..Default::default()
    };
    let report = store
        .prune_cells("trips", &prune, &mut |_| {})
        .await
        .unwrap();
    let total = report.total();
    assert_eq!(
        (total.deleted, total.kept_for_buffers),
        (0, 1),
        "{report:?}"
    );
    let history = store
        .history("trips", row, "NOTES", 10, None)
        .await
        .unwrap();
    assert_eq!(history.len(), 2);

    sqlx::query("DELETE FROM trips_buffer")
        .execute(&mut conn)
        .await
        .unwrap();
    let report = store
        .prune_cells("trips", &prune, &mut |_| {})
        .await
        .unwrap();
    let total = report.total();
    assert_eq!(
        (total.deleted, total.kept_for_buffers),
        (1, 0),
        "{report:?}"
    );
    store.shutdown(std::time::Duration::from_secs(5)).await;
}

/// The executions of a prepared statement that `pg_prepared_statements`
/// counts as (generic, custom) plans, after running `SELECT $1 + 1` eight
/// times with different values on a one-connection pool of `url`.
async fn plans_of_eight_executions(url: &str) -> (i64, i64) {
    use cellgate_store::storage::{ColType, Dialect, Sql, Value};
    let backend = one_connection(url).await;
    for n in 0..8 {
        let mut sql = Sql::new(Dialect::Postgres);
        sql.push("SELECT ").bind(Value::Int(n)).push(" + 1");
        let rows = backend.fetch(&sql, &[ColType::Int]).await.unwrap();
        assert_eq!(rows[0][0], Value::Int(n + 1));
    }
    // The pool's only connection: the session that prepared the statement.
    let mut sql = Sql::new(Dialect::Postgres);
    sql.push(
        "SELECT generic_plans, custom_plans FROM pg_prepared_statements \
         WHERE statement = 'SELECT $1 + 1'",
    );
    let rows = backend
        .fetch(&sql, &[ColType::Int, ColType::Int])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    match (&rows[0][0], &rows[0][1]) {
        (Value::Int(generic), Value::Int(custom)) => (*generic, *custom),
        other => panic!("{other:?}"),
    }
}

// PostgreSQL planned every execution of an index page again for its values
// (its default `plan_cache_mode`), which cost a third of its CPU per page.
#[tokio::test]
async fn postgres_statements_are_planned_once_per_connection_unless_the_url_says_otherwise() {
    let Ok(url) = std::env::var("CELLGATE_TEST_POSTGRES_URL") else {
        eprintln!("skipped: CELLGATE_TEST_POSTGRES_URL is not set");
        return;
    };
    assert_eq!(plans_of_eight_executions(&url).await, (8, 0));
    let separator = if url.contains('?') { '&' } else { '?' };
    let auto = format!("{url}{separator}options=-c%20plan_cache_mode%3Dauto");
    let (_, custom) = plans_of_eight_executions(&auto).await;
    // `auto` plans the first five executions for their values.
    assert!(custom >= 5, "{custom}");
}

// A row's latest cell was found by reading every version of it: MariaDB
// answered a correlated `MAX(ref_key)` so, and every backend's latest-cells
// statements (index maintenance, pages with bodies without the cell cache,
// the latest reads) scanned each pair's versions. Each pair is now one
// backward step on the unique key. The statements run on a row with 300
// versions of a column among 2,000 other rows; the database says how much
// of the cells table it read beyond the first entry of each lookup.
#[tokio::test]
async fn latest_cells_are_found_without_reading_their_older_versions() {
    let mut ran = 0;
    if let Ok(base) = std::env::var("CELLGATE_TEST_MYSQL_URL") {
        latest_cells_read_one_version(Server::MariaDb, &base).await;
        ran += 1;
    }
    if let Ok(base) = std::env::var("CELLGATE_TEST_POSTGRES_URL") {
        latest_cells_read_one_version(Server::Postgres, &base).await;
        ran += 1;
    }
    if ran == 0 {
        eprintln!("skipped: neither CELLGATE_TEST_MYSQL_URL nor CELLGATE_TEST_POSTGRES_URL is set");
    }
}

#[derive(Clone, Copy, Debug)]
enum Server {
    MariaDb,
    Postgres,
}

async fn latest_cells_read_one_version(server: Server, base: &str) {
    use cellgate_store::cells::{
        latest_cells_sql, with_latest_cells, with_latest_ref_keys, CELL_TYPES,
    };
    use cellgate_store::storage::{ColType, Sql, Value};
    let (url, drop_it) = scratch_database(server, base, "latest").await;
    let mut options = StoreOptions::new(StorageConfig::single(&url));
    options.maintain_indexes = false;
    let store = Store::open(harness::definitions(), options).await.unwrap();
    let (row, other) = (Uuid::new_v4(), Uuid::new_v4());
    let versions = 300;
    let mut cells: Vec<NewCell> = (1..=versions)
        .map(|v| cell(row, "BASE", v, json!({"v": v})))
        .collect();
    cells.push(cell(row, "STATUS", 1, json!({"status": "done"})));
    cells.extend((1..=3).map(|v| cell(other, "BASE", v, json!({"v": v}))));
    // Other rows, so that a scan of the whole table costs more than reading
    // the 300 versions through the unique key.
    cells.extend((0..2000).map(|v| cell(Uuid::new_v4(), "BASE", 1, json!({"v": v}))));
    for batch in cells.chunks(1000) {
        for result in store.put_cells("trips", batch.to_vec()).await.unwrap() {
            assert_eq!(result.unwrap(), PutStatus::Written);
        }
    }
    store.shutdown(std::time::Duration::from_secs(5)).await;

    let backend = one_connection(&url).await;
    let dialect = backend.dialect();
    let columns = ["BASE", "STATUS"];
    // The rows of a page: `row` and `other`, by their lowest version.
    let mut page = Sql::new(dialect);
    page.push(
        "SELECT row_key FROM trips_cells WHERE column_name = 'BASE' AND ref_key = 1 AND row_key",
    )
    .in_list([Value::Uuid(row), Value::Uuid(other)]);
    // Each statement, the (row, column, ref key) it finds, and the column
    // types of its result with the positions of those three.
    let cell_types: Vec<ColType> = CELL_TYPES.to_vec();
    let mut paged_types = vec![ColType::Uuid];
    paged_types.extend(cell_types.iter().copied());
    let found = |rows: Vec<Vec<Value>>, at: [usize; 3]| -> BTreeSet<(Uuid, String, i64)> {
        rows.into_iter()
            .filter_map(|r| match (&r[at[0]], &r[at[1]], &r[at[2]]) {
                (Value::Uuid(k), Value::Text(c), Value::Int(v)) => Some((*k, c.clone(), *v)),
                _ => None,
            })
            .collect()
    };
    let latest: BTreeSet<(Uuid, String, i64)> = [
        (row, "BASE".to_string(), versions),
        (row, "STATUS".to_string(), 1),
        (other, "BASE".to_string(), 3),
    ]
    .into();
    let statements = [
        (
            "latest cells",
            latest_cells_sql(dialect, "trips_cells", &[row, other], &columns),
            cell_types.clone(),
        ),
        (
            "a page with cells",
            with_latest_cells(&page, "trips_cells", &columns),
            paged_types.clone(),
        ),
    ];
    for (what, sql, types) in statements {
        let (rows, read) = rows_and_reads(server, &*backend, &sql, &types).await;
        let at = if types.len() == cell_types.len() {
            [2, 3, 4]
        } else {
            [3, 4, 5]
        };
        assert_eq!(found(rows, at), latest, "{server:?}: {what}");
        assert!(
            read < 50,
            "{server:?}: {what}: {read} read for the latest of {versions} versions"
        );
    }
    let sql = with_latest_ref_keys(&page, "trips_cells", &columns);
    let types = [ColType::Uuid, ColType::Int, ColType::Int];
    let (rows, read) = rows_and_reads(server, &*backend, &sql, &types).await;
    let mut refs = rows;
    refs.sort_by_key(|r| r[0].as_uuid() != Some(row));
    assert_eq!(
        refs,
        vec![
            vec![Value::Uuid(row), Value::Int(versions), Value::Int(1)],
            vec![Value::Uuid(other), Value::Int(3), Value::Null(ColType::Int)],
        ],
        "{server:?}: latest ref keys"
    );
    assert!(
        read < 50,
        "{server:?}: latest ref keys: {read} read for the latest of {versions} versions"
    );
    drop_it.await;
}

/// The rows of `sql` and how much of the cells table the database read for
/// them beyond one entry per lookup: on MariaDB the session's
/// `Handler_read_next`, `Handler_read_prev` and `Handler_read_rnd_next`
/// (rows read in index order, backwards, and in a scan, including the few
/// of the statement's own small temporary tables), on PostgreSQL the rows
/// returned by the scans of `trips_cells` in `EXPLAIN ANALYZE`, less the
/// scans' loops.
async fn rows_and_reads(
    server: Server,
    backend: &dyn cellgate_store::storage::Backend,
    sql: &cellgate_store::storage::Sql,
    types: &[cellgate_store::storage::ColType],
) -> (Vec<Vec<cellgate_store::storage::Value>>, u64) {
    use cellgate_store::storage::{ColType, Dialect, Sql, Value};
    let text = |v: &Value| match v {
        Value::Text(t) => t.clone(),
        other => panic!("{other:?}"),
    };
    match server {
        Server::MariaDb => {
            let mut status = Sql::new(Dialect::MySql);
            status.push(
                "SHOW SESSION STATUS WHERE Variable_name IN \
                 ('Handler_read_next', 'Handler_read_prev', 'Handler_read_rnd_next')",
            );
            let count = || async {
                let rows = backend
                    .fetch(&status, &[ColType::Text, ColType::Text])
                    .await
                    .unwrap();
                rows.iter()
                    .map(|r| text(&r[1]).parse::<u64>().unwrap())
                    .sum::<u64>()
            };
            let before = count().await;
            let rows = backend.fetch(sql, types).await.unwrap();
            (rows, count().await - before)
        }
        Server::Postgres => {
            let rows = backend.fetch(sql, types).await.unwrap();
            let mut explain = Sql::new(Dialect::Postgres);
            explain.push("EXPLAIN (ANALYZE, TIMING OFF) ").append(sql);
            let plan = backend.fetch(&explain, &[ColType::Text]).await.unwrap();
            let mut read = 0;
            for line in plan.iter().map(|r| text(&r[0])) {
                if !line.contains(" on trips_cells ") {
                    continue;
                }
                let number = |key: &str| -> u64 {
                    let at = line.rfind(key).unwrap_or_else(|| panic!("{line}")) + key.len();
                    line[at..]
                        .split(|c: char| !c.is_ascii_digit())
                        .next()
                        .unwrap()
                        .parse()
                        .unwrap()
                };
                let (returned, loops) = (number("rows="), number("loops="));
                read += (returned * loops).saturating_sub(loops);
            }
            (rows, read)
        }
    }
}

/// A new empty database named `cg_<prefix>_<random>` on the server of
/// `base`, its URL, and a future that drops it.
async fn scratch_database(
    server: Server,
    base: &str,
    prefix: &str,
) -> (
    String,
    std::pin::Pin<Box<dyn std::future::Future<Output = ()>>>,
) {
    let (head, _) = base.rsplit_once('/').unwrap();
    match server {
        Server::MariaDb => {
            let (name, mut admin) = scratch_mysql_database(base, prefix).await;
            let url = format!("{head}/{name}");
            let drop_it = async move {
                let _ = sqlx::query(&format!("DROP DATABASE {name}"))
                    .execute(&mut admin)
                    .await;
            };
            (url, Box::pin(drop_it))
        }
        Server::Postgres => {
            let name = format!("cg_{prefix}_{}", &Uuid::new_v4().simple().to_string()[..8]);
            let url = format!("{head}/{name}");
            let mut admin = sqlx::PgConnection::connect(base).await.unwrap();
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&mut admin)
                .await
                .unwrap();
            let drop_it = async move {
                let _ = sqlx::query(&format!("DROP DATABASE {name} WITH (FORCE)"))
                    .execute(&mut admin)
                    .await;
            };
            (url, Box::pin(drop_it))
        }
    }
}

/// A new empty database on the MariaDB server of `base`, named
/// `cg_<prefix>_<random>`, and an admin connection to drop it with.
async fn scratch_mysql_database(base: &str, prefix: &str) -> (String, sqlx::MySqlConnection) {
    let name = format!("cg_{prefix}_{}", &Uuid::new_v4().simple().to_string()[..8]);
    let mut admin = sqlx::MySqlConnection::connect(base).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .unwrap();
    (name, admin)
}

/// A pool of one connection to `url`: every statement runs in one session,
/// whose own counters a test can then read.
async fn one_connection(url: &str) -> std::sync::Arc<dyn cellgate_store::storage::Backend> {
    let options = cellgate_store::storage::ConnectOptions {
        cluster: "main".to_string(),
        max_connections: 1,
        acquire_timeout: std::time::Duration::from_secs(10),
        statement_timeout: std::time::Duration::from_secs(10),
        background: false,
    };
    cellgate_store::storage::connect(url, &options)
        .await
        .unwrap_or_else(|e| panic!("{url}: {e}"))
}
