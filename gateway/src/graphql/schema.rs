//! Builds the dynamic schema from the definitions.
//!
//! Names clients can rely on, for a datastore `trips` with an index
//! `driver_partner_index` (shard field `driver_partner_uuid`):
//!
//! - `Query.trips: TripsQuery!` with `row`, `rows`, `cell`, `latestCell`,
//!   `history`, `cellsForShard`, and `driverPartnerIndex(driverPartnerUuid,
//!   driverPartnerUuidIn, where, filter, orderBy, first, after)` returning a
//!   Relay connection `TripsDriverPartnerIndexConnection`;
//! - `TripsRow` with `rowKey` and one field per column in camelCase
//!   (`base`, `fareAdjustment`) returning the latest `Cell`, or the version
//!   given by `refKey`;
//! - `TripsColumn` enum, `TripsCellInput`, and
//!   `Mutation.tripsPutCells(cells: [TripsCellInput!]!): [PutCellResult!]!`;
//! - `Query.datastores` describing definitions and topology.
//!
//! Index field resolvers read only what the query selected: the connection
//! resolver looks ahead at `edges.node` and asks the store for those fields
//! alone. `row` fields go through the per-request [`CellLoader`].

use std::sync::Arc;

use async_graphql::dynamic::{
    Enum, EnumItem, Field, FieldFuture, FieldValue, InputObject, InputValue, Object,
    ResolverContext, Schema, TypeRef,
};
use async_graphql::{PathSegment, Value};
use index_dsl::{CompareOp, Condition, Datastore, FieldType, Index, Literal};
use uuid::Uuid;

use super::errors::{bad_input, coded, from_store};
use super::loaders::{CellRequest, Cells};
use super::scalars::{
    self, datetime, datetime_value, int64, int64_value, json_value, sql_value, DATETIME, INT64,
    JSON, UUID,
};
use crate::cells::{Cell, CellKey, Location, NewCell, PutStatus};
use crate::indexes::{IndexEntry, IndexPage, IndexQuery, OrderBy};
use crate::Store;

/// Limits enforced by the schema on every request (see `limits.rs`);
/// fields under `__schema` and `__type` do not count toward them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GraphqlLimits {
    /// Deepest selection nesting accepted.
    pub depth: usize,
    /// Largest query cost accepted: each field costs 1, and what a list
    /// field selects is multiplied by the items it may return.
    pub complexity: usize,
    /// Most aliased fields in one operation.
    pub aliases: usize,
    /// Most fragment spread expansions in one operation.
    pub fragment_spreads: usize,
    /// Longest `filter` string, in bytes.
    pub filter_bytes: usize,
    /// Most comparisons in one `filter` string.
    pub filter_terms: usize,
    /// Most values in one `in` list.
    pub in_values: usize,
}

impl Default for GraphqlLimits {
    fn default() -> Self {
        GraphqlLimits {
            // Introspection does not count (see `limits.rs`), so GraphiQL's
            // schema query, which nests 15 levels, passes at any depth.
            depth: 12,
            // A page of 1000 index entries with a `row` and a cell body
            // costs about 5000; eight such aliases do not pass.
            complexity: 25_000,
            aliases: 32,
            fragment_spreads: 500,
            filter_bytes: 4096,
            filter_terms: 64,
            in_values: 1000,
        }
    }
}

/// Most rows one `rows` call may ask for.
const MAX_ROWS: usize = 1000;

/// `snake_case` or `SCREAMING_CASE` to `camelCase`.
pub fn camel(name: &str) -> String {
    let mut out = String::new();
    for (i, part) in name.split('_').filter(|p| !p.is_empty()).enumerate() {
        let lower = if part.chars().any(|c| c.is_ascii_lowercase()) {
            part.to_string()
        } else {
            part.to_ascii_lowercase()
        };
        if i == 0 {
            let mut chars = lower.chars();
            if let Some(first) = chars.next() {
                out.extend(first.to_lowercase());
                out.push_str(chars.as_str());
            }
        } else {
            let mut chars = lower.chars();
            if let Some(first) = chars.next() {
                out.extend(first.to_uppercase());
                out.push_str(chars.as_str());
            }
        }
    }
    out
}

/// `snake_case` to `PascalCase`.
pub fn pascal(name: &str) -> String {
    let camel = camel(name);
    let mut chars = camel.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn parent<'a, T: std::any::Any>(ctx: &ResolverContext<'a>) -> async_graphql::Result<&'a T> {
    ctx.parent_value.try_downcast_ref::<T>()
}

/// A field computed from the parent value of type `T`.
pub(super) fn from_parent<T, F>(name: &str, ty: TypeRef, f: F) -> Field
where
    T: std::any::Any + Send + Sync,
    F: Fn(&T) -> Value + Send + Sync + 'static,
{
    let f = Arc::new(f);
    Field::new(name, ty, move |ctx| {
        let f = f.clone();
        FieldFuture::new(async move {
            // `None`, not a null value: the dynamic schema resolves a present
            // value of an object or enum type even when it is null.
            Ok(match f(parent::<T>(&ctx)?) {
                Value::Null => None,
                value => Some(FieldValue::value(value)),
            })
        })
    })
}

/// A field of a metadata object: reads `name` from the parent `Value`.
fn meta_field(name: &'static str, ty: TypeRef) -> Field {
    Field::new(name, ty, move |ctx| {
        FieldFuture::new(async move {
            let value = match ctx.parent_value.as_value() {
                Some(Value::Object(map)) => map.get(name).cloned().unwrap_or(Value::Null),
                _ => Value::Null,
            };
            Ok(match value {
                Value::Null => None,
                value => Some(meta_value(value)),
            })
        })
    })
}

fn meta_value(value: Value) -> FieldValue<'static> {
    match value {
        Value::List(items) => FieldValue::list(items.into_iter().map(meta_value)),
        other => FieldValue::value(other),
    }
}

/// Marker parent value of `Query.<datastore>`.
struct DatastoreRoot;

/// Parent value of a row object.
struct RowRef {
    row_key: Uuid,
}

/// Parent value of one mutation result.
struct PutOutcome {
    row_key: Uuid,
    column: String,
    ref_key: i64,
    /// The status, or why the cell was refused.
    result: Result<PutStatus, PutRefusal>,
}

/// Why a cell was refused, as `PutCellError` shows it.
struct PutRefusal {
    code: &'static str,
    message: String,
    retryable: bool,
}

/// The schema for the store's definitions.
pub fn build_schema(store: &Store, limits: GraphqlLimits) -> crate::Result<Schema> {
    let topology = |ds: &str| store.topology(ds);
    schema_for(store.definitions(), &topology, limits)
}

/// The schema of only the `visible` datastores of the store: what
/// introspection shows a token scoped to them.
pub fn build_visible_schema(
    store: &Store,
    limits: GraphqlLimits,
    visible: &[String],
) -> crate::Result<Schema> {
    let mut defs = store.definitions().clone();
    defs.datastores.retain(|d| visible.contains(&d.name));
    let topology = |ds: &str| store.topology(ds);
    schema_for(&defs, &topology, limits)
}

/// The SDL of the schema for `defs`, as exported to `schema/schema.graphql`.
pub fn sdl(defs: &index_dsl::Definitions) -> crate::Result<String> {
    let schema = schema_for(defs, &|_| Vec::new(), GraphqlLimits::default())?;
    Ok(schema.sdl())
}

/// Shard ranges per datastore: `(first, last, cluster)`.
type Topology<'t> = &'t dyn Fn(&str) -> Vec<(u32, u32, String)>;

fn schema_for(
    defs: &index_dsl::Definitions,
    topology: Topology<'_>,
    limits: GraphqlLimits,
) -> crate::Result<Schema> {
    let defs = defs.clone();
    let mut builder = Schema::build("Query", Some("Mutation"), None);
    for scalar in scalars::scalars() {
        builder = builder.register(scalar);
    }
    builder = builder
        .register(cell_type())
        .register(log_page_type())
        .register(page_info_type())
        .register(put_result_type())
        .register(put_error_type())
        .register(
            Enum::new("PutStatus")
                .description("What happened to a written cell.")
                .item(EnumItem::new("WRITTEN").description("stored now"))
                .item(
                    EnumItem::new("DUPLICATE").description("an identical cell was already stored"),
                )
                .item(EnumItem::new("BUFFERED").description(
                    "kept in a buffer while its primary is down; readable once replayed",
                )),
        )
        .register(
            Enum::new("SortDirection")
                .item(EnumItem::new("ASC"))
                .item(EnumItem::new("DESC")),
        );
    for ty in FieldType::ALL {
        builder = builder.register(filter_input(ty));
    }
    for object in metadata_types()
        .into_iter()
        .chain(super::maintenance::types())
    {
        builder = builder.register(object);
    }
    let (id_objects, id_enums) = super::ids::types();
    for object in id_objects {
        builder = builder.register(object);
    }
    for e in id_enums {
        builder = builder.register(e);
    }
    let mut query = Object::new("Query").description("Reads of every datastore, and IDs.");
    query = query.field(datastores_field(topology, &defs));
    for field in super::ids::query_fields() {
        query = query.field(field);
    }
    let mut mutation =
        Object::new("Mutation").description("Writes of every datastore, and ID tags.");
    mutation = mutation.field(super::ids::create_tag_field());
    let mut seen = std::collections::HashSet::from(["datastores".to_string()]);
    seen.extend(super::ids::QUERY_FIELDS.iter().map(|f| f.to_string()));
    for datastore in &defs.datastores {
        let ds: Arc<str> = Arc::from(datastore.name.as_str());
        if !seen.insert(camel(&datastore.name)) {
            return Err(name_clash(&format!("Query.{}", camel(&datastore.name))));
        }
        let types = DatastoreTypes::new(datastore);
        builder = builder
            .register(types.column_enum(datastore))
            .register(types.row_type(datastore, &ds)?)
            .register(types.cell_input(datastore))
            .register(types.query_type(datastore, &ds)?);
        for index in &datastore.indexes {
            for object in index_types(datastore, index)? {
                builder = builder.register(object);
            }
        }
        query = query.field(
            Field::new(
                camel(&datastore.name),
                TypeRef::named_nn(&types.query),
                |_| FieldFuture::new(async { Ok(Some(FieldValue::owned_any(DatastoreRoot))) }),
            )
            .description(
                datastore
                    .description
                    .clone()
                    .unwrap_or_else(|| format!("The `{}` datastore.", datastore.name)),
            ),
        );
        mutation = mutation.field(put_cells_field(datastore, &types, &ds));
        mutation = mutation.field(super::maintenance::retry_field(&ds));
    }
    builder = builder.register(query);
    builder = builder.register(mutation);
    builder
        .data(limits)
        .finish()
        .map_err(|e| crate::Error::Config(format!("cannot build the GraphQL schema: {e}")))
}

fn name_clash(what: &str) -> crate::Error {
    crate::Error::Config(format!(
        "two definitions map to the GraphQL name `{what}`; rename one of them"
    ))
}

/// Type names generated for one datastore.
struct DatastoreTypes {
    query: String,
    row: String,
    column: String,
    cell_input: String,
}

impl DatastoreTypes {
    fn new(datastore: &Datastore) -> Self {
        let p = pascal(&datastore.name);
        DatastoreTypes {
            query: format!("{p}Query"),
            row: format!("{p}Row"),
            column: format!("{p}Column"),
            cell_input: format!("{p}CellInput"),
        }
    }

    fn column_enum(&self, datastore: &Datastore) -> Enum {
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

    fn row_type(&self, datastore: &Datastore, ds: &Arc<str>) -> crate::Result<Object> {
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
                    let loader = ctx.data::<Cells>()?;
                    let request = match ctx.args.get("refKey").filter(|v| !v.is_null()) {
                        Some(v) => CellRequest::Exact {
                            datastore: ds,
                            key: CellKey {
                                row_key: row.row_key,
                                column: column.to_string(),
                                ref_key: int64(&v, "refKey")?,
                            },
                        },
                        None => CellRequest::Latest {
                            datastore: ds,
                            row_key: row.row_key,
                            column,
                        },
                    };
                    let cell = loader.load_one(request).await.map_err(|e| from_store(&e))?;
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

    fn cell_input(&self, datastore: &Datastore) -> InputObject {
        InputObject::new(&self.cell_input)
            .description(format!("A cell to write to `{}`.", datastore.name))
            .field(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
            .field(InputValue::new("column", TypeRef::named_nn(&self.column)))
            .field(InputValue::new("refKey", TypeRef::named_nn(INT64)))
            .field(InputValue::new("body", TypeRef::named_nn(JSON)).description("a JSON object"))
    }

    fn query_type(&self, datastore: &Datastore, ds: &Arc<str>) -> crate::Result<Object> {
        let mut object = Object::new(&self.query)
            .description(format!("Reads of the `{}` datastore.", datastore.name));
        object = object.field(
            Field::new("row", TypeRef::named_nn(&self.row), |ctx| {
                FieldFuture::new(async move {
                    let row_key = scalars::uuid(&ctx.args.try_get("rowKey")?, "rowKey")?;
                    Ok(Some(FieldValue::owned_any(RowRef { row_key })))
                })
            })
            .argument(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
            .description("One row; its column fields are null where the row has no cell."),
        );
        object = object.field(
            Field::new("rows", TypeRef::named_nn_list_nn(&self.row), |ctx| {
                FieldFuture::new(async move {
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
                        rows.push(FieldValue::owned_any(RowRef { row_key }));
                    }
                    Ok(Some(FieldValue::list(rows)))
                })
            })
            .argument(InputValue::new("rowKeys", TypeRef::named_nn_list_nn(UUID)))
            .description(
                "Several rows, in the order asked; cells are fetched in one query per cluster.",
            ),
        );
        let d = ds.clone();
        object = object.field(
            Field::new("cell", TypeRef::named("Cell"), move |ctx| {
                let ds = d.clone();
                FieldFuture::new(async move {
                    let store = ctx.data::<Store>()?;
                    let key = CellKey {
                        row_key: scalars::uuid(&ctx.args.try_get("rowKey")?, "rowKey")?,
                        column: ctx.args.try_get("column")?.enum_name()?.to_string(),
                        ref_key: int64(&ctx.args.try_get("refKey")?, "refKey")?,
                    };
                    let cell = store
                        .get_cell(&ds, &key)
                        .await
                        .map_err(|e| from_store(&e))?;
                    Ok(cell.map(cell_value))
                })
            })
            .argument(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
            .argument(InputValue::new("column", TypeRef::named_nn(&self.column)))
            .argument(InputValue::new("refKey", TypeRef::named_nn(INT64)))
            .description("One version of a cell."),
        );
        let d = ds.clone();
        object = object.field(
            Field::new("latestCell", TypeRef::named("Cell"), move |ctx| {
                let ds = d.clone();
                FieldFuture::new(async move {
                    let store = ctx.data::<Store>()?;
                    let row_key = scalars::uuid(&ctx.args.try_get("rowKey")?, "rowKey")?;
                    let column = ctx.args.try_get("column")?.enum_name()?.to_string();
                    let cell = store
                        .get_cell_latest(&ds, row_key, &column)
                        .await
                        .map_err(|e| from_store(&e))?;
                    Ok(cell.map(cell_value))
                })
            })
            .argument(InputValue::new("rowKey", TypeRef::named_nn(UUID)))
            .argument(InputValue::new("column", TypeRef::named_nn(&self.column)))
            .description("The version of a cell with the highest ref key."),
        );
        let d = ds.clone();
        object = object.field(
            Field::new("history", TypeRef::named_nn_list_nn("Cell"), move |ctx| {
                let ds = d.clone();
                FieldFuture::new(async move {
                    let store = ctx.data::<Store>()?;
                    let row_key = scalars::uuid(&ctx.args.try_get("rowKey")?, "rowKey")?;
                    let column = ctx.args.try_get("column")?.enum_name()?.to_string();
                    let first = page_size(&ctx, "first", 20, 1000)?;
                    let before = match ctx.args.get("before").filter(|v| !v.is_null()) {
                        Some(v) => Some(int64(&v, "before")?),
                        None => None,
                    };
                    let cells = store
                        .history(&ds, row_key, &column, first, before)
                        .await
                        .map_err(|e| from_store(&e))?;
                    Ok(Some(FieldValue::list(cells.into_iter().map(cell_value))))
                })
            })
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
            Field::new(
                "cellsForShard",
                TypeRef::named_nn("CellLogPage"),
                move |ctx| {
                    let ds = d.clone();
                    FieldFuture::new(async move {
                        let store = ctx.data::<Store>()?;
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
                        let limit = page_size(&ctx, "limit", 100, crate::cells::MAX_LOG_PAGE)?;
                        let page = store
                            .cells_for_shard(&ds, shard, location, limit)
                            .await
                            .map_err(|e| from_store(&e))?;
                        Ok(Some(FieldValue::owned_any(ShardPage {
                            cells: page.cells.into_iter().map(Arc::new).collect(),
                            next: page.next,
                        })))
                    })
                },
            )
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
        for field in super::maintenance::query_fields(ds) {
            object = object.field(field);
        }
        let mut seen: std::collections::HashSet<String> = [
            "row",
            "rows",
            "cell",
            "latestCell",
            "history",
            "cellsForShard",
        ]
        .into_iter()
        .chain(super::maintenance::QUERY_FIELDS)
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

/// The limits the schema was built with.
fn limits(ctx: &ResolverContext<'_>) -> GraphqlLimits {
    ctx.data::<GraphqlLimits>().copied().unwrap_or_default()
}

/// Refuses a filter string longer than the limits allow before it is
/// planned (a 10,000-term filter took seconds to plan). A filter that
/// does not parse is left to the planner, whose error says where.
fn check_filter(filter: &str, limits: GraphqlLimits) -> async_graphql::Result<()> {
    if filter.len() > limits.filter_bytes {
        return Err(coded(
            "LIMIT_EXCEEDED",
            format!("`filter` is at most {} bytes", limits.filter_bytes),
        ));
    }
    if let Ok(parsed) = index_dsl::parse_filter(filter) {
        if parsed.conditions.len() > limits.filter_terms {
            return Err(coded(
                "LIMIT_EXCEEDED",
                format!("`filter` has at most {} conditions", limits.filter_terms),
            ));
        }
        if parsed
            .conditions
            .iter()
            .any(|c| c.values.len() > limits.in_values)
        {
            return Err(coded(
                "LIMIT_EXCEEDED",
                format!(
                    "an `in` list of `filter` has at most {} values",
                    limits.in_values
                ),
            ));
        }
    }
    Ok(())
}

/// Reads a page-size argument, with its default and maximum.
fn page_size(
    ctx: &ResolverContext<'_>,
    name: &str,
    default: u32,
    max: u32,
) -> async_graphql::Result<u32> {
    page_size_of(argument(ctx.args.as_index_map(), name), name, default, max)
}

/// A page-size argument's value, with its default and maximum.
fn page_size_of(
    value: Option<&Value>,
    name: &str,
    default: u32,
    max: u32,
) -> async_graphql::Result<u32> {
    let value = match value {
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| bad_input(format!("`{name}` must be an integer")))?,
        Some(_) => return Err(bad_input(format!("`{name}` must be an integer"))),
        None => i64::from(default),
    };
    if value < 0 {
        return Err(bad_input(format!("`{name}` must not be negative")));
    }
    if value > i64::from(max) {
        return Err(coded(
            "LIMIT_EXCEEDED",
            format!("`{name}` is at most {max}"),
        ));
    }
    Ok(value as u32)
}

/// A field of the `Cell` type: one table for the schema and for direct
/// execution (`direct.rs`), so both answer the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CellField {
    RowKey,
    Column,
    RefKey,
    Body,
    CreatedAt,
    Shard,
    AddedId,
}

impl CellField {
    pub(super) const ALL: [CellField; 7] = [
        CellField::RowKey,
        CellField::Column,
        CellField::RefKey,
        CellField::Body,
        CellField::CreatedAt,
        CellField::Shard,
        CellField::AddedId,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            CellField::RowKey => "rowKey",
            CellField::Column => "column",
            CellField::RefKey => "refKey",
            CellField::Body => "body",
            CellField::CreatedAt => "createdAt",
            CellField::Shard => "shard",
            CellField::AddedId => "addedId",
        }
    }

    fn type_ref(self) -> TypeRef {
        TypeRef::named_nn(match self {
            CellField::RowKey => UUID,
            CellField::Column => TypeRef::STRING,
            CellField::RefKey | CellField::AddedId => INT64,
            CellField::Body => JSON,
            CellField::CreatedAt => DATETIME,
            CellField::Shard => TypeRef::INT,
        })
    }

    pub(super) fn value(self, c: &Cell) -> Value {
        match self {
            CellField::Body => json_value(&c.body),
            field => field.meta(c),
        }
    }

    /// The value of a field other than `body`, whatever the body's form
    /// (null for `body`).
    pub(super) fn meta<B>(self, c: &Cell<B>) -> Value {
        match self {
            CellField::RowKey => Value::String(c.row_key.to_string()),
            CellField::Column => Value::String(c.column.clone()),
            CellField::RefKey => int64_value(c.ref_key),
            CellField::Body => Value::Null,
            CellField::CreatedAt => datetime_value(c.created_at),
            CellField::Shard => Value::from(c.shard),
            CellField::AddedId => int64_value(c.added_id),
        }
    }
}

fn cell_type() -> Object {
    CellField::ALL.into_iter().fold(
        Object::new("Cell").description("An immutable version of a column of a row."),
        |object, field| {
            object.field(from_parent::<Arc<Cell>, _>(
                field.name(),
                field.type_ref(),
                move |c| field.value(c),
            ))
        },
    )
}

/// A page of a shard's log as `CellLogPage` resolves it.
struct ShardPage {
    cells: Vec<Arc<Cell>>,
    next: Location,
}

/// A cell as the parent of the `Cell` type's fields: shared, so the
/// per-request cell cache lends it without copying its body.
fn cell_value(cell: Cell) -> FieldValue<'static> {
    FieldValue::owned_any(Arc::new(cell))
}

fn log_page_type() -> Object {
    Object::new("CellLogPage")
        .description("A page of a shard's cell log.")
        .field(Field::new(
            "cells",
            TypeRef::named_nn_list_nn("Cell"),
            |ctx| {
                FieldFuture::new(async move {
                    let page = parent::<ShardPage>(&ctx)?;
                    Ok(Some(FieldValue::list(
                        page.cells.iter().cloned().map(FieldValue::owned_any),
                    )))
                })
            },
        ))
        .field(
            from_parent::<ShardPage, _>("next", TypeRef::named_nn(INT64), |p| match p.next {
                Location::AddedId(id) => int64_value(id),
                Location::Timestamp(_) => Value::Null,
            })
            .description("pass as `after` to read on"),
        )
}

/// How a field's value is computed from its parent.
pub(super) type FieldOf<T> = fn(&T) -> Value;

/// The fields of `PageInfo` and their values.
pub(super) const PAGE_INFO_FIELDS: [(&str, FieldOf<IndexPage>); 2] = [
    ("hasNextPage", |p| Value::Boolean(p.has_next_page)),
    ("endCursor", |p| {
        p.end_cursor.clone().map_or(Value::Null, Value::String)
    }),
];

fn page_info_type() -> Object {
    let [(has_next, has_next_value), (end_cursor, end_cursor_value)] = PAGE_INFO_FIELDS;
    Object::new("PageInfo")
        .field(from_parent::<IndexPage, _>(
            has_next,
            TypeRef::named_nn(TypeRef::BOOLEAN),
            has_next_value,
        ))
        .field(from_parent::<IndexPage, _>(
            end_cursor,
            TypeRef::named(TypeRef::STRING),
            end_cursor_value,
        ))
}

fn put_result_type() -> Object {
    Object::new("PutCellResult")
        .description("The outcome of one written cell.")
        .field(from_parent::<PutOutcome, _>(
            "rowKey",
            TypeRef::named_nn(UUID),
            |p| Value::String(p.row_key.to_string()),
        ))
        .field(from_parent::<PutOutcome, _>(
            "column",
            TypeRef::named_nn(TypeRef::STRING),
            |p| Value::String(p.column.clone()),
        ))
        .field(from_parent::<PutOutcome, _>(
            "refKey",
            TypeRef::named_nn(INT64),
            |p| int64_value(p.ref_key),
        ))
        .field(
            from_parent::<PutOutcome, _>("status", TypeRef::named("PutStatus"), |p| {
                match &p.result {
                    Ok(status) => Value::Enum(async_graphql::Name::new(match status {
                        PutStatus::Written => "WRITTEN",
                        PutStatus::Duplicate => "DUPLICATE",
                        PutStatus::Buffered => "BUFFERED",
                    })),
                    Err(_) => Value::Null,
                }
            })
            .description("null when the cell was refused (see `error`)"),
        )
        .field(
            from_parent::<PutOutcome, _>("readable", TypeRef::named_nn(TypeRef::BOOLEAN), |p| {
                Value::Boolean(p.result.as_ref().is_ok_and(|s| s.readable()))
            })
            .description("whether the cell can be read back now"),
        )
        .field(
            from_parent::<PutOutcome, _>("error", TypeRef::named("PutCellError"), |p| {
                match &p.result {
                    Ok(_) => Value::Null,
                    Err(refusal) => obj(vec![
                        ("code", Value::String(refusal.code.to_string())),
                        ("message", Value::String(refusal.message.clone())),
                        ("retryable", Value::Boolean(refusal.retryable)),
                    ]),
                }
            })
            .description("why the cell was refused; also reported in `errors` with its index"),
        )
}

fn put_error_type() -> Object {
    Object::new("PutCellError")
        .description("Why a cell was not written.")
        .field(
            meta_field("code", TypeRef::named_nn(TypeRef::STRING))
                .description("a stable code, e.g. CELL_CONFLICT"),
        )
        .field(meta_field("message", TypeRef::named_nn(TypeRef::STRING)))
        .field(
            meta_field("retryable", TypeRef::named_nn(TypeRef::BOOLEAN)).description(
                "true when writing the same cell again later may succeed \
                 (e.g. STORAGE_UNAVAILABLE); writes are idempotent, so that is safe",
            ),
        )
}

fn scalar_of(ty: FieldType) -> &'static str {
    match ty {
        FieldType::Uuid => UUID,
        FieldType::String => TypeRef::STRING,
        FieldType::Int => INT64,
        FieldType::Float => TypeRef::FLOAT,
        FieldType::Bool => TypeRef::BOOLEAN,
        FieldType::DateTime => DATETIME,
    }
}

fn filter_name(ty: FieldType) -> String {
    format!("{}Filter", scalar_of(ty))
}

/// `UUIDFilter`, `StringFilter`, `Int64Filter`, `FloatFilter`,
/// `BooleanFilter`, `DateTimeFilter`: the conditions on one index field.
fn filter_input(ty: FieldType) -> InputObject {
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
fn literal(value: &Value, ty: FieldType, what: &str) -> async_graphql::Result<Literal> {
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
struct IndexTypes {
    connection: String,
    edge: String,
    entry: String,
    where_input: String,
    order_input: String,
    field_enum: String,
}

impl IndexTypes {
    fn new(datastore: &Datastore, index: &Index) -> Self {
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

fn screaming(name: &str) -> String {
    name.to_ascii_uppercase()
}

/// The types of one index: connection, edge, entry, where, order, field enum.
fn index_types(
    datastore: &Datastore,
    index: &Index,
) -> crate::Result<Vec<async_graphql::dynamic::Type>> {
    let names = IndexTypes::new(datastore, index);
    let row_type = DatastoreTypes::new(datastore).row;
    let mut entry = Object::new(&names.entry)
        .description(format!("An entry of the `{}` index.", index.name))
        .field(from_parent::<IndexEntry, _>(
            "rowKey",
            TypeRef::named_nn(UUID),
            |e| Value::String(e.row_key.to_string()),
        ));
    let mut seen = std::collections::HashSet::from(["rowKey".to_string(), "row".to_string()]);
    for field in &index.fields {
        let gql = camel(&field.name);
        if !seen.insert(gql.clone()) {
            return Err(name_clash(&format!("{}.{gql}", names.entry)));
        }
        let name = field.name.clone();
        entry = entry.field(
            from_parent::<IndexEntry, _>(&gql, TypeRef::named(scalar_of(field.ty)), move |e| {
                entry_value(e, &name)
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
                let e = parent::<IndexEntry>(&ctx)?;
                Ok(Some(FieldValue::owned_any(RowRef { row_key: e.row_key })))
            })
        })
        .description("The row's cells, fetched in batches per shard."),
    );
    let edge = Object::new(&names.edge)
        .field(from_parent::<IndexEntry, _>(
            "cursor",
            TypeRef::named_nn(TypeRef::STRING),
            |e| Value::String(e.cursor()),
        ))
        .field(Field::new("node", TypeRef::named_nn(&names.entry), |ctx| {
            FieldFuture::new(async move {
                let e = parent::<IndexEntry>(&ctx)?;
                Ok(Some(FieldValue::owned_any(e.clone())))
            })
        }));
    let connection = Object::new(&names.connection)
        .field(Field::new(
            "edges",
            TypeRef::named_nn_list_nn(&names.edge),
            |ctx| {
                FieldFuture::new(async move {
                    let page = parent::<IndexPage>(&ctx)?;
                    Ok(Some(FieldValue::list(
                        page.entries.iter().cloned().map(FieldValue::owned_any),
                    )))
                })
            },
        ))
        .field(Field::new(
            "pageInfo",
            TypeRef::named_nn("PageInfo"),
            |ctx| {
                FieldFuture::new(async move {
                    let page = parent::<IndexPage>(&ctx)?;
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
        field_enum = field_enum.item(EnumItem::new(screaming(&field.name)));
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
pub(super) fn entry_value(entry: &IndexEntry, name: &str) -> Value {
    entry
        .fields
        .iter()
        .find(|(n, _)| n == name)
        .map_or(Value::Null, |(_, v)| sql_value(v))
}

/// The arguments of an index field naming its shard field's value, and a
/// list of them.
pub(super) fn shard_arguments(index: &Index) -> (String, String) {
    let shard_arg = camel(&index.shard_field().name);
    let list_arg = format!("{shard_arg}In");
    (shard_arg, list_arg)
}

/// `Query.<datastore>.<index>`: the index as a Relay connection.
fn index_field(datastore: &Datastore, index: &Index, ds: &Arc<str>) -> Field {
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
    Field::new(camel(&index.name), TypeRef::named_nn(&names.connection), move |ctx| {
        let index = resolver_index.clone();
        let ds = ds.clone();
        let columns = columns.clone();
        let (arg, list_arg) = (arg.clone(), list_arg.clone());
        FieldFuture::new(async move {
            let store = ctx.data::<Store>()?;
            let node = ctx.look_ahead().field("edges").field("node");
            let query = index_query(
                ctx.args.as_index_map(),
                limits(&ctx),
                &|field| node.field(field).exists(),
                &index,
                &arg,
                &list_arg,
            )?;
            let page = store.query_index(&ds, &query).await.map_err(|e| from_store(&e))?;
            prefetch_rows(&ctx, store, &ds, &columns, &page).await?;
            Ok(Some(FieldValue::owned_any(page)))
        })
    })
    .description(index.description.clone().unwrap_or_else(|| {
        format!(
            "The `{}` index. Give the shard field `{shard_arg}` (or a short `{shard_list_arg}` list).",
            index.name
        )
    }))
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
            .default_value(Value::from(crate::indexes::plan::DEFAULT_PAGE))
            .description("page size, at most 1000"),
    )
    .argument(
        InputValue::new("after", TypeRef::named(TypeRef::STRING))
            .description("the `endCursor` of the previous page"),
    )
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
    page: &crate::indexes::IndexPage,
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
        .get_cells_latest(ds, &wanted)
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
            };
            cell.map(|cell| (request, Arc::new(cell)))
        });
    ctx.data::<Cells>()?.feed_many(found).await;
    Ok(())
}

/// The arguments of a field, coerced: variables replaced by their values
/// and defaults filled in.
pub(super) type Arguments = async_graphql::indexmap::IndexMap<async_graphql::Name, Value>;

/// The non-null argument `name`.
fn argument<'a>(args: &'a Arguments, name: &str) -> Option<&'a Value> {
    args.get(name).filter(|v| !matches!(v, Value::Null))
}

fn list_of<'a>(value: &'a Value, what: &str) -> async_graphql::Result<&'a [Value]> {
    match value {
        Value::List(items) => Ok(items),
        _ => Err(bad_input(format!("`{what}` must be a list"))),
    }
}

fn object_of<'a>(value: &'a Value, what: &str) -> async_graphql::Result<&'a Arguments> {
    match value {
        Value::Object(map) => Ok(map),
        _ => Err(bad_input(format!("`{what}` must be an object"))),
    }
}

/// Turns the arguments of an index field into an [`IndexQuery`] reading
/// the index fields for which `selects` is true.
pub(super) fn index_query(
    args: &Arguments,
    limits: GraphqlLimits,
    selects: &dyn Fn(&str) -> bool,
    index: &Index,
    shard_arg: &str,
    shard_list_arg: &str,
) -> async_graphql::Result<IndexQuery> {
    let shard_field = index.shard_field();
    let mut query = IndexQuery {
        index: index.name.clone(),
        ..IndexQuery::default()
    };
    if let Some(value) = argument(args, shard_arg) {
        query
            .shard_values
            .push(literal(value, shard_field.ty, shard_arg)?);
    }
    if let Some(list) = argument(args, shard_list_arg) {
        for value in list_of(list, shard_list_arg)? {
            query
                .shard_values
                .push(literal(value, shard_field.ty, shard_list_arg)?);
        }
    }
    if let Some(conditions) = argument(args, "where") {
        let conditions = object_of(conditions, "where")?;
        for field in &index.fields {
            let Some(filter) = argument(conditions, &camel(&field.name)) else {
                continue;
            };
            for (op, value) in object_of(filter, "where")? {
                let what = format!("where.{}.{}", camel(&field.name), op.as_str());
                if matches!(value, Value::Null) {
                    continue;
                }
                let condition = |op, values| Condition {
                    field: field.name.clone(),
                    op,
                    values,
                    column: 1,
                };
                let op = match op.as_str() {
                    "eq" => CompareOp::Eq,
                    "ne" => CompareOp::Ne,
                    "gt" => CompareOp::Gt,
                    "gte" => CompareOp::Ge,
                    "lt" => CompareOp::Lt,
                    "lte" => CompareOp::Le,
                    "in" => {
                        let list = list_of(value, &what)?;
                        let max = limits.in_values;
                        if list.len() > max {
                            return Err(coded(
                                "LIMIT_EXCEEDED",
                                format!("{what}: at most {max} values"),
                            ));
                        }
                        let values = list
                            .iter()
                            .map(|v| literal(v, field.ty, &what))
                            .collect::<async_graphql::Result<Vec<_>>>()?;
                        if values.is_empty() {
                            return Err(bad_input(format!("{what}: the list is empty")));
                        }
                        query.conditions.push(condition(CompareOp::In, values));
                        continue;
                    }
                    "isNull" => {
                        let Value::Boolean(is_null) = value else {
                            return Err(bad_input(format!("{what} must be a boolean")));
                        };
                        let op = if *is_null {
                            CompareOp::Eq
                        } else {
                            CompareOp::Ne
                        };
                        query.conditions.push(condition(op, vec![Literal::Null]));
                        continue;
                    }
                    other => return Err(bad_input(format!("unknown condition `{other}`"))),
                };
                let literal = literal(value, field.ty, &what)?;
                query.conditions.push(condition(op, vec![literal]));
            }
        }
    }
    if let Some(filter) = argument(args, "filter") {
        let Value::String(filter) = filter else {
            return Err(bad_input("`filter` must be a string"));
        };
        check_filter(filter, limits)?;
        query.filter = Some(filter.to_string());
    }
    if let Some(order) = argument(args, "orderBy") {
        for key in list_of(order, "orderBy")? {
            let key = object_of(key, "orderBy")?;
            let item = match key.get("field") {
                Some(Value::Enum(name)) => name.to_string(),
                Some(Value::String(name)) => name.clone(),
                _ => return Err(bad_input("`orderBy` needs a `field`")),
            };
            let field = index
                .fields
                .iter()
                .find(|f| screaming(&f.name) == item)
                .ok_or_else(|| bad_input(format!("unknown order field `{item}`")))?;
            let descending = match key.get("direction") {
                Some(Value::Enum(name)) => name.as_str() == "DESC",
                Some(Value::String(name)) => name == "DESC",
                _ => false,
            };
            query.order_by.push(OrderBy {
                field: field.name.clone(),
                descending,
            });
        }
    }
    let first = page_size_of(
        argument(args, "first"),
        "first",
        crate::indexes::plan::DEFAULT_PAGE,
        crate::indexes::plan::MAX_PAGE,
    )?;
    query.first = Some(first);
    if let Some(after) = argument(args, "after") {
        let Value::String(after) = after else {
            return Err(bad_input("`after` must be a string"));
        };
        query.after = Some(after.clone());
    }
    // Projection: read only the fields the query selects under edges.node.
    query.fields = index
        .fields
        .iter()
        .filter(|f| selects(&camel(&f.name)))
        .map(|f| f.name.clone())
        .collect();
    if query.fields.is_empty() {
        query.fields.push(shard_field.name.clone());
    }
    Ok(query)
}

/// `Mutation.<datastore>PutCells`.
fn put_cells_field(datastore: &Datastore, types: &DatastoreTypes, ds: &Arc<str>) -> Field {
    let ds = ds.clone();
    Field::new(
        format!("{}PutCells", camel(&datastore.name)),
        TypeRef::named_nn_list_nn("PutCellResult"),
        move |ctx| {
            let ds = ds.clone();
            FieldFuture::new(async move {
                let store = ctx.data::<Store>()?;
                let inputs = ctx.args.try_get("cells")?.list()?;
                let mut cells = Vec::with_capacity(inputs.len());
                for (i, input) in inputs.iter().enumerate() {
                    let input = input.object()?;
                    let what = |f: &str| format!("cells[{i}].{f}");
                    let body = scalars::json_from_value(input.try_get("body")?.as_value());
                    cells.push(NewCell {
                        row_key: scalars::uuid(&input.try_get("rowKey")?, &what("rowKey"))?,
                        column: input.try_get("column")?.enum_name()?.to_string(),
                        ref_key: int64(&input.try_get("refKey")?, &what("refKey"))?,
                        body,
                    });
                }
                let keys: Vec<(Uuid, String, i64)> = cells
                    .iter()
                    .map(|c| (c.row_key, c.column.clone(), c.ref_key))
                    .collect();
                let results = store.put_cells(&ds, cells).await.map_err(|e| from_store(&e))?;
                let response_key = ctx.item.node.response_key().node.to_string();
                let mut items = Vec::with_capacity(results.len());
                for (i, ((row_key, column, ref_key), result)) in keys.into_iter().zip(results).enumerate() {
                    let result = result.map_err(|err| {
                        // Reported once in `errors`, with the cell's index.
                        let mut error = from_store(&err).into_server_error(ctx.item.pos);
                        error.path = vec![
                            PathSegment::Field(response_key.clone()),
                            PathSegment::Index(i),
                        ];
                        ctx.add_error(error);
                        PutRefusal {
                            code: err.code(),
                            message: err.client_message(),
                            retryable: err.is_transient(),
                        }
                    });
                    items.push(FieldValue::owned_any(PutOutcome {
                        row_key,
                        column,
                        ref_key,
                        result,
                    }));
                }
                Ok(Some(FieldValue::list(items)))
            })
        },
    )
    .argument(InputValue::new("cells", TypeRef::named_nn_list_nn(&types.cell_input)))
    .description(format!(
        "Writes cells to `{}`: one transaction per shard, a result per cell in input order. \
         A refused cell (e.g. CELL_CONFLICT: same key, different body) has a null `status` and an `error`, \
         and is reported in `errors` with its index.",
        datastore.name
    ))
}

fn metadata_types() -> Vec<Object> {
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
            )),
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

fn obj(entries: Vec<(&str, Value)>) -> Value {
    Value::Object(
        entries
            .into_iter()
            .map(|(k, v)| (scalars::name(k), v))
            .collect(),
    )
}

fn opt(s: &Option<String>) -> Value {
    s.clone().map_or(Value::Null, Value::String)
}

/// `Query.datastores`: definitions and topology, for tools and the explorer.
fn datastores_field(topology: Topology<'_>, defs: &index_dsl::Definitions) -> Field {
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

fn index_info(index: &Index) -> Value {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(camel("driver_partner_index"), "driverPartnerIndex");
        assert_eq!(camel("FARE_ADJUSTMENT"), "fareAdjustment");
        assert_eq!(camel("BASE"), "base");
        assert_eq!(camel("trips"), "trips");
        assert_eq!(pascal("trips"), "Trips");
        assert_eq!(pascal("driver_partner_index"), "DriverPartnerIndex");
        assert_eq!(camel("fareTotal"), "fareTotal");
    }
}
