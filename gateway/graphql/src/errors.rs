//! Errors as clients see them: a message and a stable `extensions.code`.
//!
//! Store errors map through [`cellgate_store::Error::code`] and
//! [`cellgate_store::Error::client_message`], so SQL, driver texts and paths stay in
//! the logs; internal errors are logged here with their full text. An
//! error that may go away if the request is sent again later (the storage
//! was unreachable) also says `extensions.retryable: true`.

use async_graphql::ErrorExtensions;

/// A client-facing error with `code`.
pub fn coded(code: &'static str, message: impl Into<String>) -> async_graphql::Error {
    async_graphql::Error::new(message.into()).extend_with(|_, e| e.set("code", code))
}

/// `BAD_USER_INPUT` with a message.
pub fn bad_input(message: impl Into<String>) -> async_graphql::Error {
    coded("BAD_USER_INPUT", message)
}

/// Converts a store error, logging what the client does not see.
pub fn from_store(err: &cellgate_store::Error) -> async_graphql::Error {
    let code = err.code();
    if matches!(code, "INTERNAL" | "STORAGE_UNAVAILABLE" | "CORRUPT_BODY") {
        tracing::error!(code, error = %err, "request failed");
    }
    let error = coded(code, err.client_message());
    if err.is_transient() {
        error.extend_with(|_, e| e.set("retryable", true))
    } else {
        error
    }
}
