//! `cellgate migrate`: create the storage tables ahead of traffic.
//!
//! Opening a [`Store`] already creates the cluster tables, and a shard's
//! tables are created on its first write, so migrating is optional for a
//! single embedded database. It matters for shared databases, where DDL
//! should run once, from a deploy step, with an account allowed to run it:
//! `--all-shards` creates (or brings up to date) every shard's tables and
//! shows a progress bar, since a datastore has thousands of shards.
//! Index maintenance stays off: this command writes no cells.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::config::StorageConfig;
use crate::storage::ddl::REGISTRY_TABLE;
use crate::storage::{self, ConnectOptions};
use crate::{Store, StoreOptions};

use super::{load_definitions, plural, DEFAULT_DATASTORES};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Directory of the datastore and index definitions.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,

    /// Data directory of the embedded SQLite database (`<DIR>/cellgate.db`,
    /// created if missing). Ignored when `--database` is given.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATA",
        default_value = "./data"
    )]
    pub data: PathBuf,

    /// URL of the one database cluster to use instead of the embedded
    /// SQLite database: `sqlite://PATH`, `mysql://USER:PASS@HOST/DB`,
    /// `mariadb://…` or `postgres://USER:PASS@HOST/DB`.
    // The URL may hold a password: `--help` must not print it.
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_DATABASE_URL",
        hide_env_values = true
    )]
    pub database: Option<String>,

    /// Create the tables of every shard of every datastore now, instead of
    /// on each shard's first write.
    // `BoolishValueParser`: the variable may be `1`/`0`, `yes`/`no`, `on`/`off`.
    #[arg(
        long,
        env = "CELLGATE_ALL_SHARDS",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub all_shards: bool,
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let (config, shown) = match &args.database {
        Some(url) => (StorageConfig::single(url), redact(url)),
        None => {
            let embedded = StorageConfig::embedded(&args.data);
            let shown = embedded.clusters[0].master.clone();
            (embedded, shown)
        }
    };
    // The store tolerates unreachable clusters (their shards fail their own
    // requests), but a migration that cannot reach a master has failed.
    for cluster in &config.clusters {
        let options = ConnectOptions {
            cluster: cluster.name.clone(),
            ..ConnectOptions::default()
        };
        let reached = match storage::connect(&cluster.master, &options).await {
            Ok(backend) => backend.ping().await,
            Err(e) => Err(e),
        };
        reached.map_err(|e| anyhow::anyhow!("cannot open storage at {shown}: {e}"))?;
    }
    let mut options = StoreOptions::new(config);
    options.maintain_indexes = false;
    let store = Store::open(defs, options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open storage at {shown}: {e}"))?;
    println!("{shown}: cluster tables ready ({REGISTRY_TABLE})");

    let before = existing_shards(&store).await?;
    if args.all_shards {
        create_all_shards(&store).await?;
    }
    let after = existing_shards(&store).await?;
    for datastore in &store.definitions().datastores {
        let total = datastore.shards as usize;
        let had = before.get(&datastore.name).copied().unwrap_or(0);
        let has = after.get(&datastore.name).copied().unwrap_or(0);
        println!(
            "{}: {has} of {} exist ({} created now)",
            datastore.name,
            plural(total, "shard", "shards"),
            has - had.min(has)
        );
    }
    if !args.all_shards {
        println!(
            "shard tables are created on each shard's first write; --all-shards creates them now"
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// How many shards of each datastore have tables.
async fn existing_shards(store: &Store) -> anyhow::Result<BTreeMap<String, usize>> {
    let mut counts = BTreeMap::new();
    for datastore in &store.definitions().datastores {
        let shards = store
            .existing_shards(&datastore.name)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("cannot list the shards of `{}`", datastore.name))?;
        counts.insert(datastore.name.clone(), shards.len());
    }
    Ok(counts)
}

async fn create_all_shards(store: &Store) -> anyhow::Result<()> {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("creating shard tables {bar:40} {pos}/{len} ({eta})")
            .expect("static progress template")
            .progress_chars("=> "),
    );
    let result = store
        .create_all_shards(|done, total| {
            bar.set_length(total);
            bar.set_position(done);
        })
        .await;
    bar.finish_and_clear();
    result.map_err(|e| anyhow::anyhow!("cannot create shard tables: {e}"))
}

/// `url` with any password replaced by `***`, for printing.
fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    match rest[..at].split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("mysql://u:secret@h:3306/db"),
            "mysql://u:***@h:3306/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact("sqlite://./data/cellgate.db"),
            "sqlite://./data/cellgate.db"
        );
        assert_eq!(redact("mysql://u:p@ss@h/db"), "mysql://u:***@h/db");
    }
}
