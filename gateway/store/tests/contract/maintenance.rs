//! The index maintenance contract: values a backend cannot store, several
//! gateways on one store, and work nobody was woken for.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use cellgate_store::cells::NewCell;
use cellgate_store::indexes::IndexQuery;
use cellgate_store::shards::row_shard;
use cellgate_store::storage::Value;
use cellgate_store::Store;
use index_dsl::Literal;
use serde_json::json;
use uuid::Uuid;

use crate::harness::{Env, TRIP_SHARDS};

fn fast(options: &mut cellgate_store::StoreOptions) {
    options.maintenance.lease_time = Duration::from_secs(2);
    options.maintenance.sweep_every = Duration::from_millis(100);
}

async fn entries(
    store: &Store,
    datastore: &str,
    index: &str,
    shard_value: &str,
) -> BTreeMap<Uuid, Vec<(std::sync::Arc<str>, Value)>> {
    let mut out = BTreeMap::new();
    let mut after = None;
    loop {
        let page = store
            .query_index(
                datastore,
                &IndexQuery {
                    index: index.into(),
                    shard_values: vec![Literal::String(shard_value.to_string())],
                    first: Some(1000),
                    after: after.clone(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        out.extend(page.entries.iter().map(|e| (e.row_key, e.fields.clone())));
        if !page.has_next_page {
            return out;
        }
        after = page.end_cursor;
    }
}

// Regression: one indexed string with U+0000 was refused by PostgreSQL on
// every retry and no later row of its shard was ever indexed.
pub async fn unstorable_values_do_not_stall_a_shard(env: Arc<Env>) {
    let store = env.open_tuned(fast).await;
    let owner = format!("owner-{}", Uuid::new_v4());
    // Every row in the same cell shard, the normal one last.
    let shard = 1234;
    let mut keys = Vec::new();
    while keys.len() < 7 {
        let key = Uuid::new_v4();
        if row_shard(&key, TRIP_SHARDS) == shard {
            keys.push(key);
        }
    }
    let bodies = [
        json!({"owner": owner, "s": "nul\u{0}inside"}),
        json!({"owner": owner, "s": "x".repeat(300)}),
        json!({"owner": owner, "t": "0500-01-01T00:00:00Z"}),
        json!({"owner": owner, "n": u64::MAX}),
        json!({"owner": format!("{owner}\u{0}"), "s": "shard field with NUL: no entry"}),
        // Regression: MySQL stored datetimes after 2038 as NULL (they were
        // sent as TIMESTAMP parameters).
        json!({"owner": owner, "x": 1e308, "t": "9999-12-31T23:59:59Z"}),
        json!({"owner": owner, "s": "normal", "n": 7, "t": "2024-05-01T00:00:00Z"}),
    ];
    for (key, body) in keys.iter().zip(bodies) {
        store
            .put_cell(
                "items",
                NewCell {
                    row_key: *key,
                    column: "DATA".into(),
                    ref_key: 1,
                    body,
                },
            )
            .await
            .unwrap();
    }
    store.sync_indexes().await.unwrap();
    let found = entries(&store, "items", "items_index", &owner).await;
    let field = |row: &Uuid, name: &str| -> Value {
        found[row]
            .iter()
            .find(|(n, _)| &**n == name)
            .unwrap()
            .1
            .clone()
    };
    assert_eq!(
        found.len(),
        6,
        "every row but the one with a NUL shard field: {found:?}"
    );
    assert!(field(&keys[0], "s").is_null(), "NUL string stored as null");
    assert!(
        field(&keys[1], "s").is_null(),
        "overlong string stored as null"
    );
    assert!(field(&keys[2], "t").is_null(), "year 500 stored as null");
    assert!(field(&keys[3], "n").is_null(), "u64::MAX stored as null");
    assert!(!found.contains_key(&keys[4]));
    assert_eq!(field(&keys[5], "x"), Value::Float(1e308));
    assert!(!field(&keys[5], "t").is_null(), "year 9999 is storable");
    assert_eq!(field(&keys[6], "s"), Value::Text("normal".into()));
    assert_eq!(field(&keys[6], "n"), Value::Int(7));
    let metrics = store.metrics();
    let items = metrics
        .datastores
        .iter()
        .find(|d| d.name == "items")
        .unwrap();
    assert!(
        items.maintenance.unstorable_values >= 5,
        "{:?}",
        items.maintenance
    );
    assert!(store.quarantine("items").await.unwrap().is_empty());
    // A query for a value that can never be stored is refused clearly.
    let err = store
        .query_index(
            "items",
            &IndexQuery {
                index: "items_index".into(),
                shard_values: vec![Literal::String(owner.clone())],
                filter: Some("s = \"a\u{0}b\"".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), "BAD_USER_INPUT", "{err}");
}

// Regression: maintenance started only from this process's own writes; a
// cell written elsewhere (or whose wake-up was lost) was never indexed.
pub async fn the_sweep_indexes_cells_nobody_announced(env: Arc<Env>) {
    let maintaining = env.open_tuned(fast).await;
    let silent = env.open_with(false).await;
    let driver = Uuid::new_v4();
    let row = Uuid::new_v4();
    silent
        .put_cell(
            "trips",
            NewCell {
                row_key: row,
                column: "BASE".into(),
                ref_key: 1,
                body: json!({"driver_partner_uuid": driver.to_string(), "trip_created_at": "2024-01-01T00:00:00Z"}),
            },
        )
        .await
        .unwrap();
    for _ in 0..300 {
        let found = entries(
            &maintaining,
            "trips",
            "driver_partner_index",
            &driver.to_string(),
        )
        .await;
        if found.contains_key(&row) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the sweep never indexed a cell written by another store");
}

// Regression: two gateways raced: one that read a row before the other
// moved its shard field re-inserted the old entry, which stayed forever.
pub async fn two_gateways_moving_shard_fields_agree_with_a_recomputation(env: Arc<Env>) {
    let a = env.open_tuned(fast).await;
    let b = env.open_tuned(fast).await;
    let drivers: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    let rows: Vec<Uuid> = (0..40).map(|_| Uuid::new_v4()).collect();
    let writers: Vec<_> = [a.clone(), b.clone()]
        .into_iter()
        .enumerate()
        .map(|(w, store)| {
            let drivers = drivers.clone();
            let rows = rows.clone();
            tokio::spawn(async move {
                let mut latest: BTreeMap<(Uuid, i64), Option<usize>> = BTreeMap::new();
                for round in 0..15i64 {
                    let cells: Vec<NewCell> = rows
                        .iter()
                        .enumerate()
                        .map(|(i, row)| {
                            let ref_key = round * 2 + w as i64 + 1;
                            // Some versions drop the shard field altogether.
                            let driver = (!(i + round as usize + w).is_multiple_of(7))
                                .then_some((i * 3 + round as usize * 5 + w) % drivers.len());
                            latest.insert((*row, ref_key), driver);
                            let body = match driver {
                                Some(d) => json!({"driver_partner_uuid": drivers[d].to_string(), "trip_created_at": "2024-01-01T00:00:00Z"}),
                                None => json!({"note": "no driver"}),
                            };
                            NewCell { row_key: *row, column: "BASE".into(), ref_key, body }
                        })
                        .collect();
                    for result in store.put_cells("trips", cells).await.unwrap() {
                        result.unwrap();
                    }
                }
                latest
            })
        })
        .collect();
    let mut versions: BTreeMap<(Uuid, i64), Option<usize>> = BTreeMap::new();
    for writer in writers {
        versions.extend(writer.await.unwrap());
    }
    a.sync_indexes().await.unwrap();
    b.sync_indexes().await.unwrap();
    // The recomputation: the driver of each row's highest ref key.
    let mut expected: BTreeMap<usize, BTreeSet<Uuid>> = BTreeMap::new();
    for row in &rows {
        let latest = versions
            .range((*row, i64::MIN)..=(*row, i64::MAX))
            .next_back()
            .unwrap();
        if let Some(d) = latest.1 {
            expected.entry(*d).or_default().insert(*row);
        }
    }
    for (d, driver) in drivers.iter().enumerate() {
        for store in [&a, &b] {
            let got: BTreeSet<Uuid> =
                entries(store, "trips", "driver_partner_index", &driver.to_string())
                    .await
                    .into_keys()
                    .collect();
            assert_eq!(
                got,
                expected.get(&d).cloned().unwrap_or_default(),
                "driver {d}"
            );
        }
    }
    let held: usize = [&a, &b]
        .iter()
        .map(|s| {
            s.metrics()
                .datastores
                .iter()
                .find(|d| d.name == "trips")
                .unwrap()
                .maintenance
                .buckets_held
        })
        .sum();
    // 64 buckets per cluster.
    let buckets = 64 * env.urls().len();
    assert!(held <= buckets, "no bucket held twice: {held} of {buckets}");
}

// Regression: with many concurrent writers the maintainer queued behind
// them for the request pool's connections, and the indexes fell seconds
// behind. Here the store's only request connection is held by a write
// waiting on a lock; its maintainer must still index a cell another store
// wrote (found by the sweep). SQLite shares one pool by design.
pub async fn maintenance_does_not_wait_behind_requests(env: Arc<Env>) {
    use sqlx::Connection;
    if env.kind == crate::harness::Kind::Sqlite {
        return;
    }
    let silent = env.open_with(false).await;
    let busy = env
        .open_tuned(|options| {
            fast(options);
            options.storage.max_connections = 1;
            options.storage.timeout_ms = 120_000;
        })
        .await;
    let base = |row: Uuid, driver: Uuid| NewCell {
        row_key: row,
        column: "BASE".into(),
        ref_key: 1,
        body: json!({"driver_partner_uuid": driver.to_string(), "trip_created_at": "2024-01-01T00:00:00Z"}),
    };
    // Another session locks the shard counter the held write needs.
    let held_row = Uuid::new_v4();
    let lock = format!(
        "SELECT next_added_id FROM trips_shards WHERE shard = {} FOR UPDATE",
        row_shard(&held_row, TRIP_SHARDS)
    );
    let mut locker: Box<dyn std::any::Any> = match env.kind {
        crate::harness::Kind::Postgres => {
            let mut conn = sqlx::PgConnection::connect(&env.url).await.unwrap();
            sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
            sqlx::query(&lock).fetch_all(&mut conn).await.unwrap();
            Box::new(conn)
        }
        _ => {
            let mut conn = sqlx::MySqlConnection::connect(&env.url).await.unwrap();
            sqlx::query("BEGIN").execute(&mut conn).await.unwrap();
            sqlx::query(&lock).fetch_all(&mut conn).await.unwrap();
            Box::new(conn)
        }
    };
    let held = {
        let busy = busy.clone();
        tokio::spawn(async move { busy.put_cell("trips", base(held_row, Uuid::new_v4())).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "the write did not wait for the lock");

    let driver = Uuid::new_v4();
    let row = Uuid::new_v4();
    silent.put_cell("trips", base(row, driver)).await.unwrap();
    let mut indexed = false;
    for _ in 0..1500 {
        let found = entries(
            &silent,
            "trips",
            "driver_partner_index",
            &driver.to_string(),
        )
        .await;
        if found.contains_key(&row) {
            indexed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !held.is_finished(),
        "the write stopped waiting before the check"
    );
    // Releasing the lock lets the held write through.
    drop(std::mem::replace(&mut locker, Box::new(())));
    held.await.unwrap().unwrap();
    assert!(
        indexed,
        "the maintainer waited behind a request for the request pool's connection"
    );
}

fn maintenance_of(store: &Store, datastore: &str) -> cellgate_store::indexes::MaintenanceMetrics {
    store
        .metrics()
        .datastores
        .iter()
        .find(|d| d.name == datastore)
        .unwrap()
        .maintenance
        .clone()
}

// Bodies read from JSON text into MessagePack (`codec::PackBody`, the
// compiled GraphQL write) are stored as their values would be, and index
// maintenance takes the members it reads from the write as well.
pub async fn bodies_written_as_text_read_back_and_are_indexed_without_decoding(env: Arc<Env>) {
    use serde::de::DeserializeSeed;
    let store = env.open_tuned(fast).await;
    let owner = format!("owner-\u{e9}-{}", Uuid::new_v4());
    let keep = store.index_members("items").unwrap();
    let text_of = |n: i64| {
        // Members out of order, one given twice (the last counts), an
        // escaped name, and members no index reads.
        format!(
            r#"{{"z": [1, {{"b": 2, "a": 1}}], "n": -1, "\u006fwner": {}, "x": 1.5, "n": {n}, "note": "\u00e9"}}"#,
            serde_json::to_string(&owner).unwrap()
        )
    };
    let put = |rows: &[Uuid], n: i64| {
        let cells = rows
            .iter()
            .map(|row| {
                let text = text_of(n);
                let mut json = serde_json::Deserializer::from_str(&text);
                let body = cellgate_store::cells::codec::PackBody { keep: Some(&keep) }
                    .deserialize(&mut json)
                    .unwrap();
                NewCell {
                    row_key: *row,
                    column: "DATA".into(),
                    ref_key: 1,
                    body,
                }
            })
            .collect::<Vec<_>>();
        let store = &store;
        async move {
            let (results, _) = store
                .put_packed_cells_with_token("items", cells)
                .await
                .unwrap();
            for result in results {
                result.unwrap();
            }
            store.sync_indexes().await.unwrap();
        }
    };
    // The first write's passes also take this process's leases.
    let warm: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
    put(&warm, 0).await;
    let before = maintenance_of(&store, "items");
    let rows: Vec<Uuid> = (0..50).map(|_| Uuid::new_v4()).collect();
    put(&rows, 2).await;
    let after = maintenance_of(&store, "items");
    assert!(
        after.bodies_reused >= before.bodies_reused + 50,
        "the bodies written as text were decoded again: {before:?} → {after:?}"
    );
    assert_eq!(after.bodies_decoded, before.bodies_decoded, "{after:?}");
    let found = entries(&store, "items", "items_index", &owner).await;
    assert_eq!(found.len(), 70);
    for row in &rows {
        let fields: BTreeMap<_, _> = found[row].iter().cloned().collect();
        assert_eq!(fields["n"], Value::Int(2), "row {row}");
        assert_eq!(fields["x"], Value::Float(1.5), "row {row}");
    }
    // Read back, the body is the value the text parses to, and writing
    // that value again is a duplicate: the bytes stored are the value's.
    let expected: serde_json::Value = serde_json::from_str(&text_of(2)).unwrap();
    let cell = store
        .get_cell(
            "items",
            &cellgate_store::cells::CellKey {
                row_key: rows[0],
                column: "DATA".into(),
                ref_key: 1,
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(cell.body, expected);
    let again = NewCell {
        row_key: rows[0],
        column: "DATA".into(),
        ref_key: 1,
        body: expected,
    };
    assert_eq!(
        store.put_cell("items", again).await.unwrap(),
        cellgate_store::cells::PutStatus::Duplicate
    );
}

// Index maintenance takes the bodies of the cells this process just wrote
// from the write instead of reading them back and decoding them, but a
// row's entry still comes from its latest cell by ref key: a late write
// of an older version changes nothing, and is not what gets indexed.
pub async fn maintenance_reuses_written_bodies_but_indexes_the_latest_cell(env: Arc<Env>) {
    let store = env.open_tuned(fast).await;
    let owner = format!("owner-{}", Uuid::new_v4());
    let put = |rows: &[Uuid], ref_key: i64, n: i64| {
        let cells = rows
            .iter()
            .map(|row| NewCell {
                row_key: *row,
                column: "DATA".into(),
                ref_key,
                body: json!({"owner": owner, "n": n}),
            })
            .collect::<Vec<_>>();
        let store = &store;
        async move {
            for result in store.put_cells("items", cells).await.unwrap() {
                result.unwrap();
            }
            store.sync_indexes().await.unwrap();
        }
    };
    // The first write's passes also take this process's leases.
    let warm: Vec<Uuid> = (0..20).map(|_| Uuid::new_v4()).collect();
    put(&warm, 1, 0).await;
    let before = maintenance_of(&store, "items");
    let rows: Vec<Uuid> = (0..50).map(|_| Uuid::new_v4()).collect();
    put(&rows, 2, 2).await;
    let after = maintenance_of(&store, "items");
    assert!(
        after.bodies_reused > before.bodies_reused,
        "the written bodies were decoded again: {before:?} → {after:?}"
    );
    // An older version of a row, written after its latest one.
    put(&rows[..5], 1, 1).await;
    let found = entries(&store, "items", "items_index", &owner).await;
    for row in &rows {
        let n = &found[row]
            .iter()
            .find(|(name, _)| &**name == "n")
            .unwrap()
            .1;
        assert_eq!(*n, Value::Int(2), "row {row} is indexed from ref key 2");
    }
    assert_eq!(found.len(), 70);
    let last = maintenance_of(&store, "items");
    assert!(
        last.bodies_decoded > after.bodies_decoded,
        "the latest cells of the rows written again were not written last, so they were decoded: {after:?} → {last:?}"
    );
}
