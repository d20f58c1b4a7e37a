//! Security and admission end to end, through the real `cellgate serve`:
//! tokens and scopes, revocation, `/metrics`, CORS, cost and fragment
//! limits, slow clients and shutdown under load.

#[path = "support/server.rs"]
mod server;

use std::io::Write as _;
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use cellgate_graphql::auth::tokens;
use reqwest::header::{AUTHORIZATION, RETRY_AFTER, WWW_AUTHENTICATE};
use reqwest::StatusCode;
use serde_json::{json, Value};
use server::{cellgate, root, Server};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Writes `cellgate.yaml` into `dir` and returns its path.
fn config(dir: &Path, text: &str) -> String {
    let path = dir.join("cellgate.yaml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// `auth.tokens` entries for `(name, scopes)`, with the tokens.
fn config_tokens(specs: &[(&str, &[&str])]) -> (String, Vec<String>) {
    let mut yaml = String::from("auth:\n  enabled: true\n  tokens:\n");
    let mut secrets = Vec::new();
    for (name, scopes) in specs {
        let token = tokens::generate();
        let scopes: Vec<String> = scopes.iter().map(|s| format!("\"{s}\"")).collect();
        yaml.push_str(&format!(
            "    - {{ name: {name}, hash: \"{}\", scopes: [{}] }}\n",
            token.hash,
            scopes.join(", ")
        ));
        secrets.push(token.token);
    }
    (yaml, secrets)
}

async fn post(server: &Server, token: Option<&str>, query: &str) -> (StatusCode, Value) {
    post_json(server, token, &json!({ "query": query })).await
}

async fn post_json(server: &Server, token: Option<&str>, body: &Value) -> (StatusCode, Value) {
    let mut request = client().post(server.graphql()).json(body);
    if let Some(token) = token {
        request = request.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    let response = request.send().await.expect("request");
    let status = response.status();
    let body = response.json().await.unwrap_or(Value::Null);
    (status, body)
}

fn code(answer: &Value) -> &str {
    answer["errors"][0]["extensions"]["code"]
        .as_str()
        .unwrap_or("")
}

const ROW: &str = "0b6f7c1e-2a4d-4c8e-9f10-1a2b3c4d5e6f";

/// One operation of each kind, with the access it needs on `trips`.
fn operations() -> Vec<(&'static str, String, &'static str)> {
    vec![
        (
            "row read",
            format!("{{ trips {{ row(rowKey: \"{ROW}\") {{ rowKey }} }} }}"),
            "read",
        ),
        (
            "index query",
            format!("{{ trips {{ driverPartnerIndex(driverPartnerUuid: \"{ROW}\") {{ edges {{ cursor }} }} }} }}"),
            "read",
        ),
        (
            "log read",
            "{ trips { cellsForShard(shard: 0) { next } } }".to_string(),
            "read",
        ),
        (
            "write",
            format!("mutation {{ tripsPutCells(cells: [{{rowKey: \"{ROW}\", column: BASE, refKey: \"1\", body: {{}}}}]) {{ status }} }}"),
            "write",
        ),
        (
            "admin query",
            "{ trips { indexStatus { name } } }".to_string(),
            "admin",
        ),
        (
            "admin query (quarantine)",
            "{ trips { quarantine { index } } }".to_string(),
            "admin",
        ),
        (
            "admin mutation",
            "mutation { tripsRetryQuarantine { applied } }".to_string(),
            "admin",
        ),
        (
            "admin query (triggers)",
            "{ trips { triggers { name lag { pendingCells } } } }".to_string(),
            "admin",
        ),
        (
            "admin query (index verify)",
            "{ trips { indexVerify { state progress { missing } } } }".to_string(),
            "admin",
        ),
        (
            "admin mutation (index verify)",
            "mutation { tripsVerifyIndexes(sample: 1) { state } }".to_string(),
            "admin",
        ),
    ]
}

fn level(access: &str) -> u8 {
    match access {
        "read" => 1,
        "write" => 2,
        _ => 3,
    }
}

#[tokio::test]
async fn every_scope_and_operation_kind_is_allowed_or_refused() {
    let scopes: [(&str, &[&str]); 5] = [
        ("reader", &["trips:read"]),
        ("writer", &["trips:write"]),
        ("admin", &["trips:admin"]),
        ("other", &["payments:admin"]),
        ("everything", &["*:admin"]),
    ];
    let (yaml, secrets) = config_tokens(&scopes);
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), &yaml);
    let server = Server::start(&["--config", &file]);

    for ((name, granted), token) in scopes.iter().zip(&secrets) {
        let granted_level = granted
            .iter()
            .filter(|s| s.starts_with("trips:") || s.starts_with("*:"))
            .map(|s| level(s.split(':').nth(1).unwrap()))
            .max()
            .unwrap_or(0);
        for (kind, query, needs) in operations() {
            let (status, answer) = post(&server, Some(token), &query).await;
            if granted_level >= level(needs) {
                assert_eq!(status, StatusCode::OK, "{name} {kind}: {answer}");
                assert_ne!(code(&answer), "FORBIDDEN", "{name} {kind}: {answer}");
                // A verify started by an earlier scope may still run: then the
                // start is refused as such, after the access check.
                let still_running = kind == "admin mutation (index verify)"
                    && answer["errors"][0]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains("already running"));
                assert!(
                    answer.get("data").is_some() || still_running,
                    "{name} {kind}: {answer}"
                );
            } else {
                assert_eq!(status, StatusCode::FORBIDDEN, "{name} {kind}: {answer}");
                assert_eq!(code(&answer), "FORBIDDEN", "{name} {kind}: {answer}");
                assert!(answer.get("data").is_none(), "{name} {kind}: {answer}");
            }
        }
    }

    // No token, or a wrong one: 401 with a challenge.
    for token in [None, Some("cg_0000000000000000_nope")] {
        let response = {
            let mut request = client()
                .post(server.graphql())
                .json(&json!({"query": "{ __typename }"}));
            if let Some(token) = token {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            request.send().await.unwrap()
        };
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(response.headers()[WWW_AUTHENTICATE], "Bearer");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(code(&answer), "UNAUTHENTICATED", "{answer}");
    }

    // A token that cannot see a datastore cannot tell whether it exists.
    let other = &secrets[3];
    let (_, hidden) = post(&server, Some(other), "{ trips { __typename } }").await;
    let (_, missing) = post(&server, Some(other), "{ nosuch { __typename } }").await;
    let message = |answer: &Value, name: &str| {
        answer["errors"][0]["message"]
            .as_str()
            .unwrap()
            .replace(name, "NAME")
    };
    assert_eq!(code(&hidden), "FORBIDDEN");
    assert_eq!(code(&missing), "FORBIDDEN");
    assert_eq!(message(&hidden, "trips"), message(&missing, "nosuch"));
    let (_, hidden) = post(
        &server,
        Some(other),
        "mutation { tripsPutCells(cells: []) { status } }",
    )
    .await;
    let (_, missing) = post(
        &server,
        Some(other),
        "mutation { nosuchPutCells(cells: []) { status } }",
    )
    .await;
    assert_eq!(message(&hidden, "trips"), message(&missing, "nosuch"));

    // `datastores` lists only what the token may read.
    let (_, listed) = post(&server, Some(&secrets[0]), "{ datastores { name } }").await;
    assert_eq!(
        listed["data"]["datastores"],
        json!([{"name": "trips"}]),
        "{listed}"
    );

    // /metrics needs a token with a `*` scope.
    let metrics = |token: Option<&str>| {
        let mut request = client().get(server.url("/metrics"));
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        request.send()
    };
    assert_eq!(
        metrics(None).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        metrics(Some(&secrets[2])).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        metrics(Some(&secrets[4])).await.unwrap().status(),
        StatusCode::OK
    );

    // Reloading the definitions, and their state, need `*:admin`; the
    // route takes only JSON, so another origin's page cannot send it
    // without a preflight.
    let reload = |token: Option<&str>, json: bool| {
        let mut request = client().post(server.url("/admin/reload")).body("{}");
        if json {
            request = request.header(reqwest::header::CONTENT_TYPE, "application/json");
        }
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        request.send()
    };
    assert_eq!(
        reload(None, true).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        reload(Some(&secrets[2]), true).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        reload(Some(&secrets[4]), false).await.unwrap().status(),
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    let reloaded = reload(Some(&secrets[4]), true).await.unwrap();
    assert_eq!(reloaded.status(), StatusCode::OK);
    let reloaded: Value = reloaded.json().await.unwrap();
    assert_eq!(reloaded["result"], "unchanged", "{reloaded}");
    let state = "{ definitions { latest lastReload { result } } }";
    let (status, answer) = post(&server, Some(&secrets[2]), state).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (status, answer) = post(&server, Some(&secrets[4]), state).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["data"]["definitions"],
        json!({"latest": true, "lastReload": {"result": "UNCHANGED"}}),
        "{answer}"
    );

    // IDs belong to no datastore: only `*` scopes take them, and only
    // `*:admin` creates a biz tag.
    let (status, answer) = post(&server, Some(&secrets[2]), "{ snowflakeIds(count: 1) }").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(code(&answer), "FORBIDDEN", "{answer}");
    let create = r#"mutation { createIdTag(bizTag: "orders") }"#;
    let (status, answer) = post(&server, Some(&secrets[2]), create).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    let (status, answer) = post(&server, Some(&secrets[4]), create).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let (status, answer) = post(
        &server,
        Some(&secrets[4]),
        r#"{ nextIds(bizTag: "orders", count: 2) }"#,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["data"]["nextIds"].as_array().map(Vec::len),
        Some(2),
        "{answer}"
    );
    let plain = |token: Option<&str>| {
        let mut request = client().get(server.url("/api/segment/get/orders"));
        if let Some(token) = token {
            request = request.header(AUTHORIZATION, format!("Bearer {token}"));
        }
        request.send()
    };
    assert_eq!(
        plain(None).await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        plain(Some(&secrets[0])).await.unwrap().status(),
        StatusCode::FORBIDDEN
    );
    let allowed = plain(Some(&secrets[4])).await.unwrap();
    assert_eq!(allowed.status(), StatusCode::OK);
    assert!(allowed.text().await.unwrap().trim().parse::<i64>().is_ok());
}

fn token_command(dir: &Path, args: &[&str]) -> std::process::Output {
    cellgate(dir)
        .arg("token")
        .args(args)
        .args(["--data", dir.join("data").to_str().unwrap()])
        .args(["--datastores", root().join("datastores").to_str().unwrap()])
        .output()
        .expect("run cellgate token")
}

#[tokio::test]
async fn a_revoked_token_stops_working_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let created = token_command(
        dir.path(),
        &["create", "--scope", "trips:read", "--name", "ci"],
    );
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let token = String::from_utf8(created.stdout)
        .unwrap()
        .trim()
        .to_string();
    assert!(token.starts_with("cg_"), "{token}");
    let id = token[3..19].to_string();

    let server = Server::start_on(dir, &["--auth", "on"]);
    let query = format!("{{ trips {{ row(rowKey: \"{ROW}\") {{ rowKey }} }} }}");
    let (status, answer) = post(&server, Some(&token), &query).await;
    assert_eq!(status, StatusCode::OK, "{answer}");

    let listed = token_command(server.dir.path(), &["list"]);
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(
        listed.contains(&id) && listed.contains("ci\ttrips:read") && listed.contains("active"),
        "{listed}"
    );
    assert!(!listed.contains(&token), "the secret is never shown again");

    let revoked = token_command(server.dir.path(), &["revoke", &id]);
    assert!(
        revoked.status.success(),
        "{}",
        String::from_utf8_lossy(&revoked.stderr)
    );
    let start = Instant::now();
    loop {
        let (status, answer) = post(&server, Some(&token), &query).await;
        if status == StatusCode::UNAUTHORIZED {
            assert_eq!(code(&answer), "UNAUTHENTICATED");
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "still accepted: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("revocation took effect after {:?}", start.elapsed());
    let listed = token_command(server.dir.path(), &["list"]);
    assert!(String::from_utf8(listed.stdout)
        .unwrap()
        .contains("revoked"));
}

#[tokio::test]
async fn per_token_rate_limits_answer_429_with_retry_after() {
    let (mut yaml, secrets) = config_tokens(&[("a", &["trips:read"]), ("b", &["trips:read"])]);
    yaml.push_str("limits:\n  rate_limit_per_token_per_second: 2\n");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&["--config", &config(dir.path(), &yaml)]);
    let mut limited = None;
    for _ in 0..10 {
        let response = client()
            .post(server.graphql())
            .header(AUTHORIZATION, format!("Bearer {}", secrets[0]))
            .json(&json!({"query": "{ __typename }"}))
            .send()
            .await
            .unwrap();
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            limited = Some(response);
            break;
        }
    }
    let limited = limited.expect("a 429 within 10 requests at 2/s");
    assert!(
        limited.headers()[RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let answer: Value = limited.json().await.unwrap();
    assert_eq!(code(&answer), "RATE_LIMITED");
    // Another token has its own budget.
    let (status, _) = post(&server, Some(&secrets[1]), "{ __typename }").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn cors_preflights_from_allowed_and_refused_origins() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(
        dir.path(),
        "cors:\n  allowed_origins: [\"https://app.example.com\"]\n",
    );
    let server = Server::start(&["--config", &file]);
    let preflight = |origin: &'static str| {
        client()
            .request(reqwest::Method::OPTIONS, server.graphql())
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "content-type, authorization",
            )
            .send()
    };
    let allowed = preflight("https://app.example.com").await.unwrap();
    assert_eq!(allowed.status(), StatusCode::NO_CONTENT);
    let headers = allowed.headers();
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example.com"
    );
    assert!(headers["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .contains("POST"));
    assert!(headers["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("authorization"));
    assert!(headers.get("access-control-allow-credentials").is_none());

    let refused = preflight("https://evil.example.com").await.unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    assert!(refused
        .headers()
        .get("access-control-allow-origin")
        .is_none());

    // The actual request carries the header for the allowed origin only.
    for (origin, expected) in [
        ("https://app.example.com", Some("https://app.example.com")),
        ("https://evil.example.com", None),
    ] {
        let response = client()
            .post(server.graphql())
            .header("origin", origin)
            .json(&json!({"query": "{ __typename }"}))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response
                .headers()
                .get("access-control-allow-origin")
                .map(|v| v.to_str().unwrap()),
            expected
        );
    }

    // Security headers on the HTML pages.
    let page = client().get(server.url("/")).send().await.unwrap();
    for name in [
        "content-security-policy",
        "x-content-type-options",
        "referrer-policy",
        "x-frame-options",
    ] {
        assert!(page.headers().get(name).is_some(), "{name} missing on /");
    }
}

#[tokio::test]
async fn fan_out_and_fragment_bombs_are_refused_with_their_limits() {
    let server = Server::start(&[]);
    let gql = "application/graphql-response+json";
    let ask = |query: String| {
        client()
            .post(server.graphql())
            .header("accept", gql)
            .json(&json!({ "query": query }))
            .send()
    };
    let page = format!(
        "driverPartnerIndex(driverPartnerUuid: \"{ROW}\", first: 1000) {{ edges {{ node {{ row {{ base {{ body }} }} }} }} }}"
    );
    // One page of 1000 rows with their bodies is accepted…
    let one = ask(format!("{{ trips {{ {page} }} }}")).await.unwrap();
    assert_eq!(one.status(), StatusCode::OK);
    // …eight of them under aliases are not.
    let aliases: String = (0..8).map(|i| format!("p{i}: {page} ")).collect();
    let response = ask(format!("{{ trips {{ {aliases} }} }}")).await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let answer: Value = response.json().await.unwrap();
    let extensions = &answer["errors"][0]["extensions"];
    assert_eq!(extensions["code"], "QUERY_TOO_COMPLEX", "{answer}");
    assert_eq!(extensions["limitName"], "complexity", "{answer}");
    assert_eq!(extensions["limit"], 25000, "{answer}");
    assert_eq!(extensions["cost"], 1 + 8 * (1 + 1000 * 5), "{answer}");

    // Fragments spreading the next one ten times over, ten levels deep:
    // 10^10 expansions, which async-graphql's parse step walked before
    // any limit was checked.
    let mut bomb = String::from("query { ...F0 }");
    for i in 0..10 {
        let spreads = format!("...F{} ", i + 1).repeat(10);
        bomb.push_str(&format!(" fragment F{i} on Query {{ {spreads}}}"));
    }
    bomb.push_str(" fragment F10 on Query { __typename }");
    let start = Instant::now();
    let response = ask(bomb.clone()).await.unwrap();
    let elapsed = start.elapsed();
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["errors"][0]["extensions"]["code"], "QUERY_TOO_COMPLEX",
        "{answer}"
    );
    assert_eq!(
        answer["errors"][0]["extensions"]["limitName"], "fragmentSpreads",
        "{answer}"
    );
    assert_eq!(answer["errors"][0]["extensions"]["limit"], 500, "{answer}");
    println!("fragment bomb refused in {elapsed:?}");
    // Regression: the same ending in a cycle selected no field at all.
    let cyclic = bomb.replace("{ __typename }", "{ ...F0 }");
    let response = ask(cyclic).await.unwrap();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["errors"][0]["extensions"]["code"], "GRAPHQL_VALIDATION_FAILED",
        "{answer}"
    );
    assert_eq!(
        answer["errors"][0]["extensions"]["limitName"], "fragmentCycle",
        "{answer}"
    );

    // Too many aliases.
    let many: String = (0..40).map(|i| format!("a{i}: __typename ")).collect();
    let response = ask(format!("{{ {many} }}")).await.unwrap();
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["errors"][0]["extensions"]["limitName"], "aliases",
        "{answer}"
    );

    // A filter of 10,000 terms is refused before it is planned.
    let filter = vec!["trip_status = \"x\""; 10_000].join(" and ");
    let (status, answer) = post_json(
        &server,
        None,
        &json!({
            "query": "query($d: UUID!, $f: String) { trips { driverPartnerIndex(driverPartnerUuid: $d, filter: $f) { edges { cursor } } } }",
            "variables": { "d": ROW, "f": filter },
        }),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(code(&answer), "LIMIT_EXCEEDED", "{answer}");
}

/// Opens a connection that sends the headers of a POST and part of its
/// body, then stalls.
fn stalled_client(base: &str) -> TcpStream {
    let address = base.trim_start_matches("http://");
    let mut stream = TcpStream::connect(address).expect("connect");
    let head = format!(
        "POST /graphql HTTP/1.1\r\nhost: {address}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{{\"query\": \"{{ __typ"
    );
    stream.write_all(head.as_bytes()).expect("send");
    stream
}

#[tokio::test]
async fn stalled_clients_hold_no_permits() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(
        dir.path(),
        "limits:\n  max_concurrent_requests: 8\n  max_connections_per_client: 1000\n  body_timeout_ms: 60000\n",
    );
    let server = Server::start(&["--config", &file]);
    let measure = || async {
        let mut latencies = Vec::new();
        for _ in 0..20 {
            let start = Instant::now();
            let (status, answer) = post(&server, None, "{ datastores { name } }").await;
            latencies.push(start.elapsed());
            assert_eq!(status, StatusCode::OK, "{answer}");
            assert!(answer.get("errors").is_none(), "{answer}");
        }
        latencies.sort();
        (
            latencies[latencies.len() / 2],
            latencies[latencies.len() - 1],
        )
    };
    let (median, max) = measure().await;
    println!("without stalled clients: median {median:?}, max {max:?}");
    let stalled: Vec<TcpStream> = (0..300).map(|_| stalled_client(&server.base)).collect();
    // Let the server read all their headers.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (median, max) = measure().await;
    println!(
        "with {} stalled clients: median {median:?}, max {max:?}",
        stalled.len()
    );
    drop(stalled);
}

#[tokio::test]
async fn slow_headers_and_bodies_time_out() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(
        dir.path(),
        "limits:\n  body_timeout_ms: 300\n  header_timeout_ms: 300\n  max_connections_per_client: 4\n",
    );
    let server = Server::start(&["--config", &file]);
    // Headers that never end: the connection is closed.
    let address = server.base.trim_start_matches("http://");
    let mut headers = TcpStream::connect(address).unwrap();
    headers
        .write_all(b"POST /graphql HTTP/1.1\r\nhost: x\r\ncontent-type: appl")
        .unwrap();
    headers
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let start = Instant::now();
    let mut rest = Vec::new();
    let read = std::io::Read::read_to_end(&mut headers, &mut rest);
    assert!(
        read.is_ok() && start.elapsed() < Duration::from_secs(5),
        "{read:?} after {:?}",
        start.elapsed()
    );

    let mut slow = stalled_client(&server.base);
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = String::new();
    let _ = std::io::Read::read_to_string(&mut slow, &mut answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("BODY_TIMEOUT"), "{answer}");
}

#[tokio::test]
async fn connections_are_capped_per_client() {
    // Timeouts far beyond the test, so the held connections stay open
    // however slowly this machine runs it.
    let dir = tempfile::tempdir().unwrap();
    let file = config(
        dir.path(),
        "limits:\n  body_timeout_ms: 60000\n  header_timeout_ms: 60000\n  max_connections_per_client: 4\n",
    );
    let server = Server::start(&["--config", &file]);
    let held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(server.base.trim_start_matches("http://")).unwrap())
        .collect();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = client()
        .post(server.graphql())
        .json(&json!({"query": "{ __typename }"}))
        .send()
        .await;
    assert!(refused.is_err(), "a fifth connection is closed");
    drop(held);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, _) = post(&server, None, "{ __typename }").await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn sigterm_is_honoured_while_requests_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(
        dir.path(),
        "limits:\n  shutdown_grace_ms: 1000\n  body_timeout_ms: 60000\n",
    );
    let mut server = Server::start(&["--config", &file]);
    // Requests in flight that would not finish on their own: stalled
    // bodies, and a stream of heavy queries.
    let _stalled: Vec<TcpStream> = (0..20).map(|_| stalled_client(&server.base)).collect();
    let graphql = server.graphql();
    let keys: Vec<String> = (0..1000)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let heavy = tokio::spawn(async move {
        let query =
            "query($k: [UUID!]!) { trips { rows(rowKeys: $k) { base { body } status { body } } } }";
        loop {
            let sent = client()
                .post(&graphql)
                .json(&json!({"query": query, "variables": {"k": keys}}))
                .send()
                .await;
            if sent.is_err() {
                break;
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    let pid = server.child.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "still running after SIGTERM; stderr:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    println!("exited {:?} after SIGTERM", start.elapsed());
    assert!(status.success(), "{status:?}: {}", server.stderr());
    heavy.abort();
}

#[tokio::test]
async fn requests_past_the_deadline_are_cancelled_with_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "limits:\n  request_timeout_ms: 1\n");
    let server = Server::start(&["--config", &file]);
    let keys: Vec<String> = (0..1000)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let (status, answer) = post_json(
        &server,
        None,
        &json!({
            "query": "query($k: [UUID!]!) { trips { rows(rowKeys: $k) { base { body } status { body } } } }",
            "variables": { "k": keys },
        }),
    )
    .await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT, "{answer}");
    assert_eq!(code(&answer), "TIMEOUT", "{answer}");
}

#[tokio::test]
async fn introspection_and_the_pages_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(
        dir.path(),
        "auth:\n  introspection: false\n  playground: false\n",
    );
    let server = Server::start(&["--config", &file]);
    let (status, answer) = post(&server, None, "{ __schema { queryType { name } } }").await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{answer}");
    assert_eq!(code(&answer), "FORBIDDEN", "{answer}");
    let (status, answer) = post(&server, None, "{ datastores { name } }").await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    for page in ["/", "/ui/", "/playground/index.html"] {
        let response = client().get(server.url(page)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{page}");
    }
}

#[tokio::test]
async fn introspection_needs_a_token_when_auth_is_on() {
    let (yaml, secrets) = config_tokens(&[("reader", &["payments:read"])]);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&["--config", &config(dir.path(), &yaml)]);
    let query = "{ __schema { queryType { name } } }";
    let (status, _) = post(&server, None, query).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, answer) = post(&server, Some(&secrets[0]), query).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["data"]["__schema"]["queryType"]["name"], "Query");
}

/// The `Query` field names and the type names an introspection shows.
async fn introspected(server: &Server, token: &str) -> (Vec<String>, Vec<String>, Value) {
    let query = "{ __schema { queryType { fields { name } } mutationType { fields { name } } types { name } } trips: __type(name: \"TripsQuery\") { name } }";
    let (status, answer) = post(server, Some(token), query).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let names = |list: &Value| -> Vec<String> {
        list.as_array()
            .expect("a list")
            .iter()
            .map(|t| t["name"].as_str().unwrap().to_string())
            .collect()
    };
    let schema = &answer["data"]["__schema"];
    let mut fields = names(&schema["queryType"]["fields"]);
    fields.extend(names(&schema["mutationType"]["fields"]));
    (
        fields,
        names(&schema["types"]),
        answer["data"]["trips"].clone(),
    )
}

// Regression: introspection showed every datastore to any valid token,
// although `Query.datastores` and the access check hide the datastores a
// token may not read.
#[tokio::test]
async fn introspection_shows_a_token_only_its_datastores() {
    let (yaml, secrets) = config_tokens(&[
        ("payments", &["payments:write"]),
        ("everything", &["*:read"]),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&["--config", &config(dir.path(), &yaml)]);
    let (fields, types, trips) = introspected(&server, &secrets[0]).await;
    assert!(fields.contains(&"payments".to_string()), "{fields:?}");
    assert!(
        fields.contains(&"paymentsPutCells".to_string()),
        "{fields:?}"
    );
    assert!(
        !fields.iter().any(|f| f.starts_with("trips")),
        "trips fields shown: {fields:?}"
    );
    assert!(
        !types.iter().any(|t| t.starts_with("Trips")),
        "trips types shown: {types:?}"
    );
    assert!(types.contains(&"PaymentsQuery".to_string()), "{types:?}");
    assert_eq!(trips, Value::Null, "__type of a hidden datastore");
    // A token for every datastore sees the whole schema.
    let (fields, types, trips) = introspected(&server, &secrets[1]).await;
    assert!(fields.contains(&"trips".to_string()), "{fields:?}");
    assert!(types.contains(&"TripsQuery".to_string()));
    assert_eq!(trips["name"], "TripsQuery");
    // Queries of the scoped token still run on the whole schema.
    let (status, answer) = post(
        &server,
        Some(&secrets[0]),
        "{ __typename payments { __typename } }",
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
}

/// A GET of `/graphql` with `Host: host`.
async fn get_with_host(server: &Server, host: &str) -> (StatusCode, String) {
    let response = client()
        .get(server.url("/graphql?query=%7B__typename%7D"))
        .header(reqwest::header::HOST, host)
        .send()
        .await
        .unwrap();
    let status = response.status();
    (status, response.text().await.unwrap())
}

// Regression: with auth off on loopback the `Host` header was not checked,
// so a page whose name was rebound to 127.0.0.1 could read and write every
// datastore through a visitor's browser.
#[tokio::test]
async fn requests_for_other_hosts_are_refused_against_dns_rebinding() {
    let server = Server::start(&[]);
    let port = server.base.rsplit(':').next().unwrap().to_string();
    for host in [
        "evil.example",
        &format!("evil.example:{port}"),
        "127.0.0.1.evil.example",
    ] {
        let (status, body) = get_with_host(&server, host).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{host}: {body}");
        assert!(body.starts_with("HOST_NOT_ALLOWED"), "{body}");
    }
    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("[::1]:{port}"),
        "app.localhost".to_string(),
    ] {
        let (status, body) = get_with_host(&server, &host).await;
        assert_eq!(status, StatusCode::OK, "{host}: {body}");
    }
    // A write from a rebound page is refused before it runs.
    let row = uuid::Uuid::new_v4();
    let write = format!(
        "mutation {{ tripsPutCells(cells: [{{ rowKey: \"{row}\", column: NOTES, refKey: 1, body: {{ text: \"x\" }} }}]) {{ status }} }}"
    );
    let response = client()
        .post(server.graphql())
        .header(reqwest::header::HOST, "evil.example")
        .json(&json!({ "query": write }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let read =
        format!("{{ trips {{ latestCell(rowKey: \"{row}\", column: NOTES) {{ refKey }} }} }}");
    let (status, answer) = post(&server, None, &read).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(
        answer["data"]["trips"]["latestCell"],
        Value::Null,
        "nothing written"
    );
    for path in ["/", "/metrics", "/ui/"] {
        let response = client()
            .get(server.url(path))
            .header(reqwest::header::HOST, "evil.example")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::FORBIDDEN, "{path}");
    }

    // Configured names are allowed, and `*` turns the check off.
    let dir = tempfile::tempdir().unwrap();
    let listed = Server::start(&[
        "--config",
        &config(
            dir.path(),
            "http:\n  allowed_hosts: [cellgate.test, .corp.example]\n",
        ),
    ]);
    assert_eq!(
        get_with_host(&listed, "cellgate.test").await.0,
        StatusCode::OK
    );
    assert_eq!(
        get_with_host(&listed, "api.corp.example:80").await.0,
        StatusCode::OK
    );
    assert_eq!(
        get_with_host(&listed, "evil.example").await.0,
        StatusCode::FORBIDDEN
    );
    let dir = tempfile::tempdir().unwrap();
    let any = Server::start(&[
        "--config",
        &config(dir.path(), "http:\n  allowed_hosts: [\"*\"]\n"),
    ]);
    assert_eq!(get_with_host(&any, "evil.example").await.0, StatusCode::OK);
}

// Regression: `/metrics` and the plain ID routes looked up every random
// well-formed token in the database with no per-address limit.
#[tokio::test]
async fn plain_routes_rate_limit_token_lookups_per_address() {
    let (mut yaml, secrets) = config_tokens(&[("scraper", &["*:read"])]);
    yaml.push_str("limits:\n  rate_limit_per_second: 5\n");
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&["--config", &config(dir.path(), &yaml)]);
    let mut statuses = Vec::new();
    for path in ["/metrics", "/api/snowflake/get/any"] {
        for _ in 0..20 {
            let token = tokens::generate().token;
            let response = client()
                .get(server.url(path))
                .header(AUTHORIZATION, format!("Bearer {token}"))
                .send()
                .await
                .unwrap();
            if response.status() == StatusCode::TOO_MANY_REQUESTS {
                assert!(response.headers().contains_key(RETRY_AFTER));
                let body = response.text().await.unwrap();
                assert!(body.starts_with("RATE_LIMITED"), "{body}");
                statuses.push(StatusCode::TOO_MANY_REQUESTS);
            } else {
                statuses.push(response.status());
            }
        }
        tokio::time::sleep(Duration::from_millis(1100)).await;
    }
    assert!(
        statuses.contains(&StatusCode::UNAUTHORIZED),
        "random tokens are refused: {statuses:?}"
    );
    let limited = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert!(
        limited >= 20,
        "at 5/s, most of 40 requests are limited: {statuses:?}"
    );
    // After a pause a valid token gets through.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let response = client()
        .get(server.url("/metrics"))
        .header(AUTHORIZATION, format!("Bearer {}", secrets[0]))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// Starts `cellgate serve --listen 0.0.0.0:0 ARGS` and returns it with
/// the port it chose.
fn serve_on_every_address(dir: &Path, args: &[&str]) -> (std::process::Child, u16) {
    use std::io::BufRead as _;
    let mut child = cellgate(dir)
        .arg("serve")
        .args(["--listen", "0.0.0.0:0"])
        .args(["--data", dir.join("data").to_str().unwrap()])
        .args(["--datastores", root().join("datastores").to_str().unwrap()])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut port = 0;
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("cellgate listening on http://") {
            let address = rest.split_whitespace().next().unwrap();
            port = address.rsplit(':').next().unwrap().parse().unwrap();
            break;
        }
    }
    assert!(port > 0, "no listening line");
    (child, port)
}

#[tokio::test]
async fn auth_is_on_off_loopback_and_turning_it_off_warns() {
    let query = json!({"query": "{ __typename }"});
    let dir = tempfile::tempdir().unwrap();
    let (mut child, port) = serve_on_every_address(dir.path(), &[]);
    let response = client()
        .post(format!("http://127.0.0.1:{port}/graphql"))
        .json(&query)
        .send()
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);

    let (mut child, port) = serve_on_every_address(dir.path(), &["--auth", "off"]);
    let response = client()
        .post(format!("http://127.0.0.1:{port}/graphql"))
        .json(&query)
        .send()
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(response.status(), StatusCode::OK);
    let stderr = std::fs::read_to_string(dir.path().join("stderr.log")).unwrap();
    assert!(
        stderr.contains("WARNING: authentication is OFF"),
        "{stderr}"
    );
}
