//! Webhook triggers: the trigger definitions of `datastores/<ds>/triggers/`
//! run as log consumers of the store that POST their cells to a URL.
//!
//! The store owns delivery (per-shard order, offsets in the datastore,
//! leases shared between gateways, retries and quarantine); this module only
//! turns a [`Trigger`] into [`ConsumerOptions`] and a handler. The handler
//! drops the cells whose body does not match the trigger's filter
//! ([`Filter::matches_json`], the rules partial indexes use too; they are
//! acknowledged with the batch), POSTs the others as one JSON document and
//! acknowledges on any 2xx answer. Everything a delivery needs is resolved
//! at start-up — header values naming environment variables, the signing
//! secret, the URL — so a missing variable stops `cellgate serve` instead
//! of failing every delivery later.
//!
//! The body is SPEC §7's `{"trigger", "datastore", "cells": [...]}` with
//! the cell fields named as in the GraphQL API. 64-bit integers (`refKey`,
//! `addedId`) are decimal strings as the GraphQL `Int64` scalar returns
//! them, so JavaScript receivers keep them exact; `shard` is a number,
//! `createdAt` an RFC 3339 UTC time. The signature header is
//! `X-Cellgate-Signature: sha256=<hex HMAC-SHA256 of the exact body bytes>`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use chrono::SecondsFormat;
use hmac::{Hmac, Mac as _};
use index_dsl::{Definitions, Filter, Trigger};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};
use serde_json::Value;
use sha2::Sha256;

use crate::config::TriggersConfig;
use cellgate_store::cells::Cell;
use cellgate_store::triggers::{Consumer, ConsumerOptions, Delivery, Handler, HandlerFuture};
use cellgate_store::Store;

/// The header carrying the body's signature.
pub const SIGNATURE_HEADER: &str = "x-cellgate-signature";

/// Starts one consumer per trigger of `defs`. Fails, before any is started,
/// when a header or secret names an environment variable that is not set.
pub fn start(
    store: &Store,
    defs: &Definitions,
    config: &TriggersConfig,
) -> anyhow::Result<Vec<Consumer>> {
    let client = http_client(None)?;
    let triggers: Vec<&Trigger> = defs
        .datastores
        .iter()
        .flat_map(|d| d.triggers.iter())
        .collect();
    let mut hooks = Vec::new();
    for trigger in &triggers {
        let hook =
            Webhook::new(trigger, &client, |name| std::env::var(name).ok()).with_context(|| {
                format!(
                    "trigger `{}` of datastore `{}`",
                    trigger.name, trigger.datastore
                )
            })?;
        hooks.push((options(trigger, config), Arc::new(hook)));
    }
    let mut consumers = Vec::new();
    for (options, hook) in hooks {
        let name = format!("{} of datastore {}", options.name, options.datastore);
        let handler: Handler = Arc::new(move |delivery: Delivery| -> HandlerFuture {
            let hook = hook.clone();
            Box::pin(async move { hook.deliver(&delivery).await })
        });
        let consumer = store
            .start_consumer(options, handler)
            .map_err(|e| anyhow::anyhow!("cannot start trigger {name}: {e}"))?;
        tracing::info!(trigger = %name, "webhook trigger started");
        consumers.push(consumer);
    }
    Ok(consumers)
}

/// The consumer of `trigger`, with the timing of `config`.
fn options(trigger: &Trigger, config: &TriggersConfig) -> ConsumerOptions {
    let mut options = ConsumerOptions::new(&trigger.name, &trigger.datastore);
    options.columns = trigger.columns.clone();
    options.batch_size = trigger.batch_size as usize;
    options.max_attempts = trigger.max_attempts;
    options.quarantine_limit = config.quarantine_limit;
    options.min_backoff = Duration::from_millis(config.min_backoff_ms.max(1));
    options.max_backoff = Duration::from_millis(config.max_backoff_ms.max(config.min_backoff_ms));
    options.lease_time = Duration::from_millis(config.lease_time_ms.max(100));
    options.sweep_every = Duration::from_millis(config.sweep_interval_ms.max(10));
    options
}

/// A trigger ready to post: everything from the environment resolved.
struct Webhook {
    name: String,
    datastore: String,
    url: String,
    headers: HeaderMap,
    secret: Option<Vec<u8>>,
    timeout: Duration,
    filter: Option<Filter>,
    client: reqwest::Client,
}

impl Webhook {
    fn new(
        trigger: &Trigger,
        client: &reqwest::Client,
        env: impl Fn(&str) -> Option<String>,
    ) -> anyhow::Result<Webhook> {
        let client = match &trigger.webhook.ca_file {
            Some(ca_file) => http_client(Some(ca_file))?,
            None => client.clone(),
        };
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        for (name, template) in &trigger.webhook.headers {
            let value = template.render(&env).map_err(|var| {
                anyhow::anyhow!(
                    "header `{name}` names environment variable `{var}`, which is not set"
                )
            })?;
            let name = HeaderName::from_bytes(name.as_bytes())
                .with_context(|| format!("invalid header name `{name}`"))?;
            let value = HeaderValue::from_str(&value).with_context(|| {
                format!("header `{name}` has a value that is not valid in HTTP")
            })?;
            headers.insert(name, value);
        }
        let secret = match &trigger.webhook.secret_env {
            None => None,
            Some(var) => Some(
                env(var)
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "secret_env names environment variable `{var}`, which is not set or empty"
                        )
                    })?
                    .into_bytes(),
            ),
        };
        let filter = trigger.filter.clone();
        Ok(Webhook {
            name: trigger.name.clone(),
            datastore: trigger.datastore.clone(),
            url: trigger.webhook.url.clone(),
            headers,
            secret,
            timeout: Duration::from_millis(trigger.webhook.timeout_ms),
            filter,
            client,
        })
    }

    /// POSTs the matching cells of `delivery`; `Err` has the store retry.
    async fn deliver(&self, delivery: &Delivery) -> Result<(), String> {
        let cells: Vec<&Cell> = delivery
            .cells
            .iter()
            .map(|c| c.as_ref())
            .filter(|c| self.matches(&c.body))
            .collect();
        if cells.is_empty() {
            return Ok(());
        }
        let body = payload(&self.name, &self.datastore, &cells);
        // The delivery's span: its request carries the `traceparent`, and
        // the cells' locations link it to the writes that stored them.
        let span = tracing::debug_span!(
            "webhook",
            otel.name = "webhook POST",
            otel.kind = "client",
            http.request.method = "POST",
            server.address = reqwest::Url::parse(&self.url)
                .ok()
                .and_then(|u| u.host_str().map(str::to_string)),
            http.response.status_code = tracing::field::Empty,
            cellgate.trigger = self.name.as_str(),
            cellgate.datastore = self.datastore.as_str(),
            cellgate.cells = cells.len(),
            cellgate.cell_locations = locations(&cells),
        );
        let mut headers = self.headers.clone();
        crate::telemetry::inject(&span, &mut headers);
        let mut request = self
            .client
            .post(&self.url)
            .headers(headers)
            .timeout(self.timeout);
        if let Some(secret) = &self.secret {
            request = request.header(SIGNATURE_HEADER, signature(secret, &body));
        }
        let response = tracing::Instrument::instrument(request.body(body).send(), span.clone())
            .await
            .map_err(|e| format!("POST {}: {}", self.url, error_chain(&e)))?;
        let status = response.status();
        span.record("http.response.status_code", status.as_u16());
        if status.is_success() {
            return Ok(());
        }
        if status.is_redirection() {
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("nowhere");
            return Err(format!(
                "POST {} answered {status}, a redirect to {location}: a redirect is not an \
                 acknowledgement (only 307 and 308 to the same origin are followed); point the \
                 trigger at the final URL",
                self.url
            ));
        }
        let text = response.text().await.unwrap_or_default();
        let text: String = text.chars().take(200).collect();
        Err(format!("POST {} answered {status}: {text}", self.url))
    }

    fn matches(&self, body: &Value) -> bool {
        self.filter.as_ref().is_none_or(|f| f.matches_json(body))
    }
}

/// The locations of the first 64 cells (`shard:added_id`, comma
/// separated), which name the writes that stored them.
fn locations(cells: &[&Cell]) -> String {
    let mut text: Vec<String> = cells
        .iter()
        .take(64)
        .map(|c| format!("{}:{}", c.shard, c.added_id))
        .collect();
    if cells.len() > 64 {
        text.push(format!("… {} more", cells.len() - 64));
    }
    text.join(",")
}

/// The client webhooks are posted with: TLS by rustls with the system's
/// certificate authorities (`SSL_CERT_FILE` and `SSL_CERT_DIR` honoured)
/// and those of `ca_file`; a request timeout per trigger; redirects as
/// [`redirects`] says.
fn http_client(ca_file: Option<&std::path::Path>) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .redirect(redirects());
    if let Some(path) = ca_file {
        let pem = std::fs::read(path)
            .with_context(|| format!("cannot read ca_file {}", path.display()))?;
        let authorities = reqwest::Certificate::from_pem_bundle(&pem)
            .ok()
            .filter(|c| !c.is_empty())
            .with_context(|| format!("ca_file {} holds no PEM certificate", path.display()))?;
        for authority in authorities {
            builder = builder.add_root_certificate(authority);
        }
    }
    builder
        .build()
        .context("cannot create the webhook HTTP client")
}

/// Redirects of a webhook POST: a 301, 302 or 303 would turn it into a GET
/// without the cells, whose 2xx would acknowledge cells nobody received,
/// so they are answers (failed attempts); a 307 or 308 keeps the method
/// and body and is followed, with the same headers and signature, when it
/// stays on the origin of the trigger's URL (at most 5 times). Headers
/// and their secrets never go to another host.
fn redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_the_body = matches!(attempt.status().as_u16(), 307 | 308);
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if keeps_the_body && same_origin && attempt.previous().len() <= 5 {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// `err` with its causes, on one line.
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The POST body of `cells`.
fn payload(trigger: &str, datastore: &str, cells: &[&Cell]) -> Vec<u8> {
    let cells: Vec<Value> = cells
        .iter()
        .map(|c| {
            serde_json::json!({
                "rowKey": c.row_key.to_string(),
                "column": c.column,
                "refKey": c.ref_key.to_string(),
                "body": c.body,
                "shard": c.shard,
                "addedId": c.added_id.to_string(),
                "createdAt": c.created_at.to_rfc3339_opts(SecondsFormat::AutoSi, true),
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "trigger": trigger,
        "datastore": datastore,
        "cells": cells,
    }))
    .expect("JSON values serialize")
}

/// `sha256=<hex HMAC-SHA256 of body>`.
pub fn signature(secret: &[u8], body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hook(yaml_filter: Option<&str>) -> Webhook {
        let mut text = String::from(
            "name: t\ndatastore: trips\ncolumns: [BASE]\nwebhook:\n  url: http://127.0.0.1:1/\n  headers: { X-Token: \"Bearer ${TOKEN}\" }\n  secret_env: SECRET\n",
        );
        if let Some(filter) = yaml_filter {
            text.push_str(&format!("filter: '{filter}'\n"));
        }
        let defs = index_dsl::load_files(
            std::path::Path::new("datastores"),
            [
                (
                    "trips/datastore.yaml",
                    "name: trips\ncolumns: [{ name: BASE }]\n".to_owned(),
                ),
                ("trips/triggers/t.yaml", text),
            ],
        )
        .unwrap();
        let env = |name: &str| match name {
            "TOKEN" => Some("abc".to_owned()),
            "SECRET" => Some("s3cret".to_owned()),
            _ => None,
        };
        Webhook::new(
            &defs.datastores[0].triggers[0],
            &reqwest::Client::new(),
            env,
        )
        .unwrap()
    }

    #[test]
    fn filters_read_paths_of_the_body() {
        let hook = hook(Some(r#"status = "completed" and fare.total > 0"#));
        let yes = serde_json::json!({"status": "completed", "fare": {"total": 12.5}});
        let zero = serde_json::json!({"status": "completed", "fare": {"total": 0}});
        let missing = serde_json::json!({"status": "completed"});
        let other = serde_json::json!({"status": "open", "fare": {"total": 3}});
        assert!(hook.matches(&yes));
        assert!(!hook.matches(&zero));
        assert!(!hook.matches(&missing));
        assert!(!hook.matches(&other));

        let hook = self::hook(Some(r#"city in ("a", "b") and note = null and n != 3"#));
        assert!(hook.matches(&serde_json::json!({"city": "b", "n": 4})));
        assert!(!hook.matches(&serde_json::json!({"city": "c"})));
        assert!(!hook.matches(&serde_json::json!({"city": "a", "note": "x"})));
        assert!(!hook.matches(&serde_json::json!({"city": "a", "n": 3})));
    }

    #[test]
    fn headers_and_secret_come_from_the_environment() {
        let hook = hook(None);
        assert_eq!(hook.headers["x-token"], "Bearer abc");
        assert_eq!(hook.secret.as_deref(), Some(&b"s3cret"[..]));
        assert!(hook.matches(&serde_json::json!({})));
    }

    #[test]
    fn a_missing_variable_is_an_error_at_start() {
        let defs = index_dsl::load_files(
            std::path::Path::new("datastores"),
            [
                (
                    "trips/datastore.yaml",
                    "name: trips\ncolumns: [{ name: BASE }]\n",
                ),
                (
                    "trips/triggers/t.yaml",
                    "name: t\ndatastore: trips\ncolumns: [BASE]\nwebhook:\n  url: http://127.0.0.1:1/\n  secret_env: SECRET\n",
                ),
            ],
        )
        .unwrap();
        let error = Webhook::new(
            &defs.datastores[0].triggers[0],
            &reqwest::Client::new(),
            |_| None,
        )
        .err()
        .unwrap();
        assert!(error.to_string().contains("`SECRET`"), "{error}");
    }

    #[test]
    fn the_body_names_cells_as_the_graphql_api_with_64_bit_integers_as_strings() {
        let cell = Cell {
            row_key: uuid::Uuid::nil(),
            column: "BASE".into(),
            ref_key: i64::MAX,
            body: serde_json::json!({ "a": 1 }),
            created_at: chrono::DateTime::from_timestamp(1_700_000_000, 5_000).unwrap(),
            shard: 7,
            added_id: 42,
        };
        let body: Value = serde_json::from_slice(&payload("t", "trips", &[&cell])).unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "trigger": "t",
                "datastore": "trips",
                "cells": [{
                    "rowKey": "00000000-0000-0000-0000-000000000000",
                    "column": "BASE",
                    "refKey": "9223372036854775807",
                    "body": { "a": 1 },
                    "shard": 7,
                    "addedId": "42",
                    "createdAt": "2023-11-14T22:13:20.000005Z",
                }],
            })
        );
    }

    #[test]
    fn the_signature_is_the_hex_hmac_of_the_body() {
        // RFC 4231 test case 2.
        assert_eq!(
            signature(b"Jefe", b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
