//! Reloading the definitions without a restart: on `SIGHUP`, on `cellgate
//! reload` (`POST /admin/reload`), and, with `serve --watch`, when the
//! definitions directory changes (the triggers of all three are in
//! `cli/serve.rs` and `cli/reload.rs`; this file does the reload).
//!
//! A reload reads the directory again (`index-dsl`). Definitions that do
//! not load are *invalid*: the diagnostics, with file, line and column, are
//! logged, counted (`cellgate_definitions_reloads_total{result="invalid"}`,
//! `cellgate_definitions_latest 0`) and shown by `Query.definitions`, and
//! the gateway keeps serving what it served. Definitions that load but that
//! the running store cannot apply (`Store::reload`: a removed datastore or
//! column, a new shard count, a catalog mismatch, a database that does not
//! answer) are *refused* in the same way. Otherwise the store applies them
//! (new index tables, maintenance of the new versions) and the gateway
//! builds the new schema and swaps it in with its access map and a fresh
//! document cache (`cellgate_graphql::Served`): requests under way finish on the schema they
//! started with, and their store calls on the store's snapshot of the same
//! definitions (`Store::pinned`), new ones get the new ones, and no
//! connection is closed.
//! Trigger changes are reported and apply at the next restart (webhook
//! delivery reads its environment once, at start-up).

use std::path::PathBuf;
use std::sync::Arc;

use cellgate_graphql::{DefinitionsStatus, ReloadResult};
use cellgate_store::Store;
use index_dsl::Definitions;
use poem::http::StatusCode;
use poem::web::Data;
use poem::{handler, Request, Response};

use super::Gateway;

/// The reload state of a gateway.
pub(super) struct Reloads {
    /// The definitions directory (`--datastores`).
    dir: PathBuf,
    /// The definitions the webhook triggers run from (those at start-up).
    triggers_from: Arc<Definitions>,
    status: DefinitionsStatus,
    /// One reload at a time: a second one waits, then reads the directory
    /// again itself.
    running: tokio::sync::Mutex<()>,
}

impl Reloads {
    pub(super) fn new(dir: PathBuf, store: &Store) -> Reloads {
        Reloads {
            dir,
            triggers_from: store.definitions(),
            status: DefinitionsStatus::default(),
            running: tokio::sync::Mutex::new(()),
        }
    }

    pub(super) fn status(&self) -> &DefinitionsStatus {
        &self.status
    }
}

/// How a reload went: its result and what changed, or why nothing did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    pub result: ReloadResult,
    pub details: Vec<String>,
}

impl Gateway {
    /// Reads the definitions directory again and serves what it holds, if
    /// it loads and the store can apply it (see the module doc); `cause`
    /// says what asked, for the log.
    pub async fn reload(&self, cause: &str) -> Reloaded {
        let _one = self.reloads.running.lock().await;
        let reloaded = self.reload_once().await;
        let details = reloaded.details.join("\n");
        match reloaded.result {
            ReloadResult::Applied => {
                tracing::info!(cause, "definitions reloaded:\n{details}")
            }
            ReloadResult::Unchanged => {
                tracing::info!(cause, "definitions reloaded: nothing changed")
            }
            ReloadResult::Invalid => tracing::error!(
                cause,
                "definitions not reloaded, they do not load; still serving the previous ones:\n{details}"
            ),
            ReloadResult::Refused => tracing::error!(
                cause,
                "definitions not reloaded; still serving the previous ones:\n{details}"
            ),
        }
        self.reloads
            .status
            .record(reloaded.result, reloaded.details.clone());
        reloaded
    }

    async fn reload_once(&self) -> Reloaded {
        let failed = |result, details| Reloaded { result, details };
        let dir = &self.reloads.dir;
        let defs = match index_dsl::load_dir(dir) {
            Ok(defs) => defs,
            Err(diagnostics) => {
                let mut details: Vec<String> =
                    diagnostics.0.iter().map(|d| d.to_string()).collect();
                if details.is_empty() {
                    details.push(diagnostics.to_string());
                }
                return failed(ReloadResult::Invalid, details);
            }
        };
        if *self.store.definitions() == defs {
            return Reloaded {
                result: ReloadResult::Unchanged,
                details: Vec::new(),
            };
        }
        // Names that clash in GraphQL are refused before the store changes.
        if let Err(error) = cellgate_graphql::sdl(&defs) {
            return failed(ReloadResult::Invalid, vec![error.to_string()]);
        }
        let triggers_changed = triggers(&defs) != triggers(&self.reloads.triggers_from);
        let report = match self.store.reload(defs).await {
            Ok(report) => report,
            Err(error) => {
                tracing::debug!(%error, "the store refused the definitions");
                return failed(ReloadResult::Refused, vec![error.client_message()]);
            }
        };
        let previous = self.pipeline.served();
        let documents = Arc::new(previous.documents().renewed());
        match cellgate_graphql::Served::build(&self.store, self.graphql_limits, documents) {
            Ok(served) => self.pipeline.serve(served),
            Err(error) => {
                // `sdl` built the same schema above, so this does not happen.
                tracing::error!(%error, "cannot build the schema of the reloaded definitions");
                return failed(ReloadResult::Refused, vec![error.client_message()]);
            }
        }
        let mut details = report.changes;
        if triggers_changed {
            details.push(
                "trigger definitions changed: webhook triggers are started with the gateway, \
                 so the change applies at the next restart"
                    .to_string(),
            );
        }
        details.extend(report.warnings.into_iter().map(|w| format!("note: {w}")));
        if details.is_empty() {
            details.push("descriptions updated".to_string());
        }
        Reloaded {
            result: ReloadResult::Applied,
            details,
        }
    }
}

/// The trigger definitions of `defs`, for comparison.
fn triggers(defs: &Definitions) -> Vec<&index_dsl::Trigger> {
    defs.datastores.iter().flat_map(|d| &d.triggers).collect()
}

/// `POST /admin/reload`: reloads the definitions and answers how it went,
/// as JSON `{"result": "applied|unchanged|invalid|refused", "details":
/// [...]}` with 200 (applied, unchanged), 422 (invalid) or 409 (refused).
/// With auth on it needs a token with a `*:admin` scope. The body must be
/// JSON (`{}`), so a page of another origin cannot send it without a CORS
/// preflight, which this route does not answer.
#[handler]
pub(super) async fn reload_route(gateway: Data<&Arc<Gateway>>, request: &Request) -> Response {
    if let Some(refused) = gateway
        .refuse_plain(
            request,
            "/admin/reload",
            cellgate_graphql::auth::Access::Admin,
        )
        .await
    {
        return refused;
    }
    let json = request
        .content_type()
        .is_some_and(|t| t.split(';').next().map(str::trim) == Some("application/json"));
    if !json {
        return Response::builder()
            .status(StatusCode::UNSUPPORTED_MEDIA_TYPE)
            .content_type("text/plain; charset=utf-8")
            .body(
                "UNSUPPORTED_MEDIA_TYPE: send the request with `Content-Type: application/json`",
            );
    }
    let reloaded = gateway.reload("POST /admin/reload").await;
    let status = match reloaded.result {
        ReloadResult::Applied | ReloadResult::Unchanged => StatusCode::OK,
        ReloadResult::Invalid => StatusCode::UNPROCESSABLE_ENTITY,
        ReloadResult::Refused => StatusCode::CONFLICT,
    };
    let body = serde_json::json!({
        "result": reloaded.result.as_str(),
        "details": reloaded.details,
    });
    Response::builder()
        .status(status)
        .content_type("application/json")
        .body(body.to_string())
}
