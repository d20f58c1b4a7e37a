//! Index maintenance stays exact when a row's cells and its index entries
//! live on different clusters and leases move between gateways: passes
//! that stall past their lease, quarantine retries that fail half-way, and
//! index versions being built beside live ones. Run on two clusters
//! (`Env::two_clusters`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cellgate_store::cells::NewCell;
use cellgate_store::indexes::{IndexQuery, PassHook, PassPoint, PassStage};
use cellgate_store::shards::{row_shard, value_shard};
use cellgate_store::storage::Value;
use cellgate_store::{Store, StoreOptions};
use futures::future::BoxFuture;
use futures::FutureExt;
use index_dsl::Literal;
use serde_json::json;
use tokio::sync::{mpsc, watch};
use uuid::Uuid;

use crate::harness::{self, Env, DEFINITIONS, TRIP_SHARDS};

/// The first shard of cluster `b` in a two-cluster environment.
const SPLIT: u32 = TRIP_SHARDS / 2;

/// Only the `trips` definitions: a stalled worker of `trips` then stops
/// its gateway's member heartbeat on its cluster, as a stalled process
/// would, instead of the `items` worker keeping it alive.
fn trips_only() -> Vec<(&'static str, &'static str)> {
    DEFINITIONS
        .iter()
        .copied()
        .filter(|(path, _)| path.starts_with("trips/"))
        .collect()
}

async fn open(env: &Env, files: &[(&str, &str)], tune: impl FnOnce(&mut StoreOptions)) -> Store {
    let defs = index_dsl::load_files(std::path::Path::new("defs"), files.iter().copied())
        .unwrap_or_else(|e| panic!("test definitions are invalid:\n{e}"));
    let mut options = StoreOptions::new(env.storage());
    options.maintenance.lease_time = Duration::from_secs(1);
    options.maintenance.sweep_every = Duration::from_millis(100);
    tune(&mut options);
    Store::open(defs, options).await.expect("store opens")
}

fn hook(f: impl Fn(PassPoint) -> BoxFuture<'static, ()> + Send + Sync + 'static) -> PassHook {
    PassHook(Arc::new(f))
}

/// A row key whose cells live on cluster `a` (`true`) or `b`.
fn row_on(a: bool) -> Uuid {
    loop {
        let key = Uuid::new_v4();
        if (row_shard(&key, TRIP_SHARDS) < SPLIT) == a {
            return key;
        }
    }
}

/// A UUID whose index entries live on cluster `a` (`true`) or `b`.
fn value_on(a: bool) -> Uuid {
    loop {
        let value = Uuid::new_v4();
        let shard = value_shard(&Value::Uuid(value), TRIP_SHARDS).unwrap();
        if (shard < SPLIT) == a {
            return value;
        }
    }
}

/// The row keys `index` lists under `value`, every page.
async fn rows_under(store: &Store, index: &str, value: String) -> BTreeSet<Uuid> {
    let mut out = BTreeSet::new();
    let mut after = None;
    loop {
        let page = store
            .query_index(
                "trips",
                &IndexQuery {
                    index: index.into(),
                    shard_values: vec![Literal::String(value.clone())],
                    first: Some(1000),
                    after: after.clone(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        out.extend(page.entries.iter().map(|e| e.row_key));
        if !page.has_next_page {
            return out;
        }
        after = page.end_cursor;
    }
}

/// Waits (at most a minute) until `check` holds.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..3000 {
        if check().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("gave up waiting: {what}");
}

fn base(row: Uuid, ref_key: i64, driver: Option<Uuid>, city: Option<Uuid>) -> NewCell {
    let mut body = json!({"trip_created_at": "2024-01-01T00:00:00Z"});
    if let Some(driver) = driver {
        body["driver_partner_uuid"] = json!(driver.to_string());
    }
    if let Some(city) = city {
        body["city_uuid"] = json!(city.to_string());
    }
    NewCell {
        row_key: row,
        column: "BASE".into(),
        ref_key,
        body,
    }
}

/// The from-scratch recomputation: per indexed value, the rows whose
/// latest version (highest ref key) carries it.
fn recompute<V: Ord + Copy>(
    versions: &BTreeMap<(Uuid, i64), Option<V>>,
) -> BTreeMap<V, BTreeSet<Uuid>> {
    let mut latest: BTreeMap<Uuid, Option<V>> = BTreeMap::new();
    for ((row, _), value) in versions {
        // Keys are in ref key order per row: the last one wins.
        latest.insert(*row, *value);
    }
    let mut expected: BTreeMap<V, BTreeSet<Uuid>> = BTreeMap::new();
    for (row, value) in latest {
        if let Some(value) = value {
            expected.entry(value).or_default().insert(row);
        }
    }
    expected
}

/// Asserts that `index` on every store lists exactly the rows the
/// recomputation gives for each of `values`.
async fn assert_recomputed(
    stores: &[&Store],
    index: &str,
    values: &[Uuid],
    expected: &BTreeMap<usize, BTreeSet<Uuid>>,
) {
    for (v, value) in values.iter().enumerate() {
        for (s, store) in stores.iter().enumerate() {
            let got = rows_under(store, index, value.to_string()).await;
            let want = expected.get(&v).cloned().unwrap_or_default();
            assert_eq!(
                got,
                want,
                "{index} under value {v} on gateway {s}: extra {:?}, missing {:?}",
                got.difference(&want).collect::<Vec<_>>(),
                want.difference(&got).collect::<Vec<_>>()
            );
        }
    }
}

// Regression: a pass that lost its lease while its write to another
// cluster was on its way inserted the row's old entry there after the new
// holder's tombstone had matched no row, and the row stayed indexed under
// the value it had left.
pub async fn a_stale_pass_cannot_reinsert_an_entry_its_successor_removed(env: Arc<Env>) {
    let files = trips_only();
    let (reached_tx, mut reached) = mpsc::unbounded_channel::<()>();
    let (release, released) = watch::channel(false);
    let armed = Arc::new(AtomicBool::new(true));
    // Holds the first pass of cluster `a` that writes to cluster `b`, as a
    // slow network would, after any checks it makes before writing.
    let stall = {
        let armed = armed.clone();
        hook(move |point| {
            let held = point.cluster == "a"
                && point.stage == PassStage::RemoteWrite { target: "b".into() }
                && armed.swap(false, Ordering::SeqCst);
            if !held {
                return async {}.boxed();
            }
            let _ = reached_tx.send(());
            let mut released = released.clone();
            async move {
                let _ = released.wait_for(|r| *r).await;
            }
            .boxed()
        })
    };
    let first = open(&env, &files, |o| o.maintenance.pass_hook = Some(stall)).await;
    let row = row_on(true);
    let (old, new) = (value_on(false), value_on(true));
    first
        .put_cell("trips", base(row, 1, Some(old), None))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), reached.recv())
        .await
        .expect("no pass of cluster a wrote to cluster b");
    // While the first gateway's pass is on its way to cluster b with the
    // old entry, the row moves to a driver whose entries live on a, and
    // a second gateway takes the first one's leases when they run out.
    first
        .put_cell("trips", base(row, 2, Some(new), None))
        .await
        .unwrap();
    let second = open(&env, &files, |_| {}).await;
    until("the second gateway indexes the new driver", || async {
        rows_under(&second, "driver_partner_index", new.to_string())
            .await
            .contains(&row)
    })
    .await;
    // The stalled pass goes on.
    release.send(true).unwrap();
    first.shutdown(Duration::from_secs(30)).await;
    second.sync_indexes().await.unwrap();
    assert_eq!(
        rows_under(&second, "driver_partner_index", old.to_string()).await,
        BTreeSet::new(),
        "the row is indexed under the driver it left"
    );
    assert_eq!(
        rows_under(&second, "driver_partner_index", new.to_string()).await,
        BTreeSet::from([row])
    );
    second.shutdown(Duration::from_secs(5)).await;
}

// Regression: a pass did not look at the time left on its leases; one
// that stalled past them still wrote to the other clusters, which no fence
// guards. Held at its start until another gateway has taken its leases
// over, it must write nothing anywhere.
pub async fn a_pass_held_past_its_lease_writes_nothing(env: Arc<Env>) {
    let files = trips_only();
    let (release, released) = watch::channel(false);
    let armed = Arc::new(AtomicBool::new(true));
    // The stages of the first gateway's passes of cluster `a`, in order;
    // the held pass is the first.
    let stages: Arc<Mutex<Vec<PassStage>>> = Arc::default();
    let (reached_tx, mut reached) = mpsc::unbounded_channel::<()>();
    let hold = {
        let stages = stages.clone();
        hook(move |point| {
            if point.cluster != "a" {
                return async {}.boxed();
            }
            stages.lock().unwrap().push(point.stage.clone());
            if point.stage != PassStage::Start || !armed.swap(false, Ordering::SeqCst) {
                return async {}.boxed();
            }
            let _ = reached_tx.send(());
            let mut released = released.clone();
            async move {
                let _ = released.wait_for(|r| *r).await;
            }
            .boxed()
        })
    };
    let first = open(&env, &files, |o| {
        o.maintenance.pass_hook = Some(hold);
        o.maintenance.passes = 1;
    })
    .await;
    let row = row_on(true);
    let (old, new) = (value_on(false), value_on(true));
    first
        .put_cell("trips", base(row, 1, Some(old), None))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(60), reached.recv())
        .await
        .expect("no pass of cluster a started");
    first
        .put_cell("trips", base(row, 2, Some(new), None))
        .await
        .unwrap();
    let second = open(&env, &files, |_| {}).await;
    until("the second gateway indexes the new driver", || async {
        rows_under(&second, "driver_partner_index", new.to_string())
            .await
            .contains(&row)
    })
    .await;
    release.send(true).unwrap();
    first.shutdown(Duration::from_secs(30)).await;
    let stages = stages.lock().unwrap().clone();
    let held: Vec<&PassStage> = stages
        .iter()
        .skip(1)
        .take_while(|s| **s != PassStage::Start)
        .collect();
    assert!(
        held.is_empty(),
        "the pass held past its lease went on to {held:?}"
    );
    second.sync_indexes().await.unwrap();
    assert_eq!(
        rows_under(&second, "driver_partner_index", old.to_string()).await,
        BTreeSet::new()
    );
    second.shutdown(Duration::from_secs(5)).await;
}

// Two gateways write new versions of rows whose cells and entries are
// spread over both clusters, moving their drivers and cities between
// clusters (or dropping them), while their passes stall at random past
// their leases so that buckets change hands mid-pass: the indexes end
// equal to a recomputation from the latest cells.
pub async fn stalled_passes_and_stolen_leases_agree_with_a_recomputation(env: Arc<Env>) {
    const ROUNDS: i64 = 10;
    const ROWS: usize = 24;
    let files = trips_only();
    let drivers: Vec<Uuid> = (0..4).map(|i| value_on(i % 2 == 0)).collect();
    let cities: Vec<Uuid> = (0..4).map(|i| value_on(i % 2 == 1)).collect();
    let stalling = Arc::new(AtomicBool::new(true));
    let stores: Vec<Store> = {
        let mut stores = Vec::new();
        for g in 0..2u64 {
            let stalling = stalling.clone();
            let stalls = Arc::new(AtomicUsize::new(0));
            let seed = Arc::new(Mutex::new(0x9e37_79b9_7f4a_7c15u64 ^ g));
            let stall = hook(move |point| {
                // A small deterministic generator per gateway.
                let roll = {
                    let mut s = seed.lock().unwrap();
                    *s ^= *s << 13;
                    *s ^= *s >> 7;
                    *s ^= *s << 17;
                    *s % 100
                };
                let chance = match point.stage {
                    PassStage::RemoteWrite { .. } => 30,
                    PassStage::LocalCommit => 10,
                    PassStage::Start => 0,
                };
                let stall = stalling.load(Ordering::SeqCst)
                    && roll < chance
                    && stalls.fetch_add(1, Ordering::SeqCst) < 6;
                async move {
                    if stall {
                        // Past the lease time: the other gateway takes the
                        // buckets over meanwhile.
                        tokio::time::sleep(Duration::from_millis(1500)).await;
                    }
                }
                .boxed()
            });
            stores.push(open(&env, &files, |o| o.maintenance.pass_hook = Some(stall)).await);
        }
        stores
    };
    // Rows are written in three rounds each, so most of them are new:
    // an entry that a stale pass inserts where its row never had one is
    // the case to catch. Half of each group's cells live on each cluster.
    let groups: Vec<Vec<Uuid>> = (0..ROUNDS)
        .map(|_| (0..ROWS).map(|i| row_on(i % 2 == 0)).collect())
        .collect();
    // Per version of a row: (row, ref key) → (driver, city) positions.
    type Versions = BTreeMap<(Uuid, i64), (Option<usize>, Option<usize>)>;
    let writers: Vec<_> = stores
        .iter()
        .cloned()
        .enumerate()
        .map(|(w, store)| {
            let (groups, drivers, cities) = (groups.clone(), drivers.clone(), cities.clone());
            tokio::spawn(async move {
                let mut versions: Versions = BTreeMap::new();
                for round in 0..groups.len() {
                    let mut cells = Vec::new();
                    for age in 0..3.min(round + 1) {
                        for (i, row) in groups[round - age].iter().enumerate() {
                            let ref_key = age as i64 * 2 + w as i64 + 1;
                            let pick = i * 7 + round * 3 + w * 5 + age;
                            let driver = (pick % 5 != 4).then_some(pick % 4);
                            let city = (pick % 6 != 5).then_some((pick / 2) % 4);
                            versions.insert((*row, ref_key), (driver, city));
                            cells.push(base(
                                *row,
                                ref_key,
                                driver.map(|d| drivers[d]),
                                city.map(|c| cities[c]),
                            ));
                        }
                    }
                    for result in store.put_cells("trips", cells).await.unwrap() {
                        result.unwrap();
                    }
                    // Time for passes (and stalls) between rounds.
                    tokio::time::sleep(Duration::from_millis(150)).await;
                }
                versions
            })
        })
        .collect();
    let mut versions: Versions = BTreeMap::new();
    for writer in writers {
        versions.extend(writer.await.unwrap());
    }
    // Stalls still under way end on their own; no new ones start.
    stalling.store(false, Ordering::SeqCst);
    for store in &stores {
        store.sync_indexes().await.unwrap();
    }
    let by_driver: BTreeMap<(Uuid, i64), Option<usize>> =
        versions.iter().map(|(k, (d, _))| (*k, *d)).collect();
    let by_city: BTreeMap<(Uuid, i64), Option<usize>> =
        versions.iter().map(|(k, (_, c))| (*k, *c)).collect();
    let stores: Vec<&Store> = stores.iter().collect();
    assert_recomputed(
        &stores,
        "driver_partner_index",
        &drivers,
        &recompute(&by_driver),
    )
    .await;
    assert_recomputed(&stores, "city_trips_index", &cities, &recompute(&by_city)).await;
    for store in stores {
        store.shutdown(Duration::from_secs(5)).await;
    }
}

// Regression: a quarantine retry deleted the records before applying their
// entries; when the apply failed (here: cluster b's index table is locked
// past the statement timeout), the records were gone while the log
// offsets had long passed the cells, so the entries were never applied.
pub async fn a_failed_quarantine_retry_keeps_the_records(env: Arc<Env>) {
    let store = open(&env, DEFINITIONS, |o| {
        o.maintain_indexes = false;
        o.storage.timeout_ms = 1000;
    })
    .await;
    let row = row_on(true);
    let driver = value_on(false);
    store
        .put_cell("trips", base(row, 1, Some(driver), None))
        .await
        .unwrap();
    // The cell's body becomes unreadable: both indexes of `trips` read it.
    let key = row.simple().to_string();
    let sql = match env.kind {
        harness::Kind::Postgres => {
            format!("UPDATE trips_cells SET body = '\\x01fffe'::bytea WHERE row_key = '{row}'")
        }
        _ => format!("UPDATE trips_cells SET body = X'01fffe' WHERE row_key = X'{key}'"),
    };
    harness::execute(env.kind, &env.url, &sql).await;
    store.sync_indexes().await.unwrap();
    let quarantined: Vec<(String, Uuid)> = store
        .quarantine("trips")
        .await
        .unwrap()
        .into_iter()
        .map(|q| (q.index, q.row_key))
        .collect();
    let expected = vec![
        ("city_trips_index".to_string(), row),
        ("driver_partner_index".to_string(), row),
    ];
    assert_eq!(quarantined, expected);
    // A readable version, whose entry goes to cluster b; b cannot be
    // written while the retry runs.
    store
        .put_cell("trips", base(row, 2, Some(driver), None))
        .await
        .unwrap();
    let table = store.index_table("trips", "driver_partner_index").unwrap();
    let second = env.second.clone().expect("two clusters");
    let lock = harness::lock_table(env.kind, &second, &table).await;
    let failed = store.retry_quarantine("trips", None).await;
    assert!(
        failed.is_err(),
        "the retry wrote through the lock: {failed:?}"
    );
    drop(lock);
    let kept: Vec<(String, Uuid)> = store
        .quarantine("trips")
        .await
        .unwrap()
        .into_iter()
        .map(|q| (q.index, q.row_key))
        .collect();
    assert_eq!(kept, expected, "a failed retry dropped the records");
    // Once b answers, the retry applies both and the records leave.
    assert_eq!(store.retry_quarantine("trips", None).await.unwrap(), (2, 0));
    assert!(store.quarantine("trips").await.unwrap().is_empty());
    assert_eq!(
        rows_under(&store, "driver_partner_index", driver.to_string()).await,
        BTreeSet::from([row])
    );
    store.shutdown(Duration::from_secs(5)).await;
}

const CHANGED_DRIVER_INDEX: &str = "table: driver_partner_index\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: driver_partner_uuid, type: UUID}\n      - { field: city_uuid, type: UUID}\n      - { field: trip_created_at, type: datetime}\n      - { field: fare.total, name: fare_total, type: float }\n";

// Regression: a pass read the log from the lowest offset of all consumers,
// so a new index version being built from the start of the log held back
// the live indexes of the same shards until it had caught up. Here the
// passes that build the new version are held outright: the live index
// must still apply a new cell.
pub async fn a_building_index_version_does_not_hold_back_live_indexes(env: Arc<Env>) {
    let files = trips_only();
    let first = open(&env, &files, |_| {}).await;
    let city = value_on(true);
    let history: Vec<NewCell> = (0..300)
        .map(|i| {
            base(
                row_on(i % 2 == 0),
                1,
                Some(value_on(i % 3 == 0)),
                Some(city),
            )
        })
        .collect();
    for result in first.put_cells("trips", history).await.unwrap() {
        result.unwrap();
    }
    first.sync_indexes().await.unwrap();
    first.shutdown(Duration::from_secs(5)).await;
    // The driver index changes: version 2 is built from the log.
    let changed: Vec<(&str, &str)> = files
        .iter()
        .map(|(path, text)| {
            if path.ends_with("driver_partner_index.yaml") {
                (*path, CHANGED_DRIVER_INDEX)
            } else {
                (*path, *text)
            }
        })
        .collect();
    let (release, released) = watch::channel(false);
    let (held_tx, mut held) = mpsc::unbounded_channel::<()>();
    let hold = hook(move |point| {
        let building = point
            .consumers
            .iter()
            .any(|c| c.starts_with("ix:driver_partner_index:2:"));
        if building {
            let _ = held_tx.send(());
        }
        let mut released = released.clone();
        async move {
            if building {
                let _ = released.wait_for(|r| *r).await;
            }
        }
        .boxed()
    });
    let store = open(&env, &changed, |o| o.maintenance.pass_hook = Some(hold)).await;
    let status = store.indexes("trips").unwrap();
    let building: Vec<(&str, u32, bool)> = status
        .iter()
        .map(|s| (s.name.as_str(), s.version, s.ready))
        .collect();
    assert!(
        building.contains(&("driver_partner_index", 2, false))
            && building.contains(&("city_trips_index", 1, true)),
        "{building:?}"
    );
    // Once passes of the build are held (one per cluster), a new cell on
    // each cluster.
    for _ in 0..2 {
        tokio::time::timeout(Duration::from_secs(60), held.recv())
            .await
            .expect("no pass of version 2 started");
    }
    let new_city = value_on(false);
    let rows = [row_on(true), row_on(false)];
    for row in rows {
        store
            .put_cell("trips", base(row, 1, Some(value_on(true)), Some(new_city)))
            .await
            .unwrap();
    }
    until("the live index applies the new cells", || async {
        rows_under(&store, "city_trips_index", new_city.to_string()).await == BTreeSet::from(rows)
    })
    .await;
    // Progress, from the offsets: the live consumers passed the new cells
    // while the version being built has not moved.
    let kind = env.kind;
    for (c, row) in rows.iter().enumerate() {
        let cell = store
            .get_cell_latest("trips", *row, "BASE")
            .await
            .unwrap()
            .unwrap();
        let url = &env.urls()[c];
        for target in ["a", "b"] {
            let offset = |consumer: String| {
                let sql = format!(
                    "SELECT MAX(added_id) FROM trips_offsets WHERE shard = {} AND consumer = '{consumer}'",
                    cell.shard
                );
                async move { harness::scalar(kind, url, &sql).await.unwrap_or(0) }
            };
            let live = offset(format!("ix:city_trips_index:1:{target}")).await;
            assert!(
                live >= cell.added_id,
                "live consumer on {target}: {live} < {}",
                cell.added_id
            );
            let built = offset(format!("ix:driver_partner_index:2:{target}")).await;
            assert_eq!(built, 0, "the held version moved on {target}");
        }
    }
    let ready = |store: &Store, name: &str| {
        store
            .indexes("trips")
            .unwrap()
            .iter()
            .any(|s| s.name == name && s.ready && s.serves_until.is_none())
    };
    assert!(!ready(&store, "driver_partner_index"));
    // Released, the new version is built and becomes ready.
    release.send(true).unwrap();
    store.sync_indexes().await.unwrap();
    until("version 2 is ready", || async {
        ready(&store, "driver_partner_index")
    })
    .await;
    store.shutdown(Duration::from_secs(5)).await;
}

/// Statements each cluster's master was sent so far.
fn statements(store: &Store) -> Vec<u64> {
    store
        .metrics()
        .clusters
        .iter()
        .map(|c| c.statements)
        .collect()
}

// Moving rows' entries between clusters costs a pass one statement per
// index and target cluster (entries and tombstones together), not one per
// row: applying 20 moved rows and 200 takes as many statements.
pub async fn moving_entries_between_clusters_takes_no_statement_per_row(env: Arc<Env>) {
    let store = open(&env, &trips_only(), |o| {
        o.maintain_indexes = false;
        // Without maintenance the workers still sweep (to measure the
        // lag), which would be counted too.
        o.maintenance.sweep_every = Duration::from_secs(3600);
        // Maintenance statements counted with the master's.
        o.storage.maintenance_connections = 0;
        // On PostgreSQL each write's notification of other gateways goes
        // out on those connections after the write returns, and would be
        // counted with the pass's statements.
        o.storage.notify = false;
        // The buffer replayer counts the buffers once a second, and the
        // topology follower reads the stored topology twice a second.
        o.replay_buffers = false;
        o.follow_topology = false;
    })
    .await;
    let mut counts = Vec::new();
    // Every pass has entries for both clusters: half the rows' drivers
    // (and the other half's cities) live on each, and every row moves to
    // the other cluster in its second version.
    let drivers = [value_on(true), value_on(false)];
    let cities = [value_on(false), value_on(true)];
    for n in [20, 200] {
        let rows: Vec<Uuid> = (0..n).map(|i| row_on(i % 2 == 0)).collect();
        for ref_key in [1, 2] {
            let side = |i: usize| (i / 2 + ref_key as usize) % 2;
            let cells: Vec<NewCell> = rows
                .iter()
                .enumerate()
                .map(|(i, row)| base(*row, ref_key, Some(drivers[side(i)]), Some(cities[side(i)])))
                .collect();
            for result in store.put_cells("trips", cells).await.unwrap() {
                result.unwrap();
            }
            let before = statements(&store);
            store.sync_indexes().await.unwrap();
            let after = statements(&store);
            let used: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
            eprintln!(
                "{:?}: applying {n} rows (version {ref_key}): {used:?} statements per cluster",
                env.kind
            );
            counts.push(used);
            for (d, driver) in drivers.iter().enumerate() {
                let expected: BTreeSet<Uuid> = rows
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| side(*i) == d)
                    .map(|(_, row)| *row)
                    .collect();
                let got = rows_under(&store, "driver_partner_index", driver.to_string()).await;
                assert!(expected.is_subset(&got), "driver {d}");
                assert!(
                    got.is_disjoint(
                        &rows
                            .iter()
                            .copied()
                            .filter(|r| !expected.contains(r))
                            .collect()
                    ),
                    "driver {d}"
                );
            }
        }
    }
    // Per cluster: its own pass (offsets and heads read before and after,
    // the log, the latest cells; `BEGIN`, an upsert per index, the offsets,
    // `COMMIT`) and the other cluster's writes to it (`BEGIN`, an upsert
    // per index, `COMMIT`). A statement per index for entries and another
    // for tombstones made it 18.
    for used in &counts {
        assert!(used.iter().all(|n| *n <= 14), "{counts:?}");
    }
    assert_eq!(counts[0], counts[2], "first versions of 20 and 200 rows");
    assert_eq!(counts[1], counts[3], "moves of 20 and 200 rows");
    store.shutdown(Duration::from_secs(5)).await;
}

/// The buckets of `trips` a store's maintainer holds.
fn buckets_held(store: &Store) -> usize {
    store
        .metrics()
        .datastores
        .iter()
        .find(|d| d.name == "trips")
        .map_or(0, |d| d.maintenance.buckets_held)
}

// Regression: a gateway that took over buckets while their offsets could
// not be read held them (renewing the leases) without ever loading their
// offsets, so nobody maintained those shards again. Here the offsets table
// is away while the second gateway takes over the first one's buckets; once
// it is back, every shard must be maintained.
pub async fn buckets_whose_offsets_cannot_be_read_are_adopted_later(env: Arc<Env>) {
    let files = trips_only();
    let first = open(&env, &files, |_| {}).await;
    let second = open(&env, &files, |_| {}).await;
    until("both gateways hold buckets", || async {
        buckets_held(&first) > 0 && buckets_held(&second) > 0
    })
    .await;
    let url = env.urls()[0].clone();
    harness::execute(
        env.kind,
        &url,
        "ALTER TABLE trips_offsets RENAME TO trips_offsets_away",
    )
    .await;
    first.shutdown(Duration::from_secs(5)).await;
    drop(first);
    until("the second gateway holds every bucket", || async {
        buckets_held(&second) == 64
    })
    .await;
    // Its adoption of the first one's buckets failed; a few rounds more.
    tokio::time::sleep(Duration::from_secs(2)).await;
    harness::execute(
        env.kind,
        &url,
        "ALTER TABLE trips_offsets_away RENAME TO trips_offsets",
    )
    .await;
    let driver = Uuid::new_v4();
    let rows: BTreeSet<Uuid> = (0..200).map(|_| Uuid::new_v4()).collect();
    let cells: Vec<NewCell> = rows
        .iter()
        .map(|row| base(*row, 1, Some(driver), None))
        .collect();
    second.put_cells("trips", cells).await.unwrap();
    until("every row is indexed, in every shard", || async {
        rows_under(&second, "driver_partner_index", driver.to_string()).await == rows
    })
    .await;
    second.shutdown(Duration::from_secs(5)).await;
}
