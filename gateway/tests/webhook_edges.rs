//! Webhook triggers at their edges, through the real `cellgate serve` on
//! its SQLite default: a receiver slower than the trigger's lease, receivers
//! that redirect, and receivers served over TLS by a private certificate
//! authority.

#[path = "support/followers.rs"]
mod followers;
#[path = "support/server.rs"]
mod server;
#[path = "support/socket.rs"]
mod socket;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use followers::{CellKey, Receiver, Reply};
use reqwest::StatusCode;
use serde_json::{json, Value};
use server::{client, Server};
use uuid::Uuid;

const DATASTORE: (&str, &str) = (
    "items/datastore.yaml",
    "name: items\nshards: 64\ncolumns:\n  - name: DATA\n",
);

/// `cellgate.yaml` with a trigger lease of `lease_ms`.
fn config(lease_ms: u64) -> String {
    format!(
        "triggers:
  lease_time_ms: {lease_ms}
  sweep_interval_ms: 200
  min_backoff_ms: 20
  max_backoff_ms: 200
  quarantine_limit: 1000
limits:
  rate_limit_per_second: 0
"
    )
}

/// A trigger of every `DATA` cell posting to `url`, with more of its
/// definition in `extra`.
fn trigger(name: &str, url: &str, extra: &str) -> String {
    format!("name: {name}\ndatastore: items\ncolumns: [DATA]\nwebhook:\n  url: {url}\n  secret_env: TEST_HOOK_SECRET\n{extra}")
}

async fn start(files: &[(String, String)], config: &str, env: &[(&str, &str)]) -> Server {
    let mut all: Vec<(&str, &str)> = vec![DATASTORE];
    all.extend(files.iter().map(|(p, t)| (p.as_str(), t.as_str())));
    let mut env = env.to_vec();
    env.push(("TEST_HOOK_SECRET", "secret"));
    let server = Server::start_with_env(&all, config, &[], &env);
    server
        .wait_ready(StatusCode::OK, Duration::from_secs(60))
        .await;
    server
}

/// Writes `n` new rows' `DATA` cells in one request; their keys.
async fn write(server: &Server, n: usize) -> Vec<CellKey> {
    let keys: Vec<CellKey> = (0..n)
        .map(|_| (Uuid::new_v4(), "DATA".to_string(), 1))
        .collect();
    let cells: Vec<Value> = keys
        .iter()
        .map(|(row, column, ref_key)| json!({"rowKey": row, "column": column, "refKey": ref_key, "body": {"n": 1}}))
        .collect();
    let answer: Value = client()
        .post(server.graphql())
        .json(&json!({
            "query": "mutation($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { status } }",
            "variables": {"cells": cells},
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let statuses = answer["data"]["itemsPutCells"].as_array().cloned();
    assert!(
        statuses.is_some_and(|s| s.iter().all(|s| s["status"] == "WRITTEN")),
        "{answer}"
    );
    keys
}

/// A series of `/metrics` for `trigger`, 0 when absent.
async fn metric(server: &Server, name: &str, trigger: &str) -> f64 {
    let text = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let label = format!("trigger=\"{trigger}\"");
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(&label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Waits (at most two minutes) until `check` holds.
async fn until(what: &str, server: &Server, mut check: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !check().await {
        assert!(
            Instant::now() < deadline,
            "gave up waiting: {what}\nserver stderr:\n{}",
            server.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A receiver that takes 3 s to answer, behind a trigger whose lease is
/// 1 s: the worker keeps its lease while the POST is in flight, so every
/// cell arrives, and no batch is posted more than twice (it used to be
/// posted again and again, each time its lease ran out mid-POST).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_slower_than_the_lease_gets_each_batch_at_most_twice() {
    let receiver = Receiver::start(
        |_, _| Reply {
            delay: Duration::from_secs(3),
            ..Reply::default()
        },
        None,
    )
    .await;
    let hooks = trigger(
        "slow",
        &receiver.url("/hooks"),
        "  timeout_ms: 10000\nbatch_size: 25\nmax_attempts: 1\n",
    );
    let server = start(
        &[("items/triggers/slow.yaml".into(), hooks)],
        &config(1000),
        &[],
    )
    .await;
    let keys = write(&server, 60).await;
    until(
        "every cell reached the slow receiver",
        &server,
        async || receiver.got.missing(&keys).is_empty(),
    )
    .await;
    // Long enough for a batch whose lease ran out to be posted again.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut posted: BTreeMap<CellKey, usize> = BTreeMap::new();
    for request in receiver.requests() {
        for key in request.cells {
            *posted.entry(key).or_default() += 1;
        }
    }
    let most = posted.values().copied().max().unwrap_or(0);
    eprintln!(
        "{} POSTs for {} cells; a cell posted at most {most} times",
        receiver.requests().len(),
        keys.len()
    );
    assert!(
        most <= 2,
        "a cell was posted {most} times\nserver stderr:\n{}",
        server.stderr()
    );
}

/// 301, 302 and 303 answers are failed attempts (the cells are
/// quarantined, nothing is fetched with GET); a 307 to the same origin is
/// followed with the same body and signature; a 307 to another origin is
/// not followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_not_acknowledgements() {
    let elsewhere = Receiver::start(|_, _| Reply::default(), None).await;
    let away = elsewhere.url("/final");
    let receiver = Receiver::start(
        move |method, path| match (method, path) {
            ("POST", "/moved") => Reply {
                status: 301,
                location: Some("/page".into()),
                ..Reply::default()
            },
            ("POST", "/found") => Reply {
                status: 302,
                location: Some("/page".into()),
                ..Reply::default()
            },
            ("POST", "/see_other") => Reply {
                status: 303,
                location: Some("/page".into()),
                ..Reply::default()
            },
            ("POST", "/temporary") => Reply {
                status: 307,
                location: Some("/final".into()),
                ..Reply::default()
            },
            ("POST", "/elsewhere") => Reply {
                status: 308,
                location: Some(away.clone()),
                ..Reply::default()
            },
            _ => Reply::default(),
        },
        None,
    )
    .await;
    let names = ["moved", "found", "see_other", "temporary", "elsewhere"];
    let files: Vec<(String, String)> = names
        .iter()
        .map(|name| {
            (
                format!("items/triggers/{name}.yaml"),
                trigger(
                    name,
                    &receiver.url(&format!("/{name}")),
                    "max_attempts: 2\n",
                ),
            )
        })
        .collect();
    let server = start(&files, &config(2000), &[]).await;
    let keys = write(&server, 10).await;
    until(
        "the followed redirect delivered every cell",
        &server,
        async || receiver.got.missing(&keys).is_empty(),
    )
    .await;
    for name in ["moved", "found", "see_other", "elsewhere"] {
        until(
            &format!("the cells of `{name}` are quarantined"),
            &server,
            async || metric(&server, "cellgate_trigger_quarantined_cells", name).await >= 10.0,
        )
        .await;
    }
    let requests = receiver.requests();
    let gets = requests.iter().filter(|r| r.method != "POST").count();
    assert_eq!(gets, 0, "a redirect was fetched: {requests:#?}");
    let finals: Vec<_> = requests.iter().filter(|r| r.path == "/final").collect();
    assert!(!finals.is_empty());
    for request in &finals {
        assert_eq!(request.method, "POST");
        assert!(
            request
                .signature
                .as_deref()
                .is_some_and(|s| s.starts_with("sha256=")),
            "the followed POST lost its signature: {request:?}"
        );
    }
    assert!(
        elsewhere.requests().is_empty(),
        "a redirect to another origin was followed: {:?}",
        elsewhere.requests()
    );
    let stderr = server.stderr();
    assert!(
        stderr.contains("redirect"),
        "no word of the redirect in the log:\n{stderr}"
    );
}

/// An `https://` receiver whose certificate a private authority signed:
/// delivered to with the trigger's `ca_file`, or with the authority in
/// `SSL_CERT_FILE`; without either, the certificate is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_webhooks_deliver_with_the_authority_of_ca_file_or_ssl_cert_file() {
    let (ca, acceptor) = followers::private_tls();
    let receiver = Receiver::start(|_, _| Reply::default(), Some(acceptor)).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let ca_path = ca_file.to_str().unwrap().to_string();
    let files = vec![
        (
            "items/triggers/pinned.yaml".to_string(),
            trigger(
                "pinned",
                &receiver.url("/pinned"),
                &format!("  ca_file: {ca_path}\nmax_attempts: 2\n"),
            ),
        ),
        (
            "items/triggers/system.yaml".to_string(),
            trigger("system", &receiver.url("/system"), "max_attempts: 2\n"),
        ),
    ];
    // Without the authority among the system's roots, only the trigger
    // that names it delivers.
    let server = start(&files, &config(2000), &[]).await;
    let keys = write(&server, 5).await;
    until(
        "the pinned trigger delivered every cell",
        &server,
        async || receiver.got.missing(&keys).is_empty(),
    )
    .await;
    until(
        "the system trigger's cells are quarantined",
        &server,
        async || metric(&server, "cellgate_trigger_quarantined_cells", "system").await >= 5.0,
    )
    .await;
    let system: Vec<_> = receiver
        .requests()
        .into_iter()
        .filter(|r| r.path == "/system")
        .collect();
    assert!(system.is_empty(), "{system:?}");
    assert!(
        server.stderr().contains("certificate"),
        "the refusal does not name the certificate:\n{}",
        server.stderr()
    );
    drop(server);
    // With it in SSL_CERT_FILE, both deliver.
    let receiver_keys = write_and_wait_with_env(&files, &receiver, &ca_path).await;
    assert!(receiver_keys > 0);
}

/// Starts a gateway with `SSL_CERT_FILE` naming the authority, writes and
/// waits until the `system` trigger delivered; the cells it delivered.
async fn write_and_wait_with_env(
    files: &[(String, String)],
    receiver: &Receiver,
    ca_path: &str,
) -> usize {
    let server = start(files, &config(2000), &[("SSL_CERT_FILE", ca_path)]).await;
    let keys = write(&server, 5).await;
    until(
        "the system trigger delivered with SSL_CERT_FILE",
        &server,
        async || {
            let system: Vec<CellKey> = receiver
                .requests()
                .into_iter()
                .filter(|r| r.path == "/system" && r.status == 200)
                .flat_map(|r| r.cells)
                .collect();
            keys.iter().all(|k| system.contains(k))
        },
    )
    .await;
    keys.len()
}
