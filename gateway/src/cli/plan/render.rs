//! A plan as text, JSON or GitHub workflow commands.

use std::fmt::Write as _;

use serde_json::json;

use super::changes::{Change, Level, Section};
use super::{Format, Plan};

/// The version of the JSON shape; raised when a field changes meaning or
/// goes away (new fields may be added without).
pub const JSON_VERSION: u32 = 1;

pub fn render(plan: &Plan, format: Format) -> String {
    match format {
        Format::Text => text(plan),
        Format::Json => {
            let mut out = serde_json::to_string_pretty(&as_json(plan)).expect("a plan serializes");
            out.push('\n');
            out
        }
        Format::Github => github(plan),
    }
}

fn counts(plan: &Plan) -> [(Level, usize); 4] {
    [
        Level::Refused,
        Level::Breaking,
        Level::Dangerous,
        Level::Safe,
    ]
    .map(|level| {
        (
            level,
            plan.changes.iter().filter(|c| c.level == level).count(),
        )
    })
}

fn summary(plan: &Plan) -> String {
    if plan.changes.is_empty() {
        return "no changes".to_string();
    }
    counts(plan)
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(level, n)| format!("{n} {}", level.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn section_title(section: Section) -> &'static str {
    match section {
        Section::Graphql => "GraphQL schema",
        Section::Storage => "Storage",
        Section::Triggers => "Triggers",
    }
}

fn text(plan: &Plan) -> String {
    let mut out = format!("cellgate plan: {} against {}\n", plan.head, plan.base);
    for section in [Section::Graphql, Section::Storage, Section::Triggers] {
        let changes: Vec<&Change> = plan
            .changes
            .iter()
            .filter(|c| c.section == section)
            .collect();
        if changes.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{}:", section_title(section));
        for change in changes {
            let at = match (&change.file, change.line) {
                (Some(file), Some(line)) => format!(" ({file}:{line})"),
                (Some(file), None) => format!(" ({file})"),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  {:<9}  {}: {}{at}",
                change.level.as_str(),
                change.path,
                change.message
            );
            if let Some(estimate) = &change.estimate {
                let _ = writeln!(out, "             {}", super::estimate::describe(estimate));
            }
        }
    }
    let _ = writeln!(out, "\n{}", summary(plan));
    out
}

fn as_json(plan: &Plan) -> serde_json::Value {
    let counts: serde_json::Map<String, serde_json::Value> = counts(plan)
        .iter()
        .map(|(level, n)| (level.as_str().to_string(), json!(n)))
        .collect();
    json!({
        "version": JSON_VERSION,
        "base": plan.base,
        "head": plan.head,
        "base_digest": plan.base_digest,
        "head_digest": plan.head_digest,
        "summary": counts,
        "changes": plan.changes,
    })
}

/// One workflow command per change (`::error` for breaking and refused
/// ones, `::warning` for dangerous, `::notice` for safe), then a notice
/// with the summary.
fn github(plan: &Plan) -> String {
    let mut out = String::new();
    for change in &plan.changes {
        let command = match change.level {
            Level::Refused | Level::Breaking => "error",
            Level::Dangerous => "warning",
            Level::Safe => "notice",
        };
        let mut properties = Vec::new();
        if let Some(file) = &change.file {
            properties.push(format!("file={}", property(file)));
            if let Some(line) = change.line {
                properties.push(format!("line={line}"));
            }
        }
        properties.push(format!(
            "title={}",
            property(&format!(
                "cellgate plan: {} {}",
                change.level.as_str(),
                change.path
            ))
        ));
        let _ = writeln!(
            out,
            "::{command} {}::{}",
            properties.join(","),
            data(&change.message)
        );
    }
    let _ = writeln!(
        out,
        "::notice title=cellgate plan::{}",
        data(&summary(plan))
    );
    out
}

/// A workflow command's message, escaped.
fn data(text: &str) -> String {
    text.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

/// A workflow command's property value, escaped.
fn property(text: &str) -> String {
    data(text).replace(':', "%3A").replace(',', "%2C")
}

#[cfg(test)]
mod tests {
    use super::{data, property};

    #[test]
    fn workflow_commands_are_escaped() {
        assert_eq!(data("a%b\nc"), "a%25b%0Ac");
        assert_eq!(property("x: y, z"), "x%3A y%2C z");
    }
}
