//! A small, realistic sample for a first look (`cellgate serve --demo`):
//! trips with drivers, cities, statuses, notes and fare adjustments, and a
//! few payments, written through the normal write path.
//!
//! Keys are fixed (derived from names), so the README can show a query that
//! returns data: driver `DEMO_DRIVER` has trips in `DEMO_CITY`.

use chrono::{Duration, TimeZone, Utc};
use serde_json::json;
use uuid::Uuid;

use cellgate_store::cells::NewCell;
use cellgate_store::{Result, Store};

/// The first demo driver; the README's first query asks for their trips.
pub const DEMO_DRIVER: &str = "5f0c8a4e-6d1b-4c2e-9a57-3b8e1d2c4f60";
/// The demo city of most trips (Amsterdam).
pub const DEMO_CITY: &str = "a3c1e9d2-7b44-4e0f-8c1a-2d5f6e7a8b90";

/// What was loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoSummary {
    pub trips: usize,
    pub payments: usize,
    pub cells: usize,
}

/// A stable UUID (version 4 layout) derived from a name.
fn key(name: &str) -> Uuid {
    let hash = xxhash_rust::xxh3::xxh3_128(name.as_bytes());
    uuid::Builder::from_random_bytes(hash.to_be_bytes()).into_uuid()
}

/// Loads the sample unless the store already holds cells; returns `None`
/// when it left an existing store alone. Only datastores named `trips` and
/// `payments` (as in the example definitions) receive cells.
pub async fn load_demo(store: &Store) -> Result<Option<DemoSummary>> {
    let defs = store.definitions();
    for ds in &defs.datastores {
        if store.has_cells(&ds.name).await? {
            return Ok(None);
        }
    }
    let mut summary = DemoSummary {
        trips: 0,
        payments: 0,
        cells: 0,
    };
    if defs.datastore("trips").is_some() {
        let cells = demo_trips();
        summary.trips = cells.iter().filter(|c| c.column == "BASE").count();
        summary.cells += put_all(store, "trips", cells).await?;
    }
    if defs.datastore("payments").is_some() {
        let cells = demo_payments();
        summary.payments = cells.iter().filter(|c| c.column == "ORDER").count();
        summary.cells += put_all(store, "payments", cells).await?;
    }
    store.sync_indexes().await?;
    Ok(Some(summary))
}

async fn put_all(store: &Store, datastore: &str, cells: Vec<NewCell>) -> Result<usize> {
    let mut written = 0;
    for batch in cells.chunks(200) {
        for result in store.put_cells(datastore, batch.to_vec()).await? {
            result.map_err(cellgate_store::Error::unshare)?;
            written += 1;
        }
    }
    Ok(written)
}

fn demo_trips() -> Vec<NewCell> {
    let cities = [
        (
            DEMO_CITY.parse().expect("demo city"),
            "Amsterdam",
            52.37,
            4.89,
        ),
        (key("city/berlin"), "Berlin", 52.52, 13.40),
        (key("city/lisbon"), "Lisbon", 38.72, -9.14),
    ];
    let mut drivers: Vec<(Uuid, &str)> = vec![(DEMO_DRIVER.parse().expect("demo driver"), "Ana")];
    for name in ["Bram", "Chen", "Dara", "Emil", "Fatima", "Goran", "Hanna"] {
        drivers.push((key(&format!("driver/{name}")), name));
    }
    let statuses = [
        "completed",
        "completed",
        "completed",
        "canceled",
        "en_route",
    ];
    let start = Utc
        .with_ymd_and_hms(2024, 3, 4, 7, 0, 0)
        .single()
        .expect("valid date");
    let mut cells = Vec::new();
    for i in 0..64usize {
        let row = key(&format!("trip/{i}"));
        let (driver, driver_name) = drivers[i % drivers.len()];
        // The first driver works in the first city; others move around.
        let (city, city_name, lat, lng) = if i % drivers.len() == 0 {
            cities[0]
        } else {
            cities[(i / 3) % cities.len()]
        };
        let created = start + Duration::minutes(37 * i as i64);
        let total = 7.5 + (i % 9) as f64 * 3.25;
        let offset = (i % 7) as f64 * 0.004;
        cells.push(NewCell {
            row_key: row,
            column: "BASE".into(),
            ref_key: 1,
            body: json!({
                "driver_partner_uuid": driver.to_string(),
                "driver_name": driver_name,
                "rider_uuid": key(&format!("rider/{}", i % 23)).to_string(),
                "city_uuid": city.to_string(),
                "city": city_name,
                "trip_created_at": created.to_rfc3339(),
                "pickup": {"lat": lat + offset, "lng": lng - offset},
                "dropoff": {"lat": lat - offset, "lng": lng + offset},
                "fare": {"total": total, "currency": "EUR"},
                "vehicle": {"make": "Toyota", "model": "Corolla", "plate": format!("DM-{:03}", i % 17)},
            }),
        });
        let status = statuses[i % statuses.len()];
        cells.push(NewCell {
            row_key: row,
            column: "STATUS".into(),
            ref_key: 1,
            body: json!({"status": "requested", "is_completed": false, "at": created.to_rfc3339()}),
        });
        cells.push(NewCell {
            row_key: row,
            column: "STATUS".into(),
            ref_key: 2,
            body: json!({
                "status": status,
                "is_completed": status == "completed",
                "at": (created + Duration::minutes(18)).to_rfc3339(),
            }),
        });
        if i % 4 == 0 {
            cells.push(NewCell {
                row_key: row,
                column: "NOTES".into(),
                ref_key: 1,
                body: json!({"text": "rider asked for a quiet ride", "by": "rider"}),
            });
        }
        if i % 6 == 1 {
            cells.push(NewCell {
                row_key: row,
                column: "FARE_ADJUSTMENT".into(),
                ref_key: 1,
                body: json!({"amount": -2.5, "currency": "EUR", "reason": "longer route than quoted"}),
            });
        }
    }
    cells
}

fn demo_payments() -> Vec<NewCell> {
    let merchants = [key("merchant/bakery"), key("merchant/books")];
    let start = Utc
        .with_ymd_and_hms(2024, 3, 4, 9, 0, 0)
        .single()
        .expect("valid date");
    let mut cells = Vec::new();
    for i in 0..24usize {
        let row = key(&format!("payment/{i}"));
        let merchant = merchants[i % merchants.len()];
        let amount = 450 + (i as i64 * 137) % 9000;
        let created = start + Duration::minutes(53 * i as i64);
        cells.push(NewCell {
            row_key: row,
            column: "ORDER".into(),
            ref_key: 1,
            body: json!({
                "merchant_uuid": merchant.to_string(),
                "amount_cents": amount,
                "currency": if i % 5 == 0 { "USD" } else { "EUR" },
                "created_at": created.to_rfc3339(),
            }),
        });
        cells.push(NewCell {
            row_key: row,
            column: "CHARGE".into(),
            ref_key: 1,
            body: json!({
                "fee": {"rate": 0.014 + (i % 3) as f64 * 0.005},
                "captured": i % 4 != 3,
                "processor": {"reference": format!("ch_{:06}", i * 7919 % 1_000_000)},
            }),
        });
        if i % 8 == 5 {
            cells.push(NewCell {
                row_key: row,
                column: "REFUND".into(),
                ref_key: 1,
                body: json!({
                    "refunded_at": (created + Duration::hours(30)).to_rfc3339(),
                    "reason": "damaged",
                    "amount_cents": amount / 2,
                }),
            });
        }
    }
    cells
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_are_stable() {
        expect_test::expect!["50b6e12c-59f7-4f62-9607-d15754fa2546"]
            .assert_eq(&super::key("driver/Bram").to_string());
    }
}
