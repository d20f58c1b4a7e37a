//! `cellgate index`: manage index tables.
//!
//! `status` shows each index's table version and state and, while one is
//! being built from the cell log, its progress (cells done of the total,
//! rate, ETA), measured from the store like the gateway's sweep; `--watch`
//! refreshes it until every index is ready. `drop` removes the table of an index whose file was removed, or of an
//! older version of an index whose fields changed (the gateway keeps such
//! tables and warns about them rather than dropping data on its own).
//! `quarantine list` shows the entries set aside after failing to apply,
//! `quarantine retry` applies them again. `verify` compares the indexes
//! with the entries their rows' latest cells give and reports every
//! mismatching key (exit status 3 on drift; 1 is an error, 2 a usage
//! error); `repair` (or `verify
//! --repair`) also fixes them, safely while gateways run. `explain` shows
//! how a query is answered (`explain.rs`).

use std::collections::BTreeMap;
use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cellgate_store::indexes::{Drift, VerifyOptions, VerifyProgress, VerifyReport};
use cellgate_store::IndexStatus;
use clap::{Args, Subcommand};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::store_args::StoreArgs;

#[derive(Debug, Args)]
pub struct IndexArgs {
    #[command(subcommand)]
    pub command: IndexCommand,
}

#[derive(Debug, Subcommand)]
pub enum IndexCommand {
    /// Show each index's table version and state, and the progress of
    /// those being built (cells done of the total, rate, ETA).
    Status(StatusArgs),
    /// Drop the table of an index that is no longer defined, or of an
    /// older version of one (`--index-version`), on every cluster.
    Drop(DropArgs),
    /// List or retry the index entries set aside in the quarantine.
    Quarantine(QuarantineArgs),
    /// Compare index entries with the cells they come from, both ways
    /// (missing, stale and extra entries); exit status 3 on drift.
    Verify(VerifyArgs),
    /// Verify, and fix exactly the drift found (as `verify --repair`).
    Repair(VerifyArgs),
    /// Show how an index query is answered: the version and shards read,
    /// the b-tree range, the conditions checked on each entry read
    /// (residual), the order, and each cluster's statement with the
    /// database's plan of it.
    Explain(super::explain::ExplainArgs),
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Only this datastore (default: all with indexes).
    #[arg(long, value_name = "DATASTORE")]
    pub datastore: Option<String>,
    /// Refresh every second until every index is ready.
    #[arg(long)]
    pub watch: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Only this datastore (default: all).
    #[arg(long, value_name = "DATASTORE")]
    pub datastore: Option<String>,
    /// Only this index (its `table` name); repeatable.
    #[arg(long, value_name = "INDEX")]
    pub index: Vec<String>,
    /// Only the rows of these shards: `N` or `FIRST-LAST`.
    #[arg(long, value_name = "RANGE", value_parser = parse_range)]
    pub shards: Option<(u32, u32)>,
    /// Only N shards picked at random (a quick check; not resumable, and
    /// entries of rows without cells are not looked for).
    #[arg(long, value_name = "N")]
    pub sample: Option<u32>,
    /// Fix the drift found, through the maintainer's guarded writes.
    #[arg(long)]
    pub repair: bool,
    /// Write every mismatching entry as a JSON line to FILE (appended to
    /// when a run resumes), then a summary line.
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Share of the time the run works (0 < F <= 1); it pauses after each
    /// chunk so foreground requests keep the databases.
    #[arg(long, value_name = "F", default_value_t = 0.5)]
    pub duty: f64,
    /// Start over instead of resuming an unfinished run of the same scope.
    #[arg(long)]
    pub restart: bool,
    /// Nice value of the run's thread and of its SQLite connections (-20
    /// to 19; Linux only): 19, the lowest priority, leaves the CPU to
    /// everything else on the machine, a gateway's requests first.
    #[arg(
        long,
        value_name = "N",
        default_value_t = 19,
        env = "CELLGATE_VERIFY_NICE",
        value_parser = clap::value_parser!(i32).range(-20..=19),
        allow_negative_numbers = true
    )]
    pub nice: i32,
    #[command(flatten)]
    pub store: StoreArgs,
}

fn parse_range(text: &str) -> Result<(u32, u32), String> {
    let number = |t: &str| {
        t.trim()
            .parse::<u32>()
            .map_err(|_| format!("`{text}` is not a shard range (N or FIRST-LAST)"))
    };
    match text.split_once('-') {
        Some((a, b)) => Ok((number(a)?, number(b)?)),
        None => {
            let n = number(text)?;
            Ok((n, n))
        }
    }
}

#[derive(Debug, Args)]
pub struct QuarantineArgs {
    #[command(subcommand)]
    pub command: QuarantineCommand,
}

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// Print the quarantined entries of a datastore, one per line.
    List(QuarantineTarget),
    /// Apply the quarantined entries again; those that succeed leave the
    /// quarantine.
    Retry(QuarantineTarget),
}

#[derive(Debug, Args)]
pub struct QuarantineTarget {
    /// The datastore.
    pub datastore: String,
    /// Only this index's entries.
    #[arg(long, value_name = "INDEX", env = "CELLGATE_INDEX")]
    pub index: Option<String>,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct DropArgs {
    /// The datastore.
    pub datastore: String,
    /// The index (its `table` name).
    pub index: String,
    /// Drop only this version of the index's table.
    #[arg(long, value_name = "N", env = "CELLGATE_INDEX_VERSION")]
    pub index_version: Option<u32>,
    /// Drop a version replaced less than a minute ago too: by default that
    /// is refused, since gateways that have not switched to the new version
    /// yet may still answer from it. Use when every gateway has restarted
    /// or reloaded since the switch.
    #[arg(long, env = "CELLGATE_INDEX_DROP_NOW")]
    pub now: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

pub async fn run(args: IndexArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        IndexCommand::Status(args) => status(args).await,
        IndexCommand::Drop(args) => drop(args).await,
        IndexCommand::Explain(args) => super::explain::explain(args).await,
        IndexCommand::Verify(args) => verify(args).await,
        IndexCommand::Repair(mut args) => {
            args.repair = true;
            verify(args).await
        }
        IndexCommand::Quarantine(QuarantineArgs {
            command: QuarantineCommand::List(target),
        }) => list(target).await,
        IndexCommand::Quarantine(QuarantineArgs {
            command: QuarantineCommand::Retry(target),
        }) => retry(target).await,
    }
}

/// How often `index status` measures while an index is building.
const STATUS_EVERY: Duration = Duration::from_secs(1);

async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let datastores: Vec<String> = match &args.datastore {
        Some(name) => vec![name.clone()],
        None => store
            .definitions()
            .datastores
            .iter()
            .filter(|ds| !ds.indexes.is_empty())
            .map(|ds| ds.name.clone())
            .collect(),
    };
    let measure = || async {
        let mut all = Vec::new();
        for datastore in &datastores {
            let indexes = store
                .measure_indexes(datastore)
                .await
                .map_err(|e| anyhow::anyhow!("cannot measure the indexes of `{datastore}`: {e}"))?;
            all.push((datastore.clone(), indexes));
        }
        anyhow::Ok(all)
    };
    let building = |all: &[(String, Vec<IndexStatus>)]| {
        all.iter()
            .any(|(_, indexes)| indexes.iter().any(|i| !i.ready))
    };
    let mut all = measure().await?;
    if building(&all) {
        // A second measurement gives the rate and the ETA.
        tokio::time::sleep(STATUS_EVERY).await;
        all = measure().await?;
    }
    if args.watch {
        let bars = MultiProgress::with_draw_target(if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        });
        let mut shown: BTreeMap<(String, String), ProgressBar> = BTreeMap::new();
        while building(&all) {
            for (datastore, indexes) in &all {
                for index in indexes.iter().filter(|i| !i.ready) {
                    let bar = shown
                        .entry((datastore.clone(), index.name.clone()))
                        .or_insert_with(|| bars.add(build_bar(datastore, index)));
                    update_bar(bar, index);
                    if bars.is_hidden() {
                        println!("{}", status_line(datastore, index));
                    }
                }
            }
            tokio::time::sleep(STATUS_EVERY).await;
            all = measure().await?;
        }
        for bar in shown.values() {
            bar.finish_and_clear();
        }
    }
    for (datastore, indexes) in &all {
        if indexes.is_empty() {
            println!("{datastore}: no indexes");
        }
        for index in indexes {
            println!("{}", status_line(datastore, index));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn build_bar(datastore: &str, index: &IndexStatus) -> ProgressBar {
    let bar = ProgressBar::hidden();
    bar.set_style(
        ProgressStyle::with_template("{prefix} {bar:40} {pos}/{len} cells, {msg}")
            .expect("static progress template")
            .progress_chars("=> "),
    );
    bar.set_prefix(format!(
        "building {datastore}.{} v{}",
        index.name, index.version
    ));
    bar
}

fn update_bar(bar: &ProgressBar, index: &IndexStatus) {
    bar.set_length(index.build_total_cells.unwrap_or(0).max(0) as u64);
    bar.set_position(index.build_done_cells().unwrap_or(0).max(0) as u64);
    bar.set_message(rate_text(index));
}

fn rate_text(index: &IndexStatus) -> String {
    match (index.build_rate, index.build_eta_seconds) {
        (Some(rate), Some(eta)) => format!("{rate:.0} cells/s, ETA {}", eta_text(eta)),
        (Some(rate), None) => format!("{rate:.0} cells/s, ETA unknown"),
        _ => "rate not measured yet".to_string(),
    }
}

fn eta_text(seconds: f64) -> String {
    let s = seconds.ceil() as u64;
    match s {
        0..=59 => format!("{s} s"),
        60..=3599 => format!("{} min {} s", s / 60, s % 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

fn status_line(datastore: &str, index: &IndexStatus) -> String {
    let head = format!(
        "{datastore}.{} v{} ({})",
        index.name, index.version, index.table
    );
    if let Some(building) = index.serves_until {
        return format!(
            "{head}: previous version, answers the queries it can answer until v{building} is ready"
        );
    }
    if index.ready {
        return format!("{head}: ready");
    }
    match (index.build_total_cells, index.build_done_cells()) {
        (Some(total), Some(done)) => format!(
            "{head}: building, {done}/{total} cells ({:.1} %), {} pending, {}",
            if total > 0 {
                done as f64 * 100.0 / total as f64
            } else {
                100.0
            },
            index.pending_cells,
            rate_text(index)
        ),
        _ => format!("{head}: building, {} cells pending", index.pending_cells),
    }
}

async fn list(target: QuarantineTarget) -> anyhow::Result<ExitCode> {
    let Some(store) = target.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let entries = store
        .quarantine(&target.datastore)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut shown = 0;
    for entry in &entries {
        if target.index.as_ref().is_some_and(|i| *i != entry.index) {
            continue;
        }
        shown += 1;
        println!(
            "{} {} shard {} added_id {} {} (last {}): {}",
            entry.index,
            entry.row_key,
            entry.shard,
            entry.added_id,
            entry.code,
            entry.last_seen.to_rfc3339(),
            entry.message
        );
    }
    println!("{shown} quarantined entries");
    Ok(ExitCode::SUCCESS)
}

async fn retry(target: QuarantineTarget) -> anyhow::Result<ExitCode> {
    let Some(store) = target.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let (applied, still) = store
        .retry_quarantine(&target.datastore, target.index.as_deref())
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("{applied} entries applied, {still} still quarantined");
    Ok(if still == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

async fn drop(args: DropArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let dropped = store
        .drop_index_with(&args.datastore, &args.index, args.index_version, !args.now)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    if dropped.is_empty() {
        println!(
            "nothing to drop: no table of index `{}` of `{}` is recorded",
            args.index, args.datastore
        );
    }
    for table in dropped {
        println!("dropped {table}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    if !(args.duty > 0.0 && args.duty <= 1.0) {
        anyhow::bail!("--duty must be within (0, 1], not {}", args.duty);
    }
    let Some(store) = args.store.open().await? else {
        return Ok(ExitCode::FAILURE);
    };
    let datastores: Vec<String> = match &args.datastore {
        Some(name) => vec![name.clone()],
        None => store
            .definitions()
            .datastores
            .iter()
            .filter(|ds| !ds.indexes.is_empty())
            .map(|ds| ds.name.clone())
            .collect(),
    };
    let mut report = match &args.report {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| anyhow::anyhow!("cannot open {}: {e}", path.display()))?,
        ),
        None => None,
    };
    let options = VerifyOptions {
        indexes: args.index.clone(),
        shards: args.shards,
        sample: args.sample,
        repair: args.repair,
        duty: args.duty,
        restart: args.restart,
        nice: Some(args.nice),
    };
    let mut drift_total = 0u64;
    let mut unrepaired = 0u64;
    for datastore in &datastores {
        let bar = progress_bar(datastore);
        let started = Instant::now();
        let mut write_error = None;
        let mut on_progress = |p: &VerifyProgress| {
            bar.set_length(u64::from(p.shards_total));
            bar.set_position(u64::from(p.shards_done));
            let rate = p.rows as f64 / started.elapsed().as_secs_f64().max(0.001);
            bar.set_message(format!("{rate:.0} rows/s, {} drift", p.drift()));
        };
        let mut on_drift = |d: &Drift| {
            if let Some(file) = report.as_mut() {
                let line = serde_json::to_string(d).expect("a drift serializes");
                if let Err(err) = writeln!(file, "{line}") {
                    write_error.get_or_insert(err);
                }
            }
            bar.suspend(|| println!("{}", drift_line(datastore, d)));
        };
        // Ctrl-C stops the run where its last chunk was recorded, and
        // gives its lease up, so the same command resumes at once.
        let result = tokio::select! {
            result = store.verify_indexes(datastore, &options, &mut on_progress, &mut on_drift) => {
                Some(result)
            }
            _ = tokio::signal::ctrl_c() => None,
        };
        bar.finish_and_clear();
        let Some(result) = result else {
            store.shutdown(Duration::from_secs(2)).await;
            eprintln!("verify of `{datastore}` interrupted; run it again to resume");
            return Ok(ExitCode::from(130));
        };
        if let Some(err) = write_error {
            anyhow::bail!("cannot write the report: {err}");
        }
        let summary = result.map_err(|e| {
            anyhow::anyhow!("verify of `{datastore}` stopped: {e}; run it again to resume")
        })?;
        println!("{}", summary_line(&summary));
        if let Some(file) = report.as_mut() {
            let line = serde_json::json!({ "summary": summary });
            writeln!(file, "{line}")
                .map_err(|e| anyhow::anyhow!("cannot write the report: {e}"))?;
        }
        drift_total += summary.progress.drift();
        unrepaired += summary.progress.drift() - summary.progress.repaired;
    }
    Ok(if unrepaired > 0 || (drift_total > 0 && !args.repair) {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    })
}

fn progress_bar(datastore: &str) -> ProgressBar {
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
    bar.set_prefix(format!("verifying {datastore}"));
    bar
}

fn drift_line(datastore: &str, d: &Drift) -> String {
    format!(
        "{} {datastore}/{} row {} (shard {}) on cluster {}{}",
        d.kind.as_str(),
        d.index,
        d.row_key,
        d.shard,
        d.cluster,
        if d.repaired { ": repaired" } else { "" }
    )
}

fn summary_line(r: &VerifyReport) -> String {
    let p = &r.progress;
    let resumed = r
        .resumed_from
        .map(|s| format!(" (resumed at shard {s})"))
        .unwrap_or_default();
    format!(
        "{}: {} of {} shards{resumed}, {} rows compared, {} cells read, {} missing, {} stale, \
         {} extra, {} repaired, {} pending (not yet applied), {} unreadable, in {:.1} s",
        r.datastore,
        p.shards_done,
        p.shards_total,
        p.rows,
        p.cells,
        p.missing,
        p.stale,
        p.extra,
        p.repaired,
        p.pending,
        p.unreadable,
        r.elapsed_ms as f64 / 1000.0
    )
}
