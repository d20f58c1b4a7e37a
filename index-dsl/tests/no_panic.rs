//! Property tests: no input makes the parsers or the loader panic, and filters round-trip
//! through their `Display`.

use index_dsl::{
    load_files, parse_filter, parse_path, parse_type, CompareOp, Condition, Filter, Literal,
};
use proptest::prelude::*;

const DATASTORE: &str = "name: trips\ncolumns:\n  - name: BASE\n  - name: STATUS\n";

/// Text built from the pieces filters and YAML are made of, so random inputs get deep into the
/// grammars instead of failing at the first character.
fn tokens() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("a".to_owned()),
        Just("fare.total".to_owned()),
        Just(" ".to_owned()),
        Just("\n".to_owned()),
        Just("and".to_owned()),
        Just("in".to_owned()),
        Just("(".to_owned()),
        Just(")".to_owned()),
        Just(",".to_owned()),
        Just("\"".to_owned()),
        Just("\\".to_owned()),
        Just("\\u".to_owned()),
        Just("=".to_owned()),
        Just("!=".to_owned()),
        Just("<=".to_owned()),
        Just(">".to_owned()),
        Just("-".to_owned()),
        Just("1".to_owned()),
        Just("99999999999999999999".to_owned()),
        Just(".5e".to_owned()),
        Just("true".to_owned()),
        Just("null".to_owned()),
        Just("é".to_owned()),
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(token, 0..24).prop_map(|v| v.concat())
}

fn yamlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("table: x\n".to_owned()),
        Just("table: ".to_owned()),
        Just("datastore: trips\n".to_owned()),
        Just("shard_field: ".to_owned()),
        Just("column_defs:\n".to_owned()),
        Just("  - column_key: BASE\n".to_owned()),
        Just("    fields:\n".to_owned()),
        Just("      - { field: a.b, type: UUID }\n".to_owned()),
        Just("      - { field: ".to_owned()),
        Just("name: ".to_owned()),
        Just("type: bool".to_owned()),
        Just("- ".to_owned()),
        Just("{".to_owned()),
        Just("}".to_owned()),
        Just("[".to_owned()),
        Just("]".to_owned()),
        Just(": ".to_owned()),
        Just("&a ".to_owned()),
        Just("*a ".to_owned()),
        Just("<<: ".to_owned()),
        Just("\"".to_owned()),
        Just("'".to_owned()),
        Just("\n".to_owned()),
        Just("  ".to_owned()),
        Just("\t".to_owned()),
        Just("#".to_owned()),
        Just("é".to_owned()),
        "[a-z_.]{1,8}".prop_map(|s| s),
        any::<char>().prop_map(String::from),
    ];
    prop::collection::vec(token, 0..40).prop_map(|v| v.concat())
}

fn load_index(text: String) {
    let _ = load_files(
        std::path::Path::new("datastores"),
        [
            ("trips/datastore.yaml".to_owned(), DATASTORE.to_owned()),
            ("trips/indexes/x.yaml".to_owned(), text),
        ],
    )
    .map_err(|d| d.to_string());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn parsers_never_panic(src in any::<String>()) {
        let _ = parse_filter(&src).map_err(|e| e.to_string());
        let _ = parse_path(&src).map_err(|e| e.to_string());
        let _ = parse_type(&src).map_err(|e| e.to_string());
    }

    #[test]
    fn token_soup_never_panics(src in tokens()) {
        let _ = parse_filter(&src).map_err(|e| e.to_string());
        let _ = parse_path(&src).map_err(|e| e.to_string());
    }

    #[test]
    fn parsed_filters_round_trip(src in tokens()) {
        if let Ok(filter) = parse_filter(&src) {
            let printed = filter.to_string();
            let reparsed: Filter = printed.parse().unwrap_or_else(|e| panic!("{printed}: {e}"));
            let strip = |f: &Filter| f.conditions.iter().map(|c| (c.field.clone(), c.op, c.values.clone())).collect::<Vec<_>>();
            prop_assert_eq!(strip(&filter), strip(&reparsed));
        }
    }

    #[test]
    fn loader_never_panics_on_random_text(text in any::<String>()) {
        load_index(text);
    }

    #[test]
    fn loader_never_panics_on_yamlish_text(text in yamlish()) {
        load_index(text);
    }
}

fn literal() -> impl Strategy<Value = Literal> {
    prop_oneof![
        any::<String>().prop_map(Literal::String),
        any::<i64>().prop_map(Literal::Int),
        any::<f64>()
            .prop_filter("finite", |x| x.is_finite())
            .prop_map(Literal::Float),
        any::<bool>().prop_map(Literal::Bool),
        Just(Literal::Null),
    ]
}

fn condition() -> impl Strategy<Value = (String, CompareOp, Vec<Literal>)> {
    let field = "[a-zA-Z_][a-zA-Z0-9_]{0,6}(\\.[a-zA-Z_][a-zA-Z0-9_]{0,6}){0,2}";
    let op = prop_oneof![
        Just(CompareOp::Eq),
        Just(CompareOp::Ne),
        Just(CompareOp::Lt),
        Just(CompareOp::Le),
        Just(CompareOp::Gt),
        Just(CompareOp::Ge),
        Just(CompareOp::In),
    ];
    (field, op, prop::collection::vec(literal(), 1..4)).prop_map(|(f, op, mut values)| {
        if op != CompareOp::In {
            values.truncate(1);
        }
        (f, op, values)
    })
}

proptest! {
    #[test]
    fn generated_filters_round_trip(conds in prop::collection::vec(condition(), 1..5)) {
        let filter = Filter {
            conditions: conds
                .into_iter()
                .map(|(field, op, values)| Condition { field, op, values, column: 0 })
                .collect(),
        };
        let printed = filter.to_string();
        let parsed = parse_filter(&printed).unwrap_or_else(|e| panic!("{printed}\n{e}"));
        prop_assert_eq!(parsed.conditions.len(), filter.conditions.len());
        for (a, b) in parsed.conditions.iter().zip(&filter.conditions) {
            prop_assert_eq!((&a.field, a.op, &a.values), (&b.field, b.op, &b.values));
        }
    }
}

// Deeply nested YAML must be refused with a diagnostic, not overflow the stack.
#[test]
fn deep_nesting_is_an_error_not_a_crash() {
    for text in [
        "[".repeat(100_000),
        "{a: ".repeat(50_000),
        "- ".repeat(50_000),
    ] {
        let result = load_files(
            std::path::Path::new("datastores"),
            [("trips/indexes/x.yaml".to_owned(), text)],
        );
        assert!(result.is_err());
    }
    assert!(parse_filter(&"(".repeat(100_000)).is_err());
}
