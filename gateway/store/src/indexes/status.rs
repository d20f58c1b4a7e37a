//! The state of one index as the store serves it: its table version,
//! whether it is complete, and how a build is progressing.

use crate::topology::IndexRuntime;

/// The state of one index as the store serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexStatus {
    pub name: String,
    /// Version of its table; a new version is built when the index's
    /// fields or shard field change.
    pub version: u32,
    pub table: String,
    /// Complete and queryable (otherwise still being built).
    pub ready: bool,
    /// For the previous version of an index whose new version is being
    /// built: that version. It answers the queries it can answer until
    /// then. `None` for the current version.
    pub serves_until: Option<u32>,
    /// Cells still to apply while building.
    pub pending_cells: i64,
    /// While building: the log cells the build reads in all, done and
    /// pending (the log heads when last measured, once per cluster the
    /// index is written to; it grows with the writes during the build).
    /// `None` when ready or not measured yet.
    pub build_total_cells: Option<i64>,
    /// While building: cells applied per second over the last 10 s of
    /// measurements; `None` before two measurements.
    pub build_rate: Option<f64>,
    /// While building: seconds until the pending cells are applied at
    /// [`build_rate`](Self::build_rate); `None` while no rate is known.
    pub build_eta_seconds: Option<f64>,
}

impl IndexStatus {
    pub(crate) fn of(i: &IndexRuntime) -> IndexStatus {
        let ready = i.is_ready();
        // A ready index was caught up when it became ready; what it has
        // to apply since is index lag, not a build's.
        let pending_cells = if ready { 0 } else { i.pending() };
        let progress = i.build_progress();
        let building = !ready && progress.total() > 0;
        IndexStatus {
            name: i.def.name.clone(),
            version: i.version,
            table: i.table.clone(),
            ready,
            serves_until: i.serves_until(),
            pending_cells,
            build_total_cells: building.then(|| progress.total()),
            build_rate: progress.rate().filter(|_| building),
            build_eta_seconds: progress.eta_seconds(pending_cells).filter(|_| building),
        }
    }

    /// While building: the log cells applied so far.
    pub fn build_done_cells(&self) -> Option<i64> {
        self.build_total_cells
            .map(|total| (total - self.pending_cells).max(0))
    }
}
