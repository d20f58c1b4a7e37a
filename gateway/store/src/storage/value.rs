//! Typed SQL values that cross the `Backend` boundary.
//!
//! Everything above the storage layer speaks `Value`; each backend binds and
//! decodes it in its own native types (a UUID is `UUID` on PostgreSQL,
//! `BINARY(16)` on MySQL and a 16-byte `BLOB` on SQLite). A NULL carries its
//! type because PostgreSQL needs to know the type of every bind parameter.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The SQL type of a column or parameter, as the project uses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ColType {
    Bool,
    Int,
    Float,
    Text,
    Bytes,
    Uuid,
    DateTime,
}

/// One SQL value. Ordering between values of the same variant matches the
/// order the databases use for the column types the project creates (binary
/// collation for text, byte order for UUIDs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Value {
    Null(ColType),
    Bool(bool),
    Int(i64),
    Float(f64),
    Text(String),
    Bytes(Vec<u8>),
    Uuid(Uuid),
    DateTime(DateTime<Utc>),
    /// A PostgreSQL array of values of one type, NULLs included: the one
    /// parameter of an `IN` list or of a column of rows there
    /// ([`Sql::in_list`](super::Sql::in_list), [`Sql::rows`](super::Sql::rows)),
    /// so that a statement's text does not depend on how many values it
    /// carries. Only statements built for PostgreSQL hold one.
    Array(ColType, Vec<Value>),
}

impl Value {
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null(_))
    }

    /// The value's type; an array's is that of its elements.
    pub fn col_type(&self) -> ColType {
        match self {
            Value::Null(t) => *t,
            Value::Bool(_) => ColType::Bool,
            Value::Int(_) => ColType::Int,
            Value::Float(_) => ColType::Float,
            Value::Text(_) => ColType::Text,
            Value::Bytes(_) => ColType::Bytes,
            Value::Uuid(_) => ColType::Uuid,
            Value::DateTime(_) => ColType::DateTime,
            Value::Array(t, _) => *t,
        }
    }

    pub fn as_int(&self) -> Option<i64> {
        match self {
            Value::Int(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_uuid(&self) -> Option<Uuid> {
        match self {
            Value::Uuid(v) => Some(*v),
            _ => None,
        }
    }

    pub fn as_text(&self) -> Option<&str> {
        match self {
            Value::Text(v) => Some(v),
            _ => None,
        }
    }

    pub fn into_bytes(self) -> Option<Vec<u8>> {
        match self {
            Value::Bytes(v) => Some(v),
            _ => None,
        }
    }

    pub fn as_datetime(&self) -> Option<DateTime<Utc>> {
        match self {
            Value::DateTime(v) => Some(*v),
            _ => None,
        }
    }

    /// Total order used to merge results of several shards; NULL sorts first,
    /// as it does in every database's ascending order (PostgreSQL is told to
    /// with `NULLS FIRST`).
    pub fn sort_cmp(&self, other: &Value) -> std::cmp::Ordering {
        use std::cmp::Ordering;
        match (self, other) {
            (Value::Null(_), Value::Null(_)) => Ordering::Equal,
            (Value::Null(_), _) => Ordering::Less,
            (_, Value::Null(_)) => Ordering::Greater,
            (Value::Bool(a), Value::Bool(b)) => a.cmp(b),
            (Value::Int(a), Value::Int(b)) => a.cmp(b),
            // As SQL compares them: -0.0 equals 0.0 (NaN is never stored).
            (Value::Float(a), Value::Float(b)) if a == b => Ordering::Equal,
            (Value::Float(a), Value::Float(b)) => a.total_cmp(b),
            (Value::Text(a), Value::Text(b)) => a.as_bytes().cmp(b.as_bytes()),
            (Value::Bytes(a), Value::Bytes(b)) => a.cmp(b),
            (Value::Uuid(a), Value::Uuid(b)) => a.as_bytes().cmp(b.as_bytes()),
            (Value::DateTime(a), Value::DateTime(b)) => a.cmp(b),
            // Mixed variants never share a column; order them stably anyway.
            (a, b) => (a.col_type() as u8).cmp(&(b.col_type() as u8)),
        }
    }
}

/// Microsecond precision is what every backend stores, so values are
/// truncated to it before they are written or compared.
pub fn truncate_to_micros(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// A UUID stored as 16 bytes (SQLite `BLOB`, MySQL `BINARY(16)`).
pub(crate) fn uuid_from_bytes(bytes: Option<Vec<u8>>) -> Result<Value, sqlx::Error> {
    match bytes {
        None => Ok(Value::Null(ColType::Uuid)),
        Some(bytes) => Uuid::from_slice(&bytes)
            .map(Value::Uuid)
            .map_err(|e| sqlx::Error::Decode(Box::new(e))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cmp::Ordering;

    // Regression: -0.0 sorted before 0.0 in the merge of several shards'
    // pages, where every database compares them as equal.
    #[test]
    fn negative_zero_sorts_equal_to_zero() {
        let cmp = |a: f64, b: f64| Value::Float(a).sort_cmp(&Value::Float(b));
        assert_eq!(cmp(-0.0, 0.0), Ordering::Equal);
        assert_eq!(cmp(0.0, -0.0), Ordering::Equal);
        assert_eq!(cmp(-1.0, -0.0), Ordering::Less);
        assert_eq!(cmp(0.5, 0.0), Ordering::Greater);
    }
}
