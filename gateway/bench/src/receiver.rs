//! A webhook receiver in the benchmark's process: takes every POST to
//! `/<gateway>`, answers 200, and records for each cell of the batch the
//! time from its `createdAt` (taken just before its commit) to the POST's
//! arrival, per path: which gateway delivered it.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use poem::listener::{Acceptor as _, Listener as _, TcpListener};
use poem::web::{Data, Json, Path};
use poem::{handler, post, EndpointExt as _, Route};
use serde_json::Value;

/// What the receiver got.
#[derive(Default)]
pub struct Received {
    /// Commit-to-POST delays in microseconds, per delivering gateway.
    lag_us: Mutex<BTreeMap<String, hdrhistogram::Histogram<u64>>>,
    /// Every cell received, by row key.
    rows: Mutex<HashSet<String>>,
    /// Cells received more than once.
    repeated: Mutex<u64>,
}

impl Received {
    /// Distinct cells received so far.
    pub fn distinct(&self) -> usize {
        self.rows.lock().expect("rows").len()
    }

    /// Cells received again.
    pub fn repeated(&self) -> u64 {
        *self.repeated.lock().expect("repeated")
    }

    /// Each gateway's delays, and all of them together.
    pub fn lags(&self) -> Vec<(String, hdrhistogram::Histogram<u64>)> {
        let lags = self.lag_us.lock().expect("lag");
        let mut all = hdrhistogram::Histogram::new(3).expect("histogram");
        let mut out = Vec::new();
        for (gateway, histogram) in lags.iter() {
            let _ = all.add(histogram);
            out.push((gateway.clone(), histogram.clone()));
        }
        out.push(("all".to_string(), all));
        out
    }
}

#[handler]
fn take(Path(gateway): Path<String>, Json(batch): Json<Value>, received: Data<&Arc<Received>>) {
    let arrived = chrono::Utc::now();
    let cells = batch["cells"].as_array().cloned().unwrap_or_default();
    let mut lags = received.lag_us.lock().expect("lag");
    let histogram = lags
        .entry(gateway)
        .or_insert_with(|| hdrhistogram::Histogram::new(3).expect("histogram"));
    let mut rows = received.rows.lock().expect("rows");
    for cell in cells {
        let row = cell["rowKey"].as_str().unwrap_or_default().to_string();
        if !rows.insert(row) {
            *received.repeated.lock().expect("repeated") += 1;
            continue;
        }
        if let Some(us) = delay_us(&cell["createdAt"], arrived) {
            let _ = histogram.record(us);
        }
    }
}

/// Microseconds from `created` (an RFC 3339 `createdAt`) to `arrived`;
/// `None` when it is not one.
pub fn delay_us(created: &Value, arrived: chrono::DateTime<chrono::Utc>) -> Option<u64> {
    let created = chrono::DateTime::parse_from_rfc3339(created.as_str()?).ok()?;
    let us = (arrived - created.with_timezone(&chrono::Utc))
        .num_microseconds()
        .unwrap_or(0);
    Some(us.max(0) as u64)
}

/// Starts a receiver on a loopback port; returns its base URL and what it
/// gets.
pub async fn start() -> anyhow::Result<(String, Arc<Received>)> {
    let received = Arc::new(Received::default());
    let acceptor = TcpListener::bind("127.0.0.1:0").into_acceptor().await?;
    let address = acceptor
        .local_addr()
        .first()
        .and_then(|a| a.as_socket_addr().copied())
        .ok_or_else(|| anyhow::anyhow!("the receiver has no address"))?;
    let app = Route::new()
        .at("/:gateway", post(take))
        .data(received.clone());
    tokio::spawn(async move {
        let _ = poem::Server::new_with_acceptor(acceptor).run(app).await;
    });
    Ok((format!("http://{address}"), received))
}
