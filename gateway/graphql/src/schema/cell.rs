//! The `Cell` object and the page of a shard's log (`CellLogPage`): the
//! fields of a stored cell, shared by every datastore.

use std::sync::Arc;

use async_graphql::dynamic::{Field, FieldFuture, FieldValue, Object, TypeRef};
use async_graphql::Value;

use crate::scalars::{datetime_value, int64_value, json_value, DATETIME, INT64, JSON, UUID};
use cellgate_store::cells::{Cell, Location};

use super::*;

/// A field of the `Cell` type: one table for the schema and for direct
/// execution (`direct.rs`), so both answer the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CellField {
    RowKey,
    Column,
    RefKey,
    Body,
    CreatedAt,
    Shard,
    AddedId,
}

impl CellField {
    pub(crate) const ALL: [CellField; 7] = [
        CellField::RowKey,
        CellField::Column,
        CellField::RefKey,
        CellField::Body,
        CellField::CreatedAt,
        CellField::Shard,
        CellField::AddedId,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            CellField::RowKey => "rowKey",
            CellField::Column => "column",
            CellField::RefKey => "refKey",
            CellField::Body => "body",
            CellField::CreatedAt => "createdAt",
            CellField::Shard => "shard",
            CellField::AddedId => "addedId",
        }
    }

    pub(super) fn type_ref(self) -> TypeRef {
        TypeRef::named_nn(match self {
            CellField::RowKey => UUID,
            CellField::Column => TypeRef::STRING,
            CellField::RefKey | CellField::AddedId => INT64,
            CellField::Body => JSON,
            CellField::CreatedAt => DATETIME,
            CellField::Shard => TypeRef::INT,
        })
    }

    pub(crate) fn value(self, c: &Cell) -> Value {
        match self {
            CellField::Body => json_value(&c.body),
            field => field.meta(c),
        }
    }

    /// The value of a field other than `body`, whatever the body's form
    /// (null for `body`).
    pub(crate) fn meta<B>(self, c: &Cell<B>) -> Value {
        match self {
            CellField::RowKey => Value::String(c.row_key.to_string()),
            CellField::Column => Value::String(c.column.clone()),
            CellField::RefKey => int64_value(c.ref_key),
            CellField::Body => Value::Null,
            CellField::CreatedAt => datetime_value(c.created_at),
            CellField::Shard => Value::from(c.shard),
            CellField::AddedId => int64_value(c.added_id),
        }
    }
}
pub(super) fn cell_type() -> Object {
    CellField::ALL.into_iter().fold(
        Object::new("Cell").description("An immutable version of a column of a row."),
        |object, field| {
            object.field(from_parent::<Arc<Cell>, _>(
                field.name(),
                field.type_ref(),
                move |c| field.value(c),
            ))
        },
    )
}

/// A page of a shard's log as `CellLogPage` resolves it.
pub(super) struct ShardPage {
    pub(super) cells: Vec<Arc<Cell>>,
    pub(super) next: Location,
}

/// A cell as the parent of the `Cell` type's fields: shared, so the
/// per-request cell cache lends it without copying its body.
pub(super) fn cell_value(cell: Cell) -> FieldValue<'static> {
    FieldValue::owned_any(Arc::new(cell))
}

pub(super) fn log_page_type() -> Object {
    Object::new("CellLogPage")
        .description("A page of a shard's cell log.")
        .field(Field::new(
            "cells",
            TypeRef::named_nn_list_nn("Cell"),
            |ctx| {
                FieldFuture::new(async move {
                    let page = parent::<ShardPage>(&ctx)?;
                    Ok(Some(FieldValue::list(
                        page.cells.iter().cloned().map(FieldValue::owned_any),
                    )))
                })
            },
        ))
        .field(
            from_parent::<ShardPage, _>("next", TypeRef::named_nn(INT64), |p| match p.next {
                Location::AddedId(id) => int64_value(id),
                Location::Timestamp(_) => Value::Null,
            })
            .description("pass as `after` to read on"),
        )
}
