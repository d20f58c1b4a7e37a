//! HTTP caching of `GET /graphql` and the manifest of persisted documents,
//! through the real `cellgate serve`: a cell named by its full key is
//! immutable (and its `304` needs no execution), a latest cell is
//! revalidated and changes its tag when a new version is written, POST,
//! mutations and errors are never stored; a manifest that does not load at
//! a reload leaves the previous one serving, and one that does not load at
//! start-up stops the start with the reason.

#[path = "support/server.rs"]
mod server;

use reqwest::header::{CACHE_CONTROL, ETAG, VARY};
use reqwest::StatusCode;
use serde_json::{json, Value};
use server::{cellgate, client, root, Server};

const ROW: &str = "0b6f7c1e-2a4d-4c8e-9f10-1a2b3c4d5e6f";
const CELL: &str = "query($r: UUID!, $ref: Int64!) { trips { cell(rowKey: $r, column: NOTES, refKey: $ref) { refKey body } } }";
const LATEST: &str =
    "query($r: UUID!) { trips { latestCell(rowKey: $r, column: NOTES) { refKey body } } }";

fn sha256(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn manifest(documents: &[&str]) -> String {
    let entries: serde_json::Map<String, Value> = documents
        .iter()
        .map(|d| (sha256(d), Value::String(d.to_string())))
        .collect();
    Value::Object(entries).to_string()
}

async fn write_note(server: &Server, ref_key: i64) {
    let answer: Value = client()
        .post(server.graphql())
        .json(&json!({
            "query": "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }",
            "variables": {"cells": [{"rowKey": ROW, "column": "NOTES", "refKey": ref_key.to_string(), "body": {"n": ref_key}}]},
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["data"]["tripsPutCells"][0]["status"], "WRITTEN",
        "{answer}"
    );
}

/// `GET /graphql` of the document `id` with `variables`, and extra headers.
async fn get(
    server: &Server,
    id: &str,
    variables: Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = client().get(server.graphql()).query(&[
        ("documentId", format!("sha256:{}", sha256(id))),
        ("variables", variables.to_string()),
    ]);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.unwrap()
}

fn header(response: &reqwest::Response, name: reqwest::header::HeaderName) -> String {
    response
        .headers()
        .get(name)
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default()
}

/// The sum of the series of `name` whose labels contain `labels`.
async fn metric(server: &Server, name: &str, labels: &str) -> f64 {
    let text = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|line| line.starts_with(&format!("{name}{{")) && line.contains(labels))
        .filter_map(|line| line.rsplit(' ').next())
        .map(|v| v.trim().parse::<f64>().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_key_reads_are_immutable_and_the_rest_is_revalidated() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("persisted-documents.json");
    std::fs::write(&file, manifest(&[CELL, LATEST])).unwrap();
    let server = Server::start_on(dir, &["--persisted-documents", file.to_str().unwrap()]);
    write_note(&server, 1).await;

    // A cell named by its full key: the same forever.
    let vars = json!({"r": ROW, "ref": "1"});
    let first = get(&server, CELL, vars.clone(), &[]).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        header(&first, CACHE_CONTROL),
        "public, max-age=31536000, immutable"
    );
    assert_eq!(header(&first, VARY), "accept, authorization");
    let tag = header(&first, ETAG);
    assert!(tag.starts_with('"') && tag.len() == 34, "{tag}");
    let body: Value = first.json().await.unwrap();
    assert_eq!(body["data"]["trips"]["cell"]["body"], json!({"n": 1}));
    let before = metric(
        &server,
        "cellgate_graphql_requests_total",
        "outcome=\"not_modified\"",
    )
    .await;
    let again = get(&server, CELL, vars.clone(), &[("if-none-match", &tag)]).await;
    assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
    assert_eq!(header(&again, ETAG), tag);
    assert!(again.bytes().await.unwrap().is_empty());
    let after = metric(
        &server,
        "cellgate_graphql_requests_total",
        "outcome=\"not_modified\"",
    )
    .await;
    assert_eq!(after, before + 1.0);
    // With credentials, only the client may keep it.
    let private = get(
        &server,
        CELL,
        vars.clone(),
        &[("authorization", "Bearer x")],
    )
    .await;
    assert_eq!(
        header(&private, CACHE_CONTROL),
        "private, max-age=31536000, immutable"
    );

    // A cell that is not there (yet): revalidated, not immutable.
    let missing = get(&server, CELL, json!({"r": ROW, "ref": "2"}), &[]).await;
    assert_eq!(header(&missing, CACHE_CONTROL), "no-cache");
    let missing_tag = header(&missing, ETAG);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["data"]["trips"]["cell"], Value::Null);

    // A latest cell: revalidated; a new version changes the answer's tag.
    let latest = get(&server, LATEST, json!({"r": ROW}), &[]).await;
    assert_eq!(header(&latest, CACHE_CONTROL), "no-cache");
    let latest_tag = header(&latest, ETAG);
    let same = get(
        &server,
        LATEST,
        json!({"r": ROW}),
        &[("if-none-match", &latest_tag)],
    )
    .await;
    assert_eq!(same.status(), StatusCode::NOT_MODIFIED);
    write_note(&server, 2).await;
    let changed = get(
        &server,
        LATEST,
        json!({"r": ROW}),
        &[("if-none-match", &latest_tag)],
    )
    .await;
    assert_eq!(changed.status(), StatusCode::OK);
    assert_ne!(header(&changed, ETAG), latest_tag);
    let body: Value = changed.json().await.unwrap();
    assert_eq!(body["data"]["trips"]["latestCell"]["refKey"], "2");
    // The cell that was missing is there now: the old tag no longer holds.
    let found = get(
        &server,
        CELL,
        json!({"r": ROW, "ref": "2"}),
        &[("if-none-match", &missing_tag)],
    )
    .await;
    assert_eq!(found.status(), StatusCode::OK);
    assert_eq!(
        header(&found, CACHE_CONTROL),
        "public, max-age=31536000, immutable"
    );

    // Never stored: POST, a mutation over GET, an error.
    let post = client()
        .post(server.graphql())
        .json(&json!({"query": CELL, "variables": vars}))
        .send()
        .await
        .unwrap();
    assert_eq!(header(&post, CACHE_CONTROL), "no-store");
    assert!(header(&post, ETAG).is_empty());
    let mutation = client()
        .get(server.graphql())
        .query(&[("query", "mutation { tripsRetryQuarantine { applied } }")])
        .send()
        .await
        .unwrap();
    assert_eq!(mutation.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(header(&mutation, CACHE_CONTROL), "no-store");
    let error = client()
        .get(server.graphql())
        .query(&[(
            "query",
            "{ trips { cell(rowKey: \"nope\", column: NOTES, refKey: 1) { refKey } } }",
        )])
        .send()
        .await
        .unwrap();
    assert_eq!(header(&error, CACHE_CONTROL), "no-store");
    assert!(header(&error, ETAG).is_empty());
    let unknown = client()
        .get(server.graphql())
        .query(&[("documentId", format!("sha256:{}", sha256("{ x }")))])
        .send()
        .await
        .unwrap();
    assert_eq!(header(&unknown, CACHE_CONTROL), "no-store");
    let body: Value = unknown.json().await.unwrap();
    assert_eq!(
        body["errors"][0]["extensions"]["code"],
        "PERSISTED_DOCUMENT_NOT_FOUND"
    );
}

fn reload(server: &Server) -> (bool, String) {
    let output = cellgate(server.dir.path())
        .args(["reload", "--url", &server.url("")])
        .output()
        .unwrap();
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_that_does_not_load_leaves_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("persisted-documents.json");
    std::fs::write(&file, manifest(&[LATEST])).unwrap();
    let server = Server::start_on(dir, &["--persisted-documents", file.to_str().unwrap()]);
    write_note(&server, 1).await;
    let runs = |id: &'static str| {
        let server = &server;
        async move {
            let answer: Value = get(server, id, json!({"r": ROW, "ref": "1"}), &[])
                .await
                .json()
                .await
                .unwrap();
            answer
        }
    };
    assert!(runs(LATEST).await.get("errors").is_none());

    // An entry whose hash is not its document's: refused whole.
    let mut wrong: serde_json::Map<String, Value> =
        serde_json::from_str(&manifest(&[CELL])).unwrap();
    wrong.insert(
        sha256(LATEST),
        Value::String("{ trips { __typename } }".into()),
    );
    std::fs::write(&file, Value::Object(wrong).to_string()).unwrap();
    let (ok, said) = reload(&server);
    assert!(ok, "{said}");
    assert!(
        said.contains("persisted documents not reloaded, the previous manifest stays")
            && said.contains("does not match"),
        "{said}"
    );
    assert!(runs(LATEST).await.get("errors").is_none());
    assert_eq!(
        runs(CELL).await["errors"][0]["extensions"]["code"],
        "PERSISTED_DOCUMENT_NOT_FOUND"
    );
    // Not JSON at all: the same.
    std::fs::write(&file, "{").unwrap();
    let (_, said) = reload(&server);
    assert!(said.contains("not a manifest"), "{said}");
    assert!(runs(LATEST).await.get("errors").is_none());

    // A good one is taken at the next reload.
    std::fs::write(&file, manifest(&[CELL])).unwrap();
    let (_, said) = reload(&server);
    assert!(
        said.contains("persisted documents: 1 in the manifest"),
        "{said}"
    );
    assert_eq!(runs(CELL).await["data"]["trips"]["cell"]["refKey"], "1");
    assert_eq!(
        runs(LATEST).await["errors"][0]["extensions"]["code"],
        "PERSISTED_DOCUMENT_NOT_FOUND"
    );
    assert_eq!(
        metric(&server, "cellgate_persisted_documents", "kind=\"manifest\"").await,
        1.0
    );
}

#[test]
fn a_gateway_does_not_start_with_a_manifest_that_does_not_load() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("persisted-documents.json");
    std::fs::write(&file, "[]").unwrap();
    let output = cellgate(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path().join("data"))
        .arg("--datastores")
        .arg(root().join("datastores"))
        .arg("--persisted-documents")
        .arg(&file)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        said.contains("persisted-documents.json") && said.contains("not a manifest"),
        "{said}"
    );
    assert!(!said.contains("panicked"), "{said}");
}
