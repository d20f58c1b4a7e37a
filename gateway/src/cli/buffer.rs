//! `cellgate buffer`: buffered writes.
//!
//! `conflicts` lists the buffered writes that lost to another body of their
//! key when they were replayed into their primary (newest first), with the
//! losing body, so that nothing a client was told `BUFFERED` disappears
//! without a trace. Exits 1 when there are any, for scripts and checks.

use std::process::ExitCode;

use clap::{Args, Subcommand};

use super::store_args::StoreArgs;

#[derive(Debug, Args)]
pub struct BufferArgs {
    #[command(subcommand)]
    pub command: BufferCommand,
}

#[derive(Debug, Subcommand)]
pub enum BufferCommand {
    /// Print the buffered writes that lost to another body of their key on
    /// replay, one per line with the losing body; exit 1 if there are any.
    Conflicts(ConflictsArgs),
}

#[derive(Debug, Args)]
pub struct ConflictsArgs {
    /// The datastore.
    #[arg(long, value_name = "NAME", env = "CELLGATE_DATASTORE")]
    pub datastore: String,
    /// Show at most this many, newest first.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub limit: usize,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub async fn run(args: BufferArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BufferCommand::Conflicts(args) => conflicts(args).await,
    }
}

async fn conflicts(args: ConflictsArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let conflicts = store
        .buffer_conflicts(&args.datastore, args.limit)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for c in &conflicts {
        println!(
            "{} {} {} lost body {} to stored {} (buffered on {} at {}, recorded {}): {}",
            c.key.row_key,
            c.key.column,
            c.key.ref_key,
            c.body_hash,
            c.stored_hash,
            c.buffered_on,
            c.buffered_at.to_rfc3339(),
            c.recorded_at.to_rfc3339(),
            c.body
        );
    }
    println!("{} conflicts", conflicts.len());
    Ok(if conflicts.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
