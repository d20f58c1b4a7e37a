//! Bad requests and bad inputs: every one is an error with a code (and, by
//! the harness's check, no SQL or path), at the HTTP status the
//! GraphQL-over-HTTP spec gives it.

use std::sync::Arc;

use reqwest::StatusCode;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::harness::{codes, Accept, Defs, Env, Server, Wait};

/// Checks that the request failed before execution: errors with `code` and
/// no data at all (a request error), answered 200 for `application/json`
/// and 400 for `application/graphql-response+json`. Failures are collected.
async fn request_error(server: &Server, body: &Value, code: &str, failures: &mut Vec<String>) {
    for (accept, status) in [
        (Accept::Json, StatusCode::OK),
        (Accept::GraphqlResponse, StatusCode::BAD_REQUEST),
    ] {
        let (got, response) = server.post_raw(&body.to_string(), accept).await;
        let codes = codes(&response);
        if got != status
            || codes.is_empty()
            || codes.iter().any(|c| c != code)
            || response.get("data").is_some()
        {
            failures.push(format!(
                "expected a request error {code}, status {status}, no data\n  request ({accept:?}): {body}\n  response ({got}): {response}"
            ));
        }
    }
}

fn assert_none_failed(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

pub async fn invalid_inputs_are_coded_errors(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let row = Uuid::new_v4();
    const VALIDATION: &str = "GRAPHQL_VALIDATION_FAILED";
    let mut failures = Vec::new();

    // Invalid UUIDs: literal, variable, shard field, list, where.
    for (query, variables) in [
        (
            r#"{ trips { row(rowKey: "not-a-uuid") { rowKey } } }"#,
            json!({}),
        ),
        (
            r#"{ trips { row(rowKey: "7d0b2b1e-4c3a-4a8e-9b59-1a2b3c4d5e6") { rowKey } } }"#,
            json!({}),
        ),
        (
            "query($k: UUID!) { trips { row(rowKey: $k) { rowKey } } }",
            json!({ "k": "not-a-uuid" }),
        ),
        (
            "query($k: UUID!) { trips { row(rowKey: $k) { rowKey } } }",
            json!({ "k": 42 }),
        ),
        (
            r#"{ trips { driverPartnerIndex(driverPartnerUuid: "zz") { edges { cursor } } } }"#,
            json!({}),
        ),
        (
            "query($ks: [UUID!]!) { trips { rows(rowKeys: $ks) { rowKey } } }",
            json!({ "ks": [Uuid::new_v4(), "nope"] }),
        ),
        (
            "query($w: ItemsItemsIndexWhere) { items { itemsIndex(owner: \"o\", where: $w) { edges { cursor } } } }",
            json!({ "w": { "u": { "eq": "nope" } } }),
        ),
    ] {
        let body = json!({ "query": query, "variables": variables });
        request_error(&server, &body, VALIDATION, &mut failures).await;
    }

    // Invalid datetimes: literal, variable, where; and in a filter string,
    // where the text is only known to be a datetime once parsed.
    for (query, variables) in [
        (
            r#"{ trips { cellsForShard(shard: 0, since: "yesterday") { next } } }"#,
            json!({}),
        ),
        (
            r#"{ trips { cellsForShard(shard: 0, since: "2024-02-30T00:00:00Z") { next } } }"#,
            json!({}),
        ),
        (
            "query($s: DateTime) { trips { cellsForShard(shard: 0, since: $s) { next } } }",
            json!({ "s": "2024-01-01 25:00" }),
        ),
        (
            "query($w: ItemsItemsIndexWhere) { items { itemsIndex(owner: \"o\", where: $w) { edges { cursor } } } }",
            json!({ "w": { "t": { "gte": "2024-13-01T00:00:00Z" } } }),
        ),
    ] {
        let body = json!({ "query": query, "variables": variables });
        request_error(&server, &body, VALIDATION, &mut failures).await;
    }
    for filter in [
        r#"t >= "not a date""#,
        r#"u = "not-a-uuid""#,
        r#"n = "12x""#,
    ] {
        let response = server
            .request(
                "query($f: String) { items { itemsIndex(owner: \"o\", filter: $f) { edges { cursor } } } }",
                json!({ "f": filter }),
            )
            .await;
        if codes(&response) != ["BAD_USER_INPUT"] {
            failures.push(format!(
                "filter `{filter}`: expected BAD_USER_INPUT, got {response}"
            ));
        }
    }

    // Malformed query text.
    for query in [
        "{ trips { row(rowKey: ",
        "query { trips { history(rowKey: \"x\", column: BASE) { refKey } } } }",
        "",
    ] {
        let body = json!({ "query": query });
        request_error(&server, &body, "GRAPHQL_PARSE_FAILED", &mut failures).await;
    }

    // Variables of the wrong type, missing, or unknown fields and arguments.
    for (query, variables) in [
        (
            format!("query($n: Int) {{ trips {{ history(rowKey: \"{row}\", column: BASE, first: $n) {{ refKey }} }} }}"),
            json!({ "n": "ten" }),
        ),
        (
            format!("query($c: TripsColumn!) {{ trips {{ latestCell(rowKey: \"{row}\", column: $c) {{ refKey }} }} }}"),
            json!({ "c": "BASEE" }),
        ),
        (
            "query($k: UUID!) { trips { row(rowKey: $k) { rowKey } } }".to_string(),
            json!({}),
        ),
        (
            "query($k: UUID!) { trips { row(rowKey: $k) { rowKey } } }".to_string(),
            json!({ "k": null }),
        ),
        ("{ trips { nope } }".to_string(), json!({})),
        (format!("{{ trips {{ row(rowKey: \"{row}\", nope: 1) {{ rowKey }} }} }}"), json!({})),
        ("{ trips { row { rowKey } } }".to_string(), json!({})),
        (format!("{{ trips {{ latestCell(rowKey: \"{row}\", column: base) {{ refKey }} }} }}"), json!({})),
    ] {
        let body = json!({ "query": query, "variables": variables });
        request_error(&server, &body, VALIDATION, &mut failures).await;
    }

    // Malformed requests: not JSON, variables that are not an object.
    for body in [
        r#"{"query": "{ datastores { name } }""#.to_string(),
        json!({ "query": "{ datastores { name } }", "variables": "{not json" }).to_string(),
        json!({ "query": "{ datastores { name } }", "variables": [1] }).to_string(),
        json!({ "query": 7 }).to_string(),
        json!({ "variables": {} }).to_string(),
    ] {
        for accept in [Accept::Json, Accept::GraphqlResponse] {
            let (status, response) = server.post_raw(&body, accept).await;
            if status != StatusCode::BAD_REQUEST || codes(&response).is_empty() {
                failures.push(format!(
                    "expected 400 with a code\n  request ({accept:?}): {body}\n  response ({status}): {response}"
                ));
            }
        }
    }
    assert_none_failed(&failures);
}

pub async fn query_errors_have_stable_codes(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let owner = format!("owner-{}", Uuid::new_v4());
    let cells: Vec<Value> = (0..3)
        .map(|i| json!({"rowKey": Uuid::new_v4(), "column": "DATA", "refKey": 1, "body": {"owner": owner, "n": i}}))
        .collect();
    server
        .data(
            "mutation($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { status } }",
            json!({ "cells": cells }),
        )
        .await;
    let mut failures = Vec::new();
    let page = "query($owner: String, $first: Int, $after: String, $order: [ItemsItemsIndexOrder!], $filter: String) {
      items { itemsIndex(owner: $owner, first: $first, after: $after, orderBy: $order, filter: $filter) {
        edges { cursor node { n } } pageInfo { hasNextPage endCursor }
      } }
    }";
    let wait = Wait::new("3 items_index entries");
    let cursor = loop {
        let data = server
            .data(
                page,
                json!({ "owner": owner, "first": 2, "order": [{"field": "N"}] }),
            )
            .await;
        let index = &data["items"]["itemsIndex"];
        if index["pageInfo"]["hasNextPage"] == true {
            break index["pageInfo"]["endCursor"]
                .as_str()
                .expect("endCursor")
                .to_string();
        }
        wait.tick(index).await;
    };
    // The cursor works where it came from.
    let data = server
        .data(
            page,
            json!({ "owner": owner, "first": 2, "after": cursor, "order": [{"field": "N"}] }),
        )
        .await;
    assert_eq!(
        data["items"]["itemsIndex"]["edges"][0]["node"]["n"], "2",
        "{data}"
    );

    for (what, variables, code) in [
        ("no shard field", json!({}), "SHARD_FIELD_REQUIRED"),
        (
            "shard field only in a filter range",
            json!({ "filter": "owner > \"a\"" }),
            "SHARD_FIELD_REQUIRED",
        ),
        (
            "page too large",
            json!({ "owner": owner, "first": 5000 }),
            "LIMIT_EXCEEDED",
        ),
        (
            "garbage cursor",
            json!({ "owner": owner, "after": "garbage!" }),
            "INVALID_CURSOR",
        ),
        (
            "base64 that is no cursor",
            json!({ "owner": owner, "after": "AAAAAAAA" }),
            "INVALID_CURSOR",
        ),
        (
            "cursor of another order",
            json!({ "owner": owner, "after": cursor, "order": [{"field": "N", "direction": "DESC"}] }),
            "INVALID_CURSOR",
        ),
        (
            "range on a bool",
            json!({ "owner": owner, "filter": "b > true" }),
            "BAD_USER_INPUT",
        ),
        (
            "unknown field in a filter",
            json!({ "owner": owner, "filter": "nope = 1" }),
            "BAD_USER_INPUT",
        ),
        (
            "filter syntax",
            json!({ "owner": owner, "filter": "n >" }),
            "BAD_USER_INPUT",
        ),
        (
            "filter value of the wrong type",
            json!({ "owner": owner, "filter": "x = \"high\"" }),
            "BAD_USER_INPUT",
        ),
        (
            "negative page",
            json!({ "owner": owner, "first": -1 }),
            "BAD_USER_INPUT",
        ),
    ] {
        let response = server.request(page, variables.clone()).await;
        if codes(&response).is_empty() || codes(&response).iter().any(|c| c != code) {
            failures.push(format!(
                "{what}: expected {code}\n  variables: {variables}\n  response: {response}"
            ));
        }
    }

    let too_many: Vec<String> = (0..65).map(|i| format!("o{i}")).collect();
    let keys: Vec<Uuid> = (0..1001).map(|_| Uuid::new_v4()).collect();
    let history = format!(
        "{{ trips {{ history(rowKey: \"{}\", column: BASE, first: 5000) {{ refKey }} }} }}",
        Uuid::new_v4()
    );
    let log = "query($s: Int!, $limit: Int) { trips { cellsForShard(shard: $s, limit: $limit) { next } } }";
    for (query, variables, code) in [
        (
            "{ trips { driverPartnerIndex { edges { cursor } } } }",
            json!({}),
            "SHARD_FIELD_REQUIRED",
        ),
        (
            "query($o: [String!]) { items { itemsIndex(ownerIn: $o) { edges { cursor } } } }",
            json!({ "o": too_many }),
            "LIMIT_EXCEEDED",
        ),
        (history.as_str(), json!({}), "LIMIT_EXCEEDED"),
        (log, json!({ "s": 0, "limit": 5000 }), "LIMIT_EXCEEDED"),
        (
            "query($k: [UUID!]!) { trips { rows(rowKeys: $k) { rowKey } } }",
            json!({ "k": keys }),
            "LIMIT_EXCEEDED",
        ),
        // Shards that do not exist (trips has 8).
        (log, json!({ "s": 8 }), "BAD_USER_INPUT"),
        (log, json!({ "s": -1 }), "BAD_USER_INPUT"),
    ] {
        let response = server.request(query, variables.clone()).await;
        if codes(&response).is_empty() || codes(&response).iter().any(|c| c != code) {
            let shown = variables.to_string();
            let shown: String = shown.chars().take(200).collect();
            failures.push(format!(
                "expected {code}\n  query: {query}\n  variables: {shown}\n  response: {response}"
            ));
        }
    }
    assert_none_failed(&failures);
}
