//! One measured phase: a request function driven by a fixed number of
//! workers until a deadline, with every latency in an HDR histogram.
//!
//! A phase is bounded three ways: by its deadline, by a request count per
//! worker, and by a timeout on every request, so a hung target ends the
//! phase with errors instead of hanging the run.

use std::future::Future;
use std::io::IsTerminal as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Upper bound on the requests of one worker in one phase.
const MAX_REQUESTS_PER_WORKER: u64 = 10_000_000;

/// One request of a workload: `Ok` holds the number of cells it wrote,
/// `Err` what went wrong.
pub type Op =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<u64, String>> + Send>> + Send + Sync>;

/// What one workload did on one path.
pub struct Outcome {
    pub requests: u64,
    pub errors: u64,
    /// Cells written by the requests that succeeded.
    pub cells: u64,
    pub elapsed: Duration,
    /// When the last worker finished.
    pub ended: Instant,
    /// Latencies of every request, in microseconds.
    pub latency: Histogram<u64>,
    pub first_error: Option<String>,
}

impl Outcome {
    pub fn per_second(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    pub fn ms(&self, quantile: f64) -> f64 {
        self.latency.value_at_quantile(quantile) as f64 / 1000.0
    }
}

/// A progress bar on stderr when it is a terminal, else a hidden one.
pub fn progress_bar(length: u64, template: &str, prefix: String) -> ProgressBar {
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::with_draw_target(Some(length), ProgressDrawTarget::stderr())
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(ProgressStyle::with_template(template).expect("valid template"));
    bar.set_prefix(prefix);
    bar
}

/// Runs `op` from `concurrency` workers until `duration` has passed,
/// waiting at most `timeout` for each request.
pub async fn run(
    label: &str,
    concurrency: u32,
    duration: Duration,
    timeout: Duration,
    op: Op,
) -> anyhow::Result<Outcome> {
    let bar = progress_bar(
        duration.as_millis() as u64,
        "{prefix:<26} {bar:30} {elapsed:>3} {msg}",
        label.to_string(),
    );
    let requests = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let cells = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(Mutex::new(None::<String>));
    let started = Instant::now();
    let deadline = started + duration;
    let mut workers = Vec::with_capacity(concurrency as usize);
    for _ in 0..concurrency {
        let op = op.clone();
        let (requests, errors, cells, first_error) = (
            requests.clone(),
            errors.clone(),
            cells.clone(),
            first_error.clone(),
        );
        workers.push(tokio::spawn(async move {
            let mut latency = new_histogram();
            let mut done = 0u64;
            while Instant::now() < deadline && done < MAX_REQUESTS_PER_WORKER {
                let sent = Instant::now();
                let result = match tokio::time::timeout(timeout, op()).await {
                    Ok(result) => result,
                    Err(_) => Err(format!("no answer within {timeout:?}")),
                };
                latency.saturating_record(sent.elapsed().as_micros() as u64);
                done += 1;
                requests.fetch_add(1, Ordering::Relaxed);
                match result {
                    Ok(written) => {
                        cells.fetch_add(written, Ordering::Relaxed);
                    }
                    Err(message) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        let mut first = first_error.lock().unwrap_or_else(|e| e.into_inner());
                        first.get_or_insert(message);
                    }
                }
            }
            latency
        }));
    }

    let ticker = {
        let (bar, requests, errors) = (bar.clone(), requests.clone(), errors.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                bar.set_position(started.elapsed().as_millis() as u64);
                bar.set_message(format!(
                    "{} requests, {} errors",
                    requests.load(Ordering::Relaxed),
                    errors.load(Ordering::Relaxed)
                ));
            }
        })
    };

    let mut latency = new_histogram();
    let mut failure = None;
    for worker in workers {
        match worker.await {
            Ok(h) => latency.add(h).expect("histograms of the same bounds"),
            Err(e) => failure = Some(e),
        }
    }
    let ended = Instant::now();
    let elapsed = ended - started;
    ticker.abort();
    let (requests, errors) = (
        requests.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    );
    bar.set_position(duration.as_millis() as u64);
    bar.finish_with_message(format!("{requests} requests, {errors} errors"));
    if let Some(e) = failure {
        anyhow::bail!("a worker of {label} failed: {e}");
    }
    let first_error = first_error.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(message) = &first_error {
        eprintln!("{label}: first error: {message}");
    }
    Ok(Outcome {
        requests,
        errors,
        cells: cells.load(Ordering::Relaxed),
        elapsed,
        ended,
        latency,
        first_error,
    })
}

/// Microseconds from 1 µs to 10 minutes, 3 significant digits.
fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds")
}
