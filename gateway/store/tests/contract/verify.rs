//! Verify and repair of indexes, on two clusters: drift injected into the
//! index tables (deleted, stale and extra entries, one of them on the
//! wrong cluster) is found key by key, repaired, and a second run is
//! clean; an interrupted run resumes where it stopped.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cellgate_store::cells::NewCell;
use cellgate_store::indexes::{Drift, DriftKind, VerifyOptions, VerifyProgress, VerifyReport};
use cellgate_store::shards::value_shard;
use cellgate_store::storage::Value;
use cellgate_store::{Store, StoreOptions};
use serde_json::json;
use uuid::Uuid;

use crate::harness::{self, Env, Kind, DEFINITIONS, TRIP_SHARDS};

const SPLIT: u32 = TRIP_SHARDS / 2;

async fn open(env: &Env) -> Store {
    let defs = index_dsl::load_files(std::path::Path::new("defs"), DEFINITIONS.iter().copied())
        .unwrap_or_else(|e| panic!("test definitions are invalid:\n{e}"));
    let mut options = StoreOptions::new(env.storage());
    options.maintenance.lease_time = Duration::from_secs(2);
    options.maintenance.sweep_every = Duration::from_millis(100);
    Store::open(defs, options).await.expect("store opens")
}

fn trip(row: Uuid, driver: Uuid, city: Uuid) -> NewCell {
    NewCell {
        row_key: row,
        column: "BASE".into(),
        ref_key: 1,
        body: json!({
            "driver_partner_uuid": driver.to_string(),
            "city_uuid": city.to_string(),
            "trip_created_at": "2024-05-01T10:00:00.123456Z",
            "fare": {"total": 12.5},
        }),
    }
}

/// The URL of the cluster holding the index entries of shard field `value`.
fn entry_url(env: &Env, value: Uuid) -> String {
    let shard = value_shard(&Value::Uuid(value), TRIP_SHARDS).unwrap();
    if shard < SPLIT {
        env.url.clone()
    } else {
        env.second.clone().expect("two clusters")
    }
}

fn other_url(env: &Env, url: &str) -> String {
    if url == env.url {
        env.second.clone().expect("two clusters")
    } else {
        env.url.clone()
    }
}

/// A UUID literal of the backend.
fn uuid_sql(kind: Kind, value: Uuid) -> String {
    match kind {
        Kind::Postgres => format!("'{value}'"),
        _ => format!("X'{}'", value.simple()),
    }
}

async fn verify(store: &Store, options: VerifyOptions) -> (VerifyReport, Vec<Drift>) {
    let mut drift = Vec::new();
    let report = store
        .verify_indexes(
            "trips",
            &options,
            &mut |_: &VerifyProgress| {},
            &mut |d: &Drift| drift.push(d.clone()),
        )
        .await
        .expect("verify runs");
    (report, drift)
}

fn full(repair: bool) -> VerifyOptions {
    VerifyOptions {
        indexes: vec!["driver_partner_index".into()],
        repair,
        duty: 1.0,
        restart: true,
        ..VerifyOptions::default()
    }
}

pub async fn injected_drift_is_found_key_by_key_and_repaired(env: Arc<Env>) {
    let store = open(&env).await;
    let rows: Vec<(Uuid, Uuid)> = (0..120).map(|_| (Uuid::new_v4(), Uuid::new_v4())).collect();
    let city = Uuid::new_v4();
    let cells: Vec<NewCell> = rows.iter().map(|(r, d)| trip(*r, *d, city)).collect();
    store.put_cells("trips", cells).await.unwrap();
    store.sync_indexes().await.unwrap();

    let (clean, drift) = verify(&store, full(false)).await;
    assert!(drift.is_empty(), "a fresh index drifts: {drift:?}");
    assert_eq!(clean.progress.rows, 120, "{clean:?}");
    assert_eq!(clean.progress.shards_done, TRIP_SHARDS);

    let table = store.index_table("trips", "driver_partner_index").unwrap();
    let kind = env.kind;
    let [(missing, missing_driver), (stale, stale_driver), (moved, moved_driver), (model, model_driver)] =
        [rows[0], rows[1], rows[2], rows[3]];
    // Missing: the entry is deleted.
    harness::execute(
        kind,
        &entry_url(&env, missing_driver),
        &format!(
            "DELETE FROM {table} WHERE row_key = {}",
            uuid_sql(kind, missing)
        ),
    )
    .await;
    // Stale: a field no longer matches the cell.
    harness::execute(
        kind,
        &entry_url(&env, stale_driver),
        &format!(
            "UPDATE {table} SET city_uuid = NULL WHERE row_key = {}",
            uuid_sql(kind, stale)
        ),
    )
    .await;
    // Extra, on the wrong cluster: the row's tombstone there comes alive.
    let wrong = other_url(&env, &entry_url(&env, moved_driver));
    harness::execute(
        kind,
        &wrong,
        &format!(
            "UPDATE {table} SET _shard = 7 WHERE row_key = {}",
            uuid_sql(kind, moved)
        ),
    )
    .await;
    // Extra, of rows that have no cells at all: copies of ten rows' entries
    // under new row keys (so on both clusters with two).
    let mut orphans = Vec::new();
    for (model, model_driver) in
        std::iter::once((model, model_driver)).chain(rows[4..13].iter().copied())
    {
        let orphan = Uuid::new_v4();
        harness::execute(
            kind,
            &entry_url(&env, model_driver),
            &format!(
                "INSERT INTO {table} (row_key, _shard, driver_partner_uuid, _updated_at) \
                 SELECT {}, _shard, driver_partner_uuid, _updated_at FROM {table} WHERE row_key = {}",
                uuid_sql(kind, orphan),
                uuid_sql(kind, model)
            ),
        )
        .await;
        orphans.push(orphan);
    }

    let (found, drift) = verify(&store, full(false)).await;
    let seen: BTreeSet<(DriftKind, Uuid)> = drift.iter().map(|d| (d.kind, d.row_key)).collect();
    let expected: BTreeSet<(DriftKind, Uuid)> = [
        (DriftKind::Missing, missing),
        (DriftKind::Stale, stale),
        (DriftKind::Extra, moved),
    ]
    .into_iter()
    .chain(orphans.iter().map(|o| (DriftKind::Extra, *o)))
    .collect();
    assert_eq!(seen, expected, "{drift:#?}");
    assert_eq!(found.progress.drift(), 13);
    assert_eq!(found.progress.repaired, 0);
    let stale_report = drift.iter().find(|d| d.row_key == stale).unwrap();
    assert_eq!(
        stale_report.stored.as_ref().unwrap()["city_uuid"],
        json!(null)
    );
    assert_eq!(
        stale_report.expected.as_ref().unwrap()["city_uuid"],
        json!(city.to_string())
    );
    assert!(drift.iter().all(|d| !d.repaired));

    let (repaired, drift) = verify(&store, full(true)).await;
    assert_eq!(drift.len(), 13, "{drift:#?}");
    assert!(drift.iter().all(|d| d.repaired), "{drift:#?}");
    assert_eq!(repaired.progress.repaired, 13);

    let (again, drift) = verify(&store, full(false)).await;
    assert!(drift.is_empty(), "drift after the repair: {drift:#?}");
    assert_eq!(again.progress.rows, 120);
    // Queries see the repaired index.
    for (row, driver) in [
        (missing, missing_driver),
        (stale, stale_driver),
        (moved, moved_driver),
    ] {
        let page = store
            .query_index(
                "trips",
                &cellgate_store::indexes::IndexQuery {
                    index: "driver_partner_index".into(),
                    shard_values: vec![index_dsl::Literal::String(driver.to_string())],
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(
            page.entries.iter().map(|e| e.row_key).collect::<Vec<_>>(),
            vec![row]
        );
    }
    store.shutdown(Duration::from_secs(5)).await;
}

pub async fn an_interrupted_verify_resumes_where_it_stopped(env: Arc<Env>) {
    let store = open(&env).await;
    let cells: Vec<NewCell> = (0..60)
        .map(|_| trip(Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()))
        .collect();
    store.put_cells("trips", cells).await.unwrap();
    store.sync_indexes().await.unwrap();
    let options = VerifyOptions {
        restart: true,
        duty: 1.0,
        ..VerifyOptions::default()
    };
    // The first run is stopped after a few chunks, as a killed process
    // would be.
    let chunks = AtomicUsize::new(0);
    let third = tokio::sync::Notify::new();
    let mut on_progress = |p: &VerifyProgress| {
        assert!(p.shards_done <= p.shards_total);
        if chunks.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
            third.notify_one();
        }
    };
    let mut ignore = |_: &Drift| {};
    tokio::select! {
        outcome = store.verify_indexes("trips", &options, &mut on_progress, &mut ignore) => {
            panic!("the run ended before it could be stopped: {outcome:?}")
        }
        _ = third.notified() => {}
    }
    let checkpoint = store
        .last_verify("trips")
        .await
        .unwrap()
        .expect("a checkpoint");
    let next = checkpoint.next_shard.expect("an unfinished run");
    assert!(next > 0, "{checkpoint:?}");

    let resumed = VerifyOptions {
        restart: false,
        ..options.clone()
    };
    let (report, drift) = {
        let mut drift = Vec::new();
        let report = store
            .verify_indexes("trips", &resumed, &mut |_| {}, &mut |d: &Drift| {
                drift.push(d.clone())
            })
            .await
            .unwrap();
        (report, drift)
    };
    assert!(drift.is_empty(), "{drift:?}");
    assert_eq!(report.resumed_from, Some(next));
    assert_eq!(report.progress.shards_done, TRIP_SHARDS);
    // Both indexes of every row were compared, across both runs.
    assert_eq!(report.progress.rows, 120, "{report:?}");
    let done = store.last_verify("trips").await.unwrap().unwrap();
    assert_eq!(done.next_shard, None);
    store.shutdown(Duration::from_secs(5)).await;
}

/// The databases compare the entries on the first look (`verify/bulk.rs`):
/// a stored row that differs from its entry by the least step of any
/// field type, ref key or shard must still be found, on every backend.
pub async fn the_smallest_difference_of_any_field_is_stale(env: Arc<Env>) {
    let store = env.open().await;
    let kind = env.kind;
    let city_u = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    let item = |row: Uuid| {
        vec![
            NewCell {
                row_key: row,
                column: "DATA".into(),
                ref_key: 3,
                body: json!({
                    "owner": "alice",
                    "n": 41,
                    "x": 0.1,
                    "s": "Abc",
                    "t": "2024-05-01T10:00:00.123456Z",
                    "u": city_u.to_string(),
                }),
            },
            NewCell {
                row_key: row,
                column: "FLAGS".into(),
                ref_key: 5,
                body: json!({"b": true}),
            },
        ]
    };
    let (t_plus_1us, x_plus_ulps, b_flipped) = match kind {
        Kind::Sqlite => ("t + 1", "x + 0.000000000000001", "NOT b"),
        Kind::MySql => (
            "t + INTERVAL 1 MICROSECOND",
            "x + 0.000000000000001",
            "NOT b",
        ),
        Kind::Postgres => (
            "t + INTERVAL '1 microsecond'",
            "x + 0.000000000000001",
            "NOT b",
        ),
    };
    let other_u = uuid_sql(kind, Uuid::from_u128(city_u.as_u128() ^ 1));
    let edits: Vec<(&str, String)> = vec![
        ("an int off by one", "n = n + 1".into()),
        ("an int set NULL", "n = NULL".into()),
        ("a float by a few ulps", format!("x = {x_plus_ulps}")),
        ("a string's case", "s = 'abc'".into()),
        ("a string's trailing space", "s = 'Abc '".into()),
        ("a datetime by a microsecond", format!("t = {t_plus_1us}")),
        ("a uuid by a bit", format!("u = {other_u}")),
        ("a bool flipped", format!("b = {b_flipped}")),
        ("a ref key", "_ref_flags = _ref_flags + 1".into()),
        ("the shard", "_shard = _shard + 1".into()),
    ];
    let rows: Vec<Uuid> = (0..=edits.len()).map(|_| Uuid::new_v4()).collect();
    let cells: Vec<NewCell> = rows.iter().flat_map(|r| item(*r)).collect();
    store.put_cells("items", cells).await.unwrap();
    store.sync_indexes().await.unwrap();
    let table = store.index_table("items", "items_index").unwrap();
    for ((_, set), row) in edits.iter().zip(&rows) {
        harness::execute(
            kind,
            &env.url,
            &format!(
                "UPDATE {table} SET {set} WHERE row_key = {}",
                uuid_sql(kind, *row)
            ),
        )
        .await;
    }
    let mut drift = Vec::new();
    store
        .verify_indexes(
            "items",
            &VerifyOptions {
                restart: true,
                duty: 1.0,
                ..VerifyOptions::default()
            },
            &mut |_: &VerifyProgress| {},
            &mut |d: &Drift| drift.push(d.clone()),
        )
        .await
        .expect("verify runs");
    for ((what, _), row) in edits.iter().zip(&rows) {
        let found: Vec<DriftKind> = drift
            .iter()
            .filter(|d| d.row_key == *row)
            .map(|d| d.kind)
            .collect();
        assert_eq!(found, vec![DriftKind::Stale], "{what}: {drift:#?}");
    }
    // The last row was not touched.
    assert_eq!(drift.len(), edits.len(), "{drift:#?}");
    store.shutdown(Duration::from_secs(5)).await;
}

/// Two gateways on one datastore: while one runs a verify that records its
/// progress, a second such run is refused (a sampled one is not), and once
/// the first is stopped the next run goes ahead.
pub async fn a_second_recording_verify_waits_for_the_first(env: Arc<Env>) {
    let first = open(&env).await;
    let second = open(&env).await;
    let cells: Vec<NewCell> = (0..60)
        .map(|_| trip(Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4()))
        .collect();
    first.put_cells("trips", cells).await.unwrap();
    first.sync_indexes().await.unwrap();
    // The first run pauses 999 times as long as each chunk took (at most
    // 10 s): it is still under way, renewing its lease, when the second
    // one asks.
    let slow = VerifyOptions {
        restart: true,
        duty: 0.001,
        ..VerifyOptions::default()
    };
    let started = tokio::sync::Notify::new();
    let mut on_progress = |_: &VerifyProgress| started.notify_one();
    let mut ignore = |_: &Drift| {};
    let second_run = async {
        started.notified().await;
        let refused = second
            .verify_indexes("trips", &VerifyOptions::default(), &mut |_| {}, &mut |_| {})
            .await
            .expect_err("a second recording verify is refused");
        let sampled = second
            .verify_indexes(
                "trips",
                &VerifyOptions {
                    sample: Some(4),
                    ..VerifyOptions::default()
                },
                &mut |_| {},
                &mut |_| {},
            )
            .await;
        (refused, sampled)
    };
    let (refused, sampled) = tokio::select! {
        outcome = first.verify_indexes("trips", &slow, &mut on_progress, &mut ignore) => {
            panic!("the first run ended before the second asked: {outcome:?}")
        }
        both = second_run => both,
    };
    assert_eq!(refused.code(), "VERIFY_RUNNING", "{refused}");
    assert!(refused.to_string().contains("trips"), "{refused}");
    let sampled = sampled.expect("a sampled verify records nothing and runs beside");
    assert_eq!(sampled.progress.drift(), 0);
    // The first run was dropped: the next one goes ahead.
    let report = second
        .verify_indexes("trips", &VerifyOptions::default(), &mut |_| {}, &mut |_| {})
        .await
        .expect("the lease of a stopped run is taken over");
    assert_eq!(report.progress.drift(), 0);
    first.shutdown(Duration::from_secs(5)).await;
    second.shutdown(Duration::from_secs(5)).await;
}

// Extra entries of rows without cells are named one by one also past the
// first page of the orphan scan (over 10,000 index rows).
pub async fn extra_entries_of_rows_without_cells_are_named_past_the_first_page(env: Arc<Env>) {
    let store = open(&env).await;
    let city = Uuid::new_v4();
    let rows: Vec<(Uuid, Uuid)> = (0..12_000)
        .map(|_| (Uuid::new_v4(), Uuid::new_v4()))
        .collect();
    for part in rows.chunks(1000) {
        let cells: Vec<NewCell> = part.iter().map(|(r, d)| trip(*r, *d, city)).collect();
        for result in store.put_cells("trips", cells).await.unwrap() {
            result.expect("written");
        }
    }
    store.sync_indexes().await.unwrap();
    let table = store.index_table("trips", "driver_partner_index").unwrap();
    let mut orphans = BTreeSet::new();
    for (model, _) in rows.iter().step_by(400) {
        let orphan = Uuid::new_v4();
        harness::execute(
            env.kind,
            &env.url,
            &format!(
                "INSERT INTO {table} (row_key, _shard, driver_partner_uuid, _updated_at) \
                 SELECT {}, _shard, driver_partner_uuid, _updated_at FROM {table} WHERE row_key = {}",
                uuid_sql(env.kind, orphan),
                uuid_sql(env.kind, *model)
            ),
        )
        .await;
        orphans.insert(orphan);
    }
    let (report, drift) = verify(&store, full(true)).await;
    let named: BTreeSet<Uuid> = drift
        .iter()
        .filter(|d| d.kind == DriftKind::Extra)
        .map(|d| d.row_key)
        .collect();
    assert_eq!(named, orphans, "{:?}", report.progress);
    assert_eq!(report.progress.repaired, orphans.len() as u64);
    store.shutdown(Duration::from_secs(5)).await;
}
