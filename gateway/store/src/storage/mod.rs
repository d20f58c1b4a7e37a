//! The storage boundary: the [`Backend`] trait and its SQLite, MySQL/MariaDB
//! and PostgreSQL implementations.
//!
//! A backend is one database (the master or a replica of a cluster). It runs
//! statements built with [`Sql`] and returns rows as [`Value`]s, decoded by
//! the column types the caller expects. Everything dialect-specific lives
//! here: connection tuning, native type binding, DDL (`ddl.rs`) and the few
//! SQL differences (`sql.rs`). The rest of the crate reaches databases only
//! through this trait.
//!
//! The three implementations share their statement plumbing through the
//! `sqlx_backend!` macro: sqlx's traits make one generic implementation
//! possible only with long higher-ranked bounds on every function, while the
//! per-driver parts (binding, decoding, connecting, insert ids) are small and
//! written out in each driver's file.
//!
//! No request waits on a server database without bound: the pool's acquire
//! timeout limits the wait for a connection, and every statement is waited
//! for at most the statement timeout ([`Timeouts`], `storage.timeout_ms`),
//! after which its connection is closed. Driver errors become
//! [`crate::Error`]s through `Error::from_sqlx`, which tells a lost or
//! unreachable database (`STORAGE_UNAVAILABLE`) from a failed statement.
//! On server databases a circuit breaker per node (`breaker.rs`) wraps the
//! backends, so a node that stopped answering costs that wait only until
//! the breaker opens.

pub mod breaker;
pub mod ddl;
mod mysql;
mod pool;
mod postgres;
mod row;
pub mod sql;
mod sqlite;
pub mod value;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

pub use row::{FromRow, FromValue};
pub use sql::{Assign, Dialect, Sql, MAX_PARAMS};
pub use value::{ColType, Value};

use crate::error::Result;

/// One row as decoded values, in the order of the `cols` asked for.
pub type Row = Vec<Value>;

/// A database the cell store runs statements on.
#[async_trait]
pub trait Backend: Send + Sync + 'static {
    fn dialect(&self) -> Dialect;

    /// The cluster this database belongs to, for errors and logs.
    fn cluster(&self) -> &str;

    /// Runs a query outside any explicit transaction.
    async fn fetch(&self, sql: &Sql, cols: &[ColType]) -> Result<Vec<Row>>;

    /// Runs a statement outside any explicit transaction; returns rows affected.
    async fn execute(&self, sql: &Sql) -> Result<u64>;

    /// Starts a write transaction.
    async fn begin(&self) -> Result<Box<dyn Tx>>;

    /// Checks the database answers.
    async fn ping(&self) -> Result<()>;

    /// Statements sent so far, `BEGIN` and `COMMIT` included: what a
    /// request costs the database, for metrics and benchmarks.
    fn statements(&self) -> u64;

    /// Closes every connection and waits until they are closed (on SQLite,
    /// the last one checkpoints the WAL into the database file). Calls
    /// after it fail as if the database had gone away.
    async fn close(&self);

    /// The state of the circuit breaker in front of this database, if it
    /// has one (`breaker.rs`).
    fn breaker(&self) -> Option<breaker::BreakerStatus> {
        None
    }

    /// The same database for index maintenance, when it is not a pool of
    /// its own: on SQLite, the same connections, whose write transactions
    /// go ahead of the queued ones of requests (`sqlite.rs`).
    fn maintenance_lane(&self) -> Option<Arc<dyn Backend>> {
        None
    }
}

/// An open transaction; dropped without `commit` it rolls back.
#[async_trait]
pub trait Tx: Send {
    async fn fetch(&mut self, sql: &Sql, cols: &[ColType]) -> Result<Vec<Row>>;

    async fn execute(&mut self, sql: &Sql) -> Result<u64>;

    async fn commit(self: Box<Self>) -> Result<()>;
}

/// Connection settings shared by all drivers.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Cluster name, for errors.
    pub cluster: String,
    /// Largest number of pooled connections.
    pub max_connections: u32,
    /// How long to wait for a connection, opening one included, before
    /// reporting the cluster unavailable.
    pub acquire_timeout: Duration,
    /// How long a server database may take to answer one statement (a
    /// commit included) before the cluster is reported unavailable; the
    /// connection is then closed rather than reused. SQLite, a local file,
    /// waits on its own busy timeout instead.
    pub statement_timeout: Duration,
    /// Connections for background work that runs beside the pools of the
    /// requests (an index verify): they log no slow statements (a
    /// throttled run's statements are slow by design), and on SQLite they
    /// leave the WAL checkpoints to the foreground's backend.
    pub background: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        let timeouts = Timeouts::default();
        ConnectOptions {
            cluster: "default".to_string(),
            max_connections: 16,
            acquire_timeout: timeouts.acquire,
            statement_timeout: timeouts.statement,
            background: false,
        }
    }
}

/// How long a request waits on a database before its cluster is reported
/// unavailable (`STORAGE_UNAVAILABLE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// For a pooled connection, opening one included.
    pub acquire: Duration,
    /// For the answer to one statement.
    pub statement: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            acquire: Duration::from_secs(5),
            statement: Duration::from_secs(5),
        }
    }
}

/// Waits for `work`, at most `limit` when there is one; `None` when the
/// database did not answer in time.
async fn answered<T>(limit: Option<Duration>, work: impl Future<Output = T>) -> Option<T> {
    match limit {
        None => Some(work.await),
        Some(limit) => tokio::time::timeout(limit, work).await.ok(),
    }
}

/// The result of a statement waited for by [`answered`] on `conn`. A
/// connection that did not answer in time, or whose error says it is lost,
/// is closed when it is dropped instead of going back to the pool.
fn settle<DB: sqlx::Database, T>(
    conn: &mut pool::Conn<DB>,
    outcome: Option<Result<T, sqlx::Error>>,
    limit: Option<Duration>,
) -> Result<T, sqlx::Error> {
    match outcome {
        None => {
            conn.discard();
            Err(no_answer(limit.unwrap_or_default()))
        }
        Some(Err(e)) if matches!(e, sqlx::Error::Io(_)) || crate::error::is_lost_connection(&e) => {
            conn.discard();
            Err(e)
        }
        Some(result) => {
            conn.settled();
            result
        }
    }
}

/// The error of a statement that got no answer within `limit`: an I/O
/// timeout, which [`crate::Error::from_sqlx`] reports as unavailability.
pub(crate) fn no_answer(limit: Duration) -> sqlx::Error {
    sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no answer from the database within {} ms",
            limit.as_millis()
        ),
    ))
}

/// The span of one statement, for traces: the database system, the
/// cluster and the statement's verb, never its text or its values.
/// Disabled, as it is unless traces are exported, it costs nothing.
pub(crate) fn statement_span(dialect: Dialect, cluster: &str, sql: &Sql) -> tracing::Span {
    let verb = || {
        sql.text()
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase()
    };
    tracing::debug_span!(
        "db",
        otel.name = verb(),
        otel.kind = "client",
        db.system.name = match dialect {
            Dialect::Sqlite => "sqlite",
            Dialect::MySql => "mysql",
            Dialect::Postgres => "postgresql",
        },
        db.operation.name = verb(),
        cellgate.cluster = cluster,
    )
}

/// Opens the database at `url` (`sqlite:`, `mysql:`/`mariadb:`, `postgres:`).
/// Server pools connect lazily, so a database that is down at start-up is
/// reported by the requests that need it, not by refusing to start.
pub async fn connect(url: &str, options: &ConnectOptions) -> Result<Arc<dyn Backend>> {
    let scheme = url.split(':').next().unwrap_or_default();
    match scheme {
        "sqlite" => Ok(Arc::new(sqlite::SqliteBackend::connect(url, options).await?)),
        "mysql" | "mariadb" => Ok(Arc::new(mysql::MySqlBackend::connect(url, options).await?)),
        "postgres" | "postgresql" => Ok(Arc::new(
            postgres::PostgresBackend::connect(url, options).await?,
        )),
        _ => Err(crate::Error::Config(format!(
            "unsupported database url scheme `{scheme}` (expected sqlite:, mysql:, mariadb: or postgres:)"
        ))),
    }
}

/// Implements [`Backend`] and [`Tx`] for one sqlx driver. The driver module
/// supplies `bind` and `decode` functions, and the statement that opens a
/// write transaction when it is not plain `BEGIN`.
///
/// Every statement runs on a connection taken from the pool here (the
/// pool's acquire timeout bounds the wait for it) and is waited for at most
/// `statement_timeout`; a connection that does not answer in time is closed
/// (see [`settle`]). A transaction is a pooled connection with sqlx's
/// transaction manager rather than `sqlx::Transaction`, so that a
/// transaction whose connection stopped answering can close it too.
macro_rules! sqlx_backend {
    ($backend:ident, $tx:ident, $db:ty, $dialect:expr, $begin:expr) => {
        pub struct $backend {
            /// Pool for writes (a single connection on SQLite).
            writer: $crate::storage::pool::Pool<$db>,
            /// Pool for reads outside transactions.
            reader: $crate::storage::pool::Pool<$db>,
            cluster: String,
            /// Longest wait for the answer to one statement; `None` on SQLite.
            statement_timeout: Option<std::time::Duration>,
            /// Statements sent, shared with the transactions.
            statements: std::sync::Arc<std::sync::atomic::AtomicU64>,
            /// Dropped with the backend or taken by `close`, which stops
            /// its background tasks.
            stop: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
            /// Writes go ahead of the ordinary writers waiting for the
            /// writer pool, if it has a lane (`Pool::with_lane`).
            first: bool,
            /// Opened with [`ConnectOptions::background`].
            background: bool,
        }

        /// An open transaction on one pooled connection.
        pub struct $tx {
            conn: $crate::storage::pool::Conn<$db>,
            /// Until committed: dropping the transaction rolls it back.
            open: bool,
            cluster: String,
            statement_timeout: Option<std::time::Duration>,
            statements: std::sync::Arc<std::sync::atomic::AtomicU64>,
        }

        /// How many times a statement may be tried when it keeps finding
        /// its connection lost: once per connection the pool can hold, plus
        /// a new one, when repeating it is safe; once otherwise.
        fn lost_connection_attempts(
            pool: &$crate::storage::pool::Pool<$db>,
            repeatable: bool,
        ) -> u32 {
            if repeatable {
                pool.max_size() + 1
            } else {
                1
            }
        }

        fn count(statements: &std::sync::atomic::AtomicU64) {
            statements.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }

        type Manager = <$db as sqlx::Database>::TransactionManager;

        impl Drop for $tx {
            fn drop(&mut self) {
                if self.open {
                    // Queued, and sent before the connection is lent again.
                    <Manager as sqlx::TransactionManager>::start_rollback(&mut *self.conn);
                    self.conn.queued();
                }
            }
        }

        fn build<'q>(
            sql: &'q $crate::storage::Sql,
        ) -> sqlx::query::Query<'q, $db, <$db as sqlx::Database>::Arguments<'q>> {
            let mut query = sqlx::query(sql.text());
            for value in sql.params() {
                query = bind(query, value);
            }
            query
        }

        fn decode_rows(
            rows: Vec<<$db as sqlx::Database>::Row>,
            cols: &[$crate::storage::ColType],
        ) -> Result<Vec<$crate::storage::Row>, sqlx::Error> {
            rows.iter()
                .map(|row| {
                    cols.iter()
                        .enumerate()
                        .map(|(i, ty)| decode(row, i, *ty))
                        .collect()
                })
                .collect()
        }

        impl $backend {
            fn error(&self, err: sqlx::Error) -> $crate::Error {
                $crate::Error::from_sqlx(&self.cluster, err)
            }

            async fn acquire(
                &self,
                pool: &$crate::storage::pool::Pool<$db>,
            ) -> $crate::Result<$crate::storage::pool::Conn<$db>> {
                pool.acquire().await.map_err(|e| self.error(e))
            }

            async fn acquire_writer(&self) -> $crate::Result<$crate::storage::pool::Conn<$db>> {
                let conn = if self.first {
                    self.writer.acquire_first().await
                } else {
                    self.writer.acquire().await
                };
                conn.map_err(|e| self.error(e))
            }
        }

        #[async_trait::async_trait]
        impl $crate::storage::Backend for $backend {
            fn dialect(&self) -> $crate::storage::Dialect {
                $dialect
            }

            fn cluster(&self) -> &str {
                &self.cluster
            }

            async fn fetch(
                &self,
                sql: &$crate::storage::Sql,
                cols: &[$crate::storage::ColType],
            ) -> $crate::Result<Vec<$crate::storage::Row>> {
                let limit = self.statement_timeout;
                // The pool lends idle connections without a test round
                // trip (`pool.rs`), so ones the server dropped meanwhile
                // (all of them, after a restart) fail here; a plain read is
                // repeated on another connection, at most once per pooled
                // connection.
                let mut attempts = lost_connection_attempts(&self.reader, sql.is_plain_read());
                let rows = loop {
                    let mut conn = self.acquire(&self.reader).await?;
                    count(&self.statements);
                    let outcome = tracing::Instrument::instrument(
                        $crate::storage::answered(limit, build(sql).fetch_all(conn.start())),
                        $crate::storage::statement_span($dialect, &self.cluster, sql),
                    )
                    .await;
                    match $crate::storage::settle(&mut conn, outcome, limit) {
                        // `settle` closes the lost connection.
                        Err(e) if attempts > 1 && $crate::error::is_lost_connection(&e) => {
                            attempts -= 1;
                        }
                        other => break other.map_err(|e| self.error(e))?,
                    }
                };
                decode_rows(rows, cols).map_err(|e| self.error(e))
            }

            async fn execute(&self, sql: &$crate::storage::Sql) -> $crate::Result<u64> {
                let limit = self.statement_timeout;
                let mut conn = self.acquire_writer().await?;
                count(&self.statements);
                let outcome = tracing::Instrument::instrument(
                    $crate::storage::answered(limit, build(sql).execute(conn.start())),
                    $crate::storage::statement_span($dialect, &self.cluster, sql),
                )
                .await;
                let result = $crate::storage::settle(&mut conn, outcome, limit)
                    .map_err(|e| self.error(e))?;
                Ok(result.rows_affected())
            }

            async fn begin(&self) -> $crate::Result<Box<dyn $crate::storage::Tx>> {
                let limit = self.statement_timeout;
                let statement: Option<&'static str> = $begin;
                // As in `fetch`: nothing has run yet, so a `BEGIN` that
                // finds its connection lost is repeated on another one.
                let mut attempts = lost_connection_attempts(&self.writer, true);
                let conn = loop {
                    let mut conn = self.acquire_writer().await?;
                    count(&self.statements);
                    let begin = <Manager as sqlx::TransactionManager>::begin(
                        conn.start(),
                        statement.map(std::borrow::Cow::Borrowed),
                    );
                    let outcome = $crate::storage::answered(limit, begin).await;
                    match $crate::storage::settle(&mut conn, outcome, limit) {
                        Ok(()) => break conn,
                        Err(e) if attempts > 1 && $crate::error::is_lost_connection(&e) => {
                            attempts -= 1;
                        }
                        Err(e) => return Err(self.error(e)),
                    }
                };
                Ok(Box::new($tx {
                    conn,
                    open: true,
                    cluster: self.cluster.clone(),
                    statement_timeout: limit,
                    statements: self.statements.clone(),
                }))
            }

            async fn ping(&self) -> $crate::Result<()> {
                let limit = self.statement_timeout;
                let mut conn = self.acquire(&self.reader).await?;
                let outcome =
                    $crate::storage::answered(limit, sqlx::query("SELECT 1").execute(conn.start()))
                        .await;
                $crate::storage::settle(&mut conn, outcome, limit).map_err(|e| self.error(e))?;
                Ok(())
            }

            fn statements(&self) -> u64 {
                self.statements.load(std::sync::atomic::Ordering::Relaxed)
            }

            fn maintenance_lane(&self) -> Option<std::sync::Arc<dyn $crate::storage::Backend>> {
                self.lane()
            }

            async fn close(&self) {
                let stop = self.stop.lock().map(|mut s| s.take()).unwrap_or(None);
                if let Some(stop) = stop {
                    let _ = stop.send(());
                }
                self.reader.close().await;
                // The writer is the last open connection now.
                Self::closing(&self.writer, self.background).await;
                self.writer.close().await;
            }
        }

        impl $tx {
            fn error(&self, err: sqlx::Error) -> $crate::Error {
                $crate::Error::from_sqlx(&self.cluster, err)
            }
        }

        #[async_trait::async_trait]
        impl $crate::storage::Tx for $tx {
            async fn fetch(
                &mut self,
                sql: &$crate::storage::Sql,
                cols: &[$crate::storage::ColType],
            ) -> $crate::Result<Vec<$crate::storage::Row>> {
                let limit = self.statement_timeout;
                count(&self.statements);
                let outcome = tracing::Instrument::instrument(
                    $crate::storage::answered(limit, build(sql).fetch_all(self.conn.start())),
                    $crate::storage::statement_span($dialect, &self.cluster, sql),
                )
                .await;
                let rows = $crate::storage::settle(&mut self.conn, outcome, limit)
                    .map_err(|e| self.error(e))?;
                decode_rows(rows, cols).map_err(|e| self.error(e))
            }

            async fn execute(&mut self, sql: &$crate::storage::Sql) -> $crate::Result<u64> {
                let limit = self.statement_timeout;
                count(&self.statements);
                let outcome = tracing::Instrument::instrument(
                    $crate::storage::answered(limit, build(sql).execute(self.conn.start())),
                    $crate::storage::statement_span($dialect, &self.cluster, sql),
                )
                .await;
                let result = $crate::storage::settle(&mut self.conn, outcome, limit)
                    .map_err(|e| self.error(e))?;
                Ok(result.rows_affected())
            }

            async fn commit(mut self: Box<Self>) -> $crate::Result<()> {
                let limit = self.statement_timeout;
                count(&self.statements);
                let outcome = $crate::storage::answered(
                    limit,
                    <Manager as sqlx::TransactionManager>::commit(self.conn.start()),
                )
                .await;
                $crate::storage::settle(&mut self.conn, outcome, limit)
                    .map_err(|e| self.error(e))?;
                self.open = false;
                Ok(())
            }
        }
    };
}

pub(crate) use sqlx_backend;

/// `url` with any password replaced by `***`, for printing.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    match rest[..at].split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod redact_tests {
    use super::redact_url as redact;

    #[test]
    fn redact_hides_only_the_password() {
        assert_eq!(
            redact("mysql://u:secret@h:3306/db"),
            "mysql://u:***@h:3306/db"
        );
        assert_eq!(redact("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact("sqlite://./data/x.db"), "sqlite://./data/x.db");
    }
}
