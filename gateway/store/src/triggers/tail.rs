//! The shared log tail: one reader of a datastore's new cells for every
//! follower in this process (GraphQL subscriptions).
//!
//! A follower must never cost a log read of its own per commit: with ten
//! thousand subscriptions, one commit would be ten thousand statements. So
//! per datastore one task, running while at least one follower exists,
//! learns the new log heads from the write events of this process (and,
//! for other gateways' commits, from a sweep of the shard counters every
//! [`TailOptions::sweep_every`]), reads the new cells of every advanced
//! shard once (one statement per cluster, pages of [`TailOptions::page`]
//! cells, until caught up) and broadcasts them as [`Arc`] batches. Followers
//! filter the batches by column and shard themselves.
//!
//! A follower that is behind the tail (it resumes from a cursor, or it
//! lagged the broadcast) subscribes to the broadcast first, then reads the
//! log itself from its positions up to the tail's positions, and then takes
//! the broadcast, skipping every cell at or below its per-shard positions:
//! nothing falls between the catch-up and the live stream. The tail's
//! positions change and its batches are sent under one lock, so a snapshot
//! of the positions taken under that lock splits the batches exactly into
//! "already covered" and "still to come".
//!
//! Each cluster is followed on its own: one that does not answer delays
//! only its own shards. A cluster the tail has not reached since it
//! started gets positions when it first answers the tail's sweep, from its
//! heads then: a follower from now starts its shards there (so cells the
//! cluster took in the moment between its return and that sweep are not
//! its), a follower resumed from a cursor reads the log up to them itself.
//! [`Follower::unfollowed`] names such clusters meanwhile. A new follower waits for
//! the tail's first positions at most [`START_WAIT`], then fails with
//! `STORAGE_UNAVAILABLE`.
//!
//! Positions are per-shard `added_id`s; [`encode_cursor`] turns them into
//! the opaque resume token of the GraphQL API.
//!
//! An idle follower costs no task wake-up and no statement, and little
//! memory: its positions are the tail's own snapshot (an [`Arc`] shared by
//! every follower that started from it) plus the few shards it moved
//! since. Each batch carries the tail's positions after it, with a number;
//! a follower whose positions were the tail's before the batch takes the
//! shared positions after it, so followers that keep up never hold a copy
//! of every shard's position.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::watch;

mod cursor;
mod positions;

use cursor::encode_positions;
pub use cursor::{decode_cursor, encode_cursor};
use positions::Positions;

use crate::cells::log_cells;
use crate::cells::Cell;
use crate::error::{Error, Result};
use crate::topology::{ClusterState, DatastoreRuntime, Topology};

/// The longest a new follower waits for the tail's first positions (no
/// cluster of the datastore answered yet).
pub const START_WAIT: Duration = Duration::from_secs(10);

/// Settings of the log tails of a store.
#[derive(Debug, Clone)]
pub struct TailOptions {
    /// How often the shard counters are read to find other gateways'
    /// commits (only while the datastore has followers).
    pub sweep_every: Duration,
    /// Most cells one log read returns.
    pub page: usize,
    /// Batches the broadcast holds for a slow follower before it lags (and
    /// catches up by reading the log itself).
    pub buffer: usize,
}

impl Default for TailOptions {
    fn default() -> TailOptions {
        TailOptions {
            sweep_every: Duration::from_millis(300),
            page: 1000,
            buffer: 1024,
        }
    }
}

/// What a follower wants.
#[derive(Debug, Clone, Default)]
pub struct FollowOptions {
    /// Cells of these columns; every column when empty.
    pub columns: Vec<String>,
    /// Cells of these shards; every shard when `None`.
    pub shards: Option<BTreeSet<u32>>,
    /// Resume after these per-shard positions (a shard absent: from its
    /// beginning); `None` starts from now.
    pub after: Option<BTreeMap<u32, i64>>,
}

/// Figures of the tails, for tests and monitoring.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TailMetrics {
    /// Log reads (statements) of the shared tails.
    pub tail_reads: u64,
    /// Log reads of followers catching up on their own.
    pub catch_up_reads: u64,
    /// Followers now.
    pub followers: usize,
    /// The same per datastore followed since the store opened, and more.
    pub datastores: Vec<DatastoreTailMetrics>,
}

/// Figures of the tail of one datastore.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DatastoreTailMetrics {
    pub datastore: String,
    /// Followers now.
    pub followers: usize,
    /// Log reads (statements) of the shared tail.
    pub tail_reads: u64,
    /// Cells handed out by followers, counted once per follower.
    pub delivered_cells: u64,
    /// Times a follower fell behind the broadcast and had to read the log
    /// itself.
    pub lagged: u64,
    /// Log reads of followers catching up on their own (a resume cursor,
    /// or after lagging).
    pub catch_up_reads: u64,
}

/// The log tails of a store, one per followed datastore.
pub(crate) struct Tails {
    topology: Weak<Topology>,
    options: TailOptions,
    tails: Mutex<HashMap<String, Arc<Tail>>>,
    shutdown: watch::Receiver<bool>,
}

/// The tail of one datastore.
struct Tail {
    datastore: String,
    sender: broadcast::Sender<Arc<Batch>>,
    state: Mutex<TailState>,
    /// Bumped when the tail has its first positions.
    ready: watch::Sender<u64>,
    tail_reads: AtomicU64,
    delivered: AtomicU64,
    lagged: AtomicU64,
    catch_up_reads: AtomicU64,
}

/// What the tail broadcasts: new cells, and its positions after them.
struct Batch {
    /// Floors of shards whose log went back (the master was replaced):
    /// every follower's position past one moves back to it first.
    went_back: Option<Arc<Vec<(u32, i64)>>>,
    /// Shards whose cluster answered for the first time, with the heads
    /// the tail starts them from.
    appeared: Option<Arc<Vec<(u32, i64)>>>,
    cells: Vec<Arc<Cell>>,
    /// The number of the tail's positions after the batch; the batch
    /// before it has the number before.
    number: u64,
    after: Arc<BTreeMap<u32, i64>>,
}

impl Tail {
    /// Takes `positions` as the tail's, numbered, and broadcasts `batch`
    /// (its cells or its marks) with them, under the lock: a follower's
    /// snapshot of the positions splits the batches into covered and to
    /// come.
    fn broadcast(&self, positions: &BTreeMap<u32, i64>, batch: Batch) {
        let after = Arc::new(positions.clone());
        let mut state = self.state.lock().expect("tail");
        state.numbered += 1;
        let number = state.numbered;
        state.positions = Some((number, after.clone()));
        let _ = self.sender.send(Arc::new(Batch {
            number,
            after,
            ..batch
        }));
    }
}

/// A batch of `cells` (or marks) to [`Tail::broadcast`].
fn batch(
    cells: Vec<Arc<Cell>>,
    went_back: Option<Arc<Vec<(u32, i64)>>>,
    appeared: Option<Arc<Vec<(u32, i64)>>>,
) -> Batch {
    Batch {
        went_back,
        appeared,
        cells,
        number: 0,
        after: Arc::default(),
    }
}

#[derive(Default)]
struct TailState {
    running: bool,
    /// What the tail has broadcast up to, per shard, and its number;
    /// `None` until its task read the heads.
    positions: Option<(u64, Arc<BTreeMap<u32, i64>>)>,
    /// The number of the next positions.
    numbered: u64,
    /// The clusters whose shards are not followed now: they did not answer.
    unfollowed: Arc<Vec<String>>,
}

impl Tails {
    pub(crate) fn new(
        topology: &Arc<Topology>,
        options: TailOptions,
        shutdown: watch::Receiver<bool>,
    ) -> Tails {
        Tails {
            topology: Arc::downgrade(topology),
            options,
            tails: Mutex::new(HashMap::new()),
            shutdown,
        }
    }

    pub(crate) fn metrics(&self) -> TailMetrics {
        let mut datastores: Vec<DatastoreTailMetrics> = self
            .tails
            .lock()
            .expect("tails")
            .values()
            .map(|t| DatastoreTailMetrics {
                datastore: t.datastore.clone(),
                followers: t.sender.receiver_count(),
                tail_reads: t.tail_reads.load(Ordering::Relaxed),
                delivered_cells: t.delivered.load(Ordering::Relaxed),
                lagged: t.lagged.load(Ordering::Relaxed),
                catch_up_reads: t.catch_up_reads.load(Ordering::Relaxed),
            })
            .collect();
        datastores.sort_by(|a, b| a.datastore.cmp(&b.datastore));
        TailMetrics {
            tail_reads: datastores.iter().map(|d| d.tail_reads).sum(),
            catch_up_reads: datastores.iter().map(|d| d.catch_up_reads).sum(),
            followers: datastores.iter().map(|d| d.followers).sum(),
            datastores,
        }
    }

    /// A follower of `datastore`; starts the datastore's tail if needed.
    pub(crate) fn follow(
        self: &Arc<Self>,
        datastore: &str,
        options: FollowOptions,
    ) -> Result<Follower> {
        let topology = self
            .topology
            .upgrade()
            .ok_or_else(|| Error::BadInput("the store is shut down".into()))?;
        let ds = topology.datastore(datastore)?;
        for column in &options.columns {
            ds.check_column(column)?;
        }
        if let Some(shard) = options
            .shards
            .iter()
            .flatten()
            .find(|s| **s >= ds.def.shards)
        {
            return Err(Error::BadInput(format!(
                "shard {shard} does not exist: datastore `{}` has shards 0-{}",
                ds.name(),
                ds.def.shards - 1
            )));
        }
        let tail = self
            .tails
            .lock()
            .expect("tails")
            .entry(ds.name().to_string())
            .or_insert_with(|| {
                let (sender, _) = broadcast::channel(self.options.buffer.max(1));
                Arc::new(Tail {
                    datastore: ds.name().to_string(),
                    sender,
                    state: Mutex::new(TailState::default()),
                    ready: watch::channel(0).0,
                    tail_reads: AtomicU64::new(0),
                    delivered: AtomicU64::new(0),
                    lagged: AtomicU64::new(0),
                    catch_up_reads: AtomicU64::new(0),
                })
            })
            .clone();
        let receiver = {
            let mut state = tail.state.lock().expect("tail");
            let receiver = tail.sender.subscribe();
            if !state.running {
                state.running = true;
                state.positions = None;
                tokio::spawn(run(self.clone(), tail.clone()));
            }
            receiver
        };
        let positions = Positions {
            base: Arc::new(options.after.clone().unwrap_or_default()),
            moved: BTreeMap::new(),
            folded: false,
        };
        Ok(Follower {
            tails: self.clone(),
            tail,
            receiver,
            columns: options.columns.iter().cloned().collect(),
            shards: options.shards,
            from_now: options.after.is_none(),
            started_now: options.after.is_none(),
            positions,
            in_step: None,
            queue: VecDeque::new(),
            joined: false,
        })
    }
}

/// The tail task of one datastore: runs while it has followers.
async fn run(tails: Arc<Tails>, tail: Arc<Tail>) {
    let Some(mut events) = tails.topology.upgrade().map(|t| t.events.subscribe()) else {
        return;
    };
    let mut shutdown = tails.shutdown.clone();
    let options = tails.options.clone();
    // The latest known head of each shard, and the tail's positions.
    let mut heads: BTreeMap<u32, i64> = BTreeMap::new();
    let mut positions: Option<BTreeMap<u32, i64>> = None;
    let mut next_sweep = tokio::time::Instant::now();
    // Floors of a log that went back, not taken yet.
    let mut went_back: Vec<(u32, i64)> = Vec::new();
    loop {
        if !went_back.is_empty() {
            let floors = Arc::new(std::mem::take(&mut went_back));
            go_back(&tail, positions.as_mut(), &mut heads, floors);
            next_sweep = tokio::time::Instant::now();
        }
        {
            let mut state = tail.state.lock().expect("tail");
            if tail.sender.receiver_count() == 0 || *shutdown.borrow() {
                state.running = false;
                state.positions = None;
                return;
            }
        }
        let Some(topology) = tails.topology.upgrade() else {
            return;
        };
        let Ok(ds) = topology.datastore(&tail.datastore) else {
            return;
        };
        let now = tokio::time::Instant::now();
        if now >= next_sweep || positions.is_none() {
            let (read, unfollowed) = read_heads(&topology, &ds).await;
            for (shard, head) in &read {
                let known = heads.entry(*shard).or_insert(*head);
                *known = (*known).max(*head);
            }
            tail.state.lock().expect("tail").unfollowed = Arc::new(unfollowed);
            match positions.as_mut() {
                None if !read.is_empty() => {
                    positions = Some(heads.clone());
                    let mut state = tail.state.lock().expect("tail");
                    state.numbered += 1;
                    state.positions = Some((state.numbered, Arc::new(heads.clone())));
                    drop(state);
                    tail.ready.send_modify(|n| *n += 1);
                }
                None => {}
                Some(positions) => appear(&tail, positions, &read),
            }
            next_sweep = now + options.sweep_every;
        }
        if let Some(positions) = positions.as_mut() {
            if let Err(err) =
                catch_up(&tails.options, &tail, &topology, &ds, positions, &heads).await
            {
                tracing::warn!(datastore = %tail.datastore, error = %err, "log tail read failed");
                next_sweep = tokio::time::Instant::now() + options.sweep_every;
            }
        }
        drop((topology, ds));
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            event = events.recv() => {
                let mut event = event;
                loop {
                    match event {
                        Ok(written) => {
                            if written.datastore == tail.datastore && written.went_back {
                                went_back.extend(written.heads.iter().copied());
                            } else if written.datastore == tail.datastore {
                                for (shard, head) in &written.heads {
                                    let known = heads.entry(*shard).or_insert(0);
                                    *known = (*known).max(*head);
                                }
                            }
                        }
                        Err(RecvError::Lagged(_)) => next_sweep = tokio::time::Instant::now(),
                        Err(RecvError::Closed) => return,
                    }
                    // Take every event already waiting before reading.
                    event = match events.try_recv() {
                        Ok(next) => Ok(next),
                        Err(broadcast::error::TryRecvError::Lagged(n)) => Err(RecvError::Lagged(n)),
                        Err(_) => break,
                    };
                }
            }
            _ = tokio::time::sleep_until(next_sweep) => {}
        }
    }
}

/// Takes the floors of a log that went back: the tail's heads and
/// positions past them move back to them (the next sweep reads the new
/// master's heads, and the cells above the floors are read again), and
/// every follower hears of the floors before the tail's next cells.
fn go_back(
    tail: &Tail,
    positions: Option<&mut BTreeMap<u32, i64>>,
    heads: &mut BTreeMap<u32, i64>,
    floors: Arc<Vec<(u32, i64)>>,
) {
    for (shard, floor) in floors.iter() {
        if let Some(head) = heads.get_mut(shard) {
            *head = (*head).min(*floor);
        }
    }
    let Some(positions) = positions else {
        // No positions yet: the first sweep takes the new master's heads.
        return;
    };
    for (shard, floor) in floors.iter() {
        if let Some(at) = positions.get_mut(shard) {
            *at = (*at).min(*floor);
        }
    }
    tracing::warn!(datastore = %tail.datastore, shards = floors.len(), "a cluster's master was replaced: subscriptions read its shards again from what the new master had");
    tail.broadcast(positions, batch(Vec::new(), Some(floors), None));
}

/// Starts following the shards of `read` the tail has no position of yet
/// (their cluster answered for the first time) from their heads, and
/// tells the followers.
fn appear(tail: &Tail, positions: &mut BTreeMap<u32, i64>, read: &[(u32, i64)]) {
    let appeared: Vec<(u32, i64)> = read
        .iter()
        .filter(|(shard, _)| !positions.contains_key(shard))
        .copied()
        .collect();
    if appeared.is_empty() {
        return;
    }
    positions.extend(appeared.iter().copied());
    tail.broadcast(positions, batch(Vec::new(), None, Some(Arc::new(appeared))));
}

/// The last `added_id` of every shard of `ds`, one statement per cluster,
/// and the names of the clusters that did not answer (their shards are
/// left out).
async fn read_heads(topology: &Topology, ds: &DatastoreRuntime) -> (Vec<(u32, i64)>, Vec<String>) {
    let mut all = Vec::new();
    let mut unfollowed = Vec::new();
    for cluster in ds.map().clusters() {
        let read = match ready_backend(topology, cluster) {
            Ok(backend) => crate::cells::heads(backend.as_ref(), ds).await,
            Err(err) => Err(err),
        };
        match read {
            Ok(heads) => {
                let ranges = ds.map().ranges_of(cluster);
                let held = |s: u32| ranges.iter().any(|(a, b)| (*a..=*b).contains(&s));
                all.extend(heads.into_iter().filter(|(s, _)| held(*s)));
            }
            Err(err) => {
                let name = topology.clusters[cluster].name.clone();
                tracing::warn!(datastore = %ds.name(), cluster = %name, error = %err, "log tail cannot read a cluster's shard heads; its shards wait for it");
                unfollowed.push(name);
            }
        }
    }
    (all, unfollowed)
}

fn ready_backend(topology: &Topology, cluster: usize) -> Result<Arc<dyn crate::storage::Backend>> {
    let cluster = &topology.clusters[cluster];
    match cluster.state() {
        ClusterState::Ready => Ok(cluster.maintenance()?.clone()),
        _ => Err(cluster.maintenance().err().unwrap_or_else(|| {
            Error::BadInput(format!("cluster `{}` is not ready", cluster.name))
        })),
    }
}

/// Reads the cells of the shards whose head is past `positions`, one
/// statement per cluster and page, and broadcasts them.
async fn catch_up(
    options: &TailOptions,
    tail: &Tail,
    topology: &Topology,
    ds: &DatastoreRuntime,
    positions: &mut BTreeMap<u32, i64>,
    heads: &BTreeMap<u32, i64>,
) -> Result<()> {
    // Clusters whose read failed: the others go on.
    let mut failed: BTreeMap<usize, Error> = BTreeMap::new();
    loop {
        // Only shards with a position: a cluster that never answered has
        // none, and its shards start from its heads once it does.
        let behind: Vec<(u32, i64)> = heads
            .iter()
            .filter_map(|(s, h)| {
                let at = *positions.get(s)?;
                (*h > at).then_some((*s, at))
            })
            .filter(|(s, _)| !failed.contains_key(&ds.map().cluster_of(*s)))
            .collect();
        if behind.is_empty() {
            return match failed.into_values().next() {
                Some(err) => Err(err),
                None => Ok(()),
            };
        }
        let mut by_cluster: BTreeMap<usize, Vec<(u32, i64)>> = BTreeMap::new();
        for (shard, at) in behind {
            by_cluster
                .entry(ds.map().cluster_of(shard))
                .or_default()
                .push((shard, at));
        }
        for (cluster, from) in by_cluster {
            let page = options.page.max(1);
            let read = match ready_backend(topology, cluster) {
                Ok(backend) => {
                    tail.tail_reads.fetch_add(1, Ordering::Relaxed);
                    log_cells(backend.as_ref(), ds, &from, &[], page).await
                }
                Err(err) => Err(err),
            };
            let cells = match read {
                Ok(cells) => cells,
                Err(err) => {
                    failed.insert(cluster, err);
                    continue;
                }
            };
            let moved = advance(&from, &cells, page, heads);
            let cells: Vec<Arc<Cell>> = cells.into_iter().map(Arc::new).collect();
            for (shard, at) in moved {
                positions.insert(shard, at);
            }
            tail.broadcast(positions, batch(cells, None, None));
        }
    }
}

/// Where each shard of `from` stands after a read of up to `page` cells
/// returned `cells`: a shard read to its end moves to its `target` (cells
/// of other columns are then skipped without being read again); when the
/// page is full the last shard may be cut short and the shards after it
/// were not reached.
fn advance(
    from: &[(u32, i64)],
    cells: &[Cell],
    page: usize,
    target: &BTreeMap<u32, i64>,
) -> Vec<(u32, i64)> {
    let full = cells.len() >= page;
    let last = cells.last().map(|c| c.shard);
    let mut last_id: BTreeMap<u32, i64> = BTreeMap::new();
    for cell in cells {
        last_id.insert(cell.shard, cell.added_id);
    }
    from.iter()
        .filter_map(|(shard, at)| {
            let read = last_id.get(shard).copied().unwrap_or(*at);
            if full {
                match last {
                    Some(l) if *shard == l => return Some((*shard, read)),
                    Some(l) if *shard > l => return None,
                    _ => {}
                }
            }
            let to = target.get(shard).copied().unwrap_or(read).max(read);
            Some((*shard, to))
        })
        .collect()
}

/// One step of a follower's stream.
enum Item {
    Cell(Arc<Cell>),
    /// Floors of shards whose log went back: positions past them move
    /// back to them.
    WentBack(Arc<Vec<(u32, i64)>>),
    /// Shards the tail starts following from these heads (their cluster
    /// answered for the first time): a follower from now starts there.
    Appeared(Arc<Vec<(u32, i64)>>),
    /// Shards read to these positions (cells of other columns skipped).
    Advance(Vec<(u32, i64)>),
    /// The end of a broadcast batch the follower took whole, in step with
    /// the tail: its positions are the tail's after it.
    InStep(u64, Arc<BTreeMap<u32, i64>>),
}

/// A follower of a datastore's log: yields the cells of its columns and
/// shards in per-shard order, at least once, from its positions on.
pub struct Follower {
    tails: Arc<Tails>,
    tail: Arc<Tail>,
    receiver: broadcast::Receiver<Arc<Batch>>,
    columns: BTreeSet<String>,
    shards: Option<BTreeSet<u32>>,
    /// Start at the tail's positions (no resume cursor), until it did.
    from_now: bool,
    /// Whether it started from now (and not from a cursor).
    started_now: bool,
    /// The position of every shard up to which cells were handed out.
    positions: Positions,
    /// The number of the tail's positions that are the follower's own
    /// (cells handed out included), while it is in step with the tail.
    in_step: Option<u64>,
    queue: VecDeque<Item>,
    /// Whether the follower has caught up with the tail once.
    joined: bool,
}

impl Follower {
    /// Per shard, the last `added_id` handed out (or skipped as not
    /// followed); what [`encode_cursor`] makes a resume token of.
    pub fn positions(&self) -> BTreeMap<u32, i64> {
        self.positions.iter().collect()
    }

    /// The clusters of the datastore whose shards are not followed now:
    /// they did not answer the tail's last read. Their cells come once
    /// they do.
    pub fn unfollowed(&self) -> Arc<Vec<String>> {
        self.tail.state.lock().expect("tail").unfollowed.clone()
    }

    /// The resume token of [`Follower::positions`] (see [`encode_cursor`]).
    pub fn cursor(&self) -> String {
        encode_positions(self.positions.iter())
    }

    /// Takes the follower's starting positions now (for a follower from
    /// now: the tail's positions at this moment) and reads what a resume
    /// cursor is behind; [`Follower::next`] does it when not done yet.
    pub async fn start(&mut self) -> Result<()> {
        if !self.joined {
            self.join().await?;
            self.joined = true;
        }
        Ok(())
    }

    fn wants(&self, cell: &Cell) -> bool {
        (self.columns.is_empty() || self.columns.contains(&cell.column))
            && self.shards.as_ref().is_none_or(|s| s.contains(&cell.shard))
    }

    fn follows_shard(&self, shard: u32) -> bool {
        self.shards.as_ref().is_none_or(|s| s.contains(&shard))
    }

    /// The next cell; waits for one. Fails only when the store shuts down
    /// or a catch-up read fails (the follower may be asked again).
    pub async fn next(&mut self) -> Result<Arc<Cell>> {
        loop {
            if let Some(cell) = self.take_queued() {
                return Ok(cell);
            }
            if !self.joined {
                self.join().await?;
                self.joined = true;
                continue;
            }
            match self.receiver.recv().await {
                Ok(batch) => self.queue_batch(&batch),
                Err(RecvError::Lagged(_)) => self.lagged(),
                Err(RecvError::Closed) => {
                    return Err(Error::BadInput("the store is shut down".into()))
                }
            }
        }
    }

    /// The next cell if one is there already (taken by the follower, or
    /// broadcast and not taken yet); never waits and never reads the log.
    /// `None` says nothing more is there now: [`Follower::next`] waits.
    pub fn try_next(&mut self) -> Option<Arc<Cell>> {
        loop {
            if let Some(cell) = self.take_queued() {
                return Some(cell);
            }
            if !self.joined {
                return None;
            }
            match self.receiver.try_recv() {
                Ok(batch) => self.queue_batch(&batch),
                Err(broadcast::error::TryRecvError::Lagged(_)) => {
                    self.lagged();
                    return None;
                }
                Err(_) => return None,
            }
        }
    }

    fn lagged(&mut self) {
        self.tail.lagged.fetch_add(1, Ordering::Relaxed);
        self.joined = false;
        self.in_step = None;
    }

    /// The next queued cell the follower wants, moving its positions.
    fn take_queued(&mut self) -> Option<Arc<Cell>> {
        while let Some(item) = self.queue.pop_front() {
            match item {
                Item::Appeared(heads) => {
                    for (shard, head) in heads.iter() {
                        if self.follows_shard(*shard) && self.positions.get(*shard) < *head {
                            self.positions.set(*shard, *head);
                        }
                    }
                }
                Item::WentBack(floors) => {
                    for (shard, floor) in floors.iter() {
                        if self.follows_shard(*shard) && self.positions.get(*shard) > *floor {
                            self.positions.set(*shard, *floor);
                        }
                    }
                }
                Item::Advance(moved) => {
                    for (shard, at) in moved {
                        if at > self.positions.get(shard) {
                            self.positions.set(shard, at);
                        }
                    }
                }
                Item::InStep(number, after) => {
                    // A catch-up read may have gone past the tail's
                    // positions; then the follower is ahead, not in step.
                    let past = |(s, p): (&u32, &i64)| *p > after.get(s).copied().unwrap_or(0);
                    let past = if self.positions.folded {
                        self.positions.base.iter().any(past)
                    } else {
                        self.positions.moved.iter().any(past)
                    };
                    if past {
                        self.in_step = None;
                    } else {
                        self.positions = Positions {
                            base: after,
                            moved: BTreeMap::new(),
                            folded: false,
                        };
                        self.in_step = Some(number);
                    }
                }
                Item::Cell(cell) => {
                    if cell.added_id <= self.positions.get(cell.shard) {
                        continue;
                    }
                    self.positions.set(cell.shard, cell.added_id);
                    if self.wants(&cell) {
                        self.tail.delivered.fetch_add(1, Ordering::Relaxed);
                        return Some(cell);
                    }
                }
            }
        }
        None
    }

    /// Queues the cells of a broadcast batch; a follower in step with the
    /// tail takes its positions after them (shared, not copied).
    fn queue_batch(&mut self, batch: &Batch) {
        if let Some(floors) = &batch.went_back {
            self.queue.push_back(Item::WentBack(floors.clone()));
        }
        if let Some(heads) = &batch.appeared {
            if self.started_now {
                self.queue.push_back(Item::Appeared(heads.clone()));
            } else if heads
                .iter()
                .any(|(s, h)| self.follows_shard(*s) && self.positions.get(*s) < *h)
            {
                // Resumed from a cursor that is behind the tail on shards it
                // now follows: their cells up to the tail's positions are
                // read from the log again, as after a lag.
                self.lagged();
                return;
            }
        }
        let shards = &self.shards;
        self.queue.extend(
            batch
                .cells
                .iter()
                .filter(|c| shards.as_ref().is_none_or(|s| s.contains(&c.shard)))
                .cloned()
                .map(Item::Cell),
        );
        if self.shards.is_none() && self.in_step == Some(batch.number - 1) {
            self.queue
                .push_back(Item::InStep(batch.number, batch.after.clone()));
        } else if self.in_step.is_some_and(|n| n >= batch.number) {
            // A batch sent before the follower's snapshot: its cells are
            // skipped, and the follower stays in step.
        } else {
            self.in_step = None;
        }
    }

    /// Waits for the tail's positions, then reads the log from the
    /// follower's positions up to them.
    async fn join(&mut self) -> Result<()> {
        let mut ready = self.tail.ready.subscribe();
        let waited = tokio::time::timeout(START_WAIT, async {
            loop {
                if let Some(p) = self.tail.state.lock().expect("tail").positions.clone() {
                    return Ok(p);
                }
                if ready.changed().await.is_err() {
                    return Err(Error::BadInput("the store is shut down".into()));
                }
            }
        })
        .await;
        let (number, target) = match waited {
            Ok(positions) => positions?,
            Err(_) => {
                let clusters = self.unfollowed().join("`, `");
                return Err(Error::ClusterNotReady {
                    cluster: clusters,
                    reason: format!(
                        "no cluster of datastore `{}` answered within {} s, so the subscription cannot start; retry",
                        self.tail.datastore,
                        START_WAIT.as_secs()
                    ),
                });
            }
        };
        if self.from_now {
            self.from_now = false;
            if self.shards.is_none() {
                // The tail's own snapshot, shared.
                self.positions = Positions {
                    base: target,
                    moved: BTreeMap::new(),
                    folded: false,
                };
                self.in_step = Some(number);
            } else {
                for (shard, at) in target.iter() {
                    if self.follows_shard(*shard) {
                        self.positions.set(*shard, *at);
                    }
                }
            }
            return Ok(());
        }
        let Some(topology) = self.tails.topology.upgrade() else {
            return Err(Error::BadInput("the store is shut down".into()));
        };
        let ds = topology.datastore(&self.tail.datastore)?;
        let columns: Vec<String> = self.columns.iter().cloned().collect();
        let page = self.tails.options.page.max(1);
        let mut at = self.positions.clone();
        // In step with the tail once caught up when no shard is ahead of
        // it (a cursor of another gateway may be).
        let ahead = self.shards.is_some()
            || at
                .iter()
                .any(|(s, p)| p > target.get(&s).copied().unwrap_or(0));
        loop {
            let behind: Vec<(u32, i64)> = target
                .iter()
                .filter(|(s, _)| self.follows_shard(**s))
                .filter_map(|(s, h)| {
                    let p = at.get(*s);
                    (*h > p).then_some((*s, p))
                })
                .collect();
            if behind.is_empty() {
                if !ahead {
                    self.queue.push_back(Item::InStep(number, target.clone()));
                }
                return Ok(());
            }
            let mut by_cluster: BTreeMap<usize, Vec<(u32, i64)>> = BTreeMap::new();
            for (shard, p) in behind {
                by_cluster
                    .entry(ds.map().cluster_of(shard))
                    .or_default()
                    .push((shard, p));
            }
            for (cluster, from) in by_cluster {
                let backend = ready_backend(&topology, cluster)?;
                self.tail.catch_up_reads.fetch_add(1, Ordering::Relaxed);
                let cells = log_cells(backend.as_ref(), &ds, &from, &columns, page).await?;
                let moved = advance(&from, &cells, page, &target);
                for (shard, p) in &moved {
                    at.set(*shard, *p);
                }
                self.queue
                    .extend(cells.into_iter().map(|c| Item::Cell(Arc::new(c))));
                self.queue.push_back(Item::Advance(moved));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_page_stops_at_its_last_shard() {
        let cell = |shard, added_id| Cell {
            row_key: uuid::Uuid::nil(),
            column: "A".into(),
            ref_key: 1,
            body: serde_json::Value::Null,
            created_at: chrono::Utc::now(),
            shard,
            added_id,
        };
        let from = [(1, 0), (2, 0), (3, 0)];
        let target = BTreeMap::from([(1, 5), (2, 9), (3, 4)]);
        let cells = [cell(1, 5), cell(2, 6)];
        assert_eq!(advance(&from, &cells, 2, &target), vec![(1, 5), (2, 6)]);
        assert_eq!(
            advance(&from, &cells, 10, &target),
            vec![(1, 5), (2, 9), (3, 4)]
        );
    }
}
