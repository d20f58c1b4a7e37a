//! Scopes: what a token may do, per datastore.
//!
//! A scope is `<datastore>:<access>`, with `*` for every datastore, e.g.
//! `trips:read`, `payments:write`, `*:admin`. Access levels are ordered:
//! `admin` includes `write`, which includes `read`, as a datastore owner
//! who may retry the quarantine may also write and read. Datastore names are
//! compared exactly (they are identifiers checked by `index-dsl`).

use std::fmt;
use std::str::FromStr;

/// How much a scope allows on its datastores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Access {
    /// Queries: rows, cells, history, index queries, the cell log.
    Read,
    /// Mutations that write cells (`<ds>PutCells`).
    Write,
    /// Maintenance: `indexStatus`, `maintenance`, `quarantine`,
    /// `<ds>RetryQuarantine`.
    Admin,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
            Access::Admin => "admin",
        }
    }
}

/// One `<datastore>:<access>` grant.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    /// `None` for `*`, every datastore.
    pub datastore: Option<String>,
    pub access: Access,
}

impl Scope {
    /// Whether this scope allows `access` on `datastore`.
    pub fn allows(&self, datastore: &str, access: Access) -> bool {
        self.access >= access && self.datastore.as_deref().is_none_or(|d| d == datastore)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let datastore = self.datastore.as_deref().unwrap_or("*");
        write!(f, "{datastore}:{}", self.access.as_str())
    }
}

impl FromStr for Scope {
    type Err = String;

    fn from_str(text: &str) -> Result<Scope, String> {
        let invalid = || {
            format!("invalid scope `{text}`: expected <datastore>:read|write|admin, or * for every datastore")
        };
        let (datastore, access) = text.trim().split_once(':').ok_or_else(invalid)?;
        let access = match access {
            "read" => Access::Read,
            "write" => Access::Write,
            "admin" => Access::Admin,
            _ => return Err(invalid()),
        };
        let datastore = match datastore {
            "*" => None,
            name if !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
            {
                Some(name.to_string())
            }
            _ => return Err(invalid()),
        };
        Ok(Scope { datastore, access })
    }
}

/// The scopes of one caller.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Scopes(pub Vec<Scope>);

impl Scopes {
    /// Every access on every datastore (authentication turned off).
    pub fn all() -> Scopes {
        Scopes(vec![Scope {
            datastore: None,
            access: Access::Admin,
        }])
    }

    /// Parses a list of scopes; all errors are reported at once.
    pub fn parse<S: AsRef<str>>(texts: &[S]) -> Result<Scopes, String> {
        let mut scopes = Vec::new();
        let mut errors = Vec::new();
        for text in texts {
            match text.as_ref().parse() {
                Ok(scope) => scopes.push(scope),
                Err(error) => errors.push(error),
            }
        }
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        if scopes.is_empty() {
            return Err("a token needs at least one scope".to_string());
        }
        Ok(Scopes(scopes))
    }

    pub fn allows(&self, datastore: &str, access: Access) -> bool {
        self.0.iter().any(|scope| scope.allows(datastore, access))
    }

    /// Whether some scope covers every datastore (`*:…`).
    pub fn covers_every_datastore(&self) -> bool {
        self.0.iter().any(|scope| scope.datastore.is_none())
    }
}

impl fmt::Display for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let texts: Vec<String> = self.0.iter().map(Scope::to_string).collect();
        f.write_str(&texts.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_parse_and_print() {
        let scopes = Scopes::parse(&["trips:read", "*:admin"]).unwrap();
        assert_eq!(scopes.to_string(), "trips:read *:admin");
        for bad in ["trips", "trips:rw", ":read", "tr ips:read", "trips:"] {
            assert!(bad.parse::<Scope>().is_err(), "{bad}");
        }
        assert!(Scopes::parse::<&str>(&[]).is_err());
    }

    #[test]
    fn admin_includes_write_includes_read() {
        let scopes = Scopes::parse(&["trips:write", "payments:read"]).unwrap();
        assert!(scopes.allows("trips", Access::Read));
        assert!(scopes.allows("trips", Access::Write));
        assert!(!scopes.allows("trips", Access::Admin));
        assert!(scopes.allows("payments", Access::Read));
        assert!(!scopes.allows("payments", Access::Write));
        assert!(!scopes.allows("other", Access::Read));
        let all = Scopes::parse(&["*:read"]).unwrap();
        assert!(all.allows("anything", Access::Read));
        assert!(!all.allows("anything", Access::Write));
        assert!(all.covers_every_datastore());
        assert!(Scopes::all().allows("x", Access::Admin));
    }
}
