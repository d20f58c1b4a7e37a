//! The two sides of a plan: definitions read from a directory, or from a
//! git revision of it (as CI checks a pull request out: `--base
//! origin/main`), each with the text of its files, so a change can be
//! pointed at its line.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use index_dsl::Definitions;

/// Why a side cannot be read; each has its own exit status.
#[derive(Debug)]
pub enum SideError {
    /// Not a directory, not a git work tree, no such revision.
    Unreadable(String),
    /// The definitions do not load; the diagnostics, rendered.
    Invalid(String),
}

/// One set of definitions and the files it was read from.
pub struct Side {
    /// How the side is named in the output (`origin/main`, a directory).
    pub label: String,
    /// The definitions directory, as given: file paths start with it.
    pub root: PathBuf,
    /// Each file's text, by its path relative to `root`.
    pub files: BTreeMap<PathBuf, String>,
    /// [`index_dsl::digest`] of the files: what `cellgate reload --plan`
    /// checks the gateway against.
    pub digest: String,
    pub defs: Definitions,
}

impl Side {
    /// The definitions in `dir`.
    pub fn from_dir(dir: &Path) -> Result<Side, SideError> {
        if !dir.is_dir() {
            return Err(SideError::Unreadable(format!(
                "`{}` is not a directory of definitions",
                dir.display()
            )));
        }
        let (defs, files) =
            index_dsl::load_dir_with_files(dir).map_err(|d| SideError::Invalid(d.to_string()))?;
        Ok(Side::new(
            dir.display().to_string(),
            dir,
            files.into_iter().collect(),
            defs,
        ))
    }

    /// The definitions the store's catalog records as deployed (the files
    /// the gateway last loaded), as if read from `dir`.
    pub fn from_deployed(
        dir: &Path,
        deployed: cellgate_store::Deployed,
    ) -> Result<Side, SideError> {
        let files: BTreeMap<PathBuf, String> = deployed
            .files
            .into_iter()
            .map(|(path, text)| (PathBuf::from(path), text))
            .collect();
        let defs = index_dsl::load_files(dir, files.iter().map(|(p, t)| (p.clone(), t.clone())))
            .map_err(|d| SideError::Invalid(d.to_string()))?;
        let label = format!(
            "deployed ({})",
            deployed.recorded_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
        Ok(Side::new(label, dir, files, defs))
    }

    fn new(
        label: String,
        root: &Path,
        files: BTreeMap<PathBuf, String>,
        defs: Definitions,
    ) -> Side {
        Side {
            label,
            root: root.to_path_buf(),
            digest: index_dsl::digest(&files),
            files,
            defs,
        }
    }

    /// The definitions `dir` held at the git revision `rev`.
    pub fn from_git(dir: &Path, rev: &str) -> Result<Side, SideError> {
        if !dir.is_dir() {
            return Err(SideError::Unreadable(format!(
                "`{}` is not a directory of definitions",
                dir.display()
            )));
        }
        git(dir, &["rev-parse", "--is-inside-work-tree"]).map_err(|e| {
            SideError::Unreadable(format!(
                "`{}` is not inside a git work tree, so `--base {rev}` cannot be read ({e}); compare two directories with --base-dir",
                dir.display()
            ))
        })?;
        let commit = git(dir, &["rev-parse", "--verify", "--quiet", &format!("{rev}^{{commit}}")])
            .map_err(|_| {
                SideError::Unreadable(format!(
                    "git revision `{rev}` does not exist (in CI, fetch it first, e.g. `git fetch origin main`)"
                ))
            })?;
        let commit = commit.trim().to_string();
        let listed = git(dir, &["ls-tree", "-r", "--name-only", &commit, "--", "."])
            .map_err(SideError::Unreadable)?;
        let mut files = BTreeMap::new();
        for name in listed.lines().filter(|l| is_definition(Path::new(l))) {
            let text = git(dir, &["show", &format!("{commit}:./{name}")])
                .map_err(SideError::Unreadable)?;
            files.insert(PathBuf::from(name), text);
        }
        let defs = index_dsl::load_files(dir, files.iter().map(|(p, t)| (p.clone(), t.clone())))
            .map_err(|d| SideError::Invalid(d.to_string()))?;
        Ok(Side::new(rev.to_string(), dir, files, defs))
    }

    /// The path of a file of this side, as the user sees it.
    pub fn path(&self, relative: &Path) -> String {
        let path = self.root.join(relative);
        let path = path.strip_prefix(".").unwrap_or(&path);
        path.display().to_string()
    }

    /// The file defining datastore `ds`.
    pub fn datastore_file(&self, ds: &str) -> Option<PathBuf> {
        let path = PathBuf::from(ds).join("datastore.yaml");
        self.files.contains_key(&path).then_some(path)
    }

    /// The file defining index `index` (its `table:`) of `ds`.
    pub fn index_file(&self, ds: &str, index: &str) -> Option<PathBuf> {
        self.named_file(ds, "indexes", "table", index)
    }

    /// The file defining trigger `trigger` of `ds`.
    pub fn trigger_file(&self, ds: &str, trigger: &str) -> Option<PathBuf> {
        self.named_file(ds, "triggers", "name", trigger)
    }

    fn named_file(&self, ds: &str, folder: &str, key: &str, name: &str) -> Option<PathBuf> {
        let under = PathBuf::from(ds).join(folder);
        self.files
            .iter()
            .find(|(path, text)| {
                path.parent() == Some(under.as_path())
                    && top_level(text, key).is_some_and(|(_, v)| v == name)
            })
            .map(|(path, _)| path.clone())
    }

    /// The line (1-based) of the top-level `key:` of `file`.
    pub fn line_of(&self, file: &Path, key: &str) -> Option<usize> {
        self.files
            .get(file)
            .and_then(|text| top_level(text, key))
            .map(|(line, _)| line)
    }
}

/// The line and the (unquoted, comment-less) value of the top-level
/// mapping key `key` in a YAML text.
fn top_level(text: &str, key: &str) -> Option<(usize, String)> {
    text.lines().enumerate().find_map(|(n, line)| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let value = rest.split(" #").next().unwrap_or("").trim();
        Some((n + 1, value.trim_matches(['"', '\'']).to_string()))
    })
}

/// Whether `path` (relative to the definitions directory) is a file the
/// loader reads: a YAML file at most two directories down
/// (`<ds>/datastore.yaml`, `<ds>/indexes/*.yaml`, `<ds>/triggers/*.yaml`,
/// and the stray ones it reports).
fn is_definition(path: &Path) -> bool {
    let yaml = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"));
    let hidden = path
        .components()
        .any(|c| c.as_os_str().to_string_lossy().starts_with('.'));
    yaml && !hidden && path.components().count() <= 3
}

/// Runs `git -C dir args…`; its stdout, or its stderr as the error.
fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let output = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .output()
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).trim().to_string());
    }
    String::from_utf8(output.stdout).map_err(|_| "git printed something that is not UTF-8".into())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{is_definition, top_level};

    #[test]
    fn only_the_loaders_files_are_read() {
        assert!(is_definition(Path::new("trips/datastore.yaml")));
        assert!(is_definition(Path::new("trips/indexes/a.yaml")));
        assert!(is_definition(Path::new("trips/triggers/b.yml")));
        assert!(!is_definition(Path::new("README.md")));
        assert!(!is_definition(Path::new("trips/indexes/x/a.yaml")));
        assert!(!is_definition(Path::new(".github/ci.yaml")));
    }

    #[test]
    fn top_level_keys_are_found_with_their_line() {
        let text = "name: trips\n# c\nshards: 4096 # fixed\n  shards: 1\n";
        assert_eq!(top_level(text, "shards"), Some((3, "4096".into())));
        assert_eq!(top_level(text, "table"), None);
    }
}
