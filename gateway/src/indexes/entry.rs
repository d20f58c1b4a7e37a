//! Index entries: typed field values taken from cell bodies.
//!
//! A field is a path into the JSON body; its value is converted to the
//! field's declared type. A missing value or one of the wrong type is
//! stored as NULL (the body has no schema, so this is not an error); a NULL
//! shard field means the row has no entry in that index.

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

/// The value of `field` in `body`, typed, or a typed NULL.
pub fn extract(body: &serde_json::Value, field: &IndexField) -> Value {
    let mut node = body;
    for segment in field.path.segments() {
        match node.get(segment.as_str()) {
            Some(child) => node = child,
            None => return Value::Null(col_type(field.ty)),
        }
    }
    from_json(node, field.ty).unwrap_or(Value::Null(col_type(field.ty)))
}

fn from_json(node: &serde_json::Value, ty: FieldType) -> Option<Value> {
    use serde_json::Value as J;
    match (ty, node) {
        (FieldType::Uuid, J::String(s)) => uuid::Uuid::parse_str(s).ok().map(Value::Uuid),
        (FieldType::String, J::String(s)) if s.chars().count() <= MAX_INDEXED_STRING => {
            Some(Value::Text(s.clone()))
        }
        (FieldType::Int, J::Number(n)) => n.as_i64().map(Value::Int),
        (FieldType::Float, J::Number(n)) => n.as_f64().map(Value::Float),
        (FieldType::Bool, J::Bool(b)) => Some(Value::Bool(*b)),
        (FieldType::DateTime, J::String(s)) => parse_datetime(s).map(Value::DateTime),
        _ => None,
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
    Ok(match (field.ty, literal) {
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
        (FieldType::Float, Literal::Float(f)) => Value::Float(*f),
        (FieldType::Bool, Literal::Bool(b)) => Value::Bool(*b),
        (_, Literal::String(_)) => return Err(wrong("a string")),
        (_, Literal::Int(_)) => return Err(wrong("an integer")),
        (_, Literal::Float(_)) => return Err(wrong("a float")),
        (_, Literal::Bool(_)) => return Err(wrong("a boolean")),
    })
}
