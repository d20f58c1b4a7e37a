//! Filter expressions: the `where` clause of index queries.
//!
//! A filter is an AND of conditions, each comparing one index field (named by its index name or
//! by its dotted path) with literals:
//!
//! ```text
//! city_uuid = "7d0b2b1e-4c3a-4a8e-9b59-1a2b3c4d5e6f" and fare_total < 30.5
//! status in ("completed", "canceled")
//! ```
//!
//! This module only parses; whether a field exists and whether a literal fits its type is the
//! business of whoever holds the [`Index`](crate::Index). Keeping the AST free of index knowledge
//! lets the gateway report "unknown field" against the index it resolved, with the column kept
//! here in [`Condition::column`].

use std::fmt;
use std::str::FromStr;

use pest::iterators::Pair;
use pest::Parser;

use crate::filter_error::FilterError;
use crate::grammar::{filter_error, ExprParser, Rule};

/// A parsed filter: all conditions must hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Filter {
    /// The conditions, in source order.
    pub conditions: Vec<Condition>,
}

/// One `field op value` or `field in (values...)` condition.
#[derive(Debug, Clone, PartialEq)]
pub struct Condition {
    /// The field as written: an index field name or a dotted path.
    pub field: String,
    /// The comparison.
    pub op: CompareOp,
    /// The right-hand side: exactly one literal, except for [`CompareOp::In`] (one or more).
    pub values: Vec<Literal>,
    /// 1-based character column of the field in the source line, for error messages.
    pub column: usize,
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareOp {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `in (...)`
    In,
}

impl CompareOp {
    /// The operator as written in a filter.
    pub fn symbol(self) -> &'static str {
        match self {
            CompareOp::Eq => "=",
            CompareOp::Ne => "!=",
            CompareOp::Lt => "<",
            CompareOp::Le => "<=",
            CompareOp::Gt => ">",
            CompareOp::Ge => ">=",
            CompareOp::In => "in",
        }
    }

    /// Whether the operator needs an ordered type (`<`, `<=`, `>`, `>=`).
    pub fn is_range(self) -> bool {
        matches!(
            self,
            CompareOp::Lt | CompareOp::Le | CompareOp::Gt | CompareOp::Ge
        )
    }
}

impl fmt::Display for CompareOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

/// A literal on the right-hand side of a condition.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    /// A double-quoted string, escapes resolved.
    String(String),
    /// An integer that fits in an `i64`.
    Int(i64),
    /// A finite float (written with `.` and/or an exponent).
    Float(f64),
    /// `true` or `false`.
    Bool(bool),
    /// `null`.
    Null,
}

impl fmt::Display for Literal {
    /// Writes the literal so that [`parse_filter`] reads it back unchanged.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Literal::String(s) => {
                f.write_str("\"")?;
                for c in s.chars() {
                    match c {
                        '"' => f.write_str("\\\"")?,
                        '\\' => f.write_str("\\\\")?,
                        '\n' => f.write_str("\\n")?,
                        '\t' => f.write_str("\\t")?,
                        '\r' => f.write_str("\\r")?,
                        c if c.is_control() => write!(f, "\\u{:04x}", c as u32)?,
                        c => write!(f, "{c}")?,
                    }
                }
                f.write_str("\"")
            }
            Literal::Int(i) => write!(f, "{i}"),
            // `{:?}` always keeps a `.` or an exponent (`1.0`, `1e300`), so a float stays a float.
            Literal::Float(x) => write!(f, "{x:?}"),
            Literal::Bool(b) => write!(f, "{b}"),
            Literal::Null => f.write_str("null"),
        }
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} ", self.field, self.op)?;
        if self.op == CompareOp::In {
            f.write_str("(")?;
            for (i, v) in self.values.iter().enumerate() {
                if i > 0 {
                    f.write_str(", ")?;
                }
                write!(f, "{v}")?;
            }
            f.write_str(")")
        } else {
            match self.values.first() {
                Some(v) => write!(f, "{v}"),
                None => f.write_str("null"),
            }
        }
    }
}

impl fmt::Display for Filter {
    /// Writes the filter in canonical form (`a = 1 and b in ("x", "y")`); it parses back to an
    /// equal [`Filter`] up to [`Condition::column`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.conditions.iter().enumerate() {
            if i > 0 {
                f.write_str(" and ")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl FromStr for Filter {
    type Err = FilterError;

    fn from_str(src: &str) -> Result<Filter, FilterError> {
        parse_filter(src)
    }
}

/// Parses a filter expression: `cond (and cond)*`.
pub fn parse_filter(src: &str) -> Result<Filter, FilterError> {
    let input = ExprParser::parse(Rule::filter_input, src)
        .map_err(|e| filter_error(src, e))?
        .next()
        .ok_or_else(|| FilterError::at(src, 0, "expected condition"))?;
    let conditions = input
        .into_inner()
        .filter(|p| p.as_rule() == Rule::condition)
        .map(|p| condition(src, p))
        .collect::<Result<_, _>>()?;
    Ok(Filter { conditions })
}

fn condition(src: &str, pair: Pair<'_, Rule>) -> Result<Condition, FilterError> {
    let column = pair.as_span().start_pos().line_col().1;
    let mut field = String::new();
    let mut op = CompareOp::Eq;
    let mut values = Vec::new();
    for part in pair.into_inner() {
        match part.as_rule() {
            Rule::path => field = part.as_str().to_owned(),
            Rule::comparison => {
                for inner in part.into_inner() {
                    match inner.as_rule() {
                        Rule::cmp_op => op = compare_op(inner.as_str()),
                        Rule::value => values.push(literal(src, inner)?),
                        _ => {}
                    }
                }
            }
            Rule::in_list => {
                op = CompareOp::In;
                for inner in part.into_inner() {
                    if inner.as_rule() == Rule::value {
                        values.push(literal(src, inner)?);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(Condition {
        field,
        op,
        values,
        column,
    })
}

fn compare_op(text: &str) -> CompareOp {
    match text {
        "!=" => CompareOp::Ne,
        "<" => CompareOp::Lt,
        "<=" => CompareOp::Le,
        ">" => CompareOp::Gt,
        ">=" => CompareOp::Ge,
        _ => CompareOp::Eq,
    }
}

/// Converts a `value` pair; the grammar guarantees its shape, the numbers may still overflow.
fn literal(src: &str, value: Pair<'_, Rule>) -> Result<Literal, FilterError> {
    let start = value.as_span().start();
    let Some(pair) = value.into_inner().next() else {
        return Err(FilterError::at(src, start, "expected value"));
    };
    let text = pair.as_str();
    match pair.as_rule() {
        Rule::int => text.parse().map(Literal::Int).map_err(|_| {
            FilterError::at(
                src,
                start,
                format!("integer `{text}` does not fit in 64 bits (write it as a string or float)"),
            )
        }),
        Rule::float => match text.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(Literal::Float(x)),
            _ => Err(FilterError::at(
                src,
                start,
                format!("float `{text}` is out of range (expected a finite 64-bit float)"),
            )),
        },
        Rule::boolean => Ok(Literal::Bool(text == "true")),
        Rule::null => Ok(Literal::Null),
        Rule::string => string(src, pair).map(Literal::String),
        _ => Err(FilterError::at(src, start, "expected value")),
    }
}

fn string(src: &str, pair: Pair<'_, Rule>) -> Result<String, FilterError> {
    let mut out = String::new();
    for part in pair.into_inner() {
        let text = part.as_str();
        if part.as_rule() == Rule::string_chars {
            out.push_str(text);
            continue;
        }
        match text {
            "\\\"" => out.push('"'),
            "\\\\" => out.push('\\'),
            "\\/" => out.push('/'),
            "\\n" => out.push('\n'),
            "\\t" => out.push('\t'),
            "\\r" => out.push('\r'),
            _ => {
                let c = u32::from_str_radix(text.get(2..).unwrap_or_default(), 16)
                    .ok()
                    .and_then(char::from_u32)
                    .ok_or_else(|| {
                        FilterError::at(
                            src,
                            part.as_span().start(),
                            format!(
                                "`{text}` is not a unicode scalar value (surrogates are not allowed)"
                            ),
                        )
                    })?;
                out.push(c);
            }
        }
    }
    Ok(out)
}
