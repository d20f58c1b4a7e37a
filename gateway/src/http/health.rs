//! `GET /healthz` (the process answers) and `GET /readyz` (every storage
//! master answers).
//!
//! Readiness failures are logged with their cause but answered with a bare
//! 503: the probe endpoint is unauthenticated, and driver errors can name
//! hosts, users and file paths.

use std::sync::Arc;

use poem::http::StatusCode;
use poem::web::Data;
use poem::{handler, IntoResponse, Response};

use super::Gateway;

#[handler]
pub(super) fn healthz() -> &'static str {
    "ok"
}

#[handler]
pub(super) async fn readyz(Data(gateway): Data<&Arc<Gateway>>) -> Response {
    match gateway.store.ping().await {
        Ok(()) => "ok".into_response(),
        Err(error) => {
            tracing::warn!(error = %error, "readiness check failed");
            "storage unavailable"
                .with_status(StatusCode::SERVICE_UNAVAILABLE)
                .into_response()
        }
    }
}
