//! Wake-ups across gateways: two `cellgate serve` processes on one
//! database, their sweeps (subscriptions', index maintenance's) set to a
//! minute, so that only the wake-up (`LISTEN/NOTIFY` on PostgreSQL, the
//! poll of the shard counters on MariaDB and SQLite) can bring a cell
//! written through one gateway to a subscriber of the other, and to the
//! index entries the other maintains, within the test's wait. Each
//! backend runs it on one cluster and on two, whose wake-ups are each
//! cluster's own. On private PostgreSQL and MariaDB servers it runs again
//! after the master was killed (`kill -9`) and started again: the
//! listener and the poll connect again by themselves.

#[path = "support/followers.rs"]
mod followers;
#[path = "support/mariadb.rs"]
mod mariadb;
#[path = "support/postgres.rs"]
mod postgres;
#[path = "support/private.rs"]
mod private;
#[path = "support/server.rs"]
mod server;
#[path = "support/servers.rs"]
mod servers;
#[path = "support/socket.rs"]
mod socket;

use std::time::{Duration, Instant};

use private::PrivateServer;
use serde_json::{json, Value};
use server::{client, Server};
use sqlx::Connection as _;

const TRIPS: (&str, &str) = (
    "trips/datastore.yaml",
    "name: trips\nshards: 64\ncolumns:\n  - name: BASE\n",
);

const BY_DRIVER: (&str, &str) = (
    "trips/indexes/by_driver.yaml",
    "table: by_driver\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: driver, type: string }\n",
);

/// Sweeps a minute apart: what reaches the other gateway sooner was woken.
const SLOW_SWEEPS: &str =
    "limits:\n  subscription_sweep_ms: 60000\nindexes:\n  sweep_interval_ms: 60000\n";

async fn admin(base: &str, sql: &str) {
    let mut conn = sqlx::PgConnection::connect(base)
        .await
        .unwrap_or_else(|e| panic!("connect to {base}: {e}"));
    sqlx::raw_sql(sql)
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn with_database(base: &str, name: &str) -> String {
    let (server, _) = base.rsplit_once('/').expect("a database URL");
    format!("{server}/{name}")
}

async fn gql(server: &Server, query: &str, variables: Value) -> Value {
    let answer: Value = client()
        .post(server.graphql())
        .json(&json!({ "query": query, "variables": variables }))
        .send()
        .await
        .expect("request")
        .json()
        .await
        .expect("JSON");
    assert!(answer.get("errors").is_none(), "{answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_one_gateway_wake_the_other_on_postgres() {
    let Ok(base) = std::env::var("CELLGATE_TEST_POSTGRES_URL") else {
        servers::skip(
            "the wake-up across gateways",
            "CELLGATE_TEST_POSTGRES_URL is not set",
        );
        return;
    };
    let name = format!(
        "cg_wake_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    admin(&base, &format!("CREATE DATABASE {name}")).await;
    let url = with_database(&base, &name);
    let outcome = tokio::spawn(check(
        SLOW_SWEEPS.to_string(),
        vec!["--database".into(), url],
    ))
    .await;
    admin(
        &base,
        &format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"),
    )
    .await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_one_gateway_wake_the_other_on_mariadb() {
    let Ok(base) = std::env::var("CELLGATE_TEST_MYSQL_URL") else {
        servers::skip(
            "the wake-up across gateways",
            "CELLGATE_TEST_MYSQL_URL is not set",
        );
        return;
    };
    let name = format!(
        "cg_wake_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    mysql_admin(&base, &format!("CREATE DATABASE {name}")).await;
    let url = with_database(&base, &name);
    let outcome = tokio::spawn(check(
        SLOW_SWEEPS.to_string(),
        vec!["--database".into(), url],
    ))
    .await;
    mysql_admin(&base, &format!("DROP DATABASE IF EXISTS {name}")).await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_one_gateway_wake_the_other_on_sqlite() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = format!("sqlite://{}", dir.path().join("cells.db").display());
    check(SLOW_SWEEPS.to_string(), vec!["--database".into(), url]).await;
}

/// [`SLOW_SWEEPS`] on the clusters `a` and `b` (the datastore's shards
/// split evenly between them).
fn two_clusters(a: &str, b: &str) -> String {
    format!(
        "{SLOW_SWEEPS}storage:\n  clusters:\n    - name: a\n      master: {a}\n    - name: b\n      master: {b}\n"
    )
}

/// Two fresh databases on the server of `base`, the check on them as two
/// clusters, the databases dropped.
async fn on_two_databases(base: &str, create: &str, drop: &str, mysql: bool) {
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..8];
    let names = [format!("cg_wake_a_{suffix}"), format!("cg_wake_b_{suffix}")];
    let run = move |sql: String| async move {
        if mysql {
            mysql_admin(base, &sql).await
        } else {
            admin(base, &sql).await
        }
    };
    for name in &names {
        run(create.replace("{}", name)).await;
    }
    let config = two_clusters(
        &with_database(base, &names[0]),
        &with_database(base, &names[1]),
    );
    let outcome = tokio::spawn(check(config, Vec::new())).await;
    for name in &names {
        run(drop.replace("{}", name)).await;
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_one_gateway_wake_the_other_on_two_sqlite_clusters() {
    let dir = tempfile::tempdir().expect("temp dir");
    let url = |name: &str| format!("sqlite://{}", dir.path().join(name).display());
    check(two_clusters(&url("a.db"), &url("b.db")), Vec::new()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_one_gateway_wake_the_other_on_two_postgres_clusters() {
    let Ok(base) = std::env::var("CELLGATE_TEST_POSTGRES_URL") else {
        servers::skip(
            "the wake-up across gateways on two clusters",
            "CELLGATE_TEST_POSTGRES_URL is not set",
        );
        return;
    };
    on_two_databases(
        &base,
        "CREATE DATABASE {}",
        "DROP DATABASE IF EXISTS {} WITH (FORCE)",
        false,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_through_one_gateway_wake_the_other_on_two_mariadb_clusters() {
    let Ok(base) = std::env::var("CELLGATE_TEST_MYSQL_URL") else {
        servers::skip(
            "the wake-up across gateways on two clusters",
            "CELLGATE_TEST_MYSQL_URL is not set",
        );
        return;
    };
    on_two_databases(
        &base,
        "CREATE DATABASE {}",
        "DROP DATABASE IF EXISTS {}",
        true,
    )
    .await;
}

async fn mysql_admin(base: &str, sql: &str) {
    let mut conn = sqlx::MySqlConnection::connect(base)
        .await
        .unwrap_or_else(|e| panic!("connect to {base}: {e}"));
    sqlx::raw_sql(sql)
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The check on gateways started with `config` and the arguments `args`.
async fn check(config: String, args: Vec<String>) {
    let pair = Pair::start(&config, &args).await;
    pair.round().await;
}

/// Two gateways on the same clusters, and a subscriber of the follower's
/// `/graphql/ws`.
struct Pair {
    writer: Server,
    follower: Server,
    got: followers::Got,
}

/// A deadline for `what`: the returned check fails once `within` is over.
fn wait_until(what: &'static str, within: Duration) -> impl Fn() {
    let deadline = Instant::now() + within;
    move || {
        assert!(
            Instant::now() < deadline,
            "{what} within {within:?}: only a sweep (a minute apart) would have found it"
        );
    }
}

impl Pair {
    async fn start(config: &str, args: &[String]) -> Pair {
        let files = [TRIPS, BY_DRIVER];
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let writer = Server::start_with(&files, config, &args);
        let follower = Server::start_with(&files, config, &args);
        for server in [&writer, &follower] {
            server
                .wait_ready(reqwest::StatusCode::OK, Duration::from_secs(60))
                .await;
        }
        // A subscriber of the follower, caught up with the (empty) log.
        let ws = follower.url("/graphql/ws").replacen("http", "ws", 1);
        let got = followers::subscribe(ws, "tripsCells", "BASE");
        let pair = Pair {
            writer,
            follower,
            got,
        };
        pair.settle().await;
        pair
    }

    /// Waits until the follower has its subscriber, then for the sweeps
    /// and retries under way to pass, so that what follows is left to the
    /// wake-up.
    async fn settle(&self) {
        let started = wait_until("the subscription to start", Duration::from_secs(30));
        loop {
            let text = client()
                .get(self.follower.url("/metrics"))
                .send()
                .await
                .expect("metrics")
                .text()
                .await
                .expect("text");
            if text
                .lines()
                .any(|l| l.starts_with("cellgate_subscription_followers") && !l.ends_with(" 0"))
            {
                break;
            }
            started();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Each gateway sweeps once soon after it starts.
        tokio::time::sleep(Duration::from_secs(3)).await;
    }

    /// Cells of many shards, written through the writer, reach the
    /// follower's subscriber and every index entry is found through either
    /// gateway, well before a sweep.
    async fn round(&self) {
        let driver = uuid::Uuid::new_v4().to_string();
        let cells: Vec<Value> = (0..40)
            .map(|_| {
                json!({"rowKey": uuid::Uuid::new_v4().to_string(), "column": "BASE", "refKey": 1,
                       "body": {"driver": driver}})
            })
            .collect();
        let keys: Vec<followers::CellKey> = cells
            .iter()
            .map(|c| {
                (
                    c["rowKey"].as_str().unwrap().parse().unwrap(),
                    "BASE".to_string(),
                    1,
                )
            })
            .collect();
        gql(
            &self.writer,
            "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }",
            json!({ "cells": cells }),
        )
        .await;
        let delivered = wait_until(
            "the follower's subscriber to get every cell",
            Duration::from_secs(20),
        );
        while !self.got.missing(&keys).is_empty() {
            delivered();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        // Index entries of the shards whose leases the follower holds are
        // applied by it, woken the same way: every entry is found through
        // either gateway.
        let indexed = wait_until("every index entry", Duration::from_secs(20));
        for server in [&self.writer, &self.follower] {
            loop {
                let answer = gql(
                    server,
                    "query($d: String!) { trips { byDriver(driver: $d, first: 100) { edges { node { rowKey } } } } }",
                    json!({ "d": driver }),
                )
                .await;
                let found = answer["data"]["trips"]["byDriver"]["edges"]
                    .as_array()
                    .map_or(0, Vec::len);
                if found == keys.len() {
                    break;
                }
                indexed();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }

    /// Waits until a write through the writer succeeds again (after its
    /// master came back), trying for two minutes.
    async fn writable(&self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let cell = json!({"rowKey": uuid::Uuid::new_v4().to_string(), "column": "BASE",
                              "refKey": 1, "body": {"driver": "probe"}});
            let answer: Option<Value> = match client()
                .post(self.writer.graphql())
                .json(&json!({
                    "query": "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }",
                    "variables": { "cells": [cell] },
                }))
                .send()
                .await
            {
                Ok(response) => response.json().await.ok(),
                Err(_) => None,
            };
            if answer.as_ref().is_some_and(|a| {
                a.pointer("/data/tripsPutCells/0/status") == Some(&json!("WRITTEN"))
            }) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "no write succeeded within 2 minutes of the restart: {answer:?}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The wake-up outlives its master: two gateways on a private server of
/// kind `D`, woken once; the server is killed (`kill -9`), started again
/// on its data directory and port, and once writes succeed again, a
/// second round must reach the follower as fast as the first. The
/// listener (PostgreSQL) or the poll (MariaDB, and PostgreSQL with
/// `notify: false`) has to connect again by itself; the sweeps, a minute
/// apart, would be too late.
async fn after_a_killed_master<D: PrivateServer>(test: &str, storage: &str) {
    let mut db = match D::init() {
        Ok(db) => db,
        Err(why) => {
            servers::skip(test, &why);
            return;
        }
    };
    db.start().await;
    let config = format!("{SLOW_SWEEPS}{storage}");
    let pair = Pair::start(&config, &["--database".into(), db.url()]).await;
    pair.round().await;
    db.kill();
    // Both gateways find their connections gone while it is down.
    tokio::time::sleep(Duration::from_secs(2)).await;
    db.start().await;
    pair.writable().await;
    pair.settle().await;
    pair.round().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_notify_wake_up_outlives_a_killed_postgres_master() {
    after_a_killed_master::<postgres::Postgres>("the wake-up after a killed master", "").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poll_wake_up_outlives_a_killed_postgres_master() {
    after_a_killed_master::<postgres::Postgres>(
        "the wake-up after a killed master",
        "storage:\n  notify: false\n",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_poll_wake_up_outlives_a_killed_mariadb_master() {
    after_a_killed_master::<mariadb::Mariadb>("the wake-up after a killed master", "").await;
}
