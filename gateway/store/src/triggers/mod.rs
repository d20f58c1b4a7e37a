//! Triggers: the cell log as a change stream for consumers in this process
//! (SPEC §7).
//!
//! A consumer ([`ConsumerOptions`]) names a datastore, the columns it
//! follows and a [`Handler`] that takes a batch of cells. Delivery is at
//! least once, in `added_id` order within each shard:
//!
//! - **Progress** is stored in the datastore: per shard the last handled
//!   `added_id`, in `<ds>_offsets` under the consumer name `trig:<name>`,
//!   on the cluster holding the shard. Offsets advance only after the
//!   handler accepted a batch, so a crash delivers the batch again.
//! - **Sharing**: the shards of each cluster are split into lease buckets
//!   (`shard_leases.rs`, leases named `trig:<name>:<ds>:<n>`) that the
//!   running gateways share fairly; a dead gateway's buckets are taken over
//!   once their leases expire. Every offset write is fenced by the leases
//!   of its shards, so a gateway that lost a bucket cannot move it.
//! - **Push**: a commit in this process wakes the consumers of its
//!   datastore at once (`Events`); other gateways' commits are found by a
//!   sweep of the shard counters every `sweep_every`.
//! - **Failures**: a failing batch is retried with exponential backoff; after
//!   `max_attempts` its cells are retried one by one, and a cell that still
//!   fails `max_attempts` times is moved to `<ds>_trigger_quarantine` so its
//!   shard moves on. Past `quarantine_limit` quarantined cells the consumer
//!   stops and says why ([`ConsumerStatus::stopped`]). Quarantined cells are
//!   listed by [`Store::trigger_quarantine`](crate::Store::trigger_quarantine)
//!   and delivered again after
//!   [`Store::retry_trigger_quarantine`](crate::Store::retry_trigger_quarantine).
//! - **Lag** is measured, not remembered:
//!   [`Store::trigger_lag`](crate::Store::trigger_lag) compares each shard's
//!   log head with the consumer's stored offset, so every gateway reports
//!   the same figures ([`ConsumerLag`]).
//! - **Rewind**: [`Store::rewind_consumer`](crate::Store::rewind_consumer)
//!   moves every shard's offset to an `added_id` or to the last cell before a
//!   time; a running consumer notices at its next offset write (which
//!   compares the offsets it read) or sweep.
//!
//! `worker.rs` runs one consumer on one cluster; `state.rs` holds the SQL of
//! offsets, quarantine and rewind. `tail.rs` is the other form of consumer:
//! followers without stored progress (GraphQL subscriptions) that share one
//! reader of the log per datastore.

mod state;
pub mod tail;
mod worker;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::cells::Cell;
use crate::error::{Error, Result};
use crate::topology::Topology;

pub(crate) use state::{list_quarantine, retry_quarantine, rewind};

/// What a handler is given: a batch of cells, in `added_id` order within
/// each shard (cells of several shards may share a batch).
#[derive(Debug, Clone)]
pub struct Delivery {
    pub consumer: String,
    pub datastore: String,
    pub cells: Vec<Arc<Cell>>,
    /// 1 for the first delivery of this batch, counting up on retries.
    pub attempt: u32,
}

/// The future a handler returns: `Ok` acknowledges the whole batch, `Err`
/// (a message for the logs and the quarantine) has it retried.
pub type HandlerFuture = Pin<Box<dyn Future<Output = std::result::Result<(), String>> + Send>>;

/// A consumer's handler.
pub type Handler = Arc<dyn Fn(Delivery) -> HandlerFuture + Send + Sync>;

/// Where a consumer without stored progress starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StartAt {
    /// With the first cell of every shard.
    #[default]
    Beginning,
    /// After the cells stored when it first takes a shard.
    Now,
}

/// A trigger consumer.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// Unique per datastore: letters, digits, `_` and `-`.
    pub name: String,
    pub datastore: String,
    /// The columns whose cells are delivered; every column when empty.
    pub columns: Vec<String>,
    /// Most cells per handler call.
    pub batch_size: usize,
    /// Attempts before a batch is split and a single cell quarantined.
    pub max_attempts: u32,
    /// Quarantined cells (of this consumer, on all clusters) past which it
    /// stops.
    pub quarantine_limit: u64,
    /// First retry delay; doubles per attempt up to `max_backoff`.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// How long a gateway that stopped keeps its shards before others take
    /// them over.
    pub lease_time: Duration,
    /// How often the shard counters are read to find other gateways'
    /// commits (and rewinds and quarantine retries).
    pub sweep_every: Duration,
    pub start_at: StartAt,
}

impl ConsumerOptions {
    /// A consumer of every column of `datastore` with the defaults.
    pub fn new(name: &str, datastore: &str) -> ConsumerOptions {
        ConsumerOptions {
            name: name.to_string(),
            datastore: datastore.to_string(),
            columns: Vec::new(),
            batch_size: 100,
            max_attempts: 5,
            quarantine_limit: 100,
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            lease_time: Duration::from_secs(10),
            sweep_every: Duration::from_secs(1),
            start_at: StartAt::Beginning,
        }
    }

    /// The name of its offsets in `<ds>_offsets` and of its quarantine.
    pub(crate) fn key(&self) -> String {
        offsets_key(&self.name)
    }
}

/// The offsets name of the consumer `name`.
pub(crate) use crate::topology::trigger_consumer as offsets_key;

/// A consumer's figures, for monitoring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStatus {
    pub name: String,
    pub datastore: String,
    /// The columns it follows; every column when empty.
    pub columns: Vec<String>,
    /// Cells handed to the handler and acknowledged, since it started.
    pub delivered: u64,
    /// Cells quarantined, on every cluster (counted at start, then kept).
    pub quarantined: u64,
    /// Cells of the shards this gateway holds not yet delivered (of any
    /// column), from the latest known heads.
    pub pending_cells: i64,
    /// Lease buckets this gateway holds.
    pub held_buckets: usize,
    /// Quarantined cells past which it stops.
    pub quarantine_limit: u64,
    /// Why it stopped, once it has.
    pub stopped: Option<String>,
}

/// How far a consumer is behind the log of one cluster's shards, measured
/// from the shard counters and its stored offsets
/// ([`Store::trigger_lag`](crate::Store::trigger_lag)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerLag {
    /// The cluster's name.
    pub cluster: String,
    /// Cells after its offsets, summed over the cluster's shards (cells of
    /// every column: the log does not say which ones it follows).
    pub pending_cells: i64,
    /// The shards with cells after its offset, in shard order.
    pub shards: Vec<crate::cells::ShardLag>,
}

/// A quarantined cell of a consumer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedCell {
    pub consumer: String,
    pub shard: u32,
    pub added_id: i64,
    pub row_key: Uuid,
    pub column: String,
    pub ref_key: i64,
    pub attempts: i64,
    /// The handler's last error.
    pub message: String,
    /// Asked to be delivered again.
    pub retry: bool,
    pub quarantined_at: DateTime<Utc>,
}

/// What the workers of one consumer share.
pub(crate) struct ConsumerState {
    pub(crate) options: ConsumerOptions,
    pub(crate) handler: Handler,
    pub(crate) delivered: AtomicU64,
    pub(crate) quarantined: AtomicU64,
    /// Per cluster: pending cells and held buckets.
    pub(crate) held: Mutex<std::collections::HashMap<usize, (i64, usize)>>,
    pub(crate) stopped: Mutex<Option<String>>,
    pub(crate) stop: tokio::sync::watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl ConsumerState {
    /// Stops the consumer for `reason` (its workers end their rounds).
    pub(crate) fn halt(&self, reason: String) {
        tracing::error!(consumer = %self.options.name, datastore = %self.options.datastore, %reason, "trigger consumer stopped");
        self.stopped.lock().expect("stopped").get_or_insert(reason);
        let _ = self.stop.send(true);
    }

    pub(crate) fn status(&self) -> ConsumerStatus {
        let held = self.held.lock().expect("held");
        ConsumerStatus {
            name: self.options.name.clone(),
            datastore: self.options.datastore.clone(),
            columns: self.options.columns.clone(),
            delivered: self.delivered.load(Ordering::Relaxed),
            quarantined: self.quarantined.load(Ordering::Relaxed),
            pending_cells: held.values().map(|(p, _)| p).sum(),
            held_buckets: held.values().map(|(_, b)| b).sum(),
            quarantine_limit: self.options.quarantine_limit,
            stopped: self.stopped.lock().expect("stopped").clone(),
        }
    }

    /// Whether every worker has ended.
    pub(crate) fn is_finished(&self) -> bool {
        self.tasks
            .lock()
            .expect("tasks")
            .iter()
            .all(|t| t.is_finished())
    }

    /// Stops the workers and waits (at most `grace`) until they gave up
    /// their leases.
    pub(crate) async fn join(&self, grace: Duration) {
        let _ = self.stop.send(true);
        let tasks: Vec<JoinHandle<()>> = std::mem::take(&mut *self.tasks.lock().expect("tasks"));
        let _ = tokio::time::timeout(grace, futures::future::join_all(tasks)).await;
    }
}

/// A running consumer. Dropping it leaves it running until the store
/// shuts down or is dropped, when it ends after the batch in flight;
/// [`Consumer::stop`] stops it.
pub struct Consumer {
    state: Arc<ConsumerState>,
}

impl Consumer {
    pub fn status(&self) -> ConsumerStatus {
        self.state.status()
    }

    /// Stops delivering and gives up this gateway's shards (others take
    /// them over at once).
    pub async fn stop(self) {
        self.state.join(Duration::from_secs(10)).await;
    }
}

/// Validates `options` and starts one worker per cluster holding shards
/// of the datastore.
pub(crate) fn start(
    topology: &Arc<Topology>,
    holder: &str,
    options: ConsumerOptions,
    handler: Handler,
    shutdown: tokio::sync::watch::Receiver<bool>,
) -> Result<(Consumer, Arc<ConsumerState>)> {
    let ds = topology.datastore(&options.datastore)?;
    let valid_name = !options.name.is_empty()
        && options.name.len() <= 64
        && options
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if !valid_name {
        return Err(Error::BadInput(format!(
            "consumer name `{}`: 1 to 64 letters, digits, `_` or `-`",
            options.name
        )));
    }
    for column in &options.columns {
        ds.check_column(column)?;
    }
    if options.batch_size == 0 || options.max_attempts == 0 {
        return Err(Error::BadInput(
            "a consumer's batch_size and max_attempts are at least 1".into(),
        ));
    }
    let (stop, _) = tokio::sync::watch::channel(false);
    let state = Arc::new(ConsumerState {
        options,
        handler,
        delivered: AtomicU64::new(0),
        quarantined: AtomicU64::new(0),
        held: Mutex::new(std::collections::HashMap::new()),
        stopped: Mutex::new(None),
        stop,
        tasks: Mutex::new(Vec::new()),
    });
    // A worker per cluster, shards or not: a shard move hands a cluster
    // shards it did not have (the worker realigns on the work map).
    let mut tasks = Vec::new();
    for cluster in 0..topology.clusters.len() {
        let worker = worker::Worker::new(topology, &ds, cluster, holder, state.clone());
        tasks.push(tokio::spawn(worker.run(shutdown.clone())));
    }
    *state.tasks.lock().expect("tasks") = tasks;
    // The store's shutdown, or the store dropped without one (a gateway
    // that dies), stops the consumer as [`Consumer::stop`] does: its
    // workers look at `stop` between batches, where a round with more
    // cells to deliver would not look at the store.
    let (mut store_stopped, mut consumer_stopped) = (shutdown, state.stop.subscribe());
    let stopping = state.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = store_stopped.changed() => {
                let _ = stopping.stop.send(true);
            }
            _ = consumer_stopped.changed() => {}
        }
    });
    Ok((
        Consumer {
            state: state.clone(),
        },
        state,
    ))
}
