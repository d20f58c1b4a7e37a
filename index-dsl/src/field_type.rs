//! [`FieldType`]: the value types an index field can have.
//!
//! The set is closed and small on purpose: each type must map onto a column type on every SQL
//! backend and have a well-defined order for range queries. Type names are case-insensitive in
//! definitions (`UUID`, `uuid`, `Datetime`), and [`FieldType::name`] gives the canonical spelling.

use std::fmt;
use std::str::FromStr;

use pest::Parser;

use crate::filter_error::FilterError;
use crate::grammar::{ExprParser, Rule};

/// The type of an index field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldType {
    /// A UUID, written as a string in JSON bodies.
    Uuid,
    /// A UTF-8 string.
    String,
    /// A 64-bit signed integer.
    Int,
    /// A 64-bit float.
    Float,
    /// `true` or `false`.
    Bool,
    /// An RFC 3339 timestamp, stored as UTC.
    DateTime,
}

impl FieldType {
    /// Every type, in the order used in "expected one of" messages.
    pub const ALL: [FieldType; 6] = [
        FieldType::Uuid,
        FieldType::String,
        FieldType::Int,
        FieldType::Float,
        FieldType::Bool,
        FieldType::DateTime,
    ];

    /// Whether values of this type have a meaningful order (and so support `<`, `<=`, `>`, `>=`).
    pub fn is_ordered(self) -> bool {
        !matches!(self, FieldType::Bool)
    }

    /// The canonical spelling: `UUID`, `string`, `int`, `float`, `bool`, `datetime`.
    pub fn name(self) -> &'static str {
        match self {
            FieldType::Uuid => "UUID",
            FieldType::String => "string",
            FieldType::Int => "int",
            FieldType::Float => "float",
            FieldType::Bool => "bool",
            FieldType::DateTime => "datetime",
        }
    }
}

impl fmt::Display for FieldType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for FieldType {
    type Err = FilterError;

    fn from_str(src: &str) -> Result<FieldType, FilterError> {
        parse_type(src)
    }
}

/// Parses a type name, case-insensitively (`UUID`, `uuid`, `Datetime`, ...).
pub fn parse_type(src: &str) -> Result<FieldType, FilterError> {
    let unknown = || {
        let expected: Vec<&str> = FieldType::ALL.iter().map(|t| t.name()).collect();
        FilterError::at(
            src,
            0,
            format!(
                "unknown type `{}` (expected one of {})",
                src.escape_debug(),
                expected.join(", ")
            ),
        )
    };
    let pairs = ExprParser::parse(Rule::type_input, src).map_err(|_| unknown())?;
    let name = pairs
        .flatten()
        .find(|p| p.as_rule() == Rule::type_name)
        .ok_or_else(unknown)?
        .as_str()
        .to_ascii_lowercase();
    Ok(match name.as_str() {
        "uuid" => FieldType::Uuid,
        "string" => FieldType::String,
        "int" => FieldType::Int,
        "float" => FieldType::Float,
        "bool" => FieldType::Bool,
        "datetime" => FieldType::DateTime,
        _ => return Err(unknown()),
    })
}
