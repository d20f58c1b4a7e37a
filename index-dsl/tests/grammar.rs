//! Unit tests of the expression grammar: paths, type names, filters and their errors.

use expect_test::expect;
use index_dsl::{parse_filter, parse_path, parse_type, CompareOp, FieldType, Literal};

fn only_value(src: &str) -> Literal {
    let filter = parse_filter(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    assert_eq!(filter.conditions.len(), 1);
    let mut values = filter.conditions.into_iter().next().unwrap().values;
    assert_eq!(values.len(), 1);
    values.pop().unwrap()
}

fn error(src: &str) -> String {
    match parse_filter(src) {
        Ok(f) => panic!("{src} parsed as {f:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn spec_examples_parse() {
    let filter = parse_filter(
        r#"city_uuid = "7d0b2b1e-4c3a-4a8e-9b59-1a2b3c4d5e6f" and trip_created_at >= "2024-01-01T00:00:00Z" and fare_total < 30.5"#,
    )
    .unwrap();
    expect![[r#"
        Filter {
            conditions: [
                Condition {
                    field: "city_uuid",
                    op: Eq,
                    values: [
                        String(
                            "7d0b2b1e-4c3a-4a8e-9b59-1a2b3c4d5e6f",
                        ),
                    ],
                    column: 1,
                },
                Condition {
                    field: "trip_created_at",
                    op: Ge,
                    values: [
                        String(
                            "2024-01-01T00:00:00Z",
                        ),
                    ],
                    column: 56,
                },
                Condition {
                    field: "fare_total",
                    op: Lt,
                    values: [
                        Float(
                            30.5,
                        ),
                    ],
                    column: 102,
                },
            ],
        }
    "#]]
    .assert_debug_eq(&filter);

    let filter = parse_filter(r#"status in ("completed", "canceled")"#).unwrap();
    let cond = &filter.conditions[0];
    assert_eq!(cond.op, CompareOp::In);
    assert_eq!(
        cond.values,
        vec![
            Literal::String("completed".into()),
            Literal::String("canceled".into())
        ]
    );
}

#[test]
fn every_operator() {
    for (text, op) in [
        ("=", CompareOp::Eq),
        ("!=", CompareOp::Ne),
        ("<", CompareOp::Lt),
        ("<=", CompareOp::Le),
        (">", CompareOp::Gt),
        (">=", CompareOp::Ge),
    ] {
        for src in [format!("a {text} 1"), format!("a{text}1")] {
            let f = parse_filter(&src).unwrap_or_else(|e| panic!("{src}: {e}"));
            assert_eq!(f.conditions[0].op, op, "{src}");
            assert_eq!(f.conditions[0].values, vec![Literal::Int(1)]);
        }
    }
}

#[test]
fn in_lists() {
    let f = parse_filter("n in (1, -2, 3.5, true, null, \"x\",)").unwrap();
    assert_eq!(
        f.conditions[0].values,
        vec![
            Literal::Int(1),
            Literal::Int(-2),
            Literal::Float(3.5),
            Literal::Bool(true),
            Literal::Null,
            Literal::String("x".into()),
        ]
    );
    let f = parse_filter("n IN(1)").unwrap();
    assert_eq!(f.conditions[0].values, vec![Literal::Int(1)]);
    expect![[r#"
        expected value (string, number, true, false or null) at 1:7
          n in ()
                ^"#]]
    .assert_eq(&error("n in ()"));
    expect![[r#"
        expected `)` or `,` at 1:9
          n in (1 2)
                  ^"#]]
    .assert_eq(&error("n in (1 2)"));
}

#[test]
fn keywords_are_case_insensitive_with_word_boundaries() {
    let f = parse_filter("a = 1 AND b In (2) aNd c = 3").unwrap();
    assert_eq!(f.conditions.len(), 3);
    assert_eq!(f.conditions[1].op, CompareOp::In);
    // Keywords are not reserved as field names.
    let f = parse_filter("and = 1 and in in (2) and android = 3 and index = 4").unwrap();
    let fields: Vec<&str> = f.conditions.iter().map(|c| c.field.as_str()).collect();
    assert_eq!(fields, ["and", "in", "android", "index"]);
    expect![[r#"
        expected end of input or `and` at 1:7
          a = 1 andb = 2
                ^"#]]
    .assert_eq(&error("a = 1 andb = 2"));
    expect![[r#"
        expected comparison operator or `in` at 1:3
          a inn (1)
            ^"#]]
    .assert_eq(&error("a inn (1)"));
}

#[test]
fn string_escapes() {
    assert_eq!(
        only_value(r#"s = "q\" b\\ n\n t\t r\r s\/ u\u00e9\u0041""#),
        Literal::String("q\" b\\ n\n t\t r\r s/ u\u{e9}A".into())
    );
    assert_eq!(
        only_value("s = \"naïve ☃\""),
        Literal::String("naïve ☃".into())
    );
    expect![[r#"
        expected closing `"` or escape sequence (\" \\ \n \t \r \/ \uXXXX) at 1:7
          s = "a\qb"
                ^"#]]
    .assert_eq(&error(r#"s = "a\qb""#));
    expect![[r#"
        `\ud800` is not a unicode scalar value (surrogates are not allowed) at 1:6
          s = "\ud800"
               ^"#]]
    .assert_eq(&error(r#"s = "\ud800""#));
    expect![[r#"
        expected closing `"` or escape sequence (\" \\ \n \t \r \/ \uXXXX) at 1:9
          s = "abc
                  ^"#]]
    .assert_eq(&error("s = \"abc"));
}

#[test]
fn numbers() {
    assert_eq!(only_value("n = 0"), Literal::Int(0));
    assert_eq!(only_value("n = -42"), Literal::Int(-42));
    assert_eq!(
        only_value("n = 9223372036854775807"),
        Literal::Int(i64::MAX)
    );
    assert_eq!(
        only_value("n = -9223372036854775808"),
        Literal::Int(i64::MIN)
    );
    assert_eq!(only_value("n = 1.5"), Literal::Float(1.5));
    assert_eq!(only_value("n = -0.25"), Literal::Float(-0.25));
    assert_eq!(only_value("n = 1e3"), Literal::Float(1000.0));
    assert_eq!(only_value("n = 2.5E-2"), Literal::Float(0.025));
    assert_eq!(only_value("n = 1e+2"), Literal::Float(100.0));
    assert_eq!(only_value("b = true"), Literal::Bool(true));
    assert_eq!(only_value("b = false"), Literal::Bool(false));
    assert_eq!(only_value("b = null"), Literal::Null);
    expect![[r#"
        integer `9223372036854775808` does not fit in 64 bits (write it as a string or float) at 1:5
          n = 9223372036854775808
              ^"#]]
    .assert_eq(&error("n = 9223372036854775808"));
    expect![[r#"
        float `1e999` is out of range (expected a finite 64-bit float) at 1:5
          n = 1e999
              ^"#]]
    .assert_eq(&error("n = 1e999"));
    expect![[r#"
        expected value (string, number, true, false or null) at 1:5
          n = 1.
              ^"#]]
    .assert_eq(&error("n = 1."));
    expect![[r#"
        expected value (string, number, true, false or null) at 1:5
          n = .5
              ^"#]]
    .assert_eq(&error("n = .5"));
    expect![[r#"
        expected value (string, number, true, false or null) at 1:5
          b = True
              ^"#]]
    .assert_eq(&error("b = True"));
}

#[test]
fn error_positions() {
    expect![[r#"
        expected comparison operator or `in` at 1:11
          city_uuid ~ "x"
                    ^"#]]
    .assert_eq(&error(r#"city_uuid ~ "x""#));
    expect![[r#"
        expected field name at 1:1
          
          ^"#]]
    .assert_eq(&error(""));
    expect![[r#"
        expected field name at 1:11
          a = 1 and 
                    ^"#]]
    .assert_eq(&error("a = 1 and "));
    // Columns count characters, lines count from 1.
    let e = parse_filter("s = 1 and\n  b ~ 2").unwrap_err();
    assert_eq!((e.line, e.column), (2, 5));
    assert_eq!(e.source_line, "  b ~ 2");
    let e = parse_filter("s = \"é\" and b ~ 2").unwrap_err();
    assert_eq!((e.line, e.column), (1, 15));
    let f = parse_filter("é = 1 and ü = 2").unwrap_err();
    assert_eq!(f.column, 1, "identifiers are ASCII: {f}");
}

#[test]
fn condition_columns_and_dotted_fields() {
    let f = parse_filter("  fare.total > 1 and rider.uuid = \"x\"").unwrap();
    assert_eq!(f.conditions[0].field, "fare.total");
    assert_eq!(f.conditions[0].column, 3);
    assert_eq!(f.conditions[1].field, "rider.uuid");
    assert_eq!(f.conditions[1].column, 22);
}

#[test]
fn display_is_canonical() {
    let f = parse_filter("a=1 AND b IN (\"x\\n\",2.0,null) and c != -1e300").unwrap();
    assert_eq!(
        f.to_string(),
        r#"a = 1 and b in ("x\n", 2.0, null) and c != -1e300"#
    );
}

#[test]
fn paths() {
    let p = parse_path("fare.total").unwrap();
    assert_eq!(p.segments(), ["fare", "total"]);
    assert_eq!(p.to_string(), "fare.total");
    assert_eq!(p.default_name(), "fare_total");
    assert!(p.is_nested());
    assert!(!parse_path("_x9").unwrap().is_nested());
    for bad in ["", ".a", "a.", "a..b", "1a", "a b", " a", "a-b", "é"] {
        assert!(parse_path(bad).is_err(), "{bad:?}");
    }
    let e = parse_path("fare..total").unwrap_err();
    assert_eq!((e.column, e.message.as_str()), (6, "expected field name"));
}

#[test]
fn types() {
    for (src, ty) in [
        ("UUID", FieldType::Uuid),
        ("uuid", FieldType::Uuid),
        ("String", FieldType::String),
        ("int", FieldType::Int),
        ("FLOAT", FieldType::Float),
        ("bool", FieldType::Bool),
        ("Datetime", FieldType::DateTime),
        ("dateTime", FieldType::DateTime),
    ] {
        assert_eq!(parse_type(src).unwrap(), ty, "{src}");
    }
    for ty in FieldType::ALL {
        assert_eq!(parse_type(ty.name()).unwrap(), ty);
        assert_eq!(ty.is_ordered(), ty != FieldType::Bool);
    }
    for bad in ["", "ints", "integer", " int", "date time", "uuid4"] {
        let e = parse_type(bad).unwrap_err();
        assert!(e.message.starts_with("unknown type"), "{bad:?}: {e}");
    }
}
