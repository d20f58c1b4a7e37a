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

pub mod ddl;
mod mysql;
mod postgres;
pub mod sql;
mod sqlite;
pub mod value;

use std::sync::Arc;

use async_trait::async_trait;

pub use sql::{Dialect, Sql, MAX_PARAMS};
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
}

/// An open transaction; dropped without `commit` it rolls back.
#[async_trait]
pub trait Tx: Send {
    async fn fetch(&mut self, sql: &Sql, cols: &[ColType]) -> Result<Vec<Row>>;

    async fn execute(&mut self, sql: &Sql) -> Result<u64>;

    /// Runs an `INSERT` into a table with an auto-increment key named
    /// `id_column` and returns the key it was given.
    async fn insert_returning_id(&mut self, sql: &Sql, id_column: &str) -> Result<i64>;

    async fn commit(self: Box<Self>) -> Result<()>;
}

/// Connection settings shared by all drivers.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Cluster name, for errors.
    pub cluster: String,
    /// Largest number of pooled connections.
    pub max_connections: u32,
    /// How long to wait for a connection before reporting the cluster unavailable.
    pub acquire_timeout: std::time::Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            cluster: "default".to_string(),
            max_connections: 16,
            acquire_timeout: std::time::Duration::from_secs(5),
        }
    }
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
/// supplies `bind`, `decode` and `insert_returning_id` functions, and the
/// statement that opens a write transaction when it is not plain `BEGIN`.
macro_rules! sqlx_backend {
    ($backend:ident, $tx:ident, $db:ty, $dialect:expr, $begin:expr) => {
        pub struct $backend {
            /// Pool for writes (a single connection on SQLite).
            writer: sqlx::Pool<$db>,
            /// Pool for reads outside transactions.
            reader: sqlx::Pool<$db>,
            cluster: String,
            /// Dropped with the backend, which stops its background tasks.
            _stop: Option<tokio::sync::oneshot::Sender<()>>,
        }

        pub struct $tx {
            tx: sqlx::Transaction<'static, $db>,
            cluster: String,
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
                let err = |e| $crate::Error::from_sqlx(&self.cluster, e);
                let rows = build(sql).fetch_all(&self.reader).await.map_err(err)?;
                decode_rows(rows, cols).map_err(err)
            }

            async fn execute(&self, sql: &$crate::storage::Sql) -> $crate::Result<u64> {
                let result = build(sql)
                    .execute(&self.writer)
                    .await
                    .map_err(|e| $crate::Error::from_sqlx(&self.cluster, e))?;
                Ok(result.rows_affected())
            }

            async fn begin(&self) -> $crate::Result<Box<dyn $crate::storage::Tx>> {
                let begin: Option<&'static str> = $begin;
                let tx = match begin {
                    Some(statement) => self.writer.begin_with(statement).await,
                    None => self.writer.begin().await,
                }
                .map_err(|e| $crate::Error::from_sqlx(&self.cluster, e))?;
                Ok(Box::new($tx {
                    tx,
                    cluster: self.cluster.clone(),
                }))
            }

            async fn ping(&self) -> $crate::Result<()> {
                sqlx::query("SELECT 1")
                    .execute(&self.reader)
                    .await
                    .map_err(|e| $crate::Error::from_sqlx(&self.cluster, e))?;
                Ok(())
            }
        }

        #[async_trait::async_trait]
        impl $crate::storage::Tx for $tx {
            async fn fetch(
                &mut self,
                sql: &$crate::storage::Sql,
                cols: &[$crate::storage::ColType],
            ) -> $crate::Result<Vec<$crate::storage::Row>> {
                let cluster = &self.cluster;
                let err = |e| $crate::Error::from_sqlx(cluster, e);
                let rows = build(sql).fetch_all(&mut *self.tx).await.map_err(err)?;
                decode_rows(rows, cols).map_err(err)
            }

            async fn execute(&mut self, sql: &$crate::storage::Sql) -> $crate::Result<u64> {
                let result = build(sql)
                    .execute(&mut *self.tx)
                    .await
                    .map_err(|e| $crate::Error::from_sqlx(&self.cluster, e))?;
                Ok(result.rows_affected())
            }

            async fn insert_returning_id(
                &mut self,
                sql: &$crate::storage::Sql,
                id_column: &str,
            ) -> $crate::Result<i64> {
                insert_returning_id(&mut self.tx, sql, id_column)
                    .await
                    .map_err(|e| $crate::Error::from_sqlx(&self.cluster, e))
            }

            async fn commit(self: Box<Self>) -> $crate::Result<()> {
                let cluster = self.cluster;
                self.tx
                    .commit()
                    .await
                    .map_err(|e| $crate::Error::from_sqlx(&cluster, e))
            }
        }
    };
}

pub(crate) use sqlx_backend;
