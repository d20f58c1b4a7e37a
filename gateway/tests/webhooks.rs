//! Webhook triggers end to end: a private MariaDB or PostgreSQL server (one
//! test each) holds the store,
//! two real `cellgate serve` processes (`a` and `b`) run the same trigger
//! definitions on it, and the test runs the receiving HTTP server, which
//! records every POST, checks its `X-Cellgate-Signature` and notes which
//! gateway sent it (a header whose value comes from an environment
//! variable of each process).
//!
//! 1. Writers put cells through `a`'s GraphQL API; at a random moment
//!    `b` is killed with SIGKILL. `a` must take `b`'s shards over within the
//!    lease time (printed), and once the writers stop every written cell of
//!    the followed column arrives at least once. Order: for each gateway
//!    and shard, the `addedId`s received, duplicates removed (a retry or a
//!    takeover delivers again from the stored offset, which at least once
//!    allows), are increasing; within each POST each shard's cells are in
//!    increasing order. Cells the trigger's filter rejects never arrive.
//! 2. The receiver answers 500 for 10 s while writers go on; afterwards
//!    every cell arrives.
//! 3. A second trigger's receiver answers 400 for one poison cell: it is
//!    quarantined (seen through `cellgate trigger quarantine`) and the
//!    later cells of its row, so of its shard, still arrive.
//!
//! Needs the database's programs; without them the test prints why it is
//! skipped, or fails with `CELLGATE_TEST_SERVERS=required`.

#[path = "support/mariadb.rs"]
mod mariadb;
#[path = "support/postgres.rs"]
mod postgres;
#[path = "support/server.rs"]
mod server;
#[path = "support/servers.rs"]
mod servers;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac as _};
use http_body_util::BodyExt as _;
use mariadb::Mariadb;
use postgres::Postgres;
use reqwest::StatusCode;
use serde_json::{json, Value};
use server::{client, Server};
use sha2::Sha256;
use uuid::Uuid;

const SECRET: &str = "test-webhook-secret";
/// Lease time of the trigger shards, from `cellgate.yaml`.
const LEASE: Duration = Duration::from_millis(2000);
const SHARDS: u32 = 64;

/// One cell as the receiver got it.
#[derive(Debug, Clone)]
struct Got {
    gateway: String,
    trigger: String,
    row: Uuid,
    column: String,
    ref_key: i64,
    shard: u32,
    added_id: i64,
    body: Value,
    at: Instant,
}

#[derive(Default)]
struct Receiver {
    /// POSTs in the order they were answered 2xx: each the cells it held.
    batches: Mutex<Vec<Vec<Got>>>,
    /// Answer 500 to `/hooks` while set.
    failing: AtomicBool,
    refused: Mutex<BTreeMap<u16, u64>>,
    bad_signatures: Mutex<Vec<String>>,
}

impl Receiver {
    fn cells(&self) -> Vec<Got> {
        self.batches
            .lock()
            .unwrap()
            .iter()
            .flatten()
            .cloned()
            .collect()
    }

    fn refuse(&self, status: u16) {
        *self.refused.lock().unwrap().entry(status).or_default() += 1;
    }

    /// Answers one POST.
    fn take(&self, path: &str, headers: &hyper::HeaderMap, body: &[u8]) -> u16 {
        let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
        mac.update(body);
        let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
        let signature = headers
            .get("x-cellgate-signature")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        if signature != expected || headers.get("x-team").is_none_or(|v| v != "dispatch") {
            self.bad_signatures
                .lock()
                .unwrap()
                .push(format!("{path}: {signature:?} {headers:?}"));
            self.refuse(401);
            return 401;
        }
        let gateway = headers
            .get("x-gateway")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
            .to_string();
        let doc: Value = serde_json::from_slice(body).expect("a JSON body");
        if path == "/hooks" && self.failing.load(Ordering::SeqCst) {
            self.refuse(500);
            return 500;
        }
        let cells: Vec<Got> = doc["cells"]
            .as_array()
            .expect("cells")
            .iter()
            .map(|c| Got {
                gateway: gateway.clone(),
                trigger: doc["trigger"].as_str().unwrap().to_string(),
                row: c["rowKey"].as_str().unwrap().parse().unwrap(),
                column: c["column"].as_str().unwrap().to_string(),
                ref_key: c["refKey"].as_str().unwrap().parse().unwrap(),
                shard: c["shard"].as_u64().unwrap() as u32,
                added_id: c["addedId"].as_str().unwrap().parse().unwrap(),
                body: c["body"].clone(),
                at: Instant::now(),
            })
            .collect();
        assert_eq!(doc["datastore"], "items");
        let times_ok = doc["cells"].as_array().unwrap().iter().all(|c| {
            c["createdAt"]
                .as_str()
                .is_some_and(|t| chrono::DateTime::parse_from_rfc3339(t).is_ok())
        });
        assert!(times_ok, "createdAt is not RFC 3339: {doc}");
        if cells.iter().any(|c| c.body["poison"] == true) {
            self.refuse(400);
            return 400;
        }
        self.batches.lock().unwrap().push(cells);
        200
    }
}

/// Serves `receiver` on a loopback port; returns the base URL.
async fn serve_receiver(receiver: Arc<Receiver>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let receiver = receiver.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let receiver = receiver.clone();
                        async move {
                            let path = request.uri().path().to_string();
                            let headers = request.headers().clone();
                            let body = request.into_body().collect().await?.to_bytes();
                            let status = receiver.take(&path, &headers, &body);
                            Ok::<_, hyper::Error>(
                                hyper::Response::builder()
                                    .status(status)
                                    .body(http_body_util::Full::new(bytes::Bytes::new()))
                                    .unwrap(),
                            )
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    format!("http://{address}")
}

fn definitions(receiver: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "items/datastore.yaml",
            format!("name: items\nshards: {SHARDS}\ncolumns:\n  - name: DATA\n  - name: OTHER\n"),
        ),
        (
            "items/triggers/hooks.yaml",
            format!(
                "name: hooks
datastore: items
columns: [DATA]
filter: skip != true
webhook:
  url: {receiver}/hooks
  headers: {{ X-Team: dispatch, X-Gateway: \"${{TEST_GATEWAY}}\" }}
  secret_env: TEST_HOOK_SECRET
  timeout_ms: 2000
batch_size: 25
max_attempts: 50
"
            ),
        ),
        (
            "items/triggers/poison.yaml",
            format!(
                "name: poison
datastore: items
columns: [OTHER]
webhook:
  url: {receiver}/poison
  headers: {{ X-Team: dispatch, X-Gateway: \"${{TEST_GATEWAY}}\" }}
  secret_env: TEST_HOOK_SECRET
batch_size: 10
max_attempts: 2
"
            ),
        ),
    ]
}

fn config(database: &str) -> String {
    format!(
        "storage:
  clusters:
    - name: main
      master: {database}
limits:
  rate_limit_per_second: 0
  max_concurrent_requests: 0
  max_connections_per_client: 0
triggers:
  lease_time_ms: {}
  sweep_interval_ms: 200
  min_backoff_ms: 50
  max_backoff_ms: 1000
",
        LEASE.as_millis()
    )
}

fn start(files: &[(&'static str, String)], config: &str, name: &str) -> Server {
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    Server::start_with_env(
        &files,
        config,
        &[],
        &[("TEST_GATEWAY", name), ("TEST_HOOK_SECRET", SECRET)],
    )
}

const PUT: &str = "mutation($cells: [ItemsCellInput!]!) {
  itemsPutCells(cells: $cells) { rowKey refKey status error { code message } }
}";

type Key = (Uuid, String, i64);

/// Puts `cells` through `url`; the keys stored (`WRITTEN` or `DUPLICATE`).
async fn put(client: &reqwest::Client, url: &str, cells: &[(Key, Value)]) -> Vec<Key> {
    let input: Vec<Value> = cells
        .iter()
        .map(|((row, column, ref_key), body)| {
            json!({ "rowKey": row, "column": column, "refKey": ref_key, "body": body })
        })
        .collect();
    let Ok(response) = client
        .post(url)
        .json(&json!({ "query": PUT, "variables": { "cells": input } }))
        .send()
        .await
    else {
        return Vec::new();
    };
    let answer: Value = response.json().await.unwrap_or_default();
    let Some(results) = answer["data"]["itemsPutCells"].as_array() else {
        panic!("unexpected answer: {answer}");
    };
    cells
        .iter()
        .zip(results)
        .filter(|(_, r)| r["status"] == "WRITTEN" || r["status"] == "DUPLICATE")
        .map(|(c, _)| c.0.clone())
        .collect()
}

/// Writers putting new `DATA` rows through `url` until stopped; every
/// seventh cell has `skip: true`, which the trigger's filter drops.
struct Load {
    stop: Arc<AtomicBool>,
    written: Arc<Mutex<Vec<(Key, bool)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(url: &str, writers: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..writers)
            .map(|w| {
                let (stop, written, url) = (stop.clone(), written.clone(), url.to_string());
                tokio::spawn(async move {
                    let client = client();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let cells: Vec<(Key, Value)> = (0..3)
                            .map(|_| {
                                n += 1;
                                let key = (Uuid::new_v4(), "DATA".to_string(), 1);
                                (
                                    key,
                                    json!({ "writer": w, "n": n, "skip": n.is_multiple_of(7) }),
                                )
                            })
                            .collect();
                        let stored = put(&client, &url, &cells).await;
                        {
                            let mut written = written.lock().unwrap();
                            for (key, body) in &cells {
                                if stored.contains(key) {
                                    written.push((key.clone(), body["skip"] == true));
                                }
                            }
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            })
            .collect();
        Load {
            stop,
            written,
            tasks,
        }
    }

    async fn finish(self) -> Vec<(Key, bool)> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await.unwrap();
        }
        Arc::try_unwrap(self.written).unwrap().into_inner().unwrap()
    }
}

/// Waits until every key of `written` not skipped has been received by
/// `trigger`; panics after `within` with what is missing.
async fn wait_received(
    receiver: &Receiver,
    trigger: &str,
    written: &[(Key, bool)],
    within: Duration,
) -> Duration {
    let started = Instant::now();
    loop {
        let got: BTreeSet<Key> = receiver
            .cells()
            .into_iter()
            .filter(|c| c.trigger == trigger)
            .map(|c| (c.row, c.column, c.ref_key))
            .collect();
        let missing: Vec<&Key> = written
            .iter()
            .filter(|(k, skip)| !skip && !got.contains(k))
            .map(|(k, _)| k)
            .collect();
        if missing.is_empty() {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{} of {} written cells not received by `{trigger}` within {within:?}, e.g. {:?}",
            missing.len(),
            written.len(),
            &missing[..missing.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The order checks of the module doc; returns the cells received more
/// than once.
fn check_order(receiver: &Receiver) -> usize {
    let batches = receiver.batches.lock().unwrap().clone();
    for batch in &batches {
        let mut last: HashMap<u32, i64> = HashMap::new();
        for cell in batch {
            if let Some(previous) = last.insert(cell.shard, cell.added_id) {
                assert!(
                    previous < cell.added_id,
                    "a POST holds shard {} out of order: {previous} then {}",
                    cell.shard,
                    cell.added_id
                );
            }
        }
    }
    let mut seen: HashMap<(String, String, u32), (BTreeSet<i64>, i64)> = HashMap::new();
    let mut duplicates = 0;
    for cell in batches.iter().flatten() {
        let entry = seen
            .entry((cell.gateway.clone(), cell.trigger.clone(), cell.shard))
            .or_default();
        if !entry.0.insert(cell.added_id) {
            duplicates += 1;
            continue;
        }
        assert!(
            entry.1 < cell.added_id,
            "gateway {} delivered shard {} of `{}` out of order: added_id {} after {}",
            cell.gateway,
            cell.shard,
            cell.trigger,
            cell.added_id,
            entry.1
        );
        entry.1 = cell.added_id;
    }
    duplicates
}

/// The database server holding the store.
trait Database: Sized {
    const KIND: &'static str;
    fn init() -> Result<Self, String>;
    async fn start(&mut self);
    fn url(&self) -> String;
}

impl Database for Mariadb {
    const KIND: &'static str = "MariaDB";
    fn init() -> Result<Self, String> {
        Mariadb::init()
    }
    async fn start(&mut self) {
        Mariadb::start(self).await
    }
    fn url(&self) -> String {
        Mariadb::url(self)
    }
}

impl Database for Postgres {
    const KIND: &'static str = "PostgreSQL";
    fn init() -> Result<Self, String> {
        Postgres::init()
    }
    async fn start(&mut self) {
        Postgres::start(self).await
    }
    fn url(&self) -> String {
        Postgres::url(self)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_mariadb_webhooks_survive_a_killed_gateway_a_failing_receiver_and_a_poison_cell() {
    scenario::<Mariadb>(
        "on_mariadb_webhooks_survive_a_killed_gateway_a_failing_receiver_and_a_poison_cell",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn on_postgres_webhooks_survive_a_killed_gateway_a_failing_receiver_and_a_poison_cell() {
    scenario::<Postgres>(
        "on_postgres_webhooks_survive_a_killed_gateway_a_failing_receiver_and_a_poison_cell",
    )
    .await
}

async fn scenario<D: Database>(test: &str) {
    let mut database = match D::init() {
        Ok(database) => database,
        Err(why) => return servers::skip(test, &why),
    };
    database.start().await;
    let kind = D::KIND;
    let receiver = Arc::new(Receiver::default());
    let base = serve_receiver(receiver.clone()).await;
    let files = definitions(&base);
    let config = config(&database.url());
    let a = start(&files, &config, "a");
    let mut b = start(&files, &config, "b");
    a.wait_ready(StatusCode::OK, Duration::from_secs(60)).await;
    b.wait_ready(StatusCode::OK, Duration::from_secs(60)).await;

    // 1. A steady load, and `b` killed at a random moment.
    let load = Load::start(&a.graphql(), 4);
    let before_kill = Duration::from_millis(3000 + rand::random::<u64>() % 3000);
    tokio::time::sleep(before_kill).await;
    b.child.kill().expect("SIGKILL b");
    b.child.wait().unwrap();
    let killed = Instant::now();
    let b_shards: BTreeSet<u32> = receiver
        .cells()
        .iter()
        .filter(|c| c.gateway == "b" && c.trigger == "hooks")
        .map(|c| c.shard)
        .collect();
    assert!(
        !b_shards.is_empty(),
        "b delivered nothing before it was killed"
    );
    tokio::time::sleep(LEASE + Duration::from_secs(3)).await;
    let written = load.finish().await;
    let caught_up = wait_received(&receiver, "hooks", &written, Duration::from_secs(30)).await;
    let cells = receiver.cells();
    let takeover = cells
        .iter()
        .filter(|c| c.gateway == "a" && c.at > killed && b_shards.contains(&c.shard))
        .map(|c| c.at - killed)
        .min()
        .expect("a delivered cells of b's shards after the kill");
    let skipped: BTreeSet<Key> = written
        .iter()
        .filter(|(_, skip)| *skip)
        .map(|(k, _)| k.clone())
        .collect();
    assert!(
        cells
            .iter()
            .all(|c| !skipped.contains(&(c.row, c.column.clone(), c.ref_key))),
        "a cell the filter rejects was posted"
    );
    let by_gateway = |g: &str| cells.iter().filter(|c| c.gateway == g).count();
    println!(
        "{kind} takeover: {} cells written ({} filtered out), b killed after {before_kill:?} having \
         delivered {} cells of {} shards; a delivered b's shards {takeover:?} after the kill \
         (lease {LEASE:?}); a delivered {} cells; all received {caught_up:?} after the load stopped",
        written.len(),
        skipped.len(),
        by_gateway("b"),
        b_shards.len(),
        by_gateway("a"),
    );
    assert!(
        takeover < LEASE + Duration::from_secs(2),
        "takeover took {takeover:?}, lease time {LEASE:?}"
    );

    // 2. The receiver answers 500 for 10 s.
    receiver.failing.store(true, Ordering::SeqCst);
    let failing_since = Instant::now();
    let load = Load::start(&a.graphql(), 2);
    tokio::time::sleep(Duration::from_secs(10)).await;
    receiver.failing.store(false, Ordering::SeqCst);
    let outage = failing_since.elapsed();
    let during = load.finish().await;
    let after = wait_received(&receiver, "hooks", &during, Duration::from_secs(20)).await;
    let refused_500 = receiver
        .refused
        .lock()
        .unwrap()
        .get(&500)
        .copied()
        .unwrap_or(0);
    println!(
        "{kind} failing receiver: {} cells written while it answered 500 for {outage:?} ({refused_500} \
         POSTs refused); all received {after:?} after it recovered",
        during.len()
    );
    assert!(refused_500 > 0, "no POST was refused during the outage");

    // 3. A poison cell, then more cells of its row (its shard).
    let client = client();
    let row = Uuid::new_v4();
    let mut keys = Vec::new();
    for ref_key in 1..=5i64 {
        let body = json!({ "poison": ref_key == 2, "n": ref_key });
        let key = (row, "OTHER".to_string(), ref_key);
        let stored = put(&client, &a.graphql(), &[(key.clone(), body)]).await;
        assert_eq!(stored, vec![key.clone()]);
        keys.push((key, ref_key == 2));
    }
    let poison_took = wait_received(&receiver, "poison", &keys, Duration::from_secs(30)).await;
    let shard = receiver
        .cells()
        .iter()
        .find(|c| c.trigger == "poison")
        .map(|c| c.shard)
        .unwrap();
    let output = server::cellgate(a.dir.path())
        .args(["trigger", "quarantine", "items/poison", "--database"])
        .arg(database.url())
        .arg("--datastores")
        .arg(a.dir.path().join("datastores"))
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&output.stdout).to_string();
    println!(
        "{kind} poison: the 4 good cells of shard {shard} received {poison_took:?} after the writes; \
         `cellgate trigger quarantine` says:\n{listed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success());
    assert!(
        listed.contains(&format!("shard {shard} ")) && listed.contains(&format!("{row} OTHER 2 ")),
        "the poison cell is not listed as quarantined"
    );
    assert!(listed.contains("1 cell quarantined"), "{listed}");

    let duplicates = check_order(&receiver);
    let bad = receiver.bad_signatures.lock().unwrap().clone();
    assert!(bad.is_empty(), "POSTs with a bad signature: {bad:?}");
    println!(
        "{kind} order: per gateway and shard increasing; {duplicates} cells delivered again; answers \
         refused by status: {:?}",
        receiver.refused.lock().unwrap()
    );
    drop(b);
    drop(a);
}

#[test]
fn a_missing_environment_variable_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let datastores = dir.path().join("datastores");
    std::fs::create_dir_all(datastores.join("t/triggers")).unwrap();
    std::fs::write(
        datastores.join("t/datastore.yaml"),
        "name: t\ncolumns:\n  - name: A\n",
    )
    .unwrap();
    std::fs::write(
        datastores.join("t/triggers/h.yaml"),
        "name: h\ndatastore: t\ncolumns: [A]\nwebhook:\n  url: http://127.0.0.1:9/x\n  headers: { X-Token: \"${CELLGATE_TEST_UNSET_TOKEN}\" }\n",
    )
    .unwrap();
    let output = server::cellgate(dir.path())
        .args(["serve", "--listen", "127.0.0.1:0", "--datastores"])
        .arg(&datastores)
        .arg("--data")
        .arg(dir.path().join("data"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "error: trigger `h` of datastore `t`: header `X-Token` names environment variable `CELLGATE_TEST_UNSET_TOKEN`, which is not set"
        ),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&output.stdout).contains("listening"));
}

#[tokio::test]
async fn an_unreachable_webhook_does_not_stop_the_start() {
    let files = [
        ("t/datastore.yaml", "name: t\ncolumns:\n  - name: A\n"),
        (
            "t/triggers/h.yaml",
            "name: h\ndatastore: t\ncolumns: [A]\nwebhook:\n  url: http://127.0.0.1:9/nobody\n",
        ),
    ];
    let server = Server::start_with(&files, "", &[]);
    server
        .wait_ready(StatusCode::OK, Duration::from_secs(60))
        .await;
    assert!(
        server
            .preamble
            .iter()
            .any(|l| l == "delivering 1 webhook trigger"),
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
        metrics.contains("cellgate_trigger_stopped{datastore=\"t\",trigger=\"h\"} 0"),
        "{metrics}"
    );
}

/// Posts `query` with `variables` as the bearer of `token`.
async fn post_as(server: &Server, token: &str, query: &str, variables: Value) -> Value {
    client()
        .post(server.graphql())
        .bearer_auth(token)
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

const TRIGGERS: &str = "query($name: String) { items { triggers(name: $name) {
  name datastore kind columns state stoppedReason quarantineLimit
  lag { pendingCells laggingShards shards(first: 4096) { shard cluster pendingCells }
        clusters { cluster pendingCells laggingShards } }
  quarantine { shard addedId rowKey column refKey attempts error retry quarantinedAt }
} } }";

/// The admin trigger fields on SQLite: a trigger whose receiver answers
/// 500 lags by exactly the cells of its shards (measured per shard and per
/// cluster), a trigger whose receiver refuses every cell with 400
/// quarantines them and stops past its quarantine limit, the retry mutation
/// marks its quarantine, and a token without `admin` is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_trigger_fields_report_lag_quarantine_and_retry() {
    let receiver = Arc::new(Receiver::default());
    receiver.failing.store(true, Ordering::SeqCst);
    let base = serve_receiver(receiver.clone()).await;
    let mut files = definitions(&base);
    for (path, text) in &mut files {
        if path.ends_with("hooks.yaml") {
            // Not quarantined while the receiver fails (1000 attempts, a second
            // apart at most, take a quarter of an hour): the lag stays put.
            *text = text.replace("max_attempts: 50", "max_attempts: 1000");
        }
        if path.ends_with("poison.yaml") {
            *text = text.replace("max_attempts: 2", "max_attempts: 1");
        }
    }
    let admin = cellgate_graphql::auth::tokens::generate();
    let writer = cellgate_graphql::auth::tokens::generate();
    let config = format!(
        "auth:
  enabled: true
  tokens:
    - {{ name: admin, hash: \"{}\", scopes: [\"items:admin\"] }}
    - {{ name: writer, hash: \"{}\", scopes: [\"items:write\"] }}
triggers:
  sweep_interval_ms: 200
  min_backoff_ms: 20
  max_backoff_ms: 1000
  quarantine_limit: 2
",
        admin.hash, writer.hash
    );
    let server = start(&files, &config, "a");
    server
        .wait_ready(StatusCode::OK, Duration::from_secs(60))
        .await;
    let admin = admin.token.as_str();
    let writer = writer.token.as_str();

    // Six rows with a DATA cell, three of them then with a poison OTHER
    // cell: `hooks` stays before the DATA cell of each shard it lags on.
    let rows: Vec<Uuid> = (0..6).map(|_| Uuid::new_v4()).collect();
    let mut cells = Vec::new();
    for (n, row) in rows.iter().enumerate() {
        cells.push(json!({ "rowKey": row, "column": "DATA", "refKey": "1", "body": { "n": n } }));
    }
    let put = "mutation($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { status } }";
    let answer = post_as(&server, admin, put, json!({ "cells": cells })).await;
    assert!(answer["errors"].is_null(), "{answer}");
    let poison: Vec<Value> = rows[..3]
        .iter()
        .map(|row| json!({ "rowKey": row, "column": "OTHER", "refKey": "7", "body": { "poison": true } }))
        .collect();
    let answer = post_as(&server, admin, put, json!({ "cells": poison })).await;
    assert!(answer["errors"].is_null(), "{answer}");

    // Where each cell went, from the cells themselves.
    let mut per_shard: BTreeMap<u64, i64> = BTreeMap::new();
    let mut poisoned: BTreeMap<String, (u64, String)> = BTreeMap::new();
    for (row, column, ref_key) in rows
        .iter()
        .map(|r| (r, "DATA", "1"))
        .chain(rows[..3].iter().map(|r| (r, "OTHER", "7")))
    {
        let answer = post_as(
            &server,
            admin,
            &format!("query($row: UUID!) {{ items {{ cell(rowKey: $row, column: {column}, refKey: \"{ref_key}\") {{ shard addedId }} }} }}"),
            json!({ "row": row }),
        )
        .await;
        let cell = &answer["data"]["items"]["cell"];
        let shard = cell["shard"].as_u64().expect("a shard");
        *per_shard.entry(shard).or_default() += 1;
        if column == "OTHER" {
            poisoned.insert(
                row.to_string(),
                (shard, cell["addedId"].as_str().unwrap().to_string()),
            );
        }
    }

    // `poison` quarantines its three cells and stops past its limit of 2.
    let deadline = Instant::now() + Duration::from_secs(60);
    let poison = loop {
        let answer = post_as(&server, admin, TRIGGERS, json!({ "name": "poison" })).await;
        let consumer = answer["data"]["items"]["triggers"][0].clone();
        if consumer["state"] == "STOPPED" {
            break consumer;
        }
        assert!(Instant::now() < deadline, "poison did not stop: {answer}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(poison["name"], "poison");
    assert_eq!(poison["datastore"], "items");
    assert_eq!(poison["kind"], "WEBHOOK");
    assert_eq!(poison["columns"], json!(["OTHER"]));
    assert_eq!(poison["quarantineLimit"], "2");
    assert!(
        poison["stoppedReason"]
            .as_str()
            .unwrap()
            .contains("more than the limit of 2"),
        "{poison}"
    );
    let quarantine = poison["quarantine"].as_array().unwrap();
    assert_eq!(quarantine.len(), 3, "{poison}");
    for q in quarantine {
        let (shard, added_id) = &poisoned[q["rowKey"].as_str().unwrap()];
        assert_eq!(q["shard"].as_u64(), Some(*shard), "{q}");
        assert_eq!(q["addedId"].as_str(), Some(added_id.as_str()), "{q}");
        assert_eq!(q["column"], "OTHER");
        assert_eq!(q["refKey"], "7");
        assert_eq!(q["attempts"], "1");
        assert!(q["error"].as_str().unwrap().contains("400"), "{q}");
        assert_eq!(q["retry"], false);
        assert!(q["quarantinedAt"].as_str().is_some());
    }

    // `hooks` lags by every cell of the shards it has cells on.
    let answer = post_as(&server, admin, TRIGGERS, json!({ "name": "hooks" })).await;
    let hooks = &answer["data"]["items"]["triggers"][0];
    assert_eq!(hooks["kind"], "WEBHOOK", "{answer}");
    assert_eq!(hooks["state"], "RUNNING");
    assert_eq!(hooks["columns"], json!(["DATA"]));
    assert!(hooks["stoppedReason"].is_null());
    let lag = &hooks["lag"];
    assert_eq!(lag["pendingCells"], "9", "{lag}");
    assert_eq!(lag["laggingShards"].as_u64(), Some(per_shard.len() as u64));
    let shards: BTreeMap<u64, i64> = lag["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["shard"].as_u64().unwrap(),
                s["pendingCells"].as_str().unwrap().parse().unwrap(),
            )
        })
        .collect();
    assert_eq!(shards, per_shard, "{lag}");
    let pending: Vec<i64> = lag["shards"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["pendingCells"].as_str().unwrap().parse().unwrap())
        .collect();
    assert!(
        pending.windows(2).all(|w| w[0] >= w[1]),
        "most behind first: {lag}"
    );
    let clusters = lag["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 1, "{lag}");
    assert_eq!(clusters[0]["pendingCells"], "9");
    assert_eq!(
        clusters[0]["laggingShards"].as_u64(),
        Some(per_shard.len() as u64)
    );
    assert_eq!(clusters[0]["cluster"], lag["shards"][0]["cluster"]);
    let both = post_as(&server, admin, TRIGGERS, json!({})).await;
    let names: Vec<&str> = both["data"]["items"]["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["hooks", "poison"]);

    // Retrying the quarantine marks its cells (the stopped consumer leaves
    // them there); an unknown trigger is bad input.
    let retry = "mutation($t: String!) { itemsRetryTriggerQuarantine(trigger: $t) { asked } }";
    let answer = post_as(&server, admin, retry, json!({ "t": "poison" })).await;
    assert_eq!(
        answer["data"]["itemsRetryTriggerQuarantine"]["asked"], 3,
        "{answer}"
    );
    let answer = post_as(&server, admin, TRIGGERS, json!({ "name": "poison" })).await;
    let quarantine = answer["data"]["items"]["triggers"][0]["quarantine"]
        .as_array()
        .unwrap()
        .clone();
    assert!(quarantine.iter().all(|q| q["retry"] == true), "{answer}");
    let answer = post_as(&server, admin, retry, json!({ "t": "nosuch" })).await;
    assert_eq!(
        answer["errors"][0]["extensions"]["code"], "BAD_USER_INPUT",
        "{answer}"
    );

    // Without `admin`: refused, whether the trigger exists or not.
    for (query, variables) in [
        (TRIGGERS, json!({})),
        (retry, json!({ "t": "poison" })),
        (retry, json!({ "t": "nosuch" })),
    ] {
        let answer = post_as(&server, writer, query, variables).await;
        assert_eq!(
            answer["errors"][0]["extensions"]["code"], "FORBIDDEN",
            "{answer}"
        );
        assert!(answer["data"].is_null(), "{answer}");
    }

    // Once the receiver answers, `hooks` catches up and lags nowhere.
    receiver.failing.store(false, Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = post_as(&server, admin, TRIGGERS, json!({ "name": "hooks" })).await;
        let lag = &answer["data"]["items"]["triggers"][0]["lag"];
        if lag["pendingCells"] == "0" {
            assert_eq!(lag["laggingShards"], 0, "{lag}");
            assert_eq!(lag["shards"], json!([]), "{lag}");
            assert_eq!(lag["clusters"][0]["pendingCells"], "0", "{lag}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "hooks did not catch up: {answer}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
