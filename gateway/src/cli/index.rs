//! `cellgate index`: manage index tables.
//!
//! `drop` removes the table of an index whose file was removed, or of an
//! older version of an index whose fields changed (the gateway keeps such
//! tables and warns about them rather than dropping data on its own).

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::store_args::StoreArgs;

#[derive(Debug, Args)]
pub struct IndexArgs {
    #[command(subcommand)]
    pub command: IndexCommand,
}

#[derive(Debug, Subcommand)]
pub enum IndexCommand {
    /// Drop the table of an index that is no longer defined, or of an
    /// older version of one (`--index-version`), on every cluster.
    Drop(DropArgs),
}

#[derive(Debug, Args)]
pub struct DropArgs {
    /// The datastore.
    pub datastore: String,
    /// The index (its `table` name).
    pub index: String,
    /// Drop only this version of the index's table.
    #[arg(long, value_name = "N", env = "CELLGATE_INDEX_VERSION")]
    pub index_version: Option<u32>,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub async fn run(args: IndexArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        IndexCommand::Drop(args) => drop(args).await,
    }
}

async fn drop(args: DropArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let dropped = store
        .drop_index(&args.datastore, &args.index, args.index_version)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if dropped.is_empty() {
        println!(
            "nothing to drop: no table of index `{}` of `{}` is recorded",
            args.index, args.datastore
        );
    }
    for table in dropped {
        println!("dropped {table}");
    }
    Ok(ExitCode::SUCCESS)
}
