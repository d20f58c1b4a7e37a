//! `GET /healthz` (the process answers) and `GET /readyz` (every storage
//! master answers, within `storage.readiness_timeout_ms`; the masters are
//! pinged at once, see `readiness.rs`).
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
    let unready = gateway
        .store
        .unready_clusters(gateway.readiness_timeout)
        .await;
    if unready.is_empty() {
        return "ok".into_response();
    }
    for (cluster, error) in &unready {
        tracing::warn!(cluster = %cluster, error = %error, "readiness check failed");
    }
    "storage unavailable"
        .with_status(StatusCode::SERVICE_UNAVAILABLE)
        .into_response()
}
