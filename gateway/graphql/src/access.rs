//! Which access an operation needs, checked against the caller's scopes
//! before anything runs.
//!
//! Every datastore is one root field of `Query` (`<ds>`, which needs
//! `read`; its `indexStatus`, `maintenance`, `quarantine`, `buffer`,
//! `bufferConflicts`, `storage`, `triggers` and `indexVerify` need `admin`)
//! and four of `Mutation` (`<ds>PutCells`: `write`;
//! `<ds>RetryQuarantine`, `<ds>RetryTriggerQuarantine` and `<ds>VerifyIndexes`:
//! `admin`), and one of `Subscription`
//! (`<ds>Cells`: `read`); `Query.definitions` (the state of the
//! definitions, `definitions.rs`) needs `*:admin`. The check walks the root fields of the
//! operation (through fragments, each fragment once per level, so the walk
//! is linear in the document) and refuses the whole request with
//! `FORBIDDEN` when any field needs what the caller lacks. It runs before
//! validation on purpose: a field of a datastore that does not exist is
//! refused with the same message as one the caller may not see, so a token
//! cannot probe which datastores exist; only a token with a `*` scope gets
//! validation's "unknown field". For the same reason introspection by a
//! token without a `*` scope is answered from a schema of the datastores
//! it may read ([`Authorized::introspects`], [`visible_datastores`]).

use std::collections::{HashMap, HashSet};

use async_graphql::parser::types::{
    DocumentOperations, ExecutableDocument, OperationDefinition, OperationType, Selection,
    SelectionSet,
};

use super::camel;
use crate::auth::{Access, Principal};

/// The datastore behind each root field name.
#[derive(Debug, Clone, Default)]
pub struct AccessMap {
    query: HashMap<String, String>,
    mutation: HashMap<String, (String, Access)>,
    subscription: HashMap<String, String>,
}

/// What the root fields of no particular datastore are checked against:
/// only `*` scopes allow it.
pub const ANY_DATASTORE: &str = "*";

/// Fields of `<Ds>Query` that need `admin`.
const ADMIN_QUERY_FIELDS: [&str; 8] = super::maintenance::QUERY_FIELDS;

impl AccessMap {
    /// The root fields of the schema generated for `defs`.
    pub fn new(defs: &index_dsl::Definitions) -> AccessMap {
        let mut map = AccessMap::default();
        for datastore in &defs.datastores {
            let field = camel(&datastore.name);
            map.mutation.insert(
                format!("{field}PutCells"),
                (datastore.name.clone(), Access::Write),
            );
            map.mutation.insert(
                format!("{field}RetryQuarantine"),
                (datastore.name.clone(), Access::Admin),
            );
            map.mutation.insert(
                super::triggers::retry_field_name(&datastore.name),
                (datastore.name.clone(), Access::Admin),
            );
            map.mutation.insert(
                super::verify::mutation_name(&datastore.name),
                (datastore.name.clone(), Access::Admin),
            );
            map.subscription
                .insert(format!("{field}Cells"), datastore.name.clone());
            map.query.insert(field, datastore.name.clone());
        }
        // IDs belong to no datastore: they need a scope on every datastore
        // (`*:read` to take them, `*:admin` to create a biz tag).
        for field in super::ids::QUERY_FIELDS {
            map.query
                .insert(field.to_string(), ANY_DATASTORE.to_string());
        }
        map.mutation.insert(
            super::ids::CREATE_TAG.to_string(),
            (ANY_DATASTORE.to_string(), Access::Admin),
        );
        map
    }
}

/// Why an operation is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denied {
    pub message: String,
}

/// What an allowed operation reads beyond its datastores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Authorized {
    /// It selects `__schema` or `__type`: a caller without a `*` scope is
    /// then answered from a schema of the datastores it may read
    /// ([`visible_datastores`]), so introspection tells a token no more
    /// than `Query.datastores` does.
    pub introspects: bool,
}

/// The datastores of `defs` whose schema `principal` may see; `None` when
/// it may see them all.
pub fn visible_datastores(
    defs: &index_dsl::Definitions,
    principal: &Principal,
) -> Option<Vec<String>> {
    if principal.scopes.covers_every_datastore() {
        return None;
    }
    Some(
        defs.datastores
            .iter()
            .filter(|d| principal.allows(&d.name, Access::Read))
            .map(|d| d.name.clone())
            .collect(),
    )
}

/// Checks that `principal` may run the operation of `document` named
/// `operation_name` (every operation when the name selects none, which
/// execution then refuses anyway). `introspection` says whether
/// `__schema`/`__type` are answered at all.
pub fn authorize(
    document: &ExecutableDocument,
    operation_name: Option<&str>,
    principal: &Principal,
    map: &AccessMap,
    introspection: bool,
) -> Result<Authorized, Denied> {
    let operations: Vec<&OperationDefinition> = match (&document.operations, operation_name) {
        (DocumentOperations::Single(op), _) => vec![&op.node],
        (DocumentOperations::Multiple(ops), Some(name)) => match ops.get(name) {
            Some(op) => vec![&op.node],
            None => ops.values().map(|op| &op.node).collect(),
        },
        (DocumentOperations::Multiple(ops), None) => ops.values().map(|op| &op.node).collect(),
    };
    let mut check = Check {
        document,
        principal,
        map,
        introspection,
        introspects: false,
        seen: HashSet::new(),
    };
    for operation in operations {
        check.root(operation.ty, &operation.selection_set.node)?;
    }
    Ok(Authorized {
        introspects: check.introspects,
    })
}

struct Check<'d> {
    document: &'d ExecutableDocument,
    principal: &'d Principal,
    map: &'d AccessMap,
    introspection: bool,
    /// Whether a root field is `__schema` or `__type`.
    introspects: bool,
    /// Fragments already checked, with the place they were spread in
    /// (the root, or the fields of a datastore).
    seen: HashSet<(&'d str, Option<&'d str>, u8)>,
}

impl<'d> Check<'d> {
    fn root(&mut self, ty: OperationType, set: &'d SelectionSet) -> Result<(), Denied> {
        for selection in &set.items {
            match &selection.node {
                Selection::Field(field) => {
                    let name = field.node.name.node.as_str();
                    match name {
                        "__typename" => {}
                        "__schema" | "__type" => {
                            self.introspects = true;
                            if !self.introspection {
                                return Err(Denied {
                                    message: "introspection is disabled on this server".into(),
                                });
                            }
                        }
                        // Lists only the datastores the caller may read.
                        "datastores" if ty == OperationType::Query => {}
                        // A subgraph's: scopes are checked per entity's
                        // datastore; the SDL shows every datastore.
                        "_entities" if ty == OperationType::Query => {}
                        "_service" if ty == OperationType::Query => {
                            self.need(ANY_DATASTORE, Access::Read)?
                        }
                        crate::definitions::QUERY_FIELD if ty == OperationType::Query => {
                            self.need(ANY_DATASTORE, Access::Admin)?
                        }
                        _ => self.root_field(ty, name, &field.node.selection_set.node)?,
                    }
                }
                Selection::InlineFragment(fragment) => {
                    self.root(ty, &fragment.node.selection_set.node)?
                }
                Selection::FragmentSpread(spread) => {
                    let name = spread.node.fragment_name.node.as_str();
                    if let Some(fragment) = self.document.fragments.get(name) {
                        if self.seen.insert((name, None, kind(ty))) {
                            self.root(ty, &fragment.node.selection_set.node)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn root_field(
        &mut self,
        ty: OperationType,
        name: &'d str,
        set: &'d SelectionSet,
    ) -> Result<(), Denied> {
        match ty {
            OperationType::Query => {
                let datastore = self.map.query.get(name).map_or(name, String::as_str);
                self.need(datastore, Access::Read)?;
                self.datastore_fields(datastore, set)
            }
            OperationType::Mutation => match self.map.mutation.get(name) {
                Some((datastore, access)) => self.need(datastore, *access),
                // An unknown mutation: named like a datastore's, so that
                // the answer does not depend on whether it exists.
                None => {
                    let datastore = name
                        .strip_suffix("PutCells")
                        .or_else(|| name.strip_suffix("RetryTriggerQuarantine"))
                        .or_else(|| name.strip_suffix("RetryQuarantine"))
                        .or_else(|| name.strip_suffix("VerifyIndexes"))
                        .unwrap_or(name);
                    self.need(datastore, Access::Write)
                }
            },
            OperationType::Subscription => {
                let datastore = self.map.subscription.get(name).map_or(name, String::as_str);
                self.need(datastore, Access::Read)
            }
        }
    }

    /// The admin fields under a datastore's query field.
    fn datastore_fields(
        &mut self,
        datastore: &'d str,
        set: &'d SelectionSet,
    ) -> Result<(), Denied> {
        for selection in &set.items {
            match &selection.node {
                Selection::Field(field) => {
                    if ADMIN_QUERY_FIELDS.contains(&field.node.name.node.as_str()) {
                        self.need(datastore, Access::Admin)?;
                    }
                }
                Selection::InlineFragment(fragment) => {
                    self.datastore_fields(datastore, &fragment.node.selection_set.node)?
                }
                Selection::FragmentSpread(spread) => {
                    let name = spread.node.fragment_name.node.as_str();
                    if let Some(fragment) = self.document.fragments.get(name) {
                        if self
                            .seen
                            .insert((name, Some(datastore), kind(OperationType::Query)))
                        {
                            self.datastore_fields(datastore, &fragment.node.selection_set.node)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn need(&self, datastore: &str, access: Access) -> Result<(), Denied> {
        if self.principal.allows(datastore, access) {
            Ok(())
        } else {
            Err(Denied {
                message: format!(
                    "this token may not {} datastore `{datastore}`",
                    match access {
                        Access::Read => "read",
                        Access::Write => "write to",
                        Access::Admin => "administer",
                    }
                ),
            })
        }
    }
}

/// A hashable stand-in for an operation type.
fn kind(ty: OperationType) -> u8 {
    match ty {
        OperationType::Query => 0,
        OperationType::Mutation => 1,
        OperationType::Subscription => 2,
    }
}

#[cfg(test)]
mod tests {
    use async_graphql::parser::parse_query;

    use super::*;
    use crate::auth::Scopes;

    fn map() -> AccessMap {
        let mut map = AccessMap::default();
        map.query.insert("trips".into(), "trips".into());
        map.mutation
            .insert("tripsPutCells".into(), ("trips".into(), Access::Write));
        map.mutation.insert(
            "tripsRetryQuarantine".into(),
            ("trips".into(), Access::Admin),
        );
        map
    }

    fn allowed(scopes: &[&str], query: &str) -> bool {
        let principal = Principal {
            token: Some("t".into()),
            scopes: Scopes::parse(scopes).unwrap(),
        };
        let document = parse_query(query).unwrap();
        authorize(&document, None, &principal, &map(), true).is_ok()
    }

    #[test]
    fn each_kind_of_field_needs_its_access() {
        let read = "{ trips { row(rowKey: \"x\") { rowKey } } }";
        let admin_read = "{ trips { quarantine { rowKey } } }";
        let write = "mutation { tripsPutCells(cells: []) { status } }";
        let admin = "mutation { tripsRetryQuarantine { retried } }";
        assert!(allowed(&["trips:read"], read));
        assert!(!allowed(&["trips:read"], admin_read));
        assert!(!allowed(&["trips:read"], write));
        assert!(allowed(&["trips:write"], write));
        assert!(!allowed(&["trips:write"], admin));
        assert!(allowed(&["trips:admin"], admin));
        assert!(allowed(&["trips:admin"], admin_read));
        for buffer in [
            "{ trips { buffer { conflicts } } }",
            "{ trips { bufferConflicts { rowKey } } }",
            "{ trips { storage { name breakers { state } } } }",
        ] {
            assert!(!allowed(&["trips:write"], buffer), "{buffer}");
            assert!(allowed(&["trips:admin"], buffer), "{buffer}");
        }
        assert!(!allowed(&["payments:admin"], read));
        assert!(allowed(&["*:read"], read));
        assert!(allowed(
            &["payments:read"],
            "{ datastores { name } __typename }"
        ));
    }

    #[test]
    fn the_definitions_status_needs_admin_of_every_datastore() {
        let status = "{ definitions { latest } }";
        assert!(!allowed(&["trips:admin", "payments:admin"], status));
        assert!(!allowed(&["*:read"], status));
        assert!(allowed(&["*:admin"], status));
        let hidden = "query { ...A } fragment A on Query { definitions { latest } }";
        assert!(!allowed(&["*:write"], hidden));
    }

    #[test]
    fn fragments_do_not_hide_fields() {
        let hidden = "query { ...A } fragment A on Query { ... on Query { trips { ...B } } } fragment B on TripsQuery { maintenance { x } }";
        assert!(!allowed(&["trips:read"], hidden));
        assert!(allowed(&["trips:admin"], hidden));
    }

    #[test]
    fn unknown_and_hidden_datastores_look_the_same() {
        let principal = Principal {
            token: Some("t".into()),
            scopes: Scopes::parse(&["trips:read"]).unwrap(),
        };
        let refusal = |query: &str| {
            let document = parse_query(query).unwrap();
            authorize(&document, None, &principal, &map(), true)
                .unwrap_err()
                .message
                .replace("payments", "NAME")
                .replace("nosuch", "NAME")
        };
        assert_eq!(
            refusal("{ payments { rowKey } }"),
            refusal("{ nosuch { rowKey } }")
        );
        assert_eq!(
            refusal("mutation { paymentsPutCells(cells: []) { status } }"),
            refusal("mutation { nosuchPutCells(cells: []) { status } }")
        );
    }
}
