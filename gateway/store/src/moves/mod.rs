//! Moving a range of logical shards to another cluster, online, and the
//! topology every gateway shares (`stored.rs`, `follow.rs`).
//!
//! A move of shards `A-B` of datastore `D` from cluster `S` to cluster `T`
//! goes through these phases, each recorded in the stored topology before
//! its work starts, so a move killed anywhere is resumed by running it
//! again (every step is idempotent):
//!
//! 1. **copy** — `T` gets the datastore's tables; the range's cells are
//!    copied with their `added_id`s, a chunk at a time, while writes go on.
//! 2. **catch_up** — the cells written meanwhile are copied, until a pass
//!    finds few. When `T` held no shard of `D`, every cell cluster gives the
//!    index consumers that will write to `T` the offsets of those writing to
//!    `S`, then the index entries of the range are copied: `T`'s consumers
//!    apply the log from those offsets, so its entries end up complete
//!    whatever was applied meanwhile. The stored row is marked `cutover`, and
//!    the move waits until every gateway reads it every few milliseconds.
//! 3. **fence** — the range's counters on `S` are negated in one statement,
//!    which waits for the writes holding them: from then on a write to the
//!    range finds no usable counter on `S` and waits (`SHARD_MOVING` inside
//!    the gateway, retried as the topology changes). The last cells, the
//!    counters (still negated) and every offset row of the range are
//!    copied; both clusters' catalogs record their new ranges.
//! 4. **switch** — a new version routes the range to `T`. Once every gateway
//!    acknowledged it (so none still reads the range on `S`), `T`'s
//!    counters are opened: writes resume there. The write pause is this
//!    phase plus the fence's tail.
//! 5. **drain** — `S`'s workers apply the range's last cells there; once
//!    every trigger consumer has delivered them, the offsets are copied
//!    again, and a new version hands the range's log to `T`'s workers (in
//!    per-shard order: they start where `S`'s stopped). When `T` held
//!    shards of `D` before, its own index consumers wrote tombstones for
//!    the range's rows meanwhile: the indexes are repaired here.
//! 6. **verify** — per shard, the count and a checksum of the cells up to
//!    the fence on both clusters.
//! 7. **cleanup** — the range's rows are deleted from `S`, then the
//!    datastore's indexes are verified and repaired. Until here the
//!    move can be undone: before the switch with [`Store::abort_move`](crate::Store::abort_move), after
//!    it by moving the range back (with `keep_source`, the move stops
//!    before cleanup, and the move back copies only what was written since).

pub(crate) mod copy;
pub(crate) mod follow;
mod plan;
pub(crate) mod stored;

use self::plan::plan;

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;

pub use crate::topology::{MoveRecord, Phase};

use crate::catalog;
use crate::error::{Error, Result};
use crate::run_lease::RunLease;
use crate::shards::{format_ranges, ShardMap};
use crate::storage::Backend;
use crate::topology::{Cluster, DatastoreRuntime, Topology};
use crate::StorageConfig;
use stored::Stored;

/// What to move, and how.
#[derive(Debug, Clone)]
pub struct MoveOptions {
    pub datastore: String,
    /// The first and last shard of the range (inclusive).
    pub shards: (u32, u32),
    /// The cluster to move them to.
    pub target: String,
    /// Only report the plan.
    pub dry_run: bool,
    /// Stop before cleanup, keeping the source's copy (the move can then be
    /// undone by moving the range back; [`Store::move_shards`](crate::Store::move_shards) with the same
    /// range and target finishes it).
    pub keep_source: bool,
    /// Cells per copy statement.
    pub chunk: usize,
    /// Verify (and repair) the datastore's indexes after the switch.
    pub verify_indexes: bool,
    /// How long to wait for every gateway to acknowledge a new version
    /// before giving up (the move can be resumed).
    pub ack_timeout: Duration,
    /// The share of the time the bulk work (the copy, the copy of a new
    /// target's index entries, the verify, the cleanup and its index
    /// repair) runs: after a chunk of `t` it pauses `t × (1 − duty) /
    /// duty`, leaving the databases to the requests. The catch-up passes
    /// of cells and the cut-over (fence to switch) always run flat out.
    /// 1: no pauses.
    pub duty: f64,
}

impl MoveOptions {
    pub fn new(datastore: &str, shards: (u32, u32), target: &str) -> MoveOptions {
        MoveOptions {
            datastore: datastore.to_string(),
            shards,
            target: target.to_string(),
            dry_run: false,
            keep_source: false,
            chunk: 1000,
            verify_indexes: true,
            ack_timeout: Duration::from_secs(30),
            duty: 0.5,
        }
    }
}

/// Where a move is, for a progress bar.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MoveProgress {
    pub phase: Phase,
    /// Units done in this phase (cells copied, shards verified, …).
    pub done: u64,
    /// Units of this phase in all (0 when unknown).
    pub total: u64,
}

/// What a move will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovePlan {
    pub datastore: String,
    pub shards: (u32, u32),
    pub source: String,
    pub target: String,
    /// The range's cells on the source now (from its counters).
    pub cells: u64,
    /// The target holds no shard of the datastore yet.
    pub new_target: bool,
    /// The phase a recorded move resumes at, if one was recorded.
    pub resumes_at: Option<Phase>,
}

/// What a move did.
#[derive(Debug, Clone, PartialEq)]
pub struct MoveReport {
    pub plan: MovePlan,
    pub cells_copied: u64,
    pub entries_copied: u64,
    /// From the fence to the open counters on the target, as the mover saw
    /// it (`None` when this run did not do the cut-over).
    pub write_pause: Option<Duration>,
    /// Time in each phase this run went through.
    pub phases: Vec<(Phase, Duration)>,
    /// Shards whose cells were checked on both clusters.
    pub verified_shards: u64,
    /// Index entries the index verify found wrong (and repaired).
    pub index_drift: u64,
    pub elapsed: Duration,
}

/// The stored topology of a datastore, as `cellgate shard status` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopologyStatus {
    pub datastore: String,
    pub version: i64,
    /// `(first, last, cluster)` ranges requests are routed by.
    pub ranges: Vec<(u32, u32, String)>,
    pub moving: Option<MoveRecord>,
}

/// How many cells a catch-up pass may find and still end the catch-up.
const CAUGHT_UP: u64 = 2000;

/// How long the drain waits for trigger consumers on the source.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

struct Mover<'a> {
    storage: &'a StorageConfig,
    topology: &'a Arc<Topology>,
    ds: Arc<DatastoreRuntime>,
    options: &'a MoveOptions,
    meta: Arc<dyn Backend>,
    source: usize,
    target: usize,
    row: Stored,
    report: MoveReport,
    fenced_at: Option<Instant>,
    /// Where the target's copy of each shard stands, once a pass knows.
    copied: Option<std::collections::BTreeMap<u32, i64>>,
    /// Cells the recorded move had copied before this run.
    copied_before: u64,
    /// The datastore's move lease (`None` for a dry run).
    lease: Option<RunLease>,
}

/// Takes the lease `move:<datastore>` on the metadata cluster, held by a
/// move while it runs and by an abort: one of them at a time, across
/// processes (`run_lease.rs`).
async fn take_lease(meta: &Arc<dyn Backend>, datastore: &str) -> Result<RunLease> {
    RunLease::take(meta.clone(), format!("move:{datastore}"), "move", |row| {
        Error::Move(format!(
            "a shard move of `{datastore}` is running ({}, its lease runs until {} unless renewed): wait for it to end, or stop it and run the command again",
            row.holder, row.expires_at
        ))
    })
    .await
}

/// Moves a shard range to another cluster (see the module doc), or
/// resumes the move recorded for it; `progress` follows each phase.
pub(crate) async fn move_shards(
    topology: &Arc<Topology>,
    storage: &StorageConfig,
    options: &MoveOptions,
    progress: &mut (dyn FnMut(&MoveProgress) + Send),
) -> Result<MoveReport> {
    let started = Instant::now();
    let ds = topology.datastore(&options.datastore)?;
    let meta = topology.clusters[0].master()?.clone();
    // Before the row is read, so the plan is not made beside a live move.
    let lease = match options.dry_run {
        true => None,
        false => Some(take_lease(&meta, ds.name()).await?),
    };
    let row = stored::read(meta.as_ref(), ds.name())
        .await?
        .ok_or_else(|| {
            Error::Move(format!(
                "datastore `{}` has no stored topology yet; start a gateway on it first",
                ds.name()
            ))
        })?;
    // Serve the newest version here too, so the plan reads the map the
    // gateways serve.
    follow::serve(topology, None, std::slice::from_ref(&row)).await?;
    let plan = plan(topology, &ds, &row, options).await?;
    let (source, target) = (
        cluster_index(topology, &plan.source)?,
        cluster_index(topology, &plan.target)?,
    );
    let mut mover = Mover {
        storage,
        topology,
        ds,
        options,
        meta,
        source,
        target,
        row,
        report: MoveReport {
            plan: plan.clone(),
            cells_copied: 0,
            entries_copied: 0,
            write_pause: None,
            phases: Vec::new(),
            verified_shards: 0,
            index_drift: 0,
            elapsed: Duration::ZERO,
        },
        fenced_at: None,
        copied: None,
        copied_before: 0,
        lease,
    };
    if plan.resumes_at.is_some() {
        mover.copied_before = mover.row.moving.as_ref().map_or(0, |m| m.copied);
    }
    if options.dry_run {
        return Ok(mover.report);
    }
    if !plan.new_target && !options.verify_indexes {
        return Err(Error::Move(format!(
            "`{}` holds shards of `{}` already: its index entries of the moved range are completed by an index repair, which cannot be skipped",
            plan.target, plan.datastore
        )));
    }
    mover.run(progress).await?;
    if let Some(lease) = mover.lease.take() {
        lease.release().await;
    }
    mover.report.elapsed = started.elapsed();
    Ok(mover.report)
}

/// Undoes a move that has not switched yet: the source's counters are
/// opened again and the target's copy is deleted. Refused while the move
/// runs (it holds the datastore's move lease); the row is taken by a
/// compare-and-set before anything is undone, so a mover that lost its
/// lease cannot record another phase meanwhile.
pub(crate) async fn abort_move(topology: &Topology, datastore: &str) -> Result<MoveRecord> {
    let ds = topology.datastore(datastore)?;
    let meta = topology.clusters[0].master()?.clone();
    let lease = take_lease(&meta, ds.name()).await?;
    let record = abort_under(topology, &ds, &meta, &lease).await;
    lease.release().await;
    record
}

async fn abort_under(
    topology: &Topology,
    ds: &DatastoreRuntime,
    meta: &Arc<dyn Backend>,
    lease: &RunLease,
) -> Result<MoveRecord> {
    let datastore = ds.name();
    let row = stored::read(meta.as_ref(), ds.name())
        .await?
        .ok_or_else(|| Error::Move(format!("datastore `{datastore}` has no move in progress")))?;
    let Some(record) = row.moving.clone() else {
        return Err(Error::Move(format!(
            "datastore `{datastore}` has no move in progress"
        )));
    };
    let names: Vec<String> = topology.clusters.iter().map(|c| c.name.clone()).collect();
    let routed = stored::parse_map(&row.ranges, ds.def.shards, &names)?;
    let switched = routed.cluster_of(record.first) != cluster_index(topology, &record.source)?;
    if record.phase > Phase::Switch || switched {
        return Err(Error::Move(format!(
            "the move of shards {}-{} of `{datastore}` has switched to `{}` already; move them back with `cellgate shard move --datastore {datastore} --shards {}-{} --to {}`",
            record.first, record.last, record.target, record.first, record.last, record.source
        )));
    }
    let source = cluster_index(topology, &record.source)?;
    let target = cluster_index(topology, &record.target)?;
    let range = (record.first, record.last);
    let mut taken = row.clone();
    taken.version += 1;
    if !stored::replace(meta.as_ref(), row.version, &taken).await? {
        return Err(changed_meanwhile(datastore));
    }
    let row = taken;
    let source_backend = topology.clusters[source].master()?.clone();
    let target_backend = topology.clusters[target].master()?.clone();
    copy::flip_counters(source_backend.as_ref(), ds.name(), range, false).await?;
    let map = ds.map();
    write_ranges(&topology.clusters[source], ds, &map).await?;
    copy::delete_range(target_backend.as_ref(), ds, range, 1.0, &mut |_| {}).await?;
    write_ranges(&topology.clusters[target], ds, &map).await?;
    lease.check()?;
    let mut next = row.clone();
    next.version += 1;
    next.cutover = false;
    next.moving = None;
    if !stored::replace(meta.as_ref(), row.version, &next).await? {
        return Err(changed_meanwhile(datastore));
    }
    Ok(record)
}

/// The stored topology of `datastore` and its move in progress.
pub(crate) async fn topology_status(
    topology: &Topology,
    datastore: &str,
) -> Result<TopologyStatus> {
    let ds = topology.datastore(datastore)?;
    let meta = topology.clusters[0].master()?.clone();
    let row = stored::read(meta.as_ref(), ds.name()).await?;
    let names: Vec<String> = topology.clusters.iter().map(|c| c.name.clone()).collect();
    match row {
        Some(row) => {
            let map = stored::parse_map(&row.ranges, ds.def.shards, &names)?;
            Ok(TopologyStatus {
                datastore: datastore.to_string(),
                version: row.version,
                ranges: ranges_named(&map, &names),
                moving: row.moving,
            })
        }
        None => Ok(TopologyStatus {
            datastore: datastore.to_string(),
            version: 0,
            ranges: ranges_named(&ds.map(), &names),
            moving: None,
        }),
    }
}

fn ranges_named(map: &ShardMap, names: &[String]) -> Vec<(u32, u32, String)> {
    let mut out: Vec<(u32, u32, String)> = map
        .clusters()
        .into_iter()
        .flat_map(|c| {
            map.ranges_of(c)
                .into_iter()
                .map(move |(a, b)| (a, b, names[c].clone()))
        })
        .collect();
    out.sort();
    out
}

fn cluster_index(topology: &Topology, name: &str) -> Result<usize> {
    topology
        .clusters
        .iter()
        .position(|c| c.name == name)
        .ok_or_else(|| {
            let known: Vec<&str> = topology.clusters.iter().map(|c| c.name.as_str()).collect();
            Error::Move(format!(
                "cluster `{name}` is not configured (clusters: {})",
                known.join(", ")
            ))
        })
}

fn changed_meanwhile(datastore: &str) -> Error {
    Error::Move(format!(
        "the stored topology of `{datastore}` changed while the move ran (is another `cellgate shard move` running?); run the move again to resume it"
    ))
}

/// Records `phase` as the move's, in a row about to be published.
fn set_phase(row: &mut Stored, phase: Phase) {
    if let Some(m) = row.moving.as_mut() {
        m.phase = phase;
    }
}

/// Records in a cluster's catalog the ranges `map` routes to it.
async fn write_ranges(cluster: &Cluster, ds: &DatastoreRuntime, map: &ShardMap) -> Result<()> {
    let backend = cluster.master()?;
    catalog::record(
        backend.as_ref(),
        ds.name(),
        &[
            ("shards".to_string(), ds.def.shards.to_string()),
            (
                "ranges".to_string(),
                format_ranges(&map.ranges_of(cluster.index)),
            ),
        ],
    )
    .await
}

impl Mover<'_> {
    fn range(&self) -> (u32, u32) {
        self.options.shards
    }

    fn source(&self) -> Result<Arc<dyn Backend>> {
        Ok(self.topology.clusters[self.source].master()?.clone())
    }

    fn target(&self) -> Result<Arc<dyn Backend>> {
        Ok(self.topology.clusters[self.target].master()?.clone())
    }

    fn names(&self) -> Vec<String> {
        self.topology
            .clusters
            .iter()
            .map(|c| c.name.clone())
            .collect()
    }

    /// The map with the range on the target.
    fn moved_map(&self, map: &ShardMap) -> Result<ShardMap> {
        let (first, last) = self.range();
        let ranges: Vec<(u32, u32, usize)> = (0..map.shards())
            .map(|s| {
                let c = if (first..=last).contains(&s) {
                    self.target
                } else {
                    map.cluster_of(s)
                };
                (s, s, c)
            })
            .collect();
        ShardMap::from_ranges(map.shards(), &ranges).map_err(Error::Internal)
    }

    /// Writes the next version of the stored row, built by `change`.
    async fn publish(&mut self, change: impl FnOnce(&mut Stored)) -> Result<()> {
        if let Some(lease) = &self.lease {
            lease.check()?;
        }
        let mut next = self.row.clone();
        next.version += 1;
        change(&mut next);
        if !stored::replace(self.meta.as_ref(), self.row.version, &next).await? {
            return Err(changed_meanwhile(self.ds.name()));
        }
        self.row = next;
        follow::serve(self.topology, None, std::slice::from_ref(&self.row)).await?;
        Ok(())
    }

    async fn enter(&mut self, phase: Phase) -> Result<()> {
        if self.row.moving.as_ref().is_some_and(|m| m.phase == phase) {
            return Ok(());
        }
        let copied = self.copied_before + self.report.cells_copied;
        self.publish(|row| {
            if let Some(m) = row.moving.as_mut() {
                m.phase = phase;
                m.copied = copied;
            }
        })
        .await
    }

    /// Waits until every gateway serving the datastore acknowledged the
    /// version stored now (or its acknowledgement expired).
    async fn acknowledged(&self) -> Result<()> {
        let deadline = Instant::now() + self.options.ack_timeout;
        loop {
            let behind =
                stored::behind(self.meta.as_ref(), self.ds.name(), self.row.version).await?;
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let list: Vec<String> = behind
                    .iter()
                    .map(|(holder, version)| format!("{holder} (version {version})"))
                    .collect();
                return Err(Error::Move(format!(
                    "gateways did not acknowledge topology version {} of `{}` within {:?}: {}; the move stays recorded at phase `{}` and resumes when run again",
                    self.row.version,
                    self.ds.name(),
                    self.options.ack_timeout,
                    list.join(", "),
                    self.row.moving.as_ref().map_or("?", |m| m.phase.name())
                )));
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn run(&mut self, progress: &mut (dyn FnMut(&MoveProgress) + Send)) -> Result<()> {
        let mut phase = match self.report.plan.resumes_at {
            Some(phase) => phase,
            None => {
                let record = MoveRecord {
                    first: self.range().0,
                    last: self.range().1,
                    source: self.report.plan.source.clone(),
                    target: self.report.plan.target.clone(),
                    phase: Phase::Copy,
                    started_at: Utc::now(),
                    keep_source: self.options.keep_source,
                    copied: 0,
                };
                self.publish(|row| {
                    row.moving = Some(record);
                    row.cutover = false;
                })
                .await?;
                Phase::Copy
            }
        };
        if let Some(m) = self.row.moving.as_ref() {
            if m.phase != phase {
                self.enter(phase).await?;
            }
        }
        loop {
            let started = Instant::now();
            progress(&MoveProgress {
                phase,
                done: 0,
                total: 0,
            });
            // A caller that stops the move (Ctrl-C) does so here, at the
            // phase's start, rather than wherever its first query waits.
            tokio::task::yield_now().await;
            let next = match phase {
                Phase::Copy => self.copy(progress).await?,
                Phase::CatchUp => self.catch_up(progress).await?,
                Phase::Fence => self.fence(progress).await?,
                Phase::Switch => self.switch(progress).await?,
                Phase::Drain => self.drain(progress).await?,
                Phase::Verify => self.verify(progress).await?,
                Phase::Cleanup => self.cleanup(progress).await?,
                Phase::Done => return Ok(()),
            };
            self.report.phases.push((phase, started.elapsed()));
            if next == Phase::Done {
                // A kept move stays recorded, done but for its cleanup.
                if self.row.moving.is_some() {
                    self.enter(Phase::Done).await?;
                }
                return Ok(());
            }
            self.enter(next).await?;
            phase = next;
        }
    }

    async fn copy(&mut self, progress: &mut (dyn FnMut(&MoveProgress) + Send)) -> Result<Phase> {
        self.prepare_target().await?;
        let total = self.report.plan.cells;
        let mut done = 0u64;
        progress(&MoveProgress {
            phase: Phase::Copy,
            done,
            total,
        });
        let (source, target) = (self.source()?, self.target()?);
        let copied = copy::copy_cells(
            source.as_ref(),
            target.as_ref(),
            &self.ds,
            self.range(),
            self.options.chunk,
            &mut self.copied,
            self.options.duty,
            &mut |n| {
                done += n;
                progress(&MoveProgress {
                    phase: Phase::Copy,
                    done,
                    total: total.max(done),
                });
            },
        )
        .await?;
        self.report.cells_copied += copied;
        Ok(Phase::CatchUp)
    }

    /// Creates the datastore's tables on the target, if it has none.
    async fn prepare_target(&self) -> Result<()> {
        let cluster = &self.topology.clusters[self.target];
        let backend = cluster.master()?;
        catalog::prepare_tables(backend.as_ref(), &self.ds).await?;
        Ok(())
    }

    async fn catch_up(
        &mut self,
        progress: &mut (dyn FnMut(&MoveProgress) + Send),
    ) -> Result<Phase> {
        let (source, target) = (self.source()?, self.target()?);
        for _ in 0..10 {
            let mut done = 0;
            let copied = copy::copy_cells(
                source.as_ref(),
                target.as_ref(),
                &self.ds,
                self.range(),
                self.options.chunk,
                &mut self.copied,
                1.0,
                &mut |n| {
                    done += n;
                    progress(&MoveProgress {
                        phase: Phase::CatchUp,
                        done,
                        total: 0,
                    })
                },
            )
            .await?;
            self.report.cells_copied += copied;
            if copied <= CAUGHT_UP {
                break;
            }
        }
        if self.report.plan.new_target {
            let (from, to) = (
                self.topology.clusters[self.source].name.clone(),
                self.topology.clusters[self.target].name.clone(),
            );
            for cluster in self.ds.work_map().clusters() {
                let backend = self.topology.clusters[cluster].master()?;
                copy::snapshot_index_offsets(backend.as_ref(), &self.ds, &from, &to).await?;
            }
            self.report.entries_copied += copy::copy_entries(
                source.as_ref(),
                target.as_ref(),
                &self.ds,
                self.range(),
                self.options.chunk,
                self.options.duty,
            )
            .await?;
        }
        // Gateways read the topology every few milliseconds from here on.
        self.publish(|row| row.cutover = true).await?;
        self.acknowledged().await?;
        // What was written while the entries were copied and the gateways
        // acknowledged: the fence's tail is then only the last moments.
        self.report.cells_copied += copy::copy_cells(
            source.as_ref(),
            target.as_ref(),
            &self.ds,
            self.range(),
            self.options.chunk,
            &mut self.copied,
            1.0,
            &mut |_| {},
        )
        .await?;
        Ok(Phase::Fence)
    }

    async fn fence(&mut self, progress: &mut (dyn FnMut(&MoveProgress) + Send)) -> Result<Phase> {
        let (source, target) = (self.source()?, self.target()?);
        let range = self.range();
        // Steps: fenced; tail and counters copied.
        let mut step = |done: u64| {
            progress(&MoveProgress {
                phase: Phase::Fence,
                done,
                total: 2,
            })
        };
        self.fenced_at = Some(Instant::now());
        copy::flip_counters(source.as_ref(), self.ds.name(), range, true).await?;
        step(1);
        // Fenced, the counters are final: the tail is copied up to them
        // while the target takes them, side by side.
        let counters = copy::counters(source.as_ref(), self.ds.name(), range.0, range.1).await?;
        let mut quiet = |_| {};
        let (copied, ()) = tokio::try_join!(
            copy::copy_cells_upto(
                source.as_ref(),
                target.as_ref(),
                &self.ds,
                range,
                self.options.chunk,
                &mut self.copied,
                &counters,
                1.0,
                &mut quiet,
            ),
            copy::copy_counters(target.as_ref(), self.ds.name(), &counters),
        )?;
        self.report.cells_copied += copied;
        step(2);
        // The offsets follow at the drain, and the catalogs' ranges once
        // the range is handed over: neither holds the writes up.
        let moved = self.moved_map(&self.ds.map())?;
        // Entering the switch routes the range to the target in the same
        // version.
        let text = stored::map_text(&moved, &self.names());
        self.publish(|row| {
            row.ranges = text;
            set_phase(row, Phase::Switch);
        })
        .await?;
        Ok(Phase::Switch)
    }

    async fn switch(&mut self, _progress: &mut (dyn FnMut(&MoveProgress) + Send)) -> Result<Phase> {
        let names = self.names();
        let current = stored::parse_map(&self.row.ranges, self.ds.def.shards, &names)?;
        let moved = self.moved_map(&current)?;
        if current != moved {
            let text = stored::map_text(&moved, &names);
            self.publish(|row| row.ranges = text).await?;
        }
        self.acknowledged().await?;
        let target = self.target()?;
        copy::flip_counters(target.as_ref(), self.ds.name(), self.range(), false).await?;
        if let Some(at) = self.fenced_at {
            self.report.write_pause = Some(at.elapsed());
        }
        self.publish(|row| {
            row.cutover = false;
            set_phase(row, Phase::Drain);
        })
        .await?;
        Ok(Phase::Drain)
    }

    async fn drain(&mut self, _progress: &mut (dyn FnMut(&MoveProgress) + Send)) -> Result<Phase> {
        let (source, target) = (self.source()?, self.target()?);
        let range = self.range();
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        loop {
            let behind = trigger_backlog(source.as_ref(), self.ds.name(), range).await?;
            if behind == 0 {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(datastore = %self.ds.name(), cells = behind, "trigger consumers did not deliver the moved range's last cells on the source in time; the target's consumers deliver them again");
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        copy::copy_offsets(source.as_ref(), target.as_ref(), self.ds.name(), range).await?;
        copy::copy_trigger_quarantine(source.as_ref(), target.as_ref(), self.ds.name(), range)
            .await?;
        let names = self.names();
        let work = stored::parse_map(&self.row.work, self.ds.def.shards, &names)?;
        let text = stored::map_text(&self.moved_map(&work)?, &names);
        self.publish(|row| row.work = text).await?;
        self.acknowledged().await?;
        // A gateway that started between the fence and the switch wrote
        // its view of the ranges into the catalogs: write the final one.
        let map = self.ds.map();
        futures::try_join!(
            write_ranges(&self.topology.clusters[self.source], &self.ds, &map),
            write_ranges(&self.topology.clusters[self.target], &self.ds, &map),
        )?;
        // A target that held shards of the datastore had its own index
        // consumers, which wrote tombstones for the range's rows while it
        // lived on the source: its entries of the range are made whole by
        // a repair now (the source's, no longer read, go with it).
        if !self.report.plan.new_target {
            self.repair_indexes().await?;
        }
        Ok(Phase::Verify)
    }

    async fn verify(&mut self, progress: &mut (dyn FnMut(&MoveProgress) + Send)) -> Result<Phase> {
        let (source, target) = (self.source()?, self.target()?);
        let (first, last) = self.range();
        let heads: std::collections::BTreeMap<u32, i64> =
            copy::counters(source.as_ref(), self.ds.name(), first, last)
                .await?
                .into_iter()
                .map(|(shard, next)| (shard, next.abs() - 1))
                .collect();
        let total: u64 = heads.values().map(|h| (*h).max(0) as u64).sum::<u64>() * 2;
        let chunk = self.options.chunk.max(1000);
        let done = std::sync::Mutex::new((0u64, progress));
        let count = |n: u64| {
            let mut guard = done.lock().expect("progress");
            guard.0 += n;
            let done = guard.0;
            (guard.1)(&MoveProgress {
                phase: Phase::Verify,
                done,
                total: total.max(done),
            });
        };
        let (mut on_source, mut on_target) = (count, count);
        let (a, b) = futures::try_join!(
            copy::checksums(
                source.as_ref(),
                self.ds.name(),
                &heads,
                chunk,
                self.options.duty,
                &mut on_source
            ),
            copy::checksums(
                target.as_ref(),
                self.ds.name(),
                &heads,
                chunk,
                self.options.duty,
                &mut on_target
            ),
        )?;
        let mismatched: Vec<String> = a
            .iter()
            .filter(|(shard, sum)| b.get(shard) != Some(sum))
            .map(|(shard, (cells, _))| {
                format!(
                    "shard {shard}: {cells} cells on the source, {} on the target",
                    b.get(shard).map_or(0, |(n, _)| *n)
                )
            })
            .collect();
        self.report.verified_shards = heads.len() as u64;
        if !mismatched.is_empty() {
            return Err(Error::Move(format!(
                "the moved cells of `{}` differ between `{}` and `{}`: {}; the source is kept, and the move stays at phase `verify`",
                self.ds.name(),
                self.report.plan.source,
                self.report.plan.target,
                mismatched.join("; ")
            )));
        }
        let keep =
            self.row.moving.as_ref().is_some_and(|m| m.keep_source) || self.options.keep_source;
        Ok(if keep { Phase::Done } else { Phase::Cleanup })
    }

    /// Verifies and repairs the datastore's indexes. A run that finds
    /// another verify running leaves the move at its phase, to be run again.
    async fn repair_indexes(&mut self) -> Result<()> {
        if self.ds.indexes.is_empty() {
            return Ok(());
        }
        // The whole datastore: the moved index shards hold entries of rows
        // of every shard, and only a full run looks for entries without
        // cells.
        let options = crate::indexes::VerifyOptions {
            repair: true,
            duty: self.options.duty,
            nice: None,
            restart: true,
            ..Default::default()
        };
        let report = crate::indexes::verify::run(
            self.topology,
            self.storage,
            self.ds.clone(),
            &options,
            &mut |_| {},
            &mut |_| {},
        )
        .await
        .map_err(|err| match err {
            Error::VerifyRunning { .. } => Error::Move(format!(
                "{err}; the move stays at phase `{}`: run it again once that verify has ended",
                self.row.moving.as_ref().map_or("?", |m| m.phase.name())
            )),
            err => err,
        })?;
        self.report.index_drift += report.progress.drift();
        Ok(())
    }

    async fn cleanup(&mut self, progress: &mut (dyn FnMut(&MoveProgress) + Send)) -> Result<Phase> {
        let source = self.source()?;
        let mut done = 0;
        copy::delete_range(
            source.as_ref(),
            &self.ds,
            self.range(),
            self.options.duty,
            &mut |n| {
                done += n;
                progress(&MoveProgress {
                    phase: Phase::Cleanup,
                    done,
                    total: 0,
                })
            },
        )
        .await?;
        // The indexes once the source's entries of the range are gone (a
        // verify before would count them as extra).
        if self.options.verify_indexes && self.report.plan.new_target {
            self.repair_indexes().await?;
        }
        self.publish(|row| {
            row.moving = None;
            row.cutover = false;
        })
        .await?;
        Ok(Phase::Done)
    }
}

/// Cells of the range on `backend` that a trigger consumer has not
/// delivered yet.
async fn trigger_backlog(
    backend: &dyn Backend,
    datastore: &str,
    (first, last): (u32, u32),
) -> Result<i64> {
    use crate::storage::{ddl, Sql, Value};
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ABS(s.")
        .ident("next_added_id")
        .push(") - 1, o.")
        .ident("added_id")
        .push(" FROM ")
        .ident(&ddl::shards_table(datastore))
        .push(" s JOIN ")
        .ident(&ddl::offsets_table(datastore))
        .push(" o ON o.")
        .ident("shard")
        .push(" = s.")
        .ident("shard")
        .push(" WHERE s.")
        .ident("shard")
        .push(" BETWEEN ")
        .bind(Value::Int(i64::from(first)))
        .push(" AND ")
        .bind(Value::Int(i64::from(last)))
        .push(" AND o.")
        .ident("consumer")
        .push(" LIKE ")
        .bind(Value::Text("trig:%".into()));
    Ok(backend
        .rows::<(i64, i64)>(&sql)
        .await?
        .into_iter()
        .map(|(head, offset)| (head - offset).max(0))
        .sum())
}
