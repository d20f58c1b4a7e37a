//! Index entries: typed field values taken from cell bodies.
//!
//! A field is a path into the JSON body; its value is converted to the
//! field's declared type. A missing value or one of the wrong type is
//! stored as NULL (the body has no schema, so this is not an error); a NULL
//! shard field means the row has no entry in that index.
//!
//! **Values a backend cannot store** follow one rule on every backend:
//! the field is stored as NULL and counted (`cellgate_index_unstorable_values`),
//! so one odd value never stops a shard. That covers strings containing
//! U+0000 (PostgreSQL refuses them in text), strings longer than
//! [`MAX_INDEXED_STRING`] characters (MySQL's key length), datetimes
//! outside the years 1000–9999 (MySQL's `DATETIME` range), integers beyond
//! the signed 64-bit range and non-finite floats. Query literals that could
//! never match such a stored value are refused with a clear message.

use chrono::{DateTime, Utc};
use index_dsl::{FieldType, IndexField, Literal};

use crate::storage::{ddl::MAX_INDEXED_STRING, value::truncate_to_micros, ColType, Value};

/// The SQL type that stores a field type.
pub fn col_type(ty: FieldType) -> ColType {
    match ty {
        FieldType::Uuid => ColType::Uuid,
        FieldType::String => ColType::Text,
        FieldType::Int => ColType::Int,
        FieldType::Float => ColType::Float,
        FieldType::Bool => ColType::Bool,
        FieldType::DateTime => ColType::DateTime,
    }
}

/// What became of one field of a body.
#[derive(Debug, Clone, PartialEq)]
pub enum Extracted {
    /// A value of the field's type that every backend stores.
    Value(Value),
    /// No value at the path, or one of another type: NULL.
    Missing,
    /// A value of the right type that not every backend can store: NULL,
    /// and counted. The text says why.
    Unstorable(&'static str),
}

/// The value of `field` in `body`, typed, or a typed NULL.
pub fn extract(body: &serde_json::Value, field: &IndexField) -> Value {
    match extract_checked(body, field) {
        Extracted::Value(value) => value,
        Extracted::Missing | Extracted::Unstorable(_) => Value::Null(col_type(field.ty)),
    }
}

/// Like [`extract`], telling a missing value from an unstorable one.
pub fn extract_checked(body: &serde_json::Value, field: &IndexField) -> Extracted {
    let mut node = body;
    for segment in field.path.segments() {
        match node.get(segment.as_str()) {
            Some(child) => node = child,
            None => return Extracted::Missing,
        }
    }
    from_json(node, field.ty)
}

/// Earliest and latest datetimes every backend stores (MySQL `DATETIME`).
const MIN_YEAR: i32 = 1000;
const MAX_YEAR: i32 = 9999;

/// Why a value of the right type cannot be stored, if it cannot.
fn unstorable(value: &Value) -> Option<&'static str> {
    use chrono::Datelike;
    match value {
        Value::Text(s) if s.contains('\0') => Some("string contains U+0000"),
        Value::Text(s) if s.chars().count() > MAX_INDEXED_STRING => {
            Some("string longer than 255 characters")
        }
        Value::DateTime(t) if !(MIN_YEAR..=MAX_YEAR).contains(&t.year()) => {
            Some("datetime outside the years 1000-9999")
        }
        Value::Float(f) if !f.is_finite() => Some("float is not finite"),
        _ => None,
    }
}

fn from_json(node: &serde_json::Value, ty: FieldType) -> Extracted {
    use serde_json::Value as J;
    let value = match (ty, node) {
        (FieldType::Uuid, J::String(s)) => uuid::Uuid::parse_str(s).ok().map(Value::Uuid),
        (FieldType::String, J::String(s)) => Some(Value::Text(s.clone())),
        (FieldType::Int, J::Number(n)) if n.is_u64() && n.as_i64().is_none() => {
            return Extracted::Unstorable("integer beyond the signed 64-bit range")
        }
        (FieldType::Int, J::Number(n)) => n.as_i64().map(Value::Int),
        (FieldType::Float, J::Number(n)) => n.as_f64().map(|f| Value::Float(zero_signless(f))),
        (FieldType::Bool, J::Bool(b)) => Some(Value::Bool(*b)),
        (FieldType::DateTime, J::String(s)) => parse_datetime(s).map(Value::DateTime),
        _ => None,
    };
    match value {
        None => Extracted::Missing,
        Some(value) => match unstorable(&value) {
            Some(reason) => Extracted::Unstorable(reason),
            None => Extracted::Value(value),
        },
    }
}

/// `f`, with -0.0 made 0.0: SQL compares them as equal, and an index value
/// is stored, ordered and put in cursors in one form only, so that pages
/// merged in Rust agree with the order of every database (PostgreSQL keeps
/// the sign, MySQL and SQLite drop it).
fn zero_signless(f: f64) -> f64 {
    if f == 0.0 {
        0.0
    } else {
        f
    }
}

/// RFC 3339, converted to UTC and truncated to microseconds.
pub fn parse_datetime(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| truncate_to_micros(t.with_timezone(&Utc)))
}

/// Converts a literal of a query to the type of the field it is compared
/// with, or says why it cannot be.
pub fn literal_value(literal: &Literal, field: &IndexField) -> Result<Value, String> {
    let wrong = |what: &str| {
        format!(
            "field `{}` is {}; {what} cannot be compared with it",
            field.name,
            field.ty.name()
        )
    };
    let value = match (field.ty, literal) {
        (_, Literal::Null) => Value::Null(col_type(field.ty)),
        (FieldType::Uuid, Literal::String(s)) => {
            Value::Uuid(uuid::Uuid::parse_str(s).map_err(|_| format!("`{s}` is not a valid UUID"))?)
        }
        (FieldType::DateTime, Literal::String(s)) => Value::DateTime(
            parse_datetime(s).ok_or_else(|| format!("`{s}` is not an RFC 3339 datetime"))?,
        ),
        (FieldType::String, Literal::String(s)) => Value::Text(s.clone()),
        (FieldType::Int, Literal::Int(i)) => Value::Int(*i),
        (FieldType::Float, Literal::Int(i)) => Value::Float(*i as f64),
        (FieldType::Float, Literal::Float(f)) => Value::Float(zero_signless(*f)),
        (FieldType::Bool, Literal::Bool(b)) => Value::Bool(*b),
        (_, Literal::String(_)) => return Err(wrong("a string")),
        (_, Literal::Int(_)) => return Err(wrong("an integer")),
        (_, Literal::Float(_)) => return Err(wrong("a float")),
        (_, Literal::Bool(_)) => return Err(wrong("a boolean")),
    };
    if let Some(reason) = unstorable(&value) {
        return Err(format!(
            "field `{}` never holds this value ({reason}: such values are indexed as null)",
            field.name
        ));
    }
    Ok(value)
}
