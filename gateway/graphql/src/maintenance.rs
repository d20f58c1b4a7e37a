//! Index maintenance in the schema: per datastore the state of its indexes
//! (`indexStatus`), the maintenance figures (`maintenance`), the quarantined
//! entries (`quarantine`), and the mutation that retries them; with the
//! buffer fields of `buffer.rs`, these are the admin fields of a datastore.

use std::sync::Arc;

use async_graphql::dynamic::{Field, FieldFuture, FieldValue, InputValue, Object, TypeRef};
use async_graphql::Value;

use super::errors::from_store;
use super::scalars::{datetime_value, int64_value, DATETIME, INT64, UUID};
use crate::args::first_argument;
use crate::fields::from_parent;
use crate::names::camel;
use cellgate_store::indexes::{MaintenanceMetrics, QuarantinedEntry};
use cellgate_store::{IndexStatus, Store};

/// Most quarantined entries one query returns.
const MAX_QUARANTINE_PAGE: usize = 1000;

/// Parent value of a retry result: `(applied, still quarantined)`.
struct Retried(usize, usize);

/// The object types of this module and of [`crate::buffer`].
pub(super) fn types() -> Vec<Object> {
    let mut types = crate::buffer::types();
    types.extend([
        Object::new("IndexStatus")
            .description("An index as the store serves it.")
            .field(from_parent::<IndexStatus, _>(
                "name",
                TypeRef::named_nn(TypeRef::STRING),
                |i| Value::String(i.name.clone()),
            ))
            .field(
                from_parent::<IndexStatus, _>("version", TypeRef::named_nn(TypeRef::INT), |i| {
                    Value::from(i.version)
                })
                .description("version of its table; a new one is built when its fields change"),
            )
            .field(
                from_parent::<IndexStatus, _>("ready", TypeRef::named_nn(TypeRef::BOOLEAN), |i| {
                    Value::from(i.ready)
                })
                .description("false while it is being built from the cell log (queries answer INDEX_BUILDING)"),
            )
            .field(
                from_parent::<IndexStatus, _>("servesUntil", TypeRef::named(TypeRef::INT), |i| {
                    i.serves_until.map_or(Value::Null, Value::from)
                })
                .description("for the previous version of an index whose new version is being built: that version; until it is ready this one answers the queries it can answer (null for the current version)"),
            )
            .field(
                from_parent::<IndexStatus, _>("pendingCells", TypeRef::named_nn(INT64), |i| {
                    int64_value(i.pending_cells)
                })
                .description("cells still to apply while it is being built"),
            )
            .field(
                from_parent::<IndexStatus, _>("buildTotalCells", TypeRef::named(INT64), |i| {
                    i.build_total_cells.map_or(Value::Null, int64_value)
                })
                .description("while it is being built: the log cells the build reads in all, done and pending (the log heads when last measured; it grows with the writes during the build)"),
            )
            .field(
                from_parent::<IndexStatus, _>("buildDoneCells", TypeRef::named(INT64), |i| {
                    i.build_done_cells().map_or(Value::Null, int64_value)
                })
                .description("while it is being built: the log cells applied so far"),
            )
            .field(
                from_parent::<IndexStatus, _>("buildRate", TypeRef::named(TypeRef::FLOAT), |i| {
                    i.build_rate.map_or(Value::Null, Value::from)
                })
                .description("while it is being built: cells applied per second over the last 10 s (null until measured twice)"),
            )
            .field(
                from_parent::<IndexStatus, _>(
                    "buildEtaSeconds",
                    TypeRef::named(TypeRef::FLOAT),
                    |i| i.build_eta_seconds.map_or(Value::Null, Value::from),
                )
                .description("while it is being built: seconds until the pending cells are applied at buildRate"),
            ),
        Object::new("IndexMaintenance")
            .description("How far index maintenance is behind the cell log, from the latest sweep.")
            .field(
                from_parent::<MaintenanceMetrics, _>("pendingCells", TypeRef::named_nn(INT64), |m| {
                    int64_value(m.pending_cells)
                })
                .description("cells not yet applied to every index"),
            )
            .field(from_parent::<MaintenanceMetrics, _>(
                "laggingShards",
                TypeRef::named_nn(TypeRef::INT),
                |m| Value::from(m.lagging_shards as u64),
            ))
            .field(
                from_parent::<MaintenanceMetrics, _>("lagMaxMs", TypeRef::named_nn(INT64), |m| {
                    int64_value(m.lag_max_ms as i64)
                })
                .description("age of the oldest cell not yet applied, in milliseconds"),
            )
            .field(from_parent::<MaintenanceMetrics, _>(
                "quarantined",
                TypeRef::named_nn(INT64),
                |m| int64_value(m.quarantine_size),
            )),
        Object::new("QuarantinedEntry")
            .description("An index entry set aside after failing to apply, so its shard keeps flowing.")
            .field(from_parent::<QuarantinedEntry, _>(
                "index",
                TypeRef::named_nn(TypeRef::STRING),
                |q| Value::String(q.index.clone()),
            ))
            .field(from_parent::<QuarantinedEntry, _>(
                "rowKey",
                TypeRef::named_nn(UUID),
                |q| Value::String(q.row_key.to_string()),
            ))
            .field(from_parent::<QuarantinedEntry, _>(
                "shard",
                TypeRef::named_nn(TypeRef::INT),
                |q| Value::from(q.shard),
            ))
            .field(from_parent::<QuarantinedEntry, _>(
                "addedId",
                TypeRef::named_nn(INT64),
                |q| int64_value(q.added_id),
            ))
            .field(from_parent::<QuarantinedEntry, _>(
                "code",
                TypeRef::named_nn(TypeRef::STRING),
                |q| Value::String(q.code.clone()),
            ))
            .field(from_parent::<QuarantinedEntry, _>(
                "message",
                TypeRef::named_nn(TypeRef::STRING),
                |q| Value::String(q.message.clone()),
            ))
            .field(from_parent::<QuarantinedEntry, _>(
                "firstSeen",
                TypeRef::named_nn(DATETIME),
                |q| datetime_value(q.first_seen),
            ))
            .field(from_parent::<QuarantinedEntry, _>(
                "lastSeen",
                TypeRef::named_nn(DATETIME),
                |q| datetime_value(q.last_seen),
            )),
        Object::new("QuarantineRetry")
            .field(
                from_parent::<Retried, _>("applied", TypeRef::named_nn(TypeRef::INT), |r| {
                    Value::from(r.0 as u64)
                })
                .description("entries applied and out of the quarantine"),
            )
            .field(
                from_parent::<Retried, _>(
                    "stillQuarantined",
                    TypeRef::named_nn(TypeRef::INT),
                    |r| Value::from(r.1 as u64),
                )
                .description("entries that failed again"),
            ),
    ]);
    types
}

/// The names of the admin fields in each datastore's query type: these,
/// those of [`crate::buffer`], `triggers` ([`crate::triggers`]) and
/// `indexVerify` ([`crate::verify`]).
pub(super) const QUERY_FIELDS: [&str; 8] = [
    "indexStatus",
    "maintenance",
    "quarantine",
    crate::buffer::QUERY_FIELDS[0],
    crate::buffer::QUERY_FIELDS[1],
    crate::buffer::QUERY_FIELDS[2],
    crate::triggers::QUERY_FIELD,
    crate::verify::QUERY_FIELD,
];

/// `indexStatus`, `maintenance` and `quarantine` of one datastore.
pub(super) fn query_fields(ds: &Arc<str>) -> Vec<Field> {
    let d = ds.clone();
    let status = Field::new(
        "indexStatus",
        TypeRef::named_nn_list_nn("IndexStatus"),
        move |ctx| {
            let ds = d.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let indexes = store.indexes(&ds).map_err(|e| from_store(&e))?;
                Ok(Some(FieldValue::list(
                    indexes.into_iter().map(FieldValue::owned_any),
                )))
            })
        },
    )
    .description("Each index's table version and whether it is built.");
    let d = ds.clone();
    let maintenance = Field::new(
        "maintenance",
        TypeRef::named_nn("IndexMaintenance"),
        move |ctx| {
            let ds = d.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let metrics = store
                    .metrics()
                    .datastores
                    .into_iter()
                    .find(|m| *m.name == *ds)
                    .map(|m| m.maintenance)
                    .unwrap_or_default();
                Ok(Some(FieldValue::owned_any(metrics)))
            })
        },
    )
    .description("How far index maintenance is behind the cell log.");
    let d = ds.clone();
    let quarantine = Field::new(
        "quarantine",
        TypeRef::named_nn_list_nn("QuarantinedEntry"),
        move |ctx| {
            let ds = d.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let first = first_argument(&ctx, MAX_QUARANTINE_PAGE)?;
                let mut entries = store.quarantine(&ds).await.map_err(|e| from_store(&e))?;
                entries.truncate(first);
                Ok(Some(FieldValue::list(
                    entries.into_iter().map(FieldValue::owned_any),
                )))
            })
        },
    )
    .argument(
        InputValue::new("first", TypeRef::named(TypeRef::INT))
            .default_value(Value::from(100))
            .description("at most 1000"),
    )
    .description("Index entries set aside after failing to apply (oldest indexes first).");
    let mut fields = vec![
        status,
        maintenance,
        quarantine,
        crate::verify::query_field(ds),
    ];
    fields.extend(crate::buffer::query_fields(ds));
    fields
}

/// `Mutation.<ds>RetryQuarantine`.
pub(super) fn retry_field(ds: &Arc<str>) -> Field {
    let d = ds.clone();
    Field::new(
        format!("{}RetryQuarantine", camel(ds)),
        TypeRef::named_nn("QuarantineRetry"),
        move |ctx| {
            let ds = d.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let index = ctx
                    .args
                    .get("index")
                    .filter(|v| !v.is_null())
                    .map(|v| v.string().map(str::to_string))
                    .transpose()?;
                let (applied, still) = store
                    .retry_quarantine(&ds, index.as_deref())
                    .await
                    .map_err(|e| from_store(&e))?;
                Ok(Some(FieldValue::owned_any(Retried(applied, still))))
            })
        },
    )
    .argument(
        InputValue::new("index", TypeRef::named(TypeRef::STRING))
            .description("only this index's entries"),
    )
    .description(format!(
        "Retries the quarantined index entries of `{ds}`: each leaves the quarantine if it can now be applied."
    ))
}
