//! `cellgate buffer`: buffered writes.
//!
//! `conflicts` lists the buffered writes that lost to another body of their
//! key when they were replayed into their primary (newest first), with the
//! losing body, so that nothing a client was told `BUFFERED` disappears
//! without a trace. Exits 1 when there are any, for scripts and checks.
//!
//! `undecodable` lists the copies whose bodies cannot be decoded (replay
//! leaves them where they are), and `set-aside` moves one of them to the
//! conflicts table of its primary, its bytes kept.

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
    /// Print the buffered copies whose bodies cannot be decoded (replay
    /// leaves them in place); exit 1 if there are any.
    Undecodable(UndecodableArgs),
    /// Move one undecodable copy to the conflicts table of its primary,
    /// its bytes kept, so replay stops retrying it.
    SetAside(SetAsideArgs),
}

#[derive(Debug, Args)]
pub struct UndecodableArgs {
    /// The datastore.
    #[arg(long, value_name = "NAME", env = "CELLGATE_DATASTORE")]
    pub datastore: String,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct SetAsideArgs {
    /// The datastore.
    #[arg(long, value_name = "NAME", env = "CELLGATE_DATASTORE")]
    pub datastore: String,
    /// The cluster whose buffer holds the copy (as `undecodable` prints it).
    #[arg(long, value_name = "NAME")]
    pub cluster: String,
    /// The copy's buffer id (as `undecodable` prints it).
    #[arg(long, value_name = "ID")]
    pub buffer_id: i64,
    #[command(flatten)]
    pub store: StoreArgs,
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
        BufferCommand::Undecodable(args) => undecodable(args).await,
        BufferCommand::SetAside(args) => set_aside(args).await,
    }
}

async fn undecodable(args: UndecodableArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let copies = store
        .buffer_undecodable(&args.datastore)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for c in &copies {
        println!(
            "cluster {} buffer id {}: {} {} {}, {} bytes buffered at {}: {}",
            c.cluster,
            c.buffer_id,
            c.key.row_key,
            c.key.column,
            c.key.ref_key,
            c.bytes,
            c.buffered_at.to_rfc3339(),
            c.reason
        );
    }
    println!("{} undecodable copies", copies.len());
    if !copies.is_empty() {
        println!("set one aside with: cellgate buffer set-aside --datastore {} --cluster <cluster> --buffer-id <id>", args.datastore);
    }
    Ok(if copies.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn set_aside(args: SetAsideArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let key = store
        .buffer_set_aside(&args.datastore, &args.cluster, args.buffer_id)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "copy {} on {} ({} {} {}) moved to the conflicts table; `cellgate buffer conflicts` lists it",
        args.buffer_id, args.cluster, key.row_key, key.column, key.ref_key
    );
    Ok(ExitCode::SUCCESS)
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
