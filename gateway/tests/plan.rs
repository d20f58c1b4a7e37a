//! `cellgate plan` through the binary: every change kind on golden pairs
//! of definitions (`tests/plan/<case>/before` and `after`, expected text
//! and JSON beside them; `UPDATE_EXPECT=1` rewrites them), and against a
//! real git repository of two commits, with the exit statuses CI relies
//! on and the errors of sides that cannot be read.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn cellgate(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cellgate"))
        .current_dir(dir)
        .args(args)
        .env_remove("CELLGATE_DATASTORES")
        .output()
        .expect("run cellgate")
}

fn cases() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/plan")
}

fn shown(output: &Output) -> String {
    format!(
        "exit {}\n{}",
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout)
    )
}

/// Compares `actual` with the file `expected`, or writes it with
/// `UPDATE_EXPECT=1`.
fn expect(expected: &Path, actual: &str) -> Result<(), String> {
    if std::env::var_os("UPDATE_EXPECT").is_some() {
        std::fs::write(expected, actual).unwrap();
        return Ok(());
    }
    let want = std::fs::read_to_string(expected).unwrap_or_default();
    if want == actual {
        Ok(())
    } else {
        Err(format!(
            "{} differs (UPDATE_EXPECT=1 rewrites it):\n--- expected\n{want}\n--- actual\n{actual}",
            expected.display()
        ))
    }
}

#[test]
fn golden_pairs_give_their_plans_in_text_and_json() {
    let mut failures = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(cases())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 5, "{dirs:?}");
    for case in &dirs {
        let text = cellgate(case, &["plan", "after", "--base-dir", "before"]);
        if let Err(e) = expect(&case.join("expected.txt"), &shown(&text)) {
            failures.push(e);
        }
        let json = cellgate(
            case,
            &["plan", "after", "--base-dir", "before", "--format", "json"],
        );
        let value: serde_json::Value =
            serde_json::from_slice(&json.stdout).expect("the JSON plan parses");
        assert_eq!(value["version"], 1);
        assert_eq!(json.status.code(), text.status.code());
        if let Err(e) = expect(&case.join("expected.json"), &shown(&json)) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn exit_statuses_separate_no_change_safe_and_breaking() {
    let status = |case: &str| {
        cellgate(
            &cases().join(case),
            &["plan", "after", "--base-dir", "before"],
        )
        .status
        .code()
    };
    assert_eq!(status("no_change"), Some(0));
    assert_eq!(status("triggers"), Some(3));
    assert_eq!(status("indexes"), Some(4));
    assert_eq!(status("refused_shard_count"), Some(4));
}

#[test]
fn github_annotations_point_at_the_files() {
    let case = cases().join("refused_shard_count");
    let out = cellgate(
        &case,
        &[
            "plan",
            "after",
            "--base-dir",
            "before",
            "--format",
            "github",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().any(
            |l| l.starts_with("::error file=after/orders/datastore.yaml,line=3,")
                && l.contains("shards 64 -> 128")
        ),
        "{text}"
    );
    assert!(text
        .lines()
        .last()
        .unwrap()
        .starts_with("::notice title=cellgate plan::1 refused"));
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.email=plan@example.com", "-c", "user.name=plan"])
        .args(args)
        .status()
        .expect("run git");
    assert!(status.success(), "git {args:?}");
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_pull_request_is_planned_against_its_base_revision() {
    let repo = tempfile::tempdir().unwrap();
    let dir = repo.path();
    git(dir, &["init", "-q"]);
    let defs = dir.join("datastores");
    copy(&cases().join("indexes/before"), &defs);
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", "base"]);
    std::fs::remove_dir_all(&defs).unwrap();
    copy(&cases().join("indexes/after"), &defs);
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "change"]);

    // The pull request's head against its base: the same plan as the
    // directories give.
    let planned = cellgate(dir, &["plan", "datastores", "--base", "HEAD~1"]);
    assert_eq!(planned.status.code(), Some(4), "{}", shown(&planned));
    let text = String::from_utf8_lossy(&planned.stdout);
    let golden = std::fs::read_to_string(cases().join("indexes/expected.txt")).unwrap();
    let lines = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| l.starts_with("  "))
            .map(|l| {
                l.replace("after/", "datastores/")
                    .replace("before/", "datastores/")
            })
            .collect()
    };
    assert_eq!(lines(&text), lines(&golden));
    assert!(
        text.starts_with("cellgate plan: datastores against HEAD~1\n"),
        "{text}"
    );
    // The working tree against the last commit: nothing.
    let clean = cellgate(dir, &["plan", "datastores"]);
    assert_eq!(clean.status.code(), Some(0), "{}", shown(&clean));

    // A revision that does not exist.
    let missing = cellgate(dir, &["plan", "datastores", "--base", "no-such-branch"]);
    assert_eq!(missing.status.code(), Some(1));
    let err = String::from_utf8_lossy(&missing.stderr);
    assert!(
        err.contains("git revision `no-such-branch` does not exist"),
        "{err}"
    );

    // A base whose definitions do not load: its diagnostics, with the file.
    std::fs::write(
        defs.join("orders/datastore.yaml"),
        "name: orders\nshards: [64\n",
    )
    .unwrap();
    git(dir, &["commit", "-q", "-am", "broken"]);
    std::fs::write(
        defs.join("orders/datastore.yaml"),
        std::fs::read_to_string(cases().join("indexes/after/orders/datastore.yaml")).unwrap(),
    )
    .unwrap();
    let broken = cellgate(dir, &["plan", "datastores"]);
    assert_eq!(broken.status.code(), Some(1));
    let err = String::from_utf8_lossy(&broken.stderr);
    assert!(err.contains("orders/datastore.yaml:2"), "{err}");

    // A directory outside any git work tree.
    let loose = tempfile::tempdir().unwrap();
    copy(
        &cases().join("indexes/after"),
        &loose.path().join("datastores"),
    );
    let outside = cellgate(loose.path(), &["plan", "datastores"]);
    assert_eq!(outside.status.code(), Some(1));
    let err = String::from_utf8_lossy(&outside.stderr);
    assert!(err.contains("is not inside a git work tree"), "{err}");
}
