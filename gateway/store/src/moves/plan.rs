//! A move's plan: the options checked against the stored topology, the
//! source of the range found, and where a recorded move resumes.

use super::*;

/// Checks the options against the stored topology and finds the source.
pub(super) async fn plan(
    topology: &Topology,
    ds: &DatastoreRuntime,
    row: &Stored,
    options: &MoveOptions,
) -> Result<MovePlan> {
    let (first, last) = options.shards;
    if first > last || last >= ds.def.shards {
        return Err(Error::Move(format!(
            "shard range {first}-{last} is not within 0-{} of `{}`",
            ds.def.shards - 1,
            ds.name()
        )));
    }
    cluster_index(topology, &options.target)?;
    let resumes_at = match &row.moving {
        Some(m) if (m.first, m.last) == options.shards && m.target == options.target => {
            if m.phase == Phase::Done && m.keep_source && !options.keep_source {
                Some(Phase::Cleanup)
            } else {
                Some(m.phase)
            }
        }
        // Moving a kept range back: the kept move ends without cleanup.
        Some(m)
            if m.phase == Phase::Done
                && (m.first, m.last) == options.shards
                && m.source == options.target =>
        {
            None
        }
        Some(m) => {
            return Err(Error::Move(format!(
                "a move of shards {}-{} of `{}` from `{}` to `{}` is recorded at phase `{}`; resume it (same shards and target){} before another",
                m.first,
                m.last,
                ds.name(),
                m.source,
                m.target,
                m.phase.name(),
                if m.phase <= Phase::Fence { " or abort it with `--abort`" } else { "" }
            )))
        }
        None => None,
    };
    let (source, new_target) = match (&row.moving, resumes_at) {
        (Some(m), Some(_)) => (m.source.clone(), false),
        _ => {
            let map = ds.map();
            let owner = map.cluster_of(first);
            if (first..=last).any(|s| map.cluster_of(s) != owner) {
                return Err(Error::Move(format!(
                    "shards {first}-{last} of `{}` live on more than one cluster now; move one cluster's range at a time (`cellgate shard status`)",
                    ds.name()
                )));
            }
            let source = topology.clusters[owner].name.clone();
            if source == options.target {
                return Err(Error::Move(format!(
                    "shards {first}-{last} of `{}` are on `{source}` already",
                    ds.name()
                )));
            }
            let target = cluster_index(topology, &options.target)?;
            (source, !map.clusters().contains(&target))
        }
    };
    let source_backend = topology.clusters[cluster_index(topology, &source)?].master()?;
    let cells = copy::counters(source_backend.as_ref(), ds.name(), first, last)
        .await?
        .values()
        .map(|n| (n.abs() - 1).max(0) as u64)
        .sum();
    let new_target = match (&row.moving, resumes_at) {
        (Some(_), Some(_)) => {
            let target = cluster_index(topology, &options.target)?;
            let work = ds.work_map();
            // While the range is still worked on the source, the target's
            // other shards say whether it was new.
            !(0..ds.def.shards)
                .filter(|s| !(first..=last).contains(s))
                .any(|s| work.cluster_of(s) == target)
        }
        _ => new_target,
    };
    Ok(MovePlan {
        datastore: ds.name().to_string(),
        shards: options.shards,
        source,
        target: options.target.clone(),
        cells,
        new_target,
        resumes_at,
    })
}
