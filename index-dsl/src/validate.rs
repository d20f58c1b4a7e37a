//! Validation: raw YAML shapes to domain types, every problem reported.
//!
//! Each check reports into a shared list and carries on, so one run shows all problems of a file.
//! A check that depends on something already found broken (an index whose datastore file did not
//! parse, a shard field naming a field with a bad type) stays quiet instead of piling on a
//! follow-up error that would disappear with the first fix.

use std::collections::HashMap;

use serde_saphyr::Spanned;

use crate::datastore::{Column, Datastore};
use crate::diagnostic::Diagnostic;
use crate::field_path::{parse_path, FieldPath};
use crate::field_type::{parse_type, FieldType};
use crate::filter::{parse_filter, CompareOp, Literal};
use crate::identifier::{check_name, NameKind};
use crate::index::{Index, IndexField};
use crate::predicate::{Predicate, PredicateSource};
use crate::raw::{RawDatastore, RawIndex, RawTrigger};
use crate::source::SourceFile;
use crate::trigger::{is_env_name, Template, Trigger, Webhook};
use crate::{DEFAULT_SHARDS, MAX_SHARDS};

/// Checks a parsed `datastore.yaml` found in directory `dir_name`. Returns the datastore (without
/// indexes) when the file has no problems.
pub(crate) fn datastore(
    file: &SourceFile,
    dir_name: &str,
    raw: RawDatastore,
    out: &mut Vec<Diagnostic>,
) -> Option<Datastore> {
    let errors_before = out.len();
    let name = &raw.name;
    if let Err(message) = check_name(NameKind::Datastore, &name.value) {
        out.push(file.at(name, message));
    } else if name.value != dir_name {
        out.push(file.at(
            name,
            format!(
                "datastore name `{}` does not match its directory `{dir_name}` (expected `{dir_name}`)",
                name.value
            ),
        ));
    }

    let shards = match &raw.shards {
        None => DEFAULT_SHARDS,
        Some(shards) => match u32::try_from(shards.value) {
            Ok(n) if (1..=MAX_SHARDS).contains(&n) => n,
            _ => {
                out.push(file.at(
                    shards,
                    format!(
                        "shard count {} is out of range (expected 1 to {MAX_SHARDS})",
                        shards.value
                    ),
                ));
                DEFAULT_SHARDS
            }
        },
    };

    if raw.columns.value.is_empty() {
        out.push(file.at(
            &raw.columns,
            format!(
                "datastore `{}` declares no columns (expected at least one `- name: ...`)",
                name.value
            ),
        ));
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut columns = Vec::new();
    for column in raw.columns.value {
        let cname = &column.name;
        if let Err(message) = check_name(NameKind::Column, &cname.value) {
            out.push(file.at(cname, message));
        } else if let Some(line) = seen.get(&cname.value.to_ascii_lowercase()) {
            out.push(file.at(
                cname,
                format!(
                    "duplicate column `{}` (already declared on line {line}; column names are case-insensitive)",
                    cname.value
                ),
            ));
        } else {
            seen.insert(cname.value.to_ascii_lowercase(), line_of(cname));
        }
        columns.push(Column {
            name: column.name.value,
            description: column.description,
        });
    }

    (out.len() == errors_before).then(|| Datastore {
        name: raw.name.value,
        shards,
        description: raw.description,
        columns,
        indexes: Vec::new(),
        triggers: Vec::new(),
    })
}

/// What an index check needs to know about its surroundings.
pub(crate) struct IndexContext<'a> {
    /// The file name without extension, which must equal `table`.
    pub file_stem: &'a str,
    /// The directory name of the enclosing datastore.
    pub datastore: &'a str,
    /// Column names of the enclosing datastore, or `None` when its definition did not parse (then
    /// column keys are not checked).
    pub columns: Option<&'a [String]>,
    /// Every datastore directory name, to tell "wrong directory" from "unknown datastore".
    pub all_datastores: &'a [String],
}

/// A field as declared, with what is known about it so far.
struct Declared<'a> {
    name: String,
    path_text: &'a str,
    path: Option<FieldPath>,
    ty: Option<FieldType>,
    /// Whether the field passed its own checks.
    ok: bool,
    type_value: &'a Spanned<String>,
    /// `sort:` as written.
    sort: Option<&'a Spanned<bool>>,
}

/// Checks a parsed index file. Returns the index when the file has no problems.
pub(crate) fn index(
    file: &SourceFile,
    ctx: &IndexContext<'_>,
    raw: &RawIndex,
    out: &mut Vec<Diagnostic>,
) -> Option<Index> {
    let errors_before = out.len();
    let table = &raw.table;
    if let Err(message) = check_name(NameKind::Index, &table.value) {
        out.push(file.at(table, message));
    } else if table.value != ctx.file_stem {
        out.push(file.at(
            table,
            format!(
                "index `{}` is defined in file `{}` (expected the file to be named `{}.yaml`)",
                table.value, ctx.file_stem, table.value
            ),
        ));
    }

    let datastore = &raw.datastore;
    if datastore.value != ctx.datastore {
        let message = if ctx.all_datastores.contains(&datastore.value) {
            format!(
                "index for datastore `{}` is under datastore `{}` (expected `{}`, or move the file to {}/indexes/)",
                datastore.value, ctx.datastore, ctx.datastore, datastore.value
            )
        } else {
            format!(
                "unknown datastore `{}` (expected `{}`, the datastore whose directory holds this file)",
                datastore.value.escape_debug(),
                ctx.datastore
            )
        };
        out.push(file.at(datastore, message));
    }

    if raw.column_defs.value.is_empty() {
        out.push(file.at(
            &raw.column_defs,
            "index has no column definitions (expected at least one `- column_key: ...` with `fields:`)",
        ));
    }

    let mut declared: Vec<(Declared<'_>, &str)> = Vec::new();
    let mut columns_used: Vec<String> = Vec::new();
    let mut names_seen: HashMap<String, usize> = HashMap::new();
    for def in &raw.column_defs.value {
        let key = &def.column_key;
        // Column keys are only checked against a datastore that parsed, has columns and is the
        // one the index names; otherwise the real problem is already reported.
        let columns = ctx
            .columns
            .filter(|c| !c.is_empty() && datastore.value == ctx.datastore);
        if let Some(columns) = columns {
            if !columns.contains(&key.value) {
                out.push(file.at(
                    key,
                    format!(
                        "unknown column `{}` in datastore `{}` (expected one of {})",
                        key.value.escape_debug(),
                        ctx.datastore,
                        columns.join(", ")
                    ),
                ));
            }
        }
        if !columns_used.contains(&key.value) {
            columns_used.push(key.value.clone());
        }
        if def.fields.value.is_empty() {
            out.push(file.at(
                &def.fields,
                format!(
                    "column `{}` lists no fields (expected at least one `{{ field: ..., type: ... }}`)",
                    key.value
                ),
            ));
        }
        for field in &def.fields.value {
            let mut ok = true;
            let path = match parse_path(&field.field.value) {
                Ok(path) => Some(path),
                Err(e) => {
                    ok = false;
                    out.push(file.inside(
                        &field.field,
                        e.column - 1,
                        1,
                        format!(
                            "malformed field path `{}`: {}",
                            field.field.value.escape_debug(),
                            e.message
                        ),
                    ));
                    None
                }
            };
            let ty = match parse_type(&field.ty.value) {
                Ok(ty) => Some(ty),
                Err(e) => {
                    ok = false;
                    out.push(file.at(&field.ty, e.message));
                    None
                }
            };
            let (name, anchor) = match (&field.name, &path) {
                (Some(name), _) => {
                    if let Err(message) = check_name(NameKind::Field, &name.value) {
                        ok = false;
                        out.push(file.at(name, message));
                    }
                    (name.value.clone(), name)
                }
                (None, Some(path)) => {
                    let name = path.default_name();
                    if let Err(message) = check_name(NameKind::Field, &name) {
                        ok = false;
                        let hint = if path.is_nested() {
                            format!("; the name `{name}` is derived from the path, set `name:` to choose another)")
                        } else {
                            "; set `name:` to choose another)".to_owned()
                        };
                        let message = message.strip_suffix(')').unwrap_or(&message);
                        out.push(file.at(&field.field, format!("{message}{hint}")));
                    }
                    (name, &field.field)
                }
                (None, None) => (field.field.value.clone(), &field.field),
            };
            let folded = name.to_ascii_lowercase();
            if check_name(NameKind::Field, &name).is_err() {
                // Already reported; a duplicate of an invalid name is noise.
            } else if let Some(line) = names_seen.get(&folded) {
                ok = false;
                out.push(file.at(
                    anchor,
                    format!(
                        "duplicate field name `{name}` in index `{}` (already declared on line {line}; field names are case-insensitive)",
                        table.value
                    ),
                ));
            } else {
                names_seen.insert(folded, line_of(anchor));
            }
            declared.push((
                Declared {
                    name,
                    path_text: &field.field.value,
                    path,
                    ty,
                    ok,
                    type_value: &field.ty,
                    sort: field.sort.as_ref(),
                },
                &key.value,
            ));
        }
    }

    let shard_position = shard_field(file, raw, &declared, out);
    let predicate = raw.predicate.as_ref().and_then(|text| {
        let all_columns = ctx.columns.unwrap_or_default();
        let columns = (&columns_used[..], all_columns);
        predicate(file, &raw.table.value, text, &declared, columns, out)
    });

    if out.len() != errors_before {
        return None;
    }
    let fields = declared
        .into_iter()
        .filter_map(|(d, column)| {
            Some(IndexField {
                path: d.path?,
                ty: d.ty?,
                name: d.name,
                column: column.to_owned(),
                sorted: d.sort.is_none_or(|s| s.value),
            })
        })
        .collect::<Vec<_>>();
    let shard_field = shard_position?;
    (shard_field < fields.len()).then(|| Index {
        name: raw.table.value.clone(),
        datastore: raw.datastore.value.clone(),
        description: raw.description.clone(),
        fields,
        shard_field,
        columns: columns_used,
        predicate,
    })
}

/// Resolves the shard field: `shard_field:` by name, then by path text, else the first field.
fn shard_field(
    file: &SourceFile,
    raw: &RawIndex,
    declared: &[(Declared<'_>, &str)],
    out: &mut Vec<Diagnostic>,
) -> Option<usize> {
    let position = match &raw.shard_field {
        Some(wanted) => {
            let found = declared
                .iter()
                .position(|(d, _)| d.name == wanted.value)
                .or_else(|| {
                    declared
                        .iter()
                        .position(|(d, _)| d.path_text == wanted.value)
                });
            if found.is_none() {
                let message = if parse_path(&wanted.value).is_err() {
                    format!(
                        "invalid shard field `{}` (expected the name or path of a field of this index)",
                        wanted.value.escape_debug()
                    )
                } else {
                    let names: Vec<&str> = declared.iter().map(|(d, _)| d.name.as_str()).collect();
                    format!(
                        "shard field `{}` names no field of index `{}` (expected one of {})",
                        wanted.value,
                        raw.table.value,
                        names.join(", ")
                    )
                };
                out.push(file.at(wanted, message));
            }
            found?
        }
        None if declared.is_empty() => return None,
        None => 0,
    };
    let (field, _) = &declared[position];
    if let Some(sort) = field.sort.filter(|s| !s.value) {
        out.push(file.at(
            sort,
            format!(
                "`sort: false` does not apply to the shard field `{}`: every b-tree of the index begins with it (remove `sort:`, or make another field the shard field)",
                field.name
            ),
        ));
    }
    if field.ok && field.ty == Some(FieldType::Bool) {
        let message = format!(
            "bool field `{}` cannot be the shard field: its two values would put every entry in one of two shards (pick a UUID, string or int field{})",
            field.name,
            if raw.shard_field.is_some() { "" } else { ", or name one with `shard_field:`; the default is the first field" }
        );
        out.push(match &raw.shard_field {
            Some(wanted) => file.at(wanted, message),
            None => file.at(field.type_value, message),
        });
    }
    Some(position)
}

/// Checks the `where:` of index `table`: it parses, each name resolves to a field of the index
/// or a path into one of its `columns` (see [`Predicate`]; `all_columns` are the datastore's,
/// to tell a column the index does not read from an unknown name), and literals compared with a
/// field fit its type.
fn predicate(
    file: &SourceFile,
    table: &str,
    text: &Spanned<String>,
    declared: &[(Declared<'_>, &str)],
    (columns, all_columns): (&[String], &[String]),
    out: &mut Vec<Diagnostic>,
) -> Option<Predicate> {
    let filter = match parse_filter(&text.value) {
        Ok(filter) => filter,
        Err(e) => {
            let offset = filter_error_offset(&text.value, &e);
            out.push(file.inside(text, offset, 1, format!("invalid predicate: {}", e.message)));
            return None;
        }
    };
    let errors_before = out.len();
    let mut sources = Vec::new();
    for condition in &filter.conditions {
        let name = condition.field.as_str();
        let at = |message: String| {
            file.inside(text, condition.column - 1, name.chars().count(), message)
        };
        let Ok(path) = parse_path(name) else {
            // The filter grammar only accepts paths here.
            out.push(at(format!(
                "invalid field `{}` in predicate",
                name.escape_debug()
            )));
            continue;
        };
        let by_field = declared
            .iter()
            .find(|(d, _)| d.name == name)
            .or_else(|| declared.iter().find(|(d, _)| d.path_text == name))
            .and_then(|(d, column)| Some(((*column).to_owned(), d.path.clone()?)));
        let qualified = match path.segments() {
            [first, rest @ ..] if !rest.is_empty() && columns.contains(first) => {
                Some((first.clone(), FieldPath::from_segments(rest.to_vec())))
            }
            _ => None,
        };
        let source = match (by_field, qualified, columns) {
            (Some(source), _, _) | (None, Some(source), _) => source,
            (None, None, [only]) => (only.clone(), path),
            (None, None, _) if path.is_nested() && all_columns.contains(&path.segments()[0]) => {
                let other = &path.segments()[0];
                out.push(at(format!(
                    "column `{other}` is not read by index `{table}` (a predicate reads only the index's columns: {}; add a `column_key: {other}` entry to `column_defs` to filter on it)",
                    columns.join(", ")
                )));
                continue;
            }
            (None, None, _) => {
                let fields: Vec<&str> = declared.iter().map(|(d, _)| d.name.as_str()).collect();
                out.push(at(format!(
                    "unknown field `{name}` in the predicate of index `{table}` (expected a field of the index ({}) or `<COLUMN>.<path>` into one of its columns ({}))",
                    fields.join(", "),
                    columns.join(", ")
                )));
                continue;
            }
        };
        let (column, path) = source;
        let field = declared
            .iter()
            .find(|(d, c)| d.ok && *c == column && d.path.as_ref() == Some(&path));
        for literal in &condition.values {
            let problem = match (literal, field) {
                (Literal::Null, _) if condition.op.is_range() => Some(format!(
                    "`{name} {} null` never holds (expected `= null` or `!= null`)",
                    condition.op
                )),
                (_, Some((d, _))) => {
                    d.ty.and_then(|ty| literal_problem(&d.name, ty, condition.op, literal))
                }
                _ => None,
            };
            if let Some(problem) = problem {
                out.push(at(format!("invalid predicate: {problem}")));
            }
        }
        sources.push(PredicateSource { column, path });
    }
    (out.len() == errors_before).then(|| Predicate {
        text: text.value.clone(),
        filter,
        sources,
    })
}

/// Why `literal` cannot be compared with field `name` of type `ty` by `op`, if it cannot.
fn literal_problem(name: &str, ty: FieldType, op: CompareOp, literal: &Literal) -> Option<String> {
    let wrong = |what: &str| {
        Some(format!(
            "field `{name}` is {}; {what} cannot be compared with it",
            ty.name()
        ))
    };
    if op.is_range() && !ty.is_ordered() {
        return Some(format!(
            "field `{name}` is {}, which has no order (expected =, != or in)",
            ty.name()
        ));
    }
    match (ty, literal) {
        (_, Literal::Null) => None,
        (FieldType::Uuid, Literal::String(s)) => uuid::Uuid::try_parse(s)
            .is_err()
            .then(|| format!("`{}` is not a valid UUID", s.escape_debug())),
        (FieldType::DateTime, Literal::String(s)) => chrono::DateTime::parse_from_rfc3339(s)
            .is_err()
            .then(|| format!("`{}` is not an RFC 3339 datetime", s.escape_debug())),
        (FieldType::String, Literal::String(_))
        | (FieldType::Int, Literal::Int(_))
        | (FieldType::Float, Literal::Int(_) | Literal::Float(_))
        | (FieldType::Bool, Literal::Bool(_)) => None,
        (_, Literal::String(_)) => wrong("a string"),
        (_, Literal::Int(_)) => wrong("an integer"),
        (_, Literal::Float(_)) => wrong("a float"),
        (_, Literal::Bool(_)) => wrong("a boolean"),
    }
}

/// The character offset in `text` of filter error `e` (which counts lines and columns).
fn filter_error_offset(text: &str, e: &crate::filter_error::FilterError) -> usize {
    text.lines()
        .take(e.line - 1)
        .map(|l| l.chars().count() + 1)
        .sum::<usize>()
        + e.column
        - 1
}

fn line_of<T>(value: &Spanned<T>) -> usize {
    usize::try_from(value.referenced.line()).unwrap_or(0)
}

/// What a trigger check needs to know about its surroundings.
pub(crate) struct TriggerContext<'a> {
    /// The file name without extension, which must equal `name`.
    pub file_stem: &'a str,
    /// The directory name of the enclosing datastore.
    pub datastore: &'a str,
    /// Column names of the enclosing datastore, or `None` when its definition did not parse.
    pub columns: Option<&'a [String]>,
}

/// `value` of `key` as an integer in `range`, or `default` when absent.
fn bounded(
    file: &SourceFile,
    key: &str,
    value: &Option<Spanned<i64>>,
    range: std::ops::RangeInclusive<i64>,
    default: i64,
    out: &mut Vec<Diagnostic>,
) -> i64 {
    match value {
        None => default,
        Some(v) if range.contains(&v.value) => v.value,
        Some(v) => {
            out.push(file.at(
                v,
                format!(
                    "{key} {} is out of range (expected {} to {})",
                    v.value,
                    range.start(),
                    range.end()
                ),
            ));
            default
        }
    }
}

/// Checks a parsed trigger file. Returns the trigger when the file has no problems.
pub(crate) fn trigger(
    file: &SourceFile,
    ctx: &TriggerContext<'_>,
    raw: RawTrigger,
    out: &mut Vec<Diagnostic>,
) -> Option<Trigger> {
    let errors_before = out.len();
    let name = &raw.name;
    if let Err(message) = check_name(NameKind::Trigger, &name.value) {
        out.push(file.at(name, message));
    } else if name.value != ctx.file_stem {
        out.push(file.at(
            name,
            format!(
                "trigger `{}` is defined in file `{}` (expected the file to be named `{}.yaml`)",
                name.value, ctx.file_stem, name.value
            ),
        ));
    }
    if raw.datastore.value != ctx.datastore {
        out.push(file.at(
            &raw.datastore,
            format!(
                "trigger for datastore `{}` is under datastore `{}` (expected `{}`, the datastore whose directory holds this file)",
                raw.datastore.value.escape_debug(),
                ctx.datastore,
                ctx.datastore
            ),
        ));
    }

    if raw.columns.value.is_empty() {
        out.push(file.at(
            &raw.columns,
            "trigger follows no columns (expected at least one column, e.g. `columns: [BASE]`)",
        ));
    }
    let mut columns: Vec<String> = Vec::new();
    for column in &raw.columns.value {
        if let Some(known) = ctx.columns.filter(|c| !c.is_empty()) {
            if !known.contains(&column.value) {
                out.push(file.at(
                    column,
                    format!(
                        "unknown column `{}` in datastore `{}` (expected one of {})",
                        column.value.escape_debug(),
                        ctx.datastore,
                        known.join(", ")
                    ),
                ));
                continue;
            }
        }
        if columns.contains(&column.value) {
            out.push(file.at(
                column,
                format!(
                    "column `{}` is listed twice (expected each column once)",
                    column.value
                ),
            ));
            continue;
        }
        columns.push(column.value.clone());
    }

    let filter = match &raw.filter {
        None => None,
        Some(text) => match parse_filter(&text.value) {
            Ok(filter) => {
                for condition in &filter.conditions {
                    if let Err(e) = parse_path(&condition.field) {
                        out.push(file.inside(
                            text,
                            condition.column - 1 + e.column - 1,
                            1,
                            format!(
                                "malformed field path `{}` in filter: {}",
                                condition.field.escape_debug(),
                                e.message
                            ),
                        ));
                    }
                }
                Some(filter)
            }
            Err(e) => {
                let offset = filter_error_offset(&text.value, &e);
                out.push(file.inside(text, offset, 1, format!("invalid filter: {}", e.message)));
                None
            }
        },
    };

    let webhook = &raw.webhook;
    let url = &webhook.url.value;
    let scheme_ok = ["http://", "https://"]
        .iter()
        .any(|s| url.len() > s.len() && url[..s.len()].eq_ignore_ascii_case(s));
    if !scheme_ok || url.chars().any(char::is_whitespace) {
        out.push(file.at(
            &webhook.url,
            format!(
                "invalid webhook url `{}` (expected an http:// or https:// URL)",
                url.escape_debug()
            ),
        ));
    }
    let mut headers = Vec::new();
    for (header, value) in webhook.headers.iter().flatten() {
        let token = !header.is_empty()
            && header
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c));
        if !token {
            out.push(file.at(
                value,
                format!(
                    "invalid header name `{}` (expected letters, digits and `-`)",
                    header.escape_debug()
                ),
            ));
            continue;
        }
        let reserved = [
            "content-type",
            "content-length",
            "host",
            "x-cellgate-signature",
        ];
        if reserved.contains(&header.to_ascii_lowercase().as_str()) {
            out.push(file.at(
                value,
                format!("header `{header}` is set by the gateway (expected another header)"),
            ));
            continue;
        }
        match Template::parse(&value.value) {
            Ok(template) => headers.push((header.clone(), template)),
            Err((offset, message)) => {
                out.push(file.inside(value, offset, 1, format!("header `{header}`: {message}")))
            }
        }
    }
    if let Some(env) = &webhook.secret_env {
        if !is_env_name(&env.value) {
            out.push(file.at(
                env,
                format!(
                    "invalid environment variable name `{}` (expected letters, digits and `_`, not starting with a digit)",
                    env.value.escape_debug()
                ),
            ));
        }
    }
    let timeout_ms = bounded(
        file,
        "timeout_ms",
        &webhook.timeout_ms,
        1..=600_000,
        5000,
        out,
    );
    let ca_file = match &webhook.ca_file {
        Some(ca) if ca.value.trim().is_empty() => {
            out.push(file.at(ca, "ca_file is empty (expected the path of a PEM file)"));
            None
        }
        Some(ca) if !webhook.url.value.starts_with("https://") => {
            out.push(file.at(ca, "ca_file is for an https:// url (this trigger's is not)"));
            None
        }
        Some(ca) => Some(
            file.path
                .parent()
                .unwrap_or(std::path::Path::new("."))
                .join(&ca.value),
        ),
        None => None,
    };
    let batch_size = bounded(file, "batch_size", &raw.batch_size, 1..=10_000, 100, out);
    let max_attempts = bounded(file, "max_attempts", &raw.max_attempts, 1..=1000, 5, out);

    (out.len() == errors_before).then(|| Trigger {
        name: raw.name.value,
        datastore: raw.datastore.value,
        columns,
        filter,
        filter_text: raw.filter.map(|f| f.value),
        webhook: Webhook {
            url: webhook.url.value.clone(),
            headers,
            secret_env: webhook.secret_env.as_ref().map(|e| e.value.clone()),
            timeout_ms: timeout_ms as u64,
            ca_file,
        },
        batch_size: batch_size as u32,
        max_attempts: max_attempts as u32,
    })
}
