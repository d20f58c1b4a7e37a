//! The `cellgate` command line: argument parsing and one file per command.
//!
//! Arguments are parsed with clap's derive API; every flag has a
//! `CELLGATE_*` environment twin so a deployment can be configured entirely
//! through its environment, and the `--help` texts are the manual. Commands
//! return an [`ExitCode`] for outcomes they have already reported (invalid
//! definitions, a stale schema file) and an `anyhow` error for everything
//! else, which `main` prints with `{:#}` on one line and turns into exit
//! code 1. Nothing here panics on bad input.
//!
//! `main.rs` only parses the arguments and runs [`run`] on a tokio runtime,
//! so that the commands are also reachable from the library (and a future
//! `serve` command slots in as one more [`Command`] variant and file).

mod buffer;
mod cells;
mod check;
mod ddl;
mod explain;
mod generated;
mod ids;
mod index;
mod migrate;
mod plan;
mod reload;
mod schema;
mod serve;
mod shard;
mod store_args;
mod token;
mod trigger;
mod upgrade;

use std::io::IsTerminal as _;
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use index_dsl::Definitions;

pub use buffer::BufferArgs;
pub use cells::CellsArgs;
pub use check::CheckArgs;
pub use ddl::DdlArgs;
pub use ids::IdsArgs;
pub use index::IndexArgs;
pub use migrate::MigrateArgs;
pub use reload::ReloadArgs;
pub use schema::SchemaArgs;
pub use serve::ServeArgs;
pub use token::TokenArgs;
pub use trigger::TriggerArgs;

/// Default directory of the datastore and index definitions.
pub const DEFAULT_DATASTORES: &str = "./datastores";

/// Log filter used when neither `--log` nor `RUST_LOG` is set.
const DEFAULT_LOG: &str = "warn,cellgate=info";

/// A sharded, append-only cell store on SQL databases, with secondary indexes
/// declared in YAML.
#[derive(Debug, Parser)]
#[command(name = "cellgate", version, propagate_version = true)]
pub struct Cli {
    /// Log filter in `RUST_LOG` syntax, e.g. `debug` or `warn,cellgate=trace`.
    /// Logs go to stderr. When unset, `RUST_LOG` is used, and failing that
    /// `warn,cellgate=info`.
    #[arg(long, global = true, env = "CELLGATE_LOG", value_name = "FILTER")]
    pub log: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the datastore, index and trigger definitions and summarize
    /// them.
    ///
    /// Loads every `<datastore>/datastore.yaml`,
    /// `<datastore>/indexes/*.yaml` and `<datastore>/triggers/*.yaml` under DIR, reports all problems at once
    /// (rustc-style, with file, line and column) and exits 1 if there are
    /// any; otherwise prints what is defined and exits 0.
    Check(CheckArgs),
    /// Write the reference SQL schema of every dialect.
    ///
    /// Writes `<OUT>/sqlite.sql`, `<OUT>/mysql.sql` and `<OUT>/postgres.sql`:
    /// the cluster tables and the tables of every datastore, as
    /// `cellgate migrate` would create them. With `--check`, writes nothing
    /// and exits 1 if any file is missing or out of date.
    Ddl(DdlArgs),
    /// Say what a change of the definitions will do before it ships.
    ///
    /// Compares DIR with a git revision of it (`--base`, HEAD by default)
    /// or with another directory (`--base-dir`), and prints the GraphQL
    /// schema changes (breaking, dangerous or safe, as graphql-inspector
    /// classifies them), the index tables created, rebuilt or left
    /// behind, the changes the store refuses, and the triggers that start,
    /// stop or change. Exits 0 without changes, 3 with only safe or
    /// dangerous ones, 4 with a breaking or refused one, 1 when a side
    /// cannot be read.
    Plan(plan::PlanArgs),
    /// Write the GraphQL SDL of the definitions to `schema/schema.graphql`.
    ///
    /// Frontend clients generate code against this file. With `--check`,
    /// writes nothing and exits 1 if it is missing or out of date.
    Schema(SchemaArgs),
    /// Create the storage tables in the configured databases.
    ///
    /// Prepares every cluster: one set of tables per datastore (logical
    /// shards are rows), a counter row per owned shard, and the catalog
    /// that records what the tables were built from. Refuses definitions
    /// that would hide stored cells (a new shard count, shards routed to
    /// another cluster). Safe to run again; the gateway does the same at
    /// start-up. `--from-v1` converts a store of the earlier per-shard
    /// layout.
    Migrate(MigrateArgs),
    /// Manage index tables (`drop`, `quarantine`).
    Index(IndexArgs),
    /// Operate on the stored cells: `prune` deletes old versions
    /// (retention) — never a latest version, nor a cell a consumer or a
    /// quarantine still needs — and reports what it removed.
    Cells(CellsArgs),
    /// Buffered writes: `conflicts` lists those that lost to another body
    /// of their key when they were replayed into their primary.
    Buffer(BufferArgs),
    /// IDs: create biz tags, take segment or snowflake IDs, list the tags,
    /// and decode an ID (`cellgate-bench ids` measures the allocator).
    Ids(IdsArgs),
    /// Ask a running gateway to reload its definitions.
    ///
    /// Sends `POST /admin/reload` to `--url` (with auth on, a `--token`
    /// with a `*:admin` scope) and prints what changed, or why nothing
    /// did (the diagnostics of definitions that do not load, a change the
    /// running store refuses); exits 1 when nothing was reloaded. The
    /// gateway keeps serving either way. SIGHUP to the gateway does the
    /// same.
    Reload(ReloadArgs),
    /// Serve the GraphQL API over HTTP.
    ///
    /// Loads the definitions, opens the store, and serves `POST/GET
    /// /graphql`, a GraphQL playground at `/`, `/healthz`, `/readyz` and
    /// `/metrics` until Ctrl-C or SIGTERM. Settings come from the flags,
    /// then `--config FILE`, then the defaults. SIGHUP, `cellgate reload`
    /// and, with `--watch`, a change of the definitions reload them
    /// without a restart.
    Serve(ServeArgs),
    /// Manage API tokens (`create`, `list`, `revoke`).
    ///
    /// Tokens are sent as `Authorization: Bearer <token>` and carry scopes
    /// per datastore: `<datastore>:read|write|admin`, `*` for every one.
    /// Only a hash of each token is stored, in the first cluster.
    Token(TokenArgs),
    /// Webhook triggers: `list` the defined ones, `status` of their
    /// quarantines, `rewind` to deliver again, `quarantine [--retry]`.
    Trigger(TriggerArgs),
    /// Shard ranges: `status` prints where they live, `move` moves one to
    /// another cluster online (resumable, `--dry-run`, `--abort`).
    Shard(shard::ShardArgs),
}

/// Runs a parsed command line; errors are for `main` to print.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    if let Command::Serve(args) = cli.command {
        // `serve` sets up logging itself, with the traces its
        // configuration asks for.
        return serve::run(args, cli.log.as_deref()).await;
    }
    init_logging(cli.log.as_deref(), None)?;
    match cli.command {
        Command::Check(args) => check::run(args),
        Command::Ddl(args) => ddl::run(args),
        Command::Plan(args) => plan::run(args).await,
        Command::Schema(args) => schema::run(args),
        Command::Migrate(args) => migrate::run(args).await,
        Command::Index(args) => index::run(args).await,
        Command::Buffer(args) => buffer::run(args).await,
        Command::Cells(args) => cells::run(args).await,
        Command::Ids(args) => ids::run(args).await,
        Command::Reload(args) => reload::run(args).await,
        Command::Serve(_) => unreachable!("served above"),
        Command::Token(args) => token::run(args).await,
        Command::Trigger(args) => trigger::run(args).await,
        Command::Shard(args) => shard::run(args).await,
    }
}

/// Sends `tracing` output to stderr, filtered by `filter`, else `RUST_LOG`,
/// else [`DEFAULT_LOG`]; and, with a `tracer`, the spans of cellgate's own
/// crates (not its log events) to OpenTelemetry (`telemetry.rs`).
fn init_logging(
    filter: Option<&str>,
    tracer: Option<opentelemetry_sdk::trace::Tracer>,
) -> anyhow::Result<()> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::{EnvFilter, Layer as _};

    let from_env = std::env::var("RUST_LOG").ok().filter(|s| !s.is_empty());
    let (directives, origin) = match (filter, from_env) {
        (Some(f), _) => (f.to_string(), "--log"),
        (None, Some(f)) => (f, "RUST_LOG"),
        (None, None) => (DEFAULT_LOG.to_string(), "default"),
    };
    let filter = EnvFilter::try_new(&directives)
        .with_context(|| format!("invalid log filter `{directives}` (from {origin})"))?;
    let log = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_filter(filter);
    let traces = tracer.map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.is_span() && meta.target().starts_with("cellgate")
            }))
    });
    // Fails only if a subscriber is already installed (when `run` is called
    // twice in one process); the first one keeps working.
    let _ = tracing_subscriber::registry()
        .with(log)
        .with(traces)
        .try_init();
    Ok(())
}

/// Loads the definitions under `dir`. Invalid definitions are printed to
/// stderr, every problem at once, and give `Ok(None)`: the caller exits 1
/// without printing more. `flag` is how the user gives the directory, for
/// the message when it does not exist.
fn load_definitions(dir: &Path, flag: &str) -> anyhow::Result<Option<Definitions>> {
    if !dir.is_dir() {
        let what = if dir.exists() {
            "is not a directory"
        } else {
            "does not exist"
        };
        anyhow::bail!(
            "datastores directory `{}` {what} (give it with {flag} or CELLGATE_DATASTORES)",
            dir.display()
        );
    }
    match index_dsl::load_dir(dir) {
        Ok(defs) => Ok(Some(defs)),
        Err(diagnostics) => {
            eprintln!("{diagnostics}");
            Ok(None)
        }
    }
}

/// `1 index`, `2 indexes`: `n` with the word that fits it.
fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_has_an_environment_twin() {
        use clap::CommandFactory as _;

        let cli = Cli::command();
        let mut commands = vec![&cli];
        commands.extend(cli.get_subcommands());
        for command in commands {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                assert!(
                    env.as_deref().is_some_and(|e| e.starts_with("CELLGATE_")),
                    "`{} {id}` has no CELLGATE_* environment variable",
                    command.get_name()
                );
                assert!(
                    arg.get_help().is_some(),
                    "`{} {id}` has no help",
                    command.get_name()
                );
            }
        }
    }
}
