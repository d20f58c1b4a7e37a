//! `cellgate migrate --from-v1`: converts a store of the per-shard table
//! layout, with a progress bar over its shards (see `cellgate_store::upgrade`).

use std::io::IsTerminal as _;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::load_definitions;
use super::store_args::StoreArgs;

/// Converts the store of `args`; `false` when the definitions are invalid
/// (already printed). `migrate` then opens the converted store and
/// reports it as after any migration.
pub async fn run(args: &StoreArgs) -> anyhow::Result<bool> {
    let Some(defs) = load_definitions(&args.datastores, "--datastores")? else {
        return Ok(false);
    };
    let storage = args.storage()?;
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("converting shards {bar:40} {pos}/{len} ({eta})")
            .expect("static progress template")
            .progress_chars("=> "),
    );
    let result = cellgate_store::upgrade::convert_v1(defs, storage, |done, total| {
        bar.set_length(total);
        bar.set_position(done);
    })
    .await;
    bar.finish_and_clear();
    let summary =
        result.map_err(|e| anyhow::anyhow!("conversion stopped: {e}; run it again to continue"))?;
    println!(
        "converted {} shards: {} cells and {} buffered cells moved into the shard-keyed tables",
        summary.shards, summary.cells, summary.buffered
    );
    println!("indexes are rebuilt from the cell log when the gateway starts");
    Ok(true)
}
