//! Followers of a datastore's cells for end-to-end tests: a webhook
//! receiver, and a `graphql-transport-ws` subscriber that resumes from its
//! last cursor; each records the keys of the cells it was given.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use http_body_util::BodyExt as _;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;
use uuid::Uuid;

use super::socket;

/// `(row_key, column, ref_key)`: a cell's key.
pub type CellKey = (Uuid, String, i64);

/// The keys of the cells a follower was given, each counted once.
#[derive(Clone, Default)]
pub struct Got(Arc<Mutex<BTreeSet<CellKey>>>);

impl Got {
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// The keys of `keys` not given yet.
    pub fn missing<'a>(&self, keys: impl IntoIterator<Item = &'a CellKey>) -> Vec<CellKey> {
        let got = self.0.lock().unwrap();
        keys.into_iter()
            .filter(|k| !got.contains(*k))
            .cloned()
            .collect()
    }

    fn take(&self, cell: &Value) {
        self.0.lock().unwrap().insert(key(cell));
    }
}

/// Serves a webhook receiver on a loopback port that takes every POST
/// (200) and records its cells; its URL and what it got.
pub async fn webhook_receiver() -> (String, Got) {
    let receiver = Receiver::start(|_, _| Reply::default(), None).await;
    (receiver.url("/hooks"), receiver.got.clone())
}

/// How a [`Receiver`] answers one request.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    /// 200 when 0.
    pub status: u16,
    pub location: Option<String>,
    /// How long it takes before it answers.
    pub delay: Duration,
}

/// One request a [`Receiver`] was sent.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub path: String,
    pub status: u16,
    pub signature: Option<String>,
    /// The keys of the cells of its body (none without one).
    pub cells: Vec<CellKey>,
}

/// A webhook receiver on a loopback port, answering as its `answer` says,
/// over TLS when given an acceptor; it records every request, and the
/// cells of the POSTs it answered 2xx.
pub struct Receiver {
    pub base: String,
    pub got: Got,
    pub requests: Arc<Mutex<Vec<Request>>>,
}

type Answer = Arc<dyn Fn(&str, &str) -> Reply + Send + Sync>;

impl Receiver {
    pub async fn start(
        answer: impl Fn(&str, &str) -> Reply + Send + Sync + 'static,
        tls: Option<tokio_rustls::TlsAcceptor>,
    ) -> Receiver {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let scheme = if tls.is_some() { "https" } else { "http" };
        let base = format!("{scheme}://{}", listener.local_addr().unwrap());
        let receiver = Receiver {
            base,
            got: Got::default(),
            requests: Arc::default(),
        };
        let answer: Answer = Arc::new(answer);
        let (got, requests) = (receiver.got.clone(), receiver.requests.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (got, requests, answer, tls) =
                    (got.clone(), requests.clone(), answer.clone(), tls.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(
                        move |request: hyper::Request<hyper::body::Incoming>| {
                            let (got, requests, answer) =
                                (got.clone(), requests.clone(), answer.clone());
                            async move {
                                let method = request.method().to_string();
                                let path = request.uri().path().to_string();
                                let signature = request
                                    .headers()
                                    .get("x-cellgate-signature")
                                    .and_then(|v| v.to_str().ok())
                                    .map(str::to_string);
                                let body = request.into_body().collect().await?.to_bytes();
                                let reply = answer(&method, &path);
                                tokio::time::sleep(reply.delay).await;
                                let status = if reply.status == 0 { 200 } else { reply.status };
                                let doc: Value =
                                    serde_json::from_slice(&body).unwrap_or(Value::Null);
                                let cells: Vec<&Value> =
                                    doc["cells"].as_array().into_iter().flatten().collect();
                                if (200..300).contains(&status) {
                                    for cell in &cells {
                                        got.take(cell);
                                    }
                                }
                                requests.lock().unwrap().push(Request {
                                    method,
                                    path,
                                    status,
                                    signature,
                                    cells: cells.iter().map(|c| key(c)).collect(),
                                });
                                let mut response = hyper::Response::builder().status(status);
                                if let Some(location) = reply.location {
                                    response = response.header("location", location);
                                }
                                Ok::<_, hyper::Error>(
                                    response
                                        .body(http_body_util::Full::new(bytes::Bytes::new()))
                                        .unwrap(),
                                )
                            }
                        },
                    );
                    let http = hyper::server::conn::http1::Builder::new();
                    match tls {
                        Some(tls) => {
                            if let Ok(stream) = tls.accept(stream).await {
                                let _ = http
                                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = http
                                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        receiver
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// A cell's key from its JSON form.
fn key(cell: &Value) -> CellKey {
    (|| {
        Some((
            cell["rowKey"].as_str()?.parse().ok()?,
            cell["column"].as_str()?.to_string(),
            cell["refKey"].as_str()?.parse().ok()?,
        ))
    })()
    .unwrap_or_else(|| panic!("a cell without its key: {cell}"))
}

/// A private certificate authority and a certificate it signed for
/// `127.0.0.1` and `localhost`: the CA's PEM, and an acceptor serving the
/// certificate.
pub fn private_tls() -> (String, tokio_rustls::TlsAcceptor) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "cellgate test CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
        .unwrap()
        .signed_by(&key, &ca_cert, &ca_key)
        .unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    (
        ca_cert.pem(),
        tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    )
}

/// Follows the cells of `column` of the datastore whose subscription field
/// is `field` through the `/graphql/ws` at `url`, from the beginning of
/// the log; a socket that ends or fails is opened again from the last
/// cursor. Runs while the test's runtime does.
pub fn subscribe(url: String, field: &'static str, column: &'static str) -> Got {
    let got = Got::default();
    let taking = got.clone();
    tokio::spawn(async move {
        let query = format!(
            "subscription($after: String) {{ {field}(columns: [{column}], after: $after) {{ cursor cell {{ rowKey column refKey }} }} }}"
        );
        let mut cursor = Value::Null;
        loop {
            let Ok(mut ws) = socket::connect_url(&url, &[]).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            };
            if socket::try_init(&mut ws, json!({})).await.is_err() {
                continue;
            }
            let after = match &cursor {
                Value::Null => json!(cellgate_store::triggers::tail::encode_cursor(
                    &Default::default()
                )),
                at => at.clone(),
            };
            socket::send(
                &mut ws,
                json!({"id": "1", "type": "subscribe", "payload": {"query": query, "variables": {"after": after}}}),
            )
            .await;
            while let Some(Ok(message)) = ws.next().await {
                let Message::Text(text) = message else {
                    continue;
                };
                let message: Value = serde_json::from_str(&text).expect("JSON");
                if message["type"] != "next" {
                    // An error or the end: subscribe again from the cursor.
                    eprintln!("subscription: {message}");
                    break;
                }
                let event = &message["payload"]["data"][field];
                if event.is_null() {
                    eprintln!("subscription: {message}");
                    break;
                }
                taking.take(&event["cell"]);
                cursor = event["cursor"].clone();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    got
}
