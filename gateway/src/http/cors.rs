//! Cross-origin resource sharing for `/graphql`, per the Fetch standard.
//!
//! No origin is allowed unless configured (`cors.allowed_origins`), so a
//! page of another origin cannot read answers. For an allowed origin:
//! preflights (`OPTIONS` with `Access-Control-Request-Method`) are answered
//! 204 with the methods (`GET`, `POST`), the request headers the API reads
//! (`Authorization`, `Content-Type`, `Accept`) and `Access-Control-Max-Age`;
//! answers carry `Access-Control-Allow-Origin` (the origin itself, or `*`
//! when any origin is allowed and credentials are not) and `Vary: Origin`.
//! A preflight from an origin that is not allowed is answered 403 without
//! CORS headers, which browsers report as a blocked request. poem's own
//! `Cors` middleware allows every origin when given none, the opposite of
//! the default wanted here, so the rules are written out.

use std::sync::Arc;

use poem::http::{header, HeaderValue, Method, StatusCode};
use poem::{Endpoint, IntoResponse as _, Request, Response};

use super::Gateway;
use crate::config::CorsConfig;

const METHODS: &str = "GET, POST";
const HEADERS: &str = "authorization, content-type, accept";

/// Refuses `allow_credentials` with `*`, which the spec forbids (browsers
/// would ignore the answers anyway).
pub(super) fn validate(config: &CorsConfig) -> cellgate_store::Result<()> {
    if config.allow_credentials && config.allowed_origins.iter().any(|o| o == "*") {
        return Err(cellgate_store::Error::Config(
            "cors: allow_credentials cannot be used with the origin \"*\"; list the origins"
                .to_string(),
        ));
    }
    Ok(())
}

/// What `Access-Control-Allow-Origin` says to `origin`, if it is allowed.
fn allowed(config: &CorsConfig, origin: &str) -> Option<String> {
    if config.allowed_origins.iter().any(|o| o == origin) {
        Some(origin.to_string())
    } else if config.allowed_origins.iter().any(|o| o == "*") {
        Some("*".to_string())
    } else {
        None
    }
}

/// Whether a WebSocket upgrade from a page of `origin` may go on, by the
/// rule of CORS: browsers send no preflight for WebSockets and let any page
/// open one, so the gateway checks the `Origin` itself. Allowed: no
/// `Origin` (not a browser), a configured origin (or `*`), and the
/// gateway's own origin (the one whose authority is the request's `Host`,
/// e.g. the playground at `/`).
pub(super) fn socket_origin_allowed(
    config: &CorsConfig,
    origin: Option<&str>,
    host: Option<&str>,
) -> bool {
    match origin {
        None => true,
        Some(origin) => allowed(config, origin).is_some() || same_origin(origin, host),
    }
}

/// Whether `origin` (`scheme://host[:port]`) names the authority `host`
/// (`host[:port]`), ports defaulting to the scheme's.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let (Some((scheme, authority)), Some(host)) = (origin.split_once("://"), host) else {
        return false;
    };
    let port = match scheme.to_ascii_lowercase().as_str() {
        "http" | "ws" => "80",
        "https" | "wss" => "443",
        _ => return false,
    };
    with_port(authority, port) == with_port(host, port)
}

/// `authority`, lowercase, with `port` added when it names none.
fn with_port(authority: &str, port: &str) -> String {
    let authority = authority.trim().to_ascii_lowercase();
    // The part after an IPv6 literal's brackets, or after the name.
    let tail = authority.rsplit(']').next().unwrap_or("");
    if tail.contains(':') {
        authority
    } else {
        format!("{authority}:{port}")
    }
}

/// Wraps the `/graphql` endpoint.
pub(super) async fn cors<E: Endpoint>(
    endpoint: Arc<E>,
    request: Request,
) -> poem::Result<Response> {
    let config = request
        .data::<Arc<Gateway>>()
        .map(|gateway| gateway.cors.clone())
        .unwrap_or_default();
    let origin = request.header(header::ORIGIN).map(str::to_string);
    let preflight = request.method() == Method::OPTIONS;
    if preflight {
        let asks = request
            .header(header::ACCESS_CONTROL_REQUEST_METHOD)
            .map(str::to_string);
        return Ok(match (origin, asks) {
            (Some(origin), Some(method)) => match allowed(&config, &origin) {
                Some(allow) if method == "GET" || method == "POST" => {
                    let mut response = Response::builder()
                        .status(StatusCode::NO_CONTENT)
                        .header(header::ACCESS_CONTROL_ALLOW_METHODS, METHODS)
                        .header(header::ACCESS_CONTROL_ALLOW_HEADERS, HEADERS)
                        .header(
                            header::ACCESS_CONTROL_MAX_AGE,
                            config.max_age_seconds.to_string(),
                        )
                        .finish();
                    decorate(&mut response, &config, &allow);
                    response
                }
                _ => Response::builder()
                    .status(StatusCode::FORBIDDEN)
                    .header(header::VARY, "origin")
                    .content_type("text/plain; charset=utf-8")
                    .body("cross-origin requests from this origin are not allowed"),
            },
            // Not a CORS preflight: a plain OPTIONS.
            _ => Response::builder()
                .status(StatusCode::NO_CONTENT)
                .header(header::ALLOW, "GET, POST, OPTIONS")
                .finish(),
        });
    }
    let mut response = match endpoint.call(request).await {
        Ok(response) => response.into_response(),
        Err(error) => error.into_response(),
    };
    if let Some(allow) = origin.as_deref().and_then(|o| allowed(&config, o)) {
        decorate(&mut response, &config, &allow);
    } else if origin.is_some() {
        response
            .headers_mut()
            .append(header::VARY, HeaderValue::from_static("origin"));
    }
    Ok(response)
}

fn decorate(response: &mut Response, config: &CorsConfig, allow: &str) {
    let headers = response.headers_mut();
    if let Ok(value) = HeaderValue::from_str(allow) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
    }
    if config.allow_credentials {
        headers.insert(
            header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            HeaderValue::from_static("true"),
        );
    }
    headers.append(header::VARY, HeaderValue::from_static("origin"));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockets_open_from_no_origin_the_own_one_or_listed_ones() {
        let none = CorsConfig::default();
        let host = Some("127.0.0.1:8080");
        assert!(socket_origin_allowed(&none, None, host));
        assert!(socket_origin_allowed(
            &none,
            Some("http://127.0.0.1:8080"),
            host
        ));
        assert!(socket_origin_allowed(
            &none,
            Some("HTTP://LOCALHOST"),
            Some("localhost:80")
        ));
        assert!(socket_origin_allowed(
            &none,
            Some("https://gw.example"),
            Some("gw.example")
        ));
        assert!(socket_origin_allowed(
            &none,
            Some("http://[::1]:8080"),
            Some("[::1]:8080")
        ));
        for refused in [
            "http://evil.example",
            "http://127.0.0.1:8081",
            "null",
            "file://",
            "http://127.0.0.1:8080.evil.example",
        ] {
            assert!(
                !socket_origin_allowed(&none, Some(refused), host),
                "{refused}"
            );
        }
        assert!(!socket_origin_allowed(
            &none,
            Some("http://127.0.0.1:8080"),
            None
        ));
        let listed = CorsConfig {
            allowed_origins: vec!["https://app.example".into()],
            ..CorsConfig::default()
        };
        assert!(socket_origin_allowed(
            &listed,
            Some("https://app.example"),
            host
        ));
        assert!(!socket_origin_allowed(
            &listed,
            Some("https://other.example"),
            host
        ));
    }

    #[test]
    fn only_listed_origins_are_allowed() {
        let none = CorsConfig::default();
        assert_eq!(allowed(&none, "https://a.example"), None);
        let listed = CorsConfig {
            allowed_origins: vec!["https://a.example".into()],
            ..CorsConfig::default()
        };
        assert_eq!(
            allowed(&listed, "https://a.example").as_deref(),
            Some("https://a.example")
        );
        assert_eq!(allowed(&listed, "https://b.example"), None);
        let any = CorsConfig {
            allowed_origins: vec!["*".into()],
            ..CorsConfig::default()
        };
        assert_eq!(allowed(&any, "https://b.example").as_deref(), Some("*"));
        assert!(validate(&any).is_ok());
        assert!(validate(&CorsConfig {
            allow_credentials: true,
            ..any
        })
        .is_err());
    }
}
