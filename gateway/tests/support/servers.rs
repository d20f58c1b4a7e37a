//! What the private database servers of the tests share: finding their
//! programs, a free loopback port, and the decision to skip a test when the
//! programs are missing. A test crate that includes `postgres.rs` or
//! `mariadb.rs` includes this file too, as `mod servers` at its root.
//!
//! Tests that start their own servers skip (print why, pass) where the
//! server programs are not installed, so `cargo test` works on a machine
//! with a Rust toolchain alone. With `CELLGATE_TEST_SERVERS=required` (CI
//! sets it) a missing program fails the test instead, so a broken install
//! cannot turn the suite green by skipping it.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// Reports that `test` cannot run, and why: a panic when
/// `CELLGATE_TEST_SERVERS=required`, otherwise a line on stderr (the
/// caller returns).
pub fn skip(test: &str, why: &str) {
    if std::env::var("CELLGATE_TEST_SERVERS").as_deref() == Ok("required") {
        panic!("{test}: {why} (and CELLGATE_TEST_SERVERS=required)");
    }
    eprintln!("skipped {test}: {why} (set CELLGATE_TEST_SERVERS=required to fail instead)");
}

/// A loopback port nothing listens on now. Another process may take it
/// before the server binds it; the tests accept that small race.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind a loopback port")
        .local_addr()
        .expect("its address")
        .port()
}

/// Whether the test runs as root (PostgreSQL refuses to; MariaDB needs to
/// be told to run as root).
pub fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The name of the user the test runs as.
pub fn user_name() -> String {
    Command::new("id")
        .arg("-un")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The first directory of `PATH`, then of `extra`, that holds every one
/// of `programs` (so that they come from one installation).
pub fn find_dir(programs: &[&str], extra: &[PathBuf]) -> Option<PathBuf> {
    let has = |dir: &Path| programs.iter().all(|p| dir.join(p).is_file());
    let mut candidates: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect())
        .unwrap_or_default();
    candidates.extend(extra.iter().cloned());
    candidates.into_iter().find(|dir| has(dir))
}

/// `program` in `PATH` or in the system's `sbin` directories (not on the
/// `PATH` of every user).
pub fn find_program(program: &str) -> Option<PathBuf> {
    let sbin = ["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from);
    find_dir(&[program], &sbin).map(|dir| dir.join(program))
}
