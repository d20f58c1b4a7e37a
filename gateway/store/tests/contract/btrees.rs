//! B-trees follow the queries: a field with `sort: false` is stored and
//! filtered on the entries of the range a query reads, never ordered by;
//! adding its b-tree back is an online rebuild whose previous version
//! answers meanwhile.

use std::sync::Arc;

use cellgate_store::cells::NewCell;
use cellgate_store::indexes::{IndexQuery, OrderBy};
use cellgate_store::Error;
use index_dsl::Literal;
use serde_json::json;
use uuid::Uuid;

use crate::harness::Env;

const TRIPS: &str = "name: trips\ncolumns:\n  - name: BASE\n";
const STORED_CITY: &str = "table: by_driver\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: driver, type: UUID }\n      - { field: at, type: datetime }\n      - { field: city, type: string, sort: false }\n";
const SORTED_CITY: &str = "table: by_driver\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: driver, type: UUID }\n      - { field: at, type: datetime }\n      - { field: city, type: string }\n";

fn files(index: &'static str) -> Vec<(&'static str, &'static str)> {
    vec![
        ("trips/datastore.yaml", TRIPS),
        ("trips/indexes/by_driver.yaml", index),
    ]
}

fn in_lviv(driver: Uuid, order: Option<(&str, bool)>) -> IndexQuery {
    IndexQuery {
        index: "by_driver".into(),
        shard_values: vec![Literal::String(driver.to_string())],
        filter: Some(r#"city = "Lviv" and at >= "2024-02-01T00:00:10Z""#.into()),
        order_by: order
            .map(|(field, descending)| OrderBy {
                field: field.into(),
                descending,
            })
            .into_iter()
            .collect(),
        first: Some(1000),
        ..Default::default()
    }
}

pub async fn a_field_without_a_b_tree_filters_but_cannot_order(env: Arc<Env>) {
    let store = env
        .open_custom(&files(STORED_CITY), env.storage(), false)
        .await
        .unwrap();
    // One driver's 60 trips, every third in Lviv.
    let driver = Uuid::new_v4();
    let cells: Vec<NewCell> = (0..60)
        .map(|i| NewCell {
            row_key: Uuid::new_v4(),
            column: "BASE".into(),
            ref_key: 1,
            body: json!({
                "driver": driver.to_string(),
                "at": format!("2024-02-01T00:00:{i:02}Z"),
                "city": if i % 3 == 0 { "Lviv" } else { "Kyiv" },
            }),
        })
        .collect();
    for result in store.put_cells("trips", cells).await.unwrap() {
        result.unwrap();
    }
    store.sync_indexes().await.unwrap();

    // A residual condition on the stored-only field, ordered by a field
    // with a b-tree: every match, newest first.
    let page = store
        .query_index("trips", &in_lviv(driver, Some(("at", true))))
        .await
        .unwrap();
    let seconds: Vec<String> = page
        .entries
        .iter()
        .map(|e| format!("{:?}", e.fields[1].1))
        .collect();
    assert_eq!(
        page.entries.len(),
        16,
        "trips 12, 15, … 57 are in Lviv after :10"
    );
    assert!(
        page.entries
            .iter()
            .all(|e| e.fields[2].1 == cellgate_store::storage::Value::Text("Lviv".into())),
        "{seconds:?}"
    );
    let mut sorted = seconds.clone();
    sorted.sort();
    sorted.reverse();
    assert_eq!(seconds, sorted, "newest first");

    // Ordering by it is refused, naming the fields that can order.
    let refused = store
        .query_index("trips", &in_lviv(driver, Some(("city", false))))
        .await
        .unwrap_err();
    match refused {
        Error::BadInput(message) => {
            assert!(message.contains("sort: false"), "{message}");
            assert!(message.contains("driver, at"), "{message}");
        }
        other => panic!("expected BAD_USER_INPUT, got {other:?}"),
    }

    // The explanation: the range of the `at` b-tree, the city checked on
    // each entry of it, and the database's own plan.
    let explained = store
        .explain_index_query("trips", &in_lviv(driver, Some(("at", true))))
        .await
        .unwrap();
    assert_eq!(explained.btree, ["driver", "at", "row_key"]);
    assert_eq!(
        explained.residual,
        [r#"city = "Lviv" (no b-tree: `sort: false`)"#]
    );
    assert_eq!(explained.bounds.len(), 2, "{:?}", explained.bounds);
    assert_eq!(explained.version, 1);
    assert!(!explained.previous);
    assert_eq!(explained.statements.len(), 1);
    let database_plan = explained.statements[0].database_plan.join("\n");
    assert!(!database_plan.is_empty());
    // No b-tree of the city exists for the database to use.
    assert!(
        !database_plan.contains("_k3") && !database_plan.contains(r#""k3""#),
        "{database_plan}"
    );

    // Giving the field its b-tree back is a new version; the previous one
    // answers meanwhile, also pages ordered by the field (it sorts them).
    let report = store
        .reload(
            index_dsl::load_files(std::path::Path::new("defs"), files(SORTED_CITY))
                .expect("definitions"),
        )
        .await
        .unwrap();
    assert_eq!(
        report.changes,
        ["index `by_driver` of `trips` changed: version 2 replaces version 1 (filled from the cell log; version 1 answers the queries it can answer until then)"]
    );
    let by_city = store
        .query_index("trips", &in_lviv(driver, Some(("city", false))))
        .await
        .unwrap();
    assert_eq!(by_city.entries.len(), 16);
    let explained = store
        .explain_index_query("trips", &in_lviv(driver, Some(("city", false))))
        .await
        .unwrap();
    assert_eq!((explained.version, explained.previous), (1, true));
    assert!(
        explained.order.contains("sorted on the entries"),
        "{}",
        explained.order
    );

    store.sync_indexes().await.unwrap();
    let explained = store
        .explain_index_query("trips", &in_lviv(driver, Some(("city", false))))
        .await
        .unwrap();
    assert_eq!((explained.version, explained.previous), (2, false));
    assert_eq!(explained.btree, ["driver", "city", "row_key"]);
    assert!(explained
        .residual
        .iter()
        .all(|r| !r.contains("sort: false")));
    let after = store
        .query_index("trips", &in_lviv(driver, Some(("city", false))))
        .await
        .unwrap();
    assert_eq!(after.entries.len(), 16);
}
