//! Test environments: a fresh database per test on each backend.
//!
//! SQLite always runs, in a temporary directory. MariaDB/MySQL and
//! PostgreSQL run when `CELLGATE_TEST_MYSQL_URL` / `CELLGATE_TEST_POSTGRES_URL`
//! point at a server (e.g. `mysql://root@127.0.0.1:3306/test`,
//! `postgres://postgres@127.0.0.1:5432/postgres`); each test then creates its
//! own database on that server and drops it afterwards. Without the variable
//! the test prints that it was skipped.
//!
//! A test runs on one cluster or on two ([`Env::two_clusters`]): then a
//! second database of the same backend (another SQLite file, another
//! database on the same server) is cluster `b`, and every datastore's
//! shards are split evenly, 0–2047 on `a` and 2048–4095 on `b`, so cells
//! and index entries of one row may live on different clusters.

use std::path::Path;

use cellgate_store::{ClusterConfig, StorageConfig};
use cellgate_store::{Store, StoreOptions};
use sqlx::Connection;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sqlite,
    MySql,
    Postgres,
}

/// One test's database. Keeps the SQLite directory alive; drops server
/// databases on `cleanup`.
pub struct Env {
    pub kind: Kind,
    pub url: String,
    server: Option<(String, String)>,
    /// Databases made by [`Env::extra_url`], dropped on cleanup.
    extra: std::sync::Mutex<Vec<String>>,
    /// The second cluster's database, when the test runs on two.
    pub second: Option<String>,
    dir: tempfile::TempDir,
}

/// Shards of both test datastores: the default count, as in production.
pub const TRIP_SHARDS: u32 = 4096;

/// The definitions the suite runs against.
pub const DEFINITIONS: &[(&str, &str)] = &[
    (
        "trips/datastore.yaml",
        "name: trips\ncolumns:\n  - name: BASE\n  - name: STATUS\n  - name: NOTES\n  - name: FARE_ADJUSTMENT\n",
    ),
    (
        "trips/indexes/driver_partner_index.yaml",
        "table: driver_partner_index # Name of the index.\ndatastore: trips # Name of the associated datastore\ncolumn_defs:\n  - column_key: BASE # From which column to fetch from.\n    fields: # The fields in the cell to denormalize\n      - { field: driver_partner_uuid, type: UUID}\n      - { field: city_uuid, type: UUID}\n      - { field: trip_created_at, type: datetime}\n",
    ),
    (
        "trips/indexes/city_trips_index.yaml",
        "table: city_trips_index\ndatastore: trips\ncolumn_defs:\n  - column_key: BASE\n    fields:\n      - { field: city_uuid, type: UUID }\n      - { field: fare.total, name: fare_total, type: float }\n  - column_key: STATUS\n    fields:\n      - { field: status, type: string }\n",
    ),
    (
        "items/datastore.yaml",
        "name: items\ncolumns:\n  - name: DATA\n  - name: FLAGS\n",
    ),
    (
        "items/indexes/items_index.yaml",
        "table: items_index\ndatastore: items\ncolumn_defs:\n  - column_key: DATA\n    fields:\n      - { field: owner, type: string }\n      - { field: n, type: int }\n      - { field: x, type: float }\n      - { field: s, type: string }\n      - { field: t, type: datetime }\n      - { field: u, type: uuid }\n  - column_key: FLAGS\n    fields:\n      - { field: b, type: bool }\n",
    ),
];

pub fn definitions() -> index_dsl::Definitions {
    index_dsl::load_files(Path::new("defs"), DEFINITIONS.iter().copied())
        .unwrap_or_else(|e| panic!("test definitions are invalid:\n{e}"))
}

impl Env {
    /// A fresh environment, or `None` (with a message) when the backend's
    /// server is not configured.
    pub async fn new(kind: Kind, test: &str) -> Option<Env> {
        let dir = tempfile::tempdir().expect("tempdir");
        let (url, server) = match kind {
            Kind::Sqlite => (
                format!("sqlite://{}", dir.path().join("cellgate.db").display()),
                None,
            ),
            Kind::MySql | Kind::Postgres => {
                let var = if kind == Kind::MySql {
                    "CELLGATE_TEST_MYSQL_URL"
                } else {
                    "CELLGATE_TEST_POSTGRES_URL"
                };
                let Ok(base) = std::env::var(var) else {
                    eprintln!("skipped {test} on {kind:?}: {var} is not set");
                    return None;
                };
                let name = format!(
                    "cg_{}_{}",
                    test.chars().take(30).collect::<String>(),
                    &uuid::Uuid::new_v4().simple().to_string()[..8]
                );
                let url = replace_database(&base, &name);
                create_database(kind, &base, &name).await;
                (url, Some((base, name)))
            }
        };
        Some(Env {
            kind,
            url,
            server,
            extra: std::sync::Mutex::new(Vec::new()),
            second: None,
            dir,
        })
    }

    /// A fresh environment of two clusters, or `None` (with a message)
    /// when the backend's server is not configured.
    pub async fn two_clusters(kind: Kind, test: &str) -> Option<Env> {
        let mut env = Env::new(kind, test).await?;
        env.second = Some(env.extra_url().await);
        Some(env)
    }

    /// The database URL of each cluster, `a` first.
    pub fn urls(&self) -> Vec<String> {
        std::iter::once(self.url.clone())
            .chain(self.second.clone())
            .collect()
    }

    /// A second, empty database of the same backend (another SQLite file,
    /// another database on the server), for two-cluster topologies.
    pub async fn extra_url(&self) -> String {
        let n = {
            let mut extra = self.extra.lock().unwrap();
            extra.push(String::new());
            extra.len()
        };
        match &self.server {
            None => format!(
                "sqlite://{}",
                self.dir.path().join(format!("extra{n}.db")).display()
            ),
            Some((base, name)) => {
                let extra_name = format!("{name}_x{n}");
                create_database(self.kind, base, &extra_name).await;
                self.extra.lock().unwrap()[n - 1] = extra_name.clone();
                replace_database(base, &extra_name)
            }
        }
    }

    /// Opens a store on `storage` with the given definition files.
    pub async fn open_custom(
        &self,
        files: &[(&str, &str)],
        storage: StorageConfig,
        maintain_indexes: bool,
    ) -> cellgate_store::Result<Store> {
        let defs = index_dsl::load_files(Path::new("defs"), files.iter().copied())
            .unwrap_or_else(|e| panic!("test definitions are invalid:\n{e}"));
        let mut options = StoreOptions::new(storage);
        options.maintain_indexes = maintain_indexes;
        Store::open(defs, options).await
    }

    /// The environment's topology: one cluster, or two with the shards
    /// split evenly.
    pub fn storage(&self) -> StorageConfig {
        match &self.second {
            None => StorageConfig::single(&self.url),
            Some(second) => StorageConfig {
                clusters: [("a", &self.url), ("b", second)]
                    .into_iter()
                    .map(|(name, url)| ClusterConfig {
                        name: name.into(),
                        master: url.to_string(),
                        replicas: vec![],
                    })
                    .collect(),
                ..StorageConfig::default()
            },
        }
    }

    pub async fn open(&self) -> Store {
        self.open_with(true).await
    }

    /// Opens a store on the suite's definitions with adjusted options.
    pub async fn open_tuned(&self, tune: impl FnOnce(&mut StoreOptions)) -> Store {
        let mut options = StoreOptions::new(self.storage());
        tune(&mut options);
        Store::open(definitions(), options)
            .await
            .expect("store opens")
    }

    pub async fn open_with(&self, maintain_indexes: bool) -> Store {
        let mut options = StoreOptions::new(self.storage());
        options.maintain_indexes = maintain_indexes;
        Store::open(definitions(), options)
            .await
            .expect("store opens")
    }

    pub async fn cleanup(self) {
        let extra = std::mem::take(&mut *self.extra.lock().unwrap());
        if let Some((base, name)) = &self.server {
            for extra_name in extra.into_iter().filter(|n| !n.is_empty()) {
                drop_database(self.kind, base, &extra_name).await;
            }
            drop_database(self.kind, base, name).await;
        }
    }
}

async fn drop_database(kind: Kind, base: &str, name: &str) {
    let sql = format!("DROP DATABASE IF EXISTS {name}");
    match kind {
        Kind::MySql => {
            let mut conn = sqlx::MySqlConnection::connect(base).await.expect("connect");
            sqlx::query(&sql)
                .execute(&mut conn)
                .await
                .expect("drop database");
        }
        Kind::Postgres => {
            let mut conn = sqlx::PgConnection::connect(base).await.expect("connect");
            let sql = format!("{sql} WITH (FORCE)");
            sqlx::query(&sql)
                .execute(&mut conn)
                .await
                .expect("drop database");
        }
        Kind::Sqlite => {}
    }
}

fn replace_database(url: &str, name: &str) -> String {
    let (head, tail) = url.split_once("://").expect("url has a scheme");
    let (authority, rest) = tail.split_once('/').unwrap_or((tail, ""));
    let query = rest
        .split_once('?')
        .map(|(_, q)| format!("?{q}"))
        .unwrap_or_default();
    format!("{head}://{authority}/{name}{query}")
}

async fn create_database(kind: Kind, base: &str, name: &str) {
    let sql = format!("CREATE DATABASE {name}");
    match kind {
        Kind::MySql => {
            let mut conn = sqlx::MySqlConnection::connect(base)
                .await
                .unwrap_or_else(|e| panic!("cannot reach MySQL at CELLGATE_TEST_MYSQL_URL: {e}"));
            sqlx::query(&sql)
                .execute(&mut conn)
                .await
                .expect("create database");
        }
        Kind::Postgres => {
            let mut conn = sqlx::PgConnection::connect(base).await.unwrap_or_else(|e| {
                panic!("cannot reach PostgreSQL at CELLGATE_TEST_POSTGRES_URL: {e}")
            });
            sqlx::query(&sql)
                .execute(&mut conn)
                .await
                .expect("create database");
        }
        Kind::Sqlite => {}
    }
}

/// Runs `sql` (no result) on the database at `url`, outside any store.
pub async fn execute(kind: Kind, url: &str, sql: &str) {
    let outcome = match kind {
        Kind::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(url).await.expect("connect");
            sqlx::query(sql).execute(&mut conn).await.map(|_| ())
        }
        Kind::MySql => {
            let mut conn = sqlx::MySqlConnection::connect(url).await.expect("connect");
            sqlx::query(sql).execute(&mut conn).await.map(|_| ())
        }
        Kind::Postgres => {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query(sql).execute(&mut conn).await.map(|_| ())
        }
    };
    outcome.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The first column of the first row of `sql` (an integer; `None` when
/// there is no row or it is NULL), on the database at `url`.
pub async fn scalar(kind: Kind, url: &str, sql: &str) -> Option<i64> {
    use sqlx::Row;
    let outcome = match kind {
        Kind::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(url).await.expect("connect");
            sqlx::query(sql)
                .fetch_optional(&mut conn)
                .await
                .map(|r| r.and_then(|r| r.get::<Option<i64>, _>(0)))
        }
        Kind::MySql => {
            let mut conn = sqlx::MySqlConnection::connect(url).await.expect("connect");
            sqlx::query(sql)
                .fetch_optional(&mut conn)
                .await
                .map(|r| r.and_then(|r| r.get::<Option<i64>, _>(0)))
        }
        Kind::Postgres => {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query(sql)
                .fetch_optional(&mut conn)
                .await
                .map(|r| r.and_then(|r| r.get::<Option<i64>, _>(0)))
        }
    };
    outcome.unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Holds a lock that keeps every other session from writing `table` of
/// the database at `url`, until the returned connection is dropped:
/// a transaction that has written (SQLite's single writer),
/// `LOCK TABLE … IN ACCESS EXCLUSIVE MODE` (PostgreSQL), `LOCK TABLES
/// … WRITE` (MySQL).
pub async fn lock_table(kind: Kind, url: &str, table: &str) -> Box<dyn std::any::Any + Send> {
    match kind {
        Kind::Sqlite => {
            let mut conn = sqlx::SqliteConnection::connect(url).await.expect("connect");
            sqlx::query("BEGIN IMMEDIATE")
                .execute(&mut conn)
                .await
                .expect("lock");
            Box::new(conn)
        }
        Kind::MySql => {
            let mut conn = sqlx::MySqlConnection::connect(url).await.expect("connect");
            sqlx::query(&format!("LOCK TABLES {table} WRITE"))
                .execute(&mut conn)
                .await
                .expect("lock");
            Box::new(conn)
        }
        Kind::Postgres => {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query("BEGIN")
                .execute(&mut conn)
                .await
                .expect("begin");
            sqlx::query(&format!("LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE"))
                .execute(&mut conn)
                .await
                .expect("lock");
            Box::new(conn)
        }
    }
}

/// Holds a transaction that has read `table` of the database at `url`,
/// until the returned connection is dropped: it keeps the table's lock
/// that reads take (PostgreSQL's `ACCESS SHARE`, MySQL's shared metadata
/// lock), which DDL on the table waits for. `None` on SQLite, where
/// readers do not hold DDL up.
pub async fn read_in_open_transaction(
    kind: Kind,
    url: &str,
    table: &str,
) -> Option<Box<dyn std::any::Any + Send>> {
    let read = format!("SELECT COUNT(*) FROM {table}");
    match kind {
        Kind::Sqlite => None,
        Kind::MySql => {
            let mut conn = sqlx::MySqlConnection::connect(url).await.expect("connect");
            sqlx::query("START TRANSACTION")
                .execute(&mut conn)
                .await
                .expect("begin");
            sqlx::query(&read).execute(&mut conn).await.expect("read");
            Some(Box::new(conn))
        }
        Kind::Postgres => {
            let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query("BEGIN")
                .execute(&mut conn)
                .await
                .expect("begin");
            sqlx::query(&read).execute(&mut conn).await.expect("read");
            Some(Box::new(conn))
        }
    }
}

/// Instantiates every listed contract test for SQLite, MySQL and PostgreSQL.
#[macro_export]
macro_rules! contract_suite {
    ($($test:ident),* $(,)?) => {
        $crate::contract_suite!(@on run: sqlite, mysql, postgres; $($test),*);
    };
    (@on $run:ident: $sqlite:ident, $mysql:ident, $postgres:ident; $($test:ident),*) => {
        mod $sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { super::$run(super::harness::Kind::Sqlite, stringify!($test), super::$test).await } )* }
        mod $mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { super::$run(super::harness::Kind::MySql, stringify!($test), super::$test).await } )* }
        mod $postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { super::$run(super::harness::Kind::Postgres, stringify!($test), super::$test).await } )* }
    };
}

/// Instantiates every listed contract test on two clusters
/// ([`Env::two_clusters`]) of SQLite, MySQL and PostgreSQL.
#[macro_export]
macro_rules! contract_suite_on_two_clusters {
    ($($test:ident),* $(,)?) => {
        $crate::contract_suite!(@on run_on_two_clusters: sqlite_two_clusters, mysql_two_clusters, postgres_two_clusters; $($test),*);
    };
}

/// A loopback port in front of a database server that can be shut: shut,
/// it closes every connection it forwards and each new one at once.
pub struct Gate {
    pub port: u16,
    open: tokio::sync::watch::Sender<bool>,
}

impl Gate {
    /// A gate to `target` (`host:port`), shut.
    pub async fn start(target: String) -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let open = tokio::sync::watch::channel(false).0;
        let watch = open.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    continue;
                };
                let mut state = watch.subscribe();
                if !*state.borrow_and_update() {
                    continue;
                }
                let target = target.clone();
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            _ = state.wait_for(|open| !*open) => {}
                        }
                    }
                });
            }
        });
        Gate { port, open }
    }

    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Closes every forwarded connection, and each new one from now on.
    pub fn shut(&self) {
        self.open.send_replace(false);
    }
}

/// `url` with its `host:port` replaced by `host_port`, and its `host:port`.
pub fn through(url: &str, host_port: &str) -> (String, String) {
    let start = url
        .find('@')
        .map_or_else(|| url.find("://").unwrap() + 3, |at| at + 1);
    let end = start + url[start..].find('/').unwrap();
    let target = url[start..end].to_string();
    (
        format!("{}{host_port}{}", &url[..start], &url[end..]),
        target,
    )
}
