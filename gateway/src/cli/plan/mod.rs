//! `cellgate plan`: what a change of the definitions will do, before it
//! ships — the GraphQL schema changes classified as graphql-inspector
//! does, the index tables created, rebuilt or left behind, the changes the
//! store refuses, and the triggers that start, stop or change.
//!
//! The two sides are the definitions directory and a git revision of it
//! (`--base`, `HEAD` by default), or another directory (`--base-dir`).
//! Exit status: 0 no change, 3 only safe or dangerous changes, 4 a
//! breaking or refused change, 1 a side that cannot be read (no such
//! revision, not a git work tree, definitions that do not load), 2 a usage
//! error.

mod changes;
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
    #[arg(long, value_name = "DIR", env = "CELLGATE_PLAN_BASE_DIR")]
    pub base_dir: Option<PathBuf>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Text, env = "CELLGATE_PLAN_FORMAT")]
    pub format: Format,
}

/// The plan from one side to the other.
pub struct Plan {
    pub base: String,
    pub head: String,
    pub changes: Vec<Change>,
}

impl Plan {
    /// The worst level among the changes, if any.
    pub fn worst(&self) -> Option<Level> {
        self.changes.iter().map(|c| c.level).max()
    }
}

pub fn run(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let base = match &args.base_dir {
        Some(dir) => Side::from_dir(dir),
        None => Side::from_git(&args.datastores, args.base.as_deref().unwrap_or("HEAD")),
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
    let plan = plan(&base, &head)?;
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
        changes,
    })
}
