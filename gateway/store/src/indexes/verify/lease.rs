//! One recording verify per datastore at a time, across gateways.
//!
//! A run that records its progress (every run but a sampled one) writes the
//! datastore's one checkpoint after each chunk. Two such runs at once, in
//! two gateways or a gateway and the command line, would overwrite each
//! other's checkpoint and do the same work twice. So such a run first takes
//! the lease `verify:<datastore>` on the datastore's first cluster
//! (`leases.rs`), renews it in the background while it runs, and gives it
//! up when it ends. A second run is refused with `VERIFY_RUNNING`, naming
//! the holder, once it has seen the lease renewed (within a few seconds);
//! a lease that is not renewed, that of a run whose process died, is
//! taken over once it expires (within 10 s). A run whose lease was taken
//! over (its process stalled past the lease time) stops before its next
//! checkpoint.
//!
//! A run that ends gives its lease up before it returns. One dropped by
//! its caller (Ctrl-C, a test) does so from a task of its own, which
//! `Store::shutdown` waits for.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::leases::{self, Lease, LeaseRow};
use crate::storage::Backend;
use crate::topology::{DatastoreRuntime, Topology};

/// How long a run's lease lasts unless renewed (every third of it): how
/// long the next run waits to see whether the holder is alive.
const LEASE_TIME: Duration = Duration::from_secs(10);

/// The lease of one recording run; given up when dropped.
pub(super) struct RunLease {
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
    /// Takes the verify lease of `ds`, or fails with `VERIFY_RUNNING`.
    pub(super) async fn take(topology: &Topology, ds: &DatastoreRuntime) -> Result<RunLease> {
        let home = ds.map().cluster_of(0);
        let backend = topology.clusters[home].maintenance()?.clone();
        let name = format!("verify:{}", ds.name());
        leases::ensure(backend.as_ref(), std::slice::from_ref(&name)).await?;
        // A held lease is watched: renewed, its holder runs (refused);
        // given up or expired unrenewed, it is taken. A run of this
        // process that was dropped gives its lease up within moments, one
        // whose process died within the lease time.
        let mut row = read(backend.as_ref(), &name).await?;
        let seen = row.expires_at;
        let deadline = std::time::Instant::now() + LEASE_TIME + Duration::from_secs(1);
        while row.expires_at > chrono::Utc::now() {
            if row.expires_at != seen || std::time::Instant::now() > deadline {
                return Err(refused(ds, backend.as_ref(), &name, &row).await);
            }
            tracing::info!(holder = %row.holder, until = %row.expires_at, "waiting to see whether the verify lease is renewed");
            tokio::time::sleep(Duration::from_millis(200)).await;
            row = read(backend.as_ref(), &name).await?;
        }
        let holder = format!("verify {}", leases::new_holder());
        let Some(lease) =
            leases::acquire(backend.as_ref(), &row, &holder, LEASE_TIME, Duration::ZERO).await?
        else {
            return Err(refused(ds, backend.as_ref(), &name, &row).await);
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
    pub(super) fn check(&self) -> Result<()> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(Error::LeaseLost(self.name.clone()));
        }
        Ok(())
    }

    /// Gives the lease up, at the end of the run.
    pub(super) async fn release(mut self) {
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
        tracing::debug!(error = %err, "giving up a verify lease failed; it expires");
    }
}

/// The releases of dropped runs, under way.
fn pending() -> &'static Mutex<Vec<tokio::task::JoinHandle<()>>> {
    static PENDING: OnceLock<Mutex<Vec<tokio::task::JoinHandle<()>>>> = OnceLock::new();
    PENDING.get_or_init(Default::default)
}

/// Waits (at most `grace`) for the releases of dropped runs.
pub(super) async fn settle(grace: Duration) {
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
                tracing::warn!(error = %err, lease = %lease.name, "renewing a verify lease failed");
                if lease.expires_at <= chrono::Utc::now() {
                    lost.store(true, Ordering::Relaxed);
                    return;
                }
            }
        }
    }
}

/// The refusal of a run while `row`'s holder (as read again) runs one.
async fn refused(
    ds: &DatastoreRuntime,
    backend: &dyn Backend,
    name: &str,
    row: &LeaseRow,
) -> Error {
    let now = read(backend, name).await.unwrap_or_else(|_| row.clone());
    Error::VerifyRunning {
        datastore: ds.name().to_string(),
        holder: now.holder,
        until: now.expires_at,
    }
}
