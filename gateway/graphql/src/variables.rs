//! A request's variables, each kept as its JSON text until it is needed.
//!
//! A write's variables hold every cell body: turning them into
//! async-graphql values (an index map and a shared name per object member)
//! and then into the JSON values the store encodes took about a quarter of
//! the gateway's CPU on a 50-cell write. The variables object is therefore
//! split only into its members here, which checks that it is well-formed
//! JSON; the compiled write (`direct/put.rs`) reads its cells straight
//! from its variable's text, and everything else asks for async-graphql's
//! values, parsed from the same texts.

use std::collections::BTreeMap;

use async_graphql::{Name, Variables};
use serde_json::value::RawValue;

/// The variables of one request: member name → JSON text.
#[derive(Debug, Default)]
pub struct RequestVariables {
    texts: BTreeMap<Name, Box<RawValue>>,
}

impl RequestVariables {
    /// Splits a JSON object into its members; `null` is no variables.
    /// Fails on anything but well-formed JSON holding an object or `null`
    /// (as with a JSON object, a name given twice keeps its last value).
    pub fn from_json(text: &str) -> serde_json::Result<RequestVariables> {
        let texts: Option<BTreeMap<Name, Box<RawValue>>> = serde_json::from_str(text)?;
        Ok(RequestVariables {
            texts: texts.unwrap_or_default(),
        })
    }

    /// The names given.
    pub fn names(&self) -> impl Iterator<Item = &Name> {
        self.texts.keys()
    }

    /// The JSON text of one variable.
    pub fn text(&self, name: &str) -> Option<&RawValue> {
        self.texts.get(name).map(Box::as_ref)
    }

    /// The variables as async-graphql values, but for `except` (the one a
    /// compiled write reads from its text). Fails on a value async-graphql
    /// cannot hold, such as one nested deeper than the JSON parser allows.
    pub fn values(&self, except: Option<&Name>) -> serde_json::Result<Variables> {
        let mut values = Variables::default();
        for (name, text) in &self.texts {
            if Some(name) != except {
                values.insert(name.clone(), serde_json::from_str(text.get())?);
            }
        }
        Ok(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_graphql::Value;

    #[test]
    fn values_equal_a_whole_parse_of_the_object() {
        let text =
            r#"{"a": [1, {"b": "c", "d": null}], "e": 1.5, "a": "last", "f": {"g": [true]}}"#;
        let variables = RequestVariables::from_json(text).unwrap();
        let whole: Variables = serde_json::from_str(text).unwrap();
        assert_eq!(variables.values(None).unwrap(), whole);
        assert_eq!(
            variables.names().map(Name::as_str).collect::<Vec<_>>(),
            ["a", "e", "f"]
        );
        assert_eq!(variables.text("a").unwrap().get(), r#""last""#);
    }

    #[test]
    fn the_excepted_variable_is_left_as_text() {
        let variables = RequestVariables::from_json(r#"{"cells": [{"x": 1}], "n": 3}"#).unwrap();
        let values = variables.values(Some(&Name::new("cells"))).unwrap();
        assert_eq!(values.get("n"), Some(&Value::from(3)));
        assert!(values.get("cells").is_none());
        assert_eq!(variables.text("cells").unwrap().get(), r#"[{"x": 1}]"#);
    }

    #[test]
    fn null_is_no_variables_and_other_json_is_refused() {
        assert_eq!(
            RequestVariables::from_json("null").unwrap().names().count(),
            0
        );
        for text in ["[1]", "3", r#""a""#, "{", r#"{"a": }"#] {
            assert!(RequestVariables::from_json(text).is_err(), "{text}");
        }
    }

    #[test]
    fn a_value_too_deep_for_graphql_values_fails_when_asked_for() {
        let deep = format!(r#"{{"v": {}{}}}"#, "[".repeat(200), "]".repeat(200));
        let variables = RequestVariables::from_json(&deep).unwrap();
        assert!(variables.values(None).is_err());
        assert!(serde_json::from_str::<Variables>(&deep).is_err());
    }
}
