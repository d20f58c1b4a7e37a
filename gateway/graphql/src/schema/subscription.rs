//! `Subscription.<ds>Cells`: a datastore's new cells as they are committed
//! (SPEC §7), and the `<Ds>CellEvent` it yields.
//!
//! Each event carries the cell and a `cursor`: the follower's per-shard
//! positions after that cell, as the opaque token of
//! [`cellgate_store::triggers::tail::encode_cursor`]. A client that passes
//! the cursor of the last event it handled as `after` gets every later
//! cell of its columns, with no gap; without `after` it starts from now.
//! The store reads the log once per commit for all subscriptions of a
//! datastore (`triggers/tail.rs`); this module only filters and encodes.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_graphql::dynamic::{
    FieldValue, InputValue, Object, SubscriptionField, SubscriptionFieldFuture, TypeRef,
};
use async_graphql::Value;
use index_dsl::Datastore;

use crate::errors::{bad_input, from_store};
use cellgate_store::cells::Cell;
use cellgate_store::triggers::tail::{decode_cursor, encode_cursor, FollowOptions};
use cellgate_store::Store;

use super::*;

/// One event of a subscription: the cell and the cursor after it.
struct CellEvent {
    cursor: String,
    cell: Arc<Cell>,
}

/// The name of the event type of `datastore`.
pub(super) fn event_type_name(datastore: &Datastore) -> String {
    format!("{}CellEvent", pascal(&datastore.name))
}

/// `<Ds>CellEvent { cursor cell }`.
pub(super) fn event_type(datastore: &Datastore) -> Object {
    Object::new(event_type_name(datastore))
        .description(format!(
            "A cell committed to `{}`, with the cursor to resume after it.",
            datastore.name
        ))
        .field(
            from_parent::<CellEvent, _>("cursor", TypeRef::named_nn(TypeRef::STRING), |e| {
                Value::String(e.cursor.clone())
            })
            .description("pass as `after` to resume after this cell"),
        )
        .field(async_graphql::dynamic::Field::new(
            "cell",
            TypeRef::named_nn("Cell"),
            |ctx| {
                async_graphql::dynamic::FieldFuture::new(async move {
                    let event = parent::<CellEvent>(&ctx)?;
                    Ok(Some(FieldValue::owned_any(event.cell.clone())))
                })
            },
        ))
}

/// `<ds>Cells(columns, shards, after): <Ds>CellEvent!`.
pub(super) fn cells_subscription(
    datastore: &Datastore,
    types: &DatastoreTypes,
    ds: &Arc<str>,
) -> SubscriptionField {
    let d = ds.clone();
    SubscriptionField::new(
        format!("{}Cells", camel(&datastore.name)),
        TypeRef::named_nn(event_type_name(datastore)),
        move |ctx| {
            let ds = d.clone();
            SubscriptionFieldFuture::new(async move {
                let store = ctx.data::<Store>()?.clone();
                let columns = match ctx.args.get("columns").filter(|v| !v.is_null()) {
                    Some(list) => list
                        .list()?
                        .iter()
                        .map(|c| c.enum_name().map(str::to_string))
                        .collect::<async_graphql::Result<Vec<_>>>()?,
                    None => Vec::new(),
                };
                let shards = match ctx.args.get("shards").filter(|v| !v.is_null()) {
                    Some(list) => Some(
                        list.list()?
                            .iter()
                            .map(|s| {
                                let s = s.i64()?;
                                u32::try_from(s)
                                    .map_err(|_| bad_input(format!("shard {s} does not exist")))
                            })
                            .collect::<async_graphql::Result<BTreeSet<u32>>>()?,
                    ),
                    None => None,
                };
                let after = match ctx.args.get("after").filter(|v| !v.is_null()) {
                    Some(cursor) => {
                        Some(decode_cursor(cursor.string()?).map_err(|e| from_store(&e))?)
                    }
                    None => None,
                };
                let mut follower = store
                    .follow(
                        &ds,
                        FollowOptions {
                            columns,
                            shards,
                            after,
                        },
                    )
                    .map_err(|e| from_store(&e))?;
                follower.start().await.map_err(|e| from_store(&e))?;
                // A failed catch-up read ends the subscription with its
                // error; the client resumes from its last cursor.
                let stream = async_graphql::futures_util::stream::unfold(
                    Some(follower),
                    |follower| async move {
                        let mut follower = follower?;
                        match follower.next().await {
                            Ok(cell) => {
                                let event = CellEvent {
                                    cursor: encode_cursor(follower.positions()),
                                    cell,
                                };
                                Some((Ok(FieldValue::owned_any(event)), Some(follower)))
                            }
                            Err(err) => Some((Err(from_store(&err)), None)),
                        }
                    },
                );
                Ok(stream)
            })
        },
    )
    .description(format!(
        "The cells committed to `{}` from now, or after the cursor `after`: at least once, \
         in per-shard order.",
        datastore.name
    ))
    .argument(
        InputValue::new("columns", TypeRef::named_nn_list(&types.column))
            .description("only cells of these columns (all when absent)"),
    )
    .argument(
        InputValue::new("shards", TypeRef::named_nn_list(TypeRef::INT))
            .description("only cells of these shards (all when absent)"),
    )
    .argument(
        InputValue::new("after", TypeRef::named(TypeRef::STRING))
            .description("the `cursor` of the last event handled; absent: from now"),
    )
}
