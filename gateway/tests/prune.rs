//! `cellgate cells prune` end to end, beside a running gateway on the
//! embedded SQLite store: cells written through GraphQL, old versions
//! pruned by the command (its arguments checked, a dry run first), then
//! `history` over GraphQL returns exactly the kept versions, every latest
//! body still reads, and `cellgate index verify` finds the indexes clean.

#[path = "support/server.rs"]
mod server;

use std::process::Output;
use std::time::Duration;

use serde_json::{json, Value};
use server::{cellgate, client, root, Server};
use sqlx::Connection as _;
use uuid::Uuid;

const ROWS: usize = 20;

async fn graphql(server: &Server, query: &str, variables: Value) -> Value {
    let answer: Value = client()
        .post(server.graphql())
        .json(&json!({"query": query, "variables": variables}))
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    assert!(answer.get("errors").is_none(), "{answer}");
    answer
}

fn base(driver: Uuid, v: u32) -> Value {
    json!({
        "driver_partner_uuid": driver.to_string(),
        "city_uuid": driver.to_string(),
        "trip_created_at": "2024-05-01T10:00:00Z",
        "fare": {"total": f64::from(v) + 0.5, "currency": "EUR"},
    })
}

async fn put(server: &Server, cells: Vec<Value>) {
    graphql(
        server,
        "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }",
        json!({"cells": cells}),
    )
    .await;
}

async fn history(server: &Server, row: Uuid, column: &str) -> Vec<(String, Value)> {
    let answer = graphql(
        server,
        &format!(
            "query($row: UUID!) {{ trips {{ history(rowKey: $row, column: {column}) {{ refKey body }} }} }}"
        ),
        json!({"row": row.to_string()}),
    )
    .await;
    answer["data"]["trips"]["history"]
        .as_array()
        .expect("a list")
        .iter()
        .map(|c| (c["refKey"].as_str().unwrap().to_string(), c["body"].clone()))
        .collect()
}

fn refs(history: &[(String, Value)]) -> Vec<&str> {
    history.iter().map(|(r, _)| r.as_str()).collect()
}

async fn count(server: &Server, sql: &str) -> i64 {
    let file = server.dir.path().join("data").join("cellgate.db");
    let mut db = sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
        .await
        .expect("open the store's database");
    sqlx::query_scalar(sql)
        .fetch_one(&mut db)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn run(server: &Server, command: &str, args: &[&str]) -> Output {
    cellgate(server.dir.path())
        .args(command.split(' '))
        .args(args)
        .arg("--data")
        .arg(server.dir.path().join("data"))
        .arg("--datastores")
        .arg(root().join("datastores"))
        .output()
        .expect("run cellgate")
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_old_versions_and_history_returns_the_kept_ones() {
    let server = Server::start(&[]);
    let rows: Vec<(Uuid, Uuid)> = (0..ROWS)
        .map(|_| (Uuid::new_v4(), Uuid::new_v4()))
        .collect();
    for v in 1..=4u32 {
        let mut cells: Vec<Value> = rows
            .iter()
            .map(|(row, driver)| {
                json!({"rowKey": row.to_string(), "column": "BASE", "refKey": v.to_string(), "body": base(*driver, v)})
            })
            .collect();
        if v <= 2 {
            cells.extend(rows.iter().map(|(row, _)| {
                json!({"rowKey": row.to_string(), "column": "STATUS", "refKey": v.to_string(), "body": {"status": format!("s{v}")}})
            }));
        }
        put(&server, cells).await;
    }
    // The gateway's index maintenance reads every cell before any can go.
    let behind = "SELECT (SELECT COUNT(DISTINCT consumer) FROM trips_offsets) <> 2 \
                  OR EXISTS (SELECT 1 FROM trips_shards s, (SELECT DISTINCT consumer FROM trips_offsets) c \
                  WHERE s.next_added_id > 1 AND NOT EXISTS (SELECT 1 FROM trips_offsets o \
                  WHERE o.shard = s.shard AND o.consumer = c.consumer AND o.added_id >= s.next_added_id - 1))";
    for _ in 0..600 {
        if count(&server, behind).await == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&server, behind).await, 0, "the indexes caught up");

    // Arguments are checked before anything runs.
    let none = run(&server, "cells prune", &["--datastore", "trips"]);
    assert_eq!(none.status.code(), Some(1), "{}", text(&none));
    assert!(
        String::from_utf8_lossy(&none.stderr).contains("--keep N"),
        "{}",
        text(&none)
    );
    let zero = run(
        &server,
        "cells prune",
        &["--datastore", "trips", "--keep", "0"],
    );
    assert_eq!(zero.status.code(), Some(1), "{}", text(&zero));
    assert!(
        String::from_utf8_lossy(&zero.stderr).contains("--keep must be at least 1"),
        "{}",
        text(&zero)
    );
    let soon = run(
        &server,
        "cells prune",
        &["--datastore", "trips", "--older-than", "soon"],
    );
    assert_eq!(soon.status.code(), Some(2), "{}", text(&soon));
    assert!(
        String::from_utf8_lossy(&soon.stderr).contains("`soon` is not a duration"),
        "{}",
        text(&soon)
    );

    // A dry run counts and deletes nothing.
    let dry = run(
        &server,
        "cells prune",
        &["--datastore", "trips", "--keep", "2", "--dry-run"],
    );
    assert_eq!(dry.status.code(), Some(0), "{}", text(&dry));
    let out = String::from_utf8_lossy(&dry.stdout);
    assert!(
        out.starts_with(&format!(
            "trips (dry run): {} cells examined, {} would delete, kept: {} latest, {} recent, 0 for consumers, 0 quarantined, 0 buffered",
            ROWS * 6,
            ROWS * 2,
            ROWS * 2,
            ROWS * 2
        )),
        "{}",
        text(&dry)
    );
    assert_eq!(
        refs(&history(&server, rows[0].0, "BASE").await),
        ["4", "3", "2", "1"]
    );

    // Everything but the latest BASE version goes; STATUS stays.
    let pruned = run(
        &server,
        "cells prune",
        &["--datastore", "trips", "--column", "BASE", "--keep", "1"],
    );
    assert_eq!(pruned.status.code(), Some(0), "{}", text(&pruned));
    let out = String::from_utf8_lossy(&pruned.stdout);
    assert!(
        out.contains(&format!(
            "  BASE: {} cells examined, {} deleted, kept: {} latest, 0 recent, 0 for consumers, 0 quarantined, 0 buffered",
            ROWS * 4,
            ROWS * 3,
            ROWS
        )),
        "{}",
        text(&pruned)
    );
    assert!(!out.contains("STATUS"), "{}", text(&pruned));
    for (row, driver) in &rows {
        let base_history = history(&server, *row, "BASE").await;
        assert_eq!(base_history, vec![("4".to_string(), base(*driver, 4))]);
        assert_eq!(refs(&history(&server, *row, "STATUS").await), ["2", "1"]);
    }

    // Nothing written in the last hour is older than an hour.
    let recent = run(
        &server,
        "cells prune",
        &["--datastore", "trips", "--older-than", "1h"],
    );
    assert_eq!(recent.status.code(), Some(0), "{}", text(&recent));
    let out = String::from_utf8_lossy(&recent.stdout);
    assert!(
        out.starts_with(&format!(
            "trips: {} cells examined, 0 deleted, kept: {} latest, {} recent",
            ROWS * 3,
            ROWS * 2,
            ROWS
        )),
        "{}",
        text(&recent)
    );
    assert!(out.contains("versions stored before "), "{}", text(&recent));
    assert_eq!(
        refs(&history(&server, rows[0].0, "STATUS").await),
        ["2", "1"]
    );

    let verify = run(
        &server,
        "index verify",
        &["--datastore", "trips", "--duty", "1"],
    );
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
    assert!(
        String::from_utf8_lossy(&verify.stdout).contains("0 missing, 0 stale, 0 extra"),
        "{}",
        text(&verify)
    );
}
