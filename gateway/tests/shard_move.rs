//! `cellgate shard move` end to end, with real processes: two
//! `cellgate serve` on three storage clusters (`a` holds shards 0–2047 of
//! `trips`, `b` 2048–4095, `c` none), a client writing cells through both
//! and reading each one back through the other at once, and the move of
//! shards 0–1023 to `c` as a child process, killed with SIGKILL after a
//! random delay several times (`cellgate shard status` must show the move
//! recorded after each kill) and run again until it finishes. The client
//! also looks up, through the other gateway, the `driver_partner_index`
//! entries of rows written before the move whose entries lie in the moved
//! range: the move carries them to `c`, and none may go missing meanwhile.
//!
//! Afterwards no client request failed, every acknowledged cell reads back
//! through both gateways, and every looked-up entry is listed by both,
//! `cellgate shard status` shows the range on `c` and no move in progress,
//! `a` keeps no cell of the range and the three clusters together hold
//! each acknowledged cell once, and `cellgate index verify` finds the
//! indexes clean.
//!
//! It runs on SQLite (three database files the processes share), and on
//! MariaDB/MySQL and PostgreSQL with three fresh databases on the server
//! `CELLGATE_TEST_MYSQL_URL` / `CELLGATE_TEST_POSTGRES_URL` names, dropped
//! afterwards, also when the test fails. Without the variable the test
//! says it is skipped, or fails with `CELLGATE_TEST_SERVERS=required`.
//!
//! A write to a fenced range waits for the cut-over at most 10 s, then
//! fails with `SHARD_MOVING`; each kill in the fence or switch prolongs
//! that wait by the kill delay and a restart. So that the test's own kills
//! cannot hold the range fenced that long, a run resuming a move that a
//! kill left fenced starts its kill delay once the move is past the
//! switch; and the first run starts it once the move is recorded.
//!
//! The kill delays and the rows written come from a seeded generator: the
//! seed is printed, and `CELLGATE_SHARD_MOVE_SEED` runs with it again
//! (where the kills land still depends on the processes' timing). When
//! the test fails, the gateways' stderr and the mover runs' output are
//! printed.

#[path = "support/server.rs"]
mod server;
#[path = "support/servers.rs"]
mod servers;

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cellgate_store::shards::row_shard;
use futures::FutureExt as _;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{json, Value};
use server::{cellgate, client, root, Server};
use sqlx::Connection as _;
use uuid::Uuid;

/// The shards of `trips` (the default count).
const SHARDS: u32 = 4096;
/// The moved range, as the command line spells it.
const MOVED: &str = "0-1023";
const MOVED_LAST: u32 = 1023;
/// How many times the mover is killed before it may finish.
const KILLS: usize = 5;
/// Kill delays, in milliseconds.
const KILL_DELAY_MS: std::ops::RangeInclusive<u64> = 200..=1500;
/// Cells written before the move, so that its copy has work.
const PRELOAD: usize = 3000;
/// Cells per client write.
const BATCH: usize = 3;
/// Row keys per read of the final check.
const READ_CHUNK: usize = 200;
/// Probes the client looks up in the index after each write.
const PROBES_PER_LOOKUP: usize = 8;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    Sqlite,
    Mariadb,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Mariadb => "MariaDB",
            Backend::Postgres => "PostgreSQL",
        }
    }

    fn variable(self) -> Option<&'static str> {
        match self {
            Backend::Sqlite => None,
            Backend::Mariadb => Some("CELLGATE_TEST_MYSQL_URL"),
            Backend::Postgres => Some("CELLGATE_TEST_POSTGRES_URL"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_move_resumes_under_load_on_sqlite() {
    run(Backend::Sqlite).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_move_resumes_under_load_on_mariadb() {
    run(Backend::Mariadb).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_move_resumes_under_load_on_postgres() {
    run(Backend::Postgres).await;
}

/// Runs the scenario on `backend`'s three databases, prints the logs of
/// its processes if it fails, and drops the databases it created.
async fn run(backend: Backend) {
    let dir = tempfile::tempdir().expect("temp dir");
    let Some(clusters) = Clusters::create(backend, dir.path()).await else {
        return;
    };
    let seed = std::env::var("CELLGATE_SHARD_MOVE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock after 1970")
                .as_nanos() as u64
        });
    eprintln!(
        "shard move on {}: CELLGATE_SHARD_MOVE_SEED={seed}",
        backend.name()
    );
    let outcome = AssertUnwindSafe(scenario(&clusters, dir.path(), seed))
        .catch_unwind()
        .await;
    if outcome.is_err() {
        print_logs(dir.path());
        eprintln!(
            "shard move on {} failed with CELLGATE_SHARD_MOVE_SEED={seed}",
            backend.name()
        );
    }
    clusters.drop_databases().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// The databases of clusters `a`, `b` and `c`.
struct Clusters {
    backend: Backend,
    urls: Vec<String>,
    /// The server's URL and the databases to drop when the test ends.
    created: Option<(String, Vec<String>)>,
}

impl Clusters {
    /// Three SQLite files in `dir`, or three new databases on the server
    /// of `backend`'s variable; `None` (after saying why) without it.
    async fn create(backend: Backend, dir: &Path) -> Option<Clusters> {
        let Some(variable) = backend.variable() else {
            let urls = ["a", "b", "c"]
                .iter()
                .map(|c| format!("sqlite://{}", dir.join(format!("{c}.db")).display()))
                .collect();
            return Some(Clusters {
                backend,
                urls,
                created: None,
            });
        };
        let Ok(base) = std::env::var(variable) else {
            servers::skip(
                &format!("the shard move on {}", backend.name()),
                &format!("{variable} is not set"),
            );
            return None;
        };
        let tag = &Uuid::new_v4().simple().to_string()[..8];
        let names: Vec<String> = ["a", "b", "c"]
            .iter()
            .map(|c| format!("cg_move_{tag}_{c}"))
            .collect();
        for name in &names {
            admin(backend, &base, &format!("CREATE DATABASE {name}")).await;
        }
        let urls = names.iter().map(|n| with_database(&base, n)).collect();
        Some(Clusters {
            backend,
            urls,
            created: Some((base, names)),
        })
    }

    async fn drop_databases(&self) {
        let Some((base, names)) = &self.created else {
            return;
        };
        let force = if self.backend == Backend::Postgres {
            " WITH (FORCE)"
        } else {
            ""
        };
        for name in names {
            admin(
                self.backend,
                base,
                &format!("DROP DATABASE IF EXISTS {name}{force}"),
            )
            .await;
        }
    }

    /// The one integer `sql` selects on cluster `cluster` (0 is `a`).
    async fn scalar(&self, cluster: usize, sql: &str) -> i64 {
        let url = &self.urls[cluster];
        let failed = |e: sqlx::Error| -> i64 { panic!("{sql} on {url}: {e}") };
        match self.backend {
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("open {url}: {e}"));
                sqlx::query_scalar(sql)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap_or_else(failed)
            }
            Backend::Mariadb => {
                let mut conn = sqlx::MySqlConnection::connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
                sqlx::query_scalar(sql)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap_or_else(failed)
            }
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(url)
                    .await
                    .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
                sqlx::query_scalar(sql)
                    .fetch_one(&mut conn)
                    .await
                    .unwrap_or_else(failed)
            }
        }
    }

    /// The phase of the move the stored topology of `trips` records, if
    /// any (read from the metadata cluster `a`, as the mover writes it).
    async fn stored_phase(&self) -> Option<String> {
        let sql = "SELECT moving FROM cellgate_topology WHERE datastore = 'trips'";
        let url = &self.urls[0];
        let moving: String = match self.backend {
            Backend::Sqlite => {
                let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
                sqlx::query_scalar(sql).fetch_one(&mut conn).await
            }
            // A binary column there.
            Backend::Mariadb => {
                let mut conn = sqlx::MySqlConnection::connect(url).await.unwrap();
                sqlx::query_scalar::<_, Vec<u8>>(sql)
                    .fetch_one(&mut conn)
                    .await
                    .map(|b| String::from_utf8(b).expect("UTF-8 move record"))
            }
            Backend::Postgres => {
                let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::query_scalar(sql).fetch_one(&mut conn).await
            }
        }
        .unwrap_or_else(|e| panic!("{sql} on {url}: {e}"));
        if moving.is_empty() {
            return None;
        }
        let record: Value = serde_json::from_str(&moving)
            .unwrap_or_else(|e| panic!("the stored move is not JSON ({e}): {moving}"));
        Some(record["phase"].as_str().unwrap_or_default().to_string())
    }
}

/// Runs one administrative statement on a database server.
async fn admin(backend: Backend, base: &str, sql: &str) {
    let variable = backend.variable().expect("a server backend");
    match backend {
        Backend::Mariadb => {
            let mut conn = sqlx::MySqlConnection::connect(base)
                .await
                .unwrap_or_else(|e| panic!("cannot reach MariaDB at {variable}: {e}"));
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(base)
                .await
                .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {variable}: {e}"));
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        Backend::Sqlite => unreachable!("SQLite has no server"),
    }
}

/// `url` with its database replaced by `name` (its query kept).
fn with_database(url: &str, name: &str) -> String {
    let (scheme, tail) = url.split_once("://").expect("the URL has a scheme");
    let (authority, rest) = tail.split_once('/').unwrap_or((tail, ""));
    let query = rest
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    format!("{scheme}://{authority}/{name}{query}")
}

/// `cellgate.yaml`: three clusters, `trips` on `a` and `b`; small pools
/// (one client needs few connections, and the test may share its database
/// server with other tests: each process opens up to 6 per database), and
/// the admission limits off, so that only the move can slow a request down.
fn config(urls: &[String]) -> String {
    format!(
        "storage:
  max_connections: 4
  maintenance_connections: 2
  clusters:
    - {{ name: a, master: \"{}\" }}
    - {{ name: b, master: \"{}\" }}
    - {{ name: c, master: \"{}\" }}
  shards:
    trips:
      - {{ first: 0, last: 2047, cluster: a }}
      - {{ first: 2048, last: 4095, cluster: b }}
limits:
  rate_limit_per_second: 0
  max_concurrent_requests: 0
  max_connections_per_client: 0
",
        urls[0], urls[1], urls[2]
    )
}

/// Where one run's processes find their configuration and write their
/// logs.
struct Ctx {
    dir: PathBuf,
    config: PathBuf,
}

impl Ctx {
    /// `cellgate serve` on the configuration, with its stderr in
    /// `<dir>/<name>…/stderr.log`, kept until the test's directory goes.
    fn gateway(&self, name: &str) -> Server {
        let mut run = tempfile::Builder::new()
            .prefix(name)
            .tempdir_in(&self.dir)
            .expect("gateway dir");
        run.disable_cleanup(true);
        let args: Vec<OsString> = vec![
            "--data".into(),
            run.path().join("data").into(),
            "--datastores".into(),
            root().join("datastores").into(),
            "--config".into(),
            self.config.clone().into(),
        ];
        Server::start_in(run, args)
    }

    /// `cellgate ARGS` on the configuration.
    fn cli(&self, args: &[&str]) -> Command {
        let mut command = cellgate(&self.dir);
        command
            .args(args)
            .arg("--config")
            .arg(&self.config)
            .arg("--datastores")
            .arg(root().join("datastores"));
        command
    }

    /// The `n`th run of the mover, its stdout and stderr in
    /// `<dir>/mover-<n>.log`.
    fn mover(&self, n: usize) -> Child {
        let log = std::fs::File::create(self.mover_log(n)).expect("mover log");
        self.cli(&[
            "shard",
            "move",
            "--datastore",
            "trips",
            "--shards",
            MOVED,
            "--to",
            "c",
        ])
        .stdout(log.try_clone().expect("mover log"))
        .stderr(log)
        .spawn()
        .expect("start cellgate shard move")
    }

    fn mover_log(&self, n: usize) -> PathBuf {
        self.dir.join(format!("mover-{n}.log"))
    }

    fn mover_output(&self, n: usize) -> String {
        std::fs::read_to_string(self.mover_log(n)).unwrap_or_default()
    }

    /// What `cellgate shard status --datastore trips` prints; it must
    /// succeed.
    fn shard_status(&self) -> String {
        let output = self
            .cli(&["shard", "status", "--datastore", "trips"])
            .output()
            .expect("run cellgate shard status");
        assert!(output.status.success(), "{}", text(&output));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

fn text(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Prints the end of every log under `dir`: the gateways' stderr and the
/// mover runs' output.
fn print_logs(dir: &Path) {
    let mut logs: Vec<PathBuf> = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            logs.push(path.join("stderr.log"));
        } else if path.extension().is_some_and(|e| e == "log") {
            logs.push(path);
        }
    }
    logs.sort();
    for log in logs {
        let Ok(text) = std::fs::read_to_string(&log) else {
            continue;
        };
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(200)..];
        eprintln!(
            "----- {} (last {} of {} lines)\n{}",
            log.display(),
            tail.len(),
            lines.len(),
            tail.join("\n")
        );
    }
}

/// A `trips` BASE body: indexed by driver and by city.
fn body(rng: &mut StdRng, n: u64) -> Value {
    let city = Uuid::from_u128(u128::from(rng.gen_range(1u8..=20)));
    json!({
        "driver_partner_uuid": random_uuid(rng).to_string(),
        "city_uuid": city.to_string(),
        "trip_created_at": "2026-11-24T10:00:00Z",
        "fare": {"total": n as f64 + 0.5, "currency": "EUR"},
        "status": "completed",
        "n": n,
    })
}

fn random_uuid(rng: &mut StdRng) -> Uuid {
    uuid::Builder::from_random_bytes(rng.gen()).into_uuid()
}

/// Writes `cells` through the gateway at `base`; the rows it answered
/// `WRITTEN`, and a line per cell or request that failed.
async fn put(
    http: &reqwest::Client,
    base: &str,
    cells: &[(Uuid, Value)],
) -> (Vec<Uuid>, Vec<String>) {
    let input: Vec<Value> = cells
        .iter()
        .map(|(row, body)| json!({"rowKey": row, "column": "BASE", "refKey": "1", "body": body}))
        .collect();
    let request = json!({
        "query": "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { rowKey status error { code message } } }",
        "variables": {"cells": input},
    });
    let answer = match post(http, base, &request).await {
        Ok(answer) => answer,
        Err(err) => return (Vec::new(), vec![format!("write through {base}: {err}")]),
    };
    let mut failures = Vec::new();
    if let Some(errors) = answer.get("errors") {
        failures.push(format!("write through {base}: errors {errors}"));
    }
    let results = answer["data"]["tripsPutCells"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let mut written = Vec::new();
    for (row, _) in cells {
        match results.iter().find(|r| r["rowKey"] == row.to_string()) {
            Some(r) if r["status"] == "WRITTEN" => written.push(*row),
            other => failures.push(format!("write of {row} through {base}: {other:?}")),
        }
    }
    (written, failures)
}

/// The latest BASE body of each of `rows`, read through the gateway at
/// `base` (`None` where it has none).
async fn read(
    http: &reqwest::Client,
    base: &str,
    rows: &[Uuid],
) -> Result<BTreeMap<Uuid, Option<Value>>, String> {
    let request = json!({
        "query": "query($rows: [UUID!]!) { trips { rows(rowKeys: $rows) { rowKey base { body } } } }",
        "variables": {"rows": rows},
    });
    let answer = post(http, base, &request).await?;
    if let Some(errors) = answer.get("errors") {
        return Err(format!("errors {errors}"));
    }
    let found = answer["data"]["trips"]["rows"]
        .as_array()
        .ok_or_else(|| format!("no rows in {answer}"))?;
    found
        .iter()
        .map(|r| {
            let row: Uuid = r["rowKey"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("a row without its key: {r}"))?;
            let body = r["base"].get("body").cloned();
            Ok((row, body))
        })
        .collect()
}

/// The rows `driver_partner_index` lists for `drivers` (at most 64),
/// read through the gateway at `base`.
async fn indexed(
    http: &reqwest::Client,
    base: &str,
    drivers: &[Uuid],
) -> Result<BTreeSet<Uuid>, String> {
    let request = json!({
        "query": "query($drivers: [UUID!]!) { trips { driverPartnerIndex(driverPartnerUuidIn: $drivers, first: 1000) { edges { node { rowKey } } } } }",
        "variables": {"drivers": drivers},
    });
    let answer = post(http, base, &request).await?;
    if let Some(errors) = answer.get("errors") {
        return Err(format!("errors {errors}"));
    }
    answer["data"]["trips"]["driverPartnerIndex"]["edges"]
        .as_array()
        .ok_or_else(|| format!("no edges in {answer}"))?
        .iter()
        .map(|e| {
            e["node"]["rowKey"]
                .as_str()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("an entry without its row: {e}"))
        })
        .collect()
}

/// The probes (see [`Probe`]) whose entries the gateway at `base` does
/// not list, with the reason when the read failed.
async fn unlisted(
    http: &reqwest::Client,
    base: &str,
    probes: &[Probe],
) -> Result<Vec<Probe>, String> {
    let mut missing = Vec::new();
    for chunk in probes.chunks(64) {
        let drivers: Vec<Uuid> = chunk.iter().map(|p| p.driver).collect();
        let listed = indexed(http, base, &drivers).await?;
        missing.extend(chunk.iter().filter(|p| !listed.contains(&p.row)).copied());
    }
    Ok(missing)
}

async fn post(http: &reqwest::Client, base: &str, request: &Value) -> Result<Value, String> {
    let response = http
        .post(format!("{base}/graphql"))
        .json(request)
        .send()
        .await
        .map_err(|e| format!("request failed: {e}"))?;
    let status = response.status();
    let text = response
        .text()
        .await
        .map_err(|e| format!("reading the answer failed: {e}"))?;
    if !status.is_success() {
        return Err(format!("status {status}: {text}"));
    }
    serde_json::from_str(&text).map_err(|e| format!("answer is not JSON ({e}): {text}"))
}

/// A row written before the move whose `driver_partner_index` entry lies
/// in the moved range (the index's shard field is the driver): the client
/// looks its entry up during the move, when it must never be missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Probe {
    row: Uuid,
    driver: Uuid,
}

/// What the client was told, and what went wrong.
#[derive(Default)]
struct Acknowledged {
    /// Every row answered `WRITTEN`, with its body.
    cells: BTreeMap<Uuid, Value>,
    /// Writes and reads that failed, and reads that missed a cell.
    failures: Vec<String>,
    /// Writes the client made (not counting the preload).
    writes: u64,
    /// Index lookups of probes the client made.
    lookups: u64,
    /// The longest a client write took.
    slowest: Duration,
}

/// Writes batches of new rows through the two gateways in turn, reads
/// each acknowledged one back through the other gateway at once, and looks
/// a few probes up in the index there, until `stop`.
async fn clients(
    gateways: [String; 2],
    probes: Arc<Vec<Probe>>,
    seed: u64,
    stop: Arc<AtomicBool>,
    acked: Arc<Mutex<Acknowledged>>,
) {
    let http = client();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let turn = (n % 2) as usize;
        let (writer, reader) = (&gateways[turn], &gateways[1 - turn]);
        let cells: Vec<(Uuid, Value)> = (0..BATCH)
            .map(|_| (random_uuid(&mut rng), body(&mut rng, n)))
            .collect();
        let started = Instant::now();
        let (written, mut failures) = put(&http, writer, &cells).await;
        let took = started.elapsed();
        if !written.is_empty() {
            match read(&http, reader, &written).await {
                Ok(found) => {
                    for (row, body) in &cells {
                        if !written.contains(row) {
                            continue;
                        }
                        match found.get(row) {
                            Some(Some(read)) if read == body => {}
                            other => failures.push(format!(
                                "read of {row} (shard {}) through {reader} right after its write through {writer}: {other:?}",
                                row_shard(row, SHARDS)
                            )),
                        }
                    }
                }
                Err(err) => failures.push(format!("read through {reader}: {err}")),
            }
        }
        let picked: Vec<Probe> = (0..PROBES_PER_LOOKUP)
            .map(|_| probes[rng.gen_range(0..probes.len())])
            .collect();
        match unlisted(&http, reader, &picked).await {
            Ok(missing) => failures.extend(missing.iter().map(|p| {
                format!(
                    "the index entry of {} (driver {}, entry shard {}) through {reader}: missing",
                    p.row,
                    p.driver,
                    row_shard(&p.driver, SHARDS)
                )
            })),
            Err(err) => failures.push(format!("index lookup through {reader}: {err}")),
        }
        {
            let mut acked = acked.lock().expect("acknowledged cells");
            acked.writes += 1;
            acked.lookups += 1;
            acked.slowest = acked.slowest.max(took);
            acked.failures.extend(failures);
            for (row, body) in cells {
                if written.contains(&row) {
                    acked.cells.insert(row, body);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(rng.gen_range(1..=5))).await;
    }
}

/// What a run of the mover must reach before its kill delay starts.
#[derive(Debug, Clone, Copy)]
enum Gate {
    /// The move is recorded in the stored topology.
    Recorded,
    /// The move is past its fence and switch: writes to the range go on.
    PastCutOver,
}

impl Gate {
    /// Polls the stored topology until the gate is reached; the exit
    /// status instead if the mover exits first.
    async fn wait(self, clusters: &Clusters, mover: &mut Child) -> Option<ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let phase = clusters.stored_phase().await;
            let reached = match self {
                Gate::Recorded => phase.is_some(),
                Gate::PastCutOver => !matches!(phase.as_deref(), Some("fence" | "switch")),
            };
            if reached {
                return None;
            }
            if let Some(status) = mover.try_wait().expect("wait for the mover") {
                return Some(status);
            }
            assert!(
                Instant::now() < deadline,
                "the mover did not reach {self:?} within 60 s (phase {phase:?})"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Waits up to `within` for `child` to exit.
async fn exit_within(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait for the mover") {
            return Some(status);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The phase `cellgate shard status` shows the move of the range at.
fn recorded_phase(status: &str) -> Option<String> {
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(&format!("moving shards {MOVED} from a to c: phase "))?;
        Some(rest.split([',', ' ']).next().unwrap_or(rest).to_string())
    })
}

/// The range lives on `c`, and no move is recorded.
fn moved(status: &str) -> bool {
    status.contains(&format!("  shards {MOVED} on c\n"))
        && status.contains("  shards 1024-2047 on a\n")
        && status.contains("  shards 2048-4095 on b\n")
        && status.contains("no move in progress")
}

async fn scenario(clusters: &Clusters, dir: &Path, seed: u64) {
    let started = Instant::now();
    let config = dir.join("cellgate.yaml");
    std::fs::write(&config, self::config(&clusters.urls)).expect("cellgate.yaml");
    let ctx = Ctx {
        dir: dir.to_path_buf(),
        config,
    };
    let gateways = [ctx.gateway("gateway-0-"), ctx.gateway("gateway-1-")];
    let bases = [gateways[0].base.clone(), gateways[1].base.clone()];
    let mut rng = StdRng::seed_from_u64(seed);

    // Cells before the move, so that its copy has work.
    let acked = Arc::new(Mutex::new(Acknowledged::default()));
    let http = client();
    let mut probes = Vec::new();
    for chunk in 0..PRELOAD / 100 {
        let cells: Vec<(Uuid, Value)> = (0..100)
            .map(|_| (random_uuid(&mut rng), body(&mut rng, chunk as u64)))
            .collect();
        let (written, failures) = put(&http, &bases[chunk % 2], &cells).await;
        assert!(failures.is_empty(), "{failures:#?}");
        let mut acked = acked.lock().unwrap();
        for (row, body) in cells {
            assert!(written.contains(&row));
            let driver: Uuid = body["driver_partner_uuid"]
                .as_str()
                .unwrap()
                .parse()
                .unwrap();
            if row_shard(&driver, SHARDS) <= MOVED_LAST {
                probes.push(Probe { row, driver });
            }
            acked.cells.insert(row, body);
        }
    }
    // The gateways' index maintenance catches up with the preload.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let missing = unlisted(&http, &bases[0], &probes).await.unwrap();
        if missing.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} preloaded rows are not indexed after 60 s, e.g. {:?}",
            missing.len(),
            missing[0]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let probes = Arc::new(probes);
    let status = ctx.shard_status();
    assert!(status.contains("  shards 0-2047 on a\n"), "{status}");
    assert!(status.contains("no move in progress"), "{status}");
    eprintln!(
        "preloaded {PRELOAD} cells in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let load = tokio::spawn(clients(
        bases.clone(),
        probes.clone(),
        rng.gen(),
        stop.clone(),
        acked.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The mover, killed after a random delay, then run again; the first
    // delay counts from the moment the move is recorded, the others from
    // the start of the run.
    let moving = Instant::now();
    let mut kills: Vec<String> = Vec::new();
    let mut runs = 0;
    // The last kill left the range fenced.
    let mut fenced = false;
    loop {
        runs += 1;
        let run_started = Instant::now();
        let mut mover = ctx.mover(runs);
        if kills.len() == KILLS {
            let status = match exit_within(&mut mover, Duration::from_secs(120)).await {
                Some(status) => status,
                None => {
                    let _ = mover.kill();
                    let _ = mover.wait();
                    panic!("the last run of the mover did not finish within 120 s");
                }
            };
            assert!(
                status.success(),
                "the last run of the mover failed ({status}):\n{}",
                ctx.mover_output(runs)
            );
            eprintln!(
                "run {runs} finished the move in {:.1} s:\n{}",
                run_started.elapsed().as_secs_f64(),
                ctx.mover_output(runs).trim_end()
            );
            break;
        }
        // The first run is killed once it has recorded the move; one that
        // resumes a fenced move, once it is past the cut-over (see the
        // module doc).
        let gate = match (runs, fenced) {
            (1, _) => Some(Gate::Recorded),
            (_, true) => Some(Gate::PastCutOver),
            _ => None,
        };
        let delay = Duration::from_millis(rng.gen_range(KILL_DELAY_MS));
        let exited = match gate {
            Some(gate) => gate.wait(clusters, &mut mover).await,
            None => None,
        };
        let exited = match exited {
            Some(status) => Some(status),
            None => exit_within(&mut mover, delay).await,
        };
        if let Some(status) = exited {
            assert!(
                status.success(),
                "run {runs} of the mover failed ({status}):\n{}",
                ctx.mover_output(runs)
            );
            eprintln!(
                "run {runs} finished the move before its kill after {delay:?}:\n{}",
                ctx.mover_output(runs).trim_end()
            );
            break;
        }
        mover.kill().expect("SIGKILL the mover");
        mover.wait().expect("reap the mover");
        let status = ctx.shard_status();
        match recorded_phase(&status) {
            Some(phase) => {
                fenced = phase == "fence" || phase == "switch";
                kills.push(format!("{phase} ({delay:?})"));
            }
            // Killed while it shut down after finishing.
            None if moved(&status) => {
                eprintln!("run {runs} was killed after it finished the move");
                break;
            }
            None => panic!("after the kill of run {runs} the move is not recorded:\n{status}"),
        }
    }
    let move_took = moving.elapsed();
    eprintln!(
        "the mover was killed {} times, at {}; {runs} runs, {:.1} s in all",
        kills.len(),
        kills.join(", "),
        move_took.as_secs_f64()
    );
    assert!(!kills.is_empty(), "the mover was killed at least once");

    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, Ordering::Relaxed);
    load.await.expect("the client task");
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    let in_range = acked
        .cells
        .keys()
        .filter(|row| row_shard(row, SHARDS) <= MOVED_LAST)
        .count() as i64;
    eprintln!(
        "{} client writes of {BATCH} cells and {} index lookups of {PROBES_PER_LOOKUP} of the {} probes during the move; {} cells acknowledged in all, {in_range} of them in the moved range; slowest write {:?}",
        acked.writes,
        acked.lookups,
        probes.len(),
        acked.cells.len(),
        acked.slowest
    );
    assert!(acked.failures.is_empty(), "{:#?}", acked.failures);
    assert!(acked.writes > 20, "the client wrote during the move");

    // Every acknowledged cell reads back through both gateways.
    let rows: Vec<Uuid> = acked.cells.keys().copied().collect();
    for base in &bases {
        for chunk in rows.chunks(READ_CHUNK) {
            let found = read(&http, base, chunk)
                .await
                .unwrap_or_else(|e| panic!("final read through {base}: {e}"));
            for row in chunk {
                assert_eq!(
                    found.get(row),
                    Some(&Some(acked.cells[row].clone())),
                    "acknowledged row {row} (shard {}) through {base}",
                    row_shard(row, SHARDS)
                );
            }
        }
    }

    // Every probe's entry is listed through both gateways.
    for base in &bases {
        let missing = unlisted(&http, base, &probes).await.unwrap();
        assert!(missing.is_empty(), "through {base}: {missing:?}");
    }

    let status = ctx.shard_status();
    assert!(moved(&status), "{status}");

    // The source keeps nothing of the range; each cell is stored once.
    let count = |filter: &str| format!("SELECT COUNT(*) FROM trips_cells WHERE {filter}");
    assert_eq!(
        clusters.scalar(0, &count("shard <= 1023")).await,
        0,
        "cells of the moved range left on a"
    );
    assert_eq!(
        clusters.scalar(2, &count("shard <= 1023")).await,
        in_range,
        "the moved range's cells on c"
    );
    let mut stored = 0;
    for cluster in 0..3 {
        stored += clusters.scalar(cluster, &count("1 = 1")).await;
    }
    assert_eq!(stored, acked.cells.len() as i64, "cells stored in all");

    let verify = ctx
        .cli(&["index", "verify", "--datastore", "trips", "--duty", "1"])
        .output()
        .expect("run cellgate index verify");
    assert_eq!(verify.status.code(), Some(0), "{}", text(&verify));
    assert!(
        String::from_utf8_lossy(&verify.stdout).contains("0 missing, 0 stale, 0 extra"),
        "{}",
        text(&verify)
    );
    eprintln!(
        "checked in {:.1} s after the move; {:.1} s in all",
        (moving.elapsed() - move_took).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    drop(gateways);
}
