//! Leaf-compatible plain HTTP routes: `GET /api/segment/get/{tag}` and
//! `GET /api/snowflake/get/{key}` answer the bare ID as `text/plain`, or
//! with `?count=N` that many IDs, one per line. (Leaf ignores the key of
//! its snowflake route; so does this one.)
//!
//! Errors answer a status and `CODE: message`: 404 `UNKNOWN_BIZ_TAG`, 503
//! for `ID_SOURCE_UNAVAILABLE` and `CLOCK_MOVED_BACKWARDS` (both worth a
//! retry), 400 for bad input. These routes bypass the GraphQL admission
//! control, like Leaf's own server: they answer from memory. With auth on
//! they need a token with a `*:read` scope, like the GraphQL ID fields.

use std::fmt::Write as _;
use std::sync::Arc;

use poem::http::StatusCode;
use poem::web::{Data, Path, Query};
use poem::{handler, IntoResponse, Response};
use serde::Deserialize;

use super::Gateway;
use cellgate_graphql::auth::Access;

#[derive(Debug, Deserialize)]
pub(super) struct CountParam {
    count: Option<usize>,
}

fn answer(result: cellgate_store::Result<Vec<i64>>) -> Response {
    match result {
        Ok(ids) => {
            let mut body = String::with_capacity(ids.len() * 20);
            for (i, id) in ids.iter().enumerate() {
                if i > 0 {
                    body.push('\n');
                }
                let _ = write!(body, "{id}");
            }
            body.with_content_type("text/plain; charset=utf-8")
                .into_response()
        }
        Err(error) => {
            let status = match error.code() {
                "UNKNOWN_BIZ_TAG" => StatusCode::NOT_FOUND,
                "BAD_USER_INPUT" | "LIMIT_EXCEEDED" => StatusCode::BAD_REQUEST,
                "ID_SOURCE_UNAVAILABLE" | "CLOCK_MOVED_BACKWARDS" | "STORAGE_UNAVAILABLE" => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                _ => {
                    tracing::error!(error = %error, "id request failed");
                    StatusCode::INTERNAL_SERVER_ERROR
                }
            };
            format!("{}: {}", error.code(), error.client_message())
                .with_content_type("text/plain; charset=utf-8")
                .with_status(status)
                .into_response()
        }
    }
}

#[handler]
pub(super) async fn segment(
    request: &poem::Request,
    Data(gateway): Data<&Arc<Gateway>>,
    Path(tag): Path<String>,
    Query(params): Query<CountParam>,
) -> Response {
    if let Some(refused) = gateway
        .refuse_plain(request, "this route", Access::Read)
        .await
    {
        return refused;
    }
    let count = params.count.unwrap_or(1);
    answer(gateway.store.ids().next_ids(&tag, count).await)
}

#[handler]
pub(super) async fn snowflake(
    request: &poem::Request,
    Data(gateway): Data<&Arc<Gateway>>,
    Path(_key): Path<String>,
    Query(params): Query<CountParam>,
) -> Response {
    if let Some(refused) = gateway
        .refuse_plain(request, "this route", Access::Read)
        .await
    {
        return refused;
    }
    let count = params.count.unwrap_or(1);
    answer(gateway.store.ids().snowflake_ids(count).await)
}
