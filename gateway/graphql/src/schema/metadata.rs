//! `Query.datastores`: the definitions and the shard topology, as
//! clients and the explorer read them.

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
            .field(meta_field(
                "topology",
                TypeRef::named_nn_list_nn("ShardRangeInfo"),
            ))
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
    ]
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
pub(super) fn datastores_field(topology: Topology<'_>, defs: &index_dsl::Definitions) -> Field {
    let value = Value::List(
        defs.datastores
            .iter()
            .map(|d| {
                let topology = topology(&d.name)
                    .into_iter()
                    .map(|(first, last, cluster)| {
                        obj(vec![
                            ("first", Value::from(first)),
                            ("last", Value::from(last)),
                            ("cluster", Value::String(cluster)),
                        ])
                    })
                    .collect();
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
                        Value::List(d.indexes.iter().map(index_info).collect()),
                    ),
                    ("topology", Value::List(topology)),
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
            FieldFuture::new(async move { Ok(Some(meta_value(value))) })
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
