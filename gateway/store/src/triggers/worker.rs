//! One trigger consumer on one cluster: holds a fair share of the lease
//! buckets of the cluster's shards, and delivers their cells.
//!
//! A **round** reads, in one statement (per [`PASS_SHARDS`] shards), up to
//! [`PAGE`] cells of the followed columns after the offsets of the held
//! shards whose log head is past them, hands them to the handler in batches
//! of `batch_size`, and moves each batch's offsets after the handler took
//! it. Shards read to their end move to the head seen before the read, so
//! cells of other columns are skipped without being read twice. Rounds run
//! while there is work; then the worker waits for a write event of its
//! datastore and cluster, the result of a sweep or the next lease renewal.
//!
//! A **sweep** reads the shard counters (other gateways' commits), the
//! stored offsets of the held shards (rewinds) and the quarantined cells
//! asked to be retried. It runs as a task of its own beside the rounds, so
//! a write event never waits for it: the worker takes its result when it
//! is there. A stored offset read by a sweep is taken only for a shard the
//! worker did not move since the sweep began (else it is the worker's own
//! older offset, not a rewind; a rewind racing with a move makes the move's
//! compare-and-set fail, which reloads the offsets at once).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::watch;

use super::state::{self, Quarantine};
use super::{ConsumerState, Delivery, StartAt};
use crate::cells::Cell;
use crate::error::Error;
use crate::shard_leases::ShardLeases;
use crate::storage::Backend;
use crate::topology::{ClusterState, DatastoreRuntime, Topology};

/// Most cells one round reads.
const PAGE: usize = 1000;
/// Most shards one round reads from.
const PASS_SHARDS: usize = 1024;
/// How long a worker whose cluster is not ready waits before looking again.
const NOT_READY: Duration = Duration::from_millis(500);

/// What came of handing a batch to the handler.
enum Outcome {
    Taken,
    /// Refused `max_attempts` times; the last error.
    Failed(String),
    /// The consumer or the store is stopping.
    Stopped,
    /// A lease of the cells' shards was lost (or could not be renewed in
    /// time) during the delivery.
    Lost,
}

/// A sweep under way.
struct Sweep {
    task: tokio::task::JoinHandle<crate::Result<Swept>>,
    /// The offsets of the held shards when it began.
    positions: BTreeMap<u32, i64>,
    at: Instant,
}

/// What a sweep read.
struct Swept {
    heads: Vec<(u32, i64)>,
    offsets: BTreeMap<u32, i64>,
    asked: Vec<super::QuarantinedCell>,
}

pub(super) struct Worker {
    state: Arc<ConsumerState>,
    topology: Weak<Topology>,
    datastore: String,
    cluster: usize,
    /// The consumer's name in the offsets and quarantine tables.
    key: String,
    holder: String,
    leases: ShardLeases,
    /// The offset of every held shard.
    positions: BTreeMap<u32, i64>,
    /// The latest known log head of the cluster's shards.
    heads: HashMap<u32, i64>,
    /// Floors of shards whose log went back (the master was replaced), to
    /// move the offsets back to before the next round.
    went_back: BTreeMap<u32, i64>,
    /// No rounds until then (the cluster failed).
    backoff: Option<Instant>,
    failures: u32,
}

impl Worker {
    pub(super) fn new(
        topology: &Arc<Topology>,
        ds: &DatastoreRuntime,
        cluster: usize,
        holder: &str,
        state: Arc<ConsumerState>,
    ) -> Worker {
        let options = &state.options;
        let leases = ShardLeases::new(
            ds,
            cluster,
            format!("trig:{}:{}:", options.name, ds.name()),
            holder.to_string(),
            options.lease_time,
        );
        Worker {
            key: options.key(),
            datastore: ds.name().to_string(),
            topology: Arc::downgrade(topology),
            cluster,
            holder: holder.to_string(),
            leases,
            positions: BTreeMap::new(),
            heads: HashMap::new(),
            went_back: BTreeMap::new(),
            backoff: None,
            failures: 0,
            state,
        }
    }

    pub(super) async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut stop = self.state.stop.subscribe();
        let Some(mut events) = self.topology.upgrade().map(|t| t.events.subscribe()) else {
            return;
        };
        let options = self.state.options.clone();
        let mut counted = false;
        let mut next_lease = Instant::now();
        let mut next_sweep = Instant::now();
        // The sweep under way, if any, and its result once it ended.
        let mut sweep: Option<Sweep> = None;
        let mut swept = None;
        // Set by a stop, a shutdown, or the store being dropped.
        let mut ending = false;
        loop {
            if ending || *stop.borrow() || *shutdown.borrow() {
                break;
            }
            let Some(topology) = self.topology.upgrade() else {
                return;
            };
            let Ok(ds) = topology.datastore(&self.datastore) else {
                return;
            };
            let owned: Vec<u32> = ds
                .work_map()
                .ranges_of(self.cluster)
                .into_iter()
                .flat_map(|(a, b)| a..=b)
                .collect();
            let cluster = &topology.clusters[self.cluster];
            if owned != self.leases.shards() {
                // A shard move changed the shards this cluster's log is
                // followed for: give up the old buckets, take the new ones.
                if let Ok(backend) = cluster.maintenance() {
                    self.leases.release_all(backend.as_ref(), false).await;
                }
                self.leases = ShardLeases::new(
                    &ds,
                    self.cluster,
                    format!("trig:{}:{}:", self.state.options.name, ds.name()),
                    self.holder.clone(),
                    self.state.options.lease_time,
                );
                self.positions.clear();
                self.heads.clear();
                next_lease = Instant::now();
                self.publish();
            }
            if owned.is_empty() {
                drop((topology, ds));
                tokio::select! {
                    changed = stop.changed() => ending |= changed.is_err(),
                    changed = shutdown.changed() => ending |= changed.is_err(),
                    _ = tokio::time::sleep(NOT_READY) => {}
                }
                continue;
            }
            let backend = match (cluster.state(), cluster.maintenance()) {
                (ClusterState::Ready, Ok(backend)) => backend.clone(),
                _ => {
                    drop(topology);
                    tokio::select! {
                        changed = stop.changed() => ending |= changed.is_err(),
                        changed = shutdown.changed() => ending |= changed.is_err(),
                        _ = tokio::time::sleep(NOT_READY) => {}
                    }
                    continue;
                }
            };
            if !counted {
                match state::quarantine_count(backend.as_ref(), &ds, &self.key).await {
                    Ok(n) => {
                        counted = true;
                        self.quarantined(n);
                    }
                    Err(err) => self.failed(&err),
                }
            }
            let now = Instant::now();
            if now >= next_lease {
                self.rebalance(backend.as_ref(), &ds).await;
                next_lease = now + options.lease_time / 3;
            }
            if now >= next_sweep && sweep.is_none() {
                sweep = Some(self.start_sweep(backend.clone(), ds.clone()));
            }
            if swept.is_none() {
                swept = sweep.as_mut().and_then(|s| (&mut s.task).now_or_never());
            }
            if let Some(done) = swept.take() {
                let started = sweep.take().expect("sweep");
                self.take_sweep(backend.as_ref(), &ds, started.positions, done, &mut stop)
                    .await;
                // A sweep asked for while this one ran (a lagged event
                // stream) still runs at once.
                if next_sweep <= started.at {
                    next_sweep = started.at + options.sweep_every;
                }
            }
            let more = match self.backoff {
                Some(until) if until > Instant::now() => false,
                _ if !self.went_back.is_empty() => {
                    self.go_back(backend.as_ref(), &ds).await;
                    true
                }
                _ => self.round(backend.as_ref(), &ds, &mut stop).await,
            };
            self.publish();
            drop((topology, ds, backend));
            if more {
                continue;
            }
            let wake = next_lease
                .min(if sweep.is_some() {
                    next_lease
                } else {
                    next_sweep
                })
                .min(self.backoff.unwrap_or(next_lease));
            let sweeping = async {
                match sweep.as_mut() {
                    Some(sweep) => (&mut sweep.task).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = stop.changed() => ending |= changed.is_err(),
                done = sweeping => swept = Some(done),
                changed = shutdown.changed() => ending |= changed.is_err(),
                event = events.recv() => {
                    let mut event = event;
                    loop {
                        match event {
                            Ok(written) => {
                                if written.datastore == self.datastore && written.cluster == self.cluster {
                                    if written.went_back {
                                        self.log_went_back(&written.heads);
                                        next_sweep = Instant::now();
                                    } else {
                                        for (shard, head) in &written.heads {
                                            let known = self.heads.entry(*shard).or_insert(0);
                                            *known = (*known).max(*head);
                                        }
                                    }
                                }
                            }
                            Err(RecvError::Lagged(_)) => next_sweep = Instant::now(),
                            Err(RecvError::Closed) => return,
                        }
                        // Take every event already waiting before the next round.
                        event = match events.try_recv() {
                            Ok(next) => Ok(next),
                            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                            Err(_) => break,
                        };
                    }
                }
                _ = tokio::time::sleep_until(wake.into()) => {}
            }
        }
        if let Some(sweep) = sweep {
            sweep.task.abort();
        }
        if let Some(topology) = self.topology.upgrade() {
            if let Ok(backend) = topology.clusters[self.cluster].maintenance() {
                self.leases.release_all(backend.as_ref(), false).await;
            }
        }
        self.positions.clear();
        self.publish();
    }

    /// Adds `n` quarantined cells to the consumer's count, and stops it past
    /// its limit.
    fn quarantined(&self, n: u64) {
        use std::sync::atomic::Ordering::Relaxed;
        let total = self.state.quarantined.fetch_add(n, Relaxed) + n;
        let limit = self.state.options.quarantine_limit;
        if total > limit {
            self.state.halt(format!(
                "{total} cells quarantined, more than the limit of {limit}: fix the handler, \
                 then retry the quarantine and start the consumer again"
            ));
        }
    }

    fn failed(&mut self, err: &Error) {
        self.failures += 1;
        let delay = Duration::from_millis(100 << self.failures.min(6));
        tracing::warn!(consumer = %self.state.options.name, datastore = %self.datastore, error = %err, "trigger consumer waits for its cluster");
        self.backoff = Some(Instant::now() + delay);
    }

    fn publish(&self) {
        let pending: i64 = self
            .positions
            .iter()
            .map(|(s, p)| (self.heads.get(s).copied().unwrap_or(0) - p).max(0))
            .sum();
        self.state
            .held
            .lock()
            .expect("held")
            .insert(self.cluster, (pending, self.leases.held.len()));
    }

    async fn rebalance(&mut self, backend: &dyn Backend, ds: &DatastoreRuntime) {
        let changed = match self.leases.rebalance(backend).await {
            Ok(changed) => changed,
            Err(err) => {
                tracing::warn!(consumer = %self.state.options.name, datastore = %self.datastore, error = %err, "trigger lease maintenance failed");
                return;
            }
        };
        for bucket in changed.lost.iter().chain(&changed.released) {
            self.forget(*bucket);
        }
        if changed.acquired.is_empty() {
            return;
        }
        let shards: Vec<u32> = changed
            .acquired
            .iter()
            .flat_map(|b| self.leases.buckets[*b].shards.iter().copied())
            .collect();
        if let Err(err) = self.adopt(backend, ds, &shards).await {
            tracing::warn!(consumer = %self.state.options.name, datastore = %self.datastore, error = %err, "cannot load a trigger's offsets; retrying at the next renewal");
            for bucket in &changed.acquired {
                self.forget(*bucket);
            }
            self.leases
                .held
                .retain(|b, _| !changed.acquired.contains(b));
        }
    }

    /// Loads the offsets of newly held shards, creating the missing ones.
    async fn adopt(
        &mut self,
        backend: &dyn Backend,
        ds: &DatastoreRuntime,
        shards: &[u32],
    ) -> crate::Result<()> {
        for (shard, head) in crate::cells::heads(backend, ds).await? {
            self.heads.insert(shard, head);
        }
        let initial: Vec<(u32, i64)> = shards
            .iter()
            .map(|s| {
                let start = match self.state.options.start_at {
                    StartAt::Beginning => 0,
                    StartAt::Now => self.heads.get(s).copied().unwrap_or(0),
                };
                (*s, start)
            })
            .collect();
        state::ensure_offsets(backend, ds, &self.key, &initial).await?;
        let offsets = state::read_offsets(backend, ds, &self.key, shards).await?;
        for shard in shards {
            self.positions
                .insert(*shard, offsets.get(shard).copied().unwrap_or(0));
        }
        tracing::debug!(consumer = %self.state.options.name, datastore = %self.datastore, shards = shards.len(), "trigger took over shards");
        Ok(())
    }

    fn forget(&mut self, bucket: usize) {
        for shard in &self.leases.buckets[bucket].shards {
            self.positions.remove(shard);
        }
    }

    /// Starts a sweep (see the module doc) as a task of its own.
    fn start_sweep(&self, backend: Arc<dyn Backend>, ds: Arc<DatastoreRuntime>) -> Sweep {
        let positions = self.positions.clone();
        let shards: Vec<u32> = positions.keys().copied().collect();
        let key = self.key.clone();
        let task = tokio::spawn(async move {
            let heads = crate::cells::heads(backend.as_ref(), &ds).await?;
            let offsets = state::read_offsets(backend.as_ref(), &ds, &key, &shards).await?;
            let asked = state::quarantined(backend.as_ref(), &ds, &key, true).await?;
            Ok(Swept {
                heads,
                offsets,
                asked,
            })
        });
        Sweep {
            task,
            positions,
            at: Instant::now(),
        }
    }

    /// Takes what a sweep found: the heads, the rewound offsets of the
    /// shards not moved since it began, and delivers the quarantined cells
    /// asked for again.
    async fn take_sweep(
        &mut self,
        backend: &dyn Backend,
        ds: &DatastoreRuntime,
        before: BTreeMap<u32, i64>,
        done: Result<crate::Result<Swept>, tokio::task::JoinError>,
        stop: &mut watch::Receiver<bool>,
    ) {
        let swept = match done {
            Ok(Ok(swept)) => swept,
            Ok(Err(err)) => return self.failed(&err),
            Err(_) => return,
        };
        for (shard, head) in swept.heads {
            let known = self.heads.entry(shard).or_insert(head);
            *known = (*known).max(head);
        }
        for (shard, offset) in swept.offsets {
            let Some(position) = self.positions.get_mut(&shard) else {
                continue;
            };
            if before.get(&shard) == Some(position) && *position != offset {
                tracing::info!(consumer = %self.state.options.name, shard, from = *position, to = offset, "trigger offset moved (rewound)");
                *position = offset;
            }
        }
        match self.retry_quarantined(backend, ds, swept.asked, stop).await {
            Ok(()) => self.failures = 0,
            Err(err) => self.failed(&err),
        }
    }

    /// Takes the floors of a log that went back: no head is known above
    /// them until a sweep reads the new master's (a round would otherwise
    /// move offsets to a head the new master has not reached, past the
    /// cells it numbers from its own heads).
    fn log_went_back(&mut self, floors: &[(u32, i64)]) {
        for (shard, floor) in floors {
            if let Some(head) = self.heads.get_mut(shard) {
                *head = (*head).min(*floor);
            }
            let at = self.went_back.entry(*shard).or_insert(*floor);
            *at = (*at).min(*floor);
        }
    }

    /// Moves the offsets of the held shards that are past their floor back
    /// to it: the cells above come again (the replayed copies of cells the
    /// new master lacked among them). Floors of shards not held are left to
    /// their holders, which heard of the new master too.
    async fn go_back(&mut self, backend: &dyn Backend, ds: &DatastoreRuntime) {
        if let Err(err) = self.reload(backend, ds).await {
            return self.failed(&err);
        }
        let moves: Vec<(u32, i64, i64)> = self
            .went_back
            .iter()
            .filter_map(|(shard, floor)| {
                let at = *self.positions.get(shard)?;
                (at > *floor).then_some((*shard, at, *floor))
            })
            .collect();
        if !moves.is_empty() && !self.commit(backend, ds, &moves, &[], 0).await {
            // Moved meanwhile (reloaded) or a lease lost: again next round.
            let held = &self.positions;
            self.went_back.retain(|shard, _| held.contains_key(shard));
            return;
        }
        tracing::warn!(consumer = %self.state.options.name, datastore = %self.datastore, shards = moves.len(), "the cluster's master was replaced: trigger offsets moved back to what the new master had; cells above them are delivered again");
        self.went_back.clear();
    }

    /// Takes the stored offsets of the held shards (moved by a rewind).
    async fn reload(&mut self, backend: &dyn Backend, ds: &DatastoreRuntime) -> crate::Result<()> {
        let shards: Vec<u32> = self.positions.keys().copied().collect();
        let stored = state::read_offsets(backend, ds, &self.key, &shards).await?;
        for (shard, offset) in stored {
            if let Some(position) = self.positions.get_mut(&shard) {
                if *position != offset {
                    tracing::info!(consumer = %self.state.options.name, shard, from = *position, to = offset, "trigger offset moved (rewound)");
                    *position = offset;
                }
            }
        }
        Ok(())
    }

    async fn retry_quarantined(
        &mut self,
        backend: &dyn Backend,
        ds: &DatastoreRuntime,
        asked: Vec<super::QuarantinedCell>,
        stop: &mut watch::Receiver<bool>,
    ) -> crate::Result<()> {
        for quarantined in asked {
            if !self.positions.contains_key(&quarantined.shard) {
                continue;
            }
            let Some(cell) =
                state::cell_at(backend, ds, quarantined.shard, quarantined.added_id).await?
            else {
                state::resolve(backend, ds, &self.key, &quarantined, None).await?;
                continue;
            };
            match self.deliver(backend, &[Arc::new(cell)], stop).await {
                Outcome::Taken => {
                    state::resolve(backend, ds, &self.key, &quarantined, None).await?;
                    use std::sync::atomic::Ordering::Relaxed;
                    self.state.delivered.fetch_add(1, Relaxed);
                    self.state.quarantined.fetch_sub(1, Relaxed);
                }
                Outcome::Failed(message) => {
                    let attempts = self.state.options.max_attempts;
                    state::resolve(
                        backend,
                        ds,
                        &self.key,
                        &quarantined,
                        Some((attempts, &message)),
                    )
                    .await?;
                }
                Outcome::Stopped | Outcome::Lost => return Ok(()),
            }
        }
        Ok(())
    }

    /// One round (see the module doc); true when it moved offsets, so there
    /// may be more to do at once.
    async fn round(
        &mut self,
        backend: &dyn Backend,
        ds: &DatastoreRuntime,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let valid = self.leases.valid();
        let pending: Vec<(u32, i64)> = self
            .positions
            .iter()
            .filter(|(s, p)| {
                self.leases
                    .bucket_of
                    .get(s)
                    .is_some_and(|b| valid.contains(b))
                    && self.heads.get(s).is_some_and(|h| h > p)
            })
            .map(|(s, p)| (*s, *p))
            .take(PASS_SHARDS)
            .collect();
        if pending.is_empty() {
            return false;
        }
        let seen: HashMap<u32, i64> = pending
            .iter()
            .map(|(s, _)| (*s, self.heads.get(s).copied().unwrap_or(0)))
            .collect();
        let options = self.state.options.clone();
        let cells =
            match crate::cells::log_cells(backend, ds, &pending, &options.columns, PAGE).await {
                Ok(cells) => cells,
                Err(err) => {
                    self.failed(&err);
                    return false;
                }
            };
        // On a full page the last shard read may be cut short, and shards
        // after it were not read at all.
        let cut = (cells.len() >= PAGE).then(|| cells.last().map_or(0, |c| c.shard));
        let cells: Vec<Arc<Cell>> = cells.into_iter().map(Arc::new).collect();
        for batch in cells.chunks(options.batch_size) {
            match self.deliver(backend, batch, stop).await {
                Outcome::Taken => {
                    if !self.advance(backend, ds, batch, &[]).await {
                        return true;
                    }
                }
                Outcome::Stopped => return false,
                // The lost shards are forgotten; the others go on.
                Outcome::Lost => return true,
                Outcome::Failed(message) => {
                    for cell in batch {
                        let one = std::slice::from_ref(cell);
                        let outcome = if batch.len() == 1 {
                            Outcome::Failed(message.clone())
                        } else {
                            self.deliver(backend, one, stop).await
                        };
                        let advanced = match outcome {
                            Outcome::Taken => self.advance(backend, ds, one, &[]).await,
                            Outcome::Stopped => return false,
                            Outcome::Lost => return true,
                            Outcome::Failed(message) => {
                                tracing::warn!(consumer = %options.name, datastore = %self.datastore, shard = cell.shard, added_id = cell.added_id, error = %message, "a cell's handler kept failing; quarantined");
                                let quarantine = [Quarantine {
                                    cell,
                                    attempts: options.max_attempts,
                                    message: &message,
                                }];
                                self.advance(backend, ds, one, &quarantine).await
                            }
                        };
                        if !advanced {
                            return true;
                        }
                    }
                }
            }
            if *stop.borrow() {
                return false;
            }
        }
        // Shards read to their end: on to the head seen before the read.
        let skipped: Vec<(u32, i64, i64)> = pending
            .iter()
            .filter(|(s, _)| cut.is_none_or(|cut| *s < cut))
            .filter_map(|(s, _)| {
                let position = *self.positions.get(s)?;
                let head = seen[s];
                (head > position).then_some((*s, position, head))
            })
            .collect();
        if !skipped.is_empty() {
            self.commit(backend, ds, &skipped, &[], 0).await;
        }
        true
    }

    /// Moves the offsets past `batch` (and quarantines `quarantine`); false
    /// when the offsets were not moved (lost leases, a rewind, a failure).
    async fn advance(
        &mut self,
        backend: &dyn Backend,
        ds: &DatastoreRuntime,
        batch: &[Arc<Cell>],
        quarantine: &[Quarantine<'_>],
    ) -> bool {
        let mut last: BTreeMap<u32, i64> = BTreeMap::new();
        for cell in batch {
            let entry = last.entry(cell.shard).or_insert(cell.added_id);
            *entry = (*entry).max(cell.added_id);
        }
        let mut moves = Vec::new();
        for (shard, added_id) in last {
            let Some(position) = self.positions.get(&shard) else {
                return false;
            };
            moves.push((shard, *position, added_id.max(*position)));
        }
        let delivered = (batch.len() - quarantine.len()) as u64;
        self.commit(backend, ds, &moves, quarantine, delivered)
            .await
    }

    /// Writes offset moves `(shard, old, new)` under the leases of their
    /// shards; true when they were written.
    async fn commit(
        &mut self,
        backend: &dyn Backend,
        ds: &DatastoreRuntime,
        moves: &[(u32, i64, i64)],
        quarantine: &[Quarantine<'_>],
        delivered: u64,
    ) -> bool {
        let Some((held, _)) = self.leases.covering(moves.iter().map(|m| m.0)) else {
            return false;
        };
        match state::commit(
            backend,
            ds,
            &self.key,
            &self.holder,
            &held,
            moves,
            quarantine,
        )
        .await
        {
            Ok(true) => {
                for (shard, _, new) in moves {
                    self.positions.insert(*shard, *new);
                }
                self.state
                    .delivered
                    .fetch_add(delivered, std::sync::atomic::Ordering::Relaxed);
                self.failures = 0;
                if !quarantine.is_empty() {
                    self.quarantined(quarantine.len() as u64);
                }
                true
            }
            Ok(false) => {
                if let Err(err) = self.reload(backend, ds).await {
                    self.failed(&err);
                }
                false
            }
            Err(Error::LeaseLost(name)) => {
                tracing::warn!(consumer = %self.state.options.name, lease = %name, "trigger lease lost; leaving its shards to their new holder");
                if let Some(bucket) = self.leases.forget(&name) {
                    self.forget(bucket);
                }
                false
            }
            Err(err) => {
                self.failed(&err);
                false
            }
        }
    }

    /// Hands `cells` to the handler until it takes them, at most
    /// `max_attempts` times, waiting between attempts; the leases of their
    /// shards are kept meanwhile ([`Worker::holding`]).
    async fn deliver(
        &mut self,
        backend: &dyn Backend,
        cells: &[Arc<Cell>],
        stop: &mut watch::Receiver<bool>,
    ) -> Outcome {
        // A batch's span (the webhook POST of a trigger is its child).
        let span = tracing::debug_span!(
            "trigger batch",
            otel.name = format!("trigger batch {}", self.state.options.name),
            cellgate.consumer = self.state.options.name.as_str(),
            cellgate.datastore = self.datastore.as_str(),
            cellgate.cells = cells.len(),
            cellgate.attempts = tracing::field::Empty,
        );
        let delivered = self.attempts(backend, cells, stop, span.clone());
        tracing::Instrument::instrument(delivered, span).await
    }

    /// [`Worker::deliver`]'s attempts, counted in `span`.
    async fn attempts(
        &mut self,
        backend: &dyn Backend,
        cells: &[Arc<Cell>],
        stop: &mut watch::Receiver<bool>,
        span: tracing::Span,
    ) -> Outcome {
        let options = self.state.options.clone();
        let mut last = String::new();
        for attempt in 1..=options.max_attempts {
            span.record("cellgate.attempts", attempt);
            let delivery = Delivery {
                consumer: options.name.clone(),
                datastore: self.datastore.clone(),
                cells: cells.to_vec(),
                attempt,
            };
            let handled =
                std::panic::AssertUnwindSafe((self.state.handler)(delivery)).catch_unwind();
            match self.holding(backend, cells, handled).await {
                None => return Outcome::Lost,
                Some(Ok(Ok(()))) => return Outcome::Taken,
                Some(Ok(Err(message))) => last = message,
                Some(Err(_)) => last = "the handler panicked".to_string(),
            }
            if attempt == options.max_attempts {
                break;
            }
            let delay = options
                .min_backoff
                .saturating_mul(1 << (attempt - 1).min(20))
                .min(options.max_backoff);
            let waited = async {
                tokio::select! {
                    _ = stop.changed() => false,
                    _ = tokio::time::sleep(delay) => true,
                }
            };
            match self.holding(backend, cells, waited).await {
                None => return Outcome::Lost,
                Some(false) => return Outcome::Stopped,
                Some(true) => {}
            }
        }
        Outcome::Failed(last)
    }

    /// Awaits `work` (a POST, a wait between attempts) while keeping the
    /// leases of the shards of `cells`: they are renewed a third of the
    /// lease time after they last were, however long `work` takes. When
    /// one is lost, or cannot be renewed before an eighth of its time is
    /// left, `work` is dropped (a POST in flight is abandoned, as its
    /// shards' next holder delivers the cells) and the answer is `None`.
    async fn holding<T>(
        &mut self,
        backend: &dyn Backend,
        cells: &[Arc<Cell>],
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        tokio::pin!(work);
        let ttl = self.leases.ttl;
        let mut retry_at: Option<Instant> = None;
        loop {
            let (_, until) = self.leases.covering(cells.iter().map(|c| c.shard))?;
            let now = Instant::now();
            let renew_at =
                retry_at.unwrap_or_else(|| until.checked_sub(ttl * 2 / 3).unwrap_or(now));
            let give_up = until.checked_sub(ttl / 8).unwrap_or(now);
            tokio::select! {
                done = &mut work => return Some(done),
                _ = tokio::time::sleep_until(renew_at.into()) => {
                    match self.leases.renew(backend).await {
                        Ok(lost) => {
                            retry_at = None;
                            for bucket in lost {
                                tracing::warn!(consumer = %self.state.options.name, datastore = %self.datastore, bucket, "trigger lease lost during a delivery; leaving its shards to their new holder");
                                self.forget(bucket);
                            }
                        }
                        Err(err) => {
                            tracing::debug!(consumer = %self.state.options.name, error = %err, "trigger lease renewal failed during a delivery");
                            retry_at = Some(Instant::now() + ttl / 10);
                        }
                    }
                }
                _ = tokio::time::sleep_until(give_up.into()) => {
                    tracing::warn!(consumer = %self.state.options.name, datastore = %self.datastore, "trigger leases could not be renewed during a delivery; it is abandoned");
                    return None;
                }
            }
        }
    }
}
