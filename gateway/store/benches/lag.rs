//! Index lag at a steady write rate, on embedded SQLite with index
//! maintenance running in the background.
//!
//! For each target rate (200/s and 1000/s, 10 s each) it writes single-cell
//! `put_cell`s of new BASE trip cells paced by a `tokio::time::interval`
//! (`MissedTickBehavior::Delay`, so a slow put lowers the achieved rate
//! rather than bursting), then waits for `sync_indexes` and reports:
//!
//! - the achieved write rate and put latency;
//! - the maintainer's own apply delay (`take_index_delays`: commit to index
//!   update, p50/p99 in microseconds, sample count);
//! - the delay seen from outside: for every Nth write (a trip of a fresh
//!   driver) a task polls `query_index` from the moment the put returned
//!   until the entry is visible.
//!
//! Row keys, drivers and cities are random over all 4096 shards.
//!
//! Run: `cargo bench -p cellgate --bench lag` (about 1 minute).

mod common;

use std::time::{Duration, Instant};

use cellgate_store::cells::NewCell;
use cellgate_store::indexes::IndexQuery;
use cellgate_store::Store;
use common::*;
use tokio::time::MissedTickBehavior;
use uuid::Uuid;

/// Length of each run.
const RUN: Duration = Duration::from_secs(10);

/// Outside-visibility probes per run.
const PROBES: u64 = 200;

/// Gives up on a probe after this long.
const PROBE_TIMEOUT: Duration = Duration::from_secs(60);

struct Report {
    rate: u64,
    writes: u64,
    achieved: f64,
    put_p50: u64,
    put_p99: u64,
    sync_ms: u128,
    delays: (u64, u64, u64),
    visible: Vec<u64>,
    timeouts: usize,
}

fn driver_query(driver: Uuid) -> IndexQuery {
    IndexQuery {
        index: "driver_partner_index".into(),
        filter: Some(format!("driver_partner_uuid = \"{driver}\"")),
        fields: vec!["trip_created_at".into()],
        first: Some(1),
        ..Default::default()
    }
}

/// Polls until the trip of `driver` is in the index; the delay in
/// microseconds since `since`, or `None` on timeout.
async fn poll_visible(store: Store, driver: Uuid, since: Instant) -> Option<u64> {
    let query = driver_query(driver);
    loop {
        let page = store.query_index("trips", &query).await.expect("query");
        if !page.entries.is_empty() {
            return Some(since.elapsed().as_micros() as u64);
        }
        if since.elapsed() > PROBE_TIMEOUT {
            return None;
        }
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
}

async fn run(store: &Store, rate: u64) -> Report {
    let drivers: Vec<Uuid> = (0..50).map(|_| Uuid::new_v4()).collect();
    let city = Uuid::new_v4();
    let total = rate * RUN.as_secs();
    let probe_every = (total / PROBES).max(1);
    let _ = store.take_index_delays();
    let mut interval = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut put_us = Vec::with_capacity(total as usize);
    let mut probes = Vec::new();
    let started = Instant::now();
    let mut writes = 0;
    while started.elapsed() < RUN {
        interval.tick().await;
        let probe = writes % probe_every == 0;
        let driver = if probe {
            Uuid::new_v4()
        } else {
            drivers[writes as usize % drivers.len()]
        };
        let cell = NewCell {
            row_key: Uuid::new_v4(),
            column: "BASE".into(),
            ref_key: 1,
            body: trip_body(driver, city, &created_at(writes as i64)),
        };
        let put_start = Instant::now();
        store.put_cell("trips", cell).await.expect("put");
        let returned = Instant::now();
        put_us.push((returned - put_start).as_micros() as u64);
        if probe {
            probes.push(tokio::spawn(poll_visible(store.clone(), driver, returned)));
        }
        writes += 1;
    }
    let elapsed = started.elapsed();
    let sync_start = Instant::now();
    store.sync_indexes().await.expect("sync");
    let sync_ms = sync_start.elapsed().as_millis();
    let mut visible = Vec::new();
    let mut timeouts = 0;
    for probe in probes {
        match probe.await.expect("probe task") {
            Some(us) => visible.push(us),
            None => timeouts += 1,
        }
    }
    visible.sort_unstable();
    put_us.sort_unstable();
    Report {
        rate,
        writes,
        achieved: writes as f64 / elapsed.as_secs_f64(),
        put_p50: percentile(&put_us, 50.0),
        put_p99: percentile(&put_us, 99.0),
        sync_ms,
        delays: store.take_index_delays(),
        visible,
        timeouts,
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let root = tempfile::tempdir().expect("tempdir");
    rt.block_on(async {
        let mut reports = Vec::new();
        for rate in [200, 1000] {
            // A fresh store per rate, so one run's backlog cannot leak into the next.
            let dir = root.path().join(format!("lag_{rate}"));
            let store = Store::open(defs(), options(&dir, true))
                .await
                .expect("open store");
            // Wait until the maintainer holds its leases and indexes a write.
            let warm = Instant::now();
            let driver = Uuid::new_v4();
            let cell = NewCell {
                row_key: Uuid::new_v4(),
                column: "BASE".into(),
                ref_key: 1,
                body: small_body(driver, Uuid::new_v4(), &created_at(0)),
            };
            store.put_cell("trips", cell).await.expect("put");
            poll_visible(store.clone(), driver, warm)
                .await
                .expect("maintenance starts");
            eprintln!(
                "rate {rate}/s: first write indexed {:.1} ms after open",
                warm.elapsed().as_secs_f64() * 1000.0
            );
            reports.push(run(&store, rate).await);
        }
        println!();
        println!(
            "| target/s | writes | achieved/s | put p50 us | put p99 us | sync after ms | maint p50 us | maint p99 us | maint n | visible p50 us | visible p99 us | probes | timeouts |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in &reports {
            println!(
                "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                r.rate,
                r.writes,
                r.achieved,
                r.put_p50,
                r.put_p99,
                r.sync_ms,
                r.delays.0,
                r.delays.1,
                r.delays.2,
                percentile(&r.visible, 50.0),
                percentile(&r.visible, 99.0),
                r.visible.len(),
                r.timeouts
            );
        }
    });
}
