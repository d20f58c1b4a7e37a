//! IDs in the schema: `Query.nextIds`, `snowflakeIds`, `taggedIds`,
//! `decodeId` and `idTags`, and `Mutation.createIdTag`. IDs are `Int64`,
//! returned as decimal strings so JavaScript keeps them exact.

use async_graphql::dynamic::{
    Enum, EnumItem, Field, FieldFuture, FieldValue, InputValue, Object, TypeRef,
};
use async_graphql::{Name, Value};

use super::errors::{bad_input, from_store};
use super::scalars::{datetime_value, int64, int64_value, DATETIME, INT64, UUID};
use crate::fields::from_parent;
use cellgate_store::ids::{DecodedId, IdKind, NewTag, TagRow};
use cellgate_store::Store;

/// The mutation that creates a biz tag.
pub(super) const CREATE_TAG: &str = "createIdTag";

/// The top-level query fields of this module, for name clash checks and
/// the access check.
pub(super) const QUERY_FIELDS: [&str; 5] =
    ["nextIds", "snowflakeIds", "taggedIds", "decodeId", "idTags"];

/// The types of this module.
pub(super) fn types() -> (Vec<Object>, Vec<Enum>) {
    let decoded = Object::new("DecodedId")
        .description("The parts of an ID.")
        .field(from_parent::<DecodedId, _>(
            "id",
            TypeRef::named_nn(INT64),
            |d| int64_value(d.id),
        ))
        .field(
            from_parent::<DecodedId, _>("kind", TypeRef::named_nn("IdKind"), |d| {
                Value::Enum(Name::new(match d.kind {
                    IdKind::Snowflake => "SNOWFLAKE",
                    IdKind::Tagged => "TAGGED",
                }))
            })
            .description("read by the version bits 62-61: 0 snowflake, 1 tagged"),
        )
        .field(from_parent::<DecodedId, _>(
            "version",
            TypeRef::named_nn(TypeRef::INT),
            |d| Value::from(d.version),
        ))
        .field(
            from_parent::<DecodedId, _>("shard", TypeRef::named(TypeRef::INT), |d| {
                d.shard.map(Value::from).unwrap_or(Value::Null)
            })
            .description("the logical shard a tagged ID names"),
        )
        .field(
            from_parent::<DecodedId, _>("time", TypeRef::named_nn(DATETIME), |d| {
                datetime_value(d.time)
            })
            .description("when it was issued (tagged IDs: to the second)"),
        )
        .field(from_parent::<DecodedId, _>(
            "workerId",
            TypeRef::named_nn(TypeRef::INT),
            |d| Value::from(d.worker),
        ))
        .field(from_parent::<DecodedId, _>(
            "sequence",
            TypeRef::named_nn(TypeRef::INT),
            |d| Value::from(d.sequence),
        ));
    let tag = Object::new("IdTag")
        .description("A biz tag of segment IDs as stored.")
        .field(from_parent::<TagRow, _>(
            "bizTag",
            TypeRef::named_nn(TypeRef::STRING),
            |t| Value::String(t.tag.clone()),
        ))
        .field(
            from_parent::<TagRow, _>("maxId", TypeRef::named_nn(INT64), |t| int64_value(t.max_id))
                .description("end (exclusive) of the latest segment taken by any gateway"),
        )
        .field(from_parent::<TagRow, _>(
            "step",
            TypeRef::named_nn(INT64),
            |t| int64_value(t.step),
        ))
        .field(from_parent::<TagRow, _>(
            "description",
            TypeRef::named_nn(TypeRef::STRING),
            |t| Value::String(t.description.clone()),
        ))
        .field(from_parent::<TagRow, _>(
            "updateTime",
            TypeRef::named_nn(DATETIME),
            |t| datetime_value(t.update_time),
        ));
    let kind = Enum::new("IdKind")
        .description("The bit layout of an ID.")
        .item(
            EnumItem::new("SNOWFLAKE")
                .description("1 + 41 bits ms + 10 bits worker + 12 bits sequence"),
        )
        .item(
            EnumItem::new("TAGGED")
                .description("version + 12 bits logical shard + seconds, worker, sequence"),
        );
    (vec![decoded, tag], vec![kind])
}

fn count_arg() -> InputValue {
    InputValue::new("count", TypeRef::named_nn(TypeRef::INT))
        .default_value(Value::from(1))
        .description("how many IDs (at most ids.max_count)")
}

fn count(ctx: &async_graphql::dynamic::ResolverContext<'_>) -> async_graphql::Result<usize> {
    let count = ctx.args.try_get("count")?.i64()?;
    usize::try_from(count).map_err(|_| bad_input("count must be at least 1"))
}

fn id_list(ids: Vec<i64>) -> FieldValue<'static> {
    FieldValue::list(ids.into_iter().map(|id| FieldValue::value(int64_value(id))))
}

/// The query fields.
pub(super) fn query_fields() -> Vec<Field> {
    let next = Field::new("nextIds", TypeRef::named_nn_list_nn(INT64), |ctx| {
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let tag = ctx.args.try_get("bizTag")?.string()?.to_string();
            let count = count(&ctx)?;
            let ids = store.ids().next_ids(&tag, count).await.map_err(|e| from_store(&e))?;
            Ok(Some(id_list(ids)))
        })
    })
    .argument(InputValue::new("bizTag", TypeRef::named_nn(TypeRef::STRING)))
    .argument(count_arg())
    .description("The next IDs of a biz tag (Leaf segment mode): unique, increasing per gateway, served from memory. Unknown tags are UNKNOWN_BIZ_TAG.");
    let snowflake = Field::new("snowflakeIds", TypeRef::named_nn_list_nn(INT64), |ctx| {
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let count = count(&ctx)?;
            let ids = store
                .ids()
                .snowflake_ids(count)
                .await
                .map_err(|e| from_store(&e))?;
            Ok(Some(id_list(ids)))
        })
    })
    .argument(count_arg())
    .description("Snowflake IDs: time-ordered, from this gateway's leased worker id.");
    let tagged = Field::new("taggedIds", TypeRef::named_nn_list_nn(INT64), |ctx| {
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let datastore = ctx.args.try_get("datastore")?.string()?.to_string();
            let row_key = ctx.args.try_get("rowKey")?.string()?;
            let row_key = uuid::Uuid::parse_str(row_key)
                .map_err(|_| bad_input("`rowKey` must be a UUID"))?;
            let count = count(&ctx)?;
            let shard = store.row_shard(&datastore, &row_key).map_err(|e| from_store(&e))?;
            let ids = store.ids().tagged_ids(shard, count).await.map_err(|e| from_store(&e))?;
            Ok(Some(id_list(ids)))
        })
    })
    .argument(InputValue::new("datastore", TypeRef::named_nn(TypeRef::STRING)))
    .argument(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
    .argument(count_arg())
    .description("Shard-tagged IDs that carry the logical shard of `rowKey` in `datastore`, so the ID alone routes a lookup (decode with decodeId). At most 512 per call: what one worker issues per shard and second.");
    let decode = Field::new("decodeId", TypeRef::named_nn("DecodedId"), |ctx| {
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let id = int64(&ctx.args.try_get("id")?, "id")?;
            let decoded = store.ids().decode(id).map_err(|e| from_store(&e))?;
            Ok(Some(FieldValue::owned_any(decoded)))
        })
    })
    .argument(InputValue::new("id", TypeRef::named_nn(INT64)))
    .description("Splits a snowflake or tagged ID into version, shard, time, worker and sequence.");
    let tags = Field::new("idTags", TypeRef::named_nn_list_nn("IdTag"), |ctx| {
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let tags = store.ids().tags().await.map_err(|e| from_store(&e))?;
            Ok(Some(FieldValue::list(
                tags.into_iter().map(FieldValue::owned_any),
            )))
        })
    })
    .description("The biz tags of segment IDs.");
    vec![next, snowflake, tagged, decode, tags]
}

/// `Mutation.createIdTag`.
pub(super) fn create_tag_field() -> Field {
    Field::new(CREATE_TAG, TypeRef::named_nn(TypeRef::BOOLEAN), |ctx| {
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let tag = NewTag {
                name: ctx.args.try_get("bizTag")?.string()?.to_string(),
                step: int64(&ctx.args.try_get("step")?, "step")?,
                start: int64(&ctx.args.try_get("start")?, "start")?,
                description: ctx.args.try_get("description")?.string()?.to_string(),
            };
            let created = store
                .ids()
                .create_tag(&tag)
                .await
                .map_err(|e| from_store(&e))?;
            Ok(Some(FieldValue::value(Value::from(created))))
        })
    })
    .argument(InputValue::new(
        "bizTag",
        TypeRef::named_nn(TypeRef::STRING),
    ))
    .argument(
        InputValue::new("step", TypeRef::named_nn(INT64))
            .default_value(Value::from(1000))
            .description("length of the first segment"),
    )
    .argument(
        InputValue::new("start", TypeRef::named_nn(INT64))
            .default_value(Value::from(1))
            .description("the first ID"),
    )
    .argument(
        InputValue::new("description", TypeRef::named_nn(TypeRef::STRING))
            .default_value(Value::from("")),
    )
    .description("Creates a biz tag for nextIds; false when it exists already (left unchanged).")
}
