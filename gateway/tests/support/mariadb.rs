//! A private MariaDB server for tests that kill and restart their database:
//! `mariadb-install-db` into a data directory in a temp directory, then
//! `mariadbd --no-defaults` (no option file of the machine is read) with
//! its own socket and pid file, listening on a free loopback port only.
//! `root` has no password (the installation grants `root@127.0.0.1`), and
//! the server holds a database `cellgate`. Commits are written to the OS at
//! once and flushed to disk once a second (`innodb_flush_log_at_trx_commit
//! = 2`): a killed process loses no committed transaction, and the test
//! does not wait for the disk. The server is killed when the [`Mariadb`]
//! is dropped, also when the test fails. Needs `mariadb-install-db` and
//! `mariadbd` on `PATH` or in the `sbin` directories; [`Mariadb::init`]
//! says why it cannot run otherwise. Uses `crate::servers`.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::servers;

/// A private MariaDB server on loopback; killed when dropped.
pub struct Mariadb {
    server: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
    mariadbd: Option<Child>,
}

impl Mariadb {
    /// Installs the system tables into a new data directory, or says why
    /// it cannot.
    pub fn init() -> Result<Mariadb, String> {
        let install = servers::find_program("mariadb-install-db")
            .ok_or("MariaDB's mariadb-install-db not found")?;
        let server =
            servers::find_program("mariadbd").ok_or("MariaDB's server mariadbd not found")?;
        let dir = tempfile::tempdir().unwrap();
        let mariadb = Mariadb {
            server,
            dir,
            port: servers::free_port(),
            mariadbd: None,
        };
        let output = Command::new(install)
            .arg("--no-defaults")
            .arg(format!("--datadir={}", mariadb.data().display()))
            .arg(format!("--user={}", servers::user_name()))
            .args([
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--innodb-log-file-size=16M",
            ])
            .current_dir(mariadb.dir.path())
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "mariadb-install-db failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(mariadb)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The server without a database, to create one.
    fn server_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/", self.port)
    }

    /// The database `cellgate`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/cellgate", self.port)
    }

    /// Starts the server, waits until it accepts queries (after a kill,
    /// InnoDB recovers its log first) and creates the database `cellgate`
    /// if it is not there. A server that exits at once (its port still
    /// held by the killed one) is started again.
    pub async fn start(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        let dir = self.dir.path();
        loop {
            let mut child = Command::new(&self.server)
                .arg("--no-defaults")
                .arg(format!("--datadir={}", self.data().display()))
                .arg(format!("--port={}", self.port))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
                .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
                .arg(format!("--log-error={}", dir.join("error.log").display()))
                .arg(format!("--user={}", servers::user_name()))
                .args([
                    "--skip-name-resolve",
                    "--innodb-log-file-size=16M",
                    "--innodb-flush-log-at-trx-commit=2",
                    "--max-connections=500",
                ])
                .current_dir(dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap();
            loop {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                use sqlx::Connection as _;
                if let Ok(mut conn) = sqlx::MySqlConnection::connect(&self.server_url()).await {
                    sqlx::query("CREATE DATABASE IF NOT EXISTS cellgate")
                        .execute(&mut conn)
                        .await
                        .expect("create the database");
                    let _ = conn.close().await;
                    self.mariadbd = Some(child);
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "MariaDB did not start; log:\n{}",
                    self.log()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(
                Instant::now() < deadline,
                "MariaDB did not start; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Sends `signal` to the server and waits for it to exit.
    pub fn stop(&mut self, signal: &str) {
        if let Some(mut child) = self.mariadbd.take() {
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }

    /// The directory holding the data directory and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mariadb {
    fn drop(&mut self) {
        // Its data is thrown away with the temp directory: no need to wait
        // for a clean shutdown.
        self.stop("KILL");
    }
}
