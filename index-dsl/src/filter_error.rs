//! [`FilterError`]: the error of the expression sub-language.
//!
//! Filter expressions arrive from clients, field paths and type names from YAML values. In all
//! three cases the caller wants the same thing: where in the text the problem is, what was
//! expected, and the offending line to show under a caret. Positions are 1-based and counted in
//! characters, not bytes, so carets line up under non-ASCII text.

use std::fmt;

/// A parse error in a filter expression, field path or type name.
#[derive(Debug, Clone, PartialEq)]
pub struct FilterError {
    /// 1-based line in the parsed text.
    pub line: usize,
    /// 1-based character column in that line.
    pub column: usize,
    /// What went wrong, lowercase, saying what was expected.
    pub message: String,
    /// The text of the offending line, without its line terminator.
    pub source_line: String,
}

impl FilterError {
    /// An error at byte `offset` of `src` (clamped to the text and to a char boundary).
    pub(crate) fn at(src: &str, offset: usize, message: impl Into<String>) -> FilterError {
        let mut offset = offset.min(src.len());
        while !src.is_char_boundary(offset) {
            offset -= 1;
        }
        let line_start = src[..offset].rfind('\n').map_or(0, |i| i + 1);
        let line_end = src[offset..].find('\n').map_or(src.len(), |i| offset + i);
        FilterError {
            line: src[..offset].matches('\n').count() + 1,
            column: src[line_start..offset].chars().count() + 1,
            message: message.into(),
            source_line: src[line_start..line_end].trim_end_matches('\r').to_owned(),
        }
    }
}

impl fmt::Display for FilterError {
    /// Renders the message, the source line and a caret under the offending column:
    ///
    /// ```text
    /// expected comparison operator or `in` at 1:11
    ///   city_uuid ~ "x"
    ///             ^
    /// ```
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} at {}:{}", self.message, self.line, self.column)?;
        writeln!(f, "  {}", self.source_line)?;
        let pad: String = self
            .source_line
            .chars()
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .chain(std::iter::repeat(' '))
            .take(self.column.saturating_sub(1))
            .collect();
        write!(f, "  {pad}^")
    }
}

impl std::error::Error for FilterError {}
