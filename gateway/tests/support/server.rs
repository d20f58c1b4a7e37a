//! The real `cellgate serve` for integration tests: started on a free port
//! (`--listen 127.0.0.1:0`) in a temp directory, with no `CELLGATE_*` or
//! `RUST_LOG` variables inherited; the bound address is read from the line
//! it prints. The process is killed when the [`Server`] is dropped, also
//! when the test fails.

// Each test crate uses a different part of this module.
#![allow(dead_code)]

use std::ffi::OsString;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The workspace root, where `datastores/` and `cellgate.example.yaml` live.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// Copies the directory `from` (a definitions directory) to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// `cellgate` with no `CELLGATE_*` or `RUST_LOG` variables inherited.
pub fn cellgate(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_cellgate"));
    command.current_dir(dir);
    for (name, _) in std::env::vars_os() {
        let name_str = name.to_string_lossy();
        if name_str.starts_with("CELLGATE_") || name_str == "RUST_LOG" {
            command.env_remove(&name);
        }
    }
    command
}

/// A running `cellgate serve`, killed on drop.
pub struct Server {
    pub child: Child,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    /// What it printed before the listening line.
    pub preamble: Vec<String>,
    pub dir: tempfile::TempDir,
}

impl Server {
    /// Starts `cellgate serve` with a fresh data directory and the
    /// repository's definitions, plus `extra` arguments.
    pub fn start(extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut args: Vec<OsString> = vec!["--data".into(), dir.path().join("data").into()];
        args.push("--datastores".into());
        args.push(root().join("datastores").into());
        args.extend(extra.iter().map(OsString::from));
        Server::start_in(dir, args)
    }

    /// Like [`Server::start`], with the data directory `<dir>/data`, which
    /// may already hold a store.
    pub fn start_on(dir: tempfile::TempDir, extra: &[&str]) -> Server {
        let mut args: Vec<OsString> = vec!["--data".into(), dir.path().join("data").into()];
        args.push("--datastores".into());
        args.push(root().join("datastores").into());
        args.extend(extra.iter().map(OsString::from));
        Server::start_in(dir, args)
    }

    /// Kills the server and hands back its directory, to start another
    /// server on the same store.
    pub fn stop(mut self) -> tempfile::TempDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("temp dir"))
    }

    /// Starts `cellgate serve --listen 127.0.0.1:0 ARGS` in `dir`, which the
    /// server keeps (and removes when it is dropped).
    pub fn start_in(dir: tempfile::TempDir, args: Vec<OsString>) -> Server {
        Server::start_in_env(dir, args, &[])
    }

    /// Like [`Server::start_in`], with the environment variables `env` set.
    pub fn start_in_env(
        dir: tempfile::TempDir,
        args: Vec<OsString>,
        env: &[(&str, &str)],
    ) -> Server {
        let stderr = std::fs::File::create(dir.path().join("stderr.log")).expect("stderr log");
        let mut child = cellgate(dir.path())
            .envs(env.iter().copied())
            .arg("serve")
            .args(["--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start cellgate serve");

        // Read stdout on a thread, so a server that never prints the line
        // fails the test after a timeout instead of hanging it.
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
            preamble: Vec::new(),
            dir,
        };
        loop {
            match lines.recv_timeout(Duration::from_secs(120)) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix("cellgate listening on ") {
                        let url = rest.split_whitespace().next().expect("address");
                        server.base = url.to_string();
                        assert!(
                            line.ends_with(&format!("GraphQL playground at {url}/")),
                            "{line}"
                        );
                        break;
                    }
                    server.preamble.push(line);
                }
                Err(_) => panic!(
                    "cellgate serve did not print its address; stderr:\n{}",
                    server.stderr()
                ),
            }
        }
        server
    }

    /// Starts `cellgate serve` in a fresh temp directory on the
    /// definitions `files` (paths under `datastores/` and their text), with
    /// `config` as its `cellgate.yaml`, `--data` in the directory, and
    /// `extra` arguments.
    pub fn start_with(files: &[(&str, &str)], config: &str, extra: &[&str]) -> Server {
        Server::start_with_env(files, config, extra, &[])
    }

    /// Like [`Server::start_with`], with the environment variables `env`
    /// set for the server.
    pub fn start_with_env(
        files: &[(&str, &str)],
        config: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        let datastores = dir.path().join("datastores");
        for (path, text) in files {
            let path = datastores.join(path);
            std::fs::create_dir_all(path.parent().expect("a file in a directory"))
                .expect("definitions directory");
            std::fs::write(path, text).expect("definition file");
        }
        let config_file = dir.path().join("cellgate.yaml");
        std::fs::write(&config_file, config).expect("cellgate.yaml");
        let mut args: Vec<OsString> = vec![
            "--data".into(),
            dir.path().join("data").into(),
            "--datastores".into(),
            datastores.into(),
            "--config".into(),
            config_file.into(),
        ];
        args.extend(extra.iter().map(OsString::from));
        Server::start_in_env(dir, args, env)
    }

    /// Polls `/readyz` until it answers `status`, for at most `within`.
    pub async fn wait_ready(&self, status: reqwest::StatusCode, within: Duration) {
        let client = client();
        let deadline = std::time::Instant::now() + within;
        loop {
            let got = client
                .get(self.url("/readyz"))
                .send()
                .await
                .map(|r| r.status());
            if got.as_ref().ok() == Some(&status) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "/readyz did not answer {status} within {within:?} (last: {got:?})"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub fn graphql(&self) -> String {
        self.url("/graphql")
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("stderr.log")).unwrap_or_default()
    }
}

/// An HTTP client whose requests give up after a minute, so a hung
/// gateway fails a test instead of stalling it.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("HTTP client")
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
