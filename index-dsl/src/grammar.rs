//! The pest parser for the expression sub-language (field paths, type names, filters).
//!
//! This module owns the generated parser and the translation of pest errors into
//! [`FilterError`]s. It exists so that every other module sees one error shape with a 1-based
//! line and character column, and so that rule names are renamed in exactly one place: a user
//! should read "expected comparison operator", never pest's internal `cmp_op`.

use pest::error::InputLocation;

use crate::filter_error::FilterError;

/// The parser generated from `grammar.pest`.
#[derive(pest_derive::Parser)]
#[grammar = "grammar.pest"]
pub(crate) struct ExprParser;

/// The human name of a rule, as shown in "expected ..." messages.
fn rule_name(rule: &Rule) -> String {
    let name = match rule {
        Rule::EOI => "end of input",
        Rule::identifier | Rule::path | Rule::path_input => "field name",
        Rule::dot => "`.`",
        Rule::type_name | Rule::type_input => "type name",
        Rule::filter_input | Rule::condition => "condition",
        Rule::comparison | Rule::cmp_op => "comparison operator",
        Rule::in_list | Rule::kw_in => "`in`",
        Rule::kw_and => "`and`",
        Rule::lparen => "`(`",
        Rule::rparen => "`)`",
        Rule::comma => "`,`",
        Rule::value => "value (string, number, true, false or null)",
        Rule::string => "string",
        // Where string characters were expected and failed, only a closing quote or an escape
        // could continue the string.
        Rule::string_chars => "closing `\"`",
        Rule::escape => "escape sequence (\\\" \\\\ \\n \\t \\r \\/ \\uXXXX)",
        Rule::float => "float",
        Rule::int => "integer",
        Rule::boolean => "boolean",
        Rule::null => "null",
        Rule::WHITESPACE => "whitespace",
        Rule::ident_char => "letter, digit or `_`",
        Rule::exponent => "exponent",
    };
    name.to_owned()
}

/// Converts a pest error into a [`FilterError`] pointing into `src`.
pub(crate) fn filter_error(src: &str, err: pest::error::Error<Rule>) -> FilterError {
    let offset = match err.location {
        InputLocation::Pos(pos) => pos,
        InputLocation::Span((start, _)) => start,
    };
    let err = err.renamed_rules(rule_name);
    FilterError::at(src, offset, err.variant.message().into_owned())
}
