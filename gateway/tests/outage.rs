//! Storage outages seen through the real binary: a PostgreSQL server whose
//! sessions are ended, that is cut off by a network partition, killed and
//! restarted, all under write load; and databases that accept connections
//! but never answer. Every error a client sees must be
//! `STORAGE_UNAVAILABLE` with `extensions.retryable: true` (never
//! `INTERNAL`), requests and `/readyz` must come back rather than hang, and
//! writes must succeed again once the database is back.
//!
//! The PostgreSQL test runs a private server (its own data directory, a
//! free loopback port, stopped when the test ends) and needs the server
//! binaries (`initdb`, `postgres` on `PATH` or in
//! `/usr/lib/postgresql/*/bin`); without them it prints why it is skipped
//! (or fails, with `CELLGATE_TEST_SERVERS=required`; see `support/servers.rs`).
//! No assertion is about speed: waits are for outcomes, with generous
//! bounds that only a hang exceeds.

#[path = "support/postgres.rs"]
mod postgres;
#[path = "support/server.rs"]
mod server;
#[path = "support/servers.rs"]
mod servers;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use postgres::Postgres;
use reqwest::StatusCode;
use serde_json::{json, Value};
use server::{client, Server};

/// Starts `cellgate serve` on `database` with `config` as its
/// `cellgate.yaml`.
fn serve(database: &str, config: &str) -> Server {
    Server::start_with(&[ITEMS], config, &["--database", database])
}

/// One small datastore, so the test does not wait for shard tables.
const ITEMS: (&str, &str) = (
    "items/datastore.yaml",
    "name: items\nshards: 4\ncolumns:\n  - name: DATA\n",
);

const PUT: &str = "mutation($cells: [ItemsCellInput!]!) {
  itemsPutCells(cells: $cells) { status error { code message retryable } }
}";

/// What became of one write.
#[derive(Debug)]
enum Write {
    Stored,
    /// Refused, with every error `STORAGE_UNAVAILABLE` and retryable.
    Unavailable,
    /// Anything else: the defect this file pins.
    Unexpected(String),
}

/// Writes one new cell and classifies the answer.
async fn write_one(client: &reqwest::Client, server: &str, n: u64) -> Write {
    let cell = json!({
        "rowKey": uuid::Uuid::new_v4(), "column": "DATA", "refKey": 1, "body": {"n": n}
    });
    let body = json!({ "query": PUT, "variables": { "cells": [cell] } });
    let response = match client.post(server).json(&body).send().await {
        Ok(response) => response,
        Err(e) => return Write::Unexpected(format!("no answer: {e}")),
    };
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let Ok(answer) = serde_json::from_str::<Value>(&text) else {
        return Write::Unexpected(format!("{status}: {text}"));
    };
    if status != StatusCode::OK {
        return Write::Unexpected(format!("{status}: {answer}"));
    }
    let Some(errors) = answer["errors"].as_array() else {
        return match answer["data"]["itemsPutCells"][0]["status"].as_str() {
            Some("WRITTEN") => Write::Stored,
            _ => Write::Unexpected(answer.to_string()),
        };
    };
    let mut refusals: Vec<&Value> = errors.iter().map(|e| &e["extensions"]).collect();
    let cell_error = &answer["data"]["itemsPutCells"][0]["error"];
    if !cell_error.is_null() {
        refusals.push(cell_error);
    }
    if refusals
        .iter()
        .all(|e| e["code"] == "STORAGE_UNAVAILABLE" && e["retryable"] == true)
    {
        Write::Unavailable
    } else {
        Write::Unexpected(answer.to_string())
    }
}

/// Counts of the writes made by [`Load`].
#[derive(Debug, Default)]
struct Tally {
    stored: u64,
    unavailable: u64,
    unexpected: Vec<String>,
    /// Answers received by each writer.
    answers: Vec<u64>,
}

/// Writers that keep writing new cells until stopped.
struct Load {
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
    writers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(server: &Server, writers: usize) -> Load {
        let tally = Arc::new(Mutex::new(Tally {
            answers: vec![0; writers],
            ..Tally::default()
        }));
        let stop = Arc::new(AtomicBool::new(false));
        let writers = (0..writers as u64)
            .map(|w| {
                let (tally, stop, url) = (tally.clone(), stop.clone(), server.graphql());
                tokio::spawn(async move {
                    let client = client();
                    let mut n = w * 1_000_000;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let outcome = write_one(&client, &url, n).await;
                        let refused = !matches!(outcome, Write::Stored);
                        {
                            let mut tally = tally.lock().unwrap();
                            tally.answers[w as usize] += 1;
                            match outcome {
                                Write::Stored => tally.stored += 1,
                                Write::Unavailable => tally.unavailable += 1,
                                Write::Unexpected(what) => tally.unexpected.push(what),
                            }
                        }
                        if refused {
                            // No tight loop of instant failures while the
                            // database is down.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            tally,
            stop,
            writers,
        }
    }

    /// Answers received so far by each writer.
    fn answers(&self) -> Vec<u64> {
        self.tally.lock().unwrap().answers.clone()
    }

    /// Writes stored and writes refused (whatever the error) so far.
    fn counts(&self) -> (u64, u64) {
        let tally = self.tally.lock().unwrap();
        (
            tally.stored,
            tally.unavailable + tally.unexpected.len() as u64,
        )
    }

    /// Waits until `done(stored, refused)` holds; fails after 120 s (a
    /// bound only a stuck server reaches).
    async fn wait_for(&self, what: &str, done: impl Fn(u64, u64) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (stored, refused) = self.counts();
            if done(stored, refused) {
                return;
            }
            let tally = self.tally.lock().unwrap();
            assert!(
                Instant::now() < deadline,
                "waited 120 s for {what}; {} stored, {} unavailable, unexpected: {:?}",
                tally.stored,
                tally.unavailable,
                &tally.unexpected[..tally.unexpected.len().min(3)]
            );
            drop(tally);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn finish(self) -> Tally {
        self.stop.store(true, Ordering::Relaxed);
        for writer in self.writers {
            writer.await.unwrap();
        }
        Arc::try_unwrap(self.tally)
            .expect("writers finished")
            .into_inner()
            .unwrap()
    }
}

/// A TCP proxy in front of a database that can be cut off like a network
/// partition: while frozen it accepts connections but passes no bytes in
/// either direction, so statements in flight get no answer.
struct Partition {
    port: u16,
    frozen: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Partition {
    async fn open(upstream: u16) -> Partition {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (frozen, watch) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                tokio::spawn(Partition::pump(client_read, server_write, watch.clone()));
                tokio::spawn(Partition::pump(server_read, client_write, watch.clone()));
            }
        });
        Partition { port, frozen, task }
    }

    /// Copies bytes from `from` to `to`, holding them while frozen.
    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut frozen: tokio::sync::watch::Receiver<bool>,
    ) {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut buf = vec![0; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if frozen.wait_for(|frozen| !frozen).await.is_err() {
                return;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
        let _ = to.shutdown().await;
    }

    fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// While PostgreSQL restarted, some writes failed with INTERNAL
// ("terminating connection due to unexpected postmaster exit") instead of
// STORAGE_UNAVAILABLE.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writes_while_postgres_dies_and_restarts_are_storage_unavailable() {
    let mut postgres = match Postgres::init() {
        Ok(postgres) => postgres,
        Err(why) => {
            servers::skip(
                "writes_while_postgres_dies_and_restarts_are_storage_unavailable",
                &why,
            );
            return;
        }
    };
    postgres.start().await;
    let partition = Partition::open(postgres.port).await;
    let server = serve(
        &format!("postgres://postgres@127.0.0.1:{}/postgres", partition.port),
        "storage:\n  timeout_ms: 2000\n  readiness_timeout_ms: 1000\n",
    );
    server
        .wait_ready(StatusCode::OK, Duration::from_secs(120))
        .await;
    let load = Load::start(&server, 16);
    load.wait_for("writes before the outage", |stored, _| stored >= 20)
        .await;

    // Sessions ended by the server, as on a fast shutdown or a failover:
    // each one gets FATAL 57P01, often in the middle of a transaction.
    let (stored_before, failed_before) = load.counts();
    let mut admin = {
        use sqlx::Connection as _;
        sqlx::PgConnection::connect(&postgres.url()).await.unwrap()
    };
    let terminate = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()";
    let deadline = Instant::now() + Duration::from_secs(120);
    while load.counts().1 < failed_before + 10 {
        sqlx::query(terminate).execute(&mut admin).await.unwrap();
        assert!(
            Instant::now() < deadline,
            "ending sessions failed no write: {:?}",
            load.counts()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(admin);
    load.wait_for("writes after the sessions ended", |stored, _| {
        stored >= stored_before + 20
    })
    .await;

    // A network partition: statements in flight get no answer. Every writer
    // must get answers while it lasts, not wait for it to end.
    let (stored_before, _) = load.counts();
    let answered_before = load.answers();
    partition.freeze(true);
    load.wait_for("every writer answered during the partition", |_, _| {
        let answers = load.answers();
        answers
            .iter()
            .zip(&answered_before)
            .all(|(now, before)| *now >= before + 2)
    })
    .await;
    server
        .wait_ready(StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(120))
        .await;
    partition.freeze(false);
    load.wait_for("writes after the partition", |stored, _| {
        stored >= stored_before + 20
    })
    .await;
    server
        .wait_ready(StatusCode::OK, Duration::from_secs(120))
        .await;

    // SIGKILL: the postmaster vanishes and its sessions end on their own;
    // QUIT: an immediate shutdown, which terminates every session.
    for signal in ["KILL", "QUIT"] {
        let (_, failed_before) = load.counts();
        postgres.stop(signal);
        load.wait_for("writes refused during the outage", |_, refused| {
            refused >= failed_before + 10
        })
        .await;
        server
            .wait_ready(StatusCode::SERVICE_UNAVAILABLE, Duration::from_secs(120))
            .await;

        postgres.start().await;
        let (stored_at_restart, _) = load.counts();
        load.wait_for("writes after the restart", |stored, _| {
            stored >= stored_at_restart + 20
        })
        .await;
        server
            .wait_ready(StatusCode::OK, Duration::from_secs(120))
            .await;
    }
    let tally = load.finish().await;
    // What the server saw, for the test log: driver errors by kind.
    let mut kinds = std::collections::BTreeMap::<String, usize>::new();
    for line in server
        .stderr()
        .lines()
        .filter(|l| l.contains("request failed"))
    {
        let error = line.split(" error=").nth(1).unwrap_or(line);
        *kinds.entry(error.chars().take(120).collect()).or_default() += 1;
    }
    eprintln!("errors logged by the server: {kinds:#?}");
    eprintln!(
        "{} writes stored, {} refused as STORAGE_UNAVAILABLE, {} unexpected",
        tally.stored,
        tally.unavailable,
        tally.unexpected.len()
    );
    assert!(
        tally.unexpected.is_empty(),
        "{} answers were not STORAGE_UNAVAILABLE/retryable, e.g. {:?}\nserver stderr:\n{}",
        tally.unexpected.len(),
        &tally.unexpected[..tally.unexpected.len().min(5)],
        server.stderr()
    );
}

/// A loopback listener that accepts connections and never answers; it
/// stops accepting when dropped.
struct BlackHole {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl BlackHole {
    async fn open() -> BlackHole {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        BlackHole { port, task }
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// A database that accepts connections and never answers left requests and
// /readyz waiting on it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_that_never_answers_gets_storage_unavailable_and_503() {
    let hole = BlackHole::open().await;
    let config = "storage:\n  timeout_ms: 1000\n  readiness_timeout_ms: 500\n";
    for scheme in ["postgres", "mysql"] {
        let server = serve(
            &format!("{scheme}://cellgate@127.0.0.1:{}/cells", hole.port),
            config,
        );
        let client = client();
        for n in 0..3 {
            match write_one(&client, &server.graphql(), n).await {
                Write::Unavailable => {}
                other => panic!("{scheme}: {other:?}"),
            }
        }
        let read = json!({ "query": format!(
            "{{ items {{ latestCell(rowKey: \"{}\", column: DATA) {{ refKey }} }} }}",
            uuid::Uuid::new_v4()
        )});
        let answer: Value = client
            .post(server.graphql())
            .json(&read)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let error = &answer["errors"][0]["extensions"];
        assert_eq!(error["code"], "STORAGE_UNAVAILABLE", "{scheme}: {answer}");
        assert_eq!(error["retryable"], true, "{scheme}: {answer}");
        let readyz = client.get(server.url("/readyz")).send().await.unwrap();
        assert_eq!(readyz.status(), StatusCode::SERVICE_UNAVAILABLE, "{scheme}");
    }
}

// A database that stops answering used to cost every request the whole
// statement timeout, as nothing remembered that it was failing: its circuit
// breaker opens, and /metrics shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_of_a_database_that_never_answers_opens_and_metrics_show_it() {
    let hole = BlackHole::open().await;
    let config = "storage:\n  timeout_ms: 500\n  readiness_timeout_ms: 500\n  breaker: { failures: 2, open_ms: 60000, max_open_ms: 60000 }\n";
    let server = serve(
        &format!("mysql://cellgate@127.0.0.1:{}/cells", hole.port),
        config,
    );
    let client = client();
    let mut metrics = String::new();
    for _ in 0..120 {
        metrics = client
            .get(server.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metrics.contains(r#"cellgate_node_breaker_state{cluster="main",node="master"} 2"#) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        metrics.contains(r#"cellgate_node_breaker_state{cluster="main",node="master"} 2"#),
        "the breaker opens after the start-up attempts to prepare the cluster: {metrics}"
    );
    assert!(
        metrics.contains(r#"cellgate_node_breaker_opened_total{cluster="main",node="master"} 1"#),
        "{metrics}"
    );
    let readyz = client.get(server.url("/readyz")).send().await.unwrap();
    assert_eq!(readyz.status(), StatusCode::SERVICE_UNAVAILABLE);
    // The admin field shows the same.
    let answer: Value = client
        .post(server.url("/graphql"))
        .json(&json!({"query": "{ items { storage { name ready breakers { node state opened } } } }"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["data"]["items"]["storage"],
        json!([{"name": "main", "ready": false, "breakers": [{"node": "master", "state": "open", "opened": "1"}]}]),
        "{answer}"
    );
}

// Once pooled connections were lent without a test round trip, every
// connection left idle from before a PostgreSQL restart failed the first
// request that took it: STORAGE_UNAVAILABLE after the database was back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn requests_after_a_postgres_restart_find_no_stale_connection() {
    let mut postgres = match Postgres::init() {
        Ok(postgres) => postgres,
        Err(why) => {
            servers::skip(
                "requests_after_a_postgres_restart_find_no_stale_connection",
                &why,
            );
            return;
        }
    };
    postgres.start().await;
    // Without index maintenance no background task touches the pool, so
    // the idle connections are still the old sessions when requests come.
    let server = serve(
        &postgres.url(),
        "storage:\n  timeout_ms: 2000\n  readiness_timeout_ms: 1000\nindexes:\n  maintain: false\n",
    );
    server
        .wait_ready(StatusCode::OK, Duration::from_secs(120))
        .await;
    let client = client();
    let graphql = server.url("/graphql");
    // Many requests at once leave the pool full of idle connections.
    let burst = |first: u64| {
        let (client, graphql) = (&client, &graphql);
        futures::future::join_all((first..first + 32).map(move |n| write_one(client, graphql, n)))
    };
    for write in burst(0).await {
        assert!(
            matches!(write, Write::Stored),
            "before the restart: {write:?}"
        );
    }
    let read = |row: uuid::Uuid| {
        let body = json!({
            "query": "query($row: UUID!) { items { latestCell(rowKey: $row, column: DATA) { refKey } } }",
            "variables": { "row": row },
        });
        let (client, graphql) = (&client, &graphql);
        async move {
            let answer: Value = client
                .post(graphql.as_str())
                .json(&body)
                .send()
                .await
                .expect("an answer")
                .json()
                .await
                .expect("JSON");
            answer
        }
    };
    for answer in futures::future::join_all((0..32).map(|_| read(uuid::Uuid::new_v4()))).await {
        assert!(
            answer.get("errors").is_none(),
            "before the restart: {answer}"
        );
    }

    // An immediate shutdown ends every session the pool holds. The requests
    // come as soon as the server accepts connections again (polling
    // `/readyz` would use up the stale connections first).
    postgres.stop("QUIT");
    postgres.start().await;

    for answer in futures::future::join_all((0..32).map(|_| read(uuid::Uuid::new_v4()))).await {
        assert!(
            answer.get("errors").is_none(),
            "a read after the restart: {answer}"
        );
    }
    for write in burst(100).await {
        assert!(
            matches!(write, Write::Stored),
            "a write after the restart: {write:?}"
        );
    }
}

/// One datastore with an index, for reads the gateway compiles.
fn write_indexed_definitions(dir: &Path) -> PathBuf {
    let datastores = dir.join("datastores");
    std::fs::create_dir_all(datastores.join("items/indexes")).unwrap();
    std::fs::write(datastores.join(ITEMS.0), ITEMS.1).unwrap();
    std::fs::write(
        datastores.join("items/indexes/by_owner.yaml"),
        "table: by_owner\ndatastore: items\ncolumn_defs:\n  - column_key: DATA\n    fields:\n      - { field: owner, type: UUID }\n      - { field: n, type: int }\n",
    )
    .unwrap();
    datastores
}

// Regressions: while the token store was down a valid token got 401 on
// `/metrics` instead of 503; and a compiled index read sent a store error
// on to the executor, which waited for the failing database again. A
// compiled write answers a failed call itself too: sent on, it would write
// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_database_is_storage_unavailable_on_plain_routes_and_compiled_answers() {
    let mut postgres = match Postgres::init() {
        Ok(postgres) => postgres,
        Err(why) => {
            servers::skip(
                "a_stopped_database_is_storage_unavailable_on_plain_routes_and_compiled_answers",
                &why,
            );
            return;
        }
    };
    postgres.start().await;
    let dir = tempfile::tempdir().unwrap();
    let datastores = write_indexed_definitions(dir.path());
    // A stored token, checked against the database, and a configured one,
    // which needs no database.
    let created = server::cellgate(dir.path())
        .args(["token", "create", "--scope", "*:read", "--name", "scraper"])
        .arg("--datastores")
        .arg(&datastores)
        .args(["--database", &postgres.url()])
        .output()
        .unwrap();
    assert!(
        created.status.success(),
        "{}",
        String::from_utf8_lossy(&created.stderr)
    );
    let stored = format!(
        "Bearer {}",
        String::from_utf8(created.stdout).unwrap().trim()
    );
    let configured = cellgate_graphql::auth::tokens::generate();
    let config_file = dir.path().join("cellgate.yaml");
    std::fs::write(
        &config_file,
        format!(
            "storage:\n  timeout_ms: 2000\n  readiness_timeout_ms: 1000\nauth:\n  enabled: true\n  tokens:\n    - {{ name: app, hash: \"{}\", scopes: [\"*:admin\"] }}\n",
            configured.hash
        ),
    )
    .unwrap();
    let configured = format!("Bearer {}", configured.token);
    let args: Vec<OsString> = vec![
        "--datastores".into(),
        datastores.into(),
        "--database".into(),
        postgres.url().into(),
        "--config".into(),
        config_file.into(),
    ];
    let server = Server::start_in(dir, args);
    server
        .wait_ready(StatusCode::OK, Duration::from_secs(120))
        .await;
    let client = client();
    let post = |body: Value| {
        let request = client
            .post(server.url("/graphql"))
            .header(reqwest::header::AUTHORIZATION, configured.clone())
            .json(&body);
        async move {
            let answer: Value = request
                .send()
                .await
                .expect("an answer")
                .json()
                .await
                .expect("JSON");
            answer
        }
    };
    let get = |path: &str, token: &str| {
        let request = client
            .get(server.url(path))
            .header(reqwest::header::AUTHORIZATION, token.to_string());
        async move {
            let response = request.send().await.expect("an answer");
            (response.status(), response.text().await.unwrap())
        }
    };
    let direct_answers = || async {
        let (_, text) = get("/metrics", &configured).await;
        text.lines()
            .find_map(|l| l.strip_prefix("cellgate_graphql_direct_requests_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or_else(|| panic!("no direct answer count in:\n{text}"))
    };
    let owner = "5f0c8a4e-6d1b-4c2e-9a57-3b8e1d2c4f60";
    let page = json!({ "query": format!(
        "{{ items {{ byOwner(owner: \"{owner}\", first: 5) {{ edges {{ node {{ rowKey n row {{ data {{ body }} }} }} }} }} }} }}"
    ) });
    // The same document with other text (trailing blanks keep every
    // location): answered by the executor.
    let page_again = json!({ "query": format!("{}   ", page["query"].as_str().unwrap()) });
    let written = post(json!({
        "query": "mutation($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { status } }",
        "variables": { "cells": [{ "rowKey": uuid::Uuid::new_v4(), "column": "DATA", "refKey": 1, "body": { "owner": owner, "n": 1 } }] },
    }))
    .await;
    assert_eq!(
        written["data"]["itemsPutCells"][0]["status"], "WRITTEN",
        "{written}"
    );
    // The executor answers a document first; once it answered without
    // errors, the compiled form answers it.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = post(page.clone()).await;
        assert!(answer.get("errors").is_none(), "{answer}");
        let found = answer["data"]["items"]["byOwner"]["edges"]
            .as_array()
            .is_some_and(|edges| edges.len() == 1);
        if found && direct_answers().await >= 1.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never answered directly: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let before = direct_answers().await;

    postgres.stop("KILL");
    // Past the token cache's second, the stored token cannot be checked:
    // 503, not 401.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for path in ["/metrics", "/api/snowflake/get/any"] {
        let (status, body) = get(path, &stored).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {body}");
        assert!(body.starts_with("STORAGE_UNAVAILABLE"), "{path}: {body}");
    }
    // The compiled read answers the outage itself, as the executor does.
    let direct = post(page.clone()).await;
    let executor = post(page_again).await;
    assert_eq!(
        direct["errors"][0]["extensions"]["code"], "STORAGE_UNAVAILABLE",
        "{direct}"
    );
    assert_eq!(
        direct["errors"][0]["extensions"]["retryable"], true,
        "{direct}"
    );
    assert_eq!(direct["data"], json!({ "items": null }), "{direct}");
    assert_eq!(direct, executor);
    // So does the compiled write: the same answer as the executor's for a
    // write of other keys, once the keys are swapped.
    let write = |query: &str, row_key: uuid::Uuid| {
        post(json!({
            "query": query,
            "variables": { "cells": [{ "rowKey": row_key, "column": "DATA", "refKey": 1, "body": { "owner": owner, "n": 2 } }] },
        }))
    };
    let put = "mutation($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { status } }";
    let (direct_key, executor_key) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
    let direct = write(put, direct_key).await;
    let executor = write(&format!("{put}   "), executor_key).await;
    assert!(direct.get("errors").is_some(), "{direct}");
    assert_eq!(
        direct.to_string().replace(&direct_key.to_string(), "KEY"),
        executor
            .to_string()
            .replace(&executor_key.to_string(), "KEY")
    );

    postgres.start().await;
    server
        .wait_ready(StatusCode::OK, Duration::from_secs(120))
        .await;
    assert_eq!(
        direct_answers().await,
        before + 2.0,
        "the outage answers came from the compiled forms"
    );
}
