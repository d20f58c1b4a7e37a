//! The `cellgate serve` child process and its cold start.
//!
//! The server runs on one database (the embedded store, or a URL given as
//! `--database`), or on the `storage:` section a benchmark writes into its
//! configuration file, e.g. a cluster with replicas.
//!
//! The server is the `cellgate` binary (beside this one, or `--cellgate`), started on a port of 127.0.0.1 chosen
//! before the spawn, so that `/readyz` can be polled from the moment the
//! process exists: the cold start is the time from the spawn to the first
//! `200` of `/readyz`, which covers opening the store (catalog checks,
//! index readiness) and building the GraphQL schema. The moment the
//! server prints its listening line is reported too.
//!
//! The child's environment holds no `CELLGATE_*` variable of the caller: a
//! database URL, a configuration file or demo data of the caller's shell
//! must not redirect it. Stopping sends SIGTERM so that the server
//! releases its index maintenance leases and the next process on the
//! store can take them over at once; SIGKILL only if it does not exit.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use crate::database::Database;
use crate::http::{truncate, Gateway};

/// Longest wait for the server to be ready.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// Longest wait for the server to exit after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How often `/readyz` is polled during start-up.
const POLL_EVERY: Duration = Duration::from_millis(5);

/// How long the server took to start.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ColdStart {
    /// From the spawn to the listening line on stdout.
    pub listening_ms: Option<f64>,
    /// From the spawn to the first `200` of `/readyz`.
    pub ready_ms: f64,
}

/// A running `cellgate serve`.
pub struct Server {
    child: tokio::process::Child,
    pub gateway: Arc<Gateway>,
    pub cold_start: ColdStart,
}

impl Server {
    /// Starts `serve` on `database` and waits until `/readyz` answers 200.
    /// The server's configuration and log go to `work_dir`. With
    /// `maintain_indexes` false the server does not maintain indexes
    /// (`indexes.maintain: false`).
    pub async fn start(
        database: &Database,
        datastores: &Path,
        work_dir: &Path,
        concurrency: u32,
        timeout: Duration,
        maintain_indexes: bool,
    ) -> anyhow::Result<Server> {
        let indexes = format!("indexes:\n  maintain: {maintain_indexes}\n");
        Server::spawn(
            Some(database),
            &indexes,
            datastores,
            work_dir,
            concurrency,
            timeout,
        )
        .await
    }

    /// Starts `serve` on `database` like [`Server::start`], with `limits`
    /// (lines of the `limits:` section, indented by two spaces) added to
    /// the benchmark's own.
    pub async fn start_with_limits(
        database: &Database,
        limits: &str,
        datastores: &Path,
        work_dir: &Path,
        concurrency: u32,
        timeout: Duration,
    ) -> anyhow::Result<Server> {
        Server::spawn(
            Some(database),
            limits,
            datastores,
            work_dir,
            concurrency,
            timeout,
        )
        .await
    }

    /// Like [`Server::start`] with index maintenance on, and `config`
    /// (YAML sections, e.g. `indexes:` with options of its own) added to
    /// the configuration file.
    pub async fn start_configured(
        database: &Database,
        config: &str,
        datastores: &Path,
        work_dir: &Path,
        concurrency: u32,
        timeout: Duration,
    ) -> anyhow::Result<Server> {
        Server::spawn(
            Some(database),
            config,
            datastores,
            work_dir,
            concurrency,
            timeout,
        )
        .await
    }

    /// The server's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Starts `serve` on the storage that `storage`, the `storage:` section
    /// of the configuration file (e.g. clusters with replicas), describes,
    /// and waits until `/readyz` answers 200. The file is written to
    /// `work_dir`, so URLs with passwords stay in the caller's temporary
    /// directory.
    pub async fn start_with_storage(
        storage: &str,
        datastores: &Path,
        work_dir: &Path,
        concurrency: u32,
        timeout: Duration,
    ) -> anyhow::Result<Server> {
        Server::spawn(None, storage, datastores, work_dir, concurrency, timeout).await
    }

    /// Starts `serve` on `database`, or on the storage of `config` without
    /// one, with `config` added to the configuration file (right after the
    /// `limits:` lines, so it may begin with more of them).
    async fn spawn(
        database: Option<&Database>,
        config: &str,
        datastores: &Path,
        work_dir: &Path,
        concurrency: u32,
        timeout: Duration,
    ) -> anyhow::Result<Server> {
        // No rate or concurrency limit: the benchmark is the only client.
        let config_text = format!(
            "limits:\n  rate_limit_per_second: 0\n  max_concurrent_requests: 0\n  \
             max_connections_per_client: 0\n{config}"
        );
        let config = work_dir.join("serve.yaml");
        std::fs::write(&config, config_text)
            .with_context(|| format!("cannot write `{}`", config.display()))?;
        let log = work_dir.join("serve.log");
        let log_file = std::fs::File::create(&log)
            .with_context(|| format!("cannot create `{}`", log.display()))?;
        let address = free_address()?;
        let gateway = Arc::new(Gateway::new(
            &format!("http://{address}"),
            concurrency,
            timeout,
        )?);
        let exe = executable();
        let mut command = tokio::process::Command::new(&exe);
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("CELLGATE_") {
                command.env_remove(name);
            }
        }
        command
            .arg("--log")
            .arg("warn")
            .arg("serve")
            .arg("--listen")
            .arg(&address)
            .arg("--datastores")
            .arg(datastores)
            .arg("--config")
            .arg(&config);
        match database.map(|d| (&d.embedded_dir, &d.url)) {
            Some((Some(dir), _)) => {
                command.arg("--data").arg(dir);
            }
            // `--database` through its environment twin, so that a password
            // in the URL does not show in the process list.
            Some((None, url)) => {
                command.env("CELLGATE_DATABASE_URL", url);
            }
            // The data directory holds only files of the gateway itself
            // then (e.g. a snowflake worker's cache): never the caller's.
            None => {
                command.arg("--data").arg(work_dir.join("data"));
            }
        }
        command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log_file)
            .kill_on_drop(true);

        let spawned = Instant::now();
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start `{} serve`", exe.display()))?;
        let stdout = child.stdout.take().context("no stdout of the server")?;
        let (listening_tx, mut listening_rx) = tokio::sync::oneshot::channel();
        // Reads the output to its end, so the server never blocks on a
        // full pipe.
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            let mut listening = Some(listening_tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if line.starts_with("cellgate listening on ") {
                    if let Some(tx) = listening.take() {
                        let _ = tx.send(spawned.elapsed());
                    }
                }
            }
        });

        let mut server = Server {
            child,
            gateway,
            cold_start: ColdStart {
                listening_ms: None,
                ready_ms: 0.0,
            },
        };
        loop {
            if let Some(status) = server.child.try_wait().context("cannot watch the server")? {
                let tail = std::fs::read_to_string(&log).unwrap_or_default();
                anyhow::bail!(
                    "the server stopped before it was ready ({status}): {}",
                    truncate(tail.trim(), 2000)
                );
            }
            let elapsed = spawned.elapsed();
            anyhow::ensure!(
                elapsed < START_TIMEOUT,
                "the server was not ready within {START_TIMEOUT:?} (log: {})",
                log.display()
            );
            if let Ok(200) = server.gateway.readyz(Duration::from_secs(2)).await {
                server.cold_start.ready_ms = spawned.elapsed().as_secs_f64() * 1000.0;
                break;
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
        // The line is printed before the server answers, so it is there by
        // now (or never will be, from a version that prints another one).
        if let Ok(Ok(at)) =
            tokio::time::timeout(Duration::from_millis(500), &mut listening_rx).await
        {
            server.cold_start.listening_ms = Some(at.as_secs_f64() * 1000.0);
        }
        Ok(server)
    }

    /// Stops the server: SIGTERM, then SIGKILL if it has not exited within
    /// [`STOP_TIMEOUT`].
    pub async fn stop(mut self) -> anyhow::Result<()> {
        #[cfg(unix)]
        if let Some(pid) = self.child.id() {
            let sent = tokio::process::Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .await;
            if matches!(sent, Ok(status) if status.success())
                && tokio::time::timeout(STOP_TIMEOUT, self.child.wait())
                    .await
                    .is_ok()
            {
                return Ok(());
            }
        }
        self.child.kill().await.context("cannot stop the server")?;
        Ok(())
    }
}

/// The `cellgate` executable the servers run, set once at start-up.
static EXECUTABLE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

/// Chooses the `cellgate` executable: `path`, else the `cellgate` beside
/// this executable (as `cargo build` leaves them). Fails when it is not a
/// file, so a run does not fail only after loading its data.
pub fn set_executable(path: Option<PathBuf>) -> anyhow::Result<()> {
    let path = match path {
        Some(path) => path,
        None => std::env::current_exe()
            .context("cannot find this executable")?
            .with_file_name(format!("cellgate{}", std::env::consts::EXE_SUFFIX)),
    };
    anyhow::ensure!(
        path.is_file(),
        "the cellgate executable `{}` does not exist: build it (`cargo build --release -p cellgate`) or give --cellgate PATH",
        path.display()
    );
    let _ = EXECUTABLE.set(path);
    Ok(())
}

fn executable() -> PathBuf {
    EXECUTABLE
        .get()
        .cloned()
        .unwrap_or_else(|| PathBuf::from("cellgate"))
}

/// A free port of 127.0.0.1, as `127.0.0.1:PORT`. It is free when this
/// returns; another process could take it before the server binds it, in
/// which case the server reports that it cannot listen.
fn free_address() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot find a free port on 127.0.0.1")?;
    let address = listener.local_addr().context("cannot read the free port")?;
    Ok(address.to_string())
}

/// The directory for the server's files.
pub fn work_dir() -> anyhow::Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix("cellgate-bench-")
        .tempdir()
        .context("cannot create a temporary directory")
}
