//! `Query.datastores` and the `--demo` server.

use std::sync::Arc;

use serde_json::{json, Value};
use sqlx::Connection as _;

use crate::harness::{root, Backend, Defs, Env, Wait};

pub async fn datastores_describe_definitions_and_topology(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let data = server
        .data(
            "{ datastores {
                name graphqlField shards
                columns { name graphqlName }
                indexes { name graphqlField shardField columns fields { name graphqlName path type column } }
                topology { first last cluster }
                topologyVersion move { phase }
            } }",
            json!({}),
        )
        .await;
    let datastores = data["datastores"].as_array().expect("datastores");
    let names: Vec<&str> = datastores
        .iter()
        .map(|d| d["name"].as_str().expect("name"))
        .collect();
    for name in ["trips", "payments", "items"] {
        assert!(names.contains(&name), "{name} missing: {names:?}");
    }
    let trips = datastores
        .iter()
        .find(|d| d["name"] == "trips")
        .expect("trips");
    assert_eq!(trips["graphqlField"], "trips");
    assert_eq!(trips["shards"], 8);
    assert_eq!(
        trips["columns"],
        json!([
            {"name": "BASE", "graphqlName": "base"},
            {"name": "STATUS", "graphqlName": "status"},
            {"name": "NOTES", "graphqlName": "notes"},
            {"name": "FARE_ADJUSTMENT", "graphqlName": "fareAdjustment"},
        ])
    );
    let index = |name: &str| -> Value {
        trips["indexes"]
            .as_array()
            .expect("indexes")
            .iter()
            .find(|i| i["name"] == name)
            .unwrap_or_else(|| panic!("index {name} missing: {trips}"))
            .clone()
    };
    assert_eq!(
        index("driver_partner_index"),
        json!({
            "name": "driver_partner_index",
            "graphqlField": "driverPartnerIndex",
            "shardField": "driver_partner_uuid",
            "columns": ["BASE"],
            "fields": [
                {"name": "driver_partner_uuid", "graphqlName": "driverPartnerUuid", "path": "driver_partner_uuid", "type": "UUID", "column": "BASE"},
                {"name": "city_uuid", "graphqlName": "cityUuid", "path": "city_uuid", "type": "UUID", "column": "BASE"},
                {"name": "trip_created_at", "graphqlName": "tripCreatedAt", "path": "trip_created_at", "type": "datetime", "column": "BASE"},
            ],
        })
    );
    let city = index("city_trips_index");
    assert_eq!(city["graphqlField"], "cityTripsIndex");
    assert_eq!(city["shardField"], "city_uuid");
    assert_eq!(city["columns"], json!(["BASE", "STATUS"]));
    let fare = city["fields"]
        .as_array()
        .expect("fields")
        .iter()
        .find(|f| f["name"] == "fare_total")
        .expect("fare_total");
    assert_eq!(
        fare,
        &json!({"name": "fare_total", "graphqlName": "fareTotal", "path": "fare.total", "type": "float", "column": "BASE"})
    );
    let payments = datastores
        .iter()
        .find(|d| d["name"] == "payments")
        .expect("payments");
    let refunds = payments["indexes"]
        .as_array()
        .expect("indexes")
        .iter()
        .find(|i| i["name"] == "refunds_by_reason_index")
        .expect("refunds_by_reason_index");
    assert_eq!(refunds["shardField"], "merchant_uuid", "{refunds}");

    // The topology covers every shard once, on named clusters, without
    // connection details.
    for datastore in datastores {
        let shards = datastore["shards"].as_i64().expect("shards");
        let mut ranges: Vec<(i64, i64, String)> = datastore["topology"]
            .as_array()
            .expect("topology")
            .iter()
            .map(|r| {
                (
                    r["first"].as_i64().expect("first"),
                    r["last"].as_i64().expect("last"),
                    r["cluster"].as_str().expect("cluster").to_string(),
                )
            })
            .collect();
        ranges.sort();
        let mut next = 0;
        for (first, last, cluster) in &ranges {
            assert_eq!(*first, next, "{datastore}");
            assert!(last >= first, "{datastore}");
            assert!(!cluster.is_empty(), "{datastore}");
            for leak in ["://", "@", "/", "127.0.0.1"] {
                assert!(
                    !cluster.contains(leak),
                    "the cluster name shows connection details: {datastore}"
                );
            }
            next = last + 1;
        }
        assert_eq!(next, shards, "{datastore}");
        // Served from the stored topology's first version; no move recorded.
        assert_eq!(datastore["topologyVersion"], 1, "{datastore}");
        assert_eq!(datastore["move"], Value::Null, "{datastore}");
    }
}

/// The driver of the demo data, the one the README's first query names.
const DEMO_DRIVER: &str = "5f0c8a4e-6d1b-4c2e-9a57-3b8e1d2c4f60";

/// The first ```graphql block of README.md.
fn readme_first_query() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let start = readme
        .find("```graphql\n")
        .expect("README.md has a ```graphql block")
        + "```graphql\n".len();
    let end = readme[start..].find("```").expect("the block ends") + start;
    readme[start..end].to_string()
}

pub async fn demo_server_answers_the_readme_query(env: Arc<Env>) {
    let server = env.serve(Defs::Repo, &["--demo"]);
    let query = readme_first_query();
    assert!(query.contains(DEMO_DRIVER), "{query}");
    // Index entries of the demo data appear shortly after start-up.
    let wait = Wait::new("the README query's answer");
    let edges = loop {
        let data = server.data(&query, json!({})).await;
        let index = &data["trips"]["driverPartnerIndex"];
        let edges = index["edges"].as_array().cloned().unwrap_or_default();
        if edges.len() == 3 {
            assert_eq!(index["pageInfo"]["hasNextPage"], true, "{index}");
            assert!(index["pageInfo"]["endCursor"].is_string(), "{index}");
            break edges;
        }
        wait.tick(index).await;
    };
    let mut times = Vec::new();
    for edge in &edges {
        let node = &edge["node"];
        assert!(node["rowKey"].is_string(), "{node}");
        let base = &node["row"]["base"]["body"];
        assert_eq!(base["driver_partner_uuid"], DEMO_DRIVER, "{node}");
        assert!(base["trip_created_at"].is_string(), "{node}");
        let at = node["tripCreatedAt"].as_str().expect("tripCreatedAt");
        assert!(at >= "2024-03-05T00:00:00Z", "{node}");
        times.push(at.to_string());
    }
    assert!(
        times.windows(2).all(|w| w[0] >= w[1]),
        "not newest first: {times:?}"
    );
}

/// A MariaDB/MySQL cluster whose InnoDB buffer pool has the default size
/// gets a start-up warning (index maintenance falls behind writes once the
/// tables outgrow it); larger pools and the other backends get none.
pub async fn a_default_innodb_buffer_pool_is_warned_about(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let expected = match env.backend {
        Backend::MySql => {
            let url = std::env::var("CELLGATE_TEST_MYSQL_URL").expect("set for this backend");
            let mut conn = sqlx::MySqlConnection::connect(&url)
                .await
                .expect("MySQL answers");
            let (bytes,): (i64,) =
                sqlx::query_as("SELECT CAST(@@innodb_buffer_pool_size AS SIGNED)")
                    .fetch_one(&mut conn)
                    .await
                    .expect("the buffer pool size");
            bytes <= 128 << 20
        }
        _ => false,
    };
    // The check runs before the cluster is marked ready.
    let wait = Wait::new("/readyz");
    loop {
        let (status, body) = server.get_text("/readyz").await;
        if status == reqwest::StatusCode::OK {
            break;
        }
        wait.tick(&body).await;
    }
    let stderr = server.stderr();
    let warned = stderr.contains("innodb_buffer_pool_size");
    assert_eq!(warned, expected, "{:?}: {stderr}", env.backend);
}
