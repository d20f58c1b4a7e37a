//! [`FieldPath`]: a dotted path into a cell's JSON body, such as `fare.total`.
//!
//! Paths are parsed by the pest grammar so that YAML definitions and filter expressions agree on
//! what a path is. A parsed path is never empty and every segment is an identifier, which is why
//! the segments are private: a `FieldPath` that exists is a valid one.

use std::fmt;
use std::str::FromStr;

use pest::Parser;

use crate::filter_error::FilterError;
use crate::grammar::{filter_error, ExprParser, Rule};

/// A non-empty sequence of identifiers naming a value in a JSON body (`fare.total`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FieldPath(Vec<String>);

impl FieldPath {
    /// Builds a path from segments the grammar already accepted.
    pub(crate) fn from_segments(segments: Vec<String>) -> FieldPath {
        debug_assert!(!segments.is_empty());
        FieldPath(segments)
    }

    /// The path's segments, outermost first: `fare.total` is `["fare", "total"]`.
    pub fn segments(&self) -> &[String] {
        &self.0
    }

    /// Whether the path reaches into a nested object (has more than one segment).
    pub fn is_nested(&self) -> bool {
        self.0.len() > 1
    }

    /// The index field name used when a definition gives none: segments joined with `_`
    /// (`fare.total` becomes `fare_total`).
    pub fn default_name(&self) -> String {
        self.0.join("_")
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.join("."))
    }
}

impl FromStr for FieldPath {
    type Err = FilterError;

    fn from_str(src: &str) -> Result<FieldPath, FilterError> {
        parse_path(src)
    }
}

/// Parses a field path: identifiers separated by `.`, no whitespace.
pub fn parse_path(src: &str) -> Result<FieldPath, FilterError> {
    let mut pairs = ExprParser::parse(Rule::path_input, src).map_err(|e| filter_error(src, e))?;
    let path = pairs
        .next()
        .and_then(|input| input.into_inner().find(|p| p.as_rule() == Rule::path))
        .ok_or_else(|| FilterError::at(src, 0, "expected field name"))?;
    Ok(path_from_pair(path))
}

/// Builds a [`FieldPath`] from a `path` pair.
pub(crate) fn path_from_pair(pair: pest::iterators::Pair<'_, Rule>) -> FieldPath {
    let segments = pair
        .into_inner()
        .filter(|p| p.as_rule() == Rule::identifier)
        .map(|p| p.as_str().to_owned())
        .collect();
    FieldPath::from_segments(segments)
}
