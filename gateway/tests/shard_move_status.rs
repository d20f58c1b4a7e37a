//! A shard move as a serving gateway shows it: `cellgate serve --demo` on
//! two SQLite clusters, `cellgate shard move --keep-source` run beside it,
//! then `/metrics` and `Query.datastores` report the new topology version,
//! the move (recorded at phase `done` until it is finished) and the shard
//! ranges as served now, not as they were when the schema was built.

#[path = "support/server.rs"]
mod server;

use std::ffi::OsString;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use server::{cellgate, client, root, Server};

/// `payments` has 256 shards, split evenly: `a` holds 0-127, `b` the rest.
const CONFIG: &str = "storage:
  clusters:
    - name: a
      master: sqlite://{dir}/a.db
    - name: b
      master: sqlite://{dir}/b.db
";

const DATASTORES: &str = "{ datastores {
    name topologyVersion
    topology { first last cluster }
    move { first last source target phase startedAt cellsCopied keepSource }
} }";

async fn scrape(server: &Server) -> String {
    let response = client().get(server.url("/metrics")).send().await.unwrap();
    assert!(response.status().is_success());
    response.text().await.unwrap()
}

/// The value of the series `series` (name and labels, as printed).
fn metric_value(text: &str, series: &str) -> Option<i64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().expect("an integer"))
}

async fn payments(server: &Server) -> Value {
    let body: Value = client()
        .post(server.graphql())
        .json(&json!({ "query": DATASTORES }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(body.get("errors").is_none(), "{body}");
    body["data"]["datastores"]
        .as_array()
        .expect("datastores")
        .iter()
        .find(|d| d["name"] == "payments")
        .expect("payments")
        .clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_move_shows_in_metrics_and_in_the_datastores_query() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("cellgate.yaml");
    std::fs::write(
        &config,
        CONFIG.replace("{dir}", &dir.path().display().to_string()),
    )
    .expect("cellgate.yaml");
    let store_args: Vec<OsString> = vec![
        "--data".into(),
        dir.path().join("data").into(),
        "--datastores".into(),
        root().join("datastores").into(),
        "--config".into(),
        config.into(),
    ];
    let mut serve_args = store_args.clone();
    serve_args.push("--demo".into());
    let server = Server::start_in(dir, serve_args);

    let text = scrape(&server).await;
    let before = metric_value(&text, r#"cellgate_topology_version{datastore="payments"}"#)
        .unwrap_or_else(|| panic!("no topology version in:\n{text}"));
    assert!(before >= 1, "{text}");
    assert!(
        text.contains("# TYPE cellgate_shard_move_phase gauge"),
        "{text}"
    );
    assert!(!text.contains("cellgate_shard_move_phase{"), "{text}");
    let info = payments(&server).await;
    assert_eq!(info["topologyVersion"], before, "{info}");
    assert_eq!(info["move"], Value::Null, "{info}");
    assert_eq!(
        info["topology"],
        json!([
            {"first": 0, "last": 127, "cluster": "a"},
            {"first": 128, "last": 255, "cluster": "b"},
        ])
    );

    let moved = cellgate(server.dir.path())
        .args([
            "shard",
            "move",
            "--datastore",
            "payments",
            "--shards",
            "0-127",
        ])
        .args(["--to", "b", "--keep-source"])
        .args(&store_args)
        .output()
        .expect("run cellgate shard move");
    assert!(
        moved.status.success(),
        "cellgate shard move failed:\n{}\n{}",
        String::from_utf8_lossy(&moved.stdout),
        String::from_utf8_lossy(&moved.stderr)
    );

    // The gateway follows the stored topology within a poll or two.
    let phase = r#"cellgate_shard_move_phase{datastore="payments",shards="0-127",source="a",target="b",phase="done"}"#;
    let deadline = Instant::now() + Duration::from_secs(30);
    let text = loop {
        let text = scrape(&server).await;
        if metric_value(&text, phase).is_some() {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "the move is not in /metrics:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(metric_value(&text, phase), Some(1));
    let after = metric_value(&text, r#"cellgate_topology_version{datastore="payments"}"#)
        .expect("topology version");
    assert!(after > before, "{before} -> {after}");
    let copied = metric_value(
        &text,
        r#"cellgate_shard_move_cells_copied{datastore="payments"}"#,
    )
    .expect("cells copied");
    assert!(copied > 0, "the demo's payments on shards 0-127 are copied");
    assert!(
        !text.contains(r#"cellgate_shard_move_phase{datastore="trips""#),
        "{text}"
    );

    let info = payments(&server).await;
    assert_eq!(info["topologyVersion"], after, "{info}");
    let record = &info["move"];
    assert_eq!(
        (
            &record["first"],
            &record["last"],
            &record["source"],
            &record["target"]
        ),
        (&json!(0), &json!(127), &json!("a"), &json!("b")),
        "{info}"
    );
    assert_eq!(record["phase"], "done", "{info}");
    assert_eq!(record["keepSource"], true, "{info}");
    assert_eq!(record["cellsCopied"], copied.to_string(), "{info}");
    let started = record["startedAt"].as_str().expect("startedAt");
    assert!(
        chrono::DateTime::parse_from_rfc3339(started).is_ok(),
        "{started}"
    );
    assert_eq!(
        info["topology"],
        json!([{"first": 0, "last": 255, "cluster": "b"}]),
        "the ranges served now"
    );
}
