//! `cellgate ids`: create biz tags, take IDs, show the segment table and
//! decode IDs (`cellgate-bench ids` measures the allocator).
//!
//! The commands open the store like `migrate` and `index` do (index
//! maintenance off).

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};

use super::store_args::StoreArgs;
use crate::config::Config;
use cellgate_store::ids::{IdKind, IdsOptions, NewTag};
use cellgate_store::{Store, StoreOptions};

#[derive(Debug, Args)]
pub struct IdsArgs {
    #[command(subcommand)]
    pub command: IdsCommand,
}

#[derive(Debug, Subcommand)]
pub enum IdsCommand {
    /// Create a biz tag for segment IDs (left unchanged if it exists).
    CreateTag(CreateTagArgs),
    /// Print the next IDs of a biz tag, one per line.
    Next(NextArgs),
    /// Print snowflake IDs, one per line (leases a worker id for the run).
    Snowflake(SnowflakeArgs),
    /// Print the biz tags as stored: max_id, step, description, update time.
    Tags(TagsArgs),
    /// Split an ID into version, shard, time, worker and sequence.
    Decode(DecodeArgs),
}

#[derive(Debug, Args)]
pub struct CreateTagArgs {
    /// The biz tag: letters, digits, `_`, `-`, `.`, `:` (at most 128).
    pub tag: String,
    /// Length of the first segment (the adaptive step starts here).
    #[arg(long, default_value_t = 1000, env = "CELLGATE_IDS_STEP")]
    pub step: i64,
    /// The first ID.
    #[arg(long, default_value_t = 1, env = "CELLGATE_IDS_START")]
    pub start: i64,
    /// What the IDs are for.
    #[arg(long, default_value = "", env = "CELLGATE_IDS_DESCRIPTION")]
    pub description: String,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct NextArgs {
    /// The biz tag.
    pub tag: String,
    /// How many IDs.
    #[arg(long, default_value_t = 1, env = "CELLGATE_IDS_COUNT")]
    pub count: usize,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct SnowflakeArgs {
    /// How many IDs.
    #[arg(long, default_value_t = 1, env = "CELLGATE_IDS_COUNT")]
    pub count: usize,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct TagsArgs {
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct DecodeArgs {
    /// The ID, in decimal.
    pub id: i64,
    /// The snowflake epoch in Unix milliseconds.
    #[arg(long, default_value_t = cellgate_store::ids::DEFAULT_EPOCH_MS, env = "CELLGATE_IDS_EPOCH_MS")]
    pub epoch_ms: i64,
}

pub async fn run(args: IdsArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        IdsCommand::CreateTag(args) => {
            let Some(store) = open(&args.store, false).await? else {
                return Ok(ExitCode::FAILURE);
            };
            let tag = NewTag {
                name: args.tag.clone(),
                start: args.start,
                step: args.step,
                description: args.description,
            };
            let created = store.ids().create_tag(&tag).await.map_err(client_error)?;
            if created {
                println!(
                    "created biz tag `{}` (first id {}, step {})",
                    args.tag, args.start, args.step
                );
            } else {
                println!("biz tag `{}` exists; left unchanged", args.tag);
            }
            Ok(ExitCode::SUCCESS)
        }
        IdsCommand::Next(args) => {
            let Some(store) = open(&args.store, false).await? else {
                return Ok(ExitCode::FAILURE);
            };
            let ids = store
                .ids()
                .next_ids(&args.tag, args.count)
                .await
                .map_err(client_error)?;
            print_ids(&ids);
            Ok(ExitCode::SUCCESS)
        }
        IdsCommand::Snowflake(args) => {
            let Some(store) = open(&args.store, true).await? else {
                return Ok(ExitCode::FAILURE);
            };
            store
                .ids()
                .wait_for_worker(Duration::from_secs(10))
                .await
                .map_err(client_error)?;
            let ids = store
                .ids()
                .snowflake_ids(args.count)
                .await
                .map_err(client_error)?;
            print_ids(&ids);
            Ok(ExitCode::SUCCESS)
        }
        IdsCommand::Tags(args) => {
            let Some(store) = open(&args.store, false).await? else {
                return Ok(ExitCode::FAILURE);
            };
            let tags = store.ids().tags().await.map_err(client_error)?;
            println!(
                "{:<32} {:>20} {:>10}  {:<27} description",
                "biz_tag", "max_id", "step", "update_time"
            );
            for t in tags {
                println!(
                    "{:<32} {:>20} {:>10}  {:<27} {}",
                    t.tag,
                    t.max_id,
                    t.step,
                    t.update_time
                        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
                    t.description
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        IdsCommand::Decode(args) => {
            let d = cellgate_store::ids::decode(args.id, args.epoch_ms).map_err(client_error)?;
            let kind = match d.kind {
                IdKind::Snowflake => "snowflake",
                IdKind::Tagged => "tagged",
            };
            println!("kind: {kind}\nversion: {}", d.version);
            if let Some(shard) = d.shard {
                println!("shard: {shard}");
            }
            println!(
                "time: {}\nworker: {}\nsequence: {}",
                d.time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                d.worker,
                d.sequence
            );
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn client_error(error: cellgate_store::Error) -> anyhow::Error {
    anyhow::anyhow!("{}: {}", error.code(), error.client_message())
}

fn print_ids(ids: &[i64]) {
    use std::io::Write as _;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for id in ids {
        let _ = writeln!(out, "{id}");
    }
}

/// Opens the store of `args` with the `ids:` section of its configuration.
async fn open(args: &StoreArgs, snowflake: bool) -> anyhow::Result<Option<Store>> {
    let Some(defs) = super::load_definitions(&args.datastores, "--datastores")? else {
        return Ok(None);
    };
    let config = match &args.config {
        Some(path) => Config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?,
        None => Config::default(),
    };
    let mut options = StoreOptions::new(args.storage()?);
    options.maintain_indexes = false;
    options.replay_buffers = false;
    options.ids = IdsOptions {
        snowflake,
        // A command holds its worker id briefly; it is free again soon after.
        worker_lease: Duration::from_secs(30),
        worker_cache: None,
        ..config.ids.options(None)
    };
    let store = Store::open(defs, options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open storage: {e}"))?;
    Ok(Some(store))
}
