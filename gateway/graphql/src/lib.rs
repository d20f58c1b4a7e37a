//! The typed GraphQL API of a cellgate store: the schema generated at
//! start-up from the definitions, who a request comes from (`auth`) and
//! what it may do, the limits checked before execution, and the compiled
//! form of the commonest read.
//!
//! Only this crate knows async-graphql, and it knows no HTTP: the
//! `cellgate` gateway turns requests into [`async_graphql::Request`]s and
//! the answers into responses. `build_schema` (in `schema/`)
//! turns the definitions into a dynamic schema; `execute` runs one request
//! with its per-request data: the store and a DataLoader (`loaders.rs`)
//! that batches cell reads per cluster. `scalars.rs` holds the custom scalars,
//! `ids.rs` the ID fields, `errors.rs` the mapping of store errors to stable codes, and `limits.rs`
//! the depth and complexity limits (introspection counted apart),
//! `documents.rs` the cache of parsed documents, `consistency.rs` where
//! reads may be served (master, replica, read tokens), `variables.rs` a
//! request's variables kept as JSON text until needed, and `direct.rs` the
//! compiled form of index reads and writes, which answers them without the
//! executor. `pipeline/` puts them together: the one path every transport
//! sends a request through (authentication, parsing, authorization,
//! limits, the direct form, execution), so HTTP and WebSocket differ only
//! in bytes, status codes and frames.

mod access;
mod args;
pub mod auth;
mod buffer;
mod consistency;
mod definitions;
mod direct;
mod documents;
mod errors;
mod fields;
mod ids;
mod limits;
mod loaders;
mod maintenance;
mod names;
mod pipeline;
mod scalars;
mod schema;
mod triggers;
mod variables;
mod verify;

use async_graphql::dataloader::DataLoader;

pub use access::ANY_DATASTORE;
pub use definitions::{DefinitionsState, DefinitionsStatus, LastReload, ReloadResult};
pub use documents::Documents;
pub use limits::GraphqlLimits;
pub use names::{camel, pascal};
pub use pipeline::{
    complete_answer, Cacheability, Caller, DocumentsMode, Executed, GraphqlRequest, Manifest,
    Persisted, PersistedCounts, PersistedOptions, Pipeline, PipelineOptions, Prepared, Refusal,
    RefusalKind, Served, Subscription, Transport,
};
pub use schema::diff::{diff_sdl, Criticality, SchemaChange};
pub use schema::{build_schema, sdl, subgraph_sdl};
pub use variables::RequestVariables;

use cellgate_store::Store;

/// Runs a subscription of `request` for `principal` (already
/// authorized): a stream of responses, one per event.
pub(crate) fn execute_stream(
    schema: &async_graphql::dynamic::Schema,
    store: &Store,
    principal: crate::auth::Principal,
    request: async_graphql::Request,
) -> impl async_graphql::futures_util::Stream<Item = async_graphql::Response> + Send + 'static {
    let request = request.data(store.clone()).data(principal);
    schema.execute_stream(request)
}

/// Runs one GraphQL request against the schema for `principal` (whose
/// access the pipeline has checked; resolvers use it to list only the
/// datastores it may read).
pub(crate) async fn execute(
    schema: &async_graphql::dynamic::Schema,
    store: &Store,
    principal: crate::auth::Principal,
    request: async_graphql::Request,
) -> async_graphql::Response {
    let served = consistency::Served::default();
    let loader: loaders::Cells = DataLoader::with_cache(
        loaders::CellLoader {
            store: store.clone(),
            served: served.clone(),
        },
        tokio::spawn,
        async_graphql::dataloader::HashMapCache::default(),
    );
    let request = request
        .data(store.clone())
        .data(loader)
        .data(principal)
        .data(served.clone());
    let mut response = schema.execute(request).await;
    if let Some(served) = served.extension() {
        response.extensions.insert("servedBy".to_string(), served);
    }
    response
}
