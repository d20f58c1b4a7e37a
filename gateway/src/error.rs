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
    /// The definitions or topology disagree with what a cluster's tables
    /// were built from (a new shard count, shards routed elsewhere).
    #[error("{0}")]
    Catalog(String),
    /// The store uses the per-shard table layout of earlier versions.
    #[error("{0}")]
    LayoutUpgradeRequired(String),
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
    /// A broken invariant of the store (never caused by client input).
    #[error("internal error: {0}")]
    Internal(String),
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
            Error::Storage(_) => "INTERNAL",
            Error::Config(_) => "CONFIG",
            Error::Definitions(_) => "INVALID_DEFINITIONS",
            Error::Shared(inner) => inner.code(),
            Error::ClusterNotReady { .. } => "STORAGE_UNAVAILABLE",
            Error::Catalog(_) => "CATALOG_MISMATCH",
            Error::LayoutUpgradeRequired(_) => "LAYOUT_UPGRADE_REQUIRED",
            Error::IndexBuilding { .. } => "INDEX_BUILDING",
            Error::LeaseLost(_) => "LEASE_LOST",
            Error::Internal(_) => "INTERNAL",
        }
    }

    /// True when the error says a database could not be reached (the
    /// request may succeed later), as opposed to a refusal of the request.
    pub fn is_unavailable(&self) -> bool {
        match self {
            Error::Unavailable { .. } | Error::ClusterNotReady { .. } => true,
            Error::Shared(inner) => inner.is_unavailable(),
            _ => false,
        }
    }

    /// The message safe to show a client: storage errors are reduced to
    /// their code so no SQL or path leaves the process.
    pub fn client_message(&self) -> String {
        match self {
            Error::Unavailable { cluster, .. } => {
                format!("storage cluster `{cluster}` is unavailable")
            }
            Error::Storage(_) | Error::Internal(_) | Error::LeaseLost(_) => {
                "internal storage error".to_string()
            }
            Error::ClusterNotReady { cluster, .. } => {
                format!("storage cluster `{cluster}` is unavailable")
            }
            Error::Shared(inner) => inner.client_message(),
            other => other.to_string(),
        }
    }

    /// Wraps a driver error, classifying connection failures as
    /// [`Error::Unavailable`].
    pub(crate) fn from_sqlx(cluster: &str, err: sqlx::Error) -> Error {
        if is_unavailable(&err) {
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

fn is_unavailable(err: &sqlx::Error) -> bool {
    matches!(
        err,
        sqlx::Error::Io(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::Tls(_)
            | sqlx::Error::WorkerCrashed
    )
}
