//! The partial index contract: only rows whose latest cells satisfy the
//! index's `where:` predicate have entries, rows enter and leave as new
//! versions of their cells start or stop matching, and a changed predicate
//! is a new index version built from the log.

use std::collections::BTreeSet;
use std::sync::Arc;

use cellgate_store::cells::NewCell;
use cellgate_store::indexes::IndexQuery;
use cellgate_store::Store;
use index_dsl::{CompareOp, Literal};
use serde_json::json;
use uuid::Uuid;

use crate::harness::Env;

const TRIPS: &str = "name: trips\ncolumns:\n  - name: BASE\n  - name: STATUS\n";

/// Completed trips with a fare, by city: the predicate reads both columns,
/// by field name (`status`) and by field path (`fare.total`).
const COMPLETED: &str = "table: completed_by_city\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: city, type: string }\n      - { field: fare.total, name: fare_total, type: float }\n  - column_key: STATUS\n    fields:\n      - { field: status, type: string }\nwhere: status = \"completed\" and fare.total > 0\n";

fn definitions(predicate: &str) -> String {
    let base = COMPLETED.rsplit_once("where:").unwrap().0;
    format!("{base}where: '{predicate}'\n")
}

fn put(row_key: Uuid, column: &str, ref_key: i64, body: serde_json::Value) -> NewCell {
    NewCell {
        row_key,
        column: column.into(),
        ref_key,
        body,
    }
}

async fn write(store: &Store, cells: Vec<NewCell>) {
    for result in store.put_cells("trips", cells).await.unwrap() {
        result.unwrap();
    }
}

/// The rows of `city` in the index, as a set.
async fn rows_in(store: &Store, city: &str) -> BTreeSet<Uuid> {
    let page = store
        .query_index(
            "trips",
            &IndexQuery {
                index: "completed_by_city".into(),
                shard_values: vec![Literal::String(city.into())],
                first: Some(1000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    page.entries.iter().map(|e| e.row_key).collect()
}

pub async fn a_partial_index_holds_the_rows_its_predicate_selects(env: Arc<Env>) {
    let defs = [
        ("trips/datastore.yaml", TRIPS),
        ("trips/indexes/completed_by_city.yaml", COMPLETED),
    ];
    let store = env.open_custom(&defs, env.storage(), true).await.unwrap();
    let city = format!("Oslo-{}", Uuid::new_v4());
    let other_city = format!("Rome-{}", Uuid::new_v4());
    let [paid, free, open, no_status, moving, late] = [(); 6].map(|_| Uuid::new_v4());
    let base = |fare: f64| json!({"city": city, "fare": {"total": fare, "currency": "EUR"}});
    let status = |s: &str| json!({ "status": s });
    write(
        &store,
        vec![
            put(paid, "BASE", 1, base(10.0)),
            put(paid, "STATUS", 1, status("completed")),
            put(free, "BASE", 1, base(0.0)),
            put(free, "STATUS", 1, status("completed")),
            put(open, "BASE", 1, base(5.0)),
            put(open, "STATUS", 1, status("requested")),
            put(no_status, "BASE", 1, base(5.0)),
            put(moving, "BASE", 1, base(7.0)),
            put(moving, "STATUS", 1, status("completed")),
            put(late, "STATUS", 1, status("completed")),
        ],
    )
    .await;
    store.sync_indexes().await.unwrap();
    assert_eq!(rows_in(&store, &city).await, BTreeSet::from([paid, moving]));

    // `paid` stops matching (a new status), `open` starts (a new status),
    // `free` starts (a new fare), `late` gets its BASE cell and enters,
    // and `moving` keeps matching but moves to another city.
    write(
        &store,
        vec![
            put(paid, "STATUS", 2, status("canceled")),
            put(open, "STATUS", 2, status("completed")),
            put(free, "BASE", 2, base(3.5)),
            put(late, "BASE", 1, base(2.0)),
            put(
                moving,
                "BASE",
                2,
                json!({"city": other_city, "fare": {"total": 7.0}}),
            ),
        ],
    )
    .await;
    store.sync_indexes().await.unwrap();
    assert_eq!(
        rows_in(&store, &city).await,
        BTreeSet::from([open, free, late])
    );
    assert_eq!(rows_in(&store, &other_city).await, BTreeSet::from([moving]));

    // A cell older than the row's latest changes nothing: the row stays
    // out.
    write(&store, vec![put(paid, "BASE", 0, base(99.0))]).await;
    store.sync_indexes().await.unwrap();
    assert!(!rows_in(&store, &city).await.contains(&paid));

    // Queries on the partial index filter and read fields as usual.
    let page = store
        .query_index(
            "trips",
            &IndexQuery {
                index: "completed_by_city".into(),
                shard_values: vec![Literal::String(city.clone())],
                conditions: vec![crate::cond(
                    "fare_total",
                    CompareOp::Gt,
                    vec![Literal::Float(3.0)],
                )],
                first: Some(1000),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let rows: BTreeSet<Uuid> = page.entries.iter().map(|e| e.row_key).collect();
    assert_eq!(rows, BTreeSet::from([open, free]));
    assert!(page.entries.iter().all(|e| e
        .fields
        .iter()
        .any(|(name, value)| &**name == "status" && value.as_text() == Some("completed"))));

    // A verify recomputes the same entries: rows outside the predicate
    // (tombstones) are no drift.
    let options = cellgate_store::indexes::VerifyOptions {
        duty: 1.0,
        restart: true,
        ..Default::default()
    };
    let mut drift = Vec::new();
    let report = store
        .verify_indexes("trips", &options, &mut |_| {}, &mut |d| {
            drift.push(d.clone())
        })
        .await
        .unwrap();
    assert!(drift.is_empty(), "{drift:#?}");
    assert!(report.progress.rows >= 6, "{report:?}");
}

pub async fn a_changed_predicate_builds_a_new_version(env: Arc<Env>) {
    let v1 = definitions(r#"status = "completed""#);
    let files = |index: &str| {
        vec![
            ("trips/datastore.yaml", TRIPS.to_owned()),
            ("trips/indexes/completed_by_city.yaml", index.to_owned()),
        ]
    };
    let open = |index: String, maintain: bool| {
        let env = env.clone();
        async move {
            let files = files(&index);
            let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
            env.open_custom(&files, env.storage(), maintain)
                .await
                .unwrap()
        }
    };
    let store = open(v1, true).await;
    let city = format!("Lima-{}", Uuid::new_v4());
    let mut by_status: Vec<(Uuid, &str)> = Vec::new();
    let mut cells = Vec::new();
    for (i, s) in ["completed", "canceled", "requested"]
        .iter()
        .cycle()
        .take(30)
        .enumerate()
    {
        let row = Uuid::new_v4();
        by_status.push((row, s));
        cells.push(put(
            row,
            "BASE",
            1,
            json!({"city": city, "fare": {"total": i as f64}}),
        ));
        cells.push(put(row, "STATUS", 1, json!({ "status": s })));
    }
    write(&store, cells).await;
    store.sync_indexes().await.unwrap();
    let rows_with = |wanted: &[&str]| -> BTreeSet<Uuid> {
        by_status
            .iter()
            .filter(|(_, s)| wanted.contains(s))
            .map(|(row, _)| *row)
            .collect()
    };
    assert_eq!(rows_in(&store, &city).await, rows_with(&["completed"]));
    drop(store);

    // Another predicate selects other rows: version 2, built from the log;
    // meanwhile version 1 answers, with the rows its predicate selects.
    let v2 = definitions(r#"status in ("completed", "canceled")"#);
    let store = open(v2, false).await;
    let status: Vec<_> = store
        .indexes("trips")
        .unwrap()
        .into_iter()
        .map(|i| (i.version, i.ready, i.serves_until))
        .collect();
    assert_eq!(status, [(2, false, None), (1, true, Some(2))]);
    assert!(
        store
            .warnings()
            .iter()
            .any(|w| w.contains("building version 2") && w.contains("version 1 answers")),
        "{:?}",
        store.warnings()
    );
    assert_eq!(rows_in(&store, &city).await, rows_with(&["completed"]));
    store.sync_indexes().await.unwrap();
    assert_eq!(
        rows_in(&store, &city).await,
        rows_with(&["completed", "canceled"])
    );
    drop(store);

    // The same predicate written another way (a qualified name, other
    // spacing) is the same version, ready at once.
    let v2_reworded = definitions(r#"STATUS.status   in ("completed","canceled")"#);
    let store = open(v2_reworded, false).await;
    let status = &store.indexes("trips").unwrap()[0];
    assert_eq!((status.version, status.ready), (2, true));
    assert_eq!(
        rows_in(&store, &city).await,
        rows_with(&["completed", "canceled"])
    );
}
