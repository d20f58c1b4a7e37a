//! The architecture's rules, checked over the source of every crate of the
//! workspace (ARCHITECTURE.md names them as invariants):
//!
//! - **no module cycles**: within each crate, no file reaches itself
//!   through the items it uses (a `use` or a path, in code or in a macro's
//!   tokens, followed through re-exports to the file that defines the
//!   item), and the crate's top-level modules use each other in one
//!   direction only;
//! - **the store's ground floor**: `topology` and `storage` use nothing of
//!   the modules above them;
//! - **no source file over 1,000 lines**, tests aside.
//!
//! Written as a test over `syn`'s syntax trees rather than with a tool
//! such as `cargo-modules`: that one builds rust-analyzer, minutes of CPU
//! in every CI run, and answers about the same question. What this reads
//! is what the compiler reads, minus `#[cfg(test)]` items (tests may use
//! what they test).

#[path = "support/server.rs"]
mod server;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

/// The crates of the workspace: name and root file.
const CRATES: [(&str, &str); 5] = [
    ("index-dsl", "index-dsl/src/lib.rs"),
    ("cellgate-store", "gateway/store/src/lib.rs"),
    ("cellgate-graphql", "gateway/graphql/src/lib.rs"),
    ("cellgate", "gateway/src/main.rs"),
    ("cellgate-bench", "gateway/bench/src/main.rs"),
];

/// Longest source file allowed, in lines.
const MAX_LINES: usize = 1000;

/// A module path inside a crate: `["cells", "read"]`; the root is `[]`.
type ModPath = Vec<String>;

/// One module of a crate.
struct Module {
    /// The file that holds it (an inline module shares its parent's).
    file: PathBuf,
    /// Names of the items it defines (functions, types, constants,
    /// macros, modules).
    items: BTreeSet<String>,
    /// Names it brings in with `use`, by name: the path they stand for,
    /// and whether it hands them on (`pub use`, a re-export, which is not
    /// a use of its own).
    uses: BTreeMap<String, (Vec<String>, bool)>,
    /// Modules it brings in whole with `use …::*`, likewise.
    globs: Vec<(Vec<String>, bool)>,
    /// The paths its code names, as written.
    paths: Vec<Vec<String>>,
}

/// A crate read from its root file.
struct Crate {
    modules: BTreeMap<ModPath, Module>,
}

impl Crate {
    fn read(root: &Path) -> Crate {
        let mut krate = Crate {
            modules: BTreeMap::new(),
        };
        krate.load(Vec::new(), root.to_path_buf(), true);
        krate
    }

    /// Reads the module at `path` from `file`; `owns_dir` says whether
    /// its children live beside it (`lib.rs`, `main.rs`, `mod.rs`) rather
    /// than in a directory named after it.
    fn load(&mut self, path: ModPath, file: PathBuf, owns_dir: bool) {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", file.display()));
        let ast = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("cannot parse {}: {e}", file.display()));
        let dir = if owns_dir {
            file.parent().expect("a directory").to_path_buf()
        } else {
            file.with_extension("")
        };
        self.load_items(path, &file, &dir, &ast.items);
    }

    fn load_items(&mut self, path: ModPath, file: &Path, dir: &Path, items: &[syn::Item]) {
        let mut module = Module {
            file: file.to_path_buf(),
            items: BTreeSet::new(),
            uses: BTreeMap::new(),
            globs: Vec::new(),
            paths: Vec::new(),
        };
        let mut children = Vec::new();
        for item in items {
            if is_test_only(item) {
                continue;
            }
            if let Some(name) = item_name(item) {
                module.items.insert(name);
            }
            match item {
                syn::Item::Use(item) => {
                    let public = !matches!(item.vis, syn::Visibility::Inherited);
                    flatten_use(&item.tree, Vec::new(), public, &mut module)
                }
                syn::Item::Mod(item) => children.push(item),
                _ => {}
            }
            let mut collector = Paths::default();
            if !matches!(item, syn::Item::Use(_) | syn::Item::Mod(_)) {
                collector.visit_item(item);
            }
            module.paths.extend(collector.paths);
        }
        self.modules.insert(path.clone(), module);
        for child in children {
            let name = child.ident.to_string();
            let mut child_path = path.clone();
            child_path.push(name.clone());
            match &child.content {
                Some((_, items)) => self.load_items(child_path, file, &dir.join(&name), items),
                None => {
                    let explicit = child.attrs.iter().find_map(path_attribute);
                    let (child_file, owns_dir) = match explicit {
                        Some(relative) => (file.parent().expect("dir").join(relative), true),
                        None if dir.join(format!("{name}.rs")).exists() => {
                            (dir.join(format!("{name}.rs")), false)
                        }
                        None => (dir.join(&name).join("mod.rs"), true),
                    };
                    self.load(child_path, child_file, owns_dir);
                }
            }
        }
    }

    /// The file that defines what `path` names, seen from module `from`;
    /// `None` for what lies outside the crate.
    fn resolve(&self, from: &[String], path: &[String], depth: usize) -> Option<PathBuf> {
        if depth > 16 || path.is_empty() {
            return None;
        }
        let absolute = self.absolute(from, path)?;
        // The longest prefix that is a module, then the item in it.
        let mut prefix = absolute.len();
        while prefix > 0 && !self.modules.contains_key(&absolute[..prefix]) {
            prefix -= 1;
        }
        let module_path = absolute[..prefix].to_vec();
        let module = self.modules.get(&module_path)?;
        let Some(name) = absolute.get(prefix) else {
            return Some(module.file.clone());
        };
        if module.items.contains(name) {
            return Some(module.file.clone());
        }
        if let Some((target, _)) = module.uses.get(name) {
            if let Some(file) = self.resolve(&module_path, target, depth + 1) {
                return Some(file);
            }
        }
        for (glob, _) in &module.globs {
            let mut target = glob.clone();
            target.push(name.clone());
            if let Some(file) = self.resolve(&module_path, &target, depth + 1) {
                return Some(file);
            }
        }
        // A name the module does not define (a variant, a method): the
        // module itself.
        Some(module.file.clone())
    }

    /// `path` from module `from` as a path from the crate root, if it
    /// starts inside the crate.
    fn absolute(&self, from: &[String], path: &[String]) -> Option<ModPath> {
        let mut base: ModPath = from.to_vec();
        let mut rest = path;
        match rest.first().map(String::as_str) {
            Some("crate") => {
                base.clear();
                rest = &rest[1..];
            }
            Some("self") => rest = &rest[1..],
            Some("super") => {
                while rest.first().map(String::as_str) == Some("super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                let mut child = base.clone();
                child.push(first.to_string());
                let module = self.modules.get(from)?;
                if self.modules.contains_key(&child) {
                    // A child module named directly.
                } else if let Some((target, _)) = module.uses.get(first) {
                    // A name brought in with `use`: where it points.
                    let mut target = target.clone();
                    target.extend(rest[1..].iter().cloned());
                    if target
                        .first()
                        .is_some_and(|s| s == "crate" || s == "super" || s == "self")
                    {
                        return self.absolute(from, &target);
                    }
                    return None;
                } else {
                    return None;
                }
            }
            None => return None,
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    /// The file-to-file edges of the crate, with the names that make each:
    /// what a file's own `use`s and code name, followed through
    /// re-exports to the file that defines it. A re-export is no edge of
    /// its own: a façade that hands a child's item on does not use it.
    fn edges(&self) -> BTreeMap<(PathBuf, PathBuf), BTreeSet<String>> {
        let mut edges: BTreeMap<(PathBuf, PathBuf), BTreeSet<String>> = BTreeMap::new();
        for (from, module) in &self.modules {
            let own_uses = module
                .uses
                .values()
                .chain(module.globs.iter())
                .filter(|(_, public)| !public)
                .map(|(path, _)| path);
            let code = module
                .paths
                .iter()
                .filter(|path| path.len() > 1 || module.uses.contains_key(&path[0]));
            for path in own_uses.chain(code) {
                if let Some(file) = self.resolve(from, path, 0) {
                    if file != module.file {
                        edges
                            .entry((module.file.clone(), file))
                            .or_default()
                            .insert(path.join("::"));
                    }
                }
            }
        }
        edges
    }

    /// The module a file holds (the outermost, for inline modules).
    fn module_of(&self, file: &Path) -> Option<&ModPath> {
        self.modules
            .iter()
            .filter(|(_, m)| m.file == file)
            .map(|(path, _)| path)
            .min_by_key(|path| path.len())
    }

    /// The cycles between sibling modules, at every level of the module
    /// tree: a child module stands for everything below it, and its
    /// parent's own file is left out (a parent declares its children and
    /// they may use what it defines). Each cycle comes with the edges
    /// between its members and the names behind them.
    fn sibling_cycles(&self) -> Vec<String> {
        // (parent, child a, child b) -> names
        let mut levels: BTreeMap<ModPath, BTreeMap<(String, String), BTreeSet<String>>> =
            BTreeMap::new();
        for ((from, to), names) in self.edges() {
            let (Some(a), Some(b)) = (self.module_of(&from), self.module_of(&to)) else {
                continue;
            };
            let common = a.iter().zip(b.iter()).take_while(|(x, y)| x == y).count();
            if a.len() == common || b.len() == common {
                continue;
            }
            let names = names
                .into_iter()
                .map(|n| format!("{n} ({})", relative(&from)));
            levels
                .entry(a[..common].to_vec())
                .or_default()
                .entry((a[common].clone(), b[common].clone()))
                .or_default()
                .extend(names);
        }
        let mut found = Vec::new();
        for (parent, edges) in levels {
            let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
            let mut nodes = BTreeSet::new();
            for (a, b) in edges.keys() {
                graph.entry(a.clone()).or_default().insert(b.clone());
                nodes.insert(a.clone());
                nodes.insert(b.clone());
            }
            for cycle in cycles(&nodes, &graph) {
                let place = if parent.is_empty() {
                    "crate".to_string()
                } else {
                    format!("crate::{}", parent.join("::"))
                };
                let mut text = format!(
                    "modules of {place} that use each other: {}\n",
                    cycle.join(", ")
                );
                for a in &cycle {
                    for b in &cycle {
                        if let Some(names) = edges.get(&(a.clone(), b.clone())) {
                            let names: Vec<&str> =
                                names.iter().map(String::as_str).take(4).collect();
                            text.push_str(&format!("  {a} -> {b}: {}\n", names.join(", ")));
                        }
                    }
                }
                found.push(text);
            }
        }
        found
    }
}

/// Whether an item is compiled only for tests.
fn is_test_only(item: &syn::Item) -> bool {
    let attrs = match item {
        syn::Item::Mod(item) => &item.attrs,
        syn::Item::Fn(item) => &item.attrs,
        syn::Item::Use(item) => &item.attrs,
        syn::Item::Impl(item) => &item.attrs,
        syn::Item::Struct(item) => &item.attrs,
        syn::Item::Const(item) => &item.attrs,
        _ => return false,
    };
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && matches!(&attr.meta, syn::Meta::List(list) if list.tokens.to_string() == "test")
    })
}

/// The file a `#[path = "…"]` attribute names.
fn path_attribute(attr: &syn::Attribute) -> Option<String> {
    if !attr.path().is_ident("path") {
        return None;
    }
    match &attr.meta {
        syn::Meta::NameValue(syn::MetaNameValue {
            value:
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(text),
                    ..
                }),
            ..
        }) => Some(text.value()),
        _ => None,
    }
}

/// The name an item defines.
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Mod(i) => &i.ident,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// Records the names a `use` tree brings in; `public` for a re-export.
fn flatten_use(tree: &syn::UseTree, prefix: Vec<String>, public: bool, module: &mut Module) {
    match tree {
        syn::UseTree::Path(path) => {
            let mut prefix = prefix;
            prefix.push(path.ident.to_string());
            flatten_use(&path.tree, prefix, public, module);
        }
        syn::UseTree::Name(name) => {
            let mut path = prefix;
            let ident = name.ident.to_string();
            if ident == "self" {
                if let Some(last) = path.last().cloned() {
                    module.uses.insert(last, (path, public));
                }
            } else {
                path.push(ident.clone());
                module.uses.insert(ident, (path, public));
            }
        }
        syn::UseTree::Rename(rename) => {
            let mut path = prefix;
            if rename.ident != "self" {
                path.push(rename.ident.to_string());
            }
            module
                .uses
                .insert(rename.rename.to_string(), (path, public));
        }
        syn::UseTree::Glob(_) => module.globs.push((prefix, public)),
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                flatten_use(tree, prefix.clone(), public, module);
            }
        }
    }
}

/// The paths an item names, in its code and in its macros' tokens.
#[derive(Default)]
struct Paths {
    paths: Vec<Vec<String>>,
}

impl<'ast> Visit<'ast> for Paths {
    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.paths.push(segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }

    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        // Inline modules are loaded as modules of their own.
        let _ = item;
    }
}

impl Paths {
    /// Paths written `a::b::c` in a macro's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            if let TokenTree::Group(group) = &trees[i] {
                self.tokens(group.stream());
                i += 1;
                continue;
            }
            let mut segments = Vec::new();
            let mut j = i;
            while let Some(TokenTree::Ident(ident)) = trees.get(j) {
                segments.push(ident.to_string());
                let colons = matches!(
                    (trees.get(j + 1), trees.get(j + 2)),
                    (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b)))
                        if a.as_char() == ':' && b.as_char() == ':'
                );
                if !colons {
                    break;
                }
                j += 3;
            }
            if segments.len() > 1 {
                self.paths.push(segments);
                i = j.max(i + 1);
            } else {
                i += 1;
            }
        }
    }
}

/// The strongly connected components of more than one node (Tarjan).
fn cycles<N: Ord + Clone>(nodes: &BTreeSet<N>, edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct State<N> {
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        on_stack: BTreeSet<N>,
        next: usize,
        found: Vec<Vec<N>>,
    }
    fn visit<N: Ord + Clone>(node: &N, edges: &BTreeMap<N, BTreeSet<N>>, s: &mut State<N>) {
        s.index.insert(node.clone(), s.next);
        s.low.insert(node.clone(), s.next);
        s.next += 1;
        s.stack.push(node.clone());
        s.on_stack.insert(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if !s.index.contains_key(next) {
                visit(next, edges, s);
                let low = s.low[node].min(s.low[next]);
                s.low.insert(node.clone(), low);
            } else if s.on_stack.contains(next) {
                let low = s.low[node].min(s.index[next]);
                s.low.insert(node.clone(), low);
            }
        }
        if s.low[node] == s.index[node] {
            let mut component = Vec::new();
            loop {
                let top = s.stack.pop().expect("on the stack");
                s.on_stack.remove(&top);
                let done = &top == node;
                component.push(top);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.found.push(component);
            }
        }
    }
    let mut state = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for node in nodes {
        if !state.index.contains_key(node) {
            visit(node, edges, &mut state);
        }
    }
    state.found
}

/// The crates of the workspace, read.
fn crates() -> Vec<(&'static str, PathBuf, Crate)> {
    let root = server::root();
    CRATES
        .iter()
        .map(|(name, file)| {
            let file = root.join(file);
            (*name, file.clone(), Crate::read(&file))
        })
        .collect()
}

fn relative(path: &Path) -> String {
    let root = server::root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn no_module_uses_a_sibling_that_uses_it() {
    let mut report = String::new();
    for (name, _, krate) in crates() {
        for cycle in krate.sibling_cycles() {
            report.push_str(&format!("{name}: {cycle}"));
        }
    }
    assert!(report.is_empty(), "module cycles:\n{report}");
}

/// The store's ground floor: what `topology` and `storage` may not use.
#[test]
fn the_store_ground_floor_uses_nothing_above_it() {
    let (_, _, store) = crates()
        .into_iter()
        .find(|(name, _, _)| *name == "cellgate-store")
        .expect("the store crate");
    let above = [
        "cells",
        "indexes",
        "replicas",
        "moves",
        "triggers",
        "options",
        "store",
        "reload",
        "catalog",
        "ids",
        "tokens",
        "leases",
        "shard_leases",
        "upgrade",
    ];
    let ground = ["topology", "storage"];
    let mut report = String::new();
    for ((from, to), names) in store.edges() {
        let module_of = |file: &PathBuf| store.module_of(file).and_then(|p| p.first().cloned());
        let (Some(a), Some(b)) = (module_of(&from), module_of(&to)) else {
            continue;
        };
        if ground.contains(&a.as_str()) && above.contains(&b.as_str()) {
            report.push_str(&format!(
                "{} uses {}: {}\n",
                relative(&from),
                relative(&to),
                names.into_iter().collect::<Vec<_>>().join(", ")
            ));
        }
    }
    assert!(report.is_empty(), "the ground floor reaches up:\n{report}");
}

/// Where the backends' SQL differs, the difference lives in `storage/`
/// (`Dialect`'s methods and capabilities): the store's other modules
/// never name a dialect.
#[test]
fn only_storage_names_a_sql_dialect() {
    let (_, _, store) = crates()
        .into_iter()
        .find(|(name, _, _)| *name == "cellgate-store")
        .expect("the store crate");
    let mut report = Vec::new();
    for (path, module) in &store.modules {
        if path.first().map(String::as_str) == Some("storage") {
            continue;
        }
        for named in &module.paths {
            let n = named.len();
            if n >= 2
                && named[n - 2] == "Dialect"
                && ["Sqlite", "MySql", "Postgres"].contains(&named[n - 1].as_str())
            {
                report.push(format!("{}: {}", relative(&module.file), named.join("::")));
            }
        }
    }
    report.sort();
    report.dedup();
    assert!(
        report.is_empty(),
        "dialects named outside storage/ (give `Dialect` a method instead):\n{}",
        report.join("\n")
    );
}

#[test]
fn no_source_file_is_over_a_thousand_lines() {
    let mut long = Vec::new();
    for (_, root_file, _) in crates() {
        let src = root_file.parent().expect("src").to_path_buf();
        let mut stack = vec![src];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).expect("a directory") {
                let path = entry.expect("an entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let lines = std::fs::read_to_string(&path)
                        .expect("text")
                        .lines()
                        .count();
                    if lines > MAX_LINES {
                        long.push(format!("{} ({lines} lines)", relative(&path)));
                    }
                }
            }
        }
    }
    long.sort();
    assert!(
        long.is_empty(),
        "files over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_checker_sees_a_cycle_through_a_reexport_and_a_macro() {
    // `a` uses `b` through the root's re-export, `b` uses `a` inside a
    // macro: a cycle. `c` uses what the root defines and the root uses
    // `c`: a parent and its child, no cycle.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).unwrap();
    write(
        "lib.rs",
        "mod a;\nmod b;\nmod c;\npub use b::Thing;\npub const N: u8 = 1;\npub fn f() { c::g() }\n",
    );
    write("a.rs", "pub fn f() -> crate::Thing { crate::Thing }\n");
    write(
        "b.rs",
        "pub struct Thing;\npub fn g() { let _ = format!(\"{:?}\", super::a::f as fn() -> Thing); }\n",
    );
    write("c.rs", "pub fn g() { let _ = crate::N; }\n");
    let krate = Crate::read(&src.join("lib.rs"));
    let cycles = krate.sibling_cycles();
    assert_eq!(cycles.len(), 1, "{cycles:?}");
    assert!(
        cycles[0].starts_with("modules of crate that use each other: a, b"),
        "{cycles:?}"
    );
    assert!(cycles[0].contains("a -> b: crate::Thing"), "{cycles:?}");
    assert!(cycles[0].contains("b -> a: super::a::f"), "{cycles:?}");
}
