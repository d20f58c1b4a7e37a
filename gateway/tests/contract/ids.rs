//! ID allocation on every backend: segments shared by several stores,
//! the double buffer against a slow or absent database, snowflake worker
//! leases, the clock and the disk cache.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use cellgate::ids::{Clock as _, Ids, IdsOptions, ManualClock, NewTag};
use cellgate::storage::{self, Backend, ColType, ConnectOptions, Dialect, Row, Sql, Tx};

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

fn unavailable() -> cellgate::Error {
    cellgate::Error::Unavailable {
        cluster: "main".into(),
        source: sqlx::Error::Io(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "down for the test",
        )),
    }
}

impl Flaky {
    async fn gate(&self) -> cellgate::Result<()> {
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
    async fn fetch(&mut self, sql: &Sql, cols: &[ColType]) -> cellgate::Result<Vec<Row>> {
        tokio::time::sleep(self.delay).await;
        self.inner.fetch(sql, cols).await
    }
    async fn execute(&mut self, sql: &Sql) -> cellgate::Result<u64> {
        tokio::time::sleep(self.delay).await;
        self.inner.execute(sql).await
    }
    async fn commit(self: Box<Self>) -> cellgate::Result<()> {
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
    async fn fetch(&self, sql: &Sql, cols: &[ColType]) -> cellgate::Result<Vec<Row>> {
        self.gate().await?;
        self.inner.fetch(sql, cols).await
    }
    async fn execute(&self, sql: &Sql) -> cellgate::Result<u64> {
        self.gate().await?;
        self.inner.execute(sql).await
    }
    async fn begin(&self) -> cellgate::Result<Box<dyn Tx>> {
        self.gate().await?;
        Ok(Box::new(FlakyTx {
            inner: self.inner.begin().await?,
            delay: self.delay,
        }))
    }
    async fn ping(&self) -> cellgate::Result<()> {
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
        clock: clock.map(|c| c as Arc<dyn cellgate::ids::Clock>),
        max_workers: 1,
        ..IdsOptions::default()
    }
}

pub async fn snowflake_clock_rollback_waits_or_refuses(env: Arc<Env>) {
    let (backend, _) = flaky(&env, Duration::ZERO).await;
    let dir = tempfile::tempdir().unwrap();
    let t = cellgate::ids::DEFAULT_EPOCH_MS + 1_000_000;
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
    let now = chrono::Utc::now().timestamp_millis();
    let clock = Arc::new(ManualClock::new(now - 500));
    let crashed = Ids::open(
        backend,
        IdsOptions {
            clock: Some(clock.clone() as Arc<dyn cellgate::ids::Clock>),
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
    let ids = store.ids().tagged_ids(shard, 600).await.unwrap();
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
    let clock = Arc::new(ManualClock::new(cellgate::ids::DEFAULT_EPOCH_MS + 5_000));
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
