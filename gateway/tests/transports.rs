//! One request pipeline for every transport, proven from outside: one
//! corpus of documents (reads, writes, admin fields, introspection,
//! subscriptions, refused and malformed ones) runs through `POST /graphql`,
//! `GET /graphql` and `subscribe` on `/graphql/ws` of the real `cellgate
//! serve`, for several principals (auth off; with auth on: no token, read,
//! write, admin, `*:admin`, and a token revoked after its socket was
//! opened), twice each (the second time a compiled document may answer);
//! the answers' data and error codes must be the same on every transport.
//! Then the socket's own promises: the upgrade checks `Origin` and `Host`,
//! and a revoked token ends the subscriptions it runs.

#[path = "support/server.rs"]
mod server;
#[path = "support/socket.rs"]
mod socket;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use cellgate_graphql::auth::tokens;
use serde_json::{json, Value};
use server::{cellgate, client, root, Server};
use socket::{connect, init, receive, send, try_connect, try_init, Socket};

/// A row written before the corpus runs, its driver and a key written
/// with another body (for `CELL_CONFLICT`).
const ROW: &str = "0b6f7c1e-2a4d-4c8e-9f10-1a2b3c4d5e6f";
const DRIVER: &str = "5a4c3f7e-8d6b-4e2a-9c1f-0e7d6b5a4c3f";

/// The kind of operation a case runs, which decides what GET and POST may
/// do with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Query,
    Mutation,
    Subscription,
}

/// One document of the corpus, with its request parameters. `{run}` in
/// the variables' text is replaced by a key unique to each sending, so
/// that writes of the same case do not turn into duplicates.
struct Case {
    name: &'static str,
    kind: Kind,
    params: Value,
}

fn corpus() -> Vec<Case> {
    let from_the_start = cellgate_store::triggers::tail::encode_cursor(&BTreeMap::new());
    let case = |name, kind, params| Case { name, kind, params };
    vec![
        case(
            "row read",
            Kind::Query,
            json!({"query": "query($row: UUID!) { trips { row(rowKey: $row) { rowKey base { refKey body } } } }",
                   "variables": {"row": ROW}}),
        ),
        case(
            "index page with rows (compiled after its first answer)",
            Kind::Query,
            json!({"query": "query($d: UUID!) { trips { driverPartnerIndex(driverPartnerUuid: $d, first: 5) { edges { cursor node { rowKey cityUuid row { rowKey base { refKey body } } } } pageInfo { hasNextPage } } } }",
                   "variables": {"d": DRIVER}}),
        ),
        case(
            "index page asking for a replica after a write",
            Kind::Query,
            json!({"query": "query($d: UUID!, $after: String) { trips { driverPartnerIndex(driverPartnerUuid: $d, consistency: REPLICA, readAfter: $after) { edges { node { rowKey } } } } }",
                   "variables": {"d": DRIVER, "after": null}}),
        ),
        case(
            "log read",
            Kind::Query,
            json!({"query": "{ trips { cellsForShard(shard: 0, limit: 1) { next } } }"}),
        ),
        case(
            "write (compiled after its first answer)",
            Kind::Mutation,
            json!({"query": "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status readable error { code } } }",
                   "variables": {"cells": [{"rowKey": "{run}", "column": "NOTES", "refKey": "1", "body": {"note": "hi"}}]}}),
        ),
        case(
            "write of a conflicting cell",
            Kind::Mutation,
            json!({"query": "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status readable error { code } } }",
                   "variables": {"cells": [{"rowKey": ROW, "column": "BASE", "refKey": "1", "body": {"other": true}}]}}),
        ),
        case(
            "admin query",
            Kind::Query,
            json!({"query": "{ trips { indexStatus { name } } }"}),
        ),
        case(
            "admin mutation",
            Kind::Mutation,
            json!({"query": "mutation { tripsRetryQuarantine { applied } }"}),
        ),
        case(
            "the definitions' state (every datastore's admin)",
            Kind::Query,
            json!({"query": "{ definitions { latest lastReload { result } } }"}),
        ),
        case(
            "datastores listed for the caller",
            Kind::Query,
            json!({"query": "{ datastores { name } }"}),
        ),
        case(
            "introspection of every type",
            Kind::Query,
            json!({"query": "{ __schema { types { name } } }"}),
        ),
        case(
            "introspection of another datastore's type",
            Kind::Query,
            json!({"query": "{ __type(name: \"PaymentsQuery\") { name } }"}),
        ),
        case(
            "another datastore",
            Kind::Query,
            json!({"query": "{ payments { __typename } }"}),
        ),
        case(
            "subscription from the start of the log",
            Kind::Subscription,
            json!({"query": "subscription($after: String) { tripsCells(columns: [BASE], after: $after) { cell { rowKey column } } }",
                   "variables": {"after": from_the_start}}),
        ),
        case(
            "subscription of another datastore",
            Kind::Subscription,
            json!({"query": "subscription($after: String) { paymentsCells(after: $after) { cursor } }",
                   "variables": {"after": from_the_start}}),
        ),
        case(
            "a document that does not parse",
            Kind::Query,
            json!({"query": "{ trips { "}),
        ),
        case(
            "an unknown field",
            Kind::Query,
            json!({"query": "{ trips { nosuch } }"}),
        ),
        case(
            "a required variable missing",
            Kind::Query,
            json!({"query": "query($row: UUID!) { trips { row(rowKey: $row) { rowKey } } }"}),
        ),
        case(
            "a variable of the wrong type",
            Kind::Query,
            json!({"query": "query($row: UUID!) { trips { row(rowKey: $row) { rowKey } } }",
                   "variables": {"row": 5}}),
        ),
        case(
            "too deep",
            Kind::Query,
            json!({"query": "{ trips { row(rowKey: \"0b6f7c1e-2a4d-4c8e-9f10-1a2b3c4d5e6f\") { base { row { base { row { base { row { base { row { base { row { base { row { rowKey } } } } } } } } } } } } } } }"}),
        ),
        case(
            "too many aliases",
            Kind::Query,
            json!({"query": format!("{{ {} }}", (0..40).map(|i| format!("a{i}: __typename")).collect::<Vec<_>>().join(" "))}),
        ),
        case(
            "two operations, the mutation named",
            Kind::Mutation,
            json!({"query": "query Q { __typename } mutation M { tripsRetryQuarantine { applied } }",
                   "operationName": "M"}),
        ),
        case(
            "two operations, none named",
            Kind::Query,
            json!({"query": "query Q { __typename } query R { __typename }"}),
        ),
        case(
            "variables that are not an object",
            Kind::Query,
            json!({"query": "{ __typename }", "variables": [1]}),
        ),
    ]
}

/// An answer reduced to what every transport must agree on: its data
/// and its error codes (messages may say how to send a thing over one
/// transport).
#[derive(Debug, Clone)]
struct Answer {
    data: Option<Value>,
    codes: Vec<String>,
    message: String,
}

impl PartialEq for Answer {
    fn eq(&self, other: &Answer) -> bool {
        self.data == other.data && self.codes == other.codes
    }
}

impl Answer {
    fn of(payload: &Value) -> Answer {
        Answer {
            data: payload.get("data").cloned(),
            codes: codes(payload.get("errors").unwrap_or(&Value::Null)),
            message: payload["errors"][0]["message"]
                .as_str()
                .unwrap_or("")
                .to_string(),
        }
    }

    fn refused(code: &str) -> Answer {
        Answer {
            data: None,
            codes: vec![code.to_string()],
            message: String::new(),
        }
    }

    fn code(&self) -> &str {
        self.codes.first().map_or("", String::as_str)
    }
}

fn codes(errors: &Value) -> Vec<String> {
    let mut codes: Vec<String> = errors
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            e["extensions"]["code"]
                .as_str()
                .unwrap_or("(none)")
                .to_string()
        })
        .collect();
    codes.sort();
    codes
}

/// The parameters of `case` for one sending, `run` a fresh row key.
fn params(case: &Case, run: &str) -> Value {
    serde_json::from_str(&case.params.to_string().replace("{run}", run)).unwrap()
}

async fn over_post(server: &Server, token: Option<&str>, params: &Value) -> Answer {
    let mut request = client().post(server.graphql()).json(params);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    Answer::of(&request.send().await.unwrap().json::<Value>().await.unwrap())
}

async fn over_get(server: &Server, token: Option<&str>, params: &Value) -> Answer {
    let mut query: Vec<(String, String)> = Vec::new();
    for (name, value) in params.as_object().unwrap() {
        let text = match value {
            Value::String(text) if name != "variables" => text.clone(),
            other => other.to_string(),
        };
        query.push((name.clone(), text));
    }
    let mut request = client().get(server.graphql()).query(&query);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    Answer::of(&request.send().await.unwrap().json::<Value>().await.unwrap())
}

/// A socket of one principal: open and acknowledged, or refused at
/// `connection_init` with a close code.
enum Connection {
    Open(Box<Socket>, usize),
    Refused(u16),
}

impl Connection {
    async fn open(server: &Server, token: Option<&str>) -> Connection {
        let mut socket = connect(server).await;
        let payload = match token {
            Some(token) => json!({"Authorization": format!("Bearer {token}")}),
            None => json!({}),
        };
        match try_init(&mut socket, payload).await {
            Ok(()) => Connection::Open(Box::new(socket), 0),
            Err(code) => Connection::Refused(code),
        }
    }

    /// Whether `connection_init` was refused.
    fn refused(&self) -> bool {
        matches!(self, Connection::Refused(_))
    }

    /// The answer to one `subscribe`: its first `next` (a subscription is
    /// then completed by the client) or its `error`. A connection refused
    /// at `connection_init` with 4403 is `UNAUTHENTICATED`, the code HTTP
    /// answers the same token with.
    async fn send(&mut self, kind: Kind, params: &Value) -> Answer {
        let (socket, count) = match self {
            Connection::Refused(4403) => return Answer::refused("UNAUTHENTICATED"),
            Connection::Refused(code) => panic!("connection_init closed with {code}"),
            Connection::Open(socket, count) => (socket, count),
        };
        *count += 1;
        let id = count.to_string();
        send(
            socket,
            json!({"id": id, "type": "subscribe", "payload": params}),
        )
        .await;
        let message = next_of(socket, &id).await;
        match message["type"].as_str() {
            Some("next") => {
                let answer = Answer::of(&message["payload"]);
                if kind == Kind::Subscription {
                    send(socket, json!({"id": id, "type": "complete"})).await;
                } else {
                    assert_eq!(next_of(socket, &id).await["type"], "complete");
                }
                answer
            }
            Some("error") => Answer::of(&json!({"errors": message["payload"]})),
            _ => panic!("unexpected {message}"),
        }
    }
}

/// The next message for the operation `id`; events of subscriptions the
/// client completed a moment ago are skipped.
async fn next_of(socket: &mut Socket, id: &str) -> Value {
    loop {
        let message = receive(socket).await.expect("the connection stays open");
        if message["id"] == id {
            return message;
        }
        assert_eq!(message["type"], "next", "{message}");
    }
}

/// Writes `cells` (a JSON list) over POST with `token`; the answer.
async fn put(server: &Server, token: Option<&str>, cells: Value) -> Value {
    let mut request = client().post(server.graphql()).json(&json!({
        "query": "mutation($cells: [TripsCellInput!]!) { tripsPutCells(cells: $cells) { status } }",
        "variables": {"cells": cells},
    }));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().await.unwrap().json().await.unwrap()
}

/// The row every read of the corpus finds, and its index entry, once the
/// index has caught up.
async fn seed(server: &Server, token: Option<&str>) {
    let body = json!({"driver_partner_uuid": DRIVER, "city_uuid": DRIVER, "trip_created_at": "2024-05-01T10:00:00Z"});
    let answer = put(
        server,
        token,
        json!([{"rowKey": ROW, "column": "BASE", "refKey": "1", "body": body}]),
    )
    .await;
    assert_eq!(
        answer["data"]["tripsPutCells"][0]["status"], "WRITTEN",
        "{answer}"
    );
    // A payments cell, so that a subscription to that log has an event.
    let mut request = client().post(server.graphql()).json(&json!({
        "query": "mutation($cells: [PaymentsCellInput!]!) { paymentsPutCells(cells: $cells) { status } }",
        "variables": {"cells": [{"rowKey": ROW, "column": "ORDER", "refKey": "1", "body": {"amount": 1}}]},
    }));
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let answer: Value = request.send().await.unwrap().json().await.unwrap();
    assert_eq!(
        answer["data"]["paymentsPutCells"][0]["status"], "WRITTEN",
        "{answer}"
    );
    let page = json!({"query": format!("{{ trips {{ driverPartnerIndex(driverPartnerUuid: \"{DRIVER}\") {{ edges {{ cursor }} }} }} }}")});
    for _ in 0..200 {
        let answer = over_post(server, token, &page).await;
        if answer.data.as_ref().is_some_and(|data| {
            data["trips"]["driverPartnerIndex"]["edges"]
                .as_array()
                .is_some_and(|edges| !edges.is_empty())
        }) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the index never listed the seeded row");
}

/// Runs the corpus for one principal through every transport, twice, and
/// checks that they agree; returns the POST answers by case.
async fn differential(
    server: &Server,
    principal: &str,
    token: Option<&str>,
    socket: &mut Connection,
) -> BTreeMap<&'static str, Answer> {
    differential_of(corpus(), server, principal, token, socket).await
}

/// [`differential`] of the cases `cases`.
async fn differential_of(
    cases: Vec<Case>,
    server: &Server,
    principal: &str,
    token: Option<&str>,
    socket: &mut Connection,
) -> BTreeMap<&'static str, Answer> {
    let mut answers = BTreeMap::new();
    for case in cases {
        for round in 0..2 {
            let context = format!("{principal}, {}, round {round}", case.name);
            let run = || uuid::Uuid::new_v4().to_string();
            let post = over_post(server, token, &params(&case, &run())).await;
            let get = over_get(server, token, &params(&case, &run())).await;
            let ws = socket.send(case.kind, &params(&case, &run())).await;
            // Refusals that come before the operation is known are the same
            // on GET; past them, GET runs only queries.
            let early = [
                "UNAUTHENTICATED",
                "FORBIDDEN",
                "GRAPHQL_PARSE_FAILED",
                "BAD_REQUEST",
            ];
            if case.kind == Kind::Query || early.contains(&post.code()) {
                assert_eq!(get, post, "GET and POST differ: {context}");
            } else {
                assert_eq!(get.codes, ["METHOD_NOT_ALLOWED"], "{context}: {get:?}");
            }
            // Only the socket runs subscriptions.
            let runs_here = case.kind == Kind::Subscription
                && post.message.starts_with("subscriptions are served");
            if runs_here {
                assert_eq!(post.codes, ["GRAPHQL_VALIDATION_FAILED"], "{context}");
                assert!(
                    ws.codes.is_empty() && ws.data.is_some(),
                    "{context}: the socket refused a subscription: {ws:?}"
                );
            } else if socket.refused() && post.code() == "BAD_REQUEST" {
                // HTTP reads a request's parameters before its token; a
                // socket authenticates once, before any operation.
                assert_eq!(ws.codes, ["UNAUTHENTICATED"], "{context}");
            } else {
                assert_eq!(ws, post, "the socket and POST differ: {context}");
            }
            answers.insert(case.name, post);
        }
    }
    answers
}

fn token_command(dir: &Path, args: &[&str]) -> String {
    let output = cellgate(dir)
        .arg("token")
        .args(args)
        .args(["--data", dir.join("data").to_str().unwrap()])
        .args(["--datastores", root().join("datastores").to_str().unwrap()])
        .output()
        .expect("run cellgate token");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// A server with auth on, configured tokens of each scope in `scopes`
/// (their secrets, in order) and one stored `trips:read` token (its
/// secret and id, for `cellgate token revoke`).
fn server_with_tokens(
    scopes: &[&str],
    extra_config: &str,
) -> (Server, Vec<String>, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let mut yaml = String::from("auth:\n  enabled: true\n  tokens:\n");
    let mut secrets = Vec::new();
    for (n, scope) in scopes.iter().enumerate() {
        let token = tokens::generate();
        yaml.push_str(&format!(
            "    - {{ name: t{n}, hash: \"{}\", scopes: [\"{scope}\"] }}\n",
            token.hash
        ));
        secrets.push(token.token);
    }
    yaml.push_str(extra_config);
    let config = dir.path().join("cellgate.yaml");
    std::fs::write(&config, yaml).unwrap();
    let stored = token_command(
        dir.path(),
        &["create", "--scope", "trips:read", "--name", "kept"],
    );
    let id = stored[3..19].to_string();
    let server = Server::start_on(dir, &["--config", config.to_str().unwrap()]);
    (server, secrets, stored, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_transport_gives_the_same_answers_to_every_principal() {
    // Auth off: everything runs for everyone.
    let open = Server::start(&[]);
    seed(&open, None).await;
    let mut socket = Connection::open(&open, None).await;
    let answers = differential(&open, "auth off", None, &mut socket).await;
    assert!(answers["admin mutation"].codes.is_empty(), "{answers:?}");
    assert_eq!(
        answers["write of a conflicting cell"].codes,
        ["CELL_CONFLICT"]
    );

    let (server, secrets, stored, id) =
        server_with_tokens(&["trips:read", "trips:write", "trips:admin", "*:admin"], "");
    let [reader, writer, admin, root_admin] = [&secrets[0], &secrets[1], &secrets[2], &secrets[3]];
    seed(&server, Some(root_admin)).await;
    let principals: [(&str, Option<&str>); 5] = [
        ("no token", None),
        ("trips:read", Some(reader)),
        ("trips:write", Some(writer)),
        ("trips:admin", Some(admin)),
        ("*:admin", Some(root_admin)),
    ];
    let mut by_principal = BTreeMap::new();
    for (principal, token) in principals {
        let mut socket = Connection::open(&server, token).await;
        by_principal.insert(
            principal,
            differential(&server, principal, token, &mut socket).await,
        );
    }
    // The corpus is refused where it must be, which makes the agreement
    // above mean something.
    let code = |principal: &str, case: &str| by_principal[principal][case].code().to_string();
    assert_eq!(code("no token", "row read"), "UNAUTHENTICATED");
    assert_eq!(code("trips:read", "row read"), "");
    assert_eq!(
        code("trips:read", "write (compiled after its first answer)"),
        "FORBIDDEN"
    );
    assert_eq!(
        code("trips:write", "write (compiled after its first answer)"),
        ""
    );
    assert_eq!(code("trips:write", "admin query"), "FORBIDDEN");
    assert_eq!(code("trips:admin", "admin mutation"), "");
    assert_eq!(
        code(
            "trips:admin",
            "the definitions' state (every datastore's admin)"
        ),
        "FORBIDDEN"
    );
    assert_eq!(
        code(
            "*:admin",
            "the definitions' state (every datastore's admin)"
        ),
        ""
    );
    assert_eq!(code("trips:read", "another datastore"), "FORBIDDEN");
    assert_eq!(
        code("trips:read", "subscription of another datastore"),
        "FORBIDDEN"
    );
    assert_eq!(
        code("trips:read", "a document that does not parse"),
        "GRAPHQL_PARSE_FAILED"
    );
    assert_eq!(code("trips:read", "too many aliases"), "QUERY_TOO_COMPLEX");
    // Scoped introspection: a trips reader sees no payments type, on every
    // transport (the agreement above), while `*:admin` does.
    let types = |principal: &str| {
        by_principal[principal]["introspection of every type"]
            .data
            .clone()
            .unwrap()
            .to_string()
    };
    assert!(
        !types("trips:read").contains("Payments"),
        "{}",
        types("trips:read")
    );
    assert!(types("*:admin").contains("PaymentsQuery"));
    assert_eq!(
        by_principal["trips:read"]["introspection of another datastore's type"].data,
        Some(json!({"__type": null}))
    );

    // A token revoked after its socket was opened: its operations are
    // refused on the socket as on HTTP.
    let mut socket = Connection::open(&server, Some(&stored)).await;
    token_command(server.dir.path(), &["revoke", &id]);
    let row = json!({"query": "{ __typename }"});
    for _ in 0..100 {
        if over_post(&server, Some(&stored), &row).await.code() == "UNAUTHENTICATED" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let revoked = differential(&server, "revoked", Some(&stored), &mut socket).await;
    assert!(
        revoked
            .values()
            .all(|answer| answer.code() == "UNAUTHENTICATED" || answer.code() == "BAD_REQUEST"),
        "{revoked:?}"
    );
}

const TRIPS: (&str, &str) = (
    "trips/datastore.yaml",
    "name: trips\nshards: 16\ncolumns:\n  - name: BASE\n",
);

/// Regression: any web page could open the socket of a loopback gateway
/// with auth off and write through it (browsers send no CORS preflight for
/// WebSockets).
/// The SHA-256 of `text`, lowercase hex.
fn sha256(text: &str) -> String {
    use sha2::Digest as _;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The documents of the persisted corpus's manifest.
const ROW_READ: &str =
    "query($row: UUID!) { trips { row(rowKey: $row) { rowKey base { refKey body } } } }";
const SUBSCRIBE: &str = "subscription($after: String) { tripsCells(columns: [BASE], after: $after) { cell { rowKey column } } }";

/// Persisted documents in every form, and free documents.
fn persisted_corpus() -> Vec<Case> {
    let from_the_start = cellgate_store::triggers::tail::encode_cursor(&BTreeMap::new());
    let apq = |text: &str| json!({"persistedQuery": {"version": 1, "sha256Hash": sha256(text)}});
    let free = "{ payments { __typename } }";
    let case = |name, kind, params| Case { name, kind, params };
    vec![
        case(
            "by id",
            Kind::Query,
            json!({"documentId": format!("sha256:{}", sha256(ROW_READ)), "variables": {"row": ROW}}),
        ),
        case(
            "by bare id",
            Kind::Query,
            json!({"documentId": sha256(ROW_READ), "variables": {"row": ROW}}),
        ),
        case(
            "a manifest document as text",
            Kind::Query,
            json!({"query": ROW_READ, "variables": {"row": ROW}}),
        ),
        case(
            "a manifest document by APQ hash",
            Kind::Query,
            json!({"extensions": apq(ROW_READ), "variables": {"row": ROW}}),
        ),
        case("a free document", Kind::Query, json!({"query": free})),
        case(
            "a free document with its APQ hash",
            Kind::Query,
            json!({"query": free, "extensions": apq(free)}),
        ),
        case(
            "a free APQ hash",
            Kind::Query,
            json!({"extensions": apq("{ trips { __typename } }")}),
        ),
        case(
            "an unknown id",
            Kind::Query,
            json!({"documentId": format!("sha256:{}", sha256("{ x }"))}),
        ),
        case(
            "a malformed id",
            Kind::Query,
            json!({"documentId": "sha256:xyz"}),
        ),
        case(
            "an APQ hash that is not the text's",
            Kind::Query,
            json!({"query": free, "extensions": apq("{ y }")}),
        ),
        case(
            "a subscription by id",
            Kind::Subscription,
            json!({"documentId": sha256(SUBSCRIBE), "variables": {"after": from_the_start}}),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persisted_documents_and_trusted_mode_are_the_same_on_every_transport() {
    let manifest_dir = tempfile::tempdir().unwrap();
    let manifest = manifest_dir.path().join("persisted-documents.json");
    let entries: serde_json::Map<String, Value> = [ROW_READ, SUBSCRIBE]
        .iter()
        .map(|d| (sha256(d), Value::String(d.to_string())))
        .collect();
    std::fs::write(&manifest, Value::Object(entries).to_string()).unwrap();
    let config = format!(
        "graphql:\n  persisted_documents: {}\n  documents: only_persisted\n",
        manifest.display()
    );
    let (server, secrets, _, _) = server_with_tokens(&["*:read", "*:admin"], &config);
    let [reader, root_admin] = [&secrets[0], &secrets[1]];
    seed(&server, Some(root_admin)).await;
    let mut answers = BTreeMap::new();
    for (principal, token) in [("*:read", reader), ("*:admin", root_admin)] {
        let mut socket = Connection::open(&server, Some(token)).await;
        answers.insert(
            principal,
            differential_of(
                persisted_corpus(),
                &server,
                principal,
                Some(token),
                &mut socket,
            )
            .await,
        );
    }
    let code = |principal: &str, case: &str| answers[principal][case].code().to_string();
    for case in [
        "by id",
        "by bare id",
        "a manifest document as text",
        "a manifest document by APQ hash",
    ] {
        for principal in ["*:read", "*:admin"] {
            let answer = &answers[principal][case];
            assert_eq!(answer.code(), "", "{principal}, {case}: {answer:?}");
            assert_eq!(
                answer.data.as_ref().unwrap()["trips"]["row"]["rowKey"],
                ROW,
                "{case}"
            );
        }
    }
    for case in [
        "a free document",
        "a free document with its APQ hash",
        "a free APQ hash",
    ] {
        assert_eq!(
            code("*:read", case),
            "PERSISTED_DOCUMENT_REQUIRED",
            "{case}"
        );
    }
    // An admin token runs free documents (the playground keeps working).
    assert_eq!(code("*:admin", "a free document"), "");
    assert_eq!(code("*:admin", "a free document with its APQ hash"), "");
    assert_eq!(
        code("*:admin", "a free APQ hash"),
        "PERSISTED_QUERY_NOT_FOUND"
    );
    assert_eq!(
        code("*:read", "an unknown id"),
        "PERSISTED_DOCUMENT_NOT_FOUND"
    );
    assert_eq!(code("*:read", "a malformed id"), "BAD_REQUEST");
    assert_eq!(
        code("*:read", "an APQ hash that is not the text's"),
        "PERSISTED_QUERY_HASH_MISMATCH"
    );
    // Over HTTP a subscription by id is refused as one by text is; the
    // socket ran it (checked by the differential).
    assert_eq!(
        code("*:read", "a subscription by id"),
        "GRAPHQL_VALIDATION_FAILED"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_is_refused_to_other_origins_and_hosts_before_any_frame() {
    let server = Server::start_with(
        &[TRIPS],
        "cors:\n  allowed_origins: [\"https://app.example\"]\n",
        &[],
    );
    let own = server.base.clone();
    let authority = own.trim_start_matches("http://").to_string();
    for (origin, host, expected) in [
        (Some("http://evil.example"), None, Err(403)),
        (Some("null"), None, Err(403)),
        (Some("http://localhost:1"), None, Err(403)),
        (None, Some("evil.example"), Err(403)),
        (Some(own.as_str()), Some("evil.example"), Err(403)),
        (None, None, Ok(())),
        (Some(own.as_str()), None, Ok(())),
        (Some("https://app.example"), None, Ok(())),
        (None, Some(authority.as_str()), Ok(())),
    ] {
        let mut headers = Vec::new();
        if let Some(origin) = origin {
            headers.push(("Origin", origin));
        }
        if let Some(host) = host {
            headers.push(("Host", host));
        }
        let result = try_connect(&server, &headers).await.map(|_| ());
        assert_eq!(result, expected, "Origin {origin:?}, Host {host:?}");
    }
    // What a hostile page would have sent goes nowhere: no cell was written.
    let answer = client()
        .post(server.graphql())
        .json(&json!({"query": "{ trips { cellsForShard(shard: 0) { cells { rowKey } } } }"}))
        .send()
        .await
        .unwrap()
        .json::<Value>()
        .await
        .unwrap();
    assert_eq!(answer["data"]["trips"]["cellsForShard"]["cells"], json!([]));
}

/// Regression: a socket kept the principal its token had at
/// `connection_init`, so a revoked token went on answering queries and
/// delivering its running subscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_ends_its_running_subscription_and_its_new_operations() {
    let (server, secrets, stored, id) = server_with_tokens(&["trips:write"], "");
    let writer = &secrets[0];
    let mut socket = connect(&server).await;
    init(&mut socket, json!({"token": stored})).await;
    send(
        &mut socket,
        json!({"id": "live", "type": "subscribe", "payload": {"query": "subscription { tripsCells(columns: [BASE]) { cell { rowKey } } }"}}),
    )
    .await;
    // The subscription delivers while the token is valid (it starts from
    // the log's head, so cells are written until one arrives).
    let mut written = Vec::new();
    let delivered = loop {
        assert!(written.len() < 200, "the subscription delivered nothing");
        let row = uuid::Uuid::new_v4().to_string();
        put(
            &server,
            Some(writer),
            json!([{"rowKey": row, "column": "BASE", "refKey": "1", "body": {}}]),
        )
        .await;
        written.push(Value::String(row));
        let next = tokio::select! {
            message = receive(&mut socket) => message.expect("open"),
            _ = tokio::time::sleep(Duration::from_millis(300)) => continue,
        };
        break next;
    };
    assert_eq!(delivered["type"], "next", "{delivered}");
    assert!(
        written.contains(&delivered["payload"]["data"]["tripsCells"]["cell"]["rowKey"]),
        "{delivered}"
    );

    token_command(server.dir.path(), &["revoke", &id]);
    // Cells written from now on are not delivered: the subscription ends
    // with UNAUTHENTICATED once the revocation is seen (the bound only
    // keeps a broken gateway from hanging the test).
    let give_up = std::time::Instant::now() + Duration::from_secs(60);
    let ended = loop {
        assert!(
            std::time::Instant::now() < give_up,
            "the subscription still delivers a minute after its token was revoked"
        );
        let row = uuid::Uuid::new_v4().to_string();
        put(
            &server,
            Some(writer),
            json!([{"rowKey": row, "column": "BASE", "refKey": "1", "body": {}}]),
        )
        .await;
        let message = tokio::select! {
            message = receive(&mut socket) => message.expect("the connection stays open"),
            _ = tokio::time::sleep(Duration::from_millis(300)) => continue,
        };
        if message["type"] == "error" {
            break message;
        }
        assert_eq!(message["type"], "next", "{message}");
    };
    assert_eq!(ended["id"], "live", "{ended}");
    assert_eq!(
        ended["payload"][0]["extensions"]["code"], "UNAUTHENTICATED",
        "{ended}"
    );
    // A new operation on the same socket is refused the same way, and the
    // connection stays usable.
    send(
        &mut socket,
        json!({"id": "q", "type": "subscribe", "payload": {"query": "{ __typename }"}}),
    )
    .await;
    let refused = receive(&mut socket).await.unwrap();
    assert_eq!(refused["type"], "error", "{refused}");
    assert_eq!(
        refused["payload"][0]["extensions"]["code"],
        "UNAUTHENTICATED"
    );
    send(&mut socket, json!({"type": "ping"})).await;
    assert_eq!(receive(&mut socket).await, Ok(json!({"type": "pong"})));
}

/// Bad input on the socket: refused with the codes HTTP gives, the
/// connection usable where the protocol allows; a message over the body
/// limit closes it with 1009.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_and_oversized_messages_are_refused_without_harm() {
    let server = Server::start_with(&[TRIPS], "limits:\n  max_body_bytes: 4096\n", &[]);
    let mut socket = connect(&server).await;
    init(&mut socket, json!({})).await;
    for (payload, code) in [
        (json!({"query": 5}), "BAD_REQUEST"),
        (json!({"variables": {}}), "BAD_REQUEST"),
        (json!({"query": "{ trips { "}), "GRAPHQL_PARSE_FAILED"),
        (
            json!({"query": "{ trips { nosuch } }"}),
            "GRAPHQL_VALIDATION_FAILED",
        ),
    ] {
        send(
            &mut socket,
            json!({"id": "1", "type": "subscribe", "payload": payload}),
        )
        .await;
        let error = receive(&mut socket).await.unwrap();
        assert_eq!(error["type"], "error", "{error}");
        assert_eq!(error["payload"][0]["extensions"]["code"], code, "{payload}");
    }
    let huge = "x".repeat(8192);
    send(
        &mut socket,
        json!({"id": "2", "type": "subscribe", "payload": {"query": format!("{{ __typename }} # {huge}")}}),
    )
    .await;
    assert_eq!(receive(&mut socket).await, Err(1009));
    // The gateway goes on serving.
    let mut socket = connect(&server).await;
    init(&mut socket, json!({})).await;
}
