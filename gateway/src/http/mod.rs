//! The HTTP gateway: poem routes in front of the GraphQL schema.
//!
//! | route | what |
//! |---|---|
//! | `POST /graphql`, `GET /graphql` | GraphQL over HTTP (`graphql.rs`) |
//! | `GET /`, `GET /playground/*` | the GraphiQL playground (`assets.rs`) |
//! | `GET /ui/` | the web explorer (`assets.rs`) |
//! | `GET /healthz`, `GET /readyz` | liveness and readiness (`health.rs`) |
//! | `GET /metrics` | Prometheus metrics (`metrics.rs`) |
//! | `GET /api/segment/get/{tag}`, `GET /api/snowflake/get/{key}` | Leaf-style plain IDs (`ids.rs`) |
//!
//! Admission control (`admission.rs`) applies to `/graphql` only: health
//! probes and metric scrapes must keep answering while the gateway sheds
//! load. Every request is logged once, with its method, path, status and
//! latency, by [`log_requests`].
//!
//! The GraphQL handler is written here rather than taken from
//! `async-graphql-poem` because the GraphQL-over-HTTP spec ties status codes
//! to the kind of failure (request error, parse or validation failure,
//! execution error) and to the negotiated media type, which that crate does
//! not distinguish.

mod admission;
mod assets;
mod graphql;
mod health;
mod ids;
mod metrics;

use std::sync::Arc;
use std::time::{Duration, Instant};

use poem::listener::TcpAcceptor;
use poem::{get, Endpoint, EndpointExt as _, IntoEndpoint, IntoResponse, Request, Response, Route};

use crate::config::Config;
use crate::Store;

pub use admission::Admission;
pub use metrics::Metrics;

/// Everything a request handler needs; shared by all requests.
pub struct Gateway {
    store: Store,
    schema: async_graphql::dynamic::Schema,
    admission: Admission,
    metrics: Metrics,
    max_body_bytes: usize,
    /// How long `/readyz` waits for the storage masters.
    readiness_timeout: Duration,
}

impl Gateway {
    /// A gateway serving `schema` (built from `store`'s definitions) under
    /// the limits and metrics settings of `config`. Needs a tokio runtime
    /// (it starts the rate limiter's cleanup task).
    pub fn new(store: Store, schema: async_graphql::dynamic::Schema, config: &Config) -> Gateway {
        Gateway {
            metrics: Metrics::new(store.clone(), &config.metrics),
            store,
            schema,
            admission: Admission::new(&config.limits),
            max_body_bytes: config.limits.max_body_bytes,
            readiness_timeout: config.storage.readiness_timeout(),
        }
    }
}

/// The routes of the gateway.
pub fn routes(gateway: Arc<Gateway>) -> impl IntoEndpoint {
    Route::new()
        .at(
            "/graphql",
            get(graphql::graphql_get).post(graphql::graphql_post),
        )
        .at("/", get(assets::playground))
        .at("/playground/*path", get(assets::playground_file))
        .at("/ui", get(assets::explorer_redirect))
        .at("/ui/", get(assets::explorer_file))
        .at("/ui/*path", get(assets::explorer_file))
        .at("/healthz", get(health::healthz))
        .at("/readyz", get(health::readyz))
        .at("/metrics", get(metrics::metrics))
        .at("/api/segment/get/:tag", get(ids::segment))
        .at("/api/snowflake/get/:key", get(ids::snowflake))
        .data(gateway)
        .around(|endpoint, request| async move { log_requests(endpoint, request).await })
}

/// Serves the gateway on an already bound listener until `shutdown`
/// resolves, then lets requests in flight finish (for at most 10 seconds).
pub async fn serve(
    listener: tokio::net::TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let acceptor = TcpAcceptor::from_tokio(listener)?;
    poem::Server::new_with_acceptor(acceptor)
        .run_with_graceful_shutdown(routes(gateway), shutdown, Some(Duration::from_secs(10)))
        .await
}

/// Logs one line per request. Errors that poem turns into responses (404,
/// 405 for an unrouted method) are logged with their status too.
async fn log_requests<E: Endpoint>(endpoint: Arc<E>, request: Request) -> poem::Result<Response> {
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let start = Instant::now();
    let response = match endpoint.call(request).await {
        Ok(response) => response.into_response(),
        Err(error) => error.into_response(),
    };
    tracing::info!(
        method = %method,
        path = %path,
        status = response.status().as_u16(),
        latency_ms = start.elapsed().as_secs_f64() * 1000.0,
        "request"
    );
    Ok(response)
}
