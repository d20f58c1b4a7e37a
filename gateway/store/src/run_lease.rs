//! One run of a job at a time, across processes: a recording index verify
//! per datastore (`verify:<datastore>`), a shard move and its abort per
//! datastore (`move:<datastore>`).
//!
//! A run first takes its lease (`leases.rs`), renews it in the background
//! while it runs, and gives it up when it ends. A second run is refused,
//! naming the holder, once it has seen the lease renewed (within a few
//! seconds); a lease that is not renewed, that of a run whose process
//! died, is taken over once it expires (within 10 s). A run whose lease
//! was taken over (its process stalled past the lease time) learns so from
//! [`RunLease::check`] and stops at its next check.
//!
//! A run that ends gives its lease up before it returns. One dropped by
//! its caller (Ctrl-C, a test) does so from a task of its own, which
//! `Store::shutdown` waits for ([`settle`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::leases::{self, Lease, LeaseRow};
use crate::storage::Backend;

/// How long a run's lease lasts unless renewed (every third of it): how
/// long the next run waits to see whether the holder is alive.
const LEASE_TIME: Duration = Duration::from_secs(10);

/// The lease of one run; given up when dropped.
pub(crate) struct RunLease {
    backend: Arc<dyn Backend>,
    name: String,
    holder: String,
    lost: Arc<AtomicBool>,
    renewal: tokio::task::JoinHandle<()>,
    /// Given up already ([`RunLease::release`]).
    released: bool,
}

/// The lease row `name`.
async fn read(backend: &dyn Backend, name: &str) -> Result<LeaseRow> {
    leases::list(backend, name)
        .await?
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| Error::Internal(format!("lease `{name}` was not created")))
}

impl RunLease {
    /// Takes the lease `name` on `backend` for a run of `kind` (named in
    /// the holder), or fails with `refused(the holder's row)`.
    pub(crate) async fn take(
        backend: Arc<dyn Backend>,
        name: String,
        kind: &str,
        refused: impl Fn(LeaseRow) -> Error,
    ) -> Result<RunLease> {
        leases::ensure(backend.as_ref(), std::slice::from_ref(&name)).await?;
        let refuse = |row: &LeaseRow| {
            let backend = backend.clone();
            let (name, row) = (name.clone(), row.clone());
            async move { read(backend.as_ref(), &name).await.unwrap_or(row) }
        };
        // A held lease is watched: renewed, its holder runs (refused);
        // given up or expired unrenewed, it is taken. A run of this
        // process that was dropped gives its lease up within moments, one
        // whose process died within the lease time.
        let mut row = read(backend.as_ref(), &name).await?;
        let seen = row.expires_at;
        let deadline = std::time::Instant::now() + LEASE_TIME + Duration::from_secs(1);
        while row.expires_at > chrono::Utc::now() {
            if row.expires_at != seen || std::time::Instant::now() > deadline {
                return Err(refused(refuse(&row).await));
            }
            tracing::info!(lease = %name, holder = %row.holder, until = %row.expires_at, "waiting to see whether the lease is renewed");
            tokio::time::sleep(Duration::from_millis(200)).await;
            row = read(backend.as_ref(), &name).await?;
        }
        let holder = format!("{kind} {}", leases::new_holder());
        let Some(lease) =
            leases::acquire(backend.as_ref(), &row, &holder, LEASE_TIME, Duration::ZERO).await?
        else {
            return Err(refused(refuse(&row).await));
        };
        let lost = Arc::new(AtomicBool::new(false));
        let renewal = tokio::spawn(renew(backend.clone(), holder.clone(), lease, lost.clone()));
        Ok(RunLease {
            backend,
            name,
            holder,
            lost,
            renewal,
            released: false,
        })
    }

    /// Fails once another process has taken the lease over.
    pub(crate) fn check(&self) -> Result<()> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(Error::LeaseLost(self.name.clone()));
        }
        Ok(())
    }

    /// Gives the lease up, at the end of the run.
    pub(crate) async fn release(mut self) {
        self.released = true;
        self.renewal.abort();
        give_up(self.backend.clone(), self.holder.clone(), self.name.clone()).await;
    }
}

impl Drop for RunLease {
    /// A run dropped before it ended gives its lease up from a task of its
    /// own; [`settle`] waits for those.
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.renewal.abort();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let task = runtime.spawn(give_up(
                self.backend.clone(),
                self.holder.clone(),
                self.name.clone(),
            ));
            let mut pending = pending().lock().expect("pending releases");
            pending.retain(|t| !t.is_finished());
            pending.push(task);
        }
    }
}

async fn give_up(backend: Arc<dyn Backend>, holder: String, name: String) {
    if let Err(err) = leases::release(backend.as_ref(), &holder, &[name]).await {
        tracing::debug!(error = %err, "giving up a run lease failed; it expires");
    }
}

/// The releases of dropped runs, under way.
fn pending() -> &'static Mutex<Vec<tokio::task::JoinHandle<()>>> {
    static PENDING: OnceLock<Mutex<Vec<tokio::task::JoinHandle<()>>>> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

/// Waits (at most `grace`) for the releases of dropped runs.
pub(crate) async fn settle(grace: Duration) {
    let tasks = std::mem::take(&mut *pending().lock().expect("pending releases"));
    let _ = tokio::time::timeout(grace, futures::future::join_all(tasks)).await;
}

/// Renews `lease` every third of the lease time; marks it lost once
/// another process holds it or it expired unrenewed.
async fn renew(backend: Arc<dyn Backend>, holder: String, mut lease: Lease, lost: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(LEASE_TIME / 3).await;
        match leases::renew(
            backend.as_ref(),
            &holder,
            std::slice::from_ref(&lease),
            LEASE_TIME,
        )
        .await
        {
            Ok(mut held) => match held.pop() {
                Some(renewed) => lease = renewed,
                None => {
                    lost.store(true, Ordering::Relaxed);
                    return;
                }
            },
            Err(err) => {
                tracing::warn!(error = %err, lease = %lease.name, "renewing a run lease failed");
                if lease.expires_at <= chrono::Utc::now() {
                    lost.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
}
