//! The connection of one index: its node, edge, where and order types,
//! the typed filter inputs per field type, and the resolver that reads a
//! page with only the selected fields.

use std::sync::Arc;

use async_graphql::dynamic::{
    Enum, EnumItem, Field, FieldFuture, FieldValue, InputObject, InputValue, Object,
    ResolverContext, TypeRef,
};
use async_graphql::Value;
use index_dsl::{Datastore, FieldType, Index, Literal};
use uuid::Uuid;

use crate::consistency::ReadSpec;
use crate::errors::{bad_input, from_store};
use crate::loaders::{CellRequest, Cells};
use crate::scalars::{sql_value, DATETIME, INT64, UUID};
use cellgate_store::indexes::{IndexEntry, IndexPage};
use cellgate_store::Store;

use super::*;

/// How a field's value is computed from its parent.
pub(crate) type FieldOf<T> = fn(&T) -> Value;

/// The fields of `PageInfo` and their values.
pub(crate) const PAGE_INFO_FIELDS: [(&str, FieldOf<IndexPage>); 2] = [
    ("hasNextPage", |p| Value::Boolean(p.has_next_page)),
    ("endCursor", |p| {
        p.end_cursor.clone().map_or(Value::Null, Value::String)
    }),
];

/// Parent value of an index connection (and of its `pageInfo`): the
/// page and where its rows' cells may be read.
#[derive(Clone)]
pub(super) struct PageRef {
    page: Arc<IndexPage>,
    read: ReadSpec,
}

/// Parent value of an edge and of its node.
#[derive(Clone)]
pub(super) struct EntryRef {
    entry: IndexEntry,
    read: ReadSpec,
}

pub(super) fn page_info_type() -> Object {
    let [(has_next, has_next_value), (end_cursor, end_cursor_value)] = PAGE_INFO_FIELDS;
    Object::new("PageInfo")
        .field(from_parent::<PageRef, _>(
            has_next,
            TypeRef::named_nn(TypeRef::BOOLEAN),
            move |p| has_next_value(&p.page),
        ))
        .field(from_parent::<PageRef, _>(
            end_cursor,
            TypeRef::named(TypeRef::STRING),
            move |p| end_cursor_value(&p.page),
        ))
}
pub(super) fn scalar_of(ty: FieldType) -> &'static str {
    match ty {
        FieldType::Uuid => UUID,
        FieldType::String => TypeRef::STRING,
        FieldType::Int => INT64,
        FieldType::Float => TypeRef::FLOAT,
        FieldType::Bool => TypeRef::BOOLEAN,
        FieldType::DateTime => DATETIME,
    }
}

pub(super) fn filter_name(ty: FieldType) -> String {
    format!("{}Filter", scalar_of(ty))
}

/// `UUIDFilter`, `StringFilter`, `Int64Filter`, `FloatFilter`,
/// `BooleanFilter`, `DateTimeFilter`: the conditions on one index field.
pub(super) fn filter_input(ty: FieldType) -> InputObject {
    let scalar = scalar_of(ty);
    let mut input = InputObject::new(filter_name(ty))
        .description(format!(
            "Conditions on a {} index field, combined with AND.",
            ty.name()
        ))
        .field(InputValue::new("eq", TypeRef::named(scalar)))
        .field(
            InputValue::new("ne", TypeRef::named(scalar))
                .description("also matches entries without a value"),
        )
        .field(InputValue::new("in", TypeRef::named_nn_list(scalar)));
    if ty.is_ordered() {
        for op in ["gt", "gte", "lt", "lte"] {
            input = input.field(InputValue::new(op, TypeRef::named(scalar)));
        }
    }
    input.field(
        InputValue::new("isNull", TypeRef::named(TypeRef::BOOLEAN))
            .description("true: entries without a value; false: entries with one"),
    )
}

/// Converts a GraphQL value of an index field to a filter literal.
pub(super) fn literal(value: &Value, ty: FieldType, what: &str) -> async_graphql::Result<Literal> {
    Ok(match (ty, value) {
        (_, Value::Null) => Literal::Null,
        (FieldType::Uuid | FieldType::String | FieldType::DateTime, Value::String(s)) => {
            Literal::String(s.clone())
        }
        (FieldType::Int, Value::Number(n)) if n.as_i64().is_some() => {
            Literal::Int(n.as_i64().unwrap_or_default())
        }
        (FieldType::Int, Value::String(s)) => Literal::Int(
            s.trim()
                .parse()
                .map_err(|_| bad_input(format!("{what}: `{s}` is not a 64-bit integer")))?,
        ),
        (FieldType::Float, Value::Number(n)) => Literal::Float(n.as_f64().unwrap_or_default()),
        (FieldType::Bool, Value::Boolean(b)) => Literal::Bool(*b),
        _ => {
            return Err(bad_input(format!(
                "{what}: wrong type, expected {}",
                ty.name()
            )))
        }
    })
}
/// Type names generated for one index.
pub(super) struct IndexTypes {
    pub(super) connection: String,
    pub(super) edge: String,
    pub(super) entry: String,
    pub(super) where_input: String,
    pub(super) order_input: String,
    pub(super) field_enum: String,
}

impl IndexTypes {
    pub(super) fn new(datastore: &Datastore, index: &Index) -> Self {
        let p = format!("{}{}", pascal(&datastore.name), pascal(&index.name));
        IndexTypes {
            connection: format!("{p}Connection"),
            edge: format!("{p}Edge"),
            entry: format!("{p}Entry"),
            where_input: format!("{p}Where"),
            order_input: format!("{p}Order"),
            field_enum: format!("{p}Field"),
        }
    }
}

/// The types of one index: connection, edge, entry, where, order, field enum.
pub(super) fn index_types(
    datastore: &Datastore,
    index: &Index,
) -> cellgate_store::Result<Vec<async_graphql::dynamic::Type>> {
    let names = IndexTypes::new(datastore, index);
    let row_type = DatastoreTypes::new(datastore).row;
    let mut entry = Object::new(&names.entry)
        .description(format!("An entry of the `{}` index.", index.name))
        .field(from_parent::<EntryRef, _>(
            "rowKey",
            TypeRef::named_nn(UUID),
            |e| Value::String(e.entry.row_key.to_string()),
        ));
    let mut seen = std::collections::HashSet::from(["rowKey".to_string(), "row".to_string()]);
    for field in &index.fields {
        let gql = camel(&field.name);
        if !seen.insert(gql.clone()) {
            return Err(name_clash(&format!("{}.{gql}", names.entry)));
        }
        let name = field.name.clone();
        entry = entry.field(
            from_parent::<EntryRef, _>(&gql, TypeRef::named(scalar_of(field.ty)), move |e| {
                entry_value(&e.entry, &name)
            })
            .description(format!(
                "`{}` of the latest `{}` cell",
                field.path, field.column
            )),
        );
    }
    entry = entry.field(
        Field::new("row", TypeRef::named_nn(&row_type), |ctx| {
            FieldFuture::new(async move {
                let e = parent::<EntryRef>(&ctx)?;
                Ok(Some(FieldValue::owned_any(RowRef {
                    row_key: e.entry.row_key,
                    read: e.read.clone(),
                    prefetched: None,
                })))
            })
        })
        .description("The row's cells, fetched in batches per shard."),
    );
    let edge = Object::new(&names.edge)
        .field(from_parent::<EntryRef, _>(
            "cursor",
            TypeRef::named_nn(TypeRef::STRING),
            |e| Value::String(e.entry.cursor()),
        ))
        .field(Field::new("node", TypeRef::named_nn(&names.entry), |ctx| {
            FieldFuture::new(async move {
                let e = parent::<EntryRef>(&ctx)?;
                Ok(Some(FieldValue::owned_any(e.clone())))
            })
        }));
    let connection = Object::new(&names.connection)
        .field(Field::new(
            "edges",
            TypeRef::named_nn_list_nn(&names.edge),
            |ctx| {
                FieldFuture::new(async move {
                    let page = parent::<PageRef>(&ctx)?;
                    Ok(Some(FieldValue::list(page.page.entries.iter().map(
                        |entry| {
                            FieldValue::owned_any(EntryRef {
                                entry: entry.clone(),
                                read: page.read.clone(),
                            })
                        },
                    ))))
                })
            },
        ))
        .field(Field::new(
            "pageInfo",
            TypeRef::named_nn("PageInfo"),
            |ctx| {
                FieldFuture::new(async move {
                    let page = parent::<PageRef>(&ctx)?;
                    Ok(Some(FieldValue::owned_any(page.clone())))
                })
            },
        ));
    let mut where_input = InputObject::new(&names.where_input).description(format!(
        "Conditions on `{}` entries, combined with AND.",
        index.name
    ));
    let mut field_enum = Enum::new(&names.field_enum);
    for field in &index.fields {
        where_input = where_input.field(InputValue::new(
            camel(&field.name),
            TypeRef::named(filter_name(field.ty)),
        ));
        // Pages are ordered by fields with a b-tree only (`sort: false`
        // leaves one out).
        if field.sorted {
            field_enum = field_enum.item(EnumItem::new(screaming(&field.name)));
        }
    }
    let order = InputObject::new(&names.order_input)
        .field(InputValue::new(
            "field",
            TypeRef::named_nn(&names.field_enum),
        ))
        .field(
            InputValue::new("direction", TypeRef::named_nn("SortDirection"))
                .default_value(Value::Enum(async_graphql::Name::new("ASC"))),
        );
    Ok(vec![
        entry.into(),
        edge.into(),
        connection.into(),
        where_input.into(),
        order.into(),
        field_enum.into(),
    ])
}

/// The value of the index field `name` (as in the definitions) of an entry.
fn entry_value(entry: &IndexEntry, name: &str) -> Value {
    entry.field(name).map_or(Value::Null, sql_value)
}

/// The arguments of an index field naming its shard field's value, and a
/// list of them.
pub(crate) fn shard_arguments(index: &Index) -> (String, String) {
    let shard_arg = camel(&index.shard_field().name);
    let list_arg = format!("{shard_arg}In");
    (shard_arg, list_arg)
}
/// `Query.<datastore>.<index>`: the index as a Relay connection.
pub(super) fn index_field(datastore: &Datastore, index: &Index, ds: &Arc<str>) -> Field {
    let names = IndexTypes::new(datastore, index);
    // (GraphQL field of the row type, column) for every column.
    let columns: Arc<Vec<(String, Arc<str>)>> = Arc::new(
        datastore
            .columns
            .iter()
            .map(|c| (camel(&c.name), Arc::from(c.name.as_str())))
            .collect(),
    );
    let shard_field = index.shard_field().clone();
    let (shard_arg, shard_list_arg) = shard_arguments(index);
    let index = Arc::new(index.clone());
    let ds = ds.clone();
    let (arg, list_arg) = (shard_arg.clone(), shard_list_arg.clone());
    let resolver_index = index.clone();
    let field = Field::new(camel(&index.name), TypeRef::named_nn(&names.connection), move |ctx| {
        let index = resolver_index.clone();
        let ds = ds.clone();
        let columns = columns.clone();
        let (arg, list_arg) = (arg.clone(), list_arg.clone());
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let read = ReadSpec::of(ctx.args.as_index_map(), &ds)?;
            let options = read.options(&served(&ctx));
            let node = ctx.look_ahead().field("edges").field("node");
            let query = index_query(
                ctx.args.as_index_map(),
                limits(&ctx),
                &|field| node.field(field).exists(),
                &index,
                &arg,
                &list_arg,
            )?;
            let page = store
                .query_index_with(&ds, &query, &options)
                .await
                .map_err(|e| from_store(&e))?;
            prefetch_rows(&ctx, store, &ds, &columns, &page, &read).await?;
            Ok(Some(FieldValue::owned_any(PageRef {
                page: Arc::new(page),
                read,
            })))
        })
    })
    .description(index_description(&index, &shard_arg, &shard_list_arg))
    .argument(
        InputValue::new(&shard_arg, TypeRef::named(scalar_of(shard_field.ty)))
            .description("the shard field: every query names it (or the list form)"),
    )
    .argument(
        InputValue::new(&shard_list_arg, TypeRef::named_nn_list(scalar_of(shard_field.ty)))
            .description("several shard field values, read in parallel (at most 64)"),
    )
    .argument(InputValue::new("where", TypeRef::named(&names.where_input)))
    .argument(
        InputValue::new("filter", TypeRef::named(TypeRef::STRING)).description(
            "conditions as text, e.g. `trip_created_at >= \"2024-01-01T00:00:00Z\" and fare_total < 30.5`",
        ),
    )
    .argument(InputValue::new("orderBy", TypeRef::named_nn_list(&names.order_input)))
    .argument(
        InputValue::new("first", TypeRef::named(TypeRef::INT))
            .default_value(Value::from(cellgate_store::indexes::plan::DEFAULT_PAGE))
            .description("page size, at most 1000"),
    )
    .argument(
        InputValue::new("after", TypeRef::named(TypeRef::STRING))
            .description("the `endCursor` of the previous page"),
    );
    read_field(field)
}

/// Reads the latest cells the page's `edges.node.row` selects, for all its
/// entries at once, into the request's cell loader, so the `row` fields
/// find them there instead of waiting for the loader to batch them (and
/// without its batching delay). A `row` column asked for with `refKey`, or
/// a row without the column, is left to the loader.
async fn prefetch_rows(
    ctx: &ResolverContext<'_>,
    store: &Store,
    ds: &Arc<str>,
    columns: &[(String, Arc<str>)],
    page: &cellgate_store::indexes::IndexPage,
    read: &ReadSpec,
) -> async_graphql::Result<()> {
    let row = ctx.look_ahead().field("edges").field("node").field("row");
    if page.entries.is_empty() || !row.exists() {
        return Ok(());
    }
    let selected: Vec<&Arc<str>> = columns
        .iter()
        .filter(|(field, _)| row.field(field).exists())
        .map(|(_, column)| column)
        .collect();
    if selected.is_empty() {
        return Ok(());
    }
    let wanted: Vec<(Uuid, String)> = page
        .entries
        .iter()
        .flat_map(|e| selected.iter().map(move |c| (e.row_key, c.to_string())))
        .collect();
    let cells = store
        .get_cells_latest_with(ds, &wanted, &read.options(&served(ctx)))
        .await
        .map_err(|e| from_store(&e))?;
    let found = wanted
        .into_iter()
        .zip(cells)
        .filter_map(|((row_key, column), cell)| {
            let request = CellRequest::Latest {
                datastore: ds.clone(),
                row_key,
                column: column.into(),
                read: read.clone(),
            };
            cell.map(|cell| (request, Arc::new(cell)))
        });
    ctx.data::<Cells>()?.feed_many(found).await;
    Ok(())
}

/// The index field's description: the definition's, or one naming the
/// shard field arguments; a partial index adds its predicate.
fn index_description(index: &Index, shard_arg: &str, shard_list_arg: &str) -> String {
    let mut text = index.description.clone().unwrap_or_else(|| {
        format!(
            "The `{}` index. Give the shard field `{shard_arg}` (or a short `{shard_list_arg}` list).",
            index.name
        )
    });
    if let Some(predicate) = &index.predicate {
        text.push_str(&format!(
            " Partial: only rows whose latest cells satisfy `{}` have entries.",
            predicate.filter
        ));
    }
    text
}
