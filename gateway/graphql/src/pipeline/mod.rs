//! The one request pipeline: every transport (`POST /graphql`, `GET
//! /graphql`, each `subscribe` on `/graphql/ws`) hands its request here and
//! gets back either a [`Prepared`] request or a [`Refusal`] with its stable
//! code, so the promises of one transport are the promises of all.
//!
//! The steps, in order, each of which can refuse:
//! 1. **authentication** ([`Pipeline::authenticate`]): the bearer token
//!    becomes a [`Caller`] (`auth/`: cached for `auth::CACHE_TTL`, so a
//!    revocation is seen within that time);
//! 2. the **document**: the request's text, or the persisted document its
//!    `documentId` or automatic persisted query names, where the
//!    trusted-documents mode lets it run (`persisted.rs`); then
//!    **parsing**, through the document cache of the schema served now
//!    (`documents.rs`);
//! 3. **authorization** of the operation's root fields against the
//!    caller's scopes (`access.rs`), before validation, so an unknown
//!    datastore and a hidden one look the same;
//! 4. **operation selection** and what the transport allows: a GET runs
//!    only queries, and only the socket runs subscriptions; a required
//!    variable that is not given fails here;
//! 5. the **direct form** of a document that has passed validation before
//!    (`direct.rs`), and the variables parsed for what needs them;
//! 6. **limits**: depth, cost, aliases, fragment expansions (`limits.rs`);
//! 7. the **schema** the caller may see: with `__schema`/`__type` and no
//!    `*` scope, one of only the datastores it may read.
//!
//! A prepared query also says how an HTTP cache may keep its answer
//! (`caching.rs`: cells named by their full key never change).
//!
//! [`Prepared::execute`] then runs a query or mutation under the request
//! deadline, and [`Prepared::subscribe`] a subscription, whose caller is
//! checked again every half second while it runs: a revoked token,
//! or one that lost the scope, ends it with `UNAUTHENTICATED` or
//! `FORBIDDEN`. The transports keep only what is theirs: bodies, headers,
//! status codes, frames, close codes and admission.

mod caching;
mod params;
mod persisted;
mod prepared;
mod refusal;
mod served;

use std::sync::Arc;
use std::time::Duration;

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, OperationDefinition, OperationType,
};
use async_graphql::Positioned;
use serde_json::json;

pub use caching::{complete as complete_answer, Cacheability};
pub use params::GraphqlRequest;
pub use persisted::{DocumentsMode, Manifest, Persisted, PersistedCounts, PersistedOptions};
pub use prepared::{Executed, Prepared, Subscription};
pub use refusal::{Refusal, RefusalKind};
pub use served::Served;

use crate::access::authorize;
use crate::auth::{AuthError, Authenticator, Principal};
use crate::definitions::DefinitionsStatus;
use crate::direct::Direct;
use crate::limits::{check_limits, GraphqlLimits};
use cellgate_store::Store;

/// How a request arrived, where that changes what may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// `POST /graphql`: queries and mutations.
    Post,
    /// `GET /graphql`: queries only, since a GET must be safe to repeat.
    Get,
    /// A `subscribe` on `/graphql/ws`: every kind of operation.
    Socket,
}

/// The settings of a pipeline.
#[derive(Debug, Clone, Copy)]
pub struct PipelineOptions {
    pub limits: GraphqlLimits,
    /// Whether `__schema` and `__type` are answered at all.
    pub introspection: bool,
    /// How long a query or mutation may run.
    pub request_timeout: Duration,
}

/// Who a request comes from: the principal, and the `Authorization` value
/// that proved it, kept so that an operation that outlives the check (a
/// subscription) can be checked again.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: Principal,
    authorization: Option<Arc<str>>,
}

/// The pipeline; cheap to clone, shared by every transport.
#[derive(Clone)]
pub struct Pipeline {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    auth: Authenticator,
    served: arc_swap::ArcSwap<Served>,
    status: DefinitionsStatus,
    options: PipelineOptions,
    persisted: Arc<Persisted>,
}

impl Pipeline {
    /// A pipeline serving `served` from `store`, authenticating with
    /// `auth`; `status` is the state of the definitions that
    /// `Query.definitions` reports; `persisted` the persisted documents.
    pub fn new(
        store: Store,
        auth: Authenticator,
        served: Served,
        status: DefinitionsStatus,
        options: PipelineOptions,
        persisted: Arc<Persisted>,
    ) -> Pipeline {
        Pipeline {
            inner: Arc::new(Inner {
                store,
                auth,
                served: arc_swap::ArcSwap::from_pointee(served),
                status,
                options,
                persisted,
            }),
        }
    }

    /// The persisted documents this pipeline runs.
    pub fn persisted(&self) -> &Persisted {
        &self.inner.persisted
    }

    /// The schema and what goes with it, for the definitions served now.
    pub fn served(&self) -> Arc<Served> {
        self.inner.served.load_full()
    }

    /// Serves `served` from now on; requests under way finish on theirs.
    pub fn serve(&self, served: Served) {
        self.inner.served.store(Arc::new(served));
    }

    /// Whether requests need an API token.
    pub fn auth_enabled(&self) -> bool {
        self.inner.auth.enabled()
    }

    /// Step 1: the caller of a request with this `Authorization` value
    /// (`Bearer <token>`). With auth off, everyone is unrestricted.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, Refusal> {
        let principal = self
            .inner
            .auth
            .authenticate(authorization)
            .await
            .map_err(Refusal::unauthenticated)?;
        Ok(Caller {
            principal,
            authorization: authorization.map(Arc::from),
        })
    }

    /// Steps 2 to 7 for `request` from `caller` over `transport`.
    pub fn prepare(
        &self,
        request: GraphqlRequest,
        caller: &Caller,
        transport: Transport,
    ) -> Result<Prepared, Refusal> {
        let options = self.inner.options;
        let served = self.served();
        let trusted = caller.principal.token.is_some()
            && caller
                .principal
                .allows(crate::ANY_DATASTORE, crate::auth::Access::Admin);
        let query = self
            .inner
            .persisted
            .resolve(
                request.query,
                request.document_id.as_deref(),
                &request.extensions,
                trusted,
            )?
            .query;
        let parsed = served
            .documents
            .parse(&query)
            .map_err(|error| Refusal::invalid(&[error], |_| "GRAPHQL_PARSE_FAILED"))?;
        let document = &parsed.document;
        let requested = request.operation_name.as_deref();
        let authorized = authorize(
            document,
            requested,
            &caller.principal,
            &served.access,
            options.introspection,
        )
        .map_err(Refusal::forbidden)?;
        let selected = select_operation(document, requested);
        let mut operation_name = request.operation_name.clone();
        let mut kind = None;
        if let Some((name, definition)) = selected {
            if operation_name.is_none() {
                operation_name = name.map(str::to_string);
            }
            kind = Some(definition.node.ty);
            allowed_over(definition.node.ty, transport)?;
            missing_variables(&definition.node, &request.variables)?;
        }
        let direct = direct_form(&served, &parsed, requested).is_some();
        let as_text = direct_form(&served, &parsed, requested).and_then(Direct::text_variable);
        let variables = request
            .variables
            .values(as_text)
            .map_err(|_| params::not_an_object("variables"))?;
        check_limits(document, requested, &variables, options.limits)
            .map_err(|error| Refusal::invalid(&[error], |_| "GRAPHQL_VALIDATION_FAILED"))?;
        let schema = if authorized.introspects {
            served
                .introspection_schema(&caller.principal, options.limits)
                .map_err(|error| {
                    tracing::error!(%error, "cannot build the schema of a token's datastores");
                    Refusal::internal()
                })?
        } else {
            served.schema.clone()
        };
        let cacheability = caching::of(document, requested, &served.defs);
        let mut graphql = async_graphql::Request::new(query);
        graphql.operation_name = request.operation_name;
        graphql.extensions = request.extensions;
        graphql.variables = variables;
        Ok(Prepared {
            pipeline: self.clone(),
            served,
            parsed,
            schema,
            request: graphql,
            texts: request.variables,
            direct,
            kind,
            operation_name,
            caller: caller.clone(),
            cacheability,
        })
    }

    /// Checks `caller` again for an operation of `document` that is still
    /// running: its token must still be valid and still allow the
    /// operation. A token store that cannot be read now does not end it.
    async fn recheck(
        &self,
        caller: &Caller,
        served: &Served,
        document: &ExecutableDocument,
        operation: Option<&str>,
    ) -> Result<(), Refusal> {
        if !self.inner.auth.enabled() {
            return Ok(());
        }
        let principal = match self
            .inner
            .auth
            .authenticate(caller.authorization.as_deref())
            .await
        {
            Ok(principal) => principal,
            Err(AuthError::Unavailable) => return Ok(()),
            Err(error) => return Err(Refusal::unauthenticated(error)),
        };
        authorize(
            document,
            operation,
            &principal,
            &served.access,
            self.inner.options.introspection,
        )
        .map(|_| ())
        .map_err(Refusal::forbidden)
    }
}

/// The direct form of the request's document, if it has one that runs
/// the requested operation.
fn direct_form<'p>(
    served: &Served,
    parsed: &'p crate::documents::Parsed,
    requested: Option<&str>,
) -> Option<&'p Direct> {
    parsed
        .direct(|document| Direct::compile(document, &served.defs))
        .filter(|direct| direct.runs(requested))
}

/// Refuses an operation `transport` does not carry.
fn allowed_over(kind: OperationType, transport: Transport) -> Result<(), Refusal> {
    match (transport, kind) {
        (Transport::Get, OperationType::Query) => Ok(()),
        (Transport::Get, _) => Err(Refusal::new(
            RefusalKind::NotAllowedHere,
            "METHOD_NOT_ALLOWED",
            format!("{kind} operations cannot be sent with GET; use POST"),
        )),
        (Transport::Post, OperationType::Subscription) => Err(Refusal::new(
            RefusalKind::Invalid,
            "GRAPHQL_VALIDATION_FAILED",
            "subscriptions are served over the WebSocket endpoint /graphql/ws \
             (protocol graphql-transport-ws)",
        )),
        _ => Ok(()),
    }
}

/// Refuses a request that does not give a required variable (non-null,
/// no default) of `operation`: variable coercion is part of the request.
fn missing_variables(
    operation: &OperationDefinition,
    given: &crate::variables::RequestVariables,
) -> Result<(), Refusal> {
    let errors: Vec<serde_json::Value> = operation
        .variable_definitions
        .iter()
        .filter(|var| !var.node.var_type.node.nullable && var.node.default_value.is_none())
        .filter(|var| given.text(var.node.name.node.as_str()).is_none())
        .map(|var| {
            json!({
                "message": format!(
                    "variable `${}` of required type `{}` was not provided",
                    var.node.name.node, var.node.var_type.node
                ),
                "extensions": {"code": "GRAPHQL_VALIDATION_FAILED"},
            })
        })
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Refusal {
            kind: RefusalKind::Invalid,
            errors,
        })
    }
}

/// The operation a request runs, with its name, if the document names it
/// unambiguously; an unknown name is left for validation to report.
fn select_operation<'d>(
    document: &'d ExecutableDocument,
    name: Option<&str>,
) -> Option<(Option<&'d str>, &'d Positioned<OperationDefinition>)> {
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
