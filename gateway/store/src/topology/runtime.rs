//! The runtimes of the definitions served: each datastore's definition
//! with its routes, index versions and counters, and each index's table
//! version, readiness and build progress; and the names the log consumers
//! keep their offsets under.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use index_dsl::{Datastore, Index};

use super::routes::Routes;
use crate::error::{Error, Result};
use crate::shards::ShardMap;
use crate::storage::ddl;

/// One index as the store maintains and serves it: its definition, the
/// version of its table, and whether that table is complete.
pub(crate) struct IndexRuntime {
    pub(crate) def: Arc<Index>,
    /// Version of the table (`<ds>_ix_<index>` is 1, then `_v2`, …): a new
    /// version is built when the index's fields or shard field change.
    pub(crate) version: u32,
    pub(crate) table: String,
    /// A digest of the definition parts that shape the table.
    pub(crate) signature: String,
    ready: AtomicBool,
    /// For the previous version of an index whose new version is being
    /// built: that new version (0 for a current version). It stays
    /// maintained and answers the queries it can answer until the new one
    /// is ready (`indexes/query.rs`), then is retired (`reload::retire`).
    serves_until: AtomicU32,
    /// Cells still to apply while building, for the error message.
    pending: AtomicI64,
    /// How far a build has come, from the measurements so far.
    progress: std::sync::Mutex<BuildProgress>,
}

/// How long the samples behind a build's rate reach back.
pub(crate) const RATE_WINDOW: std::time::Duration = std::time::Duration::from_secs(10);

/// The progress of an index build: the log cells its consumers have to
/// read in all (the log heads when measured, once per target cluster) and
/// the `(when, cells done)` measurements of the last [`RATE_WINDOW`].
#[derive(Debug, Default)]
pub(crate) struct BuildProgress {
    total: i64,
    samples: std::collections::VecDeque<(std::time::Instant, i64)>,
    /// The first measurement of the build.
    first: Option<(std::time::Instant, i64)>,
    /// The log cells to read at the first measurement.
    first_total: Option<i64>,
}

impl BuildProgress {
    /// Records a measurement: `done` of `total` log cells applied.
    pub(crate) fn record(&mut self, at: std::time::Instant, done: i64, total: i64) {
        if self.samples.back().is_some_and(|(_, d)| *d > done) {
            // Offsets never go back: fewer cells done is a stale
            // measurement (a sweep and `Store::measure_indexes` overlap).
            return;
        }
        self.total = total;
        self.first.get_or_insert((at, done));
        self.first_total.get_or_insert(total);
        self.samples.push_back((at, done));
        while self.samples.len() > 2
            && self
                .samples
                .front()
                .is_some_and(|(t, _)| at.duration_since(*t) > RATE_WINDOW)
        {
            self.samples.pop_front();
        }
    }

    /// Log cells to read in all (0 before the first measurement).
    pub(crate) fn total(&self) -> i64 {
        self.total
    }

    /// Cells applied per second over the window; `None` before two
    /// measurements some time apart.
    pub(crate) fn rate(&self) -> Option<f64> {
        let (first, last) = (self.samples.front()?, self.samples.back()?);
        let secs = last.0.duration_since(first.0).as_secs_f64();
        (secs > 0.0).then(|| (last.1 - first.1).max(0) as f64 / secs)
    }

    /// The cells applied and the seconds taken from the first measurement
    /// to the last one; `None` before two measurements some time apart.
    pub(crate) fn whole(&self) -> Option<(i64, f64)> {
        let (first, last) = (self.first?, self.samples.back()?);
        let secs = last.0.duration_since(first.0).as_secs_f64();
        (secs > 0.0).then(|| ((last.1 - first.1).max(0), secs))
    }

    /// Whether the build has applied as many cells as the log held at its
    /// first measurement, measured later.
    pub(crate) fn passed_its_start(&self) -> bool {
        match (self.first_total, self.samples.back()) {
            (Some(start), Some((_, done))) => self.samples.len() > 1 && *done >= start,
            _ => false,
        }
    }

    /// Seconds until `pending` cells are applied at the current rate.
    pub(crate) fn eta_seconds(&self, pending: i64) -> Option<f64> {
        let rate = self.rate()?;
        (rate > 0.0).then(|| pending.max(0) as f64 / rate)
    }
}

impl IndexRuntime {
    pub(crate) fn new(def: impl Into<Arc<Index>>, version: u32, ready: bool) -> IndexRuntime {
        let def = def.into();
        IndexRuntime {
            table: ddl::index_table(&def.datastore, &def.name, version),
            signature: index_signature(&def),
            def,
            version,
            ready: AtomicBool::new(ready),
            serves_until: AtomicU32::new(0),
            pending: AtomicI64::new(0),
            progress: Default::default(),
        }
    }

    /// The log consumer name of this index version writing to `cluster`.
    pub(crate) fn consumer(&self, cluster: &str) -> String {
        format!("ix:{}:{}:{}", self.def.name, self.version, cluster)
    }

    /// The version being built that this (previous, ready) version
    /// serves for; `None` for a current version.
    pub(crate) fn serves_until(&self) -> Option<u32> {
        match self.serves_until.load(Ordering::Acquire) {
            0 => None,
            v => Some(v),
        }
    }

    /// Makes this version the previous one of an index whose version
    /// `building` is being built.
    pub(crate) fn set_serves_until(&self, building: u32) {
        self.serves_until.store(building, Ordering::Release);
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub(crate) fn set_ready(&self) {
        self.ready.store(true, Ordering::Release);
    }

    /// Cells still to apply while building (from the latest sweep).
    pub(crate) fn pending(&self) -> i64 {
        self.pending.load(Ordering::Relaxed)
    }

    pub(crate) fn set_pending(&self, pending: i64) {
        self.pending.store(pending, Ordering::Relaxed);
    }

    /// Records a measurement of a build: `pending` of `total` log cells
    /// still to apply.
    pub(crate) fn set_build_progress(&self, pending: i64, total: i64) {
        self.set_pending(pending);
        self.progress.lock().expect("progress").record(
            std::time::Instant::now(),
            (total - pending).max(0),
            total,
        );
    }

    /// The build progress measured so far.
    pub(crate) fn build_progress(&self) -> std::sync::MutexGuard<'_, BuildProgress> {
        self.progress.lock().expect("progress")
    }

    /// Fails with `INDEX_BUILDING` while the table is still being filled.
    pub(crate) fn check_ready(&self) -> Result<()> {
        if self.is_ready() {
            return Ok(());
        }
        Err(Error::IndexBuilding {
            datastore: self.def.datastore.clone(),
            index: self.def.name.clone(),
            pending: self.pending.load(Ordering::Relaxed),
        })
    }
}

/// A digest of what shapes an index table and its entries: fields (name,
/// path, type, column, and `sort: false`, which leaves out a b-tree), the
/// shard field and the `where:` predicate of a partial index. Descriptions
/// do not count.
pub fn index_signature(index: &Index) -> String {
    let mut text = format!("shard={};", index.shard_field().name);
    for field in &index.fields {
        text.push_str(&format!(
            "{}={}:{}:{};",
            field.name,
            field.column,
            field.path,
            field.ty.name().to_ascii_lowercase()
        ));
        // Only when false: definitions without `sort:` keep their
        // signatures (and their tables).
        if !field.sorted {
            text.push_str("nosort;");
        }
    }
    // The predicate in its qualified form: rewording or respacing it keeps
    // the version, selecting other rows makes a new one.
    if let Some(predicate) = &index.predicate {
        text.push_str(&format!("where={};", predicate.qualified()));
    }
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
}

/// A datastore's definition with its routing and index versions.
pub(crate) struct DatastoreRuntime {
    pub(crate) def: Datastore,
    /// Where its shards live; shared with the runtimes that replace this
    /// one on a reload, and swapped as the stored topology changes
    /// (`moves/follow.rs`), so a request pinned to older definitions
    /// still routes by the newest map.
    pub(crate) routes: Arc<Routes>,
    /// The current version of each index, in the order of `def.indexes`,
    /// then the previous versions that serve while a new one is built
    /// ([`IndexRuntime::serves_until`]): all of them maintained from the
    /// log. Shared with the runtime that replaces this one on a reload
    /// where the index keeps its version.
    pub(crate) indexes: Vec<Arc<IndexRuntime>>,
    /// The top-level body members any of `indexes` reads (its fields and
    /// predicate): what a write keeps of a body for index maintenance.
    pub(crate) indexed_members: Arc<BTreeSet<String>>,
    /// Cells stored by this process, for metrics. The counters are shared
    /// with the runtimes that replace this one on a reload, so they never
    /// go back.
    pub(crate) cells_written: Arc<AtomicU64>,
    /// Cells found identical to stored ones, for metrics.
    pub(crate) cells_duplicate: Arc<AtomicU64>,
    /// Buffered cells this process delivered to their primary.
    pub(crate) cells_replayed: Arc<AtomicU64>,
    /// Buffered writes this process recorded as conflicts on replay.
    pub(crate) replay_conflicts: Arc<AtomicU64>,
    /// Buffer copies this process deleted once the primary's master and
    /// replicas all had their cells.
    pub(crate) copies_released: Arc<AtomicU64>,
}

impl DatastoreRuntime {
    pub(crate) fn new(def: Datastore, map: ShardMap, indexes: Vec<Arc<IndexRuntime>>) -> Self {
        DatastoreRuntime {
            def,
            routes: Arc::new(Routes::new(map)),
            indexed_members: members_of(&indexes),
            indexes,
            cells_written: Arc::default(),
            cells_duplicate: Arc::default(),
            cells_replayed: Arc::default(),
            replay_conflicts: Arc::default(),
            copies_released: Arc::default(),
        }
    }

    /// A runtime for a new definition of this datastore, keeping its
    /// routing and counters.
    pub(crate) fn redefined(&self, def: Datastore, indexes: Vec<Arc<IndexRuntime>>) -> Self {
        DatastoreRuntime {
            def,
            routes: self.routes.clone(),
            indexed_members: members_of(&indexes),
            indexes,
            cells_written: self.cells_written.clone(),
            cells_duplicate: self.cells_duplicate.clone(),
            cells_replayed: self.cells_replayed.clone(),
            replay_conflicts: self.replay_conflicts.clone(),
            copies_released: self.copies_released.clone(),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.def.name
    }

    /// Where requests find each shard now.
    pub(crate) fn map(&self) -> Arc<ShardMap> {
        self.routes.map.load_full()
    }

    /// Which cluster's workers (index maintenance, triggers) follow each
    /// shard's log now: the routing map, but while a moved shard range's
    /// last cells on its old cluster are being applied there.
    pub(crate) fn work_map(&self) -> Arc<ShardMap> {
        self.routes.work.load_full()
    }

    /// Fails with `UNKNOWN_COLUMN`, listing the declared columns, unless
    /// `column` is one of them.
    pub(crate) fn check_column(&self, column: &str) -> Result<()> {
        if self.def.column(column).is_some() {
            return Ok(());
        }
        let expected: Vec<&str> = self.def.columns.iter().map(|c| c.name.as_str()).collect();
        Err(Error::UnknownColumn {
            datastore: self.def.name.clone(),
            column: column.to_string(),
            expected: expected.join(", "),
        })
    }

    /// The current version of the index called `name`.
    pub(crate) fn index(&self, name: &str) -> Result<&Arc<IndexRuntime>> {
        self.indexes
            .iter()
            .find(|i| i.def.name == name)
            .ok_or_else(|| Error::UnknownIndex {
                datastore: self.def.name.clone(),
                index: name.to_string(),
            })
    }

    /// The previous version of the index called `name` that serves while
    /// its new version is built, if there is one.
    pub(crate) fn serving_previous(&self, name: &str) -> Option<&Arc<IndexRuntime>> {
        self.indexes
            .iter()
            .find(|i| i.def.name == name && i.serves_until().is_some())
    }

    /// Whether the datastore has any index reading `column`.
    pub(crate) fn indexes_column(&self, column: &str) -> bool {
        // The runtimes, not `def.indexes`: a previous version may read a
        // column the current one does not.
        self.indexes
            .iter()
            .any(|i| i.def.columns.iter().any(|c| c == column))
    }
}

/// The top-level body members that `indexes` read.
fn members_of(indexes: &[Arc<IndexRuntime>]) -> Arc<BTreeSet<String>> {
    Arc::new(
        indexes
            .iter()
            .flat_map(|i| i.def.members())
            .map(str::to_owned)
            .collect(),
    )
}

/// The offsets name of the trigger consumer `name` (index consumers are
/// named by [`IndexRuntime::consumer`]).
pub(crate) fn trigger_consumer(name: &str) -> String {
    format!("trig:{name}")
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::BuildProgress;

    #[test]
    fn build_progress_gives_the_rate_over_the_window_and_the_eta() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut p = BuildProgress::default();
        p.record(at(0), 0, 10_000);
        assert_eq!(
            (p.total(), p.rate(), p.eta_seconds(10_000)),
            (10_000, None, None)
        );
        p.record(at(10), 1_000, 10_000);
        assert_eq!(p.rate(), Some(100.0));
        assert_eq!(p.eta_seconds(9_000), Some(90.0));
        // Samples older than the window stop counting.
        p.record(at(70), 2_000, 10_000);
        p.record(at(80), 5_000, 10_000);
        assert_eq!(p.rate(), Some(300.0));
        // A stalled build has a rate of 0 and no ETA.
        let mut stalled = BuildProgress::default();
        stalled.record(at(0), 500, 1_000);
        stalled.record(at(5), 500, 1_000);
        assert_eq!(
            (stalled.rate(), stalled.eta_seconds(500)),
            (Some(0.0), None)
        );
        // A stale measurement (fewer cells done) changes nothing.
        p.record(at(81), 4_000, 9_000);
        assert_eq!((p.total(), p.rate()), (10_000, Some(300.0)));
        // The whole build, from its first measurement: what the catalog
        // records when it is ready.
        assert_eq!(p.whole(), Some((5_000, 80.0)));
        assert_eq!(BuildProgress::default().whole(), None);
        // A build under writes: done once the cells of the log at its first
        // measurement are applied, whatever was written since.
        let mut writes = BuildProgress::default();
        writes.record(at(0), 0, 300);
        assert!(!writes.passed_its_start());
        writes.record(at(1), 200, 350);
        assert!(!writes.passed_its_start());
        writes.record(at(2), 300, 400);
        assert!(writes.passed_its_start());
        let mut idle = BuildProgress::default();
        idle.record(at(0), 300, 300);
        assert!(!idle.passed_its_start(), "one measurement is not a build");
    }
}
