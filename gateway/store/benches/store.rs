//! Store benchmarks on embedded SQLite, each paired with a raw sqlx
//! baseline that runs the same SQL on its own pool:
//!
//! - `put_100/*`: `put_cells` of 100 new BASE trip cells with random row
//!   keys over all 4096 shards and all in one shard (one row key, 100 ref
//!   keys), with index maintenance off and on, vs raw sqlx running the same
//!   cluster transaction on pre-encoded bodies: lock the shard counter rows,
//!   look up existing keys, advance the counters, one multi-row `INSERT`.
//! - `query/*`: `query_index` on `driver_partner_index` (driver equality and
//!   a time range, 20 entries; a one-field projection; a 3-driver `in`
//!   fan-out) over 5,000 trips of 50 drivers, vs raw sqlx running the plan's
//!   exact SQL and decoding the rows.
//! - `codec/*`: body encoding and decoding alone, to attribute the write gap.
//!
//! It also prints (not timed) the size of trip bodies as JSON and encoded.
//!
//! Run: `cargo bench -p cellgate --bench store` (about 2 minutes on 2
//! cores; filter with e.g. `-- put_100`).

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use cellgate_store::cells::{codec, NewCell, PutStatus};
use cellgate_store::indexes::entry::col_type;
use cellgate_store::indexes::{IndexQuery, QueryPlan};
use cellgate_store::shards::row_shard;
use cellgate_store::storage::{ColType, Dialect, Value};
use cellgate_store::Store;
use common::*;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use sqlx::{Row as _, SqlitePool};
use uuid::Uuid;

/// State shared by the bench functions: the runtime and a scratch dir.
struct Env {
    rt: tokio::runtime::Runtime,
    root: tempfile::TempDir,
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
        Env { rt, root }
    })
}

/// Opens a store in a fresh directory.
fn open_store(name: &str, maintain: bool) -> Store {
    let env = env();
    let dir = env.root.path().join(name);
    env.rt.block_on(async {
        Store::open(defs(), options(&dir, maintain))
            .await
            .expect("open store")
    })
}

fn new_cells(one_shard: bool) -> Vec<NewCell> {
    let shared_row = Uuid::new_v4();
    (0..100)
        .map(|i| {
            let body = trip_body(Uuid::new_v4(), Uuid::new_v4(), &created_at(i));
            NewCell {
                row_key: if one_shard {
                    shared_row
                } else {
                    Uuid::new_v4()
                },
                column: "BASE".into(),
                ref_key: if one_shard { i + 1 } else { 1 },
                body,
            }
        })
        .collect()
}

/// A pre-encoded cell for the raw baseline.
struct RawCell {
    shard: u32,
    row_key: Uuid,
    ref_key: i64,
    body: Vec<u8>,
}

/// The same cells sorted by shard, bodies encoded (not timed).
fn raw_batch(one_shard: bool) -> Vec<RawCell> {
    let mut cells: Vec<RawCell> = new_cells(one_shard)
        .into_iter()
        .map(|cell| RawCell {
            shard: row_shard(&cell.row_key, TRIP_SHARDS),
            row_key: cell.row_key,
            ref_key: cell.ref_key,
            body: codec::encode(&cell.body).expect("encode"),
        })
        .collect();
    cells.sort_by_key(|c| c.shard);
    cells
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// What the write path does on one cluster, in plain sqlx: one
/// transaction that locks the shard counters, looks up existing keys,
/// advances the counters and inserts every cell with one statement.
async fn raw_put(pool: &SqlitePool, cells: Vec<RawCell>) {
    let now = chrono::Utc::now().timestamp_micros();
    let mut shards: Vec<u32> = cells.iter().map(|c| c.shard).collect();
    shards.dedup();
    let mut conn = pool.acquire().await.expect("acquire");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut *conn)
        .await
        .expect("begin");
    let select = format!(
        r#"SELECT "shard", "next_added_id" FROM "trips_shards" WHERE "shard" IN ({}) ORDER BY "shard""#,
        placeholders(shards.len())
    );
    let mut query = sqlx::query(&select);
    for shard in &shards {
        query = query.bind(i64::from(*shard));
    }
    let mut next: BTreeMap<u32, i64> = query
        .fetch_all(&mut *conn)
        .await
        .expect("lock")
        .iter()
        .map(|row| (row.get::<i64, _>(0) as u32, row.get::<i64, _>(1)))
        .collect();
    let rows: Vec<Uuid> = cells
        .iter()
        .map(|c| c.row_key)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let refs: Vec<i64> = cells
        .iter()
        .map(|c| c.ref_key)
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let lookup = format!(
        r#"SELECT "row_key", "column_name", "ref_key", "body" FROM "trips_cells" WHERE "row_key" IN ({}) AND "column_name" IN (?) AND "ref_key" IN ({})"#,
        placeholders(rows.len()),
        placeholders(refs.len())
    );
    let mut query = sqlx::query(&lookup);
    for row in &rows {
        query = query.bind(row.as_bytes().as_slice());
    }
    query = query.bind("BASE");
    for r in &refs {
        query = query.bind(*r);
    }
    let found = query.fetch_all(&mut *conn).await.expect("lookup");
    assert!(found.is_empty(), "cells are new");
    let ids: Vec<i64> = cells
        .iter()
        .map(|c| {
            let id = next[&c.shard];
            next.insert(c.shard, id + 1);
            id
        })
        .collect();
    let mut update = String::from(r#"UPDATE "trips_shards" SET "next_added_id" = CASE "shard""#);
    for _ in &shards {
        update.push_str(" WHEN ? THEN ?");
    }
    update.push_str(&format!(
        r#" END WHERE "shard" IN ({})"#,
        placeholders(shards.len())
    ));
    let mut query = sqlx::query(&update);
    for shard in &shards {
        query = query.bind(i64::from(*shard)).bind(next[shard]);
    }
    for shard in &shards {
        query = query.bind(i64::from(*shard));
    }
    query.execute(&mut *conn).await.expect("advance");
    let insert = format!(
        r#"INSERT INTO "trips_cells" ("shard", "added_id", "row_key", "column_name", "ref_key", "body", "created_at") VALUES {}"#,
        vec!["(?, ?, ?, ?, ?, ?, ?)"; cells.len()].join(", ")
    );
    let mut query = sqlx::query(&insert);
    for (cell, id) in cells.iter().zip(&ids) {
        query = query
            .bind(i64::from(cell.shard))
            .bind(*id)
            .bind(cell.row_key.as_bytes().as_slice())
            .bind("BASE")
            .bind(cell.ref_key)
            .bind(cell.body.as_slice())
            .bind(now);
    }
    query.execute(&mut *conn).await.expect("insert");
    sqlx::query("COMMIT")
        .execute(&mut *conn)
        .await
        .expect("commit");
}

async fn store_put(store: &Store, cells: Vec<NewCell>) {
    let results = store.put_cells("trips", cells).await.expect("put");
    assert!(results.iter().all(|r| matches!(r, Ok(PutStatus::Written))));
}

fn body_sizes(_c: &mut Criterion) {
    let created = created_at(0);
    for (name, body) in [
        (
            "realistic",
            trip_body(Uuid::new_v4(), Uuid::new_v4(), &created),
        ),
        (
            "small",
            small_body(Uuid::new_v4(), Uuid::new_v4(), &created),
        ),
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
    let body = trip_body(Uuid::new_v4(), Uuid::new_v4(), &created_at(0));
    let encoded = codec::encode(&body).expect("encode");
    group.bench_function("encode/realistic", |b| b.iter(|| codec::encode(&body)));
    group.bench_function("decode/realistic", |b| b.iter(|| codec::decode(&encoded)));
    // A written body from its JSON text, as a write reads it, kept for
    // index maintenance cut to the members the example indexes read:
    // through a JSON value (the store's `put_cells`), and read straight
    // into MessagePack (`codec::PackBody`, the compiled GraphQL write).
    let text = serde_json::to_string(&body).expect("json");
    let keep: std::sync::Arc<std::collections::BTreeSet<String>> = std::sync::Arc::new(
        [
            "city_uuid",
            "driver_partner_uuid",
            "fare",
            "status",
            "trip_created_at",
        ]
        .map(String::from)
        .into(),
    );
    group.bench_function("encode_text/through_a_value", |b| {
        b.iter(|| {
            let value: serde_json::Value = serde_json::from_str(&text).expect("json");
            let encoded = codec::encode(&value).expect("encode");
            let serde_json::Value::Object(mut all) = value else {
                unreachable!("an object")
            };
            let kept: serde_json::Map<_, _> =
                keep.iter().filter_map(|m| all.remove_entry(m)).collect();
            (encoded, kept)
        })
    });
    group.bench_function("encode_text/packed", |b| {
        b.iter(|| codec::encode_text(&text, Some(&keep)).expect("encode"))
    });
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

    // The raw baseline writes into the tables of a store of its own.
    drop(open_store("raw_writes", false));
    let raw_pool = rt.block_on(pool(&db_file(&env.root.path().join("raw_writes")), 1));
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
    let drivers: Vec<Uuid> = (0..50).map(|_| Uuid::new_v4()).collect();
    let cities: Vec<Uuid> = (0..10).map(|_| Uuid::new_v4()).collect();
    env.rt.block_on(async {
        let mut cells = Vec::new();
        for trip in 0..5000i64 {
            let driver = drivers[(trip % 50) as usize];
            let city = cities[(trip % 10) as usize];
            // 100 trips per driver, one a day.
            let body = trip_body(driver, city, &created_at((trip / 50) * 1440 + trip % 50));
            cells.push(NewCell {
                row_key: Uuid::new_v4(),
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

/// One prepared statement of a plan.
struct RawShardQuery {
    text: String,
    params: Vec<Value>,
}

/// The plan's statement for the one (embedded) cluster.
fn raw_plan(plan: &QueryPlan) -> (Vec<RawShardQuery>, Vec<ColType>) {
    let values: Vec<Value> = plan.shards.values().flatten().cloned().collect();
    let sql = plan.sql(Dialect::Sqlite, "trips_ix_driver_partner_index", &values);
    let queries = vec![RawShardQuery {
        text: sql.text().to_string(),
        params: sql.params().to_vec(),
    }];
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
    rows.sort_by(|a, b| a.0.sort_cmp(&b.0));
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
