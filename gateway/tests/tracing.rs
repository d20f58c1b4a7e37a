//! OpenTelemetry traces through the real binary: an OTLP/HTTP receiver
//! (protobuf, decoded with `opentelemetry-proto`) gets, for one request
//! with a `traceparent`, one trace continuing it whose tree is HTTP →
//! GraphQL → storage statements with the semantic conventions'
//! attributes; a webhook delivery's request carries the `traceparent` of
//! its exported span; no exported byte holds a cell body, a variable's
//! value or a token; a collector that is down costs the requests nothing
//! and its lost spans are counted.

#[path = "support/server.rs"]
mod server;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use poem::listener::{Acceptor as _, Listener as _};
use poem::web::Data;
use poem::{handler, post, EndpointExt, Route};
use prost::Message as _;
use serde_json::{json, Value};
use server::{client, Server};

/// What the receiver got: OTLP bodies, and webhook `traceparent`s.
#[derive(Clone, Default)]
struct Received {
    exports: Arc<Mutex<Vec<Vec<u8>>>>,
    traceparents: Arc<Mutex<Vec<String>>>,
}

#[handler]
fn traces(body: Vec<u8>, Data(received): Data<&Received>) -> poem::Response {
    received.exports.lock().unwrap().push(body);
    poem::Response::builder()
        .content_type("application/x-protobuf")
        .body(Vec::<u8>::new())
}

#[handler]
fn hooks(request: &poem::Request, Data(received): Data<&Received>) -> &'static str {
    if let Some(value) = request.header("traceparent") {
        received
            .traceparents
            .lock()
            .unwrap()
            .push(value.to_string());
    }
    "ok"
}

/// Serves the OTLP receiver (`/v1/traces`) and a webhook (`/hooks`).
async fn receiver() -> (String, Received) {
    let received = Received::default();
    let app = Route::new()
        .at("/v1/traces", post(traces))
        .at("/hooks", post(hooks))
        .data(received.clone());
    let acceptor = poem::listener::TcpListener::bind("127.0.0.1:0")
        .into_acceptor()
        .await
        .unwrap();
    let address = *acceptor.local_addr()[0].as_socket_addr().unwrap();
    tokio::spawn(poem::Server::new_with_acceptor(acceptor).run(app));
    (format!("http://{address}"), received)
}

/// Every span exported so far, and the raw bytes of the exports.
fn spans(received: &Received) -> (Vec<Span>, Vec<u8>) {
    let exports = received.exports.lock().unwrap();
    let mut spans = Vec::new();
    for body in exports.iter() {
        let request = ExportTraceServiceRequest::decode(body.as_slice()).expect("OTLP protobuf");
        for resource in request.resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
    }
    (spans, exports.concat())
}

fn attributes(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Any::StringValue(s)) => s.clone(),
                Some(Any::IntValue(i)) => i.to_string(),
                Some(Any::BoolValue(b)) => b.to_string(),
                Some(Any::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";
const SECRET: &str = "sapphire-body-7f3a";
const NOTE: &str = "private-variable-91c2";

fn definitions(receiver: &str) -> Vec<(&'static str, String)> {
    vec![
        (
            "items/datastore.yaml",
            "name: items\nshards: 64\ncolumns:\n  - name: DATA\n".to_string(),
        ),
        (
            "items/indexes/by_owner.yaml",
            "table: by_owner\ndatastore: items\ncolumn_defs:\n  - column_key: DATA\n    fields:\n      - { field: owner, type: string }\n".to_string(),
        ),
        (
            "items/triggers/hooks.yaml",
            format!("name: hooks\ndatastore: items\ncolumns: [DATA]\nwebhook:\n  url: {receiver}/hooks\n"),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_is_one_trace_from_http_to_the_statements_and_out_to_the_webhook() {
    let (base, received) = receiver().await;
    let files = definitions(&base);
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    let config = format!("telemetry:\n  otlp_endpoint: {base}\n  service_name: cellgate-test\n");
    let server = Server::start_with(&files, &config, &[]);

    let row = uuid::Uuid::new_v4().to_string();
    let answer: Value = client()
        .post(server.graphql())
        .header("traceparent", format!("00-{TRACE}-{PARENT}-01"))
        .json(&json!({
            "query": "mutation Store($cells: [ItemsCellInput!]!) { itemsPutCells(cells: $cells) { status } __typename }",
            "operationName": "Store",
            "variables": {"cells": [{"rowKey": row, "column": "DATA", "refKey": "1", "body": {"owner": SECRET}}], "note": NOTE},
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        answer["data"]["itemsPutCells"][0]["status"], "WRITTEN",
        "{answer}"
    );
    // A read of the cell, through the cell cache.
    let answer: Value = client()
        .post(server.graphql())
        .json(&json!({
            "query": "query($r: UUID!) { items { cell(rowKey: $r, column: DATA, refKey: 1) { refKey } } }",
            "variables": {"r": row},
        }))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(answer["data"]["items"]["cell"]["refKey"], "1", "{answer}");

    // The batch processor exports within seconds; the webhook is delivered.
    let mut found = None;
    for _ in 0..150 {
        let (spans, _) = spans(&received);
        let delivered = !received.traceparents.lock().unwrap().is_empty();
        let webhook = spans.iter().any(|s| s.name == "webhook POST");
        if delivered && webhook && spans.iter().any(|s| hex(&s.trace_id) == TRACE) {
            found = Some(spans);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let spans =
        found.unwrap_or_else(|| panic!("no trace exported: {} spans", spans(&received).0.len()));
    let by_id: HashMap<String, &Span> = spans.iter().map(|s| (hex(&s.span_id), s)).collect();

    // HTTP continues the caller's trace.
    let trace: Vec<&Span> = spans.iter().filter(|s| hex(&s.trace_id) == TRACE).collect();
    let http = trace
        .iter()
        .find(|s| s.name == "POST /graphql")
        .unwrap_or_else(|| panic!("no HTTP span: {trace:#?}"));
    assert_eq!(hex(&http.parent_span_id), PARENT);
    let a = attributes(http);
    assert_eq!(a["http.request.method"], "POST");
    assert_eq!(a["http.route"], "/graphql");
    assert_eq!(a["http.response.status_code"], "200");
    assert_eq!(a["graphql.operation.name"], "Store");
    // GraphQL under HTTP.
    let graphql = trace
        .iter()
        .find(|s| s.name == "mutation Store")
        .unwrap_or_else(|| panic!("no GraphQL span: {trace:#?}"));
    assert_eq!(hex(&graphql.parent_span_id), hex(&http.span_id));
    let a = attributes(graphql);
    assert_eq!(a["graphql.operation.type"], "mutation");
    assert!(a["graphql.document"].starts_with("sha256:"), "{a:?}");
    // Statements under GraphQL (directly or through other spans).
    let under_graphql = |span: &Span| {
        let mut parent = hex(&span.parent_span_id);
        while let Some(p) = by_id.get(&parent) {
            if p.span_id == graphql.span_id {
                return true;
            }
            parent = hex(&p.parent_span_id);
        }
        false
    };
    let statements: Vec<&&Span> = trace
        .iter()
        .filter(|s| attributes(s).contains_key("db.system.name"))
        .collect();
    assert!(!statements.is_empty(), "no statement spans: {trace:#?}");
    for statement in &statements {
        assert!(under_graphql(statement), "{statement:#?}");
        let a = attributes(statement);
        assert_eq!(a["db.system.name"], "sqlite");
        assert_eq!(a["cellgate.cluster"], "main");
        assert!(
            ["SELECT", "INSERT", "UPDATE", "DELETE", "WITH"]
                .contains(&a["db.operation.name"].as_str()),
            "{a:?}"
        );
    }

    // The webhook's request carries the traceparent of its exported span.
    let traceparent = received.traceparents.lock().unwrap()[0].clone();
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    let webhook = spans
        .iter()
        .find(|s| hex(&s.span_id) == parts[2])
        .unwrap_or_else(|| {
            panic!("the webhook's traceparent {traceparent} names no exported span")
        });
    assert_eq!(hex(&webhook.trace_id), parts[1]);
    assert_eq!(webhook.name, "webhook POST");
    // Under the trigger's batch.
    let batch = by_id
        .get(&hex(&webhook.parent_span_id))
        .unwrap_or_else(|| panic!("the webhook POST has no exported parent: {webhook:#?}"));
    assert_eq!(batch.name, "trigger batch hooks");
    assert_eq!(attributes(batch)["cellgate.attempts"], "1");
    let a = attributes(webhook);
    assert_eq!(a["cellgate.trigger"], "hooks");
    assert!(a["cellgate.cell_locations"].contains(':'), "{a:?}");

    // The cell cache says what it held.
    let (spans, _) = self::spans(&received);
    let cache = spans
        .iter()
        .find(|s| s.name == "cell cache")
        .unwrap_or_else(|| panic!("no cell cache span"));
    let a = attributes(cache);
    assert!(
        a.contains_key("cellgate.cache.hits") && a.contains_key("cellgate.cache.misses"),
        "{a:?}"
    );

    // Nothing on the wire holds a body, a variable's value or a token.
    let (_, wire) = self::spans(&received);
    for secret in [SECRET, NOTE, row.as_str()] {
        assert!(
            !wire.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "`{secret}` was exported"
        );
    }
    let service = ExportTraceServiceRequest::decode(received.exports.lock().unwrap()[0].as_slice())
        .unwrap()
        .resource_spans[0]
        .resource
        .clone()
        .unwrap();
    assert!(format!("{service:?}").contains("cellgate-test"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_costs_nothing_but_counted_spans() {
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = format!("telemetry:\n  otlp_endpoint: http://127.0.0.1:{port}\n");
    let files = definitions("http://127.0.0.1:9");
    let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
    let server = Server::start_with(&files[..2], &config, &[]);
    for _ in 0..20 {
        let answer: Value = client()
            .post(server.graphql())
            .json(&json!({"query": "{ items { __typename } }"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(answer["data"]["items"]["__typename"], "ItemsQuery");
    }
    let mut dropped = 0.0;
    for _ in 0..100 {
        let metrics = client()
            .get(server.url("/metrics"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        dropped = metrics
            .lines()
            .find_map(|l| l.strip_prefix("cellgate_telemetry_spans_dropped_total "))
            .map(|v| v.trim().parse::<f64>().unwrap())
            .expect("the dropped spans are reported");
        if dropped > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(dropped >= 20.0, "{dropped} spans counted as dropped");
}
