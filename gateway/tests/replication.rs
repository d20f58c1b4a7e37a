//! The gateway on a replicated cluster, and the replication harness that
//! later tests of reads from replicas build on (`support/replication.rs`).
//! For a MariaDB pair (GTID replication) and a PostgreSQL pair (streaming
//! replication), one test starts the pair and the real `cellgate serve`
//! with one cluster whose master is the pair's master and whose
//! `replicas:` is the pair's replica, then:
//! - writes cells over GraphQL and finds their rows in `items_cells` on the
//!   replica (read with SQL): the gateway's tables and rows replicate, DDL
//!   included;
//! - with a replica delay, finds a fresh cell on the master and, once the
//!   replica has received it, not on the replica (what read-your-writes
//!   tests need), then removes the delay and finds it on the replica;
//! - kills the replica (`kill -9`): the gateway, which reads masters only
//!   today, still writes and reads; the restarted replica catches up;
//! - kills and restarts the master: the gateway writes again once it is
//!   back, and the replica follows;
//! - stops the master (`SIGSTOP`): a query on it gets no answer; once it
//!   continues, it answers and the replica catches up.
//!
//! Every wait is bounded and fails on its outcome, never on its duration;
//! the test prints how long each step took. The pairs need their programs
//! (`mariadb-install-db`, `mariadbd`; `initdb`, `postgres`,
//! `pg_basebackup`); without them a test prints why it is skipped, or
//! fails with `CELLGATE_TEST_SERVERS=required` (see `support/servers.rs`).

#[path = "support/postgres.rs"]
mod postgres;
#[path = "support/replication.rs"]
mod replication;
#[path = "support/server.rs"]
mod server;
#[path = "support/servers.rs"]
mod servers;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use replication::{MariaDbPair, Pair, PostgresPair};
use reqwest::StatusCode;
use serde_json::{json, Value};
use server::{client, Server};
use sqlx::Connection as _;
use uuid::Uuid;

/// The longest wait for the gateway to write again after its master
/// restarted, or to be ready.
const WAIT: Duration = Duration::from_secs(90);
/// How long the replica delays what it applies while a test looks for a
/// fresh cell on it: far longer than the few statements between the write
/// and the look, so the cell cannot have arrived yet.
const DELAY_SECS: u32 = 60;
/// How long a query on a stopped master is given to (not) answer.
const NO_ANSWER: Duration = Duration::from_secs(2);

/// Reads the rows a test wrote, with SQL, on either server of a pair.
trait Rows: Pair {
    /// The row keys of `items_cells` in the database at `url`.
    async fn rows(url: &str) -> Result<BTreeSet<Uuid>, String>;
}

impl Rows for MariaDbPair {
    async fn rows(url: &str) -> Result<BTreeSet<Uuid>, String> {
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let rows: Vec<Vec<u8>> = sqlx::query_scalar("SELECT row_key FROM items_cells")
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let _ = conn.close().await;
        rows.iter()
            .map(|row| Uuid::from_slice(row).map_err(|e| e.to_string()))
            .collect()
    }
}

impl Rows for PostgresPair {
    async fn rows(url: &str) -> Result<BTreeSet<Uuid>, String> {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let rows: Vec<Uuid> = sqlx::query_scalar("SELECT row_key FROM items_cells")
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        let _ = conn.close().await;
        Ok(rows.into_iter().collect())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_runs_on_a_mariadb_master_with_a_gtid_replica() {
    replicated::<MariaDbPair>("the_gateway_runs_on_a_mariadb_master_with_a_gtid_replica").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_runs_on_a_postgres_primary_with_a_streaming_replica() {
    replicated::<PostgresPair>("the_gateway_runs_on_a_postgres_primary_with_a_streaming_replica")
        .await;
}

/// Starts `cellgate serve` on one cluster: `master` with `replica`.
fn serve(master: &str, replica: &str) -> Server {
    let config = format!(
        "storage:
  clusters:
    - name: a
      master: {master}
      replicas: [{replica}]
  timeout_ms: 2000
  readiness_timeout_ms: 1000
"
    );
    Server::start_with(
        &[(
            "items/datastore.yaml",
            "name: items\ncolumns:\n  - name: DATA\n",
        )],
        &config,
        &[],
    )
}

/// Posts a GraphQL request; its `data`, or the answer that has errors.
async fn graphql(server: &Server, body: Value) -> Result<Value, String> {
    let response = client()
        .post(server.graphql())
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let answer: Value =
        serde_json::from_str(&text).map_err(|_| format!("{status}, not JSON: {text}"))?;
    if status != StatusCode::OK || answer.get("errors").is_some() {
        return Err(format!("{status}: {answer}"));
    }
    Ok(answer["data"].clone())
}

/// Writes one new `DATA` cell (ref key 1) to each of `rows`; an error
/// unless every cell is stored (`WRITTEN`, or `DUPLICATE` when an attempt
/// whose answer was lost stored it).
async fn put(server: &Server, rows: &[Uuid]) -> Result<(), String> {
    let cells: Vec<Value> = rows
        .iter()
        .enumerate()
        .map(|(n, row)| json!({ "rowKey": row, "column": "DATA", "refKey": 1, "body": { "n": n } }))
        .collect();
    let data = graphql(
        server,
        json!({
            "query": "mutation($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { rowKey status error { code } } }",
            "variables": { "cells": cells },
        }),
    )
    .await?;
    let results = data["itemsPutCells"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if results.len() != rows.len()
        || results
            .iter()
            .any(|r| r["status"] != "WRITTEN" && r["status"] != "DUPLICATE")
    {
        return Err(format!("not every cell was stored: {data}"));
    }
    Ok(())
}

/// The rows of `rows` that read back over GraphQL with a `DATA` cell.
async fn readable(server: &Server, rows: &[Uuid]) -> Result<BTreeSet<Uuid>, String> {
    let data = graphql(
        server,
        json!({
            "query": "query($rows: [UUID!]!) { items { rows(rowKeys: $rows) { rowKey data { refKey } } } }",
            "variables": { "rows": rows },
        }),
    )
    .await?;
    Ok(data["items"]["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|row| !row["data"].is_null())
        .map(|row| serde_json::from_value(row["rowKey"].clone()).unwrap())
        .collect())
}

fn new_rows(n: usize) -> Vec<Uuid> {
    (0..n).map(|_| Uuid::new_v4()).collect()
}

/// Fails unless every row of `rows` is in `items_cells` at `url`.
async fn assert_stored<P: Rows>(url: &str, rows: &[Uuid], where_: &str) {
    let stored = P::rows(url)
        .await
        .unwrap_or_else(|e| panic!("read items_cells on the {where_}: {e}"));
    let missing: Vec<&Uuid> = rows.iter().filter(|r| !stored.contains(r)).collect();
    assert!(
        missing.is_empty(),
        "rows missing from items_cells on the {where_}: {missing:?}"
    );
}

/// Prints how long a step took (nothing is asserted on it).
fn took(kind: &str, step: &str, since: Instant) {
    eprintln!("{kind}: {step} in {:?}", since.elapsed());
}

async fn replicated<P: Rows>(test: &str) {
    let kind = P::KIND;
    let started = Instant::now();
    let mut pair = match P::start().await {
        Ok(pair) => pair,
        Err(why) => return servers::skip(test, &why),
    };
    took(kind, "pair started, database replicated", started);
    let server = serve(&pair.master_url(), &pair.replica_url());
    server.wait_ready(StatusCode::OK, WAIT).await;

    // The gateway creates its tables on the master; they and the cells
    // replicate.
    let step = Instant::now();
    let first = new_rows(20);
    put(&server, &first).await.expect("write the first cells");
    pair.wait_replica_caught_up().await;
    assert_stored::<P>(&pair.master_url(), &first, "master").await;
    assert_stored::<P>(&pair.replica_url(), &first, "replica").await;
    took(kind, "first cells on the replica", step);

    // A delayed replica: a fresh cell is on the master, not on the replica.
    let step = Instant::now();
    pair.set_replica_delay(DELAY_SECS).await;
    let fresh = new_rows(1);
    put(&server, &fresh).await.expect("write a fresh cell");
    assert_stored::<P>(&pair.master_url(), &fresh, "master").await;
    // Received, so only the delay keeps it from the replica's tables.
    pair.wait_replica_received().await;
    let on_replica = P::rows(&pair.replica_url())
        .await
        .expect("read the replica");
    assert!(
        !on_replica.contains(&fresh[0]),
        "the fresh cell is on the replica despite its {DELAY_SECS} s delay"
    );
    assert!(
        first.iter().all(|r| on_replica.contains(r)),
        "the delayed replica lost earlier cells"
    );
    pair.set_replica_delay(0).await;
    pair.wait_replica_caught_up().await;
    assert_stored::<P>(&pair.replica_url(), &fresh, "replica").await;
    took(
        kind,
        "delayed cell seen on the master only, then on the replica",
        step,
    );

    // A killed replica: the gateway reads and writes its master as before.
    let step = Instant::now();
    pair.kill_replica();
    let while_down = new_rows(10);
    put(&server, &while_down)
        .await
        .expect("write while the replica is down");
    let all: Vec<Uuid> = [&first[..], &fresh[..], &while_down[..]].concat();
    assert_eq!(
        readable(&server, &all)
            .await
            .expect("read while the replica is down"),
        all.iter().copied().collect::<BTreeSet<_>>(),
        "cells unreadable while the replica is down"
    );
    pair.restart_replica().await;
    pair.wait_replica_caught_up().await;
    assert_stored::<P>(&pair.replica_url(), &all, "restarted replica").await;
    took(kind, "replica killed, restarted and caught up", step);

    // A killed master: once it is back the gateway writes again (its first
    // attempts may meet connections of the killed server) and the replica
    // follows it.
    let step = Instant::now();
    pair.kill_master();
    pair.restart_master().await;
    let after_restart = new_rows(5);
    let deadline = Instant::now() + WAIT;
    while let Err(e) = put(&server, &after_restart).await {
        assert!(
            Instant::now() < deadline,
            "the gateway does not write to the restarted master: {e}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pair.wait_replica_caught_up().await;
    assert_stored::<P>(&pair.replica_url(), &after_restart, "replica").await;
    took(
        kind,
        "master killed, restarted, written and replicated",
        step,
    );

    // A stopped master answers nothing until it continues.
    let step = Instant::now();
    pair.stop_master_answering();
    let stopped = tokio::time::timeout(NO_ANSWER, P::rows(&pair.master_url())).await;
    assert!(stopped.is_err(), "the stopped master answered: {stopped:?}");
    pair.resume_master();
    assert_stored::<P>(&pair.master_url(), &after_restart, "resumed master").await;
    pair.wait_replica_caught_up().await;
    took(kind, "master stopped and continued", step);
    took(kind, "the whole test", started);
}
