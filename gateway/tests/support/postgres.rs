//! A private PostgreSQL server for tests that kill and restart their
//! database: its own data directory in a temp directory, a free loopback
//! port, no Unix socket, `fsync` off (a killed process loses nothing the
//! OS already has), trust authentication for `postgres`. It is shut down
//! (immediately) when the [`Postgres`] is dropped, also when the test
//! fails. Needs `initdb` and `postgres` on `PATH` or in
//! `/usr/lib/postgresql/*/bin` (the newest version there); [`Postgres::init`]
//! says why it cannot run otherwise. Uses `crate::servers`.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::servers;

/// A private PostgreSQL server on loopback; stopped (immediate shutdown)
/// when dropped.
pub struct Postgres {
    bin: PathBuf,
    dir: tempfile::TempDir,
    pub port: u16,
    /// The server's user and group when the test runs as root (PostgreSQL
    /// refuses to run as root).
    owner: Option<(u32, u32)>,
    postmaster: Option<Child>,
}

impl Postgres {
    /// The directory holding `initdb` and `postgres`, if installed.
    pub fn binaries() -> Option<PathBuf> {
        let mut installed: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
            .map(|dirs| dirs.flatten().map(|d| d.path().join("bin")).collect())
            .unwrap_or_default();
        installed.sort_by_key(|dir| {
            dir.parent()
                .and_then(|v| v.file_name())
                .and_then(|v| v.to_str())
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        });
        installed.reverse();
        servers::find_dir(&["initdb", "postgres"], &installed)
    }

    /// The uid and gid of the `postgres` user.
    pub fn postgres_user() -> Option<(u32, u32)> {
        let id = |flag: &str| -> Option<u32> {
            let output = Command::new("id").args([flag, "postgres"]).output().ok()?;
            String::from_utf8(output.stdout).ok()?.trim().parse().ok()
        };
        Some((id("-u")?, id("-g")?))
    }

    /// Initializes a data directory, or says why it cannot.
    pub fn init() -> Result<Postgres, String> {
        let bin = Postgres::binaries()
            .ok_or("PostgreSQL server binaries (initdb, postgres) not found")?;
        let dir = tempfile::tempdir().unwrap();
        let owner = if servers::running_as_root() {
            let owner =
                Postgres::postgres_user().ok_or("running as root without a postgres user")?;
            std::os::unix::fs::chown(dir.path(), Some(owner.0), Some(owner.1)).unwrap();
            Some(owner)
        } else {
            None
        };
        let postgres = Postgres {
            bin,
            dir,
            port: servers::free_port(),
            owner,
            postmaster: None,
        };
        let data = postgres.data();
        let output = postgres
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(postgres)
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.current_dir(self.dir.path());
        if let Some((uid, gid)) = self.owner {
            use std::os::unix::process::CommandExt as _;
            command.uid(uid).gid(gid);
        }
        command
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server and waits until it accepts queries. After a kill
    /// the old server's sessions take a moment to exit; until they have,
    /// the new one refuses to start, so it is started again.
    pub async fn start(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let log = std::fs::File::options()
                .create(true)
                .append(true)
                .open(self.dir.path().join("postgres.log"))
                .unwrap();
            let mut child = self
                .command("postgres")
                .arg("-D")
                .arg(self.data())
                .args(["-p", &self.port.to_string()])
                .args(["-c", "listen_addresses=127.0.0.1"])
                .args(["-c", "unix_socket_directories="])
                .args(["-c", "fsync=off"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .unwrap();
            loop {
                if child.try_wait().unwrap().is_some() {
                    break;
                }
                use sqlx::Connection as _;
                if let Ok(conn) = sqlx::PgConnection::connect(&self.url()).await {
                    let _ = conn.close().await;
                    self.postmaster = Some(child);
                    return;
                }
                assert!(
                    Instant::now() < deadline,
                    "PostgreSQL did not start; log:\n{}",
                    self.log()
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            assert!(
                Instant::now() < deadline,
                "PostgreSQL did not start; log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Sends `signal` to the postmaster and waits for it to exit.
    pub fn stop(&mut self, signal: &str) {
        if let Some(mut child) = self.postmaster.take() {
            let _ = Command::new("kill")
                .args([&format!("-{signal}"), &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }

    /// The directory holding the data directory and the log.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Immediate shutdown: the postmaster takes its sessions with it.
        self.stop("QUIT");
    }
}
