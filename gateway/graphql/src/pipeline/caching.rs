//! What an HTTP cache may do with an answer, from what the operation
//! reads. A cell named by its full key (row, column, ref key) never changes
//! (cells are immutable), so an answer built only from such cells, every
//! one found, is the same forever; anything else (a row's latest cells, an
//! index page, the log, metadata) may change and must be revalidated.

use async_graphql::parser::types::{ExecutableDocument, OperationType, Selection, SelectionSet};
use index_dsl::Definitions;
use serde_json::Value;

use super::select_operation;
use crate::names::camel;

/// How the answer to a request may be cached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cacheability {
    /// Read only cells named by their full key: the answer never changes
    /// once each of them was found ([`complete`] tells).
    Immutable,
    /// A query whose answer may change: cached only if revalidated.
    Revalidate,
    /// Not a query (or no operation can be told): never cached.
    NoStore,
}

/// The cacheability of the operation `requested` of `document`.
pub(crate) fn of(
    document: &ExecutableDocument,
    requested: Option<&str>,
    defs: &Definitions,
) -> Cacheability {
    let Some((_, operation)) = select_operation(document, requested) else {
        return Cacheability::NoStore;
    };
    if operation.node.ty != OperationType::Query {
        return Cacheability::NoStore;
    }
    let datastores: Vec<String> = defs.datastores.iter().map(|d| camel(&d.name)).collect();
    let mut cells = 0;
    let immutable = only(&operation.node.selection_set.node, |field| {
        if !datastores.iter().any(|d| d == field.name.node.as_str()) {
            return false;
        }
        only(&field.selection_set.node, |inner| {
            let full_key = inner.name.node == "cell"
                && ["rowKey", "column", "refKey"]
                    .iter()
                    .all(|a| inner.get_argument(a).is_some());
            cells += usize::from(full_key);
            full_key
        })
    });
    if immutable && cells > 0 {
        Cacheability::Immutable
    } else {
        Cacheability::Revalidate
    }
}

/// Whether every selection of `set` is a field (no fragments) that is
/// `__typename` or passes `check`.
fn only(
    set: &SelectionSet,
    mut check: impl FnMut(&async_graphql::parser::types::Field) -> bool,
) -> bool {
    set.items.iter().all(|item| match &item.node {
        Selection::Field(field) => field.node.name.node == "__typename" || check(&field.node),
        Selection::FragmentSpread(_) | Selection::InlineFragment(_) => false,
    })
}

/// Whether an [`Cacheability::Immutable`] operation's answer `body` found
/// every cell it asked for: `data` holds, under each datastore field, no
/// `null`, and there are no `errors`.
pub fn complete(body: &[u8]) -> bool {
    let Ok(Value::Object(answer)) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    if answer.contains_key("errors") {
        return false;
    }
    let Some(Value::Object(data)) = answer.get("data") else {
        return false;
    };
    data.values().all(|datastore| match datastore {
        Value::String(_) => true,
        Value::Object(cells) => cells.values().all(|cell| !cell.is_null()),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defs() -> Definitions {
        index_dsl::load_files(
            std::path::Path::new("d"),
            [(
                "trips/datastore.yaml",
                "name: trips\nshards: 8\ncolumns:\n  - name: BASE\n",
            )],
        )
        .unwrap()
    }

    fn cacheability(text: &str) -> Cacheability {
        let document = async_graphql::parser::parse_query(text).unwrap();
        of(&document, None, &defs())
    }

    #[test]
    fn only_full_key_cell_reads_are_immutable() {
        let cell = "cell(rowKey: $r, column: BASE, refKey: 1) { body }";
        assert_eq!(
            cacheability(&format!(
                "query($r: UUID!) {{ trips {{ a: {cell} b: {cell} __typename }} }}"
            )),
            Cacheability::Immutable
        );
        for other in [
            "query($r: UUID!) { trips { latestCell(rowKey: $r, column: BASE) { body } } }",
            "query($r: UUID!) { trips { cell(rowKey: $r, column: BASE, refKey: 1) { body } row(rowKey: $r) { rowKey } } }",
            "query($r: UUID!) { trips { ...F } } fragment F on TripsQuery { cell(rowKey: $r, column: BASE, refKey: 1) { body } }",
            "query($r: UUID!) { trips { cell(rowKey: $r, column: BASE, refKey: 1) { body } } datastores { name } }",
            "{ trips { __typename } }",
        ] {
            assert_eq!(cacheability(other), Cacheability::Revalidate, "{other}");
        }
        assert_eq!(
            cacheability("mutation { trips { __typename } }"),
            Cacheability::NoStore
        );
    }

    #[test]
    fn an_answer_is_complete_when_every_cell_was_found() {
        assert!(complete(
            br#"{"data":{"trips":{"a":{"body":{}},"__typename":"TripsQuery"}}}"#
        ));
        assert!(!complete(
            br#"{"data":{"trips":{"a":{"body":{}},"b":null}}}"#
        ));
        assert!(!complete(
            br#"{"data":{"trips":{"a":{}}},"errors":[{"message":"x"}]}"#
        ));
        assert!(!complete(br#"{"data":null}"#));
    }
}
