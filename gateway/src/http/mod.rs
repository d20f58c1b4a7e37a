//! The HTTP gateway: poem routes in front of the GraphQL schema.
//!
//! | route | what |
//! |---|---|
//! | `POST /graphql`, `GET /graphql` | GraphQL over HTTP (`graphql.rs`) |
//! | `OPTIONS /graphql` | CORS preflight (`cors.rs`, which wraps the route) |
//! | `GET /graphql/ws` | GraphQL over WebSocket, `graphql-transport-ws`, for subscriptions (`ws.rs`) |
//! | `GET /`, `GET /playground/*` | the GraphiQL playground (`assets.rs`; `auth.playground`) |
//! | `GET /ui/` | the web explorer (`assets.rs`; `auth.playground`) |
//! | `GET /healthz`, `GET /readyz` | liveness and readiness (`health.rs`) |
//! | `GET /metrics` | Prometheus metrics (`metrics.rs`; a `*` token with auth on) |
//! | `POST /admin/reload` | reload the definitions (`reload.rs`; a `*:admin` token with auth on) |
//! | `GET /api/segment/get/{tag}`, `GET /api/snowflake/get/{key}` | Leaf-style plain IDs (`ids.rs`) |
//!
//! Connections are accepted by `server.rs` (header timeout, connections
//! per address, shutdown grace). Authentication and admission control
//! (`admission.rs`) apply to `/graphql` (and authentication to
//! `/metrics`): health probes and metric scrapes must keep answering while
//! the gateway sheds load. Every request is logged once, with its method, path, status and
//! latency, by [`log_requests`].
//!
//! The GraphQL handler is written here rather than taken from
//! `async-graphql-poem` because the GraphQL-over-HTTP spec ties status codes
//! to the kind of failure (request error, parse or validation failure,
//! execution error) and to the negotiated media type, which that crate does
//! not distinguish.

mod admission;
mod assets;
mod caching;
mod cors;
mod graphql;
mod health;
mod hosts;
mod ids;
mod metrics;
mod reload;
mod server;
mod ws;

use std::sync::Arc;
use std::time::{Duration, Instant};

use poem::{get, Endpoint, EndpointExt as _, IntoEndpoint, IntoResponse, Request, Response, Route};

use crate::config::{Config, CorsConfig};
use cellgate_graphql::auth::Authenticator;
use cellgate_store::Store;

pub use admission::{client_key, Admission};
pub use hosts::AllowedHosts;
pub use metrics::Metrics;
pub use server::ServerOptions;

/// Everything a request handler needs; shared by all requests.
pub struct Gateway {
    store: Store,
    /// Authentication, parsing, authorization, limits and execution of
    /// GraphQL requests, for every transport; it holds the schema served.
    pipeline: cellgate_graphql::Pipeline,
    /// Where the definitions are read from on a reload, and one reload at
    /// a time.
    reloads: reload::Reloads,
    /// Depth, cost and alias limits, for the schemas a reload builds.
    graphql_limits: cellgate_graphql::GraphqlLimits,
    /// Whether the schemas are Federation 2 subgraphs.
    federation: bool,
    admission: Admission,
    metrics: Metrics,
    /// The `Host` names requests may carry (`hosts.rs`).
    hosts: AllowedHosts,
    playground: bool,
    /// Whether `/metrics` needs a token with a `*` scope.
    protect_metrics: bool,
    cors: CorsConfig,
    max_body_bytes: usize,
    body_timeout: Duration,
    /// How long `/readyz` waits for the storage masters.
    readiness_timeout: Duration,
    /// Subscription limits of `/graphql/ws`, and the running counts.
    max_subscriptions_per_connection: usize,
    max_subscriptions_per_client: usize,
    subscriptions: ws::SubscriptionCounts,
    client_ipv6_prefix: u8,
}

impl Gateway {
    /// With auth on, the answer to a plain route (`what`, e.g. "/metrics")
    /// requested without a token whose `*` scope allows `access`: 429 past
    /// the client's per-address rate (counted before the token is looked
    /// up, so random tokens cannot make a database lookup each), 401
    /// without a valid token, 403 with one that lacks the scope, 503 when
    /// the token store cannot be read. `None` when the request may go on.
    pub(super) async fn refuse_plain(
        &self,
        request: &Request,
        what: &str,
        access: cellgate_graphql::auth::Access,
    ) -> Option<Response> {
        if !self.pipeline.auth_enabled() {
            return None;
        }
        let plain = |status: poem::http::StatusCode, text: String| {
            Response::builder()
                .status(status)
                .content_type("text/plain; charset=utf-8")
                .body(text)
        };
        let address = request.remote_addr().as_socket_addr().map(|a| a.ip());
        if let Err(admission::Rejection::RateLimited { retry_after }) =
            self.admission.limit_address(address)
        {
            let mut response = plain(
                poem::http::StatusCode::TOO_MANY_REQUESTS,
                "RATE_LIMITED: too many requests from this address".to_string(),
            );
            response.headers_mut().insert(
                poem::http::header::RETRY_AFTER,
                poem::http::HeaderValue::from(retry_after.as_secs_f64().ceil().max(1.0) as u64),
            );
            return Some(response);
        }
        let header = request.header(poem::http::header::AUTHORIZATION);
        match self.pipeline.authenticate(header).await {
            Ok(caller)
                if caller
                    .principal
                    .allows(cellgate_graphql::ANY_DATASTORE, access) =>
            {
                None
            }
            Ok(_) => Some(plain(
                poem::http::StatusCode::FORBIDDEN,
                format!(
                    "FORBIDDEN: {what} needs a token with a `*:{}` scope",
                    access.as_str()
                ),
            )),
            Err(refusal) if refusal.kind == cellgate_graphql::RefusalKind::AuthUnavailable => {
                Some(plain(
                    poem::http::StatusCode::SERVICE_UNAVAILABLE,
                    "STORAGE_UNAVAILABLE: the API tokens cannot be read now; retry later"
                        .to_string(),
                ))
            }
            Err(_) => {
                let mut response = plain(
                    poem::http::StatusCode::UNAUTHORIZED,
                    format!("UNAUTHENTICATED: {what} needs `Authorization: Bearer <token>`"),
                );
                response.headers_mut().insert(
                    poem::http::header::WWW_AUTHENTICATE,
                    poem::http::HeaderValue::from_static("Bearer"),
                );
                Some(response)
            }
        }
    }
    /// A gateway serving the schema of `store`'s definitions under
    /// the limits, auth and metrics settings of `config`. Needs a tokio
    /// runtime (it starts the rate limiter's cleanup task). Fails on an
    /// invalid `auth` or `cors` section.
    pub fn new(store: Store, config: &Config) -> cellgate_store::Result<Gateway> {
        let auth_on = config.auth.enabled_for(config.listen);
        cors::validate(&config.cors)?;
        if !(1..=128).contains(&config.limits.client_ipv6_prefix) {
            return Err(cellgate_store::Error::Config(format!(
                "limits.client_ipv6_prefix is {}: it must be 1 to 128",
                config.limits.client_ipv6_prefix
            )));
        }
        let documents = Arc::new(cellgate_graphql::Documents::new(
            config.limits.document_cache_bytes,
        ));
        let reloads = reload::Reloads::new(config.datastores.clone(), &store);
        let persisted = Arc::new(
            cellgate_graphql::Persisted::new(config.graphql.persisted())
                .map_err(cellgate_store::Error::Config)?,
        );
        let auth = Authenticator::new(&config.auth.tokens, auth_on, Some(store.clone()))?;
        let pipeline = cellgate_graphql::Pipeline::new(
            store.clone(),
            auth,
            cellgate_graphql::Served::build(
                &store,
                config.limits.graphql(),
                documents.clone(),
                config.graphql.federation,
            )?,
            reloads.status().clone(),
            cellgate_graphql::PipelineOptions {
                limits: config.limits.graphql(),
                introspection: config.auth.introspection,
                request_timeout: Duration::from_millis(config.limits.request_timeout_ms.max(1)),
            },
            persisted.clone(),
        );
        Ok(Gateway {
            metrics: Metrics::new(
                store.clone(),
                documents,
                persisted,
                reloads.status().clone(),
                &config.metrics,
            ),
            pipeline,
            hosts: AllowedHosts::new(&config.http, auth_on),
            reloads,
            playground: config.auth.playground,
            protect_metrics: config.auth.protect_metrics,
            cors: config.cors.clone(),
            store,
            graphql_limits: config.limits.graphql(),
            federation: config.graphql.federation,
            admission: Admission::new(&config.limits),
            max_body_bytes: config.limits.max_body_bytes,
            body_timeout: Duration::from_millis(config.limits.body_timeout_ms.max(1)),
            readiness_timeout: config.storage.readiness_timeout(),
            max_subscriptions_per_connection: config.limits.max_subscriptions_per_connection,
            max_subscriptions_per_client: config.limits.max_subscriptions_per_client,
            subscriptions: ws::SubscriptionCounts::default(),
            client_ipv6_prefix: config.limits.client_ipv6_prefix,
        })
    }

    /// Whether requests need an API token.
    pub fn auth_enabled(&self) -> bool {
        self.pipeline.auth_enabled()
    }
}

/// The routes of the gateway. The pages are left out when
/// `auth.playground` is off.
pub fn routes(gateway: Arc<Gateway>) -> impl IntoEndpoint {
    let mut route = Route::new()
        .at(
            "/graphql",
            get(graphql::graphql_get)
                .post(graphql::graphql_post)
                .options(graphql::graphql_options)
                .around(|endpoint, request| async move { cors::cors(endpoint, request).await }),
        )
        .at("/graphql/ws", get(ws::graphql_ws));
    if gateway.playground {
        route = route
            .at("/", get(assets::playground))
            .at("/playground/*path", get(assets::playground_file))
            .at("/ui", get(assets::explorer_redirect))
            .at("/ui/", get(assets::explorer_file))
            .at("/ui/*path", get(assets::explorer_file));
    }
    route
        .at("/healthz", get(health::healthz))
        .at("/readyz", get(health::readyz))
        .at("/metrics", get(metrics::metrics))
        .at("/admin/reload", poem::post(reload::reload_route))
        .at("/api/segment/get/:tag", get(ids::segment))
        .at("/api/snowflake/get/:key", get(ids::snowflake))
        .data(gateway.clone())
        .around(move |endpoint, request| {
            let gateway = gateway.clone();
            async move { check_host(&gateway.hosts, endpoint, request).await }
        })
        .around(|endpoint, request| async move { log_requests(endpoint, request).await })
}

/// Refuses a request whose `Host` the gateway does not answer to
/// (`hosts.rs`), before any route runs.
async fn check_host<E: Endpoint>(
    hosts: &AllowedHosts,
    endpoint: Arc<E>,
    request: Request,
) -> poem::Result<Response> {
    let host = request
        .header(poem::http::header::HOST)
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    if !hosts.allows(host) {
        return Ok(Response::builder()
            .status(poem::http::StatusCode::FORBIDDEN)
            .content_type("text/plain; charset=utf-8")
            .body(
                "HOST_NOT_ALLOWED: this gateway does not answer to the host of this request; \
                 add the name to http.allowed_hosts in cellgate.yaml",
            ));
    }
    Ok(endpoint.call(request).await?.into_response())
}

/// Serves the gateway on an already bound listener until `shutdown`
/// resolves, then lets requests in flight finish for at most
/// `limits.shutdown_grace_ms` (see `server.rs`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    gateway: Arc<Gateway>,
    shutdown: impl std::future::Future<Output = ()>,
    options: ServerOptions,
) -> std::io::Result<()> {
    server::run(listener, routes(gateway), shutdown, options).await
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
