//! OpenTelemetry traces of `cellgate serve`: the `tracing` spans of the
//! gateway, the pipeline and the store, exported over OTLP/HTTP (protobuf)
//! by `tracing-opentelemetry` and the OpenTelemetry SDK. Off unless an
//! endpoint is configured (`telemetry.otlp_endpoint`, or the standard
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` / `OTEL_EXPORTER_OTLP_ENDPOINT`).
//!
//! The spans, with the semantic conventions' attributes (never a cell
//! body, a variable's value, a token or a statement's text):
//! - `POST /graphql` / `GET /graphql` (`http/graphql.rs`): the HTTP
//!   request, continuing an incoming `traceparent`/`tracestate`;
//! - `query <name>` (`cellgate-graphql`'s `Prepared::execute`): the
//!   operation's name, type and document hash;
//! - `<VERB>` per storage statement (`cellgate-store`'s backends): the
//!   database system, the cluster, the statement's verb;
//! - `webhook POST` (`triggers.rs`): each delivery, whose request carries
//!   its `traceparent`, with the cells' locations (datastore, shard, added
//!   ids) as the link to the writes that made them.
//!
//! Spans are handed to a batch processor on a thread of its own: a request
//! never waits for the collector; when the queue is full or an export
//! fails the spans are dropped, and those of failed exports are counted
//! (`cellgate_telemetry_spans_dropped_total`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider, SpanData, SpanExporter, Tracer};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::config::TelemetryConfig;

/// Spans lost because their export failed.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Spans lost because their export failed, for `/metrics`.
pub fn dropped_spans() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// A running exporter; [`Telemetry::shutdown`] sends what is queued.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Starts exporting if an endpoint is configured; the tracer to give
    /// the `tracing` layer. Needs a tokio runtime (the exports run on it).
    pub fn start(config: &TelemetryConfig) -> anyhow::Result<Option<(Telemetry, Tracer)>> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let from_env = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .is_some();
        if config.otlp_endpoint.is_none() && !from_env {
            return Ok(None);
        }
        let client = Exporting {
            client: reqwest::Client::builder()
                .use_rustls_tls()
                .timeout(Duration::from_secs(10))
                .build()
                .context("cannot create the OTLP HTTP client")?,
            runtime: tokio::runtime::Handle::current(),
        };
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_http_client(client);
        if let Some(endpoint) = config.otlp_endpoint.as_ref().filter(|_| !from_env) {
            // As the standard variable: the base URL, the signal's path
            // appended. The variables, when set, take precedence.
            exporter =
                exporter.with_endpoint(format!("{}/v1/traces", endpoint.trim_end_matches('/')));
        }
        let exporter = exporter
            .build()
            .context("cannot configure the OTLP exporter")?;
        let ratio = env("OTEL_TRACES_SAMPLER_ARG")
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(config.sampling_ratio)
            .clamp(0.0, 1.0);
        let service = env("OTEL_SERVICE_NAME").unwrap_or_else(|| config.service_name.clone());
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(Counted(exporter))
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                ratio,
            ))))
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name(service)
                    .build(),
            )
            .build();
        let tracer = provider.tracer("cellgate");
        Ok(Some((Telemetry { provider }, tracer)))
    }

    /// Exports what is queued, waiting at most a few seconds.
    pub fn shutdown(self) {
        if let Err(error) = self.provider.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!(%error, "the last spans were not exported");
        }
    }
}

/// Continues the trace of an incoming request's `traceparent` and
/// `tracestate` headers in `span`.
pub fn continue_trace(span: &tracing::Span, headers: &poem::http::HeaderMap) {
    if span.is_disabled() || !headers.contains_key("traceparent") {
        return;
    }
    let parent =
        TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers));
    let _ = span.set_parent(parent);
}

/// Adds `span`'s `traceparent` (and `tracestate`) to an outgoing request.
pub fn inject(span: &tracing::Span, headers: &mut reqwest::header::HeaderMap) {
    if span.is_disabled() {
        return;
    }
    TraceContextPropagator::new().inject_context(
        &span.context(),
        &mut opentelemetry_http::HeaderInjector(headers),
    );
}

/// The OTLP exporter, counting the spans of failed exports.
#[derive(Debug)]
struct Counted(opentelemetry_otlp::SpanExporter);

impl SpanExporter for Counted {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let spans = batch.len() as u64;
        let result = self.0.export(batch).await;
        if result.is_err() {
            DROPPED.fetch_add(spans, Ordering::Relaxed);
        }
        result
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.0.set_resource(resource);
    }
}

/// The exporter's HTTP client: reqwest (rustls, so `https://` collectors
/// work), run on the gateway's tokio runtime, since the batch processor
/// exports from a thread of its own.
#[derive(Debug)]
struct Exporting {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for Exporting {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let client = self.client.clone();
        let (status, headers, body) = self
            .runtime
            .spawn(async move {
                let response = client.execute(request).await?;
                let status = response.status();
                let headers = response.headers().clone();
                let body = response.bytes().await?;
                Ok::<_, reqwest::Error>((status, headers, body))
            })
            .await??;
        let mut response = Response::builder().status(status).body(body)?;
        *response.headers_mut() = headers;
        Ok(response)
    }
}
