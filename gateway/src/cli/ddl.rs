//! `cellgate ddl`: the reference SQL schema files, one per dialect.
//!
//! The files under `schema/sql/` are generated from the definitions and
//! committed, so a change to a datastore or index shows up in review as the
//! SQL it causes. `--check` is the guard that keeps them in step: it writes
//! nothing and fails on any missing or stale file, and a test runs it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use cellgate_store::storage::{ddl, Dialect};

use super::{generated, load_definitions, DEFAULT_DATASTORES};

/// Default directory of the schema files.
const DEFAULT_OUT: &str = "./schema/sql";

#[derive(Debug, Args)]
pub struct DdlArgs {
    /// Directory of the datastore and index definitions.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,

    /// Directory the `<dialect>.sql` files are written to (created if
    /// missing).
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DDL_OUT",
        default_value = DEFAULT_OUT
    )]
    pub out: PathBuf,

    /// Write nothing; exit 1 if any file is missing or differs from what
    /// would be written (for CI).
    // `BoolishValueParser`: the variable may be `1`/`0`, `yes`/`no`, `on`/`off`.
    #[arg(
        long,
        env = "CELLGATE_DDL_CHECK",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub check: bool,
}

pub fn run(args: DdlArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let files: Vec<(PathBuf, String)> = Dialect::ALL
        .iter()
        .map(|&dialect| {
            let path = args.out.join(format!("{}.sql", dialect.name()));
            (path, ddl::schema_file(dialect, &defs))
        })
        .collect();
    if args.check {
        generated::check(&files, &fix_command(&args))
    } else {
        generated::write(&files)?;
        Ok(ExitCode::SUCCESS)
    }
}

/// The command that regenerates the files, with the directories the check
/// ran with when they are not the defaults.
fn fix_command(args: &DdlArgs) -> String {
    let mut command = "cellgate ddl".to_string();
    if args.datastores != Path::new(DEFAULT_DATASTORES) {
        command.push_str(&format!(" --datastores {}", args.datastores.display()));
    }
    if args.out != Path::new(DEFAULT_OUT) {
        command.push_str(&format!(" --out {}", args.out.display()));
    }
    command
}
