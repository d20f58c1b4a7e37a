//! What depends on the definitions served: the schema, the schemas of
//! fewer datastores that scoped introspection answers from, the access
//! map and the document cache. A reload replaces it as a whole
//! ([`super::Pipeline::serve`]); a request loads it once and runs on it to
//! the end, so it never mixes a schema with the access map or the cached
//! documents of another.

use std::sync::Arc;

use async_graphql::dynamic::Schema;

use crate::access::{visible_datastores, AccessMap};
use crate::auth::Principal;
use crate::documents::Documents;
use crate::limits::GraphqlLimits;

/// Most schemas of datastore subsets kept for introspection.
const VISIBLE_SCHEMAS: u64 = 64;

/// The schema of one set of definitions and what goes with it.
pub struct Served {
    /// The store's definitions and runtimes the schema was built from;
    /// the request's store calls are pinned to it (`Store::pinned`).
    pub(crate) snapshot: cellgate_store::Snapshot,
    pub(crate) defs: Arc<index_dsl::Definitions>,
    pub(crate) schema: Schema,
    /// Schemas of fewer datastores, by the datastores they show, for
    /// introspection by tokens scoped to those (`access.rs`).
    visible_schemas: moka::sync::Cache<Vec<String>, Schema>,
    /// Parsed documents by text (`limits.document_cache_bytes`), with
    /// whether they passed this schema's validation and their direct form.
    pub(crate) documents: Arc<Documents>,
    pub(crate) access: AccessMap,
    /// Whether the schemas are Federation 2 subgraphs.
    federation: bool,
}

impl Served {
    /// `schema`, built from the definitions of `snapshot`, with the
    /// document cache `documents`.
    pub fn new(
        snapshot: cellgate_store::Snapshot,
        schema: Schema,
        documents: Arc<Documents>,
    ) -> Served {
        let defs = snapshot.definitions();
        Served {
            access: AccessMap::new(&defs),
            snapshot,
            defs,
            schema,
            visible_schemas: moka::sync::Cache::new(VISIBLE_SCHEMAS),
            documents,
            federation: false,
        }
    }

    /// The schema of the definitions `store` serves now, with the
    /// document cache `documents`; with `federation`, a Federation 2
    /// subgraph. Fails on definitions whose names clash in GraphQL.
    pub fn build(
        store: &cellgate_store::Store,
        limits: GraphqlLimits,
        documents: Arc<Documents>,
        federation: bool,
    ) -> cellgate_store::Result<Served> {
        let snapshot = store.snapshot();
        let schema = crate::schema::schema_for(&snapshot.definitions(), limits, federation)?;
        Ok(Served {
            federation,
            ..Served::new(snapshot, schema, documents)
        })
    }

    /// The document cache of this schema.
    pub fn documents(&self) -> &Arc<Documents> {
        &self.documents
    }

    /// The schema `principal` may introspect: the whole one for a token
    /// with a `*` scope (or with auth off), else one of the datastores it
    /// may read, built once per set of datastores.
    pub(crate) fn introspection_schema(
        &self,
        principal: &Principal,
        limits: GraphqlLimits,
    ) -> cellgate_store::Result<Schema> {
        let Some(visible) = visible_datastores(&self.defs, principal) else {
            return Ok(self.schema.clone());
        };
        if let Some(schema) = self.visible_schemas.get(&visible) {
            return Ok(schema);
        }
        let schema =
            crate::schema::build_visible_schema(&self.defs, limits, &visible, self.federation)?;
        self.visible_schemas.insert(visible, schema.clone());
        Ok(schema)
    }
}
