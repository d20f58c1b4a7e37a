//! Writes: `Mutation.<datastore>PutCells` and its per-cell result and
//! error objects.

use std::sync::Arc;

use async_graphql::dynamic::{Field, FieldFuture, FieldValue, InputValue, Object, TypeRef};
use async_graphql::{PathSegment, Value};
use index_dsl::Datastore;
use uuid::Uuid;

use crate::errors::from_store;
use crate::scalars::{self, int64, int64_value, INT64, UUID};
use cellgate_store::cells::{NewCell, PutStatus};
use cellgate_store::Store;

use super::*;

/// Parent value of one mutation result.
pub(super) struct PutOutcome {
    pub(super) row_key: Uuid,
    pub(super) column: String,
    pub(super) ref_key: i64,
    /// The status, or why the cell was refused.
    pub(super) result: Result<PutStatus, PutRefusal>,
    /// The read token of the whole call.
    pub(super) token: Arc<str>,
}

/// Why a cell was refused, as `PutCellError` shows it.
pub(super) struct PutRefusal {
    pub(super) code: &'static str,
    pub(super) message: String,
    pub(super) retryable: bool,
}
pub(super) fn put_result_type() -> Object {
    Object::new("PutCellResult")
        .description("The outcome of one written cell.")
        .field(from_parent::<PutOutcome, _>(
            "rowKey",
            TypeRef::named_nn(UUID),
            |p| Value::String(p.row_key.to_string()),
        ))
        .field(from_parent::<PutOutcome, _>(
            "column",
            TypeRef::named_nn(TypeRef::STRING),
            |p| Value::String(p.column.clone()),
        ))
        .field(from_parent::<PutOutcome, _>(
            "refKey",
            TypeRef::named_nn(INT64),
            |p| int64_value(p.ref_key),
        ))
        .field(
            from_parent::<PutOutcome, _>("status", TypeRef::named("PutStatus"), |p| {
                match &p.result {
                    Ok(status) => Value::Enum(async_graphql::Name::new(match status {
                        PutStatus::Written => "WRITTEN",
                        PutStatus::Duplicate => "DUPLICATE",
                        PutStatus::Buffered => "BUFFERED",
                    })),
                    Err(_) => Value::Null,
                }
            })
            .description("null when the cell was refused (see `error`)"),
        )
        .field(
            from_parent::<PutOutcome, _>("readable", TypeRef::named_nn(TypeRef::BOOLEAN), |p| {
                Value::Boolean(p.result.as_ref().is_ok_and(|s| s.readable()))
            })
            .description("whether the cell can be read back now"),
        )
        .field(
            from_parent::<PutOutcome, _>(
                "readToken",
                TypeRef::named(TypeRef::STRING),
                |p| match &p.result {
                    Ok(status) if status.readable() => Value::String(p.token.to_string()),
                    _ => Value::Null,
                },
            )
            .description(
                "pass as `readAfter` to a read that must see this call's writes: it may then be \
                 served by a replica that has applied them. The same for every cell of the call; \
                 null for a refused or buffered cell",
            ),
        )
        .field(
            from_parent::<PutOutcome, _>("error", TypeRef::named("PutCellError"), |p| {
                match &p.result {
                    Ok(_) => Value::Null,
                    Err(refusal) => obj(vec![
                        ("code", Value::String(refusal.code.to_string())),
                        ("message", Value::String(refusal.message.clone())),
                        ("retryable", Value::Boolean(refusal.retryable)),
                    ]),
                }
            })
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
                for (i, ((row_key, column, ref_key), result)) in keys.into_iter().zip(results).enumerate() {
                    let result = result.map_err(|err| {
                        // Reported once in `errors`, with the cell's index.
                        let mut error = from_store(&err).into_server_error(ctx.item.pos);
                        error.path = vec![
                            PathSegment::Field(response_key.clone()),
                            PathSegment::Index(i),
                        ];
                        ctx.add_error(error);
                        PutRefusal {
                            code: err.code(),
                            message: err.client_message(),
                            retryable: err.is_transient(),
                        }
                    });
                    items.push(FieldValue::owned_any(PutOutcome {
                        row_key,
                        column,
                        ref_key,
                        result,
                        token: token.clone(),
                    }));
                }
                Ok(Some(FieldValue::list(items)))
            })
        },
    )
    .argument(InputValue::new("cells", TypeRef::named_nn_list_nn(&types.cell_input)))
    .description(format!(
        "Writes cells to `{}`: one transaction per shard, a result per cell in input order. \
         A refused cell (e.g. CELL_CONFLICT: same key, different body) has a null `status` and an `error`, \
         and is reported in `errors` with its index.",
        datastore.name
    ))
}
