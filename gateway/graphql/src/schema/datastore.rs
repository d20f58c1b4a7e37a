//! The types of one datastore: its row object (one field per column), its
//! query object (`row`, `rows`, `cell`, `latestCell`, `history`,
//! `cellsForShard` and one field per index), its column enum and its cell
//! input.

use std::sync::Arc;

use async_graphql::dynamic::{
    Enum, EnumItem, Field, FieldFuture, FieldValue, InputObject, InputValue, Object, TypeRef,
};
use async_graphql::Value;
use index_dsl::Datastore;
use uuid::Uuid;

use crate::consistency::{self, ReadSpec};
use crate::errors::{bad_input, coded, from_store};
use crate::loaders::{CellRequest, Cells};
use crate::scalars::{self, datetime, int64, DATETIME, INT64, JSON, UUID};
use cellgate_store::cells::{CellKey, Location};
use cellgate_store::Store;

use super::*;

/// Most rows one `rows` call may ask for.
pub(super) const MAX_ROWS: usize = 1000;
/// Parent value of a row object.
pub(super) struct RowRef {
    pub(super) row_key: Uuid,
    /// Where its cells may be read: the spec of the field that led here.
    pub(super) read: ReadSpec,
    /// The cells read ahead for a row of a subscription event, and the
    /// loader of the rest (a subscription has no per-request loader: it
    /// would hold on to every cell it ever loaded, and a row's latest cell
    /// changes while the subscription runs).
    pub(super) prefetched: Option<Arc<Prefetched>>,
}

/// Cells read ahead for the rows of a burst of subscription events, in one
/// batch of the cell loader.
pub(super) struct Prefetched {
    pub(super) loader: Cells,
    /// Every cell asked for ahead, found or not.
    pub(super) known:
        std::collections::HashMap<CellRequest, Option<Arc<cellgate_store::cells::Cell>>>,
}
/// Type names generated for one datastore.
pub(super) struct DatastoreTypes {
    pub(super) query: String,
    pub(super) row: String,
    pub(super) column: String,
    pub(super) cell_input: String,
}

impl DatastoreTypes {
    pub(super) fn new(datastore: &Datastore) -> Self {
        let p = pascal(&datastore.name);
        DatastoreTypes {
            query: format!("{p}Query"),
            row: format!("{p}Row"),
            column: format!("{p}Column"),
            cell_input: format!("{p}CellInput"),
        }
    }

    pub(super) fn column_enum(&self, datastore: &Datastore) -> Enum {
        let mut e = Enum::new(&self.column)
            .description(format!("Columns of the `{}` datastore.", datastore.name));
        for column in &datastore.columns {
            let mut item = EnumItem::new(&column.name);
            if let Some(d) = &column.description {
                item = item.description(d);
            }
            e = e.item(item);
        }
        e
    }

    pub(super) fn row_type(
        &self,
        datastore: &Datastore,
        ds: &Arc<str>,
    ) -> cellgate_store::Result<Object> {
        let mut row = Object::new(&self.row)
            .description(format!(
                "A row of `{}`: its latest cell per column, or the version given by `refKey`.",
                datastore.name
            ))
            .field(from_parent::<RowRef, _>(
                "rowKey",
                TypeRef::named_nn(UUID),
                |r| Value::String(r.row_key.to_string()),
            ));
        let mut seen = std::collections::HashSet::from(["rowKey".to_string()]);
        for column in &datastore.columns {
            let field_name = camel(&column.name);
            if !seen.insert(field_name.clone()) {
                return Err(name_clash(&format!("{}.{field_name}", self.row)));
            }
            let ds = ds.clone();
            let column_name: Arc<str> = Arc::from(column.name.as_str());
            let field = Field::new(field_name, TypeRef::named("Cell"), move |ctx| {
                let ds = ds.clone();
                let column = column_name.clone();
                FieldFuture::new(async move {
                    let row = parent::<RowRef>(&ctx)?;
                    let request = match ctx.args.get("refKey").filter(|v| !v.is_null()) {
                        Some(v) => CellRequest::Exact {
                            datastore: ds,
                            key: CellKey {
                                row_key: row.row_key,
                                column: column.to_string(),
                                ref_key: int64(&v, "refKey")?,
                            },
                            read: row.read.clone(),
                        },
                        None => CellRequest::Latest {
                            datastore: ds,
                            row_key: row.row_key,
                            column,
                            read: row.read.clone(),
                        },
                    };
                    let cell = match &row.prefetched {
                        Some(ahead) => match ahead.known.get(&request) {
                            Some(known) => Ok(known.clone()),
                            None => ahead.loader.load_one(request).await,
                        },
                        None => ctx.data::<Cells>()?.load_one(request).await,
                    }
                    .map_err(|e| from_store(&e))?;
                    Ok(cell.map(FieldValue::owned_any))
                })
            })
            .argument(
                InputValue::new("refKey", TypeRef::named(INT64))
                    .description("A specific version; the latest when omitted."),
            )
            .description(
                column
                    .description
                    .clone()
                    .unwrap_or_else(|| format!("The `{}` cell of this row.", column.name)),
            );
            row = row.field(field);
        }
        Ok(row)
    }

    pub(super) fn cell_input(&self, datastore: &Datastore) -> InputObject {
        InputObject::new(&self.cell_input)
            .description(format!("A cell to write to `{}`.", datastore.name))
            .field(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
            .field(InputValue::new("column", TypeRef::named_nn(&self.column)))
            .field(InputValue::new("refKey", TypeRef::named_nn(INT64)))
            .field(InputValue::new("body", TypeRef::named_nn(JSON)).description("a JSON object"))
    }

    pub(super) fn query_type(
        &self,
        datastore: &Datastore,
        ds: &Arc<str>,
    ) -> cellgate_store::Result<Object> {
        let mut object = Object::new(&self.query)
            .description(format!("Reads of the `{}` datastore.", datastore.name));
        let d = ds.clone();
        object = object.field(
            read_field(Field::new(
                "row",
                TypeRef::named_nn(&self.row),
                move |ctx| {
                    let ds = d.clone();
                    FieldFuture::new(async move {
                        let read = ReadSpec::of(ctx.args.as_index_map(), &ds)?;
                        let row_key = scalars::uuid(&ctx.args.try_get("rowKey")?, "rowKey")?;
                        Ok(Some(FieldValue::owned_any(RowRef {
                            row_key,
                            read,
                            prefetched: None,
                        })))
                    })
                },
            ))
            .argument(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
            .description("One row; its column fields are null where the row has no cell."),
        );
        let d = ds.clone();
        object = object.field(
            read_field(Field::new(
                "rows",
                TypeRef::named_nn_list_nn(&self.row),
                move |ctx| {
                    let ds = d.clone();
                    FieldFuture::new(async move {
                        let read = ReadSpec::of(ctx.args.as_index_map(), &ds)?;
                        let keys = ctx.args.try_get("rowKeys")?.list()?;
                        if keys.len() > MAX_ROWS {
                            return Err(coded(
                                "LIMIT_EXCEEDED",
                                format!("at most {MAX_ROWS} row keys per call"),
                            ));
                        }
                        let mut rows = Vec::with_capacity(keys.len());
                        for key in keys.iter() {
                            let row_key = scalars::uuid(&key, "rowKeys")?;
                            let read = read.clone();
                            rows.push(FieldValue::owned_any(RowRef {
                                row_key,
                                read,
                                prefetched: None,
                            }));
                        }
                        Ok(Some(FieldValue::list(rows)))
                    })
                },
            ))
            .argument(InputValue::new("rowKeys", TypeRef::named_nn_list_nn(UUID)))
            .description(
                "Several rows, in the order asked; cells are fetched in one query per cluster.",
            ),
        );
        let d = ds.clone();
        object = object.field(
            read_field(Field::new("cell", TypeRef::named("Cell"), move |ctx| {
                let ds = d.clone();
                FieldFuture::new(async move {
                    let store = ctx.data::<Store>()?;
                    let read = read_options(&ctx, &ds)?;
                    let key = CellKey {
                        row_key: scalars::uuid(&ctx.args.try_get("rowKey")?, "rowKey")?,
                        column: ctx.args.try_get("column")?.enum_name()?.to_string(),
                        ref_key: int64(&ctx.args.try_get("refKey")?, "refKey")?,
                    };
                    let cell = store
                        .get_cell_with(&ds, &key, &read)
                        .await
                        .map_err(|e| from_store(&e))?;
                    Ok(cell.map(cell_value))
                })
            }))
            .argument(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
            .argument(InputValue::new("column", TypeRef::named_nn(&self.column)))
            .argument(InputValue::new("refKey", TypeRef::named_nn(INT64)))
            .description("One version of a cell."),
        );
        let d = ds.clone();
        object = object.field(
            read_field(Field::new(
                "latestCell",
                TypeRef::named("Cell"),
                move |ctx| {
                    let ds = d.clone();
                    FieldFuture::new(async move {
                        let store = ctx.data::<Store>()?;
                        let read = read_options(&ctx, &ds)?;
                        let row_key = scalars::uuid(&ctx.args.try_get("rowKey")?, "rowKey")?;
                        let column = ctx.args.try_get("column")?.enum_name()?.to_string();
                        let cell = store
                            .history_with(&ds, row_key, &column, 1, None, &read)
                            .await
                            .map_err(|e| from_store(&e))?
                            .pop();
                        Ok(cell.map(cell_value))
                    })
                },
            ))
            .argument(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
            .argument(InputValue::new("column", TypeRef::named_nn(&self.column)))
            .description("The version of a cell with the highest ref key."),
        );
        let d = ds.clone();
        object = object.field(
            read_field(Field::new(
                "history",
                TypeRef::named_nn_list_nn("Cell"),
                move |ctx| {
                    let ds = d.clone();
                    FieldFuture::new(async move {
                        let store = ctx.data::<Store>()?;
                        let read = read_options(&ctx, &ds)?;
                        let row_key = scalars::uuid(&ctx.args.try_get("rowKey")?, "rowKey")?;
                        let column = ctx.args.try_get("column")?.enum_name()?.to_string();
                        let first = page_size(&ctx, "first", 20, 1000)?;
                        let before = match ctx.args.get("before").filter(|v| !v.is_null()) {
                            Some(v) => Some(int64(&v, "before")?),
                            None => None,
                        };
                        let cells = store
                            .history_with(&ds, row_key, &column, first, before, &read)
                            .await
                            .map_err(|e| from_store(&e))?;
                        Ok(Some(FieldValue::list(cells.into_iter().map(cell_value))))
                    })
                },
            ))
            .argument(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
            .argument(InputValue::new("column", TypeRef::named_nn(&self.column)))
            .argument(
                InputValue::new("first", TypeRef::named(TypeRef::INT))
                    .default_value(Value::from(20))
                    .description("at most 1000"),
            )
            .argument(
                InputValue::new("before", TypeRef::named(INT64))
                    .description("only versions with a lower ref key (the previous page's last)"),
            )
            .description("Versions of a cell, newest first."),
        );
        let d = ds.clone();
        object = object.field(
            read_field(Field::new(
                "cellsForShard",
                TypeRef::named_nn("CellLogPage"),
                move |ctx| {
                    let ds = d.clone();
                    FieldFuture::new(async move {
                        let store = ctx.data::<Store>()?;
                        let read = read_options(&ctx, &ds)?;
                        let shard = ctx.args.try_get("shard")?.i64()?;
                        let shard = u32::try_from(shard)
                            .map_err(|_| bad_input(format!("shard {shard} does not exist")))?;
                        let after = ctx.args.get("after").filter(|v| !v.is_null());
                        let since = ctx.args.get("since").filter(|v| !v.is_null());
                        let location = match (after, since) {
                            (Some(_), Some(_)) => {
                                return Err(bad_input("give `after` or `since`, not both"))
                            }
                            (Some(after), None) => Location::AddedId(int64(&after, "after")?),
                            (None, Some(since)) => Location::Timestamp(datetime(&since, "since")?),
                            (None, None) => Location::AddedId(0),
                        };
                        let limit =
                            page_size(&ctx, "limit", 100, cellgate_store::cells::MAX_LOG_PAGE)?;
                        let page = store
                            .cells_for_shard_with(&ds, shard, location, limit, &read)
                            .await
                            .map_err(|e| from_store(&e))?;
                        Ok(Some(FieldValue::owned_any(ShardPage {
                            cells: page.cells.into_iter().map(Arc::new).collect(),
                            next: page.next,
                        })))
                    })
                },
            ))
            .argument(InputValue::new("shard", TypeRef::named_nn(TypeRef::INT)))
            .argument(
                InputValue::new("after", TypeRef::named(INT64))
                    .description("continue after this added id (the previous page's `next`)"),
            )
            .argument(
                InputValue::new("since", TypeRef::named(DATETIME))
                    .description("start at the first cell created at or after this time"),
            )
            .argument(
                InputValue::new("limit", TypeRef::named(TypeRef::INT))
                    .default_value(Value::from(100))
                    .description("at most 1000"),
            )
            .description("A shard's cells in insertion order: the cell log."),
        );
        for field in crate::maintenance::query_fields(ds) {
            object = object.field(field);
        }
        object = object.field(crate::triggers::query_field(datastore, ds));
        let mut seen: std::collections::HashSet<String> = [
            "row",
            "rows",
            "cell",
            "latestCell",
            "history",
            "cellsForShard",
        ]
        .into_iter()
        .chain(crate::maintenance::QUERY_FIELDS)
        .map(String::from)
        .collect();
        for index in &datastore.indexes {
            let name = camel(&index.name);
            if !seen.insert(name.clone()) {
                return Err(name_clash(&format!("{}.{name}", self.query)));
            }
            object = object.field(index_field(datastore, index, ds));
        }
        Ok(object)
    }
}

/// `field` with the `consistency` and `readAfter` arguments.
pub(super) fn read_field(field: Field) -> Field {
    consistency::arguments()
        .into_iter()
        .fold(field, |field, argument| field.argument(argument))
}

/// The store's read options of a field's `consistency` and `readAfter`,
/// recording into the request's [`Served`](crate::consistency::Served).
pub(super) fn read_options(
    ctx: &async_graphql::dynamic::ResolverContext<'_>,
    datastore: &str,
) -> async_graphql::Result<cellgate_store::replicas::ReadOptions> {
    let spec = ReadSpec::of(ctx.args.as_index_map(), datastore)?;
    Ok(spec.options(&served(ctx)))
}

/// The request's record of the replicas that served it.
pub(super) fn served(
    ctx: &async_graphql::dynamic::ResolverContext<'_>,
) -> crate::consistency::Served {
    ctx.data::<crate::consistency::Served>()
        .cloned()
        .unwrap_or_default()
}
