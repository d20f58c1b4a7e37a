//! Where reads are served: the `consistency` and `readAfter` arguments of
//! every read field, the `Consistency` enum, and the `servedBy` response
//! extension naming the replicas that answered.
//!
//! A field's arguments become a [`ReadSpec`]; the cells under it (a `row`
//! of an index entry, the columns of `rows`) are read with the same spec,
//! through the cell loader, which batches reads of one spec together. Every
//! store read of a request shares the request's [`Served`] record, which
//! [`crate::execute`] and the compiled reads turn into
//! `extensions.servedBy` when a replica answered part of the request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use async_graphql::dynamic::{Enum, EnumItem, InputValue, TypeRef};
use async_graphql::Value;

use crate::errors::{bad_input, from_store};
use cellgate_store::replicas::{Consistency, ReadOptions, ReadToken};

/// The GraphQL enum of [`Consistency`].
pub(crate) const CONSISTENCY: &str = "Consistency";

/// The argument names every read field takes.
pub(crate) const ARGUMENTS: [&str; 2] = ["consistency", "readAfter"];

pub(crate) fn consistency_enum() -> Enum {
    Enum::new(CONSISTENCY)
        .description("Which database node may serve a read.")
        .item(EnumItem::new("MASTER").description(
            "the cluster's master: sees every acknowledged write (the default); \
             a replica only when the master's circuit breaker is open",
        ))
        .item(EnumItem::new("REPLICA").description(
            "any healthy replica within `storage.max_replica_lag_ms`, the master when none is; \
             may miss recent writes (the response's `extensions.servedBy` says which replica answered)",
        ))
}

/// The `consistency` and `readAfter` arguments of a read field.
pub(crate) fn arguments() -> [InputValue; 2] {
    [
        InputValue::new("consistency", TypeRef::named_nn(CONSISTENCY))
            .default_value(Value::Enum(async_graphql::Name::new("MASTER"))),
        InputValue::new("readAfter", TypeRef::named(TypeRef::STRING)).description(
            "the `readToken` of an earlier write: the read may then be served by a replica \
             that has applied that write, and by the master otherwise. Index entries follow \
             their cells after the commit, so an index page is read from a replica only \
             with `consistency: REPLICA`; its rows' cells honour the token",
        ),
    ]
}

/// How one field's reads may be served: hashable, so the cell loader can
/// batch the reads of one spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub(crate) struct ReadSpec {
    pub(crate) consistency: Consistency,
    pub(crate) after: Option<Arc<ReadToken>>,
}

impl ReadSpec {
    /// The spec of a field's (coerced) arguments, for `datastore`: a
    /// `readAfter` that is not a token of this datastore is refused.
    pub(crate) fn of(
        args: &crate::args::Arguments,
        datastore: &str,
    ) -> async_graphql::Result<ReadSpec> {
        let consistency = match args.get("consistency") {
            None | Some(Value::Null) => Consistency::Master,
            Some(Value::Enum(name)) if name.as_str() == "MASTER" => Consistency::Master,
            Some(Value::Enum(name)) if name.as_str() == "REPLICA" => Consistency::Replica,
            Some(Value::String(name)) if name == "MASTER" => Consistency::Master,
            Some(Value::String(name)) if name == "REPLICA" => Consistency::Replica,
            Some(_) => return Err(bad_input("`consistency` is MASTER or REPLICA")),
        };
        let after = match args.get("readAfter") {
            None | Some(Value::Null) => None,
            Some(Value::String(text)) => {
                let token = ReadToken::decode(text).map_err(|e| from_store(&e))?;
                if token.datastore != datastore {
                    return Err(bad_input(format!(
                        "`readAfter` is a token of datastore `{}`, not `{datastore}`",
                        token.datastore
                    )));
                }
                Some(Arc::new(token))
            }
            Some(_) => return Err(bad_input("`readAfter` must be a string")),
        };
        Ok(ReadSpec { consistency, after })
    }

    /// The store's options for this spec, recording into `served`.
    pub(crate) fn options(&self, served: &Served) -> ReadOptions {
        ReadOptions {
            consistency: self.consistency,
            after: self.after.as_deref().cloned(),
            served: served.0.clone(),
        }
    }
}

/// The replicas that served a request's reads (`node → possibly stale`).
#[derive(Debug, Clone, Default)]
pub struct Served(Arc<Mutex<BTreeMap<String, bool>>>);

impl Served {
    /// The `servedBy` extension, or `None` when only masters answered.
    pub fn extension(&self) -> Option<Value> {
        let served = self.0.lock().expect("served");
        if served.is_empty() {
            return None;
        }
        Some(Value::List(
            served
                .iter()
                .map(|(node, stale)| {
                    Value::Object(
                        [
                            (
                                async_graphql::Name::new("node"),
                                Value::String(node.clone()),
                            ),
                            (
                                async_graphql::Name::new("possiblyStale"),
                                Value::Boolean(*stale),
                            ),
                        ]
                        .into_iter()
                        .collect(),
                    )
                })
                .collect(),
        ))
    }
}
