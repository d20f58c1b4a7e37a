//! A partial index in the GraphQL API: its field answers with the rows its
//! `where:` predicate selects, and its description names the predicate.

use std::path::Path;

use cellgate_graphql::auth::Principal;
use cellgate_graphql::{build_schema, execute, sdl, GraphqlLimits};
use cellgate_store::cells::NewCell;
use cellgate_store::{StorageConfig, Store, StoreOptions};
use serde_json::json;
use uuid::Uuid;

const FILES: [(&str, &str); 2] = [
    (
        "trips/datastore.yaml",
        "name: trips\ncolumns:\n  - name: BASE\n  - name: STATUS\n",
    ),
    (
        "trips/indexes/completed_by_city.yaml",
        "table: completed_by_city\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: city, type: string }\n      - { field: fare.total, name: fare_total, type: float }\n  - column_key: STATUS\n    fields:\n      - { field: status, type: string }\nwhere: status = \"completed\"   and fare.total > 0\n",
    ),
];

#[tokio::test]
async fn a_partial_index_field_answers_with_the_rows_its_predicate_selects() {
    let defs = index_dsl::load_files(Path::new("defs"), FILES).unwrap();
    let text = sdl(&defs).unwrap();
    assert!(
        text.contains(
            "Partial: only rows whose latest cells satisfy `status = \"completed\" and fare.total > 0` have entries."
        ),
        "{text}"
    );

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("cellgate.db").display());
    let store = Store::open(defs, StoreOptions::new(StorageConfig::single(&url)))
        .await
        .unwrap();
    let (done, open) = (Uuid::new_v4(), Uuid::new_v4());
    let mut cells = Vec::new();
    for (row, status) in [(done, "completed"), (open, "requested")] {
        for (column, body) in [
            ("BASE", json!({"city": "Oslo", "fare": {"total": 12.5}})),
            ("STATUS", json!({ "status": status })),
        ] {
            cells.push(NewCell {
                row_key: row,
                column: column.into(),
                ref_key: 1,
                body,
            });
        }
    }
    for result in store.put_cells("trips", cells).await.unwrap() {
        result.unwrap();
    }
    store.sync_indexes().await.unwrap();

    let schema = build_schema(&store, GraphqlLimits::default()).unwrap();
    let query = r#"{ trips { completedByCity(city: "Oslo") { edges { node { rowKey status fareTotal } } } } }"#;
    let response = execute(
        &schema,
        &store,
        Principal::unrestricted(),
        async_graphql::Request::new(query),
    )
    .await;
    assert!(response.errors.is_empty(), "{:?}", response.errors);
    assert_eq!(
        response.data.into_json().unwrap(),
        json!({"trips": {"completedByCity": {"edges": [
            {"node": {"rowKey": done.to_string(), "status": "completed", "fareTotal": 12.5}}
        ]}}})
    );
}
