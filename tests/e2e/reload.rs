//! Reloading the definitions of a running gateway: SIGHUP, `cellgate
//! reload` and `serve --watch`. Indexes are added, changed and removed
//! while a client reads and writes in a loop; a broken file is reported
//! and the running schema stays.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::harness::{Defs, Env, Server, Wait};

pub(crate) const BY_N: &str = "items/indexes/items_by_n.yaml";

pub(crate) const BY_N_V1: &str = "table: items_by_n\ndatastore: items\nshard_field: owner\ncolumn_defs:\n  - column_key: DATA\n    fields:\n      - { field: owner, type: string }\n      - { field: n, type: int }\n";

pub(crate) const BY_N_V2: &str = "table: items_by_n\ndatastore: items\nshard_field: owner\ncolumn_defs:\n  - column_key: DATA\n    fields:\n      - { field: owner, type: string }\n      - { field: n, type: int }\n      - { field: x, type: float }\n";

/// An index on a column `items` does not have: line 5, column 21.
const BROKEN: (&str, &str) = (
    "items/indexes/broken.yaml",
    "table: broken\ndatastore: items\ncolumn_defs:\n  - column_key: DATA\n    fields: [{ field: a, type: nope }]\n",
);

pub(crate) fn write(server: &Server, path: &str, text: &str) {
    std::fs::write(server.datastores.join(path), text).expect("write a definition");
}

fn remove(server: &Server, path: &str) {
    std::fs::remove_file(server.datastores.join(path)).expect("remove a definition");
}

/// Writes `count` items of `owner` with `n` = 0..count and `x` = n / 2.
pub(crate) async fn put_items(server: &Server, owner: &str, count: i64) {
    let cells: Vec<Value> = (0..count)
        .map(|n| {
            json!({"rowKey": uuid::Uuid::new_v4().to_string(), "column": "DATA", "refKey": 1,
                   "body": {"owner": owner, "n": n, "x": n as f64 / 2.0}})
        })
        .collect();
    let data = server
        .data(
            "mutation($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { status } }",
            json!({ "cells": cells }),
        )
        .await;
    assert_eq!(
        data["itemsPutCells"],
        json!(vec![json!({"status": "WRITTEN"}); count as usize])
    );
}

/// The `n` of every entry of `owner` in `itemsByN`, selecting `fields`;
/// `Err` with the error codes while the field is unknown or being built.
pub(crate) async fn by_n(
    server: &Server,
    owner: &str,
    fields: &str,
) -> Result<Vec<Value>, Vec<String>> {
    let response = server
        .request(
            &format!(
                "query($owner: String!) {{ items {{ itemsByN(owner: $owner, first: 100) {{ edges {{ node {{ {fields} }} }} }} }} }}"
            ),
            json!({ "owner": owner }),
        )
        .await;
    match response.get("errors") {
        Some(errors) => Err(errors
            .as_array()
            .expect("errors")
            .iter()
            .map(|e| e["extensions"]["code"].as_str().unwrap_or("").to_string())
            .collect()),
        None => {
            let edges = response["data"]["items"]["itemsByN"]["edges"]
                .as_array()
                .expect("edges")
                .iter()
                .map(|e| e["node"].clone())
                .collect();
            Ok(edges)
        }
    }
}

/// Waits until `itemsByN` answers `count` entries with `fields`; only
/// "unknown field" (the schema not swapped yet) and `INDEX_BUILDING` may
/// come before.
pub(crate) async fn until_answered(
    server: &Server,
    owner: &str,
    fields: &str,
    count: usize,
) -> Vec<Value> {
    let wait = Wait::new(format!("itemsByN {{ {fields} }} to answer {count} entries"));
    loop {
        match by_n(server, owner, fields).await {
            Ok(nodes) if nodes.len() == count => return nodes,
            Ok(nodes) => wait.tick(&nodes).await,
            Err(codes) => {
                assert!(
                    codes
                        .iter()
                        .all(|c| c == "GRAPHQL_VALIDATION_FAILED" || c == "INDEX_BUILDING"),
                    "unexpected errors {codes:?}"
                );
                wait.tick(&codes).await;
            }
        }
    }
}

/// `Query.definitions`.
async fn definitions(server: &Server) -> Value {
    server
        .data(
            "{ definitions { latest loadedAt lastReload { result details } } }",
            json!({}),
        )
        .await["definitions"]
        .clone()
}

/// A client reading an index page (the compiled path once validated),
/// through the executor (`row`), and writing, until stopped; every answer
/// must be complete and without errors.
struct Client {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    failures: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Client {
    fn start(server: Arc<Server>, owner: &'static str, count: usize) -> Client {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(Mutex::new(Vec::new()));
        let task = tokio::spawn({
            let (stop, rounds, failures) = (stop.clone(), rounds.clone(), failures.clone());
            async move {
                while !stop.load(Ordering::Relaxed) {
                    let page = server
                        .request(
                            "query Page($owner: String!) { items { itemsIndex(owner: $owner, first: 100) { edges { node { n } } } } }",
                            json!({ "owner": owner }),
                        )
                        .await;
                    let entries = page["data"]["items"]["itemsIndex"]["edges"]
                        .as_array()
                        .map_or(0, Vec::len);
                    if page.get("errors").is_some() || entries != count {
                        failures.lock().unwrap().push(format!("page: {page}"));
                    }
                    let rows = server
                        .request(
                            "query Rows($owner: String!) { items { itemsIndex(owner: $owner, first: 2) { edges { node { row { data { body } } } } } } }",
                            json!({ "owner": owner }),
                        )
                        .await;
                    if rows.get("errors").is_some() {
                        failures.lock().unwrap().push(format!("rows: {rows}"));
                    }
                    let put = server
                        .request(
                            "mutation($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { status } }",
                            json!({ "cells": [{"rowKey": uuid::Uuid::new_v4().to_string(), "column": "FLAGS", "refKey": 1, "body": {"b": true}}] }),
                        )
                        .await;
                    if put["data"]["itemsPutCells"][0]["status"] != "WRITTEN" {
                        failures.lock().unwrap().push(format!("put: {put}"));
                    }
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Client {
            stop,
            rounds,
            failures,
            task,
        }
    }

    /// Waits until the client has done `more` rounds beyond those done now.
    async fn rounds_more(&self, more: u64) {
        let start = self.rounds.load(Ordering::Relaxed);
        let wait = Wait::new(format!("{more} more client rounds"));
        while self.rounds.load(Ordering::Relaxed) < start + more {
            assert!(!self.task.is_finished(), "the client stopped");
            wait.tick(&self.rounds.load(Ordering::Relaxed)).await;
        }
    }

    async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the client task");
        let failures = self.failures.lock().unwrap();
        assert!(
            failures.is_empty(),
            "{} failures, first: {}",
            failures.len(),
            failures[0]
        );
        self.rounds.load(Ordering::Relaxed)
    }
}

/// SIGHUP adds an index (built, then answering), changes it (a new table
/// version), a broken file is refused by `cellgate reload` while the
/// running schema keeps serving and the error shows in `/metrics` and
/// `Query.definitions`, and removing the file stops serving the index but
/// keeps its tables; a client reading and writing throughout never fails.
pub async fn reload_swaps_definitions_while_serving(env: Arc<Env>) {
    let server = Arc::new(env.serve(Defs::Small, &[]));
    put_items(&server, "reload-owner", 12).await;
    // Entries follow their cells after the commit.
    let wait = Wait::new("itemsIndex to hold the items");
    loop {
        let page = server
            .data(
                "query($owner: String!) { items { itemsIndex(owner: $owner, first: 100) { edges { cursor } } } }",
                json!({ "owner": "reload-owner" }),
            )
            .await;
        let edges = &page["items"]["itemsIndex"]["edges"];
        if edges.as_array().map_or(0, Vec::len) == 12 {
            break;
        }
        wait.tick(edges).await;
    }
    let client = Client::start(server.clone(), "reload-owner", 12);
    client.rounds_more(3).await;

    // Added, on SIGHUP.
    write(&server, BY_N, BY_N_V1);
    server.hangup();
    let nodes = until_answered(&server, "reload-owner", "n", 12).await;
    let mut ns: Vec<i64> = nodes
        .iter()
        .map(|n| n["n"].as_str().unwrap().parse().unwrap())
        .collect();
    ns.sort();
    assert_eq!(ns, (0..12).collect::<Vec<_>>());
    assert!(env.table_exists("items_ix_items_by_n").await);
    let state = definitions(&server).await;
    assert_eq!(state["latest"], true, "{state}");
    assert_eq!(state["lastReload"]["result"], "APPLIED", "{state}");
    let details = state["lastReload"]["details"].to_string();
    assert!(
        details.contains("index `items_by_n` of `items` added"),
        "{details}"
    );
    client.rounds_more(3).await;

    // Changed: a new table version, built from the log.
    write(&server, BY_N, BY_N_V2);
    let (ok, stdout, stderr) = server.reload_command();
    assert!(ok, "cellgate reload failed: {stdout}{stderr}");
    assert!(stdout.contains("version 2 replaces version 1"), "{stdout}");
    let nodes = until_answered(&server, "reload-owner", "n x", 12).await;
    assert!(nodes.iter().all(|n| n["x"].is_number()), "{nodes:?}");
    assert!(env.table_exists("items_ix_items_by_n_v2").await);
    client.rounds_more(3).await;

    // Broken: refused with the file's position, the running schema stays.
    write(&server, BROKEN.0, BROKEN.1);
    let (ok, stdout, stderr) = server.reload_command();
    assert!(!ok, "a broken file was reloaded: {stdout}");
    assert!(stderr.contains("broken.yaml:5:"), "{stderr}");
    assert_eq!(
        by_n(&server, "reload-owner", "n x").await.map(|n| n.len()),
        Ok(12)
    );
    assert_eq!(
        server
            .metric("cellgate_definitions_reloads_total{result=\"invalid\"}")
            .await,
        1.0
    );
    assert_eq!(
        server
            .metric("cellgate_definitions_reloads_total{result=\"applied\"}")
            .await,
        2.0
    );
    assert_eq!(server.metric("cellgate_definitions_latest").await, 0.0);
    let state = definitions(&server).await;
    assert_eq!(state["latest"], false, "{state}");
    assert_eq!(state["lastReload"]["result"], "INVALID", "{state}");
    assert!(
        state["lastReload"]["details"]
            .to_string()
            .contains("broken.yaml:5:"),
        "{state}"
    );
    client.rounds_more(3).await;

    // Refused: valid definitions the running store cannot apply.
    remove(&server, BROKEN.0);
    let datastore = std::fs::read_to_string(server.datastores.join("items/datastore.yaml"))
        .expect("items/datastore.yaml");
    assert!(datastore.contains("shards: 4\n"), "{datastore}");
    write(
        &server,
        "items/datastore.yaml",
        &datastore.replace("shards: 4\n", "shards: 16\n"),
    );
    let (ok, stdout, stderr) = server.reload_command();
    assert!(!ok, "a new shard count was reloaded: {stdout}");
    assert!(
        stderr.contains("shard count is fixed at creation"),
        "{stderr}"
    );
    assert_eq!(
        server
            .metric("cellgate_definitions_reloads_total{result=\"refused\"}")
            .await,
        1.0
    );
    assert_eq!(
        by_n(&server, "reload-owner", "n x").await.map(|n| n.len()),
        Ok(12)
    );
    write(&server, "items/datastore.yaml", &datastore);
    client.rounds_more(3).await;

    // Removed: no longer served, its tables stay for `cellgate index drop`.
    remove(&server, BY_N);
    server.hangup();
    let wait = Wait::new("itemsByN to be gone");
    loop {
        match by_n(&server, "reload-owner", "n").await {
            Err(codes) if codes.iter().all(|c| c == "GRAPHQL_VALIDATION_FAILED") => break,
            other => wait.tick(&other).await,
        }
    }
    assert_eq!(server.metric("cellgate_definitions_latest").await, 1.0);
    assert!(env.table_exists("items_ix_items_by_n").await);
    assert!(env.table_exists("items_ix_items_by_n_v2").await);
    let state = definitions(&server).await;
    assert_eq!(state["latest"], true, "{state}");
    assert!(
        state["lastReload"]["details"]
            .to_string()
            .contains("removed"),
        "{state}"
    );
    client.rounds_more(3).await;
    let rounds = client.finish().await;
    assert!(rounds >= 15, "{rounds}");
    assert!(!server.stderr().contains("panicked"), "{}", server.stderr());
}

/// `serve --watch` reloads when a definition file changes.
pub async fn watch_reloads_changed_definitions(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &["--watch"]);
    put_items(&server, "watch-owner", 3).await;
    write(&server, BY_N, BY_N_V1);
    until_answered(&server, "watch-owner", "n", 3).await;
    assert_eq!(
        server
            .metric("cellgate_definitions_reloads_total{result=\"applied\"}")
            .await,
        1.0
    );
    assert_eq!(server.metric("cellgate_definitions_latest").await, 1.0);
}

/// `cellgate plan --base-deployed` against the store, then `cellgate reload
/// --plan`: the new index's estimate counts the log, the plan applies, and
/// the same plan once more (made from files no longer served) is refused.
pub async fn a_planned_reload_applies_what_was_planned_only(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    put_items(&server, "plan-owner", 30).await;
    let dir = server.datastores.display().to_string();
    let plan = |format: &str| {
        let mut args = vec!["plan".to_string(), dir.clone(), "--base-deployed".into()];
        args.extend(env.store_flags());
        args.extend(["--format".to_string(), format.to_string()]);
        env.command(&args)
    };
    let shown = |o: &std::process::Output| {
        format!(
            "{:?}\n{}\n{}",
            o.status.code(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let output = plan("text");
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));

    write(&server, BY_N, BY_N_V1);
    let output = plan("json");
    assert_eq!(output.status.code(), Some(3), "{}", shown(&output));
    let planned: Value = serde_json::from_slice(&output.stdout).expect("a JSON plan");
    let added = planned["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["kind"] == "INDEX_ADDED")
        .unwrap_or_else(|| panic!("{planned:#}"))
        .clone();
    assert_eq!(added["path"], "items/items_by_n", "{planned:#}");
    // The items datastore's log holds the 30 cells written, on one cluster.
    assert_eq!(added["estimate"]["cells"], 30, "{planned:#}");
    let file = env.data_dir().with_file_name("plan.json");
    std::fs::write(&file, &output.stdout).unwrap();
    let reload = || {
        env.command(&[
            "reload".into(),
            "--url".into(),
            server.base().to_string(),
            "--plan".into(),
            file.display().to_string(),
        ])
    };
    let output = reload();
    assert_eq!(output.status.code(), Some(0), "{}", shown(&output));
    until_answered(&server, "plan-owner", "n", 30).await;

    write(&server, BY_N, BY_N_V2);
    let output = reload();
    assert_eq!(output.status.code(), Some(1), "{}", shown(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("but the gateway serves"),
        "{}",
        shown(&output)
    );
    // Still the planned version: `x` is not served.
    assert!(by_n(&server, "plan-owner", "x").await.is_err());
    let output = plan("json");
    let now: Value = serde_json::from_slice(&output.stdout).expect("a JSON plan");
    assert_eq!(now["base_digest"], planned["head_digest"], "{now:#}");
}
