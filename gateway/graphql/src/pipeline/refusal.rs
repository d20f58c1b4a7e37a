//! Why the pipeline did not run a request, with the stable codes a client
//! sees on every transport.

use std::time::Duration;

use async_graphql::ServerError;
use serde_json::{json, Map, Value};

use crate::access::Denied;
use crate::auth::AuthError;

/// What kind of refusal a [`Refusal`] is: the transports turn it into a
/// status code or a frame, never into another error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusalKind {
    /// The request's parameters are malformed (not a JSON object, a
    /// `query` that is no string, variables that are no object).
    BadRequest,
    /// The document does not parse, fails validation or the limits, or
    /// lacks a required variable: a GraphQL request error.
    Invalid,
    /// Auth is on and the request has no valid token (missing, unknown or
    /// revoked): `UNAUTHENTICATED`.
    Unauthenticated,
    /// The token store cannot be read now: `STORAGE_UNAVAILABLE`,
    /// retryable.
    AuthUnavailable,
    /// The token lacks a scope the operation needs: `FORBIDDEN`.
    Forbidden,
    /// The operation cannot be sent this way (a mutation in a GET, a
    /// subscription outside the socket).
    NotAllowedHere,
    /// Execution ran past the request deadline and was cancelled.
    TimedOut,
    /// The gateway failed in a way that is not the request's fault.
    Internal,
}

/// A request the pipeline refused, with its errors, each carrying
/// `extensions.code`.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub kind: RefusalKind,
    /// GraphQL errors as JSON (`message`, `extensions.code`, maybe
    /// `locations`); at least one.
    pub errors: Vec<Value>,
}

impl Refusal {
    /// One error of `kind` with `code` and `message`.
    pub fn new(kind: RefusalKind, code: &str, message: impl Into<String>) -> Refusal {
        let mut extensions = Map::new();
        extensions.insert("code".into(), Value::String(code.to_string()));
        if kind == RefusalKind::AuthUnavailable {
            extensions.insert("retryable".into(), Value::Bool(true));
        }
        Refusal {
            kind,
            errors: vec![json!({"message": message.into(), "extensions": extensions})],
        }
    }

    /// Malformed request parameters (`BAD_REQUEST`).
    pub fn bad_request(message: impl Into<String>) -> Refusal {
        Refusal::new(RefusalKind::BadRequest, "BAD_REQUEST", message)
    }

    /// A request error from async-graphql's errors, each given `code`
    /// unless it carries one.
    pub(crate) fn invalid(errors: &[ServerError], code: impl Fn(&ServerError) -> &str) -> Refusal {
        Refusal {
            kind: RefusalKind::Invalid,
            errors: errors
                .iter()
                .map(|error| {
                    with_code(serde_json::to_value(error).unwrap_or_default(), code(error))
                })
                .collect(),
        }
    }

    pub(crate) fn unauthenticated(error: AuthError) -> Refusal {
        match error {
            AuthError::Missing => Refusal::new(
                RefusalKind::Unauthenticated,
                "UNAUTHENTICATED",
                "this server needs an API token: send `Authorization: Bearer <token>`",
            ),
            AuthError::Invalid => Refusal::new(
                RefusalKind::Unauthenticated,
                "UNAUTHENTICATED",
                "the API token is not valid (unknown or revoked)",
            ),
            AuthError::Unavailable => Refusal::new(
                RefusalKind::AuthUnavailable,
                "STORAGE_UNAVAILABLE",
                "the API tokens cannot be read right now; retry later",
            ),
        }
    }

    pub(crate) fn forbidden(denied: Denied) -> Refusal {
        Refusal::new(RefusalKind::Forbidden, "FORBIDDEN", denied.message)
    }

    pub(crate) fn timed_out(limit: Duration) -> Refusal {
        Refusal::new(
            RefusalKind::TimedOut,
            "TIMEOUT",
            format!(
                "the request did not finish within {} ms and was cancelled",
                limit.as_millis()
            ),
        )
    }

    pub(crate) fn internal() -> Refusal {
        Refusal::new(
            RefusalKind::Internal,
            "INTERNAL_SERVER_ERROR",
            "internal error",
        )
    }

    /// The code of the first error.
    pub fn code(&self) -> &str {
        self.errors
            .first()
            .and_then(|e| e.pointer("/extensions/code"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// The message of the first error.
    pub fn message(&self) -> &str {
        self.errors
            .first()
            .and_then(|e| e.get("message"))
            .and_then(Value::as_str)
            .unwrap_or("")
    }
}

/// `error` with `extensions.code` set to `code` unless it has one.
pub(crate) fn with_code(mut error: Value, code: &str) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_kept_and_missing_ones_set() {
        let coded = json!({"message": "m", "extensions": {"code": "QUERY_TOO_DEEP"}});
        assert_eq!(with_code(coded.clone(), "X"), coded);
        assert_eq!(
            with_code(json!({"message": "m"}), "X"),
            json!({"message": "m", "extensions": {"code": "X"}})
        );
    }

    #[test]
    fn transient_refusals_are_retryable() {
        let refusal = Refusal::unauthenticated(AuthError::Unavailable);
        assert_eq!(refusal.code(), "STORAGE_UNAVAILABLE");
        assert_eq!(refusal.errors[0]["extensions"]["retryable"], true);
        let refusal = Refusal::unauthenticated(AuthError::Invalid);
        assert_eq!(refusal.code(), "UNAUTHENTICATED");
        assert!(refusal.errors[0]["extensions"].get("retryable").is_none());
    }
}
