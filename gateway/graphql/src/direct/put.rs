//! Direct answers to a write: `mutation ($cells: [<Ds>CellInput!]!) {
//! <ds>PutCells(cells: $cells) { … } }`.
//!
//! On the executor's path a write of 50 cells spent about a quarter of the
//! gateway's CPU outside the store: validating the document again,
//! resolving five fields of every result through boxed futures, and
//! converting each cell's input object field by field through
//! `ValueAccessor`s. Here the cells are read once, straight from the
//! variable's JSON text (`variables.rs`): no async-graphql value tree is
//! built and converted to JSON, which took about a quarter of the
//! gateway's CPU on a 50-cell write. Nor is a JSON value built for each
//! body: it is read straight into the MessagePack the store keeps
//! (`codec::PackBody`), and the store writes the cells
//! (`Store::put_packed_cells_with_token`, which stores them as the
//! resolver's write would). The response is built from the results.
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

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use async_graphql::indexmap::IndexMap;
use async_graphql::parser::types::{BaseType, Field, OperationDefinition, Selection};
use async_graphql::{Name, PathSegment, Pos, Positioned, Value};
use index_dsl::Definitions;
use serde::de::{DeserializeSeed, Deserializer, Error as _, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use uuid::Uuid;

use super::Answer;
use crate::errors::from_store;
use crate::names::{camel, pascal};
use crate::scalars::int64_of;
use crate::schema::PutOutcome;
use crate::variables::RequestVariables;
use cellgate_store::cells::codec::{PackBody, Packed};
use cellgate_store::cells::NewCell;
use cellgate_store::Store;

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

    /// The variable whose JSON text holds the cells.
    pub(super) fn variable(&self) -> &Name {
        &self.variable
    }

    /// The answer for `variables`, `None` for async-graphql to answer.
    pub(super) async fn run(&self, store: &Store, variables: &RequestVariables) -> Option<Answer> {
        let keep = store.index_members(&self.datastore).ok();
        let cells = self.cells(variables.text(&self.variable)?, keep.as_ref())?;
        let keys: Vec<(Uuid, String, i64)> = cells
            .iter()
            .map(|c| (c.row_key, c.column.clone(), c.ref_key))
            .collect();
        let (results, token) = match store
            .put_packed_cells_with_token(&self.datastore, cells)
            .await
        {
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

    /// The cells of the variable's JSON text, or `None` unless it is a
    /// list of complete, well-typed cell inputs. Each body is read into
    /// its MessagePack by the same JSON reader, so a body this reader
    /// refuses (nested past its recursion limit, a number out of range)
    /// declines the list, as it did when bodies were read into values; the
    /// other members are read as async-graphql reads them, so a value is
    /// taken here exactly when the executor would take it.
    fn cells(
        &self,
        text: &RawValue,
        keep: Option<&Arc<BTreeSet<String>>>,
    ) -> Option<Vec<NewCell<Packed>>> {
        let mut json = serde_json::Deserializer::from_str(text.get());
        let list = CellList {
            columns: &self.columns,
            keep,
        };
        let cells = list.deserialize(&mut json).ok()?;
        json.end().ok()?;
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

/// A list of cell input objects, read from JSON: the datastore's columns,
/// and the body members its indexes read.
#[derive(Clone, Copy)]
struct CellList<'c> {
    columns: &'c HashSet<String>,
    keep: Option<&'c Arc<BTreeSet<String>>>,
}

/// One cell input object, read from JSON.
struct CellObject<'c>(CellList<'c>);

/// Why a cell list is left to async-graphql; its text is never shown.
const DECLINED: &str = "not a list of complete cell inputs";

impl<'de> DeserializeSeed<'de> for CellList<'_> {
    type Value = Vec<NewCell<Packed>>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for CellList<'_> {
    type Value = Vec<NewCell<Packed>>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of cell inputs")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut items: A) -> Result<Self::Value, A::Error> {
        let mut cells = Vec::with_capacity(items.size_hint().unwrap_or(0));
        while let Some(cell) = items.next_element_seed(CellObject(self))? {
            cells.push(cell);
        }
        Ok(cells)
    }
}

impl<'de> DeserializeSeed<'de> for CellObject<'_> {
    type Value = NewCell<Packed>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for CellObject<'_> {
    type Value = NewCell<Packed>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a cell input object")
    }

    /// A member given twice keeps its last value, as in async-graphql's
    /// object; a value async-graphql would refuse declines the list.
    fn visit_map<A: MapAccess<'de>>(self, mut members: A) -> Result<Self::Value, A::Error> {
        let declined = || A::Error::custom(DECLINED);
        let (mut row_key, mut column, mut ref_key, mut body) = (None, None, None, None);
        while let Some(member) = members.next_key::<Member>()? {
            match member {
                Member::RowKey => {
                    row_key = match members.next_value::<Value>()? {
                        Value::String(s) => Some(Uuid::parse_str(&s).map_err(|_| declined())?),
                        _ => return Err(declined()),
                    }
                }
                Member::Column => {
                    column = match members.next_value::<Value>()? {
                        Value::String(name) if self.0.columns.contains(&name) => Some(name),
                        _ => return Err(declined()),
                    }
                }
                Member::RefKey => {
                    ref_key = Some(int64_of(&members.next_value::<Value>()?).ok_or_else(declined)?)
                }
                Member::Body => {
                    let packed = members.next_value_seed(PackBody { keep: self.0.keep })?;
                    if packed.is_null() {
                        return Err(declined());
                    }
                    body = Some(packed);
                }
                Member::Other => return Err(declined()),
            }
        }
        match (row_key, column, ref_key, body) {
            (Some(row_key), Some(column), Some(ref_key), Some(body)) => Ok(NewCell {
                row_key,
                column,
                ref_key,
                body,
            }),
            _ => Err(declined()),
        }
    }
}

/// A member name of a cell input object, read without copying it.
#[derive(serde::Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum Member {
    RowKey,
    Column,
    RefKey,
    Body,
    #[serde(other)]
    Other,
}
