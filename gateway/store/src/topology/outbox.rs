//! What this store's writes committed and the other gateways have not
//! been told of yet; `wake.rs` sends it.

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Heads committed by this store that other gateways have not been told
/// of yet: per cluster and datastore, the highest head of each shard.
#[derive(Default)]
pub(crate) struct Outbox {
    pending: Mutex<BTreeMap<(usize, String), BTreeMap<u32, i64>>>,
    posted: tokio::sync::Notify,
}

impl Outbox {
    /// Posts the new `heads` of `datastore` on `cluster`, committed.
    pub(crate) fn post(&self, cluster: usize, datastore: &str, heads: &[(u32, i64)]) {
        if heads.is_empty() {
            return;
        }
        {
            let mut pending = self.pending.lock().expect("outbox");
            let shards = pending.entry((cluster, datastore.to_string())).or_default();
            for &(shard, head) in heads {
                let known = shards.entry(shard).or_insert(head);
                *known = (*known).max(head);
            }
        }
        // Stores a permit when the sender is busy: nothing posted is left
        // waiting for a later post.
        self.posted.notify_one();
    }

    /// Resolves once something was posted since the last call (at once
    /// if it was while nobody waited).
    pub(crate) fn posted(&self) -> tokio::sync::futures::Notified<'_> {
        self.posted.notified()
    }

    /// Everything posted since the last call.
    pub(crate) fn take(&self) -> BTreeMap<(usize, String), BTreeMap<u32, i64>> {
        std::mem::take(&mut *self.pending.lock().expect("outbox"))
    }
}

#[cfg(test)]
mod tests {
    use super::Outbox;

    #[test]
    fn the_outbox_keeps_the_highest_head_of_each_shard_until_taken() {
        let outbox = Outbox::default();
        outbox.post(0, "trips", &[(7, 10), (9, 3)]);
        outbox.post(0, "trips", &[(7, 8), (9, 5), (11, 1)]);
        outbox.post(1, "trips", &[(7, 2)]);
        outbox.post(0, "items", &[]);
        let taken = outbox.take();
        assert_eq!(taken.len(), 2, "{taken:?}");
        let trips: Vec<(u32, i64)> = taken[&(0, "trips".to_string())]
            .iter()
            .map(|(s, h)| (*s, *h))
            .collect();
        assert_eq!(trips, vec![(7, 10), (9, 5), (11, 1)]);
        assert_eq!(taken[&(1, "trips".to_string())].len(), 1);
        assert!(outbox.take().is_empty());
    }
}
