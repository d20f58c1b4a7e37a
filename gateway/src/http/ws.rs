//! `GET /graphql/ws`: GraphQL over WebSocket, protocol
//! `graphql-transport-ws` (the `graphql-ws` library's protocol), mostly for
//! subscriptions; queries and mutations answer with one `next`.
//!
//! This module keeps only what belongs to the socket; every operation goes
//! through the request pipeline (`cellgate_graphql::Pipeline`) like a
//! request to `/graphql`, with the same parsing, authorization, scoped
//! introspection, limits, direct forms, deadline and error codes.
//!
//! - **The upgrade** passes the `Host` check of every route (`hosts.rs`)
//!   and an `Origin` check with the rule of CORS (`cors.rs`): a browser
//!   page may open the socket only from the gateway's own origin or a
//!   configured `cors.allowed_origins` entry; a request without `Origin` is
//!   not from a browser and is served. Otherwise 403 `ORIGIN_NOT_ALLOWED`,
//!   before any frame: browsers send no CORS preflight for WebSockets, so
//!   without it any page a developer visits could write to a gateway on
//!   loopback with auth off.
//! - **Close codes** carry the protocol's reasons: no `connection_init`
//!   within [`INIT_TIMEOUT`]: 4408; a second one: 4429; a message that is
//!   not one of the protocol: 4400; a `subscribe` before the
//!   `connection_ack`: 4401; a `subscribe` whose `id` runs already: 4409;
//!   a subprotocol other than `graphql-transport-ws`: 4406; a message over
//!   `limits.max_body_bytes` (the limit of a request body): 1009.
//! - **The token** is the `connection_init` payload's `Authorization` (or
//!   `authorization`, or `token`), a bearer token with or without the
//!   `Bearer ` prefix, else the upgrade request's `Authorization` header.
//!   With auth on, a missing, unknown or revoked token closes with 4403;
//!   an unreadable token store with 4500. The connection keeps the token,
//!   not what it allowed: every `subscribe` authenticates it again (through
//!   the token cache, as a request to `/graphql` does), and a running
//!   subscription is checked every second by the pipeline, so a revoked
//!   token ends its socket's operations (`error` with `UNAUTHENTICATED`)
//!   within the horizon it has on HTTP.
//! - **Refusals** of a `subscribe` are `error` messages with the codes a
//!   request to `/graphql` gets; the connection stays open. Queries and
//!   mutations are admitted like HTTP requests (rate per address and token,
//!   concurrency: `RATE_LIMITED`, `OVERLOADED`) and counted in the
//!   request metrics; subscriptions have limits per connection and per
//!   client (`SUBSCRIPTION_LIMIT`).
//! - `ping` is answered with `pong` (with the same payload).
//!
//! Each operation runs in a task of its own that sends its messages
//! through a bounded channel to the connection's writer, so a slow client
//! slows only its own subscriptions (whose followers then lag and catch up
//! from the log, see the store's `triggers/tail.rs`).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{SinkExt as _, StreamExt as _};
use poem::http::{header, StatusCode};
use poem::web::websocket::{Message, WebSocket, WebSocketConfig};
use poem::web::Data;
use poem::{handler, IntoResponse, Request, Response};
use serde_json::value::RawValue;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::admission::Rejection;
use super::metrics::Outcome;
use super::Gateway;
use cellgate_graphql::{GraphqlRequest, Refusal, RefusalKind, Transport};

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
    let origin = request.header(header::ORIGIN);
    let host = request
        .header(header::HOST)
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if !super::cors::socket_origin_allowed(&gateway.cors, origin, host) {
        return Response::builder()
            .status(StatusCode::FORBIDDEN)
            .content_type("text/plain; charset=utf-8")
            .body(
                "ORIGIN_NOT_ALLOWED: pages of this origin may not open the GraphQL socket; \
                 add it to cors.allowed_origins in cellgate.yaml",
            );
    }
    let offered = request
        .header(header::SEC_WEBSOCKET_PROTOCOL)
        .is_some_and(|p| p.split(',').any(|p| p.trim() == PROTOCOL));
    let authorization = request.header(header::AUTHORIZATION).map(str::to_string);
    let ip = request.remote_addr().as_socket_addr().map(|a| a.ip());
    let address = ip
        .map(|ip| super::client_key(ip, gateway.client_ipv6_prefix).to_string())
        .unwrap_or_default();
    let gateway = gateway.clone();
    let config = WebSocketConfig::default()
        .max_message_size(Some(gateway.max_body_bytes))
        .max_frame_size(Some(gateway.max_body_bytes));
    socket
        .protocols([PROTOCOL])
        .config(config)
        .on_upgrade(move |stream| async move {
            let (sink, source) = stream.split();
            let connection = Connection {
                gateway,
                authorization,
                ip,
                address,
                initialized: false,
                running: HashMap::new(),
            };
            connection.serve(sink, source, offered).await;
        })
        .into_response()
}

struct Connection {
    gateway: Arc<Gateway>,
    /// The `Authorization` value the operations are authenticated with:
    /// from `connection_init`, else from the upgrade request.
    authorization: Option<String>,
    ip: Option<IpAddr>,
    /// The client key of the address, for the subscription limits.
    address: String,
    /// Whether `connection_init` was acknowledged.
    initialized: bool,
    /// The running operations by id.
    running: HashMap<String, tokio::task::JoinHandle<()>>,
}

/// A close code and reason.
type Close = (u16, String);

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
        let (outbox, mut out) = mpsc::channel::<String>(OUTBOX);
        let init_deadline = tokio::time::sleep(INIT_TIMEOUT);
        tokio::pin!(init_deadline);
        loop {
            let close = tokio::select! {
                message = source.next() => match message {
                    Some(Ok(Message::Text(text))) => self.receive(&text, &outbox).await,
                    Some(Ok(Message::Binary(_))) => Some((4400, "binary messages are not part of the protocol".to_string())),
                    Some(Ok(Message::Close(_))) | None => break,
                    // A message over the size limit; any other read error
                    // leaves no connection to answer on.
                    Some(Err(_)) => Some((1009, "message too big or unreadable".to_string())),
                    Some(Ok(_)) => None,
                },
                Some(text) = out.recv() => {
                    if sink.send(Message::Text(text)).await.is_err() {
                        break;
                    }
                    None
                },
                _ = &mut init_deadline, if !self.initialized => {
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
    async fn receive(&mut self, text: &str, outbox: &mpsc::Sender<String>) -> Option<Close> {
        #[derive(serde::Deserialize)]
        struct ClientMessage<'a> {
            #[serde(rename = "type")]
            kind: String,
            #[serde(default)]
            id: Option<String>,
            #[serde(borrow, default)]
            payload: Option<&'a RawValue>,
        }
        let Ok(message) = serde_json::from_str::<ClientMessage>(text) else {
            return Some((4400, "Invalid message received".into()));
        };
        match message.kind.as_str() {
            "connection_init" => self.init(message.payload, outbox).await,
            "ping" => {
                let pong = match message.payload {
                    Some(payload) => format!(r#"{{"type":"pong","payload":{}}}"#, payload.get()),
                    None => r#"{"type":"pong"}"#.to_string(),
                };
                let _ = outbox.send(pong).await;
                None
            }
            "pong" => None,
            "subscribe" => {
                if !self.initialized {
                    return Some((4401, "Unauthorized".into()));
                }
                let Some(id) = message.id else {
                    return Some((4400, "a subscribe message needs an id".into()));
                };
                let Some(payload) = message.payload else {
                    return Some((4400, "a subscribe message needs a payload".into()));
                };
                self.running.retain(|_, task| !task.is_finished());
                if self.running.contains_key(&id) {
                    return Some((4409, format!("Subscriber for {id} already exists")));
                }
                let refusal = match GraphqlRequest::from_json(payload.get().as_bytes()) {
                    Ok(request) => match self.start(&id, request, outbox.clone()) {
                        Ok(task) => {
                            self.running.insert(id, task);
                            return None;
                        }
                        Err(refusal) => refusal,
                    },
                    Err(refusal) => refusal,
                };
                let _ = outbox.send(error_message(&id, &refusal.errors)).await;
                None
            }
            "complete" => {
                if let Some(task) = message.id.and_then(|id| self.running.remove(&id)) {
                    task.abort();
                }
                None
            }
            kind => Some((4400, format!("Invalid message type `{kind}`"))),
        }
    }

    /// `connection_init`: authenticates the token it carries, which the
    /// connection then keeps for its operations.
    async fn init(
        &mut self,
        payload: Option<&RawValue>,
        outbox: &mpsc::Sender<String>,
    ) -> Option<Close> {
        if self.initialized {
            return Some((4429, "Too many initialisation requests".into()));
        }
        let payload: Value = payload
            .and_then(|p| serde_json::from_str(p.get()).ok())
            .unwrap_or(Value::Null);
        let token = ["Authorization", "authorization", "token"]
            .iter()
            .find_map(|k| payload.get(*k).and_then(Value::as_str))
            .map(|t| {
                if t.starts_with("Bearer ") || t.starts_with("bearer ") {
                    t.to_string()
                } else {
                    format!("Bearer {t}")
                }
            });
        if token.is_some() {
            self.authorization = token;
        }
        match self
            .gateway
            .pipeline
            .authenticate(self.authorization.as_deref())
            .await
        {
            Ok(_) => {
                self.initialized = true;
                let _ = outbox
                    .send(r#"{"type":"connection_ack"}"#.to_string())
                    .await;
                None
            }
            Err(refusal) if refusal.kind == RefusalKind::AuthUnavailable => Some((
                4500,
                "the API tokens cannot be read now; retry later".into(),
            )),
            Err(_) => Some((4403, "Forbidden".into())),
        }
    }

    /// Checks the limits a `subscribe` is held to before it runs, and
    /// starts its task, which runs it through the pipeline.
    fn start(
        &self,
        id: &str,
        request: GraphqlRequest,
        outbox: mpsc::Sender<String>,
    ) -> Result<tokio::task::JoinHandle<()>, Refusal> {
        let gateway = &self.gateway;
        gateway.admission.limit_address(self.ip).map_err(rejected)?;
        let per_connection = gateway.max_subscriptions_per_connection;
        if self.running.len() >= per_connection {
            return Err(subscription_limit(format!(
                "at most {per_connection} subscriptions run on one connection"
            )));
        }
        let task = Operation {
            gateway: gateway.clone(),
            id: id.to_string(),
            authorization: self.authorization.clone(),
            address: self.address.clone(),
            outbox,
        };
        Ok(tokio::spawn(task.run(request)))
    }
}

/// One operation of a connection, run in its own task.
struct Operation {
    gateway: Arc<Gateway>,
    id: String,
    authorization: Option<String>,
    address: String,
    outbox: mpsc::Sender<String>,
}

impl Operation {
    async fn run(self, request: GraphqlRequest) {
        let start = Instant::now();
        let mut operation = request.operation_name.clone();
        let (outcome, refusal) = match self.answer(request, &mut operation).await {
            Ok(outcome) => (outcome, None),
            Err((outcome, refusal)) => (outcome, Some(refusal)),
        };
        if let Some(refusal) = refusal {
            let _ = self
                .outbox
                .send(error_message(&self.id, &refusal.errors))
                .await;
        }
        if let Some(outcome) = outcome {
            self.gateway
                .metrics
                .record(operation.as_deref(), outcome, start.elapsed());
        }
    }

    /// Runs the operation and sends its messages; the outcome of a query or
    /// mutation for the metrics (`None` for a subscription), or the
    /// refusal to send as an `error`.
    async fn answer(
        &self,
        request: GraphqlRequest,
        operation: &mut Option<String>,
    ) -> Result<Option<Outcome>, (Option<Outcome>, Refusal)> {
        let pipeline = &self.gateway.pipeline;
        let refused = |refusal: Refusal| (Some(Outcome::refused(refusal.kind)), refusal);
        let caller = pipeline
            .authenticate(self.authorization.as_deref())
            .await
            .map_err(refused)?;
        let prepared = pipeline
            .prepare(request, &caller, Transport::Socket)
            .map_err(refused)?;
        *operation = prepared.operation_name().map(str::to_string);
        if prepared.is_subscription() {
            let client = caller
                .principal
                .token
                .as_deref()
                .map(|t| format!("token:{t}"))
                .unwrap_or_else(|| format!("address:{}", self.address));
            let _counted = self.count(client).map_err(|refusal| (None, refusal))?;
            let mut events = prepared.subscribe();
            while let Some(event) = events.next().await {
                match event {
                    Ok(body) => {
                        if !self.send_next(body).await {
                            return Ok(None);
                        }
                    }
                    Err(refusal) => return Err((None, refusal)),
                }
            }
            self.complete().await;
            return Ok(None);
        }
        let _permit = self
            .gateway
            .admission
            .admit(caller.principal.token.as_ref())
            .map_err(|rejection| {
                let refusal = rejected(rejection);
                let outcome = match rejection {
                    Rejection::RateLimited { .. } => Outcome::RateLimited,
                    Rejection::Overloaded => Outcome::Overloaded,
                };
                (Some(outcome), refusal)
            })?;
        let executed = prepared.execute().await.map_err(refused)?;
        let outcome = if executed.has_errors {
            Outcome::Error
        } else {
            Outcome::Ok
        };
        if self.send_next(executed.body).await {
            self.complete().await;
        }
        Ok(Some(outcome))
    }

    /// Counts a subscription of `client` against its limit.
    fn count(&self, client: String) -> Result<Counted, Refusal> {
        let per_client = self.gateway.max_subscriptions_per_client;
        let mut counts = self.gateway.subscriptions.counts.lock().expect("counts");
        let n = counts.entry(client.clone()).or_insert(0);
        if *n >= per_client {
            return Err(subscription_limit(format!(
                "at most {per_client} subscriptions run for one client"
            )));
        }
        *n += 1;
        Ok(Counted {
            counts: self.gateway.clone(),
            client,
        })
    }

    /// Sends a `next` with `body` as its payload; false when the
    /// connection is gone.
    async fn send_next(&self, body: Vec<u8>) -> bool {
        let payload = String::from_utf8(body).unwrap_or_else(|_| "{}".to_string());
        let message = format!(
            r#"{{"type":"next","id":{},"payload":{payload}}}"#,
            json_string(&self.id)
        );
        self.outbox.send(message).await.is_ok()
    }

    async fn complete(&self) {
        let message = format!(r#"{{"type":"complete","id":{}}}"#, json_string(&self.id));
        let _ = self.outbox.send(message).await;
    }
}

/// An `error` message for the operation `id`.
fn error_message(id: &str, errors: &[Value]) -> String {
    json!({"type": "error", "id": id, "payload": errors}).to_string()
}

fn json_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".to_string())
}

fn subscription_limit(message: String) -> Refusal {
    Refusal::new(RefusalKind::Invalid, "SUBSCRIPTION_LIMIT", message)
}

/// The refusal of an operation that admission control turned away, with
/// the codes of HTTP's 429 and 503.
fn rejected(rejection: Rejection) -> Refusal {
    let (code, message) = match rejection {
        Rejection::RateLimited { .. } => (
            "RATE_LIMITED",
            "too many requests from this client; retry later",
        ),
        Rejection::Overloaded => (
            "OVERLOADED",
            "the server is at its request limit; retry later",
        ),
    };
    let mut refusal = Refusal::new(RefusalKind::Invalid, code, message);
    refusal.errors[0]["extensions"]["retryable"] = Value::Bool(true);
    refusal
}
