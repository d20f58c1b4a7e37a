//! The opaque resume token of a follower's positions (see
//! [`encode_cursor`]).

use std::collections::BTreeMap;

use crate::error::{Error, Result};

/// The version byte of the cursor format.
const CURSOR_V1: u8 = 1;

/// The opaque resume token of `positions`: URL-safe base64 (no padding) of
/// a version byte and the zlib-compressed list of the shards whose
/// position is not 0, each as two LEB128 varints: the gap to the previous
/// shard, and the zigzag difference of its position from the previous
/// shard's. Neighbouring shards hold similar `added_id`s, so a position
/// costs about a byte before compression; 4096 shards stay within a few
/// kilobytes.
pub fn encode_cursor(positions: &BTreeMap<u32, i64>) -> String {
    encode_positions(positions.iter().map(|(s, p)| (*s, *p)))
}

/// [`encode_cursor`] of positions in shard order.
pub(super) fn encode_positions(positions: impl Iterator<Item = (u32, i64)>) -> String {
    use base64::Engine as _;
    use std::io::Write as _;
    let mut raw = Vec::with_capacity(1024);
    let (mut prev_shard, mut prev_at) = (0u32, 0i64);
    for (shard, at) in positions.filter(|(_, at)| *at > 0) {
        varint(&mut raw, u64::from(shard - prev_shard));
        let diff = at.wrapping_sub(prev_at);
        varint(&mut raw, ((diff << 1) ^ (diff >> 63)) as u64);
        (prev_shard, prev_at) = (shard, at);
    }
    let mut out = vec![CURSOR_V1];
    let mut z = flate2::write::ZlibEncoder::new(&mut out, flate2::Compression::fast());
    let _ = z.write_all(&raw);
    let _ = z.finish();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(out)
}

/// The positions of a token made by [`encode_cursor`].
pub fn decode_cursor(cursor: &str) -> Result<BTreeMap<u32, i64>> {
    use base64::Engine as _;
    use std::io::Read as _;
    let bad = || Error::InvalidCursor("not a subscription cursor of this gateway".into());
    if cursor.len() > 1 << 20 {
        return Err(bad());
    }
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|_| bad())?;
    let (&version, body) = bytes.split_first().ok_or_else(bad)?;
    if version != CURSOR_V1 {
        return Err(bad());
    }
    let mut raw = Vec::new();
    flate2::read::ZlibDecoder::new(body)
        .take(1 << 20)
        .read_to_end(&mut raw)
        .map_err(|_| bad())?;
    let mut positions = BTreeMap::new();
    let (mut shard, mut at) = (0u64, 0i64);
    let mut rest = &raw[..];
    while !rest.is_empty() {
        shard += read_varint(&mut rest).ok_or_else(bad)?;
        let z = read_varint(&mut rest).ok_or_else(bad)?;
        at = at.wrapping_add(((z >> 1) as i64) ^ -((z & 1) as i64));
        let shard = u32::try_from(shard).map_err(|_| bad())?;
        if at <= 0 || (!positions.is_empty() && positions.contains_key(&shard)) {
            return Err(bad());
        }
        positions.insert(shard, at);
    }
    Ok(positions)
}

fn varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn read_varint(input: &mut &[u8]) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = input.split_first()?;
        *input = rest;
        n |= u64::from(byte & 0x7f) << shift;
        if byte < 0x80 {
            return Some(n);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_stay_small_for_4096_shards() {
        let positions: BTreeMap<u32, i64> = (0..4096u32)
            .map(|s| (s, 250_000 + i64::from(s % 97)))
            .collect();
        let cursor = encode_cursor(&positions);
        assert!(cursor.len() < 16 * 1024, "{} bytes", cursor.len());
        assert_eq!(decode_cursor(&cursor).unwrap(), positions);
        let sparse = BTreeMap::from([(3, 7), (4095, 1), (9, 0)]);
        let back = decode_cursor(&encode_cursor(&sparse)).unwrap();
        assert_eq!(back, BTreeMap::from([(3, 7), (4095, 1)]));
        assert!(decode_cursor("not a cursor").is_err());
        assert!(decode_cursor("").is_err());
    }
}
