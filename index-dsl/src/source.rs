//! [`SourceFile`]: one definition file's path and text, and diagnostics pointing into it.
//!
//! Checks report problems against YAML values (`Spanned<T>`) or serde-saphyr errors; this module
//! turns those positions into [`Diagnostic`]s with the right line text and caret width, so the
//! checks themselves only say what is wrong.

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde_saphyr::{Location, MessageFormatter, Spanned};

use crate::diagnostic::Diagnostic;

/// A definition file: the path shown in diagnostics and its text.
#[derive(Debug, Clone)]
pub(crate) struct SourceFile {
    /// The definitions directory joined with the file's relative path.
    pub path: PathBuf,
    /// The whole file.
    pub text: String,
}

impl SourceFile {
    /// Parses the file as `T`, reporting a syntax or structure error into `out`.
    pub fn parse<T: DeserializeOwned>(&self, out: &mut Vec<Diagnostic>) -> Option<T> {
        match serde_saphyr::from_str::<T>(&self.text) {
            Ok(value) => Some(value),
            Err(err) => {
                let message = yaml_message(&err);
                match err.location().filter(|l| l.line() > 0) {
                    Some(loc) => {
                        let len = usize::try_from(loc.span().len()).unwrap_or(1);
                        out.push(self.at_location(loc, 0, len, message));
                    }
                    None => out.push(Diagnostic::file(&self.path, message)),
                }
                None
            }
        }
    }

    /// A diagnostic underlining the whole of `value`.
    pub fn at<T>(&self, value: &Spanned<T>, message: impl Into<String>) -> Diagnostic {
        let len = usize::try_from(value.referenced.span().len()).unwrap_or(1);
        self.at_location(value.referenced, 0, len, message)
    }

    /// A diagnostic at character `offset` inside the string scalar `value`, `len` wide. Quotes
    /// around the scalar are skipped so the caret lands on the offending character, and in a
    /// scalar written over several lines the offset is followed onto the line that holds it.
    pub fn inside(
        &self,
        value: &Spanned<String>,
        offset: usize,
        len: usize,
        message: impl Into<String>,
    ) -> Diagnostic {
        let loc = value.referenced;
        if loc.line() == 0 {
            return Diagnostic::file(&self.path, message);
        }
        let quoted = self
            .line_text(loc.line())
            .chars()
            .nth(to_usize(loc.column()).saturating_sub(1))
            .is_some_and(|c| c == '"' || c == '\'');
        let (line, column) = self.position_in_scalar(loc, offset + usize::from(quoted));
        let rest = self
            .line_text(line as u64)
            .chars()
            .count()
            .saturating_sub(column - 1);
        Diagnostic::at(
            &self.path,
            &self.text,
            line,
            column,
            len.min(rest).max(1),
            message,
        )
    }

    /// The line and column of character `offset` of the scalar that starts at `loc`. A plain,
    /// folded or literal scalar over several lines drops their indentation and joins them with
    /// one character (a space or a newline), so the offset is walked over the source lines the
    /// same way; an offset on the first line, or past the text, stays on the line it reaches.
    fn position_in_scalar(&self, loc: Location, mut offset: usize) -> (usize, usize) {
        let mut line = to_usize(loc.line());
        let mut column = to_usize(loc.column()).max(1);
        loop {
            let rest = self
                .line_text(line as u64)
                .chars()
                .count()
                .saturating_sub(column - 1);
            let has_next = self.text.lines().nth(line).is_some();
            if offset <= rest || !has_next {
                return (line, column + offset);
            }
            offset -= rest + 1;
            line += 1;
            column = self
                .line_text(line as u64)
                .chars()
                .take_while(|c| *c == ' ' || *c == '\t')
                .count()
                + 1;
        }
    }

    fn at_location(
        &self,
        loc: Location,
        offset: usize,
        len: usize,
        message: impl Into<String>,
    ) -> Diagnostic {
        let line = to_usize(loc.line());
        if line == 0 {
            return Diagnostic::file(&self.path, message);
        }
        let column = to_usize(loc.column()).max(1) + offset;
        // A multi-line scalar would underline past its first line; stop at the line's end.
        let rest = self
            .line_text(loc.line())
            .chars()
            .count()
            .saturating_sub(column - 1);
        Diagnostic::at(
            &self.path,
            &self.text,
            line,
            column,
            len.min(rest).max(1),
            message,
        )
    }

    fn line_text(&self, line: u64) -> &str {
        self.text
            .lines()
            .nth(to_usize(line).saturating_sub(1))
            .unwrap_or_default()
    }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// serde-saphyr's message for `err`, reworded where its wording is aimed at Rust programmers
/// rather than at someone editing YAML.
fn yaml_message(err: &serde_saphyr::Error) -> String {
    let message = serde_saphyr::DefaultMessageFormatter.format_message(err);
    let message = message.trim();
    if let Some(rest) = message.strip_prefix("duplicate mapping key: ") {
        let key = rest.split(',').next().unwrap_or(rest).trim();
        return format!("duplicate key `{key}` (expected each key once)");
    }
    // serde speaks of struct fields; the person editing the file sees keys.
    if let Some(rest) = message.strip_prefix("unknown field ") {
        return match rest.split_once(", expected ") {
            Some((key, expected)) => format!("unknown key {key} (expected {expected})"),
            None => format!("unknown key {rest}"),
        };
    }
    if let Some(rest) = message.strip_prefix("missing field ") {
        return format!("missing key {rest}");
    }
    if message.starts_with("cannot deserialize null into") {
        return "expected a value, found null".to_owned();
    }
    let reworded = match message {
        "unexpected end of input" => "empty definition file (expected a mapping of keys to values)",
        "expected mapping start" => "expected a mapping (`key: value` lines)",
        "expected sequence start" => "expected a list (`- item` lines or `[...]`)",
        "expected string scalar" => "expected a string",
        "invalid i64" => "expected an integer",
        other => other,
    };
    let mut chars = reworded.chars();
    match chars.next() {
        // Messages are lowercase by convention; YAML parser messages sometimes are not.
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => "invalid YAML".to_owned(),
    }
}
