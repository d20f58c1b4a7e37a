//! IDs through the real binary: the GraphQL fields, the admin mutation,
//! the Leaf-style plain routes and their metrics.

use std::collections::HashSet;
use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::json;

use crate::harness::{assert_code, Defs, Env};

fn int64s(value: &serde_json::Value) -> Vec<i64> {
    value
        .as_array()
        .expect("a list")
        .iter()
        .map(|v| {
            v.as_str()
                .expect("Int64 as a string")
                .parse()
                .expect("decimal")
        })
        .collect()
}

pub async fn ids_over_graphql_and_leaf_routes(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);

    let unknown = server
        .request("{ nextIds(bizTag: \"order\", count: 2) }", json!({}))
        .await;
    assert_code(&unknown, "UNKNOWN_BIZ_TAG");
    let (status, body) = server.get_text("/api/segment/get/order").await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert!(body.starts_with("UNKNOWN_BIZ_TAG"), "{body}");

    let created = server
        .data(
            "mutation { createIdTag(bizTag: \"order\", step: \"1000\", description: \"orders\") }",
            json!({}),
        )
        .await;
    assert_eq!(created["createIdTag"], true);

    let mut seen = HashSet::new();
    let data = server
        .data("{ nextIds(bizTag: \"order\", count: 150) }", json!({}))
        .await;
    let from_graphql = int64s(&data["nextIds"]);
    assert_eq!(from_graphql.len(), 150);
    assert_eq!(from_graphql[0], 1);
    assert!(from_graphql.windows(2).all(|w| w[0] < w[1]));
    seen.extend(from_graphql.iter().copied());
    let (status, body) = server.get_text("/api/segment/get/order").await;
    assert_eq!(status, StatusCode::OK);
    let bare: i64 = body.trim().parse().expect("a bare number");
    assert!(seen.insert(bare));
    let (status, body) = server.get_text("/api/segment/get/order?count=300").await;
    assert_eq!(status, StatusCode::OK);
    let lines: Vec<i64> = body.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(lines.len(), 300);
    for id in lines {
        assert!(seen.insert(id), "{id} twice");
    }

    // The worker id is leased in the background; a loaded machine may
    // answer the first requests before it is.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (status, body) = loop {
        let (status, body) = server.get_text("/api/snowflake/get/any?count=3").await;
        if status != StatusCode::SERVICE_UNAVAILABLE || std::time::Instant::now() > deadline {
            break (status, body);
        }
        assert!(body.starts_with("ID_SOURCE_UNAVAILABLE"), "{body}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(status, StatusCode::OK, "{body}");
    let snowflakes: Vec<i64> = body.lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(snowflakes.len(), 3);
    let data = server
        .data(
            "query($id: Int64!) { snowflakeIds(count: 2) decodeId(id: $id) { kind version shard workerId sequence time } }",
            json!({ "id": snowflakes[2].to_string() }),
        )
        .await;
    assert!(int64s(&data["snowflakeIds"])[0] > snowflakes[2]);
    assert_eq!(data["decodeId"]["kind"], "SNOWFLAKE");
    assert_eq!(data["decodeId"]["sequence"], 2);
    assert_eq!(data["decodeId"]["shard"], json!(null));

    let row = "7d0b2b1e-4c3a-4a8e-9b59-1a2b3c4d5e6f";
    let data = server
        .data(
            "query($row: UUID!) { taggedIds(datastore: \"trips\", rowKey: $row, count: 1) }",
            json!({ "row": row }),
        )
        .await;
    let tagged = int64s(&data["taggedIds"])[0];
    let data = server
        .data(
            "query($id: Int64!) { decodeId(id: $id) { kind version shard } }",
            json!({ "id": tagged.to_string() }),
        )
        .await;
    assert_eq!(data["decodeId"]["kind"], "TAGGED");
    assert_eq!(data["decodeId"]["version"], 1);
    // trips has 8 shards in the small definitions; the row's shard by the
    // stable hash of shards.rs.
    let uuid = uuid::Uuid::parse_str(row).unwrap();
    let shard = cellgate_store::shards::row_shard(&uuid, 8);
    assert_eq!(data["decodeId"]["shard"], shard);

    let refused = server
        .request("{ nextIds(bizTag: \"order\", count: 100000) }", json!({}))
        .await;
    assert_code(&refused, "LIMIT_EXCEEDED");

    let (_, metrics) = server.get_text("/metrics").await;
    assert!(
        metrics.contains("cellgate_ids_issued_total{tag=\"order\"} 451"),
        "{metrics}"
    );
    assert!(metrics.contains("cellgate_ids_boundary_waits_total{tag=\"order\"} 0"));
    assert!(metrics.contains("cellgate_ids_snowflake_lease{state=\"held\"} 1"));
    assert!(metrics.contains("cellgate_ids_snowflake_worker_id "));
}

/// Asks `server` for snowflake IDs until it has a worker id.
async fn first_snowflake(server: &crate::harness::Server) -> i64 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (status, body) = server.get_text("/api/snowflake/get/any").await;
        if status == StatusCode::OK {
            return body.trim().parse().expect("a bare number");
        }
        assert!(body.starts_with("ID_SOURCE_UNAVAILABLE"), "{body}");
        assert!(std::time::Instant::now() < deadline, "no worker id: {body}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The worker id `server` reads out of `id`.
async fn worker_of(server: &crate::harness::Server, id: i64) -> i64 {
    let data = server
        .data(
            "query($id: Int64!) { decodeId(id: $id) { workerId } }",
            json!({ "id": id.to_string() }),
        )
        .await;
    data["decodeId"]["workerId"].as_i64().expect("worker id")
}

// Regression: a second gateway on the data directory of a running one
// took the first one's holder name from the worker cache, renewed its
// lease and issued snowflake IDs with the same worker id.
pub async fn two_gateways_on_one_data_directory_issue_no_duplicate(env: Arc<Env>) {
    let first = env.serve(Defs::Small, &[]);
    let first_id = first_snowflake(&first).await;
    assert!(env.data_dir().join("snowflake-worker.json").exists());
    let second = env.serve(Defs::Small, &[]);
    let second_id = first_snowflake(&second).await;
    assert_ne!(
        worker_of(&first, first_id).await,
        worker_of(&second, second_id).await,
        "two processes, one worker id"
    );
    // Both issue under load, through both surfaces, at once.
    let servers = [Arc::new(first), Arc::new(second)];
    let mut tasks = Vec::new();
    for server in &servers {
        for client in 0..3 {
            let server = server.clone();
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                for _ in 0..15 {
                    if client == 0 {
                        let (status, body) =
                            server.get_text("/api/snowflake/get/any?count=1000").await;
                        assert_eq!(status, StatusCode::OK, "{body}");
                        out.extend(body.lines().map(|l| l.parse::<i64>().unwrap()));
                    } else {
                        let data = server
                            .data("{ snowflakeIds(count: 1000) }", json!({}))
                            .await;
                        out.extend(int64s(&data["snowflakeIds"]));
                    }
                }
                out
            }));
        }
    }
    let mut seen = HashSet::new();
    for task in tasks {
        for id in task.await.expect("client") {
            assert!(seen.insert(id), "{id} issued twice");
        }
    }
    assert_eq!(seen.len(), 2 * 3 * 15 * 1000);
}
