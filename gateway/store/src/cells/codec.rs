//! Cell body encoding: one format byte, then the JSON object as
//! MessagePack, compressed with zlib.
//!
//! The format byte lets the encoding evolve: a reader dispatches on it and a
//! new format gets a new byte. Decoding is bounded so a corrupt or hostile
//! body cannot inflate without limit.
//!
//! Each thread keeps one zlib compressor and decompressor and resets them
//! between bodies: setting up zlib's state costs more than compressing a
//! cell-sized body, so allocating it per call would double the codec cost.

use std::cell::RefCell;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

/// MessagePack (rmp-serde) compressed with zlib (flate2).
pub const FORMAT_MSGPACK_ZLIB: u8 = 1;

/// Largest body accepted, measured as its MessagePack encoding. Stored
/// bytes are at most a few bytes more (zlib never grows data by more than
/// 5 bytes per 16 KiB block), which keeps one body well inside the 16 MiB
/// packet that MySQL and MariaDB accept by default.
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Deepest nesting of objects and arrays in a body: what a JSON parser
/// with serde_json's default recursion limit accepts. Checked before any
/// recursive step, so a hostile body cannot overflow the stack.
pub const MAX_BODY_DEPTH: usize = 128;

/// Encodes a body; fails when it is not a JSON object, too large or too
/// deeply nested, or when it would not decode back to itself.
pub fn encode(body: &serde_json::Value) -> Result<Vec<u8>, String> {
    if !body.is_object() {
        return Err("a cell body must be a JSON object".to_string());
    }
    if depth_exceeds(body, MAX_BODY_DEPTH) {
        return Err(format!(
            "body nests objects and arrays more than {MAX_BODY_DEPTH} levels deep"
        ));
    }
    let packed = rmp_serde::to_vec(body).map_err(|e| format!("cannot encode body: {e}"))?;
    if packed.len() > MAX_BODY_BYTES {
        return Err(format!(
            "body is {} bytes encoded, more than the limit of {MAX_BODY_BYTES}",
            packed.len()
        ));
    }
    let mut out = Vec::with_capacity(packed.len() / 2 + 64);
    out.push(FORMAT_MSGPACK_ZLIB);
    COMPRESS.with(|compress| {
        let mut compress = compress.borrow_mut();
        compress.reset();
        loop {
            if out.capacity() - out.len() < 64 {
                out.reserve(out.capacity().max(256));
            }
            let consumed = compress.total_in() as usize;
            let status = compress
                .compress_vec(&packed[consumed..], &mut out, FlushCompress::Finish)
                .map_err(|e| format!("cannot compress body: {e}"))?;
            if status == Status::StreamEnd {
                break;
            }
        }
        Ok::<(), String>(())
    })?;
    // Never acknowledge a body that would not read back: inflate what is
    // about to be stored and compare it, byte for byte, with the
    // MessagePack it was made of. (MessagePack itself round-trips every
    // JSON value, which the property tests below hold it to; comparing
    // bytes instead of decoded trees keeps this check cheap.)
    match inflate(&out[1..]) {
        Ok(inflated) if inflated == packed => Ok(out),
        Ok(_) => Err("body does not survive encoding unchanged".to_string()),
        Err(reason) => Err(format!("body cannot be stored readably: {reason}")),
    }
}

/// Whether `value` nests deeper than `limit` levels, found without
/// recursion.
fn depth_exceeds(value: &serde_json::Value, limit: usize) -> bool {
    // Only containers are pushed: scalars cannot nest.
    let is_container = |v: &serde_json::Value| v.is_object() || v.is_array();
    let mut stack = vec![(value, 1usize)];
    while let Some((value, depth)) = stack.pop() {
        if depth > limit {
            return true;
        }
        match value {
            serde_json::Value::Object(map) => stack.extend(
                map.values()
                    .filter(|child| is_container(child))
                    .map(|child| (child, depth + 1)),
            ),
            serde_json::Value::Array(items) => stack.extend(
                items
                    .iter()
                    .filter(|child| is_container(child))
                    .map(|child| (child, depth + 1)),
            ),
            _ => {}
        }
    }
    false
}

thread_local! {
    // The fastest level: on cell-sized bodies it compresses within a few
    // percent of the default level at a fraction of the CPU.
    static COMPRESS: RefCell<Compress> = RefCell::new(Compress::new(Compression::fast(), true));
    static DECOMPRESS: RefCell<Decompress> = RefCell::new(Decompress::new(true));
}

/// Inflates a zlib stream, refusing to grow beyond [`MAX_BODY_BYTES`].
///
/// The stream is fed with `FlushDecompress::None` and the output grown
/// whenever it fills: with `Finish`, zlib treats an output buffer too small
/// for the whole stream as an error, which made every body that compresses
/// more than the initial guess unreadable.
fn inflate(input: &[u8]) -> Result<Vec<u8>, String> {
    DECOMPRESS.with(|decompress| {
        let mut decompress = decompress.borrow_mut();
        decompress.reset(true);
        let mut out = Vec::with_capacity((input.len() * 4).clamp(256, MAX_BODY_BYTES + 1));
        loop {
            if out.len() > MAX_BODY_BYTES {
                return Err("body inflates beyond the size limit".to_string());
            }
            if out.capacity() == out.len() {
                let grow = out.capacity().min(MAX_BODY_BYTES + 1 - out.len()).max(256);
                out.reserve(grow);
            }
            let consumed = decompress.total_in() as usize;
            let before = (consumed, out.len());
            let status = decompress
                .decompress_vec(&input[consumed..], &mut out, FlushDecompress::None)
                .map_err(|e| format!("zlib: {e}"))?;
            if status == Status::StreamEnd {
                if (decompress.total_in() as usize) < input.len() {
                    return Err("zlib: trailing bytes after the stream".to_string());
                }
                return Ok(out);
            }
            // No progress with room left in the output: the input ran out
            // before the end of the stream.
            let progressed = (decompress.total_in() as usize, out.len()) != before;
            if !progressed && out.capacity() > out.len() {
                return Err("zlib: truncated stream".to_string());
            }
        }
    })
}

/// Decodes a stored body. The error says what is wrong, never panics.
pub fn decode(bytes: &[u8]) -> Result<serde_json::Value, String> {
    let (&format, rest) = bytes.split_first().ok_or("empty body")?;
    match format {
        FORMAT_MSGPACK_ZLIB => {
            let packed = inflate(rest)?;
            rmp_serde::from_slice(&packed).map_err(|e| format!("msgpack: {e}"))
        }
        other => Err(format!("unknown body format byte {other}")),
    }
}

/// A stored body as JSON text, transcoded from its MessagePack without
/// building a JSON value first. The text is what `decode` then
/// `serde_json::to_vec` would give: bodies are stored from JSON values,
/// whose objects hold their members in key order.
pub fn decode_json(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let (&format, rest) = bytes.split_first().ok_or("empty body")?;
    match format {
        FORMAT_MSGPACK_ZLIB => {
            let packed = inflate(rest)?;
            let mut out = Vec::with_capacity(packed.len() + packed.len() / 4);
            let mut deserializer = rmp_serde::Deserializer::from_read_ref(&packed);
            let mut serializer = serde_json::Serializer::new(&mut out);
            serde_transcode::transcode(&mut deserializer, &mut serializer)
                .map_err(|e| format!("msgpack: {e}"))?;
            Ok(out)
        }
        other => Err(format!("unknown body format byte {other}")),
    }
}

/// Decodes only the top-level members named in `keys` of a stored body
/// (an object holding those of them it has). The other members are
/// skipped without being built, though still checked to be well-formed,
/// so a body that `decode` refuses is refused here too. Index maintenance
/// reads a few fields of each body and spent most of its time building the
/// rest.
pub fn decode_members(
    bytes: &[u8],
    keys: &std::collections::BTreeSet<String>,
) -> Result<serde_json::Value, String> {
    let (&format, rest) = bytes.split_first().ok_or("empty body")?;
    match format {
        FORMAT_MSGPACK_ZLIB => {
            let packed = inflate(rest)?;
            let mut deserializer = rmp_serde::Deserializer::from_read_ref(&packed);
            let members = serde::Deserializer::deserialize_any(&mut deserializer, Members { keys })
                .map_err(|e| format!("msgpack: {e}"))?;
            Ok(serde_json::Value::Object(members))
        }
        other => Err(format!("unknown body format byte {other}")),
    }
}

/// The serde visitor of [`decode_members`].
struct Members<'k> {
    keys: &'k std::collections::BTreeSet<String>,
}

impl<'de> serde::de::Visitor<'de> for Members<'_> {
    type Value = serde_json::Map<String, serde_json::Value>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a body object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut members = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if self.keys.contains(&key) {
                members.insert(key, map.next_value::<serde_json::Value>()?);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Arbitrary JSON objects, the shapes a client may send.
    fn json() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<u64>().prop_map(serde_json::Value::from),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(serde_json::Value::from),
            ".{0,40}".prop_map(serde_json::Value::from),
        ];
        let value = leaf.prop_recursive(4, 64, 8, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..8).prop_map(serde_json::Value::from),
                prop::collection::btree_map(".{0,12}", inner, 0..8)
                    .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        });
        prop::collection::btree_map("[a-z_]{1,12}", value, 0..10)
            .prop_map(|m| serde_json::Value::Object(m.into_iter().collect()))
    }

    #[test]
    fn decoding_members_keeps_only_the_named_ones() {
        let body = serde_json::json!({
            "a": 1, "b": {"c": [1, 2, {"d": "€"}]}, "route": "x".repeat(300), "z": null
        });
        let bytes = encode(&body).unwrap();
        let keys = ["b", "z", "missing"]
            .map(String::from)
            .into_iter()
            .collect();
        assert_eq!(
            decode_members(&bytes, &keys).unwrap(),
            serde_json::json!({"b": {"c": [1, 2, {"d": "€"}]}, "z": null})
        );
        // A body that does not decode is refused here too.
        let mut corrupt = bytes.clone();
        corrupt.truncate(bytes.len() - 3);
        assert!(decode_members(&corrupt, &keys).is_err());
    }

    proptest! {
        #[test]
        fn round_trip(body in json()) {
            let bytes = encode(&body).unwrap();
            prop_assert_eq!(bytes[0], FORMAT_MSGPACK_ZLIB);
            prop_assert_eq!(&decode(&bytes).unwrap(), &body);
            // Every member decoded alone equals the same member decoded
            // with the rest of the body.
            let all = body.as_object().unwrap();
            for (i, key) in all.keys().enumerate() {
                let keys = all.keys().skip(i).step_by(2).cloned().collect();
                let members = decode_members(&bytes, &keys).unwrap();
                let expected: serde_json::Map<_, _> = all
                    .iter()
                    .filter(|(k, _)| keys.contains(*k))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                prop_assert_eq!(members, serde_json::Value::Object(expected), "{}", key);
            }
        }

        // Regression: bodies compressing more than ~4x were stored but
        // every read failed with "deflate decompression error".
        #[test]
        fn adversarial_bodies_round_trip(body in crate::cells::testing::adversarial_body()) {
            let bytes = encode(&body).unwrap();
            prop_assert_eq!(decode(&bytes).unwrap(), body);
        }

        // The JSON text read without a value is the value's text, byte for
        // byte: direct GraphQL answers rely on it.
        #[test]
        fn json_text_is_the_values_text(body in json()) {
            let bytes = encode(&body).unwrap();
            let text = decode_json(&bytes).unwrap();
            prop_assert_eq!(
                String::from_utf8(text).unwrap(),
                serde_json::to_string(&decode(&bytes).unwrap()).unwrap()
            );
        }

        #[test]
        fn adversarial_json_text_is_the_values_text(
            body in crate::cells::testing::adversarial_body()
        ) {
            let bytes = encode(&body).unwrap();
            let text = decode_json(&bytes).unwrap();
            prop_assert_eq!(text, serde_json::to_vec(&body).unwrap());
        }

        #[test]
        fn garbage_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&bytes);
            let _ = decode_json(&bytes);
        }
    }

    // Regression: `{"s": "a" × 256}` and `{"s": "€" × 85}` came back
    // CORRUPT_BODY. These are the exact bytes the encoder stored before the
    // fix; they are valid zlib and must read back.
    #[test]
    fn cells_stored_before_the_inflate_fix_read_back() {
        let stored = [
            (
                "017801e5c0810000000c02b01f35860842492b9a409accfc615c012f0a6371",
                serde_json::json!({"s": "a".repeat(256)}),
            ),
            (
                "017801e5c2311100000802c0d026d026ee1462a50804e1eef787d6a1590032edb2be",
                serde_json::json!({"s": "€".repeat(85)}),
            ),
        ];
        for (hex, body) in stored {
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            assert_eq!(decode(&bytes).unwrap(), body);
            // The bytes the encoder makes may differ between versions (the
            // zlib implementation changed since); a cell sent again is still
            // a duplicate, since the write path compares decoded bodies when
            // the bytes differ.
            assert_eq!(decode(&encode(&body).unwrap()).unwrap(), body);
        }
    }

    #[test]
    fn the_size_limit_is_exact_and_limit_sized_bodies_read_back() {
        // A map with one key `s` and a string: 1 (map) + 2 (key) + 5 (str32
        // header) bytes around the string.
        let at_limit = serde_json::json!({"s": "x".repeat(MAX_BODY_BYTES - 8)});
        assert_eq!(rmp_serde::to_vec(&at_limit).unwrap().len(), MAX_BODY_BYTES);
        let bytes = encode(&at_limit).unwrap();
        assert_eq!(decode(&bytes).unwrap(), at_limit);
        let over = serde_json::json!({"s": "x".repeat(MAX_BODY_BYTES - 7)});
        assert!(encode(&over).unwrap_err().contains("more than the limit"));
    }

    #[test]
    fn incompressible_limit_sized_bodies_read_back() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let text: String = (0..MAX_BODY_BYTES - 8)
            .map(|_| char::from(rng.gen_range(b'!'..=b'~')))
            .collect();
        let body = serde_json::json!({ "s": text });
        let bytes = encode(&body).unwrap();
        assert!(bytes.len() < MAX_BODY_BYTES + 4096);
        assert_eq!(decode(&bytes).unwrap(), body);
    }

    #[test]
    fn rejects_non_objects_and_unknown_formats() {
        assert!(encode(&serde_json::json!([1, 2])).is_err());
        assert_eq!(decode(&[]).unwrap_err(), "empty body");
        assert_eq!(
            decode(&[9, 1, 2]).unwrap_err(),
            "unknown body format byte 9"
        );
        let mut bytes = encode(&serde_json::json!({"a": 1})).unwrap();
        bytes.truncate(4);
        assert!(decode(&bytes).unwrap_err().starts_with("zlib"));
    }

    #[test]
    fn trailing_bytes_and_bombs_are_refused() {
        let mut bytes = encode(&serde_json::json!({"a": 1})).unwrap();
        bytes.push(0);
        assert!(decode(&bytes).unwrap_err().contains("trailing"));
        // 64 MiB of zeros deflates to ~64 KiB: a bomb past the limit.
        let mut bomb = vec![FORMAT_MSGPACK_ZLIB];
        let mut compress = Compress::new(Compression::best(), true);
        let zeros = vec![0u8; 64 * 1024 * 1024];
        let mut out = Vec::with_capacity(1 << 20);
        compress
            .compress_vec(&zeros, &mut out, FlushCompress::Finish)
            .unwrap();
        bomb.extend_from_slice(&out);
        assert!(decode(&bomb).unwrap_err().contains("size limit"));
    }

    #[test]
    fn nesting_is_limited_without_recursion() {
        let nest = |levels: usize| {
            let mut body = serde_json::json!({});
            for i in 1..levels - 1 {
                body = if i % 2 == 0 {
                    serde_json::json!({ "n": body })
                } else {
                    serde_json::json!([body])
                };
            }
            serde_json::json!({ "n": body })
        };
        let deepest = nest(MAX_BODY_DEPTH);
        assert_eq!(decode(&encode(&deepest).unwrap()).unwrap(), deepest);
        let err = encode(&nest(MAX_BODY_DEPTH + 1)).unwrap_err();
        assert!(err.contains("more than 128 levels"), "{err}");
        // Far deeper than any stack would survive in a recursive check.
        let mut body = serde_json::json!({"leaf": true});
        for _ in 0..200_000 {
            // Not `json!`, which would copy the value recursively.
            body = serde_json::Value::Object([("n".to_string(), body)].into_iter().collect());
        }
        assert!(encode(&body).unwrap_err().contains("levels deep"));
        // Dropping the value would recurse 200,000 deep.
        std::mem::forget(body);
    }
}
