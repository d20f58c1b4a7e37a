//! `cellgate shard`: where a datastore's shards live, and moving them.
//!
//! `move` copies a shard range to another cluster while the gateways keep
//! serving it, then switches every gateway to the new map and cleans the
//! source (the phases are in the `cellgate_store::moves` docs). A move that
//! was interrupted (Ctrl-C, a crash, a kill) is resumed by running the same
//! command again; `--abort` undoes one that has not switched yet, and a
//! move kept with `--keep-source` is undone by moving the range back.
//! `status` prints the stored topology and the move in progress.

use std::io::IsTerminal;
use std::process::ExitCode;

use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use cellgate_store::moves::{MoveOptions, MoveProgress, MoveReport, Phase};
use cellgate_store::{Store, StoreOptions};

use super::load_definitions;
use super::store_args::StoreArgs;

#[derive(Debug, Args)]
pub struct ShardArgs {
    #[command(subcommand)]
    pub command: ShardCommand,
}

#[derive(Debug, Subcommand)]
pub enum ShardCommand {
    /// Move a shard range to another cluster, online (or resume, or abort,
    /// the move recorded for it).
    Move(MoveArgs),
    /// Print where each shard range lives (the stored topology) and the
    /// move in progress.
    Status(StatusArgs),
    /// Double the clusters of a datastore: move the upper half of each
    /// cluster's shard range to a new cluster, one move after another
    /// (seed 004's 8 → 16). Run it again to resume.
    Double(DoubleArgs),
}

#[derive(Debug, Args)]
pub struct DoubleArgs {
    /// The datastore.
    #[arg(long, value_name = "NAME", env = "CELLGATE_DATASTORE")]
    pub datastore: String,
    /// The new clusters, comma-separated, one per cluster holding shards
    /// now, in the order of their shard ranges.
    #[arg(long, value_name = "CLUSTERS", value_delimiter = ',', required = true)]
    pub to: Vec<String>,
    /// Print the moves and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Cells per copy statement.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub chunk: usize,
    /// Share of the time the copy, the verify and the cleanup work
    /// (0 < F <= 1): they pause after each chunk so the gateways' requests
    /// keep the databases. The cut-over itself never pauses.
    #[arg(long, value_name = "F", default_value_t = 0.5, value_parser = parse_duty)]
    pub duty: f64,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The datastore.
    #[arg(long, value_name = "NAME", env = "CELLGATE_DATASTORE")]
    pub datastore: String,
    /// The shard range, `FIRST-LAST` (inclusive), all on one cluster now.
    #[arg(long, value_name = "FIRST-LAST", value_parser = parse_range)]
    pub shards: (u32, u32),
    /// The cluster to move them to (a name from `storage.clusters`).
    #[arg(long, value_name = "CLUSTER")]
    pub to: String,
    /// Print the plan (source, cells to copy, where a recorded move
    /// resumes) and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Stop before deleting the source's copy: the range can then be moved
    /// back cheaply; run the move again without this flag to clean up.
    #[arg(long)]
    pub keep_source: bool,
    /// Undo the recorded move of this range, if it has not switched yet.
    #[arg(long, conflicts_with_all = ["dry_run", "keep_source"])]
    pub abort: bool,
    /// Cells per copy statement.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub chunk: usize,
    /// Share of the time the copy, the verify and the cleanup work
    /// (0 < F <= 1): they pause after each chunk so the gateways' requests
    /// keep the databases. The cut-over itself never pauses.
    #[arg(long, value_name = "F", default_value_t = 0.5, value_parser = parse_duty)]
    pub duty: f64,
    /// Skip the index verify (and repair) after the switch.
    #[arg(long)]
    pub no_index_verify: bool,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The datastore.
    #[arg(long, value_name = "NAME", env = "CELLGATE_DATASTORE")]
    pub datastore: String,
    #[command(flatten)]
    pub store: StoreArgs,
}

fn parse_duty(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(duty) if duty > 0.0 && duty <= 1.0 => Ok(duty),
        _ => Err(format!("must be a number within (0, 1], not `{text}`")),
    }
}

fn parse_range(text: &str) -> Result<(u32, u32), String> {
    let (a, b) = text
        .split_once('-')
        .ok_or_else(|| format!("`{text}`: expected FIRST-LAST, e.g. 0-1023"))?;
    let first = a
        .trim()
        .parse()
        .map_err(|_| format!("`{a}` is not a shard number"))?;
    let last = b
        .trim()
        .parse()
        .map_err(|_| format!("`{b}` is not a shard number"))?;
    if first > last {
        return Err(format!("`{text}`: the first shard is after the last"));
    }
    Ok((first, last))
}

pub async fn run(args: ShardArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        ShardCommand::Move(args) => move_shards(args).await,
        ShardCommand::Status(args) => status(args).await,
        ShardCommand::Double(args) => double(args).await,
    }
}

/// Opens the store as a mover: no index maintenance, no buffer replay, and
/// not counted among the gateways a cut-over waits for.
async fn open(args: &StoreArgs) -> anyhow::Result<Option<Store>> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(None);
    };
    let mut options = StoreOptions::new(args.storage()?);
    options.maintain_indexes = false;
    options.replay_buffers = false;
    options.require_all_clusters = true;
    options.follow_topology = false;
    let store = Store::open(defs, options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot open storage: {e}"))?;
    Ok(Some(store))
}

async fn move_shards(args: MoveArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = open(&args.store).await? else {
        return Ok(ExitCode::FAILURE);
    };
    if args.abort {
        let record = store
            .abort_move(&args.datastore)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        println!(
            "aborted the move of shards {}-{} of {} from {} to {} (was at phase {}); the shards stay on {}",
            record.first,
            record.last,
            args.datastore,
            record.source,
            record.target,
            record.phase.name(),
            record.source
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut options = MoveOptions::new(&args.datastore, args.shards, &args.to);
    options.dry_run = args.dry_run;
    options.keep_source = args.keep_source;
    options.chunk = args.chunk.max(1);
    options.duty = args.duty;
    options.verify_indexes = !args.no_index_verify;
    let bar = progress_bar();
    let mut shown: Option<Phase> = None;
    let mut on_progress = |p: &MoveProgress| {
        if shown != Some(p.phase) {
            shown = Some(p.phase);
            bar.set_position(0);
            bar.set_message(p.phase.name());
        }
        bar.set_length(p.total.max(p.done));
        bar.set_position(p.done);
    };
    let moved = tokio::select! {
        moved = store.move_shards(&options, &mut on_progress) => moved,
        _ = tokio::signal::ctrl_c() => {
            bar.abandon();
            eprintln!("interrupted: the move stays recorded; run the same command to resume it{}", if args.dry_run { "" } else { " (or `--abort` before the switch)" });
            store.shutdown(std::time::Duration::from_secs(5)).await;
            return Ok(ExitCode::from(130));
        }
    };
    bar.finish_and_clear();
    let report = moved.map_err(|e| anyhow::anyhow!("{e}"))?;
    for line in report_lines(&report, args.dry_run) {
        println!("{line}");
    }
    store.shutdown(std::time::Duration::from_secs(5)).await;
    Ok(ExitCode::SUCCESS)
}

fn report_lines(r: &MoveReport, dry_run: bool) -> Vec<String> {
    let p = &r.plan;
    let mut lines = vec![format!(
        "{} shards {}-{}: {} → {}, {} cells on the source{}{}",
        p.datastore,
        p.shards.0,
        p.shards.1,
        p.source,
        p.target,
        p.cells,
        if p.new_target {
            ", new cluster for this datastore"
        } else {
            ""
        },
        p.resumes_at
            .map(|ph| format!(", resuming at phase {}", ph.name()))
            .unwrap_or_default()
    )];
    if dry_run {
        lines.push("dry run: nothing changed".into());
        return lines;
    }
    let phases: Vec<String> = r
        .phases
        .iter()
        .map(|(ph, d)| format!("{} {:.2} s", ph.name(), d.as_secs_f64()))
        .collect();
    lines.push(format!(
        "copied {} cells and {} index entries; {} shards verified, {} index entries repaired; in {:.1} s ({})",
        r.cells_copied,
        r.entries_copied,
        r.verified_shards,
        r.index_drift,
        r.elapsed.as_secs_f64(),
        phases.join(", ")
    ));
    if let Some(pause) = r.write_pause {
        lines.push(format!(
            "writes to the range waited {:.0} ms at the cut-over",
            pause.as_secs_f64() * 1000.0
        ));
    }
    let kept = r.phases.iter().all(|(ph, _)| *ph != Phase::Cleanup);
    if kept && r.phases.iter().any(|(ph, _)| *ph == Phase::Verify) {
        lines.push(format!(
            "the source's copy is kept: run again without --keep-source to delete it, or move the shards back with --to {}",
            p.source
        ));
    }
    lines
}

async fn status(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = open(&args.store).await? else {
        return Ok(ExitCode::FAILURE);
    };
    let status = store
        .topology_status(&args.datastore)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("{} topology version {}", status.datastore, status.version);
    for (first, last, cluster) in &status.ranges {
        println!("  shards {first}-{last} on {cluster}");
    }
    match &status.moving {
        Some(m) => println!(
            "moving shards {}-{} from {} to {}: phase {}{}, started {}",
            m.first,
            m.last,
            m.source,
            m.target,
            m.phase.name(),
            if m.keep_source { " (source kept)" } else { "" },
            m.started_at.to_rfc3339()
        ),
        None => println!("no move in progress"),
    }
    Ok(ExitCode::SUCCESS)
}

/// The moves that double the clusters of `ranges` onto `to`: the upper
/// half of each source cluster's range, in shard order. A range that is on
/// its new cluster already is left out (a doubling run again resumes).
fn doubling_moves(
    ranges: &[(u32, u32, String)],
    to: &[String],
) -> anyhow::Result<Vec<((u32, u32), String)>> {
    // Each cluster's one contiguous range, in shard order.
    let mut owners: Vec<(u32, u32, String)> = Vec::new();
    for (first, last, cluster) in ranges {
        match owners.last_mut() {
            Some(last_range) if last_range.2 == *cluster && last_range.1 + 1 == *first => {
                last_range.1 = *last
            }
            _ => owners.push((*first, *last, cluster.clone())),
        }
    }
    // Ranges already moved by an earlier run are pairs `(source, target)`
    // next to each other: fold them back into their source's range.
    let mut sources: Vec<(u32, u32, String)> = Vec::new();
    for (first, last, cluster) in owners {
        if to.contains(&cluster) {
            match sources.last_mut() {
                Some(source) if source.1 + 1 == first => source.1 = last,
                _ => anyhow::bail!("shards {first}-{last} are on `{cluster}`, a new cluster, but not next to a range they came from"),
            }
        } else {
            sources.push((first, last, cluster));
        }
    }
    if sources.len() != to.len() {
        anyhow::bail!(
            "{} clusters hold shards ({}) but {} new clusters were given",
            sources.len(),
            sources
                .iter()
                .map(|s| s.2.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            to.len()
        );
    }
    let mut moves = Vec::new();
    for ((first, last, source), target) in sources.iter().zip(to) {
        if first == last {
            anyhow::bail!("cluster `{source}` holds one shard ({first}); it cannot be halved");
        }
        let upper = (first + (last - first).div_ceil(2), *last);
        let done = ranges
            .iter()
            .any(|(a, b, c)| c == target && *a == upper.0 && *b == upper.1);
        if !done {
            moves.push((upper, target.clone()));
        }
    }
    Ok(moves)
}

async fn double(args: DoubleArgs) -> anyhow::Result<ExitCode> {
    let Some(store) = open(&args.store).await? else {
        return Ok(ExitCode::FAILURE);
    };
    let status = store
        .topology_status(&args.datastore)
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let moves = doubling_moves(&status.ranges, &args.to)?;
    if moves.is_empty() {
        println!(
            "{}: every cluster's upper half is on its new cluster already",
            args.datastore
        );
        return Ok(ExitCode::SUCCESS);
    }
    for ((first, last), target) in &moves {
        println!("move {} shards {first}-{last} to {target}", args.datastore);
    }
    if args.dry_run {
        println!("dry run: nothing changed");
        return Ok(ExitCode::SUCCESS);
    }
    for (shards, target) in moves {
        let mut options = MoveOptions::new(&args.datastore, shards, &target);
        options.chunk = args.chunk.max(1);
        options.duty = args.duty;
        let bar = progress_bar();
        let mut on_progress = |p: &MoveProgress| {
            bar.set_message(format!(
                "{}-{} → {target}: {}",
                shards.0,
                shards.1,
                p.phase.name()
            ));
            bar.set_length(p.total.max(p.done));
            bar.set_position(p.done);
        };
        let moved = tokio::select! {
            moved = store.move_shards(&options, &mut on_progress) => moved,
            _ = tokio::signal::ctrl_c() => {
                bar.abandon();
                eprintln!("interrupted: run the same command to resume");
                store.shutdown(std::time::Duration::from_secs(5)).await;
                return Ok(ExitCode::from(130));
            }
        };
        bar.finish_and_clear();
        let report = moved.map_err(|e| anyhow::anyhow!("{e}"))?;
        for line in report_lines(&report, false) {
            println!("{line}");
        }
    }
    store.shutdown(std::time::Duration::from_secs(5)).await;
    Ok(ExitCode::SUCCESS)
}

fn progress_bar() -> ProgressBar {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("moving {msg} {bar:40} {pos}/{len} ({eta})")
            .expect("static progress template")
            .progress_chars("=> "),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::doubling_moves;

    fn ranges(spec: &[(u32, u32, &str)]) -> Vec<(u32, u32, String)> {
        spec.iter()
            .map(|(a, b, c)| (*a, *b, c.to_string()))
            .collect()
    }

    #[test]
    fn doubling_moves_each_upper_half_and_skips_what_moved() {
        let to = vec!["c".to_string(), "d".to_string()];
        let start = ranges(&[(0, 2047, "a"), (2048, 4095, "b")]);
        assert_eq!(
            doubling_moves(&start, &to).unwrap(),
            vec![((1024, 2047), "c".into()), ((3072, 4095), "d".into())]
        );
        // After the first move, a rerun does the second only.
        let half = ranges(&[(0, 1023, "a"), (1024, 2047, "c"), (2048, 4095, "b")]);
        assert_eq!(
            doubling_moves(&half, &to).unwrap(),
            vec![((3072, 4095), "d".into())]
        );
        let done = ranges(&[
            (0, 1023, "a"),
            (1024, 2047, "c"),
            (2048, 3071, "b"),
            (3072, 4095, "d"),
        ]);
        assert!(doubling_moves(&done, &to).unwrap().is_empty());
        // One new cluster per cluster holding shards.
        assert!(doubling_moves(&start, &to[..1])
            .unwrap_err()
            .to_string()
            .contains("2 clusters hold shards (a, b) but 1 new clusters were given"));
    }
}
