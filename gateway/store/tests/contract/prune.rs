//! Retention (`Store::prune_cells`): old versions go, chunk by chunk, while
//! every latest version stays readable with its body, `history` shrinks by
//! exactly what was deleted, cells a log consumer has not read yet or a
//! quarantine record names stay, and the indexes verify clean afterwards.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellgate_store::cells::{NewCell, PruneOptions, PruneProgress, PruneReport};
use cellgate_store::indexes::{Drift, VerifyOptions, VerifyProgress};
use cellgate_store::triggers::{ConsumerOptions, Delivery, Handler};
use cellgate_store::Store;
use serde_json::json;
use uuid::Uuid;

use crate::harness::{Env, TRIP_SHARDS};

const ROWS: usize = 24;

/// The BASE body of version `v` of a trip row (its driver and city stay,
/// the fare changes).
fn base(driver: Uuid, city: Uuid, v: i64) -> serde_json::Value {
    json!({
        "driver_partner_uuid": driver.to_string(),
        "city_uuid": city.to_string(),
        "trip_created_at": "2024-05-01T10:00:00Z",
        "fare": {"total": v as f64 + 0.5},
    })
}

fn new_cell(row: Uuid, column: &str, ref_key: i64, body: serde_json::Value) -> NewCell {
    NewCell {
        row_key: row,
        column: column.into(),
        ref_key,
        body,
    }
}

async fn put(store: &Store, cells: Vec<NewCell>) {
    for result in store.put_cells("trips", cells).await.unwrap() {
        result.unwrap();
    }
}

async fn prune(store: &Store, options: PruneOptions) -> PruneReport {
    let mut last = PruneProgress::default();
    let report = store
        .prune_cells("trips", &options, &mut |p: &PruneProgress| last = *p)
        .await
        .expect("prune runs");
    assert_eq!(last.shards_done, TRIP_SHARDS, "progress covers every shard");
    assert_eq!(report.shards, TRIP_SHARDS);
    report
}

async fn refs(store: &Store, row: Uuid, column: &str) -> Vec<i64> {
    store
        .history("trips", row, column, 100, None)
        .await
        .unwrap()
        .iter()
        .map(|c| c.ref_key)
        .collect()
}

/// Verifies every index of `trips` and fails on any drift.
async fn assert_indexes_clean(store: &Store) {
    let mut drift = Vec::new();
    let report = store
        .verify_indexes(
            "trips",
            &VerifyOptions {
                duty: 1.0,
                restart: true,
                ..VerifyOptions::default()
            },
            &mut |_: &VerifyProgress| {},
            &mut |d: &Drift| drift.push(d.clone()),
        )
        .await
        .expect("verify runs");
    assert!(drift.is_empty(), "drift after the prune: {drift:?}");
    assert_eq!(report.progress.pending, 0, "{report:?}");
}

/// Rows with BASE versions 1–5 (written 5, 1, 3, 2, 4: insertion order is
/// not version order), STATUS versions 1–3 and one NOTES version.
async fn write_rows(store: &Store, city: Uuid) -> Vec<(Uuid, Uuid)> {
    let rows: Vec<(Uuid, Uuid)> = (0..ROWS)
        .map(|_| (Uuid::new_v4(), Uuid::new_v4()))
        .collect();
    for v in [5, 1, 3, 2, 4] {
        put(
            store,
            rows.iter()
                .map(|(r, d)| new_cell(*r, "BASE", v, base(*d, city, v)))
                .collect(),
        )
        .await;
    }
    for v in 1..=3 {
        put(
            store,
            rows.iter()
                .map(|(r, _)| new_cell(*r, "STATUS", v, json!({"status": format!("s{v}")})))
                .collect(),
        )
        .await;
    }
    put(
        store,
        rows.iter()
            .map(|(r, _)| new_cell(*r, "NOTES", 1, json!({"note": r.to_string()})))
            .collect(),
    )
    .await;
    rows
}

pub async fn prune_keeps_every_latest_version_and_the_indexes_verify_clean(env: Arc<Env>) {
    let store = env.open().await;
    let city = Uuid::new_v4();
    let rows = write_rows(&store, city).await;
    store.sync_indexes().await.unwrap();
    let n = ROWS as u64;

    // Bad options are refused before anything runs.
    let none = store
        .prune_cells("trips", &PruneOptions::default(), &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(none.code(), "BAD_USER_INPUT", "{none}");
    let zero = PruneOptions {
        keep: Some(0),
        ..PruneOptions::default()
    };
    let zero = store
        .prune_cells("trips", &zero, &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(zero.code(), "BAD_USER_INPUT", "{zero}");
    let column = PruneOptions {
        keep: Some(1),
        column: Some("NOPE".into()),
        ..PruneOptions::default()
    };
    let column = store
        .prune_cells("trips", &column, &mut |_| {})
        .await
        .unwrap_err();
    assert_eq!(column.code(), "UNKNOWN_COLUMN");

    // A dry run counts and deletes nothing.
    let dry = prune(
        &store,
        PruneOptions {
            keep: Some(1),
            dry_run: true,
            ..PruneOptions::default()
        },
    )
    .await;
    assert_eq!(dry.total().examined, n * 9);
    assert_eq!(dry.total().deleted, n * 6);
    assert_eq!(refs(&store, rows[0].0, "BASE").await, vec![5, 4, 3, 2, 1]);

    // Two newest BASE versions kept; the other columns untouched.
    let two = prune(
        &store,
        PruneOptions {
            keep: Some(2),
            column: Some("BASE".into()),
            ..PruneOptions::default()
        },
    )
    .await;
    let counts = two.columns["BASE"];
    assert_eq!(
        (
            counts.examined,
            counts.deleted,
            counts.kept_latest,
            counts.kept_recent
        ),
        (n * 5, n * 3, n, n),
        "{two:?}"
    );
    assert_eq!(two.columns.keys().collect::<Vec<_>>(), vec!["BASE"]);
    for (row, _) in &rows {
        assert_eq!(refs(&store, *row, "BASE").await, vec![5, 4]);
        assert_eq!(refs(&store, *row, "STATUS").await, vec![3, 2, 1]);
    }

    // Then only the latest of every column.
    let one = prune(
        &store,
        PruneOptions {
            keep: Some(1),
            ..PruneOptions::default()
        },
    )
    .await;
    let total = one.total();
    assert_eq!(
        (total.examined, total.deleted, total.kept_latest),
        (n * 6, n * 3, n * 3),
        "{one:?}"
    );
    assert_eq!(total.kept_for_consumers + total.kept_for_quarantine, 0);
    assert_eq!(one.columns["NOTES"].deleted, 0);
    for (row, driver) in &rows {
        assert_eq!(refs(&store, *row, "BASE").await, vec![5]);
        assert_eq!(refs(&store, *row, "STATUS").await, vec![3]);
        assert_eq!(refs(&store, *row, "NOTES").await, vec![1]);
        let latest = store
            .get_cell_latest("trips", *row, "BASE")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(latest.body, base(*driver, city, 5));
        let status = store
            .get_cell_latest("trips", *row, "STATUS")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(status.body, json!({"status": "s3"}));
    }
    // Nothing more to delete.
    let again = prune(
        &store,
        PruneOptions {
            keep: Some(1),
            ..PruneOptions::default()
        },
    )
    .await;
    assert_eq!(again.total().deleted, 0);
    assert_eq!(again.total().kept_latest, n * 3);

    // Index maintenance goes on: a new version after the prune is indexed.
    let (row, driver) = rows[0];
    put(
        &store,
        vec![new_cell(row, "BASE", 6, base(driver, city, 6))],
    )
    .await;
    store.sync_indexes().await.unwrap();
    let page = store
        .query_index("trips", &crate::by_driver(driver))
        .await
        .unwrap();
    assert_eq!(crate::rows_of(&page), vec![row]);
    assert_indexes_clean(&store).await;
    store.shutdown(Duration::from_secs(5)).await;
}

pub async fn prune_older_than_keeps_recent_versions_and_the_latest(env: Arc<Env>) {
    let store = env.open().await;
    let city = Uuid::new_v4();
    let rows: Vec<(Uuid, Uuid)> = (0..ROWS)
        .map(|_| (Uuid::new_v4(), Uuid::new_v4()))
        .collect();
    // Versions 1–3 of every row, then (after `mid`) versions 4–5 of the
    // first half; the second half's latest version is old.
    for v in 1..=3 {
        put(
            &store,
            rows.iter()
                .map(|(r, d)| new_cell(*r, "BASE", v, base(*d, city, v)))
                .collect(),
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    let mid = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (fresh, stale) = rows.split_at(ROWS / 2);
    for v in 4..=5 {
        put(
            &store,
            fresh
                .iter()
                .map(|(r, d)| new_cell(*r, "BASE", v, base(*d, city, v)))
                .collect(),
        )
        .await;
    }
    store.sync_indexes().await.unwrap();
    let half = (ROWS / 2) as u64;

    // Both: only versions past the newest 3 *and* older than `mid`.
    let both = prune(
        &store,
        PruneOptions {
            keep: Some(3),
            created_before: Some(mid),
            ..PruneOptions::default()
        },
    )
    .await;
    assert_eq!(both.total().deleted, half * 2, "{both:?}");
    for (row, _) in fresh {
        assert_eq!(refs(&store, *row, "BASE").await, vec![5, 4, 3]);
    }
    for (row, _) in stale {
        assert_eq!(refs(&store, *row, "BASE").await, vec![3, 2, 1]);
    }

    // Older than `mid` alone: every old version but a row's latest.
    let old = prune(
        &store,
        PruneOptions {
            created_before: Some(mid),
            ..PruneOptions::default()
        },
    )
    .await;
    let total = old.total();
    assert_eq!(total.deleted, half + half * 2, "{old:?}");
    assert_eq!(total.kept_latest, half * 2);
    assert_eq!(total.kept_recent, half, "version 4 of the fresh rows");
    for (row, driver) in fresh {
        assert_eq!(refs(&store, *row, "BASE").await, vec![5, 4]);
        let latest = store
            .get_cell_latest("trips", *row, "BASE")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(latest.body, base(*driver, city, 5));
    }
    for (row, driver) in stale {
        assert_eq!(refs(&store, *row, "BASE").await, vec![3]);
        let latest = store
            .get_cell_latest("trips", *row, "BASE")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(latest.body, base(*driver, city, 3));
    }
    assert_indexes_clean(&store).await;
    store.shutdown(Duration::from_secs(5)).await;
}

pub async fn prune_keeps_cells_a_consumer_has_not_read(env: Arc<Env>) {
    let store = env.open().await;
    let city = Uuid::new_v4();
    let rows: Vec<(Uuid, Uuid)> = (0..ROWS)
        .map(|_| (Uuid::new_v4(), Uuid::new_v4()))
        .collect();
    let write = |store: Store, v: i64| {
        let rows = rows.clone();
        async move {
            put(
                &store,
                rows.iter()
                    .map(|(r, d)| new_cell(*r, "BASE", v, base(*d, city, v)))
                    .collect(),
            )
            .await
        }
    };
    write(store.clone(), 1).await;
    write(store.clone(), 2).await;
    store.sync_indexes().await.unwrap();
    store.shutdown(Duration::from_secs(5)).await;

    // Without maintenance the index offsets stay where they are: versions
    // 3 and 4 are not applied yet.
    let held = env.open_with(false).await;
    write(held.clone(), 3).await;
    write(held.clone(), 4).await;
    let n = ROWS as u64;
    let report = prune(
        &held,
        PruneOptions {
            keep: Some(1),
            ..PruneOptions::default()
        },
    )
    .await;
    let total = report.total();
    assert_eq!(
        (total.deleted, total.kept_for_consumers, total.kept_latest),
        (n * 2, n, n),
        "{report:?}"
    );
    assert!(
        report.held_back_by.keys().all(|c| c.starts_with("ix:")) && !report.held_back_by.is_empty(),
        "{report:?}"
    );
    assert_eq!(report.held_back_by.values().sum::<u64>(), n);
    for (row, _) in &rows {
        assert_eq!(refs(&held, *row, "BASE").await, vec![4, 3]);
    }

    // Once applied, version 3 goes too, and the index agrees.
    held.sync_indexes().await.unwrap();
    let after = prune(
        &held,
        PruneOptions {
            keep: Some(1),
            ..PruneOptions::default()
        },
    )
    .await;
    assert_eq!(after.total().deleted, n, "{after:?}");
    assert!(after.held_back_by.is_empty());
    for (row, driver) in &rows {
        assert_eq!(refs(&held, *row, "BASE").await, vec![4]);
        let page = held
            .query_index("trips", &crate::by_driver(*driver))
            .await
            .unwrap();
        assert_eq!(crate::rows_of(&page), vec![*row]);
    }
    assert_indexes_clean(&held).await;
    held.shutdown(Duration::from_secs(5)).await;
}

pub async fn prune_keeps_cells_a_quarantine_names(env: Arc<Env>) {
    let store = env.open().await;
    // A trigger consumer that refuses poison cells: one lands in its
    // quarantine, and its offsets move past it.
    let seen: Arc<Mutex<BTreeMap<(u32, i64), ()>>> = Arc::default();
    let poisoned = Arc::new(AtomicBool::new(true));
    let record = seen.clone();
    let refuse = poisoned.clone();
    let handler: Handler = Arc::new(move |delivery: Delivery| {
        let record = record.clone();
        let refuse = refuse.clone();
        Box::pin(async move {
            if refuse.load(Ordering::Relaxed)
                && delivery
                    .cells
                    .iter()
                    .any(|c| c.body["poison"] == json!(true))
            {
                return Err("refused a poison cell".to_string());
            }
            let mut seen = record.lock().unwrap();
            for cell in &delivery.cells {
                seen.insert((cell.shard, cell.added_id), ());
            }
            Ok(())
        })
    });
    let options = ConsumerOptions {
        columns: vec!["NOTES".into()],
        min_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        max_attempts: 2,
        sweep_every: Duration::from_millis(100),
        ..ConsumerOptions::new("keeper", "trips")
    };
    let consumer = store.start_consumer(options, handler).unwrap();
    let (poisoned_row, plain_row) = (Uuid::new_v4(), Uuid::new_v4());
    put(
        &store,
        vec![
            new_cell(poisoned_row, "NOTES", 1, json!({"poison": true})),
            new_cell(plain_row, "NOTES", 1, json!({"n": 1})),
        ],
    )
    .await;
    put(
        &store,
        vec![
            new_cell(poisoned_row, "NOTES", 2, json!({"n": 2})),
            new_cell(plain_row, "NOTES", 2, json!({"n": 2})),
        ],
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let quarantined = store.trigger_quarantine("trips", "keeper").await.unwrap();
        let lag = store.trigger_lag("trips", "keeper").await.unwrap();
        if !quarantined.is_empty()
            && seen.lock().unwrap().len() == 3
            && lag.iter().all(|l| l.pending_cells == 0)
        {
            break;
        }
        assert!(Instant::now() < deadline, "the poison cell is quarantined");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store.sync_indexes().await.unwrap();

    let report = prune(
        &store,
        PruneOptions {
            keep: Some(1),
            column: Some("NOTES".into()),
            ..PruneOptions::default()
        },
    )
    .await;
    let notes = report.columns["NOTES"];
    assert_eq!(
        (notes.deleted, notes.kept_for_quarantine, notes.kept_latest),
        (1, 1, 2),
        "{report:?}"
    );
    assert_eq!(refs(&store, poisoned_row, "NOTES").await, vec![2, 1]);
    assert_eq!(refs(&store, plain_row, "NOTES").await, vec![2]);
    consumer.stop().await;
    store.shutdown(Duration::from_secs(5)).await;
}

pub async fn prune_while_writing_keeps_every_latest_version(env: Arc<Env>) {
    let store = env.open().await;
    let city = Uuid::new_v4();
    let rows: Vec<(Uuid, Uuid)> = (0..ROWS)
        .map(|_| (Uuid::new_v4(), Uuid::new_v4()))
        .collect();
    // A writer adds versions 1–30 of every row, a batch per version, while
    // prunes run beside it; `acked` is the last version acknowledged.
    let acked = Arc::new(std::sync::atomic::AtomicI64::new(0));
    let writer = {
        let store = store.clone();
        let rows = rows.clone();
        let acked = acked.clone();
        tokio::spawn(async move {
            for v in 1..=30 {
                put(
                    &store,
                    rows.iter()
                        .map(|(r, d)| new_cell(*r, "BASE", v, base(*d, city, v)))
                        .collect(),
                )
                .await;
                acked.store(v, Ordering::SeqCst);
            }
        })
    };
    let mut deleted = 0;
    let mut rounds = 0;
    while !writer.is_finished() {
        let report = store
            .prune_cells(
                "trips",
                &PruneOptions {
                    keep: Some(1),
                    ..PruneOptions::default()
                },
                &mut |_| {},
            )
            .await
            .expect("prune runs");
        deleted += report.total().deleted;
        rounds += 1;
        // Every row still has the newest version acknowledged before the
        // read (or a newer one), with its body.
        let before = acked.load(Ordering::SeqCst);
        for (row, driver) in &rows {
            let history = refs(&store, *row, "BASE").await;
            assert!(history.windows(2).all(|w| w[0] > w[1]), "{history:?}");
            if before > 0 {
                assert!(
                    history.first().is_some_and(|newest| *newest >= before),
                    "version {before} was acknowledged, history is {history:?}"
                );
                let latest = store
                    .get_cell_latest("trips", *row, "BASE")
                    .await
                    .unwrap()
                    .unwrap();
                assert_eq!(latest.body, base(*driver, city, latest.ref_key));
            }
        }
    }
    assert!(rounds > 0);
    writer.await.unwrap();
    store.sync_indexes().await.unwrap();
    let last = prune(
        &store,
        PruneOptions {
            keep: Some(1),
            ..PruneOptions::default()
        },
    )
    .await;
    deleted += last.total().deleted;
    assert_eq!(deleted, ROWS as u64 * 29, "every older version went, once");
    for (row, driver) in &rows {
        assert_eq!(refs(&store, *row, "BASE").await, vec![30]);
        let latest = store
            .get_cell_latest("trips", *row, "BASE")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(latest.body, base(*driver, city, 30));
    }
    assert_indexes_clean(&store).await;
    store.shutdown(Duration::from_secs(5)).await;
}
