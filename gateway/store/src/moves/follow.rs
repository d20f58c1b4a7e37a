//! Following the stored topology: every gateway with more than one cluster
//! reads `cellgate_topology` on the metadata cluster every [`POLL`]
//! (every [`FAST_POLL`] while a move's cut-over is near, and at once when a
//! write meets a moving shard), serves each new version, and acknowledges
//! the version it serves (`stored.rs`).
//!
//! Serving a version swaps the datastore's shard maps (`Routes::set`):
//! requests route by the new map from then on, whatever definitions they
//! are pinned to. When the *work* map changed (which cluster's workers
//! follow a shard's log), index maintenance of the datastore is paused and
//! resumed on the new map before the version is acknowledged, so a passes
//! still running on the old map have ended by then; trigger workers
//! realign their leases on their next round.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::stored::{self, Stored};
use crate::error::Result;
use crate::indexes::maintainer::{self, Maintainer};
use crate::topology::{DatastoreRuntime, Topology, FENCE_AFTER};

/// How often a gateway reads the stored topology.
pub(crate) const POLL: Duration = Duration::from_millis(500);

/// How often while a cut-over is near.
pub(crate) const FAST_POLL: Duration = Duration::from_millis(10);

/// How long an acknowledgement lasts unless renewed: a gateway that stops
/// without withdrawing holds up a move's cut-over this long at most.
pub(crate) const ACK_TTL: Duration = Duration::from_secs(10);

/// Serves the versions of `stored` that differ from the ones served now.
/// Returns whether any changed.
pub(crate) async fn serve(
    topology: &Arc<Topology>,
    maintainer: Option<&Arc<Maintainer>>,
    rows: &[Stored],
) -> Result<bool> {
    let names: Vec<String> = topology.clusters.iter().map(|c| c.name.clone()).collect();
    let mut changed = false;
    for ds in topology.datastores_sorted() {
        let Some(row) = rows.iter().find(|r| r.datastore == ds.name()) else {
            continue;
        };
        if row.version == ds.routes.version() {
            continue;
        }
        apply(topology, maintainer, &ds, row, &names).await?;
        changed = true;
    }
    Ok(changed)
}

async fn apply(
    topology: &Arc<Topology>,
    maintainer: Option<&Arc<Maintainer>>,
    ds: &Arc<DatastoreRuntime>,
    row: &Stored,
    names: &[String],
) -> Result<()> {
    let map = stored::parse_map(&row.ranges, ds.def.shards, names)?;
    let work = stored::parse_map(&row.work, ds.def.shards, names)?;
    let work_changed = *ds.work_map() != work;
    let was = ds.routes.version();
    ds.routes.set_moving(row.moving.clone());
    ds.routes.set(row.version, map, work);
    if work_changed {
        if let Some(maintainer) = maintainer {
            maintainer::pause(maintainer, ds.name()).await;
            maintainer::resume(topology, maintainer, ds).await;
        }
    }
    if was != 0 {
        tracing::info!(datastore = %ds.name(), version = row.version, ranges = %row.ranges, moving = ?row.moving.as_ref().map(|m| m.phase), "serving a new topology version");
    }
    Ok(())
}

/// The follower task of a store (see the module doc); ends when the store
/// is dropped or shut down, withdrawing its acknowledgements.
pub(crate) async fn follow(
    topology: Weak<Topology>,
    maintainer: Arc<Maintainer>,
    holder: String,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut acked = Acked::default();
    let mut failing = false;
    loop {
        let Some(topology) = topology.upgrade() else {
            return;
        };
        let fast = match round(&topology, &maintainer, &holder, &mut acked).await {
            Ok(fast) => {
                if failing {
                    tracing::info!("the stored topology can be read again");
                }
                failing = false;
                fast
            }
            Err(err) => {
                if !failing {
                    tracing::warn!(error = %err, "cannot read the stored topology; serving the last version read, checked against the clusters before each read once {} s have passed", FENCE_AFTER.as_secs());
                }
                failing = true;
                false
            }
        };
        let wait = if fast { FAST_POLL } else { POLL };
        tokio::select! {
            _ = topology.moves.poke.notified() => {}
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => {
                let names: Vec<String> = topology.datastores_sorted().iter().map(|d| d.name().to_string()).collect();
                if let Ok(meta) = topology.clusters[0].maintenance() {
                    stored::withdraw(meta.as_ref(), &holder, &names).await;
                }
                return;
            }
        }
    }
}

/// The (datastore, version) pairs served now.
fn served(topology: &Topology) -> Vec<(String, i64)> {
    topology
        .datastores_sorted()
        .iter()
        .map(|ds| (ds.name().to_string(), ds.routes.version()))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// The versions acknowledged last, and when.
#[derive(Default)]
struct Acked {
    versions: Vec<(String, i64)>,
    at: Option<Instant>,
}

/// One read of the stored topology; whether a cut-over is near.
async fn round(
    topology: &Arc<Topology>,
    maintainer: &Arc<Maintainer>,
    holder: &str,
    acked: &mut Acked,
) -> Result<bool> {
    // Background work: on the maintenance connections, not the requests'.
    let meta = topology.clusters[0].maintenance()?.clone();
    let rows = stored::read_all(meta.as_ref()).await?;
    serve(topology, Some(maintainer), &rows).await?;
    let mut versions = served(topology);
    let due = acked.at.is_none_or(|at| at.elapsed() >= ACK_TTL / 3);
    if due || versions != acked.versions {
        let lapsed = topology.moves.stale().is_some();
        let sent = Instant::now();
        stored::acknowledge(meta.as_ref(), holder, &versions, ACK_TTL).await?;
        if lapsed {
            // Without an acknowledgement in force (the first one, or one
            // that expired), this gateway was passed by: a move may have
            // published versions after the read above. Read again now
            // that movers wait for it, before its routes are trusted.
            let rows = stored::read_all(meta.as_ref()).await?;
            serve(topology, Some(maintainer), &rows).await?;
            let now = served(topology);
            if now != versions {
                stored::acknowledge(meta.as_ref(), holder, &now, ACK_TTL).await?;
                versions = now;
            }
        }
        topology.moves.acknowledged(sent);
        *acked = Acked {
            versions,
            at: Some(sent),
        };
    }
    Ok(rows.iter().any(|r| r.cutover))
}
