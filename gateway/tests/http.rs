//! `cellgate serve` end to end: each test starts the real binary on a free
//! port (`--listen 127.0.0.1:0`), reads the bound address from the line it
//! prints, and talks HTTP to it (`support/server.rs`). The process is
//! killed when the test ends, also when it fails.

#[path = "support/server.rs"]
mod server;

use std::process::{Command, Output};
use std::time::Duration;

use reqwest::header::{ACCEPT, ALLOW, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use serde_json::{json, Value};
use server::{cellgate, root, Server};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("http client")
}

/// POSTs `body` as JSON with the given `Accept` header.
async fn post(server: &Server, accept: Option<&str>, body: &Value) -> reqwest::Response {
    let mut request = client()
        .post(server.graphql())
        .header(CONTENT_TYPE, "application/json")
        .body(body.to_string());
    if let Some(accept) = accept {
        request = request.header(ACCEPT, accept);
    }
    request.send().await.expect("POST /graphql")
}

fn content_type(response: &reqwest::Response) -> String {
    response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// The `extensions.code` of the first error.
fn first_code(body: &Value) -> &str {
    body["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("no error code in {body}"))
}

#[tokio::test]
async fn health_readiness_and_metrics() {
    let server = Server::start(&[]);
    let healthz = client().get(server.url("/healthz")).send().await.unwrap();
    assert_eq!(healthz.status(), StatusCode::OK);
    assert_eq!(healthz.text().await.unwrap(), "ok");
    let readyz = client().get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(readyz.status(), StatusCode::OK);

    let query = json!({"query": "query Probe { __typename }"});
    assert_eq!(post(&server, None, &query).await.status(), StatusCode::OK);
    let bad = json!({"query": "{"});
    assert_eq!(post(&server, None, &bad).await.status(), StatusCode::OK);

    let metrics = client().get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    assert!(content_type(&metrics).starts_with("application/openmetrics-text"));
    let text = metrics.text().await.unwrap();
    for expected in [
        r#"cellgate_graphql_requests_total{operation="Probe",outcome="ok"} 1"#,
        r#"cellgate_graphql_requests_total{operation="anonymous",outcome="invalid"} 1"#,
        "cellgate_graphql_request_duration_seconds_count 2",
        r#"cellgate_cells_written_total{datastore="trips"} 0"#,
        r#"cellgate_cells_duplicate_total{datastore="payments"} 0"#,
        r#"cellgate_index_lag_max_ms{datastore="trips"} 0"#,
        r#"cellgate_index_lagging_shards{datastore="payments"} 0"#,
        r#"cellgate_index_pending_cells{datastore="trips"} 0"#,
        r#"cellgate_index_unstorable_values_total{datastore="payments"} 0"#,
        r#"cellgate_index_quarantined_total{datastore="trips"} 0"#,
        r#"cellgate_cluster_ready{cluster="main"} 1"#,
        "# TYPE cellgate_index_buckets_held gauge",
        "cellgate_index_delay_samples_total",
        r#"cellgate_topology_version{datastore="trips"} 1"#,
        "# TYPE cellgate_shard_move_phase gauge",
        "# TYPE cellgate_shard_move_cells_copied gauge",
        "cellgate_cell_cache_budget_bytes 268435456",
        "cellgate_cell_cache_cells 0",
        r#"cellgate_cell_cache_lookups_total{result="hit"} 0"#,
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
    // No move is recorded: the move families have no series
    // (`shard_move.rs` has one).
    for absent in [
        "cellgate_shard_move_phase{",
        "cellgate_shard_move_cells_copied{",
    ] {
        assert!(!text.contains(absent), "unexpected `{absent}` in:\n{text}");
    }

    // A cell read twice by its full key: read from the database, then
    // from the cell cache, with the same answer.
    let row = uuid::Uuid::new_v4();
    let put = json!({
        "query": "mutation($c: [TripsCellInput!]!) { tripsPutCells(cells: $c) { status } }",
        "variables": { "c": [{ "rowKey": row, "column": "BASE", "refKey": 3, "body": { "n": 1, "s": "ü\u{0000}" } }] },
    });
    let written: Value = post(&server, None, &put).await.json().await.unwrap();
    assert_eq!(
        written["data"]["tripsPutCells"][0]["status"], "WRITTEN",
        "{written}"
    );
    let read = json!({
        "query": "query($r: UUID!) { trips { cell(rowKey: $r, column: BASE, refKey: 3) { refKey body createdAt } } }",
        "variables": { "r": row },
    });
    let first: Value = post(&server, None, &read).await.json().await.unwrap();
    let second: Value = post(&server, None, &read).await.json().await.unwrap();
    assert_eq!(
        first["data"]["trips"]["cell"]["body"],
        json!({ "n": 1, "s": "ü\u{0000}" }),
        "{first}"
    );
    assert_eq!(first, second);
    let text = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for expected in [
        "cellgate_cell_cache_cells 1",
        r#"cellgate_cell_cache_lookups_total{result="hit"} 1"#,
        r#"cellgate_cell_cache_lookups_total{result="miss"} 1"#,
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
}

/// The `operation` label values of `cellgate_graphql_requests_total`, with
/// the request count of each.
fn operation_counts(metrics: &str) -> std::collections::BTreeMap<String, u64> {
    let mut counts = std::collections::BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("cellgate_graphql_requests_total{operation=\"") else {
            continue;
        };
        let (name, rest) = rest.split_once('"').expect("a quoted label");
        let count: u64 = rest
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .expect("a count");
        *counts.entry(name.to_string()).or_default() += count;
    }
    counts
}

async fn scrape(server: &Server) -> String {
    let response = client().get(server.url("/metrics")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.unwrap()
}

/// Sends `{ __typename }` under each of `names`.
async fn send_named(server: &Server, names: impl IntoIterator<Item = String>) {
    for name in names {
        let query = json!({"query": format!("query {name} {{ __typename }}")});
        assert_eq!(post(server, None, &query).await.status(), StatusCode::OK);
    }
}

// /metrics grew with every client-chosen operation name (3 KB -> 20 KB after
// 300 names).
#[tokio::test]
async fn metrics_stay_bounded_under_many_operation_names() {
    let server = Server::start(&[]);
    send_named(&server, (0..100).map(|i| format!("Op{i}"))).await;
    let after_100 = scrape(&server).await;
    send_named(&server, (100..350).map(|i| format!("Op{i}"))).await;
    let after_350 = scrape(&server).await;

    let counts = operation_counts(&after_350);
    assert!(
        counts.len() <= 21,
        "{} operation series after 350 names:\n{after_350}",
        counts.len()
    );
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        operation_counts(&after_100).keys().collect::<Vec<_>>()
    );
    assert_eq!(counts.values().sum::<u64>(), 350, "{counts:?}");
    assert_eq!(
        counts["other"],
        350 - (counts.len() as u64 - 1),
        "{counts:?}"
    );
    // Only counts grew: a few digits, no new series.
    assert!(
        after_350.len() <= after_100.len() + 64,
        "/metrics grew from {} to {} bytes",
        after_100.len(),
        after_350.len()
    );
}

#[tokio::test]
async fn listed_operations_keep_their_series() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cellgate.yaml");
    std::fs::write(
        &config,
        "metrics:\n  operations: [TripsByDriver]\n  max_operations: 2\n",
    )
    .unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let names = ["A", "B", "C", "D", "TripsByDriver", "A"];
    send_named(&server, names.map(String::from)).await;
    let counts = operation_counts(&scrape(&server).await);
    let expected: std::collections::BTreeMap<String, u64> =
        [("A", 2), ("B", 1), ("TripsByDriver", 1), ("other", 2)]
            .map(|(name, n)| (name.to_string(), n))
            .into();
    assert_eq!(counts, expected);
}

#[tokio::test]
async fn queries_run_over_post_and_get() {
    let server = Server::start(&[]);
    let response = post(&server, None, &json!({"query": "{ __typename }"})).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(content_type(&response).starts_with("application/json"));
    let body: Value = response.json().await.unwrap();
    assert_eq!(body, json!({"data": {"__typename": "Query"}}));

    let response = client()
        .get(server.graphql())
        .query(&[
            (
                "query",
                "query Q($n: String!) { __type(name: $n) { name } }",
            ),
            ("variables", r#"{"n": "Query"}"#),
            ("operationName", "Q"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body, json!({"data": {"__type": {"name": "Query"}}}));
}

/// graphql-js's introspection queries from `tests/fixtures/introspection`:
/// `(version/variant, query)`.
fn introspection_queries() -> Vec<(String, String)> {
    let dir = root().join("tests/fixtures/introspection");
    let mut queries = Vec::new();
    for version in std::fs::read_dir(&dir).expect("introspection fixtures") {
        let version = version.unwrap().path();
        if !version.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&version).unwrap() {
            let file = file.unwrap().path();
            let name = file.strip_prefix(&dir).unwrap().display().to_string();
            queries.push((name, std::fs::read_to_string(&file).unwrap()));
        }
    }
    queries.sort();
    assert!(
        queries.len() >= 20,
        "{} introspection fixtures",
        queries.len()
    );
    queries
}

/// POSTs `query` and returns the status and body.
async fn ask(server: &Server, accept: &str, query: &str) -> (StatusCode, Value) {
    let response = post(server, Some(accept), &json!({ "query": query })).await;
    let status = response.status();
    (status, response.json().await.unwrap())
}

// graphql-js's standard introspection query (GraphiQL, graphql-codegen,
// Apollo tooling) was refused with QUERY_TOO_DEEP.
#[tokio::test]
async fn standard_introspection_queries_are_answered() {
    let server = Server::start(&[]);
    for (name, query) in introspection_queries() {
        for accept in ["application/json", "application/graphql-response+json"] {
            let body = json!({ "query": query, "operationName": "IntrospectionQuery" });
            let response = post(&server, Some(accept), &body).await;
            assert_eq!(response.status(), StatusCode::OK, "{name}");
            let answer: Value = response.json().await.unwrap();
            assert!(answer.get("errors").is_none(), "{name}: {answer}");
            let schema = &answer["data"]["__schema"];
            assert_eq!(schema["queryType"]["name"], "Query", "{name}");
            let types = schema["types"].as_array().expect("types");
            let trips = types
                .iter()
                .find(|t| t["name"] == "TripsQuery")
                .unwrap_or_else(|| panic!("{name}: no TripsQuery"));
            assert!(!trips["fields"].as_array().unwrap().is_empty(), "{name}");
            if query.contains("isOneOf") {
                let input = types
                    .iter()
                    .find(|t| t["kind"] == "INPUT_OBJECT")
                    .expect("an input type");
                assert_eq!(input["isOneOf"], false, "{name}");
            }
        }
    }
}

// User queries keep their limits: only introspection is left out of them.
#[tokio::test]
async fn depth_and_complexity_limits_hold_outside_introspection() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cellgate.yaml");
    std::fs::write(&config, "limits:\n  max_depth: 3\n  max_complexity: 6\n").unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let gql = "application/graphql-response+json";

    let (_, all) = introspection_queries()
        .into_iter()
        .find(|(name, _)| name == "graphql-17.1.0/all.graphql")
        .unwrap();
    let (status, answer) = ask(&server, gql, &all).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer.get("errors").is_none(), "{answer}");

    let row = r#"row(rowKey: "0b6f7c1e-2a4d-4c8e-9f10-1a2b3c4d5e6f")"#;
    let shallow = format!("{{ trips {{ {row} {{ rowKey }} }} }}");
    let (status, answer) = ask(&server, gql, &shallow).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert!(answer.get("errors").is_none(), "{answer}");

    let deep = [
        format!("{{ trips {{ {row} {{ base {{ refKey }} }} }} }}"),
        format!("{{ __schema {{ queryType {{ name }} }} trips {{ {row} {{ base {{ refKey }} }} }} }}"),
        format!("query Q {{ trips {{ ...R }} }} fragment R on TripsQuery {{ {row} {{ base {{ refKey }} }} }}"),
        // Nested introspection lists multiply the answer by the schema size.
        "{ __schema { types { fields { type { fields { type { fields { name } } } } } } } }".to_string(),
        // Past the parser's recursion guard.
        format!(
            "{{ __type(name: \"Query\") {{ {}name{} }} }}",
            "ofType { ".repeat(40),
            " }".repeat(40)
        ),
    ];
    for query in deep {
        let (status, answer) = ask(&server, gql, &query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {answer}");
        assert_eq!(first_code(&answer), "QUERY_TOO_DEEP", "{query}: {answer}");
        assert!(answer.get("data").is_none(), "{answer}");
    }

    let aliases: String = (0..300)
        .map(|i| format!("t{i}: __type(name: \"Query\") {{ name }} "))
        .collect();
    let complex = [
        "{ a: datastores { name } b: datastores { name } c: datastores { name } d: datastores { name } }".to_string(),
        format!("{{ {aliases} }}"),
    ];
    for query in complex {
        let (status, answer) = ask(&server, gql, &query).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(first_code(&answer), "QUERY_TOO_COMPLEX", "{answer}");
    }
}

#[tokio::test]
async fn mutations_are_refused_over_get() {
    let server = Server::start(&[]);
    let response = client()
        .get(server.graphql())
        .query(&[("query", "mutation { __typename }")])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(response.headers().get(ALLOW).unwrap(), "POST");
    let body: Value = response.json().await.unwrap();
    assert_eq!(first_code(&body), "METHOD_NOT_ALLOWED");
}

#[tokio::test]
async fn bad_http_input_gets_4xx_with_a_code() {
    let server = Server::start(&[]);
    let response = client()
        .post(server.graphql())
        .header(CONTENT_TYPE, "text/plain")
        .body("{ __typename }")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(first_code(&body), "UNSUPPORTED_MEDIA_TYPE");

    for (body, accept) in [
        ("{ \"not a JSON", "application/json"),
        ("{ \"not a JSON", "application/graphql-response+json"),
        (r#"{"notquery": "{ __typename }"}"#, "application/json"),
        (r#"{"query": 7}"#, "application/json"),
        (
            r#"{"query": "{ __typename }", "variables": "x"}"#,
            "application/json",
        ),
        ("", "application/json"),
    ] {
        let response = client()
            .post(server.graphql())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, accept)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{body}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(first_code(&answer), "BAD_REQUEST", "{body}");
        assert!(answer.get("data").is_none());
    }

    let response = post(
        &server,
        Some("text/html"),
        &json!({"query": "{ __typename }"}),
    )
    .await;
    assert_eq!(response.status(), StatusCode::NOT_ACCEPTABLE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(first_code(&body), "NOT_ACCEPTABLE");
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_413() {
    let server = Server::start(&[]);
    let padding = " ".repeat(1024 * 1024);
    let body = format!(r#"{{"query": "{{ __typename }}"{padding}}}"#);
    let response = client()
        .post(server.graphql())
        .header(CONTENT_TYPE, "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = response.json().await.unwrap();
    assert_eq!(
        body,
        json!({"errors": [{
            "message": "request body exceeds 1048576 bytes",
            "extensions": {"code": "PAYLOAD_TOO_LARGE"}
        }]})
    );
}

/// Writes a whole request on a fresh connection before reading anything,
/// as most HTTP clients do (fetch, Python's http.client), then returns the
/// status and the JSON body of the answer. `head` is the request line and
/// headers without the blank line; the request asks for `Connection: close`
/// so the answer ends at end of stream.
async fn send_whole_then_read(server: &Server, head: &str, body: &[Vec<u8>]) -> (u16, Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let address = server.base.trim_start_matches("http://");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let head = format!("{head}\r\nHost: {address}\r\nConnection: close\r\n\r\n");
        stream.write_all(head.as_bytes()).await.expect("send head");
        for piece in body {
            if let Err(e) = stream.write_all(piece).await {
                panic!("the server stopped reading the body and closed the connection ({e}): a client that sends its whole body first never sees the answer");
            }
        }
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read answer");
        answer
    };
    let answer = tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .expect("no answer within 60 s");
    parse_answer(&answer)
}

/// The status and JSON body of one HTTP/1.1 answer with a `Content-Length`.
fn parse_answer(answer: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer, only {} bytes: {text:?}", answer.len()));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    (status, body)
}

/// `{"query": "{ __typename }", "x": "aaa…"}` of about `size` bytes, in
/// 64 KiB pieces.
fn padded_body(size: usize) -> Vec<Vec<u8>> {
    let mut text = br#"{"query": "{ __typename }", "x": ""#.to_vec();
    text.resize(size, b'a');
    text.extend_from_slice(br#""}"#);
    text.chunks(64 * 1024).map(<[u8]>::to_vec).collect()
}

// A 10 MB chunked body (no Content-Length) was not answered 413
// PAYLOAD_TOO_LARGE like a sized one.
#[tokio::test]
async fn a_chunked_oversized_body_is_refused_with_413() {
    let server = Server::start(&[]);
    let chunks = chunked(padded_body(10 * 1024 * 1024));
    let head =
        "POST /graphql HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked";
    let (status, body) = send_whole_then_read(&server, head, &chunks).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(first_code(&body), "PAYLOAD_TOO_LARGE", "{body}");

    // The same body with a Content-Length gets the same answer.
    let sized = padded_body(10 * 1024 * 1024);
    let length: usize = sized.iter().map(Vec::len).sum();
    let head = format!(
        "POST /graphql HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {length}"
    );
    let (status, body) = send_whole_then_read(&server, &head, &sized).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(first_code(&body), "PAYLOAD_TOO_LARGE", "{body}");

    // A chunked body within the limit is read and executed.
    let small = br#"{"query": "{ __typename }"}"#;
    let chunked = [
        format!("{:x}\r\n", small.len()).into_bytes(),
        small.to_vec(),
        b"\r\n0\r\n\r\n".to_vec(),
    ];
    let head =
        "POST /graphql HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked";
    let (status, body) = send_whole_then_read(&server, head, &chunked).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"data": {"__typename": "Query"}}));
}

/// `pieces` framed as a chunked body, with its last chunk.
fn chunked(pieces: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    pieces
        .into_iter()
        .map(|piece| {
            let mut chunk = format!("{:x}\r\n", piece.len()).into_bytes();
            chunk.extend_from_slice(&piece);
            chunk.extend_from_slice(b"\r\n");
            chunk
        })
        .chain([b"0\r\n\r\n".to_vec()])
        .collect()
}

/// Writes a whole request on a fresh connection, shuts down the sending
/// side of the socket (as `nc -N` does) and reads the answer until the
/// server closes the connection. The request keeps the connection alive:
/// the end of the client's stream is all that tells the server to close.
async fn send_and_half_close(server: &Server, head: &str, body: &[Vec<u8>]) -> (u16, Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let address = server.base.trim_start_matches("http://");
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address)
            .await
            .expect("connect");
        let head = format!("{head}\r\nHost: {address}\r\n\r\n");
        stream.write_all(head.as_bytes()).await.expect("send head");
        for piece in body {
            stream.write_all(piece).await.expect("send body");
        }
        stream.shutdown().await.expect("half-close");
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.expect("read answer");
        answer
    };
    let answer = tokio::time::timeout(Duration::from_secs(60), exchange)
        .await
        .expect("no answer within 60 s");
    parse_answer(&answer)
}

// A client that half-closed its connection after sending a whole request
// (`nc -N`) got no answer: the gateway took the end of its stream for an
// abandoned request and closed the connection.
#[tokio::test]
async fn a_client_that_half_closes_after_its_request_gets_the_answer() {
    let server = Server::start(&[]);
    let query = br#"{"query":"{ __typename }"}"#;
    let head = format!(
        "POST /graphql HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
        query.len()
    );
    // Several times: the answer used to be lost to a race, which the
    // closing side won nearly always but not always.
    for _ in 0..5 {
        let (status, body) = send_and_half_close(&server, &head, &[query.to_vec()]).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body, json!({"data": {"__typename": "Query"}}));
    }

    // An oversized chunked body, then the end of the stream: 413.
    let head =
        "POST /graphql HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked";
    for _ in 0..3 {
        let chunks = chunked(padded_body(4 * 1024 * 1024));
        let (status, body) = send_and_half_close(&server, head, &chunks).await;
        assert_eq!(status, 413, "{body}");
        assert_eq!(first_code(&body), "PAYLOAD_TOO_LARGE", "{body}");
    }

    // A body cut short by the end of the stream is broken: 400.
    let head = format!(
        "POST /graphql HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {}",
        query.len() + 1
    );
    let (status, body) = send_and_half_close(&server, &head, &[query.to_vec()]).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(first_code(&body), "BAD_REQUEST", "{body}");
}

/// Writes a request on a fresh connection, `body` one piece every `pause`,
/// while reading the answer; the sending stops when the server stops
/// reading. Returns the status and the JSON body of the answer. The request
/// asks for `Connection: close` so the answer ends at end of stream.
async fn send_paced(
    server: &Server,
    head: &str,
    body: Vec<Vec<u8>>,
    pause: Duration,
) -> (u16, Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let address = server.base.trim_start_matches("http://").to_string();
    let stream = tokio::net::TcpStream::connect(&address)
        .await
        .expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let head = format!("{head}\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    // The writer is handed back rather than dropped: dropping it would
    // half-close the connection.
    let sender = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await.expect("send head");
        for piece in body {
            if writer.write_all(&piece).await.is_err() {
                break;
            }
            tokio::time::sleep(pause).await;
        }
        writer
    });
    let mut answer = Vec::new();
    // The server may reset the connection after its answer, as it stops
    // reading a refused body: what arrived before the reset is the answer.
    let read = tokio::time::timeout(Duration::from_secs(60), reader.read_to_end(&mut answer))
        .await
        .expect("no answer within 60 s");
    let _writer = sender.await.expect("sender");
    if answer.is_empty() {
        panic!("no answer: {read:?}");
    }
    parse_answer(&answer)
}

// A chunked body over the limit that arrived slowly, 64 KiB at a time, was
// answered 408 BODY_TIMEOUT instead of 413 PAYLOAD_TOO_LARGE: the rest of
// the refused body was read and dropped under the body deadline, and the
// deadline won.
#[tokio::test]
async fn a_slow_oversized_body_is_refused_with_413() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cellgate.yaml");
    std::fs::write(
        &config,
        "limits:\n  max_body_bytes: 262144\n  body_timeout_ms: 2000\n",
    )
    .unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    // The limit is passed after 5 pieces, a quarter of a second; the whole
    // body would take over 3 seconds, past the body deadline.
    let pause = Duration::from_millis(50);
    let head =
        "POST /graphql HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked";
    let chunks = chunked(padded_body(4 * 1024 * 1024));
    let (status, body) = send_paced(&server, head, chunks, pause).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(
        body,
        json!({"errors": [{
            "message": "request body exceeds 262144 bytes",
            "extensions": {"code": "PAYLOAD_TOO_LARGE"}
        }]})
    );

    // The same with a Content-Length over the limit.
    let sized = padded_body(4 * 1024 * 1024);
    let length: usize = sized.iter().map(Vec::len).sum();
    let head = format!(
        "POST /graphql HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {length}"
    );
    let (status, body) = send_paced(&server, &head, sized, pause).await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(first_code(&body), "PAYLOAD_TOO_LARGE", "{body}");

    // A slow body within the limit still times out.
    let small = padded_body(128 * 1024);
    let head =
        "POST /graphql HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked";
    let (status, body) = send_paced(&server, head, chunked(small), Duration::from_secs(1)).await;
    assert_eq!(status, 408, "{body}");
    assert_eq!(first_code(&body), "BODY_TIMEOUT", "{body}");

    // A malformed chunk within the limit is a broken body.
    let mut broken = chunked(padded_body(128 * 1024));
    broken[1][0] = b'z';
    let (status, body) = send_paced(&server, head, broken, Duration::ZERO).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body,
        json!({"errors": [{
            "message": "cannot read the request body",
            "extensions": {"code": "BAD_REQUEST"}
        }]})
    );
}

#[tokio::test]
async fn graphql_response_json_status_codes() {
    let server = Server::start(&[]);
    let gql = Some("application/graphql-response+json");

    let response = post(&server, gql, &json!({"query": "{ __typename }"})).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(content_type(&response).starts_with("application/graphql-response+json"));

    let response = post(&server, gql, &json!({"query": "{"})).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert!(body.get("data").is_none(), "{body}");
    assert_eq!(first_code(&body), "GRAPHQL_PARSE_FAILED");

    let unknown_field = json!({"query": "{ noSuchField }"});
    let response = post(&server, gql, &unknown_field).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert!(body.get("data").is_none(), "{body}");
    assert_eq!(first_code(&body), "GRAPHQL_VALIDATION_FAILED");

    let coercion = json!({"query": "query Q($id: ID!) { __typename }", "variables": {"id": null}});
    let response = post(&server, gql, &coercion).await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);

    // The legacy media type answers the same failures with 200.
    let response = post(&server, Some("application/json"), &unknown_field).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(content_type(&response).starts_with("application/json"));
    let body: Value = response.json().await.unwrap();
    assert!(body.get("data").is_none(), "{body}");
    assert_eq!(first_code(&body), "GRAPHQL_VALIDATION_FAILED");
}

#[tokio::test]
async fn the_playground_is_served_at_the_root() {
    let server = Server::start(&[]);
    let response = client().get(server.url("/")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(content_type(&response).starts_with("text/html"));
    let html = response.text().await.unwrap();
    assert!(html.to_lowercase().contains("graphiql"), "{html}");
    assert!(html.contains("/graphql"), "{html}");
}

#[tokio::test]
async fn the_rate_limit_comes_from_the_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cellgate.yaml");
    std::fs::write(&config, "limits:\n  rate_limit_per_second: 2\n").unwrap();
    let server = Server::start(&["--config", config.to_str().unwrap()]);
    let query = json!({"query": "{ __typename }"});
    let mut statuses = Vec::new();
    for _ in 0..5 {
        statuses.push(post(&server, None, &query).await);
    }
    let limited = statuses
        .into_iter()
        .find(|r| r.status() == StatusCode::TOO_MANY_REQUESTS)
        .expect("a request over the rate is refused");
    assert!(limited.headers().get(RETRY_AFTER).is_some());
    let body: Value = limited.json().await.unwrap();
    assert_eq!(first_code(&body), "RATE_LIMITED");
    // Health probes are not rate limited.
    for _ in 0..5 {
        let healthz = client().get(server.url("/healthz")).send().await.unwrap();
        assert_eq!(healthz.status(), StatusCode::OK);
    }
}

#[test]
fn invalid_definitions_exit_1_with_diagnostics() {
    let dir = tempfile::tempdir().unwrap();
    let trips = dir.path().join("datastores").join("trips");
    std::fs::create_dir_all(&trips).unwrap();
    std::fs::write(
        trips.join("datastore.yaml"),
        "name: trips\nshards: 0\ncolumns:\n  - name: BASE\n",
    )
    .unwrap();
    let output: Output = cellgate(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--data", "data"])
        .args(["--datastores", "datastores"])
        .output()
        .expect("run cellgate serve");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "stderr:\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stderr.contains("shard count 0 is out of range"), "{stderr}");
    assert!(!String::from_utf8_lossy(&output.stdout).contains("listening"));
}

#[tokio::test]
async fn demo_start_prints_what_it_loaded() {
    let server = Server::start(&["--demo"]);
    assert!(
        server
            .preamble
            .iter()
            .any(|line| line.starts_with("demo data loaded: 64 trips, 24 payments (")),
        "{:?}",
        server.preamble
    );
    let metrics = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        !metrics.contains(r#"cellgate_cells_written_total{datastore="trips"} 0"#),
        "{metrics}"
    );
}

#[cfg(unix)]
#[test]
fn sigterm_stops_the_server_cleanly() {
    let mut server = Server::start(&[]);
    let status = Command::new("kill")
        .args(["-TERM", &server.child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    for _ in 0..100 {
        if let Some(status) = server.child.try_wait().unwrap() {
            assert!(
                status.success(),
                "exit {status}; stderr:\n{}",
                server.stderr()
            );
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("cellgate serve did not stop within 10 s of SIGTERM");
}

/// Polls `/metrics` until `line` appears; the text at that moment.
async fn metrics_with(server: &Server, line: &str) -> String {
    let mut last = String::new();
    for _ in 0..600 {
        let response = client().get(server.url("/metrics")).send().await.unwrap();
        last = response.text().await.unwrap();
        if last.lines().any(|l| l == line) {
            return last;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("`{line}` never appeared in /metrics:\n{last}");
}

fn metric_value(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no `{name}` in {text}"))
}

// Regression: after a restart the index lag metrics read 0 while the index
// was far behind, because lag was known only for shards written since the
// process started.
#[tokio::test]
async fn index_lag_metrics_survive_a_restart() {
    use cellgate_store::cells::NewCell;
    let dir = tempfile::tempdir().unwrap();
    {
        let defs = index_dsl::load_dir(&root().join("datastores")).unwrap();
        let mut options = cellgate_store::StoreOptions::new(
            cellgate_store::StorageConfig::embedded(&dir.path().join("data")),
        );
        options.maintain_indexes = false;
        let store = cellgate_store::Store::open(defs, options).await.unwrap();
        let cells: Vec<NewCell> = (0..300)
            .map(|_| NewCell {
                row_key: uuid::Uuid::new_v4(),
                column: "BASE".into(),
                ref_key: 1,
                body: json!({
                    "driver_partner_uuid": uuid::Uuid::new_v4().to_string(),
                    "city_uuid": uuid::Uuid::new_v4().to_string(),
                    "trip_created_at": "2024-03-01T10:00:00Z",
                }),
            })
            .collect();
        for result in store.put_cells("trips", cells).await.unwrap() {
            result.unwrap();
        }
    }
    let config = dir.path().join("observe.yaml");
    std::fs::write(
        &config,
        "indexes:\n  maintain: false\n  sweep_interval_ms: 100\n",
    )
    .unwrap();
    let server = Server::start_on(dir, &["--config", config.to_str().unwrap()]);
    let text = metrics_with(
        &server,
        r#"cellgate_index_pending_cells{datastore="trips"} 300"#,
    )
    .await;
    let lagging = metric_value(&text, r#"cellgate_index_lagging_shards{datastore="trips"}"#);
    assert!(
        lagging > 250.0,
        "300 random rows of 4096 shards: {lagging} shards behind"
    );
    let age = metric_value(&text, r#"cellgate_index_lag_max_ms{datastore="trips"}"#);
    assert!(age > 0.0, "the oldest unapplied cell has an age");

    // A maintaining gateway on the same store catches up and says so.
    let dir = server.stop();
    let server = Server::start_on(dir, &[]);
    let text = metrics_with(
        &server,
        r#"cellgate_index_pending_cells{datastore="trips"} 0"#,
    )
    .await;
    assert_eq!(
        metric_value(&text, r#"cellgate_index_lagging_shards{datastore="trips"}"#),
        0.0
    );
}

fn buckets_held(text: &str) -> f64 {
    metric_value(text, r#"cellgate_index_buckets_held{datastore="trips"}"#)
}

/// Writes `count` trips of `driver` through `server`, in batches of 50.
async fn write_trips(server: &Server, driver: uuid::Uuid, count: usize) {
    let query = "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }";
    for _ in 0..count / 50 {
        let cells: Vec<Value> = (0..50)
            .map(|i| {
                json!({
                    "rowKey": uuid::Uuid::new_v4(),
                    "column": "BASE",
                    "refKey": 1,
                    "body": {
                        "driver_partner_uuid": driver.to_string(),
                        "city_uuid": uuid::Uuid::new_v4().to_string(),
                        "trip_created_at": format!("2024-03-01T10:00:{:02}Z", i),
                    },
                })
            })
            .collect();
        let response = post(
            server,
            None,
            &json!({"query": query, "variables": {"cells": cells}}),
        )
        .await;
        let body: Value = response.json().await.unwrap();
        let results = body["data"]["tripsPutCells"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"));
        assert!(results.iter().all(|r| r["status"] == "WRITTEN"), "{body}");
    }
}

/// Counts the index entries of `driver` through `server`.
async fn count_entries(server: &Server, driver: uuid::Uuid) -> usize {
    let query = "query($d: UUID!, $after: String) { trips { driverPartnerIndex(driverPartnerUuid: $d, first: 1000, after: $after) { edges { node { rowKey } } pageInfo { hasNextPage endCursor } } } }";
    let mut after = Value::Null;
    let mut total = 0;
    loop {
        let response = post(
            server,
            None,
            &json!({"query": query, "variables": {"d": driver, "after": after}}),
        )
        .await;
        let body: Value = response.json().await.unwrap();
        let connection = &body["data"]["trips"]["driverPartnerIndex"];
        total += connection["edges"]
            .as_array()
            .unwrap_or_else(|| panic!("{body}"))
            .len();
        if connection["pageInfo"]["hasNextPage"] != true {
            return total;
        }
        after = connection["pageInfo"]["endCursor"].clone();
    }
}

// Two gateways on one store split the index maintenance through leases;
// when one is killed mid-load the other takes its shards over and every
// write is indexed.
#[tokio::test]
async fn a_killed_gateway_s_shards_are_taken_over() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("leases.yaml");
    std::fs::write(
        &config,
        "indexes:\n  lease_time_ms: 2000\n  sweep_interval_ms: 200\n",
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let a = Server::start_on(dir, &["--config", &config]);
    // The second gateway shares the first one's data directory.
    let data = a.dir.path().join("data");
    let second = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&data, second.path().join("data")).unwrap();
    let b = Server::start_on(second, &["--config", &config]);
    // They settle on half of the 64 buckets each.
    let mut split = false;
    for _ in 0..300 {
        let held_a = buckets_held(
            &client()
                .get(a.url("/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
        let held_b = buckets_held(
            &client()
                .get(b.url("/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
        if held_a > 0.0 && held_b > 0.0 && held_a + held_b == 64.0 {
            split = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(split, "the gateways never shared the buckets");
    let driver = uuid::Uuid::new_v4();
    write_trips(&a, driver, 500).await;
    write_trips(&b, driver, 500).await;
    let killed = std::time::Instant::now();
    drop(b.stop());
    write_trips(&a, driver, 1000).await;
    let text = metrics_with(&a, r#"cellgate_index_buckets_held{datastore="trips"} 64"#).await;
    eprintln!(
        "takeover: all buckets held {:.1} s after the kill (lease time 2 s)",
        killed.elapsed().as_secs_f64()
    );
    assert_eq!(buckets_held(&text), 64.0);
    metrics_with(&a, r#"cellgate_index_pending_cells{datastore="trips"} 0"#).await;
    assert_eq!(count_entries(&a, driver).await, 2000, "every write indexed");
}

// Regression: a gateway stopped with SIGTERM kept its index leases until
// they expired, so the others waited the whole lease time to take over.
#[tokio::test]
async fn a_stopped_gateway_hands_its_shards_over_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("leases.yaml");
    // Far longer than the test waits: only a release explains a takeover.
    std::fs::write(
        &config,
        "indexes:\n  lease_time_ms: 600000\n  sweep_interval_ms: 200\n",
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let a = Server::start_on(dir, &["--config", &config]);
    let second = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(a.dir.path().join("data"), second.path().join("data")).unwrap();
    let mut b = Server::start_on(second, &["--config", &config]);
    let mut split = false;
    for _ in 0..600 {
        let held_b = buckets_held(
            &client()
                .get(b.url("/metrics"))
                .send()
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        );
        if held_b > 0.0 {
            split = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        split,
        "the second gateway never took a share of the buckets"
    );
    let status = Command::new("kill")
        .args(["-TERM", &b.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = b.child.wait().unwrap();
    assert!(exit.success(), "SIGTERM ends the gateway cleanly: {exit:?}");
    metrics_with(&a, r#"cellgate_index_buckets_held{datastore="trips"} 64"#).await;
}
