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
//! 4. **document parsing**: a syntax error is a request error
//!    (`GRAPHQL_PARSE_FAILED`); over GET, only queries run (405 with
//!    `Allow: POST` otherwise), since GETs must be safe to repeat and cache.
//!    Variables were only split into their members' JSON texts in step 2;
//!    they are now parsed into async-graphql's values, but for the cells a
//!    compiled write reads from their text, and one nested deeper than the
//!    JSON parser allows is refused here (400);
//! 5. **execution**, through [`cellgate_graphql::execute`]. async-graphql
//!    validates the document and coerces variables before executing; a
//!    failure there comes back as a response with errors, `null` data and no
//!    error path, which is a request error (`GRAPHQL_VALIDATION_FAILED`).
//!    Execution past `limits.request_timeout_ms` is cancelled: 504 `TIMEOUT`.
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
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use super::admission::Rejection;
use super::metrics::Outcome;
use super::Gateway;
use cellgate_graphql::auth::AuthError;
use cellgate_graphql::{Answer, RequestVariables};

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

/// The GraphQL parameters of a request, checked for type. Extensions go
/// from the request's JSON text straight into async-graphql's values;
/// variables are split into their members' JSON texts, parsed into
/// async-graphql's values only for what needs them (a compiled write reads
/// its cells from the text: `cellgate_graphql::RequestVariables`).
struct Params {
    query: String,
    operation_name: Option<String>,
    variables: RequestVariables,
    extensions: async_graphql::Extensions,
}

/// The members of a request object, each left as JSON text until its
/// type is checked. Other members are ignored.
#[derive(serde::Deserialize)]
struct RawParams<'a> {
    #[serde(borrow, default)]
    query: Option<&'a RawValue>,
    #[serde(rename = "operationName", borrow, default)]
    operation_name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    variables: Option<&'a RawValue>,
    #[serde(borrow, default)]
    extensions: Option<&'a RawValue>,
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
    let start = Instant::now();
    let mut operation = None;
    let media = negotiate(request.header(header::ACCEPT));
    let (response, outcome) = match media {
        None => {
            let failure = Failure::new(
                StatusCode::NOT_ACCEPTABLE,
                "NOT_ACCEPTABLE",
                format!("responses are {GRAPHQL_RESPONSE_JSON} or {JSON}; the Accept header allows neither"),
            );
            failure_response(MediaType::Json, failure)
        }
        Some(media) => match respond(gateway, request, body, media, &mut operation).await {
            Ok(answer) => answer,
            Err(failure) => failure_response(media, failure),
        },
    };
    gateway
        .metrics
        .record(operation.as_deref(), outcome, start.elapsed());
    response
}

/// The answer to a request that ran past `limit`.
fn timed_out(limit: Duration) -> Failure {
    let mut failure = Failure::new(
        StatusCode::GATEWAY_TIMEOUT,
        "TIMEOUT",
        format!(
            "the request did not finish within {} ms and was cancelled",
            limit.as_millis()
        ),
    );
    failure.outcome = Outcome::TimedOut;
    failure
}

/// Steps 2 to 5 of the module doc. `operation` receives the operation name
/// as soon as it is known, for the metrics.
async fn respond(
    gateway: &Gateway,
    request: &Request,
    body: Option<Body>,
    media: MediaType,
    operation: &mut Option<String>,
) -> Result<(Response, Outcome), Failure> {
    // The body is read before a permit is taken, within its own deadline,
    // so clients that stall while sending hold no permit.
    let params = match body {
        None => get_params(request)?,
        Some(body) => {
            post_params(request, body, gateway.max_body_bytes, gateway.body_timeout).await?
        }
    };
    let address = request.remote_addr().as_socket_addr().map(|a| a.ip());
    gateway.admission.limit_address(address).map_err(rejected)?;
    let principal = gateway
        .auth
        .authenticate(request.header(header::AUTHORIZATION))
        .await
        .map_err(unauthenticated)?;
    let _permit = gateway
        .admission
        .admit(principal.token.as_ref())
        .map_err(rejected)?;

    *operation = params.operation_name.clone();
    let is_get = request.method() == poem::http::Method::GET;

    let mut graphql_request = async_graphql::Request::new(params.query);
    graphql_request.operation_name = params.operation_name;
    graphql_request.extensions = params.extensions;
    let texts = params.variables;

    let requested_name = graphql_request.operation_name.clone();
    let provided: Vec<String> = texts.names().map(|name| name.to_string()).collect();
    // The schema, access map and document cache of the definitions served
    // now; a reload meanwhile does not change them for this request.
    let served = gateway.served();
    // Parsed once per distinct text (`graphql/documents.rs`); async-graphql
    // is then given this tree instead of parsing again.
    let parsed = match served.documents.parse(&graphql_request.query) {
        Ok(parsed) => parsed,
        Err(error) => {
            let errors = vec![with_code(
                serde_json::to_value(&error).unwrap_or_default(),
                "GRAPHQL_PARSE_FAILED",
            )];
            return Ok((request_error(media, errors), Outcome::Invalid));
        }
    };
    let document = &parsed.document;
    let authorized = match cellgate_graphql::authorize(
        document,
        requested_name.as_deref(),
        &principal,
        &served.access,
        gateway.introspection,
    ) {
        Ok(authorized) => authorized,
        Err(denied) => {
            let mut failure = Failure::new(StatusCode::FORBIDDEN, "FORBIDDEN", denied.message);
            failure.outcome = Outcome::Denied;
            return Err(failure);
        }
    };
    let selected = select_operation(document, requested_name.as_deref());
    if operation.is_none() {
        *operation = selected.and_then(|(name, _)| name.map(str::to_string));
    }
    if let Some((_, definition)) = selected {
        let kind = definition.node.ty;
        if is_get && kind != async_graphql::parser::types::OperationType::Query {
            let mut failure = Failure::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "METHOD_NOT_ALLOWED",
                format!("{kind} operations cannot be sent with GET; use POST"),
            );
            failure.headers.push((header::ALLOW, "POST".to_string()));
            return Err(failure);
        }
        // Variable coercion is part of the request: a required variable
        // that is not given fails the whole request before execution.
        let missing = missing_variables(&definition.node, &provided);
        if !missing.is_empty() {
            let errors = missing
                .into_iter()
                .map(|(name, ty)| {
                    json!({
                        "message": format!("variable `${name}` of required type `{ty}` was not provided"),
                        "extensions": {"code": "GRAPHQL_VALIDATION_FAILED"},
                    })
                })
                .collect();
            return Ok((request_error(media, errors), Outcome::Invalid));
        }
    }
    // A document that has passed validation before and reads an index page
    // or writes cells is answered directly (`graphql/direct.rs`) unless
    // this request needs async-graphql, e.g. to report an error. A
    // compiled write's cells stay JSON text until it reads them: its one
    // variable is the `cells` argument, which the limits do not measure.
    let direct = parsed
        .direct(|document| cellgate_graphql::Direct::compile(document, &served.defs))
        .filter(|direct| direct.runs(requested_name.as_deref()));
    let as_text = direct.as_ref().and_then(|direct| direct.text_variable());
    graphql_request.variables = texts
        .values(as_text)
        .map_err(|_| not_an_object("variables"))?;
    // Depth, cost and aliases (`graphql/limits.rs`), before async-graphql
    // walks the document.
    if let Err(error) = cellgate_graphql::check_limits(
        document,
        requested_name.as_deref(),
        &graphql_request.variables,
        gateway.graphql_limits,
    ) {
        let errors = vec![with_code(
            serde_json::to_value(&error).unwrap_or_default(),
            "GRAPHQL_VALIDATION_FAILED",
        )];
        return Ok((request_error(media, errors), Outcome::Invalid));
    }
    let started = tokio::time::Instant::now();
    if let Some(direct) = &direct {
        let run = cellgate_store::Store::pinned(
            served.snapshot.clone(),
            direct.run(
                &gateway.store,
                &graphql_request.variables,
                &texts,
                gateway.graphql_limits,
            ),
        );
        match tokio::time::timeout(gateway.request_timeout, run).await {
            Ok(Some(Answer::Body(body))) => {
                served.documents.answered_directly();
                return Ok((json_bytes(StatusCode::OK, media, body), Outcome::Ok));
            }
            Ok(Some(Answer::Failed(response))) => {
                served.documents.answered_directly();
                return Ok(execution_errors(&response, media));
            }
            Ok(None) => {}
            Err(_) => return Err(timed_out(gateway.request_timeout)),
        }
        if as_text.is_some() {
            graphql_request.variables =
                texts.values(None).map_err(|_| not_an_object("variables"))?;
        }
    }
    graphql_request.set_parsed_query(document.clone());

    // Dropping the execution at the deadline cancels its work: every
    // resolver awaits the store, and CPU-bound steps are bounded by the
    // limits checked before execution.
    let introspection_schema;
    let schema = if authorized.introspects {
        introspection_schema =
            gateway
                .introspection_schema(&served, &principal)
                .map_err(|error| {
                    tracing::error!(%error, "cannot build the schema of a token's datastores");
                    Failure::new(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "INTERNAL_SERVER_ERROR",
                        "internal error".to_string(),
                    )
                })?;
        &introspection_schema
    } else {
        &served.schema
    };
    let graphql_request = graphql_request.data(gateway.reloads.status().clone());
    let execution = cellgate_store::Store::pinned(
        served.snapshot.clone(),
        cellgate_graphql::execute(schema, &gateway.store, principal, graphql_request),
    );
    let remaining = gateway.request_timeout.saturating_sub(started.elapsed());
    let Ok(response) = tokio::time::timeout(remaining, execution).await else {
        return Err(timed_out(gateway.request_timeout));
    };
    // Validation and variable coercion run before execution, and their
    // errors are the only ones without a path and with no data at all.
    if response.errors.is_empty() {
        parsed.validated();
        // The common case goes straight to bytes, without a `Value` tree.
        let body = serde_json::to_vec(&response).unwrap_or_default();
        return Ok((json_bytes(StatusCode::OK, media, body), Outcome::Ok));
    }
    let before_execution = response.data == async_graphql::Value::Null
        && response.errors.iter().all(|e| e.path.is_empty());
    if before_execution {
        let errors = response
            .errors
            .iter()
            .map(|error| {
                let code = cellgate_graphql::prepare_error_code(error)
                    .unwrap_or("GRAPHQL_VALIDATION_FAILED");
                with_code(serde_json::to_value(error).unwrap_or_default(), code)
            })
            .collect();
        return Ok((request_error(media, errors), Outcome::Invalid));
    }
    Ok(execution_errors(&response, media))
}

/// The answer to a request whose execution reported errors: 200 with the
/// errors, each with a code (`INTERNAL_SERVER_ERROR` where none was set).
fn execution_errors(response: &async_graphql::Response, media: MediaType) -> (Response, Outcome) {
    let mut value = serde_json::to_value(response).unwrap_or_else(|_| json!({}));
    if let Some(Value::Array(errors)) = value.get_mut("errors") {
        for error in errors.iter_mut() {
            *error = with_code(std::mem::take(error), "INTERNAL_SERVER_ERROR");
        }
    }
    (json_response(StatusCode::OK, media, &value), Outcome::Error)
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

fn unauthenticated(error: AuthError) -> Failure {
    let message = match error {
        AuthError::Missing => {
            "this server needs an API token: send `Authorization: Bearer <token>`"
        }
        AuthError::Invalid => "the API token is not valid (unknown or revoked)",
        AuthError::Unavailable => {
            let mut failure = Failure::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "STORAGE_UNAVAILABLE",
                "the API tokens cannot be read right now; retry later",
            );
            failure.retryable = true;
            failure.outcome = Outcome::Error;
            return failure;
        }
    };
    let mut failure = Failure::new(StatusCode::UNAUTHORIZED, "UNAUTHENTICATED", message);
    failure.outcome = Outcome::Denied;
    failure
        .headers
        .push((header::WWW_AUTHENTICATE, "Bearer".to_string()));
    failure
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

/// The parameters of a GET from its query string.
fn get_params(request: &Request) -> Result<Params, Failure> {
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
    let text = serde_json::to_string(&Value::Object(params))
        .map_err(|_| Failure::bad_request("malformed query string"))?;
    let raw: RawParams =
        serde_json::from_str(&text).map_err(|_| Failure::bad_request("malformed query string"))?;
    checked_params(raw)
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
) -> Result<Params, Failure> {
    let deadline = tokio::time::Instant::now() + timeout;
    let content_type = request.header(header::CONTENT_TYPE).unwrap_or("");
    if !is_json_utf8(content_type) {
        return Err(Failure::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UNSUPPORTED_MEDIA_TYPE",
            "the request body must be application/json (UTF-8)",
        ));
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
        return Err(too_large());
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
                ))
            }
            Ok(None) => break,
            Ok(Some(Err(_))) => return Err(Failure::bad_request("cannot read the request body")),
            Ok(Some(Ok(frame))) => frame,
        };
        if bytes.len() + frame.len() > limit {
            discard(frames, deadline).await;
            return Err(too_large());
        }
        bytes.extend_from_slice(&frame);
    }
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(Failure::bad_request("the request body is empty"));
    }
    // serde would also read a struct from a JSON array, so the kind of
    // value is told from its first byte; the parse checks the rest.
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    match serde_json::from_slice::<RawParams>(&bytes) {
        Ok(raw) if first == Some(&b'{') => checked_params(raw),
        _ if serde_json::from_slice::<serde::de::IgnoredAny>(&bytes).is_err() => {
            Err(Failure::bad_request("the request body is not valid JSON"))
        }
        _ if first == Some(&b'[') => {
            Err(Failure::bad_request("batched requests are not supported"))
        }
        _ if first == Some(&b'{') => Err(Failure::bad_request(
            "the request parameters must be an object without repeated members",
        )),
        _ => Err(Failure::bad_request(
            "the request body must be a JSON object",
        )),
    }
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

fn checked_params(raw: RawParams) -> Result<Params, Failure> {
    let is_null = |value: Option<&RawValue>| value.is_none_or(|v| v.get() == "null");
    let query = match raw.query {
        None => return Err(Failure::bad_request("the `query` parameter is required")),
        Some(query) => serde_json::from_str::<String>(query.get())
            .map_err(|_| Failure::bad_request("`query` must be a string"))?,
    };
    let operation_name = match raw.operation_name {
        name if is_null(name) => None,
        Some(name) => Some(
            serde_json::from_str::<String>(name.get())
                .map_err(|_| Failure::bad_request("`operationName` must be a string"))?,
        ),
        None => None,
    };
    // `null` or absent is empty; anything but an object is refused.
    fn object<T: serde::de::DeserializeOwned + Default>(
        name: &str,
        value: Option<&RawValue>,
    ) -> Result<T, Failure> {
        let refused = || not_an_object(name);
        match value.map(RawValue::get) {
            None | Some("null") => Ok(T::default()),
            Some(text) if text.starts_with('{') => {
                serde_json::from_str(text).map_err(|_| refused())
            }
            Some(_) => Err(refused()),
        }
    }
    let variables = match raw.variables.map(RawValue::get) {
        None => RequestVariables::default(),
        Some(text) if text == "null" || text.starts_with('{') => {
            RequestVariables::from_json(text).map_err(|_| not_an_object("variables"))?
        }
        Some(_) => return Err(not_an_object("variables")),
    };
    Ok(Params {
        query,
        operation_name,
        variables,
        extensions: object("extensions", raw.extensions)?,
    })
}

fn not_an_object(name: &str) -> Failure {
    Failure::bad_request(format!("`{name}` must be a JSON object"))
}

/// The operation a request runs, with its name, if the document names it
/// unambiguously; an unknown name is left for validation to report.
fn select_operation<'d>(
    document: &'d async_graphql::parser::types::ExecutableDocument,
    name: Option<&str>,
) -> Option<(
    Option<&'d str>,
    &'d async_graphql::Positioned<async_graphql::parser::types::OperationDefinition>,
)> {
    use async_graphql::parser::types::DocumentOperations;
    match (&document.operations, name) {
        (DocumentOperations::Single(op), _) => Some((None, op)),
        (DocumentOperations::Multiple(ops), Some(name)) => ops
            .iter()
            .find(|(n, _)| n.as_str() == name)
            .map(|(n, op)| (Some(n.as_str()), op)),
        (DocumentOperations::Multiple(ops), None) if ops.len() == 1 => {
            ops.iter().next().map(|(n, op)| (Some(n.as_str()), op))
        }
        (DocumentOperations::Multiple(_), None) => None,
    }
}

/// Required variables (non-null, no default) of `operation` that the
/// request does not give, with their types.
fn missing_variables(
    operation: &async_graphql::parser::types::OperationDefinition,
    provided: &[String],
) -> Vec<(String, String)> {
    operation
        .variable_definitions
        .iter()
        .filter(|var| !var.node.var_type.node.nullable && var.node.default_value.is_none())
        .filter(|var| !provided.iter().any(|p| p == var.node.name.node.as_str()))
        .map(|var| {
            (
                var.node.name.node.to_string(),
                var.node.var_type.node.to_string(),
            )
        })
        .collect()
}

/// `error` with `extensions.code` set to `code` unless it has one.
fn with_code(mut error: Value, code: &str) -> Value {
    if let Value::Object(fields) = &mut error {
        let extensions = fields
            .entry("extensions")
            .or_insert_with(|| Value::Object(Map::new()));
        if let Value::Object(extensions) = extensions {
            extensions
                .entry("code")
                .or_insert_with(|| Value::String(code.to_string()));
        }
    }
    error
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
        .header(header::VARY, "accept")
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
