//! cellgate as an Apollo Federation 2 subgraph, through the real binary:
//! `_service { sdl }` is the committed `schema/schema.federation.graphql`,
//! `_entities` resolves 1,000 representations across two clusters in a
//! bounded number of statements and answers as `rows` does, scopes apply
//! per datastore, bad representations and too many of them are refused
//! with stable codes, and without `graphql.federation` none of it exists.

#[path = "support/server.rs"]
mod server;

use cellgate_graphql::auth::tokens;
use serde_json::{json, Value};
use server::{client, root, Server};

/// Two embedded clusters, federation on, no per-client rate limit.
const CONFIG: &str = "graphql:
  federation: true
limits:
  rate_limit_per_second: 0
storage:
  clusters:
    - name: a
      master: sqlite://{dir}/a.db
    - name: b
      master: sqlite://{dir}/b.db
";

const ENTITIES: &str = "query($r: [_Any!]!) { _entities(representations: $r) { __typename ... on TripsRow { rowKey base { refKey body } notes { body } } ... on PaymentsRow { rowKey } } }";

fn start(extra_config: &str) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cellgate.yaml");
    let text = CONFIG.replace("{dir}", &dir.path().display().to_string());
    std::fs::write(&config, format!("{text}{extra_config}")).unwrap();
    Server::start_on(dir, &["--config", config.to_str().unwrap()])
}

async fn post(server: &Server, token: Option<&str>, body: Value) -> Value {
    let mut request = client().post(server.graphql()).json(&body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().json().await.unwrap()
}

/// Writes `count` trips (BASE, and NOTES for the even ones); their keys.
async fn write_trips(server: &Server, token: Option<&str>, count: usize) -> Vec<String> {
    let keys: Vec<String> = (0..count)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let mut cells = Vec::new();
    for (n, key) in keys.iter().enumerate() {
        cells.push(json!({"rowKey": key, "column": "BASE", "refKey": "1", "body": {"n": n}}));
        if n % 2 == 0 {
            cells.push(
                json!({"rowKey": key, "column": "NOTES", "refKey": "1", "body": {"note": n}}),
            );
        }
    }
    for chunk in cells.chunks(500) {
        let answer = post(
            server,
            token,
            json!({"query": "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }",
                   "variables": {"cells": chunk}}),
        )
        .await;
        assert!(answer.get("errors").is_none(), "{answer}");
    }
    keys
}

/// Statements sent to each cluster so far.
async fn statements(server: &Server) -> f64 {
    let text = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with("cellgate_storage_statements_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn representations(keys: &[String]) -> Value {
    keys.iter()
        .map(|k| json!({"__typename": "TripsRow", "rowKey": k}))
        .collect()
}

fn code(answer: &Value) -> String {
    answer["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error code: {answer}"))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_resolve_in_a_bounded_number_of_statements_as_rows_do() {
    let server = start("");
    let sdl = post(&server, None, json!({"query": "{ _service { sdl } }"})).await;
    let committed =
        std::fs::read_to_string(root().join("schema/schema.federation.graphql")).unwrap();
    assert_eq!(
        sdl["data"]["_service"]["sdl"], committed,
        "run `cellgate schema --federation`"
    );
    assert!(committed.contains("type TripsRow @key(fields: \"rowKey\")"));
    assert!(committed.contains("https://specs.apollo.dev/federation/v2"));

    let keys = write_trips(&server, None, 1000).await;
    let direct = post(
        &server,
        None,
        json!({"query": "query($k: [UUID!]!) { trips { rows(rowKeys: $k) { rowKey base { refKey body } notes { body } } } }",
               "variables": {"k": keys}}),
    )
    .await;
    let rows = direct["data"]["trips"]["rows"].as_array().unwrap().clone();
    for count in [1, 100, 1000] {
        // What the same rows cost through `rows`.
        let before = statements(&server).await;
        let answer = post(
            &server,
            None,
            json!({"query": "query($k: [UUID!]!) { trips { rows(rowKeys: $k) { rowKey base { refKey body } notes { body } } } }",
                   "variables": {"k": keys[..count]}}),
        )
        .await;
        assert!(answer.get("errors").is_none(), "{answer}");
        let by_rows = statements(&server).await - before;
        let before = statements(&server).await;
        let answer = post(
            &server,
            None,
            json!({"query": ENTITIES, "variables": {"r": representations(&keys[..count])}}),
        )
        .await;
        let spent = statements(&server).await - before;
        assert!(answer.get("errors").is_none(), "{answer}");
        let entities = answer["data"]["_entities"].as_array().unwrap();
        assert_eq!(entities.len(), count);
        for (entity, row) in entities.iter().zip(&rows) {
            assert_eq!(entity["__typename"], "TripsRow");
            assert_eq!(entity["rowKey"], row["rowKey"]);
            assert_eq!(entity["base"], row["base"]);
            assert_eq!(entity["notes"], row["notes"]);
        }
        // The batched reads of `rows`: per cluster and batch of the cell
        // loader, never one per representation (the rows are spread over
        // both clusters).
        assert!(
            spent <= by_rows && spent <= 8.0,
            "{count} representations cost {spent} statements, `rows` {by_rows}"
        );
        println!("{count} representations: {spent} statements (rows: {by_rows})");
    }

    // A row key without cells is a row whose columns are null, as `row`.
    let nobody = uuid::Uuid::new_v4().to_string();
    let answer = post(
        &server,
        None,
        json!({"query": ENTITIES, "variables": {"r": [{"__typename": "TripsRow", "rowKey": nobody}, {"__typename": "PaymentsRow", "rowKey": nobody}]}}),
    )
    .await;
    assert_eq!(
        answer["data"]["_entities"],
        json!([{"__typename": "TripsRow", "rowKey": nobody, "base": null, "notes": null},
               {"__typename": "PaymentsRow", "rowKey": nobody}])
    );

    // Bad input: named by position, with a stable code.
    for (representation, said) in [
        (
            json!({"__typename": "TripsRow"}),
            "representation 0: a `TripsRow` representation needs its `rowKey`",
        ),
        (
            json!({"__typename": "TripsRow", "rowKey": "nope"}),
            "must be a UUID",
        ),
        (json!({"rowKey": nobody}), "needs its `__typename`"),
        (
            json!({"__typename": "TripsQuery", "rowKey": nobody}),
            "is not an entity",
        ),
        (json!("TripsRow"), "must be an object"),
    ] {
        let answer = post(
            &server,
            None,
            json!({"query": ENTITIES, "variables": {"r": [representation]}}),
        )
        .await;
        assert_eq!(code(&answer), "BAD_REQUEST", "{answer}");
        assert!(
            answer["errors"][0]["message"]
                .as_str()
                .unwrap()
                .contains(said),
            "{answer}"
        );
    }
    let too_many: Vec<String> = (0..1001).map(|n| keys[n % keys.len()].clone()).collect();
    let answer = post(
        &server,
        None,
        json!({"query": ENTITIES, "variables": {"r": representations(&too_many)}}),
    )
    .await;
    assert_eq!(code(&answer), "LIMIT_EXCEEDED", "{answer}");
    let answer = post(&server, None, json!({"query": "{ _service { sdl } }"})).await;
    assert!(
        answer["data"]["_service"]["sdl"].is_string(),
        "still serving"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn entities_follow_the_scopes_of_their_datastores() {
    let reader = tokens::generate();
    let admin = tokens::generate();
    let auth = format!(
        "auth:\n  enabled: true\n  tokens:\n    - {{ name: r, hash: \"{}\", scopes: [\"trips:read\"] }}\n    - {{ name: a, hash: \"{}\", scopes: [\"*:admin\"] }}\n",
        reader.hash, admin.hash
    );
    let server = start(&auth);
    let keys = write_trips(&server, Some(&admin.token), 2).await;
    let trips = json!({"query": ENTITIES, "variables": {"r": representations(&keys)}});
    let answer = post(&server, Some(&reader.token), trips.clone()).await;
    assert_eq!(
        answer["data"]["_entities"][1]["rowKey"], keys[1],
        "{answer}"
    );
    let payments = json!({"query": ENTITIES, "variables": {"r": [{"__typename": "PaymentsRow", "rowKey": keys[0]}]}});
    assert_eq!(
        code(&post(&server, Some(&reader.token), payments.clone()).await),
        "FORBIDDEN"
    );
    assert!(post(&server, Some(&admin.token), payments)
        .await
        .get("errors")
        .is_none());
    // The SDL shows every datastore: a `*` scope, as introspection.
    let sdl = json!({"query": "{ _service { sdl } }"});
    assert_eq!(
        code(&post(&server, Some(&reader.token), sdl.clone()).await),
        "FORBIDDEN"
    );
    assert_eq!(code(&post(&server, None, trips).await), "UNAUTHENTICATED");
    assert!(post(&server, Some(&admin.token), sdl).await["data"]["_service"]["sdl"].is_string());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_federation_there_is_no_subgraph() {
    let server = Server::start(&[]);
    let answer = post(&server, None, json!({"query": "{ _service { sdl } }"})).await;
    assert_eq!(code(&answer), "GRAPHQL_VALIDATION_FAILED", "{answer}");
    let sdl = std::fs::read_to_string(root().join("schema/schema.graphql")).unwrap();
    assert!(!sdl.contains("@key"));
}
