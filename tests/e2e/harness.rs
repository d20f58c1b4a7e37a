//! Test environments for the end-to-end suite: a fresh database per test on
//! each backend, the real `cellgate serve` started on a free port, and a tiny
//! GraphQL client.
//!
//! SQLite always runs (a `--data` temp dir). MariaDB/MySQL and PostgreSQL run
//! when `CELLGATE_TEST_MYSQL_URL` / `CELLGATE_TEST_POSTGRES_URL` point at a
//! server; each test then creates its own database there (`--database`) and
//! drops it afterwards, also when the test fails. Without the variable the
//! test prints that it was skipped and passes.
//!
//! Every GraphQL response goes through [`check_errors`]: each error must
//! carry an `extensions.code` and no SQL, driver text or file path.

use std::future::Future;
use std::io::{BufRead as _, BufReader};
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use futures::FutureExt as _;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::StatusCode;
use serde_json::{json, Value};
use sqlx::Connection as _;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    MySql,
    Postgres,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "sqlite",
            Backend::MySql => "mysql",
            Backend::Postgres => "postgres",
        }
    }

    fn variable(self) -> Option<&'static str> {
        match self {
            Backend::Sqlite => None,
            Backend::MySql => Some("CELLGATE_TEST_MYSQL_URL"),
            Backend::Postgres => Some("CELLGATE_TEST_POSTGRES_URL"),
        }
    }
}

/// The `items` datastore: one index with a field of every type, sharded by
/// the string `owner` (each test uses a fresh owner).
const ITEMS: &[(&str, &str)] = &[
    (
        "items/datastore.yaml",
        "name: items\nshards: 4\ncolumns:\n  - name: DATA\n  - name: FLAGS\n",
    ),
    (
        "items/indexes/items_index.yaml",
        "table: items_index\ndatastore: items\ncolumn_defs:\n  - column_key: DATA\n    fields:\n      - { field: owner, type: string }\n      - { field: n, type: int }\n      - { field: x, type: float }\n      - { field: s, type: string }\n      - { field: t, type: datetime }\n      - { field: u, type: uuid }\n  - column_key: FLAGS\n    fields:\n      - { field: b, type: bool }\n",
    ),
];

/// Which definitions a server runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Defs {
    /// The repository's `datastores/` with `shards: 8`, plus `items`.
    Small,
    /// The repository's `datastores/` as they are.
    Repo,
}

/// The workspace root, where `datastores/` lives.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Copies the repository's definitions to `to`, with `shards: 8` in every
/// `datastore.yaml`, and adds the `items` datastore.
fn write_small_definitions(to: &Path) {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).expect("create definitions dir");
        for entry in std::fs::read_dir(from).expect("read datastores") {
            let entry = entry.expect("dir entry");
            let target = to.join(entry.file_name());
            if entry.file_type().expect("file type").is_dir() {
                copy(&entry.path(), &target);
                continue;
            }
            let mut text = std::fs::read_to_string(entry.path()).expect("read definition");
            if entry.file_name() == "datastore.yaml" {
                let mut out = String::new();
                for line in text.lines() {
                    if line.trim_start().starts_with("shards:") {
                        continue;
                    }
                    out.push_str(line);
                    out.push('\n');
                    if line.starts_with("name:") {
                        out.push_str("shards: 8\n");
                    }
                }
                text = out;
            }
            std::fs::write(target, text).expect("write definition");
        }
    }
    copy(&root().join("datastores"), to);
    for (path, text) in ITEMS {
        let path = to.join(path);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("create dir");
        std::fs::write(path, text).expect("write definition");
    }
}

/// One test's storage: a temp dir, and a database on a server.
pub struct Env {
    pub backend: Backend,
    dir: tempfile::TempDir,
    /// `(server url, database name)` to drop afterwards.
    database: Option<(String, String)>,
}

/// The `cellgate` binary, with no `CELLGATE_*` or `RUST_LOG` variables
/// inherited.
fn cellgate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cellgate"));
    for (name, _) in std::env::vars_os() {
        let text = name.to_string_lossy();
        if text.starts_with("CELLGATE_") || text == "RUST_LOG" {
            command.env_remove(&name);
        }
    }
    command
}

/// Runs one test on `backend`, or prints why it is skipped; drops the
/// test's database afterwards, also when the test panics.
pub async fn run<F, Fut>(backend: Backend, test: &str, body: F)
where
    F: FnOnce(Arc<Env>) -> Fut,
    Fut: Future<Output = ()>,
{
    let Some(env) = Env::new(backend, test).await else {
        return;
    };
    let env = Arc::new(env);
    let outcome = AssertUnwindSafe(body(env.clone())).catch_unwind().await;
    if let Ok(env) = Arc::try_unwrap(env) {
        env.cleanup().await;
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

impl Env {
    async fn new(backend: Backend, test: &str) -> Option<Env> {
        let dir = tempfile::tempdir().expect("temp dir");
        let database = match backend.variable() {
            None => None,
            Some(variable) => {
                let Ok(base) = std::env::var(variable) else {
                    eprintln!(
                        "skipped {test} on {}: {variable} is not set",
                        backend.name()
                    );
                    return None;
                };
                let name = format!(
                    "cg_e2e_{}_{}",
                    test.chars().take(30).collect::<String>(),
                    &uuid::Uuid::new_v4().simple().to_string()[..8]
                );
                admin(backend, &base, &format!("CREATE DATABASE {name}")).await;
                Some((base, name))
            }
        };
        Some(Env {
            backend,
            dir,
            database,
        })
    }

    async fn cleanup(self) {
        if let Some((base, name)) = &self.database {
            let force = if self.backend == Backend::Postgres {
                " WITH (FORCE)"
            } else {
                ""
            };
            admin(
                self.backend,
                base,
                &format!("DROP DATABASE IF EXISTS {name}{force}"),
            )
            .await;
        }
    }

    /// The data directory every server of this test shares (the SQLite
    /// database on SQLite, the snowflake worker cache on every backend).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Starts `cellgate serve` on this test's storage.
    pub fn serve(&self, defs: Defs, extra: &[&str]) -> Server {
        let run_dir = tempfile::tempdir_in(self.dir.path()).expect("server dir");
        let datastores = match defs {
            Defs::Small => {
                let dir = run_dir.path().join("datastores");
                write_small_definitions(&dir);
                dir
            }
            Defs::Repo => root().join("datastores"),
        };
        let mut command = Command::new(env!("CARGO_BIN_EXE_cellgate"));
        command.current_dir(run_dir.path());
        for (name, _) in std::env::vars_os() {
            let text = name.to_string_lossy();
            if text.starts_with("CELLGATE_") || text == "RUST_LOG" {
                command.env_remove(&name);
            }
        }
        command
            .arg("serve")
            .args(["--listen", "127.0.0.1:0", "--datastores"])
            .arg(&datastores)
            .args(extra);
        command.arg("--data").arg(self.data_dir());
        if let Some((base, name)) = &self.database {
            command.arg("--database").arg(replace_database(base, name));
        }
        let stderr_path = run_dir.path().join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path).expect("stderr log");
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start cellgate serve");
        let stdout = child.stdout.take().expect("stdout");
        let (lines_tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut server = Server {
            child,
            base: String::new(),
            client: reqwest::Client::new(),
            stderr_path,
            datastores,
            _dir: run_dir,
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) => {
                    let Some(rest) = line.strip_prefix("cellgate listening on ") else {
                        continue;
                    };
                    let url = rest.split_whitespace().next().expect("address").to_string();
                    assert!(
                        url.starts_with("http://127.0.0.1:") && !url.ends_with(":0"),
                        "{line}"
                    );
                    assert!(
                        line.ends_with(&format!("GraphQL playground at {url}/")),
                        "{line}"
                    );
                    server.base = url;
                    return server;
                }
                Err(_) => panic!(
                    "cellgate serve did not print its address; stderr:\n{}",
                    server.stderr()
                ),
            }
        }
    }
}

impl Env {
    /// The flags that name this test's store to a command other than
    /// `serve` (`--data DIR`, and `--database URL` on a server backend).
    pub fn store_flags(&self) -> Vec<String> {
        let mut flags = vec!["--data".to_string(), self.data_dir().display().to_string()];
        if let Some((base, name)) = &self.database {
            flags.push("--database".to_string());
            flags.push(replace_database(base, name));
        }
        flags
    }

    /// Runs `cellgate args…` with no `CELLGATE_*` variables inherited.
    pub fn command(&self, args: &[String]) -> std::process::Output {
        let mut command = cellgate();
        command
            .current_dir(self.dir.path())
            .args(args)
            .output()
            .expect("run cellgate")
    }

    /// Whether the store holds a table called `table`.
    pub async fn table_exists(&self, table: &str) -> bool {
        match (&self.database, self.backend) {
            (None, _) => {
                let url = format!(
                    "sqlite://{}?mode=ro",
                    self.data_dir().join("cellgate.db").display()
                );
                let mut conn = sqlx::SqliteConnection::connect(&url)
                    .await
                    .unwrap_or_else(|e| panic!("cannot open {url}: {e}"));
                let found: Option<(String,)> = sqlx::query_as(
                    "SELECT name FROM sqlite_master WHERE type = 'table' AND name = ?",
                )
                .bind(table)
                .fetch_optional(&mut conn)
                .await
                .expect("sqlite_master");
                found.is_some()
            }
            (Some((base, name)), Backend::Postgres) => {
                let mut conn = sqlx::PgConnection::connect(&replace_database(base, name))
                    .await
                    .expect("connect to the test database");
                let found: Option<(i32,)> =
                    sqlx::query_as("SELECT 1 FROM information_schema.tables WHERE table_name = $1")
                        .bind(table)
                        .fetch_optional(&mut conn)
                        .await
                        .expect("information_schema.tables");
                found.is_some()
            }
            (Some((base, name)), _) => {
                let mut conn = sqlx::MySqlConnection::connect(base)
                    .await
                    .expect("connect to the test server");
                let found: Option<(i32,)> = sqlx::query_as(
                    "SELECT 1 FROM information_schema.tables WHERE table_schema = ? AND table_name = ?",
                )
                .bind(name)
                .bind(table)
                .fetch_optional(&mut conn)
                .await
                .expect("information_schema.tables");
                found.is_some()
            }
        }
    }
}

/// Runs one administrative statement on a database server.
async fn admin(backend: Backend, base: &str, sql: &str) {
    match backend {
        Backend::MySql => {
            let mut conn = sqlx::MySqlConnection::connect(base)
                .await
                .unwrap_or_else(|e| panic!("cannot reach MySQL at CELLGATE_TEST_MYSQL_URL: {e}"));
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        Backend::Postgres => {
            let mut conn = sqlx::PgConnection::connect(base).await.unwrap_or_else(|e| {
                panic!("cannot reach PostgreSQL at CELLGATE_TEST_POSTGRES_URL: {e}")
            });
            sqlx::query(sql)
                .execute(&mut conn)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        Backend::Sqlite => {}
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

/// A running `cellgate serve`, killed on drop.
pub struct Server {
    child: Child,
    /// `http://127.0.0.1:PORT`
    base: String,
    client: reqwest::Client,
    stderr_path: PathBuf,
    /// The definitions directory it serves (`--datastores`).
    pub datastores: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The media type a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accept {
    Json,
    GraphqlResponse,
}

impl Server {
    /// Sends the server SIGHUP (reload the definitions).
    pub fn hangup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -HUP failed");
    }

    /// Runs `cellgate reload --url <this server>`; returns whether it
    /// succeeded, its stdout and its stderr.
    pub fn reload_command(&self) -> (bool, String, String) {
        let mut command = cellgate();
        let output = command
            .args(["reload", "--url", &self.base])
            .output()
            .expect("run cellgate reload");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The gateway's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// POSTs `{query, variables}` and returns the JSON response, whatever
    /// its errors.
    pub async fn request(&self, query: &str, variables: Value) -> Value {
        let body = json!({ "query": query, "variables": variables });
        let (status, response) = self.post_raw(&body.to_string(), Accept::Json).await;
        assert!(
            status == StatusCode::OK,
            "status {status} for {query}: {response}"
        );
        response
    }

    /// POSTs and returns `data`, failing the test on any error.
    pub async fn data(&self, query: &str, variables: Value) -> Value {
        let response = self.request(query, variables).await;
        assert!(
            response.get("errors").is_none(),
            "unexpected errors for {query}: {response}"
        );
        response["data"].clone()
    }

    /// GETs `path` (e.g. `/api/segment/get/order`); returns the status and
    /// the body as text.
    pub async fn get_text(&self, path: &str) -> (StatusCode, String) {
        let response = self
            .client
            .get(format!("{}{path}", self.base))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path} failed: {e}\nstderr:\n{}", self.stderr()));
        let status = response.status();
        (status, response.text().await.expect("response body"))
    }

    /// POSTs a raw body with `Content-Type: application/json`; returns the
    /// status and the JSON response (checked by [`check_errors`]).
    pub async fn post_raw(&self, body: &str, accept: Accept) -> (StatusCode, Value) {
        let (status, text) = self.post_text(body, accept).await;
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("response is not JSON ({e}): {text}"));
        check_errors(&value);
        (status, value)
    }

    /// POSTs a raw body with `Content-Type: application/json`; returns the
    /// status and the response body as it came.
    pub async fn post_text(&self, body: &str, accept: Accept) -> (StatusCode, String) {
        let accept = match accept {
            Accept::Json => "application/json",
            Accept::GraphqlResponse => "application/graphql-response+json",
        };
        let response = self
            .client
            .post(format!("{}/graphql", self.base))
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, accept)
            .body(body.to_string())
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST /graphql failed: {e}\nstderr:\n{}", self.stderr()));
        let status = response.status();
        (status, response.text().await.expect("response body"))
    }

    /// The value of the unlabelled metric `name` in `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let (status, text) = self.get_text("/metrics").await;
        assert_eq!(status, StatusCode::OK, "{text}");
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|value| value.trim().parse().ok())
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }
}

/// Every error has `extensions.code` and a message free of SQL, driver
/// names and file paths.
pub fn check_errors(response: &Value) {
    let Some(errors) = response.get("errors") else {
        return;
    };
    let errors = errors.as_array().expect("`errors` is a list");
    assert!(!errors.is_empty(), "`errors` is empty: {response}");
    for error in errors {
        let code = error["extensions"]["code"].as_str();
        assert!(
            code.is_some_and(|c| !c.is_empty()),
            "error without extensions.code: {error}"
        );
        let message = error["message"].as_str().expect("error message");
        for leak in [
            "SELECT",
            "INSERT",
            "UPDATE ",
            "DELETE ",
            "sqlx",
            "/tmp",
            "/work",
            "/home",
            ".rs:",
            ".db",
            "mysql://",
            "postgres://",
            "sqlite://",
        ] {
            assert!(
                !message.contains(leak),
                "error message leaks `{leak}`: {error}"
            );
        }
    }
}

/// The codes of the response's errors, in order.
pub fn codes(response: &Value) -> Vec<String> {
    response["errors"]
        .as_array()
        .map(|errors| {
            errors
                .iter()
                .map(|e| e["extensions"]["code"].as_str().unwrap_or("").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Asserts the response failed with `code` (and only that code).
pub fn assert_code(response: &Value, code: &str) {
    let codes = codes(response);
    assert!(
        !codes.is_empty() && codes.iter().all(|c| c == code),
        "expected errors with code {code}, got {response}"
    );
}

/// A bounded wait for eventually consistent state: poll, then `tick`.
pub struct Wait {
    what: String,
    deadline: Instant,
}

impl Wait {
    pub fn new(what: impl Into<String>) -> Wait {
        Wait {
            what: what.into(),
            deadline: Instant::now() + Duration::from_secs(30),
        }
    }

    /// Sleeps 20 ms, or fails the test with `last` once 30 s have passed.
    pub async fn tick(&self, last: &dyn std::fmt::Debug) {
        assert!(
            Instant::now() < self.deadline,
            "timed out after 30 s waiting for {}; last seen: {last:?}",
            self.what
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Instantiates every listed test for SQLite, MySQL and PostgreSQL.
#[macro_export]
macro_rules! e2e_suite {
    ($($module:ident :: $test:ident),* $(,)?) => {
        mod sqlite { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { $crate::harness::run($crate::harness::Backend::Sqlite, stringify!($test), $crate::$module::$test).await } )* }
        mod mysql { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { $crate::harness::run($crate::harness::Backend::MySql, stringify!($test), $crate::$module::$test).await } )* }
        mod postgres { $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $test() { $crate::harness::run($crate::harness::Backend::Postgres, stringify!($test), $crate::$module::$test).await } )* }
    };
}
