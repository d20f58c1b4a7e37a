//! Store benchmarks on embedded SQLite, each paired with a raw sqlx
//! baseline that runs the same SQL on its own pool:
//!
//! - `put_100/*`: `put_cells` of 100 new BASE trip cells spread over ~100
//!   shards and all in one shard (one row key, 100 ref keys), with index
//!   maintenance off and on, vs raw sqlx doing per shard one transaction of
//!   meta-row `UPDATE`, existence `SELECT` and one `INSERT` per pre-encoded
//!   cell.
//! - `query/*`: `query_index` on `driver_partner_index` (driver equality and
//!   a time range, 20 entries; a one-field projection; a 3-driver `in`
//!   fan-out) over 5,000 trips of 50 drivers, vs raw sqlx running the plan's
//!   exact per-shard SQL and decoding the rows.
//! - `codec/encode`: body encoding alone, to attribute the write gap.
//!
//! It also prints (not timed) the size of trip bodies as JSON and encoded.
//! Every store starts from a copy of one SQLite file where the tables of
//! 256 of the 4096 `trips` shards exist, and every row key, driver and city
//! is drawn to hash into those shards (`common::live_uuid`), so no run pays
//! for lazy DDL; a spread batch of 100 cells touches ~83 shards.
//!
//! Run: `cargo bench -p cellgate --bench store` (about 2 minutes on 2
//! cores; filter with e.g. `-- put_100`).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use cellgate::cells::{codec, NewCell, PutStatus};
use cellgate::indexes::entry::col_type;
use cellgate::indexes::{IndexQuery, QueryPlan};
use cellgate::shards::row_shard;
use cellgate::storage::{ColType, Dialect, Value};
use cellgate::Store;
use common::*;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use sqlx::{Row as _, SqlitePool};
use uuid::Uuid;

/// State shared by the bench functions: the runtime and the shard template.
struct Env {
    rt: tokio::runtime::Runtime,
    root: tempfile::TempDir,
    template: PathBuf,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("tokio runtime");
        let root = tempfile::tempdir().expect("tempdir");
        let template = rt.block_on(template(root.path()));
        Env { rt, root, template }
    })
}

/// Opens a store on a fresh copy of the template and marks the live shards
/// ready (one registry read per shard, no DDL).
fn open_store(name: &str, maintain: bool) -> Store {
    let env = env();
    let dir = copy_template(&env.template, env.root.path(), name);
    env.rt.block_on(async {
        let store = Store::open(defs(), options(&dir, maintain))
            .await
            .expect("open store");
        ensure_live_shards(&store).await;
        if maintain {
            wait_maintainer_idle(&store).await;
        }
        store
    })
}

/// Waits until the maintainer has finished the start-up sweep of every
/// shard: a fresh write is only indexed after the current batch of wake-ups.
async fn wait_maintainer_idle(store: &Store) {
    let driver = live_uuid();
    let cell = NewCell {
        row_key: live_uuid(),
        column: "BASE".into(),
        ref_key: 1,
        body: small_body(driver, live_uuid(), &created_at(0)),
    };
    store.put_cell("trips", cell).await.expect("put");
    let query = IndexQuery {
        index: "driver_partner_index".into(),
        filter: Some(format!("driver_partner_uuid = \"{driver}\"")),
        ..Default::default()
    };
    while store
        .query_index("trips", &query)
        .await
        .expect("query")
        .entries
        .is_empty()
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn new_cells(one_shard: bool) -> Vec<NewCell> {
    let shared_row = live_uuid();
    (0..100)
        .map(|i| {
            let body = trip_body(live_uuid(), live_uuid(), &created_at(i));
            NewCell {
                row_key: if one_shard { shared_row } else { live_uuid() },
                column: "BASE".into(),
                ref_key: if one_shard { i + 1 } else { 1 },
                body,
            }
        })
        .collect()
}

/// A pre-encoded cell for the raw baseline.
struct RawCell {
    row_key: Uuid,
    ref_key: i64,
    body: Vec<u8>,
}

/// The same cells grouped by shard, bodies encoded (not timed).
fn raw_batch(one_shard: bool) -> BTreeMap<u32, Vec<RawCell>> {
    let mut groups: BTreeMap<u32, Vec<RawCell>> = BTreeMap::new();
    for cell in new_cells(one_shard) {
        groups
            .entry(row_shard(&cell.row_key, TRIP_SHARDS))
            .or_default()
            .push(RawCell {
                row_key: cell.row_key,
                ref_key: cell.ref_key,
                body: codec::encode(&cell.body).expect("encode"),
            });
    }
    groups
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// What `commit_primary` does, in plain sqlx: per shard one transaction.
async fn raw_put(pool: &SqlitePool, groups: BTreeMap<u32, Vec<RawCell>>) {
    let now = chrono::Utc::now().timestamp_micros();
    for (shard, cells) in groups {
        let mut tx = pool.begin().await.expect("begin");
        sqlx::query(&format!(
            r#"UPDATE "trips_s{shard}_meta" SET "writes" = "writes" + 1 WHERE "id" = 1"#
        ))
        .execute(&mut *tx)
        .await
        .expect("lock");
        let mut rows: Vec<Uuid> = cells.iter().map(|c| c.row_key).collect();
        rows.dedup();
        let refs: Vec<i64> = cells
            .iter()
            .map(|c| c.ref_key)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let select = format!(
            r#"SELECT "row_key", "column_name", "ref_key", "body" FROM "trips_s{shard}_cells" WHERE "row_key" IN ({}) AND "ref_key" IN ({})"#,
            placeholders(rows.len()),
            placeholders(refs.len())
        );
        let mut query = sqlx::query(&select);
        for row in &rows {
            query = query.bind(row.as_bytes().as_slice());
        }
        for r in &refs {
            query = query.bind(*r);
        }
        let found = query.fetch_all(&mut *tx).await.expect("lookup");
        assert!(found.is_empty(), "cells are new");
        let insert = format!(
            r#"INSERT INTO "trips_s{shard}_cells" ("row_key", "column_name", "ref_key", "body", "created_at") VALUES (?, ?, ?, ?, ?)"#
        );
        for cell in &cells {
            sqlx::query(&insert)
                .bind(cell.row_key.as_bytes().as_slice())
                .bind("BASE")
                .bind(cell.ref_key)
                .bind(cell.body.as_slice())
                .bind(now)
                .execute(&mut *tx)
                .await
                .expect("insert");
        }
        tx.commit().await.expect("commit");
    }
}

async fn store_put(store: &Store, cells: Vec<NewCell>) {
    let results = store.put_cells("trips", cells).await.expect("put");
    assert!(results.iter().all(|r| matches!(r, Ok(PutStatus::Written))));
}

fn body_sizes(_c: &mut Criterion) {
    let created = created_at(0);
    for (name, body) in [
        ("realistic", trip_body(live_uuid(), live_uuid(), &created)),
        ("small", small_body(live_uuid(), live_uuid(), &created)),
    ] {
        let json = serde_json::to_vec(&body).expect("json").len();
        let encoded = codec::encode(&body).expect("encode").len();
        eprintln!(
            "body size ({name}): JSON {json} B, encoded {encoded} B, encoded/JSON {:.2}",
            encoded as f64 / json as f64
        );
    }
}

fn codec_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));
    let body = trip_body(live_uuid(), live_uuid(), &created_at(0));
    let encoded = codec::encode(&body).expect("encode");
    group.bench_function("encode/realistic", |b| b.iter(|| codec::encode(&body)));
    group.bench_function("decode/realistic", |b| b.iter(|| codec::decode(&encoded)));
    group.finish();
}

fn writes(c: &mut Criterion) {
    let env = env();
    let rt = &env.rt;
    let mut group = c.benchmark_group("put_100");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5))
        .throughput(Throughput::Elements(100));

    let raw_dir = copy_template(&env.template, env.root.path(), "raw_writes");
    let raw_pool = rt.block_on(pool(&db_file(&raw_dir), 1));
    for (label, one_shard) in [("spread", false), ("one_shard", true)] {
        group.bench_function(format!("raw_sqlx/{label}"), |b| {
            b.to_async(rt).iter_batched(
                || raw_batch(one_shard),
                |batch| raw_put(&raw_pool, batch),
                BatchSize::SmallInput,
            )
        });
    }
    rt.block_on(raw_pool.close());

    for maintain in [false, true] {
        let tag = if maintain { "maint_on" } else { "maint_off" };
        let store = open_store(&format!("writes_{tag}"), maintain);
        for (label, one_shard) in [("spread", false), ("one_shard", true)] {
            group.bench_function(format!("cellgate_{tag}/{label}"), |b| {
                b.to_async(rt).iter_batched(
                    || new_cells(one_shard),
                    |cells| store_put(&store, cells),
                    BatchSize::SmallInput,
                )
            });
        }
        if maintain {
            // Let the backlog drain so it does not load later benches.
            let started = std::time::Instant::now();
            rt.block_on(store.sync_indexes()).expect("sync");
            eprintln!(
                "maint_on: index backlog drained in {:.1} s after the write benches; delays (p50, p99, n) = {:?} us",
                started.elapsed().as_secs_f64(),
                store.take_index_delays()
            );
        }
        drop(store);
    }
    group.finish();
}

/// A store with 5,000 trips of 50 drivers, indexed.
struct QueryFixture {
    store: Store,
    drivers: Vec<Uuid>,
    since: String,
    raw: SqlitePool,
}

fn query_fixture() -> QueryFixture {
    let env = env();
    let store = open_store("queries", false);
    let drivers: Vec<Uuid> = (0..50).map(|_| live_uuid()).collect();
    let cities: Vec<Uuid> = (0..10).map(|_| live_uuid()).collect();
    env.rt.block_on(async {
        let mut cells = Vec::new();
        for trip in 0..5000i64 {
            let driver = drivers[(trip % 50) as usize];
            let city = cities[(trip % 10) as usize];
            // 100 trips per driver, one a day.
            let body = trip_body(driver, city, &created_at((trip / 50) * 1440 + trip % 50));
            cells.push(NewCell {
                row_key: live_uuid(),
                column: "BASE".into(),
                ref_key: 1,
                body,
            });
            if cells.len() == 100 {
                store_put(&store, std::mem::take(&mut cells)).await;
            }
        }
        store.sync_indexes().await.expect("sync");
    });
    let raw = env
        .rt
        .block_on(pool(&db_file(&env.root.path().join("queries")), 8));
    QueryFixture {
        store,
        drivers,
        // Half of each driver's trips are on or after day 50.
        since: created_at(50 * 1440),
        raw,
    }
}

/// One prepared per-shard statement of a plan.
struct RawShardQuery {
    text: String,
    params: Vec<Value>,
}

fn raw_plan(plan: &QueryPlan) -> (Vec<RawShardQuery>, Vec<ColType>) {
    let queries = plan
        .shards
        .keys()
        .map(|&shard| {
            let sql = plan.shard_sql(Dialect::Sqlite, shard);
            RawShardQuery {
                text: sql.text().to_string(),
                params: sql.params().to_vec(),
            }
        })
        .collect();
    let types = plan
        .projection
        .iter()
        .map(|&p| col_type(plan.index.fields[p].ty))
        .collect();
    (queries, types)
}

fn decode(row: &sqlx::sqlite::SqliteRow, i: usize, ty: ColType) -> Value {
    let null = Value::Null(ty);
    match ty {
        ColType::Uuid => row
            .get::<Option<Vec<u8>>, _>(i)
            .map_or(null, |b| Value::Uuid(Uuid::from_slice(&b).expect("uuid"))),
        ColType::DateTime => row.get::<Option<i64>, _>(i).map_or(null, |m| {
            Value::DateTime(chrono::DateTime::from_timestamp_micros(m).expect("datetime"))
        }),
        ColType::Int => row.get::<Option<i64>, _>(i).map_or(null, Value::Int),
        ColType::Float => row.get::<Option<f64>, _>(i).map_or(null, Value::Float),
        ColType::Bool => row.get::<Option<bool>, _>(i).map_or(null, Value::Bool),
        ColType::Text => row.get::<Option<String>, _>(i).map_or(null, Value::Text),
        ColType::Bytes => row.get::<Option<Vec<u8>>, _>(i).map_or(null, Value::Bytes),
    }
}

/// Runs the shard statements concurrently, decodes, merges by row key and
/// keeps `limit` rows (the plans here have no explicit order).
async fn raw_query(
    pool: &SqlitePool,
    queries: &[RawShardQuery],
    types: &[ColType],
    limit: usize,
) -> usize {
    let reads = queries.iter().map(|q| async move {
        let mut query = sqlx::query(&q.text);
        for value in &q.params {
            query = bind(query, value);
        }
        let rows = query.fetch_all(pool).await.expect("raw query");
        rows.iter()
            .map(|row| {
                let row_key = decode(row, 0, ColType::Uuid);
                let fields: Vec<Value> = types
                    .iter()
                    .enumerate()
                    .map(|(i, ty)| decode(row, i + 1, *ty))
                    .collect();
                (row_key, fields)
            })
            .collect::<Vec<_>>()
    });
    let mut rows: Vec<(Value, Vec<Value>)> = futures::future::join_all(reads)
        .await
        .into_iter()
        .flatten()
        .collect();
    if queries.len() > 1 {
        rows.sort_by(|a, b| a.0.sort_cmp(&b.0));
    }
    rows.truncate(limit);
    rows.len()
}

fn queries(c: &mut Criterion) {
    let env = env();
    let rt = &env.rt;
    let fx = query_fixture();
    let trips = defs()
        .datastores
        .into_iter()
        .find(|d| d.name == "trips")
        .expect("trips");
    let mut group = c.benchmark_group("query");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .throughput(Throughput::Elements(1));

    type MakeQuery<'a> = Box<dyn Fn(usize) -> IndexQuery + 'a>;
    let one = |i: usize, fields: Vec<String>| IndexQuery {
        index: "driver_partner_index".into(),
        filter: Some(format!(
            "driver_partner_uuid = \"{}\" and trip_created_at >= \"{}\"",
            fx.drivers[i % fx.drivers.len()],
            fx.since
        )),
        fields,
        first: Some(20),
        ..Default::default()
    };
    let variants: Vec<(&str, MakeQuery)> = vec![
        ("driver_range", Box::new(|i| one(i, Vec::new()))),
        (
            "driver_range_projection",
            Box::new(|i| one(i, vec!["trip_created_at".into()])),
        ),
        (
            "fanout_3_drivers",
            Box::new(|i| {
                let d = &fx.drivers;
                IndexQuery {
                    index: "driver_partner_index".into(),
                    filter: Some(format!(
                        "driver_partner_uuid in (\"{}\", \"{}\", \"{}\") and trip_created_at >= \"{}\"",
                        d[i % d.len()],
                        d[(i + 1) % d.len()],
                        d[(i + 2) % d.len()],
                        fx.since
                    )),
                    first: Some(20),
                    ..Default::default()
                }
            }),
        ),
    ];
    for (name, make) in &variants {
        // Sanity: both paths return the same number of entries.
        let probe = make(0);
        let plan = QueryPlan::build(&trips, &probe).expect("plan");
        let (raw_queries, types) = raw_plan(&plan);
        let page = rt
            .block_on(fx.store.query_index("trips", &probe))
            .expect("query");
        let raw_len = rt.block_on(raw_query(&fx.raw, &raw_queries, &types, 20));
        assert_eq!(page.entries.len(), 20, "{name}: a full page");
        assert_eq!(raw_len, 20, "{name}: raw full page");

        let queries: Vec<IndexQuery> = (0..fx.drivers.len()).map(make).collect();
        let plans: Vec<(Vec<RawShardQuery>, Vec<ColType>)> = queries
            .iter()
            .map(|q| raw_plan(&QueryPlan::build(&trips, q).expect("plan")))
            .collect();
        let next = AtomicUsize::new(0);
        group.bench_function(format!("cellgate/{name}"), |b| {
            b.to_async(rt).iter(|| {
                let i = next.fetch_add(1, Ordering::Relaxed) % queries.len();
                let store = &fx.store;
                let query = &queries[i];
                async move {
                    let page = store.query_index("trips", query).await.expect("query");
                    assert_eq!(page.entries.len(), 20);
                }
            })
        });
        group.bench_function(format!("raw_sqlx/{name}"), |b| {
            b.to_async(rt).iter(|| {
                let i = next.fetch_add(1, Ordering::Relaxed) % plans.len();
                let (raw_queries, types) = &plans[i];
                let pool = &fx.raw;
                async move {
                    assert_eq!(raw_query(pool, raw_queries, types, 20).await, 20);
                }
            })
        });
    }
    group.finish();
}

criterion_group!(benches, body_sizes, codec_bench, writes, queries);
criterion_main!(benches);
