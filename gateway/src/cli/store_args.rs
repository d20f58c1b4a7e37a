//! The storage flags shared by the commands that open a store without
//! serving it (`migrate`, `index`, `cells`): where the definitions are and which
//! databases to use.

use std::path::PathBuf;

use clap::Args;

use crate::config::{Config, StorageConfig};
use cellgate_store::{Store, StoreOptions};

use super::{load_definitions, DEFAULT_DATASTORES};

#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Directory of the datastore and index definitions.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,

    /// Data directory of the embedded SQLite database (`<DIR>/cellgate.db`,
    /// created if missing). Ignored when `--database` is given or the
    /// configuration file lists storage clusters.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATA",
        default_value = "./data"
    )]
    pub data: PathBuf,

    /// URL of the one database cluster to use instead of the embedded
    /// SQLite database or the configured clusters: `sqlite://PATH`,
    /// `mysql://USER:PASS@HOST/DB`, `mariadb://…` or
    /// `postgres://USER:PASS@HOST/DB`.
    // The URL may hold a password: `--help` must not print it.
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_DATABASE_URL",
        hide_env_values = true
    )]
    pub database: Option<String>,

    /// Configuration file (`cellgate.yaml`) whose storage topology to use.
    #[arg(long, value_name = "FILE", env = "CELLGATE_CONFIG")]
    pub config: Option<PathBuf>,
}

impl StoreArgs {
    /// The storage topology these flags name.
    pub fn storage(&self) -> anyhow::Result<StorageConfig> {
        storage(self.database.as_deref(), self.config.as_deref(), &self.data)
    }

    /// Opens the store without index maintenance; `None` when the
    /// definitions are invalid (already printed).
    pub async fn open(&self) -> anyhow::Result<Option<Store>> {
        let Some(defs) = load_definitions(&self.datastores, "--datastores")? else {
            return Ok(None);
        };
        let storage = self.storage()?;
        let shown: Vec<String> = storage
            .clusters
            .iter()
            .map(|c| {
                format!(
                    "{} ({})",
                    c.name,
                    cellgate_store::storage::redact_url(&c.master)
                )
            })
            .collect();
        let mut options = StoreOptions::new(storage);
        options.maintain_indexes = false;
        options.replay_buffers = false;
        options.require_all_clusters = true;
        let store = Store::open(defs, options)
            .await
            .map_err(|e| anyhow::anyhow!("cannot open storage {}: {e}", shown.join(", ")))?;
        Ok(Some(store))
    }
}

/// The storage topology of a `--database` URL, else of a `--config` file's
/// clusters, else the embedded SQLite database in `data`.
pub fn storage(
    database: Option<&str>,
    config: Option<&std::path::Path>,
    data: &std::path::Path,
) -> anyhow::Result<StorageConfig> {
    if let Some(url) = database {
        return Ok(StorageConfig::single(url));
    }
    let file = match config {
        Some(path) => {
            Config::load(path)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .storage
        }
        None => StorageConfig::default(),
    };
    if file.clusters.is_empty() {
        Ok(StorageConfig {
            shards: file.shards,
            ..StorageConfig::embedded(data)
        })
    } else {
        Ok(file)
    }
}
