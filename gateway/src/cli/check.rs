//! `cellgate check`: validate the definitions and print what they define.
//!
//! The summary is plain, uncoloured and in definition order (datastores and
//! indexes sorted by the loader), so it is stable enough to snapshot and to
//! diff in code review.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use index_dsl::{Datastore, Definitions, Index};

use super::{load_definitions, plural, DEFAULT_DATASTORES};

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Directory of the definitions: one `<datastore>/datastore.yaml` per
    /// datastore, its indexes in `<datastore>/indexes/<index>.yaml`.
    #[arg(
        value_name = "DIR",
        env = "CELLGATE_DATASTORES",
        default_value = DEFAULT_DATASTORES
    )]
    pub datastores: PathBuf,
}

pub fn run(args: CheckArgs) -> anyhow::Result<ExitCode> {
    let Some(defs) = load_definitions(&args.datastores, "the DIR argument")? else {
        return Ok(ExitCode::FAILURE);
    };
    print!("{}", summary(&args.datastores, &defs));
    Ok(ExitCode::SUCCESS)
}

/// The text `check` prints for valid definitions.
fn summary(dir: &Path, defs: &Definitions) -> String {
    let columns: usize = defs.datastores.iter().map(|d| d.columns.len()).sum();
    let indexes: usize = defs.datastores.iter().map(|d| d.indexes.len()).sum();
    let mut out = format!(
        "datastores in {}: {}, {}, {}\n",
        dir.display(),
        plural(defs.datastores.len(), "datastore", "datastores"),
        plural(columns, "column", "columns"),
        plural(indexes, "index", "indexes"),
    );
    for datastore in &defs.datastores {
        out.push('\n');
        write_datastore(&mut out, datastore);
    }
    out
}

fn write_datastore(out: &mut String, datastore: &Datastore) {
    let columns: Vec<&str> = datastore.columns.iter().map(|c| c.name.as_str()).collect();
    let _ = writeln!(
        out,
        "{}: {}, columns {}",
        datastore.name,
        plural(datastore.shards as usize, "shard", "shards"),
        columns.join(", ")
    );
    if datastore.indexes.is_empty() {
        out.push_str("  no indexes\n");
    }
    for index in &datastore.indexes {
        write_index(out, index);
    }
    for trigger in &datastore.triggers {
        let filter = trigger
            .filter_text
            .as_deref()
            .map(|f| format!(", filter {f}"))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  trigger {}: {} -> POST {}{filter}",
            trigger.name,
            trigger.columns.join(", "),
            trigger.webhook.url
        );
    }
}

/// One header line per index, then one aligned line per field:
/// name, type and where the value comes from (`COLUMN.path`).
fn write_index(out: &mut String, index: &Index) {
    let _ = writeln!(
        out,
        "  index {}: shard field {}, from {}",
        index.name,
        index.shard_field().name,
        index.columns.join(", ")
    );
    let name_width = index.fields.iter().map(|f| f.name.len()).max().unwrap_or(0);
    let type_width = index
        .fields
        .iter()
        .map(|f| f.ty.name().len())
        .max()
        .unwrap_or(0);
    for field in &index.fields {
        let _ = writeln!(
            out,
            "    {:name_width$}  {:type_width$}  {}.{}",
            field.name,
            field.ty.name(),
            field.column,
            field.path
        );
    }
}
