//! The worker of one datastore on one cell cluster: its loop (write
//! events, sweeps, lease rounds, shutdown), the batches of dirty shards a
//! pass applies, and what it records of each pass. Its leases are in
//! `buckets.rs`.
//!
//! **Live and building consumers.** A pass applies the log for one group
//! of consumers: those of ready indexes (*live*) or those of index versions
//! still being built from the log. The groups keep dirty shards of their
//! own and their passes read from their own offsets, so a version being
//! built from the start of the log never holds back the live indexes: the
//! build runs one pass (a page of the log at most) at a time, as a task of
//! its own that the rounds of live passes do not wait for.
//!
//! **Passes in flight, not rounds.** Live passes run as tasks of their
//! own, each over whole lease buckets no other pass in flight holds, up to
//! `passes` at once. A pass starts as soon as a slot is free and dirty
//! shards wait in buckets no pass holds, so a write waits for at most the
//! pass under way on its own bucket, never for the slowest pass of a round.
//!
//! **Lease deadlines.** A pass writes nothing once the leases it runs
//! under may have expired: its deadline is when the first of them was last
//! taken or renewed (the statement sent, by the monotonic clock) plus the
//! lease time, less an eighth of it, which covers skew between this
//! process's clock and the database's that judges expiry.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::indexes::apply::{self, Consumer, Fence, Pass};
use crate::indexes::lag::{self};
use crate::indexes::recent::Recent;
use crate::leases::Lease;
use crate::shard_leases::{Held, ShardLeases};
use crate::topology::{DatastoreRuntime, Topology};

use super::*;

/// What one pass is given.
pub(super) struct Work {
    /// Per shard, per consumer; `i64::MAX` for consumers the pass leaves
    /// alone.
    offsets: BTreeMap<u32, Vec<i64>>,
    leases: Vec<Lease>,
    deadline: Instant,
    attempts: HashMap<(usize, Uuid), u32>,
}

/// What a pass for the versions being built reports back to its worker.
pub(super) struct Built {
    batch: Vec<u32>,
    group: Vec<bool>,
    down: BTreeSet<usize>,
    attempts: HashMap<(usize, Uuid), u32>,
    result: Result<apply::PassResult>,
}

/// A live pass in flight: its batch, and its outcome once it ends.
type Flights = futures::stream::FuturesUnordered<Flight>;
/// What a sweep read: the lag, the shards behind, and those of them whose
/// stored offsets went back.
type Swept = (lag::ClusterLag, Vec<lag::Behind>, Vec<lag::Behind>);
type Flight = futures::future::BoxFuture<
    'static,
    (Vec<u32>, std::result::Result<Built, tokio::task::JoinError>),
>;

pub(super) struct Worker {
    /// Apply the log (hold leases); without, the worker only measures lag.
    pub(super) maintain: bool,
    pub(super) topology: Weak<Topology>,
    /// The cell cluster's master, kept to release the leases at shutdown.
    pub(super) backend: Arc<dyn crate::storage::Backend>,
    pub(super) shared: Arc<Maintainer>,
    pub(super) datastore: String,
    pub(super) cluster: usize,
    pub(super) consumers: Vec<Consumer>,
    pub(super) leases: ShardLeases,
    /// Offsets per consumer of the shards of held buckets.
    pub(super) offsets: BTreeMap<u32, Vec<i64>>,
    /// Latest known log head per held shard.
    pub(super) heads: HashMap<u32, i64>,
    /// Shards a live consumer may be behind on.
    pub(super) dirty: BTreeSet<u32>,
    /// Where the next pass starts in `dirty`, so every shard gets a turn.
    pub(super) cursor: u32,
    /// Buckets of the live passes in flight, with when their pass started.
    pub(super) claimed: BTreeMap<usize, Instant>,
    /// The work left waits only in buckets a pass in flight holds, or for
    /// the pass under way of the versions being built: no new pass until a
    /// pass ends or new work comes.
    pub(super) stalled: bool,
    /// Shards a consumer of an index version being built may be behind on.
    pub(super) building: BTreeSet<u32>,
    /// Where the next building pass starts in `building`.
    pub(super) building_cursor: u32,
    pub(super) attempts: HashMap<(usize, Uuid), u32>,
    /// Target clusters skipped until the given time.
    pub(super) down: HashMap<usize, (Instant, u32)>,
    /// No passes until then (the cell cluster failed, or leases are due
    /// for renewal).
    pub(super) backoff: Option<Instant>,
    /// Passes failed in a row, for the backoff.
    pub(super) failures: u32,
    /// Buckets taken whose offsets could not be read yet: adopted at the
    /// next lease round, so no held shard goes unmaintained.
    pub(super) unadopted: BTreeSet<usize>,
    /// Bodies this process wrote to the shards it maintains, for its
    /// passes (`indexes/recent.rs`).
    pub(super) recent: Arc<Recent>,
}

impl Worker {
    pub(super) fn new(
        topology: Weak<Topology>,
        shared: Arc<Maintainer>,
        ds: &DatastoreRuntime,
        cluster: usize,
        full: &Topology,
    ) -> Worker {
        let leases = ShardLeases::new(
            ds,
            cluster,
            format!("maint:{}:", ds.name()),
            shared.holder.clone(),
            shared.options.lease_time,
        );
        Worker {
            maintain: true,
            topology,
            backend: full.clusters[cluster].master.clone(),
            shared,
            datastore: ds.name().to_string(),
            cluster,
            consumers: apply::consumers(full, ds),
            leases,
            offsets: BTreeMap::new(),
            heads: HashMap::new(),
            dirty: BTreeSet::new(),
            unadopted: BTreeSet::new(),
            recent: Arc::default(),
            cursor: 0,
            claimed: BTreeMap::new(),
            stalled: false,
            building: BTreeSet::new(),
            building_cursor: 0,
            attempts: HashMap::new(),
            down: HashMap::new(),
            backoff: None,
            failures: 0,
        }
    }

    pub(super) async fn run(
        mut self,
        mut messages: mpsc::UnboundedReceiver<Msg>,
        mut stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        let options = self.shared.options.clone();
        let mut next_lease_round = Instant::now();
        // The first sweep after one interval: a maintaining worker finds
        // its work when it takes its leases.
        let sweep_every = options.sweep_every.max(Duration::from_millis(10));
        let mut sweep_tick =
            tokio::time::interval_at(tokio::time::Instant::now() + sweep_every, sweep_every);
        sweep_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The pass for index versions being built, while one is under way.
        let mut build: Option<JoinHandle<Built>> = None;
        // The live passes in flight.
        let mut flights = Flights::new();
        // The sweep's reads, while they are under way.
        let mut sweeping: Option<JoinHandle<Option<Swept>>> = None;
        loop {
            let waiting = self.backoff;
            let can_work = (!self.dirty.is_empty()
                || (!self.building.is_empty() && build.is_none()))
                && !self.stalled
                && waiting.is_none();
            tokio::select! {
                biased;
                _ = stopped.changed() => break,
                message = messages.recv() => match message {
                    None => break,
                    Some(Msg::Written(heads, cells)) => {
                        self.stalled = false;
                        self.written(heads);
                        self.recent.keep(&cells, |shard| self.offsets.contains_key(&shard));
                    }
                    Some(Msg::Sweep(reply)) => {
                        if self.topology.strong_count() == 0 {
                            break;
                        }
                        self.sweep().await;
                        let _ = reply.send(());
                    }
                },
                _ = tokio::time::sleep_until(next_lease_round.into()) => {
                    if self.topology.strong_count() == 0 {
                        break;
                    }
                    // A pass in flight for longer than half the lease time
                    // has stalled (a database that stopped answering, a
                    // paused process); the worker then stops renewing its
                    // leases, so they lapse and another gateway takes its
                    // shards on, as it would if the whole worker had
                    // stalled. The stalled pass commits nothing once it
                    // resumes: it is past its deadline, and its fence fails.
                    let stalled_after = options.lease_time / 2;
                    let short = if self.claimed.values().any(|since| since.elapsed() > stalled_after) {
                        false
                    } else {
                        self.leases().await
                    };
                    self.stalled = false;
                    // Short of a fair share: buckets are changing hands
                    // (a gateway stopped or started); look again soon.
                    // Renewal needs a quarter of the lease time; gateways
                    // that come and go are noticed within two seconds.
                    let every = (options.lease_time / 4).min(Duration::from_secs(2));
                    let wait = if short { every.min(Duration::from_millis(250)) } else { every };
                    next_lease_round = Instant::now() + wait.max(Duration::from_millis(20));
                }
                _ = sweep_tick.tick() => {
                    if self.topology.strong_count() == 0 {
                        break;
                    }
                    if sweeping.is_none() {
                        sweeping = self.start_sweep();
                    }
                }
                outcome = async { sweeping.as_mut().expect("a sweep").await }, if sweeping.is_some() => {
                    sweeping = None;
                    self.swept(outcome);
                }
                _ = tokio::time::sleep_until(waiting.unwrap_or_else(Instant::now).into()), if waiting.is_some() => {
                    self.backoff = None;
                }
                outcome = async { build.as_mut().expect("a build pass").await }, if build.is_some() => {
                    build = None;
                    self.stalled = false;
                    self.built(outcome);
                }
                Some((batch, outcome)) = futures::StreamExt::next(&mut flights), if !flights.is_empty() => {
                    self.landed(&batch, outcome);
                }
                _ = std::future::ready(()), if can_work => {
                    self.pass(&mut build, &mut flights);
                }
            }
        }
        if let Some(build) = build {
            let _ = build.await;
        }
        while let Some((batch, outcome)) = futures::StreamExt::next(&mut flights).await {
            self.landed(&batch, outcome);
        }
        self.release_all().await;
    }

    fn written(&mut self, heads: Vec<(u32, i64)>) {
        let building = self.topology.upgrade().is_some_and(|topology| {
            topology
                .datastore(&self.datastore)
                .is_ok_and(|ds| ds.indexes.iter().any(|i| !i.is_ready()))
        });
        for (shard, head) in heads {
            let known = self.heads.entry(shard).or_insert(0);
            *known = (*known).max(head);
            if self.offsets.contains_key(&shard) {
                self.dirty.insert(shard);
                if building {
                    self.building.insert(shard);
                }
            }
        }
    }

    /// Per consumer: whether its index version is still being built.
    fn building_consumers(&self, ds: &DatastoreRuntime) -> Vec<bool> {
        self.consumers
            .iter()
            .map(|c| !ds.indexes[c.index].is_ready())
            .collect()
    }

    fn targets_down(&self) -> BTreeSet<usize> {
        let now = Instant::now();
        self.down
            .iter()
            .filter(|(_, (until, _))| *until > now)
            .map(|(t, _)| *t)
            .collect()
    }

    /// Starts passes: live ones, while fewer than `passes` are in flight,
    /// each over whole lease buckets of dirty shards that no pass in
    /// flight holds (so no two lock the same lease row or touch the same
    /// index entries), at most [`PASS_SHARDS`] shards each; and unless one
    /// is under way (`build`), one for the consumers of index versions
    /// being built, which the live passes never wait for (its index
    /// entries are other tables; where its buckets are also in a live
    /// pass, the two take the lease rows in turn).
    fn pass(&mut self, build: &mut Option<JoinHandle<Built>>, flights: &mut Flights) {
        let Some(topology) = self.topology.upgrade() else {
            self.dirty.clear();
            self.building.clear();
            return;
        };
        let Ok(ds) = topology.datastore(&self.datastore) else {
            self.dirty.clear();
            self.building.clear();
            return;
        };
        let building = self.building_consumers(&ds);
        if !building.contains(&true) {
            self.building.clear();
        }
        let live: Vec<bool> = building.iter().map(|b| !b).collect();
        let down = self.targets_down();
        let mut started = false;
        if build.is_none() {
            if let Some(batch) = self.building_batch(&building) {
                *build = Some(self.start(&topology, &ds, batch, building, &down));
                started = true;
            }
        }
        let slots = self.passes(&topology).saturating_sub(flights.len());
        let batches = if slots == 0 || self.dirty.is_empty() {
            Vec::new()
        } else {
            self.batches(slots, &live)
        };
        if batches.is_empty() {
            if flights.is_empty() && !started {
                // Dirty shards whose leases are about to lapse wait for
                // renewal.
                self.backoff = Some(Instant::now() + Duration::from_millis(100));
            } else {
                self.stalled = true;
            }
            return;
        }
        for batch in batches {
            for shard in &batch {
                if let Some(bucket) = self.leases.bucket_of.get(shard) {
                    self.claimed.insert(*bucket, Instant::now());
                }
            }
            let handle = self.start(&topology, &ds, batch.clone(), live.clone(), &down);
            flights.push(Box::pin(async move { (batch, handle.await) }));
        }
        if flights.len() >= self.passes(&topology) {
            self.stalled = true;
        }
    }

    /// Starts the pass over `batch` for the consumers of `group` as a task
    /// of its own.
    fn start(
        &self,
        topology: &Arc<Topology>,
        ds: &Arc<DatastoreRuntime>,
        batch: Vec<u32>,
        group: Vec<bool>,
        down: &BTreeSet<usize>,
    ) -> JoinHandle<Built> {
        let mut work = self.work(ds, &batch, &group, down);
        let (topology, ds) = (topology.clone(), ds.clone());
        let consumers = self.consumers.clone();
        let holder = self.shared.holder.clone();
        let hook = self.shared.options.pass_hook.clone();
        let quarantine_after = self.shared.options.quarantine_after;
        let cluster = self.cluster;
        let down = down.clone();
        let recent = self.recent.clone();
        tokio::spawn(async move {
            let mut pass = Pass {
                topology: &topology,
                ds: &ds,
                cluster,
                consumers: &consumers,
                fence: Some(Fence {
                    holder: &holder,
                    leases: &work.leases,
                    deadline: work.deadline,
                }),
                attempts: &mut work.attempts,
                quarantine_after,
                hook: hook.as_ref(),
                recent: Some(&recent),
            };
            let result = pass.run(&work.offsets).await;
            Built {
                batch,
                group,
                down,
                attempts: work.attempts,
                result,
            }
        })
    }

    /// Takes in the outcome of a live pass over `batch`, and frees its
    /// buckets.
    fn landed(
        &mut self,
        batch: &[u32],
        outcome: std::result::Result<Built, tokio::task::JoinError>,
    ) {
        self.stalled = false;
        for shard in batch {
            if let Some(bucket) = self.leases.bucket_of.get(shard) {
                self.claimed.remove(bucket);
            }
        }
        self.take_in(outcome, false);
    }

    /// Takes in the outcome of a pass for the versions being built.
    fn built(&mut self, outcome: std::result::Result<Built, tokio::task::JoinError>) {
        self.take_in(outcome, true);
    }

    /// Takes in the outcome of a pass, live or for the versions being
    /// built (`building`).
    fn take_in(
        &mut self,
        outcome: std::result::Result<Built, tokio::task::JoinError>,
        building: bool,
    ) {
        let (Some(topology), Ok(done)) = (self.topology.upgrade(), outcome) else {
            tracing::error!(datastore = %self.datastore, building, "an index maintenance pass did not end");
            return;
        };
        let Ok(ds) = topology.datastore(&self.datastore) else {
            return;
        };
        self.take_attempts(&ds, &done.batch, &done.group, done.attempts);
        self.settle(
            &topology,
            &done.batch,
            &done.group,
            building,
            &done.down,
            done.result,
        );
    }

    /// What a pass over `batch` for the consumers of `group` is given:
    /// offsets, leases, deadline, failed attempts.
    fn work(
        &self,
        ds: &DatastoreRuntime,
        batch: &[u32],
        group: &[bool],
        down: &BTreeSet<usize>,
    ) -> Work {
        let margin = self.shared.options.lease_time / 8;
        // Consumers outside the group, and those of skipped targets, count
        // as caught up for this pass.
        let offsets: BTreeMap<u32, Vec<i64>> = batch
            .iter()
            .map(|s| {
                let per = self.offsets[s]
                    .iter()
                    .zip(&self.consumers)
                    .zip(group)
                    .map(|((o, c), in_group)| {
                        if !in_group || down.contains(&c.target) {
                            i64::MAX
                        } else {
                            *o
                        }
                    })
                    .collect();
                (*s, per)
            })
            .collect();
        let held: Vec<&Held> = batch
            .iter()
            .filter_map(|s| self.leases.bucket_of.get(s))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .filter_map(|b| self.leases.held.get(b))
            .collect();
        let leases: Vec<Lease> = held.iter().map(|h| h.lease.clone()).collect();
        let deadline = held
            .iter()
            .map(|h| h.until)
            .min()
            .map_or_else(Instant::now, |until| {
                until.checked_sub(margin).unwrap_or_else(Instant::now)
            });
        // The failed attempts of this batch's entries travel with it.
        let attempts: HashMap<(usize, Uuid), u32> = self
            .attempts
            .iter()
            .filter(|(key, _)| in_batch_of(ds, &self.consumers, batch, group, key))
            .map(|(k, v)| (*k, *v))
            .collect();
        Work {
            offsets,
            leases,
            deadline,
            attempts,
        }
    }

    /// Replaces the failed attempts of the entries of `batch` for `group`
    /// by those its pass brought back.
    fn take_attempts(
        &mut self,
        ds: &DatastoreRuntime,
        batch: &[u32],
        group: &[bool],
        attempts: HashMap<(usize, Uuid), u32>,
    ) {
        let consumers = &self.consumers;
        self.attempts
            .retain(|key, _| !in_batch_of(ds, consumers, batch, group, key));
        self.attempts.extend(attempts);
    }

    /// The batch of the next building pass: whole buckets of shards behind
    /// for the versions being built, under comfortably valid leases, a page
    /// of cells at most, from the rotating cursor on.
    fn building_batch(&mut self, group: &[bool]) -> Option<Vec<u32>> {
        if self.building.is_empty() {
            return None;
        }
        let valid = self.leases.valid();
        let mut by_bucket: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for shard in self
            .building
            .range(self.building_cursor..)
            .chain(self.building.range(..self.building_cursor))
        {
            if let Some(bucket) = self
                .leases
                .bucket_of
                .get(shard)
                .filter(|b| valid.contains(b))
            {
                by_bucket.entry(*bucket).or_default().push(*shard);
            }
        }
        let start = self
            .leases
            .bucket_of
            .get(&self.building_cursor)
            .copied()
            .unwrap_or(0);
        let mut order: Vec<usize> = by_bucket.keys().copied().collect();
        order.sort_by_key(|b| (*b < start, *b));
        let (mut batches, last_bucket) =
            group_buckets(&order, &by_bucket, 1, |s| self.pending(s, group));
        if let Some(bucket) = last_bucket {
            self.building_cursor = self.leases.buckets[bucket]
                .shards
                .last()
                .map_or(0, |s| s + 1);
        }
        let mut batch = batches.pop()?;
        batch.sort_unstable();
        Some(batch)
    }

    /// Picks at most `passes` batches: whole buckets of dirty shards under
    /// comfortably valid leases that no pass in flight holds, from the
    /// rotating cursor on.
    fn batches(&mut self, passes: usize, group: &[bool]) -> Vec<Vec<u32>> {
        let valid = self.leases.valid();
        let mut by_bucket: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
        for shard in self
            .dirty
            .range(self.cursor..)
            .chain(self.dirty.range(..self.cursor))
        {
            if let Some(bucket) = self
                .leases
                .bucket_of
                .get(shard)
                .filter(|b| valid.contains(b) && !self.claimed.contains_key(b))
            {
                by_bucket.entry(*bucket).or_default().push(*shard);
            }
        }
        // Buckets in rotation order from the cursor.
        let start = self
            .leases
            .bucket_of
            .get(&self.cursor)
            .copied()
            .unwrap_or(0);
        let mut order: Vec<usize> = by_bucket.keys().copied().collect();
        order.sort_by_key(|b| (*b < start, *b));
        let (mut batches, last_bucket) =
            group_buckets(&order, &by_bucket, passes, |s| self.pending(s, group));
        if let Some(bucket) = last_bucket {
            self.cursor = self.leases.buckets[bucket]
                .shards
                .last()
                .map_or(0, |s| s + 1);
        }
        for batch in &mut batches {
            batch.sort_unstable();
        }
        batches
    }

    /// The cells of `shard` the slowest consumer of `group` has yet to
    /// apply, as far as this worker knows the log head (at least 1, at most
    /// a page).
    fn pending(&self, shard: u32, group: &[bool]) -> usize {
        let from = self
            .offsets
            .get(&shard)
            .and_then(|o| {
                o.iter()
                    .zip(group)
                    .filter(|(_, in_group)| **in_group)
                    .map(|(o, _)| *o)
                    .min()
            })
            .unwrap_or(0);
        self.heads.get(&shard).map_or(1, |head| {
            usize::try_from(head.saturating_sub(from)).map_or(1, |n| n.clamp(1, apply::PAGE))
        })
    }

    /// Passes run at once: a server database takes concurrent writers,
    /// SQLite's single writer only lets one pass read while another writes.
    fn passes(&self, topology: &Topology) -> usize {
        match self.shared.options.passes {
            0 if topology.clusters[self.cluster]
                .master
                .dialect()
                .is_embedded() =>
            {
                2
            }
            0 => 4,
            n => n,
        }
    }

    /// Takes in the outcome of one pass over `batch` for the consumers of
    /// `group` (those of the versions being built when `building`).
    fn settle(
        &mut self,
        topology: &Topology,
        batch: &[u32],
        group: &[bool],
        building: bool,
        down: &BTreeSet<usize>,
        result: Result<apply::PassResult>,
    ) {
        match result {
            Ok(result) if result.abandoned => {
                // Its shards stay dirty; their buckets are left out of the
                // next rounds until the leases are renewed.
                tracing::debug!(datastore = %self.datastore, shards = batch.len(), "pass stopped at its lease deadline");
            }
            Ok(mut result) => {
                self.failures = 0;
                if building {
                    // Cells of a build are old by design: their delays
                    // say nothing of how far behind the live indexes are.
                    result.delays_us.clear();
                }
                for (shard, per) in &result.offsets {
                    // A build pass may end after its buckets were given up.
                    let Some(stored) = self.offsets.get_mut(shard) else {
                        continue;
                    };
                    for (c, value) in per.iter().enumerate() {
                        if *value != i64::MAX {
                            stored[c] = stored[c].max(*value);
                        }
                    }
                }
                for (target, err) in &result.failed_targets {
                    let (_, failures) = self
                        .down
                        .get(target)
                        .copied()
                        .unwrap_or((Instant::now(), 0));
                    let delay = Duration::from_millis(500 << failures.min(5));
                    tracing::warn!(datastore = %self.datastore, cluster = %topology.clusters[*target].name, error = %err, "index entries for this cluster wait until it is back");
                    self.down
                        .insert(*target, (Instant::now() + delay, failures + 1));
                }
                if result.failed_targets.is_empty() {
                    self.down.retain(|_, (until, _)| *until > Instant::now());
                }
                for shard in batch {
                    let caught_up = self.heads.get(shard).is_none_or(|head| {
                        self.offsets.get(shard).is_some_and(|offsets| {
                            offsets.iter().zip(&self.consumers).zip(group).all(
                                |((o, c), in_group)| {
                                    !in_group || down.contains(&c.target) || o >= head
                                },
                            )
                        })
                    });
                    if result.complete.contains(shard) && caught_up {
                        if building {
                            self.building.remove(shard);
                        } else {
                            self.dirty.remove(shard);
                        }
                    }
                }
                self.shared.record(&self.datastore, &result);
            }
            Err(Error::LeaseLost(name)) => {
                tracing::warn!(datastore = %self.datastore, lease = %name, "lease lost; leaving its shards to their new holder");
                if let Some(bucket) = self.leases.forget(&name) {
                    self.forget_shards(bucket);
                }
            }
            Err(err) => {
                self.failures += 1;
                let delay = Duration::from_millis(100 << self.failures.min(6));
                if err.is_transient() {
                    tracing::warn!(datastore = %self.datastore, error = %err, "index maintenance waits for its cluster");
                } else {
                    tracing::error!(datastore = %self.datastore, error = %err, "index maintenance pass failed; retrying");
                }
                self.backoff = Some(Instant::now() + delay);
            }
        }
    }

    /// Forgets a bucket's shards (another process holds it now).
    pub(super) fn forget_shards(&mut self, bucket: usize) {
        for shard in &self.leases.buckets[bucket].shards {
            self.offsets.remove(shard);
            self.dirty.remove(shard);
            self.building.remove(shard);
            self.heads.remove(shard);
        }
    }

    /// Compares log heads with offsets: marks held shards that are behind
    /// dirty, publishes the lag, and marks indexes that caught up ready.
    async fn sweep(&mut self) {
        if let Some(read) = self.start_sweep() {
            let outcome = read.await;
            self.swept(outcome);
        }
    }

    /// Starts the sweep's reads as a task of its own, so that passes keep
    /// starting while it reads every shard's head and offsets.
    fn start_sweep(&self) -> Option<JoinHandle<Option<Swept>>> {
        let topology = self.topology.upgrade()?;
        let ds = topology.datastore(&self.datastore).ok()?;
        let backend = topology.clusters[self.cluster].maintenance().ok()?.clone();
        let consumers = self.consumers.clone();
        let shared = self.shared.clone();
        let datastore = self.datastore.clone();
        // Offsets in memory only advance after the database's have, so
        // read before the database's they can never be ahead of them.
        let known = self.offsets.clone();
        Some(tokio::spawn(async move {
            let (lag, behind) = match lag::measure(backend.as_ref(), &ds, &consumers).await {
                Ok(measured) => measured,
                Err(err) => {
                    tracing::debug!(datastore = %datastore, error = %err, "sweep failed");
                    return None;
                }
            };
            let rewound = went_back(&known, &behind);
            mark_ready_indexes(&topology, &shared, &ds).await;
            Some((lag, behind, rewound))
        }))
    }

    /// Takes in what a sweep read.
    fn swept(&mut self, outcome: std::result::Result<Option<Swept>, tokio::task::JoinError>) {
        self.stalled = false;
        let Ok(Some((lag, behind, rewound))) = outcome else {
            return;
        };
        for row in &rewound {
            // The log went back: the master was replaced by a replica that
            // lacks its last cells (its counters and these offsets are the
            // replica's), or the offsets were rewound. Cells numbered again
            // from there must not be skipped: go on from the stored offset.
            if let Some(per) = self.offsets.get_mut(&row.shard) {
                tracing::warn!(datastore = %self.datastore, shard = row.shard, consumer = %self.consumers[row.consumer].name, memory = per[row.consumer], stored = row.offset, head = row.head, "a shard's log went back; maintaining it again from its stored offset");
                per[row.consumer] = row.offset;
                self.heads.insert(row.shard, row.head);
            }
        }
        let Some(topology) = self.topology.upgrade() else {
            return;
        };
        let Ok(ds) = topology.datastore(&self.datastore) else {
            return;
        };
        let down = self.targets_down();
        let building = self.building_consumers(&ds);
        for row in behind {
            if down.contains(&self.consumers[row.consumer].target) {
                continue;
            }
            if let Some(per) = self.offsets.get(&row.shard) {
                let known = self.heads.entry(row.shard).or_insert(0);
                *known = (*known).max(row.head);
                if per[row.consumer] < row.head {
                    if building[row.consumer] {
                        self.building.insert(row.shard);
                    } else {
                        self.dirty.insert(row.shard);
                    }
                }
            }
        }
        self.shared
            .lag
            .lock()
            .expect("lag")
            .insert((self.datastore.clone(), self.cluster), lag);
    }
}

/// The rows of `behind` whose stored offset is below the offset `known`
/// held in memory before it was read: the log went back.
fn went_back(known: &BTreeMap<u32, Vec<i64>>, behind: &[lag::Behind]) -> Vec<lag::Behind> {
    behind
        .iter()
        .filter(|row| {
            known
                .get(&row.shard)
                .and_then(|per| per.get(row.consumer))
                .is_some_and(|memory| *memory > row.offset)
        })
        .copied()
        .collect()
}

/// Whether the entry `key` (index, row) belongs to the pass over `batch`
/// for the consumers of `group`: its row is in one of the shards and its
/// index is one the group's consumers write.
fn in_batch_of(
    ds: &DatastoreRuntime,
    consumers: &[Consumer],
    batch: &[u32],
    group: &[bool],
    (index, row): &(usize, Uuid),
) -> bool {
    let written = consumers
        .iter()
        .zip(group)
        .any(|(c, in_group)| *in_group && c.index == *index);
    written && batch.contains(&crate::shards::row_shard(row, ds.def.shards))
}

/// Groups the dirty shards of `by_bucket`, whole buckets in `order`, into
/// at most `passes` batches of at most [`PASS_SHARDS`] shards, each ended
/// once the cells `pending` expects of its shards fill a page: the log read
/// of a pass gets cheaper with every shard it need not look at. Returns the
/// batches and the last bucket taken.
fn group_buckets(
    order: &[usize],
    by_bucket: &BTreeMap<usize, Vec<u32>>,
    passes: usize,
    pending: impl Fn(u32) -> usize,
) -> (Vec<Vec<u32>>, Option<usize>) {
    let mut batches: Vec<Vec<u32>> = Vec::new();
    let mut current: Vec<u32> = Vec::new();
    let mut cells = 0;
    let mut last_bucket = None;
    for &bucket in order {
        let shards = &by_bucket[&bucket];
        if !current.is_empty()
            && (current.len() + shards.len() > PASS_SHARDS || cells >= apply::PAGE)
        {
            batches.push(std::mem::take(&mut current));
            cells = 0;
            if batches.len() == passes {
                break;
            }
        }
        current.extend(shards);
        cells += shards.iter().map(|s| pending(*s)).sum::<usize>();
        last_bucket = Some(bucket);
    }
    if !current.is_empty() && batches.len() < passes {
        batches.push(current);
    }
    (batches, last_bucket)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 64 buckets of 64 shards, as 4,096 shards split over 64 leases.
    fn buckets() -> (Vec<usize>, BTreeMap<usize, Vec<u32>>) {
        let by_bucket: BTreeMap<usize, Vec<u32>> = (0..64)
            .map(|b| (b, (b as u32 * 64..(b as u32 + 1) * 64).collect()))
            .collect();
        (by_bucket.keys().copied().collect(), by_bucket)
    }

    #[test]
    fn a_backlog_fills_a_batch_with_a_page_of_cells_not_with_shards() {
        let (order, by_bucket) = buckets();
        // 49 cells behind on every shard: one bucket holds 3,136.
        let (batches, last) = group_buckets(&order, &by_bucket, 4, |_| 49);
        assert_eq!(batches.len(), 4);
        assert!(
            batches.iter().all(|b| b.len() == 64),
            "{:?}",
            batches.iter().map(Vec::len).collect::<Vec<_>>()
        );
        assert_eq!(last, Some(3));
    }

    #[test]
    fn shards_a_cell_behind_fill_a_batch_up_to_the_shard_limit() {
        let (order, by_bucket) = buckets();
        let (batches, last) = group_buckets(&order, &by_bucket, 2, |_| 1);
        assert_eq!(batches.len(), 2);
        assert!(batches.iter().all(|b| b.len() == PASS_SHARDS));
        assert_eq!(last, Some(31));
        // Fewer dirty buckets than a round can take: one batch of all.
        let (batches, last) = group_buckets(&order[..3], &by_bucket, 4, |_| 1);
        assert_eq!(batches, vec![(0..192).collect::<Vec<u32>>()]);
        assert_eq!(last, Some(2));
    }
}
