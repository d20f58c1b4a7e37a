//! The `graphql` section of `cellgate.yaml`.

use std::path::PathBuf;

use serde::Deserialize;

/// Persisted documents (requests that name a document by its SHA-256),
/// the trusted-documents mode, and the schema as a federation subgraph.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GraphqlConfig {
    /// A manifest of persisted documents in the format graphql-codegen's
    /// client preset writes (`{"<sha256 hex>": "<document>"}`), read at
    /// start-up and again with the definitions.
    ///
    /// ```yaml
    /// persisted_documents: ./persisted-documents.json
    /// ```
    pub persisted_documents: Option<PathBuf>,
    /// `any` document runs, or `only_persisted`: only the manifest's,
    /// except for tokens with the `*:admin` scope.
    ///
    /// ```yaml
    /// documents: any
    /// ```
    pub documents: cellgate_graphql::DocumentsMode,
    /// Bytes of document text kept for automatic persisted queries
    /// (Apollo's `extensions.persistedQuery`); 0 turns their registration
    /// off.
    ///
    /// ```yaml
    /// apq_cache_bytes: 8388608
    /// ```
    pub apq_cache_bytes: u64,
    /// Serve the schema as an Apollo Federation 2 subgraph: each
    /// datastore's row type an entity keyed by `rowKey`, `_service` and
    /// `_entities` (see the guide, "Use cellgate in a supergraph").
    ///
    /// ```yaml
    /// federation: false
    /// ```
    pub federation: bool,
}

impl Default for GraphqlConfig {
    fn default() -> Self {
        GraphqlConfig {
            persisted_documents: None,
            documents: cellgate_graphql::DocumentsMode::Any,
            apq_cache_bytes: 8 * 1024 * 1024,
            federation: false,
        }
    }
}

impl GraphqlConfig {
    /// The options of the gateway's persisted documents.
    pub fn persisted(&self) -> cellgate_graphql::PersistedOptions {
        cellgate_graphql::PersistedOptions {
            manifest: self.persisted_documents.clone(),
            mode: self.documents,
            apq_bytes: self.apq_cache_bytes,
        }
    }
}
