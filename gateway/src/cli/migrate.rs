//! `cellgate migrate`: create the storage tables ahead of traffic.
//!
//! Opening a store already prepares every reachable cluster (its tables,
//! one counter row per owned shard, the catalog), so on a single embedded
//! database migrating is optional. It matters for shared databases, where
//! DDL should run once, from a deploy step, with an account allowed to run
//! it, and fail loudly when a cluster cannot be reached. The number of
//! tables depends on the definitions, not on the shard count, so this takes
//! seconds whatever the size of the datastores.
//!
//! `--from-v1` converts a store in the per-shard table layout of earlier
//! versions (see `upgrade.rs`).

use std::process::ExitCode;

use clap::Args;

use super::store_args::StoreArgs;
use super::{plural, upgrade};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub store: StoreArgs,

    /// Convert a store in the per-shard table layout of earlier versions:
    /// every cell moves into the shard-keyed tables with its shard and
    /// `added_id`, the old tables are dropped shard by shard (the command
    /// can be interrupted and run again), and indexes are rebuilt from the
    /// cell log by the gateway.
    // `BoolishValueParser`: the variable may be `1`/`0`, `yes`/`no`, `on`/`off`.
    #[arg(
        long,
        env = "CELLGATE_FROM_V1",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub from_v1: bool,
}

pub async fn run(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    if args.from_v1 && !upgrade::run(&args.store).await? {
        return Ok(ExitCode::FAILURE);
    }
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    report(&store)
}

/// Prints what the store holds now; fails when a cluster is not ready.
fn report(store: &cellgate_store::Store) -> anyhow::Result<ExitCode> {
    let metrics = store.metrics();
    let mut failed = false;
    for cluster in &metrics.clusters {
        if cluster.ready {
            println!("cluster {}: tables ready", cluster.name);
        } else {
            println!("cluster {}: unreachable, not migrated", cluster.name);
            failed = true;
        }
    }
    for datastore in &store.definitions().datastores {
        let ranges: Vec<String> = store
            .topology(&datastore.name)
            .iter()
            .map(|(first, last, cluster)| format!("{first}-{last} on {cluster}"))
            .collect();
        println!(
            "{}: {} ({})",
            datastore.name,
            plural(datastore.shards as usize, "shard", "shards"),
            ranges.join(", ")
        );
        for index in store.indexes(&datastore.name)? {
            let state = if index.ready {
                "ready".to_string()
            } else {
                "to be built from the cell log by the gateway".to_string()
            };
            println!(
                "  index {} (table {}, version {}): {state}",
                index.name, index.table, index.version
            );
        }
    }
    for warning in store.warnings() {
        println!("warning: {warning}");
    }
    if failed {
        anyhow::bail!(
            "some clusters could not be reached; run `cellgate migrate` again when they answer"
        );
    }
    Ok(ExitCode::SUCCESS)
}
