//! A partial index in the GraphQL API: its field answers with the rows its
//! `where:` predicate selects, and its description names the predicate.

use std::path::Path;

use std::sync::Arc;
use std::time::Duration;

use cellgate_graphql::auth::Authenticator;
use cellgate_graphql::{
    build_schema, sdl, DefinitionsStatus, Documents, GraphqlLimits, GraphqlRequest, Persisted,
    PersistedOptions, Pipeline, PipelineOptions, Served, Transport,
};
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
    let pipeline = Pipeline::new(
        store.clone(),
        Authenticator::new(&[], false, None).unwrap(),
        Served::new(store.snapshot(), schema, Arc::new(Documents::new(1 << 20))),
        DefinitionsStatus::default(),
        PipelineOptions {
            limits: GraphqlLimits::default(),
            introspection: true,
            request_timeout: Duration::from_secs(30),
        },
        Arc::new(Persisted::new(PersistedOptions::default()).unwrap()),
    );
    let query = r#"{ trips { completedByCity(city: "Oslo") { edges { node { rowKey status fareTotal } } } } }"#;
    let caller = pipeline.authenticate(None).await.unwrap();
    let request = GraphqlRequest {
        query: Some(query.to_string()),
        ..GraphqlRequest::default()
    };
    let executed = pipeline
        .prepare(request, &caller, Transport::Post)
        .unwrap()
        .execute()
        .await
        .unwrap();
    assert!(!executed.has_errors);
    let response: serde_json::Value = serde_json::from_slice(&executed.body).unwrap();
    assert_eq!(
        response["data"],
        json!({"trips": {"completedByCity": {"edges": [
            {"node": {"rowKey": done.to_string(), "status": "completed", "fareTotal": 12.5}}
        ]}}})
    );
}
