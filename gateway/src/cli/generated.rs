//! Files generated from the definitions and committed (`schema/sql/*.sql`,
//! `schema/schema.graphql`): writing them, and checking they are current.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;

/// Writes `files`, leaving up-to-date ones alone so their modification time
/// stays.
pub fn write(files: &[(PathBuf, String)]) -> anyhow::Result<()> {
    for (path, content) in files {
        if read(path)?.as_deref() == Some(content.as_str()) {
            println!("{} is up to date", path.display());
            continue;
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create directory `{}`", dir.display()))?;
        }
        std::fs::write(path, content)
            .with_context(|| format!("cannot write `{}`", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Writes nothing; fails naming each missing or stale file and the command
/// `fix` that regenerates it.
pub fn check(files: &[(PathBuf, String)], fix: &str) -> anyhow::Result<ExitCode> {
    let mut outdated = 0;
    for (path, content) in files {
        match read(path)? {
            Some(existing) if existing == *content => {
                println!("{} is up to date", path.display());
            }
            Some(_) => {
                eprintln!("error: {} is stale: run `{fix}`", path.display());
                outdated += 1;
            }
            None => {
                eprintln!("error: {} is missing: run `{fix}`", path.display());
                outdated += 1;
            }
        }
    }
    Ok(if outdated == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The file's content, `None` if it does not exist.
fn read(path: &Path) -> anyhow::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read `{}`", path.display())),
    }
}
