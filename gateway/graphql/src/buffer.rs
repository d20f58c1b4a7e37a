//! Buffered writes and storage nodes in the schema: per datastore the
//! backlog and replay figures (`buffer`), the conflicts replay recorded
//! (`bufferConflicts`), and the clusters holding its shards with the
//! circuit breaker of each database node (`storage`), admin fields next to
//! the index maintenance ones.

use std::sync::Arc;

use async_graphql::dynamic::{Field, FieldFuture, FieldValue, InputValue, Object, TypeRef};
use async_graphql::Value;
use cellgate_store::cells::{Backlog, Conflict};
use cellgate_store::replicas::ReplicaLag;
use cellgate_store::storage::breaker::BreakerStatus;
use cellgate_store::{ClusterMetrics, DatastoreMetrics, Store};

use super::errors::{coded, from_store};
use super::scalars::{datetime_value, int64_value, json_value, DATETIME, INT64, JSON, UUID};
use crate::fields::{from_parent, parent};

/// Most conflicts one query returns.
const MAX_CONFLICTS_PAGE: usize = 1000;

/// The names these fields take in each datastore's query type.
pub(super) const QUERY_FIELDS: [&str; 3] = ["buffer", "bufferConflicts", "storage"];

/// The object types of this module.
pub(super) fn types() -> Vec<Object> {
    vec![
        Object::new("BufferStatus")
            .description("Writes kept in buffers while their primary was down, and their replay.")
            .field(
                Field::new(
                    "clusters",
                    TypeRef::named_nn_list_nn("BufferBacklog"),
                    |ctx| {
                        FieldFuture::new(async move {
                            let metrics = parent::<DatastoreMetrics>(&ctx)?;
                            Ok(Some(FieldValue::list(
                                metrics.buffered.iter().cloned().map(FieldValue::owned_any),
                            )))
                        })
                    },
                )
                .description("per cluster holding buffered writes, from the latest count"),
            )
            .field(
                from_parent::<DatastoreMetrics, _>("replayedCells", TypeRef::named_nn(INT64), |m| {
                    int64_value(m.cells_replayed as i64)
                })
                .description("buffered cells this gateway delivered to their primary since it started"),
            )
            .field(
                from_parent::<DatastoreMetrics, _>("conflicts", TypeRef::named_nn(INT64), |m| {
                    int64_value(m.replay_conflicts as i64)
                })
                .description("buffered writes this gateway recorded as conflicts since it started"),
            )
            .field(
                from_parent::<DatastoreMetrics, _>("releasedCopies", TypeRef::named_nn(INT64), |m| {
                    int64_value(m.copies_released as i64)
                })
                .description("buffer copies this gateway deleted once the primary's master and all its replicas had their cells, since it started"),
            ),
        Object::new("BufferBacklog")
            .description("The buffered writes one cluster holds for other clusters' primaries.")
            .field(from_parent::<Backlog, _>(
                "cluster",
                TypeRef::named_nn(TypeRef::STRING),
                |b| Value::String(b.cluster.clone()),
            ))
            .field(from_parent::<Backlog, _>("cells", TypeRef::named_nn(INT64), |b| {
                int64_value(b.cells)
            }))
            .field(
                from_parent::<Backlog, _>("oldest", TypeRef::named(DATETIME), |b| {
                    b.oldest.map_or(Value::Null, datetime_value)
                })
                .description("when the oldest was buffered; null when there are none"),
            )
            .field(
                from_parent::<Backlog, _>("awaitingReplicas", TypeRef::named_nn(INT64), |b| {
                    int64_value(b.awaiting_replicas)
                })
                .description("of `cells`, those their primary's master has, kept until its replicas have them too (from the latest pass of the gateway replaying this buffer; 0 on the others)"),
            ),
        Object::new("StorageCluster")
            .description("A storage cluster holding some of the datastore's shards.")
            .field(from_parent::<ClusterMetrics, _>(
                "name",
                TypeRef::named_nn(TypeRef::STRING),
                |c| Value::String(c.name.clone()),
            ))
            .field(
                from_parent::<ClusterMetrics, _>("ready", TypeRef::named_nn(TypeRef::BOOLEAN), |c| {
                    Value::from(c.ready)
                })
                .description("prepared and serving"),
            )
            .field(
                Field::new("breakers", TypeRef::named_nn_list_nn("NodeBreaker"), |ctx| {
                    FieldFuture::new(async move {
                        let cluster = parent::<ClusterMetrics>(&ctx)?;
                        Ok(Some(FieldValue::list(
                            cluster.breakers.iter().cloned().map(FieldValue::owned_any),
                        )))
                    })
                })
                .description("the circuit breaker of each database server, the master first; empty for SQLite files"),
            )
            .field(
                Field::new("replicas", TypeRef::named_nn_list_nn("ReplicaLag"), |ctx| {
                    FieldFuture::new(async move {
                        let cluster = parent::<ClusterMetrics>(&ctx)?;
                        Ok(Some(FieldValue::list(
                            cluster.replicas.iter().cloned().map(FieldValue::owned_any),
                        )))
                    })
                })
                .description("how far each replica is behind its master, measured twice a second; empty without replicas"),
            ),
        Object::new("ReplicaLag")
            .description("How far one replica is behind its master.")
            .field(
                from_parent::<ReplicaLag, _>("node", TypeRef::named_nn(TypeRef::STRING), |r| {
                    Value::String(r.node.clone())
                })
                .description("`replica<i>` for the i-th replica (from 0)"),
            )
            .field(
                from_parent::<ReplicaLag, _>("cellsBehind", TypeRef::named_nn(INT64), |r| {
                    int64_value(r.cells_behind)
                })
                .description("cells the master has that the replica has not applied yet"),
            )
            .field(
                from_parent::<ReplicaLag, _>("lagMs", TypeRef::named_nn(INT64), |r| {
                    int64_value(r.lag_ms as i64)
                })
                .description("how long ago the master had no more cells than the replica has now"),
            ),
        Object::new("NodeBreaker")
            .description("The circuit breaker in front of one database server.")
            .field(
                from_parent::<BreakerStatus, _>("node", TypeRef::named_nn(TypeRef::STRING), |b| {
                    Value::String(b.node.clone())
                })
                .description("`master`, or `replica<i>` for the i-th replica (from 0)"),
            )
            .field(
                from_parent::<BreakerStatus, _>("state", TypeRef::named_nn(TypeRef::STRING), |b| {
                    Value::String(b.state.as_str().to_string())
                })
                .description("`closed` (statements go through), `open` (they fail at once) or `half_open` (one probe goes through)"),
            )
            .field(
                from_parent::<BreakerStatus, _>(
                    "consecutiveFailures",
                    TypeRef::named_nn(TypeRef::INT),
                    |b| Value::from(b.consecutive_failures),
                )
                .description("failures in a row since the last success"),
            )
            .field(
                from_parent::<BreakerStatus, _>("opened", TypeRef::named_nn(INT64), |b| {
                    int64_value(b.opened as i64)
                })
                .description("times it opened since the gateway started"),
            ),
        Object::new("BufferConflict")
            .description("A buffered write that lost to another body of its key when it was replayed. The stored cell keeps the winning body; this one is kept here.")
            .field(from_parent::<Conflict, _>("rowKey", TypeRef::named_nn(UUID), |c| {
                Value::String(c.key.row_key.to_string())
            }))
            .field(from_parent::<Conflict, _>(
                "column",
                TypeRef::named_nn(TypeRef::STRING),
                |c| Value::String(c.key.column.clone()),
            ))
            .field(from_parent::<Conflict, _>("refKey", TypeRef::named_nn(INT64), |c| {
                int64_value(c.key.ref_key)
            }))
            .field(
                from_parent::<Conflict, _>("body", TypeRef::named_nn(JSON), |c| json_value(&c.body))
                    .description("the losing body"),
            )
            .field(
                from_parent::<Conflict, _>("bodyHash", TypeRef::named_nn(TypeRef::STRING), |c| {
                    Value::String(c.body_hash.clone())
                })
                .description("xxh3 of the losing body's JSON text, hex"),
            )
            .field(
                from_parent::<Conflict, _>("storedHash", TypeRef::named_nn(TypeRef::STRING), |c| {
                    Value::String(c.stored_hash.clone())
                })
                .description("xxh3 of the stored (winning) body's JSON text, hex"),
            )
            .field(
                from_parent::<Conflict, _>("bufferedOn", TypeRef::named_nn(TypeRef::STRING), |c| {
                    Value::String(c.buffered_on.clone())
                })
                .description("the cluster whose buffer held the losing write"),
            )
            .field(from_parent::<Conflict, _>(
                "bufferedAt",
                TypeRef::named_nn(DATETIME),
                |c| datetime_value(c.buffered_at),
            ))
            .field(from_parent::<Conflict, _>(
                "recordedAt",
                TypeRef::named_nn(DATETIME),
                |c| datetime_value(c.recorded_at),
            )),
    ]
}

/// `buffer` and `bufferConflicts` of one datastore.
pub(super) fn query_fields(ds: &Arc<str>) -> Vec<Field> {
    let d = ds.clone();
    let buffer = Field::new("buffer", TypeRef::named_nn("BufferStatus"), move |ctx| {
        let ds = d.clone();
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let metrics = store
                .metrics()
                .datastores
                .into_iter()
                .find(|m| *m.name == *ds)
                .ok_or_else(|| coded("UNKNOWN_DATASTORE", format!("unknown datastore `{ds}`")))?;
            Ok(Some(FieldValue::owned_any(metrics)))
        })
    })
    .description("Buffered writes waiting for their primary, and their replay.");
    let d = ds.clone();
    let conflicts = Field::new(
        "bufferConflicts",
        TypeRef::named_nn_list_nn("BufferConflict"),
        move |ctx| {
            let ds = d.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let first = crate::args::first_argument(&ctx, MAX_CONFLICTS_PAGE)?;
                let conflicts = store
                    .buffer_conflicts(&ds, first)
                    .await
                    .map_err(|e| from_store(&e))?;
                Ok(Some(FieldValue::list(
                    conflicts.into_iter().map(FieldValue::owned_any),
                )))
            })
        },
    )
    .argument(
        InputValue::new("first", TypeRef::named(TypeRef::INT))
            .default_value(Value::from(100))
            .description("at most 1000"),
    )
    .description("Buffered writes that lost to another body of their key on replay, newest first.");
    let d = ds.clone();
    let storage = Field::new(
        "storage",
        TypeRef::named_nn_list_nn("StorageCluster"),
        move |ctx| {
            let ds = d.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let clusters = clusters_of(store, &ds);
                Ok(Some(FieldValue::list(clusters.into_iter().map(FieldValue::owned_any))))
            })
        },
    )
    .description("The clusters holding this datastore's shards, with the circuit breaker of each database server.");
    vec![buffer, conflicts, storage]
}

/// The clusters holding `datastore`'s shards, as measured now.
pub(crate) fn clusters_of(store: &Store, datastore: &str) -> Vec<ClusterMetrics> {
    let holding: std::collections::BTreeSet<String> = store
        .topology(datastore)
        .into_iter()
        .map(|(_, _, c)| c)
        .collect();
    store
        .metrics()
        .clusters
        .into_iter()
        .filter(|c| holding.contains(&c.name))
        .collect()
}
