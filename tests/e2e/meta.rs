//! `Query.datastores` and the `--demo` server.

use std::sync::Arc;

use serde_json::{json, Value};

use crate::harness::{Defs, Env, Wait};

pub async fn datastores_describe_definitions_and_topology(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let data = server
        .data(
            "{ datastores {
                name graphqlField shards
                columns { name graphqlName }
                indexes { name graphqlField shardField columns fields { name graphqlName path type column } }
                topology { first last cluster }
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
    }
}

/// The driver of the demo data.
const DEMO_DRIVER: &str = "5f0c8a4e-6d1b-4c2e-9a57-3b8e1d2c4f60";

pub async fn demo_server_answers_the_first_query(env: Arc<Env>) {
    let server = env.serve(Defs::Repo, &["--demo"]);
    let query =
        "query($driver: UUID!) { trips { driverPartnerIndex(driverPartnerUuid: $driver, first: 5) {
        edges { node { rowKey driverPartnerUuid tripCreatedAt row { base { body } } } }
        pageInfo { hasNextPage }
    } } }";
    let wait = Wait::new("the demo driver's trips");
    let edges = loop {
        let data = server.data(query, json!({ "driver": DEMO_DRIVER })).await;
        let index = &data["trips"]["driverPartnerIndex"];
        if index["edges"].as_array().is_some_and(|e| e.len() == 5) {
            break index["edges"].clone();
        }
        wait.tick(index).await;
    };
    for edge in edges.as_array().expect("edges") {
        let node = &edge["node"];
        assert_eq!(node["driverPartnerUuid"], DEMO_DRIVER, "{node}");
        assert!(node["tripCreatedAt"].is_string(), "{node}");
        assert_eq!(
            node["row"]["base"]["body"]["driver_partner_uuid"], DEMO_DRIVER,
            "{node}"
        );
    }
}
