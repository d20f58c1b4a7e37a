//! The stored topology: one row per datastore in `cellgate_topology` on the
//! store's first cluster (the *metadata cluster*), and the acknowledgements
//! of the gateways that serve it.
//!
//! | column | what |
//! |---|---|
//! | `version` | raised by every change; gateways serve the newest they read |
//! | `ranges` | where requests find each shard: `0-2047:a,2048-4095:b` |
//! | `work` | whose workers (index maintenance, triggers) follow each shard's log: `ranges`, but while a moved range's last cells on its old cluster are applied there |
//! | `cutover` | 1 while a move's cut-over is near: gateways read the row every few milliseconds |
//! | `moving` | the move in progress, as JSON (empty when none) |
//!
//! The first gateway to open a datastore writes its row from the shard
//! ranges of `cellgate.yaml`; from then on the row is what every gateway
//! serves, and only a shard move changes it.
//!
//! **Acknowledgements.** Each gateway that routes requests keeps a row
//! `topo:<datastore>:<holder>` in `cellgate_leases` on the metadata
//! cluster whose token is the version it serves, renewed while it runs. A
//! move waits for every such row that has not expired to show its new
//! version before the next step of the cut-over.

use chrono::Utc;

use crate::error::{Error, Result};
use crate::shards::ShardMap;
use crate::storage::{ddl, Backend, Sql, Value};
use crate::topology::MoveRecord;

/// One datastore's stored topology row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) datastore: String,
    pub(crate) version: i64,
    pub(crate) ranges: String,
    pub(crate) work: String,
    pub(crate) cutover: bool,
    pub(crate) moving: Option<MoveRecord>,
}

/// `0-2047:a,2048-4095:b`: a map as text, with cluster names.
pub(crate) fn map_text(map: &ShardMap, names: &[String]) -> String {
    let mut ranges: Vec<(u32, u32, usize)> = map
        .clusters()
        .into_iter()
        .flat_map(|c| map.ranges_of(c).into_iter().map(move |(a, b)| (a, b, c)))
        .collect();
    ranges.sort();
    ranges
        .iter()
        .map(|(a, b, c)| format!("{a}-{b}:{}", names[*c]))
        .collect::<Vec<_>>()
        .join(",")
}

/// The shard count a stored map covers (its last shard plus one).
fn shard_count(text: &str) -> Option<u32> {
    text.split(',')
        .filter_map(|part| {
            part.split_once(':')?
                .0
                .split_once('-')?
                .1
                .parse::<u32>()
                .ok()
        })
        .max()
        .map(|last| last + 1)
}

/// Reads [`map_text`]'s form back, with the clusters known as `names`.
pub(crate) fn parse_map(text: &str, shards: u32, names: &[String]) -> Result<ShardMap> {
    let mut ranges = Vec::new();
    for part in text.split(',').filter(|p| !p.is_empty()) {
        let bad = || Error::Config(format!("stored topology: unreadable shard range `{part}`"));
        let (span, cluster) = part.split_once(':').ok_or_else(bad)?;
        let (first, last) = span.split_once('-').ok_or_else(bad)?;
        let (first, last): (u32, u32) = (
            first.parse().map_err(|_| bad())?,
            last.parse().map_err(|_| bad())?,
        );
        let index = names.iter().position(|n| n == cluster).ok_or_else(|| {
            Error::Config(format!(
                "the stored topology routes shards {first}-{last} to cluster `{cluster}`, which \
                 this gateway's configuration does not list; add it to `storage.clusters`"
            ))
        })?;
        ranges.push((first, last, index));
    }
    ShardMap::from_ranges(shards, &ranges)
        .map_err(|e| Error::Config(format!("stored topology: {e}")))
}

const COLUMNS: [&str; 6] = [
    "datastore",
    "version",
    "ranges",
    "work",
    "cutover",
    "moving",
];

/// A row of [`COLUMNS`].
type Row = (String, i64, String, String, i64, Option<String>);

fn from_row((datastore, version, ranges, work, cutover, moving): Row) -> Stored {
    Stored {
        datastore,
        version,
        ranges,
        work,
        cutover: cutover != 0,
        moving: moving
            .filter(|m| !m.is_empty())
            .and_then(|m| serde_json::from_str(&m).ok()),
    }
}

/// Every datastore's row, in one statement.
pub(crate) async fn read_all(backend: &dyn Backend) -> Result<Vec<Stored>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(COLUMNS)
        .push(" FROM ")
        .ident(ddl::TOPOLOGY_TABLE);
    Ok(backend
        .rows::<Row>(&sql)
        .await?
        .into_iter()
        .map(from_row)
        .collect())
}

/// A datastore's stored topology as a gateway serves it.
pub(crate) struct Served {
    pub(crate) version: i64,
    pub(crate) map: ShardMap,
    pub(crate) work: ShardMap,
    pub(crate) moving: Option<MoveRecord>,
}

/// At start-up: writes the rows of datastores that have none from the
/// configuration's maps (`maps`), and reads every row. With the metadata
/// cluster unreachable, the configuration's maps are served until the
/// follower reads the stored ones.
pub(crate) async fn open(
    clusters: &[crate::topology::Cluster],
    reachable: bool,
    defs: &index_dsl::Definitions,
    maps: &std::collections::HashMap<String, ShardMap>,
    warnings: &mut Vec<String>,
) -> Result<std::collections::HashMap<String, Served>> {
    let mut served = std::collections::HashMap::new();
    if !reachable {
        warnings.push(format!(
            "the metadata cluster `{}` is unreachable: serving the shard ranges of the configuration until the stored topology can be read",
            clusters[0].name
        ));
        return Ok(served);
    }
    let names: Vec<String> = clusters.iter().map(|c| c.name.clone()).collect();
    let meta = clusters[0].master.as_ref();
    let rows = read_all(meta).await?;
    for def in &defs.datastores {
        if !rows.iter().any(|r| r.datastore == def.name) {
            seed(meta, &def.name, &map_text(&maps[&def.name], &names)).await?;
        }
    }
    for row in read_all(meta).await? {
        let Some(def) = defs.datastore(&row.datastore) else {
            continue;
        };
        if shard_count(&row.ranges) != Some(def.shards) {
            // A new shard count: the catalog refuses it with its message.
            continue;
        }
        let map = parse_map(&row.ranges, def.shards, &names)?;
        let work = parse_map(&row.work, def.shards, &names)?;
        if map != maps[&def.name] {
            warnings.push(format!(
                "datastore `{}`: the configuration's shard ranges differ from the stored topology (version {}: {}); the stored topology is served, and only `cellgate shard move` changes it",
                def.name, row.version, row.ranges
            ));
        }
        served.insert(
            row.datastore.clone(),
            Served {
                version: row.version,
                map,
                work,
                moving: row.moving.clone(),
            },
        );
    }
    Ok(served)
}

/// One datastore's row.
pub(crate) async fn read(backend: &dyn Backend, datastore: &str) -> Result<Option<Stored>> {
    Ok(read_all(backend)
        .await?
        .into_iter()
        .find(|s| s.datastore == datastore))
}

/// Writes the first row of a datastore, unless one exists.
pub(crate) async fn seed(backend: &dyn Backend, datastore: &str, ranges: &str) -> Result<()> {
    let dialect = backend.dialect();
    let mut sql = Sql::new(dialect);
    sql.push(dialect.insert_ignore())
        .ident(ddl::TOPOLOGY_TABLE)
        .push(" (")
        .idents(COLUMNS)
        .push(", ")
        .ident("updated_at")
        .push(") ")
        .rows([vec![
            Value::Text(datastore.to_string()),
            Value::Int(1),
            Value::Text(ranges.to_string()),
            Value::Text(ranges.to_string()),
            Value::Int(0),
            Value::Text(String::new()),
            now(),
        ]])
        .push(dialect.on_conflict_do_nothing());
    backend.execute(&sql).await?;
    Ok(())
}

/// Replaces the row of `next.datastore` with `next` (its version one
/// above `previous`'s), if the stored row still has `previous`'s version.
/// False when another writer changed it first.
pub(crate) async fn replace(backend: &dyn Backend, previous: i64, next: &Stored) -> Result<bool> {
    let moving = match &next.moving {
        Some(record) => serde_json::to_string(record).expect("move record serializes"),
        None => String::new(),
    };
    let mut sql = Sql::new(backend.dialect());
    sql.push("UPDATE ")
        .ident(ddl::TOPOLOGY_TABLE)
        .push(" SET ")
        .ident("version")
        .push(" = ")
        .bind(Value::Int(next.version))
        .push(", ")
        .ident("ranges")
        .push(" = ")
        .bind(Value::Text(next.ranges.clone()))
        .push(", ")
        .ident("work")
        .push(" = ")
        .bind(Value::Text(next.work.clone()))
        .push(", ")
        .ident("cutover")
        .push(" = ")
        .bind(Value::Int(i64::from(next.cutover)))
        .push(", ")
        .ident("moving")
        .push(" = ")
        .bind(Value::Text(moving))
        .push(", ")
        .ident("updated_at")
        .push(" = ")
        .bind(now())
        .push(" WHERE ")
        .ident("datastore")
        .push(" = ")
        .bind(Value::Text(next.datastore.clone()))
        .push(" AND ")
        .ident("version")
        .push(" = ")
        .bind(Value::Int(previous));
    Ok(backend.execute(&sql).await? == 1)
}

fn now() -> Value {
    Value::DateTime(crate::storage::value::truncate_to_micros(Utc::now()))
}

/// The lease-table name of a gateway's acknowledgement for `datastore`.
fn ack_name(datastore: &str, holder: &str) -> String {
    format!("{}{holder}", ack_prefix(datastore))
}

fn ack_prefix(datastore: &str) -> String {
    format!("topo:{datastore}:")
}

/// Records that `holder` serves `versions` (datastore, version), for `ttl`.
pub(crate) async fn acknowledge(
    backend: &dyn Backend,
    holder: &str,
    versions: &[(String, i64)],
    ttl: std::time::Duration,
) -> Result<()> {
    if versions.is_empty() {
        return Ok(());
    }
    let dialect = backend.dialect();
    let now = Utc::now();
    let expires = now + chrono::Duration::from_std(ttl).unwrap_or(chrono::Duration::seconds(10));
    let mut sql = Sql::new(dialect);
    sql.push("INSERT INTO ")
        .ident(ddl::LEASES_TABLE)
        .push(" (")
        .idents(["name", "holder", "token", "expires_at", "acquired_at"])
        .push(") ")
        .rows(versions.iter().map(|(datastore, version)| {
            vec![
                Value::Text(ack_name(datastore, holder)),
                Value::Text(holder.to_string()),
                Value::Int(*version),
                Value::DateTime(crate::storage::value::truncate_to_micros(expires)),
                Value::DateTime(crate::storage::value::truncate_to_micros(now)),
            ]
        }))
        .push(&dialect.upsert(&["name"], &["token", "expires_at"]));
    backend.execute(&sql).await?;
    Ok(())
}

/// Gives up `holder`'s acknowledgements (a gateway that stops).
pub(crate) async fn withdraw(backend: &dyn Backend, holder: &str, datastores: &[String]) {
    let names: Vec<String> = datastores.iter().map(|d| ack_name(d, holder)).collect();
    if names.is_empty() {
        return;
    }
    let mut sql = Sql::new(backend.dialect());
    sql.push("DELETE FROM ")
        .ident(ddl::LEASES_TABLE)
        .push(" WHERE ")
        .ident("name")
        .in_list(names.into_iter().map(Value::Text));
    if let Err(err) = backend.execute(&sql).await {
        tracing::debug!(error = %err, "could not withdraw topology acknowledgements");
    }
}

/// The gateways serving `datastore` whose acknowledgement has not expired
/// and shows a version below `version`: `(holder, version served)`.
pub(crate) async fn behind(
    backend: &dyn Backend,
    datastore: &str,
    version: i64,
) -> Result<Vec<(String, i64)>> {
    let now = Utc::now();
    Ok(crate::leases::list(backend, &ack_prefix(datastore))
        .await?
        .into_iter()
        .filter(|row| row.expires_at > now && row.token < version)
        .map(|row| (row.holder, row.token))
        .collect())
}
