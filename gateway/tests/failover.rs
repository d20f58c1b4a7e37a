//! Buffered writes across a cluster outage, end to end: two private database
//! servers (MariaDB in one test, PostgreSQL in the other) are the masters
//! of clusters `a` and `b` of the real `cellgate serve` with
//! `buffer_count: 1`. Writers keep writing new versions of rows through
//! `itemsPutCells` while the master of `b` is killed (`kill -9`), stays
//! down, and is started again on the same data directory and port.
//!
//! While `b` is down, a write whose primary is `b` gets its buffer copy on
//! `a` and is answered `BUFFERED`; a write whose primary is `a` cannot get
//! its copy on `b` and fails with `STORAGE_UNAVAILABLE`. Every answer must
//! be a per-cell status or a clean GraphQL error code (never a 5xx or
//! `INTERNAL`). Once `b` is back, the test waits (bounded, polling, no
//! assertion on speed) until the store has converged:
//! - every acknowledged cell (`WRITTEN`, `DUPLICATE`, `BUFFERED`) reads
//!   back by its full key with its exact body;
//! - `items_buffer` is empty on both servers (read with SQL);
//! - no cell key is stored twice in `items_cells` across the servers;
//! - for each city, the rows of the `by_city` index equal the rows whose
//!   latest stored `DATA` cell names that city. The expectation comes from
//!   the cells as stored (read over GraphQL), not from the answers alone:
//!   a write answered with an error may still have been committed.
//!
//! It prints the counts of written, buffered and refused cells, how soon
//! after the restart the outage's buffered cells left the buffer, and the
//! time from the restart until the store converged. A store that does not
//! converge fails the wait with the unreadable cells and the rows left in
//! each buffer.
//!
//! The master-loss tests (`a_lost_*`) lose `b`'s master with its disk
//! instead: `b` is a master with a replica behind one address, two
//! gateways serve, one of them is killed, the replica (held back so it
//! lacks the last writes) is promoted and the address repointed at it.
//! The same convergence conditions must hold, on `a` and the promoted
//! server.
//!
//! The servers need their programs (`mariadb-install-db`, `mariadbd`;
//! `initdb`, `postgres`); without them a test prints why it is skipped, or
//! fails with `CELLGATE_TEST_SERVERS=required` (see `support/servers.rs`).

#[path = "support/followers.rs"]
mod followers;
#[path = "support/mariadb.rs"]
mod mariadb;
#[path = "support/postgres.rs"]
mod postgres;
#[path = "support/private.rs"]
mod private;
#[path = "support/replication.rs"]
mod replication;
#[path = "support/server.rs"]
mod server;
#[path = "support/servers.rs"]
mod servers;
#[path = "support/socket.rs"]
mod socket;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use mariadb::Mariadb;
use postgres::Postgres;
use private::PrivateServer;
use replication::{MariaDbPair, Pair, PostgresPair};
use reqwest::StatusCode;
use serde_json::{json, Value};
use server::{client, Server};
use uuid::Uuid;

/// The datastore's shard count: the default, as in a real deployment.
const SHARDS: u32 = 4096;
/// Concurrent writers, each with its own rows.
const WRITERS: usize = 6;
/// Rows a writer keeps rewriting once it has made this many.
const ROWS_PER_WRITER: usize = 40;
/// How long the load runs before the kill, while `b` is down, and after
/// its restart.
const BEFORE_KILL: Duration = Duration::from_secs(4);
const OUTAGE: Duration = Duration::from_secs(15);
const AFTER_RESTART: Duration = Duration::from_secs(5);
/// The longest wait for the store to converge after the load: generous,
/// so only a store that never converges exceeds it.
const CONVERGE: Duration = Duration::from_secs(120);

/// `(row_key, column, ref_key)`: a cell's key.
type CellKey = (Uuid, String, i64);

/// The key of every row of `table` (`items_cells` or `items_buffer`) in
/// the database at `url`.
async fn keys(url: &str, table: &str) -> Result<Vec<CellKey>, String> {
    use sqlx::Connection as _;
    let sql = format!("SELECT row_key, column_name, ref_key FROM {table}");
    if url.starts_with("mysql:") {
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let rows: Vec<(Vec<u8>, Vec<u8>, i64)> = sqlx::query_as(&sql)
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
        rows.into_iter()
            .map(|(row, column, ref_key)| {
                let row = Uuid::from_slice(&row).map_err(|e| e.to_string())?;
                let column = String::from_utf8(column).map_err(|e| e.to_string())?;
                Ok((row, column, ref_key))
            })
            .collect()
    } else {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query_as(&sql)
            .fetch_all(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }
}

/// Rows of `items_buffer` at `url` buffered before `before`.
async fn buffered_before(url: &str, before: chrono::DateTime<chrono::Utc>) -> Result<i64, String> {
    use sqlx::Connection as _;
    if url.starts_with("mysql:") {
        let mut conn = sqlx::MySqlConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query_scalar("SELECT COUNT(*) FROM items_buffer WHERE created_at < ?")
            .bind(before.naive_utc())
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string())
    } else {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        sqlx::query_scalar("SELECT COUNT(*) FROM items_buffer WHERE created_at < $1")
            .bind(before)
            .fetch_one(&mut conn)
            .await
            .map_err(|e| e.to_string())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buffered_writes_survive_a_mariadb_master_outage() {
    failover::<Mariadb>("buffered_writes_survive_a_mariadb_master_outage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn buffered_writes_survive_a_postgres_master_outage() {
    failover::<Postgres>("buffered_writes_survive_a_postgres_master_outage").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_mariadb_master_loses_no_acknowledged_cell() {
    master_loss::<Mariadb, MariaDbPair>("a_lost_mariadb_master_loses_no_acknowledged_cell").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_postgres_primary_loses_no_acknowledged_cell() {
    master_loss::<Postgres, PostgresPair>("a_lost_postgres_primary_loses_no_acknowledged_cell")
        .await;
}

/// City names candidates; [`cities`] picks some whose index shard lives on
/// each cluster.
const CITY_NAMES: [&str; 16] = [
    "amsterdam",
    "berlin",
    "cairo",
    "dakar",
    "essen",
    "fez",
    "geneva",
    "hanoi",
    "izmir",
    "jakarta",
    "kyoto",
    "lima",
    "madrid",
    "nairobi",
    "oslo",
    "porto",
];

/// Three cities whose index entries live on `a` and three on `b` (shards
/// are split evenly, in order, over the two clusters), so a row whose city
/// changes moves its entry between index shards on both clusters.
fn cities() -> Vec<&'static str> {
    let on_a =
        |city: &str| cellgate_store::shards::shard_of_bytes(city.as_bytes(), SHARDS) < SHARDS / 2;
    let a: Vec<&str> = CITY_NAMES.into_iter().filter(|c| on_a(c)).take(3).collect();
    let b: Vec<&str> = CITY_NAMES
        .into_iter()
        .filter(|c| !on_a(c))
        .take(3)
        .collect();
    assert!(
        a.len() == 3 && b.len() == 3,
        "the candidates name too few cities per cluster: {a:?} {b:?}"
    );
    a.into_iter().chain(b).collect()
}

/// Starts `cellgate serve` on clusters `a` and `b` with one buffer copy
/// per write and no admission limits (the writers would hit the rate
/// limit, and a refusal there is not what this test is about); with
/// `hooks`, a webhook trigger of every `DATA` cell posts to it.
fn serve(a: &str, b: &str, b_replica: Option<&str>, hooks: Option<&str>) -> Server {
    let replicas = b_replica.map_or(String::new(), |r| format!("\n      replicas: [\"{r}\"]"));
    let config = format!(
        "storage:
  buffer_count: 1
  clusters:
    - name: a
      master: {a}
    - name: b
      master: {b}{replicas}
  timeout_ms: 2000
  readiness_timeout_ms: 1000
limits:
  rate_limit_per_second: 0
  max_concurrent_requests: 0
  max_connections_per_client: 0
"
    );
    let trigger = hooks.map(|url| {
        format!("name: hooks\ndatastore: items\ncolumns: [DATA]\nwebhook:\n  url: {url}\nbatch_size: 100\n")
    });
    let mut definitions = vec![
        (
            "items/datastore.yaml",
            "name: items\ncolumns:\n  - name: DATA\n",
        ),
        (
            "items/indexes/by_city.yaml",
            "table: by_city\ndatastore: items\nshard_field: city\ncolumn_defs:\n  - column_key: DATA\n    fields:\n      - { field: city, type: string }\n      - { field: n, type: int }\n",
        ),
    ];
    if let Some(trigger) = &trigger {
        definitions.push(("items/triggers/hooks.yaml", trigger));
    }
    Server::start_with(&definitions, &config, &[])
}

/// Where the outage stands when a write is sent.
const BEFORE: u8 = 0;
const DOWN: u8 = 1;
const RESTARTED: u8 = 2;

/// A cell the gateway acknowledged.
#[derive(Debug, Clone)]
struct Ack {
    row: Uuid,
    ref_key: i64,
    body: Value,
    status: String,
    /// [`BEFORE`], [`DOWN`] or [`RESTARTED`], when the write was sent.
    phase: u8,
}

/// What the writers saw.
#[derive(Debug, Default)]
struct Tally {
    acks: Vec<Ack>,
    /// Refused cells by error code.
    refused: BTreeMap<String, u64>,
    /// Answers that are not a status or a clean GraphQL error code.
    unexpected: Vec<String>,
    /// Every row a writer wrote to, acknowledged or not.
    rows: BTreeSet<Uuid>,
}

impl Tally {
    fn count(&self, status: &str, phase: Option<u8>) -> usize {
        self.acks
            .iter()
            .filter(|a| a.status == status && phase.is_none_or(|p| a.phase == p))
            .count()
    }

    fn refused(&self) -> u64 {
        self.refused.values().sum()
    }
}

/// A small xorshift generator: the test needs varied choices, not a
/// reproducible stream, and the crate has no `rand`.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        Rng((Uuid::new_v4().as_u128() as u64) | 1)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

const PUT: &str = "mutation($cells: [ItemsCellInput!]!) {
  itemsPutCells(cells: $cells) { rowKey refKey status error { code message retryable } }
}";

/// Writers that each keep writing batches of one to three cells, new rows
/// and new versions (the next ref key, a random city) of their own rows,
/// until stopped.
struct Load {
    tally: Arc<Mutex<Tally>>,
    stop: Arc<AtomicBool>,
    phase: Arc<AtomicU8>,
    /// The gateway each writer sends to.
    urls: Arc<Mutex<Vec<String>>>,
    writers: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// Writers spread over `servers` (each writer sends to one of them
    /// until [`Load::only_to`]).
    fn start(servers: &[&Server], cities: &[&'static str]) -> Load {
        let tally = Arc::new(Mutex::new(Tally::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let phase = Arc::new(AtomicU8::new(BEFORE));
        let urls: Arc<Mutex<Vec<String>>> = Arc::new(Mutex::new(
            (0..WRITERS)
                .map(|w| servers[w % servers.len()].graphql())
                .collect(),
        ));
        let writers = (0..WRITERS)
            .map(|w| {
                let (tally, stop, phase) = (tally.clone(), stop.clone(), phase.clone());
                let (urls, cities) = (urls.clone(), cities.to_vec());
                tokio::spawn(async move {
                    let client = client();
                    let mut rng = Rng::new();
                    // Each row with the ref key its next version gets.
                    let mut rows: Vec<(Uuid, i64)> = Vec::new();
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let size = 1 + rng.below(3);
                        let mut picked = BTreeSet::new();
                        let mut cells = Vec::new();
                        for _ in 0..size {
                            let grow = rows.len() < ROWS_PER_WRITER && rng.below(3) == 0;
                            let at = if grow || rows.is_empty() {
                                rows.push((Uuid::new_v4(), 1));
                                rows.len() - 1
                            } else {
                                rng.below(rows.len())
                            };
                            if !picked.insert(at) {
                                continue;
                            }
                            let (row, ref_key) = rows[at];
                            // The next version whatever becomes of this one:
                            // a refused write may still have been stored.
                            rows[at].1 += 1;
                            n += 1;
                            let city = cities[rng.below(cities.len())];
                            let body = json!({ "city": city, "n": n, "writer": w });
                            cells.push((row, ref_key, body));
                        }
                        let sent_in = phase.load(Ordering::Relaxed);
                        let url = urls.lock().unwrap()[w].clone();
                        let answer = put(&client, &url, &cells).await;
                        let refused = {
                            let mut tally = tally.lock().unwrap();
                            tally.rows.extend(cells.iter().map(|c| c.0));
                            record(&mut tally, &cells, sent_in, answer)
                        };
                        if refused {
                            // No tight loop of instant failures while a
                            // cluster is down.
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                })
            })
            .collect();
        Load {
            tally,
            stop,
            phase,
            urls,
            writers,
        }
    }

    /// Sends every later write to `server`.
    fn only_to(&self, server: &Server) {
        let url = server.graphql();
        self.urls
            .lock()
            .unwrap()
            .iter_mut()
            .for_each(|u| *u = url.clone());
    }

    fn set_phase(&self, phase: u8) {
        self.phase.store(phase, Ordering::Relaxed);
    }

    fn acks(&self) -> usize {
        self.tally.lock().unwrap().acks.len()
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

/// Sends one `itemsPutCells`; the answer's JSON, or what was wrong with it.
async fn put(
    client: &reqwest::Client,
    url: &str,
    cells: &[(Uuid, i64, Value)],
) -> Result<Value, String> {
    let cells: Vec<Value> = cells
        .iter()
        .map(|(row, ref_key, body)| {
            json!({ "rowKey": row, "column": "DATA", "refKey": ref_key, "body": body })
        })
        .collect();
    let body = json!({ "query": PUT, "variables": { "cells": cells } });
    let response = client
        .post(url)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if status != StatusCode::OK {
        return Err(format!("{status}: {text}"));
    }
    serde_json::from_str(&text).map_err(|_| format!("{status}, not JSON: {text}"))
}

/// Whether an error code is a clean refusal: anything but an internal
/// error (a missing code is a defect too).
fn clean_code(code: &Value) -> Option<String> {
    let code = code.as_str()?;
    (!code.starts_with("INTERNAL")).then(|| code.to_string())
}

/// Adds one answer to the tally; whether any cell was refused.
fn record(
    tally: &mut Tally,
    cells: &[(Uuid, i64, Value)],
    phase: u8,
    answer: Result<Value, String>,
) -> bool {
    let answer = match answer {
        Ok(answer) => answer,
        Err(what) => {
            tally.unexpected.push(what);
            return true;
        }
    };
    for error in answer["errors"].as_array().into_iter().flatten() {
        if clean_code(&error["extensions"]["code"]).is_none() {
            tally.unexpected.push(answer.to_string());
            return true;
        }
    }
    let Some(results) = answer["data"]["itemsPutCells"].as_array() else {
        // The whole request was refused: each cell by the first error.
        let code = clean_code(&answer["errors"][0]["extensions"]["code"]);
        match code {
            Some(code) => *tally.refused.entry(code).or_default() += cells.len() as u64,
            None => tally.unexpected.push(answer.to_string()),
        }
        return true;
    };
    if results.len() != cells.len() {
        tally.unexpected.push(answer.to_string());
        return true;
    }
    let mut refused = false;
    for ((row, ref_key, body), result) in cells.iter().zip(results) {
        let same_key =
            result["rowKey"] == json!(row) && result["refKey"] == json!(ref_key.to_string());
        match result["status"].as_str() {
            Some(status @ ("WRITTEN" | "DUPLICATE" | "BUFFERED")) if same_key => {
                tally.acks.push(Ack {
                    row: *row,
                    ref_key: *ref_key,
                    body: body.clone(),
                    status: status.to_string(),
                    phase,
                });
            }
            None if same_key => match clean_code(&result["error"]["code"]) {
                Some(code) => {
                    refused = true;
                    *tally.refused.entry(code).or_default() += 1;
                }
                None => tally.unexpected.push(result.to_string()),
            },
            _ => tally.unexpected.push(result.to_string()),
        }
    }
    refused
}

/// Posts a GraphQL query; its `data`, or why there is none (an error code
/// or a failed request).
async fn query(client: &reqwest::Client, url: &str, body: Value) -> Result<Value, String> {
    let response = client
        .post(url)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let status = response.status();
    let answer: Value = response
        .json()
        .await
        .map_err(|e| format!("{status}, not JSON: {e}"))?;
    if let Some(errors) = answer["errors"].as_array() {
        let code = &errors[0]["extensions"]["code"];
        assert!(
            clean_code(code).is_some(),
            "a read was answered with an internal error: {answer}"
        );
        return Err(format!("{status} {code}"));
    }
    Ok(answer["data"].clone())
}

/// Reads each cell of `cells` by its full key; the ones not readable yet.
/// A cell that reads back with another body fails the test.
async fn unreadable(client: &reqwest::Client, url: &str, cells: &[Ack]) -> Vec<Ack> {
    let chunks = cells.chunks(25).map(|chunk| async move {
        let fields: String = chunk
            .iter()
            .enumerate()
            .map(|(i, ack)| {
                format!(
                    "c{i}: cell(rowKey: \"{}\", column: DATA, refKey: {}) {{ body }} ",
                    ack.row, ack.ref_key
                )
            })
            .collect();
        let data = query(
            client,
            url,
            json!({ "query": format!("{{ items {{ {fields} }} }}") }),
        )
        .await;
        let Ok(data) = data else {
            return chunk.to_vec();
        };
        let mut missing = Vec::new();
        for (i, ack) in chunk.iter().enumerate() {
            let cell = &data["items"][format!("c{i}")];
            if cell.is_null() {
                missing.push(ack.clone());
            } else {
                assert_eq!(
                    cell["body"], ack.body,
                    "cell {} ref {} ({}) reads back with another body",
                    ack.row, ack.ref_key, ack.status
                );
            }
        }
        missing
    });
    let mut missing = Vec::new();
    // A few requests at a time.
    let mut chunks = futures::stream::iter(chunks).buffer_unordered(4);
    while let Some(chunk) = chunks.next().await {
        missing.extend(chunk);
    }
    missing
}

/// The city of each row's latest stored `DATA` cell, read over GraphQL;
/// rows without a stored cell have none.
async fn latest_cities(
    client: &reqwest::Client,
    url: &str,
    rows: &[Uuid],
) -> Result<HashMap<Uuid, String>, String> {
    let mut cities = HashMap::new();
    for chunk in rows.chunks(100) {
        let data = query(
            client,
            url,
            json!({
                "query": "query($rows: [UUID!]!) { items { rows(rowKeys: $rows) { rowKey data { refKey body } } } }",
                "variables": { "rows": chunk },
            }),
        )
        .await?;
        for row in data["items"]["rows"].as_array().into_iter().flatten() {
            if let Some(city) = row["data"]["body"]["city"].as_str() {
                let key: Uuid = serde_json::from_value(row["rowKey"].clone()).unwrap();
                cities.insert(key, city.to_string());
            }
        }
    }
    Ok(cities)
}

/// The rows of the `by_city` index under `city`, all pages.
async fn index_rows(
    client: &reqwest::Client,
    url: &str,
    city: &str,
) -> Result<BTreeSet<Uuid>, String> {
    let mut rows = BTreeSet::new();
    let mut after: Option<String> = None;
    loop {
        let data = query(
            client,
            url,
            json!({
                "query": "query($city: String!, $after: String) { items { byCity(city: $city, first: 1000, after: $after) { edges { node { rowKey } } pageInfo { hasNextPage endCursor } } } }",
                "variables": { "city": city, "after": after },
            }),
        )
        .await?;
        let page = &data["items"]["byCity"];
        for edge in page["edges"].as_array().into_iter().flatten() {
            let row: Uuid = serde_json::from_value(edge["node"]["rowKey"].clone()).unwrap();
            assert!(rows.insert(row), "row {row} is listed twice under {city}");
        }
        if page["pageInfo"]["hasNextPage"] != true {
            return Ok(rows);
        }
        after = page["pageInfo"]["endCursor"].as_str().map(str::to_string);
    }
}

/// Rows of one city that the index lacks, and rows it lists that do not
/// have that city.
#[derive(Debug)]
struct IndexDiff {
    missing: Vec<Uuid>,
    extra: Vec<Uuid>,
}

/// How far the store is from converged; empty fields where it is.
#[derive(Debug)]
struct Divergence {
    /// Acknowledged cells that do not read back yet.
    unreadable: Vec<Ack>,
    /// The keys of the `items_buffer` rows on `a` and `b` (or why they
    /// could not be read).
    buffers: [Result<Vec<CellKey>, String>; 2],
    /// Cell keys stored more than once across both servers (or why they
    /// could not be read).
    duplicated: Result<Vec<CellKey>, String>,
    /// Per city where the index differs: rows missing, rows extra (or why
    /// it could not be compared).
    index: BTreeMap<String, Result<IndexDiff, String>>,
}

impl Divergence {
    fn converged(&self) -> bool {
        self.unreadable.is_empty()
            && self
                .buffers
                .iter()
                .all(|b| b.as_ref().is_ok_and(Vec::is_empty))
            && self.duplicated.as_ref().is_ok_and(Vec::is_empty)
            && self.index.is_empty()
    }

    /// Rows in each buffer, for a progress line.
    fn buffer_counts(&self) -> String {
        let count = |b: &Result<Vec<CellKey>, String>| match b {
            Ok(keys) => keys.len().to_string(),
            Err(why) => format!("unknown ({why})"),
        };
        format!(
            "a={} b={}",
            count(&self.buffers[0]),
            count(&self.buffers[1])
        )
    }

    fn describe(&self, acks: &[Ack]) -> String {
        // What the writers were told of each buffered cell: a copy of a
        // cell that was refused, or written on its primary, is left over.
        let answers: HashMap<(Uuid, i64), &str> = acks
            .iter()
            .map(|a| ((a.row, a.ref_key), a.status.as_str()))
            .collect();
        let buffers: Vec<String> = ["a", "b"]
            .iter()
            .zip(&self.buffers)
            .map(|(cluster, keys)| match keys {
                Ok(keys) => {
                    let mut by_answer = BTreeMap::<&str, usize>::new();
                    for (row, _, ref_key) in keys {
                        let answer = answers.get(&(*row, *ref_key)).unwrap_or(&"refused");
                        *by_answer.entry(answer).or_default() += 1;
                    }
                    format!("{cluster}: {} (cells answered {by_answer:?})", keys.len())
                }
                Err(why) => format!("{cluster}: not read ({why})"),
            })
            .collect();
        let mut unreadable = BTreeMap::<&str, usize>::new();
        for ack in &self.unreadable {
            *unreadable.entry(ack.status.as_str()).or_default() += 1;
        }
        let index: Vec<String> = self
            .index
            .iter()
            .map(|(city, diff)| match diff {
                Ok(IndexDiff { missing, extra }) => format!(
                    "{city}: {} rows missing, {} extra (e.g. missing {:?}, extra {:?})",
                    missing.len(),
                    extra.len(),
                    missing.first(),
                    extra.first()
                ),
                Err(why) => format!("{city}: not read ({why})"),
            })
            .collect();
        format!(
            "{} of {} acknowledged cells unreadable (by their answer: {unreadable:?}; e.g. {:?}); \
             items_buffer rows: {}; cell keys stored more than once: {}; \
             index by_city differs for {} cities: {index:#?}",
            self.unreadable.len(),
            acks.len(),
            self.unreadable.first(),
            buffers.join(", "),
            match &self.duplicated {
                Ok(keys) => format!("{} (e.g. {:?})", keys.len(), keys.first()),
                Err(why) => format!("not read ({why})"),
            },
            self.index.len(),
        )
    }
}

/// Checks every convergence condition once. `pending` holds the
/// acknowledged cells not yet seen readable (cells are immutable, so one
/// seen once stays readable).
async fn check(
    client: &reqwest::Client,
    url: &str,
    servers: [&str; 2],
    pending: &[Ack],
    rows: &[Uuid],
    cities: &[&str],
) -> Divergence {
    let mut divergence = Divergence {
        unreadable: unreadable(client, url, pending).await,
        buffers: [
            keys(servers[0], "items_buffer").await,
            keys(servers[1], "items_buffer").await,
        ],
        duplicated: duplicated(servers).await,
        index: BTreeMap::new(),
    };
    let latest = match latest_cities(client, url, rows).await {
        Ok(latest) => latest,
        Err(why) => {
            divergence.index.insert("(latest cells)".into(), Err(why));
            return divergence;
        }
    };
    for city in cities {
        let expected: BTreeSet<Uuid> = latest
            .iter()
            .filter(|(_, c)| c.as_str() == *city)
            .map(|(row, _)| *row)
            .collect();
        match index_rows(client, url, city).await {
            Ok(listed) if listed == expected => {}
            Ok(listed) => {
                let missing = expected.difference(&listed).copied().collect();
                let extra = listed.difference(&expected).copied().collect();
                divergence
                    .index
                    .insert(city.to_string(), Ok(IndexDiff { missing, extra }));
            }
            Err(why) => {
                divergence.index.insert(city.to_string(), Err(why));
            }
        }
    }
    divergence
}

/// Cell keys stored more than once in `items_cells`, across the servers.
async fn duplicated(servers: [&str; 2]) -> Result<Vec<CellKey>, String> {
    let mut stored = HashMap::<CellKey, usize>::new();
    for server in servers {
        for key in keys(server, "items_cells").await? {
            *stored.entry(key).or_default() += 1;
        }
    }
    Ok(stored
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(key, _)| key)
        .collect())
}

/// Waits for `done` under load, failing after 120 s.
async fn wait_for(what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !done() {
        assert!(Instant::now() < deadline, "waited 120 s for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn failover<D: PrivateServer>(test: &str) {
    let (mut a, mut b) = match (D::init(), D::init()) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(why), _) | (_, Err(why)) => {
            servers::skip(test, &why);
            return;
        }
    };
    a.start().await;
    b.start().await;
    let cities = cities();
    let server = serve(&a.url(), &b.url(), None, None);
    server
        .wait_ready(StatusCode::OK, Duration::from_secs(120))
        .await;
    let url = server.graphql();

    let load = Load::start(&[&server], &cities);
    wait_for("writes before the outage", || load.acks() >= 100).await;
    tokio::time::sleep(BEFORE_KILL).await;

    // Writes sent from now on may find b gone.
    load.set_phase(DOWN);
    b.kill();
    tokio::time::sleep(OUTAGE).await;

    b.start().await;
    let restarted = Instant::now();
    let restarted_at = chrono::Utc::now();
    load.set_phase(RESTARTED);
    // How soon the cells buffered during the outage leave a's buffer (new
    // writes pass through the buffers too, so only older rows count).
    let mut drained_after = None;
    let drain_deadline = restarted + AFTER_RESTART;
    while Instant::now() < drain_deadline {
        if buffered_before(&a.url(), restarted_at).await == Ok(0) {
            drained_after = Some(restarted.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    match drained_after {
        Some(after) => eprintln!(
            "{}: the outage's buffered cells left a's buffer {:.2} s after b's restart",
            D::KIND,
            after.as_secs_f64()
        ),
        None => eprintln!(
            "{}: the outage's buffered cells were still in a's buffer {} s after b's restart",
            D::KIND,
            AFTER_RESTART.as_secs()
        ),
    }
    tokio::time::sleep(drain_deadline.saturating_duration_since(Instant::now())).await;
    let tally = load.finish().await;

    let (written, duplicate, buffered) = (
        tally.count("WRITTEN", None),
        tally.count("DUPLICATE", None),
        tally.count("BUFFERED", None),
    );
    eprintln!(
        "{}: {} cells acknowledged: {written} WRITTEN, {duplicate} DUPLICATE, {buffered} BUFFERED \
         ({} of them while b was down); {} refused {:?}; {} unexpected answers; {} rows",
        D::KIND,
        tally.acks.len(),
        tally.count("BUFFERED", Some(DOWN)),
        tally.refused(),
        tally.refused,
        tally.unexpected.len(),
        tally.rows.len(),
    );
    assert!(
        tally.unexpected.is_empty(),
        "{} answers were neither a status nor a clean error code, e.g. {:#?}\nserver stderr:\n{}",
        tally.unexpected.len(),
        &tally.unexpected[..tally.unexpected.len().min(5)],
        server.stderr()
    );
    assert!(
        tally.count("BUFFERED", Some(DOWN)) > 0,
        "no write was BUFFERED while b was down, so the test proves nothing"
    );

    let client = client();
    let rows: Vec<Uuid> = tally.rows.iter().copied().collect();
    let deadline = Instant::now() + CONVERGE;
    let mut pending = tally.acks.clone();
    let mut last_report = Instant::now();
    loop {
        let divergence = check(
            &client,
            &url,
            [&a.url(), &b.url()],
            &pending,
            &rows,
            &cities,
        )
        .await;
        if divergence.converged() {
            break;
        }
        if Instant::now() >= deadline {
            panic!(
                "{}: the store did not converge within {} s of the load's end ({} s after b's restart): {}",
                D::KIND,
                CONVERGE.as_secs(),
                restarted.elapsed().as_secs(),
                divergence.describe(&tally.acks),
            );
        }
        if last_report.elapsed() >= Duration::from_secs(20) {
            last_report = Instant::now();
            eprintln!(
                "{}: {} s after b's restart: {} acknowledged cells unreadable, items_buffer rows {}",
                D::KIND,
                restarted.elapsed().as_secs(),
                divergence.unreadable.len(),
                divergence.buffer_counts(),
            );
        }
        pending = divergence.unreadable;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "{}: {written} written, {buffered} buffered, {} refused; every acknowledged cell readable, \
         buffers empty, no duplicate and the index recomputed {:.1} s after b's restart",
        D::KIND,
        tally.refused(),
        restarted.elapsed().as_secs_f64()
    );
}

/// One address for cluster `b`'s master, as a virtual IP or a proxy gives
/// it: a TCP forwarder to the port it is pointed at, which an operator
/// repoints at the promoted replica.
struct Address {
    port: u16,
    target: Arc<std::sync::atomic::AtomicU16>,
}

impl Address {
    async fn start(target: u16) -> Address {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let target = Arc::new(std::sync::atomic::AtomicU16::new(target));
        let to = target.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let port = to.load(Ordering::SeqCst);
                tokio::spawn(async move {
                    if let Ok(mut server) =
                        tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                    {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
            }
        });
        Address { port, target }
    }

    fn point_at(&self, port: u16) {
        self.target.store(port, Ordering::SeqCst);
    }

    /// `url` with its port replaced by this address's.
    fn url(&self, url: &str, port: u16) -> String {
        url.replace(&format!(":{port}/"), &format!(":{}/", self.port))
    }
}

/// Whether `row`'s cells live on `b` (shards are split evenly, in order,
/// over the two clusters).
fn on_b(row: &Uuid) -> bool {
    cellgate_store::shards::row_shard(row, SHARDS) >= SHARDS / 2
}

/// A master lost with its disk: `b` is a master with a replica behind one
/// address, and the replica stops receiving (so the asynchronous window is
/// never empty); one of the two gateways is killed (`kill -9`), then the
/// master is killed and its data directory deleted, the replica promoted
/// and the address repointed at it, while the writers go on through the
/// other gateway. Every acknowledged cell must read back with its body, the buffers
/// drain, no key is stored twice and the index equals a recomputation.
async fn master_loss<D: PrivateServer, P: Pair>(test: &str) {
    let mut a = match D::init() {
        Ok(a) => a,
        Err(why) => {
            servers::skip(test, &why);
            return;
        }
    };
    let mut b = match P::start().await {
        Ok(b) => b,
        Err(why) => {
            servers::skip(test, &why);
            return;
        }
    };
    a.start().await;
    let cities = cities();
    let address = Address::start(b.master_port()).await;
    let b_master = address.url(&b.master_url(), b.master_port());
    // Two gateways; the first is killed while copies wait for the replica,
    // so the other takes over their release and replay.
    // Every cell goes to a webhook (from both gateways) and to a
    // subscription of the gateway that lives: each must be given every
    // acknowledged cell, the replayed ones and those the promoted replica
    // numbers anew included.
    let (hooks, hooked) = followers::webhook_receiver().await;
    let first = serve(&a.url(), &b_master, Some(&b.replica_url()), Some(&hooks));
    let server = serve(&a.url(), &b_master, Some(&b.replica_url()), Some(&hooks));
    for gateway in [&first, &server] {
        gateway
            .wait_ready(StatusCode::OK, Duration::from_secs(120))
            .await;
    }
    let url = server.graphql();
    let subscribed = followers::subscribe(server.url("/graphql/ws"), "itemsCells", "DATA");

    let load = Load::start(&[&first, &server], &cities);
    wait_for("writes before the loss", || load.acks() >= 100).await;
    tokio::time::sleep(BEFORE_KILL).await;
    // From now on the replica has nothing the master commits.
    b.hold_back_replica().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The writes in flight on the first gateway end before it is killed.
    load.only_to(&server);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut first = first;
    first.child.kill().expect("kill -9 of the first gateway");
    let _ = first.child.wait();
    tokio::time::sleep(Duration::from_secs(1)).await;
    load.set_phase(DOWN);
    b.lose_master();
    tokio::time::sleep(Duration::from_secs(2)).await;
    b.promote_replica().await;
    address.point_at(b.replica_port());
    let promoted = Instant::now();
    load.set_phase(RESTARTED);
    // The asynchronous window: cells acknowledged WRITTEN on b before the
    // loss that the promoted replica does not have.
    let on_replica: BTreeSet<CellKey> = keys(&b.replica_url(), "items_cells")
        .await
        .expect("read the promoted replica")
        .into_iter()
        .collect();
    let window: Vec<Ack> = {
        let tally = load.tally.lock().unwrap();
        tally
            .acks
            .iter()
            .filter(|a| a.status == "WRITTEN" && on_b(&a.row) && a.phase == BEFORE)
            .filter(|a| !on_replica.contains(&(a.row, "DATA".to_string(), a.ref_key)))
            .cloned()
            .collect()
    };
    tokio::time::sleep(AFTER_RESTART).await;
    let tally = load.finish().await;
    eprintln!(
        "{}: {} cells acknowledged ({} WRITTEN, {} BUFFERED); {} acknowledged WRITTEN on b were missing on the promoted replica; {} refused {:?}",
        P::KIND,
        tally.acks.len(),
        tally.count("WRITTEN", None),
        tally.count("BUFFERED", None),
        window.len(),
        tally.refused(),
        tally.refused,
    );
    assert!(
        tally.unexpected.is_empty(),
        "{} answers were neither a status nor a clean error code, e.g. {:#?}\nserver stderr:\n{}",
        tally.unexpected.len(),
        &tally.unexpected[..tally.unexpected.len().min(5)],
        server.stderr()
    );
    assert!(
        !window.is_empty(),
        "the promoted replica had every acknowledged cell, so the test proves nothing"
    );

    let client = client();
    let rows: Vec<Uuid> = tally.rows.iter().copied().collect();
    let deadline = Instant::now() + CONVERGE;
    let mut pending = tally.acks.clone();
    let new_b = b.replica_url();
    let mut window_back = None;
    loop {
        let divergence = check(&client, &url, [&a.url(), &new_b], &pending, &rows, &cities).await;
        if window_back.is_none() && unreadable(&client, &url, &window).await.is_empty() {
            window_back = Some(promoted.elapsed());
        }
        if divergence.converged() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: the store did not converge within {} s after the promotion: {}\nserver stderr:\n{}",
            P::KIND,
            CONVERGE.as_secs(),
            divergence.describe(&tally.acks),
            server.stderr()
        );
        pending = divergence.unreadable;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "{}: the {} cells of the asynchronous window read back {:.1} s after the promotion; every acknowledged cell readable, buffers empty, no duplicate and the index recomputed {:.1} s after it",
        P::KIND,
        window.len(),
        window_back.unwrap_or_default().as_secs_f64(),
        promoted.elapsed().as_secs_f64()
    );
    let acknowledged: Vec<CellKey> = tally
        .acks
        .iter()
        .map(|a| (a.row, "DATA".to_string(), a.ref_key))
        .collect();
    loop {
        let unhooked = hooked.missing(&acknowledged);
        let unsubscribed = subscribed.missing(&acknowledged);
        if unhooked.is_empty() && unsubscribed.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{}: of {} acknowledged cells, {} never reached the webhook (e.g. {:?}) and {} never the subscription (e.g. {:?}); {} of the asynchronous window among them\nserver stderr:\n{}",
            P::KIND,
            acknowledged.len(),
            unhooked.len(),
            &unhooked[..unhooked.len().min(3)],
            unsubscribed.len(),
            &unsubscribed[..unsubscribed.len().min(3)],
            window
                .iter()
                .filter(|w| unhooked.iter().chain(&unsubscribed).any(|k| k.0 == w.row && k.2 == w.ref_key))
                .count(),
            server.stderr()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    eprintln!(
        "{}: every acknowledged cell reached the webhook ({} cells taken) and the subscription ({}) {:.1} s after the promotion",
        P::KIND,
        hooked.len(),
        subscribed.len(),
        promoted.elapsed().as_secs_f64()
    );
}
