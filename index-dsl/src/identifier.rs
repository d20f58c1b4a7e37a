//! Identifier rules for names that reach SQL: datastores, columns, indexes, index fields.
//!
//! Names from YAML become table and column names, so they are held to a strict pattern
//! (`[A-Za-z_][A-Za-z0-9_]*`) and to length limits that leave room for the prefixes and suffixes
//! the storage layer adds while staying under every backend's identifier limit (MySQL: 64).

/// The kinds of names checked, each with its own length limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameKind {
    /// A datastore name (part of every table name of the datastore).
    Datastore,
    /// A datastore column name.
    Column,
    /// An index name, the YAML `table`.
    Index,
    /// An index field name (a column of the index table).
    Field,
    /// A trigger name (part of its consumer's name).
    Trigger,
}

impl NameKind {
    fn label(self) -> &'static str {
        match self {
            NameKind::Datastore => "datastore name",
            NameKind::Column => "column name",
            NameKind::Index => "index name",
            NameKind::Field => "field name",
            NameKind::Trigger => "trigger name",
        }
    }

    fn max_len(self) -> usize {
        match self {
            NameKind::Datastore => 20,
            NameKind::Index => 32,
            NameKind::Column | NameKind::Field | NameKind::Trigger => 48,
        }
    }
}

/// Whether `s` matches `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Checks `name` as a `kind`; the error message says what is allowed.
pub(crate) fn check_name(kind: NameKind, name: &str) -> Result<(), String> {
    let label = kind.label();
    if name.is_empty() {
        return Err(format!(
            "empty {label} (expected letters, digits and `_`, not starting with a digit)"
        ));
    }
    if !is_identifier(name) {
        return Err(format!(
            "invalid {label} `{}` (expected letters, digits and `_`, not starting with a digit)",
            name.escape_debug()
        ));
    }
    let len = name.chars().count();
    if len > kind.max_len() {
        return Err(format!(
            "{label} `{name}` is {len} characters long (expected at most {}, it becomes part of SQL identifiers)",
            kind.max_len()
        ));
    }
    if kind == NameKind::Field {
        if name.eq_ignore_ascii_case("row_key") {
            return Err(format!(
                "field name `{name}` is reserved (every index entry already has a `row_key` column)"
            ));
        }
        if name.starts_with('_') {
            return Err(format!(
                "field name `{name}` is reserved (names starting with `_` are kept for internal columns)"
            ));
        }
    }
    Ok(())
}
