//! `GET /metrics`: Prometheus metrics in the OpenMetrics text format.
//!
//! The gateway's own metrics (requests by operation and outcome, request
//! latency) are kept in `prometheus-client` metrics; the store's counters,
//! index lag and topology (and the trigger consumers' figures, from
//! [`Store::consumers`]) are read from [`Store::metrics`] at each scrape by a
//! collector, so there is one source of truth for them. `prometheus-client`
//! rather than a hand-written encoder: histograms, label escaping and the
//! `_total` suffixes are easy to get subtly wrong, and the crate is the
//! Prometheus project's own.
//!
//! Operation names come from clients, so the label set is bounded: a name
//! must look like a GraphQL name of at most 64 characters, and gets its own
//! series only if it is listed in `metrics.operations` or is among the first
//! `metrics.max_operations` other distinct names; every other request is
//! counted as `other`. A series, once created, is never dropped (a counter
//! that vanishes and comes back reads as a reset), so the unlisted slots go
//! first come, first served rather than to the currently busiest names;
//! listing the operations that matter keeps their series whatever clients
//! send.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use poem::web::Data;
use poem::{handler, IntoResponse, Response};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

mod figures;

use super::Gateway;
use crate::config::MetricsConfig;
use cellgate_store::storage::breaker::BreakerState;
use cellgate_store::Store;

/// What became of a GraphQL request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Executed without errors.
    Ok,
    /// Executed, with errors in the response.
    Error,
    /// Not executed: bad HTTP input, a parse or a validation failure.
    Invalid,
    /// Refused by the per-client rate limit.
    RateLimited,
    /// Refused by the concurrency limit.
    Overloaded,
    /// Refused for want of a valid token (401) or of a scope (403).
    Denied,
    /// Cancelled at the request deadline.
    TimedOut,
    /// Answered `304 Not Modified`: the client's copy is current.
    NotModified,
}

impl Outcome {
    /// The outcome of a request the pipeline refused.
    pub fn refused(kind: cellgate_graphql::RefusalKind) -> Outcome {
        use cellgate_graphql::RefusalKind;
        match kind {
            RefusalKind::BadRequest | RefusalKind::Invalid | RefusalKind::NotAllowedHere => {
                Outcome::Invalid
            }
            RefusalKind::Unauthenticated | RefusalKind::Forbidden => Outcome::Denied,
            RefusalKind::TimedOut => Outcome::TimedOut,
            _ => Outcome::Error,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Invalid => "invalid",
            Outcome::RateLimited => "rate_limited",
            Outcome::Overloaded => "overloaded",
            Outcome::Denied => "denied",
            Outcome::TimedOut => "timeout",
            Outcome::NotModified => "not_modified",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    operation: String,
    outcome: &'static str,
}

/// The gateway's metrics registry.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Histogram,
    /// Names from `metrics.operations`.
    listed: HashSet<String>,
    /// Unlisted names given a series so far, at most `max_unlisted`.
    unlisted: Mutex<HashSet<String>>,
    max_unlisted: usize,
}

impl Metrics {
    /// Metrics of a gateway in front of `store`.
    pub fn new(
        store: Store,
        documents: Arc<cellgate_graphql::Documents>,
        persisted: Arc<cellgate_graphql::Persisted>,
        definitions: cellgate_graphql::DefinitionsStatus,
        config: &MetricsConfig,
    ) -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "cellgate_graphql_requests",
            "GraphQL requests by operation name and outcome",
            requests.clone(),
        );
        // 0.5 ms to about 16 s.
        let latency = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register(
            "cellgate_graphql_request_duration_seconds",
            "Time from receiving a GraphQL request to its response",
            latency.clone(),
        );
        registry.register_collector(Box::new(StoreCollector(store)));
        registry.register_collector(Box::new(DocumentCollector(documents)));
        registry.register_collector(Box::new(PersistedCollector(persisted)));
        registry.register_collector(Box::new(TelemetryCollector));
        registry.register_collector(Box::new(DefinitionsCollector(definitions)));
        Metrics {
            registry,
            requests,
            latency,
            listed: config.operations.iter().cloned().collect(),
            unlisted: Mutex::new(HashSet::new()),
            max_unlisted: config.max_operations,
        }
    }

    /// Counts one GraphQL request.
    pub fn record(&self, operation: Option<&str>, outcome: Outcome, elapsed: Duration) {
        let operation = self.operation_label(operation);
        self.requests
            .get_or_create(&RequestLabels {
                operation,
                outcome: outcome.as_str(),
            })
            .inc();
        self.latency.observe(elapsed.as_secs_f64());
    }

    fn operation_label(&self, operation: Option<&str>) -> String {
        let Some(name) = operation.filter(|n| !n.is_empty()) else {
            return "anonymous".to_string();
        };
        let graphql_name = name.len() <= 64
            && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !graphql_name {
            return "other".to_string();
        }
        if self.listed.contains(name) {
            return name.to_string();
        }
        let mut unlisted = self.unlisted.lock().unwrap_or_else(|e| e.into_inner());
        if unlisted.contains(name) {
            return name.to_string();
        }
        if unlisted.len() < self.max_unlisted {
            unlisted.insert(name.to_string());
            return name.to_string();
        }
        "other".to_string()
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)
            .expect("writing to a String cannot fail");
        text
    }
}

/// `GET /metrics`. With auth on and `auth.protect_metrics`, it needs a
/// token with a `*` scope, since the metrics name every datastore.
#[handler]
pub(super) async fn metrics(
    request: &poem::Request,
    Data(gateway): Data<&Arc<Gateway>>,
) -> Response {
    if gateway.protect_metrics {
        let refused = gateway
            .refuse_plain(request, "/metrics", cellgate_graphql::auth::Access::Read)
            .await;
        if let Some(response) = refused {
            return response;
        }
    }
    gateway
        .metrics
        .encode()
        .with_content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .into_response()
}

/// Reads the store's counters at each scrape.
/// The hits and misses of the parsed-document cache.
struct DocumentCollector(Arc<cellgate_graphql::Documents>);

impl std::fmt::Debug for DocumentCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DocumentCollector")
    }
}

/// Spans of failed trace exports.
#[derive(Debug)]
struct TelemetryCollector;

impl Collector for TelemetryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = encoder.encode_descriptor(
            "cellgate_telemetry_spans_dropped",
            "Trace spans lost because their export to the OTLP collector failed",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        ConstCounter::new(crate::telemetry::dropped_spans()).encode(family)?;
        Ok(())
    }
}

/// What persisted documents hold and served.
struct PersistedCollector(Arc<cellgate_graphql::Persisted>);

impl std::fmt::Debug for PersistedCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PersistedCollector")
    }
}

impl Collector for PersistedCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.0.counts();
        let mut family = encoder.encode_descriptor(
            "cellgate_persisted_documents",
            "Persisted documents held: in the manifest, and registered as automatic persisted queries",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (kind, n) in [
            ("manifest", counts.manifest_documents),
            ("apq", counts.apq_documents),
        ] {
            ConstGauge::new(n as i64).encode(family.encode_family(&[("kind", kind)])?)?;
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_persisted_requests",
            "Requests naming a persisted document: by documentId, automatic persisted queries found, not found and registered, and free documents refused in trusted-documents mode",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (kind, n) in [
            ("by_id", counts.by_id),
            ("apq_hit", counts.apq_hits),
            ("apq_miss", counts.apq_misses),
            ("apq_registered", counts.apq_registered),
            ("refused", counts.refused),
        ] {
            ConstCounter::new(n).encode(family.encode_family(&[("kind", kind)])?)?;
        }
        Ok(())
    }
}

/// The reloads of the definitions (`reload.rs`).
#[derive(Debug)]
struct DefinitionsCollector(cellgate_graphql::DefinitionsStatus);

impl Collector for DefinitionsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let state = self.0.get();
        let mut family = encoder.encode_descriptor(
            "cellgate_definitions_reloads",
            "Reloads of the definitions by result: applied, unchanged, invalid (they do not \
             load), refused (the running store cannot apply them)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (result, count) in cellgate_graphql::ReloadResult::ALL
            .iter()
            .zip(state.reloads)
        {
            ConstCounter::new(count)
                .encode(family.encode_family(&[("result", result.as_str())])?)?;
        }
        let family = encoder.encode_descriptor(
            "cellgate_definitions_latest",
            "1 when the definitions served are the latest on disk, 0 after a failed reload",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        ConstGauge::new(i64::from(state.latest)).encode(family)?;
        Ok(())
    }
}

impl Collector for DocumentCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (hits, misses) = self.0.counts();
        let mut family = encoder.encode_descriptor(
            "cellgate_graphql_documents",
            "GraphQL documents taken from the parse cache (hit) or parsed (miss)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        ConstCounter::new(hits).encode(family.encode_family(&[("cache", "hit")])?)?;
        ConstCounter::new(misses).encode(family.encode_family(&[("cache", "miss")])?)?;
        let family = encoder.encode_descriptor(
            "cellgate_graphql_direct_requests",
            "GraphQL requests answered without async-graphql's executor, by a document's compiled form (an index read or a PutCells write)",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        ConstCounter::new(self.0.direct_count()).encode(family)?;
        Ok(())
    }
}

struct StoreCollector(Store);

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreCollector")
    }
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snapshot = self.0.metrics();

        let mut family = encoder.encode_descriptor(
            "cellgate_cells_written",
            "Cells stored by this process, per datastore",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ds in &snapshot.datastores {
            let labels = [("datastore", ds.name.as_str())];
            ConstCounter::new(ds.cells_written).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_cells_duplicate",
            "Cell writes answered as duplicates of stored cells, per datastore",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ds in &snapshot.datastores {
            let labels = [("datastore", ds.name.as_str())];
            ConstCounter::new(ds.cells_duplicate).encode(family.encode_family(&labels)?)?;
        }

        let mut family = encoder.encode_descriptor(
            "cellgate_buffer_replayed_cells",
            "Buffered cells this process delivered to their primary (written there; on a cluster without replicas also those found there), per datastore",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ds in &snapshot.datastores {
            let labels = [("datastore", ds.name.as_str())];
            ConstCounter::new(ds.cells_replayed).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_buffer_conflicts",
            "Buffered writes this process recorded as conflicts on replay (another body of their key was stored; list them with `cellgate buffer conflicts`), per datastore",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ds in &snapshot.datastores {
            let labels = [("datastore", ds.name.as_str())];
            ConstCounter::new(ds.replay_conflicts).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_buffer_released_copies",
            "Buffer copies this process deleted once the primary's master and every replica of it had their cells, per datastore",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for ds in &snapshot.datastores {
            let labels = [("datastore", ds.name.as_str())];
            ConstCounter::new(ds.copies_released).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_buffered_awaiting_replicas",
            "Buffer copies whose cells the primary's master has, kept until its replicas have them too, per datastore and holding cluster, from the latest pass of the gateway replaying that buffer",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for ds in &snapshot.datastores {
            for backlog in &ds.buffered {
                let labels = [
                    ("datastore", ds.name.as_str()),
                    ("cluster", backlog.cluster.as_str()),
                ];
                ConstGauge::new(backlog.awaiting_replicas)
                    .encode(family.encode_family(&labels)?)?;
            }
        }
        let now = chrono::Utc::now();
        for (name, help, oldest) in [
            (
                "cellgate_buffered_cells",
                "Writes kept in a cluster's buffer until their primary's master and replicas have them (copies under half a second old, of writes still committing, not counted), per datastore and holding cluster, from the latest count",
                false,
            ),
            (
                "cellgate_buffered_oldest_seconds",
                "Age of the oldest write in a cluster's buffer (0: empty), per datastore and holding cluster",
                true,
            ),
        ] {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for ds in &snapshot.datastores {
                for backlog in &ds.buffered {
                    let labels = [
                        ("datastore", ds.name.as_str()),
                        ("cluster", backlog.cluster.as_str()),
                    ];
                    let value = if oldest {
                        backlog
                            .oldest
                            .map_or(0, |t| (now - t).num_seconds().max(0))
                    } else {
                        backlog.cells
                    };
                    ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
                }
            }
        }

        let (quantiles, samples) = &snapshot.index_delay_us;
        let mut family = encoder.encode_descriptor(
            "cellgate_index_delay_microseconds",
            "Delay from cell commit to index update since start, by quantile",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for (quantile, value) in quantiles {
            let labels = [("quantile", quantile.to_string())];
            ConstGauge::new(*value as i64).encode(family.encode_family(&labels)?)?;
        }
        ConstCounter::new(*samples).encode(encoder.encode_descriptor(
            "cellgate_index_delay_samples",
            "Index updates measured for cellgate_index_delay_microseconds",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?)?;

        use prometheus_client::metrics::MetricType::{Counter as CounterType, Gauge as GaugeType};
        type Figure = fn(&cellgate_store::DatastoreMetrics) -> i64;
        let per_datastore: [(&str, &str, _, Figure); 14] = [
            (
                "cellgate_index_lag_max_ms",
                "Age of the oldest cell not yet applied to every index (0: caught up), from the log heads and stored offsets",
                GaugeType,
                |d| d.maintenance.lag_max_ms as i64,
            ),
            (
                "cellgate_index_lagging_shards",
                "Shards with cells not yet applied to every index",
                GaugeType,
                |d| d.maintenance.lagging_shards as i64,
            ),
            (
                "cellgate_index_pending_cells",
                "Cells not yet applied to every index",
                GaugeType,
                |d| d.maintenance.pending_cells,
            ),
            (
                "cellgate_index_applied_cells",
                "Log cells applied to the indexes by this process",
                CounterType,
                |d| d.maintenance.applied_cells as i64,
            ),
            (
                "cellgate_index_bodies_decoded",
                "Latest cells whose bodies index maintenance decoded from storage",
                CounterType,
                |d| d.maintenance.bodies_decoded as i64,
            ),
            (
                "cellgate_index_bodies_reused",
                "Latest cells whose bodies index maintenance took from this process's own writes instead of decoding them",
                CounterType,
                |d| d.maintenance.bodies_reused as i64,
            ),
            (
                "cellgate_index_unstorable_values",
                "Index field values stored as null because a backend cannot store them (NUL in text, overlong strings, out-of-range dates)",
                CounterType,
                |d| d.maintenance.unstorable_values as i64,
            ),
            (
                "cellgate_index_quarantined",
                "Index entries moved to the quarantine by this process",
                CounterType,
                |d| d.maintenance.quarantined as i64,
            ),
            (
                "cellgate_index_quarantine_size",
                "Index entries in the quarantine (list and retry them with `cellgate index quarantine`)",
                GaugeType,
                |d| d.maintenance.quarantine_size,
            ),
            (
                "cellgate_index_buckets_held",
                "Lease buckets of shards this process maintains",
                GaugeType,
                |d| d.maintenance.buckets_held as i64,
            ),
            (
                "cellgate_index_verify_runs",
                "Index verify runs (scheduled or asked for) this process finished",
                CounterType,
                |d| d.verify.runs as i64,
            ),
            (
                "cellgate_index_verify_failed",
                "Index verify runs of this process that stopped on an error",
                CounterType,
                |d| d.verify.failed as i64,
            ),
            (
                "cellgate_index_verify_last_drift",
                "Mismatching index entries the latest finished verify of this process found",
                GaugeType,
                |d| d.verify.last_drift as i64,
            ),
            (
                "cellgate_index_drift_repaired",
                "Mismatching index entries repaired by verify runs of this process",
                CounterType,
                |d| d.verify.repaired as i64,
            ),
        ];
        for (name, help, kind, value) in per_datastore {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for ds in &snapshot.datastores {
                let labels = [("datastore", ds.name.as_str())];
                let v = value(ds).max(0);
                match kind {
                    CounterType => {
                        ConstCounter::new(v as u64).encode(family.encode_family(&labels)?)?
                    }
                    _ => ConstGauge::new(v).encode(family.encode_family(&labels)?)?,
                }
            }
        }
        figures::encode_topology(&snapshot.datastores, &mut encoder)?;
        figures::encode_index_versions(&snapshot.datastores, &mut encoder)?;
        let mut family = encoder.encode_descriptor(
            "cellgate_index_drift",
            "Mismatching index entries found by verify runs of this process, by kind (missing, stale, extra)",
            None,
            CounterType,
        )?;
        for ds in &snapshot.datastores {
            for (kind, count) in [
                ("missing", ds.verify.missing),
                ("stale", ds.verify.stale),
                ("extra", ds.verify.extra),
            ] {
                let labels = [("datastore", ds.name.as_str()), ("kind", kind)];
                ConstCounter::new(count).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_index_building_pending_cells",
            "Indexes still being built from the cell log, with the cells to go",
            None,
            GaugeType,
        )?;
        for ds in &snapshot.datastores {
            for index in &ds.maintenance.building {
                let labels = [
                    ("datastore", ds.name.as_str()),
                    ("index", index.name.as_str()),
                ];
                ConstGauge::new(index.pending_cells).encode(family.encode_family(&labels)?)?;
            }
        }
        type BuildFigure = fn(&cellgate_store::IndexStatus) -> Option<f64>;
        let per_build: [(&str, &str, BuildFigure); 3] = [
            (
                "cellgate_index_building_total_cells",
                "Indexes still being built: the log cells the build reads in all, done and pending (the log heads when last measured)",
                |i| i.build_total_cells.map(|n| n as f64),
            ),
            (
                "cellgate_index_building_rate_cells_per_second",
                "Indexes still being built: cells applied per second over the last 10 s",
                |i| i.build_rate,
            ),
            (
                "cellgate_index_building_eta_seconds",
                "Indexes still being built: seconds until the pending cells are applied at the current rate",
                |i| i.build_eta_seconds,
            ),
        ];
        for (name, help, value) in per_build {
            let mut family = encoder.encode_descriptor(name, help, None, GaugeType)?;
            for ds in &snapshot.datastores {
                for index in &ds.maintenance.building {
                    let Some(v) = value(index) else { continue };
                    let labels = [
                        ("datastore", ds.name.as_str()),
                        ("index", index.name.as_str()),
                    ];
                    ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
                }
            }
        }
        let consumers = self.0.consumers();
        type ConsumerFigure = fn(&cellgate_store::triggers::ConsumerStatus) -> i64;
        let per_consumer: [(&str, &str, _, ConsumerFigure); 5] = [
            (
                "cellgate_trigger_delivered_cells",
                "Cells this process handed to a trigger (POSTed, or skipped by its filter) and had acknowledged, per datastore and trigger",
                CounterType,
                |c| c.delivered as i64,
            ),
            (
                "cellgate_trigger_quarantined_cells",
                "Cells of a trigger in the quarantine, on every cluster (list and retry them with `cellgate trigger quarantine`)",
                GaugeType,
                |c| c.quarantined as i64,
            ),
            (
                "cellgate_trigger_pending_cells",
                "Cells of the shards this process holds for a trigger not yet delivered, from the latest known log heads",
                GaugeType,
                |c| c.pending_cells,
            ),
            (
                "cellgate_trigger_buckets_held",
                "Lease buckets of shards this process delivers for a trigger",
                GaugeType,
                |c| c.held_buckets as i64,
            ),
            (
                "cellgate_trigger_stopped",
                "Whether a trigger stopped (1), past its quarantine limit, until the gateway restarts",
                GaugeType,
                |c| i64::from(c.stopped.is_some()),
            ),
        ];
        for (name, help, kind, value) in per_consumer {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for consumer in &consumers {
                let labels = [
                    ("datastore", consumer.datastore.as_str()),
                    ("trigger", consumer.name.as_str()),
                ];
                let v = value(consumer).max(0);
                match kind {
                    CounterType => {
                        ConstCounter::new(v as u64).encode(family.encode_family(&labels)?)?
                    }
                    _ => ConstGauge::new(v).encode(family.encode_family(&labels)?)?,
                }
            }
        }
        let tails = self.0.tail_metrics();
        type TailFigure = fn(&cellgate_store::triggers::tail::DatastoreTailMetrics) -> i64;
        let per_tail: [(&str, &str, _, TailFigure); 5] = [
            (
                "cellgate_subscription_followers",
                "Log followers (GraphQL subscriptions) of a datastore in this process",
                GaugeType,
                |t| t.followers as i64,
            ),
            (
                "cellgate_subscription_tail_reads",
                "Log reads (statements) of a datastore's shared tail, which feeds all its followers: one per cluster and page of new cells",
                CounterType,
                |t| t.tail_reads as i64,
            ),
            (
                "cellgate_subscription_delivered_cells",
                "Cells handed to the followers of a datastore, once per follower",
                CounterType,
                |t| t.delivered_cells as i64,
            ),
            (
                "cellgate_subscription_lagged",
                "Times a follower of a datastore fell behind the shared tail and had to read the log itself",
                CounterType,
                |t| t.lagged as i64,
            ),
            (
                "cellgate_subscription_catch_up_reads",
                "Log reads (statements) of followers of a datastore reading on their own (a resume cursor, or after lagging)",
                CounterType,
                |t| t.catch_up_reads as i64,
            ),
        ];
        for (name, help, kind, value) in per_tail {
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for tail in &tails.datastores {
                let labels = [("datastore", tail.datastore.as_str())];
                let v = value(tail).max(0);
                match kind {
                    CounterType => {
                        ConstCounter::new(v as u64).encode(family.encode_family(&labels)?)?
                    }
                    _ => ConstGauge::new(v).encode(family.encode_family(&labels)?)?,
                }
            }
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_cluster_ready",
            "Whether a storage cluster is prepared and serving (1) or not (0)",
            None,
            GaugeType,
        )?;
        for cluster in &snapshot.clusters {
            let labels = [("cluster", cluster.name.as_str())];
            ConstGauge::new(i64::from(cluster.ready)).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_storage_statements",
            "SQL statements this process sent to each cluster's master, BEGIN and COMMIT included",
            None,
            CounterType,
        )?;
        for cluster in &snapshot.clusters {
            let labels = [("cluster", cluster.name.as_str())];
            ConstCounter::new(cluster.statements).encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_storage_maintenance_statements",
            "SQL statements this process sent to each cluster's master for background work (index maintenance, triggers, subscription tails) through its maintenance pool, or on SQLite its maintenance lane to the one writer; 0 where they share the master's pool (storage.maintenance_connections 0) and count in cellgate_storage_statements",
            None,
            CounterType,
        )?;
        for cluster in &snapshot.clusters {
            let labels = [("cluster", cluster.name.as_str())];
            ConstCounter::new(cluster.maintenance_statements)
                .encode(family.encode_family(&labels)?)?;
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_node_breaker_state",
            "State of the circuit breaker of each database server node: 0 closed, 1 half-open, 2 open",
            None,
            GaugeType,
        )?;
        for cluster in &snapshot.clusters {
            for breaker in &cluster.breakers {
                let labels = [
                    ("cluster", cluster.name.as_str()),
                    ("node", breaker.node.as_str()),
                ];
                let state = match breaker.state {
                    BreakerState::Closed => 0,
                    BreakerState::HalfOpen => 1,
                    BreakerState::Open => 2,
                };
                ConstGauge::new(state).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "cellgate_node_breaker_opened",
            "Times the circuit breaker of each database server node opened, failed probes included",
            None,
            CounterType,
        )?;
        for cluster in &snapshot.clusters {
            for breaker in &cluster.breakers {
                let labels = [
                    ("cluster", cluster.name.as_str()),
                    ("node", breaker.node.as_str()),
                ];
                ConstCounter::new(breaker.opened).encode(family.encode_family(&labels)?)?;
            }
        }
        for (name, help, seconds) in [
            (
                "cellgate_replica_lag_cells",
                "Cells a replica has not applied yet (the master's shard counters against the replica's, summed over the datastores)",
                false,
            ),
            (
                "cellgate_replica_lag_seconds",
                "How long ago the master had no more cells than a replica has applied now",
                true,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, GaugeType)?;
            for lag in &snapshot.replica_lag {
                let labels = [
                    ("cluster", lag.cluster.as_str()),
                    ("node", lag.node.as_str()),
                ];
                let value = if seconds {
                    (lag.lag_ms / 1000) as i64
                } else {
                    lag.cells_behind
                };
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        figures::encode_cell_cache(&snapshot.cell_cache, &mut encoder)?;
        figures::encode_ids(&self.0.ids().metrics(), &mut encoder)
    }
}
