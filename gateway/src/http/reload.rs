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
//! delivery reads its environment once, at start-up). The manifest of
//! persisted documents is read again on every reload; one that does not
//! load is reported and the previous one stays.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use cellgate_graphql::{DefinitionsStatus, ReloadResult};
use cellgate_store::Store;
use index_dsl::Definitions;
use poem::http::StatusCode;
use poem::web::Data;
use poem::{handler, Body, Request, Response};

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
    /// The files of the definitions served, when the directory held them
    /// (at start-up, what the store was opened with).
    served: std::sync::Mutex<Option<Files>>,
}

/// Definition files, by path relative to the directory, with their digest.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Files {
    digest: String,
    texts: BTreeMap<String, String>,
}

impl Files {
    fn of(read: Vec<(PathBuf, String)>) -> Files {
        let texts: BTreeMap<String, String> = read
            .into_iter()
            .map(|(path, text)| (path.to_string_lossy().replace('\\', "/"), text))
            .collect();
        Files {
            digest: index_dsl::digest(&texts),
            texts,
        }
    }
}

/// What a plan (`cellgate plan --format json`) was made from and for:
/// `cellgate reload --plan` reloads only when the gateway serves `base` and
/// its directory holds `head`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct PlannedDigests {
    pub base: String,
    pub head: String,
}

impl Reloads {
    pub(super) fn new(dir: PathBuf, store: &Store) -> Reloads {
        let served = match index_dsl::load_dir_with_files(&dir) {
            Ok((defs, read)) if defs == *store.definitions() => Some(Files::of(read)),
            _ => None,
        };
        Reloads {
            dir,
            triggers_from: store.definitions(),
            status: DefinitionsStatus::default(),
            running: tokio::sync::Mutex::new(()),
            served: std::sync::Mutex::new(served),
        }
    }

    fn served(&self) -> Option<Files> {
        self.served.lock().expect("served files").clone()
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
        self.reload_planned(cause, None).await
    }

    /// [`Gateway::reload`], only if the gateway serves the files `plan`
    /// was made from and its directory holds those it was made for.
    pub async fn reload_planned(&self, cause: &str, plan: Option<&PlannedDigests>) -> Reloaded {
        let _one = self.reloads.running.lock().await;
        let manifest = self.pipeline.persisted().reload();
        let (mut reloaded, schema) = self.reload_once(plan).await;
        match manifest {
            Ok(None) => {}
            Ok(Some(count)) => reloaded
                .details
                .push(format!("persisted documents: {count} in the manifest")),
            Err(error) => {
                tracing::error!(cause, %error, "persisted documents not reloaded; the previous manifest stays");
                reloaded.details.push(format!(
                    "persisted documents not reloaded, the previous manifest stays: {error}"
                ));
            }
        }
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
        // After the outcome is recorded: a client that sees the new schema
        // sees the reload's state too.
        if let Some(schema) = schema {
            self.pipeline.serve(schema);
        }
        if matches!(
            reloaded.result,
            ReloadResult::Applied | ReloadResult::Unchanged
        ) {
            self.record_deployed().await;
        }
        reloaded
    }

    /// Records the definition files served in the store's catalog (for
    /// `cellgate plan --base-deployed`); a failure is logged, nothing else.
    pub async fn record_deployed(&self) {
        let Some(files) = self.reloads.served() else {
            return;
        };
        if let Err(error) = self.store.record_deployed(&files.digest, files.texts).await {
            tracing::warn!(%error, "cannot record the deployed definitions in the catalog");
        }
    }

    /// Serves `files` from now on; the catalog records them once the
    /// reload's outcome is (see [`Gateway::reload_planned`]).
    fn served(&self, files: Files) {
        *self.reloads.served.lock().expect("served files") = Some(files);
    }

    /// Applies the definitions to the store; returns the outcome and, when
    /// applied, the schema to serve (once the outcome is recorded).
    async fn reload_once(
        &self,
        plan: Option<&PlannedDigests>,
    ) -> (Reloaded, Option<cellgate_graphql::Served>) {
        let failed = |result, details| (Reloaded { result, details }, None);
        if let Some(plan) = plan {
            let served = self.reloads.served().map(|f| f.digest);
            if served.as_deref() != Some(plan.base.as_str()) {
                let serving = served.unwrap_or_else(|| "files it cannot name".into());
                return failed(
                    ReloadResult::Refused,
                    vec![format!(
                        "the plan was made from definitions {} but the gateway serves {serving}: \
                         make the plan again against what is deployed (`cellgate plan --base-deployed`)",
                        plan.base
                    )],
                );
            }
        }
        let dir = &self.reloads.dir;
        let (defs, files) = match index_dsl::load_dir_with_files(dir) {
            Ok((defs, read)) => {
                let files = Files::of(read);
                if let Some(plan) = plan.filter(|p| p.head != files.digest) {
                    return failed(
                        ReloadResult::Refused,
                        vec![format!(
                            "the plan was made for definitions {} but the directory holds {}: \
                             make the plan again for what is there",
                            plan.head, files.digest
                        )],
                    );
                }
                if *self.store.definitions() == defs {
                    self.served(files);
                    let unchanged = Reloaded {
                        result: ReloadResult::Unchanged,
                        details: Vec::new(),
                    };
                    return (unchanged, None);
                }
                (defs, files)
            }
            Err(diagnostics) => {
                let mut details: Vec<String> =
                    diagnostics.0.iter().map(|d| d.to_string()).collect();
                if details.is_empty() {
                    details.push(diagnostics.to_string());
                }
                return failed(ReloadResult::Invalid, details);
            }
        };
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
        let schema = match cellgate_graphql::Served::build(
            &self.store,
            self.graphql_limits,
            documents,
            self.federation,
        ) {
            Ok(served) => served,
            Err(error) => {
                // `sdl` built the same schema above, so this does not happen.
                tracing::error!(%error, "cannot build the schema of the reloaded definitions");
                return failed(ReloadResult::Refused, vec![error.client_message()]);
            }
        };
        self.served(files);
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
        let applied = Reloaded {
            result: ReloadResult::Applied,
            details,
        };
        (applied, Some(schema))
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
pub(super) async fn reload_route(
    gateway: Data<&Arc<Gateway>>,
    request: &Request,
    body: Body,
) -> Response {
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
    let plan = match planned(body).await {
        Ok(plan) => plan,
        Err(message) => {
            return Response::builder()
                .status(StatusCode::BAD_REQUEST)
                .content_type("text/plain; charset=utf-8")
                .body(format!("BAD_REQUEST: {message}"))
        }
    };
    let reloaded = gateway
        .reload_planned("POST /admin/reload", plan.as_ref())
        .await;
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

/// The largest body `POST /admin/reload` reads.
const MAX_RELOAD_BODY: usize = 64 * 1024;

/// The `plan` member of a reload request's body (`{}` or `{"plan": {"base":
/// "sha256:…", "head": "sha256:…"}}`), read within 5 s.
async fn planned(body: Body) -> Result<Option<PlannedDigests>, String> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Request {
        plan: Option<PlannedDigests>,
    }
    let read = async {
        let mut bytes = Vec::new();
        let mut frames = body.into_bytes_stream();
        while let Some(frame) = futures::StreamExt::next(&mut frames).await {
            let frame = frame.map_err(|_| "cannot read the request body".to_string())?;
            bytes.extend_from_slice(&frame);
            if bytes.len() > MAX_RELOAD_BODY {
                return Err(format!("the body exceeds {MAX_RELOAD_BODY} bytes"));
            }
        }
        Ok(bytes)
    };
    let bytes = tokio::time::timeout(std::time::Duration::from_secs(5), read)
        .await
        .map_err(|_| "the body did not arrive within 5 s".to_string())??;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    serde_json::from_slice::<Request>(&bytes)
        .map(|r| r.plan)
        .map_err(|e| {
            format!("the body is not `{{}}` or `{{\"plan\": {{\"base\": …, \"head\": …}}}}`: {e}")
        })
}
