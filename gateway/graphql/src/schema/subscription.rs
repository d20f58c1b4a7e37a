//! `Subscription.<ds>Cells`: a datastore's new cells as they are committed
//! (SPEC §7), and the `<Ds>CellEvent` it yields.
//!
//! Each event carries the cell, its `row` (the row's latest cells, like
//! `<ds>.row`) and a `cursor`: the follower's per-shard positions after that
//! cell, as the opaque token of
//! [`cellgate_store::triggers::tail::encode_cursor`]. A client that passes
//! the cursor of the last event it handled as `after` gets every later
//! cell of its columns, with no gap; without `after` it starts from now.
//! The store reads the log once per commit for all subscriptions of a
//! datastore (`triggers/tail.rs`); this module only filters and encodes.
//!
//! Events come in bursts (a commit of many cells, or a follower catching
//! up): the cells the burst's `row` fields select are read ahead in one
//! batch of the cell loader (one statement per cluster), so a burst never
//! costs a statement per event. The cursor is encoded only when selected:
//! it covers every shard, and ten thousand subscribers that do not ask
//! for it should not pay for it on every cell.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use async_graphql::dataloader::{DataLoader, HashMapCache};
use async_graphql::dynamic::{
    FieldValue, InputValue, Object, SubscriptionField, SubscriptionFieldFuture, TypeRef,
};
use async_graphql::Value;
use index_dsl::Datastore;

use crate::consistency::{ReadSpec, Served};
use crate::errors::{bad_input, from_store};
use crate::loaders::{CellLoader, CellRequest};
use cellgate_store::cells::Cell;
use cellgate_store::triggers::tail::{decode_cursor, FollowOptions, Follower};
use cellgate_store::Store;

use super::*;

/// Most events taken from a follower at once, whose rows are read ahead in
/// one batch.
const BURST: usize = 256;

/// One event of a subscription: the cell and the cursor after it.
struct CellEvent {
    /// `None` when the subscription does not select it.
    cursor: Option<String>,
    /// The clusters not followed when the event was taken.
    unfollowed: Arc<Vec<String>>,
    cell: Arc<Cell>,
    /// The row cells read ahead for the event's burst.
    prefetched: Option<Arc<Prefetched>>,
}

/// The name of the event type of `datastore`.
pub(super) fn event_type_name(datastore: &Datastore) -> String {
    format!("{}CellEvent", pascal(&datastore.name))
}

/// `<Ds>CellEvent { cursor cell row }`.
pub(super) fn event_type(datastore: &Datastore, types: &DatastoreTypes) -> Object {
    Object::new(event_type_name(datastore))
        .description(format!(
            "A cell committed to `{}`, with the cursor to resume after it.",
            datastore.name
        ))
        .field(
            from_parent::<CellEvent, _>("cursor", TypeRef::named_nn(TypeRef::STRING), |e| {
                Value::String(e.cursor.clone().unwrap_or_default())
            })
            .description("pass as `after` to resume after this cell"),
        )
        .field(
            from_parent::<CellEvent, _>(
                "unfollowedClusters",
                TypeRef::named_nn_list_nn(TypeRef::STRING),
                |e| Value::List(e.unfollowed.iter().cloned().map(Value::String).collect()),
            )
            .description(
                "storage clusters of the datastore whose cells this subscription does not follow \
                 now because they do not answer (usually none): their cells come, in order, once \
                 they do",
            ),
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
        .field(
            async_graphql::dynamic::Field::new("row", TypeRef::named_nn(&types.row), |ctx| {
                async_graphql::dynamic::FieldFuture::new(async move {
                    let event = parent::<CellEvent>(&ctx)?;
                    Ok(Some(FieldValue::owned_any(RowRef {
                        row_key: event.cell.row_key,
                        read: ReadSpec::default(),
                        prefetched: event.prefetched.clone(),
                    })))
                })
            })
            .description(
                "the cell's row: its latest cells (read from the master when the event is sent)",
            ),
        )
}

/// `<ds>Cells(columns, shards, after): <Ds>CellEvent!`.
pub(super) fn cells_subscription(
    datastore: &Datastore,
    types: &DatastoreTypes,
    ds: &Arc<str>,
) -> SubscriptionField {
    let d = ds.clone();
    // (GraphQL field, column) of every column of the row type.
    let row_columns: Arc<Vec<(String, Arc<str>)>> = Arc::new(
        datastore
            .columns
            .iter()
            .map(|c| (camel(&c.name), Arc::from(c.name.as_str())))
            .collect(),
    );
    SubscriptionField::new(
        format!("{}Cells", camel(&datastore.name)),
        TypeRef::named_nn(event_type_name(datastore)),
        move |ctx| {
            let ds = d.clone();
            let row_columns = row_columns.clone();
            SubscriptionFieldFuture::new(async move {
                let store = ctx.data::<Store>()?.clone();
                let wants_cursor = ctx.look_ahead().field("cursor").exists();
                let row = ctx.look_ahead().field("row");
                let read_ahead: Vec<Arc<str>> = row_columns
                    .iter()
                    .filter(|(field, _)| row.field(field).exists())
                    .map(|(_, column)| column.clone())
                    .collect();
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
                let burst = Burst {
                    follower,
                    ready: VecDeque::new(),
                    wants_cursor,
                    read_ahead,
                    store,
                    datastore: ds,
                };
                let stream =
                    async_graphql::futures_util::stream::unfold(Some(burst), |burst| async move {
                        let mut burst = burst?;
                        if burst.ready.is_empty() {
                            if let Err(err) = burst.fill().await {
                                return Some((Err(from_store(&err)), None));
                            }
                        }
                        let event = burst.ready.pop_front()?;
                        Some((Ok(FieldValue::owned_any(event)), Some(burst)))
                    });
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

/// The state of one subscription's stream.
struct Burst {
    follower: Follower,
    /// Events taken from the follower, not yielded yet.
    ready: VecDeque<CellEvent>,
    wants_cursor: bool,
    /// The columns whose latest cells the selected `row` shows.
    read_ahead: Vec<Arc<str>>,
    store: Store,
    datastore: Arc<str>,
}

impl Burst {
    /// Waits for a cell, takes up to [`BURST`] cells that are there
    /// already, and reads their rows' selected cells in one batch.
    async fn fill(&mut self) -> cellgate_store::Result<()> {
        let cell = self.follower.next().await?;
        self.push(cell);
        while self.ready.len() < BURST {
            match self.follower.try_next() {
                Some(cell) => self.push(cell),
                None => break,
            }
        }
        if self.read_ahead.is_empty() {
            return Ok(());
        }
        let loader: crate::loaders::Cells = DataLoader::with_cache(
            CellLoader {
                store: self.store.clone(),
                served: Served::default(),
            },
            tokio::spawn,
            HashMapCache::default(),
        );
        let requests: BTreeSet<(uuid::Uuid, Arc<str>)> = self
            .ready
            .iter()
            .flat_map(|e| self.read_ahead.iter().map(|c| (e.cell.row_key, c.clone())))
            .collect();
        let requests: Vec<CellRequest> = requests
            .into_iter()
            .map(|(row_key, column)| CellRequest::Latest {
                datastore: self.datastore.clone(),
                row_key,
                column,
                read: ReadSpec::default(),
            })
            .collect();
        // A failed read leaves each row field to the loader on its own.
        let known: HashMap<CellRequest, Option<Arc<Cell>>> =
            match loader.load_many(requests.iter().cloned()).await {
                Ok(found) => requests
                    .into_iter()
                    .map(|r| {
                        let cell = found.get(&r).cloned();
                        (r, cell)
                    })
                    .collect(),
                Err(_) => HashMap::new(),
            };
        let prefetched = Arc::new(Prefetched { loader, known });
        for event in &mut self.ready {
            event.prefetched = Some(prefetched.clone());
        }
        Ok(())
    }

    fn push(&mut self, cell: Arc<Cell>) {
        let cursor = self.wants_cursor.then(|| self.follower.cursor());
        self.ready.push_back(CellEvent {
            cursor,
            unfollowed: self.follower.unfollowed(),
            cell,
            prefetched: None,
        });
    }
}
