//! Readiness of indexes being built: an index becomes queryable the first
//! time every cluster of its datastore reports it caught up (no further
//! behind than the ready indexes), from a sweep or, at start-up, from a
//! measurement.

use crate::error::Result;
use crate::indexes::apply::{self};
use crate::indexes::lag::{self, ClusterLag};
use crate::topology::{DatastoreRuntime, Topology};

use super::*;

/// Marks the building indexes of `ds` ready once every cluster's latest
/// sweep shows them caught up.
pub(super) async fn mark_ready_indexes(
    topology: &Topology,
    shared: &Maintainer,
    ds: &DatastoreRuntime,
) {
    let consumers = apply::consumers(topology, ds);
    let caught_up: Vec<(usize, i64, Option<i64>, bool, bool)> = {
        let lag = shared.lag.lock().expect("lag");
        ds.indexes
            .iter()
            .enumerate()
            .filter(|(_, i)| !i.is_ready())
            .map(|(position, _)| {
                let mut pending = 0;
                // The log cells the index's consumers read in all: each
                // cluster's log once per consumer (target cluster).
                let mut total = Some(0);
                let mut complete = true;
                // As fresh as the live indexes: on every cluster and for
                // every target, no more cells to apply than the ready
                // indexes writing to that target have in the same
                // measurement (none, without ready indexes).
                let mut as_fresh = true;
                for cluster in ds.work_map().clusters() {
                    match lag.get(&(ds.name().to_string(), cluster)) {
                        None => {
                            complete = false;
                            total = None;
                        }
                        Some(l) => {
                            let at = |c: usize| l.pending_by_consumer.get(c).copied().unwrap_or(0);
                            let live = |target: usize| {
                                consumers
                                    .iter()
                                    .enumerate()
                                    .filter(|(_, other)| {
                                        other.target == target && ds.indexes[other.index].is_ready()
                                    })
                                    .map(|(c, _)| at(c))
                                    .max()
                                    .unwrap_or(0)
                            };
                            for (c, consumer) in consumers.iter().enumerate() {
                                if consumer.index == position {
                                    pending += at(c);
                                    as_fresh &= at(c) <= live(consumer.target);
                                    total = total.zip(l.log_cells).map(|(t, n)| t + n);
                                }
                            }
                        }
                    }
                }
                (position, pending, total, complete, as_fresh)
            })
            .collect()
    };
    for (position, pending, total, complete, as_fresh) in caught_up {
        let index = &ds.indexes[position];
        if index.is_ready() {
            // Marked ready meanwhile, from a newer measurement (a sweep
            // and `Store::measure_indexes` can overlap).
            continue;
        }
        let was_building = index.pending() > 0;
        match total {
            Some(total) => index.set_build_progress(pending, total),
            None => index.set_pending(pending),
        }
        // Caught up: nothing left to apply; or, since under steady writes
        // a build is never at 0, every cell the log held when the build
        // was first measured applied and as fresh as the live indexes
        // (from then on it is maintained as one of them).
        let ready =
            complete && (pending == 0 || (as_fresh && index.build_progress().passed_its_start()));
        if ready {
            match crate::catalog::mark_ready(topology, ds, index).await {
                Ok(()) => {
                    index.set_ready();
                    if was_building {
                        tracing::info!(datastore = %ds.name(), index = %index.def.name, version = index.version, "index built and ready");
                    } else {
                        tracing::debug!(datastore = %ds.name(), index = %index.def.name, version = index.version, "index ready");
                    }
                }
                Err(err) => {
                    tracing::warn!(datastore = %ds.name(), index = %index.def.name, error = %err, "cannot record a ready index yet")
                }
            }
        } else {
            let (total, rate) = {
                let progress = index.build_progress();
                (progress.total(), progress.rate().map(|r| r.round() as i64))
            };
            tracing::info!(datastore = %ds.name(), index = %index.def.name, pending, total, rate = ?rate, "index building");
        }
    }
}

/// The lag of every cluster of `ds`, measured now.
pub(crate) async fn measure(
    topology: &Topology,
    ds: &DatastoreRuntime,
) -> Result<Vec<(usize, ClusterLag)>> {
    let consumers = apply::consumers(topology, ds);
    let mut out = Vec::new();
    for cluster in ds.work_map().clusters() {
        let backend = topology.clusters[cluster].master()?;
        out.push((
            cluster,
            lag::measure(backend.as_ref(), ds, &consumers).await?.0,
        ));
    }
    Ok(out)
}

/// Marks the indexes of every datastore ready that are caught up now; used
/// at start-up so a fresh store's indexes are queryable at once.
pub(crate) async fn check_ready(topology: &Topology, shared: &Maintainer) {
    for ds in topology.datastores_sorted() {
        check_ready_datastore(topology, shared, &ds).await;
    }
}

/// [`check_ready`] for one datastore.
pub(crate) async fn check_ready_datastore(
    topology: &Topology,
    shared: &Maintainer,
    ds: &DatastoreRuntime,
) {
    if ds.indexes.iter().all(|i| i.is_ready()) {
        return;
    }
    let _ = measure_datastore(topology, shared, ds).await;
}

/// Measures the lag of `ds` on every cluster now, publishes it, records
/// the progress of its building indexes and marks those caught up ready.
pub(crate) async fn measure_datastore(
    topology: &Topology,
    shared: &Maintainer,
    ds: &DatastoreRuntime,
) -> Result<()> {
    let measured = measure(topology, ds).await?;
    {
        let mut lag = shared.lag.lock().expect("lag");
        for (cluster, l) in measured {
            lag.insert((ds.name().to_string(), cluster), l);
        }
    }
    mark_ready_indexes(topology, shared, ds).await;
    Ok(())
}
