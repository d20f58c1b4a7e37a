//! One recording verify per datastore at a time, across gateways.
//!
//! A run that records its progress (every run but a sampled one) writes the
//! datastore's one checkpoint after each chunk. Two such runs at once, in
//! two gateways or a gateway and the command line, would overwrite each
//! other's checkpoint and do the same work twice. So such a run first takes
//! the lease `verify:<datastore>` on the datastore's first cluster
//! (`leases.rs`), renews it in the background while it runs, and gives it
//! up when it ends. A second run is refused with `VERIFY_RUNNING`, naming
//! the holder. A run whose lease was taken over (its process stalled past
//! the lease time) stops before its next checkpoint.
//!
//! A run dropped by its caller (Ctrl-C, a test) gives its lease up from a
//! task of its own; the next run of the same process waits for that (up to
//! 2 s) instead of being refused. One in another process that died keeps
//! the lease until it expires (30 s).

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use uuid::Uuid;

use crate::error::{Error, Result};
use crate::leases::{self, Lease, LeaseRow};
use crate::storage::Backend;
use crate::topology::{DatastoreRuntime, Topology};

/// How long a run's lease lasts unless renewed: how long a run whose
/// process died blocks the next one.
const LEASE_TIME: Duration = Duration::from_secs(30);

/// The lease of one recording run; given up when dropped.
pub(super) struct RunLease {
    backend: Arc<dyn Backend>,
    name: String,
    holder: String,
    lost: Arc<AtomicBool>,
    renewal: tokio::task::JoinHandle<()>,
}

/// Waits of 50 ms for the lease of a dropped run of this process to be
/// given up.
const DROPPED_WAITS: usize = 40;

/// The lease row `name`.
async fn read(backend: &dyn Backend, name: &str) -> Result<LeaseRow> {
    leases::list(backend, name)
        .await?
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| Error::Internal(format!("lease `{name}` was not created")))
}

/// The holders of the runs of this process that are still under way.
fn running() -> &'static Mutex<HashSet<String>> {
    static RUNNING: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    RUNNING.get_or_init(Default::default)
}

/// What every holder of this process starts with.
fn process_prefix() -> &'static str {
    static PREFIX: OnceLock<String> = OnceLock::new();
    PREFIX.get_or_init(|| {
        let host = std::env::var("HOSTNAME").unwrap_or_else(|_| "host".to_string());
        format!("verify {host}:{}:", std::process::id())
    })
}

impl RunLease {
    /// Takes the verify lease of `ds`, or fails with `VERIFY_RUNNING`.
    pub(super) async fn take(topology: &Topology, ds: &DatastoreRuntime) -> Result<RunLease> {
        let home = ds.map.cluster_of(0);
        let backend = topology.clusters[home].maintenance()?.clone();
        let name = format!("verify:{}", ds.name());
        leases::ensure(backend.as_ref(), std::slice::from_ref(&name)).await?;
        // A run of this process that was dropped gives its lease up from a
        // task of its own: that lands within moments, and is waited for.
        let mut row = read(backend.as_ref(), &name).await?;
        for _ in 0..DROPPED_WAITS {
            let dropped_here = row.expires_at > chrono::Utc::now()
                && row.holder.starts_with(process_prefix())
                && !running().lock().expect("verify runs").contains(&row.holder);
            if !dropped_here {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            row = read(backend.as_ref(), &name).await?;
        }
        let holder = format!(
            "{}{}",
            process_prefix(),
            &Uuid::new_v4().simple().to_string()[..8]
        );
        let Some(lease) =
            leases::acquire(backend.as_ref(), &row, &holder, LEASE_TIME, Duration::ZERO).await?
        else {
            return Err(refused(ds, backend.as_ref(), &name, &row).await);
        };
        running()
            .lock()
            .expect("verify runs")
            .insert(holder.clone());
        let lost = Arc::new(AtomicBool::new(false));
        let renewal = tokio::spawn(renew(backend.clone(), holder.clone(), lease, lost.clone()));
        Ok(RunLease {
            backend,
            name,
            holder,
            lost,
            renewal,
        })
    }

    /// Fails once another process has taken the lease over.
    pub(super) fn check(&self) -> Result<()> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(Error::LeaseLost(self.name.clone()));
        }
        Ok(())
    }
}

impl Drop for RunLease {
    fn drop(&mut self) {
        self.renewal.abort();
        running().lock().expect("verify runs").remove(&self.holder);
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (backend, holder, name) =
                (self.backend.clone(), self.holder.clone(), self.name.clone());
            runtime.spawn(async move {
                if let Err(err) = leases::release(backend.as_ref(), &holder, &[name]).await {
                    tracing::debug!(error = %err, "giving up a verify lease failed; it expires");
                }
            });
        }
    }
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
