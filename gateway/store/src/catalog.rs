//! The catalog: what each cluster's tables were built from, and the
//! preparation of a cluster (its tables, its shard rows, its catalog).
//!
//! Each cluster has a `cellgate_catalog` table of `(datastore, item) →
//! value` rows:
//!
//! | item | value |
//! |---|---|
//! | `layout` (datastore `""`) | the table layout version, `2` |
//! | `shards` | the datastore's logical shard count, fixed at creation |
//! | `ranges` | the shard ranges this cluster holds, e.g. `0-2047` |
//! | `index:<name>:<version>` | JSON: the definition's signature, `building` / `ready` / `superseded`, its fields, the definition it was built from (`catalog/stored.rs`), once ready the cells and seconds its build took, and once superseded when |
//! | `definitions` (datastore `""`, first cluster) | JSON: the definition files a gateway last served, with their digest (`deployed.rs`) |
//!
//! At start-up the definitions and topology are checked against every
//! reachable cluster's catalog. A change that would hide or corrupt data is
//! refused: a new shard count (every cell would hash elsewhere), or shard
//! ranges that moved between clusters (moving shards means copying their
//! rows first). An index whose fields, shard field or `where:` predicate
//! changed gets a new table version, filled online from the cell log; the
//! previous version (still `ready`) stays maintained and answers the
//! queries it can answer meanwhile, recorded here with its definition so a
//! store started with the new definitions serves it too. Once the new
//! version is ready the previous one is `superseded`: no longer maintained,
//! its table stays until `cellgate index drop` removes it (refused for
//! [`DROP_GRACE`] after the switch), as does the table of an index whose
//! file was removed.
//!
//! Preparing a cluster creates its tables in one transaction (where the
//! backend has transactional DDL) and is idempotent, so concurrent
//! gateways may prepare the same cluster. Clusters unreachable at start-up
//! are prepared by a background task once they answer; until then their
//! shards fail with `STORAGE_UNAVAILABLE`. Requests never run DDL.

mod stored;
mod superseded;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use index_dsl::{Definitions, Index};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::retry::with_retry;
use crate::shards::format_ranges;
use crate::storage::{ddl, Backend, Dialect, Sql, Value, MAX_PARAMS};
use crate::topology::{
    index_signature, Cluster, ClusterState, DatastoreRuntime, Defined, Topology,
};
use stored::StoredIndex;

/// A cluster's catalog rows: `(datastore, item) → value`.
pub(crate) type Catalog = BTreeMap<(String, String), String>;

/// What a catalog records of one index version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct IndexRecord {
    signature: String,
    state: IndexState,
    /// The fields, for people reading the catalog.
    fields: String,
    /// How the build of this version went, once it is ready (what
    /// `cellgate plan` estimates rebuilds from).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    built: Option<Built>,
    /// The definition the table was built from, so that a store started
    /// with changed definitions can serve this version while it builds
    /// the new one. Absent in records of earlier versions until a store
    /// that serves them records it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    definition: Option<StoredIndex>,
    /// When a newer version replaced this one (Unix seconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    superseded_at: Option<i64>,
}

impl IndexRecord {
    fn of(index: &crate::topology::IndexRuntime, state: IndexState) -> IndexRecord {
        IndexRecord {
            signature: index.signature.clone(),
            state,
            fields: fields_text(&index.def),
            built: None,
            definition: Some(StoredIndex::of(&index.def)),
            superseded_at: None,
        }
    }
}

/// How long after a switch to a new index version `cellgate index drop`
/// refuses to drop the previous one: gateways switch within a sweep of
/// noticing the new version ready, and requests that started before finish
/// with the version they started with.
pub(crate) const DROP_GRACE: Duration = Duration::from_secs(60);

/// The measured part of an index build: cells applied, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Built {
    pub cells: i64,
    pub seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum IndexState {
    /// Being filled from the cell log; queries answer `INDEX_BUILDING`.
    Building,
    /// Complete and maintained.
    Ready,
    /// Replaced by a newer version; no longer maintained.
    Superseded,
}

/// The version of each index's table the store will use, whether it is
/// known to be complete, and while it is not, the previous version that
/// serves meanwhile (with the definition it was built from).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct IndexPlan {
    pub(crate) version: u32,
    pub(crate) ready: bool,
    pub(crate) previous: Option<(u32, Index)>,
}

/// The build figures of a catalog value, if it is an index record that
/// has them.
pub(crate) fn recorded_build(value: &str) -> Option<Built> {
    serde_json::from_str::<IndexRecord>(value).ok()?.built
}

fn index_item(name: &str, version: u32) -> String {
    format!("index:{name}:{version}")
}

/// `index:<name>:<version>` → `(name, version)`.
fn parse_index_item(item: &str) -> Option<(&str, u32)> {
    let rest = item.strip_prefix("index:")?;
    let (name, version) = rest.rsplit_once(':')?;
    Some((name, version.parse().ok()?))
}

fn fields_text(index: &Index) -> String {
    let fields = index
        .fields
        .iter()
        .map(|f| format!("{} {}", f.name, f.ty.name()))
        .collect::<Vec<_>>()
        .join(", ");
    match &index.predicate {
        None => fields,
        Some(predicate) => format!("{fields} where {}", predicate.qualified()),
    }
}

/// Creates the cluster tables if needed, refuses a store in the per-shard
/// layout of earlier versions (unless `converting`), and reads the catalog.
pub(crate) async fn open_cluster(backend: &dyn Backend, converting: bool) -> Result<Catalog> {
    let dialect = backend.dialect();
    if backend.has_table(ddl::V1_REGISTRY_TABLE).await? {
        return Err(Error::LayoutUpgradeRequired(format!(
            "storage cluster `{}` holds cells in the per-shard table layout of earlier versions; \
             convert it with `cellgate migrate --from-v1` (cells keep their shards and added ids, \
             indexes are rebuilt from the cell log)",
            backend.cluster()
        )));
    }
    if !converting && backend.has_table(ddl::V1_CONVERTING_TABLE).await? {
        return Err(Error::LayoutUpgradeRequired(format!(
            "storage cluster `{}` is partly converted from the per-shard table layout; \
             finish with `cellgate migrate --from-v1`",
            backend.cluster()
        )));
    }
    with_retry("creating the cluster tables", || async {
        let mut tx = backend.begin().await?;
        for stmt in ddl::cluster_ddl(dialect) {
            tx.execute(&raw(dialect, &stmt)).await?;
        }
        tx.commit().await
    })
    .await?;
    read(backend).await
}

/// Reads a cluster's catalog.
pub(crate) async fn read(backend: &dyn Backend) -> Result<Catalog> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(["datastore", "item", "value"])
        .push(" FROM ")
        .ident(ddl::CATALOG_TABLE);
    Ok(backend
        .rows::<(String, String, String)>(&sql)
        .await?
        .into_iter()
        .map(|(ds, item, value)| ((ds, item), value))
        .collect())
}

/// Chooses each index's table version from the reachable catalogs: the
/// version whose signature matches the definition, or a new one (building)
/// when there is none. Warns about superseded versions and indexes whose
/// files were removed.
pub(crate) fn plan_indexes(
    defs: &Definitions,
    catalogs: &[&Catalog],
    warnings: &mut Vec<String>,
) -> HashMap<(String, String), IndexPlan> {
    let mut plans = HashMap::new();
    for ds in &defs.datastores {
        for index in &ds.indexes {
            let signature = index_signature(index);
            let mut highest = 0;
            let mut matching: Option<IndexPlan> = None;
            // Ready versions that could serve while another is built.
            let mut ready_versions: Vec<(u32, IndexRecord)> = Vec::new();
            for catalog in catalogs {
                for ((name, item), value) in catalog.iter() {
                    if name != &ds.name {
                        continue;
                    }
                    let Some((index_name, version)) = parse_index_item(item) else {
                        continue;
                    };
                    if index_name != index.name {
                        continue;
                    }
                    highest = highest.max(version);
                    let Ok(record) = serde_json::from_str::<IndexRecord>(value) else {
                        continue;
                    };
                    if record.signature == signature && record.state != IndexState::Superseded {
                        let ready = record.state == IndexState::Ready
                            || matching.as_ref().is_some_and(|m: &IndexPlan| m.ready);
                        matching = Some(IndexPlan {
                            version,
                            ready,
                            previous: None,
                        });
                    }
                    if record.state == IndexState::Ready {
                        ready_versions.push((version, record));
                    }
                }
            }
            let mut plan = matching.unwrap_or(IndexPlan {
                version: highest + 1,
                ready: false,
                previous: None,
            });
            if !plan.ready {
                plan.previous = serving_previous(ds, index, plan.version, &mut ready_versions);
            }
            if plan.version > highest || plan.previous.is_some() {
                if let Some((previous, _)) = &plan.previous {
                    warnings.push(format!(
                        "index `{}` of `{}` changed: building version {} from the cell log; \
                         version {previous} answers the queries it can answer until then, and \
                         its table stays until `cellgate index drop {} {} --index-version {previous}`",
                        index.name,
                        ds.name,
                        plan.version,
                        ds.name,
                        index.name
                    ));
                } else if highest > 0 {
                    warnings.push(format!(
                        "index `{}` of `{}` changed: building version {} from the cell log \
                         (queries answer INDEX_BUILDING until it is complete: no ready version \
                         of it records the definition it was built from); the table of \
                         version {highest} stays until `cellgate index drop {} {} --index-version {highest}`",
                        index.name,
                        ds.name,
                        plan.version,
                        ds.name,
                        index.name
                    ));
                }
            }
            plans.insert((ds.name.clone(), index.name.clone()), plan);
        }
    }
    for catalog in catalogs {
        for ((name, item), _) in catalog.iter() {
            let Some((index_name, version)) = parse_index_item(item) else {
                continue;
            };
            let defined = defs
                .datastore(name)
                .is_some_and(|ds| ds.index(index_name).is_some());
            let warning = format!(
                "index `{index_name}` (version {version}) of `{name}` is no longer defined; \
                 its table `{}` stays until `cellgate index drop {name} {index_name}`",
                ddl::index_table(name, index_name, version)
            );
            if !defined && !warnings.contains(&warning) {
                warnings.push(warning);
            }
        }
    }
    plans
}

/// The ready version of `index` other than `building` that serves while
/// `building` is built: the highest one whose recorded definition can be
/// served by the datastore as defined now.
fn serving_previous(
    ds: &index_dsl::Datastore,
    index: &Index,
    building: u32,
    ready: &mut [(u32, IndexRecord)],
) -> Option<(u32, Index)> {
    ready.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    ready
        .iter()
        .filter(|(version, _)| *version != building)
        .find_map(|(version, record)| {
            let restored =
                record
                    .definition
                    .as_ref()?
                    .restore(ds, &index.name, &record.signature)?;
            Some((*version, restored))
        })
}

/// Checks a cluster's catalog against the definitions and topology; fails
/// with a message naming the datastore and what changed.
pub(crate) fn validate(
    topology: &Topology,
    cluster: &Cluster,
    catalog: &Catalog,
    warnings: &mut Vec<String>,
) -> Result<()> {
    validate_defined(&topology.defined(), cluster, catalog, warnings)
}

/// [`validate`] for a set of definitions that may not be served yet
/// (`Store::reload` checks them before it serves them).
pub(crate) fn validate_defined(
    defined: &Defined,
    cluster: &Cluster,
    catalog: &Catalog,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let mut problems = Vec::new();
    for ds in defined.sorted() {
        let name = ds.name();
        let ranges = format_ranges(&ds.map().ranges_of(cluster.index));
        let recorded_shards = catalog.get(&(name.to_string(), "shards".to_string()));
        if let Some(recorded) = recorded_shards {
            if recorded != &ds.def.shards.to_string() {
                problems.push(format!(
                    "datastore `{name}` was created with {recorded} shards (recorded on cluster `{}`) \
                     but its definition now says {}: the shard count is fixed at creation, since \
                     every stored cell would hash to another shard; restore `shards: {recorded}`",
                    cluster.name, ds.def.shards
                ));
                continue;
            }
        }
        let recorded_ranges = catalog.get(&(name.to_string(), "ranges".to_string()));
        // The range of a move in progress may be recorded on either side.
        let settled = |text: &str| -> Vec<u32> {
            let moving = ds.routes.moving();
            parse_ranges(text)
                .into_iter()
                .filter(|s| moving.as_ref().is_none_or(|m| !m.contains(*s)))
                .collect()
        };
        match recorded_ranges {
            Some(recorded) if settled(recorded) != settled(&ranges) => {
                let now = if ranges.is_empty() {
                    "none".to_string()
                } else {
                    ranges.clone()
                };
                problems.push(format!(
                    "cluster `{}` holds shards {recorded} of `{name}` but the topology now routes \
                     shards {now} to it: moving shards between clusters means copying their rows \
                     first, and routing them elsewhere would hide stored cells; restore the shard \
                     ranges of `{name}` in the configuration",
                    cluster.name
                ));
            }
            _ => {}
        }
    }
    let defined: Vec<&str> = defined
        .defs
        .datastores
        .iter()
        .map(|d| d.name.as_str())
        .collect();
    for (name, item) in catalog.keys() {
        if item == "ranges" && !name.is_empty() && !defined.contains(&name.as_str()) {
            warnings.push(format!(
                "datastore `{name}` on cluster `{}` is no longer defined; its tables stay",
                cluster.name
            ));
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Error::Catalog(problems.join("\n")))
    }
}

/// Creates the tables of every datastore with shards on `cluster`, seeds
/// one counter row per owned shard and records the catalog, in one
/// transaction where DDL is transactional; then marks the cluster ready.
pub(crate) async fn prepare(
    topology: &Topology,
    cluster: &Cluster,
    catalog: &Catalog,
) -> Result<()> {
    let backend = cluster.master.as_ref();
    let datastores = topology.datastores_sorted();
    with_retry("preparing the cluster tables", || {
        prepare_once(&datastores, cluster, backend, catalog, false)
    })
    .await?;
    superseded::drop_superseded(&datastores, cluster).await;
    if let Some(query) = backend.dialect().buffer_pool_size_query() {
        warn_of_a_default_buffer_pool(cluster, backend, query).await;
    }
    cluster.set_state(ClusterState::Ready);
    Ok(())
}

/// InnoDB's default buffer pool (128 MiB).
const DEFAULT_BUFFER_POOL: i64 = 128 << 20;

/// Warns when a MariaDB/MySQL cluster runs with InnoDB's default buffer
/// pool: once the cell and index tables outgrow it, index upserts read
/// pages from disk and maintenance falls behind the writes (README,
/// "Storage configuration"). A failed check only goes unreported.
async fn warn_of_a_default_buffer_pool(cluster: &Cluster, backend: &dyn Backend, query: &str) {
    let size = raw(backend.dialect(), query);
    let Ok(Some((bytes,))) = backend.first_row::<(i64,)>(&size).await else {
        return;
    };
    if bytes <= DEFAULT_BUFFER_POOL {
        tracing::warn!(
            cluster = %cluster.name,
            innodb_buffer_pool_mib = bytes >> 20,
            "InnoDB's buffer pool has its default size: once the tables outgrow it, index \
             maintenance falls behind the writes; raise innodb_buffer_pool_size to hold the \
             tables written to (README, \"Storage configuration\")"
        );
    }
}

/// Prepares a ready cluster for the `datastores` a reload adds or
/// changes: only the tables and shard rows its catalog does not record yet
/// are created (DDL on a table in use would wait for, and hold up, the
/// requests on it), and the catalog records the new index versions.
pub(crate) async fn prepare_reloaded(
    datastores: &[Arc<DatastoreRuntime>],
    cluster: &Cluster,
    catalog: &Catalog,
) -> Result<()> {
    let backend = cluster.master()?.as_ref();
    with_retry("preparing the tables of reloaded definitions", || {
        prepare_once(datastores, cluster, backend, catalog, true)
    })
    .await
}

async fn prepare_once(
    datastores: &[Arc<DatastoreRuntime>],
    cluster: &Cluster,
    backend: &dyn Backend,
    catalog: &Catalog,
    only_new: bool,
) -> Result<()> {
    let dialect = backend.dialect();
    let now = Value::DateTime(crate::storage::value::truncate_to_micros(Utc::now()));
    let mut tx = backend.begin().await?;
    let mut records: Vec<(String, String, String)> = vec![(
        String::new(),
        "layout".to_string(),
        ddl::LAYOUT_VERSION.to_string(),
    )];
    let mut superseded: Vec<(String, String, String)> = Vec::new();
    for ds in datastores {
        let owned = ds.map().ranges_of(cluster.index);
        if owned.is_empty() {
            continue;
        }
        let recorded = |item: String| catalog.contains_key(&(ds.name().to_string(), item));
        let known_datastore = only_new && recorded("ranges".to_string());
        if !known_datastore {
            for stmt in ddl::datastore_ddl(dialect, ds.name()) {
                tx.execute(&raw(dialect, &stmt)).await?;
            }
        }
        for index in &ds.indexes {
            if only_new && recorded(index_item(&index.def.name, index.version)) {
                continue;
            }
            for stmt in ddl::index_ddl(dialect, &index.def, index.version) {
                tx.execute(&raw(dialect, &stmt)).await?;
            }
        }
        if !known_datastore {
            seed_shards(tx.as_mut(), dialect, ds, &owned).await?;
        }
        records.push((
            ds.name().to_string(),
            "shards".into(),
            ds.def.shards.to_string(),
        ));
        records.push((
            ds.name().to_string(),
            "ranges".into(),
            format_ranges(&owned),
        ));
        for index in &ds.indexes {
            let item = index_item(&index.def.name, index.version);
            let state = if index.is_ready() {
                IndexState::Ready
            } else {
                IndexState::Building
            };
            let known = catalog
                .get(&(ds.name().to_string(), item.clone()))
                .and_then(|v| serde_json::from_str::<IndexRecord>(v).ok());
            match known {
                Some(k) if k.state == state && k.definition.is_some() => {}
                // Never backwards: another gateway may have recorded the
                // switch (this one's runtime follows at its next sweep).
                Some(k)
                    if k.state == IndexState::Superseded
                        || (k.state == IndexState::Ready && state == IndexState::Building) => {}
                Some(mut k) if k.state == state => {
                    // A record of an earlier version: the definition is
                    // what a later start needs to serve this version while
                    // it builds another.
                    k.definition = Some(StoredIndex::of(&index.def));
                    let value = serde_json::to_string(&k).expect("record serializes");
                    records.push((ds.name().to_string(), item, value));
                }
                _ => {
                    let record = IndexRecord::of(index, state);
                    let value = serde_json::to_string(&record).expect("record serializes");
                    records.push((ds.name().to_string(), item, value));
                }
            }
            if index.serves_until().is_some() {
                continue;
            }
            for ((name, other), value) in catalog.iter() {
                let Some((index_name, version)) = parse_index_item(other) else {
                    continue;
                };
                let served = ds
                    .indexes
                    .iter()
                    .any(|i| i.def.name == index_name && i.version == version);
                if name != ds.name() || index_name != index.def.name || served {
                    continue;
                }
                if let Ok(mut record) = serde_json::from_str::<IndexRecord>(value) {
                    if record.state != IndexState::Superseded {
                        record.state = IndexState::Superseded;
                        record.superseded_at = Some(Utc::now().timestamp());
                        let value = serde_json::to_string(&record).expect("record serializes");
                        superseded.push((name.clone(), other.clone(), value));
                    }
                }
            }
        }
    }
    // Indexes no longer defined are no longer maintained: their versions
    // cannot serve a later change of the same index.
    for ds in datastores {
        for ((name, item), value) in catalog.iter() {
            let Some((index_name, _)) = parse_index_item(item) else {
                continue;
            };
            if name != ds.name() || ds.indexes.iter().any(|i| i.def.name == index_name) {
                continue;
            }
            // No `superseded_at`: no switch to wait for (gateways that
            // still serve it do until they reload, whatever the wait).
            if let Ok(mut record) = serde_json::from_str::<IndexRecord>(value) {
                if record.state != IndexState::Superseded {
                    record.state = IndexState::Superseded;
                    let value = serde_json::to_string(&record).expect("record serializes");
                    superseded.push((name.clone(), item.clone(), value));
                }
            }
        }
    }
    records.extend(superseded);
    write_records(tx.as_mut(), dialect, &records, now).await?;
    tx.commit().await
}

/// Creates the tables of `ds` (and of its index versions) on a cluster
/// that holds none of its shards yet, the target of a shard move, and
/// records its shard count there.
pub(crate) async fn prepare_tables(backend: &dyn Backend, ds: &DatastoreRuntime) -> Result<()> {
    let dialect = backend.dialect();
    with_retry("creating a move target's tables", || async {
        let mut tx = backend.begin().await?;
        for stmt in ddl::datastore_ddl(dialect, ds.name()) {
            tx.execute(&raw(dialect, &stmt)).await?;
        }
        for index in &ds.indexes {
            for stmt in ddl::index_ddl(dialect, &index.def, index.version) {
                tx.execute(&raw(dialect, &stmt)).await?;
            }
        }
        tx.commit().await
    })
    .await?;
    let mut records = vec![("shards".to_string(), ds.def.shards.to_string())];
    for index in &ds.indexes {
        let state = if index.is_ready() {
            IndexState::Ready
        } else {
            IndexState::Building
        };
        let record = IndexRecord::of(index, state);
        records.push((
            index_item(&index.def.name, index.version),
            serde_json::to_string(&record).expect("record serializes"),
        ));
    }
    record(backend, ds.name(), &records).await
}

/// The shards of a catalog `ranges` value (`0-2047,3000-3100`).
fn parse_ranges(text: &str) -> Vec<u32> {
    text.split(',')
        .filter_map(|part| {
            let (a, b) = part.split_once('-')?;
            Some(a.parse::<u32>().ok()?..=b.parse::<u32>().ok()?)
        })
        .flatten()
        .collect()
}

/// Writes catalog items of `datastore` on one cluster.
pub(crate) async fn record(
    backend: &dyn Backend,
    datastore: &str,
    items: &[(String, String)],
) -> Result<()> {
    let dialect = backend.dialect();
    let now = Value::DateTime(crate::storage::value::truncate_to_micros(Utc::now()));
    let records: Vec<(String, String, String)> = items
        .iter()
        .map(|(item, value)| (datastore.to_string(), item.clone(), value.clone()))
        .collect();
    let mut tx = backend.begin().await?;
    write_records(tx.as_mut(), dialect, &records, now).await?;
    tx.commit().await
}

/// One counter row per owned shard, starting at `added_id` 1; existing
/// rows are left alone.
async fn seed_shards(
    tx: &mut dyn crate::storage::Tx,
    dialect: Dialect,
    ds: &DatastoreRuntime,
    owned: &[(u32, u32)],
) -> Result<()> {
    let shards: Vec<u32> = owned.iter().flat_map(|(a, b)| *a..=*b).collect();
    for chunk in shards.chunks(MAX_PARAMS / 2) {
        let mut sql = Sql::new(dialect);
        sql.push(dialect.insert_ignore())
            .ident(&ddl::shards_table(ds.name()))
            .push(" (")
            .idents(["shard", "next_added_id"])
            .push(") ")
            .rows(
                chunk
                    .iter()
                    .map(|s| vec![Value::Int(i64::from(*s)), Value::Int(1)]),
            )
            .push(dialect.on_conflict_do_nothing());
        tx.execute(&sql).await?;
    }
    Ok(())
}

/// Upserts catalog rows.
async fn write_records(
    tx: &mut dyn crate::storage::Tx,
    dialect: Dialect,
    records: &[(String, String, String)],
    now: Value,
) -> Result<()> {
    if records.is_empty() {
        return Ok(());
    }
    let mut sql = Sql::new(dialect);
    sql.push("INSERT INTO ")
        .ident(ddl::CATALOG_TABLE)
        .push(" (")
        .idents(["datastore", "item", "value", "updated_at"])
        .push(") ")
        .rows(records.iter().map(|(ds, item, value)| {
            vec![
                Value::Text(ds.clone()),
                Value::Text(item.clone()),
                Value::Text(value.clone()),
                now.clone(),
            ]
        }))
        .push(&dialect.upsert(&["datastore", "item"], &["value", "updated_at"]));
    tx.execute(&sql).await?;
    Ok(())
}

/// Records that `index` is complete on every prepared cluster of its
/// datastore.
pub(crate) async fn mark_ready(
    topology: &Topology,
    ds: &DatastoreRuntime,
    index: &crate::topology::IndexRuntime,
) -> Result<()> {
    let record = IndexRecord {
        built: index
            .build_progress()
            .whole()
            .map(|(cells, seconds)| Built { cells, seconds }),
        ..IndexRecord::of(index, IndexState::Ready)
    };
    let value = serde_json::to_string(&record).expect("record serializes");
    // The previous version that served meanwhile is superseded in the
    // same transaction: a store that starts from now on serves the new
    // version only.
    let superseded: Vec<(String, String, String)> = ds
        .indexes
        .iter()
        .filter(|i| i.def.name == index.def.name && i.serves_until() == Some(index.version))
        .map(|previous| {
            let record = IndexRecord {
                superseded_at: Some(Utc::now().timestamp()),
                ..IndexRecord::of(previous, IndexState::Superseded)
            };
            (
                ds.name().to_string(),
                index_item(&previous.def.name, previous.version),
                serde_json::to_string(&record).expect("record serializes"),
            )
        })
        .collect();
    let now = Value::DateTime(crate::storage::value::truncate_to_micros(Utc::now()));
    for cluster in ds.map().clusters() {
        let Ok(backend) = topology.clusters[cluster].master() else {
            continue;
        };
        let dialect = backend.dialect();
        let mut records = vec![(
            ds.name().to_string(),
            index_item(&index.def.name, index.version),
            value.clone(),
        )];
        records.extend(superseded.iter().cloned());
        with_retry("recording a ready index", || async {
            let mut tx = backend.begin().await?;
            write_records(tx.as_mut(), dialect, &records, now.clone()).await?;
            tx.commit().await
        })
        .await?;
    }
    Ok(())
}

/// Removes an index's table (one version, or every version) and its
/// progress from every cluster of the datastore; returns the tables
/// dropped. Refuses to drop the version the definitions use, a previous
/// version that still serves while a new one is built, and one replaced
/// less than [`DROP_GRACE`] ago.
pub(crate) async fn drop_index(
    topology: &Topology,
    datastore: &str,
    index: &str,
    version: Option<u32>,
    grace: bool,
) -> Result<Vec<String>> {
    let ds = topology.datastore(datastore)?;
    if let Ok(current) = ds.index(index) {
        if version.is_none_or(|v| v == current.version) {
            return Err(Error::BadInput(format!(
                "index `{index}` of `{datastore}` is defined (version {}); remove its file first, \
                 or name an older version with --index-version",
                current.version
            )));
        }
    }
    // While the new version builds the previous one answers queries;
    // after the switch it is still maintained until retired (the grace,
    // which `--now` skips).
    let building = ds.index(index).is_ok_and(|c| !c.is_ready());
    if let Some(previous) = ds
        .serving_previous(index)
        .filter(|p| (building || grace) && version.is_none_or(|v| v == p.version))
    {
        return Err(Error::BadInput(format!(
            "version {} of index `{index}` of `{datastore}` answers queries until version {} \
             is built and it is retired; drop it once `cellgate index status` no longer lists it",
            previous.version,
            previous.serves_until().unwrap_or_default()
        )));
    }
    let now = Utc::now().timestamp();
    for cluster in ds.map().clusters().into_iter().filter(|_| grace) {
        let catalog = read(topology.clusters[cluster].master()?.as_ref()).await?;
        for ((name, item), value) in &catalog {
            let Some((found, v)) = parse_index_item(item) else {
                continue;
            };
            if name != datastore || found != index || version.is_some_and(|wanted| wanted != v) {
                continue;
            }
            let Some(at) = serde_json::from_str::<IndexRecord>(value)
                .ok()
                .and_then(|r| r.superseded_at)
            else {
                continue;
            };
            let left = DROP_GRACE.as_secs() as i64 - (now - at);
            if left > 0 {
                return Err(Error::BadInput(format!(
                    "version {v} of index `{index}` of `{datastore}` was replaced {}s ago; \
                     gateways that have not switched yet may still answer from it: retry in \
                     {left}s (or pass --now once every gateway has restarted or reloaded)",
                    now - at
                )));
            }
        }
    }
    let mut dropped = Vec::new();
    for cluster in ds.map().clusters() {
        let backend = topology.clusters[cluster].master()?;
        let dialect = backend.dialect();
        let catalog = read(backend.as_ref()).await?;
        let versions: Vec<u32> = catalog
            .keys()
            .filter(|(name, _)| name == datastore)
            .filter_map(|(_, item)| parse_index_item(item))
            .filter(|(name, v)| *name == index && version.is_none_or(|wanted| wanted == *v))
            .map(|(_, v)| v)
            .collect();
        for v in versions {
            let table = ddl::index_table(datastore, index, v);
            with_retry("dropping an index", || async {
                let mut tx = backend.begin().await?;
                tx.execute(&raw(
                    dialect,
                    &ddl::drop_index_ddl(dialect, datastore, index, v),
                ))
                .await?;
                let mut offsets = Sql::new(dialect);
                offsets
                    .push("DELETE FROM ")
                    .ident(&ddl::offsets_table(datastore))
                    .push(" WHERE ")
                    .ident("consumer")
                    .push(" LIKE ")
                    .bind(Value::Text(format!("ix:{index}:{v}:%")));
                tx.execute(&offsets).await?;
                let mut forget = Sql::new(dialect);
                forget
                    .push("DELETE FROM ")
                    .ident(ddl::CATALOG_TABLE)
                    .push(" WHERE ")
                    .ident("datastore")
                    .push(" = ")
                    .bind(Value::Text(datastore.to_string()))
                    .push(" AND ")
                    .ident("item")
                    .push(" = ")
                    .bind(Value::Text(index_item(index, v)));
                tx.execute(&forget).await?;
                tx.commit().await
            })
            .await?;
            dropped.push(format!("{}: {table}", topology.clusters[cluster].name));
        }
    }
    Ok(dropped)
}

/// Prepares the clusters that were unreachable at start-up once they
/// answer, retrying every `every`; stops when all are ready or refused, or
/// when the store is dropped.
pub(crate) async fn prepare_later(topology: std::sync::Weak<Topology>, every: Duration) {
    loop {
        tokio::time::sleep(every).await;
        let Some(topology) = topology.upgrade() else {
            return;
        };
        let mut waiting = false;
        for cluster in &topology.clusters {
            if !matches!(cluster.state(), ClusterState::Pending(_)) {
                continue;
            }
            match prepare_pending(&topology, cluster).await {
                Ok(()) => {
                    tracing::info!(cluster = %cluster.name, "storage cluster prepared");
                }
                Err(err) if err.is_transient() => {
                    waiting = true;
                    cluster.set_state(ClusterState::Pending(err.client_message()));
                }
                Err(err) => {
                    tracing::error!(cluster = %cluster.name, error = %err, "storage cluster refused; its shards stay unavailable until a restart with matching definitions");
                    cluster.set_state(ClusterState::Refused(err.client_message()));
                }
            }
        }
        if !waiting {
            return;
        }
    }
}

/// Opens, checks and prepares one cluster.
pub(crate) async fn prepare_pending(topology: &Topology, cluster: &Cluster) -> Result<()> {
    let catalog = open_cluster(cluster.master.as_ref(), false).await?;
    let mut warnings = Vec::new();
    validate(topology, cluster, &catalog, &mut warnings)?;
    for warning in warnings {
        tracing::warn!(cluster = %cluster.name, "{warning}");
    }
    prepare(topology, cluster, &catalog).await
}

/// A statement without parameters.
pub(crate) fn raw(dialect: Dialect, text: &str) -> Sql {
    let mut sql = Sql::new(dialect);
    sql.push(text);
    sql
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_items_round_trip() {
        assert_eq!(
            parse_index_item(&index_item("by_city", 3)),
            Some(("by_city", 3))
        );
        assert_eq!(parse_index_item("shards"), None);
        assert_eq!(parse_index_item("index:x:notanumber"), None);
    }
}
