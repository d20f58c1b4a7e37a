//! `cellgate cells`: operations on the stored cells themselves.
//!
//! `prune` is retention (SPEC §1): it deletes old versions of a datastore's
//! cells — beyond the newest `--keep N` of every `(row, column)`, or stored
//! longer ago than `--older-than`, or what both allow — with a progress bar
//! over the shards, and reports what it removed and what it kept and why.
//! A row's latest version of a column, cells a log consumer (index
//! maintenance, a trigger) has not read yet and cells a quarantine record
//! names always stay (`cellgate_store::cells::PruneOptions`). It is safe
//! while gateways serve.

use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cellgate_store::cells::{PruneCounts, PruneOptions, PruneProgress, PruneReport};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::store_args::StoreArgs;

#[derive(Debug, Args)]
pub struct CellsArgs {
    #[command(subcommand)]
    pub command: CellsCommand,
}

#[derive(Debug, Subcommand)]
pub enum CellsCommand {
    /// Delete old versions of cells (retention).
    ///
    /// Deletes the versions beyond the newest N of every (row, column)
    /// (`--keep N`), those stored longer ago than `--older-than`, or, with
    /// both, only what both allow. Never deletes a row's latest version of
    /// a column, a cell an index or trigger consumer has not read yet, or
    /// one a quarantine record names. Works through the shards in chunks,
    /// safely while gateways serve; `history` and the log no longer return
    /// what it deleted.
    Prune(PruneArgs),
}

#[derive(Debug, Args)]
pub struct PruneArgs {
    /// The datastore whose cells to prune.
    #[arg(long, value_name = "DATASTORE", env = "CELLGATE_PRUNE_DATASTORE")]
    pub datastore: String,
    /// Only the versions of this column (default: every column).
    #[arg(long, value_name = "COLUMN", env = "CELLGATE_PRUNE_COLUMN")]
    pub column: Option<String>,
    /// Keep the N newest versions of every (row, column); at least 1.
    #[arg(long, value_name = "N", env = "CELLGATE_PRUNE_KEEP")]
    pub keep: Option<u32>,
    /// Delete versions stored longer ago than this, e.g. `90days`, `12h`,
    /// `2w 3d` (the latest version of a (row, column) always stays).
    #[arg(
        long,
        value_name = "DURATION",
        env = "CELLGATE_PRUNE_OLDER_THAN",
        value_parser = parse_duration
    )]
    pub older_than: Option<Duration>,
    /// Count what would be deleted; delete nothing.
    #[arg(long, env = "CELLGATE_PRUNE_DRY_RUN")]
    pub dry_run: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("`{text}` is not a duration such as `30days` or `12h`: {e}"))
}

pub async fn run(args: CellsArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        CellsCommand::Prune(args) => prune(args).await,
    }
}

async fn prune(args: PruneArgs) -> anyhow::Result<ExitCode> {
    if args.keep.is_none() && args.older_than.is_none() {
        anyhow::bail!(
            "say which versions to delete: --keep N (keep the newest N of every row and column), \
             --older-than DURATION, or both"
        );
    }
    if args.keep == Some(0) {
        anyhow::bail!("--keep must be at least 1: the latest version of a cell always stays");
    }
    if args.older_than == Some(Duration::ZERO) {
        anyhow::bail!("--older-than must be longer than 0");
    }
    let created_before = match args.older_than {
        Some(age) => {
            let age = chrono::Duration::from_std(age)
                .map_err(|_| anyhow::anyhow!("--older-than is too long"))?;
            Some(
                chrono::Utc::now()
                    .checked_sub_signed(age)
                    .ok_or_else(|| anyhow::anyhow!("--older-than is too long"))?,
            )
        }
        None => None,
    };
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let options = PruneOptions {
        column: args.column.clone(),
        keep: args.keep,
        created_before,
        dry_run: args.dry_run,
    };
    let bar = progress_bar(&args.datastore, args.dry_run);
    let started = Instant::now();
    let mut on_progress = |p: &PruneProgress| {
        bar.set_length(u64::from(p.shards_total));
        bar.set_position(u64::from(p.shards_done));
        let rate = p.examined as f64 / started.elapsed().as_secs_f64().max(0.001);
        let verb = if args.dry_run { "to delete" } else { "deleted" };
        bar.set_message(format!("{rate:.0} cells/s, {} {verb}", p.deleted));
    };
    let result = store
        .prune_cells(&args.datastore, &options, &mut on_progress)
        .await;
    bar.finish_and_clear();
    let report = result.map_err(|e| {
        anyhow::anyhow!(
            "prune of `{}` stopped: {e}; what it deleted so far stays deleted, run it again to go on",
            args.datastore
        )
    })?;
    for line in report_lines(&report, created_before) {
        println!("{line}");
    }
    store.shutdown(Duration::from_secs(5)).await;
    Ok(ExitCode::SUCCESS)
}

fn progress_bar(datastore: &str, dry_run: bool) -> ProgressBar {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix} {bar:40} {pos}/{len} shards, {msg} ({eta})")
            .expect("static progress template")
            .progress_chars("=> "),
    );
    let what = if dry_run { "counting" } else { "pruning" };
    bar.set_prefix(format!("{what} {datastore}"));
    bar
}

/// The report as printed: a summary line, one line per column, and the
/// consumers that held cells back.
fn report_lines(
    report: &PruneReport,
    created_before: Option<chrono::DateTime<chrono::Utc>>,
) -> Vec<String> {
    let verb = if report.dry_run {
        "would delete"
    } else {
        "deleted"
    };
    let mut lines = vec![format!(
        "{}{}: {}, {} shards in {:.1} s ({} statements)",
        report.datastore,
        if report.dry_run { " (dry run)" } else { "" },
        counts_text(&report.total(), verb),
        report.shards,
        report.elapsed_ms as f64 / 1000.0,
        report.statements
    )];
    if let Some(before) = created_before {
        lines.push(format!(
            "  versions stored before {} could go",
            before.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
        ));
    }
    for (column, counts) in &report.columns {
        lines.push(format!("  {column}: {}", counts_text(counts, verb)));
    }
    for (consumer, cells) in &report.held_back_by {
        lines.push(format!(
            "  held back by consumer {consumer}: {cells} cells it has not read yet"
        ));
    }
    lines
}

fn counts_text(c: &PruneCounts, verb: &str) -> String {
    format!(
        "{} cells examined, {} {verb}, kept: {} latest, {} recent, {} for consumers, {} quarantined, {} buffered",
        c.examined,
        c.deleted,
        c.kept_latest,
        c.kept_recent,
        c.kept_for_consumers,
        c.kept_for_quarantine,
        c.kept_for_buffers
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse_with_units_and_refuse_the_rest() {
        assert_eq!(
            parse_duration("90days").unwrap(),
            Duration::from_secs(90 * 86_400)
        );
        assert_eq!(
            parse_duration("2w 3d").unwrap(),
            Duration::from_secs(17 * 86_400)
        );
        assert_eq!(parse_duration("12h").unwrap(), Duration::from_secs(43_200));
        let err = parse_duration("soon").unwrap_err();
        assert!(err.contains("`soon` is not a duration"), "{err}");
        assert!(parse_duration("12").is_err(), "a number needs a unit");
    }
}
