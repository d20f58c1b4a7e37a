//! The store's index API: queries, status, lag, maintenance, the
//! quarantine, verify and repair runs (`indexes/`).

use super::*;

impl Store {
    /// The indexes of `datastore` with their table versions and state.
    pub fn indexes(&self, datastore: &str) -> Result<Vec<IndexStatus>> {
        let ds = self.topology_ref().datastore(datastore)?;
        Ok(ds.indexes.iter().map(|i| IndexStatus::of(i)).collect())
    }

    /// [`indexes`](Self::indexes), measured now: the log heads and
    /// offsets of `datastore` are read (one statement each per cluster)
    /// and building indexes that caught up are marked ready. For a store
    /// opened without maintenance; successive calls give the build rate.
    pub async fn measure_indexes(&self, datastore: &str) -> Result<Vec<IndexStatus>> {
        let topology = self.topology_ref();
        let ds = topology.datastore(datastore)?;
        maintainer::measure_datastore(topology, &self.inner.maintainer, &ds).await?;
        self.indexes(datastore)
    }

    /// Answers an index query.
    pub async fn query_index(&self, datastore: &str, query: &IndexQuery) -> Result<IndexPage> {
        self.query_index_with(datastore, query, &ReadOptions::default())
            .await
    }

    /// How [`Store::query_index`] answers `query` now: the index version
    /// and shards it reads, the b-tree whose range it reads, the conditions
    /// that bound it and those checked on each entry (residual), how the
    /// order comes about, and each cluster's statement with the database's
    /// plan of it (`EXPLAIN`).
    pub async fn explain_index_query(
        &self,
        datastore: &str,
        query: &IndexQuery,
    ) -> Result<crate::indexes::IndexExplain> {
        crate::indexes::explain(self.topology_ref(), datastore, query).await
    }

    /// [`Store::query_index`], served as `read` allows: a replica with
    /// [`Consistency::Replica`](crate::replicas::Consistency::Replica);
    /// a read token alone does not send index reads to a replica, since
    /// index entries follow their cells after the commit.
    pub async fn query_index_with(
        &self,
        datastore: &str,
        query: &IndexQuery,
        read: &ReadOptions,
    ) -> Result<IndexPage> {
        query::query_index(self.topology_ref(), datastore, query, read).await
    }

    /// Answers an index query together with the latest cells of `columns`
    /// for the rows of its page, bodies as JSON text, in one statement,
    /// when one cluster holds every shard of the datastore. `None` when the
    /// cells are spread over clusters: then [`Store::query_index`] and
    /// [`Store::get_cells_latest_json`] answer it.
    pub async fn query_index_with_cells_json(
        &self,
        datastore: &str,
        query: &IndexQuery,
        columns: &[&str],
        read: &ReadOptions,
    ) -> Result<Option<(IndexPage, Vec<Cell<Vec<u8>>>)>> {
        let topology = self.topology_ref();
        let plan = query::plan(&*topology.datastore(datastore)?, query)?;
        query::run_plan_with_cells(topology, &self.inner.cell_cache, &plan, columns, read).await
    }

    /// Runs a plan built by [`QueryPlan::build`].
    pub async fn run_plan(&self, plan: &QueryPlan) -> Result<IndexPage> {
        query::run_plan(self.topology_ref(), plan, &ReadOptions::default()).await
    }

    /// The table an index query reads (its current version), for tools
    /// that inspect the SQL of a plan.
    pub fn index_table(&self, datastore: &str, index: &str) -> Result<String> {
        let ds = self.topology_ref().datastore(datastore)?;
        Ok(ds.index(index)?.table.clone())
    }

    /// Returns when every index has applied the cell log as it was at the
    /// call, on every cluster. With maintenance running, the workers (of
    /// this and other gateways) do the work and this waits for them;
    /// without, the work is done here.
    pub async fn sync_indexes(&self) -> Result<()> {
        let topology = self.topology_ref();
        if !self.inner.maintaining {
            for ds in topology.datastores_sorted() {
                if ds.indexes.is_empty() {
                    continue;
                }
                for cluster in ds.map().clusters() {
                    maintainer::apply_all(
                        topology,
                        &ds,
                        cluster,
                        self.inner.maintainer.options.quarantine_after,
                    )
                    .await?;
                }
            }
            maintainer::check_ready(topology, &self.inner.maintainer).await;
            return Ok(());
        }
        let mut targets: BTreeMap<(String, usize), HashMap<u32, i64>> = BTreeMap::new();
        for ds in topology.datastores_sorted() {
            if ds.indexes.is_empty() {
                continue;
            }
            for cluster in ds.map().clusters() {
                let backend = topology.clusters[cluster].master()?;
                let heads = cells::heads(backend.as_ref(), &ds).await?;
                targets.insert(
                    (ds.name().to_string(), cluster),
                    heads.into_iter().collect(),
                );
            }
        }
        loop {
            self.inner.maintainer.sweep_all().await;
            let mut done = true;
            for ((name, cluster), heads) in &targets {
                let ds = topology.datastore(name)?;
                let backend = topology.clusters[*cluster].master()?;
                let consumers = crate::indexes::apply::consumers(topology, &ds);
                let behind = lag::behind(backend.as_ref(), &ds, &consumers).await?;
                if behind
                    .iter()
                    .any(|b| heads.get(&b.shard).is_some_and(|h| b.offset < *h))
                {
                    done = false;
                    break;
                }
            }
            if done {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How far each shard's indexes are behind its log, measured now from
    /// the log heads and stored offsets of every cluster.
    pub async fn index_lag(&self, datastore: &str) -> Result<Vec<ShardLag>> {
        let topology = self.topology_ref();
        let ds = topology.datastore(datastore)?;
        let mut lags = Vec::new();
        for (_, measured) in maintainer::measure(topology, &ds).await? {
            lags.extend(
                measured
                    .shards
                    .into_iter()
                    .map(|(shard, pending_cells)| ShardLag {
                        shard,
                        pending_cells,
                    }),
            );
        }
        lags.sort_by_key(|l| l.shard);
        Ok(lags)
    }

    /// Delay between a cell's commit and its index update, as
    /// `(p50, p99, samples)` in microseconds since the last call.
    pub fn take_index_delays(&self) -> (u64, u64, u64) {
        self.inner.maintainer.take_delays()
    }

    /// The index entries of `datastore` set aside in the quarantine.
    pub async fn quarantine(&self, datastore: &str) -> Result<Vec<QuarantinedEntry>> {
        let ds = self.topology_ref().datastore(datastore)?;
        crate::indexes::quarantine::list(self.topology_ref(), &ds).await
    }

    /// Retries the quarantined entries of `datastore` (of one index, or
    /// all); returns `(applied, still quarantined)`.
    pub async fn retry_quarantine(
        &self,
        datastore: &str,
        index: Option<&str>,
    ) -> Result<(usize, usize)> {
        let ds = self.topology_ref().datastore(datastore)?;
        crate::indexes::quarantine::retry(self.topology_ref(), &ds, index).await
    }

    /// Compares the indexes of `datastore` with the entries their rows'
    /// latest cells give, both ways, and with `options.repair` fixes the
    /// drift found through the maintainer's guarded writes (safe while
    /// gateways run). `on_progress` is called after every chunk of shards,
    /// `on_drift` for every mismatching entry. A full run resumes where an
    /// unfinished run of the same scope stopped. With `options.nice` (the
    /// default) the run works on a thread of its own, at that priority,
    /// with connections of its own; the callbacks are called on this task.
    pub async fn verify_indexes(
        &self,
        datastore: &str,
        options: &crate::indexes::VerifyOptions,
        on_progress: &mut (dyn FnMut(&crate::indexes::VerifyProgress) + Send),
        on_drift: &mut (dyn FnMut(&crate::indexes::Drift) + Send),
    ) -> Result<crate::indexes::VerifyReport> {
        let ds = self.topology_ref().datastore(datastore)?;
        crate::indexes::verify::run(
            &self.inner.topology,
            &self.inner.storage,
            ds,
            options,
            on_progress,
            on_drift,
        )
        .await
    }

    /// Starts a verify (and repair) of `datastore` in the background;
    /// [`Store::verify_status`] follows it. Refused while one runs.
    pub fn start_verify(
        &self,
        datastore: &str,
        options: crate::indexes::VerifyOptions,
    ) -> Result<crate::indexes::VerifyStatus> {
        start_verify(&self.inner, datastore, options, false)
    }

    /// The verify run of `datastore` started in this process (running or
    /// the latest), if any.
    pub fn verify_status(&self, datastore: &str) -> Option<crate::indexes::VerifyStatus> {
        self.inner.verifier.status(datastore)
    }

    /// The recorded state of the latest full verify of `datastore`.
    pub async fn last_verify(
        &self,
        datastore: &str,
    ) -> Result<Option<crate::indexes::VerifyCheckpoint>> {
        let ds = self.topology_ref().datastore(datastore)?;
        crate::indexes::verify::last_run(self.topology_ref(), &ds).await
    }

    /// Drops the table of an index that is no longer defined (or of an
    /// older `version` of a defined one) on every cluster, with its
    /// progress; returns what was dropped as `cluster: table`. Refused for
    /// the current version, for a previous version that serves while a new
    /// one is built, and for one replaced less than a minute ago
    /// (the grace a gateway needs to switch).
    pub async fn drop_index(
        &self,
        datastore: &str,
        index: &str,
        version: Option<u32>,
    ) -> Result<Vec<String>> {
        self.drop_index_with(datastore, index, version, true).await
    }

    /// [`Store::drop_index`]; with `grace` false, a version replaced less
    /// than a minute ago is dropped too (when every gateway
    /// is known to have switched).
    pub async fn drop_index_with(
        &self,
        datastore: &str,
        index: &str,
        version: Option<u32>,
        grace: bool,
    ) -> Result<Vec<String>> {
        catalog::drop_index(self.topology_ref(), datastore, index, version, grace).await
    }
}

/// Retires previous index versions once their new version is ready
/// (`reload::retire`), checking twice a second; ends with the store.
pub(super) async fn retire_previous_versions(inner: std::sync::Weak<Inner>, grace: Duration) {
    let mut ready_since = std::collections::HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if *inner.shutdown.borrow() {
            return;
        }
        let serving = inner
            .topology
            .datastores_sorted()
            .iter()
            .any(|ds| ds.indexes.iter().any(|i| i.serves_until().is_some()));
        if !serving {
            ready_since.clear();
            continue;
        }
        let _one = inner.reloading.lock().await;
        crate::reload::retire(&inner.topology, &inner.maintainer, grace, &mut ready_since).await;
    }
}

/// Starts a verify run of `datastore` on a task of its own.
pub(super) fn start_verify(
    inner: &Arc<Inner>,
    datastore: &str,
    options: crate::indexes::VerifyOptions,
    scheduled: bool,
) -> Result<crate::indexes::VerifyStatus> {
    let ds = inner.topology.datastore(datastore)?;
    if let Some(index) = options.indexes.iter().find(|i| ds.index(i).is_err()) {
        return Err(Error::UnknownIndex {
            datastore: datastore.to_string(),
            index: index.clone(),
        });
    }
    let verifier = inner.verifier.clone();
    if !verifier.begin(datastore, &options, scheduled) {
        return Err(Error::BadInput(format!(
            "a verify of `{datastore}` is already running in this gateway"
        )));
    }
    let status = verifier.status(datastore).expect("just begun");
    let store = Store {
        inner: inner.clone(),
    };
    let name = datastore.to_string();
    let mut stopped = inner.shutdown.subscribe();
    tokio::spawn(async move {
        let mut on_progress = |p: &crate::indexes::VerifyProgress| verifier.progress(&name, p);
        let mut on_drift = |d: &crate::indexes::Drift| verifier.drift(&name, d);
        let run = store.verify_indexes(&name, &options, &mut on_progress, &mut on_drift);
        let outcome = tokio::select! {
            outcome = run => outcome,
            _ = stopped.wait_for(|s| *s) => Err(Error::Internal("the gateway stopped".into())),
        };
        verifier.finish(&name, &outcome);
        if let Ok(report) = &outcome {
            tracing::info!(
                datastore = %name,
                scheduled,
                shards = report.progress.shards_done,
                rows = report.progress.rows,
                drift = report.progress.drift(),
                repaired = report.progress.repaired,
                "index verify done"
            );
        }
    });
    Ok(status)
}

/// Every `every`, a sampled verify of each datastore with indexes.
pub(super) async fn scheduled_verifies(
    inner: std::sync::Weak<Inner>,
    every: Duration,
    sample: u32,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if *inner.shutdown.borrow() {
            return;
        }
        for ds in inner.topology.datastores_sorted() {
            // Current versions only: a previous one serving meanwhile
            // shares its index's name.
            let ready = |i: &&Arc<crate::topology::IndexRuntime>| {
                i.is_ready() && i.serves_until().is_none()
            };
            if !ds.indexes.iter().any(|i| ready(&i)) {
                continue;
            }
            let options = crate::indexes::VerifyOptions {
                indexes: ds
                    .indexes
                    .iter()
                    .filter(ready)
                    .map(|i| i.def.name.clone())
                    .collect(),
                sample: Some(sample.max(1)),
                ..crate::indexes::VerifyOptions::default()
            };
            if let Err(err) = start_verify(&inner, ds.name(), options, true) {
                tracing::debug!(datastore = %ds.name(), error = %err, "no scheduled verify");
            }
        }
    }
}
