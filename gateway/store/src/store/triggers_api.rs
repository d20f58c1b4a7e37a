//! The store's trigger API: consumers, followers of the log, their lag
//! and quarantine (`triggers/`).

use super::*;

impl Store {
    /// Buffered writes of `datastore` that lost to another body of their
    /// key when they were replayed, newest first, at most `limit`.
    /// Starts a trigger consumer (see [`crate::triggers`]): from now on
    /// this gateway delivers its fair share of the datastore's shards to
    /// `handler`, until [`triggers::Consumer::stop`] or the store's
    /// shutdown.
    pub fn start_consumer(
        &self,
        options: triggers::ConsumerOptions,
        handler: triggers::Handler,
    ) -> Result<triggers::Consumer> {
        let mut consumers = self.inner.consumers.lock().expect("consumers");
        consumers.retain(|c| !c.is_finished());
        if consumers.iter().any(|c| {
            c.options.name == options.name
                && c.options.datastore == options.datastore
                && !c.is_finished()
        }) {
            return Err(Error::BadInput(format!(
                "consumer `{}` of `{}` already runs in this gateway",
                options.name, options.datastore
            )));
        }
        let (consumer, state) = triggers::start(
            &self.inner.topology,
            &self.inner.maintainer.holder,
            options,
            handler,
            self.inner.shutdown.subscribe(),
        )?;
        consumers.push(state);
        Ok(consumer)
    }

    /// A follower of `datastore`'s log (see [`triggers::tail`]): the cells
    /// of its columns and shards after its positions, or from now, read
    /// once per commit for all followers of the datastore.
    pub fn follow(
        &self,
        datastore: &str,
        options: triggers::tail::FollowOptions,
    ) -> Result<triggers::tail::Follower> {
        self.inner.tails.follow(datastore, options)
    }

    /// Log reads and followers of the shared tails.
    pub fn tail_metrics(&self) -> triggers::tail::TailMetrics {
        self.inner.tails.metrics()
    }

    /// The status of every trigger consumer running in this gateway.
    pub fn consumers(&self) -> Vec<triggers::ConsumerStatus> {
        self.inner
            .consumers
            .lock()
            .expect("consumers")
            .iter()
            .map(|c| c.status())
            .collect()
    }

    /// How far consumer `name` of `datastore` is behind the log, per
    /// cluster holding its shards: each shard's head in `<ds>_shards`
    /// against the consumer's stored offset (none counts as 0, where a
    /// consumer starting at the beginning would start), one statement per
    /// cluster. Like the index lag it is measured, so every gateway reports
    /// the same figures, whichever holds the shards.
    pub async fn trigger_lag(
        &self,
        datastore: &str,
        name: &str,
    ) -> Result<Vec<triggers::ConsumerLag>> {
        let topology = self.topology_ref();
        let ds = topology.datastore(datastore)?;
        let consumer = [crate::indexes::apply::Consumer {
            index: 0,
            target: 0,
            name: triggers::offsets_key(name),
        }];
        let mut out = Vec::new();
        for cluster in ds.map().clusters() {
            let backend = topology.clusters[cluster].master()?;
            let mut shards: Vec<ShardLag> = lag::behind(backend.as_ref(), &ds, &consumer)
                .await?
                .into_iter()
                .filter(|b| b.shard < ds.map().shards() && ds.map().cluster_of(b.shard) == cluster)
                .map(|b| ShardLag {
                    shard: b.shard,
                    pending_cells: b.head - b.offset,
                })
                .collect();
            shards.sort_by_key(|l| l.shard);
            out.push(triggers::ConsumerLag {
                cluster: topology.clusters[cluster].name.clone(),
                pending_cells: shards.iter().map(|l| l.pending_cells).sum(),
                shards,
            });
        }
        Ok(out)
    }

    /// The cells consumer `name` of `datastore` quarantined, on every
    /// cluster, in shard and `added_id` order.
    pub async fn trigger_quarantine(
        &self,
        datastore: &str,
        name: &str,
    ) -> Result<Vec<triggers::QuarantinedCell>> {
        triggers::list_quarantine(self.topology_ref(), datastore, name).await
    }

    /// Asks for every quarantined cell of consumer `name` to be delivered
    /// again by the gateway holding its shard (at its next sweep); a cell
    /// its handler takes leaves the quarantine. Returns how many were asked.
    pub async fn retry_trigger_quarantine(&self, datastore: &str, name: &str) -> Result<u64> {
        triggers::retry_quarantine(self.topology_ref(), datastore, name).await
    }

    /// Moves every offset of consumer `name` of `datastore` to `to`: the
    /// cells after an `added_id`, or from a time on, are delivered again
    /// (running workers take the new offsets at their next write or sweep).
    /// Returns the shards moved.
    pub async fn rewind_consumer(&self, datastore: &str, name: &str, to: Location) -> Result<u64> {
        triggers::rewind(self.topology_ref(), datastore, name, to).await
    }
}
