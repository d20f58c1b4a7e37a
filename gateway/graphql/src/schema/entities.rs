//! Apollo Federation: with `graphql.federation` on, the schema is a
//! Federation 2 subgraph. Each datastore's row type (`TripsRow`) is an
//! entity with `@key(fields: "rowKey")`: a row key is the one key every
//! row has, and it names the row on every cluster. Index entry types are
//! not entities: an index entry is not unique by any key a client holds
//! (the same row may have several entries, one per cell version the index
//! keeps), and its row is reachable through the entry's `row` field.
//!
//! `_entities` resolves each representation to its row the way `row`
//! does, without a read of its own: the row's selected columns go through
//! the per-request cell loader, which reads them for all representations
//! at once (one statement per cluster), as for `rows`. Like `row`, a row
//! key with no cells is a row whose columns are null. A representation
//! that is malformed, not of an entity, or of a datastore the token may not
//! read fails the whole field, naming its position (async-graphql's dynamic
//! schema resolves `[_Entity]` items only to typed values, so one item
//! cannot be null with an error of its own).

use std::collections::HashMap;
use std::sync::Arc;

use async_graphql::dynamic::{FieldFuture, FieldValue, ResolverContext};
use async_graphql::Value;
use index_dsl::Definitions;
use uuid::Uuid;

use super::datastore::{RowRef, MAX_ROWS};
use super::DatastoreTypes;
use crate::auth::{Access, Principal};
use crate::consistency::ReadSpec;
use crate::errors::coded;

/// An entity type: its datastore.
struct Entity {
    datastore: Arc<str>,
}

/// The entity types of `defs` by type name.
#[derive(Clone)]
pub(super) struct Entities(Arc<HashMap<String, Entity>>);

impl Entities {
    pub(super) fn new(defs: &Definitions) -> Entities {
        let types = defs
            .datastores
            .iter()
            .map(|d| {
                let entity = Entity {
                    datastore: Arc::from(d.name.as_str()),
                };
                (DatastoreTypes::new(d).row, entity)
            })
            .collect();
        Entities(Arc::new(types))
    }

    /// The resolver of `_entities`.
    pub(super) fn resolve<'a>(&self, ctx: ResolverContext<'a>) -> FieldFuture<'a> {
        let entities = self.clone();
        FieldFuture::new(async move {
            let representations = ctx.args.try_get("representations")?.list()?;
            if representations.len() > MAX_ROWS {
                return Err(coded(
                    "LIMIT_EXCEEDED",
                    format!(
                        "at most {MAX_ROWS} representations per request (got {})",
                        representations.len()
                    ),
                ));
            }
            let principal = ctx.data::<Principal>()?;
            let mut values = Vec::with_capacity(representations.len());
            for (position, representation) in representations.iter().enumerate() {
                let (type_name, row_key) = entities
                    .representation(representation.as_value(), principal)
                    .map_err(|(code, message)| {
                        coded(code, format!("representation {position}: {message}"))
                    })?;
                values.push(
                    FieldValue::owned_any(RowRef {
                        row_key,
                        read: ReadSpec::default(),
                        prefetched: None,
                    })
                    .with_type(type_name.to_string()),
                );
            }
            Ok(Some(FieldValue::list(values)))
        })
    }

    /// The entity a representation names, if it is one `principal` may
    /// read.
    fn representation<'e>(
        &'e self,
        value: &Value,
        principal: &Principal,
    ) -> Result<(&'e str, Uuid), (&'static str, String)> {
        let bad = |message: String| ("BAD_REQUEST", message);
        let Value::Object(fields) = value else {
            return Err(bad("a representation must be an object".into()));
        };
        let Some(Value::String(type_name)) = fields.get("__typename") else {
            return Err(bad("a representation needs its `__typename`".into()));
        };
        let Some((name, entity)) = self.0.get_key_value(type_name.as_str()) else {
            return Err(bad(format!(
                "`{type_name}` is not an entity of this subgraph"
            )));
        };
        if !principal.allows(&entity.datastore, Access::Read) {
            return Err((
                "FORBIDDEN",
                format!("the token may not read `{}`", entity.datastore),
            ));
        }
        let row_key = match fields.get("rowKey") {
            Some(Value::String(text)) => Uuid::parse_str(text)
                .map_err(|_| bad(format!("`rowKey` of a `{type_name}` must be a UUID")))?,
            Some(Value::Null) | None => {
                return Err(bad(format!(
                    "a `{type_name}` representation needs its `rowKey`"
                )))
            }
            Some(_) => {
                return Err(bad(format!(
                    "`rowKey` of a `{type_name}` must be a UUID (a string)"
                )))
            }
        };
        Ok((name, row_key))
    }
}
