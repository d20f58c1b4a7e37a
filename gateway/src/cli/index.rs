//! `cellgate index`: manage index tables.
//!
//! `drop` removes the table of an index whose file was removed, or of an
//! older version of an index whose fields changed (the gateway keeps such
//! tables and warns about them rather than dropping data on its own).
//! `quarantine list` shows the entries set aside after failing to apply,
//! `quarantine retry` applies them again.

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
    /// List or retry the index entries set aside in the quarantine.
    Quarantine(QuarantineArgs),
}

#[derive(Debug, Args)]
pub struct QuarantineArgs {
    #[command(subcommand)]
    pub command: QuarantineCommand,
}

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// Print the quarantined entries of a datastore, one per line.
    List(QuarantineTarget),
    /// Apply the quarantined entries again; those that succeed leave the
    /// quarantine.
    Retry(QuarantineTarget),
}

#[derive(Debug, Args)]
pub struct QuarantineTarget {
    /// The datastore.
    pub datastore: String,
    /// Only this index's entries.
    #[arg(long, value_name = "INDEX", env = "CELLGATE_INDEX")]
    pub index: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
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
        IndexCommand::Quarantine(QuarantineArgs {
            command: QuarantineCommand::List(target),
        }) => list(target).await,
        IndexCommand::Quarantine(QuarantineArgs {
            command: QuarantineCommand::Retry(target),
        }) => retry(target).await,
    }
}

async fn list(target: QuarantineTarget) -> anyhow::Result<ExitCode> {
    let Some(store) = target.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let entries = store
        .quarantine(&target.datastore)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut shown = 0;
    for entry in &entries {
        if target.index.as_ref().is_some_and(|i| *i != entry.index) {
            continue;
        }
        shown += 1;
        println!(
            "{} {} shard {} added_id {} {} (last {}): {}",
            entry.index,
            entry.row_key,
            entry.shard,
            entry.added_id,
            entry.code,
            entry.last_seen.to_rfc3339(),
            entry.message
        );
    }
    println!("{shown} quarantined entries");
    Ok(ExitCode::SUCCESS)
}

async fn retry(target: QuarantineTarget) -> anyhow::Result<ExitCode> {
    let Some(store) = target.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let (applied, still) = store
        .retry_quarantine(&target.datastore, target.index.as_deref())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("{applied} entries applied, {still} still quarantined");
    Ok(if still == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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
