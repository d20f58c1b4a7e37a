//! Trigger consumers in the schema: per datastore the consumers running in
//! this gateway (`triggers`: kind, columns followed, state, the lag measured
//! now per cluster and per lagging shard, the quarantined cells), and the
//! mutation that has a consumer's quarantined cells delivered again
//! (`<ds>RetryTriggerQuarantine`). Both are admin fields, like those of
//! [`crate::maintenance`].
//!
//! The running consumers are this gateway's (`Store::consumers`): its
//! webhook triggers and the consumers its embedding program started
//! through the Rust API. Lag and quarantine are read from the datastore,
//! so they are the same whichever gateway holds a consumer's shards.

use std::sync::Arc;

use async_graphql::dynamic::{
    Enum, EnumItem, Field, FieldFuture, FieldValue, InputValue, Object, TypeRef,
};
use async_graphql::Value;
use index_dsl::Datastore;

use super::errors::{bad_input, from_store};
use super::scalars::{datetime_value, int64_value, DATETIME, INT64, UUID};
use crate::args::first_argument;
use crate::fields::{from_parent, parent};
use crate::names::camel;
use cellgate_store::triggers::{ConsumerLag, ConsumerStatus, QuarantinedCell};
use cellgate_store::Store;

/// The admin field of each datastore's query type.
pub(super) const QUERY_FIELD: &str = "triggers";

/// Most quarantined cells one `quarantine` list returns.
const MAX_QUARANTINE_PAGE: usize = 1000;

/// Most lagging shards one `shards` list returns (every shard of the
/// largest datastore).
const MAX_SHARDS_PAGE: usize = 4096;

/// Parent value of a `TriggerConsumer`.
struct Consumer {
    status: ConsumerStatus,
    /// Declared as a webhook trigger in the definitions.
    webhook: bool,
}

/// Parent value of a `TriggerLag`: the figures of every cluster.
struct Lag(Vec<ConsumerLag>);

/// Parent value of a `TriggerShardLag`.
struct ShardLag {
    shard: u32,
    cluster: String,
    pending_cells: i64,
}

/// Parent value of a retry result: the cells asked to be delivered again.
struct Retried(u64);

/// The types of this module.
pub(super) fn types() -> (Vec<Object>, Vec<Enum>) {
    let kind = Enum::new("TriggerKind")
        .description("How a trigger consumer handles its cells.")
        .item(EnumItem::new("WEBHOOK").description(
            "declared in `datastores/<ds>/triggers/*.yaml`: batches are POSTed to its URL",
        ))
        .item(
            EnumItem::new("RUST")
                .description("started by the program embedding the store, with a handler in Rust"),
        );
    let state = Enum::new("TriggerState")
        .item(EnumItem::new("RUNNING").description("delivering"))
        .item(EnumItem::new("STOPPED").description(
            "stopped, see `stoppedReason` (e.g. past its quarantine limit); a restart resumes it",
        ));
    let consumer = Object::new("TriggerConsumer")
        .description("A trigger consumer running in this gateway.")
        .field(from_parent::<Consumer, _>(
            "name",
            TypeRef::named_nn(TypeRef::STRING),
            |c| Value::String(c.status.name.clone()),
        ))
        .field(from_parent::<Consumer, _>(
            "datastore",
            TypeRef::named_nn(TypeRef::STRING),
            |c| Value::String(c.status.datastore.clone()),
        ))
        .field(from_parent::<Consumer, _>(
            "kind",
            TypeRef::named_nn("TriggerKind"),
            |c| {
                Value::Enum(async_graphql::Name::new(if c.webhook {
                    "WEBHOOK"
                } else {
                    "RUST"
                }))
            },
        ))
        .field(
            from_parent::<Consumer, _>(
                "columns",
                TypeRef::named_nn_list_nn(TypeRef::STRING),
                |c| {
                    Value::List(
                        c.status
                            .columns
                            .iter()
                            .cloned()
                            .map(Value::String)
                            .collect(),
                    )
                },
            )
            .description("the columns whose cells it takes; empty: every column"),
        )
        .field(from_parent::<Consumer, _>(
            "state",
            TypeRef::named_nn("TriggerState"),
            |c| {
                Value::Enum(async_graphql::Name::new(if c.status.stopped.is_some() {
                    "STOPPED"
                } else {
                    "RUNNING"
                }))
            },
        ))
        .field(
            from_parent::<Consumer, _>("stoppedReason", TypeRef::named(TypeRef::STRING), |c| {
                c.status.stopped.clone().map_or(Value::Null, Value::String)
            })
            .description("why it stopped, once it has"),
        )
        .field(
            from_parent::<Consumer, _>("delivered", TypeRef::named_nn(INT64), |c| {
                int64_value(c.status.delivered as i64)
            })
            .description("cells this gateway delivered and had acknowledged since it started"),
        )
        .field(
            from_parent::<Consumer, _>("quarantined", TypeRef::named_nn(INT64), |c| {
                int64_value(c.status.quarantined as i64)
            })
            .description("quarantined cells on every cluster, as this gateway counts them"),
        )
        .field(
            from_parent::<Consumer, _>("quarantineLimit", TypeRef::named_nn(INT64), |c| {
                int64_value(c.status.quarantine_limit as i64)
            })
            .description("quarantined cells past which it stops"),
        )
        .field(
            from_parent::<Consumer, _>("heldBuckets", TypeRef::named_nn(TypeRef::INT), |c| {
                Value::from(c.status.held_buckets as u64)
            })
            .description(
                "lease buckets of shards this gateway holds (the others are other gateways')",
            ),
        )
        .field(lag_field())
        .field(quarantine_field());
    let lag = Object::new("TriggerLag")
        .description(
            "How far a consumer is behind the cell log, measured now: each shard's last `addedId` \
             against the consumer's stored offset (cells of every column count).",
        )
        .field(
            from_parent::<Lag, _>("pendingCells", TypeRef::named_nn(INT64), |l| {
                int64_value(l.0.iter().map(|c| c.pending_cells).sum())
            })
            .description("cells after its offsets, on every shard"),
        )
        .field(
            from_parent::<Lag, _>("laggingShards", TypeRef::named_nn(TypeRef::INT), |l| {
                Value::from(l.0.iter().map(|c| c.shards.len() as u64).sum::<u64>())
            })
            .description("shards with cells after its offset"),
        )
        .field(
            Field::new(
                "shards",
                TypeRef::named_nn_list_nn("TriggerShardLag"),
                |ctx| {
                    FieldFuture::new(async move {
                        let first = first_argument(&ctx, MAX_SHARDS_PAGE)?;
                        let lag = parent::<Lag>(&ctx)?;
                        let mut shards: Vec<ShardLag> = lag
                            .0
                            .iter()
                            .flat_map(|c| {
                                c.shards.iter().map(|s| ShardLag {
                                    shard: s.shard,
                                    cluster: c.cluster.clone(),
                                    pending_cells: s.pending_cells,
                                })
                            })
                            .collect();
                        shards.sort_by(|a, b| {
                            b.pending_cells
                                .cmp(&a.pending_cells)
                                .then(a.shard.cmp(&b.shard))
                        });
                        shards.truncate(first);
                        Ok(Some(FieldValue::list(
                            shards.into_iter().map(FieldValue::owned_any),
                        )))
                    })
                },
            )
            .argument(
                InputValue::new("first", TypeRef::named(TypeRef::INT))
                    .default_value(Value::from(100))
                    .description("at most 4096"),
            )
            .description("The shards that lag, most cells behind first (then by shard)."),
        )
        .field(
            Field::new(
                "clusters",
                TypeRef::named_nn_list_nn("TriggerClusterLag"),
                |ctx| {
                    FieldFuture::new(async move {
                        let lag = parent::<Lag>(&ctx)?;
                        Ok(Some(FieldValue::list(
                            lag.0.iter().map(|c| FieldValue::borrowed_any(c)),
                        )))
                    })
                },
            )
            .description("Per cluster holding the datastore's shards, in configuration order."),
        );
    let shard = Object::new("TriggerShardLag")
        .field(from_parent::<ShardLag, _>(
            "shard",
            TypeRef::named_nn(TypeRef::INT),
            |s| Value::from(s.shard),
        ))
        .field(from_parent::<ShardLag, _>(
            "cluster",
            TypeRef::named_nn(TypeRef::STRING),
            |s| Value::String(s.cluster.clone()),
        ))
        .field(
            from_parent::<ShardLag, _>("pendingCells", TypeRef::named_nn(INT64), |s| {
                int64_value(s.pending_cells)
            })
            .description("cells after the consumer's offset"),
        );
    let cluster = Object::new("TriggerClusterLag")
        .field(from_parent::<ConsumerLag, _>(
            "cluster",
            TypeRef::named_nn(TypeRef::STRING),
            |c| Value::String(c.cluster.clone()),
        ))
        .field(from_parent::<ConsumerLag, _>(
            "pendingCells",
            TypeRef::named_nn(INT64),
            |c| int64_value(c.pending_cells),
        ))
        .field(from_parent::<ConsumerLag, _>(
            "laggingShards",
            TypeRef::named_nn(TypeRef::INT),
            |c| Value::from(c.shards.len() as u64),
        ));
    let cell = Object::new("QuarantinedTriggerCell")
        .description(
            "A cell a trigger's handler kept refusing, set aside so its shard keeps flowing.",
        )
        .field(from_parent::<QuarantinedCell, _>(
            "shard",
            TypeRef::named_nn(TypeRef::INT),
            |q| Value::from(q.shard),
        ))
        .field(from_parent::<QuarantinedCell, _>(
            "addedId",
            TypeRef::named_nn(INT64),
            |q| int64_value(q.added_id),
        ))
        .field(from_parent::<QuarantinedCell, _>(
            "rowKey",
            TypeRef::named_nn(UUID),
            |q| Value::String(q.row_key.to_string()),
        ))
        .field(from_parent::<QuarantinedCell, _>(
            "column",
            TypeRef::named_nn(TypeRef::STRING),
            |q| Value::String(q.column.clone()),
        ))
        .field(from_parent::<QuarantinedCell, _>(
            "refKey",
            TypeRef::named_nn(INT64),
            |q| int64_value(q.ref_key),
        ))
        .field(
            from_parent::<QuarantinedCell, _>("attempts", TypeRef::named_nn(INT64), |q| {
                int64_value(q.attempts)
            })
            .description("deliveries that failed before it was set aside"),
        )
        .field(
            from_parent::<QuarantinedCell, _>("error", TypeRef::named_nn(TypeRef::STRING), |q| {
                Value::String(q.message.clone())
            })
            .description("the handler's last error"),
        )
        .field(
            from_parent::<QuarantinedCell, _>("retry", TypeRef::named_nn(TypeRef::BOOLEAN), |q| {
                Value::from(q.retry)
            })
            .description("asked to be delivered again, not yet taken"),
        )
        .field(from_parent::<QuarantinedCell, _>(
            "quarantinedAt",
            TypeRef::named_nn(DATETIME),
            |q| datetime_value(q.quarantined_at),
        ));
    let retried = Object::new("TriggerQuarantineRetry").field(
        from_parent::<Retried, _>("asked", TypeRef::named_nn(TypeRef::INT), |r| {
            Value::from(r.0)
        })
        .description(
            "quarantined cells asked to be delivered again (by the gateway holding their \
             shard, at its next sweep; those the handler takes leave the quarantine)",
        ),
    );
    (
        vec![consumer, lag, shard, cluster, cell, retried],
        vec![kind, state],
    )
}

/// `TriggerConsumer.lag`: measured when asked, one statement per cluster.
fn lag_field() -> Field {
    Field::new("lag", TypeRef::named_nn("TriggerLag"), |ctx| {
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let consumer = parent::<Consumer>(&ctx)?;
            let lag = store
                .trigger_lag(&consumer.status.datastore, &consumer.status.name)
                .await
                .map_err(|e| from_store(&e))?;
            Ok(Some(FieldValue::owned_any(Lag(lag))))
        })
    })
    .description("How far it is behind the cell log, measured now on every cluster.")
}

/// `TriggerConsumer.quarantine`.
fn quarantine_field() -> Field {
    Field::new(
        "quarantine",
        TypeRef::named_nn_list_nn("QuarantinedTriggerCell"),
        |ctx| {
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let first = first_argument(&ctx, MAX_QUARANTINE_PAGE)?;
                let consumer = parent::<Consumer>(&ctx)?;
                let mut cells = store
                    .trigger_quarantine(&consumer.status.datastore, &consumer.status.name)
                    .await
                    .map_err(|e| from_store(&e))?;
                cells.truncate(first);
                Ok(Some(FieldValue::list(
                    cells.into_iter().map(FieldValue::owned_any),
                )))
            })
        },
    )
    .argument(
        InputValue::new("first", TypeRef::named(TypeRef::INT))
            .default_value(Value::from(100))
            .description("at most 1000"),
    )
    .description("Its quarantined cells on every cluster, in shard and `addedId` order.")
}

/// `<Ds>Query.triggers`.
pub(super) fn query_field(datastore: &Datastore, ds: &Arc<str>) -> Field {
    let d = ds.clone();
    let webhooks: Arc<Vec<String>> =
        Arc::new(datastore.triggers.iter().map(|t| t.name.clone()).collect());
    Field::new(
        QUERY_FIELD,
        TypeRef::named_nn_list_nn("TriggerConsumer"),
        move |ctx| {
            let ds = d.clone();
            let webhooks = webhooks.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let name = ctx
                    .args
                    .get("name")
                    .filter(|v| !v.is_null())
                    .map(|v| v.string().map(str::to_string))
                    .transpose()?;
                let mut consumers: Vec<Consumer> = store
                    .consumers()
                    .into_iter()
                    .filter(|c| *c.datastore == *ds)
                    .filter(|c| name.as_deref().is_none_or(|n| n == c.name))
                    .map(|status| Consumer {
                        webhook: webhooks.contains(&status.name),
                        status,
                    })
                    .collect();
                consumers.sort_by(|a, b| a.status.name.cmp(&b.status.name));
                Ok(Some(FieldValue::list(
                    consumers.into_iter().map(FieldValue::owned_any),
                )))
            })
        },
    )
    .argument(
        InputValue::new("name", TypeRef::named(TypeRef::STRING)).description("only this consumer"),
    )
    .description(format!(
        "The trigger consumers of `{}` running in this gateway, by name.",
        datastore.name
    ))
}

/// `Mutation.<ds>RetryTriggerQuarantine`.
pub(super) fn retry_field(datastore: &Datastore, ds: &Arc<str>) -> Field {
    let d = ds.clone();
    let webhooks: Arc<Vec<String>> =
        Arc::new(datastore.triggers.iter().map(|t| t.name.clone()).collect());
    Field::new(
        retry_field_name(&datastore.name),
        TypeRef::named_nn("TriggerQuarantineRetry"),
        move |ctx| {
            let ds = d.clone();
            let webhooks = webhooks.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let trigger = ctx.args.try_get("trigger")?.string()?.to_string();
                let known = webhooks.contains(&trigger)
                    || store
                        .consumers()
                        .iter()
                        .any(|c| *c.datastore == *ds && c.name == trigger);
                if !known {
                    return Err(bad_input(format!(
                        "no trigger `{trigger}` of `{ds}` is defined or runs in this gateway"
                    )));
                }
                let asked = store
                    .retry_trigger_quarantine(&ds, &trigger)
                    .await
                    .map_err(|e| from_store(&e))?;
                Ok(Some(FieldValue::owned_any(Retried(asked))))
            })
        },
    )
    .argument(
        InputValue::new("trigger", TypeRef::named_nn(TypeRef::STRING))
            .description("the consumer's name"),
    )
    .description(format!(
        "Has the quarantined cells of a trigger of `{}` delivered again.",
        datastore.name
    ))
}

/// The name of the retry mutation of `datastore`.
pub(super) fn retry_field_name(datastore: &str) -> String {
    format!("{}RetryTriggerQuarantine", camel(datastore))
}
