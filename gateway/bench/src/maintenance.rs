//! Index maintenance as the benchmark sees it: counters and gauges read
//! the same way on both paths (`/metrics` of the gateway, or
//! [`Store::metrics`] in-process), sampled while writes run, and the wait
//! for the indexes to catch up afterwards.
//!
//! The pending cells and the lag come from the maintainer's sweep (every
//! second by default), so a sample shows the latest sweep, not this very
//! instant. The end of a drain is therefore decided by the applied-cells
//! counter — every cell the writers stored has been applied — and falls
//! back to a zero pending figure from a sweep after the writes only when a
//! gateway does not report that counter.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::http::{Gateway, APPLIED, LAG_MAX_MS, PENDING, STATEMENTS};
use cellgate_store::Store;

/// How often the figures are sampled during a write phase.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(500);
/// How often they are read while waiting for the indexes.
const POLL_EVERY: Duration = Duration::from_millis(100);
/// After the writes, a pending figure of 0 is trusted only from a scrape
/// this much later: by then a sweep has run since the last write (at the
/// default sweep interval of 1 s).
const SWEEP_MARGIN: Duration = Duration::from_millis(2500);
/// Failed reads of the figures a drain tolerates.
const MAX_FAILED_READS: u32 = 10;

/// The figures at one moment; `None` when the source does not report one.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    /// Statements sent to the databases, summed over clusters.
    pub statements: Option<u64>,
    /// Cells not yet applied to every index, summed over datastores.
    pub pending: Option<i64>,
    /// Age of the oldest unapplied cell, the largest over datastores.
    pub lag_max_ms: Option<u64>,
    /// Log cells applied to the indexes, summed over datastores.
    pub applied: Option<u64>,
    /// Pending cells per datastore, for messages.
    pub pending_by_datastore: Vec<(String, i64)>,
}

impl Snapshot {
    /// `trips 1200, payments 0`, or `unknown`.
    pub fn describe_pending(&self) -> String {
        if self.pending_by_datastore.is_empty() {
            return "unknown".to_string();
        }
        self.pending_by_datastore
            .iter()
            .map(|(name, pending)| format!("{name} {pending}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where the figures come from.
pub enum Source {
    Http(Arc<Gateway>),
    Store(Store),
}

impl Source {
    pub async fn snapshot(&self) -> anyhow::Result<Snapshot> {
        match self {
            Source::Http(gateway) => {
                let metrics = gateway.metrics().await?;
                Ok(Snapshot {
                    statements: metrics.sum(STATEMENTS).map(|v| v as u64),
                    pending: metrics.sum(PENDING).map(|v| v as i64),
                    lag_max_ms: metrics.max(LAG_MAX_MS).map(|v| v as u64),
                    applied: metrics.sum(APPLIED).map(|v| v as u64),
                    pending_by_datastore: metrics
                        .by_label(PENDING, "datastore")
                        .into_iter()
                        .map(|(name, v)| (name, v as i64))
                        .collect(),
                })
            }
            Source::Store(store) => {
                let metrics = store.metrics();
                let maintenance = metrics.datastores.iter().map(|d| &d.maintenance);
                Ok(Snapshot {
                    statements: Some(metrics.clusters.iter().map(|c| c.statements).sum()),
                    pending: Some(maintenance.clone().map(|m| m.pending_cells).sum()),
                    lag_max_ms: Some(maintenance.clone().map(|m| m.lag_max_ms).max().unwrap_or(0)),
                    applied: Some(maintenance.map(|m| m.applied_cells).sum()),
                    pending_by_datastore: metrics
                        .datastores
                        .iter()
                        .map(|d| (d.name.clone(), d.maintenance.pending_cells))
                        .collect(),
                })
            }
        }
    }
}

/// Samples pending cells and lag every [`SAMPLE_EVERY`] until stopped.
pub struct Sampler {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<(i64, u64)>>,
}

impl Sampler {
    /// Starts sampling; at most `bound` long, whether stopped or not.
    pub fn start(source: Arc<Source>, bound: Duration) -> Sampler {
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let mut samples = Vec::new();
            let mut tick =
                tokio::time::interval_at(tokio::time::Instant::now() + SAMPLE_EVERY, SAMPLE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while started.elapsed() < bound {
                tokio::select! {
                    _ = stopped.changed() => break,
                    _ = tick.tick() => {}
                }
                // A failed scrape is a missing sample, not a failed run.
                if let Ok(Snapshot {
                    pending: Some(pending),
                    lag_max_ms,
                    ..
                }) = source.snapshot().await
                {
                    samples.push((pending, lag_max_ms.unwrap_or(0)));
                }
            }
            samples
        });
        Sampler { stop, task }
    }

    /// Stops sampling; the `(pending cells, lag ms)` samples.
    pub async fn stop(self) -> Vec<(i64, u64)> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// How a wait for the indexes ended.
pub struct Drained {
    /// From the end of the writes to caught up (or to giving up).
    pub elapsed: Duration,
    /// The figures at the end.
    pub last: Snapshot,
    /// Caught up; false after `timeout`, or when not measured.
    pub done: bool,
    /// The source reports applied or pending cells (a gateway of another
    /// version may report neither).
    pub measured: bool,
}

/// Waits until the indexes have applied the `written` cells stored since
/// `before` was taken, at most `timeout` after `started`, the moment the
/// writes ended.
pub async fn drain(
    source: &Source,
    before: &Snapshot,
    written: u64,
    started: Instant,
    timeout: Duration,
) -> anyhow::Result<Drained> {
    let mut failures = 0;
    loop {
        let now = match source.snapshot().await {
            Ok(now) => now,
            // A scrape that failed now and then is waited out; a source
            // that stopped answering ends the run.
            Err(e) if failures >= MAX_FAILED_READS || started.elapsed() >= timeout => {
                return Err(e.context("cannot read the index maintenance figures"))
            }
            Err(_) => {
                failures += 1;
                tokio::time::sleep(POLL_EVERY).await;
                continue;
            }
        };
        let applied = match (now.applied, before.applied) {
            (Some(now), Some(before)) => Some(now.saturating_sub(before)),
            _ => None,
        };
        let done = match applied {
            Some(applied) => applied >= written,
            None => match now.pending {
                Some(pending) => pending == 0 && started.elapsed() >= SWEEP_MARGIN,
                None => {
                    return Ok(Drained {
                        elapsed: started.elapsed(),
                        last: now,
                        done: false,
                        measured: false,
                    })
                }
            },
        };
        if done || started.elapsed() >= timeout {
            return Ok(Drained {
                elapsed: started.elapsed(),
                last: now,
                done,
                measured: true,
            });
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// p50, p99 and max of a set of samples.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Spread {
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(mut values: Vec<f64>) -> Spread {
        if values.is_empty() {
            return Spread::default();
        }
        values.sort_by(f64::total_cmp);
        let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
        Spread {
            p50: at(0.5),
            p99: at(0.99),
            max: values[values.len() - 1],
        }
    }
}

/// Index maintenance during one write phase.
#[derive(Debug, Clone, Serialize)]
pub struct MaintenanceReport {
    pub path: &'static str,
    /// Cells stored by the writers, and per second of the phase.
    pub written_cells: u64,
    pub write_cells_per_second: f64,
    /// Cells applied from the phase's start to the end of the drain, and
    /// per second of that time; `None` without the applied counter.
    pub applied_cells: Option<u64>,
    pub apply_cells_per_second: Option<f64>,
    pub pending_cells: Spread,
    pub lag_ms: Spread,
    pub samples: usize,
    /// Seconds from the end of the writes until every written cell was
    /// applied; `None` when not measured or not reached.
    pub drain_seconds: Option<f64>,
    pub drained: bool,
}

impl Drained {
    /// A drain that was not measured.
    pub fn unmeasured() -> Drained {
        Drained {
            elapsed: Duration::ZERO,
            last: Snapshot::default(),
            done: false,
            measured: false,
        }
    }
}

impl MaintenanceReport {
    pub fn new(
        path: &'static str,
        written: u64,
        phase: Duration,
        before: &Snapshot,
        samples: &[(i64, u64)],
        drained: &Drained,
    ) -> MaintenanceReport {
        let applied = match (drained.last.applied, before.applied) {
            (Some(now), Some(before)) => Some(now.saturating_sub(before)),
            _ => None,
        };
        let apply_time = (phase + drained.elapsed).as_secs_f64().max(1e-9);
        MaintenanceReport {
            path,
            written_cells: written,
            write_cells_per_second: written as f64 / phase.as_secs_f64().max(1e-9),
            applied_cells: applied,
            apply_cells_per_second: applied.map(|a| a as f64 / apply_time),
            pending_cells: Spread::of(samples.iter().map(|s| s.0 as f64).collect()),
            lag_ms: Spread::of(samples.iter().map(|s| s.1 as f64).collect()),
            samples: samples.len(),
            drain_seconds: drained.done.then_some(drained.elapsed.as_secs_f64()),
            drained: drained.done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Spread;

    #[test]
    fn spread_of_samples() {
        assert_eq!(Spread::of(vec![]), Spread::default());
        let spread = Spread::of((1..=100).rev().map(f64::from).collect());
        assert_eq!((spread.p50, spread.p99, spread.max), (51.0, 99.0, 100.0));
    }
}
