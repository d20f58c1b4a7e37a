//! `GET /graphql` and `POST /graphql` per the GraphQL-over-HTTP spec.
//!
//! A request goes through these steps, each of which can end it:
//! 1. **negotiation** of the response media type from `Accept`:
//!    `application/graphql-response+json` when the client accepts it at
//!    least as much as `application/json`, `application/json` for `*/*`, a
//!    missing header or `application/json`; anything else is 406;
//! 2. **request parsing**: a POST needs `Content-Type: application/json`
//!    (415), a body within the size limit (413; a chunked body is counted as
//!    it arrives, and the rest of a refused body is read and dropped, within
//!    bounds, so that the client can read the answer) holding a JSON object (400)
//!    whose `query` is a string and whose `operationName`, `variables` and
//!    `extensions` are absent, null or of the right type (400); a GET takes
//!    the same from its URL, `variables` and `extensions` as JSON text; the
//!    whole body must arrive within `limits.body_timeout_ms` (408), unless
//!    it is already known to be too large (413 whenever the rest arrives);
//! 3. the **rate per client address** (429), **authentication**
//!    (`Authorization: Bearer`, `auth/`: 401 `UNAUTHENTICATED`), then
//!    **admission** (rate per token, concurrency: `admission.rs`, 429,
//!    503). All come after the body, so a client stalling mid-body holds
//!    no permit;
//! 4. the **request pipeline** (`cellgate_graphql::Pipeline`), which every
//!    transport shares: parsing, authorization, operation selection (over
//!    GET, only queries run: 405 with `Allow: POST` otherwise), limits, the
//!    compiled direct form, and execution under `limits.request_timeout_ms`
//!    (504 `TIMEOUT`). Its refusals carry their codes; this module only
//!    picks their status codes.
//!
//! Request errors have no `data` entry. With `application/graphql-response+json`
//! they are answered 400; with `application/json`, 200 (the legacy media
//! type is read by clients that ignore the status), except for the HTTP-level
//! failures of step 3, which are 4xx in both. Execution errors are 200 with
//! `data`. Every error carries `extensions.code`: this module sets the codes
//! of the failures it detects and leaves the schema's own codes alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use poem::http::{header, HeaderValue, StatusCode};
use poem::web::Data;
use poem::{handler, Body, Request, Response};
use serde_json::{json, Map, Value};
use tracing::Instrument as _;

use super::admission::Rejection;
use super::caching::Caching;
use super::metrics::Outcome;
use super::Gateway;
use cellgate_graphql::{Cacheability, GraphqlRequest, Refusal, RefusalKind, Transport};

const GRAPHQL_RESPONSE_JSON: &str = "application/graphql-response+json";
const JSON: &str = "application/json";

/// The media type of the response body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MediaType {
    GraphqlResponseJson,
    Json,
}

impl MediaType {
    fn content_type(self) -> &'static str {
        match self {
            MediaType::GraphqlResponseJson => "application/graphql-response+json; charset=utf-8",
            MediaType::Json => "application/json; charset=utf-8",
        }
    }
}

/// A request that ends before execution, with its HTTP status.
struct Failure {
    status: StatusCode,
    code: &'static str,
    message: String,
    outcome: Outcome,
    /// Whether the same request may succeed later (`extensions.retryable`).
    retryable: bool,
    /// Extra response headers (`Allow`, `Retry-After`).
    headers: Vec<(header::HeaderName, String)>,
}

impl Failure {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            status,
            code,
            message: message.into(),
            outcome: Outcome::Invalid,
            retryable: false,
            headers: Vec::new(),
        }
    }

    fn bad_request(message: impl Into<String>) -> Failure {
        Failure::new(StatusCode::BAD_REQUEST, "BAD_REQUEST", message)
    }
}

#[handler]
pub(super) async fn graphql_get(request: &Request, Data(gateway): Data<&Arc<Gateway>>) -> Response {
    handle(gateway, request, None).await
}

/// `OPTIONS /graphql`; answered by the CORS layer (`cors.rs`) before it
/// gets here.
#[handler]
pub(super) fn graphql_options() -> StatusCode {
    StatusCode::NO_CONTENT
}

#[handler]
pub(super) async fn graphql_post(
    request: &Request,
    body: Body,
    Data(gateway): Data<&Arc<Gateway>>,
) -> Response {
    handle(gateway, request, Some(body)).await
}

/// Answers one request and records it in the metrics. `body` is `None`
/// for a GET.
async fn handle(gateway: &Gateway, request: &Request, body: Option<Body>) -> Response {
    let method = if body.is_some() { "POST" } else { "GET" };
    // The request's span (`telemetry.rs`), continuing the caller's trace.
    let span = tracing::debug_span!(
        "http",
        otel.name = format!("{method} /graphql"),
        otel.kind = "server",
        http.request.method = method,
        http.route = "/graphql",
        url.path = "/graphql",
        http.response.status_code = tracing::field::Empty,
        graphql.operation.name = tracing::field::Empty,
    );
    crate::telemetry::continue_trace(&span, request.headers());
    let start = Instant::now();
    let mut operation = None;
    let (response, outcome) = answer(gateway, request, body, &mut operation)
        .instrument(span.clone())
        .await;
    let mut response = response;
    if !response.headers().contains_key(header::CACHE_CONTROL) {
        // Refusals, failures and everything but a GET query's answer.
        Caching::no_store().apply(&mut response);
    }
    span.record("http.response.status_code", response.status().as_u16());
    if let Some(name) = &operation {
        span.record("graphql.operation.name", name.as_str());
    }
    gateway
        .metrics
        .record(operation.as_deref(), outcome, start.elapsed());
    response
}

/// The answer to a request, and how it ended.
async fn answer(
    gateway: &Gateway,
    request: &Request,
    body: Option<Body>,
    operation: &mut Option<String>,
) -> (Response, Outcome) {
    let media = negotiate(request.header(header::ACCEPT));
    match media {
        None => {
            let failure = Failure::new(
                StatusCode::NOT_ACCEPTABLE,
                "NOT_ACCEPTABLE",
                format!("responses are {GRAPHQL_RESPONSE_JSON} or {JSON}; the Accept header allows neither"),
            );
            failure_response(MediaType::Json, failure)
        }
        Some(media) => match respond(gateway, request, body, media, operation).await {
            Ok(answer) => answer,
            Err(Answered::Failure(failure)) => failure_response(media, failure),
            Err(Answered::Refusal(refusal)) => refusal_response(media, refusal),
        },
    }
}

/// How a request ended before an answer with data: a failure of HTTP
/// itself, or a refusal of the pipeline.
enum Answered {
    Failure(Failure),
    Refusal(Refusal),
}

impl From<Failure> for Answered {
    fn from(failure: Failure) -> Answered {
        Answered::Failure(failure)
    }
}

impl From<Refusal> for Answered {
    fn from(refusal: Refusal) -> Answered {
        Answered::Refusal(refusal)
    }
}

/// Steps 2 to 4 of the module doc. `operation` receives the operation name
/// as soon as it is known, for the metrics.
async fn respond(
    gateway: &Gateway,
    request: &Request,
    body: Option<Body>,
    media: MediaType,
    operation: &mut Option<String>,
) -> Result<(Response, Outcome), Answered> {
    // The body is read before a permit is taken, within its own deadline,
    // so clients that stall while sending hold no permit.
    let (params, transport) = match body {
        None => (get_params(request)?, Transport::Get),
        Some(body) => (
            post_params(request, body, gateway.max_body_bytes, gateway.body_timeout).await?,
            Transport::Post,
        ),
    };
    let address = request.remote_addr().as_socket_addr().map(|a| a.ip());
    gateway.admission.limit_address(address).map_err(rejected)?;
    let caller = gateway
        .pipeline
        .authenticate(request.header(header::AUTHORIZATION))
        .await?;
    let _permit = gateway
        .admission
        .admit(caller.principal.token.as_ref())
        .map_err(rejected)?;
    *operation = params.operation_name.clone();
    let prepared = gateway.pipeline.prepare(params, &caller, transport)?;
    *operation = prepared.operation_name().map(str::to_string);
    let cacheability = match transport {
        Transport::Get => prepared.cacheability(),
        _ => Cacheability::NoStore,
    };
    // A full-key read's tag is the request's: its 304 needs no execution.
    let immutable = (cacheability == Cacheability::Immutable).then(|| {
        Caching::immutable(
            request,
            media.content_type(),
            prepared.request_tag().as_bytes(),
        )
    });
    if let Some(caching) = immutable.as_ref().filter(|c| c.not_modified(request)) {
        return Ok((caching.not_modified_response(), Outcome::NotModified));
    }
    let executed = prepared.execute().await?;
    let caching = match (immutable, cacheability) {
        _ if executed.has_errors => Caching::no_store(),
        (Some(caching), _) if cellgate_graphql::complete_answer(&executed.body) => caching,
        (_, Cacheability::Immutable | Cacheability::Revalidate) => {
            Caching::revalidate(request, media.content_type(), &executed.body)
        }
        _ => Caching::no_store(),
    };
    if caching.not_modified(request) {
        return Ok((caching.not_modified_response(), Outcome::NotModified));
    }
    let outcome = if executed.has_errors {
        Outcome::Error
    } else {
        Outcome::Ok
    };
    let mut response = json_bytes(StatusCode::OK, media, executed.body);
    caching.apply(&mut response);
    Ok((response, outcome))
}

/// The answer to a refused request: request errors (parse, validation,
/// limits) as the GraphQL-over-HTTP spec asks for the media type, the
/// others with their HTTP status.
fn refusal_response(media: MediaType, refusal: Refusal) -> (Response, Outcome) {
    let outcome = Outcome::refused(refusal.kind);
    let (status, header) = match refusal.kind {
        RefusalKind::Invalid => return (request_error(media, refusal.errors), outcome),
        RefusalKind::BadRequest => (StatusCode::BAD_REQUEST, None),
        RefusalKind::Unauthenticated => (
            StatusCode::UNAUTHORIZED,
            Some((header::WWW_AUTHENTICATE, "Bearer")),
        ),
        RefusalKind::Forbidden => (StatusCode::FORBIDDEN, None),
        RefusalKind::AuthUnavailable => (StatusCode::SERVICE_UNAVAILABLE, None),
        RefusalKind::NotAllowedHere => (
            StatusCode::METHOD_NOT_ALLOWED,
            Some((header::ALLOW, "POST")),
        ),
        RefusalKind::TimedOut => (StatusCode::GATEWAY_TIMEOUT, None),
        _ => (StatusCode::INTERNAL_SERVER_ERROR, None),
    };
    let mut response = json_response(status, media, &json!({ "errors": refusal.errors }));
    if let Some((name, value)) = header {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    (response, outcome)
}

/// The response media type for an `Accept` header, `None` for 406.
fn negotiate(accept: Option<&str>) -> Option<MediaType> {
    let Some(accept) = accept.filter(|a| !a.trim().is_empty()) else {
        return Some(MediaType::Json);
    };
    // The best quality the header gives each of our two types.
    let (mut graphql, mut json) = (0.0f32, 0.0f32);
    for range in accept.split(',') {
        let mut parts = range.split(';');
        let essence = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        let mut quality = 1.0f32;
        for param in parts {
            if let Some((name, value)) = param.split_once('=') {
                if name.trim().eq_ignore_ascii_case("q") {
                    quality = value.trim().parse().unwrap_or(0.0);
                }
            }
        }
        match essence.as_str() {
            GRAPHQL_RESPONSE_JSON => graphql = graphql.max(quality),
            JSON => json = json.max(quality),
            // Wildcards mean the client does not care: the widely
            // understood legacy type is the safe answer.
            "*/*" | "application/*" => json = json.max(quality),
            _ => {}
        }
    }
    if graphql > 0.0 && graphql >= json {
        Some(MediaType::GraphqlResponseJson)
    } else if json > 0.0 {
        Some(MediaType::Json)
    } else {
        None
    }
}

fn rejected(rejection: Rejection) -> Failure {
    match rejection {
        Rejection::RateLimited { retry_after } => {
            let mut failure = Failure::new(
                StatusCode::TOO_MANY_REQUESTS,
                "RATE_LIMITED",
                "too many requests from this client; retry later",
            );
            failure.outcome = Outcome::RateLimited;
            failure.retryable = true;
            failure
                .headers
                .push((header::RETRY_AFTER, retry_seconds(retry_after).to_string()));
            failure
        }
        Rejection::Overloaded => {
            let mut failure = Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "OVERLOADED",
                "the server is at its request limit; retry later",
            );
            failure.outcome = Outcome::Overloaded;
            failure.retryable = true;
            failure.headers.push((header::RETRY_AFTER, "1".to_string()));
            failure
        }
    }
}

/// Whole seconds to wait, at least 1 (`Retry-After` has no fractions).
fn retry_seconds(wait: Duration) -> u64 {
    (wait.as_millis() as u64).div_ceil(1000).max(1)
}

/// The parameters of a GET from its query string: `variables` and
/// `extensions` are JSON text, the others plain strings.
fn get_params(request: &Request) -> Result<GraphqlRequest, Answered> {
    let pairs: Vec<(String, String)> =
        serde_urlencoded::from_str(request.uri().query().unwrap_or(""))
            .map_err(|_| Failure::bad_request("malformed query string"))?;
    let mut params = Map::new();
    for (name, value) in pairs {
        let value = match name.as_str() {
            "variables" | "extensions" if !value.is_empty() => serde_json::from_str(&value)
                .map_err(|_| Failure::bad_request(format!("`{name}` is not valid JSON")))?,
            "variables" | "extensions" => Value::Null,
            _ => Value::String(value),
        };
        params.insert(name, value);
    }
    // GETs are small: they go through the same checks as a POST body.
    let text = serde_json::to_vec(&Value::Object(params))
        .map_err(|_| Failure::bad_request("malformed query string"))?;
    Ok(GraphqlRequest::from_json(&text)?)
}

/// The parameters of a POST from its JSON body, which must arrive within
/// `timeout` and hold at most `limit` bytes.
///
/// A body known to be over the limit is answered 413 however the rest of
/// it arrives: declared too long, counted past the limit as it arrives
/// (chunked), then too slow or cut off. Only a body that fails before it
/// is known to be too large is answered 408 (too slow) or 400 (broken).
async fn post_params(
    request: &Request,
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<GraphqlRequest, Answered> {
    let deadline = tokio::time::Instant::now() + timeout;
    let content_type = request.header(header::CONTENT_TYPE).unwrap_or("");
    if !is_json_utf8(content_type) {
        return Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            "the request body must be application/json (UTF-8)",
        )
        .into());
    }
    let too_large = || {
        Failure::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "PAYLOAD_TOO_LARGE",
            format!("request body exceeds {limit} bytes"),
        )
    };
    let declared = request
        .header(header::CONTENT_LENGTH)
        .and_then(|n| n.parse::<u64>().ok());
    let mut frames = body.into_bytes_stream();
    if declared.is_some_and(|n| n > limit as u64) {
        if declared.is_some_and(|n| n <= DISCARD_BYTES) {
            discard(frames, deadline).await;
        }
        return Err(too_large().into());
    }
    // Chunked bodies have no declared length: the limit is checked as the
    // frames arrive.
    let mut bytes = Vec::new();
    loop {
        let frame = match tokio::time::timeout_at(deadline, frames.next()).await {
            Err(_) => {
                return Err(Failure::new(
                    StatusCode::REQUEST_TIMEOUT,
                    "BODY_TIMEOUT",
                    format!(
                        "the request body did not arrive within {} ms",
                        timeout.as_millis()
                    ),
                )
                .into())
            }
            Ok(None) => break,
            Ok(Some(Err(_))) => {
                return Err(Failure::bad_request("cannot read the request body").into())
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if bytes.len() + frame.len() > limit {
            discard(frames, deadline).await;
            return Err(too_large().into());
        }
        bytes.extend_from_slice(&frame);
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Failure::bad_request("the request body is empty").into());
    }
    Ok(GraphqlRequest::from_json(&bytes)?)
}

/// Most of an oversized body that is read and dropped before the 413 is
/// sent (see [`discard`]).
const DISCARD_BYTES: u64 = 64 * 1024 * 1024;

/// Longest time spent dropping the rest of an oversized body.
const DISCARD_TIME: Duration = Duration::from_secs(10);

/// Reads and drops what is left of a refused body before its answer is
/// sent. Most clients send the whole body before they read the answer;
/// closing a connection with unread data in it makes the kernel reset it,
/// and the reset destroys the 413 on its way, so such a client saw a broken
/// connection (or a proxy's 400) instead. Bounded by [`DISCARD_BYTES`],
/// [`DISCARD_TIME`] and the body's `deadline`: past any, the connection is
/// closed after all. How the rest ends (in time or not, whole or broken)
/// does not change the answer, which is 413.
async fn discard<F: AsRef<[u8]>>(
    mut frames: impl futures::Stream<Item = std::io::Result<F>> + Unpin,
    deadline: tokio::time::Instant,
) {
    let drain = async {
        let mut left = DISCARD_BYTES;
        while let Some(Ok(frame)) = frames.next().await {
            left = left.saturating_sub(frame.as_ref().len() as u64);
            if left == 0 {
                break;
            }
        }
    };
    let until = deadline.min(tokio::time::Instant::now() + DISCARD_TIME);
    let _ = tokio::time::timeout_at(until, drain).await;
}

/// `application/json`, with no charset or UTF-8.
fn is_json_utf8(content_type: &str) -> bool {
    let mut parts = content_type.split(';');
    if !parts
        .next()
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case(JSON))
    {
        return false;
    }
    parts.all(|param| match param.split_once('=') {
        Some((name, value)) if name.trim().eq_ignore_ascii_case("charset") => {
            value.trim().trim_matches('"').eq_ignore_ascii_case("utf-8")
        }
        _ => true,
    })
}

/// A response for a request error: no `data` entry.
fn request_error(media: MediaType, errors: Vec<Value>) -> Response {
    let status = match media {
        MediaType::GraphqlResponseJson => StatusCode::BAD_REQUEST,
        MediaType::Json => StatusCode::OK,
    };
    json_response(status, media, &json!({ "errors": errors }))
}

fn failure_response(media: MediaType, failure: Failure) -> (Response, Outcome) {
    let mut extensions = json!({ "code": failure.code });
    if failure.retryable {
        extensions["retryable"] = Value::Bool(true);
    }
    let body = json!({
        "errors": [{
            "message": failure.message,
            "extensions": extensions,
        }]
    });
    let mut response = json_response(failure.status, media, &body);
    for (name, value) in failure.headers {
        if let Ok(value) = HeaderValue::from_str(&value) {
            response.headers_mut().insert(name, value);
        }
    }
    (response, failure.outcome)
}

fn json_response(status: StatusCode, media: MediaType, body: &Value) -> Response {
    json_bytes(status, media, serde_json::to_vec(body).unwrap_or_default())
}

fn json_bytes(status: StatusCode, media: MediaType, body: Vec<u8>) -> Response {
    Response::builder()
        .status(status)
        .content_type(media.content_type())
        .body(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_prefers_the_graphql_type_and_defaults_to_json() {
        use MediaType::*;
        assert_eq!(negotiate(None), Some(Json));
        assert_eq!(negotiate(Some("*/*")), Some(Json));
        assert_eq!(negotiate(Some("application/json")), Some(Json));
        assert_eq!(
            negotiate(Some("application/graphql-response+json")),
            Some(GraphqlResponseJson)
        );
        assert_eq!(
            negotiate(Some(
                "application/graphql-response+json, application/json;q=0.9"
            )),
            Some(GraphqlResponseJson)
        );
        assert_eq!(
            negotiate(Some(
                "application/json, application/graphql-response+json;q=0.5"
            )),
            Some(Json)
        );
        assert_eq!(negotiate(Some("text/html")), None);
        assert_eq!(negotiate(Some("application/json;q=0")), None);
    }

    #[test]
    fn only_utf8_json_bodies_are_accepted() {
        assert!(is_json_utf8("application/json"));
        assert!(is_json_utf8("Application/JSON; charset=UTF-8"));
        assert!(is_json_utf8("application/json; charset=\"utf-8\""));
        assert!(!is_json_utf8("application/json; charset=latin1"));
        assert!(!is_json_utf8("text/plain"));
        assert!(!is_json_utf8(""));
    }

    #[test]
    fn retry_after_is_rounded_up_to_a_second() {
        assert_eq!(retry_seconds(Duration::from_millis(1)), 1);
        assert_eq!(retry_seconds(Duration::ZERO), 1);
        assert_eq!(retry_seconds(Duration::from_millis(1500)), 2);
        assert_eq!(retry_seconds(Duration::from_secs(3)), 3);
    }
}
