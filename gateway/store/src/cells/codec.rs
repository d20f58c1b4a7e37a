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
use std::collections::BTreeSet;
use std::sync::Arc;

use serde::de::DeserializeSeed;

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
        return Err(too_deep());
    }
    let packed = rmp_serde::to_vec(body).map_err(|e| format!("cannot encode body: {e}"))?;
    pack(packed)
}

/// Compresses a body's MessagePack into the stored bytes, refusing one
/// too large or one that would not read back.
fn pack(packed: Vec<u8>) -> Result<Vec<u8>, String> {
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

/// A body read from JSON text into its MessagePack, not yet compressed
/// ([`PackBody`]); a write stores it (`Store::put_packed_cells_with_token`)
/// exactly as [`encode`] stores the value the text parses to.
#[derive(Debug, Clone)]
pub struct Packed {
    pub(crate) msgpack: Vec<u8>,
    pub(crate) kept: Option<Cut>,
}

/// The top-level members of a body that were asked for, and the names
/// asked for.
pub(crate) type Cut = (serde_json::Value, Arc<BTreeSet<String>>);

impl Packed {
    /// Whether the text was `null`.
    pub fn is_null(&self) -> bool {
        self.msgpack == [0xc0]
    }

    /// The stored bytes, refused as [`encode`] refuses the value.
    pub(crate) fn encode(self) -> Result<(Vec<u8>, Option<Cut>), String> {
        // A map's marker: fixmap, map 16, map 32.
        if !matches!(self.msgpack.first(), Some(0x80..=0x8f | 0xde | 0xdf)) {
            return Err("a cell body must be a JSON object".to_string());
        }
        Ok((pack(self.msgpack)?, self.kept))
    }
}

/// Reads one JSON value of any kind into a [`Packed`] body, without
/// building that value: its MessagePack is written as it is read, objects'
/// members sorted by key and a key given twice keeping its last value, as
/// in the value's map. With `keep`, the top-level members named there are
/// also kept as an object, the only part built as a value (what index
/// maintenance reads of a body this process wrote).
///
/// Building a trip body's value from its text and dropping it again took
/// nearly as long as packing and compressing it (`cargo bench -p
/// cellgate-store --bench store -- codec`: `encode_text/*`).
pub struct PackBody<'k> {
    pub keep: Option<&'k Arc<BTreeSet<String>>>,
}

impl<'de> DeserializeSeed<'de> for PackBody<'_> {
    type Value = Packed;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Packed, D::Error> {
        let mut msgpack = Vec::with_capacity(512);
        let mut kept = self.keep.map(|_| serde_json::Map::new());
        Pack {
            out: &mut msgpack,
            depth: 1,
            keep: self.keep.map(|k| &**k).zip(kept.as_mut()),
        }
        .deserialize(d)?;
        Ok(Packed {
            msgpack,
            kept: kept
                .zip(self.keep)
                .map(|(kept, names)| (serde_json::Value::Object(kept), names.clone())),
        })
    }
}

/// [`encode`] of the value `text` parses to, from the text ([`PackBody`]),
/// with the top-level members named in `keep` when asked.
pub fn encode_text(
    text: &str,
    keep: Option<&Arc<BTreeSet<String>>>,
) -> Result<(Vec<u8>, Option<serde_json::Value>), String> {
    let mut json = serde_json::Deserializer::from_str(text);
    let packed = PackBody { keep }
        .deserialize(&mut json)
        .and_then(|packed| json.end().map(|()| packed))
        .map_err(|e| {
            let reason = e.to_string();
            // serde_json's own recursion limit (128 open containers) is
            // met one level before ours.
            if reason.starts_with(TOO_DEEP) || reason.starts_with("recursion limit exceeded") {
                too_deep()
            } else {
                format!("body is not valid JSON: {reason}")
            }
        })?;
    let (bytes, kept) = packed.encode()?;
    Ok((bytes, kept.map(|(kept, _)| kept)))
}

const TOO_DEEP: &str = "body nests objects and arrays more than";

fn too_deep() -> String {
    format!("{TOO_DEEP} {MAX_BODY_DEPTH} levels deep")
}

/// Writes the MessagePack of the JSON value it reads to `out`.
struct Pack<'o, 'k> {
    out: &'o mut Vec<u8>,
    /// Of the value read: 1 for the body itself.
    depth: usize,
    /// At the top level only: the members to keep, and where.
    keep: Option<(
        &'k BTreeSet<String>,
        &'k mut serde_json::Map<String, serde_json::Value>,
    )>,
}

impl Pack<'_, '_> {
    fn nested(&mut self) -> Pack<'_, '_> {
        Pack {
            out: self.out,
            depth: self.depth + 1,
            keep: None,
        }
    }
}

/// A member name, borrowed from the text when it has no escapes.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = std::borrow::Cow<'de, str>;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Key {
    type Value = std::borrow::Cow<'de, str>;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a member name")
    }

    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Borrowed(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(std::borrow::Cow::Owned(v.to_owned()))
    }
}

/// `rmp`'s writers cannot fail on a `Vec`.
fn written<T, E: std::fmt::Debug>(result: Result<T, E>) -> T {
    result.expect("writing MessagePack to a Vec cannot fail")
}

impl<'de> DeserializeSeed<'de> for Pack<'_, '_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Pack<'_, '_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        written(rmp::encode::write_nil(self.out));
        Ok(())
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        written(rmp::encode::write_bool(self.out, v));
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        written(rmp::encode::write_uint(self.out, v));
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        written(rmp::encode::write_sint(self.out, v));
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        written(rmp::encode::write_f64(self.out, v));
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        written(rmp::encode::write_str(self.out, v));
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(mut self, mut items: A) -> Result<(), A::Error> {
        if self.depth > MAX_BODY_DEPTH {
            return Err(serde::de::Error::custom(too_deep()));
        }
        let start = self.out.len();
        let mut count: u32 = 0;
        while items.next_element_seed(self.nested())?.is_some() {
            count += 1;
        }
        // The length comes first; the items are moved behind it.
        let mut header = Vec::with_capacity(5);
        written(rmp::encode::write_array_len(&mut header, count));
        self.out.splice(start..start, header);
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(mut self, mut members: A) -> Result<(), A::Error> {
        if self.depth > MAX_BODY_DEPTH {
            return Err(serde::de::Error::custom(too_deep()));
        }
        let start = self.out.len();
        // Each member's value is packed in turn; then the members are
        // written again in key order, a repeated key's last value winning.
        let mut entries: Vec<(std::borrow::Cow<'de, str>, std::ops::Range<usize>)> = Vec::new();
        while let Some(key) = members.next_key_seed(Key)? {
            let from = self.out.len();
            match self.keep.as_mut() {
                Some((names, kept)) if names.contains(key.as_ref()) => {
                    let value: serde_json::Value = members.next_value()?;
                    written(rmp_serde::encode::write(self.out, &value));
                    kept.insert(key.to_string(), value);
                }
                _ => members.next_value_seed(self.nested())?,
            }
            entries.push((key, from..self.out.len()));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let last_of_each = |i: &usize| {
            entries
                .get(i + 1)
                .is_none_or(|next| next.0 != entries[*i].0)
        };
        let kept: Vec<usize> = (0..entries.len()).filter(last_of_each).collect();
        let mut map = Vec::with_capacity(self.out.len() - start + 8 * entries.len() + 5);
        written(rmp::encode::write_map_len(&mut map, kept.len() as u32));
        for i in kept {
            let (key, range) = &entries[i];
            written(rmp::encode::write_str(&mut map, key));
            map.extend_from_slice(&self.out[range.clone()]);
        }
        self.out.truncate(start);
        self.out.extend_from_slice(&map);
        Ok(())
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

    /// `value` as JSON text that parses back to it but reads differently:
    /// members in reverse key order, each object's last member given first
    /// with a decoy value that the real one must replace, and, in every
    /// other object, names written as `\u` escapes.
    fn scrambled(value: &serde_json::Value, depth: usize) -> String {
        use serde_json::Value;
        let escaped = |s: &str| {
            s.encode_utf16()
                .map(|unit| format!("\\u{unit:04x}"))
                .collect::<String>()
        };
        match value {
            Value::Array(items) => format!(
                "[ {} ]",
                items
                    .iter()
                    .map(|item| scrambled(item, depth + 1))
                    .collect::<Vec<_>>()
                    .join(" ,")
            ),
            Value::Object(members) => {
                let name = |key: &str| match depth % 2 {
                    0 => serde_json::to_string(key).unwrap(),
                    _ => format!("\"{}\"", escaped(key)),
                };
                let mut parts: Vec<String> = Vec::new();
                if let Some((last, _)) = members.iter().next_back() {
                    parts.push(format!("{}: {{\"decoy\": [1, 2]}}", name(last)));
                }
                parts.extend(
                    members
                        .iter()
                        .rev()
                        .map(|(k, v)| format!("{} :{}", name(k), scrambled(v, depth + 1))),
                );
                format!("{{\n{}}}", parts.join(",\n  "))
            }
            scalar => serde_json::to_string(scalar).unwrap(),
        }
    }

    /// What the write path did before `encode_text`: parse, encode, cut.
    fn through_a_value(
        text: &str,
        keep: &BTreeSet<String>,
    ) -> Result<(Vec<u8>, serde_json::Value), String> {
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let encoded = encode(&value)?;
        let kept = match value {
            serde_json::Value::Object(mut all) => {
                keep.iter().filter_map(|m| all.remove_entry(m)).collect()
            }
            _ => unreachable!("encode refuses non-objects"),
        };
        Ok((encoded, serde_json::Value::Object(kept)))
    }

    fn assert_same_as_through_a_value(text: &str, keep: &Arc<BTreeSet<String>>) {
        let (expected, expected_kept) = through_a_value(text, keep).unwrap();
        let (bytes, kept) = encode_text(text, Some(keep)).unwrap();
        assert_eq!(bytes, expected, "{text}");
        assert_eq!(kept.unwrap(), expected_kept, "{text}");
        assert_eq!(encode_text(text, None).unwrap(), (expected, None));
    }

    #[test]
    fn text_encodes_as_its_value_whatever_its_numbers_and_repeats() {
        let keep: Arc<BTreeSet<String>> = Arc::new(["a", "n", "z"].map(String::from).into());
        for text in [
            r#"{"b": 1, "a": 2}"#,
            r#"{"a": 1, "a": {"x": 1}, "b": [], "a": "last"}"#,
            r#"{"n": [0, -0, 1.0, -1.5e3, 1E2, 18446744073709551615, 18446744073709551616,
                -9223372036854775808, -9223372036854775809, 0.1, 1e-320, 123456789012345678901234567890]}"#,
            r#"{"\u007a": "\ud83d\ude00", "z\u0000": null, "": {"": {"": []}}}"#,
            r#" { "s" : "tab\tnew\nline \"q\" \\ €" , "t": true, "f": false } "#,
            r#"{"nested": {"b": {"d": 1, "c": 2, "d": 3}, "a": [{"y": 1, "x": 2}]}}"#,
            &format!(
                r#"{{"long": "{}", "a": "{}"}}"#,
                "x".repeat(70_000),
                "y".repeat(300)
            ),
            &format!(r#"{{"many": [{}]}}"#, vec!["1"; 70_000].join(",")),
        ] {
            assert_same_as_through_a_value(text, &keep);
        }
    }

    #[test]
    fn text_is_refused_as_its_value_is() {
        for (text, reason) in [
            ("[1, 2]", "a cell body must be a JSON object"),
            ("\"a\"", "a cell body must be a JSON object"),
            ("{\"a\": 1} x", "body is not valid JSON"),
            ("{\"a\": }", "body is not valid JSON"),
        ] {
            let err = encode_text(text, None).unwrap_err();
            assert!(err.starts_with(reason), "{text}: {err}");
        }
        let nested = |levels: usize| {
            format!(
                "{{\"a\": {}1{}}}",
                "[".repeat(levels - 1),
                "]".repeat(levels - 1)
            )
        };
        assert!(encode_text(&nested(100), None).is_ok());
        let err = encode_text(&nested(1000), None).unwrap_err();
        assert_eq!(err, format!("{TOO_DEEP} {MAX_BODY_DEPTH} levels deep"));
        let over = format!(r#"{{"s": "{}"}}"#, "x".repeat(MAX_BODY_BYTES - 7));
        assert!(encode_text(&over, None)
            .unwrap_err()
            .contains("more than the limit"));
        let at_limit = format!(r#"{{"s": "{}"}}"#, "x".repeat(MAX_BODY_BYTES - 8));
        assert!(encode_text(&at_limit, None).is_ok());
    }

    proptest! {
        // The direct write path encodes bodies from their text: the bytes
        // stored, and so duplicate detection, must be what the value gives.
        #[test]
        fn text_encodes_as_its_value(body in json(), keep_every in 1usize..4) {
            let keep: Arc<BTreeSet<String>> =
                Arc::new(body.as_object().unwrap().keys().step_by(keep_every).cloned().collect());
            for text in [serde_json::to_string(&body).unwrap(), scrambled(&body, 0)] {
                let (expected, expected_kept) = through_a_value(&text, &keep).unwrap();
                let (bytes, kept) = encode_text(&text, Some(&keep)).unwrap();
                prop_assert_eq!(&bytes, &expected);
                prop_assert_eq!(kept.unwrap(), expected_kept);
            }
        }

        #[test]
        fn adversarial_text_encodes_as_its_value(
            body in crate::cells::testing::adversarial_body()
        ) {
            let keep = BTreeSet::new();
            for text in [serde_json::to_string(&body).unwrap(), scrambled(&body, 1)] {
                let (expected, _) = through_a_value(&text, &keep).unwrap();
                prop_assert_eq!(encode_text(&text, None).unwrap().0, expected);
            }
        }

        #[test]
        fn garbage_text_never_panics(text in ".{0,200}") {
            let _ = encode_text(&text, None);
            let _ = encode_text(&format!("{{{text}"), None);
        }
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
