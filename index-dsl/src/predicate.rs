//! [`Predicate`]: the `where:` of a partial index, deciding which rows have an entry.
//!
//! A predicate is written in the filter syntax (`status = "completed" and fare.total > 0`) and
//! tested on a row's latest cells each time the row's entry is computed; a row that does not
//! satisfy it has no entry, so a row whose new version stops matching leaves the index.
//!
//! Each condition reads one value of one of the index's own columns, so every cell that can
//! change the outcome is one the index already follows. The name before the operator resolves,
//! in this order, to
//!
//! 1. a field of the index, by name or by path as in query filters (`status`, `fare_total`,
//!    `fare.total`): its column and path, and its type, which the literals must fit;
//! 2. in an index reading one column, a path into that column's body (`rider.rating`);
//! 3. in an index reading several columns, `<COLUMN>.<path>`: a path into the body of the named
//!    column of the index (`STATUS.reason`).
//!
//! Values are compared as they are in the JSON body, by the rules of
//! [`Condition::holds_json`], the same as webhook trigger filters.

use std::fmt;

use serde_json::Value;

use crate::field_path::FieldPath;
use crate::filter::Filter;

/// A validated `where:` predicate of an index.
#[derive(Debug, Clone, PartialEq)]
pub struct Predicate {
    /// The predicate as written in the definition.
    pub text: String,
    /// The parsed filter; each condition's field as written.
    pub filter: Filter,
    /// Where each condition of `filter` reads its value, in the same order.
    pub sources: Vec<PredicateSource>,
}

/// The value one condition of a [`Predicate`] reads.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PredicateSource {
    /// The column of the index whose latest cell is read.
    pub column: String,
    /// The path into that cell's body.
    pub path: FieldPath,
}

impl Predicate {
    /// Whether a row satisfies the predicate, given the body of its latest cell in each column
    /// (`None` for a column the row has no cell in: every value of it is absent).
    pub fn matches<'a>(&self, body_of: impl Fn(&str) -> Option<&'a Value>) -> bool {
        self.filter
            .conditions
            .iter()
            .zip(&self.sources)
            .all(|(condition, source)| {
                condition.holds_json(body_of(&source.column).and_then(|b| source.path.lookup(b)))
            })
    }

    /// The top-level body members the predicate reads, with their columns; a reader that decodes
    /// only some members of a body must decode these.
    pub fn members(&self) -> impl Iterator<Item = (&str, &str)> {
        self.sources
            .iter()
            .filter_map(|s| Some((s.column.as_str(), s.path.segments().first()?.as_str())))
    }

    /// The predicate with every name resolved to `COLUMN.path`, in canonical spacing:
    /// `BASE.fare.total > 0 and STATUS.status = "completed"`. Two predicates that select the same
    /// rows by the same conditions have the same qualified form, whatever names and spacing they
    /// were written with, so it is what a stored index version records.
    pub fn qualified(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for Predicate {
    /// Writes [`Predicate::qualified`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (condition, source)) in self.filter.conditions.iter().zip(&self.sources).enumerate()
        {
            if i > 0 {
                f.write_str(" and ")?;
            }
            let mut resolved = condition.clone();
            resolved.field = format!("{}.{}", source.column, source.path);
            write!(f, "{resolved}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;
    use crate::{parse_filter, parse_path};

    fn predicate(text: &str, sources: &[(&str, &str)]) -> Predicate {
        Predicate {
            text: text.to_owned(),
            filter: parse_filter(text).unwrap(),
            sources: sources
                .iter()
                .map(|(column, path)| PredicateSource {
                    column: (*column).to_owned(),
                    path: parse_path(path).unwrap(),
                })
                .collect(),
        }
    }

    #[test]
    fn conditions_read_their_own_columns() {
        let p = predicate(
            r#"status = "completed"   and fare_total > 0"#,
            &[("STATUS", "status"), ("BASE", "fare.total")],
        );
        let row = |status: &str| {
            HashMap::from([
                ("BASE", json!({"fare": {"total": 3}})),
                ("STATUS", json!({ "status": status })),
            ])
        };
        let done = row("completed");
        assert!(p.matches(|c| done.get(c)));
        let open = row("open");
        assert!(!p.matches(|c| open.get(c)));
        // No BASE cell: the fare is absent, and `> 0` does not hold.
        assert!(!p.matches(|c| done.get(c).filter(|_| c == "STATUS")));
        assert_eq!(
            p.qualified(),
            r#"STATUS.status = "completed" and BASE.fare.total > 0"#
        );
        assert_eq!(
            p.members().collect::<Vec<_>>(),
            vec![("STATUS", "status"), ("BASE", "fare")]
        );
    }
}
