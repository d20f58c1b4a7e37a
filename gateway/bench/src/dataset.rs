//! The data set and the requests of the workloads: which trips are loaded,
//! which drivers the queries ask for, and the GraphQL documents and
//! Rust-API calls that do the same work on each path.
//!
//! Loaded cells are derived from the seed batch by batch: a run can be
//! repeated on the same data (`--seed`), a million cells are never held in
//! memory at once, and concurrent loaders share nothing but the next batch
//! number. Row keys, drivers and cities are random UUIDs, so cells spread
//! over all shards as production keys do.

use clap::ValueEnum;
use index_dsl::{CompareOp, Condition, Definitions, Literal};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng as _};
use serde_json::{json, Value};
use uuid::Uuid;

use cellgate_store::cells::NewCell;
use cellgate_store::indexes::IndexQuery;

/// The datastore, columns and index the workloads use.
pub const DATASTORE: &str = "trips";
pub const BASE: &str = "BASE";
pub const STATUS: &str = "STATUS";
pub const INDEX: &str = "driver_partner_index";
const DRIVER_FIELD: &str = "driver_partner_uuid";
const CREATED_FIELD: &str = "trip_created_at";
const CITY_FIELD: &str = "city_uuid";

/// Page size of the index queries.
pub const PAGE: u32 = 20;
/// Cells per load request (`put_cells` or `tripsPutCells`).
pub const LOAD_BATCH: u64 = 500;
/// Cities the trips are spread over.
const CITIES: usize = 5;
/// Drivers of the trips written by the write workload. They are never
/// queried, so the queried part of the index is the same for every phase.
const WRITE_DRIVERS: usize = 200;
/// Loaded trips are created every [`TRIP_EVERY_MINUTES`] from [`EPOCH`].
const EPOCH: &str = "2024-01-01T00:00:00Z";
const TRIP_EVERY_MINUTES: i64 = 30;

/// A document reading an index page: `driverPartnerIndex` of a driver,
/// trips since a time, first 20, `rowKey` and `tripCreatedAt`; `$arguments`
/// is appended to the field's arguments and `$row` to each entry's
/// selection. One macro, so that every variant has the same shape.
macro_rules! index_page {
    ($operation:literal, $arguments:literal, $row:literal) => {
        concat!(
            "query ",
            $operation,
            "($driver: UUID!, $since: DateTime!) { trips { \
            driverPartnerIndex(driverPartnerUuid: $driver, where: {tripCreatedAt: {gte: $since}}, first: 20",
            $arguments,
            ") { edges { node { rowKey tripCreatedAt",
            $row,
            " } } } } }"
        )
    };
}

/// The index query (`query` workload).
pub const QUERY: &str = index_page!("BenchIndex", "", "");

/// The same page with each row's BASE body (`rows` workload), read by the
/// gateway's DataLoader.
pub const ROWS: &str = index_page!("BenchRows", "", " row { base { body } }");

/// [`QUERY`] and [`ROWS`] read from the master and from a replica
/// (`cellgate-bench replicas`). The consistency is a literal, not a
/// variable: a variable of an enum type would take the request off the
/// gateway's direct path for index pages, and the two would no longer
/// compare like with like.
pub const QUERY_MASTER: &str = index_page!("BenchIndexMaster", ", consistency: MASTER", "");
pub const QUERY_REPLICA: &str = index_page!("BenchIndexReplica", ", consistency: REPLICA", "");
pub const ROWS_MASTER: &str = index_page!(
    "BenchRowsMaster",
    ", consistency: MASTER",
    " row { base { body } }"
);
pub const ROWS_REPLICA: &str = index_page!(
    "BenchRowsReplica",
    ", consistency: REPLICA",
    " row { base { body } }"
);

/// A batch of new cells (`write` workload).
pub const WRITE: &str = "mutation BenchWrite($cells: [TripsCellInput!]!) { \
    tripsPutCells(cells: $cells) { rowKey status } }";

/// A batch of the loaded data set; its own name keeps it apart from the
/// write workload in the gateway's request metrics.
pub const LOAD: &str = "mutation BenchLoad($cells: [TripsCellInput!]!) { \
    tripsPutCells(cells: $cells) { rowKey status } }";

/// Checks that the definitions have what the workloads use.
pub fn check_definitions(defs: &Definitions, status: bool) -> anyhow::Result<()> {
    let ds = defs.datastore(DATASTORE).ok_or_else(|| {
        anyhow::anyhow!("the benchmark needs a `{DATASTORE}` datastore (as in ./datastores)")
    })?;
    for column in [BASE].into_iter().chain(status.then_some(STATUS)) {
        anyhow::ensure!(
            ds.column(column).is_some(),
            "the benchmark needs a `{column}` column in `{DATASTORE}`{}",
            if column == STATUS {
                " (or --status false)"
            } else {
                ""
            }
        );
    }
    let index = ds.index(INDEX).ok_or_else(|| {
        anyhow::anyhow!("the benchmark needs the `{INDEX}` index of `{DATASTORE}`")
    })?;
    anyhow::ensure!(
        index.shard_field().name == DRIVER_FIELD
            && index.field(CREATED_FIELD).is_some()
            && index.field(CITY_FIELD).is_some(),
        "the `{INDEX}` index must be sharded by `{DRIVER_FIELD}` and have `{CREATED_FIELD}` and `{CITY_FIELD}`"
    );
    Ok(())
}

/// The loaded trips and what the workloads ask for.
pub struct Dataset {
    pub trips: u64,
    /// Whether each trip also gets a STATUS cell.
    pub status: bool,
    pub seed: u64,
    /// Cells per write request.
    pub batch: usize,
    /// Loaded trip `i` belongs to `drivers[i % len]`.
    drivers: Vec<Uuid>,
    /// The drivers with at least one trip created at or after `since`:
    /// every query of one of them has a non-empty page.
    queried: Vec<Uuid>,
    write_drivers: Vec<Uuid>,
    cities: Vec<Uuid>,
    /// Queries ask for trips created from this time on (RFC 3339): the last
    /// three quarters of the loaded trips.
    pub since: String,
}

impl Dataset {
    pub fn new(trips: u64, drivers: u32, status: bool, seed: u64, batch: usize) -> Dataset {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut draw = |n: usize| (0..n).map(|_| random_uuid(&mut rng)).collect::<Vec<_>>();
        let drivers = draw(drivers.max(1) as usize);
        let write_drivers = draw(WRITE_DRIVERS);
        let cities = draw(CITIES);
        let first_queried = trips / 4;
        let queried = (first_queried..trips)
            .take(drivers.len())
            .map(|i| drivers[(i % drivers.len() as u64) as usize])
            .collect();
        Dataset {
            trips,
            status,
            seed,
            batch,
            drivers,
            queried,
            write_drivers,
            cities,
            since: created_at(first_queried as i64 * TRIP_EVERY_MINUTES),
        }
    }

    pub fn drivers(&self) -> usize {
        self.drivers.len()
    }

    pub fn cells_per_trip(&self) -> u64 {
        1 + u64::from(self.status)
    }

    /// Cells of the whole data set.
    pub fn cells(&self) -> u64 {
        self.trips * self.cells_per_trip()
    }

    fn trips_per_batch(&self) -> u64 {
        LOAD_BATCH / self.cells_per_trip()
    }

    /// Number of load batches.
    pub fn load_batches(&self) -> u64 {
        self.trips.div_ceil(self.trips_per_batch())
    }

    /// The cells of load batch `number` (from 0), the same for a seed
    /// whoever loads it.
    pub fn load_batch(&self, number: u64) -> Vec<NewCell> {
        let per = self.trips_per_batch();
        let first = number * per;
        let last = (first + per).min(self.trips);
        let mut rng =
            StdRng::seed_from_u64(self.seed ^ (number + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let mut cells = Vec::with_capacity(((last - first) * self.cells_per_trip()) as usize);
        for i in first..last {
            let driver = self.drivers[(i % self.drivers.len() as u64) as usize];
            let city = self.cities[(i % self.cities.len() as u64) as usize];
            let row_key = random_uuid(&mut rng);
            let created = created_at(i as i64 * TRIP_EVERY_MINUTES);
            cells.push(NewCell {
                row_key,
                column: BASE.into(),
                ref_key: 1,
                body: trip_body(&mut rng, driver, city, &created),
            });
            if self.status {
                cells.push(NewCell {
                    row_key,
                    column: STATUS.into(),
                    ref_key: 1,
                    body: status_body(&mut rng, &created),
                });
            }
        }
        cells
    }

    /// The drivers the queries ask for.
    pub fn queried_drivers(&self) -> &[Uuid] {
        &self.queried
    }

    /// A driver whose page is never empty.
    pub fn random_driver(&self) -> Uuid {
        self.queried[rand::thread_rng().gen_range(0..self.queried.len())]
    }

    /// A batch of new trips for the write workload.
    pub fn write_cells(&self) -> Vec<NewCell> {
        let mut rng = rand::thread_rng();
        (0..self.batch)
            .map(|_| {
                let row_key = random_uuid(&mut rng);
                self.new_trip(&mut rng, row_key)
            })
            .collect()
    }

    /// The BASE cell of a new trip of row `row_key`, created now, by one of
    /// the write workload's drivers.
    pub fn new_trip(&self, rng: &mut impl Rng, row_key: Uuid) -> NewCell {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        let driver = self.write_drivers[rng.gen_range(0..self.write_drivers.len())];
        let city = self.cities[rng.gen_range(0..self.cities.len())];
        NewCell {
            row_key,
            column: BASE.into(),
            ref_key: 1,
            body: trip_body(rng, driver, city, &now),
        }
    }

    /// The variables of [`QUERY`] and [`ROWS`].
    pub fn query_variables(&self, driver: Uuid) -> Value {
        json!({ "driver": driver.to_string(), "since": self.since })
    }

    /// The Rust-API twin of [`QUERY`] (and of the index part of [`ROWS`]).
    pub fn index_query(&self, driver: Uuid) -> IndexQuery {
        IndexQuery {
            index: INDEX.into(),
            shard_values: vec![Literal::String(driver.to_string())],
            conditions: vec![Condition {
                field: CREATED_FIELD.into(),
                op: CompareOp::Ge,
                values: vec![Literal::String(self.since.clone())],
                column: 1,
            }],
            // What the GraphQL resolver asks for when `rowKey` and
            // `tripCreatedAt` are selected.
            fields: vec![CREATED_FIELD.into()],
            first: Some(PAGE),
            ..IndexQuery::default()
        }
    }
}

/// A cell as `TripsCellInput`.
pub fn cell_input(cell: &NewCell) -> Value {
    json!({
        "rowKey": cell.row_key.to_string(),
        "column": cell.column,
        "refKey": cell.ref_key,
        "body": cell.body,
    })
}

/// A random (version 4) UUID.
pub fn random_uuid(rng: &mut impl Rng) -> Uuid {
    uuid::Builder::from_random_bytes(rng.gen()).into_uuid()
}

/// An RFC 3339 time `minutes` after [`EPOCH`].
fn created_at(minutes: i64) -> String {
    let epoch = chrono::DateTime::parse_from_rfc3339(EPOCH).expect("valid epoch");
    (epoch + chrono::Duration::minutes(minutes))
        .with_timezone(&chrono::Utc)
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// A BASE body of a trip, about 700 bytes of JSON.
fn trip_body(rng: &mut impl Rng, driver: Uuid, city: Uuid, created_at: &str) -> Value {
    let distance: f64 = rng.gen_range(1.0..30.0);
    let minutes: f64 = rng.gen_range(3.0..60.0);
    let total = ((2.5 + distance * 1.1 + minutes * 0.3) * 100.0).round() / 100.0;
    let lat = 37.77 + rng.gen_range(-0.05..0.05);
    let lng = -122.42 + rng.gen_range(-0.05..0.05);
    json!({
        "driver_partner_uuid": driver.to_string(),
        "city_uuid": city.to_string(),
        "rider_uuid": random_uuid(rng).to_string(),
        "trip_created_at": created_at,
        "status": "completed",
        "product": "UberX",
        "pickup": {"lat": lat, "lng": lng, "address": format!("{} Market St", rng.gen_range(1..2000))},
        "dropoff": {"lat": lat + 0.01, "lng": lng + 0.01, "address": format!("{} Valencia St", rng.gen_range(1..2000))},
        "fare": {"total": total, "currency": "USD", "distance_km": (distance * 100.0).round() / 100.0},
        "vehicle": {"make": "Toyota", "model": "Prius", "plate": format!("8ABC{:03}", rng.gen_range(0..1000))},
        "duration_s": (minutes * 60.0).round() as i64,
        "route_polyline": (0..200).map(|_| char::from(rng.gen_range(b'?'..=b'~'))).collect::<String>(),
    })
}

/// A STATUS body: the trip's final state, about 100 bytes of JSON.
fn status_body(rng: &mut impl Rng, created_at: &str) -> Value {
    json!({
        "status": "completed",
        "is_completed": true,
        "since": created_at,
        "rating": rng.gen_range(1..=5),
    })
}

/// Stores every load batch of `data` through the Rust API, four batches
/// at once; returns the cells stored.
pub async fn load_through_api(
    store: &cellgate_store::Store,
    data: &Dataset,
) -> anyhow::Result<u64> {
    use futures::StreamExt as _;
    let mut batches = futures::stream::iter(0..data.load_batches())
        .map(|n| {
            let store = store.clone();
            let cells = data.load_batch(n);
            async move { store.put_cells(DATASTORE, cells).await }
        })
        .buffer_unordered(4);
    let mut stored = 0u64;
    while let Some(results) = batches.next().await {
        stored += results?.into_iter().filter(|r| r.is_ok()).count() as u64;
    }
    Ok(stored)
}

/// A workload of the measured phases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Workload {
    /// An index page: `driverPartnerIndex` of a driver, trips since a
    /// time, first 20, `rowKey` and `tripCreatedAt`.
    Query,
    /// The same page with each row's BASE body (`row { base { body } }`,
    /// the DataLoader path).
    Rows,
    /// `tripsPutCells` with `--batch` new BASE cells.
    Write,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Query => "query",
            Workload::Rows => "rows",
            Workload::Write => "write",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_batches_cover_every_trip_once_and_repeat_per_seed() {
        let data = Dataset::new(1001, 7, true, 42, 50);
        assert_eq!(data.cells(), 2002);
        let cells: Vec<NewCell> = (0..data.load_batches())
            .flat_map(|b| data.load_batch(b))
            .collect();
        assert_eq!(cells.len(), 2002);
        assert!(cells.chunks(500).all(|c| c.len() <= LOAD_BATCH as usize));
        let rows: std::collections::HashSet<Uuid> = cells.iter().map(|c| c.row_key).collect();
        assert_eq!(rows.len(), 1001, "one row key per trip");
        let again = Dataset::new(1001, 7, true, 42, 50).load_batch(1);
        assert_eq!(again[0].row_key, data.load_batch(1)[0].row_key);
    }

    #[test]
    fn index_page_documents_differ_only_in_name_and_consistency() {
        assert_eq!(
            QUERY,
            "query BenchIndex($driver: UUID!, $since: DateTime!) { trips { \
             driverPartnerIndex(driverPartnerUuid: $driver, where: {tripCreatedAt: {gte: $since}}, \
             first: 20) { edges { node { rowKey tripCreatedAt } } } } }"
        );
        let same = |document: &str, name: &str, consistency: &str| {
            document
                .replacen(name, "", 1)
                .replacen(&format!(", consistency: {consistency}"), "", 1)
        };
        for (document, name, consistency) in [
            (QUERY_MASTER, "Master", "MASTER"),
            (QUERY_REPLICA, "Replica", "REPLICA"),
        ] {
            assert_eq!(same(document, name, consistency), QUERY);
        }
        for (document, name, consistency) in [
            (ROWS_MASTER, "Master", "MASTER"),
            (ROWS_REPLICA, "Replica", "REPLICA"),
        ] {
            assert_eq!(same(document, name, consistency), ROWS);
        }
        assert!(ROWS.ends_with("rowKey tripCreatedAt row { base { body } } } } } } }"));
    }

    #[test]
    fn every_queried_driver_has_a_trip_since_the_query_time() {
        for (trips, drivers) in [(1, 20), (3, 20), (20, 20), (100, 7), (2000, 20)] {
            let data = Dataset::new(trips, drivers, false, 1, 50);
            assert!(!data.queried.is_empty());
            for driver in &data.queried {
                let has = (0..trips).any(|i| {
                    data.drivers[(i % data.drivers.len() as u64) as usize] == *driver
                        && created_at(i as i64 * TRIP_EVERY_MINUTES) >= data.since
                });
                assert!(has, "{trips} trips, {drivers} drivers");
            }
        }
    }
}
