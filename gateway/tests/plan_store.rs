//! `cellgate plan` against a running store of 100,000 cells (the embedded
//! SQLite default), through the binaries: the catalog records the
//! definitions a gateway deployed, a plan against them estimates each index
//! build from the log heads (and, once the store has recorded a build, its
//! time), and `cellgate reload --plan` applies exactly what was planned and
//! refuses a plan made from or for other definitions.

#[path = "support/server.rs"]
mod server;

use std::ffi::OsString;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};
use server::{cellgate, client, copy_dir, root, Server};
use uuid::Uuid;

const CELLS: i64 = 100_000;

const FARE_STATUS_INDEX: &str = "\
table: fare_status_index
datastore: trips
shard_field: status
column_defs:
  - column_key: BASE
    fields:
      - { field: status, type: string }
      - { field: fare.total, name: fare_total, type: float }
";

async fn graphql(server: &Server, query: &str, variables: Value) -> Value {
    client()
        .post(server.graphql())
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json")
}

/// Writes `CELLS` trips, 1,000 a request.
async fn write_trips(server: &Server) {
    for chunk in 0..CELLS / 1000 {
        let cells: Vec<Value> = (0..1000)
            .map(|i| {
                let n = chunk * 1000 + i;
                json!({
                    "rowKey": Uuid::new_v4().to_string(),
                    "column": "BASE",
                    "refKey": "1",
                    "body": {
                        "driver_partner_uuid": Uuid::new_v4().to_string(),
                        "city_uuid": Uuid::new_v4().to_string(),
                        "trip_created_at": "2024-05-01T10:00:00Z",
                        "fare": {"total": n as f64, "currency": "EUR"},
                        "status": format!("s{}", n % 400),
                    },
                })
            })
            .collect();
        let answer = graphql(
            server,
            "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }",
            json!({ "cells": cells }),
        )
        .await;
        assert!(answer.get("errors").is_none(), "{answer}");
    }
}

fn run(dir: &Path, args: &[&str]) -> Output {
    cellgate(dir).args(args).output().expect("run cellgate")
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `cellgate plan datastores --base-deployed --data data [extra…]`.
fn plan(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec!["plan", "datastores", "--base-deployed", "--data", "data"];
    args.extend_from_slice(extra);
    run(dir, &args)
}

fn json_plan(dir: &Path) -> (Output, Value) {
    let output = plan(dir, &["--format", "json"]);
    let value =
        serde_json::from_slice(&output.stdout).unwrap_or_else(|_| panic!("{}", text(&output)));
    (output, value)
}

/// The change of `kind` in a JSON plan.
fn change<'a>(plan: &'a Value, kind: &str) -> &'a Value {
    plan["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in {plan:#}"))
}

fn reload(dir: &Path, server: &Server, plan_file: &str) -> Output {
    run(
        dir,
        &["reload", "--url", &server.url(""), "--plan", plan_file],
    )
}

async fn wait_built(server: &Server, index: &str) {
    for _ in 0..6000 {
        let answer = graphql(
            server,
            "{ trips { indexStatus { name ready } } }",
            json!({}),
        )
        .await;
        let ready = answer["data"]["trips"]["indexStatus"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .any(|i| i["name"] == index && i["ready"] == true);
        if ready {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("index {index} was not built");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_estimates_builds_from_the_store_and_a_reload_applies_exactly_it() {
    let temp = tempfile::tempdir().expect("temp dir");
    let dir = temp.path().to_path_buf();
    copy_dir(&root().join("datastores"), &dir.join("datastores"));
    let args: Vec<OsString> = vec![
        "--data".into(),
        dir.join("data").into(),
        "--datastores".into(),
        dir.join("datastores").into(),
    ];
    let server = Server::start_in(temp, args);
    write_trips(&server).await;

    // What the gateway deployed is what the directory holds.
    let output = plan(&dir, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("no changes"),
        "{}",
        text(&output)
    );

    // A new index reads the whole log of trips; no build is recorded yet,
    // so there is no time to give.
    std::fs::write(
        dir.join("datastores/trips/indexes/fare_status_index.yaml"),
        FARE_STATUS_INDEX,
    )
    .unwrap();
    let (output, first) = json_plan(&dir);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    let estimate = &change(&first, "INDEX_ADDED")["estimate"];
    assert_eq!(estimate["cells"], CELLS, "{first:#}");
    assert_eq!(estimate["clusters"]["main"], CELLS, "{first:#}");
    assert_eq!(estimate["rate"], Value::Null, "{first:#}");
    let shown = plan(&dir, &[]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains(
            "reads 100,000 log cells; no build recorded on this store yet, so no time estimate"
        ),
        "{}",
        text(&shown)
    );
    std::fs::write(dir.join("first.json"), &output.stdout).unwrap();

    // The plan, applied: the gateway serves what it was made from, the
    // directory holds what it was made for.
    let output = reload(&dir, &server, "first.json");
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("fare_status_index"),
        "{}",
        text(&output)
    );
    wait_built(&server, "fare_status_index").await;

    // Deployed now; the build of 100,000 cells gave the store a rate.
    let output = plan(&dir, &[]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    std::fs::write(
        dir.join("datastores/trips/indexes/fare_status_index.yaml"),
        format!("{FARE_STATUS_INDEX}      - {{ field: city_uuid, type: UUID }}\n"),
    )
    .unwrap();
    let (output, second) = json_plan(&dir);
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    let estimate = &change(&second, "INDEX_REBUILT")["estimate"];
    assert_eq!(estimate["cells"], CELLS, "{second:#}");
    let rate = estimate["rate"]
        .as_f64()
        .unwrap_or_else(|| panic!("{second:#}"));
    let seconds = estimate["seconds"].as_f64().unwrap();
    assert!(rate > 0.0, "{second:#}");
    assert!(
        (seconds - CELLS as f64 / rate).abs() < 1e-6 * seconds,
        "{second:#}"
    );
    let shown = plan(&dir, &[]);
    assert!(
        String::from_utf8_lossy(&shown.stdout).contains("reads 100,000 log cells; about "),
        "{}",
        text(&shown)
    );
    assert_eq!(second["base_digest"], first["head_digest"], "{second:#}");

    // The first plan again: the gateway no longer serves what it was made
    // from. Refused, and nothing changes.
    let output = reload(&dir, &server, "first.json");
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let said = String::from_utf8_lossy(&output.stderr);
    assert!(
        said.contains(first["base_digest"].as_str().unwrap())
            && said.contains(first["head_digest"].as_str().unwrap()),
        "{}",
        text(&output)
    );

    // A plan whose directory changed after it was made.
    std::fs::write(dir.join("second.json"), output_of(&dir)).unwrap();
    std::fs::write(
        dir.join("datastores/trips/indexes/fare_status_index.yaml"),
        format!("{FARE_STATUS_INDEX}      - {{ field: driver_partner_uuid, type: UUID }}\n"),
    )
    .unwrap();
    let output = reload(&dir, &server, "second.json");
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("but the directory holds"),
        "{}",
        text(&output)
    );
    let deployed = plan(&dir, &["--format", "json"]);
    let deployed: Value = serde_json::from_slice(&deployed.stdout).unwrap();
    assert_eq!(
        deployed["base_digest"], first["head_digest"],
        "nothing was reloaded"
    );

    // Without the plan file's digests, or with a store that is not there.
    std::fs::write(dir.join("bad.json"), "{\"version\": 1}").unwrap();
    let output = reload(&dir, &server, "bad.json");
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("base_digest"),
        "{}",
        text(&output)
    );
    let output = run(
        &dir,
        &["plan", "datastores", "--base-deployed", "--data", "nowhere"],
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("does not exist"),
        "{}",
        text(&output)
    );
    assert!(!dir.join("nowhere").exists(), "reading a store created it");
    let output = run(&dir, &["plan", "datastores", "--base-deployed"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    drop(server);
}

/// The JSON plan of the directory against what is deployed, now.
fn output_of(dir: &Path) -> Vec<u8> {
    plan(dir, &["--format", "json"]).stdout
}

/// Two clusters: the deployed files are read from the first, the log heads
/// from each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_reads_the_log_heads_of_every_cluster() {
    let temp = tempfile::tempdir().expect("temp dir");
    let dir = temp.path().to_path_buf();
    copy_dir(&root().join("datastores"), &dir.join("datastores"));
    let config = dir.join("cellgate.yaml");
    std::fs::write(
        &config,
        format!(
            "storage:\n  clusters:\n    - name: a\n      master: sqlite://{0}/a.db\n    - name: b\n      master: sqlite://{0}/b.db\n",
            dir.display()
        ),
    )
    .unwrap();
    let args: Vec<OsString> = vec![
        "--datastores".into(),
        dir.join("datastores").into(),
        "--config".into(),
        config.clone().into(),
        "--demo".into(),
    ];
    let server = Server::start_in(temp, args);
    let flags = ["--base-deployed", "--config", "cellgate.yaml"];
    let output = run(&dir, &[&["plan", "datastores"][..], &flags].concat());
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));

    std::fs::write(
        dir.join("datastores/trips/indexes/fare_status_index.yaml"),
        FARE_STATUS_INDEX,
    )
    .unwrap();
    let output = run(
        &dir,
        &[&["plan", "datastores", "--format", "json"][..], &flags].concat(),
    );
    assert_eq!(output.status.code(), Some(3), "{}", text(&output));
    let plan: Value = serde_json::from_slice(&output.stdout).unwrap();
    let estimate = &change(&plan, "INDEX_ADDED")["estimate"];
    let (a, b) = (
        estimate["clusters"]["a"]
            .as_i64()
            .unwrap_or_else(|| panic!("{plan:#}")),
        estimate["clusters"]["b"]
            .as_i64()
            .unwrap_or_else(|| panic!("{plan:#}")),
    );
    assert!(a > 0 && b > 0, "{plan:#}");
    assert_eq!(estimate["cells"], a + b, "{plan:#}");
    let shown = run(&dir, &[&["plan", "datastores"][..], &flags].concat());
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains(&format!("log cells (a {a}, b {b})")),
        "{shown}"
    );
    drop(server);
}
