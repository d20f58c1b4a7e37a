//! [`Trigger`]: a webhook that receives the cells of chosen columns of a datastore.
//!
//! A trigger comes from `datastores/<datastore>/triggers/<name>.yaml` (SPEC §7). The gateway
//! runs one log consumer per trigger and posts batches of cells to its URL. Header values are
//! [`Template`]s so that secrets stay out of git: `${NAME}` is replaced by the environment
//! variable `NAME` when the gateway starts, and a missing variable stops the start.

use std::fmt;

use crate::filter::Filter;

/// A validated webhook trigger.
#[derive(Debug, Clone, PartialEq)]
pub struct Trigger {
    /// The trigger name, unique per datastore; letters, digits and `_`, at most 48 characters.
    pub name: String,
    /// The datastore followed.
    pub datastore: String,
    /// The columns whose cells are delivered, as declared.
    pub columns: Vec<String>,
    /// Only cells whose body matches are posted; field names are paths into the body.
    pub filter: Option<Filter>,
    /// The filter as written.
    pub filter_text: Option<String>,
    /// Where cells are posted.
    pub webhook: Webhook,
    /// Most cells per POST.
    pub batch_size: u32,
    /// Failed attempts after which a cell is quarantined.
    pub max_attempts: u32,
}

/// The HTTP side of a trigger.
#[derive(Debug, Clone, PartialEq)]
pub struct Webhook {
    /// An `http://` or `https://` URL.
    pub url: String,
    /// Extra request headers, sorted by name.
    pub headers: Vec<(String, Template)>,
    /// The environment variable holding the signing secret, if requests are signed.
    pub secret_env: Option<String>,
    /// Request timeout in milliseconds.
    pub timeout_ms: u64,
    /// A PEM file of extra trusted certificate authorities, resolved against the trigger
    /// file's directory.
    pub ca_file: Option<std::path::PathBuf>,
}

/// A header value with `${NAME}` references to environment variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(pub Vec<TemplatePart>);

/// A piece of a [`Template`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplatePart {
    /// Text taken as written.
    Text(String),
    /// The value of an environment variable.
    Env(String),
}

impl Template {
    /// Parses `text`; a `$` not followed by `{` is plain text. On error, the character offset
    /// of the problem and a message.
    pub fn parse(text: &str) -> Result<Template, (usize, String)> {
        let mut parts = Vec::new();
        let mut rest = text;
        let mut offset = 0;
        while let Some(start) = rest.find("${") {
            if start > 0 {
                parts.push(TemplatePart::Text(rest[..start].to_owned()));
            }
            let at = offset + rest[..start].chars().count();
            let after = &rest[start + 2..];
            let Some(end) = after.find('}') else {
                return Err((at, "unterminated `${` (expected `${NAME}`)".to_owned()));
            };
            let name = &after[..end];
            if !is_env_name(name) {
                return Err((
                    at,
                    format!(
                        "invalid environment variable name `{}` (expected letters, digits and `_`, not starting with a digit)",
                        name.escape_debug()
                    ),
                ));
            }
            parts.push(TemplatePart::Env(name.to_owned()));
            offset = at + 3 + name.chars().count();
            rest = &after[end + 1..];
        }
        if !rest.is_empty() {
            parts.push(TemplatePart::Text(rest.to_owned()));
        }
        Ok(Template(parts))
    }

    /// The value with every variable replaced through `lookup`; the name of the first variable
    /// `lookup` does not know is the error.
    pub fn render(&self, lookup: impl Fn(&str) -> Option<String>) -> Result<String, String> {
        let mut out = String::new();
        for part in &self.0 {
            match part {
                TemplatePart::Text(text) => out.push_str(text),
                TemplatePart::Env(name) => out.push_str(&lookup(name).ok_or_else(|| name.clone())?),
            }
        }
        Ok(out)
    }
}

impl fmt::Display for Template {
    /// Writes the template as it is written in YAML.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for part in &self.0 {
            match part {
                TemplatePart::Text(text) => f.write_str(text)?,
                TemplatePart::Env(name) => write!(f, "${{{name}}}")?,
            }
        }
        Ok(())
    }
}

/// Whether `name` is a portable environment variable name.
pub fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_name_environment_variables() {
        let t = Template::parse("Bearer ${TOKEN}; $x").unwrap();
        assert_eq!(
            t.0,
            vec![
                TemplatePart::Text("Bearer ".into()),
                TemplatePart::Env("TOKEN".into()),
                TemplatePart::Text("; $x".into())
            ]
        );
        assert_eq!(t.to_string(), "Bearer ${TOKEN}; $x");
        assert_eq!(
            t.render(|n| (n == "TOKEN").then(|| "s3".to_owned())),
            Ok("Bearer s3; $x".to_owned())
        );
        assert_eq!(t.render(|_| None), Err("TOKEN".to_owned()));
        assert_eq!(Template::parse("a ${B").unwrap_err().0, 2);
        assert_eq!(Template::parse("${1X}").unwrap_err().0, 0);
    }
}
