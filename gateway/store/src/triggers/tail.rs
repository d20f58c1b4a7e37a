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
//! Positions are per-shard `added_id`s; [`encode_cursor`] turns them into
//! the opaque resume token of the GraphQL API.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::broadcast::{self, error::RecvError};
use tokio::sync::watch;

use crate::cells::log_cells;
use crate::cells::Cell;
use crate::error::{Error, Result};
use crate::topology::{ClusterState, DatastoreRuntime, Topology};

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
}

/// The log tails of a store, one per followed datastore.
pub(crate) struct Tails {
    topology: Weak<Topology>,
    options: TailOptions,
    tails: Mutex<HashMap<String, Arc<Tail>>>,
    shutdown: watch::Receiver<bool>,
    tail_reads: AtomicU64,
    catch_up_reads: AtomicU64,
}

/// The tail of one datastore.
struct Tail {
    datastore: String,
    sender: broadcast::Sender<Arc<Vec<Arc<Cell>>>>,
    state: Mutex<TailState>,
    /// Bumped when the tail has its first positions.
    ready: watch::Sender<u64>,
}

#[derive(Default)]
struct TailState {
    running: bool,
    /// What the tail has broadcast up to, per shard; `None` until its task
    /// read the heads.
    positions: Option<BTreeMap<u32, i64>>,
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
            tail_reads: AtomicU64::new(0),
            catch_up_reads: AtomicU64::new(0),
        }
    }

    pub(crate) fn metrics(&self) -> TailMetrics {
        TailMetrics {
            tail_reads: self.tail_reads.load(Ordering::Relaxed),
            catch_up_reads: self.catch_up_reads.load(Ordering::Relaxed),
            followers: self
                .tails
                .lock()
                .expect("tails")
                .values()
                .map(|t| t.sender.receiver_count())
                .sum(),
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
        let positions = options.after.clone().unwrap_or_default();
        Ok(Follower {
            tails: self.clone(),
            tail,
            receiver,
            columns: options.columns.iter().cloned().collect(),
            shards: options.shards,
            from_now: options.after.is_none(),
            positions,
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
    loop {
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
            match read_heads(&topology, &ds).await {
                Ok(read) => {
                    for (shard, head) in read {
                        let known = heads.entry(shard).or_insert(head);
                        *known = (*known).max(head);
                    }
                    if positions.is_none() {
                        positions = Some(heads.clone());
                        tail.state.lock().expect("tail").positions = Some(heads.clone());
                        tail.ready.send_modify(|n| *n += 1);
                    }
                }
                Err(err) => {
                    tracing::warn!(datastore = %tail.datastore, error = %err, "log tail cannot read the shard heads")
                }
            }
            next_sweep = now + options.sweep_every;
        }
        if let Some(positions) = positions.as_mut() {
            if let Err(err) = catch_up(&tails, &tail, &topology, &ds, positions, &heads).await {
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
                            if written.datastore == tail.datastore {
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

/// The last `added_id` of every shard of `ds`, one statement per cluster.
async fn read_heads(topology: &Topology, ds: &DatastoreRuntime) -> Result<Vec<(u32, i64)>> {
    let mut all = Vec::new();
    for cluster in ds.map.clusters() {
        let backend = ready_backend(topology, cluster)?;
        let ranges = ds.map.ranges_of(cluster);
        let held = |s: u32| ranges.iter().any(|(a, b)| (*a..=*b).contains(&s));
        all.extend(
            crate::cells::heads(backend.as_ref(), ds)
                .await?
                .into_iter()
                .filter(|(s, _)| held(*s)),
        );
    }
    Ok(all)
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
    tails: &Tails,
    tail: &Tail,
    topology: &Topology,
    ds: &DatastoreRuntime,
    positions: &mut BTreeMap<u32, i64>,
    heads: &BTreeMap<u32, i64>,
) -> Result<()> {
    loop {
        let behind: Vec<(u32, i64)> = heads
            .iter()
            .filter_map(|(s, h)| {
                let at = positions.get(s).copied().unwrap_or(0);
                (*h > at).then_some((*s, at))
            })
            .collect();
        if behind.is_empty() {
            return Ok(());
        }
        let mut by_cluster: BTreeMap<usize, Vec<(u32, i64)>> = BTreeMap::new();
        for (shard, at) in behind {
            by_cluster
                .entry(ds.map.cluster_of(shard))
                .or_default()
                .push((shard, at));
        }
        for (cluster, from) in by_cluster {
            let backend = ready_backend(topology, cluster)?;
            let page = tails.options.page.max(1);
            tails.tail_reads.fetch_add(1, Ordering::Relaxed);
            let cells = log_cells(backend.as_ref(), ds, &from, &[], page).await?;
            let moved = advance(&from, &cells, page, heads);
            let batch: Vec<Arc<Cell>> = cells.into_iter().map(Arc::new).collect();
            let mut state = tail.state.lock().expect("tail");
            for (shard, at) in moved {
                positions.insert(shard, at);
            }
            state.positions = Some(positions.clone());
            if !batch.is_empty() {
                let _ = tail.sender.send(Arc::new(batch));
            }
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
    /// Shards read to these positions (cells of other columns skipped).
    Advance(Vec<(u32, i64)>),
}

/// A follower of a datastore's log: yields the cells of its columns and
/// shards in per-shard order, at least once, from its positions on.
pub struct Follower {
    tails: Arc<Tails>,
    tail: Arc<Tail>,
    receiver: broadcast::Receiver<Arc<Vec<Arc<Cell>>>>,
    columns: BTreeSet<String>,
    shards: Option<BTreeSet<u32>>,
    /// Start at the tail's positions (no resume cursor).
    from_now: bool,
    /// The position of every shard up to which cells were handed out.
    positions: BTreeMap<u32, i64>,
    queue: VecDeque<Item>,
    /// Whether the follower has caught up with the tail once.
    joined: bool,
}

impl Follower {
    /// Per shard, the last `added_id` handed out (or skipped as not
    /// followed); what [`encode_cursor`] makes a resume token of.
    pub fn positions(&self) -> &BTreeMap<u32, i64> {
        &self.positions
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
            while let Some(item) = self.queue.pop_front() {
                match item {
                    Item::Advance(moved) => {
                        for (shard, at) in moved {
                            let known = self.positions.entry(shard).or_insert(0);
                            *known = (*known).max(at);
                        }
                    }
                    Item::Cell(cell) => {
                        let known = self.positions.get(&cell.shard).copied().unwrap_or(0);
                        if cell.added_id <= known {
                            continue;
                        }
                        self.positions.insert(cell.shard, cell.added_id);
                        if self.wants(&cell) {
                            return Ok(cell);
                        }
                    }
                }
            }
            if !self.joined {
                self.join().await?;
                self.joined = true;
                continue;
            }
            match self.receiver.recv().await {
                Ok(batch) => {
                    let shards = &self.shards;
                    self.queue.extend(
                        batch
                            .iter()
                            .filter(|c| shards.as_ref().is_none_or(|s| s.contains(&c.shard)))
                            .cloned()
                            .map(Item::Cell),
                    )
                }
                Err(RecvError::Lagged(_)) => self.joined = false,
                Err(RecvError::Closed) => {
                    return Err(Error::BadInput("the store is shut down".into()))
                }
            }
        }
    }

    /// Waits for the tail's positions, then reads the log from the
    /// follower's positions up to them.
    async fn join(&mut self) -> Result<()> {
        let mut ready = self.tail.ready.subscribe();
        let target = loop {
            if let Some(p) = self.tail.state.lock().expect("tail").positions.clone() {
                break p;
            }
            if ready.changed().await.is_err() {
                return Err(Error::BadInput("the store is shut down".into()));
            }
        };
        if self.from_now {
            self.from_now = false;
            for (shard, at) in target {
                if self.follows_shard(shard) {
                    self.positions.insert(shard, at);
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
        loop {
            let behind: Vec<(u32, i64)> = target
                .iter()
                .filter(|(s, _)| self.follows_shard(**s))
                .filter_map(|(s, h)| {
                    let p = at.get(s).copied().unwrap_or(0);
                    (*h > p).then_some((*s, p))
                })
                .collect();
            if behind.is_empty() {
                return Ok(());
            }
            let mut by_cluster: BTreeMap<usize, Vec<(u32, i64)>> = BTreeMap::new();
            for (shard, p) in behind {
                by_cluster
                    .entry(ds.map.cluster_of(shard))
                    .or_default()
                    .push((shard, p));
            }
            for (cluster, from) in by_cluster {
                let backend = ready_backend(&topology, cluster)?;
                self.tails.catch_up_reads.fetch_add(1, Ordering::Relaxed);
                let cells = log_cells(backend.as_ref(), &ds, &from, &columns, page).await?;
                let moved = advance(&from, &cells, page, &target);
                for (shard, p) in &moved {
                    at.insert(*shard, *p);
                }
                self.queue
                    .extend(cells.into_iter().map(|c| Item::Cell(Arc::new(c))));
                self.queue.push_back(Item::Advance(moved));
            }
        }
    }
}

/// The version byte of the cursor format.
const CURSOR_V1: u8 = 1;

/// The opaque resume token of `positions`: URL-safe base64 (no padding) of
/// a version byte and the zlib-compressed list of the shards whose
/// position is not 0, each as two LEB128 varints: the gap to the previous
/// shard, and the zigzag difference of its position from the previous
/// shard's. Neighbouring shards hold similar `added_id`s, so a position
/// costs about a byte before compression; 4096 shards stay within a few
/// kilobytes.
pub fn encode_cursor(positions: &BTreeMap<u32, i64>) -> String {
    use base64::Engine as _;
    use std::io::Write as _;
    let mut raw = Vec::with_capacity(positions.len() * 3);
    let (mut prev_shard, mut prev_at) = (0u32, 0i64);
    for (shard, at) in positions.iter().filter(|(_, at)| **at > 0) {
        varint(&mut raw, u64::from(shard - prev_shard));
        let diff = at.wrapping_sub(prev_at);
        varint(&mut raw, ((diff << 1) ^ (diff >> 63)) as u64);
        (prev_shard, prev_at) = (*shard, *at);
    }
    let mut out = vec![CURSOR_V1];
    let mut z = flate2::write::ZlibEncoder::new(&mut out, flate2::Compression::fast());
    let _ = z.write_all(&raw);
    let _ = z.finish();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out)
}

/// The positions of a token made by [`encode_cursor`].
pub fn decode_cursor(cursor: &str) -> Result<BTreeMap<u32, i64>> {
    use base64::Engine as _;
    use std::io::Read as _;
    let bad = || Error::InvalidCursor("not a subscription cursor of this gateway".into());
    if cursor.len() > 1 << 20 {
        return Err(bad());
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|_| bad())?;
    let (&version, body) = bytes.split_first().ok_or_else(bad)?;
    if version != CURSOR_V1 {
        return Err(bad());
    }
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(body)
        .take(1 << 20)
        .read_to_end(&mut raw)
        .map_err(|_| bad())?;
    let mut positions = BTreeMap::new();
    let (mut shard, mut at) = (0u64, 0i64);
    let mut rest = &raw[..];
    while !rest.is_empty() {
        shard += read_varint(&mut rest).ok_or_else(bad)?;
        let z = read_varint(&mut rest).ok_or_else(bad)?;
        at = at.wrapping_add(((z >> 1) as i64) ^ -((z & 1) as i64));
        let shard = u32::try_from(shard).map_err(|_| bad())?;
        if at <= 0 || (!positions.is_empty() && positions.contains_key(&shard)) {
            return Err(bad());
        }
        positions.insert(shard, at);
    }
    Ok(positions)
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn read_varint(input: &mut &[u8]) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = input.split_first()?;
        *input = rest;
        n |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(n);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_stay_small_for_4096_shards() {
        let positions: BTreeMap<u32, i64> = (0..4096u32)
            .map(|s| (s, 250_000 + i64::from(s % 97)))
            .collect();
        let cursor = encode_cursor(&positions);
        assert!(cursor.len() < 16 * 1024, "{} bytes", cursor.len());
        assert_eq!(decode_cursor(&cursor).unwrap(), positions);
        let sparse = BTreeMap::from([(3, 7), (4095, 1), (9, 0)]);
        let back = decode_cursor(&encode_cursor(&sparse)).unwrap();
        assert_eq!(back, BTreeMap::from([(3, 7), (4095, 1)]));
        assert!(decode_cursor("not a cursor").is_err());
        assert!(decode_cursor("").is_err());
    }

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
