//! What writers announce: the shards whose log advanced on a cluster, to
//! index maintenance through a channel and to trigger consumers and log
//! tails through a broadcast.

use std::sync::Arc;

use tokio::sync::mpsc;
use uuid::Uuid;

use super::outbox::Outbox;

/// Cells committed on one cluster: what the maintainer needs to know.
#[derive(Debug, Clone, Default)]
pub(crate) struct Written {
    pub(crate) datastore: String,
    pub(crate) cluster: usize,
    /// Each touched shard with its new last `added_id`.
    pub(crate) heads: Vec<(u32, i64)>,
    /// The cluster's master was replaced by a server whose log of these
    /// shards may end before what was read from the old one (a promoted
    /// replica): `heads` are then floors, at or below the new master's
    /// heads, from where followers of the log read again. Cells the new
    /// master numbers anew above a floor are not skipped; cells between a
    /// floor and the old position come again (followers deliver at least
    /// once).
    pub(crate) went_back: bool,
    /// The cells this process wrote, with the bodies it wrote them from
    /// (cut to the members the indexes read);
    /// empty for cells learnt of otherwise (other gateways, replays). Index
    /// maintenance computes their entries from these instead of decoding
    /// what it reads back (`indexes/recent.rs`).
    pub(crate) cells: Arc<[WrittenCell]>,
}

/// A cell a write of this process committed, with the members of its body
/// that index maintenance reads.
#[derive(Debug, Clone)]
pub(crate) struct WrittenCell {
    pub(crate) shard: u32,
    pub(crate) row_key: Uuid,
    pub(crate) column: String,
    pub(crate) ref_key: i64,
    /// The body cut to `members` (those of them it has).
    pub(crate) body: Arc<serde_json::Value>,
    /// The top-level members the body was cut to: those the datastore's
    /// indexes read when it was written.
    pub(crate) members: Arc<std::collections::BTreeSet<String>>,
}

/// The write notifications of a store: to index maintenance through a
/// channel, and to trigger consumers through a broadcast (a consumer that
/// falls behind it learns so and sweeps instead). Sending never blocks and
/// never fails a write: with no subscriber, events are dropped.
pub(crate) struct Events {
    sender: mpsc::UnboundedSender<Written>,
    broadcast: tokio::sync::broadcast::Sender<Arc<Written>>,
    /// The name this store gives itself in the notifications its writes
    /// send other gateways (`wake.rs`), so that it skips its own, and the
    /// outbox they are sent from; `None` when it sends none
    /// (`storage.notify: false`).
    notify: Option<(String, Arc<Outbox>)>,
}

/// Write events a broadcast holds for slow receivers.
const BROADCAST_EVENTS: usize = 4096;

impl Events {
    /// Events of a store; `notify`: whether its writes notify other
    /// gateways.
    pub(crate) fn new(notify: bool) -> (Events, mpsc::UnboundedReceiver<Written>) {
        let (sender, receiver) = mpsc::unbounded_channel();
        let (broadcast, _) = tokio::sync::broadcast::channel(BROADCAST_EVENTS);
        let notify = notify.then(|| {
            let origin = format!("{:016x}", rand::random::<u64>());
            (origin, Arc::default())
        });
        (
            Events {
                sender,
                broadcast,
                notify,
            },
            receiver,
        )
    }

    pub(crate) fn written(&self, event: Written) {
        if self.broadcast.receiver_count() > 0 {
            let _ = self.broadcast.send(Arc::new(event.clone()));
        }
        // The receiver is gone only when maintenance is off or stopping.
        let _ = self.sender.send(event);
    }

    /// Announces cells this process committed: to its own consumers, and,
    /// when `notify` (the cluster's database can), to the other gateways,
    /// whose notification is sent after this returns (`wake.rs`).
    pub(crate) fn committed(&self, event: Written, notify: bool) {
        if let Some((_, outbox)) = self.notify.as_ref().filter(|_| notify) {
            outbox.post(event.cluster, &event.datastore, &event.heads);
        }
        self.written(event);
    }

    /// What this store's write notifications name it, and where they wait
    /// to be sent; `None` when it sends none.
    pub(crate) fn outbox(&self) -> Option<(&str, &Arc<Outbox>)> {
        let (origin, outbox) = self.notify.as_ref()?;
        Some((origin, outbox))
    }

    /// The write events from now on.
    pub(crate) fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Arc<Written>> {
        self.broadcast.subscribe()
    }
}
