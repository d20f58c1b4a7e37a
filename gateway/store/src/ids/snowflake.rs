//! Snowflake IDs (and shard-tagged IDs) from a leased worker id.
//!
//! **Worker ids are leases** (`leases.rs`) named `snowflake-worker-<n>`,
//! `n < 1024`, on the ID cluster. A gateway takes a free one (never held,
//! or expired for at least [`TAKEOVER_MARGIN`]), renews it every third of
//! the lease time, and a worker id whose holder stopped renewing is
//! recycled once its lease expired. A gateway issues IDs only while its
//! lease is valid by its own clock: one that cannot renew stops at expiry,
//! and the next holder takes the id over only after the margin, so two
//! processes never issue with the same worker id (given clocks within the
//! margin of each other).
//!
//! **The disk cache** (`ids.snowflake.cache`) holds the holder name, the
//! worker id, its token and expiry, and a high-water mark of issued time:
//! before the generator issues in a millisecond past the mark it moves the
//! mark [`RESERVE_MS`] ahead and writes the file durably (fsync of the file
//! and its directory), so the file is never behind an issued ID; when the
//! write fails, issuing stops with `ID_SOURCE_UNAVAILABLE` rather than run
//! ahead of the mark. A restart reads it: a lease that has not expired is
//! used at once, with or without the database, and issuing waits (≤ 5 ms)
//! or refuses with `CLOCK_MOVED_BACKWARDS` until the clock passes the mark.
//! A clean shutdown writes the exact last time instead.
//!
//! **A cache belongs to one live process.** Several processes may share a
//! data directory (a blue/green restart on one host, two gateways in
//! tests), and a cached holder name renews its lease in the database for
//! whoever presents it. So each cache file is a *slot* guarded by an
//! exclusive lock on `<cache>.lock` (`flock`, released by the kernel when
//! the process dies): a process takes the first slot it can lock
//! (`snowflake-worker.json`, then `snowflake-worker.1.json`, …) and reads
//! only that slot's cache. A second process on the same directory thus
//! never sees the first one's holder name, and leases a worker id of its
//! own. With all [`CACHE_SLOTS`] locked the process runs without a cache
//! (and says so).
//!
//! **The clock** going back by at most 5 ms is waited out (twice the gap,
//! as in Leaf); by more, requests are refused, never answered with a
//! possible duplicate.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use super::clock::{Clock, SystemClock};
use super::tagged::{
    self, MAX_SEQUENCE, SNOWFLAKE_MAX_TIME, SNOWFLAKE_YEARS, TAGGED_MAX_SEQUENCE, TAGGED_MAX_TIME,
};
use super::IdsOptions;
use crate::error::{Error, Result};
use crate::leases::{self, Lease};
use crate::storage::Backend;

/// How long an expired worker lease stays untouched before another
/// process takes it: the bound on clock skew between gateways.
pub(crate) const TAKEOVER_MARGIN: Duration = Duration::from_secs(2);

/// How far the cached high-water mark runs ahead of issued time.
pub(crate) const RESERVE_MS: i64 = 1000;

/// Cache slots per configured cache path: processes that may share one
/// data directory at once.
pub(crate) const CACHE_SLOTS: usize = 16;

/// The longest clock step back that is waited out rather than refused.
pub(crate) const MAX_WAIT_BACK_MS: i64 = 5;

const LEASE_PREFIX: &str = "snowflake-worker-";

/// The lease name of worker `n`.
pub(crate) fn lease_name(n: u16) -> String {
    format!("{LEASE_PREFIX}{n}")
}

fn worker_of(name: &str) -> Option<u16> {
    name.strip_prefix(LEASE_PREFIX)?.parse().ok()
}

/// Where the worker lease stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseState {
    /// No worker id yet.
    None,
    /// Taken from the disk cache, not yet confirmed by the database.
    Cached,
    /// Held and renewed.
    Held,
    /// Held, but the latest renewal failed (issuing until it expires).
    Stale,
    /// Taken over by another process; a new one is being leased.
    Lost,
}

impl LeaseState {
    pub fn as_str(self) -> &'static str {
        match self {
            LeaseState::None => "none",
            LeaseState::Cached => "cached",
            LeaseState::Held => "held",
            LeaseState::Stale => "stale",
            LeaseState::Lost => "lost",
        }
    }
}

/// Snowflake figures for `/metrics`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnowflakeMetrics {
    pub worker_id: Option<u16>,
    pub lease_state: LeaseState,
    /// Milliseconds until the lease expires (0 without one).
    pub lease_remaining_ms: i64,
    /// IDs issued by this process (snowflake and tagged).
    pub issued: u64,
    /// Requests refused because the clock moved backwards.
    pub clock_refusals: u64,
}

/// The disk cache.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct CacheFile {
    holder: String,
    worker: u16,
    token: i64,
    expires_at_ms: i64,
    /// No ID was issued at or after this Unix millisecond.
    last_ms: i64,
    epoch_ms: i64,
}

struct Gen {
    lease: Option<(u16, Lease)>,
    state: LeaseState,
    last_ms: i64,
    seq: i64,
    /// Cached high-water mark of issued time.
    reserved_ms: i64,
    /// Tagged IDs are issued only in seconds (since the epoch) after this
    /// one: the second of the cached mark at start-up.
    tag_floor_sec: i64,
    tagged: HashMap<u16, (i64, i64)>,
    stopped: bool,
}

enum Issue {
    /// The clock is behind by a few ms: wait this long and try again.
    Wait(u64),
    Fail(Error),
}

/// The snowflake generator of one process.
pub(crate) struct Snowflake {
    backend: Arc<dyn Backend>,
    clock: Arc<dyn Clock>,
    epoch_ms: i64,
    ttl: Duration,
    max_workers: u16,
    holder: String,
    /// This process's cache slot: the file and the lock that makes it ours.
    cache: Option<PathBuf>,
    cache_lock: Mutex<Option<std::fs::File>>,
    gen: Mutex<Gen>,
    issued: AtomicU64,
    clock_refusals: AtomicU64,
    stop: tokio::sync::watch::Sender<bool>,
}

fn read_cache(path: &Path, epoch_ms: i64) -> Option<CacheFile> {
    let text = std::fs::read_to_string(path).ok()?;
    match serde_json::from_str::<CacheFile>(&text) {
        Ok(cache) if cache.epoch_ms == epoch_ms => Some(cache),
        Ok(_) => {
            tracing::warn!(path = %path.display(), "snowflake worker cache is for another epoch; ignored");
            None
        }
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "unreadable snowflake worker cache; ignored");
            None
        }
    }
}

/// Writes `text` to `path` durably: a temporary file, fsynced, renamed
/// over `path`, and the directory fsynced so the rename survives a crash.
fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write as _;
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension("tmp");
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(text.as_bytes())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Slot `n` of the configured cache path: the path itself for 0, else
/// `<stem>.<n>.<extension>`.
fn slot_path(path: &Path, n: usize) -> PathBuf {
    if n == 0 {
        return path.to_path_buf();
    }
    let stem = path.file_stem().unwrap_or_default().to_string_lossy();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{n}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{n}"),
    };
    path.with_file_name(name)
}

/// Locks the first free cache slot of `path`: its cache file and the held
/// lock. `None` when every slot is locked by another live process or the
/// lock files cannot be made.
fn lock_slot(path: &Path) -> Option<(PathBuf, std::fs::File)> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Err(error) = std::fs::create_dir_all(dir) {
            tracing::warn!(path = %dir.display(), %error, "cannot create the snowflake worker cache directory; running without a cache");
            return None;
        }
    }
    for n in 0..CACHE_SLOTS {
        let slot = slot_path(path, n);
        let mut lock_name = slot.as_os_str().to_owned();
        lock_name.push(".lock");
        let file = match std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(PathBuf::from(lock_name))
        {
            Ok(file) => file,
            Err(error) => {
                tracing::warn!(path = %slot.display(), %error, "cannot open the snowflake worker cache lock; running without a cache");
                return None;
            }
        };
        match file.try_lock() {
            Ok(()) => return Some((slot, file)),
            Err(std::fs::TryLockError::WouldBlock) => continue,
            Err(std::fs::TryLockError::Error(error)) => {
                tracing::warn!(path = %slot.display(), %error, "cannot lock the snowflake worker cache; running without a cache");
                return None;
            }
        }
    }
    tracing::warn!(
        path = %path.display(),
        slots = CACHE_SLOTS,
        "every snowflake worker cache slot is held by a running process; running without a cache"
    );
    None
}

impl Snowflake {
    /// Starts the generator: takes the cached worker id when its lease is
    /// still valid, and leases (then renews) one in the background.
    pub(crate) fn start(backend: Arc<dyn Backend>, options: &IdsOptions) -> Result<Arc<Snowflake>> {
        let clock: Arc<dyn Clock> = options.clock.clone().unwrap_or(Arc::new(SystemClock));
        let since = clock.now_ms() - options.epoch_ms;
        if !(0..=SNOWFLAKE_MAX_TIME).contains(&since) {
            return Err(Error::Config(format!(
                "ids.snowflake.epoch_ms {} is {}: snowflake IDs carry {SNOWFLAKE_YEARS} years of milliseconds from the epoch (their version bits must stay 0, or they would read as tagged IDs)",
                options.epoch_ms,
                if since < 0 { "in the future" } else { "too far back" },
            )));
        }
        let slot = options.worker_cache.as_deref().and_then(lock_slot);
        let cache = slot
            .as_ref()
            .and_then(|(path, _)| read_cache(path, options.epoch_ms));
        let (cache_path, cache_lock) = slot.unzip();
        let holder = cache.as_ref().map(|c| c.holder.clone()).unwrap_or_else(|| {
            format!(
                "ids-{}-{}",
                std::process::id(),
                &uuid::Uuid::new_v4().simple().to_string()[..12]
            )
        });
        let mut gen = Gen {
            lease: None,
            state: LeaseState::None,
            last_ms: 0,
            seq: 0,
            reserved_ms: 0,
            tag_floor_sec: i64::MIN,
            tagged: HashMap::new(),
            stopped: false,
        };
        if let Some(cache) = &cache {
            // Regression: a restart within the millisecond of the last
            // issued ID issued sequence 0 of it again. The cached
            // millisecond counts as used up; issuing starts after it.
            gen.last_ms = cache.last_ms;
            gen.seq = MAX_SEQUENCE + 1;
            gen.reserved_ms = cache.last_ms;
            gen.tag_floor_sec = (cache.last_ms - options.epoch_ms).div_euclid(1000);
            let expires_at = DateTime::from_timestamp_millis(cache.expires_at_ms);
            if let Some(expires_at) = expires_at.filter(|e| *e > Utc::now()) {
                gen.lease = Some((
                    cache.worker,
                    Lease {
                        name: lease_name(cache.worker),
                        token: cache.token,
                        expires_at,
                    },
                ));
                gen.state = LeaseState::Cached;
            }
        }
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let snowflake = Arc::new(Snowflake {
            backend,
            clock,
            epoch_ms: options.epoch_ms,
            ttl: options.worker_lease,
            max_workers: options.max_workers.clamp(1, super::MAX_WORKERS),
            holder,
            cache: cache_path,
            cache_lock: Mutex::new(cache_lock),
            gen: Mutex::new(gen),
            issued: AtomicU64::new(0),
            clock_refusals: AtomicU64::new(0),
            stop,
        });
        tokio::spawn(maintain(Arc::downgrade(&snowflake), stopped));
        Ok(snowflake)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Gen> {
        self.gen.lock().expect("snowflake lock")
    }

    pub(crate) fn worker_id(&self) -> Option<u16> {
        self.lock().lease.as_ref().map(|(w, _)| *w)
    }

    pub(crate) async fn wait_for_worker(&self, timeout: Duration) -> Result<u16> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(worker) = self.worker_id() {
                return Ok(worker);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::IdSourceUnavailable(
                    "no snowflake worker id is leased".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Records `last_ms` (and the lease) in this process's cache slot.
    /// `Ok` without a cache.
    fn write_cache(&self, gen: &Gen, last_ms: i64) -> std::io::Result<()> {
        let (Some(path), Some((worker, lease))) = (&self.cache, &gen.lease) else {
            return Ok(());
        };
        let file = CacheFile {
            holder: self.holder.clone(),
            worker: *worker,
            token: lease.token,
            expires_at_ms: lease.expires_at.timestamp_millis(),
            last_ms,
            epoch_ms: self.epoch_ms,
        };
        let text = serde_json::to_string(&file).expect("cache serializes");
        write_file(path, &text).inspect_err(|error| {
            tracing::warn!(path = %path.display(), %error, "cannot write the snowflake worker cache");
        })
    }

    /// Moves the high-water mark past `now`, durably, before an ID of
    /// millisecond `now` is issued; refuses to issue when the mark cannot
    /// be recorded.
    fn reserve(&self, gen: &mut Gen, now: i64) -> Result<(), Issue> {
        if now >= gen.reserved_ms {
            let mark = now + RESERVE_MS;
            self.write_cache(gen, mark).map_err(|_| {
                Issue::Fail(Error::IdSourceUnavailable(
                    "cannot record the snowflake high-water mark on disk".into(),
                ))
            })?;
            gen.reserved_ms = mark;
        }
        Ok(())
    }

    /// Checks the lease and the clock; returns the worker id and now.
    fn check(&self, gen: &Gen) -> Result<(u16, i64), Issue> {
        if gen.stopped {
            return Err(Issue::Fail(Error::IdSourceUnavailable(
                "the id generator is shutting down".into(),
            )));
        }
        let Some((worker, lease)) = &gen.lease else {
            return Err(Issue::Fail(Error::IdSourceUnavailable(
                "no snowflake worker id is leased yet".into(),
            )));
        };
        if lease.expires_at <= Utc::now() {
            return Err(Issue::Fail(Error::IdSourceUnavailable(
                "the snowflake worker lease expired and could not be renewed".into(),
            )));
        }
        let now = self.clock.now_ms();
        if now < gen.last_ms {
            let behind = gen.last_ms - now;
            if behind <= MAX_WAIT_BACK_MS {
                return Err(Issue::Wait((behind * 2) as u64));
            }
            self.clock_refusals.fetch_add(1, Relaxed);
            return Err(Issue::Fail(Error::ClockMovedBackwards {
                behind_ms: behind,
            }));
        }
        Ok((*worker, now))
    }

    fn issue(&self, count: usize) -> Result<Vec<i64>, Issue> {
        let mut gen = self.lock();
        let (worker, mut now) = self.check(&gen)?;
        let mut out = Vec::with_capacity(count);
        while out.len() < count {
            if now > gen.last_ms {
                check_time(now - self.epoch_ms)?;
                self.reserve(&mut gen, now)?;
                gen.last_ms = now;
                gen.seq = 0;
            } else if gen.seq > MAX_SEQUENCE {
                // This millisecond is used up: spin into the next one.
                self.clock.spin();
                now = self.clock.now_ms();
                if gen.last_ms - now > MAX_WAIT_BACK_MS {
                    self.clock_refusals.fetch_add(1, Relaxed);
                    return Err(Issue::Fail(Error::ClockMovedBackwards {
                        behind_ms: gen.last_ms - now,
                    }));
                }
                continue;
            }
            let ms = gen.last_ms - self.epoch_ms;
            check_time(ms)?;
            out.push(tagged::snowflake(ms, worker, gen.seq));
            gen.seq += 1;
        }
        self.issued.fetch_add(count as u64, Relaxed);
        Ok(out)
    }

    /// Up to `count` tagged IDs of `shard`; fewer when the shard's
    /// sequence of this second ran out. The second element is how long
    /// to wait for the next second when none could be issued.
    fn issue_tagged(&self, shard: u16, count: usize) -> Result<(Vec<i64>, u64), Issue> {
        let mut gen = self.lock();
        let (worker, now) = self.check(&gen)?;
        let since = now - self.epoch_ms;
        let sec = since.div_euclid(1000);
        let next_second = (1000 - since.rem_euclid(1000)) as u64;
        if !(0..=TAGGED_MAX_TIME).contains(&sec) {
            return Err(Issue::Fail(Error::Config(
                "the clock is outside the 34 years after ids.snowflake.epoch_ms".into(),
            )));
        }
        if sec <= gen.tag_floor_sec {
            return Ok((Vec::new(), next_second));
        }
        if now > gen.last_ms {
            self.reserve(&mut gen, now)?;
            gen.last_ms = now;
            gen.seq = 0;
        }
        let entry = gen.tagged.entry(shard).or_insert((sec, 0));
        if entry.0 != sec {
            *entry = (sec, 0);
        }
        let mut out = Vec::with_capacity(count);
        while out.len() < count && entry.1 <= TAGGED_MAX_SEQUENCE {
            out.push(tagged::tagged(shard, sec, worker, entry.1));
            entry.1 += 1;
        }
        self.issued.fetch_add(out.len() as u64, Relaxed);
        Ok((out, next_second))
    }

    /// `count` snowflake IDs.
    pub(crate) async fn next(&self, count: usize) -> Result<Vec<i64>> {
        match self.issue(count) {
            Ok(ids) => Ok(ids),
            Err(Issue::Fail(err)) => Err(err),
            Err(Issue::Wait(ms)) => {
                self.clock.sleep(ms).await;
                match self.issue(count) {
                    Ok(ids) => Ok(ids),
                    Err(Issue::Fail(err)) => Err(err),
                    Err(Issue::Wait(ms)) => {
                        self.clock_refusals.fetch_add(1, Relaxed);
                        Err(Error::ClockMovedBackwards {
                            behind_ms: (ms / 2) as i64,
                        })
                    }
                }
            }
        }
    }

    /// `count` tagged IDs of `shard`.
    pub(crate) async fn next_tagged(&self, shard: u16, count: usize) -> Result<Vec<i64>> {
        let mut out = Vec::with_capacity(count);
        let mut waited_back = false;
        while out.len() < count {
            match self.issue_tagged(shard, count - out.len()) {
                Ok((ids, next_second)) => {
                    if ids.is_empty() {
                        self.clock.sleep(next_second).await;
                    }
                    out.extend(ids);
                }
                Err(Issue::Fail(err)) => return Err(err),
                Err(Issue::Wait(ms)) if !waited_back => {
                    waited_back = true;
                    self.clock.sleep(ms).await;
                }
                Err(Issue::Wait(ms)) => {
                    self.clock_refusals.fetch_add(1, Relaxed);
                    return Err(Error::ClockMovedBackwards {
                        behind_ms: (ms / 2) as i64,
                    });
                }
            }
        }
        Ok(out)
    }

    pub(crate) fn metrics(&self) -> SnowflakeMetrics {
        let gen = self.lock();
        SnowflakeMetrics {
            worker_id: gen.lease.as_ref().map(|(w, _)| *w),
            lease_state: gen.state,
            lease_remaining_ms: gen
                .lease
                .as_ref()
                .map(|(_, l)| (l.expires_at - Utc::now()).num_milliseconds().max(0))
                .unwrap_or(0),
            issued: self.issued.load(Relaxed),
            clock_refusals: self.clock_refusals.load(Relaxed),
        }
    }

    /// Stops issuing and renewing; writes the exact last issued time and
    /// gives the cache slot up for the next process.
    pub(crate) fn shutdown(&self) {
        let _ = self.stop.send(true);
        let mut gen = self.lock();
        gen.stopped = true;
        let last = gen.last_ms;
        if self.write_cache(&gen, last).is_ok() {
            // The slot is released only with the exact time written: with
            // the write failed, the reserved mark on disk still covers
            // every issued ID, and the lock goes with the process.
            drop(self.cache_lock.lock().expect("cache lock").take());
        }
    }

    /// Renews the lease held, or leases a worker id when none is held.
    async fn round(&self) {
        let held = self.lock().lease.as_ref().map(|(_, l)| l.clone());
        if let Some(lease) = held {
            match leases::renew(self.backend.as_ref(), &self.holder, &[lease], self.ttl).await {
                Ok(renewed) => {
                    let mut gen = self.lock();
                    match renewed.into_iter().next() {
                        Some(lease) => {
                            if let Some((_, held)) = gen.lease.as_mut() {
                                held.expires_at = lease.expires_at;
                            }
                            gen.state = LeaseState::Held;
                            let mark = gen.reserved_ms.max(gen.last_ms);
                            // A failed write is logged; the mark on disk
                            // still covers every issued ID.
                            let _ = self.write_cache(&gen, mark);
                            return;
                        }
                        None => {
                            tracing::warn!(holder = %self.holder, "snowflake worker lease was taken over; leasing another worker id");
                            gen.lease = None;
                            gen.state = LeaseState::Lost;
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot renew the snowflake worker lease");
                    let mut gen = self.lock();
                    // A lease from the cache stays "cached" until the
                    // database confirms it.
                    if gen.state == LeaseState::Held {
                        gen.state = LeaseState::Stale;
                    }
                    return;
                }
            }
        }
        if let Err(error) = self.acquire().await {
            tracing::warn!(%error, "cannot lease a snowflake worker id");
        }
    }

    async fn acquire(&self) -> Result<()> {
        let backend = self.backend.as_ref();
        let names: Vec<String> = (0..self.max_workers).map(lease_name).collect();
        leases::ensure(backend, &names).await?;
        let rows = leases::list(backend, LEASE_PREFIX).await?;
        let now = Utc::now();
        let margin = chrono::Duration::from_std(TAKEOVER_MARGIN).unwrap_or_default();
        let cached = {
            let gen = self.lock();
            gen.lease.as_ref().map(|(w, _)| *w)
        };
        let mut candidates: Vec<&leases::LeaseRow> = rows
            .iter()
            .filter(|r| worker_of(&r.name).is_some_and(|w| w < self.max_workers))
            .filter(|r| r.holder == self.holder || r.expires_at + margin < now)
            .collect();
        // Our own lease first (a restart), then free ones in random order
        // so that gateways starting together do not race for the same row.
        use rand::seq::SliceRandom as _;
        candidates.shuffle(&mut rand::thread_rng());
        candidates.sort_by_key(|r| {
            (
                worker_of(&r.name) != cached || cached.is_none(),
                r.holder != self.holder,
            )
        });
        for row in candidates {
            if let Some(lease) =
                leases::acquire(backend, row, &self.holder, self.ttl, TAKEOVER_MARGIN).await?
            {
                let worker = worker_of(&lease.name).expect("worker lease name");
                let mut gen = self.lock();
                gen.lease = Some((worker, lease));
                gen.state = LeaseState::Held;
                let mark = gen.reserved_ms.max(gen.last_ms);
                let _ = self.write_cache(&gen, mark);
                tracing::info!(worker, holder = %self.holder, "leased snowflake worker id");
                return Ok(());
            }
        }
        Err(Error::IdSourceUnavailable(format!(
            "all {} snowflake worker ids are leased",
            self.max_workers
        )))
    }
}

/// Refuses a time (milliseconds since the epoch) outside the snowflake
/// range: before the epoch, or at or past [`SNOWFLAKE_MAX_TIME`], where the
/// top time bits would read as a tagged layout version (`tagged.rs`).
fn check_time(ms: i64) -> Result<(), Issue> {
    if (0..=SNOWFLAKE_MAX_TIME).contains(&ms) {
        return Ok(());
    }
    Err(Issue::Fail(Error::IdSourceUnavailable(if ms < 0 {
        "the clock is before ids.snowflake.epoch_ms".to_string()
    } else {
        format!(
            "snowflake IDs run out {} years after ids.snowflake.epoch_ms (the clock is past it)",
            SNOWFLAKE_YEARS
        )
    })))
}

/// The background task: a round at once, then every third of the lease
/// time (every second while no worker id is held), until stopped or the
/// generator is dropped.
async fn maintain(snowflake: Weak<Snowflake>, mut stopped: tokio::sync::watch::Receiver<bool>) {
    loop {
        let every = {
            let Some(snowflake) = snowflake.upgrade() else {
                return;
            };
            snowflake.round().await;
            let third = (snowflake.ttl / 3).max(Duration::from_millis(20));
            if snowflake.worker_id().is_some() {
                third
            } else {
                third.min(Duration::from_secs(1))
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stopped.changed() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_names_round_trip() {
        assert_eq!(lease_name(17), "snowflake-worker-17");
        assert_eq!(worker_of("snowflake-worker-17"), Some(17));
        assert_eq!(worker_of("member:x"), None);
    }
}
