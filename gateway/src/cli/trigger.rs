//! `cellgate trigger`: the webhook triggers of the definitions.
//!
//! `list` prints the triggers defined (no storage needed); `status` prints
//! each trigger's quarantine from the store (live delivery figures are per
//! gateway, in `/metrics`); `rewind` moves a trigger's offsets back so the
//! running gateways deliver again from an `added_id` or a time;
//! `quarantine` lists the cells set aside after `max_attempts` failures and
//! `--retry` has them delivered again. Triggers are named `<datastore>/<name>`
//! or by name alone when it is unique.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use index_dsl::{Definitions, Trigger};

use cellgate_store::cells::Location;

use super::load_definitions;
use super::store_args::StoreArgs;

#[derive(Debug, Args)]
pub struct TriggerArgs {
    #[command(subcommand)]
    pub command: TriggerCommand,
}

#[derive(Debug, Subcommand)]
pub enum TriggerCommand {
    /// Print the webhook triggers of the definitions, one per line.
    List(ListArgs),
    /// Print each trigger's quarantined cells (and those asked to be
    /// retried) from the store; exit 1 if any trigger has quarantined cells.
    Status(StatusArgs),
    /// Deliver a trigger's cells again: move every shard's offset back to
    /// after an `added_id` (`--to 0`: from the beginning) or to a time
    /// (`--to 2024-01-01T00:00:00Z`). Running gateways pick it up at their
    /// next sweep.
    Rewind(RewindArgs),
    /// Print a trigger's quarantined cells, one per line; with `--retry`,
    /// have them delivered again by the gateway holding their shard.
    Quarantine(QuarantineArgs),
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Directory of the datastore and index definitions.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = super::DEFAULT_DATASTORES
    )]
    pub datastores: std::path::PathBuf,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Only this trigger (`<datastore>/<name>` or a unique name).
    #[arg(value_name = "TRIGGER", env = "CELLGATE_TRIGGER")]
    pub trigger: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct RewindArgs {
    /// The trigger: `<datastore>/<name>` or a unique name.
    #[arg(value_name = "TRIGGER", env = "CELLGATE_TRIGGER")]
    pub trigger: String,
    /// An `added_id` to deliver the cells after, or an RFC 3339 time to
    /// deliver the cells created from.
    #[arg(long, value_name = "ADDED_ID|TIME", env = "CELLGATE_REWIND_TO")]
    pub to: String,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct QuarantineArgs {
    /// The trigger: `<datastore>/<name>` or a unique name.
    #[arg(value_name = "TRIGGER", env = "CELLGATE_TRIGGER")]
    pub trigger: String,
    /// Have the quarantined cells delivered again; those the webhook takes
    /// leave the quarantine.
    #[arg(
        long,
        env = "CELLGATE_RETRY",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub retry: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub async fn run(args: TriggerArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        TriggerCommand::List(args) => list(args),
        TriggerCommand::Status(args) => status(args).await,
        TriggerCommand::Rewind(args) => rewind(args).await,
        TriggerCommand::Quarantine(args) => quarantine(args).await,
    }
}

/// The triggers `wanted` names (every one when `None`).
fn find<'a>(defs: &'a Definitions, wanted: Option<&str>) -> anyhow::Result<Vec<&'a Trigger>> {
    let all: Vec<&Trigger> = defs
        .datastores
        .iter()
        .flat_map(|d| d.triggers.iter())
        .collect();
    let Some(wanted) = wanted else {
        return Ok(all);
    };
    let found: Vec<&Trigger> = all
        .iter()
        .copied()
        .filter(|t| match wanted.split_once('/') {
            Some((ds, name)) => t.datastore == ds && t.name == name,
            None => t.name == wanted,
        })
        .collect();
    match found.len() {
        0 => anyhow::bail!(
            "no trigger `{wanted}` in the definitions (see `cellgate trigger list`)"
        ),
        1 => Ok(found),
        _ => anyhow::bail!(
            "trigger name `{wanted}` is defined in several datastores (give it as <datastore>/{wanted})"
        ),
    }
}

fn list(args: ListArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let triggers = find(&defs, None)?;
    for t in &triggers {
        let filter = t
            .filter_text
            .as_deref()
            .map(|f| format!(" filter: {f}"))
            .unwrap_or_default();
        println!(
            "{}/{} columns [{}] -> POST {} (batch_size {}, max_attempts {}, timeout {} ms{}){filter}",
            t.datastore,
            t.name,
            t.columns.join(", "),
            t.webhook.url,
            t.batch_size,
            t.max_attempts,
            t.webhook.timeout_ms,
            t.webhook
                .secret_env
                .as_deref()
                .map(|e| format!(", signed with ${e}"))
                .unwrap_or_default(),
        );
    }
    println!("{}", super::plural(triggers.len(), "trigger", "triggers"));
    Ok(ExitCode::SUCCESS)
}

async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let defs = store.definitions();
    let triggers = find(&defs, args.trigger.as_deref())?;
    let mut any = false;
    for t in triggers {
        let cells = store
            .trigger_quarantine(&t.datastore, &t.name)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let retrying = cells.iter().filter(|c| c.retry).count();
        any |= !cells.is_empty();
        println!(
            "{}/{}: {} quarantined ({} asked to be retried)",
            t.datastore,
            t.name,
            cells.len(),
            retrying
        );
    }
    println!("delivery figures of a running gateway: cellgate_trigger_* in its /metrics");
    Ok(if any {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

async fn rewind(args: RewindArgs) -> anyhow::Result<ExitCode> {
    let to = match args.to.parse::<i64>() {
        Ok(id) if id >= 0 => Location::AddedId(id),
        Ok(_) => anyhow::bail!("--to {}: an added_id is 0 or more", args.to),
        Err(_) => match chrono::DateTime::parse_from_rfc3339(&args.to) {
            Ok(t) => Location::Timestamp(t.with_timezone(&chrono::Utc)),
            Err(_) => anyhow::bail!(
                "--to {}: expected an added_id (an integer) or an RFC 3339 time",
                args.to
            ),
        },
    };
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let defs = store.definitions();
    let trigger = find(&defs, Some(&args.trigger))?[0];
    let moved = store
        .rewind_consumer(&trigger.datastore, &trigger.name, to)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!(
        "{}/{}: {} rewound",
        trigger.datastore,
        trigger.name,
        super::plural(moved as usize, "shard", "shards")
    );
    Ok(ExitCode::SUCCESS)
}

async fn quarantine(args: QuarantineArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let defs = store.definitions();
    let trigger = find(&defs, Some(&args.trigger))?[0];
    if args.retry {
        let asked = store
            .retry_trigger_quarantine(&trigger.datastore, &trigger.name)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        println!(
            "{}/{}: {} asked to be delivered again",
            trigger.datastore,
            trigger.name,
            super::plural(asked as usize, "cell", "cells")
        );
        return Ok(ExitCode::SUCCESS);
    }
    let cells = store
        .trigger_quarantine(&trigger.datastore, &trigger.name)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for c in &cells {
        println!(
            "shard {} added_id {} {} {} {} attempts {}{} quarantined {}: {}",
            c.shard,
            c.added_id,
            c.row_key,
            c.column,
            c.ref_key,
            c.attempts,
            if c.retry { " (retry asked)" } else { "" },
            c.quarantined_at.to_rfc3339(),
            c.message
        );
    }
    println!(
        "{} quarantined",
        super::plural(cells.len(), "cell", "cells")
    );
    Ok(ExitCode::SUCCESS)
}
