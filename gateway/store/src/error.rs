//! The one error type of the `cellgate` library, with a stable code per
//! variant.
//!
//! Codes are what clients see (`extensions.code` in GraphQL, exit messages in
//! the CLI); they never change once published. `Display` texts are for
//! humans and for logs: storage errors keep their driver text out of
//! [`Error::client_message`], so SQL and file paths stay in the logs.

use uuid::Uuid;

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A cell with the same `(row_key, column, ref_key)` exists with a different body.
    #[error("cell ({row_key}, {column}, {ref_key}) already exists with a different body")]
    CellConflict {
        row_key: Uuid,
        column: String,
        ref_key: i64,
    },
    /// The datastore is not defined.
    #[error("unknown datastore `{0}`")]
    UnknownDatastore(String),
    /// The column is not declared in the datastore definition.
    #[error("unknown column `{column}` in datastore `{datastore}` (expected one of {expected})")]
    UnknownColumn {
        datastore: String,
        column: String,
        expected: String,
    },
    /// The index is not defined for the datastore.
    #[error("unknown index `{index}` in datastore `{datastore}`")]
    UnknownIndex { datastore: String, index: String },
    /// A cell body that cannot be stored (not a JSON object, too large).
    #[error("invalid body for cell ({row_key}, {column}, {ref_key}): {reason}")]
    InvalidBody {
        row_key: Uuid,
        column: String,
        ref_key: i64,
        reason: String,
    },
    /// A stored body that cannot be decoded.
    #[error("stored body of cell ({row_key}, {column}, {ref_key}) is corrupt: {reason}")]
    CorruptBody {
        row_key: Uuid,
        column: String,
        ref_key: i64,
        reason: String,
    },
    /// An index query without the index's shard field.
    #[error("index `{index}` needs its shard field `{field}` (equality or a short `in` list)")]
    ShardFieldRequired { index: String, field: String },
    /// A malformed or ill-typed query, filter or argument.
    #[error("{0}")]
    BadInput(String),
    /// A pagination cursor that was not produced by this query.
    #[error("invalid cursor: {0}")]
    InvalidCursor(String),
    /// A request larger than a configured limit.
    #[error("{what} exceeds the limit of {limit}")]
    LimitExceeded { what: String, limit: usize },
    /// The database of a cluster cannot be reached.
    #[error("storage cluster `{cluster}` is unavailable: {source}")]
    Unavailable {
        cluster: String,
        #[source]
        source: sqlx::Error,
    },
    /// A node whose circuit breaker is open: it failed too often in a row
    /// to be tried again before its cool-down ends and a probe succeeds.
    #[error(
        "storage cluster `{cluster}` is unavailable: its {node} is failing (circuit breaker open)"
    )]
    BreakerOpen { cluster: String, node: String },
    /// Every connection of a node's pool stayed in use for the whole
    /// acquire timeout: the node answers, the gateway asked too much of it
    /// at once. Transient, and not a failure of the node (its circuit
    /// breaker does not count it).
    #[error("storage cluster `{cluster}` is busy: no connection became free in time")]
    PoolBusy { cluster: String },
    /// Any other database error.
    #[error("storage error: {0}")]
    Storage(#[from] sqlx::Error),
    /// Invalid configuration or topology.
    #[error("configuration: {0}")]
    Config(String),
    /// An error shared by several cells of one failed shard transaction.
    #[error("{0}")]
    Shared(std::sync::Arc<Error>),
    /// Invalid datastore or index definitions.
    #[error("{0}")]
    Definitions(#[from] index_dsl::Diagnostics),
    /// A cluster that is not serving yet: unreachable at start-up and not
    /// prepared since, or refused by its catalog.
    #[error("storage cluster `{cluster}` is not serving: {reason}")]
    ClusterNotReady { cluster: String, reason: String },
    /// A cluster whose catalog disagrees with the definitions: it stays
    /// out of service until a restart with definitions that agree, so
    /// waiting does not help and a write to it is never buffered.
    #[error("storage cluster `{cluster}` is out of service: {reason}")]
    ClusterRefused { cluster: String, reason: String },
    /// The definitions or topology disagree with what a cluster's tables
    /// were built from (a new shard count, shards routed elsewhere).
    #[error("{0}")]
    Catalog(String),
    /// The store uses the per-shard table layout of earlier versions.
    #[error("{0}")]
    LayoutUpgradeRequired(String),
    /// New definitions that a running store cannot apply (a datastore or
    /// column removed, a new shard count); nothing was changed.
    #[error("{0}")]
    ReloadRefused(String),
    /// An index that is still being filled from the cell log.
    #[error("index `{index}` of `{datastore}` is still being built from the cell log ({pending} cells to go); retry when it is ready")]
    IndexBuilding {
        datastore: String,
        index: String,
        pending: i64,
    },
    /// A maintenance pass found that another process took its lease.
    #[error("lease `{0}` is held by another process")]
    LeaseLost(String),
    /// A verify that records its progress is already running on the
    /// datastore (`indexes/verify/lease.rs`).
    #[error("a verify of datastore `{datastore}` is already running ({holder}, its lease runs until {until} unless renewed): wait for it to end, or run a sampled verify, which records no progress")]
    VerifyRunning {
        datastore: String,
        holder: String,
        until: chrono::DateTime<chrono::Utc>,
    },
    /// A shard is moving to another cluster, or has moved and the route
    /// that reached this cluster was stale: its writes wait for the cut-over
    /// (`moves`), and the write is retried on the new route; this error
    /// reaches a client only when the cut-over did not end in time.
    #[error("shard {shard} of `{datastore}` is moving to another cluster; retry shortly")]
    ShardMoving { datastore: String, shard: u32 },
    /// This gateway could not read the stored topology for longer than a
    /// move waits for it, and a cluster it routes a read to no longer
    /// serves every shard it routes there: a move passed it by. Its reads
    /// of that cluster are refused until the topology is read again
    /// (`topology/fence.rs`).
    #[error("{}", topology_stale(datastore, cluster, *since))]
    TopologyStale {
        datastore: String,
        cluster: String,
        /// Seconds since the last acknowledgement (`None`: none since
        /// start-up).
        since: Option<u64>,
    },
    /// A shard move that cannot start or go on (another move is running, a
    /// range that is not where the move says, a target that is not ready).
    #[error("{0}")]
    Move(String),
    /// A biz tag that was never created (tags are created by `cellgate ids
    /// create-tag`, the `createIdTag` mutation or `ids.tags` in the
    /// configuration, never by a request for IDs).
    #[error("unknown biz tag `{0}`")]
    UnknownBizTag(String),
    /// IDs cannot be issued now: the segment table cannot be reached and
    /// the buffered segments are used up, or no snowflake worker id is held.
    #[error("ids unavailable: {0}")]
    IdSourceUnavailable(String),
    /// The clock is behind the last issued snowflake timestamp by more than
    /// the few milliseconds the generator waits out.
    #[error("the clock moved backwards by {behind_ms} ms; no ids are issued until it catches up")]
    ClockMovedBackwards { behind_ms: i64 },
    /// A broken invariant of the store (never caused by client input).
    #[error("internal error: {0}")]
    Internal(String),
}

fn topology_stale(datastore: &str, cluster: &str, since: Option<u64>) -> String {
    let since = match since {
        Some(seconds) => format!("for {seconds} s"),
        None => "since it started".to_string(),
    };
    format!("this gateway has not read the shard topology {since} (the metadata cluster does not answer it), and shards of `{datastore}` it routes to cluster `{cluster}` have moved away: retry, or ask another gateway")
}

impl Error {
    /// The stable machine-readable code of this error.
    pub fn code(&self) -> &'static str {
        match self {
            Error::CellConflict { .. } => "CELL_CONFLICT",
            Error::UnknownDatastore(_) => "UNKNOWN_DATASTORE",
            Error::UnknownColumn { .. } => "UNKNOWN_COLUMN",
            Error::UnknownIndex { .. } => "UNKNOWN_INDEX",
            Error::InvalidBody { .. } => "INVALID_BODY",
            Error::CorruptBody { .. } => "CORRUPT_BODY",
            Error::ShardFieldRequired { .. } => "SHARD_FIELD_REQUIRED",
            Error::BadInput(_) => "BAD_USER_INPUT",
            Error::InvalidCursor(_) => "INVALID_CURSOR",
            Error::LimitExceeded { .. } => "LIMIT_EXCEEDED",
            Error::Unavailable { .. } => "STORAGE_UNAVAILABLE",
            Error::BreakerOpen { .. } => "STORAGE_UNAVAILABLE",
            Error::PoolBusy { .. } => "STORAGE_UNAVAILABLE",
            Error::Storage(_) => "INTERNAL",
            Error::Config(_) => "CONFIG",
            Error::Definitions(_) => "INVALID_DEFINITIONS",
            Error::Shared(inner) => inner.code(),
            Error::ClusterNotReady { .. } => "STORAGE_UNAVAILABLE",
            Error::ClusterRefused { .. } => "CATALOG_MISMATCH",
            Error::Catalog(_) => "CATALOG_MISMATCH",
            Error::ReloadRefused(_) => "RELOAD_REFUSED",
            Error::LayoutUpgradeRequired(_) => "LAYOUT_UPGRADE_REQUIRED",
            Error::IndexBuilding { .. } => "INDEX_BUILDING",
            Error::LeaseLost(_) => "LEASE_LOST",
            Error::VerifyRunning { .. } => "VERIFY_RUNNING",
            Error::ShardMoving { .. } => "SHARD_MOVING",
            Error::TopologyStale { .. } => "TOPOLOGY_STALE",
            Error::Move(_) => "MOVE_REFUSED",
            Error::UnknownBizTag(_) => "UNKNOWN_BIZ_TAG",
            Error::IdSourceUnavailable(_) => "ID_SOURCE_UNAVAILABLE",
            Error::ClockMovedBackwards { .. } => "CLOCK_MOVED_BACKWARDS",
            Error::Internal(_) => "INTERNAL",
        }
    }

    /// The message safe to show a client: storage errors are reduced to
    /// their code so no SQL or path leaves the process.
    pub fn client_message(&self) -> String {
        match self {
            Error::Unavailable { cluster, .. } | Error::BreakerOpen { cluster, .. } => {
                format!("storage cluster `{cluster}` is unavailable")
            }
            Error::PoolBusy { cluster } => {
                format!("storage cluster `{cluster}` is busy; retry")
            }
            Error::Storage(_) | Error::Internal(_) | Error::LeaseLost(_) => {
                "internal storage error".to_string()
            }
            Error::ClusterNotReady { cluster, .. } => {
                format!("storage cluster `{cluster}` is unavailable")
            }
            Error::ClusterRefused { cluster, .. } => format!(
                "storage cluster `{cluster}` is out of service: its catalog disagrees with the definitions (see the gateway log)"
            ),
            Error::Shared(inner) => inner.client_message(),
            other => other.to_string(),
        }
    }

    /// True when the same request may succeed if it is sent again later,
    /// unchanged: a storage cluster could not be reached, did not answer in
    /// time or is not serving yet, or an index is still being built.
    /// Clients are told so (`extensions.retryable`); repeating a write is
    /// safe because writes are idempotent.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unavailable { .. }
            | Error::BreakerOpen { .. }
            | Error::PoolBusy { .. }
            | Error::ClusterNotReady { .. }
            | Error::IndexBuilding { .. }
            | Error::ShardMoving { .. }
            | Error::TopologyStale { .. }
            | Error::IdSourceUnavailable(_)
            | Error::ClockMovedBackwards { .. } => true,
            Error::Shared(inner) => inner.is_transient(),
            _ => false,
        }
    }

    /// Wraps a driver error, classifying connection failures as
    /// [`Error::Unavailable`].
    pub(crate) fn from_sqlx(cluster: &str, err: sqlx::Error) -> Error {
        if matches!(err, sqlx::Error::PoolTimedOut) {
            Error::PoolBusy {
                cluster: cluster.to_string(),
            }
        } else if is_unavailable(&err) {
            Error::Unavailable {
                cluster: cluster.to_string(),
                source: err,
            }
        } else {
            Error::Storage(err)
        }
    }

    /// Takes an error out of its `Arc` when it is the only owner.
    pub fn unshare(shared: std::sync::Arc<Error>) -> Error {
        std::sync::Arc::try_unwrap(shared).unwrap_or_else(Error::Shared)
    }

    /// True when a transaction failed only because of a concurrent one: a
    /// unique key inserted first, a deadlock, or a serialization failure.
    /// The caller retries the whole transaction.
    pub(crate) fn is_retryable(&self) -> bool {
        match self {
            Error::Storage(sqlx::Error::Database(db)) => {
                db.is_unique_violation() || matches!(db.code().as_deref(), Some("40001" | "40P01"))
            }
            _ => false,
        }
    }
}

/// Whether `err` says the connection a statement ran on was already lost
/// (the server restarted or dropped it while it sat in the pool), so the
/// same statement may succeed on a new connection at once. A statement
/// that got no answer in time is not retried: that would double the wait.
pub(crate) fn is_lost_connection(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(io) => io.kind() != std::io::ErrorKind::TimedOut,
        sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => false,
        other => is_unavailable(other),
    }
}

/// True for the errors that say the database could not be reached, went
/// away, is shutting down or starting up, or did not answer in time, as
/// opposed to errors about the statement. A connection that breaks
/// mid-statement shows up in several forms depending on when it broke: an
/// I/O error, a protocol error on a half-read message, or a final error
/// message from a server that is going down.
fn is_unavailable(err: &sqlx::Error) -> bool {
    match err {
        sqlx::Error::Io(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            if let Some(pg) = db.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                postgres_unavailable(pg.code())
            } else if let Some(my) = db.try_downcast_ref::<sqlx::mysql::MySqlDatabaseError>() {
                mysql_unavailable(my.number(), my.code())
            } else if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some() {
                // The extended result code, in decimal.
                db.code()
                    .and_then(|code| code.parse().ok())
                    .is_some_and(sqlite_unavailable)
            } else {
                false
            }
        }
        _ => false,
    }
}

/// PostgreSQL SQLSTATEs of a lost or refused connection: class 08
/// (connection exception), the shutdown and start-up codes of class 57
/// (57P01 admin shutdown, also sent as "terminating connection due to
/// unexpected postmaster exit"; 57P02 crash shutdown; 57P03 cannot connect
/// now; 57P05 idle session timeout), 53300 too many connections, and 25P03,
/// the session closed for idling in a transaction.
fn postgres_unavailable(sqlstate: &str) -> bool {
    sqlstate.starts_with("08")
        || matches!(
            sqlstate,
            "57P01" | "57P02" | "57P03" | "57P05" | "53300" | "25P03"
        )
}

/// MySQL/MariaDB error numbers of a lost or refused connection, and
/// SQLSTATE class 08 for any the list misses.
fn mysql_unavailable(number: u16, sqlstate: Option<&str>) -> bool {
    const UNAVAILABLE: &[u16] = &[
        1040, // ER_CON_COUNT_ERROR: too many connections
        1053, // ER_SERVER_SHUTDOWN: server shutdown in progress
        1152, // ER_ABORTING_CONNECTION
        1158, // ER_NET_READ_ERROR
        1159, // ER_NET_READ_INTERRUPTED
        1160, // ER_NET_ERROR_ON_WRITE
        1161, // ER_NET_WRITE_INTERRUPTED
        1184, // ER_NEW_ABORTING_CONNECTION
        1927, // ER_CONNECTION_KILLED (MariaDB)
        2002, // CR_CONNECTION_ERROR
        2003, // CR_CONN_HOST_ERROR
        2006, // CR_SERVER_GONE_ERROR: server has gone away
        2013, // CR_SERVER_LOST: lost connection during query
        2055, // CR_SERVER_LOST_EXTENDED
        3032, // ER_SERVER_OFFLINE_MODE
        4031, // ER_CLIENT_INTERACTION_TIMEOUT (MySQL 8)
    ];
    UNAVAILABLE.contains(&number) || sqlstate.is_some_and(|s| s.starts_with("08"))
}

/// SQLite result codes (extended codes keep the primary code in their low
/// byte) of a database file that cannot be used right now: SQLITE_BUSY
/// (locked by another process past the busy timeout), SQLITE_IOERR,
/// SQLITE_FULL, SQLITE_CANTOPEN and SQLITE_PROTOCOL (a WAL lock race).
fn sqlite_unavailable(code: i32) -> bool {
    const BUSY: i32 = 5;
    const IOERR: i32 = 10;
    const FULL: i32 = 13;
    const CANTOPEN: i32 = 14;
    const PROTOCOL: i32 = 15;
    matches!(code & 0xff, BUSY | IOERR | FULL | CANTOPEN | PROTOCOL)
}

#[cfg(test)]
mod tests {
    use sqlx::sqlite::SqliteConnectOptions;
    use sqlx::{ConnectOptions as _, Connection as _};

    use super::*;

    async fn sqlite(path: &std::path::Path) -> sqlx::SqliteConnection {
        SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .busy_timeout(std::time::Duration::ZERO)
            .connect()
            .await
            .expect("open sqlite")
    }

    // A SQLite file locked by another process past the busy timeout was
    // reported as an internal error, though a retry later can succeed.
    #[tokio::test]
    async fn sqlite_errors_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cells.db");
        let mut holder = sqlite(&path).await;
        let mut other = sqlite(&path).await;
        sqlx::query("CREATE TABLE t (k INTEGER PRIMARY KEY)")
            .execute(&mut holder)
            .await
            .unwrap();
        sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut holder)
            .await
            .unwrap();
        let busy = sqlx::query("BEGIN IMMEDIATE")
            .execute(&mut other)
            .await
            .expect_err("the file is locked");
        let busy = Error::from_sqlx("main", busy);
        assert_eq!(busy.code(), "STORAGE_UNAVAILABLE", "{busy:?}");
        assert!(busy.is_transient());

        sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut holder)
            .await
            .unwrap();
        let duplicate = sqlx::query("INSERT INTO t VALUES (1)")
            .execute(&mut holder)
            .await
            .expect_err("a duplicate key");
        let duplicate = Error::from_sqlx("main", duplicate);
        assert_eq!(duplicate.code(), "INTERNAL", "{duplicate:?}");
        assert!(duplicate.is_retryable() && !duplicate.is_transient());

        let syntax = sqlx::query("SELEKT 1")
            .execute(&mut holder)
            .await
            .expect_err("bad SQL");
        let syntax = Error::from_sqlx("main", syntax);
        assert_eq!(syntax.code(), "INTERNAL", "{syntax:?}");
        assert!(!syntax.is_transient());
        holder.close().await.unwrap();
    }

    #[test]
    fn sqlite_extended_codes_keep_their_primary_code() {
        // SQLITE_IOERR_WRITE, SQLITE_IOERR_FSYNC, SQLITE_CANTOPEN_ISDIR,
        // SQLITE_BUSY_SNAPSHOT, SQLITE_FULL.
        for code in [
            10 | (3 << 8),
            10 | (4 << 8),
            14 | (2 << 8),
            5 | (2 << 8),
            13,
        ] {
            assert!(sqlite_unavailable(code), "{code}");
        }
        // SQLITE_CONSTRAINT_UNIQUE, SQLITE_ERROR, SQLITE_CORRUPT,
        // SQLITE_READONLY, SQLITE_NOTADB.
        for code in [19 | (8 << 8), 1, 11, 8, 26] {
            assert!(!sqlite_unavailable(code), "{code}");
        }
    }

    #[test]
    fn unavailability_is_shared_with_the_cells_of_a_failed_transaction() {
        let lost = Error::from_sqlx("main", sqlx::Error::PoolClosed);
        let shared = Error::Shared(std::sync::Arc::new(lost));
        assert_eq!(shared.code(), "STORAGE_UNAVAILABLE");
        assert!(shared.is_transient());
        assert_eq!(
            shared.client_message(),
            "storage cluster `main` is unavailable"
        );
    }
}
