//! `cellgate index verify` and `repair` end to end, beside a running
//! gateway on the embedded SQLite store: drift injected into an index
//! table is reported key by key (exit status 3, a JSON-lines report), a
//! repair killed with SIGKILL part-way resumes where it stopped, and a
//! second verify is clean.

#[path = "support/server.rs"]
mod server;

use std::process::{Output, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use server::{cellgate, client, root, Server};
use sqlx::Connection as _;
use uuid::Uuid;

const INDEX_TABLE: &str = "trips_ix_driver_partner_index";

async fn write_trips(server: &Server, n: usize) {
    let http = client();
    for chunk in 0..n.div_ceil(100) {
        let cells: Vec<Value> = (0..100.min(n - chunk * 100))
            .map(|i| {
                json!({
                    "rowKey": Uuid::new_v4().to_string(),
                    "column": "BASE",
                    "refKey": "1",
                    "body": {
                        "driver_partner_uuid": Uuid::new_v4().to_string(),
                        "city_uuid": Uuid::new_v4().to_string(),
                        "trip_created_at": "2024-05-01T10:00:00Z",
                        "fare": {"total": 10.0 + i as f64, "currency": "EUR"},
                        "status": "completed",
                    },
                })
            })
            .collect();
        let answer: Value = http
            .post(server.graphql())
            .json(&json!({
                "query": "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }",
                "variables": {"cells": cells},
            }))
            .send()
            .await
            .expect("put")
            .json()
            .await
            .expect("json");
        assert!(answer.get("errors").is_none(), "{answer}");
    }
}

async fn sqlite(server: &Server) -> sqlx::SqliteConnection {
    let file = server.dir.path().join("data").join("cellgate.db");
    sqlx::SqliteConnection::connect(&format!("sqlite://{}", file.display()))
        .await
        .expect("open the store's database")
}

async fn count(server: &Server, sql: &str) -> i64 {
    let mut db = sqlite(server).await;
    sqlx::query_scalar(sql)
        .fetch_one(&mut db)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

fn index_command(server: &Server, args: &[&str]) -> std::process::Command {
    let mut command = cellgate(server.dir.path());
    command
        .arg("index")
        .args(args)
        .arg("--data")
        .arg(server.dir.path().join("data"))
        .arg("--datastores")
        .arg(root().join("datastores"));
    command
}

fn run(server: &Server, args: &[&str]) -> Output {
    index_command(server, args)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drift_is_reported_and_a_killed_repair_resumes_to_a_clean_index() {
    let server = Server::start(&[]);
    write_trips(&server, 400).await;
    // The gateway's maintainer catches up.
    let live = format!("SELECT COUNT(*) FROM {INDEX_TABLE} WHERE _shard IS NOT NULL");
    for _ in 0..600 {
        if count(&server, &live).await == 400 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(count(&server, &live).await, 400);

    let clean = run(&server, &["verify", "--datastore", "trips", "--duty", "1"]);
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean));

    // Every other entry disappears.
    let doomed = count(
        &server,
        &format!("SELECT COUNT(*) FROM {INDEX_TABLE} WHERE _shard IS NOT NULL AND rowid % 2 = 0"),
    )
    .await;
    assert!(doomed > 100, "{doomed}");
    let mut db = sqlite(&server).await;
    sqlx::query(&format!(
        "DELETE FROM {INDEX_TABLE} WHERE _shard IS NOT NULL AND rowid % 2 = 0"
    ))
    .execute(&mut db)
    .await
    .unwrap();
    // And five entries of rows that have no cells at all appear.
    const ORPHANS: i64 = 5;
    sqlx::query(&format!(
        "INSERT INTO {INDEX_TABLE} (row_key, _shard, driver_partner_uuid, _updated_at) \
         SELECT randomblob(16), _shard, driver_partner_uuid, _updated_at FROM {INDEX_TABLE} \
         WHERE _shard IS NOT NULL LIMIT {ORPHANS}"
    ))
    .execute(&mut db)
    .await
    .unwrap();
    drop(db);

    let report = server.dir.path().join("drift.jsonl");
    let found = run(
        &server,
        &[
            "verify",
            "--datastore",
            "trips",
            "--index",
            "driver_partner_index",
            "--duty",
            "1",
            "--report",
            report.to_str().unwrap(),
        ],
    );
    assert_eq!(found.status.code(), Some(3), "{}", text(&found));
    let lines: Vec<Value> = std::fs::read_to_string(&report)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let (drift, summary): (Vec<&Value>, Vec<&Value>) =
        lines.iter().partition(|l| l.get("summary").is_none());
    assert_eq!(drift.len() as i64, doomed + ORPHANS, "{}", text(&found));
    assert!(drift.iter().all(|d| d["index"] == "driver_partner_index"));
    let extra = drift.iter().filter(|d| d["kind"] == "extra").count() as i64;
    assert_eq!(extra, ORPHANS, "{}", text(&found));
    assert_eq!(summary.len(), 1);
    assert_eq!(summary[0]["summary"]["progress"]["missing"], json!(doomed));
    // Every drifted key is named on the terminal too.
    let stdout = String::from_utf8_lossy(&found.stdout);
    for d in &drift {
        let line = format!(
            "{} trips/driver_partner_index row {} ",
            d["kind"].as_str().unwrap(),
            d["rowKey"].as_str().unwrap()
        );
        assert!(
            stdout.contains(&line),
            "{line} is not named:\n{}",
            text(&found)
        );
    }

    // A slow repair (it works 2% of the time) is killed once it has
    // recorded progress.
    let mut repair = index_command(
        &server,
        &[
            "repair",
            "--datastore",
            "trips",
            "--index",
            "driver_partner_index",
            "--duty",
            "0.02",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .expect("start the repair");
    let checkpoint = "SELECT COUNT(*) FROM cellgate_catalog WHERE item = 'verify' \
                      AND value LIKE '%\"repair\":true%' AND value NOT LIKE '%\"nextShard\":null%' \
                      AND value NOT LIKE '%\"nextShard\":0,%'";
    let mut recorded = false;
    for _ in 0..1200 {
        if count(&server, checkpoint).await == 1 {
            recorded = true;
            break;
        }
        assert!(
            repair.try_wait().unwrap().is_none(),
            "the repair ended before it could be killed"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(recorded, "the repair recorded no progress");
    repair.kill().expect("SIGKILL");
    repair.wait().unwrap();
    assert!(
        count(&server, &live).await < 400,
        "the killed repair had already fixed everything"
    );

    let resumed = run(
        &server,
        &[
            "repair",
            "--datastore",
            "trips",
            "--index",
            "driver_partner_index",
            "--duty",
            "1",
        ],
    );
    assert_eq!(resumed.status.code(), Some(0), "{}", text(&resumed));
    let out = String::from_utf8_lossy(&resumed.stdout);
    assert!(out.contains("resumed at shard"), "{}", text(&resumed));
    assert_eq!(count(&server, &live).await, 400);

    let after = run(
        &server,
        &["verify", "--datastore", "trips", "--duty", "1", "--restart"],
    );
    assert_eq!(after.status.code(), Some(0), "{}", text(&after));
    assert!(
        String::from_utf8_lossy(&after.stdout).contains("0 missing, 0 stale, 0 extra"),
        "{}",
        text(&after)
    );
}

#[test]
fn bad_arguments_are_refused_with_a_clear_message() {
    let server = Server::start(&[]);
    let output = run(&server, &["verify", "--shards", "9-x"]);
    assert_eq!(output.status.code(), Some(2), "{}", text(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("is not a shard range"));
    let output = run(
        &server,
        &["verify", "--datastore", "trips", "--index", "nope"],
    );
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("nope"),
        "{}",
        text(&output)
    );
    let output = run(&server, &["verify", "--datastore", "trips", "--duty", "0"]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--duty"));
}

async fn graphql(server: &Server, query: &str) -> Value {
    let answer: Value = client()
        .post(server.graphql())
        .json(&json!({ "query": query }))
        .send()
        .await
        .expect("post")
        .json()
        .await
        .expect("json");
    answer
}

/// Polls `indexVerify` until the run is no longer running.
async fn finished_run(server: &Server) -> Value {
    for _ in 0..1200 {
        let answer = graphql(
            server,
            "{ trips { indexVerify { state repair error progress { shardsDone shardsTotal rows \
             missing stale extra repaired } drift { index rowKey kind cluster expected stored repaired } } } }",
        )
        .await;
        let run = answer["data"]["trips"]["indexVerify"].clone();
        if run["state"] != "RUNNING" {
            return run;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the verify did not finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_runs_a_verify_and_metrics_count_the_drift() {
    let server = Server::start(&[]);
    let none = graphql(&server, "{ trips { indexVerify { state } } }").await;
    assert_eq!(none["data"]["trips"]["indexVerify"], Value::Null, "{none}");
    write_trips(&server, 100).await;
    let live = format!("SELECT COUNT(*) FROM {INDEX_TABLE} WHERE _shard IS NOT NULL");
    for _ in 0..600 {
        if count(&server, &live).await == 100 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut db = sqlite(&server).await;
    let gone: Vec<Uuid> = sqlx::query_scalar(&format!(
        "SELECT row_key FROM {INDEX_TABLE} WHERE _shard IS NOT NULL ORDER BY row_key LIMIT 3"
    ))
    .fetch_all(&mut db)
    .await
    .unwrap();
    sqlx::query(&format!(
        "DELETE FROM {INDEX_TABLE} WHERE row_key IN (SELECT row_key FROM {INDEX_TABLE} \
         WHERE _shard IS NOT NULL ORDER BY row_key LIMIT 3)"
    ))
    .execute(&mut db)
    .await
    .unwrap();
    drop(db);

    let started = graphql(
        &server,
        "mutation { tripsVerifyIndexes(indexes: [\"driver_partner_index\"]) { state repair } }",
    )
    .await;
    assert_eq!(
        started["data"]["tripsVerifyIndexes"]["state"], "RUNNING",
        "{started}"
    );
    let run = finished_run(&server).await;
    assert_eq!(run["state"], "DONE", "{run}");
    assert_eq!(run["progress"]["missing"], "3", "{run}");
    assert_eq!(
        run["progress"]["shardsDone"],
        run["progress"]["shardsTotal"]
    );
    let mut reported: Vec<String> = run["drift"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            assert_eq!(d["kind"], "MISSING", "{d}");
            assert_eq!(d["stored"], Value::Null, "{d}");
            assert!(d["expected"]["driver_partner_uuid"].is_string(), "{d}");
            d["rowKey"].as_str().unwrap().to_string()
        })
        .collect();
    reported.sort();
    let mut gone: Vec<String> = gone.iter().map(Uuid::to_string).collect();
    gone.sort();
    assert_eq!(reported, gone);

    let metrics = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("cellgate_index_drift_total{datastore=\"trips\",kind=\"missing\"} 3"),
        "{metrics}"
    );
    assert!(metrics.contains("cellgate_index_verify_last_drift{datastore=\"trips\"} 3"));

    // Bad arguments are refused; then a repair.
    let bad = graphql(
        &server,
        "mutation { tripsVerifyIndexes(sample: 0) { state } }",
    )
    .await;
    assert_eq!(
        bad["errors"][0]["extensions"]["code"], "BAD_USER_INPUT",
        "{bad}"
    );
    let bad = graphql(
        &server,
        "mutation { tripsVerifyIndexes(indexes: [\"nope\"]) { state } }",
    )
    .await;
    assert!(
        bad["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("nope"),
        "{bad}"
    );
    graphql(
        &server,
        "mutation { tripsVerifyIndexes(repair: true, indexes: [\"driver_partner_index\"]) { state } }",
    )
    .await;
    let run = finished_run(&server).await;
    assert_eq!(run["repair"], true);
    assert_eq!(run["progress"]["repaired"], "3", "{run}");
    assert_eq!(count(&server, &live).await, 100);
}
