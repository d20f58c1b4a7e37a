//! What a store records of its definitions and tells of its logs without
//! being opened: the definition files a gateway last served (an item of the
//! first cluster's catalog, written at start-up and at each reload), and
//! for `cellgate plan` each cluster's log size per datastore and the index
//! builds its catalog measured. [`inspect`] only reads: it creates no
//! table, prepares no cluster and starts no background work.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::catalog::{self, Built};
use crate::error::{Error, Result};
use crate::storage::{self, ddl, Backend, ConnectOptions};
use crate::StorageConfig;

/// The catalog item (of datastore `""`) holding the deployed definitions.
const ITEM: &str = "definitions";

/// The definition files a gateway served, as the catalog records them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployed {
    /// `index_dsl::digest` of the files.
    pub digest: String,
    pub recorded_at: DateTime<Utc>,
    /// Each file's text by its path relative to the definitions directory.
    pub files: BTreeMap<String, String>,
}

/// What [`inspect`] found on one cluster.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterInspection {
    pub name: String,
    /// Per datastore with tables here: the cells of its log on this
    /// cluster (the sum of its shards' heads), what an index build reads.
    pub log_cells: BTreeMap<String, i64>,
    /// The largest index build the catalog here recorded, if any: the
    /// rate to expect of the next one.
    pub largest_build: Option<Built>,
}

/// What [`inspect`] found on a store.
#[derive(Debug, Clone, PartialEq)]
pub struct Inspection {
    /// In the order of the storage configuration.
    pub clusters: Vec<ClusterInspection>,
    /// The definitions last deployed, when a gateway recorded them.
    pub deployed: Option<Deployed>,
}

/// Reads what a store records, on each cluster's master, without changing
/// anything. Fails on a cluster that does not answer or holds no store.
pub async fn inspect(storage: &StorageConfig) -> Result<Inspection> {
    let mut clusters = Vec::new();
    let mut deployed = None;
    for (position, cluster) in storage.clusters.iter().enumerate() {
        let options = ConnectOptions {
            cluster: cluster.name.clone(),
            max_connections: 1,
            background: true,
            ..ConnectOptions::default()
        };
        if let Some(path) = sqlite_file(&cluster.master).filter(|p| !p.exists()) {
            return Err(Error::Config(format!(
                "storage cluster `{}` holds no cellgate store: `{}` does not exist",
                cluster.name,
                path.display()
            )));
        }
        let backend = storage::connect(&cluster.master, &options).await?;
        let found = inspect_cluster(backend.as_ref(), &cluster.name).await;
        backend.close().await;
        let (inspection, catalog) = found?;
        if position == 0 {
            deployed = catalog
                .get(&(String::new(), ITEM.to_string()))
                .and_then(|value| serde_json::from_str(value).ok());
        }
        clusters.push(inspection);
    }
    Ok(Inspection { clusters, deployed })
}

/// The file of a `sqlite:` URL (which connecting would create).
fn sqlite_file(url: &str) -> Option<std::path::PathBuf> {
    let rest = url.strip_prefix("sqlite:")?;
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then(|| path.into())
}

async fn inspect_cluster(
    backend: &dyn Backend,
    name: &str,
) -> Result<(ClusterInspection, catalog::Catalog)> {
    if !backend.has_table(ddl::CATALOG_TABLE).await? {
        return Err(Error::Config(format!(
            "storage cluster `{name}` holds no cellgate store (it has no `{}` table)",
            ddl::CATALOG_TABLE
        )));
    }
    let catalog = catalog::read(backend).await?;
    let mut log_cells = BTreeMap::new();
    for (datastore, item) in catalog.keys() {
        if item == "shards" && backend.has_table(&ddl::shards_table(datastore)).await? {
            let cells = crate::cells::log_length(backend, datastore).await?;
            log_cells.insert(datastore.clone(), cells);
        }
    }
    let largest_build = catalog
        .values()
        .filter_map(|value| catalog::recorded_build(value))
        .max_by_key(|built| built.cells);
    let inspection = ClusterInspection {
        name: name.to_string(),
        log_cells,
        largest_build,
    };
    Ok((inspection, catalog))
}

/// Records `deployed` on the first cluster of the store.
pub(crate) async fn record(backend: &dyn Backend, deployed: &Deployed) -> Result<()> {
    let value = serde_json::to_string(deployed).expect("definitions serialize");
    catalog::record(backend, "", &[(ITEM.to_string(), value)]).await
}
