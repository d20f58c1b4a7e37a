//! Replica reads and circuit breakers under load, end to end, on real
//! replication: cluster `a` is a replicated pair (a MariaDB master with a
//! GTID replica in one test, a PostgreSQL primary with a streaming standby
//! in the other, `support/replication.rs`), cluster `b` a private server of
//! the same kind, both behind the real `cellgate serve` with the default
//! 4096 shards and `buffer_count: 1`. Every step runs readers and writers
//! through GraphQL at once:
//!
//! 1. **The surface**: write results carry a `readToken`; a `REPLICA` read
//!    and an index page read with `consistency: REPLICA` say in
//!    `extensions.servedBy` that the replica answered; `Query.datastores`
//!    shows the replica's lag; a malformed token is `BAD_USER_INPUT`.
//! 2. **Read-your-writes with a delayed replica** (`MASTER_DELAY` /
//!    `recovery_min_apply_delay` of one second): writers keep writing new
//!    versions of rows, readers read rows with the token of an earlier
//!    write of them. [`TOKENED_READS`] reads, none may return an older
//!    version than the token's write; the share the replica served is
//!    printed (and must not be zero, or nothing was tested).
//! 3. **The replica killed** (`kill -9`) under `REPLICA` reads: fewer than
//!    0.1% of the reads may fail; the time until reads were served by the
//!    master again is printed.
//! 4. **The master stopped** (`SIGSTOP`) under reads and writes: its breaker
//!    opens; reads go on from the replica and writes to its shards are
//!    buffered on `b`. Most requests after the breaker opened must be
//!    answered without waiting `timeout_ms` for the master.
//! 5. **The master killed** (`kill -9`) under reads and writes: reads go on
//!    from the replica, writes to its shards are `BUFFERED`; after the
//!    restart the buffers drain, and every acknowledged write reads back
//!    from the master with its body.
//!
//! Waits are bounded outcomes; the only time limit asserted is the
//! configured `timeout_ms` in step 4, which tells a request that waited for
//! the stopped master from one that did not.

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

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use private::PrivateServer;
use rand::Rng as _;
use replication::{MariaDbPair, Pair, PostgresPair};
use reqwest::StatusCode;
use serde_json::{json, Value};
use server::{client, Server};
use uuid::Uuid;

/// Reads with a write's token in step 2.
const TOKENED_READS: usize = 100_000;
/// Rows the writers rewrite; each has a version per write.
const ROWS: usize = 300;
/// The gateway's `storage.timeout_ms`.
const TIMEOUT_MS: u64 = 2000;
/// The longest wait for a convergence: generous, so only a store that
/// never gets there exceeds it.
const WAIT: Duration = Duration::from_secs(120);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replica_reads_and_breakers_hold_under_load_on_mariadb() {
    under_load::<MariaDbPair, mariadb::Mariadb>(
        "replica_reads_and_breakers_hold_under_load_on_mariadb",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replica_reads_and_breakers_hold_under_load_on_postgres() {
    under_load::<PostgresPair, postgres::Postgres>(
        "replica_reads_and_breakers_hold_under_load_on_postgres",
    )
    .await;
}

const DATASTORE: &str = "name: items\ncolumns:\n  - name: DATA\n";
const INDEX: &str = "table: by_group\ndatastore: items\nshard_field: group\ncolumn_defs:\n  - column_key: DATA\n    fields:\n      - { field: group, type: string }\n      - { field: v, type: int }\n";

/// Starts `cellgate serve` on clusters `a` (shards 0-2047, with the
/// replica) and `b` (2048-4095), one buffer copy per write, and no
/// admission limits (the load would meet the rate limit).
fn serve(master: &str, replica: &str, b: &str) -> Server {
    let config = format!(
        "storage:
  clusters:
    - name: a
      master: {master}
      replicas: [{replica}]
    - name: b
      master: {b}
  buffer_count: 1
  timeout_ms: {TIMEOUT_MS}
  readiness_timeout_ms: 1000
limits:
  rate_limit_per_second: 0
  max_concurrent_requests: 0
  max_connections_per_client: 0
"
    );
    Server::start_with(
        &[
            ("items/datastore.yaml", DATASTORE),
            ("items/indexes/by_group.yaml", INDEX),
        ],
        &config,
        &[],
    )
}

/// One GraphQL answer: its data, its error codes and the replicas that
/// served it.
#[derive(Debug, Default)]
struct Answer {
    data: Value,
    codes: Vec<String>,
    replicas: Vec<(String, bool)>,
}

impl Answer {
    fn by_replica(&self) -> bool {
        !self.replicas.is_empty()
    }
}

/// Posts a request; `Err` for anything but a 200 with a JSON body.
async fn post(http: &reqwest::Client, server: &str, body: Value) -> Result<Answer, String> {
    let response = http
        .post(server)
        .json(&body)
        .send()
        .await
        .map_err(|e| format!("no answer: {e}"))?;
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    if status != StatusCode::OK {
        return Err(format!("{status}: {text}"));
    }
    let answer: Value = serde_json::from_str(&text).map_err(|_| format!("not JSON: {text}"))?;
    let codes = answer["errors"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            e["extensions"]["code"]
                .as_str()
                .unwrap_or("none")
                .to_string()
        })
        .collect();
    let replicas = answer["extensions"]["servedBy"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            (
                s["node"].as_str().unwrap_or_default().to_string(),
                s["possiblyStale"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    Ok(Answer {
        data: answer["data"].clone(),
        codes,
        replicas,
    })
}

/// What a write of one version got: its status (or error code) and token.
#[derive(Debug, Clone)]
struct Ack {
    status: String,
    token: Option<String>,
}

fn body(row: usize, version: i64) -> Value {
    json!({ "group": format!("g{}", row % 16), "v": version, "row": row, "text": "x".repeat(200) })
}

async fn write(
    http: &reqwest::Client,
    url: &str,
    row: Uuid,
    n: usize,
    version: i64,
) -> Result<Ack, String> {
    let answer = post(
        http,
        url,
        json!({
            "query": "mutation($c: [ItemsCellInput!]!) { itemsPutCells(cells: $c) { status readToken error { code } } }",
            "variables": { "c": [{ "rowKey": row, "column": "DATA", "refKey": version, "body": body(n, version) }] },
        }),
    )
    .await?;
    let result = &answer.data["itemsPutCells"][0];
    if result.is_null() {
        return Err(format!("write failed: {:?}", answer.codes));
    }
    Ok(Ack {
        status: result["status"]
            .as_str()
            .map(String::from)
            .unwrap_or_else(|| result["error"]["code"].as_str().unwrap_or("?").to_string()),
        token: result["readToken"].as_str().map(String::from),
    })
}

/// The latest version of `row`'s DATA cell, as `args` allow, with its body.
async fn read(
    http: &reqwest::Client,
    url: &str,
    row: Uuid,
    args: &str,
) -> Result<(Option<(i64, Value)>, Answer), String> {
    let answer = post(
        http,
        url,
        json!({
            "query": format!("query($r: UUID!) {{ items {{ latestCell(rowKey: $r, column: DATA{args}) {{ refKey body }} }} }}"),
            "variables": { "r": row },
        }),
    )
    .await?;
    if !answer.codes.is_empty() {
        return Err(format!("read failed: {:?}", answer.codes));
    }
    let cell = &answer.data["items"]["latestCell"];
    let found = (!cell.is_null()).then(|| {
        let version = cell["refKey"]
            .as_str()
            .and_then(|v| v.parse().ok())
            .or_else(|| cell["refKey"].as_i64())
            .unwrap_or(-1);
        (version, cell["body"].clone())
    });
    Ok((found, answer))
}

/// The rows, their versions and every acknowledged write.
struct Rows {
    keys: Vec<Uuid>,
    /// Per row, the next version to write.
    next: Vec<Mutex<i64>>,
    /// Per row, acknowledged versions with their status and token.
    acked: Vec<Mutex<BTreeMap<i64, Ack>>>,
    /// Rows whose shard is on cluster `a` (the replicated one).
    on_a: Vec<usize>,
}

impl Rows {
    /// Writes the next version of row `n`; records it if acknowledged.
    /// The answer's status or error code.
    async fn write_next(&self, http: &reqwest::Client, url: &str, n: usize) -> Result<Ack, String> {
        let version = {
            let mut next = self.next[n].lock().unwrap();
            *next += 1;
            *next
        };
        match write(http, url, self.keys[n], n, version).await {
            Ok(ack) if ["WRITTEN", "DUPLICATE", "BUFFERED"].contains(&ack.status.as_str()) => {
                self.acked[n].lock().unwrap().insert(version, ack.clone());
                Ok(ack)
            }
            Ok(refused) => Err(refused.status),
            Err(failed) => Err(failed),
        }
    }
}

/// Writers that keep writing random rows until `stop`; counts of statuses.
fn writers(
    rows: &Arc<Rows>,
    url: &str,
    count: usize,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<HashMap<String, usize>>> {
    (0..count)
        .map(|_| {
            let (rows, url, stop) = (rows.clone(), url.to_string(), stop.clone());
            tokio::spawn(async move {
                let http = client();
                let mut statuses: HashMap<String, usize> = HashMap::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = rand::thread_rng().gen_range(0..rows.keys.len());
                    let status = match rows.write_next(&http, &url, n).await {
                        Ok(ack) => ack.status,
                        Err(code) => code,
                    };
                    *statuses.entry(status).or_default() += 1;
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                statuses
            })
        })
        .collect()
}

/// The writers' answers by status or error code. A write whose buffer
/// copy would go to the failing cluster is refused with
/// `STORAGE_UNAVAILABLE` (`buffer_shortfall: fail`); any other refusal
/// fails the test.
async fn statuses(
    handles: Vec<tokio::task::JoinHandle<HashMap<String, usize>>>,
) -> BTreeMap<String, usize> {
    let mut all = BTreeMap::new();
    for handle in handles {
        for (status, n) in handle.await.expect("writer") {
            *all.entry(status).or_default() += n;
        }
    }
    let clean = ["WRITTEN", "DUPLICATE", "BUFFERED", "STORAGE_UNAVAILABLE"];
    assert!(
        all.keys().all(|status| clean.contains(&status.as_str())),
        "writes answered other than {clean:?}: {all:?}"
    );
    all
}

/// One read of a load phase: when it started and ended (from the phase's
/// start), whether it succeeded, and whether a replica served it.
#[derive(Debug, Clone, Copy)]
struct Sample {
    started: Duration,
    took: Duration,
    ok: bool,
    by_replica: bool,
}

/// Readers of rows on cluster `a` with `args` until `stop`.
fn readers(
    rows: &Arc<Rows>,
    url: &str,
    args: &'static str,
    count: usize,
    origin: Instant,
    stop: &Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<Vec<Sample>>> {
    (0..count)
        .map(|_| {
            let (rows, url, stop) = (rows.clone(), url.to_string(), stop.clone());
            tokio::spawn(async move {
                let http = client();
                let mut samples = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let n = rows.on_a[rand::thread_rng().gen_range(0..rows.on_a.len())];
                    let started = Instant::now();
                    let result = read(&http, &url, rows.keys[n], args).await;
                    samples.push(Sample {
                        started: started - origin,
                        took: started.elapsed(),
                        ok: matches!(&result, Ok((Some(_), _))),
                        by_replica: result.as_ref().is_ok_and(|(_, a)| a.by_replica()),
                    });
                }
                samples
            })
        })
        .collect()
}

async fn samples(handles: Vec<tokio::task::JoinHandle<Vec<Sample>>>) -> Vec<Sample> {
    let mut all = Vec::new();
    for handle in handles {
        all.extend(handle.await.expect("reader"));
    }
    all.sort_by_key(|s| s.started);
    all
}

/// The state of cluster `a`'s master breaker and its replica's lag.
async fn cluster_a(http: &reqwest::Client, url: &str) -> Value {
    let answer = post(
        http,
        url,
        json!({ "query": "{ datastores { name clusters { name breakers { node state } replicas { node cellsBehind lagMs } } } }" }),
    )
    .await
    .expect("Query.datastores");
    answer.data["datastores"][0]["clusters"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "a")
        .cloned()
        .unwrap_or(Value::Null)
}

async fn wait_for(what: &str, mut check: impl AsyncFnMut() -> Result<(), String>) {
    let deadline = Instant::now() + WAIT;
    loop {
        match check().await {
            Ok(()) => return,
            Err(state) => assert!(Instant::now() < deadline, "{what}: {state}"),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn percentile(mut values: Vec<Duration>, p: f64) -> Duration {
    if values.is_empty() {
        return Duration::ZERO;
    }
    values.sort();
    values[((values.len() - 1) as f64 * p) as usize]
}

async fn under_load<P: Pair, O: PrivateServer>(test: &str) {
    let kind = P::KIND;
    let mut pair = match P::start().await {
        Ok(pair) => pair,
        Err(why) => return servers::skip(test, &why),
    };
    let mut b = match O::init() {
        Ok(b) => b,
        Err(why) => return servers::skip(test, &why),
    };
    b.start().await;
    let server = serve(&pair.master_url(), &pair.replica_url(), &b.url());
    server.wait_ready(StatusCode::OK, WAIT).await;
    let url = server.graphql();
    let http = client();

    // Rows, written once; those of cluster `a` are read in the load steps.
    let keys: Vec<Uuid> = (0..ROWS).map(|_| Uuid::new_v4()).collect();
    let rows = Arc::new(Rows {
        next: keys.iter().map(|_| Mutex::new(0)).collect(),
        acked: keys.iter().map(|_| Mutex::new(BTreeMap::new())).collect(),
        keys: keys.clone(),
        on_a: Vec::new(),
    });
    for n in 0..ROWS {
        let ack = rows.write_next(&http, &url, n).await.expect("first write");
        assert_eq!(ack.status, "WRITTEN");
        assert!(
            ack.token.as_deref().is_some_and(|t| t.starts_with("rt1.")),
            "a write result carries a read token: {ack:?}"
        );
    }
    let answer = post(
        &http,
        &url,
        json!({
            "query": "query($r: [UUID!]!) { items { rows(rowKeys: $r) { data { shard } } } }",
            "variables": { "r": keys },
        }),
    )
    .await
    .expect("read the rows' shards");
    let on_a: Vec<usize> = (0..ROWS)
        .filter(|n| answer.data["items"]["rows"][n]["data"]["shard"].as_u64() < Some(2048))
        .collect();
    assert!(on_a.len() > ROWS / 4, "rows on cluster a: {}", on_a.len());
    let rows = Arc::new(Rows {
        on_a,
        ..Arc::try_unwrap(rows).unwrap_or_else(|_| unreachable!())
    });

    // 1. The surface.
    pair.wait_replica_caught_up().await;
    wait_for("the replica's lag is measured and zero", async || {
        let a = cluster_a(&http, &url).await;
        match a["replicas"][0]["cellsBehind"].as_str() {
            Some("0") => Ok(()),
            _ => Err(a.to_string()),
        }
    })
    .await;
    let row = rows.keys[rows.on_a[0]];
    let (found, answer) = read(&http, &url, row, ", consistency: REPLICA")
        .await
        .expect("a REPLICA read");
    assert_eq!(found.map(|f| f.0), Some(1));
    assert_eq!(answer.replicas, vec![("a/replica0".to_string(), true)]);
    let (_, answer) = read(&http, &url, row, "").await.expect("a MASTER read");
    assert!(!answer.by_replica(), "MASTER reads stay on the master");
    let groups: Vec<String> = (0..16).map(|g| format!("g{g}")).collect();
    let index = post(
        &http,
        &url,
        json!({
            "query": "query($g: [String!]) { items { byGroup(groupIn: $g, first: 50, consistency: REPLICA) { edges { node { rowKey v row { data { refKey } } } } } } }",
            "variables": { "g": groups },
        }),
    )
    .await
    .expect("an index page from the replica");
    assert!(index.codes.is_empty(), "{:?}", index.codes);
    assert!(
        index.replicas.iter().any(|(node, _)| node == "a/replica0"),
        "the replica served part of the index page: {:?}",
        index.replicas
    );
    let bad = read(&http, &url, row, ", readAfter: \"nonsense\"").await;
    assert!(
        bad.as_ref().is_err_and(|e| e.contains("BAD_USER_INPUT")),
        "{bad:?}"
    );

    // 2. Read-your-writes with a delayed replica.
    pair.set_replica_delay(1).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writing = writers(&rows, &url, 2, &stop);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let done = Arc::new(AtomicUsize::new(0));
    let stale = Arc::new(Mutex::new(Vec::new()));
    let (by_replica, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let started = Instant::now();
    let tokened: Vec<_> = (0..12)
        .map(|_| {
            let (rows, url, done) = (rows.clone(), url.clone(), done.clone());
            let (stale, by_replica, failed) = (stale.clone(), by_replica.clone(), failed.clone());
            tokio::spawn(async move {
                let http = client();
                while done.fetch_add(1, Ordering::Relaxed) < TOKENED_READS {
                    let n = rows.on_a[rand::thread_rng().gen_range(0..rows.on_a.len())];
                    let Some((version, token)) = rows.acked[n]
                        .lock()
                        .unwrap()
                        .iter()
                        .next_back()
                        .and_then(|(v, ack)| Some((*v, ack.token.clone()?)))
                    else {
                        continue;
                    };
                    let args = format!(", readAfter: \"{token}\"");
                    match read(&http, &url, rows.keys[n], &args).await {
                        Ok((found, answer)) => {
                            if found.as_ref().map(|f| f.0) < Some(version) {
                                stale.lock().unwrap().push((n, version, found));
                            }
                            if answer.by_replica() {
                                by_replica.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            if failed.fetch_add(1, Ordering::Relaxed) < 3 {
                                eprintln!("a tokened read failed: {e}");
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for reader in tokened {
        reader.await.expect("tokened reader");
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let written = statuses(writing).await;
    let (served, failed) = (
        by_replica.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    let stale = stale.lock().unwrap().clone();
    eprintln!(
        "{kind}: replica delayed 1 s, writes {written:?}: {TOKENED_READS} reads with the token of \
         their row's latest write in {elapsed:?}: {} stale, {failed} failed, {served} ({:.1}%) served by the replica",
        stale.len(),
        served as f64 * 100.0 / TOKENED_READS as f64
    );
    assert!(
        stale.is_empty(),
        "stale tokened reads: {:?}",
        &stale[..stale.len().min(5)]
    );
    assert_eq!(failed, 0, "tokened reads failed");
    assert!(
        served > 0,
        "no tokened read reached the replica: nothing was tested"
    );
    pair.set_replica_delay(0).await;
    pair.wait_replica_caught_up().await;

    // 3. The replica killed under REPLICA reads.
    let stop = Arc::new(AtomicBool::new(false));
    let origin = Instant::now();
    let reading = readers(&rows, &url, ", consistency: REPLICA", 8, origin, &stop);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let killed_at = origin.elapsed();
    pair.kill_replica();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    let all = samples(reading).await;
    let failed = all.iter().filter(|s| !s.ok).count();
    let after: Vec<&Sample> = all.iter().filter(|s| s.started >= killed_at).collect();
    let rerouted = after
        .iter()
        .find(|s| s.ok && !s.by_replica)
        .map(|s| s.started + s.took - killed_at);
    let slowest = after.iter().map(|s| s.took).max().unwrap_or_default();
    eprintln!(
        "{kind}: replica killed under REPLICA reads: {} reads, {failed} failed; first read served by the master \
         {rerouted:?} after the kill; slowest read after it {slowest:?}; {} of {} before it by the replica",
        all.len(),
        all.iter().filter(|s| s.started < killed_at && s.by_replica).count(),
        all.iter().filter(|s| s.started < killed_at).count(),
    );
    assert!(
        failed * 1000 < all.len(),
        "{failed} of {} reads failed",
        all.len()
    );
    assert!(
        rerouted.is_some(),
        "reads were not served by the master after the kill"
    );
    pair.restart_replica().await;
    pair.wait_replica_caught_up().await;
    wait_for("the replica's breaker closes", async || {
        let a = cluster_a(&http, &url).await;
        let open = a["breakers"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|b| b["state"] != "closed");
        if open {
            Err(a.to_string())
        } else {
            Ok(())
        }
    })
    .await;

    // 4. The master stopped under reads and writes.
    let stop = Arc::new(AtomicBool::new(false));
    let origin = Instant::now();
    let reading = readers(&rows, &url, "", 8, origin, &stop);
    let writing = writers(&rows, &url, 2, &stop);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let stopped_at = origin.elapsed();
    pair.stop_master_answering();
    let mut opened_at = None;
    let deadline = Instant::now() + Duration::from_secs(30);
    while opened_at.is_none() {
        let a = cluster_a(&http, &url).await;
        if a["breakers"][0]["state"] == "open" {
            opened_at = Some(origin.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "the stopped master's breaker opens: {a}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let opened_at = opened_at.unwrap_or_default();
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, Ordering::Relaxed);
    let all = samples(reading).await;
    let written = statuses(writing).await;
    pair.resume_master();
    let failed = all
        .iter()
        .filter(|s| !s.ok && s.started >= stopped_at)
        .count();
    let after_open: Vec<&Sample> = all.iter().filter(|s| s.started >= opened_at).collect();
    let waited = after_open
        .iter()
        .filter(|s| s.took >= Duration::from_millis(TIMEOUT_MS))
        .count();
    let took: Vec<Duration> = after_open.iter().map(|s| s.took).collect();
    eprintln!(
        "{kind}: master stopped: breaker open {:?} after SIGSTOP; writes {written:?}; {} reads after it opened: \
         {} by the replica, {waited} waited {TIMEOUT_MS} ms or more, p50 {:?}, p99 {:?}; {failed} reads failed while stopped",
        opened_at - stopped_at,
        after_open.len(),
        after_open.iter().filter(|s| s.by_replica).count(),
        percentile(took.clone(), 0.5),
        percentile(took, 0.99),
    );
    assert!(!after_open.is_empty(), "no read after the breaker opened");
    assert!(
        waited * 10 < after_open.len(),
        "{waited} of {} reads after the breaker opened waited for the stopped master",
        after_open.len()
    );
    assert!(
        after_open.iter().filter(|s| s.ok).all(|s| s.by_replica),
        "a read after the breaker opened was served by the stopped master"
    );
    assert!(
        written.contains_key("BUFFERED"),
        "no write was buffered: {written:?}"
    );
    wait_for("the master's breaker closes after SIGCONT", async || {
        let a = cluster_a(&http, &url).await;
        if a["breakers"][0]["state"] == "closed" {
            Ok(())
        } else {
            Err(a.to_string())
        }
    })
    .await;

    // 5. The master killed under reads and writes, then restarted.
    let stop = Arc::new(AtomicBool::new(false));
    let origin = Instant::now();
    let reading = readers(&rows, &url, "", 8, origin, &stop);
    let writing = writers(&rows, &url, 2, &stop);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed_at = origin.elapsed();
    pair.kill_master();
    tokio::time::sleep(Duration::from_secs(4)).await;
    stop.store(true, Ordering::Relaxed);
    let all = samples(reading).await;
    let written = statuses(writing).await;
    let after: Vec<&Sample> = all.iter().filter(|s| s.started >= killed_at).collect();
    let failed = after.iter().filter(|s| !s.ok).count();
    let first = after
        .iter()
        .find(|s| s.ok && s.by_replica)
        .map(|s| s.started + s.took - killed_at);
    eprintln!(
        "{kind}: master killed: writes {written:?}; {} reads after the kill, {failed} failed, {} by the replica; \
         first read served by the replica {first:?} after the kill",
        after.len(),
        after.iter().filter(|s| s.by_replica).count(),
    );
    assert!(
        failed * 1000 < after.len().max(1),
        "{failed} of {} reads failed",
        after.len()
    );
    assert!(
        written.contains_key("BUFFERED"),
        "no write was buffered: {written:?}"
    );
    let restarted = Instant::now();
    pair.restart_master().await;
    wait_for("the buffers drain", async || {
        let answer = post(
            &http,
            &url,
            json!({ "query": "{ items { buffer { clusters { cluster cells } } } }" }),
        )
        .await?;
        let waiting: i64 = answer.data["items"]["buffer"]["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["cells"].as_str()?.parse::<i64>().ok())
            .sum();
        if waiting == 0 && answer.codes.is_empty() {
            Ok(())
        } else {
            Err(answer.data.to_string())
        }
    })
    .await;
    eprintln!(
        "{kind}: buffers drained {:?} after the master restart began",
        restarted.elapsed()
    );

    // Every acknowledged write reads back from the master.
    wait_for("every acknowledged write reads back", async || {
        let mut missing = Vec::new();
        for n in 0..ROWS {
            let acked = rows.acked[n].lock().unwrap().clone();
            let Some((&version, _)) = acked.iter().next_back() else {
                continue;
            };
            match read(&http, &url, rows.keys[n], "").await?.0 {
                Some((v, body_read)) if v >= version => {
                    assert_eq!(body_read, body(n, v), "row {n} version {v}");
                }
                other => missing.push((n, version, other.map(|f| f.0))),
            }
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("acknowledged writes missing: {missing:?}"))
        }
    })
    .await;
    drop(server);
}
