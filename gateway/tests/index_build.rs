//! An index added to a gateway with tens of thousands of cells is built
//! from the cell log end to end on the embedded SQLite store: while it
//! builds, queries on it answer `INDEX_BUILDING` and `indexStatus`,
//! `/metrics` and `cellgate index status` show its progress; a gateway
//! killed with SIGKILL part-way through resumes the build after a restart,
//! the index then answers with the right rows and `cellgate index verify`
//! finds it clean.

#[path = "support/server.rs"]
mod server;

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};
use server::{cellgate, client, copy_dir, root, Server};
use sqlx::Connection as _;
use uuid::Uuid;

const CELLS: usize = 20_000;
const STATUSES: usize = 400;

/// The index added to the running store.
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

fn args(dir: &Path) -> Vec<OsString> {
    vec![
        "--data".into(),
        dir.join("data").into(),
        "--datastores".into(),
        dir.join("datastores").into(),
    ]
}

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

/// Writes the trips in batches of 500; returns the row keys by status.
async fn write_trips(server: &Server) -> Vec<BTreeSet<String>> {
    let mut by_status = vec![BTreeSet::new(); STATUSES];
    for chunk in 0..CELLS / 500 {
        let cells: Vec<Value> = (0..500)
            .map(|i| {
                let n = chunk * 500 + i;
                let row = Uuid::new_v4().to_string();
                by_status[n % STATUSES].insert(row.clone());
                json!({
                    "rowKey": row,
                    "column": "BASE",
                    "refKey": "1",
                    "body": {
                        "driver_partner_uuid": Uuid::new_v4().to_string(),
                        "city_uuid": Uuid::new_v4().to_string(),
                        "trip_created_at": "2024-05-01T10:00:00Z",
                        "fare": {"total": n as f64, "currency": "EUR"},
                        "status": format!("s{}", n % STATUSES),
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
    by_status
}

async fn index_status(server: &Server) -> Value {
    let answer = graphql(
        server,
        "{ trips { indexStatus { name version ready pendingCells buildTotalCells buildDoneCells \
         buildRate buildEtaSeconds } } }",
        json!({}),
    )
    .await;
    answer["data"]["trips"]["indexStatus"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .find(|i| i["name"] == "fare_status_index")
        .unwrap_or_else(|| panic!("no fare_status_index: {answer}"))
        .clone()
}

/// The row keys of status `s7`, or the error code.
async fn query_s7(server: &Server) -> Result<BTreeSet<String>, String> {
    let answer = graphql(
        server,
        "{ trips { fareStatusIndex(status: \"s7\", first: 200) { edges { node { rowKey } } } } }",
        json!({}),
    )
    .await;
    if let Some(errors) = answer.get("errors") {
        return Err(errors[0]["extensions"]["code"]
            .as_str()
            .unwrap_or_else(|| panic!("{answer}"))
            .to_string());
    }
    Ok(answer["data"]["trips"]["fareStatusIndex"]["edges"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .map(|e| e["node"]["rowKey"].as_str().unwrap().to_string())
        .collect())
}

async fn sqlite(dir: &Path) -> sqlx::SqliteConnection {
    let file = dir.join("data").join("cellgate.db");
    sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
        .await
        .expect("open the store's database")
}

/// Log cells the new index's consumer has applied (its offsets).
async fn applied(db: &mut sqlx::SqliteConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT COALESCE(SUM(added_id), 0) FROM trips_offsets \
         WHERE consumer LIKE 'ix:fare_status_index:1:%'",
    )
    .fetch_one(db)
    .await
    .unwrap()
}

fn index_command(dir: &Path, args: &[&str]) -> Output {
    cellgate(dir)
        .arg("index")
        .args(args)
        .arg("--data")
        .arg(dir.join("data"))
        .arg("--datastores")
        .arg(dir.join("datastores"))
        .output()
        .expect("run cellgate index")
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The line of `cellgate index status` about the new index.
fn status_line(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find(|l| l.starts_with("trips.fare_status_index v1 (trips_ix_fare_status_index): "))
        .unwrap_or_else(|| panic!("{}", text(output)))
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_index_build_killed_part_way_completes_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().to_path_buf();
    copy_dir(&root().join("datastores"), &path.join("datastores"));
    let server = Server::start_in(dir, args(&path));
    let by_status = write_trips(&server).await;
    let dir = server.stop();

    // The gateway comes back with a new index, built from the log.
    std::fs::write(
        path.join("datastores/trips/indexes/fare_status_index.yaml"),
        FARE_STATUS_INDEX,
    )
    .unwrap();
    let server = Server::start_in(dir, args(&path));
    let mut db = sqlite(&path).await;
    // Once the build has applied some of the log, the test takes the
    // database's write lock, so the build stands still part-way.
    let mut done = 0;
    for _ in 0..20_000 {
        done = applied(&mut db).await;
        if done > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut db)
        .await
        .unwrap();
    let done = applied(&mut db).await.max(done);
    assert!(
        done > 0 && done < CELLS as i64,
        "the build was not caught part-way: {done} of {CELLS} cells applied"
    );
    let status = index_status(&server).await;
    assert_eq!(status["ready"], false, "{status}");
    assert!(
        status["pendingCells"]
            .as_str()
            .unwrap()
            .parse::<i64>()
            .unwrap()
            > 0,
        "{status}"
    );
    // Every cell of the log is one to read: 20 000, on one cluster.
    assert_eq!(status["buildTotalCells"], CELLS.to_string(), "{status}");
    assert_eq!(query_s7(&server).await, Err("INDEX_BUILDING".to_string()));
    let metrics = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(&format!(
            "cellgate_index_building_total_cells{{datastore=\"trips\",index=\"fare_status_index\"}} {CELLS}"
        )),
        "{metrics}"
    );
    assert!(
        metrics.contains("cellgate_index_building_pending_cells{datastore=\"trips\",index=\"fare_status_index\"}"),
        "{metrics}"
    );

    // kill -9 mid-build.
    let dir = server.stop();
    sqlx::query("ROLLBACK").execute(&mut db).await.unwrap();
    let done = applied(&mut db).await;
    assert!(done > 0 && done < CELLS as i64, "{done}");

    // Without a gateway, `cellgate index status` measures the store: the
    // build stands where the killed gateway left it.
    let output = index_command(&path, &["status", "--datastore", "trips"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    let line = status_line(&output);
    assert!(
        line.contains(&format!("building, {done}/{CELLS} cells")),
        "{line}"
    );
    assert!(
        line.contains(&format!("{} pending", CELLS as i64 - done)),
        "{line}"
    );
    assert!(
        String::from_utf8_lossy(&output.stdout)
            .contains("trips.driver_partner_index v1 (trips_ix_driver_partner_index): ready"),
        "{}",
        text(&output)
    );

    // Restarted, the gateway finishes the build from the stored offsets.
    let server = Server::start_in(dir, args(&path));
    let mut built = false;
    for _ in 0..2400 {
        if index_status(&server).await["ready"] == true {
            built = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(built, "{}", index_status(&server).await);
    let status = index_status(&server).await;
    assert_eq!(status["pendingCells"], "0", "{status}");
    assert_eq!(status["buildTotalCells"], Value::Null, "{status}");
    assert_eq!(query_s7(&server).await, Ok(by_status[7].clone()));
    assert_eq!(applied(&mut db).await, CELLS as i64);

    let verify = index_command(
        &path,
        &[
            "verify",
            "--datastore",
            "trips",
            "--index",
            "fare_status_index",
            "--duty",
            "1",
        ],
    );
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
    let output = index_command(&path, &["status", "--datastore", "trips", "--watch"]);
    assert_eq!(output.status.code(), Some(0), "{}", text(&output));
    assert!(
        status_line(&output).ends_with(": ready"),
        "{}",
        text(&output)
    );
    drop(server);
}
