//! The database a local run uses: the embedded SQLite file (a temporary
//! directory or `--data`) or a server database (`--database`), its
//! emptiness check and its size after loading.
//!
//! The statements go through `storage::Backend` like everything else that
//! touches a database; they read catalogs only (`sqlite_master`,
//! `information_schema`, `pg_class`) and the first row of `trips_cells`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::dataset::DATASTORE;
use cellgate_store::storage::redact_url as redact;
use cellgate_store::storage::{self, ColType, ConnectOptions, Dialect, Sql, Value};
use cellgate_store::StorageConfig;

/// The database of a local run.
pub struct Database {
    /// What the store opens, e.g. `sqlite:///tmp/x/cellgate.db`.
    pub url: String,
    pub dialect: Dialect,
    /// The data directory of the embedded store (`--data` of the server);
    /// `None` for a `--database` URL.
    pub embedded_dir: Option<PathBuf>,
}

/// How large the store is.
#[derive(Debug, Clone, Serialize)]
pub struct StorageFigures {
    /// Bytes on disk: the SQLite file and its WAL; a server database's
    /// own estimate (PostgreSQL: `pg_database_size`; MySQL/MariaDB: data
    /// and index length from `information_schema`, which InnoDB updates
    /// lazily).
    pub bytes: Option<u64>,
    /// For SQLite, the database file and the WAL separately.
    pub sqlite_db_bytes: Option<u64>,
    pub sqlite_wal_bytes: Option<u64>,
    /// Tables in the database (schema, on PostgreSQL).
    pub tables: i64,
    /// Tables, indexes and other schema objects: `sqlite_master` rows, or
    /// tables plus indexes on a server.
    pub schema_objects: i64,
}

impl Database {
    /// The embedded SQLite store in `dir`.
    pub fn embedded(dir: &Path) -> Database {
        Database {
            url: StorageConfig::embedded(dir).clusters[0].master.clone(),
            dialect: Dialect::Sqlite,
            embedded_dir: Some(dir.to_path_buf()),
        }
    }

    /// The database at `url`.
    pub fn server(url: &str) -> anyhow::Result<Database> {
        let scheme = url.split(':').next().unwrap_or_default();
        let dialect = match scheme {
            "sqlite" => Dialect::Sqlite,
            "mysql" | "mariadb" => Dialect::MySql,
            "postgres" | "postgresql" => Dialect::Postgres,
            _ => anyhow::bail!(
                "unsupported database URL `{}` (expected mysql://, mariadb://, postgres:// or sqlite://)",
                redact(url)
            ),
        };
        Ok(Database {
            url: url.to_string(),
            dialect,
            embedded_dir: None,
        })
    }

    /// The storage configuration of the in-process store.
    pub fn storage(&self) -> StorageConfig {
        match &self.embedded_dir {
            Some(dir) => StorageConfig::embedded(dir),
            None => StorageConfig::single(&self.url),
        }
    }

    /// `sqlite`, `mysql` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        self.dialect.name()
    }

    /// The SQLite file, for its size.
    fn sqlite_file(&self) -> Option<PathBuf> {
        if self.dialect != Dialect::Sqlite {
            return None;
        }
        let rest = self.url.strip_prefix("sqlite:")?;
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let path = rest.split('?').next().unwrap_or(rest);
        Some(PathBuf::from(path))
    }

    async fn connect(&self) -> anyhow::Result<std::sync::Arc<dyn storage::Backend>> {
        let options = ConnectOptions {
            cluster: "main".to_string(),
            max_connections: 1,
            ..ConnectOptions::default()
        };
        storage::connect(&self.url, &options)
            .await
            .map_err(|e| anyhow::anyhow!("cannot open the database {}: {e}", redact(&self.url)))
    }

    /// Refuses a database that already holds trips: the load would
    /// collide with them, and the figures would describe other data.
    pub async fn ensure_empty(&self) -> anyhow::Result<()> {
        if self.sqlite_file().is_some_and(|file| !file.exists()) {
            return Ok(());
        }
        let backend = self.connect().await?;
        let table = storage::ddl::cells_table(DATASTORE);
        let found = backend
            .fetch(&self.dialect.table_exists(&table), &[ColType::Text])
            .await
            .map_err(|e| anyhow::anyhow!("cannot read the database {}: {e}", redact(&self.url)))?;
        if found.is_empty() {
            return Ok(());
        }
        let mut sql = Sql::new(self.dialect);
        sql.push("SELECT COUNT(*) FROM (SELECT 1 AS one FROM ")
            .ident(&table)
            .push(" LIMIT 1) probe");
        let rows = backend
            .fetch(&sql, &[ColType::Int])
            .await
            .map_err(|e| anyhow::anyhow!("cannot read `{table}`: {e}"))?;
        let has_rows = rows
            .first()
            .and_then(|r| r.first())
            .and_then(|v| v.as_int())
            .unwrap_or(0)
            > 0;
        anyhow::ensure!(
            !has_rows,
            "the database {} already holds trips (`{table}` has rows); the benchmark \
             needs an empty database so that its figures describe its own data",
            redact(&self.url)
        );
        Ok(())
    }

    /// Waits until no process holds an index maintenance lease on the
    /// store, at most `timeout`; how long it waited. A process that stopped
    /// releases its leases as it exits; one that was killed leaves them to
    /// expire. Either way the next process to run a measured phase then
    /// finds every lease free and maintains every shard from its start.
    /// Snowflake worker leases are not counted: a stopped gateway keeps
    /// its worker id until it expires, by design, and it has no bearing on
    /// index maintenance.
    pub async fn wait_idle(&self, timeout: Duration) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let backend = self.connect().await?;
        let exists = backend
            .fetch(
                &self.dialect.table_exists(storage::ddl::LEASES_TABLE),
                &[ColType::Text],
            )
            .await
            .map_err(|e| anyhow::anyhow!("cannot look for the lease table: {e}"))?;
        if exists.is_empty() {
            return Ok(started.elapsed());
        }
        loop {
            let mut sql = Sql::new(self.dialect);
            sql.push("SELECT COUNT(*) FROM ")
                .ident(storage::ddl::LEASES_TABLE)
                .push(" WHERE ")
                .ident("expires_at")
                .push(" > ")
                .bind(Value::DateTime(chrono::Utc::now()))
                .push(" AND ")
                .ident("name")
                .push(" NOT LIKE ")
                .bind(Value::Text("snowflake-worker-%".to_string()));
            let held = backend
                .fetch(&sql, &[ColType::Int])
                .await
                .map_err(|e| anyhow::anyhow!("cannot read the leases: {e}"))?
                .first()
                .and_then(|r| r.first())
                .and_then(|v| v.as_int())
                .unwrap_or(0);
            if held == 0 || started.elapsed() >= timeout {
                return Ok(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The size and schema of the store now.
    pub async fn figures(&self) -> anyhow::Result<StorageFigures> {
        let backend = self.connect().await?;
        let (tables, objects, bytes) = match self.dialect {
            Dialect::Sqlite => (
                "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'",
                "SELECT COUNT(*) FROM sqlite_master",
                None,
            ),
            Dialect::MySql => (
                "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE()",
                "SELECT CAST((SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = DATABASE()) + (SELECT COUNT(DISTINCT table_name, index_name) \
                 FROM information_schema.statistics WHERE table_schema = DATABASE()) AS SIGNED)",
                Some(
                    "SELECT CAST(COALESCE(SUM(data_length + index_length), 0) AS SIGNED) \
                     FROM information_schema.tables WHERE table_schema = DATABASE()",
                ),
            ),
            Dialect::Postgres => (
                "SELECT COUNT(*) FROM information_schema.tables \
                 WHERE table_schema = current_schema()",
                "SELECT COUNT(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE n.nspname = current_schema()",
                Some("SELECT pg_database_size(current_database())"),
            ),
        };
        let int = |text: &'static str| {
            let backend = backend.clone();
            let dialect = self.dialect;
            async move {
                let mut sql = Sql::new(dialect);
                sql.push(text);
                let rows = backend
                    .fetch(&sql, &[ColType::Int])
                    .await
                    .map_err(|e| anyhow::anyhow!("cannot measure the database: {e}"))?;
                rows.first()
                    .and_then(|r| r.first())
                    .and_then(|v| v.as_int())
                    .ok_or_else(|| anyhow::anyhow!("no answer to `{text}`"))
            }
        };
        let mut figures = StorageFigures {
            bytes: None,
            sqlite_db_bytes: None,
            sqlite_wal_bytes: None,
            tables: int(tables).await?,
            schema_objects: int(objects).await?,
        };
        if let Some(bytes) = bytes {
            figures.bytes = Some(int(bytes).await?.max(0) as u64);
        }
        if let Some(file) = self.sqlite_file() {
            let size = |path: &Path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let mut wal = file.clone().into_os_string();
            wal.push("-wal");
            let (db, wal) = (size(&file), size(Path::new(&wal)));
            figures.sqlite_db_bytes = Some(db);
            figures.sqlite_wal_bytes = Some(wal);
            figures.bytes = Some(db + wal);
        }
        Ok(figures)
    }
}
