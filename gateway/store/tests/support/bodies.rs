//! Adversarial cell bodies for property tests: highly compressible runs,
//! deep nesting, long strings, arbitrary unicode (NUL included) in keys and
//! values, big arrays. Shared by the codec's unit tests and the storage
//! contract suite, so every backend sees the same shapes.

use proptest::prelude::*;
use serde_json::{json, Map, Value};

/// A character that is awkward somewhere: NUL, ASCII, a multi-byte
/// sequence, an astral-plane emoji, a combining mark, a quote.
fn awkward_char() -> impl Strategy<Value = char> {
    prop_oneof![
        Just('\0'),
        Just('a'),
        Just('€'),
        Just('😀'),
        Just('\u{301}'),
        Just('"'),
        Just('\\'),
        any::<char>(),
    ]
}

/// One run of a character: compresses extremely well.
fn run() -> impl Strategy<Value = String> {
    (awkward_char(), 0usize..100_000).prop_map(|(c, n)| std::iter::repeat_n(c, n).collect())
}

/// Arbitrary unicode text, including NUL.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(awkward_char(), 0..max).prop_map(|cs| cs.into_iter().collect())
}

/// An object nested `depth` levels deep, through objects or arrays.
fn nested() -> impl Strategy<Value = Value> {
    (1usize..120, any::<bool>(), text(8)).prop_map(|(depth, arrays, key)| {
        let mut value = json!({ "leaf": key });
        for i in 0..depth {
            value = if arrays && i % 2 == 0 {
                json!([value])
            } else {
                json!({ key.clone(): value })
            };
        }
        json!({ "n": value })
    })
}

fn scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |f| f.is_finite())
            .prop_map(Value::from),
        text(40).prop_map(Value::from),
    ]
}

/// A JSON object body of one adversarial kind.
pub fn adversarial_body() -> impl Strategy<Value = Value> {
    prop_oneof![
        run().prop_map(|s| json!({ "s": s })),
        (text(12), run()).prop_map(|(k, s)| json!({ k: s })),
        nested(),
        text(20_000).prop_map(|s| json!({ "long": s })),
        (scalar(), 0usize..20_000).prop_map(|(v, n)| json!({ "many": vec![v; n] })),
        prop::collection::btree_map(text(16), scalar(), 0..64)
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
    ]
}
