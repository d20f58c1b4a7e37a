//! Verify runs started in this process: where each stands, what they
//! found, and the totals for `/metrics`.

use super::*;

/// Mismatches a [`VerifyStatus`] keeps (all of them go to the run's
/// callback and the log).
pub(crate) const KEPT_DRIFT: usize = 100;

/// Where a verify run started in this process stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum VerifyState {
    Running,
    Done,
    Failed,
}

/// A verify run started in this process (by the admin API or the
/// schedule), as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VerifyStatus {
    pub datastore: String,
    pub state: VerifyState,
    /// Started by the schedule (a sampled verify), not by a person.
    pub scheduled: bool,
    pub repair: bool,
    pub sample: Option<u32>,
    pub progress: VerifyProgress,
    /// The first 100 mismatches.
    pub drift: Vec<Drift>,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

/// Verify counters of one datastore in this process, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyTotals {
    /// Runs finished (scheduled or asked for).
    pub runs: u64,
    /// Runs that stopped on an error.
    pub failed: u64,
    pub missing: u64,
    pub stale: u64,
    pub extra: u64,
    pub repaired: u64,
    /// Mismatches found by the latest finished run.
    pub last_drift: u64,
}

/// The verify runs of this process: at most one per datastore at a time.
#[derive(Default)]
pub(crate) struct Verifier {
    runs: std::sync::Mutex<HashMap<String, VerifyStatus>>,
    totals: std::sync::Mutex<HashMap<String, VerifyTotals>>,
}

impl Verifier {
    /// Records a new run of `datastore`; false when one is running.
    pub(crate) fn begin(&self, datastore: &str, options: &VerifyOptions, scheduled: bool) -> bool {
        let mut runs = self.runs.lock().expect("verify runs");
        if runs
            .get(datastore)
            .is_some_and(|r| r.state == VerifyState::Running)
        {
            return false;
        }
        runs.insert(
            datastore.to_string(),
            VerifyStatus {
                datastore: datastore.to_string(),
                state: VerifyState::Running,
                scheduled,
                repair: options.repair,
                sample: options.sample,
                progress: VerifyProgress::default(),
                drift: Vec::new(),
                started_at: Utc::now(),
                finished_at: None,
                error: None,
            },
        );
        true
    }

    pub(crate) fn progress(&self, datastore: &str, progress: &VerifyProgress) {
        if let Some(run) = self.runs.lock().expect("verify runs").get_mut(datastore) {
            run.progress = progress.clone();
        }
    }

    pub(crate) fn drift(&self, datastore: &str, drift: &Drift) {
        tracing::warn!(
            datastore,
            index = %drift.index,
            row_key = %drift.row_key,
            shard = drift.shard,
            cluster = %drift.cluster,
            repaired = drift.repaired,
            "index entry {}",
            drift.kind.as_str()
        );
        if let Some(run) = self.runs.lock().expect("verify runs").get_mut(datastore) {
            if run.drift.len() < KEPT_DRIFT {
                run.drift.push(drift.clone());
            }
        }
    }

    pub(crate) fn finish(&self, datastore: &str, outcome: &Result<VerifyReport>) {
        let mut totals = self.totals.lock().expect("verify totals");
        let total = totals.entry(datastore.to_string()).or_default();
        total.runs += 1;
        if let Some(run) = self.runs.lock().expect("verify runs").get_mut(datastore) {
            run.finished_at = Some(Utc::now());
            match outcome {
                Ok(report) => {
                    run.state = VerifyState::Done;
                    run.progress = report.progress.clone();
                    let p = &report.progress;
                    total.missing += p.missing;
                    total.stale += p.stale;
                    total.extra += p.extra;
                    total.repaired += p.repaired;
                    total.last_drift = p.drift();
                }
                Err(err) => {
                    run.state = VerifyState::Failed;
                    run.error = Some(err.client_message());
                    total.failed += 1;
                }
            }
        }
    }

    pub(crate) fn status(&self, datastore: &str) -> Option<VerifyStatus> {
        self.runs
            .lock()
            .expect("verify runs")
            .get(datastore)
            .cloned()
    }

    pub(crate) fn totals(&self, datastore: &str) -> VerifyTotals {
        self.totals
            .lock()
            .expect("verify totals")
            .get(datastore)
            .cloned()
            .unwrap_or_default()
    }
}
