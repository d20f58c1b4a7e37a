//! `cellgate plan`: what a change of the definitions will do, before it
//! ships — the GraphQL schema changes classified as graphql-inspector
//! does, the index tables created, rebuilt or left behind, the changes the
//! store refuses, and the triggers that start, stop or change.
//!
//! The two sides are the definitions directory and a git revision of it
//! (`--base`, `HEAD` by default), another directory (`--base-dir`), or what
//! the store's catalog records as deployed (`--base-deployed`). With a
//! store to look at (`--data`, `--database`, `--config`), each index built
//! from the cell log says how many cells it reads and about how long that
//! takes (`estimate.rs`). Each side's digest is in the JSON, for `cellgate
//! reload --plan`.
//! Exit status: 0 no change, 3 only safe or dangerous changes, 4 a
//! breaking or refused change, 1 a side or store that cannot be read (no
//! such revision, not a git work tree, definitions that do not load), 2 a
//! usage error.

mod changes;
mod estimate;
mod render;
mod sides;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};

use self::changes::{Change, Level};
use self::sides::{Side, SideError};
use super::DEFAULT_DATASTORES;

/// Exit status with changes that are all safe or dangerous.
pub const EXIT_CHANGES: u8 = 3;
/// Exit status with a breaking or refused change.
pub const EXIT_BREAKING: u8 = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Grouped, for a terminal or a pull request comment.
    Text,
    /// One JSON document (`version: 1`).
    Json,
    /// GitHub Actions workflow commands: an annotation per change.
    Github,
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// Directory of the new definitions.
    #[arg(
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,
    /// The git revision of DIR to compare with (a branch, a tag, a commit:
    /// `origin/main` in a pull request's CI job).
    #[arg(
        long,
        value_name = "REV",
        env = "CELLGATE_PLAN_BASE",
        conflicts_with = "base_dir"
    )]
    pub base: Option<String>,
    /// Another directory of definitions to compare with, instead of a git
    /// revision.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_PLAN_BASE_DIR",
        conflicts_with = "base_deployed"
    )]
    pub base_dir: Option<PathBuf>,
    /// Compare with the definitions the store's catalog records as
    /// deployed (the files a gateway last loaded); needs the store's
    /// `--data`, `--database` or `--config`.
    #[arg(long, env = "CELLGATE_PLAN_BASE_DEPLOYED", conflicts_with = "base")]
    pub base_deployed: bool,
    /// Data directory of an embedded SQLite store to estimate the index
    /// builds against (`<DIR>/cellgate.db`; read only).
    #[arg(long, value_name = "DIR", env = "CELLGATE_DATA")]
    pub data: Option<PathBuf>,
    /// URL of the one database cluster of a store to estimate against.
    #[arg(
        long,
        value_name = "URL",
        env = "CELLGATE_DATABASE_URL",
        hide_env_values = true
    )]
    pub database: Option<String>,
    /// Configuration file (`cellgate.yaml`) of a store to estimate against.
    #[arg(long, value_name = "FILE", env = "CELLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text, env = "CELLGATE_PLAN_FORMAT")]
    pub format: Format,
}

/// The plan from one side to the other.
pub struct Plan {
    pub base: String,
    pub head: String,
    /// `index_dsl::digest` of each side's files.
    pub base_digest: String,
    pub head_digest: String,
    pub changes: Vec<Change>,
}

impl Plan {
    /// The worst level among the changes, if any.
    pub fn worst(&self) -> Option<Level> {
        self.changes.iter().map(|c| c.level).max()
    }
}

pub async fn run(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let inspection = match store_of(&args) {
        Ok(None) => None,
        Ok(Some(storage)) => match cellgate_store::inspect(&storage).await {
            Ok(inspection) => Some(inspection),
            Err(error) => {
                eprintln!("error: cannot read the store: {error}");
                return Ok(ExitCode::FAILURE);
            }
        },
        Err(error) => {
            eprintln!("error: {error}");
            return Ok(ExitCode::from(2));
        }
    };
    let base = match (&args.base_dir, &inspection) {
        (Some(dir), _) => Side::from_dir(dir),
        (None, Some(inspection)) if args.base_deployed => match inspection.deployed.clone() {
            Some(deployed) => Side::from_deployed(&args.datastores, deployed),
            None => Err(SideError::Unreadable(
                "the store's catalog records no deployed definitions (a gateway records them when it starts or reloads)".into(),
            )),
        },
        (None, None) if args.base_deployed => {
            eprintln!("error: --base-deployed needs the store: give --data, --database or --config");
            return Ok(ExitCode::from(2));
        }
        (None, _) => Side::from_git(&args.datastores, args.base.as_deref().unwrap_or("HEAD")),
    };
    let sides = base.and_then(|base| Ok((base, Side::from_dir(&args.datastores)?)));
    let (base, head) = match sides {
        Ok(sides) => sides,
        Err(SideError::Unreadable(message)) => {
            eprintln!("error: {message}");
            return Ok(ExitCode::FAILURE);
        }
        Err(SideError::Invalid(diagnostics)) => {
            eprintln!("{diagnostics}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut plan = plan(&base, &head)?;
    if let Some(inspection) = &inspection {
        estimate::attach(&mut plan.changes, inspection);
    }
    print!("{}", render::render(&plan, args.format));
    Ok(ExitCode::from(match plan.worst() {
        None => 0,
        Some(Level::Safe | Level::Dangerous) => EXIT_CHANGES,
        Some(Level::Breaking | Level::Refused) => EXIT_BREAKING,
    }))
}

/// Every change from `base` to `head`: GraphQL first, then storage, then
/// triggers, the worst first within each.
pub fn plan(base: &Side, head: &Side) -> anyhow::Result<Plan> {
    let old = cellgate_graphql::sdl(&base.defs)?;
    let new = cellgate_graphql::sdl(&head.defs)?;
    let schema = cellgate_graphql::diff_sdl(&old, &new)
        .map_err(|e| anyhow::anyhow!("the generated schema does not parse: {e}"))?;
    let mut changes = changes::graphql(schema, base, head);
    changes.extend(changes::definitions(base, head));
    // Stable: within a section and level, the order they were found in.
    changes.sort_by_key(|c| (c.section, std::cmp::Reverse(c.level)));
    Ok(Plan {
        base: base.label.clone(),
        head: head.label.clone(),
        base_digest: base.digest.clone(),
        head_digest: head.digest.clone(),
        changes,
    })
}

/// The storage the flags name, if any does.
fn store_of(args: &PlanArgs) -> anyhow::Result<Option<cellgate_store::StorageConfig>> {
    if args.data.is_none() && args.database.is_none() && args.config.is_none() {
        return Ok(None);
    }
    let data = args.data.clone().unwrap_or_else(|| PathBuf::from("./data"));
    super::store_args::storage(args.database.as_deref(), args.config.as_deref(), &data).map(Some)
}
