//! Private replicated database servers for tests of reads from replicas:
//! [`MariaDbPair`] (a master with binary logging, ROW format, and a replica
//! following it with GTID-based asynchronous replication,
//! `MASTER_USE_GTID=slave_pos`) and [`PostgresPair`] (a primary and a hot
//! standby made with `pg_basebackup -R`, streaming through a physical
//! replication slot). Each server has its own data directory in the pair's
//! temp directory and its own free loopback port; the replica is read-only.
//! Both pairs hold a database `cellgate`, created on the master and
//! replicated, so the replica proves replication works before a test
//! starts.
//!
//! A test drives the failures the replica-read feature must survive: a
//! master or a replica killed (`kill -9`) and restarted on its data
//! directory (replication resumes by itself), a master that stops
//! answering without closing its connections (`SIGSTOP`, then `SIGCONT`),
//! and a replica that applies what it receives only after a delay
//! (MariaDB's `MASTER_DELAY`, PostgreSQL's `recovery_min_apply_delay`),
//! so a fresh write is on the master and not yet on the replica.
//! [`MariaDbPair::wait_replica_caught_up`] (and its PostgreSQL twin) waits,
//! bounded, until the replica has applied everything the master had
//! committed when it was called: GTID positions on MariaDB, the replayed
//! WAL position against the primary's on PostgreSQL.
//! `wait_replica_received` waits until the replica has received it,
//! applied or not, so a test can tell a delayed replica from a slow one.
//! Every wait here is bounded and fails with the servers' state, never on
//! how long it took.
//!
//! The retry intervals are short (`MASTER_CONNECT_RETRY=1`,
//! `wal_retrieve_retry_interval=200ms`), so a replica reconnects within a
//! second of its master's restart instead of a minute. Commits reach the OS
//! at once but the disk only lazily (`innodb_flush_log_at_trx_commit=2`,
//! `fsync=off`): a killed process loses nothing, and the tests do not wait
//! for the disk. Everything is killed when the pair is dropped, also when
//! the test fails.
//!
//! The programs are found as `support/mariadb.rs` and `support/postgres.rs`
//! find them (plus `pg_basebackup`); `start` says why a pair cannot run
//! without them, and the test hands that to `servers::skip`. PostgreSQL
//! runs as the `postgres` user when the tests run as root. Uses
//! `crate::servers` and `crate::postgres`.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sqlx::Connection as _;

use crate::postgres::Postgres;
use crate::servers;

/// The longest wait for a server to start, a replica to catch up, or a
/// statement of the harness to be answered.
const WAIT: Duration = Duration::from_secs(90);
/// The longest wait for one connection or statement of the harness.
const STATEMENT: Duration = Duration::from_secs(5);

/// One server process of a pair.
struct Node {
    /// `master` or `replica`, for messages.
    role: &'static str,
    /// Holds the data directory `data` and the log.
    dir: PathBuf,
    port: u16,
    process: Option<Child>,
    /// Processes stopped by `SIGSTOP`, to continue.
    stopped: Vec<u32>,
}

impl Node {
    fn new(role: &'static str, parent: &Path) -> Node {
        let dir = parent.join(role);
        std::fs::create_dir_all(&dir).unwrap();
        Node {
            role,
            dir,
            port: servers::free_port(),
            process: None,
            stopped: Vec::new(),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn log(&self) -> String {
        let log = std::fs::read_to_string(self.log_file()).unwrap_or_default();
        // The end says why it failed; the start is the same every time.
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    fn pid(&self) -> u32 {
        self.process
            .as_ref()
            .unwrap_or_else(|| panic!("the {} is not running", self.role))
            .id()
    }

    /// `kill -9` of the server (and whatever it had stopped), waiting for
    /// it to exit.
    fn kill(&mut self) {
        for pid in self.stopped.drain(..) {
            signal(pid, "KILL");
        }
        if let Some(mut child) = self.process.take() {
            signal(child.id(), "KILL");
            let _ = child.wait();
        }
    }

    /// `kill -9` of the server and its data directory deleted.
    fn lose(&mut self) {
        self.kill();
        std::fs::remove_dir_all(self.data()).unwrap();
    }

    /// Stops `pids` with `SIGSTOP`, to continue them in [`Node::resume`].
    fn stop(&mut self, pids: Vec<u32>) {
        for &pid in &pids {
            signal(pid, "STOP");
        }
        self.stopped.extend(pids);
    }

    fn resume(&mut self) {
        for pid in self.stopped.drain(..) {
            signal(pid, "CONT");
        }
    }

    /// Starts `command` until it stays up and `answers` connects to it:
    /// after a kill, the old process may hold the port (MariaDB) or its
    /// shared memory (PostgreSQL) a moment longer, and the new one exits.
    async fn start<F, Fut>(&mut self, mut command: impl FnMut() -> Command, answers: F)
    where
        F: Fn(u16) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let deadline = Instant::now() + WAIT;
        loop {
            let log = std::fs::File::options()
                .create(true)
                .append(true)
                .open(self.log_file())
                .unwrap();
            let mut child = command().stdout(Stdio::null()).stderr(log).spawn().unwrap();
            while child.try_wait().unwrap().is_none() {
                if answers(self.port).await {
                    self.process = Some(child);
                    return;
                }
                self.check(deadline, "did not start");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            self.check(deadline, "did not start");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Fails the test with the end of the log once `deadline` has passed.
    fn check(&self, deadline: Instant, what: &str) {
        assert!(
            Instant::now() < deadline,
            "the {} {what}; its log ends:\n{}",
            self.role,
            self.log()
        );
    }
}

/// Sends `signal` (`KILL`, `STOP`, `CONT`, …) to process `pid`.
fn signal(pid: u32, signal: &str) {
    let _ = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status();
}

/// The processes whose parent is `pid` (read from `/proc`).
fn children(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // `pid (comm) state ppid …`; the name may hold spaces and parens.
            let ppid: u32 = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            (ppid == pid).then_some(child)
        })
        .collect()
}

/// Runs `what` at most [`STATEMENT`]; its error, or that it timed out, as
/// text.
async fn bounded<T, E: std::fmt::Display>(
    what: impl std::future::Future<Output = Result<T, E>>,
) -> Result<T, String> {
    match tokio::time::timeout(STATEMENT, what).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err(format!("no answer within {STATEMENT:?}")),
    }
}

/// A MariaDB master and its GTID replica on loopback; killed when dropped.
pub struct MariaDbPair {
    server: PathBuf,
    dir: tempfile::TempDir,
    master: Node,
    replica: Node,
}

impl MariaDbPair {
    /// Installs both servers, starts them, points the replica at the
    /// master, creates `cellgate` on the master and waits until the
    /// replica has it; or says which program is missing.
    pub async fn start() -> Result<MariaDbPair, String> {
        let install = servers::find_program("mariadb-install-db")
            .ok_or("MariaDB's mariadb-install-db not found")?;
        let server =
            servers::find_program("mariadbd").ok_or("MariaDB's server mariadbd not found")?;
        let dir = tempfile::tempdir().unwrap();
        let mut pair = MariaDbPair {
            server,
            master: Node::new("master", dir.path()),
            replica: Node::new("replica", dir.path()),
            dir,
        };
        // One after the other: two installations at once have failed on
        // each other's temporary tables.
        for node in [&pair.master, &pair.replica] {
            let output = Command::new(&install)
                .arg("--no-defaults")
                .arg(format!("--datadir={}", node.data().display()))
                .arg(format!("--user={}", servers::user_name()))
                .args([
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                    "--innodb-log-file-size=16M",
                ])
                .env("TMPDIR", &node.dir)
                .current_dir(&node.dir)
                .output()
                .unwrap();
            assert!(
                output.status.success(),
                "mariadb-install-db failed: {}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        pair.restart_master().await;
        pair.restart_replica().await;
        let master_port = pair.master.port;
        pair.replica_sql(&format!(
            "CHANGE MASTER TO MASTER_HOST='127.0.0.1', MASTER_PORT={master_port}, \
             MASTER_USER='root', MASTER_PASSWORD='', MASTER_USE_GTID=slave_pos, \
             MASTER_CONNECT_RETRY=1; START SLAVE"
        ))
        .await;
        let mut master = Self::connect(&pair.server_url(&pair.master))
            .await
            .expect("connect to the master");
        sqlx::raw_sql("CREATE DATABASE cellgate")
            .execute(&mut master)
            .await
            .expect("create the database");
        let _ = master.close().await;
        pair.wait_replica_caught_up().await;
        let replica = Self::connect(&pair.replica_url())
            .await
            .expect("the database cellgate is replicated");
        let _ = replica.close().await;
        Ok(pair)
    }

    /// The database `cellgate` on the master.
    pub fn master_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/cellgate", self.master.port)
    }

    /// The database `cellgate` on the replica.
    pub fn replica_url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/cellgate", self.replica.port)
    }

    fn server_url(&self, node: &Node) -> String {
        format!("mysql://root@127.0.0.1:{}/", node.port)
    }

    async fn connect(url: &str) -> Result<sqlx::MySqlConnection, String> {
        bounded(sqlx::MySqlConnection::connect(url)).await
    }

    /// `kill -9` of the master.
    pub fn kill_master(&mut self) {
        self.master.kill();
    }

    /// `kill -9` of the master, and its data directory deleted: the
    /// master and whatever only it had are gone for good.
    pub fn lose_master(&mut self) {
        self.master.lose();
    }

    /// The replica's port.
    pub fn replica_port(&self) -> u16 {
        self.replica.port
    }

    /// The master's port.
    pub fn master_port(&self) -> u16 {
        self.master.port
    }

    /// Starts the master on its data directory (after
    /// [`MariaDbPair::kill_master`]) and waits until it answers; the
    /// replica reconnects by itself.
    pub async fn restart_master(&mut self) {
        let args = [
            "--server-id=1",
            "--log-bin=mysql-bin",
            "--binlog-format=ROW",
            "--gtid-strict-mode=ON",
        ];
        self.start_node(true, &args).await;
    }

    /// `kill -9` of the replica.
    pub fn kill_replica(&mut self) {
        self.replica.kill();
    }

    /// Starts the replica on its data directory (after
    /// [`MariaDbPair::kill_replica`]); replication starts again from the
    /// replica's GTID position by itself. The replica logs what it applies
    /// too (`log_slave_updates`), so it can become a master.
    pub async fn restart_replica(&mut self) {
        let args = [
            "--server-id=2",
            "--read-only=ON",
            "--relay-log=relay-bin",
            "--log-bin=mysql-bin",
            "--log-slave-updates=ON",
            "--binlog-format=ROW",
            "--gtid-strict-mode=ON",
        ];
        self.start_node(false, &args).await;
    }

    async fn start_node(&mut self, master: bool, args: &[&str]) {
        let server = self.server.clone();
        let node = if master {
            &mut self.master
        } else {
            &mut self.replica
        };
        let (dir, data, port) = (node.dir.clone(), node.data(), node.port);
        let command = || {
            let mut command = Command::new(&server);
            command
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg(format!("--port={port}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--socket={}", dir.join("mysqld.sock").display()))
                .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
                .arg(format!("--tmpdir={}", dir.display()))
                .arg(format!("--user={}", servers::user_name()))
                .args([
                    "--skip-name-resolve",
                    "--innodb-log-file-size=16M",
                    "--innodb-flush-log-at-trx-commit=2",
                    "--max-connections=500",
                ])
                .args(args)
                .current_dir(&dir);
            command
        };
        let answers = |port: u16| async move {
            let url = format!("mysql://root@127.0.0.1:{port}/");
            match Self::connect(&url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    true
                }
                Err(_) => false,
            }
        };
        node.start(command, answers).await;
    }

    /// Stops the master process (`SIGSTOP`): it keeps its connections and
    /// answers nothing until [`MariaDbPair::resume_master`].
    pub fn stop_master_answering(&mut self) {
        let pid = self.master.pid();
        self.master.stop(vec![pid]);
    }

    /// Continues the master process (`SIGCONT`).
    pub fn resume_master(&mut self) {
        self.master.resume();
    }

    /// Makes the replica apply each transaction `secs` seconds after the
    /// master committed it (`CHANGE MASTER TO MASTER_DELAY`), `0` for no
    /// delay. Takes effect before it returns: the replication threads are
    /// stopped and started again around the change.
    pub async fn set_replica_delay(&self, secs: u32) {
        self.replica_sql(&format!(
            "STOP SLAVE; CHANGE MASTER TO MASTER_DELAY={secs}; START SLAVE"
        ))
        .await;
    }

    /// Stops the replica receiving the master's binary log (`STOP SLAVE
    /// IO_THREAD`): what the master commits from now on is not on the
    /// replica, as with a replica far behind when its master dies.
    pub async fn hold_back_replica(&mut self) {
        self.replica_sql("STOP SLAVE IO_THREAD").await;
    }

    /// Makes the replica a master: replication stopped and forgotten
    /// (`RESET SLAVE ALL`), writable.
    pub async fn promote_replica(&mut self) {
        self.replica_sql("STOP SLAVE; RESET SLAVE ALL; SET GLOBAL read_only = OFF")
            .await;
    }

    /// Runs `sql` (statements separated by `;`) on the replica.
    async fn replica_sql(&self, sql: &str) {
        let mut conn = Self::connect(&self.server_url(&self.replica))
            .await
            .expect("connect to the replica");
        bounded(sqlx::raw_sql(sql).execute(&mut conn))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        let _ = conn.close().await;
    }

    /// A server's GTID position: what the master has logged, or what the
    /// replica has applied.
    async fn gtid_position(&self, node: &Node, variable: &str) -> Result<String, String> {
        let mut conn = Self::connect(&self.server_url(node)).await?;
        let sql = format!("SELECT CAST(@@{variable} AS CHAR)");
        let position: Option<String> = bounded(sqlx::query_scalar(&sql).fetch_one(&mut conn))
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
        let _ = conn.close().await;
        Ok(position.unwrap_or_default())
    }

    /// What the replica has received from the master, applied or not
    /// (`Gtid_IO_Pos` of `SHOW SLAVE STATUS`).
    async fn received_position(&self) -> Result<String, String> {
        use sqlx::Row as _;
        let mut conn = Self::connect(&self.server_url(&self.replica)).await?;
        // No row when the replica has no master.
        let status = bounded(sqlx::raw_sql("SHOW SLAVE STATUS").fetch_one(&mut conn)).await?;
        let _ = conn.close().await;
        status
            .try_get::<String, _>("Gtid_IO_Pos")
            .or_else(|_| {
                let bytes: Vec<u8> = status.try_get("Gtid_IO_Pos")?;
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            })
            .map_err(|e: sqlx::Error| e.to_string())
    }

    /// Waits until the replica has received every transaction the master
    /// had logged when this was called, whether it has applied them or
    /// not (with a delay, it has not); fails the test after a bounded wait.
    pub async fn wait_replica_received(&self) {
        let target = self.master_position().await;
        let deadline = Instant::now() + WAIT;
        let mut received = Err(String::from("not asked yet"));
        while Instant::now() < deadline {
            received = self.received_position().await;
            if let Ok(received) = &received {
                if gtid_reached(received, &target) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the replica did not receive the master's GTID position {target:?} \
             within {WAIT:?} (it has received {received:?}); its log ends:\n{}",
            self.replica.log()
        );
    }

    /// The master's GTID position, waiting (bounded) for it to answer.
    async fn master_position(&self) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            match self.gtid_position(&self.master, "gtid_binlog_pos").await {
                Ok(target) => return target,
                Err(e) => assert!(
                    Instant::now() < deadline,
                    "the master does not tell its GTID position: {e}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the replica has applied every transaction the master had
    /// logged when this was called (`gtid_slave_pos` reaches the master's
    /// `gtid_binlog_pos` in every replication domain); fails the test with
    /// the replica's state after a bounded wait.
    pub async fn wait_replica_caught_up(&self) {
        let target = self.master_position().await;
        let deadline = Instant::now() + WAIT;
        let mut applied = Err(String::from("not asked yet"));
        while Instant::now() < deadline {
            applied = self.gtid_position(&self.replica, "gtid_slave_pos").await;
            if let Ok(applied) = &applied {
                if gtid_reached(applied, &target) {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the replica did not reach the master's GTID position {target:?} \
             within {WAIT:?} (it has applied {applied:?}); its log ends:\n{}",
            self.replica.log()
        );
    }
}

/// Whether GTID position `applied` includes `target`: in every domain of
/// `target`, a sequence number at least as high (positions are lists of
/// `domain-server-sequence`).
fn gtid_reached(applied: &str, target: &str) -> bool {
    let parse = |position: &str| -> Vec<(u32, u64)> {
        position
            .split(',')
            .filter_map(|gtid| {
                let mut parts = gtid.trim().split('-');
                let domain = parts.next()?.parse().ok()?;
                let sequence = parts.nth(1)?.parse().ok()?;
                Some((domain, sequence))
            })
            .collect()
    };
    let applied = parse(applied);
    parse(target)
        .into_iter()
        .all(|(domain, sequence)| applied.iter().any(|&(d, s)| d == domain && s >= sequence))
}

impl Drop for MariaDbPair {
    fn drop(&mut self) {
        // Their data goes with the temp directory: no clean shutdown.
        self.replica.kill();
        self.master.kill();
    }
}

/// A PostgreSQL primary and its streaming hot standby on loopback; killed
/// when dropped.
pub struct PostgresPair {
    bin: PathBuf,
    dir: tempfile::TempDir,
    /// The servers' user and group when the tests run as root.
    owner: Option<(u32, u32)>,
    master: Node,
    replica: Node,
}

/// The physical replication slot the standby streams through, so the
/// primary keeps the WAL a stopped standby has not received.
const SLOT: &str = "cellgate_replica";

impl PostgresPair {
    /// Initializes and starts the primary, creates `cellgate` there, makes
    /// the standby from a base backup of it and starts it, and waits until
    /// the standby has `cellgate`; or says which program is missing.
    pub async fn start() -> Result<PostgresPair, String> {
        // The installation's own directory: `PATH` may hold links to some
        // of its programs only (`initdb`, `postgres`).
        let bin = Postgres::binaries()
            .and_then(|bin| std::fs::canonicalize(bin.join("postgres")).ok())
            .and_then(|postgres| postgres.parent().map(Path::to_path_buf))
            .filter(|bin| {
                ["initdb", "postgres", "pg_basebackup"]
                    .iter()
                    .all(|program| bin.join(program).is_file())
            })
            .ok_or("PostgreSQL server binaries (initdb, postgres, pg_basebackup) not found")?;
        let dir = tempfile::tempdir().unwrap();
        let owner = if servers::running_as_root() {
            let owner =
                Postgres::postgres_user().ok_or("running as root without a postgres user")?;
            std::os::unix::fs::chown(dir.path(), Some(owner.0), Some(owner.1)).unwrap();
            Some(owner)
        } else {
            None
        };
        let mut pair = PostgresPair {
            bin,
            owner,
            master: Node::new("primary", dir.path()),
            replica: Node::new("standby", dir.path()),
            dir,
        };
        for node in [&pair.master, &pair.replica] {
            if let Some((uid, gid)) = pair.owner {
                std::os::unix::fs::chown(&node.dir, Some(uid), Some(gid)).unwrap();
            }
        }
        let output = pair
            .command("initdb")
            .arg("-D")
            .arg(pair.master.data())
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        pair.restart_master().await;
        let mut primary = Self::connect(&pair.url(&pair.master, "postgres"))
            .await
            .expect("connect to the primary");
        sqlx::raw_sql("CREATE DATABASE cellgate")
            .execute(&mut primary)
            .await
            .expect("create the database");
        let _ = primary.close().await;
        let output = pair
            .command("pg_basebackup")
            .args(["-h", "127.0.0.1", "-p", &pair.master.port.to_string()])
            .args(["-U", "postgres", "-D"])
            .arg(pair.replica.data())
            .args(["-R", "-X", "stream", "-c", "fast", "-N", "-C", "-S", SLOT])
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "pg_basebackup failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        pair.restart_replica().await;
        pair.wait_replica_caught_up().await;
        Ok(pair)
    }

    /// `program` of the installation, run as the servers' user.
    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin.join(program));
        command.current_dir(self.dir.path());
        if let Some((uid, gid)) = self.owner {
            use std::os::unix::process::CommandExt as _;
            command.uid(uid).gid(gid);
        }
        command
    }

    fn url(&self, node: &Node, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", node.port)
    }

    /// The database `cellgate` on the primary.
    pub fn master_url(&self) -> String {
        self.url(&self.master, "cellgate")
    }

    /// The database `cellgate` on the standby.
    pub fn replica_url(&self) -> String {
        self.url(&self.replica, "cellgate")
    }

    async fn connect(url: &str) -> Result<sqlx::PgConnection, String> {
        bounded(sqlx::PgConnection::connect(url)).await
    }

    /// `kill -9` of the primary's postmaster; its sessions notice and exit.
    pub fn kill_master(&mut self) {
        self.master.kill();
    }

    /// `kill -9` of the primary, and its data directory deleted.
    pub fn lose_master(&mut self) {
        self.master.lose();
    }

    /// The standby's port.
    pub fn replica_port(&self) -> u16 {
        self.replica.port
    }

    /// The primary's port.
    pub fn master_port(&self) -> u16 {
        self.master.port
    }

    /// Starts the primary on its data directory and waits until it answers;
    /// the standby reconnects by itself.
    pub async fn restart_master(&mut self) {
        self.start_node(true).await;
    }

    /// `kill -9` of the standby's postmaster.
    pub fn kill_replica(&mut self) {
        self.replica.kill();
    }

    /// Starts the standby on its data directory: it recovers, then streams
    /// from the primary again where it stopped.
    pub async fn restart_replica(&mut self) {
        self.start_node(false).await;
    }

    async fn start_node(&mut self, master: bool) {
        let node = if master { &self.master } else { &self.replica };
        let (data, port) = (node.data(), node.port.to_string());
        let (program, owner, cwd) = (
            self.bin.join("postgres"),
            self.owner,
            self.dir.path().to_owned(),
        );
        let command = || {
            let mut command = Command::new(&program);
            command
                .arg("-D")
                .arg(&data)
                .args(["-p", &port])
                .args(["-c", "listen_addresses=127.0.0.1"])
                .args(["-c", "unix_socket_directories="])
                .args(["-c", "fsync=off"])
                .args(["-c", "wal_retrieve_retry_interval=200ms"])
                .current_dir(&cwd);
            if let Some((uid, gid)) = owner {
                use std::os::unix::process::CommandExt as _;
                command.uid(uid).gid(gid);
            }
            command
        };
        // The standby accepts connections once its data is consistent.
        let answers = |port: u16| async move {
            let url = format!("postgres://postgres@127.0.0.1:{port}/postgres");
            match Self::connect(&url).await {
                Ok(conn) => {
                    let _ = conn.close().await;
                    true
                }
                Err(_) => false,
            }
        };
        let node = if master {
            &mut self.master
        } else {
            &mut self.replica
        };
        node.start(command, answers).await;
    }

    /// Stops the primary (`SIGSTOP`): its postmaster first, so it starts
    /// no process meanwhile, then every process it started. Each session
    /// of PostgreSQL is a process of its own, so stopping the postmaster
    /// alone would leave open connections answering. Nothing answers until
    /// [`PostgresPair::resume_master`].
    pub fn stop_master_answering(&mut self) {
        let postmaster = self.master.pid();
        self.master.stop(vec![postmaster]);
        self.master.stop(children(postmaster));
    }

    /// Continues the primary's processes (`SIGCONT`).
    pub fn resume_master(&mut self) {
        self.master.resume();
    }

    /// Stops the standby receiving WAL (`SIGSTOP` of its WAL receiver):
    /// what the primary commits from now on is not on the standby, as with
    /// a standby far behind when its primary dies.
    pub async fn hold_back_replica(&mut self) {
        let url = self.url(&self.replica, "postgres");
        let deadline = Instant::now() + WAIT;
        let pid = loop {
            let mut conn = Self::connect(&url).await.expect("connect to the standby");
            let pid: Option<i32> = bounded(
                sqlx::query_scalar("SELECT pid FROM pg_stat_wal_receiver")
                    .fetch_optional(&mut conn),
            )
            .await
            .expect("read the WAL receiver");
            let _ = conn.close().await;
            if let Some(pid) = pid {
                break pid as u32;
            }
            assert!(Instant::now() < deadline, "the standby has no WAL receiver");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        self.replica.stop(vec![pid]);
    }

    /// Makes the standby a primary: its held-back WAL receiver killed (the
    /// standby restarts its processes and recovers what it has on disk),
    /// then `pg_promote()`, waiting until it accepts writes.
    pub async fn promote_replica(&mut self) {
        for pid in std::mem::take(&mut self.replica.stopped) {
            signal(pid, "KILL");
        }
        let url = self.url(&self.replica, "postgres");
        let deadline = Instant::now() + WAIT;
        loop {
            if let Ok(mut conn) = Self::connect(&url).await {
                let promoted: Result<bool, String> =
                    bounded(sqlx::query_scalar("SELECT pg_promote(true, 60)").fetch_one(&mut conn))
                        .await;
                let _ = conn.close().await;
                if promoted == Ok(true) {
                    return;
                }
            }
            self.replica.check(deadline, "was not promoted");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Makes the standby apply each commit `secs` seconds after the primary
    /// made it (`recovery_min_apply_delay`, set with `ALTER SYSTEM` and
    /// `pg_reload_conf()`), `0` for no delay. Returns once a new session
    /// sees the setting: the postmaster has read it and passed the reload
    /// on to the startup process that applies the WAL, which reads it when
    /// it wakes, at once.
    pub async fn set_replica_delay(&self, secs: u32) {
        let url = self.url(&self.replica, "postgres");
        let mut conn = Self::connect(&url).await.expect("connect to the standby");
        // Two statements: ALTER SYSTEM refuses to run in the transaction
        // that a multi-statement query is.
        let alter = format!("ALTER SYSTEM SET recovery_min_apply_delay = '{secs}s'");
        for sql in [alter.as_str(), "SELECT pg_reload_conf()"] {
            bounded(sqlx::raw_sql(sql).execute(&mut conn))
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e}"));
        }
        let _ = conn.close().await;
        // In milliseconds, the setting's unit.
        let want = (u64::from(secs) * 1000).to_string();
        let deadline = Instant::now() + WAIT;
        loop {
            let mut conn = Self::connect(&url).await.expect("connect to the standby");
            let got: String = bounded(
                sqlx::query_scalar(
                    "SELECT setting FROM pg_settings WHERE name = 'recovery_min_apply_delay'",
                )
                .fetch_one(&mut conn),
            )
            .await
            .expect("read recovery_min_apply_delay");
            let _ = conn.close().await;
            if got == want {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the standby did not take recovery_min_apply_delay = {want} ms (it has {got})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A WAL position (`pg_lsn` as text) read with `sql` from `node`.
    async fn lsn(&self, node: &Node, sql: &str) -> Result<Option<u64>, String> {
        let mut conn = Self::connect(&self.url(node, "postgres")).await?;
        let lsn: Option<String> = bounded(sqlx::query_scalar(sql).fetch_one(&mut conn))
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
        let _ = conn.close().await;
        Ok(lsn.as_deref().and_then(parse_lsn))
    }

    /// Waits until the standby has replayed the WAL the primary had written
    /// when this was called (`pg_last_wal_replay_lsn()` reaches
    /// `pg_current_wal_lsn()`); fails the test with the standby's state
    /// after a bounded wait.
    pub async fn wait_replica_caught_up(&self) {
        self.wait_standby("replayed", "SELECT pg_last_wal_replay_lsn()::text")
            .await
    }

    /// Waits until the standby has received the WAL the primary had written
    /// when this was called (`pg_last_wal_receive_lsn()`), replayed or not
    /// (with a delay, it has not); fails the test after a bounded wait.
    pub async fn wait_replica_received(&self) {
        self.wait_standby("received", "SELECT pg_last_wal_receive_lsn()::text")
            .await
    }

    /// Waits until the WAL position `sql` reads on the standby reaches the
    /// primary's current one.
    async fn wait_standby(&self, what: &str, sql: &str) {
        let deadline = Instant::now() + WAIT;
        let target = loop {
            match self
                .lsn(&self.master, "SELECT pg_current_wal_lsn()::text")
                .await
            {
                Ok(Some(target)) => break target,
                other => assert!(
                    Instant::now() < deadline,
                    "the primary does not tell its WAL position: {other:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let mut reached = Err(String::from("not asked yet"));
        while Instant::now() < deadline {
            reached = self.lsn(&self.replica, sql).await;
            if matches!(reached, Ok(Some(lsn)) if lsn >= target) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!(
            "the standby has not {what} the primary's WAL up to {target:X} \
             within {WAIT:?} (it has {what} {reached:X?}); its log ends:\n{}",
            self.replica.log()
        );
    }
}

/// A `pg_lsn` in its text form (`16/B374D848`) as a number.
fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    Some((u64::from_str_radix(high, 16).ok()? << 32) | u64::from_str_radix(low, 16).ok()?)
}

impl Drop for PostgresPair {
    fn drop(&mut self) {
        // The sessions of a killed postmaster exit by themselves once they
        // run; stopped ones are killed with it.
        self.replica.kill();
        self.master.kill();
    }
}

/// A replicated pair of either kind, for tests that run on both.
pub trait Pair: Sized {
    /// `MariaDB` or `PostgreSQL`.
    const KIND: &'static str;
    async fn start() -> Result<Self, String>;
    fn master_url(&self) -> String;
    fn replica_url(&self) -> String;
    fn kill_master(&mut self);
    async fn restart_master(&mut self);
    fn kill_replica(&mut self);
    async fn restart_replica(&mut self);
    fn stop_master_answering(&mut self);
    fn resume_master(&mut self);
    async fn set_replica_delay(&self, secs: u32);
    async fn wait_replica_received(&self);
    async fn wait_replica_caught_up(&self);
    async fn hold_back_replica(&mut self);
    fn lose_master(&mut self);
    async fn promote_replica(&mut self);
    fn master_port(&self) -> u16;
    fn replica_port(&self) -> u16;
}

macro_rules! pair {
    ($ty:ty, $kind:literal) => {
        impl Pair for $ty {
            const KIND: &'static str = $kind;
            async fn start() -> Result<Self, String> {
                <$ty>::start().await
            }
            fn master_url(&self) -> String {
                <$ty>::master_url(self)
            }
            fn replica_url(&self) -> String {
                <$ty>::replica_url(self)
            }
            fn kill_master(&mut self) {
                <$ty>::kill_master(self)
            }
            async fn restart_master(&mut self) {
                <$ty>::restart_master(self).await
            }
            fn kill_replica(&mut self) {
                <$ty>::kill_replica(self)
            }
            async fn restart_replica(&mut self) {
                <$ty>::restart_replica(self).await
            }
            fn stop_master_answering(&mut self) {
                <$ty>::stop_master_answering(self)
            }
            fn resume_master(&mut self) {
                <$ty>::resume_master(self)
            }
            async fn set_replica_delay(&self, secs: u32) {
                <$ty>::set_replica_delay(self, secs).await
            }
            async fn wait_replica_received(&self) {
                <$ty>::wait_replica_received(self).await
            }
            async fn wait_replica_caught_up(&self) {
                <$ty>::wait_replica_caught_up(self).await
            }
            async fn hold_back_replica(&mut self) {
                <$ty>::hold_back_replica(self).await
            }
            fn lose_master(&mut self) {
                <$ty>::lose_master(self)
            }
            async fn promote_replica(&mut self) {
                <$ty>::promote_replica(self).await
            }
            fn master_port(&self) -> u16 {
                <$ty>::master_port(self)
            }
            fn replica_port(&self) -> u16 {
                <$ty>::replica_port(self)
            }
        }
    };
}
pair!(MariaDbPair, "MariaDB");
pair!(PostgresPair, "PostgreSQL");
