//! `GET /graphql/ws`: GraphQL over WebSocket, protocol
//! `graphql-transport-ws` (the `graphql-ws` library's protocol), mostly for
//! subscriptions; queries and mutations answer with one `next`.
//!
//! Written here rather than taken from `async-graphql-poem` because the
//! protocol's close codes carry the reason of a refusal, which that crate
//! does not distinguish (it closes every refused `connection_init` with
//! 1002), and because authorization and the subscription limits must run
//! per `subscribe`:
//!
//! - no `connection_init` within [`INIT_TIMEOUT`]: close 4408; a second
//!   one: 4429; a message that is not one of the protocol: 4400; a
//!   `subscribe` before the `connection_ack`: 4401; a `subscribe` whose
//!   `id` runs already: 4409; a subprotocol other than
//!   `graphql-transport-ws`: 4406;
//! - the token is the `connection_init` payload's `Authorization` (or
//!   `authorization`, or `token`), a bearer token with or without the
//!   `Bearer ` prefix, else the upgrade request's `Authorization` header.
//!   With auth on, a missing, unknown or revoked token closes with 4403;
//!   an unreadable token store with 4500;
//! - every `subscribe` is checked like a request to `/graphql` (parse,
//!   scopes: `read` on the datastore for `<ds>Cells`, depth and cost
//!   limits); a refusal is an `error` message with `extensions.code`
//!   (`FORBIDDEN`, `GRAPHQL_PARSE_FAILED`, `GRAPHQL_VALIDATION_FAILED`,
//!   `SUBSCRIPTION_LIMIT`) and the connection stays open;
//! - `ping` is answered with `pong` (with the same payload).
//!
//! Each operation runs in a task of its own that sends its messages
//! through a bounded channel to the connection's writer, so a slow client
//! slows only its own subscriptions (whose followers then lag and catch up
//! from the log, see the store's `triggers/tail.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{SinkExt as _, StreamExt as _};
use poem::http::header;
use poem::web::websocket::{Message, WebSocket};
use poem::web::Data;
use poem::{handler, IntoResponse, Request, Response};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::Gateway;
use cellgate_graphql::auth::{AuthError, Principal};

/// The subprotocol spoken.
pub const PROTOCOL: &str = "graphql-transport-ws";
/// How long a client has to send `connection_init`.
const INIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Messages queued for a connection's writer.
const OUTBOX: usize = 256;

/// Subscriptions running per client, over all connections.
#[derive(Default)]
pub struct SubscriptionCounts {
    counts: Mutex<HashMap<String, usize>>,
}

/// One counted subscription; uncounted when dropped.
struct Counted {
    counts: Arc<Gateway>,
    client: String,
}

impl Drop for Counted {
    fn drop(&mut self) {
        let mut counts = self.counts.subscriptions.counts.lock().expect("counts");
        if let Some(n) = counts.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.client);
            }
        }
    }
}

/// The upgrade of `/graphql/ws`.
#[handler]
pub(super) async fn graphql_ws(
    request: &Request,
    socket: WebSocket,
    Data(gateway): Data<&Arc<Gateway>>,
) -> Response {
    let offered = request
        .header(header::SEC_WEBSOCKET_PROTOCOL)
        .is_some_and(|p| p.split(',').any(|p| p.trim() == PROTOCOL));
    let authorization = request.header(header::AUTHORIZATION).map(str::to_string);
    let address = request
        .remote_addr()
        .as_socket_addr()
        .map(|a| super::client_key(a.ip(), gateway.client_ipv6_prefix).to_string())
        .unwrap_or_default();
    let gateway = gateway.clone();
    socket
        .protocols([PROTOCOL])
        .on_upgrade(move |stream| async move {
            let (sink, source) = stream.split();
            let connection = Connection {
                gateway,
                authorization,
                address,
                principal: None,
                running: HashMap::new(),
            };
            connection.serve(sink, source, offered).await;
        })
        .into_response()
}

/// A message for the client.
enum Out {
    Text(String),
}

struct Connection {
    gateway: Arc<Gateway>,
    authorization: Option<String>,
    address: String,
    /// Set by `connection_init`.
    principal: Option<Principal>,
    /// The running operations by id.
    running: HashMap<String, tokio::task::JoinHandle<()>>,
}

impl Connection {
    async fn serve<W, R>(mut self, mut sink: W, mut source: R, offered: bool)
    where
        W: futures::Sink<Message> + Unpin,
        R: futures::Stream<Item = std::io::Result<Message>> + Unpin,
    {
        if !offered {
            let _ = sink
                .send(Message::close_with(4406u16, "Subprotocol not acceptable"))
                .await;
            return;
        }
        let (outbox, mut out) = mpsc::channel::<Out>(OUTBOX);
        let init_deadline = tokio::time::sleep(INIT_TIMEOUT);
        tokio::pin!(init_deadline);
        loop {
            let close = tokio::select! {
                message = source.next() => match message {
                    Some(Ok(Message::Text(text))) => self.receive(&text, &outbox).await,
                    Some(Ok(Message::Binary(_))) => Some((4400, "binary messages are not part of the protocol".to_string())),
                    Some(Ok(Message::Close(_))) | None | Some(Err(_)) => break,
                    Some(Ok(_)) => None,
                },
                Some(message) = out.recv() => match message {
                    Out::Text(text) => {
                        if sink.send(Message::Text(text)).await.is_err() {
                            break;
                        }
                        None
                    }
                },
                _ = &mut init_deadline, if self.principal.is_none() => {
                    Some((4408, "Connection initialisation timeout".to_string()))
                }
            };
            if let Some((code, reason)) = close {
                let _ = sink.send(Message::close_with(code, reason)).await;
                break;
            }
        }
        for (_, task) in self.running.drain() {
            task.abort();
        }
    }

    /// Handles one client message; `Some` closes the connection.
    async fn receive(&mut self, text: &str, outbox: &mpsc::Sender<Out>) -> Option<(u16, String)> {
        let Ok(message) = serde_json::from_str::<Value>(text) else {
            return Some((4400, "Invalid message received".into()));
        };
        let kind = message.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "connection_init" => {
                if self.principal.is_some() {
                    return Some((4429, "Too many initialisation requests".into()));
                }
                let payload = message.get("payload").cloned().unwrap_or(Value::Null);
                let token = ["Authorization", "authorization", "token"]
                    .iter()
                    .find_map(|k| payload.get(*k).and_then(Value::as_str))
                    .map(|t| {
                        if t.starts_with("Bearer ") || t.starts_with("bearer ") {
                            t.to_string()
                        } else {
                            format!("Bearer {t}")
                        }
                    })
                    .or_else(|| self.authorization.clone());
                match self.gateway.auth.authenticate(token.as_deref()).await {
                    Ok(principal) => {
                        self.principal = Some(principal);
                        let ack = json!({"type": "connection_ack"}).to_string();
                        let _ = outbox.send(Out::Text(ack)).await;
                        None
                    }
                    Err(AuthError::Unavailable) => Some((
                        4500,
                        "the API tokens cannot be read now; retry later".into(),
                    )),
                    Err(_) => Some((4403, "Forbidden".into())),
                }
            }
            "ping" => {
                let mut pong = json!({"type": "pong"});
                if let Some(payload) = message.get("payload") {
                    pong["payload"] = payload.clone();
                }
                let _ = outbox.send(Out::Text(pong.to_string())).await;
                None
            }
            "pong" => None,
            "subscribe" => {
                let Some(principal) = self.principal.clone() else {
                    return Some((4401, "Unauthorized".into()));
                };
                let Some(id) = message.get("id").and_then(Value::as_str) else {
                    return Some((4400, "a subscribe message needs an id".into()));
                };
                let Some(payload) = message.get("payload") else {
                    return Some((4400, "a subscribe message needs a payload".into()));
                };
                self.running.retain(|_, task| !task.is_finished());
                if self.running.contains_key(id) {
                    return Some((4409, format!("Subscriber for {id} already exists")));
                }
                match self.start(id, payload, principal, outbox.clone()) {
                    Ok(task) => {
                        self.running.insert(id.to_string(), task);
                    }
                    Err(errors) => {
                        let error = json!({"type": "error", "id": id, "payload": errors});
                        let _ = outbox.send(Out::Text(error.to_string())).await;
                    }
                }
                None
            }
            "complete" => {
                if let Some(id) = message.get("id").and_then(Value::as_str) {
                    if let Some(task) = self.running.remove(id) {
                        task.abort();
                    }
                }
                None
            }
            _ => Some((4400, format!("Invalid message type `{kind}`"))),
        }
    }

    /// Checks a `subscribe` and starts its task; the errors of a refusal.
    fn start(
        &self,
        id: &str,
        payload: &Value,
        principal: Principal,
        outbox: mpsc::Sender<Out>,
    ) -> Result<tokio::task::JoinHandle<()>, Value> {
        let refuse = |code: &str, message: String| {
            Err(json!([{"message": message, "extensions": {"code": code}}]))
        };
        let Some(query) = payload.get("query").and_then(Value::as_str) else {
            return refuse("BAD_REQUEST", "the payload needs a `query` string".into());
        };
        let operation_name = payload
            .get("operationName")
            .and_then(Value::as_str)
            .map(str::to_string);
        let variables = payload.get("variables").cloned().unwrap_or(Value::Null);
        let served = self.gateway.served();
        let parsed = match served.documents.parse(query) {
            Ok(parsed) => parsed,
            Err(error) => return refuse("GRAPHQL_PARSE_FAILED", error.message),
        };
        if let Err(denied) = cellgate_graphql::authorize(
            &parsed.document,
            operation_name.as_deref(),
            &principal,
            &served.access,
            self.gateway.introspection,
        ) {
            return refuse("FORBIDDEN", denied.message);
        }
        let mut request = async_graphql::Request::new(query);
        request.operation_name = operation_name.clone();
        if !variables.is_null() {
            request.variables = async_graphql::Variables::from_json(variables);
        }
        if let Err(error) = cellgate_graphql::check_limits(
            &parsed.document,
            operation_name.as_deref(),
            &request.variables,
            self.gateway.graphql_limits,
        ) {
            return refuse("GRAPHQL_VALIDATION_FAILED", error.message);
        }
        let per_connection = self.gateway.max_subscriptions_per_connection;
        if self.running.len() >= per_connection {
            return refuse(
                "SUBSCRIPTION_LIMIT",
                format!("at most {per_connection} subscriptions run on one connection"),
            );
        }
        let client = principal
            .token
            .as_deref()
            .map(|t| format!("token:{t}"))
            .unwrap_or_else(|| format!("address:{}", self.address));
        let counted = {
            let per_client = self.gateway.max_subscriptions_per_client;
            let mut counts = self.gateway.subscriptions.counts.lock().expect("counts");
            let n = counts.entry(client.clone()).or_insert(0);
            if *n >= per_client {
                drop(counts);
                return refuse(
                    "SUBSCRIPTION_LIMIT",
                    format!("at most {per_client} subscriptions run for one client"),
                );
            }
            *n += 1;
            Counted {
                counts: self.gateway.clone(),
                client,
            }
        };
        request.set_parsed_query(parsed.document.clone());
        let gateway = self.gateway.clone();
        let id = id.to_string();
        Ok(tokio::spawn(async move {
            let _counted = counted;
            let mut responses = Box::pin(cellgate_graphql::execute_stream(
                &served.schema,
                &gateway.store,
                principal,
                request,
            ));
            let mut first = true;
            while let Some(response) = responses.next().await {
                // Validation fails before execution: no data and no path.
                let refused = first
                    && response.data == async_graphql::Value::Null
                    && !response.errors.is_empty()
                    && response.errors.iter().all(|e| e.path.is_empty());
                first = false;
                let message = if refused {
                    let errors: Vec<Value> = response
                        .errors
                        .iter()
                        .map(|e| {
                            let mut error = serde_json::to_value(e).unwrap_or_default();
                            if error.pointer("/extensions/code").is_none() {
                                error["extensions"] = json!({"code": "GRAPHQL_VALIDATION_FAILED"});
                            }
                            error
                        })
                        .collect();
                    json!({"type": "error", "id": id, "payload": errors})
                } else {
                    json!({"type": "next", "id": id, "payload": response})
                };
                let text = message.to_string();
                if outbox.send(Out::Text(text)).await.is_err() || refused {
                    return;
                }
            }
            let complete = json!({"type": "complete", "id": id}).to_string();
            let _ = outbox.send(Out::Text(complete)).await;
        }))
    }
}
