//! Subscriptions end to end, through the real `cellgate serve`: a
//! `graphql-transport-ws` client follows a datastore while cells are
//! written over GraphQL, its socket is cut at random points and it resumes
//! from its last cursor, and it must see every written cell of its
//! columns; refusals close with the protocol's codes or answer with coded
//! `error` messages.

#[path = "support/server.rs"]
mod server;
#[path = "support/socket.rs"]
mod socket;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use cellgate_graphql::auth::tokens;
use rand::Rng as _;
use serde_json::{json, Value};
use server::{client, Server};
use socket::{connect, init, receive, send, try_connect};

const TRIPS: (&str, &str) = (
    "trips/datastore.yaml",
    "name: trips\nshards: 16\ncolumns:\n  - name: BASE\n  - name: STATUS\n",
);

const SUBSCRIBE: &str = "subscription($after: String) {
  tripsCells(columns: [BASE], after: $after) {
    cursor cell { rowKey column refKey body shard addedId createdAt }
  }
}";

/// Writes `rows` rows, each with a BASE and a STATUS cell; their keys.
async fn write(server: &Server, token: Option<&str>, rows: usize) -> Vec<String> {
    let keys: Vec<String> = (0..rows)
        .map(|_| uuid::Uuid::new_v4().to_string())
        .collect();
    let cells: Vec<Value> = keys
        .iter()
        .flat_map(|k| {
            ["BASE", "STATUS"]
                .map(|c| json!({"rowKey": k, "column": c, "refKey": 1, "body": {"k": k}}))
        })
        .collect();
    let mut request = client().post(server.graphql());
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer: Value = request
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
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_at_random_points_resumes_without_missing_a_cell() {
    let server = Server::start_with(&[TRIPS], "", &[]);
    // Writes run while the client follows, in batches of random size.
    let (done_tx, mut done_rx) = tokio::sync::oneshot::channel::<BTreeSet<String>>();
    let server = std::sync::Arc::new(server);
    let writing = server.clone();
    tokio::spawn(async move {
        let mut written = BTreeSet::new();
        for _ in 0..40 {
            let (n, pause) = {
                let mut rng = rand::thread_rng();
                (rng.gen_range(1..12), rng.gen_range(0..30))
            };
            written.extend(write(&writing, None, n).await);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        let _ = done_tx.send(written);
    });
    // From the beginning of every shard: the cursor of no positions.
    let mut cursor = cellgate_store::triggers::tail::encode_cursor(&BTreeMap::new());
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    let mut written: Option<BTreeSet<String>> = None;
    let mut cuts = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    'connections: loop {
        let mut socket = connect(&server).await;
        init(&mut socket, json!({})).await;
        send(
            &mut socket,
            json!({"id": "1", "type": "subscribe", "payload": {"query": SUBSCRIBE, "variables": {"after": cursor}}}),
        )
        .await;
        let cut_after = rand::thread_rng().gen_range(1..40);
        let mut events = 0;
        loop {
            assert!(
                std::time::Instant::now() < deadline,
                "gave up: {} rows seen",
                seen.len()
            );
            if written.is_none() {
                if let Ok(all) = done_rx.try_recv() {
                    written = Some(all);
                }
            }
            if let Some(all) = &written {
                if all.iter().all(|k| seen.contains_key(k)) {
                    break 'connections;
                }
            }
            let message = tokio::select! {
                message = receive(&mut socket) => message,
                _ = tokio::time::sleep(Duration::from_millis(200)) => continue,
            };
            let message = message.unwrap_or_else(|code| panic!("closed with {code}"));
            assert_eq!(message["type"], "next", "{message}");
            let event = &message["payload"]["data"]["tripsCells"];
            let cell = &event["cell"];
            assert_eq!(cell["column"], "BASE", "{message}");
            let shard = cell["shard"].as_i64().unwrap();
            let added_id: i64 = cell["addedId"].as_str().unwrap().parse().unwrap();
            let previous = last.insert(shard, added_id).unwrap_or(0);
            assert!(
                added_id > previous,
                "shard {shard} went back: {previous} then {added_id}"
            );
            *seen
                .entry(cell["rowKey"].as_str().unwrap().to_string())
                .or_default() += 1;
            cursor = event["cursor"].as_str().unwrap().to_string();
            events += 1;
            if events >= cut_after {
                // Cut the socket without a close handshake.
                drop(socket);
                cuts += 1;
                continue 'connections;
            }
        }
    }
    let written = written.unwrap();
    assert!(cuts > 3, "only {cuts} cuts");
    assert_eq!(
        seen.len(),
        written.len(),
        "rows seen that were never written"
    );
    // Every event's cursor resumes right after it: nothing comes twice.
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "seen more than once: {twice:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_close_with_the_protocol_codes() {
    let mut yaml = String::from("auth:\n  enabled: true\n  tokens:\n");
    let mut secrets = Vec::new();
    for (name, scope) in [
        ("reader", "trips:read"),
        ("stranger", "other:read"),
        ("writer", "trips:write"),
    ] {
        let token = tokens::generate();
        yaml.push_str(&format!(
            "    - {{ name: {name}, hash: \"{}\", scopes: [\"{scope}\"] }}\n",
            token.hash
        ));
        secrets.push(token.token);
    }
    yaml.push_str("limits:\n  max_subscriptions_per_connection: 2\n");
    let server = Server::start_with(&[TRIPS], &yaml, &[]);
    let (reader, stranger) = (&secrets[0], &secrets[1]);
    let subscribe =
        |id: &str| json!({"id": id, "type": "subscribe", "payload": {"query": SUBSCRIBE}});

    // No token, or an unknown one: 4403.
    for payload in [
        json!({}),
        json!({"Authorization": "Bearer cg_0000000000000000_nope"}),
    ] {
        let mut socket = connect(&server).await;
        send(
            &mut socket,
            json!({"type": "connection_init", "payload": payload}),
        )
        .await;
        assert_eq!(receive(&mut socket).await, Err(4403));
    }
    // A subscribe before the ack: 4401.
    let mut socket = connect(&server).await;
    send(&mut socket, subscribe("1")).await;
    assert_eq!(receive(&mut socket).await, Err(4401));
    // Not a protocol message: 4400.
    let mut socket = connect(&server).await;
    send(&mut socket, json!({"type": "nonsense"})).await;
    assert_eq!(receive(&mut socket).await, Err(4400));
    // A second init: 4429.
    let mut socket = connect(&server).await;
    init(
        &mut socket,
        json!({"Authorization": format!("Bearer {reader}")}),
    )
    .await;
    send(&mut socket, json!({"type": "connection_init"})).await;
    assert_eq!(receive(&mut socket).await, Err(4429));

    // The token without `read` on trips: a FORBIDDEN error, the connection
    // stays; ping is answered.
    let mut socket = connect(&server).await;
    init(&mut socket, json!({"token": stranger})).await;
    send(&mut socket, subscribe("1")).await;
    let error = receive(&mut socket).await.unwrap();
    assert_eq!(error["type"], "error", "{error}");
    assert_eq!(
        error["payload"][0]["extensions"]["code"], "FORBIDDEN",
        "{error}"
    );
    send(&mut socket, json!({"type": "ping", "payload": {"n": 1}})).await;
    assert_eq!(
        receive(&mut socket).await,
        Ok(json!({"type": "pong", "payload": {"n": 1}}))
    );

    // The reader: two subscriptions run, a third is over the limit, a
    // second one with a running id closes with 4409.
    let mut socket = connect(&server).await;
    init(
        &mut socket,
        json!({"Authorization": format!("Bearer {reader}")}),
    )
    .await;
    send(&mut socket, subscribe("a")).await;
    send(&mut socket, subscribe("b")).await;
    send(&mut socket, subscribe("c")).await;
    let error = receive(&mut socket).await.unwrap();
    assert_eq!(error["id"], "c", "{error}");
    assert_eq!(
        error["payload"][0]["extensions"]["code"], "SUBSCRIPTION_LIMIT",
        "{error}"
    );
    // The running ones deliver.
    write(&server, Some(&secrets[2]), 1).await;
    let mut ids = BTreeSet::new();
    for _ in 0..2 {
        let next = receive(&mut socket).await.unwrap();
        assert_eq!(next["type"], "next", "{next}");
        ids.insert(next["id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids, BTreeSet::from(["a".to_string(), "b".to_string()]));
    send(&mut socket, subscribe("a")).await;
    assert_eq!(receive(&mut socket).await, Err(4409));
    // The token in the upgrade request's Authorization header also counts.
    let authorization = format!("Bearer {reader}");
    let mut socket = try_connect(&server, &[("Authorization", &authorization)])
        .await
        .unwrap();
    init(&mut socket, json!({})).await;
}

/// The value of the series `name{datastore="trips"}` (or `name` without
/// labels) in the server's `/metrics`; 0 when absent.
async fn metric(server: &Server, name: &str) -> f64 {
    let text = client()
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| line.rsplit_once(' '))
        .filter(|(series, _)| {
            *series == format!("{name}{{datastore=\"trips\"}}")
                || series.starts_with(&format!("{name}{{cluster="))
        })
        .map(|(_, value)| value.parse::<f64>().expect("a number"))
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_resolve_their_rows_in_one_read_per_burst_and_the_metrics_count_it() {
    let server = Server::start_with(&[TRIPS], "", &[]);
    assert_eq!(
        metric(&server, "cellgate_subscription_followers").await,
        0.0
    );
    let mut socket = connect(&server).await;
    init(&mut socket, json!({})).await;
    let query = "subscription { tripsCells(columns: [BASE]) {
        cell { rowKey }
        row { rowKey status { column body } base { refKey } }
    } }";
    send(
        &mut socket,
        json!({"id": "1", "type": "subscribe", "payload": {"query": query}}),
    )
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while metric(&server, "cellgate_subscription_followers").await < 1.0 {
        assert!(std::time::Instant::now() < deadline, "never followed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tail_reads = metric(&server, "cellgate_subscription_tail_reads_total").await;
    let delivered = metric(&server, "cellgate_subscription_delivered_cells_total").await;
    let statements = metric(&server, "cellgate_storage_statements_total").await;

    // One commit of 40 rows (BASE and STATUS each): one burst of 40 events.
    let rows = 40;
    let keys: BTreeSet<String> = write(&server, None, rows).await.into_iter().collect();
    let mut seen = BTreeSet::new();
    for _ in 0..rows {
        let message = receive(&mut socket).await.expect("an event");
        assert_eq!(message["type"], "next", "{message}");
        let event = &message["payload"]["data"]["tripsCells"];
        let key = event["cell"]["rowKey"].as_str().unwrap().to_string();
        // The row's other column, written in the same commit.
        assert_eq!(event["row"]["rowKey"], key.as_str(), "{message}");
        assert_eq!(event["row"]["status"]["column"], "STATUS", "{message}");
        assert_eq!(
            event["row"]["status"]["body"],
            json!({"k": key}),
            "{message}"
        );
        assert_eq!(event["row"]["base"]["refKey"], "1", "{message}");
        seen.insert(key);
    }
    assert_eq!(seen, keys);
    // The write (a handful), one tail read, one read of the burst's rows,
    // and perhaps a sweep of the shard heads: never one per event.
    let spent = metric(&server, "cellgate_storage_statements_total").await - statements;
    assert!(
        spent < rows as f64 / 2.0,
        "{spent} statements for {rows} events"
    );
    assert!(metric(&server, "cellgate_subscription_tail_reads_total").await > tail_reads);
    assert_eq!(
        metric(&server, "cellgate_subscription_delivered_cells_total").await - delivered,
        rows as f64
    );

    // A second subscriber from the beginning reads the log itself first.
    assert_eq!(
        metric(&server, "cellgate_subscription_catch_up_reads_total").await,
        0.0
    );
    let from_start = cellgate_store::triggers::tail::encode_cursor(&BTreeMap::new());
    send(
        &mut socket,
        json!({"id": "2", "type": "subscribe", "payload": {"query": SUBSCRIBE, "variables": {"after": from_start}}}),
    )
    .await;
    for _ in 0..rows {
        let message = receive(&mut socket).await.expect("an event");
        assert_eq!(message["id"], "2", "{message}");
    }
    assert_eq!(
        metric(&server, "cellgate_subscription_followers").await,
        2.0
    );
    assert!(metric(&server, "cellgate_subscription_catch_up_reads_total").await > 0.0);
    assert_eq!(
        metric(&server, "cellgate_subscription_lagged_total").await,
        0.0
    );
    drop(socket);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while metric(&server, "cellgate_subscription_followers").await > 0.0 {
        assert!(std::time::Instant::now() < deadline, "followers stay");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
