//! ID allocation on every backend: segments shared by several stores,
//! the double buffer against a slow or absent database, snowflake worker
//! leases, the clock and the disk cache.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cellgate_store::ids::{Clock as _, Ids, IdsOptions, ManualClock, NewTag};
use cellgate_store::storage::{self, Backend, ColType, ConnectOptions, Dialect, Row, Sql, Tx};

use crate::harness::Env;

fn tag(name: &str, step: i64) -> NewTag {
    NewTag {
        name: name.to_string(),
        start: 1,
        step,
        description: "test".to_string(),
    }
}

fn segment_options(min_step: i64, max_step: i64, prefetch: bool) -> IdsOptions {
    IdsOptions {
        prefetch,
        min_step,
        max_step,
        snowflake: false,
        ..IdsOptions::default()
    }
}

/// A backend that answers every statement `delay` late, or not at all
/// while `down` is set.
struct Flaky {
    inner: Arc<dyn Backend>,
    delay: Duration,
    down: Arc<AtomicBool>,
}

fn unavailable() -> cellgate_store::Error {
    cellgate_store::Error::Unavailable {
        cluster: "main".into(),
        source: sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "down for the test",
        )),
    }
}

impl Flaky {
    async fn gate(&self) -> cellgate_store::Result<()> {
        if self.down.load(Ordering::SeqCst) {
            return Err(unavailable());
        }
        tokio::time::sleep(self.delay).await;
        Ok(())
    }
}

struct FlakyTx {
    inner: Box<dyn Tx>,
    delay: Duration,
}

#[async_trait]
impl Tx for FlakyTx {
    async fn fetch(&mut self, sql: &Sql, cols: &[ColType]) -> cellgate_store::Result<Vec<Row>> {
        tokio::time::sleep(self.delay).await;
        self.inner.fetch(sql, cols).await
    }
    async fn execute(&mut self, sql: &Sql) -> cellgate_store::Result<u64> {
        tokio::time::sleep(self.delay).await;
        self.inner.execute(sql).await
    }
    async fn commit(self: Box<Self>) -> cellgate_store::Result<()> {
        tokio::time::sleep(self.delay).await;
        self.inner.commit().await
    }
}

#[async_trait]
impl Backend for Flaky {
    fn dialect(&self) -> Dialect {
        self.inner.dialect()
    }
    fn cluster(&self) -> &str {
        self.inner.cluster()
    }
    async fn fetch(&self, sql: &Sql, cols: &[ColType]) -> cellgate_store::Result<Vec<Row>> {
        self.gate().await?;
        self.inner.fetch(sql, cols).await
    }
    async fn execute(&self, sql: &Sql) -> cellgate_store::Result<u64> {
        self.gate().await?;
        self.inner.execute(sql).await
    }
    async fn begin(&self) -> cellgate_store::Result<Box<dyn Tx>> {
        self.gate().await?;
        Ok(Box::new(FlakyTx {
            inner: self.inner.begin().await?,
            delay: self.delay,
        }))
    }
    async fn ping(&self) -> cellgate_store::Result<()> {
        self.gate().await?;
        self.inner.ping().await
    }
    fn statements(&self) -> u64 {
        self.inner.statements()
    }
    async fn close(&self) {
        self.inner.close().await
    }
}

/// The prepared test database behind a [`Flaky`] wrapper.
async fn flaky(env: &Env, delay: Duration) -> (Arc<dyn Backend>, Arc<AtomicBool>) {
    // Opening a store prepares the cluster, ID tables included.
    env.open_with(false).await;
    let inner = storage::connect(&env.url, &ConnectOptions::default())
        .await
        .unwrap();
    let down = Arc::new(AtomicBool::new(false));
    let backend: Arc<dyn Backend> = Arc::new(Flaky {
        inner,
        delay,
        down: down.clone(),
    });
    (backend, down)
}

pub async fn segment_allocators_never_hand_out_an_id_twice(env: Arc<Env>) {
    const ALLOCATORS: usize = 4;
    const PER_ALLOCATOR: usize = 300_000;
    const BATCH: usize = 500;
    let mut stores = Vec::new();
    for _ in 0..ALLOCATORS {
        stores.push(
            env.open_tuned(|o| {
                o.maintain_indexes = false;
                // A small ceiling keeps the stores going back to the row.
                o.ids = segment_options(1000, 20_000, true);
            })
            .await,
        );
    }
    assert!(stores[0]
        .ids()
        .create_tag(&tag("order", 1000))
        .await
        .unwrap());
    assert!(!stores[1].ids().create_tag(&tag("order", 5)).await.unwrap());
    let started = Instant::now();
    let tasks: Vec<_> = stores
        .iter()
        .map(|store| {
            let ids = store.ids().clone();
            tokio::spawn(async move {
                let mut got = Vec::with_capacity(PER_ALLOCATOR);
                while got.len() < PER_ALLOCATOR {
                    got.extend(ids.next_ids("order", BATCH).await.unwrap());
                }
                got
            })
        })
        .collect();
    let mut all = HashSet::with_capacity(ALLOCATORS * PER_ALLOCATOR);
    let mut loads = 0;
    for (task, store) in tasks.into_iter().zip(&stores) {
        let got = task.await.unwrap();
        assert!(
            got.windows(2).all(|w| w[0] < w[1]),
            "IDs of one allocator increase"
        );
        for id in got {
            assert!(id >= 1);
            assert!(all.insert(id), "ID {id} handed out twice");
        }
        loads += store.ids().metrics().tags[0].segment_loads;
    }
    assert_eq!(all.len(), ALLOCATORS * PER_ALLOCATOR);
    assert!(loads >= 8, "the stores shared the row: {loads} segments");
    eprintln!(
        "{} IDs from {ALLOCATORS} stores in {:?} ({loads} segments)",
        all.len(),
        started.elapsed()
    );
    let stored = stores[0].ids().tags().await.unwrap();
    assert_eq!(stored.len(), 1);
    assert!(stored[0].max_id > *all.iter().max().unwrap());
}

/// Takes `n` IDs one at a time with a pause between them; returns the
/// slowest call after the first and the IDs.
async fn paced(ids: &Ids, n: usize, pause: Duration) -> (Duration, Vec<i64>) {
    let mut slowest = Duration::ZERO;
    let mut got = Vec::new();
    for i in 0..n {
        let start = Instant::now();
        got.extend(ids.next_ids("paced", 1).await.unwrap());
        if i > 0 {
            slowest = slowest.max(start.elapsed());
        }
        tokio::time::sleep(pause).await;
    }
    (slowest, got)
}

pub async fn a_segment_switch_never_waits_on_the_database_with_prefetch(env: Arc<Env>) {
    // A segment load is 4 statements each held back 10 ms: at least 40 ms.
    // The 90 IDs after the 10% mark take at least 900 ms, over 20 times
    // that, so a prefetched segment is there in time even on a loaded
    // machine, and a request that waits shows it.
    let (backend, _) = flaky(&env, Duration::from_millis(10)).await;
    let on = Ids::open(backend.clone(), segment_options(100, 100, true))
        .await
        .unwrap();
    on.create_tag(&tag("paced", 100)).await.unwrap();
    let (_, got) = paced(&on, 450, Duration::from_millis(10)).await;
    let metrics = &on.metrics().tags[0];
    assert!(metrics.segment_loads >= 5, "{metrics:?}");
    assert_eq!(
        metrics.boundary_waits, 0,
        "no request waited for a load: {metrics:?}"
    );
    assert!(got.windows(2).all(|w| w[0] < w[1]));

    // The same pace without prefetch waits at every boundary, each time
    // for a whole load: the test can tell the two apart.
    let off = Ids::open(backend, segment_options(100, 100, false))
        .await
        .unwrap();
    let (slowest, _) = paced(&off, 250, Duration::from_millis(3)).await;
    let metrics = &off.metrics().tags[0];
    assert!(metrics.boundary_waits >= 2, "{metrics:?}");
    assert!(slowest >= Duration::from_millis(40), "slowest {slowest:?}");
}

pub async fn segments_serve_from_memory_while_the_database_is_down(env: Arc<Env>) {
    let (backend, down) = flaky(&env, Duration::ZERO).await;
    let ids = Ids::open(backend, segment_options(1000, 1000, true))
        .await
        .unwrap();
    ids.create_tag(&tag("outage", 1000)).await.unwrap();
    let mut seen: HashSet<i64> = HashSet::new();
    // Past 10%: the next segment is being loaded; wait until it is there.
    seen.extend(ids.next_ids("outage", 200).await.unwrap());
    let deadline = Instant::now() + Duration::from_secs(5);
    while ids.segment_state()[0].next.is_none() {
        assert!(Instant::now() < deadline, "the next segment was loaded");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    down.store(true, Ordering::SeqCst);
    let mut served_down = 0;
    let error = loop {
        match ids.next_ids("outage", 100).await {
            Ok(got) => {
                served_down += got.len();
                for id in got {
                    assert!(seen.insert(id), "{id} twice");
                }
            }
            Err(error) => break error,
        }
    };
    assert_eq!(error.code(), "ID_SOURCE_UNAVAILABLE", "{error}");
    assert!(error.is_transient());
    assert!(
        served_down >= 1800,
        "both buffers were served while the database was down: {served_down}"
    );
    down.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(250)).await;
    for id in ids.next_ids("outage", 100).await.unwrap() {
        assert!(seen.insert(id), "{id} twice after the outage");
    }
}

pub async fn unknown_biz_tags_are_refused_not_created(env: Arc<Env>) {
    let store = env
        .open_tuned(|o| o.ids = segment_options(1000, 1000, true))
        .await;
    let error = store.ids().next_ids("typo", 1).await.unwrap_err();
    assert_eq!(error.code(), "UNKNOWN_BIZ_TAG");
    let error = store.ids().next_ids("typo", 1).await.unwrap_err();
    assert_eq!(error.code(), "UNKNOWN_BIZ_TAG");
    assert!(store.ids().tags().await.unwrap().is_empty());
    assert!(
        store.ids().segment_state().is_empty(),
        "typos are forgotten"
    );
    let error = store.ids().next_ids("bad tag", 1).await.unwrap_err();
    assert_eq!(error.code(), "BAD_USER_INPUT");
    let error = store.ids().next_ids("a", 0).await.unwrap_err();
    assert_eq!(error.code(), "BAD_USER_INPUT");
}

fn snowflake_options(clock: Option<Arc<ManualClock>>, dir: &std::path::Path) -> IdsOptions {
    IdsOptions {
        snowflake: true,
        worker_lease: Duration::from_millis(1000),
        worker_cache: Some(dir.join("worker.json")),
        clock: clock.map(|c| c as Arc<dyn cellgate_store::ids::Clock>),
        max_workers: 1,
        ..IdsOptions::default()
    }
}

pub async fn snowflake_clock_rollback_waits_or_refuses(env: Arc<Env>) {
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let t = cellgate_store::ids::DEFAULT_EPOCH_MS + 1_000_000;
    let clock = Arc::new(ManualClock::new(t));
    let ids = Ids::open(backend, snowflake_options(Some(clock.clone()), dir.path()))
        .await
        .unwrap();
    ids.wait_for_worker(Duration::from_secs(5)).await.unwrap();
    let mut all = ids.snowflake_ids(10_000).await.unwrap();
    let last = clock.now_ms();
    assert!(last > t, "a used-up millisecond moves on to the next");
    // Back by 3 ms: waited out.
    clock.set(last - 3);
    all.extend(ids.snowflake_ids(10).await.unwrap());
    // Back by 100 ms: refused, however often asked.
    let now = clock.now_ms();
    clock.set(now - 100);
    for _ in 0..3 {
        let error = ids.snowflake_ids(1).await.unwrap_err();
        assert_eq!(error.code(), "CLOCK_MOVED_BACKWARDS", "{error}");
    }
    clock.set(now + 1);
    all.extend(ids.snowflake_ids(10).await.unwrap());
    assert!(
        all.windows(2).all(|w| w[0] < w[1]),
        "increasing, no duplicate"
    );
    let decoded = ids.decode(all[0]).unwrap();
    assert_eq!(decoded.time.timestamp_millis(), t);
    assert_eq!(decoded.worker, 0);
}

pub async fn snowflake_worker_ids_are_recycled_after_the_lease_expires(env: Arc<Env>) {
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let first_dir = tempfile::tempdir().unwrap();
    let second_dir = tempfile::tempdir().unwrap();
    let first = Ids::open(backend.clone(), snowflake_options(None, first_dir.path()))
        .await
        .unwrap();
    assert_eq!(
        first.wait_for_worker(Duration::from_secs(5)).await.unwrap(),
        0
    );
    let before = first.snowflake_ids(100).await.unwrap();
    let second = Ids::open(backend, snowflake_options(None, second_dir.path()))
        .await
        .unwrap();
    // The only worker id is held and renewed.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(second.worker_id(), None);
    assert_eq!(
        second.snowflake_ids(1).await.unwrap_err().code(),
        "ID_SOURCE_UNAVAILABLE"
    );
    // The first gateway dies without releasing its lease.
    drop(first);
    assert_eq!(
        second
            .wait_for_worker(Duration::from_secs(10))
            .await
            .unwrap(),
        0,
        "the expired worker id was recycled"
    );
    let after = second.snowflake_ids(100).await.unwrap();
    assert!(after[0] > *before.last().unwrap());
}

pub async fn snowflake_restarts_from_the_disk_cache_with_the_database_down(env: Arc<Env>) {
    let (backend, down) = flaky(&env, Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let options = || IdsOptions {
        worker_lease: Duration::from_secs(60),
        max_workers: 4,
        ..snowflake_options(None, dir.path())
    };
    let ids = Ids::open(backend.clone(), options()).await.unwrap();
    let worker = ids.wait_for_worker(Duration::from_secs(5)).await.unwrap();
    let before = ids.snowflake_ids(1000).await.unwrap();
    ids.shutdown().await;
    drop(ids);

    down.store(true, Ordering::SeqCst);
    let restarted = Ids::open(backend.clone(), options()).await.unwrap();
    assert_eq!(
        restarted.worker_id(),
        Some(worker),
        "worker id from the cache"
    );
    let after = restarted.snowflake_ids(1000).await.unwrap();
    assert!(after[0] > *before.last().unwrap());
    assert_eq!(
        restarted.metrics().snowflake.unwrap().lease_state.as_str(),
        "cached"
    );

    // A crash leaves the cached mark ahead of the last ID: a restart whose
    // clock is behind it refuses until the clock passes it.
    drop(restarted);
    released(&dir.path().join("worker.json.lock")).await;
    let now = chrono::Utc::now().timestamp_millis();
    let clock = Arc::new(ManualClock::new(now - 500));
    let crashed = Ids::open(
        backend,
        IdsOptions {
            clock: Some(clock.clone() as Arc<dyn cellgate_store::ids::Clock>),
            ..options()
        },
    )
    .await
    .unwrap();
    let error = crashed.snowflake_ids(1).await.unwrap_err();
    assert_eq!(error.code(), "CLOCK_MOVED_BACKWARDS", "{error}");
    clock.set(now + 2000);
    let later = crashed.snowflake_ids(10).await.unwrap();
    assert!(later[0] > *after.last().unwrap());
}

/// Waits until no allocator holds the cache slot locked by `lock`: a
/// dropped allocator lets it go once its background task has finished the
/// round it was in, as a dead process's lock goes with the process.
async fn released(lock: &std::path::Path) {
    let file = std::fs::File::open(lock).expect("lock file");
    let deadline = Instant::now() + Duration::from_secs(10);
    while file.try_lock().is_err() {
        assert!(Instant::now() < deadline, "cache slot still locked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

pub async fn tagged_ids_name_the_shard_of_their_row(env: Arc<Env>) {
    let store = env
        .open_tuned(|o| {
            o.maintain_indexes = false;
            o.ids.snowflake = true;
        })
        .await;
    store
        .ids()
        .wait_for_worker(Duration::from_secs(5))
        .await
        .unwrap();
    let row = uuid::Uuid::new_v4();
    let shard = store.row_shard("trips", &row).unwrap();
    let mut ids = store.ids().tagged_ids(shard, 512).await.unwrap();
    ids.extend(store.ids().tagged_ids(shard, 88).await.unwrap());
    let unique: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(unique.len(), 600, "beyond 512 a second, the next second");
    for id in &ids {
        let decoded = store.ids().decode(*id).unwrap();
        assert_eq!(decoded.shard, Some(shard as u16));
        assert_eq!(decoded.version, 1);
    }
}

// Regression: a restart within the millisecond of the last issued ID
// issued sequence 0 of that millisecond again.
pub async fn snowflake_restart_in_the_same_millisecond_issues_no_duplicate(env: Arc<Env>) {
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(
        cellgate_store::ids::DEFAULT_EPOCH_MS + 5_000,
    ));
    let options = || IdsOptions {
        worker_lease: Duration::from_secs(60),
        ..snowflake_options(Some(clock.clone()), dir.path())
    };
    let ids = Ids::open(backend.clone(), options()).await.unwrap();
    ids.wait_for_worker(Duration::from_secs(5)).await.unwrap();
    let before = ids.snowflake_ids(3).await.unwrap();
    ids.shutdown().await;
    drop(ids);
    let restarted = Ids::open(backend, options()).await.unwrap();
    let after = restarted.snowflake_ids(3).await.unwrap();
    assert!(
        after[0] > *before.last().unwrap(),
        "{before:?} then {after:?}"
    );
}

// Regression: `taggedIds(count: 10000)` for one shard slept about 20 s
// (512 a second) while other callers for that shard waited behind it.
pub async fn tagged_ids_per_call_are_capped_at_a_seconds_worth(env: Arc<Env>) {
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let ids = Ids::open(backend, snowflake_options(None, dir.path()))
        .await
        .unwrap();
    ids.wait_for_worker(Duration::from_secs(5)).await.unwrap();
    let error = ids.tagged_ids(7, 10_000).await.unwrap_err();
    assert_eq!(error.code(), "LIMIT_EXCEEDED", "{error}");
    let error = ids.tagged_ids(7, 513).await.unwrap_err();
    assert_eq!(error.code(), "LIMIT_EXCEEDED", "{error}");
    assert_eq!(ids.tagged_ids(7, 512).await.unwrap().len(), 512);
}

// Regression: a configured tag with step 0 or below was accepted and its
// segments lowered max_id, so IDs were handed out again.
pub async fn configured_tags_with_a_step_below_one_are_refused(env: Arc<Env>) {
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    for step in [0, -5] {
        let options = IdsOptions {
            tags: vec![tag("orders", step)],
            ..segment_options(1, 1000, false)
        };
        let error = match Ids::open(backend.clone(), options).await {
            Ok(_) => panic!("step {step} was accepted"),
            Err(error) => error,
        };
        assert_eq!(error.code(), "CONFIG", "{error}");
        assert!(
            error.to_string().contains("step must be at least 1"),
            "{error}"
        );
    }
    // Nothing was created, and a tag created through the API is checked the
    // same way.
    let ids = Ids::open(backend, segment_options(1, 1000, false))
        .await
        .unwrap();
    assert_eq!(
        ids.next_ids("orders", 1).await.unwrap_err().code(),
        "UNKNOWN_BIZ_TAG"
    );
    let error = ids.create_tag(&tag("orders", 0)).await.unwrap_err();
    assert_eq!(error.code(), "BAD_USER_INPUT");
}

// Regression: snowflake IDs issued 2^39 ms or more after the epoch set the
// version bits of the tagged layout, decoded as tagged IDs and could
// collide with them.
pub async fn snowflake_ids_never_enter_the_tagged_layout(env: Arc<Env>) {
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let epoch = cellgate_store::ids::DEFAULT_EPOCH_MS;
    let last_ms = epoch + (1i64 << 39) - 1;
    let clock = Arc::new(ManualClock::new(last_ms - 2));
    let ids = Ids::open(
        backend.clone(),
        snowflake_options(Some(clock.clone()), dir.path()),
    )
    .await
    .unwrap();
    ids.wait_for_worker(Duration::from_secs(5)).await.unwrap();
    let mut issued = ids.snowflake_ids(4096 * 2).await.unwrap();
    issued.extend(ids.snowflake_ids(4096).await.unwrap());
    for id in [issued[0], *issued.last().unwrap()] {
        let decoded = ids.decode(id).unwrap();
        assert_eq!(decoded.kind, cellgate_store::ids::IdKind::Snowflake, "{id}");
        assert_eq!(decoded.version, 0);
    }
    // The next milliseconds would carry version bits: refused, also when
    // the sequence of the last one runs out.
    let error = ids.snowflake_ids(4096 * 2).await.unwrap_err();
    assert_eq!(error.code(), "ID_SOURCE_UNAVAILABLE", "{error}");
    clock.set(last_ms + 1);
    let error = ids.snowflake_ids(1).await.unwrap_err();
    assert_eq!(error.code(), "ID_SOURCE_UNAVAILABLE", "{error}");
    assert!(error.client_message().contains("17 years"), "{error}");
    // Tagged IDs keep their own 34 years.
    let tagged = ids.tagged_ids(5, 3).await.unwrap();
    assert_eq!(ids.decode(tagged[0]).unwrap().shard, Some(5));
    ids.shutdown().await;
    drop(ids);

    // An epoch that puts the clock past the range is refused at start-up.
    let error = match Ids::open(
        backend,
        IdsOptions {
            clock: Some(
                Arc::new(ManualClock::new(last_ms + 1)) as Arc<dyn cellgate_store::ids::Clock>
            ),
            ..snowflake_options(None, dir.path())
        },
    )
    .await
    {
        Ok(_) => panic!("an epoch more than 2^39 ms back was accepted"),
        Err(error) => error,
    };
    assert_eq!(error.code(), "CONFIG", "{error}");
}

// Regression: a failed write of the high-water mark only logged a warning
// while issuing went on, so after a crash with the clock set back IDs
// could repeat.
pub async fn snowflake_stops_when_its_high_water_mark_cannot_be_recorded(env: Arc<Env>) {
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let cache_dir = dir.path().join("cache");
    std::fs::create_dir(&cache_dir).unwrap();
    let clock = Arc::new(ManualClock::new(
        cellgate_store::ids::DEFAULT_EPOCH_MS + 10_000,
    ));
    let ids = Ids::open(backend, snowflake_options(Some(clock.clone()), &cache_dir))
        .await
        .unwrap();
    ids.wait_for_worker(Duration::from_secs(5)).await.unwrap();
    let first = ids.snowflake_ids(10).await.unwrap();
    let mark = |path: &std::path::Path| -> i64 {
        let text = std::fs::read_to_string(path).unwrap();
        serde_json::from_str::<serde_json::Value>(&text).unwrap()["last_ms"]
            .as_i64()
            .unwrap()
    };
    let on_disk = mark(&cache_dir.join("worker.json"));
    assert!(
        on_disk > clock.now_ms(),
        "the mark runs ahead of issued time"
    );
    // Within the reserved second IDs need no write.
    clock.set(clock.now_ms() + 500);
    let more = ids.snowflake_ids(10).await.unwrap();
    assert!(more[0] > *first.last().unwrap());
    // The cache directory becomes unwritable (a file stands in its place):
    // past the mark, issuing stops instead of running ahead of the disk.
    std::fs::rename(&cache_dir, dir.path().join("moved")).unwrap();
    std::fs::write(&cache_dir, "not a directory").unwrap();
    clock.set(on_disk + 1);
    let error = ids.snowflake_ids(1).await.unwrap_err();
    assert_eq!(error.code(), "ID_SOURCE_UNAVAILABLE", "{error}");
    assert_eq!(mark(&dir.path().join("moved").join("worker.json")), on_disk);
    // Writable again: issuing resumes past the old mark.
    std::fs::remove_file(&cache_dir).unwrap();
    std::fs::rename(dir.path().join("moved"), &cache_dir).unwrap();
    let resumed = ids.snowflake_ids(1).await.unwrap();
    assert!(resumed[0] > *more.last().unwrap());
    assert!(mark(&cache_dir.join("worker.json")) > on_disk);
}

// Regression: two processes on one data directory read the same cached
// holder name, both renewed its lease and issued with one worker id.
pub async fn two_allocators_on_one_cache_path_lease_distinct_workers(env: Arc<Env>) {
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let options = || IdsOptions {
        worker_lease: Duration::from_secs(60),
        max_workers: 4,
        ..snowflake_options(None, dir.path())
    };
    // A first process leases a worker id and writes the cache ...
    let first = Ids::open(backend.clone(), options()).await.unwrap();
    let first_worker = first.wait_for_worker(Duration::from_secs(5)).await.unwrap();
    first.snowflake_ids(10).await.unwrap();
    assert!(dir.path().join("worker.json").exists());
    // ... and a second starts on the same directory while it runs.
    let second = Ids::open(backend.clone(), options()).await.unwrap();
    let second_worker = second
        .wait_for_worker(Duration::from_secs(5))
        .await
        .unwrap();
    assert_ne!(first_worker, second_worker, "one worker id, two processes");
    let mut tasks = Vec::new();
    for ids in [first.clone(), second.clone()] {
        for _ in 0..2 {
            let ids = ids.clone();
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                for _ in 0..20 {
                    out.extend(ids.snowflake_ids(1000).await.unwrap());
                    tokio::task::yield_now().await;
                }
                out
            }));
        }
    }
    let mut seen = HashSet::new();
    for task in tasks {
        for id in task.await.unwrap() {
            assert!(seen.insert(id), "{id} issued twice");
        }
    }
    assert_eq!(seen.len(), 80_000);
    // The first one stops cleanly; a restart takes its slot and worker id
    // from the cache while the second keeps its own.
    first.shutdown().await;
    drop(first);
    let restarted = Ids::open(backend, options()).await.unwrap();
    assert_eq!(
        restarted.worker_id(),
        Some(first_worker),
        "from the first slot's cache"
    );
    assert_eq!(second.worker_id(), Some(second_worker));
    let after = restarted.snowflake_ids(10).await.unwrap();
    assert!(after.iter().all(|id| !seen.contains(id)));
}

// Regression: a takeover was a compare-and-set on the token alone, with
// expiry judged from the row as read by the taker's clock; renewals keep
// the token, so a renewal racing a takeover left two holders.
pub async fn a_renewed_lease_cannot_be_taken_over_from_a_stale_read(env: Arc<Env>) {
    use cellgate_store::leases;
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let backend = backend.as_ref();
    let name = "test:race".to_string();
    leases::ensure(backend, std::slice::from_ref(&name))
        .await
        .unwrap();
    let free = leases::list(backend, "test:race").await.unwrap().remove(0);
    let ttl = Duration::from_secs(60);
    let a = leases::acquire(backend, &free, "a", ttl, Duration::ZERO)
        .await
        .unwrap()
        .expect("a free lease is taken");
    // `b` read the row while `a` held it, and judged it expired by a clock
    // of its own that runs ahead: the database's clock says otherwise.
    let seen = leases::list(backend, "test:race").await.unwrap().remove(0);
    assert_eq!((seen.holder.as_str(), seen.token), ("a", a.token));
    assert_eq!(
        leases::acquire(backend, &seen, "b", ttl, Duration::ZERO)
            .await
            .unwrap(),
        None,
        "a held lease was taken over"
    );
    // `a` renews (keeping its token); `b` then tries with the stale read.
    let renewed = leases::renew(backend, "a", std::slice::from_ref(&a), ttl)
        .await
        .unwrap();
    assert_eq!(renewed.len(), 1);
    assert!(leases::acquire_all(
        backend,
        std::slice::from_ref(&seen),
        "b",
        ttl,
        Duration::ZERO
    )
    .await
    .unwrap()
    .is_empty());
    // Only `a` passes the fence.
    for (holder, lease, ok) in [("a", &a, true), ("b", &a, false)] {
        let mut tx = backend.begin().await.unwrap();
        let fenced = leases::fence(
            tx.as_mut(),
            backend.dialect(),
            holder,
            std::slice::from_ref(lease),
        )
        .await;
        assert_eq!(fenced.is_ok(), ok, "{holder}: {fenced:?}");
        drop(tx);
    }

    // Expired by the database's clock (a lease of 1 ms): it cannot be
    // renewed, and a takeover raises the token, so the old holder is fenced.
    let short = leases::acquire(
        backend,
        &leases::list(backend, "test:race").await.unwrap()[0],
        "a",
        Duration::from_millis(1),
        Duration::ZERO,
    )
    .await
    .unwrap()
    .expect("ours again");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        leases::renew(backend, "a", std::slice::from_ref(&short), ttl)
            .await
            .unwrap()
            .is_empty()
    );
    let expired = leases::list(backend, "test:race").await.unwrap().remove(0);
    // With a margin of a minute it is not expired enough for a takeover.
    assert_eq!(
        leases::acquire(backend, &expired, "b", ttl, Duration::from_secs(60))
            .await
            .unwrap(),
        None
    );
    let b = leases::acquire(backend, &expired, "b", ttl, Duration::ZERO)
        .await
        .unwrap()
        .expect("an expired lease is taken over");
    assert_eq!(b.token, short.token + 1);
    let mut tx = backend.begin().await.unwrap();
    assert!(leases::fence(
        tx.as_mut(),
        backend.dialect(),
        "a",
        std::slice::from_ref(&short)
    )
    .await
    .is_err());
    assert!(leases::fence(
        tx.as_mut(),
        backend.dialect(),
        "b",
        std::slice::from_ref(&b)
    )
    .await
    .is_ok());
}

// Regression: renewals, takeovers and releases locked lease rows in the
// order the database came across them, fences in name order. A renewal
// then waited for a pass's fence while holding a row the fence waited for:
// on PostgreSQL a deadlock, found after `deadlock_timeout` (a second), that
// aborted the pass or the renewal.
pub async fn renewals_and_fences_lock_leases_in_one_order(env: Arc<Env>) {
    use cellgate_store::leases;
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let names: Vec<String> = (0..40).map(|i| format!("test:order:{i:02}")).collect();
    // Inserted, and below rewritten, from the last name to the first, so
    // that a statement locking the rows as it finds them, by a scan of the
    // table or of the rows an index found, takes them in the reverse of
    // the fences' order.
    for name in names.iter().rev() {
        leases::ensure(backend.as_ref(), std::slice::from_ref(name))
            .await
            .unwrap();
    }
    let ttl = Duration::from_secs(60);
    let rows = leases::list(backend.as_ref(), "test:order:").await.unwrap();
    let held = leases::acquire_all(backend.as_ref(), &rows, "a", ttl, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(held.len(), names.len());

    let (b, renewing) = (backend.clone(), held.clone());
    let renewed = behind_two_fences(&backend, &held, async move {
        leases::renew(b.as_ref(), "a", &renewing, ttl).await
    })
    .await;
    assert_eq!(renewed.len(), names.len(), "renewed: {renewed:?}");

    // A takeover of many: `a` takes its own leases again, raising the tokens.
    let rows = leases::list(backend.as_ref(), "test:order:").await.unwrap();
    let b = backend.clone();
    let taken = behind_two_fences(&backend, &renewed, async move {
        leases::acquire_all(b.as_ref(), &rows, "a", ttl, Duration::ZERO).await
    })
    .await;
    assert_eq!(taken.len(), names.len(), "taken: {taken:?}");

    let b = backend.clone();
    behind_two_fences(&backend, &taken, async move {
        leases::release(b.as_ref(), "a", &names).await
    })
    .await;
    let rows = leases::list(backend.as_ref(), "test:order:").await.unwrap();
    assert!(rows.iter().all(|r| r.expires_at < chrono::Utc::now()));
}

/// Runs `operation` on the leases `held` (by `a`) while two passes fence
/// them: one holds the middle lease's row, the other fences all of them,
/// so it locks those before the middle one and waits there; the operation
/// starts behind both. Both passes must commit; returns the operation's
/// result.
async fn behind_two_fences<T: Send + 'static>(
    backend: &Arc<dyn Backend>,
    held: &[cellgate_store::leases::Lease],
    operation: impl std::future::Future<Output = cellgate_store::Result<T>> + Send + 'static,
) -> T {
    use cellgate_store::leases;
    let mut held = held.to_vec();
    held.sort_by(|a, b| a.name.cmp(&b.name));
    // Each row rewritten alone, from the last name to the first (see the
    // caller).
    for lease in held.iter().rev() {
        let ttl = Duration::from_secs(60);
        let renewed = leases::renew(backend.as_ref(), "a", std::slice::from_ref(lease), ttl)
            .await
            .unwrap();
        assert_eq!(renewed.len(), 1);
    }
    let mut middle = backend.begin().await.unwrap();
    leases::fence(
        middle.as_mut(),
        backend.dialect(),
        "a",
        &held[held.len() / 2..][..1],
    )
    .await
    .unwrap();
    let fence = {
        let backend = backend.clone();
        tokio::spawn(async move {
            let mut tx = backend.begin().await?;
            leases::fence(tx.as_mut(), backend.dialect(), "a", &held).await?;
            tx.commit().await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let operation = tokio::spawn(operation);
    tokio::time::sleep(Duration::from_millis(300)).await;
    middle.commit().await.unwrap();
    fence
        .await
        .unwrap()
        .expect("the fence of every lease commits");
    operation
        .await
        .unwrap()
        .expect("the operation on every lease goes through")
}
