//! `cellgate serve` end to end: each test starts the real binary on a free
//! port (`--listen 127.0.0.1:0`), reads the bound address from the line it
//! prints, and talks HTTP to it. The process is killed when the test ends,
//! also when it fails (see [`Server`]'s `Drop`).

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use reqwest::header::{ACCEPT, ALLOW, CONTENT_TYPE, RETRY_AFTER};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// The workspace root, where `datastores/` and `cellgate.example.yaml` live.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// `cellgate` with no `CELLGATE_*` or `RUST_LOG` variables inherited.
fn cellgate(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cellgate"));
    command.current_dir(dir);
    for (name, _) in std::env::vars_os() {
        let name_str = name.to_string_lossy();
        if name_str.starts_with("CELLGATE_") || name_str == "RUST_LOG" {
            command.env_remove(&name);
        }
    }
    command
}

/// A running `cellgate serve`, killed on drop.
struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    base: String,
    /// What it printed before the listening line.
    preamble: Vec<String>,
    dir: tempfile::TempDir,
}

impl Server {
    /// Starts `cellgate serve` on a free port with a fresh data directory
    /// and the repository's definitions, plus `extra` arguments.
    fn start(extra: &[&str]) -> Server {
        Server::start_in(tempfile::tempdir().expect("temp dir"), extra)
    }

    /// Like [`Server::start`], with the data directory `<dir>/data`, which
    /// may already hold a store.
    fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Server {
        let data = dir.path().join("data");
        let datastores = root().join("datastores");
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr log");
        let mut child = cellgate(dir.path())
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .arg("--data")
            .arg(&data)
            .arg("--datastores")
            .arg(&datastores)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start cellgate serve");

        // Read stdout on a thread, so a server that never prints the line
        // fails the test after a timeout instead of hanging it.
        let stdout = child.stdout.take().expect("stdout");
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server {
            child,
            base: String::new(),
            preamble: Vec::new(),
            dir,
        };
        loop {
            match lines.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("cellgate listening on ") {
                        let url = rest.split_whitespace().next().expect("address");
                        server.base = url.to_string();
                        assert!(
                            line.ends_with(&format!("GraphQL playground at {url}/")),
                            "{line}"
                        );
                        break;
                    }
                    server.preamble.push(line);
                }
                Err(_) => panic!(
                    "cellgate serve did not print its address; stderr:\n{}",
                    server.stderr()
                ),
            }
        }
        server
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn graphql(&self) -> String {
        self.url("/graphql")
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }
}

impl Server {
    /// Kills the server and hands back its directory, to start another
    /// server on the same store.
    fn stop(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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
    ] {
        assert!(text.contains(expected), "missing `{expected}` in:\n{text}");
    }
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
fn the_reference_config_is_the_default() {
    let path = root().join("cellgate.example.yaml");
    let text = std::fs::read_to_string(&path).expect("cellgate.example.yaml");
    let config =
        cellgate::config::Config::from_yaml(&text, &path).expect("reference config parses");
    assert_eq!(config, cellgate::config::Config::default());
}

#[test]
fn unknown_config_keys_are_errors() {
    let error = cellgate::config::Config::from_yaml(
        "limits:\n  max_bodybytes: 10\n",
        Path::new("cellgate.yaml"),
    )
    .unwrap_err();
    assert!(format!("{error:#}").contains("max_bodybytes"), "{error:#}");
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
    use cellgate::cells::NewCell;
    let dir = tempfile::tempdir().unwrap();
    {
        let defs = index_dsl::load_dir(&root().join("datastores")).unwrap();
        let mut options = cellgate::StoreOptions::new(cellgate::config::StorageConfig::embedded(
            &dir.path().join("data"),
        ));
        options.maintain_indexes = false;
        let store = cellgate::Store::open(defs, options).await.unwrap();
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
    let server = Server::start_in(dir, &["--config", config.to_str().unwrap()]);
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
    let server = Server::start_in(dir, &[]);
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
    let a = Server::start_in(dir, &["--config", &config]);
    // The second gateway shares the first one's data directory.
    let data = a.dir.path().join("data");
    let second = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(&data, second.path().join("data")).unwrap();
    let b = Server::start_in(second, &["--config", &config]);
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
