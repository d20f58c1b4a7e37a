//! Index verify in the schema: per datastore the run of this gateway
//! (`indexVerify`: running or the latest, with its progress and the first
//! mismatching entries) and the mutation that starts one
//! (`<ds>VerifyIndexes`). Both are admin fields. The run itself is the
//! store's (`Store::start_verify`), the one `cellgate index verify` runs.

use std::sync::Arc;

use async_graphql::dynamic::{
    Enum, EnumItem, Field, FieldFuture, FieldValue, InputValue, Object, TypeRef,
};
use async_graphql::Value;

use crate::errors::{coded, from_store};
use crate::fields::{from_parent, parent};
use crate::names::camel;
use crate::scalars::{datetime_value, int64_value, DATETIME, INT64, JSON, UUID};
use cellgate_store::indexes::{
    Drift, DriftKind, VerifyOptions, VerifyProgress, VerifyState, VerifyStatus,
};
use cellgate_store::Store;

/// The admin field of each datastore's query type.
pub(super) const QUERY_FIELD: &str = "indexVerify";

/// The name of `Mutation.<ds>VerifyIndexes`.
pub(super) fn mutation_name(datastore: &str) -> String {
    format!("{}VerifyIndexes", camel(datastore))
}

fn int(v: u64) -> Value {
    int64_value(v as i64)
}

/// The types of this module.
pub(super) fn types() -> (Vec<Object>, Vec<Enum>) {
    let state = Enum::new("IndexVerifyState")
        .item(EnumItem::new("RUNNING"))
        .item(EnumItem::new("DONE"))
        .item(EnumItem::new("FAILED").description("stopped on an error, see `error`"));
    let kind = Enum::new("IndexDriftKind")
        .description("How an index entry differs from what its row's latest cells give.")
        .item(EnumItem::new("MISSING").description("no entry where the row's entry belongs"))
        .item(
            EnumItem::new("STALE")
                .description("an entry with other field values or source ref keys"),
        )
        .item(EnumItem::new("EXTRA").description("an entry where none belongs"));
    let progress = Object::new("IndexVerifyProgress")
        .field(from_parent::<VerifyProgress, _>(
            "shardsDone",
            TypeRef::named_nn(TypeRef::INT),
            |p| Value::from(p.shards_done),
        ))
        .field(from_parent::<VerifyProgress, _>(
            "shardsTotal",
            TypeRef::named_nn(TypeRef::INT),
            |p| Value::from(p.shards_total),
        ))
        .field(
            from_parent::<VerifyProgress, _>("rows", TypeRef::named_nn(INT64), |p| int(p.rows))
                .description("rows compared, per index"),
        )
        .field(from_parent::<VerifyProgress, _>(
            "cells",
            TypeRef::named_nn(INT64),
            |p| int(p.cells),
        ))
        .field(
            from_parent::<VerifyProgress, _>("pending", TypeRef::named_nn(INT64), |p| {
                int(p.pending)
            })
            .description("rows skipped because maintenance had not applied their cells yet"),
        )
        .field(
            from_parent::<VerifyProgress, _>("unreadable", TypeRef::named_nn(INT64), |p| {
                int(p.unreadable)
            })
            .description("rows whose latest cells cannot be decoded (see `quarantine`)"),
        )
        .field(from_parent::<VerifyProgress, _>(
            "missing",
            TypeRef::named_nn(INT64),
            |p| int(p.missing),
        ))
        .field(from_parent::<VerifyProgress, _>(
            "stale",
            TypeRef::named_nn(INT64),
            |p| int(p.stale),
        ))
        .field(from_parent::<VerifyProgress, _>(
            "extra",
            TypeRef::named_nn(INT64),
            |p| int(p.extra),
        ))
        .field(from_parent::<VerifyProgress, _>(
            "repaired",
            TypeRef::named_nn(INT64),
            |p| int(p.repaired),
        ));
    let drift = Object::new("IndexDrift")
        .description("An index entry that differs from what its row's latest cells give.")
        .field(from_parent::<Drift, _>(
            "index",
            TypeRef::named_nn(TypeRef::STRING),
            |d| Value::String(d.index.clone()),
        ))
        .field(from_parent::<Drift, _>(
            "rowKey",
            TypeRef::named_nn(UUID),
            |d| Value::String(d.row_key.to_string()),
        ))
        .field(
            from_parent::<Drift, _>("shard", TypeRef::named_nn(TypeRef::INT), |d| {
                Value::from(d.shard)
            })
            .description("the row's shard"),
        )
        .field(from_parent::<Drift, _>(
            "kind",
            TypeRef::named_nn("IndexDriftKind"),
            |d| Value::Enum(async_graphql::Name::new(drift_kind(d.kind))),
        ))
        .field(
            from_parent::<Drift, _>("cluster", TypeRef::named_nn(TypeRef::STRING), |d| {
                Value::String(d.cluster.clone())
            })
            .description("the cluster whose index table is wrong"),
        )
        .field(
            from_parent::<Drift, _>("expected", TypeRef::named(JSON), |d| {
                d.expected
                    .as_ref()
                    .map_or(Value::Null, crate::scalars::json_value)
            })
            .description("the entry the cells give, if it belongs on `cluster`"),
        )
        .field(
            from_parent::<Drift, _>("stored", TypeRef::named(JSON), |d| {
                d.stored
                    .as_ref()
                    .map_or(Value::Null, crate::scalars::json_value)
            })
            .description("the entry stored on `cluster`, if any"),
        )
        .field(from_parent::<Drift, _>(
            "repaired",
            TypeRef::named_nn(TypeRef::BOOLEAN),
            |d| Value::from(d.repaired),
        ));
    let run = Object::new("IndexVerify")
        .description(
            "A verify of a datastore's indexes run by this gateway: every entry compared with \
             the entry its row's latest cells give.",
        )
        .field(from_parent::<VerifyStatus, _>(
            "state",
            TypeRef::named_nn("IndexVerifyState"),
            |s| {
                Value::Enum(async_graphql::Name::new(match s.state {
                    VerifyState::Running => "RUNNING",
                    VerifyState::Done => "DONE",
                    VerifyState::Failed => "FAILED",
                }))
            },
        ))
        .field(
            from_parent::<VerifyStatus, _>("scheduled", TypeRef::named_nn(TypeRef::BOOLEAN), |s| {
                Value::from(s.scheduled)
            })
            .description("started by the schedule (`indexes.verify_every_hours`)"),
        )
        .field(from_parent::<VerifyStatus, _>(
            "repair",
            TypeRef::named_nn(TypeRef::BOOLEAN),
            |s| Value::from(s.repair),
        ))
        .field(
            from_parent::<VerifyStatus, _>("sample", TypeRef::named(TypeRef::INT), |s| {
                s.sample.map_or(Value::Null, Value::from)
            })
            .description("shards picked at random, when not every shard"),
        )
        .field(Field::new(
            "progress",
            TypeRef::named_nn("IndexVerifyProgress"),
            |ctx| {
                FieldFuture::new(async move {
                    let status = parent::<VerifyStatus>(&ctx)?;
                    Ok(Some(FieldValue::owned_any(status.progress.clone())))
                })
            },
        ))
        .field(
            Field::new("drift", TypeRef::named_nn_list_nn("IndexDrift"), |ctx| {
                FieldFuture::new(async move {
                    let status = parent::<VerifyStatus>(&ctx)?;
                    Ok(Some(FieldValue::list(
                        status.drift.iter().cloned().map(FieldValue::owned_any),
                    )))
                })
            })
            .description("the first 100 mismatching entries found"),
        )
        .field(from_parent::<VerifyStatus, _>(
            "startedAt",
            TypeRef::named_nn(DATETIME),
            |s| datetime_value(s.started_at),
        ))
        .field(from_parent::<VerifyStatus, _>(
            "finishedAt",
            TypeRef::named(DATETIME),
            |s| s.finished_at.map_or(Value::Null, datetime_value),
        ))
        .field(from_parent::<VerifyStatus, _>(
            "error",
            TypeRef::named(TypeRef::STRING),
            |s| s.error.clone().map_or(Value::Null, Value::String),
        ));
    (vec![progress, drift, run], vec![state, kind])
}

fn drift_kind(kind: DriftKind) -> &'static str {
    match kind {
        DriftKind::Missing => "MISSING",
        DriftKind::Stale => "STALE",
        DriftKind::Extra => "EXTRA",
    }
}

/// `<ds> { indexVerify }`.
pub(super) fn query_field(ds: &Arc<str>) -> Field {
    let d = ds.clone();
    Field::new(QUERY_FIELD, TypeRef::named("IndexVerify"), move |ctx| {
        let ds = d.clone();
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            Ok(store.verify_status(&ds).map(FieldValue::owned_any))
        })
    })
    .description(
        "The index verify this gateway runs or ran last (started by `VerifyIndexes` or the \
         schedule); null if none since it started.",
    )
}

/// `Mutation.<ds>VerifyIndexes`.
pub(super) fn mutation_field(ds: &Arc<str>, shards: u32) -> Field {
    let d = ds.clone();
    Field::new(
        mutation_name(ds),
        TypeRef::named_nn("IndexVerify"),
        move |ctx| {
            let ds = d.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let indexes = match ctx.args.get("indexes") {
                    Some(list) if !list.is_null() => list
                        .list()?
                        .iter()
                        .map(|v| v.string().map(str::to_string))
                        .collect::<async_graphql::Result<Vec<_>>>()?,
                    _ => Vec::new(),
                };
                let first = ctx.args.get("firstShard").map(|v| v.i64()).transpose()?;
                let last = ctx.args.get("lastShard").map(|v| v.i64()).transpose()?;
                let range = match (first, last) {
                    (None, None) => None,
                    (first, last) => {
                        let (first, last) = (first.unwrap_or(0), last.unwrap_or(shards as i64 - 1));
                        if first < 0 || last < first || last >= shards as i64 {
                            return Err(coded(
                                "BAD_USER_INPUT",
                                format!("shards {first}-{last} are not within 0-{}", shards - 1),
                            ));
                        }
                        Some((first as u32, last as u32))
                    }
                };
                let sample = ctx.args.get("sample").map(|v| v.i64()).transpose()?;
                if sample.is_some_and(|s| s < 1 || s > shards as i64) {
                    return Err(coded(
                        "BAD_USER_INPUT",
                        format!("sample must be between 1 and {shards}"),
                    ));
                }
                let repair = ctx
                    .args
                    .get("repair")
                    .map(|v| v.boolean())
                    .transpose()?
                    .unwrap_or(false);
                let options = VerifyOptions {
                    indexes,
                    shards: range,
                    sample: sample.map(|s| s as u32),
                    repair,
                    ..VerifyOptions::default()
                };
                let status = store
                    .start_verify(&ds, options)
                    .map_err(|e| from_store(&e))?;
                Ok(Some(FieldValue::owned_any(status)))
            })
        },
    )
    .argument(
        InputValue::new("indexes", TypeRef::named_nn_list(TypeRef::STRING))
            .description("only these indexes (default: all)"),
    )
    .argument(InputValue::new("firstShard", TypeRef::named(TypeRef::INT)))
    .argument(InputValue::new("lastShard", TypeRef::named(TypeRef::INT)))
    .argument(
        InputValue::new("sample", TypeRef::named(TypeRef::INT))
            .description("only this many shards picked at random"),
    )
    .argument(
        InputValue::new("repair", TypeRef::named_nn(TypeRef::BOOLEAN))
            .default_value(Value::from(false))
            .description("fix the drift found, through the maintainer's guarded writes"),
    )
    .description(format!(
        "Starts a verify of the indexes of `{ds}` in this gateway (one at a time) and returns \
         it running; `{ds} {{ indexVerify }}` follows it. A full run resumes where an \
         unfinished one of the same scope stopped."
    ))
}
