//! Helpers shared by the benches: definitions, realistic trip bodies, and
//! a raw sqlx pool configured like `storage/sqlite.rs`. Keys are random
//! UUIDs over all 4096 shards of `trips`, as in production.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use cellgate_store::storage::Value;
use cellgate_store::StorageConfig;
use cellgate_store::StoreOptions;
use rand::Rng;
use serde_json::json;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Sqlite, SqlitePool};
use uuid::Uuid;

/// Shards of the `trips` datastore in `datastores/` (the default count).
pub const TRIP_SHARDS: u32 = 4096;

/// The repository's datastore definitions.
pub fn defs() -> index_dsl::Definitions {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../datastores");
    index_dsl::load_dir(&dir).expect("datastores/ loads")
}

/// Options for an embedded store in `dir`.
pub fn options(dir: &Path, maintain_indexes: bool) -> StoreOptions {
    let mut options = StoreOptions::new(StorageConfig::embedded(dir));
    options.maintain_indexes = maintain_indexes;
    options
}

/// The SQLite file of an embedded store in `dir`.
pub fn db_file(dir: &Path) -> PathBuf {
    dir.join("cellgate.db")
}

/// A pool over `file` configured like `storage/sqlite.rs` (WAL,
/// synchronous NORMAL, same busy timeout and statement cache).
pub async fn pool(file: &Path, max_connections: u32) -> SqlitePool {
    let connect = SqliteConnectOptions::from_str(&format!("sqlite://{}", file.display()))
        .expect("sqlite url")
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Normal)
        .busy_timeout(Duration::from_secs(10))
        .statement_cache_capacity(1024);
    SqlitePoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(connect)
        .await
        .expect("connect raw pool")
}

/// Binds a cellgate value the way `storage/sqlite.rs` does.
pub fn bind<'q>(
    query: sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>>,
    value: &'q Value,
) -> sqlx::query::Query<'q, Sqlite, sqlx::sqlite::SqliteArguments<'q>> {
    match value {
        Value::Null(_) => query.bind(None::<i64>),
        Value::Bool(v) => query.bind(*v),
        Value::Int(v) => query.bind(*v),
        Value::Float(v) => query.bind(*v),
        Value::Text(v) => query.bind(v.as_str()),
        Value::Bytes(v) => query.bind(v.as_slice()),
        Value::Uuid(v) => query.bind(v.as_bytes().as_slice()),
        Value::DateTime(v) => query.bind(v.timestamp_micros()),
        // Statements for SQLite carry no arrays (`Sql::in_list`, `Sql::rows`).
        Value::Array(..) => unreachable!("an array parameter in a statement for SQLite"),
    }
}

fn coord(rng: &mut impl Rng, lat: f64, lng: f64) -> serde_json::Value {
    json!({
        "lat": lat + rng.gen_range(-0.05..0.05),
        "lng": lng + rng.gen_range(-0.05..0.05),
    })
}

/// A route polyline of about `len` characters.
fn polyline(rng: &mut impl Rng, len: usize) -> String {
    const CHARS: &[u8] = b"?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~";
    (0..len)
        .map(|_| CHARS[rng.gen_range(0..CHARS.len())] as char)
        .collect()
}

/// A realistic BASE body of a trip (about 1 KB as JSON).
pub fn trip_body(driver: Uuid, city: Uuid, created_at: &str) -> serde_json::Value {
    let mut rng = rand::thread_rng();
    let pickup = coord(&mut rng, 37.7749, -122.4194);
    let dropoff = coord(&mut rng, 37.7849, -122.4094);
    let base: f64 = rng.gen_range(2.0..4.0);
    let distance: f64 = rng.gen_range(3.0..30.0);
    let time: f64 = rng.gen_range(1.0..12.0);
    let surge: f64 = if rng.gen_bool(0.2) {
        rng.gen_range(1.0..8.0)
    } else {
        0.0
    };
    let total = ((base + distance + time + surge) * 100.0).round() / 100.0;
    json!({
        "driver_partner_uuid": driver.to_string(),
        "city_uuid": city.to_string(),
        "rider_uuid": Uuid::new_v4().to_string(),
        "trip_created_at": created_at,
        "requested_at": created_at,
        "status": "completed",
        "is_completed": true,
        "payment_status": "captured",
        "product": "UberX",
        "pickup": {
            "lat": pickup["lat"], "lng": pickup["lng"],
            "address": format!("{} Market St, San Francisco, CA 94103", rng.gen_range(1..2000)),
        },
        "dropoff": {
            "lat": dropoff["lat"], "lng": dropoff["lng"],
            "address": format!("{} Valencia St, San Francisco, CA 94110", rng.gen_range(1..2000)),
        },
        "fare": {
            "total": total,
            "currency": "USD",
            "breakdown": {
                "base": (base * 100.0).round() / 100.0,
                "distance": (distance * 100.0).round() / 100.0,
                "time": (time * 100.0).round() / 100.0,
                "surge": (surge * 100.0).round() / 100.0,
            },
        },
        "vehicle": {
            "make": "Toyota",
            "model": "Prius",
            "plate": format!("8{}{:03}", ["ABC", "XYZ", "KLM"][rng.gen_range(0..3)], rng.gen_range(0..1000)),
        },
        "distance_km": (distance * 0.6 * 100.0).round() / 100.0,
        "duration_s": rng.gen_range(300..3600),
        "route_polyline": polyline(&mut rng, 300),
    })
}

/// A small BASE body: only the indexed fields.
pub fn small_body(driver: Uuid, city: Uuid, created_at: &str) -> serde_json::Value {
    json!({
        "driver_partner_uuid": driver.to_string(),
        "city_uuid": city.to_string(),
        "trip_created_at": created_at,
    })
}

/// An RFC 3339 time `minutes` after 2024-01-01T00:00:00Z.
pub fn created_at(minutes: i64) -> String {
    let base = chrono::DateTime::parse_from_rfc3339("2024-01-01T00:00:00Z").expect("valid");
    (base + chrono::Duration::minutes(minutes))
        .with_timezone(&chrono::Utc)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// Percentile (0..=100) of sorted microsecond samples.
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}
