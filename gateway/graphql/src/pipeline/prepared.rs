//! A request the pipeline has accepted, and its execution: a query or
//! mutation under the request deadline (by its direct form where it has
//! one, else by async-graphql), or a subscription whose caller is checked
//! again while it runs.

use std::pin::Pin;
use std::sync::Arc;

use async_graphql::dynamic::Schema;
use async_graphql::futures_util::{Stream, StreamExt as _};
use async_graphql::parser::types::OperationType;
use serde_json::Value;

use super::refusal::with_code;
use super::{direct_form, Caller, Pipeline, Refusal, Served};
use crate::direct::Answer;
use crate::documents::Parsed;
use crate::variables::RequestVariables;
use cellgate_store::Store;

/// How often a running subscription's caller is checked again. Token
/// lookups are cached for `auth::CACHE_TTL` (1 s), so a revoked token ends
/// its subscriptions at most 1.5 s after the revocation; a check costs a
/// cache lookup and a walk of the document's root fields, so ten thousand
/// idle subscriptions cost twenty thousand of those a second.
pub(crate) const RECHECK_PERIOD: std::time::Duration = std::time::Duration::from_millis(500);

/// A request that passed every check of the pipeline, ready to run.
pub struct Prepared {
    pub(super) pipeline: Pipeline,
    pub(super) served: Arc<Served>,
    pub(super) parsed: Arc<Parsed>,
    /// The schema the caller may see.
    pub(super) schema: Schema,
    pub(super) request: async_graphql::Request,
    /// The variables as JSON text, for a compiled write.
    pub(super) texts: RequestVariables,
    /// Whether the document has a direct form that runs this request.
    pub(super) direct: bool,
    /// `None` when the document names no operation unambiguously, which
    /// validation reports.
    pub(super) kind: Option<OperationType>,
    pub(super) operation_name: Option<String>,
    pub(super) caller: Caller,
    pub(super) cacheability: super::Cacheability,
}

/// The answer to a query or mutation that ran.
#[derive(Debug)]
pub struct Executed {
    /// The response, serialized: `data`, and `errors` if any.
    pub body: Vec<u8>,
    /// Whether `errors` reports execution errors (each with a code).
    pub has_errors: bool,
}

/// The responses of a subscription, serialized, until it completes; an
/// error ends it (validation failed, or its caller no longer may run it).
pub type Subscription = Pin<Box<dyn Stream<Item = Result<Vec<u8>, Refusal>> + Send>>;

impl Prepared {
    /// The operation's name: the requested one, or the only one the
    /// document has.
    pub fn operation_name(&self) -> Option<&str> {
        self.operation_name.as_deref()
    }

    /// How an HTTP cache may keep the answer (`caching.rs`).
    pub fn cacheability(&self) -> super::Cacheability {
        self.cacheability
    }

    /// A tag of the request itself (document, operation, variables): for
    /// an [`Immutable`](super::Cacheability::Immutable) operation whose
    /// answer was complete, the same tag always means the same answer.
    pub fn request_tag(&self) -> String {
        let variables = serde_json::to_string(&self.request.variables).unwrap_or_default();
        let operation = self.request.operation_name.as_deref().unwrap_or("");
        super::persisted::sha256(&format!("{}\0{operation}\0{variables}", self.request.query))
    }

    /// Whether the operation is a subscription (run it with
    /// [`Prepared::subscribe`]).
    pub fn is_subscription(&self) -> bool {
        self.kind == Some(OperationType::Subscription)
    }

    /// Runs a query or mutation, within the request deadline. Errors that
    /// async-graphql reports before execution (validation, variable
    /// coercion) are a refusal, like the pipeline's own.
    pub async fn execute(self) -> Result<Executed, Refusal> {
        let kind = match self.kind {
            Some(OperationType::Query) => "query",
            Some(OperationType::Mutation) => "mutation",
            Some(OperationType::Subscription) => "subscription",
            None => "unknown",
        };
        // The operation's span (never its variables or the document's
        // text: its hash).
        let span = tracing::debug_span!(
            "graphql",
            otel.name = match &self.operation_name {
                Some(name) => format!("{kind} {name}"),
                None => kind.to_string(),
            },
            graphql.operation.type = kind,
            graphql.operation.name = self.operation_name.as_deref(),
            graphql.document = tracing::field::Empty,
        );
        if !span.is_disabled() {
            span.record(
                "graphql.document",
                format!("sha256:{}", super::persisted::sha256(&self.request.query)),
            );
        }
        tracing::Instrument::instrument(self.run(), span).await
    }

    async fn run(self) -> Result<Executed, Refusal> {
        let timeout = self.pipeline.inner.options.request_timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let store = &self.pipeline.inner.store;
        let served = &self.served;
        let mut request = self.request;
        let requested = request.operation_name.clone();
        if self.direct {
            if let Some(direct) = direct_form(served, &self.parsed, requested.as_deref()) {
                let run = Store::pinned(
                    served.snapshot.clone(),
                    direct.run(
                        store,
                        &request.variables,
                        &self.texts,
                        self.pipeline.inner.options.limits,
                    ),
                );
                match tokio::time::timeout_at(deadline, run).await {
                    Ok(Some(Answer::Body(body))) => {
                        served.documents.answered_directly();
                        return Ok(Executed {
                            body,
                            has_errors: false,
                        });
                    }
                    Ok(Some(Answer::Failed(response))) => {
                        served.documents.answered_directly();
                        return Ok(execution_errors(&response));
                    }
                    Ok(None) => {}
                    Err(_) => return Err(Refusal::timed_out(timeout)),
                }
                // The executor needs every variable as a value, the
                // compiled write's cells too.
                if direct.text_variable().is_some() {
                    request.variables = self
                        .texts
                        .values(None)
                        .map_err(|_| super::params::not_an_object("variables"))?;
                }
            }
        }
        request.set_parsed_query(self.parsed.document.clone());
        let request = request.data(self.pipeline.inner.status.clone());
        // Dropping the execution at the deadline cancels its work: every
        // resolver awaits the store, and CPU-bound steps are bounded by the
        // limits checked before execution.
        let execution = Store::pinned(
            served.snapshot.clone(),
            crate::execute(&self.schema, store, self.caller.principal, request),
        );
        let Ok(response) = tokio::time::timeout_at(deadline, execution).await else {
            return Err(Refusal::timed_out(timeout));
        };
        if response.errors.is_empty() {
            self.parsed.validated();
            return Ok(Executed {
                body: serde_json::to_vec(&response).unwrap_or_default(),
                has_errors: false,
            });
        }
        if before_execution(&response) {
            return Err(refused(&response));
        }
        Ok(execution_errors(&response))
    }

    /// Runs a subscription: its responses, serialized, until it completes
    /// or fails. Every half second (`RECHECK_PERIOD`) the caller's token is
    /// authenticated and the operation authorized again; a refusal then is
    /// the stream's last item.
    pub fn subscribe(self) -> Subscription {
        let Prepared {
            pipeline,
            served,
            parsed,
            schema,
            mut request,
            caller,
            ..
        } = self;
        let operation = request.operation_name.clone();
        request.set_parsed_query(parsed.document.clone());
        let request = request.data(pipeline.inner.status.clone());
        let responses = crate::execute_stream(
            &schema,
            &pipeline.inner.store,
            caller.principal.clone(),
            request,
        )
        .boxed();
        let period = RECHECK_PERIOD;
        let mut recheck = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let state = Running {
            checks: pipeline.auth_enabled(),
            pipeline,
            served,
            parsed,
            caller,
            operation,
            responses,
            recheck,
            first: true,
            ended: false,
        };
        async_graphql::futures_util::stream::unfold(state, |mut state| async move {
            if state.ended {
                return None;
            }
            let item = state.next().await?;
            state.ended = item.is_err();
            Some((item, state))
        })
        .boxed()
    }
}

/// A running subscription.
struct Running {
    pipeline: Pipeline,
    served: Arc<Served>,
    parsed: Arc<Parsed>,
    caller: Caller,
    /// The operation name the request gave.
    operation: Option<String>,
    responses: Pin<Box<dyn Stream<Item = async_graphql::Response> + Send>>,
    recheck: tokio::time::Interval,
    /// Whether auth is on, so that there is a caller to check.
    checks: bool,
    first: bool,
    ended: bool,
}

impl Running {
    async fn next(&mut self) -> Option<Result<Vec<u8>, Refusal>> {
        loop {
            let response = tokio::select! {
                response = Store::pinned(self.served.snapshot.clone(), self.responses.next()) => response?,
                _ = self.recheck.tick(), if self.checks => {
                    if let Err(refusal) = self
                        .pipeline
                        .recheck(&self.caller, &self.served, &self.parsed.document, self.operation.as_deref())
                        .await
                    {
                        return Some(Err(refusal));
                    }
                    continue;
                }
            };
            let first = std::mem::replace(&mut self.first, false);
            if first && before_execution(&response) {
                return Some(Err(refused(&response)));
            }
            return Some(Ok(serde_json::to_vec(&response).unwrap_or_default()));
        }
    }
}

/// Whether async-graphql failed the request before executing it:
/// validation and variable coercion errors are the only ones without a
/// path and with no data at all.
fn before_execution(response: &async_graphql::Response) -> bool {
    !response.errors.is_empty()
        && response.data == async_graphql::Value::Null
        && response.errors.iter().all(|e| e.path.is_empty())
}

/// The request error of a response that failed before execution.
fn refused(response: &async_graphql::Response) -> Refusal {
    Refusal::invalid(&response.errors, |error| {
        crate::limits::prepare_error_code(error).unwrap_or("GRAPHQL_VALIDATION_FAILED")
    })
}

/// A response with execution errors, each with a code
/// (`INTERNAL_SERVER_ERROR` where none was set).
fn execution_errors(response: &async_graphql::Response) -> Executed {
    let mut value =
        serde_json::to_value(response).unwrap_or_else(|_| Value::Object(Default::default()));
    if let Some(Value::Array(errors)) = value.get_mut("errors") {
        for error in errors.iter_mut() {
            *error = with_code(std::mem::take(error), "INTERNAL_SERVER_ERROR");
        }
    }
    Executed {
        body: serde_json::to_vec(&value).unwrap_or_default(),
        has_errors: true,
    }
}
