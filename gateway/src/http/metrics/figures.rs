//! The store's figures that need more than a loop over one list: the
//! cell cache, the topology and shard moves, index versions, the ID
//! allocator.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// Every index version a datastore serves, its version number labelled
/// with its state: `ready` or `building` for the current version, and
/// while a new one is built, `previous` for the version that answers the
/// queries it can answer meanwhile.
pub(super) fn encode_index_versions(
    datastores: &[cellgate_store::DatastoreMetrics],
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType::Gauge as GaugeType;
    let mut family = encoder.encode_descriptor(
        "cellgate_index_version",
        "The table version of each index served, by state: ready or building (the current version), previous (the version answering queries while a new one is built)",
        None,
        GaugeType,
    )?;
    for ds in datastores {
        for index in &ds.maintenance.versions {
            let state = match (index.serves_until, index.ready) {
                (Some(_), _) => "previous",
                (None, true) => "ready",
                (None, false) => "building",
            };
            let labels = [
                ("datastore", ds.name.as_str()),
                ("index", index.name.as_str()),
                ("state", state),
            ];
            ConstGauge::new(i64::from(index.version)).encode(family.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// The cells kept in memory by their full key (`storage.cell_cache_bytes`).
pub(super) fn encode_cell_cache(
    cache: &cellgate_store::cells::CellCacheMetrics,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType::{Counter as CounterType, Gauge as GaugeType};
    let gauge = |bytes: u64| ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
    for (name, help, value) in [
        (
            "cellgate_cell_cache_budget_bytes",
            "The memory the cell cache may hold (storage.cell_cache_bytes; 0: off)",
            cache.budget_bytes,
        ),
        (
            "cellgate_cell_cache_bytes",
            "The memory the cell cache holds now: the kept bodies' JSON text plus a fixed cost per cell",
            cache.bytes,
        ),
        (
            "cellgate_cell_cache_cells",
            "Cells the cell cache holds now",
            cache.cells,
        ),
    ] {
        gauge(value).encode(encoder.encode_descriptor(name, help, None, GaugeType)?)?;
    }
    let mut family = encoder.encode_descriptor(
        "cellgate_cell_cache_lookups",
        "Cells looked up in the cell cache by their full key: served from memory (hit) or read from the database (miss)",
        None,
        CounterType,
    )?;
    ConstCounter::new(cache.hits).encode(family.encode_family(&[("result", "hit")])?)?;
    ConstCounter::new(cache.misses).encode(family.encode_family(&[("result", "miss")])?)?;
    Ok(())
}

/// The stored topology each datastore is served from, and the shard move
/// recorded for it: the phase as an info-style series (one, labelled with
/// the current phase), so a dashboard can show the move and alert on one
/// that stays in a phase too long.
pub(super) fn encode_topology(
    datastores: &[cellgate_store::DatastoreMetrics],
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType::Gauge as GaugeType;
    let mut family = encoder.encode_descriptor(
        "cellgate_topology_version",
        "The stored topology version this process serves, per datastore; each step a shard move records (a phase, a new route) makes a new one (0: none read yet)",
        None,
        GaugeType,
    )?;
    for ds in datastores {
        let labels = [("datastore", ds.name.as_str())];
        ConstGauge::new(ds.topology_version).encode(family.encode_family(&labels)?)?;
    }
    let mut family = encoder.encode_descriptor(
        "cellgate_shard_move_phase",
        "The shard move recorded for a datastore (`cellgate shard move`): 1, labelled with its shard range, source and target clusters and current phase; no series while none is recorded",
        None,
        GaugeType,
    )?;
    for ds in datastores {
        let Some(moving) = &ds.moving else { continue };
        let shards = format!("{}-{}", moving.first, moving.last);
        let labels = [
            ("datastore", ds.name.as_str()),
            ("shards", shards.as_str()),
            ("source", moving.source.as_str()),
            ("target", moving.target.as_str()),
            ("phase", moving.phase.name()),
        ];
        ConstGauge::new(1).encode(family.encode_family(&labels)?)?;
    }
    let mut family = encoder.encode_descriptor(
        "cellgate_shard_move_cells_copied",
        "Cells the shard move recorded for a datastore has copied to its target, as recorded when its current phase began",
        None,
        GaugeType,
    )?;
    for ds in datastores {
        let Some(moving) = &ds.moving else { continue };
        let labels = [("datastore", ds.name.as_str())];
        let copied = i64::try_from(moving.copied).unwrap_or(i64::MAX);
        ConstGauge::new(copied).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The ID allocator's figures: per biz tag, and the snowflake worker.
pub(super) fn encode_ids(
    ids: &cellgate_store::ids::IdsMetrics,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::metrics::MetricType::{Counter as CounterType, Gauge as GaugeType};
    type Figure = fn(&cellgate_store::ids::TagMetrics) -> i64;
    let per_tag: [(&str, &str, _, Figure); 4] = [
        (
            "cellgate_ids_issued",
            "Segment IDs handed out by this process, per biz tag",
            CounterType,
            |t| t.issued as i64,
        ),
        (
            "cellgate_ids_segment_loads",
            "Segments taken from the database, per biz tag",
            CounterType,
            |t| t.segment_loads as i64,
        ),
        (
            "cellgate_ids_boundary_waits",
            "Requests that waited for the database at a segment boundary (0 while prefetch keeps up), per biz tag",
            CounterType,
            |t| t.boundary_waits as i64,
        ),
        (
            "cellgate_ids_segment_step",
            "Length of the latest segment (the adaptive step), per biz tag",
            GaugeType,
            |t| t.step,
        ),
    ];
    for (name, help, kind, value) in per_tag {
        let mut family = encoder.encode_descriptor(name, help, None, kind)?;
        for tag in &ids.tags {
            let labels = [("tag", tag.tag.as_str())];
            let v = value(tag).max(0);
            match kind {
                CounterType => {
                    ConstCounter::new(v as u64).encode(family.encode_family(&labels)?)?
                }
                _ => ConstGauge::new(v).encode(family.encode_family(&labels)?)?,
            }
        }
    }
    let Some(snowflake) = &ids.snowflake else {
        return Ok(());
    };
    ConstGauge::new(snowflake.worker_id.map(i64::from).unwrap_or(-1)).encode(
        encoder.encode_descriptor(
            "cellgate_ids_snowflake_worker_id",
            "The leased snowflake worker id (-1: none)",
            None,
            GaugeType,
        )?,
    )?;
    let mut family = encoder.encode_descriptor(
        "cellgate_ids_snowflake_lease",
        "State of the snowflake worker lease (1 for the current state)",
        None,
        GaugeType,
    )?;
    use cellgate_store::ids::LeaseState;
    for state in [
        LeaseState::None,
        LeaseState::Cached,
        LeaseState::Held,
        LeaseState::Stale,
        LeaseState::Lost,
    ] {
        let labels = [("state", state.as_str())];
        ConstGauge::new(i64::from(snowflake.lease_state == state))
            .encode(family.encode_family(&labels)?)?;
    }
    ConstGauge::new(snowflake.lease_remaining_ms).encode(encoder.encode_descriptor(
        "cellgate_ids_snowflake_lease_remaining_ms",
        "Milliseconds until the worker lease expires unless renewed",
        None,
        GaugeType,
    )?)?;
    ConstCounter::new(snowflake.issued).encode(encoder.encode_descriptor(
        "cellgate_ids_snowflake_issued",
        "Snowflake and tagged IDs issued by this process",
        None,
        CounterType,
    )?)?;
    ConstCounter::new(snowflake.clock_refusals).encode(encoder.encode_descriptor(
        "cellgate_ids_clock_refusals",
        "Snowflake requests refused because the clock moved backwards",
        None,
        CounterType,
    )?)?;
    Ok(())
}
