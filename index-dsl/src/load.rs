//! Loading a definitions directory: find the files, parse them, validate, assemble.
//!
//! The directory layout is `<dir>/<datastore>/datastore.yaml` plus
//! `<dir>/<datastore>/indexes/<index>.yaml` and `<dir>/<datastore>/triggers/<trigger>.yaml`
//! (`.yml` works too). Reading files is the only I/O of
//! the crate and happens in [`load_dir`]; everything after it works on in-memory text through
//! [`load_files`], which tests and fuzzers call directly. Files that are not YAML (a README) are
//! ignored; YAML files anywhere else are reported, since they were surely meant to be loaded.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Component, Path, PathBuf};

use crate::definitions::Definitions;
use crate::diagnostic::{Diagnostic, Diagnostics};
use crate::raw::{RawDatastore, RawIndex, RawTrigger};
use crate::source::SourceFile;
use crate::validate::{self, IndexContext, TriggerContext};

/// The definition files of one datastore directory.
#[derive(Default)]
struct DatastoreDir {
    datastore_files: Vec<SourceFile>,
    index_files: Vec<(String, SourceFile)>,
    trigger_files: Vec<(String, SourceFile)>,
}

/// Loads and validates every datastore under `dir`, reporting all problems together.
///
/// Paths in diagnostics are `dir` joined with each file's relative path, so a relative `dir`
/// gives relative paths.
pub fn load_dir(dir: &Path) -> Result<Definitions, Diagnostics> {
    load_dir_with_files(dir).map(|(defs, _)| defs)
}

/// [`load_dir`], with the files it read: `(path relative to dir, text)`,
/// sorted by path (for [`digest`]).
pub fn load_dir_with_files(
    dir: &Path,
) -> Result<(Definitions, Vec<(PathBuf, String)>), Diagnostics> {
    let mut diagnostics = Vec::new();
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    match read_sorted(dir) {
        Err(message) => diagnostics.push(Diagnostic::file(dir, message)),
        Ok(entries) => {
            for (name, is_dir) in entries {
                if !is_dir {
                    push_file(dir, PathBuf::from(&name), &mut files, &mut diagnostics);
                    continue;
                }
                dirs.push(name.clone());
                walk_datastore(dir, &name, &mut files, &mut diagnostics);
            }
        }
    }
    let mut read = files.clone();
    read.sort();
    check(dir, dirs, files, diagnostics).map(|defs| (defs, read))
}

/// The digest of a set of definition files, `sha256:<hex>`, over each
/// file's path (relative to the definitions directory, `/`-separated) and
/// text, in path order: the same files give the same digest wherever the
/// directory is and whichever way they were read (a directory, a git
/// revision, the store's catalog).
pub fn digest<P: AsRef<Path>, S: AsRef<str>>(files: impl IntoIterator<Item = (P, S)>) -> String {
    use sha2::{Digest as _, Sha256};
    let mut files: Vec<(String, S)> = files
        .into_iter()
        .map(|(p, s)| (portable(p.as_ref()), s))
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    let mut hash = Sha256::new();
    for (path, text) in &files {
        let text = text.as_ref();
        hash.update(format!("{path}\n{}\n", text.len()));
        hash.update(text);
    }
    let bytes = hash.finalize();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// `path`'s normal components joined by `/`.
fn portable(path: &Path) -> String {
    path.components()
        .filter_map(|c| match c {
            Component::Normal(part) => Some(part.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Validates definitions given as `(path relative to root, text)` pairs, as if read from `root`
/// by [`load_dir`]. A datastore directory exists when some path starts with its name.
pub fn load_files<P, S>(
    root: &Path,
    files: impl IntoIterator<Item = (P, S)>,
) -> Result<Definitions, Diagnostics>
where
    P: AsRef<Path>,
    S: Into<String>,
{
    let files: Vec<(PathBuf, String)> = files
        .into_iter()
        .map(|(p, s)| (p.as_ref().to_path_buf(), s.into()))
        .collect();
    check(root, Vec::new(), files, Vec::new())
}

/// Reads a directory's visible entries as `(name, is_dir)`, sorted by name.
fn read_sorted(dir: &Path) -> Result<Vec<(String, bool)>, String> {
    let entries =
        fs::read_dir(dir).map_err(|e| format!("cannot read directory: {}", io_msg(&e)))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read directory: {}", io_msg(&e)))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') {
            continue;
        }
        // `metadata` follows symlinks, so a linked datastore directory works.
        let is_dir = fs::metadata(entry.path()).is_ok_and(|m| m.is_dir());
        out.push((name, is_dir));
    }
    out.sort();
    Ok(out)
}

/// Collects the YAML files of `<root>/<name>/` and `<root>/<name>/<sub>/`.
fn walk_datastore(
    root: &Path,
    name: &str,
    files: &mut Vec<(PathBuf, String)>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let rel = PathBuf::from(name);
    let entries = match read_sorted(&root.join(&rel)) {
        Ok(entries) => entries,
        Err(message) => return diagnostics.push(Diagnostic::file(&root.join(&rel), message)),
    };
    for (entry, is_dir) in entries {
        let rel = rel.join(&entry);
        if !is_dir {
            push_file(root, rel, files, diagnostics);
            continue;
        }
        match read_sorted(&root.join(&rel)) {
            Err(message) => diagnostics.push(Diagnostic::file(&root.join(&rel), message)),
            Ok(sub) => {
                for (file, is_dir) in sub {
                    if !is_dir {
                        push_file(root, rel.join(file), files, diagnostics);
                    }
                }
            }
        }
    }
}

/// Reads `root/rel` if it is a YAML file.
fn push_file(
    root: &Path,
    rel: PathBuf,
    files: &mut Vec<(PathBuf, String)>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    if !is_yaml(&rel) {
        return;
    }
    let path = root.join(&rel);
    match fs::read(&path) {
        Err(e) => diagnostics.push(Diagnostic::file(
            &path,
            format!("cannot read file: {}", io_msg(&e)),
        )),
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => files.push((rel, text)),
            Err(_) => diagnostics.push(Diagnostic::file(
                &path,
                "file is not valid UTF-8 (expected UTF-8 YAML text)",
            )),
        },
    }
}

fn is_yaml(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("yaml") || e.eq_ignore_ascii_case("yml"))
}

fn io_msg(e: &std::io::Error) -> String {
    let text = e.to_string();
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

/// Sorts files into datastore directories, then parses and validates everything.
fn check(
    root: &Path,
    dirs: Vec<String>,
    files: Vec<(PathBuf, String)>,
    mut diagnostics: Vec<Diagnostic>,
) -> Result<Definitions, Diagnostics> {
    let mut tree: BTreeMap<String, DatastoreDir> = BTreeMap::new();
    for dir in dirs {
        tree.entry(dir).or_default();
    }
    for (rel, text) in files {
        if !is_yaml(&rel) {
            continue;
        }
        let parts: Vec<String> = rel
            .components()
            .filter_map(|c| match c {
                Component::Normal(part) => Some(part.to_string_lossy().into_owned()),
                _ => None,
            })
            .collect();
        let file = SourceFile {
            path: root.join(&rel),
            text,
        };
        match parts.as_slice() {
            [ds, name] if is_datastore_file(name) => {
                tree.entry(ds.clone())
                    .or_default()
                    .datastore_files
                    .push(file);
            }
            [ds, triggers, name] if triggers == "triggers" => {
                let stem = Path::new(name)
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                tree.entry(ds.clone())
                    .or_default()
                    .trigger_files
                    .push((stem, file));
            }
            [ds, indexes, name] if indexes == "indexes" => {
                let stem = Path::new(name)
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default();
                tree.entry(ds.clone())
                    .or_default()
                    .index_files
                    .push((stem, file));
            }
            _ => {
                if let [ds, ..] = parts.as_slice() {
                    if parts.len() > 1 {
                        tree.entry(ds.clone()).or_default();
                    }
                }
                diagnostics.push(Diagnostic::file(
                    &file.path,
                    "unexpected definition file (expected <datastore>/datastore.yaml, <datastore>/indexes/<index>.yaml or <datastore>/triggers/<trigger>.yaml)",
                ));
            }
        }
    }

    let all_datastores: Vec<String> = tree.keys().cloned().collect();
    let mut datastores = Vec::new();
    for (dir_name, mut dir) in tree {
        dir.datastore_files.sort_by(|a, b| a.path.cmp(&b.path));
        dir.index_files.sort_by(|a, b| a.1.path.cmp(&b.1.path));
        dir.trigger_files.sort_by(|a, b| a.1.path.cmp(&b.1.path));
        if let Some(ds) = check_datastore(root, &dir_name, &dir, &all_datastores, &mut diagnostics)
        {
            datastores.push(ds);
        }
    }

    if diagnostics.is_empty() {
        datastores.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Definitions { datastores })
    } else {
        diagnostics.sort_by(|a, b| (&a.file, a.line, a.column).cmp(&(&b.file, b.line, b.column)));
        Err(Diagnostics(diagnostics))
    }
}

fn is_datastore_file(name: &str) -> bool {
    name == "datastore.yaml" || name == "datastore.yml"
}

/// Parses and validates one datastore directory.
fn check_datastore(
    root: &Path,
    dir_name: &str,
    dir: &DatastoreDir,
    all_datastores: &[String],
    out: &mut Vec<Diagnostic>,
) -> Option<crate::datastore::Datastore> {
    let mut columns: Option<Vec<String>> = None;
    let mut datastore = None;
    match dir.datastore_files.as_slice() {
        [] => out.push(Diagnostic::file(
            &root.join(dir_name),
            format!("datastore directory `{dir_name}` has no datastore.yaml (expected {dir_name}/datastore.yaml with `name:` and `columns:`)"),
        )),
        [file, extra @ ..] => {
            for extra in extra {
                out.push(Diagnostic::file(
                    &extra.path,
                    "second datastore definition in this directory (expected only one of datastore.yaml and datastore.yml)",
                ));
            }
            if let Some(raw) = file.parse::<RawDatastore>(out) {
                columns = Some(raw.columns.value.iter().map(|c| c.name.value.clone()).collect());
                datastore = validate::datastore(file, dir_name, raw, out);
            }
        }
    }

    let mut indexes = Vec::new();
    let mut seen: HashMap<String, &Path> = HashMap::new();
    for (stem, file) in &dir.index_files {
        let Some(raw) = file.parse::<RawIndex>(out) else {
            continue;
        };
        let ctx = IndexContext {
            file_stem: stem,
            datastore: dir_name,
            columns: columns.as_deref(),
            all_datastores,
        };
        let folded = raw.table.value.to_ascii_lowercase();
        if let Some(first) = seen.get(&folded) {
            out.push(file.at(
                &raw.table,
                format!(
                    "duplicate index `{}` in datastore `{dir_name}` (already defined in {}; index names are case-insensitive)",
                    raw.table.value,
                    first.display()
                ),
            ));
            continue;
        }
        seen.insert(folded, &file.path);
        if let Some(index) = validate::index(file, &ctx, &raw, out) {
            indexes.push(std::sync::Arc::new(index));
        }
    }

    let mut triggers = Vec::new();
    let mut seen: HashMap<String, &Path> = HashMap::new();
    for (stem, file) in &dir.trigger_files {
        let Some(raw) = file.parse::<RawTrigger>(out) else {
            continue;
        };
        let folded = raw.name.value.to_ascii_lowercase();
        if let Some(first) = seen.get(&folded) {
            out.push(file.at(
                &raw.name,
                format!(
                    "duplicate trigger `{}` in datastore `{dir_name}` (already defined in {}; trigger names are case-insensitive)",
                    raw.name.value,
                    first.display()
                ),
            ));
            continue;
        }
        seen.insert(folded, &file.path);
        let ctx = TriggerContext {
            file_stem: stem,
            datastore: dir_name,
            columns: columns.as_deref(),
        };
        if let Some(trigger) = validate::trigger(file, &ctx, raw, out) {
            triggers.push(trigger);
        }
    }

    let mut datastore = datastore?;
    indexes.sort_by(|a, b| a.name.cmp(&b.name));
    datastore.indexes = indexes;
    triggers.sort_by(|a, b| a.name.cmp(&b.name));
    datastore.triggers = triggers;
    Some(datastore)
}

#[cfg(test)]
mod tests {
    use super::digest;

    #[test]
    fn the_digest_is_of_paths_and_texts_in_any_order() {
        let one = digest([("a/datastore.yaml", "x"), ("a/indexes/i.yaml", "y")]);
        assert!(one.starts_with("sha256:") && one.len() == 7 + 64);
        assert_eq!(
            one,
            digest([("./a/indexes/i.yaml", "y"), ("a/datastore.yaml", "x")])
        );
        assert_ne!(
            one,
            digest([("a/datastore.yaml", "x"), ("a/indexes/j.yaml", "y")])
        );
        assert_ne!(
            one,
            digest([("a/datastore.yaml", "x "), ("a/indexes/i.yaml", "y")])
        );
        // The lengths keep a text from running into the next path.
        assert_ne!(
            digest([("a", "b\nc\n1\nd")]),
            digest([("a", "b"), ("c", "d")])
        );
    }
}
