//! Replay of buffered writes into their primary.
//!
//! A write whose primary master failed transiently stays in the
//! `<ds>_buffer` table of `buffer_count` other clusters (see `write.rs`).
//! The replayer delivers it once the primary answers again:
//!
//! 1. Every second (every [`RETRY_EVERY`] while cells wait), each gateway
//!    counts the buffered cells of each datastore on each cluster (one
//!    statement; the `/metrics` figures) and, where there are some, takes
//!    or renews the lease `buffer-replay:<ds>` on that cluster, so one
//!    gateway at a time replays a buffer and any other can take it over.
//! 2. The holder reads the buffer in `buffer_id` order, a page at a time,
//!    groups the page by the cells' primary clusters (from the shard map)
//!    and commits each group through the write path's own primary commit
//!    (`write::commit_primary`): a cell is `WRITTEN` or, if it got there
//!    first by another way, `DUPLICATE`. Its log heads are announced like
//!    any write's, so it is indexed like any other cell.
//! 3. Several buffered writes of one key go in buffer order: the first
//!    that reaches the primary wins, as a direct write would, and each
//!    later one with another body is a conflict. A conflict is recorded in
//!    `<ds>_conflicts` on the primary (the key, both bodies' hashes, the
//!    losing body, where and when it was buffered), counted, and listed by
//!    [`list_conflicts`]; it is never dropped silently.
//! 4. Only then are the page's buffer rows of that group deleted. A crash
//!    in between replays them again, which changes nothing (duplicates, and
//!    a conflict is keyed so that it is recorded once).
//!
//! A group whose primary is still down stays buffered and is tried again
//! within [`RETRY_EVERY`]; the rest of the page goes on. A buffered cell
//! younger than [`MIN_AGE`] waits, and one younger than [`REPLAY_AGE`] is
//! only released (never written into its primary), so that a write still
//! committing on its primary normally is not replayed under it. Replay is
//! idempotent, so the lease is there to keep gateways from doing the same
//! work, not for correctness: a holder that stalled past its lease does no
//! harm.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::write::{commit_primary, existing_bodies, Prepared};
use super::{codec, CellKey, PutStatus};
use crate::error::{Error, Result};
use crate::leases::{self, Lease};
use crate::retry::with_retry;
use crate::storage::value::truncate_to_micros;
use crate::storage::{ddl, Backend, Sql, Value, MAX_PARAMS};
use crate::topology::{ClusterState, DatastoreRuntime, Topology, Written};

/// Buffer rows read and replayed at once.
const PAGE: usize = 500;

/// How often a gateway looks for buffered cells when there were none.
const IDLE_EVERY: Duration = Duration::from_secs(1);

/// How often buffered cells are tried again while some wait.
pub const RETRY_EVERY: Duration = Duration::from_millis(250);

/// Buffered cells younger than this are left to the write that is still
/// committing them.
pub const MIN_AGE: Duration = Duration::from_millis(500);

/// Copies younger than this are only released (once the primary and its
/// replicas have their cells), never written into the primary: their
/// write may still be committing, and a replay that got there first would
/// answer that write `DUPLICATE` for its own cell. Writes are bounded by
/// the statement timeout, so one still committing after this is rare (and
/// its cell is stored all the same).
pub const REPLAY_AGE: Duration = Duration::from_secs(5);

/// The lease of replaying one datastore's buffer on one cluster.
fn lease_name(datastore: &str) -> String {
    format!("buffer-replay:{datastore}")
}

/// Buffered cells waiting on one cluster, from the latest count.
#[derive(Debug, Clone, PartialEq)]
pub struct Backlog {
    /// The cluster whose buffer table holds them.
    pub cluster: String,
    pub cells: i64,
    /// When the oldest was buffered.
    pub oldest: Option<DateTime<Utc>>,
    /// Of `cells`, those their primary's master has, waiting for its
    /// replicas to have them too (from the latest pass of the gateway
    /// holding this buffer's lease; 0 elsewhere).
    pub awaiting_replicas: i64,
}

/// A buffered write that lost to another body of its key on replay.
#[derive(Debug, Clone, PartialEq)]
pub struct Conflict {
    pub key: CellKey,
    /// The body that was buffered and lost.
    pub body: serde_json::Value,
    /// Hash of the losing body's JSON text (xxh3, hex).
    pub body_hash: String,
    /// Hash of the stored (winning) body's JSON text.
    pub stored_hash: String,
    /// The cluster whose buffer held the losing write.
    pub buffered_on: String,
    pub buffered_at: DateTime<Utc>,
    pub recorded_at: DateTime<Utc>,
}

/// The replayer's state, shared with the store for metrics.
pub(crate) struct Replayer {
    holder: String,
    lease_time: Duration,
    backlog: Mutex<BTreeMap<(String, usize), Backlog>>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Replayer {
    pub(crate) fn new(holder: String, lease_time: Duration) -> Replayer {
        Replayer {
            holder,
            lease_time,
            backlog: Mutex::new(BTreeMap::new()),
            task: Mutex::new(None),
        }
    }

    /// Starts replaying in the background until `stopped` is set.
    pub(crate) fn start(
        self: &Arc<Self>,
        topology: Arc<Topology>,
        stopped: tokio::sync::watch::Receiver<bool>,
    ) {
        let task = tokio::spawn(run(topology, self.clone(), stopped));
        *self.task.lock().expect("task") = Some(task);
    }

    /// Waits for the replayer to stop (after a shutdown) and release its
    /// leases, at most `grace`.
    pub(crate) async fn join(&self, grace: Duration) {
        let task = self.task.lock().expect("task").take();
        if let Some(task) = task {
            if tokio::time::timeout(grace, task).await.is_err() {
                tracing::warn!(
                    "buffer replay did not stop in time; its leases expire on their own"
                );
            }
        }
    }

    /// The latest counts of a datastore's buffered cells, per cluster.
    pub(crate) fn backlog(&self, datastore: &str) -> Vec<Backlog> {
        self.backlog
            .lock()
            .expect("backlog")
            .iter()
            .filter(|((ds, _), _)| ds == datastore)
            .map(|(_, backlog)| backlog.clone())
            .collect()
    }

    /// The copies awaiting replicas on `cluster` at the latest pass.
    fn awaiting_replicas(&self, datastore: &str, cluster: usize) -> i64 {
        self.backlog
            .lock()
            .expect("backlog")
            .get(&(datastore.to_string(), cluster))
            .map_or(0, |b| b.awaiting_replicas)
    }

    fn set_backlog(&self, datastore: &str, cluster: usize, backlog: Backlog) {
        self.backlog
            .lock()
            .expect("backlog")
            .insert((datastore.to_string(), cluster), backlog);
    }
}

/// Runs the replayer until `stopped`; releases its leases on the way out.
async fn run(
    topology: Arc<Topology>,
    replayer: Arc<Replayer>,
    mut stopped: tokio::sync::watch::Receiver<bool>,
) {
    let mut held: HashMap<(String, usize), Lease> = HashMap::new();
    while !*stopped.borrow() {
        let mut waiting = false;
        for ds in topology.defined().datastores.values() {
            for cluster in 0..topology.clusters.len() {
                if *stopped.borrow() {
                    break;
                }
                match tend(&topology, &replayer, ds, cluster, &mut held, &stopped).await {
                    Ok(left) => waiting |= left > 0,
                    Err(err) => {
                        tracing::debug!(datastore = %ds.name(), cluster = %topology.clusters[cluster].name, error = %err, "buffer replay: cannot reach the buffer");
                    }
                }
            }
        }
        let pause = if waiting { RETRY_EVERY } else { IDLE_EVERY };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            // A shutdown, or the store dropped.
            _ = stopped.changed() => break,
        }
    }
    for ((datastore, cluster), lease) in held {
        if let Ok(backend) = topology.clusters[cluster].maintenance() {
            let _ = leases::release(backend.as_ref(), &replayer.holder, &[lease.name]).await;
        }
        tracing::debug!(%datastore, "buffer replay lease released");
    }
}

/// Counts one buffer, and replays it if this process holds (or can take)
/// its lease. Returns the cells still buffered there.
async fn tend(
    topology: &Topology,
    replayer: &Replayer,
    ds: &DatastoreRuntime,
    cluster: usize,
    held: &mut HashMap<(String, usize), Lease>,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> Result<i64> {
    let backend = topology.clusters[cluster].maintenance()?.clone();
    let (cells, oldest) = count(backend.as_ref(), ds.name()).await?;
    let backlog = |awaiting_replicas: i64| Backlog {
        cluster: topology.clusters[cluster].name.clone(),
        cells,
        oldest,
        awaiting_replicas,
    };
    // Until this pass tells, the last pass's figure stands.
    let before = replayer.awaiting_replicas(ds.name(), cluster);
    replayer.set_backlog(ds.name(), cluster, backlog(before.min(cells)));
    let slot = (ds.name().to_string(), cluster);
    if cells == 0 {
        if let Some(lease) = held.remove(&slot) {
            leases::release(backend.as_ref(), &replayer.holder, &[lease.name]).await?;
        }
        return Ok(0);
    }
    let Some(lease) = hold(backend.as_ref(), replayer, ds.name(), held.remove(&slot)).await? else {
        return Ok(cells);
    };
    // Stop a second before the lease runs out by this process's clock.
    let left = (lease.expires_at - Utc::now())
        .to_std()
        .unwrap_or_default()
        .saturating_sub(Duration::from_secs(1));
    let deadline = Instant::now() + left.min(replayer.lease_time / 2);
    held.insert(slot, lease);
    let span = tracing::debug_span!(
        "buffer replay",
        cellgate.datastore = ds.name(),
        cellgate.cluster = topology.clusters[cluster].name.as_str(),
        cellgate.buffered_cells = cells,
        cellgate.copies_deleted = tracing::field::Empty,
    );
    let replayed = replay(topology, ds, cluster, backend.as_ref(), deadline, stopped);
    let pass = tracing::Instrument::instrument(replayed, span.clone()).await?;
    span.record("cellgate.copies_deleted", pass.deleted);
    replayer.set_backlog(ds.name(), cluster, backlog(pass.awaiting_replicas as i64));
    Ok(cells - pass.deleted as i64)
}

/// Renews `lease`, or takes the buffer's lease when it is free.
async fn hold(
    backend: &dyn Backend,
    replayer: &Replayer,
    datastore: &str,
    lease: Option<Lease>,
) -> Result<Option<Lease>> {
    if let Some(lease) = lease {
        let renewed = leases::renew(backend, &replayer.holder, &[lease], replayer.lease_time)
            .await?
            .pop();
        if renewed.is_some() {
            return Ok(renewed);
        }
    }
    let name = lease_name(datastore);
    leases::ensure(backend, std::slice::from_ref(&name)).await?;
    let Some(row) = leases::list(backend, &name)
        .await?
        .into_iter()
        .find(|row| row.name == name)
    else {
        return Ok(None);
    };
    leases::acquire(
        backend,
        &row,
        &replayer.holder,
        replayer.lease_time,
        Duration::ZERO,
    )
    .await
}

/// The number of buffered cells of `datastore` on a cluster, and when the
/// oldest was buffered. Copies younger than [`MIN_AGE`] belong to writes
/// still committing normally and do not count: they would make every
/// gateway under write load take and give up the lease all the time.
async fn count(backend: &dyn Backend, datastore: &str) -> Result<(i64, Option<DateTime<Utc>>)> {
    let mut sql = Sql::new(backend.dialect());
    let young_from = backend
        .dialect()
        .now_minus_millis(MIN_AGE.as_millis() as u64);
    sql.push("SELECT COUNT(*), MIN(")
        .ident("created_at")
        .push(") FROM ")
        .ident(&ddl::buffer_table(datastore))
        .push(" WHERE ")
        .ident("created_at")
        .push(" < ")
        .push(&young_from);
    let row = backend
        .first_row::<(Option<i64>, Option<DateTime<Utc>>)>(&sql)
        .await?;
    Ok(row.map_or((0, None), |(count, oldest)| (count.unwrap_or(0), oldest)))
}

/// One buffered write as read back.
struct Buffered {
    buffer_id: i64,
    shard: u32,
    key: CellKey,
    encoded: Vec<u8>,
    created_at: DateTime<Utc>,
    /// Younger than [`MIN_AGE`]: left to the write still committing it.
    young: bool,
    /// Older than [`REPLAY_AGE`]: written into the primary if it lacks it.
    settled: bool,
}

/// What one pass over a buffer did.
#[derive(Debug, Default)]
struct Pass {
    /// Buffer rows deleted: their cells are on the primary's master and
    /// every replica (or recorded as conflicts).
    deleted: usize,
    /// Copies whose cells the master has and a replica does not yet.
    awaiting_replicas: usize,
}

/// Replays the buffer of `datastore` on `holder` page by page until its
/// end, `deadline` or a shutdown, and deletes the copies no longer needed.
async fn replay(
    topology: &Topology,
    ds: &DatastoreRuntime,
    holder: usize,
    backend: &dyn Backend,
    deadline: Instant,
    stopped: &tokio::sync::watch::Receiver<bool>,
) -> Result<Pass> {
    let mut after = 0;
    let mut pass = Pass::default();
    while Instant::now() < deadline && !*stopped.borrow() {
        let page = read_page(backend, ds.name(), after).await?;
        let Some(last) = page.last() else { break };
        after = last.buffer_id;
        let full = page.len() == PAGE;
        let mut groups: BTreeMap<usize, Vec<Buffered>> = BTreeMap::new();
        for cell in page {
            if cell.young {
                continue;
            }
            groups
                .entry(ds.map().cluster_of(cell.shard))
                .or_default()
                .push(cell);
        }
        let outcomes = futures::future::join_all(
            groups
                .into_iter()
                .map(|(primary, cells)| deliver(topology, ds, holder, primary, cells)),
        )
        .await;
        for outcome in outcomes {
            match outcome {
                Ok(Delivered { done, waiting }) => {
                    delete(backend, ds.name(), &done).await?;
                    pass.deleted += done.len();
                    pass.awaiting_replicas += waiting;
                }
                Err(err) => {
                    tracing::debug!(datastore = %ds.name(), error = %err, "buffered cells wait for their primary");
                }
            }
        }
        if !full {
            break;
        }
    }
    Ok(pass)
}

/// Buffer rows after `after`, in buffer order.
async fn read_page(backend: &dyn Backend, datastore: &str, after: i64) -> Result<Vec<Buffered>> {
    let dialect = backend.dialect();
    let mut sql = Sql::new(dialect);
    sql.push("SELECT ")
        .idents([
            "buffer_id",
            "shard",
            "row_key",
            "column_name",
            "ref_key",
            "body",
            "created_at",
        ])
        // How old the copy is by the clock of the server that stamped it:
        // 0 under `MIN_AGE`, 1 under `REPLAY_AGE`, 2 older.
        .push(", CAST(CASE WHEN ")
        .ident("created_at")
        .push(" < ")
        .push(&dialect.now_minus_millis(REPLAY_AGE.as_millis() as u64))
        .push(" THEN 2 WHEN ")
        .ident("created_at")
        .push(" < ")
        .push(&dialect.now_minus_millis(MIN_AGE.as_millis() as u64))
        .push(&format!(
            " THEN 1 ELSE 0 END AS {}) FROM ",
            dialect.integer_cast()
        ))
        .ident(&ddl::buffer_table(datastore))
        .push(" WHERE ")
        .ident("buffer_id")
        .push(" > ")
        .bind(Value::Int(after))
        .push(" ORDER BY ")
        .ident("buffer_id")
        .push(&format!(" LIMIT {PAGE}"));
    type Row = (i64, i64, Uuid, String, i64, Vec<u8>, DateTime<Utc>, i64);
    let mut page = Vec::new();
    for (buffer_id, shard, row_key, column, ref_key, encoded, created_at, age) in
        backend.rows::<Row>(&sql).await?
    {
        page.push(Buffered {
            buffer_id,
            shard: shard as u32,
            key: CellKey {
                row_key,
                column,
                ref_key,
            },
            encoded,
            created_at,
            young: age == 0,
            settled: age == 2,
        });
    }
    Ok(page)
}

/// The outcome of [`deliver`].
struct Delivered {
    /// Buffer ids safe to delete.
    done: Vec<i64>,
    /// Copies kept until the primary's replicas have their cells.
    waiting: usize,
}

/// Commits buffered cells of one primary, records their conflicts, and
/// returns the buffer ids now safe to delete: those whose cells the
/// primary's master and every one of its replicas have. Fails, keeping
/// them all, while the primary cannot take them.
///
/// A copy outlives its write's commit for the loss it guards against: a
/// master that dies with its disk before its replicas have the cell. The
/// replica promoted then lacks the cell, and this replays the copy into
/// it, like any other buffered write.
async fn deliver(
    topology: &Topology,
    ds: &DatastoreRuntime,
    holder: usize,
    primary: usize,
    cells: Vec<Buffered>,
) -> Result<Delivered> {
    let cluster = &topology.clusters[primary];
    if let ClusterState::Refused(reason) = cluster.state() {
        return Err(Error::ClusterRefused {
            cluster: cluster.name.clone(),
            reason,
        });
    }
    let master = cluster.maintenance()?;
    // Rounds: the first buffered write of each key, then the second, …,
    // so the first in buffer order wins and the later ones meet it.
    let mut rounds: Vec<Vec<Prepared>> = Vec::new();
    let mut seen: HashMap<CellKey, usize> = HashMap::new();
    let mut origin: HashMap<usize, (i64, DateTime<Utc>)> = HashMap::new();
    // Per buffer id the shard of its cell; conflicts are done at once.
    let mut stored_copies: Vec<(i64, u32)> = Vec::with_capacity(cells.len());
    let mut done = Vec::new();
    // The highest `added_id` per shard among the cells the master has.
    let mut heads: BTreeMap<u32, i64> = BTreeMap::new();
    // Copies whose write may still be committing are only looked up.
    let (cells, unsettled): (Vec<Buffered>, Vec<Buffered>) =
        cells.into_iter().partition(|cell| cell.settled);
    if !unsettled.is_empty() {
        let table = ddl::cells_table(ds.name());
        let found = existing_bodies(master.as_ref(), &table, &unsettled, |c| &c.key).await?;
        for copy in &unsettled {
            let Some(stored) = found.get(&copy.key) else {
                continue;
            };
            if stored.body != copy.encoded {
                // Another body, or the same one encoded otherwise: judged
                // once the copy is old enough to replay.
                continue;
            }
            let head = heads.entry(stored.shard).or_insert(stored.added_id);
            *head = (*head).max(stored.added_id);
            stored_copies.push((copy.buffer_id, stored.shard));
        }
    }
    for (index, cell) in cells.into_iter().enumerate() {
        if let Err(err) = codec::decode(&cell.encoded) {
            // Bodies are checked to read back before they are buffered;
            // one that does not stays for an operator.
            tracing::error!(datastore = %ds.name(), row_key = %cell.key.row_key, error = %err, "a buffered cell cannot be decoded; it stays in the buffer");
            continue;
        }
        let round = seen.entry(cell.key.clone()).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        origin.insert(index, (cell.buffer_id, cell.created_at));
        rounds[*round].push(Prepared {
            index,
            shard: cell.shard,
            key: cell.key,
            // Replays wake index maintenance without bodies.
            indexed: None,
            encoded: cell.encoded,
        });
        *round += 1;
    }
    // Where replicas follow the master, most copies are of writes that
    // committed normally: meeting their cell is a release, not a replay.
    let replicated = !cluster.replicas.is_empty();
    for mut round in rounds {
        round.sort_by_key(|p| (p.shard, p.index));
        let (statuses, round_heads) = with_retry("replaying buffered cells", || {
            commit_primary(master.as_ref(), ds.name(), &round)
        })
        .await?;
        if statuses.iter().any(|s| matches!(s, Ok(PutStatus::Written))) {
            topology.events.committed(
                Written {
                    datastore: ds.name().to_string(),
                    cluster: primary,
                    heads: round_heads.clone(),
                    went_back: false,
                    ..Written::default()
                },
                master.dialect().has_notify(),
            );
        }
        for (shard, added_id) in round_heads {
            let head = heads.entry(shard).or_insert(added_id);
            *head = (*head).max(added_id);
        }
        let mut lost = Vec::new();
        for (cell, status) in round.iter().zip(statuses) {
            let buffer_id = origin[&cell.index].0;
            match status {
                Ok(PutStatus::Written) => {
                    ds.cells_written.fetch_add(1, Relaxed);
                    ds.cells_replayed.fetch_add(1, Relaxed);
                    stored_copies.push((buffer_id, cell.shard));
                }
                Ok(_) => {
                    if !replicated {
                        ds.cells_replayed.fetch_add(1, Relaxed);
                    }
                    stored_copies.push((buffer_id, cell.shard));
                }
                Err(err) if matches!(*err, Error::CellConflict { .. }) => {
                    lost.push(cell);
                    done.push(buffer_id);
                }
                // Moved away meanwhile: the next pass finds the new home.
                Err(err) if matches!(*err, Error::ShardMoving { .. }) => {}
                Err(err) => return Err(Error::unshare(err)),
            }
        }
        if !lost.is_empty() {
            let holder_name = &topology.clusters[holder].name;
            record_conflicts(master.as_ref(), ds, &lost, holder_name, &origin).await?;
        }
    }
    if !replicated {
        done.extend(stored_copies.iter().map(|(id, _)| *id));
        return Ok(Delivered { done, waiting: 0 });
    }
    let heads: Vec<(u32, i64)> = heads.into_iter().collect();
    let mut everywhere: Option<BTreeSet<u32>> = None;
    for (r, replica) in cluster.replicas.iter().enumerate() {
        let applied = match crate::replicas::applied_shards(replica.as_ref(), ds.name(), &heads)
            .await
        {
            Ok(applied) => applied,
            Err(err) => {
                tracing::debug!(cluster = %cluster.name, replica = r, error = %err, "cannot tell whether a replica has buffered cells; their copies stay");
                BTreeSet::new()
            }
        };
        everywhere = Some(match everywhere {
            None => applied,
            Some(so_far) => so_far.intersection(&applied).copied().collect(),
        });
    }
    let everywhere = everywhere.unwrap_or_default();
    let mut waiting = 0;
    for (buffer_id, shard) in stored_copies {
        if everywhere.contains(&shard) {
            done.push(buffer_id);
            ds.copies_released.fetch_add(1, Relaxed);
        } else {
            waiting += 1;
        }
    }
    Ok(Delivered { done, waiting })
}

/// The columns of `<ds>_conflicts`, in the order they are written and read.
const CONFLICT_COLUMNS: [&str; 9] = [
    "row_key",
    "column_name",
    "ref_key",
    "body_hash",
    "body",
    "stored_hash",
    "buffered_on",
    "buffered_at",
    "recorded_at",
];

/// A body's hash for conflict records: xxh3 of its JSON text, in hex.
fn body_hash(body: &serde_json::Value) -> String {
    let text = serde_json::to_vec(body).unwrap_or_default();
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(&text))
}

/// Records the losing writes of `lost` in `<ds>_conflicts` on their
/// primary; a conflict recorded before (a replay repeated after a crash)
/// is left as it is.
async fn record_conflicts(
    master: &dyn Backend,
    ds: &DatastoreRuntime,
    lost: &[&Prepared],
    buffered_on: &str,
    origin: &HashMap<usize, (i64, DateTime<Utc>)>,
) -> Result<()> {
    let stored = existing_bodies(master, &ddl::cells_table(ds.name()), lost, |c| &c.key).await?;
    let now = Value::DateTime(truncate_to_micros(Utc::now()));
    let dialect = master.dialect();
    for chunk in lost.chunks(MAX_PARAMS / 9) {
        let mut sql = Sql::new(dialect);
        sql.push(dialect.insert_ignore())
            .ident(&ddl::conflicts_table(ds.name()))
            .push(" (")
            .idents(CONFLICT_COLUMNS)
            .push(") ")
            .rows(chunk.iter().map(|cell| {
                let stored_hash = stored
                    .get(&cell.key)
                    .and_then(|stored| codec::decode(&stored.body).ok())
                    .map(|body| body_hash(&body))
                    .unwrap_or_default();
                vec![
                    Value::Uuid(cell.key.row_key),
                    Value::Text(cell.key.column.clone()),
                    Value::Int(cell.key.ref_key),
                    Value::Text(
                        codec::decode(&cell.encoded)
                            .map(|body| body_hash(&body))
                            .unwrap_or_default(),
                    ),
                    Value::Bytes(cell.encoded.clone()),
                    Value::Text(stored_hash),
                    Value::Text(buffered_on.to_string()),
                    Value::DateTime(origin[&cell.index].1),
                    now.clone(),
                ]
            }))
            .push(dialect.on_conflict_do_nothing());
        let recorded = master.execute(&sql).await?;
        ds.replay_conflicts.fetch_add(recorded, Relaxed);
    }
    for cell in lost {
        tracing::warn!(datastore = %ds.name(), row_key = %cell.key.row_key, column = %cell.key.column, ref_key = cell.key.ref_key, "a buffered write lost to another body of its key; recorded in the conflicts table");
    }
    Ok(())
}

/// Deletes delivered buffer rows.
async fn delete(backend: &dyn Backend, datastore: &str, ids: &[i64]) -> Result<()> {
    for chunk in ids.chunks(MAX_PARAMS) {
        let mut sql = Sql::new(backend.dialect());
        sql.push("DELETE FROM ")
            .ident(&ddl::buffer_table(datastore))
            .push(" WHERE ")
            .ident("buffer_id")
            .in_list(chunk.iter().map(|id| Value::Int(*id)));
        backend.execute(&sql).await?;
    }
    Ok(())
}

/// The recorded conflicts of a datastore on every ready cluster, newest
/// first, at most `limit`.
pub(crate) async fn list_conflicts(
    topology: &Topology,
    datastore: &str,
    limit: usize,
) -> Result<Vec<Conflict>> {
    let ds = topology.datastore(datastore)?;
    let mut all = Vec::new();
    for cluster in &topology.clusters {
        let backend = cluster.master()?;
        let mut sql = Sql::new(backend.dialect());
        sql.push("SELECT ")
            .idents(CONFLICT_COLUMNS)
            .push(" FROM ")
            .ident(&ddl::conflicts_table(ds.name()))
            .push(" ORDER BY ")
            .ident("recorded_at")
            .push(&format!(" DESC LIMIT {limit}"));
        type Row = (
            Uuid,
            Option<String>,
            i64,
            Option<String>,
            Option<Vec<u8>>,
            Option<String>,
            Option<String>,
            DateTime<Utc>,
            DateTime<Utc>,
        );
        for (
            row_key,
            column,
            ref_key,
            body_hash,
            body,
            stored_hash,
            buffered_on,
            buffered_at,
            recorded_at,
        ) in backend.rows::<Row>(&sql).await?
        {
            let key = CellKey {
                row_key,
                column: column.unwrap_or_default(),
                ref_key,
            };
            // A copy set aside because it could not be decoded keeps its
            // bytes there; the listing says so instead of failing.
            let body = match body {
                Some(bytes) => codec::decode(&bytes).unwrap_or_else(|_| {
                    serde_json::Value::String(format!("<undecodable: {} bytes>", bytes.len()))
                }),
                None => serde_json::Value::Null,
            };
            all.push(Conflict {
                body_hash: body_hash.unwrap_or_default(),
                stored_hash: stored_hash.unwrap_or_default(),
                buffered_on: buffered_on.unwrap_or_default(),
                key,
                body,
                buffered_at,
                recorded_at,
            });
        }
    }
    all.sort_by_key(|c| std::cmp::Reverse(c.recorded_at));
    all.truncate(limit);
    Ok(all)
}

/// A buffered copy whose body cannot be decoded: replay leaves it where it
/// is (and logs it each pass) until an operator sets it aside.
#[derive(Debug, Clone, PartialEq)]
pub struct UndecodableCopy {
    /// The cluster whose buffer holds it.
    pub cluster: String,
    pub buffer_id: i64,
    pub key: CellKey,
    pub bytes: usize,
    pub buffered_at: DateTime<Utc>,
    pub reason: String,
}

/// Every undecodable copy of `datastore` in the buffers of the ready
/// clusters, a page of [`PAGE`] rows at a time.
pub(crate) async fn list_undecodable(
    topology: &Topology,
    datastore: &str,
) -> Result<Vec<UndecodableCopy>> {
    let ds = topology.datastore(datastore)?;
    let mut found = Vec::new();
    for cluster in &topology.clusters {
        let backend = match cluster.master() {
            Ok(backend) => backend,
            Err(err) => {
                tracing::warn!(cluster = %cluster.name, error = %err, "the buffer of an unavailable cluster is not searched for undecodable copies");
                continue;
            }
        };
        let mut after = 0;
        loop {
            let page = read_page(backend.as_ref(), ds.name(), after).await?;
            let Some(last) = page.last() else { break };
            after = last.buffer_id;
            let full = page.len() == PAGE;
            for copy in page {
                if let Err(reason) = codec::decode(&copy.encoded) {
                    found.push(UndecodableCopy {
                        cluster: cluster.name.clone(),
                        buffer_id: copy.buffer_id,
                        key: copy.key,
                        bytes: copy.encoded.len(),
                        buffered_at: copy.created_at,
                        reason,
                    });
                }
            }
            if !full {
                break;
            }
        }
    }
    Ok(found)
}

/// Moves the undecodable copy `buffer_id` from the buffer of `cluster` to
/// the conflicts table on its primary (its bytes kept, `body_hash`
/// `undecodable`), so replay stops retrying it; refuses a copy that
/// decodes. The record is written before the copy is deleted, so a failure
/// in between leaves both, never neither.
pub(crate) async fn set_aside(
    topology: &Topology,
    datastore: &str,
    cluster: &str,
    buffer_id: i64,
) -> Result<CellKey> {
    let ds = topology.datastore(datastore)?;
    let holder = topology
        .clusters
        .iter()
        .find(|c| c.name == cluster)
        .ok_or_else(|| Error::BadInput(format!("no storage cluster is named `{cluster}`")))?;
    let backend = holder.master()?;
    let copy = read_page(backend.as_ref(), ds.name(), buffer_id - 1)
        .await?
        .into_iter()
        .next()
        .filter(|copy| copy.buffer_id == buffer_id)
        .ok_or_else(|| {
            Error::BadInput(format!(
                "the buffer of `{cluster}` holds no copy {buffer_id} of `{datastore}`"
            ))
        })?;
    if codec::decode(&copy.encoded).is_ok() {
        return Err(Error::BadInput(format!(
            "copy {buffer_id} on `{cluster}` decodes: replay delivers it, nothing to set aside"
        )));
    }
    let primary = topology.clusters[ds.map().cluster_of(copy.shard)].master()?;
    let dialect = primary.dialect();
    let mut sql = Sql::new(dialect);
    sql.push(dialect.insert_ignore())
        .ident(&ddl::conflicts_table(ds.name()))
        .push(" (")
        .idents(CONFLICT_COLUMNS)
        .push(") ")
        .rows([vec![
            Value::Uuid(copy.key.row_key),
            Value::Text(copy.key.column.clone()),
            Value::Int(copy.key.ref_key),
            Value::Text("undecodable".into()),
            Value::Bytes(copy.encoded.clone()),
            Value::Text(String::new()),
            Value::Text(cluster.to_string()),
            Value::DateTime(copy.created_at),
            Value::DateTime(truncate_to_micros(Utc::now())),
        ]])
        .push(dialect.on_conflict_do_nothing());
    primary.execute(&sql).await?;
    delete(backend.as_ref(), ds.name(), &[buffer_id]).await?;
    tracing::warn!(datastore = %ds.name(), cluster, buffer_id, row_key = %copy.key.row_key, "an undecodable buffered copy was set aside in the conflicts table");
    Ok(copy.key)
}
