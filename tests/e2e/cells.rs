//! Cells over GraphQL: writes, versions, rows, the cell log and `Int64`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{json, Value};
use uuid::Uuid;

use reqwest::StatusCode;

use crate::harness::{assert_code, Accept, Defs, Env, Server};

pub const PUT_TRIPS: &str = "mutation($cells: [TripsCellInput!]!) {
  tripsPutCells(cells: $cells) { rowKey column refKey status readable error { code message } }
}";

pub fn cell(row_key: Uuid, column: &str, ref_key: i64, body: Value) -> Value {
    json!({ "rowKey": row_key, "column": column, "refKey": ref_key, "body": body })
}

/// Writes cells to `trips` and asserts every one was written.
pub async fn put_trips(server: &Server, cells: Vec<Value>) {
    let count = cells.len();
    let data = server.data(PUT_TRIPS, json!({ "cells": cells })).await;
    let results = data["tripsPutCells"].as_array().expect("results");
    assert_eq!(results.len(), count, "{data}");
    for result in results {
        assert_eq!(result["status"], "WRITTEN", "{data}");
    }
}

pub async fn put_cells_reports_written_duplicate_and_conflict(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let row = Uuid::new_v4();
    let other = Uuid::new_v4();
    let first = cell(row, "BASE", 1, json!({"city": "Lisbon", "fare": 12.5}));

    let data = server.data(PUT_TRIPS, json!({ "cells": [first] })).await;
    assert_eq!(
        data["tripsPutCells"],
        json!([{ "rowKey": row.to_string(), "column": "BASE", "refKey": "1", "status": "WRITTEN", "readable": true, "error": null }])
    );

    let data = server.data(PUT_TRIPS, json!({ "cells": [first] })).await;
    assert_eq!(
        data["tripsPutCells"],
        json!([{ "rowKey": row.to_string(), "column": "BASE", "refKey": "1", "status": "DUPLICATE", "readable": true, "error": null }])
    );

    // The conflicting cell sits between two good ones: only it fails.
    let conflicting = cell(row, "BASE", 1, json!({"city": "Porto"}));
    let response = server
        .request(
            PUT_TRIPS,
            json!({ "cells": [
                cell(other, "BASE", 1, json!({"city": "Faro"})),
                conflicting,
                cell(row, "STATUS", 1, json!({"status": "requested"})),
            ] }),
        )
        .await;
    assert_code(&response, "CELL_CONFLICT");
    let errors = response["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), 1, "{response}");
    assert_eq!(errors[0]["path"], json!(["tripsPutCells", 1]), "{response}");
    let results = response["data"]["tripsPutCells"]
        .as_array()
        .unwrap_or_else(|| panic!("the results list is null: {response}"));
    assert_eq!(results.len(), 3, "{response}");
    assert_eq!(results[0]["status"], "WRITTEN", "{response}");
    assert_eq!(results[0]["error"], Value::Null, "{response}");
    // The refused cell: no status, not readable, and the same error as in
    // `errors`.
    let refused = &results[1];
    assert_eq!(
        (
            &refused["rowKey"],
            &refused["column"],
            &refused["refKey"],
            &refused["status"],
            &refused["readable"],
            &refused["error"]["code"],
        ),
        (
            &json!(row.to_string()),
            &json!("BASE"),
            &json!("1"),
            &Value::Null,
            &json!(false),
            &json!("CELL_CONFLICT"),
        ),
        "{response}"
    );
    assert_eq!(
        refused["error"]["message"], errors[0]["message"],
        "{response}"
    );
    assert_eq!(results[2]["status"], "WRITTEN", "{response}");
    assert_eq!(results[2]["readable"], true, "{response}");

    // Under an alias, the error's path names the alias.
    let response = server
        .request(
            "mutation($cells: [TripsCellInput!]!) { w: tripsPutCells(cells: $cells) { status } }",
            json!({ "cells": [cell(row, "BASE", 1, json!({"city": "Braga"}))] }),
        )
        .await;
    assert_code(&response, "CELL_CONFLICT");
    assert_eq!(response["errors"][0]["path"], json!(["w", 0]), "{response}");
    assert_eq!(
        response["data"]["w"],
        json!([{"status": null}]),
        "{response}"
    );

    // Nothing was overwritten.
    let data = server
        .data(
            "query($row: UUID!) { trips { cell(rowKey: $row, column: BASE, refKey: 1) { body } } }",
            json!({ "row": row }),
        )
        .await;
    assert_eq!(
        data["trips"]["cell"]["body"],
        json!({"city": "Lisbon", "fare": 12.5})
    );

    // A body that is not a JSON object is refused with a code.
    let response = server
        .request(
            PUT_TRIPS,
            json!({ "cells": [cell(Uuid::new_v4(), "NOTES", 1, json!([1, 2]))] }),
        )
        .await;
    assert_code(&response, "INVALID_BODY");
    assert_eq!(response["errors"][0]["path"], json!(["tripsPutCells", 0]));
    let refused = &response["data"]["tripsPutCells"][0];
    assert_eq!(refused["status"], Value::Null, "{response}");
    assert_eq!(refused["readable"], false, "{response}");
    assert_eq!(refused["error"]["code"], "INVALID_BODY", "{response}");
}

pub async fn latest_cell_history_and_versions(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let row = Uuid::new_v4();
    for ref_key in [1, 3, 2] {
        put_trips(
            &server,
            vec![cell(
                row,
                "STATUS",
                ref_key,
                json!({"status": format!("v{ref_key}")}),
            )],
        )
        .await;
    }
    let data = server
        .data(
            r#"query($row: UUID!) { trips {
                latestCell(rowKey: $row, column: STATUS) { rowKey column refKey body }
                history(rowKey: $row, column: STATUS) { refKey body }
                before3: history(rowKey: $row, column: STATUS, before: 3) { refKey }
                newest: history(rowKey: $row, column: STATUS, first: 1) { refKey }
                cell(rowKey: $row, column: STATUS, refKey: 2) { refKey body }
                missing: cell(rowKey: $row, column: STATUS, refKey: 4) { refKey }
                otherColumn: latestCell(rowKey: $row, column: BASE) { refKey }
                row(rowKey: $row) {
                  rowKey
                  status(refKey: "1") { body }
                  latest: status { refKey }
                  base { refKey }
                }
            } }"#,
            json!({ "row": row }),
        )
        .await;
    let trips = &data["trips"];
    assert_eq!(
        trips["latestCell"],
        json!({"rowKey": row.to_string(), "column": "STATUS", "refKey": "3", "body": {"status": "v3"}})
    );
    assert_eq!(
        trips["history"],
        json!([
            {"refKey": "3", "body": {"status": "v3"}},
            {"refKey": "2", "body": {"status": "v2"}},
            {"refKey": "1", "body": {"status": "v1"}},
        ])
    );
    assert_eq!(trips["before3"], json!([{"refKey": "2"}, {"refKey": "1"}]));
    assert_eq!(trips["newest"], json!([{"refKey": "3"}]));
    assert_eq!(
        trips["cell"],
        json!({"refKey": "2", "body": {"status": "v2"}})
    );
    assert_eq!(trips["missing"], Value::Null);
    assert_eq!(trips["otherColumn"], Value::Null);
    assert_eq!(
        trips["row"],
        json!({
            "rowKey": row.to_string(),
            "status": {"body": {"status": "v1"}},
            "latest": {"refKey": "3"},
            "base": null,
        })
    );
}

pub async fn int64_accepts_numbers_and_strings_exactly(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let row = Uuid::new_v4();
    let huge: i64 = 9_007_199_254_740_993;
    // refKey as a JSON number, as a string, and beyond 2^53 both ways.
    let data = server
        .data(
            PUT_TRIPS,
            json!({ "cells": [
                {"rowKey": row, "column": "NOTES", "refKey": 5, "body": {"n": 5}},
                {"rowKey": row, "column": "NOTES", "refKey": "6", "body": {"n": 6}},
                {"rowKey": row, "column": "NOTES", "refKey": huge, "body": {"n": "huge"}},
                {"rowKey": row, "column": "NOTES", "refKey": i64::MAX.to_string(), "body": {"n": "max"}},
            ] }),
        )
        .await;
    let ref_keys: Vec<&Value> = data["tripsPutCells"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| &r["refKey"])
        .collect();
    assert_eq!(
        ref_keys,
        [
            &json!("5"),
            &json!("6"),
            &json!("9007199254740993"),
            &json!("9223372036854775807")
        ]
    );

    // Literals: a number, a string, a huge number, and the same via variables.
    let data = server
        .data(
            &format!(
                r#"query($big: Int64!, $bigText: Int64!) {{ trips {{
                    a: cell(rowKey: "{row}", column: NOTES, refKey: 5) {{ refKey body }}
                    b: cell(rowKey: "{row}", column: NOTES, refKey: "6") {{ refKey body }}
                    c: cell(rowKey: "{row}", column: NOTES, refKey: 9007199254740993) {{ refKey body }}
                    d: cell(rowKey: "{row}", column: NOTES, refKey: $big) {{ refKey }}
                    e: cell(rowKey: "{row}", column: NOTES, refKey: $bigText) {{ refKey }}
                    off: cell(rowKey: "{row}", column: NOTES, refKey: 9007199254740992) {{ refKey }}
                    latestCell(rowKey: "{row}", column: NOTES) {{ refKey body }}
                    history(rowKey: "{row}", column: NOTES, before: "9223372036854775807") {{ refKey }}
                }} }}"#
            ),
            json!({ "big": huge, "bigText": huge.to_string() }),
        )
        .await;
    let trips = &data["trips"];
    assert_eq!(trips["a"], json!({"refKey": "5", "body": {"n": 5}}));
    assert_eq!(trips["b"], json!({"refKey": "6", "body": {"n": 6}}));
    assert_eq!(
        trips["c"],
        json!({"refKey": "9007199254740993", "body": {"n": "huge"}})
    );
    assert_eq!(trips["d"], json!({"refKey": "9007199254740993"}));
    assert_eq!(trips["e"], json!({"refKey": "9007199254740993"}));
    assert_eq!(trips["off"], Value::Null, "2^53 must not round to 2^53+1");
    assert_eq!(
        trips["latestCell"],
        json!({"refKey": "9223372036854775807", "body": {"n": "max"}})
    );
    assert_eq!(
        trips["history"],
        json!([{"refKey": "9007199254740993"}, {"refKey": "6"}, {"refKey": "5"}])
    );

    // Not an Int64: as a literal, via a variable, and out of range.
    let literal = server
        .request(
            &format!(r#"{{ trips {{ cell(rowKey: "{row}", column: NOTES, refKey: "12x") {{ refKey }} }} }}"#),
            json!({}),
        )
        .await;
    let variable = server
        .request(
            &format!(
                r#"query($r: Int64!) {{ trips {{ cell(rowKey: "{row}", column: NOTES, refKey: $r) {{ refKey }} }} }}"#
            ),
            json!({ "r": "12x" }),
        )
        .await;
    let overflow = server
        .request(
            &format!(
                r#"{{ trips {{ cell(rowKey: "{row}", column: NOTES, refKey: "9223372036854775808") {{ refKey }} }} }}"#
            ),
            json!({}),
        )
        .await;
    let fraction = server
        .request(
            PUT_TRIPS,
            json!({ "cells": [{"rowKey": row, "column": "NOTES", "refKey": 1.5, "body": {}}] }),
        )
        .await;
    for response in [literal, variable, overflow, fraction] {
        let codes = crate::harness::codes(&response);
        assert!(
            !codes.is_empty()
                && codes
                    .iter()
                    .all(|c| c == "GRAPHQL_VALIDATION_FAILED" || c == "BAD_USER_INPUT"),
            "{response}"
        );
        assert!(
            response["data"].is_null(),
            "no field may run with an invalid Int64: {response}"
        );
    }
}

pub async fn rows_in_order_and_cell_log_pages(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let keys: Vec<Uuid> = (0..12).map(|_| Uuid::new_v4()).collect();
    let mut cells = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        cells.push(cell(*key, "BASE", 1, json!({"i": i})));
        if i % 2 == 0 {
            cells.push(cell(*key, "STATUS", 7, json!({"status": format!("s{i}")})));
        }
    }
    put_trips(&server, cells).await;

    // `rows` follows the order asked, repeats included; unknown rows are empty.
    let unknown = Uuid::new_v4();
    let asked = vec![keys[3], keys[0], unknown, keys[7], keys[0], keys[10]];
    let data = server
        .data(
            "query($keys: [UUID!]!) { trips { rows(rowKeys: $keys) { rowKey base { body } status { refKey body } } } }",
            json!({ "keys": asked }),
        )
        .await;
    let rows = data["trips"]["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), asked.len(), "{data}");
    for (row, key) in rows.iter().zip(&asked) {
        assert_eq!(row["rowKey"], key.to_string(), "{data}");
        match keys.iter().position(|k| k == key) {
            None => {
                assert_eq!(row["base"], Value::Null, "{data}");
                assert_eq!(row["status"], Value::Null, "{data}");
            }
            Some(i) => {
                assert_eq!(row["base"]["body"], json!({"i": i}), "{data}");
                if i % 2 == 0 {
                    assert_eq!(
                        row["status"],
                        json!({"refKey": "7", "body": {"status": format!("s{i}")}}),
                        "{data}"
                    );
                } else {
                    assert_eq!(row["status"], Value::Null, "{data}");
                }
            }
        }
    }

    // Where did each cell land? Read every written cell's shard and added id.
    let data = server
        .data(
            "query($keys: [UUID!]!) { trips { rows(rowKeys: $keys) { base { rowKey column refKey shard addedId } status { rowKey column refKey shard addedId } } } }",
            json!({ "keys": keys }),
        )
        .await;
    let mut by_shard: BTreeMap<i64, BTreeSet<(String, String, String, String)>> = BTreeMap::new();
    for row in data["trips"]["rows"].as_array().expect("rows") {
        for c in [&row["base"], &row["status"]] {
            if c.is_null() {
                continue;
            }
            let shard = c["shard"].as_i64().expect("shard");
            assert!((0..8).contains(&shard), "{c}");
            by_shard.entry(shard).or_default().insert((
                c["addedId"]
                    .as_str()
                    .expect("addedId is a string")
                    .to_string(),
                c["rowKey"].as_str().expect("rowKey").to_string(),
                c["column"].as_str().expect("column").to_string(),
                c["refKey"].as_str().expect("refKey").to_string(),
            ));
        }
    }
    let (shard, expected) = by_shard
        .iter()
        .max_by_key(|(_, cells)| cells.len())
        .expect("some shard");
    assert!(expected.len() >= 2, "{by_shard:?}");

    // Page through the shard's log two cells at a time with `next`.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    for _ in 0..=expected.len() + 1 {
        let data = server
            .data(
                "query($shard: Int!, $after: Int64) { trips { cellsForShard(shard: $shard, after: $after, limit: 2) { cells { rowKey column refKey addedId shard } next } } }",
                json!({ "shard": shard, "after": after }),
            )
            .await;
        let page = &data["trips"]["cellsForShard"];
        let cells = page["cells"].as_array().expect("cells");
        assert!(cells.len() <= 2, "{page}");
        if cells.is_empty() {
            break;
        }
        for c in cells {
            assert_eq!(c["shard"].as_i64(), Some(*shard), "{page}");
            seen.push((
                c["addedId"].as_str().expect("addedId").to_string(),
                c["rowKey"].as_str().expect("rowKey").to_string(),
                c["column"].as_str().expect("column").to_string(),
                c["refKey"].as_str().expect("refKey").to_string(),
            ));
        }
        let next = page["next"].as_str().expect("next is an Int64 string");
        assert_eq!(
            next,
            cells.last().expect("last")["addedId"].as_str().expect("id"),
            "{page}"
        );
        after = Some(next.to_string());
    }
    // Reading from a time on gives the same log, and a `next` to go on with.
    let data = server
        .data(
            "query($shard: Int!) { trips { cellsForShard(shard: $shard, since: \"2000-01-01T00:00:00Z\", limit: 1) { cells { addedId } next } } }",
            json!({ "shard": shard }),
        )
        .await;
    let page = &data["trips"]["cellsForShard"];
    assert_eq!(
        page["cells"][0]["addedId"].as_str(),
        Some(seen[0].0.as_str()),
        "{page}"
    );
    assert_eq!(page["next"].as_str(), Some(seen[0].0.as_str()), "{page}");

    let ids: Vec<i64> = seen
        .iter()
        .map(|c| c.0.parse().expect("numeric added id"))
        .collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "log out of order or repeated: {ids:?}"
    );
    let seen: BTreeSet<_> = seen.into_iter().collect();
    assert_eq!(&seen, expected, "the log of shard {shard}");
}

// Regression: a body compressing more than ~4x was acknowledged `WRITTEN`
// and then every read answered CORRUPT_BODY ("deflate decompression error").
pub async fn compressible_and_deep_bodies_read_back(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let mut deep = json!({"leaf": "€"});
    for _ in 0..99 {
        deep = json!({ "n": deep });
    }
    let bodies = [
        json!({"s": "a".repeat(256)}),
        json!({"s": "a".repeat(100_000)}),
        json!({"s": "€".repeat(85)}),
        json!({"s": "\u{0}".repeat(1000), "k\u{0}€": [0, 0, 0, 0, 0, 0, 0, 0]}),
        deep,
    ];
    for body in bodies {
        let row = Uuid::new_v4();
        put_trips(&server, vec![cell(row, "NOTES", 1, body.clone())]).await;
        let data = server
            .data(
                "query($row: UUID!) { trips { latestCell(rowKey: $row, column: NOTES) { body } } }",
                json!({ "row": row }),
            )
            .await;
        assert_eq!(data["trips"]["latestCell"]["body"], body, "{data}");
    }
}

/// Regression: JSON numbers were parsed with serde_json's fast float
/// path, which is off by one bit for some inputs, so `-122.36647480579401`
/// was stored and read back as `-122.366474805794`.
pub async fn floats_read_back_to_the_last_bit(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let floats = [
        -122.366_474_805_794_01_f64,
        37.774_929_499_999_99,
        0.1 + 0.2,
        f64::MIN_POSITIVE,
        1.797_693_134_862_315_7e308,
        -5e-324,
    ];
    for value in floats {
        let expected = json!({ "x": value });
        // Through variables, as JSON text.
        let row = Uuid::new_v4();
        put_trips(&server, vec![cell(row, "NOTES", 1, expected.clone())]).await;
        // Through an inline GraphQL literal, written with Rust's exact
        // shortest representation.
        let literal_row = Uuid::new_v4();
        let mutation = format!(
            r#"mutation {{ tripsPutCells(cells: [{{rowKey: "{literal_row}", column: NOTES, refKey: 1, body: {{x: {value:?}}}}}]) {{ status }} }}"#
        );
        let data = server.data(&mutation, json!({})).await;
        assert_eq!(data["tripsPutCells"][0]["status"], "WRITTEN", "{data}");
        for row in [row, literal_row] {
            let data = server
                .data(
                    "query($row: UUID!) { trips { latestCell(rowKey: $row, column: NOTES) { body } } }",
                    json!({ "row": row }),
                )
                .await;
            let body = &data["trips"]["latestCell"]["body"];
            assert_eq!(
                body["x"].as_f64(),
                Some(value),
                "{value:?} came back as {body}"
            );
        }
    }
}

/// A write's response from the executor and from the document's direct
/// form (`graphql/direct/put.rs`) are the same bytes, once the row keys and
/// read tokens, which differ between two writes, are swapped for names.
pub async fn direct_writes_equal_the_executors(env: Arc<Env>) {
    let server = env.serve(Defs::Small, &[]);
    let direct_count = || server.metric("cellgate_graphql_direct_requests_total");
    let documents = [
        "mutation W($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { rowKey column refKey status readable readToken error { code message retryable } } }",
        "mutation($c: [TripsCellInput!]!) { w: tripsPutCells(cells: $c) { s: status key: rowKey error { retryable why: message } ok: readable } }",
    ];
    for (d, document) in documents.iter().enumerate() {
        let variable = if d == 0 { "cells" } else { "c" };
        let body = |text: &str, cells: Value| {
            json!({ "query": text, "variables": { variable: cells } }).to_string()
        };
        // Answered without errors once: the text has passed validation.
        let (status, text) = server
            .post_text(
                &body(
                    document,
                    json!([cell(Uuid::new_v4(), "BASE", 1, json!({}))]),
                ),
                Accept::Json,
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{text}");
        assert!(!text.contains("errors"), "{text}");

        // Written, refused as a conflict, a duplicate, refused as a body
        // that is not an object, an Int64 given as a string.
        let batch = |keys: &[Uuid; 4]| {
            json!([
                cell(
                    keys[0],
                    "BASE",
                    1,
                    json!({"city": "Lisbon", "n": "ünï \u{0000}"})
                ),
                cell(keys[1], "BASE", 1, json!({"city": "Porto"})),
                cell(keys[1], "STATUS", 1, json!({"status": "requested"})),
                cell(keys[2], "NOTES", 1, json!([1, 2])),
                json!({ "rowKey": keys[3], "column": "STATUS", "refKey": "7", "body": {"s": 1} }),
            ])
        };
        let mut answers = Vec::new();
        for (path, text) in [
            ("executor", format!("{document}\n# executor")),
            ("direct", document.to_string()),
        ] {
            let keys: [Uuid; 4] = std::array::from_fn(|_| Uuid::new_v4());
            put_trips(
                &server,
                vec![
                    cell(keys[1], "BASE", 1, json!({"city": "Faro"})),
                    cell(keys[1], "STATUS", 1, json!({"status": "requested"})),
                ],
            )
            .await;
            let before = direct_count().await;
            let (status, mut text) = server
                .post_text(&body(&text, batch(&keys)), Accept::Json)
                .await;
            let direct = direct_count().await - before;
            assert_eq!(
                direct,
                f64::from(u8::from(path == "direct")),
                "{path}: {text}"
            );
            let answer: Value = serde_json::from_str(&text).expect("JSON");
            let mut tokens = BTreeSet::new();
            collect_tokens(&answer, &mut tokens);
            for token in tokens {
                text = text.replace(&token, "TOKEN");
            }
            for (i, key) in keys.iter().enumerate() {
                text = text.replace(&key.to_string(), &format!("KEY{i}"));
            }
            answers.push((status, text));
        }
        assert_eq!(answers[0], answers[1], "document {d}");
        assert!(answers[1].1.contains("CELL_CONFLICT"), "{}", answers[1].1);

        // The compiled write reads its cells from the variable's JSON text:
        // escaped member names, a member given twice (the last counts),
        // numbers at the edges of their types, escapes and NUL in strings,
        // a nested body. Both paths store the same body.
        let mut stored = Vec::new();
        for (path, text) in [
            ("executor", format!("{document}\n# executor")),
            ("direct", document.to_string()),
        ] {
            let key = Uuid::new_v4();
            let cells = format!(
                r#"[{{"row\u004bey": "{key}", "column": "NOTES", "refKey": 9, "refKey": "1",
                   "body": {{"n": [1e300, -0.0, 12345678901234567890, -9223372036854775808, 0.1, 5e-324],
                             "k\u00e9": "first", "k\u00e9": "\ud83d\ude00 \u0000 \"q\"",
                             "deep": [[[{{"a": null, "b": {{}}, "c": []}}]]]}}}}]"#
            );
            let request = format!(
                r#"{{"query": {}, "variables": {{"{variable}": {cells}}}}}"#,
                Value::from(text)
            );
            let before = direct_count().await;
            let (status, answer) = server.post_text(&request, Accept::Json).await;
            assert_eq!(status, StatusCode::OK, "{path}: {answer}");
            assert!(answer.contains("WRITTEN"), "{path}: {answer}");
            let direct = direct_count().await - before;
            assert_eq!(direct, f64::from(u8::from(path == "direct")), "{path}");
            let data = server
                .data(
                    "query($row: UUID!) { trips { latestCell(rowKey: $row, column: NOTES) { refKey body } } }",
                    json!({ "row": key }),
                )
                .await;
            assert_eq!(data["trips"]["latestCell"]["refKey"], "1", "{path}: {data}");
            stored.push(data["trips"]["latestCell"]["body"].clone());
        }
        assert_eq!(stored[0], stored[1], "document {d}");
        assert_eq!(stored[1]["ké"], "😀 \u{0} \"q\"", "{}", stored[1]);
        assert_eq!(stored[1]["n"][2], 12345678901234567890_u64, "{}", stored[1]);

        // Inputs the executor refuses, before writing anything: the
        // executor's answer, from the executor.
        let key = Uuid::new_v4();
        let mut too_deep = json!({});
        for _ in 0..200 {
            too_deep = json!({ "n": too_deep });
        }
        let refused = [
            json!([{ "rowKey": key, "column": "BASE", "refKey": 1, "body": too_deep }]),
            json!([{ "rowKey": key, "column": "BASE", "refKey": 1, "body": {}, "extra": 1 }]),
            json!([{ "rowKey": key, "column": "BASE", "refKey": 1 }]),
            json!([{ "rowKey": "not-a-uuid", "column": "BASE", "refKey": 1, "body": {} }]),
            json!([{ "rowKey": key, "column": "NOPE", "refKey": 1, "body": {} }]),
            json!([{ "rowKey": key, "column": "BASE", "refKey": 1.5, "body": {} }]),
            json!([{ "rowKey": key, "column": "BASE", "refKey": 1, "body": null }]),
            json!({ "rowKey": key, "column": "BASE", "refKey": 1, "body": {} }),
            json!([null]),
            json!(null),
        ];
        for cells in refused {
            let executor = server
                .post_text(
                    &body(&format!("{document}\n# executor"), cells.clone()),
                    Accept::Json,
                )
                .await;
            let before = direct_count().await;
            let answer = server
                .post_text(&body(document, cells.clone()), Accept::Json)
                .await;
            assert_eq!(direct_count().await, before, "{cells}: {answer:?}");
            assert_eq!(executor, answer, "{cells}");
        }
        // Bodies the JSON reader refuses, which no JSON value can hold:
        // the compiled write reads bodies without building values, and
        // still declines these.
        for refused_body in ["{\"n\": 1e400}", "{\"n\": -1e999}"] {
            let cells = format!(
                r#"[{{"rowKey": "{key}", "column": "BASE", "refKey": 1, "body": {refused_body}}}]"#
            );
            let request = |text: String| {
                format!(
                    r#"{{"query": {}, "variables": {{"{variable}": {cells}}}}}"#,
                    Value::from(text)
                )
            };
            let executor = server
                .post_text(&request(format!("{document}\n# executor")), Accept::Json)
                .await;
            let before = direct_count().await;
            let answer = server
                .post_text(&request(document.to_string()), Accept::Json)
                .await;
            assert_eq!(direct_count().await, before, "{cells}: {answer:?}");
            assert_eq!(executor, answer, "{cells}");
        }
    }
}

fn collect_tokens(value: &Value, tokens: &mut BTreeSet<String>) {
    match value {
        Value::String(s) if s.starts_with("rt1.") => {
            tokens.insert(s.clone());
        }
        Value::Array(items) => items.iter().for_each(|v| collect_tokens(v, tokens)),
        Value::Object(map) => map.values().for_each(|v| collect_tokens(v, tokens)),
        _ => {}
    }
}
