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
        let key = (|| {
            Some((
                cell["rowKey"].as_str()?.parse().ok()?,
                cell["column"].as_str()?.to_string(),
                cell["refKey"].as_str()?.parse().ok()?,
            ))
        })();
        let key = key.unwrap_or_else(|| panic!("a cell without its key: {cell}"));
        self.0.lock().unwrap().insert(key);
    }
}

/// Serves a webhook receiver on a loopback port that takes every POST
/// (200) and records its cells; its URL and what it got.
pub async fn webhook_receiver() -> (String, Got) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hooks", listener.local_addr().unwrap());
    let got = Got::default();
    let taking = got.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let got = taking.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |request: hyper::Request<hyper::body::Incoming>| {
                        let got = got.clone();
                        async move {
                            let body = request.into_body().collect().await?.to_bytes();
                            let doc: Value = serde_json::from_slice(&body).expect("a JSON body");
                            for cell in doc["cells"].as_array().expect("cells") {
                                got.take(cell);
                            }
                            Ok::<_, hyper::Error>(hyper::Response::new(http_body_util::Full::new(
                                bytes::Bytes::new(),
                            )))
                        }
                    },
                );
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, got)
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
