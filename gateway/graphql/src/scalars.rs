//! The custom scalars: `UUID`, `DateTime` (RFC 3339), `JSON`, and `Int64`
//! (accepts an integer or a decimal string, returns a decimal string so it
//! stays exact in JavaScript), with the conversions resolvers use.

use async_graphql::dynamic::{Scalar, ValueAccessor};
use async_graphql::{Name, Value};
use chrono::{DateTime, SecondsFormat, Utc};
use uuid::Uuid;

use super::errors::bad_input;
use cellgate_store::storage::Value as SqlValue;

pub const UUID: &str = "UUID";
pub const DATETIME: &str = "DateTime";
pub const JSON: &str = "JSON";
pub const INT64: &str = "Int64";

pub fn scalars() -> Vec<Scalar> {
    vec![
        Scalar::new(UUID)
            .description("A UUID in its canonical text form, e.g. `7d0b2b1e-4c3a-4a8e-9b59-1a2b3c4d5e6f`.")
            .specified_by_url("https://www.rfc-editor.org/rfc/rfc4122")
            .validator(|v| valid_input(UUID, v)),
        Scalar::new(DATETIME)
            .description("An RFC 3339 date and time, e.g. `2024-01-01T00:00:00Z`; returned in UTC.")
            .specified_by_url("https://www.rfc-editor.org/rfc/rfc3339")
            .validator(|v| valid_input(DATETIME, v)),
        Scalar::new(JSON).description("Any JSON value."),
        Scalar::new(INT64)
            .description("A signed 64-bit integer. Accepts a number or a decimal string; returned as a decimal string so JavaScript keeps it exact.")
            .validator(|v| valid_input(INT64, v)),
    ]
}

/// Whether `value` is a valid input of the custom scalar `name` (false for
/// any other name).
pub fn valid_input(name: &str, value: &Value) -> bool {
    match name {
        UUID => matches!(value, Value::String(s) if Uuid::parse_str(s).is_ok()),
        DATETIME => matches!(value, Value::String(s) if parse_datetime(s).is_some()),
        INT64 => int64_of(value).is_some(),
        JSON => true,
        _ => false,
    }
}

fn parse_datetime(s: &str) -> Option<DateTime<Utc>> {
    cellgate_store::indexes::entry::parse_datetime(s)
}

pub(crate) fn int64_of(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Reads an `Int64` argument.
pub fn int64(arg: &ValueAccessor<'_>, name: &str) -> async_graphql::Result<i64> {
    int64_of(arg.as_value()).ok_or_else(|| {
        bad_input(format!(
            "`{name}` must be a 64-bit integer or a decimal string"
        ))
    })
}

/// Reads a `UUID` argument.
pub fn uuid(arg: &ValueAccessor<'_>, name: &str) -> async_graphql::Result<Uuid> {
    match arg.as_value() {
        Value::String(s) => Uuid::parse_str(s)
            .map_err(|_| bad_input(format!("`{name}`: `{s}` is not a valid UUID"))),
        _ => Err(bad_input(format!("`{name}` must be a UUID string"))),
    }
}

/// Reads a `DateTime` argument.
pub fn datetime(arg: &ValueAccessor<'_>, name: &str) -> async_graphql::Result<DateTime<Utc>> {
    match arg.as_value() {
        Value::String(s) => parse_datetime(s)
            .ok_or_else(|| bad_input(format!("`{name}`: `{s}` is not an RFC 3339 datetime"))),
        _ => Err(bad_input(format!(
            "`{name}` must be an RFC 3339 datetime string"
        ))),
    }
}

pub fn int64_value(v: i64) -> Value {
    Value::String(v.to_string())
}

pub fn datetime_value(t: DateTime<Utc>) -> Value {
    Value::String(datetime_text(t))
}

fn datetime_text(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::AutoSi, true)
}

/// A GraphQL input value (a cell body) as JSON, converted node by node
/// from a borrowed tree, as `ConstValue::into_json` would convert a copy:
/// enum names become strings, binary values lists of bytes.
pub fn json_from_value(value: &Value) -> serde_json::Value {
    match value {
        Value::Null => serde_json::Value::Null,
        Value::Boolean(b) => serde_json::Value::Bool(*b),
        Value::Number(n) => serde_json::Value::Number(n.clone()),
        Value::String(s) => serde_json::Value::String(s.clone()),
        Value::Enum(name) => serde_json::Value::String(name.to_string()),
        Value::Binary(bytes) => {
            serde_json::Value::Array(bytes.iter().map(|b| serde_json::Value::from(*b)).collect())
        }
        Value::List(items) => serde_json::Value::Array(items.iter().map(json_from_value).collect()),
        Value::Object(map) => serde_json::Value::Object(
            map.iter()
                .map(|(k, v)| (k.to_string(), json_from_value(v)))
                .collect(),
        ),
    }
}

/// A JSON value (a cell body) as a GraphQL value, converted node by node
/// from a borrowed tree: no copy of the tree first, no serde round trip.
/// Bodies nest at most `codec::MAX_BODY_DEPTH` levels, so the recursion is
/// bounded.
pub fn json_value(json: &serde_json::Value) -> Value {
    match json {
        serde_json::Value::Null => Value::Null,
        serde_json::Value::Bool(b) => Value::Boolean(*b),
        serde_json::Value::Number(n) => Value::Number(n.clone()),
        serde_json::Value::String(s) => Value::String(s.clone()),
        serde_json::Value::Array(items) => Value::List(items.iter().map(json_value).collect()),
        serde_json::Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (async_graphql::Name::new(k), json_value(v)))
                .collect(),
        ),
    }
}

/// A typed storage value as the GraphQL value of its index field.
pub fn sql_value(value: &SqlValue) -> Value {
    match value {
        SqlValue::Null(_) => Value::Null,
        SqlValue::Bool(b) => Value::Boolean(*b),
        SqlValue::Int(i) => int64_value(*i),
        SqlValue::Float(f) => Value::from(*f),
        SqlValue::Text(s) => Value::String(s.clone()),
        SqlValue::Bytes(b) => Value::String(base64_encode(b)),
        SqlValue::Uuid(u) => Value::String(u.to_string()),
        SqlValue::DateTime(t) => datetime_value(*t),
        SqlValue::Array(_, values) => Value::List(values.iter().map(sql_value).collect()),
    }
}

/// Writes the JSON of [`sql_value`]`(value)`, byte for byte as serde_json
/// writes that value, without building it: the compiled reads write every
/// index field of a page this way.
pub fn write_sql_json(out: &mut Vec<u8>, value: &SqlValue) {
    use std::io::Write as _;
    // Writing to a `Vec` cannot fail.
    let _ = match value {
        SqlValue::Null(_) => out.write_all(b"null"),
        SqlValue::Bool(b) => out.write_all(if *b { b"true" } else { b"false" }),
        // Int64 is a string; its digits need no escape.
        SqlValue::Int(i) => write!(out, "\"{i}\""),
        // serde_json writes a non-finite float as null, as `sql_value`
        // makes it.
        SqlValue::Float(f) => serde_json::to_writer(&mut *out, f).map_err(Into::into),
        SqlValue::Text(s) => serde_json::to_writer(&mut *out, s).map_err(Into::into),
        SqlValue::Uuid(u) => write!(out, "\"{}\"", u.hyphenated()),
        // RFC 3339 needs no escape either.
        SqlValue::DateTime(t) => write!(out, "\"{}\"", datetime_text(*t)),
        SqlValue::Bytes(_) | SqlValue::Array(..) => {
            serde_json::to_writer(&mut *out, &sql_value(value)).map_err(Into::into)
        }
    };
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// `Name` helper for building object values.
pub fn name(s: &str) -> Name {
    Name::new(s)
}

#[cfg(test)]
mod conversion_tests {
    use super::*;

    #[test]
    fn bodies_convert_as_into_json_does() {
        let json = serde_json::json!({
            "s": "€\u{0}", "n": -122.36647480579401, "i": 9007199254740993u64, "b": true,
            "z": null, "l": [1, [2, {"x": []}]], "o": {}
        });
        let value = Value::from_json(json.clone()).unwrap();
        assert_eq!(json_from_value(&value), value.clone().into_json().unwrap());
        assert_eq!(json_from_value(&value), json);
        assert_eq!(json_value(&json), value);
        let other = Value::List(vec![
            Value::Enum(async_graphql::Name::new("OPEN")),
            Value::Binary(vec![1u8, 2].into()),
        ]);
        assert_eq!(json_from_value(&other), other.clone().into_json().unwrap());
    }

    #[test]
    fn sql_values_are_written_as_their_graphql_values_serialize() {
        use cellgate_store::storage::ColType;
        let t = |s: &str| DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc);
        let values = [
            SqlValue::Null(ColType::Float),
            SqlValue::Bool(true),
            SqlValue::Bool(false),
            SqlValue::Int(0),
            SqlValue::Int(i64::MIN),
            SqlValue::Int(i64::MAX),
            SqlValue::Float(-0.0),
            SqlValue::Float(1e300),
            SqlValue::Float(10.0 + 1.0 / 3.0),
            SqlValue::Float(f64::NAN),
            SqlValue::Float(f64::NEG_INFINITY),
            SqlValue::Text(String::new()),
            SqlValue::Text("quote \" backslash \\ nul \u{0} \u{1f} ünïcode \u{1F697}".into()),
            SqlValue::Uuid(Uuid::new_v4()),
            SqlValue::DateTime(t("2024-05-01T08:00:00+02:00")),
            SqlValue::DateTime(t("2024-05-01T08:00:00.007+00:00")),
            SqlValue::DateTime(t("1970-01-01T00:00:00.123456Z")),
            SqlValue::Bytes(vec![0, 1, 254, 255]),
            SqlValue::Array(ColType::Int, vec![SqlValue::Int(1), SqlValue::Int(-2)]),
        ];
        for value in values {
            let mut written = Vec::new();
            write_sql_json(&mut written, &value);
            let serialized = serde_json::to_vec(&sql_value(&value)).unwrap();
            assert_eq!(
                String::from_utf8(written).unwrap(),
                String::from_utf8(serialized).unwrap(),
                "{value:?}"
            );
        }
    }
}
