//! Where a datastore's shards are served from now: the routing and work
//! maps of the stored topology version served, the shard move in
//! progress (as the stored topology records it), and how the write path
//! waits for a move's cut-over.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::shards::ShardMap;

/// The phases of a shard move, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Copying the range's cells to the target, in chunks.
    Copy,
    /// Copying what was written meanwhile, then the index entries; the
    /// gateways are told a cut-over is near.
    CatchUp,
    /// Writes to the range wait: the source's counters are fenced, the
    /// last cells copied.
    Fence,
    /// Requests route the range to the target; writes still wait until
    /// every gateway serves the new map.
    Switch,
    /// Writes go to the target; the source's workers apply its last cells.
    Drain,
    /// The target's workers follow the range; the source's copy is checked.
    Verify,
    /// The source's copy is deleted (from here on the move cannot be
    /// undone).
    Cleanup,
    /// Finished, or kept before cleanup with `--keep-source`.
    Done,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Copy => "copy",
            Phase::CatchUp => "catch_up",
            Phase::Fence => "fence",
            Phase::Switch => "switch",
            Phase::Drain => "drain",
            Phase::Verify => "verify",
            Phase::Cleanup => "cleanup",
            Phase::Done => "done",
        }
    }

    pub const ALL: [Phase; 8] = [
        Phase::Copy,
        Phase::CatchUp,
        Phase::Fence,
        Phase::Switch,
        Phase::Drain,
        Phase::Verify,
        Phase::Cleanup,
        Phase::Done,
    ];
}

/// A shard move as the stored topology records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MoveRecord {
    pub first: u32,
    pub last: u32,
    pub source: String,
    pub target: String,
    pub phase: Phase,
    pub started_at: DateTime<Utc>,
    /// The source's source copy is kept when the move is done (`--keep-source`).
    #[serde(default)]
    pub keep_source: bool,
    /// Cells copied to the target so far (for progress).
    #[serde(default)]
    pub copied: u64,
}

impl MoveRecord {
    pub fn contains(&self, shard: u32) -> bool {
        (self.first..=self.last).contains(&shard)
    }
}

/// The shard maps of a datastore and the stored topology version they
/// came from.
pub(crate) struct Routes {
    pub(super) map: ArcSwap<ShardMap>,
    pub(super) work: ArcSwap<ShardMap>,
    version: AtomicI64,
    /// Told each new version.
    changed: tokio::sync::watch::Sender<i64>,
    /// The move in progress, if any, as last read.
    moving: std::sync::Mutex<Option<MoveRecord>>,
}

impl Routes {
    pub(crate) fn new(map: ShardMap) -> Routes {
        Routes {
            work: ArcSwap::from_pointee(map.clone()),
            map: ArcSwap::from_pointee(map),
            version: AtomicI64::new(0),
            changed: tokio::sync::watch::channel(0).0,
            moving: std::sync::Mutex::new(None),
        }
    }

    /// The move in progress, if any, as last read.
    pub(crate) fn moving(&self) -> Option<MoveRecord> {
        self.moving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn set_moving(&self, record: Option<MoveRecord>) {
        *self.moving.lock().unwrap_or_else(|e| e.into_inner()) = record;
    }

    /// Learns of the versions served after this call.
    pub(crate) fn watch(&self) -> tokio::sync::watch::Receiver<i64> {
        self.changed.subscribe()
    }

    /// The stored topology version served now (0 before one was read).
    pub(crate) fn version(&self) -> i64 {
        self.version.load(Ordering::Acquire)
    }

    /// Serves `map` (and `work`) of stored topology `version` from now on.
    pub(crate) fn set(&self, version: i64, map: ShardMap, work: ShardMap) {
        self.map.store(Arc::new(map));
        self.work.store(Arc::new(work));
        self.version.store(version, Ordering::Release);
        self.changed.send_replace(version);
    }
}

/// How long after sending its last acknowledgement of the stored topology
/// (`moves/follow.rs`) a gateway trusts the routes it serves. A mover stops
/// waiting for an acknowledgement 10 s (`ACK_TTL`) after it was written,
/// by its own clock; this is earlier by a margin for the clocks of the two
/// machines and the statement's way to the database. From then on reads
/// check the routes against the clusters (`topology/fence.rs`) until the
/// stored topology is read and acknowledged again.
pub(crate) const FENCE_AFTER: std::time::Duration = std::time::Duration::from_secs(8);

/// How the write path waits for a shard move's cut-over, and how recent
/// the topology this gateway serves is known to be.
#[derive(Default)]
pub(crate) struct MoveSignals {
    /// Wakes the topology follower (`moves/follow.rs`) to read the stored
    /// topology at once.
    pub(crate) poke: tokio::sync::Notify,
    /// When the acknowledgement in force was sent, in microseconds since
    /// [`origin`] plus one; [`UNACKED`] with a follower running and none
    /// recorded yet; 0 without a follower (one cluster, or a store that
    /// routes nothing): no move can pass such a store by. Read on every
    /// request, so an atomic rather than a lock.
    acked: AtomicU64,
}

/// [`MoveSignals::acked`] before a following store's first acknowledgement.
const UNACKED: u64 = u64::MAX;

/// The instant acknowledgement times are counted from.
fn origin() -> std::time::Instant {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// How long a write that met a moving shard waits for a new topology
/// version before it tries again anyway.
const MOVE_RECHECK: std::time::Duration = std::time::Duration::from_millis(100);

impl MoveSignals {
    /// A follower starts. Until its first acknowledgement is recorded no
    /// mover waits for this gateway, so its reads are checked (`stale`)
    /// from the start.
    pub(crate) fn following(&self) {
        origin();
        self.acked.store(UNACKED, Ordering::Release);
    }

    /// An acknowledgement sent at `at` was recorded.
    pub(crate) fn acknowledged(&self, at: std::time::Instant) {
        let micros = at.saturating_duration_since(origin()).as_micros() as u64 + 1;
        // Only a following store records them.
        let _ = self
            .acked
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                (now != 0).then_some(micros)
            });
    }

    /// How long ago the acknowledgement in force was sent, once that is
    /// [`FENCE_AFTER`] or more (`Duration::MAX`: none since start-up): a
    /// move may since have switched a range without this gateway, so the
    /// routes it serves are checked against the clusters before a read
    /// (`topology/fence.rs`). `None` while the topology is known to be
    /// current.
    pub(crate) fn stale(&self) -> Option<std::time::Duration> {
        match self.acked.load(Ordering::Acquire) {
            0 => None,
            UNACKED => Some(std::time::Duration::MAX),
            micros => {
                let at = origin() + std::time::Duration::from_micros(micros - 1);
                let elapsed = at.elapsed();
                (elapsed >= FENCE_AFTER).then_some(elapsed)
            }
        }
    }

    /// Asks for the stored topology to be read now, then waits until a
    /// version newer than `seen`'s is served, [`MOVE_RECHECK`] at most.
    /// False once `deadline` has passed.
    pub(crate) async fn wait(
        &self,
        mut seen: tokio::sync::watch::Receiver<i64>,
        deadline: tokio::time::Instant,
    ) -> bool {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        self.poke.notify_one();
        let until = deadline.min(tokio::time::Instant::now() + MOVE_RECHECK);
        let _ = tokio::time::timeout_at(until, seen.changed()).await;
        tokio::time::Instant::now() < deadline
    }
}
