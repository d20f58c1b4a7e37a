//! Builds the dynamic schema from the definitions, one file per kind of
//! generated type: `datastore.rs`, `index.rs`, `cell.rs`, `put.rs`,
//! `metadata.rs`, and `arguments.rs` for decoding arguments.
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
    Enum, EnumItem, Field, FieldFuture, FieldValue, Object, Schema, TypeRef,
};
use index_dsl::FieldType;

use crate::scalars::{self};
use cellgate_store::Store;

mod arguments;
mod cell;
mod datastore;
pub mod diff;
mod entities;
mod index;
mod metadata;
mod put;
mod subscription;

use self::arguments::*;
use self::cell::*;
use self::datastore::*;
use self::index::*;
use self::metadata::*;
use self::put::*;
use self::subscription::*;
use crate::fields::*;
use crate::limits::GraphqlLimits;
use crate::names::*;

pub(crate) use self::arguments::{index_query, Arguments};
pub(crate) use self::cell::CellField;
pub(crate) use self::index::{shard_arguments, PAGE_INFO_FIELDS};
pub(crate) use self::put::PutOutcome;

/// Marker parent value of `Query.<datastore>`.
pub(super) struct DatastoreRoot;
/// The schema for the store's definitions.
pub fn build_schema(store: &Store, limits: GraphqlLimits) -> cellgate_store::Result<Schema> {
    schema_for(&store.definitions(), limits, false)
}

/// The schema of only the `visible` datastores of `defs`: what
/// introspection shows a token scoped to them.
pub(crate) fn build_visible_schema(
    defs: &index_dsl::Definitions,
    limits: GraphqlLimits,
    visible: &[String],
    federation: bool,
) -> cellgate_store::Result<Schema> {
    let mut defs = defs.clone();
    defs.datastores.retain(|d| visible.contains(&d.name));
    schema_for(&defs, limits, federation)
}

/// The SDL of the schema for `defs`, as exported to `schema/schema.graphql`.
pub fn sdl(defs: &index_dsl::Definitions) -> cellgate_store::Result<String> {
    let schema = schema_for(defs, GraphqlLimits::default(), false)?;
    Ok(schema.sdl())
}

/// The SDL of the schema for `defs` as a Federation 2 subgraph, as
/// `_service { sdl }` answers it (`schema/schema.federation.graphql`).
pub fn subgraph_sdl(defs: &index_dsl::Definitions) -> cellgate_store::Result<String> {
    let schema = schema_for(defs, GraphqlLimits::default(), true)?;
    Ok(schema.sdl_with_options(
        async_graphql::SDLExportOptions::new()
            .federation()
            .compose_directive(),
    ))
}

/// The schema for `defs`; with `federation`, a Federation 2 subgraph
/// whose row types are entities (`entities.rs`).
pub(crate) fn schema_for(
    defs: &index_dsl::Definitions,
    limits: GraphqlLimits,
    federation: bool,
) -> cellgate_store::Result<Schema> {
    let defs = defs.clone();
    let subscribed = !defs.datastores.is_empty();
    let mut builder = Schema::build(
        "Query",
        Some("Mutation"),
        subscribed.then_some("Subscription"),
    );
    for scalar in scalars::scalars() {
        builder = builder.register(scalar);
    }
    builder = builder
        .register(cell_type())
        .register(log_page_type())
        .register(if federation {
            // Subgraphs commonly define their own `PageInfo`.
            page_info_type().shareable()
        } else {
            page_info_type()
        })
        .register(put_result_type())
        .register(put_error_type())
        .register(crate::consistency::consistency_enum())
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
        .chain(crate::maintenance::types())
    {
        builder = builder.register(object);
    }
    let (id_objects, id_enums) = crate::ids::types();
    for object in id_objects {
        builder = builder.register(object);
    }
    for e in id_enums {
        builder = builder.register(e);
    }
    let (verify_objects, verify_enums) = crate::verify::types();
    for object in verify_objects {
        builder = builder.register(object);
    }
    for e in verify_enums {
        builder = builder.register(e);
    }
    let (trigger_objects, trigger_enums) = crate::triggers::types();
    for object in trigger_objects {
        builder = builder.register(object);
    }
    for e in trigger_enums {
        builder = builder.register(e);
    }
    let (status_objects, status_enum) = crate::definitions::types();
    for object in status_objects {
        builder = builder.register(object);
    }
    builder = builder.register(status_enum);
    let mut query = Object::new("Query").description("Reads of every datastore, and IDs.");
    query = query.field(datastores_field(&defs));
    for field in crate::ids::query_fields() {
        query = query.field(field);
    }
    query = query.field(crate::definitions::query_field());
    let mut mutation =
        Object::new("Mutation").description("Writes of every datastore, and ID tags.");
    mutation = mutation.field(crate::ids::create_tag_field());
    let mut subscription = async_graphql::dynamic::Subscription::new("Subscription")
        .description("Cells of every datastore as they are committed (over `/graphql/ws`).");
    let mut seen = std::collections::HashSet::from(["datastores".to_string()]);
    seen.extend(crate::ids::QUERY_FIELDS.iter().map(|f| f.to_string()));
    seen.insert(crate::definitions::QUERY_FIELD.to_string());
    for datastore in &defs.datastores {
        let ds: Arc<str> = Arc::from(datastore.name.as_str());
        if !seen.insert(camel(&datastore.name)) {
            return Err(name_clash(&format!("Query.{}", camel(&datastore.name))));
        }
        let types = DatastoreTypes::new(datastore);
        builder = builder
            .register(types.column_enum(datastore))
            .register(if federation {
                types.row_type(datastore, &ds)?.key("rowKey")
            } else {
                types.row_type(datastore, &ds)?
            })
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
        mutation = mutation.field(crate::maintenance::retry_field(&ds));
        mutation = mutation.field(crate::triggers::retry_field(datastore, &ds));
        mutation = mutation.field(crate::verify::mutation_field(&ds, datastore.shards));
        builder = builder.register(event_type(datastore, &types));
        subscription = subscription.field(cells_subscription(datastore, &types, &ds));
    }
    if subscribed {
        builder = builder.register(subscription);
    }
    builder = builder.register(query);
    builder = builder.register(mutation);
    if federation {
        let entities = self::entities::Entities::new(&defs);
        builder = builder
            .enable_federation()
            .entity_resolver(move |ctx| entities.resolve(ctx));
    }
    builder
        .data(limits)
        .finish()
        .map_err(|e| cellgate_store::Error::Config(format!("cannot build the GraphQL schema: {e}")))
}

pub(super) fn name_clash(what: &str) -> cellgate_store::Error {
    cellgate_store::Error::Config(format!(
        "two definitions map to the GraphQL name `{what}`; rename one of them"
    ))
}
