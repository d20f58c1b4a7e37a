//! `cellgate ddl`: the reference SQL schema files, one per dialect.
//!
//! The files under `schema/sql/` are generated from the definitions and
//! committed, so a change to a datastore or index shows up in review as the
//! SQL it causes. `--check` is the guard that keeps them in step: it writes
//! nothing and fails on any missing or stale file, and a test runs it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::Args;

use crate::storage::{ddl, Dialect};

use super::{load_definitions, DEFAULT_DATASTORES};

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
        check(&args, &files)
    } else {
        write(&args.out, &files)?;
        Ok(ExitCode::SUCCESS)
    }
}

fn write(out: &Path, files: &[(PathBuf, String)]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out)
        .with_context(|| format!("cannot create directory `{}`", out.display()))?;
    for (path, content) in files {
        // Leave an up-to-date file alone so its modification time stays.
        if read(path)?.as_deref() == Some(content.as_str()) {
            println!("{} is up to date", path.display());
            continue;
        }
        std::fs::write(path, content)
            .with_context(|| format!("cannot write `{}`", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn check(args: &DdlArgs, files: &[(PathBuf, String)]) -> anyhow::Result<ExitCode> {
    let fix = fix_command(args);
    let mut outdated = 0;
    for (path, content) in files {
        match read(path)? {
            Some(existing) if existing == *content => {
                println!("{} is up to date", path.display());
            }
            Some(_) => {
                eprintln!("error: {} is stale: run `{fix}`", path.display());
                outdated += 1;
            }
            None => {
                eprintln!("error: {} is missing: run `{fix}`", path.display());
                outdated += 1;
            }
        }
    }
    Ok(if outdated == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
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

/// The file's content, `None` if it does not exist.
fn read(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read `{}`", path.display())),
    }
}
