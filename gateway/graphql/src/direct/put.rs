//! Direct answers to a write: `mutation ($cells: [<Ds>CellInput!]!) {
//! <ds>PutCells(cells: $cells) { … } }`.
//!
//! On the executor's path a write of 50 cells spent about a quarter of the
//! gateway's CPU outside the store: validating the document again,
//! resolving five fields of every result through boxed futures, and
//! converting each cell's input object field by field through
//! `ValueAccessor`s. Here the cells are read from the variable once, the
//! store writes them (`Store::put_cells_with_token`, as the resolver
//! does) and the response is built from the results.
//!
//! Only this shape is taken: the operation declares exactly one variable,
//! `[<Ds>CellInput!]!` without a default, passed as the field's only
//! argument; the field selects the scalar fields of `PutCellResult` and
//! `error { code message retryable }`, aliased or not, without directives
//! or `__typename`. A request whose variable is not a list of complete,
//! well-typed cell objects (a missing or unknown member, a column the
//! datastore lacks, a key that is not a UUID, a null body, a single object
//! where a list belongs) goes to async-graphql, which reports the error as
//! before. A refused cell and a failed call are answered here as the
//! resolver and the executor answer them, a cell's values and its reported
//! error coming from the resolver's own `PutOutcome` (`schema/put.rs`):
//! writing is not repeated.

use std::collections::HashSet;
use std::sync::Arc;

use async_graphql::indexmap::IndexMap;
use async_graphql::parser::types::{BaseType, Field, OperationDefinition, Selection};
use async_graphql::{Name, PathSegment, Pos, Positioned, Value, Variables};
use index_dsl::Definitions;
use uuid::Uuid;

use super::Answer;
use crate::errors::from_store;
use crate::names::{camel, pascal};
use crate::scalars::{int64_of, json_from_value};
use crate::schema::PutOutcome;
use cellgate_store::cells::NewCell;
use cellgate_store::Store;

/// Members of a cell input object.
const CELL_MEMBERS: usize = 4;

/// A compiled `<ds>PutCells`.
#[derive(Debug)]
pub(super) struct PutCells {
    /// The variable holding the cells.
    variable: Name,
    datastore: Arc<str>,
    /// The datastore's columns: the names of its column enum.
    columns: HashSet<String>,
    /// The field's response key and its place (error locations).
    key: Name,
    pos: Pos,
    selection: Vec<(Name, ResultField)>,
}

/// A selected field of `PutCellResult`.
#[derive(Debug)]
enum ResultField {
    RowKey,
    Column,
    RefKey,
    Status,
    Readable,
    ReadToken,
    /// `error`, with its selected members: (response key, name).
    Error(Vec<(Name, &'static str)>),
}

impl PutCells {
    pub(super) fn compile(
        definition: &OperationDefinition,
        definitions: &Definitions,
    ) -> Option<PutCells> {
        let [variable] = &definition.variable_definitions[..] else {
            return None;
        };
        let variable = &variable.node;
        let ty = &variable.var_type.node;
        let BaseType::List(item) = &ty.base else {
            return None;
        };
        let BaseType::Named(input) = &item.base else {
            return None;
        };
        if ty.nullable
            || item.nullable
            || variable.default_value.is_some()
            || !variable.directives.is_empty()
        {
            return None;
        }
        let [field] = &definition.selection_set.node.items[..] else {
            return None;
        };
        let Selection::Field(field) = &field.node else {
            return None;
        };
        let pos = field.pos;
        let field = &field.node;
        if !field.directives.is_empty() {
            return None;
        }
        let datastore = definitions
            .datastores
            .iter()
            .find(|d| format!("{}PutCells", camel(&d.name)) == field.name.node.as_str())?;
        if input.as_str() != format!("{}CellInput", pascal(&datastore.name)) {
            return None;
        }
        let [(argument, value)] = &field.arguments[..] else {
            return None;
        };
        match &value.node {
            async_graphql_value::Value::Variable(name)
                if argument.node.as_str() == "cells" && *name == variable.name.node => {}
            _ => return None,
        }
        Some(PutCells {
            variable: variable.name.node.clone(),
            datastore: Arc::from(datastore.name.as_str()),
            columns: datastore.columns.iter().map(|c| c.name.clone()).collect(),
            key: field.response_key().node.clone(),
            pos,
            selection: result_fields(field)?,
        })
    }

    /// The answer for `variables`, `None` for async-graphql to answer.
    pub(super) async fn run(&self, store: &Store, variables: &Variables) -> Option<Answer> {
        let cells = self.cells(variables)?;
        let keys: Vec<(Uuid, String, i64)> = cells
            .iter()
            .map(|c| (c.row_key, c.column.clone(), c.ref_key))
            .collect();
        let (results, token) = match store.put_cells_with_token(&self.datastore, cells).await {
            Ok(put) => put,
            Err(error) => return Some(Answer::Failed(self.failed(&error))),
        };
        let token: Arc<str> = Arc::from(token.encode());
        let mut errors = Vec::new();
        let mut items = Vec::with_capacity(results.len());
        for (i, (key, result)) in keys.into_iter().zip(results).enumerate() {
            let (outcome, reported) =
                PutOutcome::of(key, result, token.clone(), (self.pos, &self.key, i));
            errors.extend(reported);
            items.push(self.item(&outcome));
        }
        let data = IndexMap::from([(self.key.clone(), Value::List(items))]);
        let mut response = async_graphql::Response::new(Value::Object(data));
        if errors.is_empty() {
            return Some(Answer::Body(serde_json::to_vec(&response).ok()?));
        }
        response.errors = errors;
        Some(Answer::Failed(response))
    }

    /// The cells of the request, or `None` unless every item is a
    /// complete, well-typed cell input.
    fn cells(&self, variables: &Variables) -> Option<Vec<NewCell>> {
        let Some(Value::List(items)) = variables.get(&self.variable) else {
            return None;
        };
        let mut cells = Vec::with_capacity(items.len());
        for item in items {
            let Value::Object(members) = item else {
                return None;
            };
            if members.len() != CELL_MEMBERS {
                return None;
            }
            let row_key = match members.get("rowKey")? {
                Value::String(s) => Uuid::parse_str(s).ok()?,
                _ => return None,
            };
            let column = match members.get("column")? {
                Value::String(name) if self.columns.contains(name) => name.clone(),
                Value::Enum(name) if self.columns.contains(name.as_str()) => name.to_string(),
                _ => return None,
            };
            let ref_key = int64_of(members.get("refKey")?)?;
            let body = match members.get("body")? {
                Value::Null => return None,
                body => json_from_value(body),
            };
            cells.push(NewCell {
                row_key,
                column,
                ref_key,
                body,
            });
        }
        Some(cells)
    }

    /// One cell's result object, with the values `schema/put.rs` resolves.
    fn item(&self, outcome: &PutOutcome) -> Value {
        let object = self
            .selection
            .iter()
            .map(|(key, field)| {
                let value = match field {
                    ResultField::RowKey => outcome.row_key(),
                    ResultField::Column => outcome.column(),
                    ResultField::RefKey => outcome.ref_key(),
                    ResultField::Status => outcome.status(),
                    ResultField::Readable => outcome.readable(),
                    ResultField::ReadToken => outcome.read_token(),
                    ResultField::Error(members) => match outcome.error() {
                        Value::Object(error) => Value::Object(
                            members
                                .iter()
                                .map(|(key, name)| {
                                    (key.clone(), error.get(*name).cloned().unwrap_or_default())
                                })
                                .collect(),
                        ),
                        other => other,
                    },
                };
                (key.clone(), value)
            })
            .collect();
        Value::Object(object)
    }

    /// The executor's response to a failed call: the field is non-null,
    /// so `data` is null, and the error is located at the field.
    fn failed(&self, error: &cellgate_store::Error) -> async_graphql::Response {
        let mut error = from_store(error).into_server_error(self.pos);
        error.path = vec![PathSegment::Field(self.key.to_string())];
        let mut response = async_graphql::Response::new(Value::Null);
        response.errors.push(error);
        response
    }
}

/// The fields a `PutCellResult` selection asks for, `None` for a selection
/// this module does not answer.
fn result_fields(field: &Field) -> Option<Vec<(Name, ResultField)>> {
    plain_fields(&field.selection_set.node.items)?
        .into_iter()
        .map(|field| {
            let leaf = field.selection_set.node.items.is_empty();
            let kind = match field.name.node.as_str() {
                "rowKey" if leaf => ResultField::RowKey,
                "column" if leaf => ResultField::Column,
                "refKey" if leaf => ResultField::RefKey,
                "status" if leaf => ResultField::Status,
                "readable" if leaf => ResultField::Readable,
                "readToken" if leaf => ResultField::ReadToken,
                "error" => ResultField::Error(error_fields(field)?),
                _ => return None,
            };
            Some((field.response_key().node.clone(), kind))
        })
        .collect()
}

fn error_fields(field: &Field) -> Option<Vec<(Name, &'static str)>> {
    plain_fields(&field.selection_set.node.items)?
        .into_iter()
        .map(|field| {
            if !field.selection_set.node.items.is_empty() {
                return None;
            }
            let name = ["code", "message", "retryable"]
                .into_iter()
                .find(|name| *name == field.name.node.as_str())?;
            Some((field.response_key().node.clone(), name))
        })
        .collect()
}

/// The fields of a selection set that has only fields, each without
/// arguments or directives and under a response key of its own; `None`
/// otherwise, or when it is empty.
fn plain_fields(items: &[Positioned<Selection>]) -> Option<Vec<&Field>> {
    let mut keys = HashSet::new();
    let mut fields = Vec::with_capacity(items.len());
    for item in items {
        let Selection::Field(field) = &item.node else {
            return None;
        };
        let field = &field.node;
        if !field.arguments.is_empty()
            || !field.directives.is_empty()
            || !keys.insert(field.response_key().node.as_str())
        {
            return None;
        }
        fields.push(field);
    }
    (!fields.is_empty()).then_some(fields)
}
