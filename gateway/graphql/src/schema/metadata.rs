//! `Query.datastores`: the definitions and the shard topology, as
//! clients and the explorer read them.
//!
//! The definitions part is built once with the schema. The topology part
//! (the shard ranges, the stored topology version, the shard move in
//! progress) is read from the store at each request: `cellgate shard move`
//! changes it while the gateway serves, without a schema rebuild.

use std::collections::HashMap;

use async_graphql::dynamic::{Field, FieldFuture, Object, TypeRef};
use async_graphql::Value;
use index_dsl::Index;

use crate::scalars::{self};

use super::*;

pub(super) fn metadata_types() -> Vec<Object> {
    vec![
        Object::new("DatastoreInfo")
            .description("A datastore's definition and where its shards live.")
            .field(meta_field("name", TypeRef::named_nn(TypeRef::STRING)))
            .field(meta_field("description", TypeRef::named(TypeRef::STRING)))
            .field(meta_field(
                "graphqlField",
                TypeRef::named_nn(TypeRef::STRING),
            ))
            .field(meta_field("shards", TypeRef::named_nn(TypeRef::INT)))
            .field(meta_field(
                "columns",
                TypeRef::named_nn_list_nn("ColumnInfo"),
            ))
            .field(meta_field(
                "indexes",
                TypeRef::named_nn_list_nn("IndexInfo"),
            ))
            .field(
                meta_field("topology", TypeRef::named_nn_list_nn("ShardRangeInfo")).description(
                    "Where the shards live now: contiguous ranges of shards per storage cluster, \
                     from the topology version this gateway serves.",
                ),
            )
            .field(
                meta_field("topologyVersion", TypeRef::named_nn(TypeRef::INT)).description(
                    "The stored topology version this gateway serves; each step a shard move \
                     records (a phase, a new route) makes a new one (0: none read yet).",
                ),
            )
            .field(
                meta_field("move", TypeRef::named("ShardMoveInfo")).description(
                    "The shard move recorded for this datastore (`cellgate shard move`), as this \
                     gateway last read it; null when none is.",
                ),
            )
            .field(clusters_field()),
        Object::new("ColumnInfo")
            .field(meta_field("name", TypeRef::named_nn(TypeRef::STRING)))
            .field(meta_field("description", TypeRef::named(TypeRef::STRING)))
            .field(meta_field(
                "graphqlName",
                TypeRef::named_nn(TypeRef::STRING),
            )),
        Object::new("IndexInfo")
            .field(meta_field("name", TypeRef::named_nn(TypeRef::STRING)))
            .field(meta_field("description", TypeRef::named(TypeRef::STRING)))
            .field(meta_field(
                "graphqlField",
                TypeRef::named_nn(TypeRef::STRING),
            ))
            .field(meta_field("shardField", TypeRef::named_nn(TypeRef::STRING)))
            .field(meta_field(
                "columns",
                TypeRef::named_nn_list_nn(TypeRef::STRING),
            ))
            .field(meta_field(
                "fields",
                TypeRef::named_nn_list_nn("IndexFieldInfo"),
            )),
        Object::new("IndexFieldInfo")
            .field(meta_field("name", TypeRef::named_nn(TypeRef::STRING)))
            .field(meta_field(
                "graphqlName",
                TypeRef::named_nn(TypeRef::STRING),
            ))
            .field(meta_field("path", TypeRef::named_nn(TypeRef::STRING)))
            .field(meta_field("type", TypeRef::named_nn(TypeRef::STRING)))
            .field(meta_field("column", TypeRef::named_nn(TypeRef::STRING))),
        Object::new("ShardRangeInfo")
            .field(meta_field("first", TypeRef::named_nn(TypeRef::INT)))
            .field(meta_field("last", TypeRef::named_nn(TypeRef::INT)))
            .field(meta_field("cluster", TypeRef::named_nn(TypeRef::STRING))),
        shard_move_type(),
    ]
}

/// `ShardMoveInfo`: a recorded move of a shard range between clusters.
fn shard_move_type() -> Object {
    let field = |name, ty, description| meta_field(name, ty).description(description);
    Object::new("ShardMoveInfo")
        .description(
            "A move of a shard range to another cluster (`cellgate shard move`), as recorded in \
             the stored topology. It goes through the phases copy, catch_up, fence, switch, \
             drain, verify, cleanup; a move kept with `--keep-source` stays recorded at `done` \
             until it is finished or moved back.",
        )
        .field(field(
            "first",
            TypeRef::named_nn(TypeRef::INT),
            "The first shard of the range.",
        ))
        .field(field(
            "last",
            TypeRef::named_nn(TypeRef::INT),
            "The last shard of the range (inclusive).",
        ))
        .field(field(
            "source",
            TypeRef::named_nn(TypeRef::STRING),
            "The cluster the range moves from.",
        ))
        .field(field(
            "target",
            TypeRef::named_nn(TypeRef::STRING),
            "The cluster the range moves to.",
        ))
        .field(field(
            "phase",
            TypeRef::named_nn(TypeRef::STRING),
            "The phase recorded last: copy, catch_up, fence, switch, drain, verify, cleanup \
             or done.",
        ))
        .field(field(
            "startedAt",
            TypeRef::named_nn(scalars::DATETIME),
            "When the move started.",
        ))
        .field(field(
            "cellsCopied",
            TypeRef::named_nn(scalars::INT64),
            "Cells copied to the target, as recorded when the current phase began.",
        ))
        .field(field(
            "keepSource",
            TypeRef::named_nn(TypeRef::BOOLEAN),
            "The source's copy is kept when the move is done (`--keep-source`), so the range \
             can be moved back cheaply.",
        ))
}

/// The parts of a datastore's `DatastoreInfo` that change while the
/// gateway serves (see the module doc).
fn live_topology(store: &cellgate_store::Store) -> HashMap<String, Vec<(&'static str, Value)>> {
    store
        .metrics()
        .datastores
        .into_iter()
        .map(|ds| {
            let ranges = store
                .topology(&ds.name)
                .into_iter()
                .map(|(first, last, cluster)| {
                    obj(vec![
                        ("first", Value::from(first)),
                        ("last", Value::from(last)),
                        ("cluster", Value::String(cluster)),
                    ])
                })
                .collect();
            let fields = vec![
                ("topology", Value::List(ranges)),
                ("topologyVersion", Value::from(ds.topology_version)),
                ("move", ds.moving.as_ref().map_or(Value::Null, move_info)),
            ];
            (ds.name, fields)
        })
        .collect()
}

fn move_info(record: &cellgate_store::moves::MoveRecord) -> Value {
    obj(vec![
        ("first", Value::from(record.first)),
        ("last", Value::from(record.last)),
        ("source", Value::String(record.source.clone())),
        ("target", Value::String(record.target.clone())),
        ("phase", Value::String(record.phase.name().to_string())),
        ("startedAt", scalars::datetime_value(record.started_at)),
        (
            "cellsCopied",
            scalars::int64_value(i64::try_from(record.copied).unwrap_or(i64::MAX)),
        ),
        ("keepSource", Value::Boolean(record.keep_source)),
    ])
}

/// `DatastoreInfo.clusters`: the clusters holding the datastore's shards,
/// with their nodes' circuit breakers and replica lag, as measured now.
fn clusters_field() -> Field {
    Field::new(
        "clusters",
        TypeRef::named_nn_list_nn("StorageCluster"),
        |ctx| {
            FieldFuture::new(async move {
                let store = ctx.data::<cellgate_store::Store>()?;
                let name = match ctx.parent_value.as_value() {
                    Some(Value::Object(map)) => match map.get("name") {
                        Some(Value::String(name)) => name.clone(),
                        _ => String::new(),
                    },
                    _ => String::new(),
                };
                let clusters = crate::buffer::clusters_of(store, &name);
                Ok(Some(async_graphql::dynamic::FieldValue::list(
                    clusters
                        .into_iter()
                        .map(async_graphql::dynamic::FieldValue::owned_any),
                )))
            })
        },
    )
    .description(
        "The clusters holding the shards: readiness, each server's circuit breaker and each \
         replica's lag, as measured now.",
    )
}

pub(super) fn obj(entries: Vec<(&str, Value)>) -> Value {
    Value::Object(
        entries
            .into_iter()
            .map(|(k, v)| (scalars::name(k), v))
            .collect(),
    )
}

pub(super) fn opt(s: &Option<String>) -> Value {
    s.clone().map_or(Value::Null, Value::String)
}

/// `Query.datastores`: definitions and topology, for tools and the explorer.
pub(super) fn datastores_field(defs: &index_dsl::Definitions) -> Field {
    let value = Value::List(
        defs.datastores
            .iter()
            .map(|d| {
                obj(vec![
                    ("name", Value::String(d.name.clone())),
                    ("description", opt(&d.description)),
                    ("graphqlField", Value::String(camel(&d.name))),
                    ("shards", Value::from(d.shards)),
                    (
                        "columns",
                        Value::List(
                            d.columns
                                .iter()
                                .map(|c| {
                                    obj(vec![
                                        ("name", Value::String(c.name.clone())),
                                        ("description", opt(&c.description)),
                                        ("graphqlName", Value::String(camel(&c.name))),
                                    ])
                                })
                                .collect(),
                        ),
                    ),
                    (
                        "indexes",
                        Value::List(d.indexes.iter().map(|i| index_info(i)).collect()),
                    ),
                ])
            })
            .collect(),
    );
    Field::new(
        "datastores",
        TypeRef::named_nn_list_nn("DatastoreInfo"),
        move |ctx| {
            let mut value = value.clone();
            // Only the datastores the caller may read are listed.
            if let (Ok(principal), Value::List(items)) =
                (ctx.data::<crate::auth::Principal>(), &mut value)
            {
                items.retain(|item| match item {
                    Value::Object(fields) => match fields.get("name") {
                        Some(Value::String(name)) => {
                            principal.allows(name, crate::auth::Access::Read)
                        }
                        _ => false,
                    },
                    _ => false,
                });
            }
            FieldFuture::new(async move {
                let store = ctx.data::<cellgate_store::Store>()?;
                let mut live = live_topology(store);
                if let Value::List(items) = &mut value {
                    for item in items {
                        let Value::Object(fields) = item else {
                            continue;
                        };
                        let name = match fields.get("name") {
                            Some(Value::String(name)) => name.clone(),
                            _ => continue,
                        };
                        // A datastore the store does not serve (yet) has
                        // no shard on any cluster.
                        let found = live.remove(&name).unwrap_or_else(|| {
                            vec![
                                ("topology", Value::List(Vec::new())),
                                ("topologyVersion", Value::from(0)),
                            ]
                        });
                        for (key, v) in found {
                            fields.insert(scalars::name(key), v);
                        }
                    }
                }
                Ok(Some(meta_value(value)))
            })
        },
    )
    .description("Every datastore's definition, indexes and shard topology.")
}

pub(super) fn index_info(index: &Index) -> Value {
    obj(vec![
        ("name", Value::String(index.name.clone())),
        ("description", opt(&index.description)),
        ("graphqlField", Value::String(camel(&index.name))),
        (
            "shardField",
            Value::String(index.shard_field().name.clone()),
        ),
        (
            "columns",
            Value::List(index.columns.iter().cloned().map(Value::String).collect()),
        ),
        (
            "fields",
            Value::List(
                index
                    .fields
                    .iter()
                    .map(|f| {
                        obj(vec![
                            ("name", Value::String(f.name.clone())),
                            ("graphqlName", Value::String(camel(&f.name))),
                            ("path", Value::String(f.path.to_string())),
                            ("type", Value::String(f.ty.name().to_string())),
                            ("column", Value::String(f.column.clone())),
                        ])
                    })
                    .collect(),
            ),
        ),
    ])
}
