//! Filters evaluated against JSON bodies: the one place a [`Condition`] is tested on a cell.
//!
//! Webhook triggers test each cell's body against their `filter:`, and partial indexes test a
//! row's latest cells against their `where:` predicate ([`Predicate`](crate::Predicate)). Both
//! read a value at a path of a body and compare it with the condition's literals, by the rules
//! of [`Condition::holds_json`], written here once.

use std::cmp::Ordering;

use serde_json::Value;

use crate::field_path::FieldPath;
use crate::filter::{CompareOp, Condition, Filter, Literal};

impl FieldPath {
    /// The value at this path in `body`, if there is one.
    pub fn lookup<'a>(&self, body: &'a Value) -> Option<&'a Value> {
        lookup(body, self.segments().iter().map(String::as_str))
    }
}

/// The value reached by following `segments` through nested objects of `body`.
fn lookup<'a, 's>(
    body: &'a Value,
    segments: impl IntoIterator<Item = &'s str>,
) -> Option<&'a Value> {
    segments
        .into_iter()
        .try_fold(body, |value, segment| value.as_object()?.get(segment))
}

impl Condition {
    /// Whether `value`, the JSON value at the condition's field (`None`: absent), satisfies the
    /// condition:
    ///
    /// - an absent member and JSON `null` both equal `null`;
    /// - strings compare as text (so datetimes compare correctly only when written in one form,
    ///   such as RFC 3339 in UTC), numbers as numbers (an integer literal matches `2` and `2.0`),
    ///   booleans with `false < true`;
    /// - values of different kinds are unequal and never ordered, so `!=` holds between them and
    ///   a range condition does not (`fare > 0` does not hold for a missing fare).
    pub fn holds_json(&self, value: Option<&Value>) -> bool {
        let value = value.unwrap_or(&Value::Null);
        let first = || self.values.first().and_then(|l| compare(value, l));
        match self.op {
            CompareOp::Eq => first() == Some(Ordering::Equal),
            CompareOp::Ne => first() != Some(Ordering::Equal),
            CompareOp::Lt => first() == Some(Ordering::Less),
            CompareOp::Le => matches!(first(), Some(Ordering::Less | Ordering::Equal)),
            CompareOp::Gt => first() == Some(Ordering::Greater),
            CompareOp::Ge => matches!(first(), Some(Ordering::Greater | Ordering::Equal)),
            CompareOp::In => self
                .values
                .iter()
                .any(|l| compare(value, l) == Some(Ordering::Equal)),
        }
    }
}

impl Filter {
    /// Whether `body` satisfies every condition, reading each condition's field as a path into
    /// the body (`fare.total` is member `total` of member `fare`).
    ///
    /// ```
    /// let filter = index_dsl::parse_filter(r#"status = "completed" and fare.total > 0"#)?;
    /// assert!(filter.matches_json(&serde_json::json!({"status": "completed", "fare": {"total": 12.5}})));
    /// assert!(!filter.matches_json(&serde_json::json!({"status": "completed"})));
    /// # Ok::<(), index_dsl::FilterError>(())
    /// ```
    pub fn matches_json(&self, body: &Value) -> bool {
        // The grammar's `path` is identifiers joined by `.` without whitespace, so splitting the
        // field as written gives exactly its segments.
        self.conditions
            .iter()
            .all(|c| c.holds_json(lookup(body, c.field.split('.'))))
    }
}

/// How a JSON value orders against a literal, if they are of one kind.
fn compare(value: &Value, literal: &Literal) -> Option<Ordering> {
    match (value, literal) {
        (Value::Null, Literal::Null) => Some(Ordering::Equal),
        (Value::String(s), Literal::String(l)) => Some(s.as_str().cmp(l.as_str())),
        (Value::Bool(b), Literal::Bool(l)) => Some(b.cmp(l)),
        (Value::Number(n), Literal::Int(l)) => match n.as_i64() {
            Some(i) => Some(i.cmp(l)),
            None => n.as_f64()?.partial_cmp(&(*l as f64)),
        },
        (Value::Number(n), Literal::Float(l)) => n.as_f64()?.partial_cmp(l),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::parse_filter;

    #[test]
    fn filters_read_paths_of_the_body() {
        let filter = parse_filter(r#"status = "completed" and fare.total > 0"#).unwrap();
        assert!(filter.matches_json(&json!({"status": "completed", "fare": {"total": 12.5}})));
        assert!(!filter.matches_json(&json!({"status": "completed", "fare": {"total": 0}})));
        assert!(!filter.matches_json(&json!({"status": "completed"})));
        assert!(!filter.matches_json(&json!({"status": "open", "fare": {"total": 3}})));
        assert!(!filter.matches_json(&json!({"status": "completed", "fare": 3})));

        let filter = parse_filter(r#"city in ("a", "b") and note = null and n != 3"#).unwrap();
        assert!(filter.matches_json(&json!({"city": "b", "n": 4})));
        assert!(filter.matches_json(&json!({"city": "b", "note": null, "n": "3"})));
        assert!(!filter.matches_json(&json!({"city": "c"})));
        assert!(!filter.matches_json(&json!({"city": "a", "note": "x"})));
        assert!(!filter.matches_json(&json!({"city": "a", "n": 3})));
        assert!(!filter.matches_json(&json!({"city": "a", "n": 3.0})));
    }

    #[test]
    fn numbers_compare_across_integer_and_float() {
        let filter = parse_filter("n >= 2 and x < 1.5 and big > 9223372036854775807").unwrap();
        assert!(filter.matches_json(&json!({"n": 2.0, "x": 1, "big": 18446744073709551615u64})));
        assert!(!filter.matches_json(&json!({"n": 1.9, "x": 1, "big": 18446744073709551615u64})));
        assert!(!filter.matches_json(&json!({"n": 2, "x": 1.5, "big": 18446744073709551615u64})));
        let flag = parse_filter("ok = true and b > false").unwrap();
        assert!(flag.matches_json(&json!({"ok": true, "b": true})));
        assert!(!flag.matches_json(&json!({"ok": "true", "b": true})));
    }
}
