//! `cellgate schema`: the GraphQL SDL of the definitions, for clients to
//! generate code against.
//!
//! `schema/schema.graphql` is generated from `./datastores` and committed;
//! with `--federation`, so is the Federation 2 subgraph SDL beside it
//! (`schema.federation.graphql`, what `_service { sdl }` answers with
//! `graphql.federation` on). `--check` fails when one is stale, and CI runs
//! the check.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::{generated, load_definitions, DEFAULT_DATASTORES};

/// Default location of the SDL file.
const DEFAULT_OUT: &str = "./schema/schema.graphql";

#[derive(Debug, Args)]
pub struct SchemaArgs {
    /// Directory of the datastore and index definitions.
    #[arg(
        long,
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,

    /// File the SDL is written to.
    #[arg(
        long,
        value_name = "FILE",
        env = "CELLGATE_SCHEMA_OUT",
        default_value = DEFAULT_OUT
    )]
    pub out: PathBuf,

    /// Write nothing; exit 1 if the file is missing or differs from what
    /// would be written (for CI).
    // `BoolishValueParser`: the variable may be `1`/`0`, `yes`/`no`, `on`/`off`.
    #[arg(
        long,
        env = "CELLGATE_SCHEMA_CHECK",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub check: bool,

    /// Also the SDL of the schema as a Federation 2 subgraph, written to
    /// `schema.federation.graphql` in the directory of `--out`.
    #[arg(
        long,
        env = "CELLGATE_SCHEMA_FEDERATION",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub federation: bool,
}

/// The name of the subgraph SDL file.
const FEDERATION_FILE: &str = "schema.federation.graphql";

pub fn run(args: SchemaArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(ExitCode::FAILURE);
    };
    let sdl = cellgate_graphql::sdl(&defs)?;
    let mut files = vec![(args.out.clone(), sdl)];
    if args.federation {
        let subgraph = cellgate_graphql::subgraph_sdl(&defs)?;
        files.push((args.out.with_file_name(FEDERATION_FILE), subgraph));
    }
    if args.check {
        let mut fix = "cellgate schema".to_string();
        if args.federation {
            fix.push_str(" --federation");
        }
        if args.datastores != Path::new(DEFAULT_DATASTORES) {
            fix.push_str(&format!(" --datastores {}", args.datastores.display()));
        }
        if args.out != Path::new(DEFAULT_OUT) {
            fix.push_str(&format!(" --out {}", args.out.display()));
        }
        generated::check(&files, &fix)
    } else {
        generated::write(&files)?;
        Ok(ExitCode::SUCCESS)
    }
}
