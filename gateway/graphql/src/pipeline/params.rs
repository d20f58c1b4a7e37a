//! The parameters of a GraphQL request (`query`, `operationName`,
//! `variables`, `extensions`), read from the JSON object that a POST body,
//! a GET's query string and a socket's `subscribe` payload all carry.

use serde_json::value::RawValue;

use super::Refusal;
use crate::variables::RequestVariables;

/// A request as a transport received it, checked for type. Variables stay
/// JSON text (see `variables.rs`); extensions are parsed.
#[derive(Debug, Default)]
pub struct GraphqlRequest {
    /// The document's text; `None` when the request names a persisted
    /// document instead (`documentId`, an automatic persisted query).
    pub query: Option<String>,
    /// `documentId`: the id of a persisted document (`persisted.rs`).
    pub document_id: Option<String>,
    pub operation_name: Option<String>,
    pub variables: RequestVariables,
    pub extensions: async_graphql::Extensions,
}

/// The members of a request object, each left as JSON text until its
/// type is checked. Other members are ignored.
#[derive(serde::Deserialize)]
struct RawParams<'a> {
    #[serde(borrow, default)]
    query: Option<&'a RawValue>,
    #[serde(rename = "documentId", borrow, default)]
    document_id: Option<&'a RawValue>,
    #[serde(rename = "operationName", borrow, default)]
    operation_name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    variables: Option<&'a RawValue>,
    #[serde(borrow, default)]
    extensions: Option<&'a RawValue>,
}

impl GraphqlRequest {
    /// The request in `bytes`, a JSON object. Refused (`BAD_REQUEST`) when
    /// it is not JSON, not an object (a batch, an array, a string), repeats
    /// a member, or has a member of the wrong type: `query` a string,
    /// `operationName` a string or null, `variables` and `extensions`
    /// objects or null.
    pub fn from_json(bytes: &[u8]) -> Result<GraphqlRequest, Refusal> {
        // serde would also read a struct from a JSON array, so the kind of
        // value is told from its first byte; the parse checks the rest.
        let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
        match serde_json::from_slice::<RawParams>(bytes) {
            Ok(raw) if first == Some(&b'{') => checked(raw),
            _ if first.is_none() => Err(Refusal::bad_request("the request is empty")),
            _ if serde_json::from_slice::<serde::de::IgnoredAny>(bytes).is_err() => {
                Err(Refusal::bad_request("the request is not valid JSON"))
            }
            _ if first == Some(&b'[') => {
                Err(Refusal::bad_request("batched requests are not supported"))
            }
            _ if first == Some(&b'{') => Err(Refusal::bad_request(
                "the request parameters must be an object without repeated members",
            )),
            _ => Err(Refusal::bad_request("the request must be a JSON object")),
        }
    }
}

fn checked(raw: RawParams) -> Result<GraphqlRequest, Refusal> {
    let is_null = |value: Option<&RawValue>| value.is_none_or(|v| v.get() == "null");
    let string = |value: Option<&RawValue>, name: &str| match value {
        v if is_null(v) => Ok(None),
        Some(v) => serde_json::from_str::<String>(v.get())
            .map(Some)
            .map_err(|_| Refusal::bad_request(format!("`{name}` must be a string"))),
        None => Ok(None),
    };
    let query = string(raw.query, "query")?;
    let document_id = string(raw.document_id, "documentId")?;
    // An empty name is no name (some clients send `operationName=`).
    let operation_name = string(raw.operation_name, "operationName")?.filter(|n| !n.is_empty());
    let variables = match raw.variables.map(RawValue::get) {
        None => RequestVariables::default(),
        Some(text) if text == "null" || text.starts_with('{') => {
            RequestVariables::from_json(text).map_err(|_| not_an_object("variables"))?
        }
        Some(_) => return Err(not_an_object("variables")),
    };
    let extensions = match raw.extensions.map(RawValue::get) {
        None | Some("null") => async_graphql::Extensions::default(),
        Some(text) if text.starts_with('{') => {
            serde_json::from_str(text).map_err(|_| not_an_object("extensions"))?
        }
        Some(_) => return Err(not_an_object("extensions")),
    };
    Ok(GraphqlRequest {
        query,
        document_id,
        operation_name,
        variables,
        extensions,
    })
}

pub(super) fn not_an_object(name: &str) -> Refusal {
    Refusal::bad_request(format!("`{name}` must be a JSON object"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> String {
        GraphqlRequest::from_json(text.as_bytes())
            .expect_err(text)
            .message()
            .to_string()
    }

    #[test]
    fn well_typed_parameters_are_read() {
        let request = GraphqlRequest::from_json(
            br#"{"query": "{ a }", "operationName": null, "variables": {"x": [1]}, "extensions": {"e": 1}, "other": 2}"#,
        )
        .unwrap();
        assert_eq!(request.query.as_deref(), Some("{ a }"));
        assert_eq!(request.operation_name, None);
        assert_eq!(request.variables.text("x").unwrap().get(), "[1]");
        assert!(request.extensions.contains_key("e"));
        let named = GraphqlRequest::from_json(br#"{"query": "q", "operationName": "Q"}"#).unwrap();
        assert_eq!(named.operation_name.as_deref(), Some("Q"));
    }

    #[test]
    fn malformed_parameters_are_refused_with_a_reason() {
        assert_eq!(refused("  "), "the request is empty");
        assert_eq!(refused("{"), "the request is not valid JSON");
        assert_eq!(
            refused(r#"[{"query": "{ a }"}]"#),
            "batched requests are not supported"
        );
        assert_eq!(refused(r#""{ a }""#), "the request must be a JSON object");
        assert_eq!(
            refused(r#"{"query": "a", "query": "b"}"#),
            "the request parameters must be an object without repeated members"
        );
        assert_eq!(refused(r#"{"query": 1}"#), "`query` must be a string");
        assert_eq!(
            refused(r#"{"documentId": 1}"#),
            "`documentId` must be a string"
        );
        assert_eq!(
            refused(r#"{"query": "q", "operationName": 1}"#),
            "`operationName` must be a string"
        );
        assert_eq!(
            refused(r#"{"query": "q", "variables": [1]}"#),
            "`variables` must be a JSON object"
        );
        assert_eq!(
            refused(r#"{"query": "q", "extensions": "x"}"#),
            "`extensions` must be a JSON object"
        );
    }
}
