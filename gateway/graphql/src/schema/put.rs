//! Writes: `Mutation.<datastore>PutCells` and its per-cell result and
//! error objects.

use std::sync::Arc;

use async_graphql::dynamic::{Field, FieldFuture, FieldValue, InputValue, Object, TypeRef};
use async_graphql::{PathSegment, ServerError, Value};
use index_dsl::Datastore;
use uuid::Uuid;

use crate::errors::from_store;
use crate::scalars::{self, int64, int64_value, INT64, UUID};
use cellgate_store::cells::{NewCell, PutResult, PutStatus};
use cellgate_store::Store;

use super::*;

/// Parent value of one mutation result; the compiled write
/// (`direct/put.rs`) builds the same values from it.
pub(crate) struct PutOutcome {
    row_key: Uuid,
    column: String,
    ref_key: i64,
    /// The status, or why the cell was refused.
    result: Result<PutStatus, PutRefusal>,
    /// The read token of the whole call.
    token: Arc<str>,
}

/// Why a cell was refused, as `PutCellError` shows it.
struct PutRefusal {
    code: &'static str,
    message: String,
    retryable: bool,
}

impl PutOutcome {
    /// The outcome of the `index`th cell of a call, and for a refused cell
    /// the error reported in `errors`: at the field (`pos`), with the
    /// path `[response_key, index]`.
    pub(crate) fn of(
        key: (Uuid, String, i64),
        result: PutResult,
        token: Arc<str>,
        (pos, response_key, index): (async_graphql::Pos, &str, usize),
    ) -> (PutOutcome, Option<ServerError>) {
        let (row_key, column, ref_key) = key;
        let mut reported = None;
        let result = result.map_err(|err| {
            let mut error = from_store(&err).into_server_error(pos);
            error.path = vec![
                PathSegment::Field(response_key.to_string()),
                PathSegment::Index(index),
            ];
            reported = Some(error);
            PutRefusal {
                code: err.code(),
                message: err.client_message(),
                retryable: err.is_transient(),
            }
        });
        let outcome = PutOutcome {
            row_key,
            column,
            ref_key,
            result,
            token,
        };
        (outcome, reported)
    }

    pub(crate) fn row_key(&self) -> Value {
        Value::String(self.row_key.to_string())
    }

    pub(crate) fn column(&self) -> Value {
        Value::String(self.column.clone())
    }

    pub(crate) fn ref_key(&self) -> Value {
        int64_value(self.ref_key)
    }

    pub(crate) fn status(&self) -> Value {
        match &self.result {
            Ok(status) => Value::Enum(async_graphql::Name::new(match status {
                PutStatus::Written => "WRITTEN",
                PutStatus::Duplicate => "DUPLICATE",
                PutStatus::Buffered => "BUFFERED",
            })),
            Err(_) => Value::Null,
        }
    }

    pub(crate) fn readable(&self) -> Value {
        Value::Boolean(self.result.as_ref().is_ok_and(|s| s.readable()))
    }

    pub(crate) fn read_token(&self) -> Value {
        match &self.result {
            Ok(status) if status.readable() => Value::String(self.token.to_string()),
            _ => Value::Null,
        }
    }

    /// `PutCellError`'s fields by name, or null for a written cell.
    pub(crate) fn error(&self) -> Value {
        match &self.result {
            Ok(_) => Value::Null,
            Err(refusal) => obj(vec![
                ("code", Value::String(refusal.code.to_string())),
                ("message", Value::String(refusal.message.clone())),
                ("retryable", Value::Boolean(refusal.retryable)),
            ]),
        }
    }
}

pub(super) fn put_result_type() -> Object {
    Object::new("PutCellResult")
        .description("The outcome of one written cell.")
        .field(from_parent::<PutOutcome, _>(
            "rowKey",
            TypeRef::named_nn(UUID),
            PutOutcome::row_key,
        ))
        .field(from_parent::<PutOutcome, _>(
            "column",
            TypeRef::named_nn(TypeRef::STRING),
            PutOutcome::column,
        ))
        .field(from_parent::<PutOutcome, _>(
            "refKey",
            TypeRef::named_nn(INT64),
            PutOutcome::ref_key,
        ))
        .field(
            from_parent::<PutOutcome, _>("status", TypeRef::named("PutStatus"), PutOutcome::status)
                .description("null when the cell was refused (see `error`)"),
        )
        .field(
            from_parent::<PutOutcome, _>(
                "readable",
                TypeRef::named_nn(TypeRef::BOOLEAN),
                PutOutcome::readable,
            )
            .description("whether the cell can be read back now"),
        )
        .field(
            from_parent::<PutOutcome, _>(
                "readToken",
                TypeRef::named(TypeRef::STRING),
                PutOutcome::read_token,
            )
            .description(
                "pass as `readAfter` to a read that must see this call's writes: it may then be \
                 served by a replica that has applied them. The same for every cell of the call; \
                 null for a refused or buffered cell",
            ),
        )
        .field(
            from_parent::<PutOutcome, _>(
                "error",
                TypeRef::named("PutCellError"),
                PutOutcome::error,
            )
            .description("why the cell was refused; also reported in `errors` with its index"),
        )
}

pub(super) fn put_error_type() -> Object {
    Object::new("PutCellError")
        .description("Why a cell was not written.")
        .field(
            meta_field("code", TypeRef::named_nn(TypeRef::STRING))
                .description("a stable code, e.g. CELL_CONFLICT"),
        )
        .field(meta_field("message", TypeRef::named_nn(TypeRef::STRING)))
        .field(
            meta_field("retryable", TypeRef::named_nn(TypeRef::BOOLEAN)).description(
                "true when writing the same cell again later may succeed \
                 (e.g. STORAGE_UNAVAILABLE); writes are idempotent, so that is safe",
            ),
        )
}
/// `Mutation.<datastore>PutCells`.
pub(super) fn put_cells_field(
    datastore: &Datastore,
    types: &DatastoreTypes,
    ds: &Arc<str>,
) -> Field {
    let ds = ds.clone();
    Field::new(
        format!("{}PutCells", camel(&datastore.name)),
        TypeRef::named_nn_list_nn("PutCellResult"),
        move |ctx| {
            let ds = ds.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let inputs = ctx.args.try_get("cells")?.list()?;
                let mut cells = Vec::with_capacity(inputs.len());
                for (i, input) in inputs.iter().enumerate() {
                    let input = input.object()?;
                    let what = |f: &str| format!("cells[{i}].{f}");
                    let body = scalars::json_from_value(input.try_get("body")?.as_value());
                    cells.push(NewCell {
                        row_key: scalars::uuid(&input.try_get("rowKey")?, &what("rowKey"))?,
                        column: input.try_get("column")?.enum_name()?.to_string(),
                        ref_key: int64(&input.try_get("refKey")?, &what("refKey"))?,
                        body,
                    });
                }
                let keys: Vec<(Uuid, String, i64)> = cells
                    .iter()
                    .map(|c| (c.row_key, c.column.clone(), c.ref_key))
                    .collect();
                let (results, token) = store
                    .put_cells_with_token(&ds, cells)
                    .await
                    .map_err(|e| from_store(&e))?;
                let token: Arc<str> = Arc::from(token.encode());
                let response_key = ctx.item.node.response_key().node.to_string();
                let mut items = Vec::with_capacity(results.len());
                for (i, (key, result)) in keys.into_iter().zip(results).enumerate() {
                    let (outcome, reported) = PutOutcome::of(
                        key,
                        result,
                        token.clone(),
                        (ctx.item.pos, &response_key, i),
                    );
                    if let Some(error) = reported {
                        // Reported once in `errors`, with the cell's index.
                        ctx.add_error(error);
                    }
                    items.push(FieldValue::owned_any(outcome));
                }
                Ok(Some(FieldValue::list(items)))
            })
        },
    )
    .argument(InputValue::new("cells", TypeRef::named_nn_list_nn(&types.cell_input)))
    .description(format!(
        "Writes cells to `{}`: one transaction per cluster, a result per cell in input order. \
         A refused cell (e.g. CELL_CONFLICT: same key, different body) has a null `status` and an `error`, \
         and is reported in `errors` with its index.",
        datastore.name
    ))
}
