//! Opaque keyset cursors.
//!
//! A cursor is the position of an entry in the query's order: the values of
//! the order fields and the row key, plus a signature of the index and order
//! it belongs to, MessagePack-encoded and base64url'd. Clients treat it as
//! opaque; a cursor from another query is refused rather than misread.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::error::{Error, Result};
use crate::storage::Value;

const VERSION: u8 = 1;

#[derive(Serialize, Deserialize)]
struct Payload {
    v: u8,
    sig: u64,
    keys: Vec<Value>,
    row: Uuid,
}

/// A position in an ordered index result.
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    /// Values of the order fields, in order.
    pub keys: Vec<Value>,
    /// The row key, the final tie-breaker.
    pub row_key: Uuid,
}

/// Signature of an index and an order (field positions in `index`):
/// cursors only work where they came from. It names the fields, not their
/// positions, so a cursor stays good across versions of the index that
/// order by the same fields (a previous version serving while a new one is
/// built, and the new one after the switch).
pub fn signature(index: &index_dsl::Index, order: &[(usize, bool)]) -> u64 {
    let mut text = index.name.clone();
    for &(p, descending) in order {
        text.push(':');
        text.push_str(&index.fields[p].name);
        text.push_str(if descending { "-" } else { "+" });
    }
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

pub fn encode(sig: u64, position: &Position) -> String {
    let payload = Payload {
        v: VERSION,
        sig,
        keys: position.keys.clone(),
        row: position.row_key,
    };
    let bytes = rmp_serde::to_vec(&payload).expect("cursor payload serializes");
    URL_SAFE_NO_PAD.encode(bytes)
}

pub fn decode(cursor: &str, sig: u64) -> Result<Position> {
    let bytes = URL_SAFE_NO_PAD
        .decode(cursor)
        .map_err(|_| Error::InvalidCursor("not a cursor returned by this query".into()))?;
    let payload: Payload = rmp_serde::from_slice(&bytes)
        .map_err(|_| Error::InvalidCursor("not a cursor returned by this query".into()))?;
    if payload.v != VERSION || payload.sig != sig {
        return Err(Error::InvalidCursor(
            "the cursor belongs to another index or order".into(),
        ));
    }
    Ok(Position {
        keys: payload.keys,
        row_key: payload.row,
    })
}
