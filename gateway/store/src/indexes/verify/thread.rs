//! A verify on an OS thread of its own, at a low priority, with
//! connections of its own.
//!
//! A verify reads every cell of a datastore; beside live traffic on a
//! machine with few cores its work competes with the requests for the CPU,
//! and on SQLite the database work is CPU work of this process. Pauses
//! alone (`duty`) did not keep the requests' p99 within 20% of its level
//! without a verify: whenever the run works, it takes a core. So the run
//! gets a thread of its own with a current-thread runtime, lowered to a
//! nice value (19 by default) on Linux, where the nice value belongs to a
//! thread and is inherited by the threads it starts. It opens its own
//! connection pools from that thread (`ConnectOptions::background`): sqlx
//! runs each SQLite connection on a thread started when it connects, so
//! the database work of the run is low priority too, and the requests
//! never wait for a connection behind it. On a server database the pools
//! are only apart; the server's processes keep their priority.
//!
//! The caller's callbacks stay on the caller's task: the thread sends what
//! it finds over a channel, and after each chunk waits for the caller to
//! take its progress. The caller records the run's checkpoint (on the
//! store's own connections, at the caller's priority, so that the write
//! after every chunk never waits for SQLite's one write lock held by a
//! low-priority thread; only repairs write from the thread) before it
//! calls back, so a caller that drops the run (Ctrl-C, a gateway
//! stopping, a test) knows the last checkpoint. The thread stops at its
//! next await once the caller is gone.

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::{
    run_on, Drift, Listener, VerifyCheckpoint, VerifyOptions, VerifyProgress, VerifyReport,
};
use crate::error::{Error, Result};
use crate::storage::{self, Backend};
use crate::topology::{ClusterState, DatastoreRuntime, Topology};
use crate::StorageConfig;

/// Connections of each pool of the run: two chunks run at once at duty 1.
const CONNECTIONS: u32 = 2;

/// What the thread tells its caller.
enum Message {
    Drift(Drift),
    /// The progress after a chunk, with the checkpoint to record; the run
    /// goes on once `taken` is sent.
    Progress {
        progress: VerifyProgress,
        checkpoint: Option<VerifyCheckpoint>,
        taken: oneshot::Sender<()>,
    },
    Done(Result<VerifyReport>),
}

/// Runs the verify on a thread of its own at `nice` and relays what it
/// reports to `listener`.
pub(super) async fn run(
    topology: &Arc<Topology>,
    storage: &StorageConfig,
    ds: Arc<DatastoreRuntime>,
    options: VerifyOptions,
    nice: i32,
    listener: &mut dyn Listener,
) -> Result<VerifyReport> {
    let (sender, mut messages) = mpsc::unbounded_channel();
    let topology = topology.clone();
    let storage = storage.clone();
    std::thread::Builder::new()
        .name(format!("verify-{}", ds.name()))
        .spawn(move || {
            lower_priority(nice);
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(err) => {
                    let err = Error::Internal(format!("cannot start the verify's runtime: {err}"));
                    let _ = sender.send(Message::Done(Err(err)));
                    return;
                }
            };
            runtime.block_on(async {
                let outcome = verify_apart(&topology, &storage, &ds, &options, &sender).await;
                let _ = sender.send(Message::Done(outcome));
            });
        })
        .map_err(|e| Error::Internal(format!("cannot start the verify's thread: {e}")))?;
    while let Some(message) = messages.recv().await {
        match message {
            Message::Drift(drift) => listener.drift(&drift),
            Message::Progress {
                progress,
                checkpoint,
                taken,
            } => {
                listener.progress(&progress, checkpoint.as_ref()).await?;
                let _ = taken.send(());
                // A caller that drops the run now, from its callback,
                // does so before the next checkpoint is written here.
                tokio::task::yield_now().await;
            }
            Message::Done(outcome) => return outcome,
        }
    }
    Err(Error::Internal("the verify's thread stopped".into()))
}

/// On the run's thread: opens the run's connections, verifies, and closes
/// them again.
async fn verify_apart(
    main: &Topology,
    storage: &StorageConfig,
    ds: &DatastoreRuntime,
    options: &VerifyOptions,
    sender: &mpsc::UnboundedSender<Message>,
) -> Result<VerifyReport> {
    let mut own: Vec<Arc<dyn Backend>> = Vec::new();
    let topology = connect(main, storage, &mut own).await;
    let outcome = match topology {
        Ok(topology) => {
            let mut relay = Relay { sender };
            tokio::select! {
                outcome = run_on(&topology, ds, options, &mut relay) => outcome,
                _ = sender.closed() => Err(Error::Internal("the verify was stopped".into())),
            }
        }
        Err(err) => Err(err),
    };
    for backend in own {
        backend.close().await;
    }
    outcome
}

/// A topology like `main` whose prepared clusters have background pools
/// of their own, opened from this thread (and added to `own`). A cluster
/// that is not prepared keeps its state, so the run fails on it as it
/// would on `main`, without connecting.
async fn connect(
    main: &Topology,
    storage: &StorageConfig,
    own: &mut Vec<Arc<dyn Backend>>,
) -> Result<Topology> {
    let mut masters = Vec::new();
    for (cluster, config) in main.clusters.iter().zip(&storage.clusters) {
        if cluster.state() != ClusterState::Ready {
            masters.push(cluster.master.clone());
            continue;
        }
        let options = storage::ConnectOptions {
            max_connections: CONNECTIONS,
            background: true,
            ..storage.connect_options(&cluster.name)
        };
        let backend = storage::connect(&config.master, &options).await?;
        own.push(backend.clone());
        masters.push(backend);
    }
    Ok(main.apart(masters))
}

/// The run's listener on its thread: sends what it reports to the caller.
struct Relay<'a> {
    sender: &'a mpsc::UnboundedSender<Message>,
}

#[async_trait::async_trait]
impl Listener for Relay<'_> {
    fn drift(&mut self, drift: &Drift) {
        let _ = self.sender.send(Message::Drift(drift.clone()));
    }

    async fn progress(
        &mut self,
        progress: &VerifyProgress,
        checkpoint: Option<&VerifyCheckpoint>,
    ) -> Result<()> {
        let (taken, was_taken) = oneshot::channel();
        let message = Message::Progress {
            progress: progress.clone(),
            checkpoint: checkpoint.cloned(),
            taken,
        };
        let stopped = || Error::Internal("the verify was stopped".into());
        self.sender.send(message).map_err(|_| stopped())?;
        was_taken.await.map_err(|_| stopped())
    }
}

/// Lowers the calling thread to `nice`; the threads it starts from now on
/// inherit it (Linux keeps the nice value per thread).
#[cfg(target_os = "linux")]
fn lower_priority(nice: i32) {
    // SAFETY: both calls only read or set the scheduling attributes of
    // the calling thread; they touch no memory of this process.
    let outcome = unsafe {
        let thread = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, thread as libc::id_t, nice)
    };
    if outcome != 0 {
        tracing::warn!(
            nice,
            error = %std::io::Error::last_os_error(),
            "cannot set the verify's priority; it runs at the process's"
        );
    }
}

/// Elsewhere the thread keeps the process's priority.
#[cfg(not(target_os = "linux"))]
fn lower_priority(_nice: i32) {}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The nice value of the calling thread.
    fn nice() -> i32 {
        // SAFETY: reads the scheduling attributes of the calling thread.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
    }

    /// What the design relies on: the nice value set on the run's thread
    /// holds for that thread only, and threads it starts (SQLite's
    /// connection threads) inherit it.
    #[test]
    fn a_lowered_thread_and_the_threads_it_starts_run_at_its_nice_value() {
        let before = nice();
        let (own, started) = std::thread::spawn(|| {
            super::lower_priority(19);
            (nice(), std::thread::spawn(nice).join().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!((own, started), (19, 19));
        assert_eq!(nice(), before);
    }
}
