//! What a change of the definitions does to the store and the triggers,
//! by the rules the store applies at start-up and on a reload
//! (`catalog.rs`, "Changing definitions" in the guide): which index tables
//! are created, rebuilt as a new version or left for `index drop`, which
//! change is refused, which trigger starts or stops delivering.

use std::path::PathBuf;

use cellgate_graphql::{camel, pascal, Criticality, SchemaChange};
use index_dsl::{Datastore, Index, Trigger};
use serde::Serialize;

use super::sides::Side;

/// The part of the plan a change belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Section {
    Graphql,
    Storage,
    Triggers,
}

/// How bad a change is; `Refused` is a change the store will not start
/// with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Safe,
    Dangerous,
    Breaking,
    Refused,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Safe => "safe",
            Level::Dangerous => "dangerous",
            Level::Breaking => "breaking",
            Level::Refused => "refused",
        }
    }
}

impl From<Criticality> for Level {
    fn from(c: Criticality) -> Level {
        match c {
            Criticality::Safe => Level::Safe,
            Criticality::Dangerous => Level::Dangerous,
            Criticality::Breaking => Level::Breaking,
        }
    }
}

/// One planned change.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    pub section: Section,
    pub level: Level,
    /// A stable name of the kind of change (`INDEX_REBUILT`,
    /// graphql-inspector's `FIELD_REMOVED`, …).
    pub kind: &'static str,
    /// What changed: `Type.field`, `trips/driver_partner_index`, …
    pub path: String,
    pub message: String,
    /// The definition file it comes from, and the line there, if known.
    pub file: Option<String>,
    pub line: Option<usize>,
    /// For an index built from the cell log, with a store to look at:
    /// what the build reads and how long it may take.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimate: Option<Estimate>,
    /// For an index rebuilt as a new table version: what the previous
    /// version answers while the new one is built.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serving: Option<Serving>,
}

/// While a changed index's new version is built, its previous version
/// keeps answering every query that reads only what it has as the new
/// version has it; the others wait for the new version (`INDEX_BUILDING`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Serving {
    /// The previous version keeps serving (always true: said for readers
    /// of the JSON).
    pub previous_serves: bool,
    /// Queries that select, filter or order by these fields (new, or
    /// changed in type, path or column) wait for the new version.
    pub waiting_fields: Vec<String>,
    /// When the shard field changed: queries by the new one wait for the
    /// new version; queries by this one (the previous version's) are
    /// answered by the previous version meanwhile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub previous_shard_field: Option<String>,
    /// The `where:` predicate changed: until the switch, answers hold the
    /// rows the previous predicate selects.
    pub predicate_changed: bool,
}

impl Serving {
    fn of(before: &Index, after: &Index) -> Serving {
        let shard_changed = !before.shard_field().same_values(after.shard_field());
        Serving {
            previous_serves: true,
            waiting_fields: after
                .fields
                .iter()
                .filter(|f| !before.fields.iter().any(|b| b.same_values(f)))
                .map(|f| f.name.clone())
                .collect(),
            previous_shard_field: shard_changed.then(|| before.shard_field().name.clone()),
            predicate_changed: before.predicate.as_ref().map(|p| p.qualified())
                != after.predicate.as_ref().map(|p| p.qualified()),
        }
    }

    /// The sentence of the plan's text.
    fn text(&self, after: &Index) -> String {
        let mut text =
            "until it has caught up, the previous version answers every query it can answer"
                .to_string();
        if let Some(previous) = &self.previous_shard_field {
            text.push_str(&format!(
                " (those by its shard field `{previous}`); queries by `{}`",
                after.shard_field().name
            ));
            if !self.waiting_fields.is_empty() {
                text.push_str(" or");
            }
        } else if !self.waiting_fields.is_empty() {
            text.push_str("; queries");
        }
        if !self.waiting_fields.is_empty() {
            let names: Vec<String> = self
                .waiting_fields
                .iter()
                .map(|f| format!("`{f}`"))
                .collect();
            text.push_str(&format!(
                " that select, filter or order by {}",
                names.join(", ")
            ));
        }
        if self.previous_shard_field.is_some() || !self.waiting_fields.is_empty() {
            text.push_str(" answer INDEX_BUILDING until then");
        }
        if self.predicate_changed {
            text.push_str("; its answers hold the rows of the previous `where:` until the switch");
        }
        text
    }
}

/// What building an index reads, from a store's log heads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Estimate {
    /// Log cells of the datastore, in all.
    pub cells: i64,
    /// The same, per cluster.
    pub clusters: std::collections::BTreeMap<String, i64>,
    /// Cells per second of the largest build the store's catalogs
    /// recorded, on the slowest cluster the build reads; `None` when none
    /// was recorded.
    pub rate: Option<f64>,
    /// `cells` at `rate`, on the cluster with the most to read.
    pub seconds: Option<f64>,
}

/// The GraphQL changes, pointed at the definition file of the datastore or
/// index their type or field belongs to.
pub fn graphql(changes: Vec<SchemaChange>, base: &Side, head: &Side) -> Vec<Change> {
    changes
        .into_iter()
        .map(|c| {
            // The closer match of either side: a removed index's types
            // belong to its file in the base.
            let found = match (owner(&c.path, head), owner(&c.path, base)) {
                (Some(h), Some(b)) if b.0 > h.0 => Some(base.path(&b.1)),
                (Some(h), _) => Some(head.path(&h.1)),
                (None, b) => b.map(|b| base.path(&b.1)),
            };
            Change {
                section: Section::Graphql,
                level: c.criticality.into(),
                kind: c.kind,
                path: c.path,
                message: c.message,
                file: found,
                line: None,
                estimate: None,
                serving: None,
            }
        })
        .collect()
}

/// The file on `side` of the datastore or index whose generated type, or
/// root or datastore query field, `path` names, with the length of the
/// match (longer is closer).
fn owner(path: &str, side: &Side) -> Option<(usize, PathBuf)> {
    let mut parts = path.split('.');
    let first = parts.next()?;
    let second = parts.next().unwrap_or("");
    let mut best: Option<(usize, PathBuf)> = None;
    for ds in &side.defs.datastores {
        let prefix = pascal(&ds.name);
        let root_field = matches!(first, "Query" | "Mutation" | "Subscription")
            && second.starts_with(&camel(&ds.name));
        if !first.starts_with(&prefix) && !root_field {
            continue;
        }
        let mut found = (prefix.len(), side.datastore_file(&ds.name));
        for index in &ds.indexes {
            let longer = format!("{prefix}{}", pascal(&index.name));
            let query_field =
                first == format!("{prefix}Query") && second.starts_with(&camel(&index.name));
            if first.starts_with(&longer) || query_field {
                found = (longer.len(), side.index_file(&ds.name, &index.name));
            }
        }
        if let (len, Some(file)) = found {
            if best.as_ref().is_none_or(|(l, _)| len > *l) {
                best = Some((len, file));
            }
        }
    }
    best
}

/// The storage and trigger changes from `base` to `head`.
pub fn definitions(base: &Side, head: &Side) -> Vec<Change> {
    let mut out = Vec::new();
    for after in &head.defs.datastores {
        match base.defs.datastore(&after.name) {
            None => {
                out.push(datastore_change(
                    head,
                    after,
                    Level::Safe,
                    "DATASTORE_ADDED",
                    "datastore added: its tables are created on every cluster at start-up"
                        .to_string(),
                ));
                for index in &after.indexes {
                    out.push(index_added(head, after, index));
                }
                for trigger in &after.triggers {
                    out.push(trigger_added(head, trigger));
                }
            }
            Some(before) => compare_datastore(&mut out, base, head, before, after),
        }
    }
    for before in &base.defs.datastores {
        if head.defs.datastore(&before.name).is_none() {
            out.push(datastore_change(
                base,
                before,
                Level::Dangerous,
                "DATASTORE_REMOVED",
                "datastore removed: it is no longer served; its tables and cells stay".to_string(),
            ));
        }
    }
    out
}

fn datastore_change(
    side: &Side,
    ds: &Datastore,
    level: Level,
    kind: &'static str,
    message: String,
) -> Change {
    Change {
        section: Section::Storage,
        level,
        kind,
        path: ds.name.clone(),
        message,
        file: side.datastore_file(&ds.name).map(|f| side.path(&f)),
        line: None,
        estimate: None,
        serving: None,
    }
}

fn compare_datastore(
    out: &mut Vec<Change>,
    base: &Side,
    head: &Side,
    before: &Datastore,
    after: &Datastore,
) {
    if before.shards != after.shards {
        let file = head.datastore_file(&after.name);
        out.push(Change {
            section: Section::Storage,
            level: Level::Refused,
            kind: "SHARD_COUNT_CHANGED",
            path: after.name.clone(),
            message: format!(
                "shards {} -> {}: the store refuses a new shard count at start-up (every stored cell would hash to another shard and become invisible); keep {}",
                before.shards, after.shards, before.shards
            ),
            line: file.as_ref().and_then(|f| head.line_of(f, "shards")).or(Some(1)),
            file: file.map(|f| head.path(&f)),
            estimate: None,
            serving: None,
        });
    }
    for column in &after.columns {
        if before.column(&column.name).is_none() {
            out.push(datastore_change(
                head,
                after,
                Level::Safe,
                "COLUMN_ADDED",
                format!("column `{}` added", column.name),
            ));
        }
    }
    for column in &before.columns {
        if after.column(&column.name).is_none() {
            out.push(datastore_change(
                head,
                after,
                Level::Dangerous,
                "COLUMN_REMOVED",
                format!(
                    "column `{}` removed: its cells stay stored but are no longer served or writable",
                    column.name
                ),
            ));
        }
    }
    for index in &after.indexes {
        match before.index(&index.name) {
            None => out.push(index_added(head, after, index)),
            Some(was) => {
                let reasons = rebuild_reasons(was, index);
                if !reasons.is_empty() {
                    let serving = Serving::of(was, index);
                    out.push(Change {
                        section: Section::Storage,
                        level: Level::Dangerous,
                        kind: "INDEX_REBUILT",
                        path: format!("{}/{}", after.name, index.name),
                        message: format!(
                            "index `{}` is built as a new table version from the cell log ({}); {}; then the new version answers, and the previous version's table stays until `cellgate index drop {} {} --index-version N`",
                            index.name,
                            reasons.join("; "),
                            serving.text(index),
                            after.name,
                            index.name
                        ),
                        file: head.index_file(&after.name, &index.name).map(|f| head.path(&f)),
                        line: None,
                        estimate: None,
                        serving: Some(serving),
                    });
                }
            }
        }
    }
    for index in &before.indexes {
        if after.index(&index.name).is_none() {
            out.push(Change {
                section: Section::Storage,
                level: Level::Dangerous,
                kind: "INDEX_REMOVED",
                path: format!("{}/{}", after.name, index.name),
                message: format!(
                    "index `{}` is no longer served or maintained; its table stays until `cellgate index drop {} {}`",
                    index.name, after.name, index.name
                ),
                file: base.index_file(&after.name, &index.name).map(|f| base.path(&f)),
                line: None,
                estimate: None,
                serving: None,
            });
        }
    }
    for trigger in &after.triggers {
        match before.trigger(&trigger.name) {
            None => out.push(trigger_added(head, trigger)),
            Some(was) => compare_trigger(out, head, was, trigger),
        }
    }
    for trigger in &before.triggers {
        if after.trigger(&trigger.name).is_none() {
            out.push(Change {
                section: Section::Triggers,
                level: Level::Dangerous,
                kind: "TRIGGER_REMOVED",
                path: format!("{}/{}", trigger.datastore, trigger.name),
                message: format!(
                    "trigger `{}` stops delivering to {}; its offsets and quarantine stay (a trigger of the same name later resumes from them)",
                    trigger.name,
                    host(&trigger.webhook.url)
                ),
                file: base.trigger_file(&trigger.datastore, &trigger.name).map(|f| base.path(&f)),
                line: None,
                estimate: None,
                serving: None,
            });
        }
    }
}

fn index_added(side: &Side, ds: &Datastore, index: &Index) -> Change {
    Change {
        section: Section::Storage,
        level: Level::Safe,
        kind: "INDEX_ADDED",
        path: format!("{}/{}", ds.name, index.name),
        message: format!(
            "index `{}` is created and built from the cell log (every cell of {}); queries on it answer INDEX_BUILDING until it has caught up{}",
            index.name,
            index.columns.join(", "),
            stored_only(index)
        ),
        file: side.index_file(&ds.name, &index.name).map(|f| side.path(&f)),
        line: None,
        estimate: None,
        serving: None,
    }
}

/// `; fields stored without a b-tree: …` when the index has such fields
/// (`sort: false`), else nothing.
fn stored_only(index: &Index) -> String {
    let names: Vec<String> = index
        .fields
        .iter()
        .filter(|f| !f.sorted)
        .map(|f| format!("`{}`", f.name))
        .collect();
    if names.is_empty() {
        String::new()
    } else {
        format!(
            "; stored without a b-tree (`sort: false`, filtered on the entries read, never ordered by): {}",
            names.join(", ")
        )
    }
}

/// Why an index gets a new table version: what its signature
/// (`index_signature` in the store) depends on — the shard field, each
/// field's column, path, type and b-tree, the `where:` predicate —
/// changed.
fn rebuild_reasons(before: &Index, after: &Index) -> Vec<String> {
    let mut reasons = Vec::new();
    if before.shard_field().name != after.shard_field().name {
        reasons.push(format!(
            "shard field `{}` -> `{}`",
            before.shard_field().name,
            after.shard_field().name
        ));
    }
    for field in &after.fields {
        match before.fields.iter().find(|f| f.name == field.name) {
            None => reasons.push(format!("field `{}` added", field.name)),
            Some(was) => {
                if was.ty != field.ty {
                    reasons.push(format!(
                        "field `{}`: type {} -> {}",
                        field.name,
                        was.ty.name(),
                        field.ty.name()
                    ));
                }
                if was.path.to_string() != field.path.to_string() {
                    reasons.push(format!(
                        "field `{}`: path {} -> {}",
                        field.name, was.path, field.path
                    ));
                }
                if was.column != field.column {
                    reasons.push(format!(
                        "field `{}`: column {} -> {}",
                        field.name, was.column, field.column
                    ));
                }
                if was.sorted != field.sorted {
                    reasons.push(if field.sorted {
                        format!("field `{}`: gets a b-tree (`sort:` true), pages can be ordered by it", field.name)
                    } else {
                        format!("field `{}`: stored only (`sort: false`), its b-tree is left out and pages can no longer be ordered by it", field.name)
                    });
                }
            }
        }
    }
    for field in &before.fields {
        if !after.fields.iter().any(|f| f.name == field.name) {
            reasons.push(format!("field `{}` removed", field.name));
        }
    }
    let qualified = |i: &Index| i.predicate.as_ref().map(|p| p.qualified());
    if qualified(before) != qualified(after) {
        reasons.push(match (&before.predicate, &after.predicate) {
            (None, Some(_)) => "a `where:` predicate added".to_string(),
            (Some(_), None) => "its `where:` predicate removed".to_string(),
            _ => "its `where:` predicate selects other rows".to_string(),
        });
    }
    if reasons.is_empty()
        && cellgate_store::index_signature(before) != cellgate_store::index_signature(after)
    {
        reasons.push("its stored form changed".to_string());
    }
    reasons
}

fn trigger_added(side: &Side, trigger: &Trigger) -> Change {
    Change {
        section: Section::Triggers,
        level: Level::Dangerous,
        kind: "TRIGGER_ADDED",
        path: format!("{}/{}", trigger.datastore, trigger.name),
        message: format!(
            "trigger `{}` starts delivering every cell of {} from the beginning of each shard's log (the cells stored before it too) to {}",
            trigger.name,
            columns(trigger),
            host(&trigger.webhook.url)
        ),
        file: side.trigger_file(&trigger.datastore, &trigger.name).map(|f| side.path(&f)),
        line: None,
        estimate: None,
        serving: None,
    }
}

fn compare_trigger(out: &mut Vec<Change>, head: &Side, before: &Trigger, after: &Trigger) {
    let mut push = |level: Level, kind: &'static str, what: String| {
        out.push(Change {
            section: Section::Triggers,
            level,
            kind,
            path: format!("{}/{}", after.datastore, after.name),
            message: format!(
                "trigger `{}`: {what}; it goes on from its stored offsets, so the change applies to cells it has not delivered yet",
                after.name
            ),
            file: head.trigger_file(&after.datastore, &after.name).map(|f| head.path(&f)),
            line: None,
            estimate: None,
            serving: None,
        })
    };
    if host(&before.webhook.url) != host(&after.webhook.url) {
        push(
            Level::Dangerous,
            "TRIGGER_HOST_CHANGED",
            format!(
                "deliveries go to {} instead of {}",
                host(&after.webhook.url),
                host(&before.webhook.url)
            ),
        );
    } else if before.webhook.url != after.webhook.url {
        push(
            Level::Safe,
            "TRIGGER_URL_CHANGED",
            format!("url {} -> {}", before.webhook.url, after.webhook.url),
        );
    }
    if before.columns != after.columns {
        push(
            Level::Dangerous,
            "TRIGGER_COLUMNS_CHANGED",
            format!("columns {} -> {}", columns(before), columns(after)),
        );
    }
    if before.filter_text != after.filter_text {
        let text = |t: &Trigger| t.filter_text.clone().unwrap_or_else(|| "none".into());
        push(
            Level::Dangerous,
            "TRIGGER_FILTER_CHANGED",
            format!("filter {} -> {}", text(before), text(after)),
        );
    }
    if before.webhook.headers != after.webhook.headers
        || before.webhook.secret_env != after.webhook.secret_env
    {
        push(
            Level::Safe,
            "TRIGGER_REQUEST_CHANGED",
            "headers or signing secret changed".into(),
        );
    }
    let delivery: Vec<String> = [
        (
            "batch_size",
            u64::from(before.batch_size),
            u64::from(after.batch_size),
        ),
        (
            "max_attempts",
            u64::from(before.max_attempts),
            u64::from(after.max_attempts),
        ),
        (
            "timeout_ms",
            before.webhook.timeout_ms,
            after.webhook.timeout_ms,
        ),
    ]
    .into_iter()
    .filter(|(_, was, now)| was != now)
    .map(|(what, was, now)| format!("{what} {was} -> {now}"))
    .collect();
    if !delivery.is_empty() {
        push(Level::Safe, "TRIGGER_DELIVERY_CHANGED", delivery.join(", "));
    }
}

fn columns(trigger: &Trigger) -> String {
    trigger.columns.join(", ")
}

/// The scheme, host and port of `url`.
fn host(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => format!(
            "{}://{}{}",
            u.scheme(),
            u.host_str().unwrap_or(""),
            u.port().map(|p| format!(":{p}")).unwrap_or_default()
        ),
        Err(_) => url.to_string(),
    }
}
