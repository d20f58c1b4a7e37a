//! Conversion of a store in the per-shard table layout of earlier versions
//! (`cellgate migrate --from-v1`).
//!
//! That layout kept every logical shard in tables of its own
//! (`<ds>_s<N>_cells`, `_ix_<index>`, `_offsets`, `_locator`, `_meta`,
//! `_buffer`) and listed them in a `cellgate_shards` registry. Conversion:
//!
//! 1. renames the registry to `cellgate_shards_v1`, which marks the cluster
//!    as converting (a gateway refuses to serve it until it is done);
//! 2. prepares the shard-keyed tables as for a new store;
//! 3. per shard, in one transaction: copies its cells into `<ds>_cells`
//!    with their `added_id`s, sets its counter row past them, copies any
//!    buffered cells, drops its old tables and removes its registry row;
//! 4. drops the renamed registry once it is empty.
//!
//! Every step can be interrupted and run again. Index tables are not
//! copied: they are derived data, rebuilt from the cell log by the gateway
//! after the conversion (queries answer `INDEX_BUILDING` meanwhile).

use index_dsl::Definitions;
use uuid::Uuid;

use crate::catalog::raw;
use crate::error::{Error, Result};
use crate::retry::with_retry;
use crate::storage::{self, ddl, Backend, ConnectOptions, Dialect, Sql, Value};
use crate::topology::Topology;
use crate::StorageConfig;
use crate::{Store, StoreOptions};

/// What a conversion did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct V1Summary {
    /// Shards converted now.
    pub shards: u64,
    /// Cells copied into the shard-keyed tables.
    pub cells: u64,
    /// Buffered cells copied.
    pub buffered: u64,
}

/// Converts every cluster of `storage` that holds the per-shard layout;
/// `progress(done, total)` follows the shards.
pub async fn convert_v1(
    defs: Definitions,
    storage: StorageConfig,
    mut progress: impl FnMut(u64, u64),
) -> Result<V1Summary> {
    check_names(&defs)?;
    for cluster in &storage.clusters {
        let options = ConnectOptions {
            cluster: cluster.name.clone(),
            ..ConnectOptions::default()
        };
        let backend = storage::connect(&cluster.master, &options).await?;
        mark_converting(backend.as_ref()).await?;
    }
    let mut options = StoreOptions::new(storage);
    options.maintain_indexes = false;
    options.replay_buffers = false;
    options.require_all_clusters = true;
    options.converting_v1 = true;
    let store = Store::open(defs, options).await?;
    let topology = store.topology_arc();
    let mut summary = V1Summary::default();
    let mut work = Vec::new();
    for cluster in &topology.clusters {
        let backend = cluster.master()?;
        for (datastore, shard) in registry(backend.as_ref()).await? {
            if !topology.defined().datastores.contains_key(&datastore) {
                return Err(Error::Catalog(format!(
                    "the per-shard store on cluster `{}` holds datastore `{datastore}`, which is not \
                     defined; restore its definition to convert it",
                    cluster.name
                )));
            }
            work.push((cluster.index, datastore, shard));
        }
    }
    let total = work.len() as u64;
    progress(0, total);
    for (done, (cluster, datastore, shard)) in work.into_iter().enumerate() {
        let (cells, buffered) = convert_shard(&topology, cluster, &datastore, shard).await?;
        summary.shards += 1;
        summary.cells += cells;
        summary.buffered += buffered;
        progress(done as u64 + 1, total);
    }
    for cluster in &topology.clusters {
        let backend = cluster.master()?;
        summary.buffered += convert_stray_buffers(&topology, backend.as_ref()).await?;
        finish(backend.as_ref()).await?;
    }
    Ok(summary)
}

/// Refuses definitions where one datastore's tables could be mistaken for
/// a shard table of another (`a` and `a_s1`): conversion drops the old
/// tables by name.
fn check_names(defs: &Definitions) -> Result<()> {
    for a in &defs.datastores {
        for b in &defs.datastores {
            let prefix = format!("{}_s", a.name.to_ascii_lowercase());
            let rest = b.name.to_ascii_lowercase();
            let Some(rest) = rest.strip_prefix(&prefix) else {
                continue;
            };
            if rest.bytes().next().is_some_and(|c| c.is_ascii_digit()) {
                return Err(Error::Catalog(format!(
                    "datastores `{}` and `{}` have names that the per-shard layout cannot tell apart; \
                     convert with only one of them defined",
                    a.name, b.name
                )));
            }
        }
    }
    Ok(())
}

/// Renames the v1 registry to the converting marker (once).
async fn mark_converting(backend: &dyn Backend) -> Result<()> {
    let dialect = backend.dialect();
    if !backend.has_table(ddl::V1_REGISTRY_TABLE).await? {
        return Ok(());
    }
    if backend.has_table(ddl::V1_CONVERTING_TABLE).await? {
        return Err(Error::Internal(format!(
            "cluster `{}` has both `{}` and `{}`; remove the one that is empty",
            backend.cluster(),
            ddl::V1_REGISTRY_TABLE,
            ddl::V1_CONVERTING_TABLE
        )));
    }
    let rename = format!(
        "ALTER TABLE {} RENAME TO {}",
        dialect.quote(ddl::V1_REGISTRY_TABLE),
        dialect.quote(ddl::V1_CONVERTING_TABLE)
    );
    backend.execute(&raw(dialect, &rename)).await?;
    Ok(())
}

/// The `(datastore, shard)` rows left in the converting registry.
async fn registry(backend: &dyn Backend) -> Result<Vec<(String, u32)>> {
    let dialect = backend.dialect();
    if !backend.has_table(ddl::V1_CONVERTING_TABLE).await? {
        return Ok(Vec::new());
    }
    let mut sql = Sql::new(dialect);
    sql.push("SELECT ")
        .idents(["datastore", "shard"])
        .push(" FROM ")
        .ident(ddl::V1_CONVERTING_TABLE)
        .push(" ORDER BY ")
        .idents(["datastore", "shard"]);
    Ok(backend
        .rows::<(String, i64)>(&sql)
        .await?
        .into_iter()
        .map(|(datastore, shard)| (datastore, shard as u32))
        .collect())
}

fn v1_prefix(datastore: &str, shard: u32) -> String {
    format!("{}_s{shard}_", datastore.to_ascii_lowercase())
}

/// Moves one shard's cells and buffered cells, drops its old tables and
/// forgets it, in one transaction; returns `(cells, buffered)` copied.
async fn convert_shard(
    topology: &Topology,
    cluster: usize,
    datastore: &str,
    shard: u32,
) -> Result<(u64, u64)> {
    let ds = topology.datastore(datastore)?;
    if shard >= ds.def.shards {
        return Err(Error::Catalog(format!(
            "the per-shard store has shard {shard} of `{datastore}`, but the definition has {} shards; \
             restore the shard count the store was created with",
            ds.def.shards
        )));
    }
    let owner = ds.map().cluster_of(shard);
    if owner != cluster {
        return Err(Error::Catalog(format!(
            "shard {shard} of `{datastore}` is stored on cluster `{}` but the topology routes it to `{}`; \
             restore the shard ranges the store was created with",
            topology.clusters[cluster].name, topology.clusters[owner].name
        )));
    }
    let backend = topology.clusters[cluster].master()?;
    let dialect = backend.dialect();
    let prefix = v1_prefix(datastore, shard);
    with_retry("converting a shard", || async {
        let tables = tables_with_prefix(backend.as_ref(), &prefix).await?;
        let mut tx = backend.begin().await?;
        let old_cells = format!("{prefix}cells");
        let mut cells = 0;
        if tables.contains(&old_cells) {
            // Every cell column but the shard, which the old tables lacked.
            let columns = &ddl::CELL_COLUMNS[1..];
            let mut copy = Sql::new(dialect);
            copy.push(dialect.insert_ignore())
                .ident(&ddl::cells_table(datastore))
                .push(" (")
                .ident("shard")
                .push(", ")
                .idents(columns.iter().copied())
                .push(") SELECT ")
                .bind(Value::Int(i64::from(shard)))
                .push(", ")
                .idents(columns.iter().copied())
                .push(" FROM ")
                .ident(&old_cells)
                .push(dialect.on_conflict_do_nothing());
            cells = tx.execute(&copy).await?;
            let mut advance = Sql::new(dialect);
            advance
                .push("UPDATE ")
                .ident(&ddl::shards_table(datastore))
                .push(" SET ")
                .ident("next_added_id")
                .push(" = (SELECT COALESCE(MAX(")
                .ident("added_id")
                .push("), 0) + 1 FROM ")
                .ident(&ddl::cells_table(datastore))
                .push(" WHERE ")
                .ident("shard")
                .push(" = ")
                .bind(Value::Int(i64::from(shard)))
                .push(") WHERE ")
                .ident("shard")
                .push(" = ")
                .bind(Value::Int(i64::from(shard)));
            tx.execute(&advance).await?;
        }
        let old_buffer = format!("{prefix}buffer");
        let mut buffered = 0;
        if tables.contains(&old_buffer) {
            buffered = copy_buffer(tx.as_mut(), dialect, datastore, shard, &old_buffer).await?;
        }
        for table in &tables {
            let drop = format!("DROP TABLE IF EXISTS {}", dialect.quote(table));
            tx.execute(&raw(dialect, &drop)).await?;
        }
        let mut forget = Sql::new(dialect);
        forget
            .push("DELETE FROM ")
            .ident(ddl::V1_CONVERTING_TABLE)
            .push(" WHERE ")
            .ident("datastore")
            .push(" = ")
            .bind(Value::Text(datastore.to_string()))
            .push(" AND ")
            .ident("shard")
            .push(" = ")
            .bind(Value::Int(i64::from(shard)));
        tx.execute(&forget).await?;
        tx.commit().await?;
        Ok((cells, buffered))
    })
    .await
}

/// Copies a v1 buffer table into the datastore's buffer table.
async fn copy_buffer(
    tx: &mut dyn storage::Tx,
    dialect: Dialect,
    datastore: &str,
    shard: u32,
    table: &str,
) -> Result<u64> {
    let columns = ["row_key", "column_name", "ref_key", "body", "created_at"];
    let mut copy = Sql::new(dialect);
    copy.push("INSERT INTO ")
        .ident(&ddl::buffer_table(datastore))
        .push(" (")
        .idents(["batch_id", "shard"])
        .push(", ")
        .idents(columns)
        .push(") SELECT ")
        .bind(Value::Uuid(Uuid::new_v4()))
        .push(", ")
        .bind(Value::Int(i64::from(shard)))
        .push(", ")
        .idents(columns)
        .push(" FROM ")
        .ident(table);
    tx.execute(&copy).await
}

/// Buffer tables of shards this cluster only buffered for (they were not
/// in its registry): copied and dropped.
async fn convert_stray_buffers(topology: &Topology, backend: &dyn Backend) -> Result<u64> {
    let dialect = backend.dialect();
    let mut copied = 0;
    for ds in topology.datastores_sorted() {
        let prefix = format!("{}_s", ds.name().to_ascii_lowercase());
        for table in tables_with_prefix(backend, &prefix).await? {
            let Some(shard) = table
                .strip_prefix(&prefix)
                .and_then(|rest| rest.strip_suffix("_buffer"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            copied += with_retry("converting a buffer table", || async {
                let mut tx = backend.begin().await?;
                let n = copy_buffer(tx.as_mut(), dialect, ds.name(), shard, &table).await?;
                let drop = format!("DROP TABLE IF EXISTS {}", dialect.quote(&table));
                tx.execute(&raw(dialect, &drop)).await?;
                tx.commit().await?;
                Ok(n)
            })
            .await?;
        }
    }
    Ok(copied)
}

/// Drops the converting registry once it is empty.
async fn finish(backend: &dyn Backend) -> Result<()> {
    if registry(backend).await?.is_empty() {
        let dialect = backend.dialect();
        let drop = format!(
            "DROP TABLE IF EXISTS {}",
            dialect.quote(ddl::V1_CONVERTING_TABLE)
        );
        backend.execute(&raw(dialect, &drop)).await?;
    }
    Ok(())
}

async fn tables_with_prefix(backend: &dyn Backend, prefix: &str) -> Result<Vec<String>> {
    Ok(backend
        .rows::<(String,)>(&backend.dialect().tables_with_prefix(prefix))
        .await?
        .into_iter()
        .map(|(table,)| table)
        .collect())
}
