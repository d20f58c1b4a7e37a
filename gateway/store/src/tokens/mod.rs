//! API tokens: generation, hashing, the `cellgate_tokens` table, and the
//! scopes a token carries (`scopes.rs`). Checking a request's token
//! against them is the gateway's (`cellgate-graphql`'s `auth`).
//!
//! A token is `cg_<id>_<secret>`: `id` is 16 hex digits that name the token
//! in `token list` and `token revoke`, `secret` 256 random bits in
//! URL-safe base64. Only the SHA-256 of the whole token is stored. A slow
//! password hash (argon2, bcrypt) exists to make guessing *low-entropy*
//! passwords expensive; these tokens have 256 bits of entropy, so inverting
//! their hash is out of reach already, and a slow hash would only make each
//! authenticated request cost tens of milliseconds of CPU, which turns
//! the hash into a lever for denial of service. A keyed hash with a pepper
//! kept in the same database protects nothing a leaked database does not
//! also reveal. Looking tokens up *by* their hash also means no stored
//! secret is ever compared byte by byte with client input, so timing tells
//! an attacker nothing. Tokens from the configuration file are given by
//! the same hash (`sha256:<hex>`), which `cellgate token create --no-store`
//! prints.
//!
//! The table lives on the first storage cluster (`catalog.rs` creates it
//! with the other cluster tables on every cluster; only the first is used).
//! Revoking sets `revoked_at`: rows are kept for the audit trail.

use chrono::{DateTime, Utc};
use rand::RngCore as _;
use sha2::{Digest as _, Sha256};

mod scopes;

use crate::storage::{ddl, Backend, Sql, Value};
use crate::{Error, Result};
pub use scopes::{Access, Scope, Scopes};

/// The prefix of every token, so that secret scanners can recognise them.
pub const TOKEN_PREFIX: &str = "cg_";

/// A newly made token: the secret is shown once and never stored.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub id: String,
    /// The token to hand to the client: `cg_<id>_<secret>`.
    pub token: String,
    /// `sha256:<hex>`, what is stored and what the configuration takes.
    pub hash: String,
}

/// Makes a fresh random token.
pub fn generate() -> NewToken {
    use base64::Engine as _;
    let mut rng = rand::rngs::OsRng;
    let mut id = [0u8; 8];
    let mut secret = [0u8; 32];
    rng.fill_bytes(&mut id);
    rng.fill_bytes(&mut secret);
    let id: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret);
    let token = format!("{TOKEN_PREFIX}{id}_{secret}");
    NewToken {
        hash: hash(&token),
        id,
        token,
    }
}

/// Whether `token` has the shape of a generated token:
/// `cg_<16 hex digits>_<43 URL-safe base64 characters>`.
pub fn well_formed(token: &str) -> bool {
    let Some(rest) = token.strip_prefix(TOKEN_PREFIX) else {
        return false;
    };
    let Some((id, secret)) = rest.split_once('_') else {
        return false;
    };
    id.len() == 16
        && id.bytes().all(|b| b.is_ascii_hexdigit())
        && secret.len() == 43
        && secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// `sha256:<hex>` of a token.
pub fn hash(token: &str) -> String {
    let digest = Sha256::digest(token.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A stored token as `token list` shows it.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenRow {
    pub id: String,
    pub name: String,
    pub scopes: Scopes,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

fn now() -> DateTime<Utc> {
    crate::storage::value::truncate_to_micros(Utc::now())
}

/// Stores `token` under `name` with `scopes`.
pub async fn insert(
    backend: &dyn Backend,
    token: &NewToken,
    name: &str,
    scopes: &Scopes,
) -> Result<()> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("INSERT INTO ")
        .ident(ddl::TOKENS_TABLE)
        .push(" (")
        .idents(["id", "token_hash", "name", "scopes", "created_at"])
        .push(") ")
        .rows([vec![
            Value::Text(token.id.clone()),
            Value::Text(token.hash.clone()),
            Value::Text(name.to_string()),
            Value::Text(scopes.to_string()),
            Value::DateTime(now()),
        ]]);
    backend.execute(&sql).await?;
    Ok(())
}

const COLUMNS: [&str; 5] = ["id", "name", "scopes", "created_at", "revoked_at"];

/// A row of [`COLUMNS`].
type Row = (String, String, String, DateTime<Utc>, Option<DateTime<Utc>>);

fn decode((id, name, scopes, created_at, revoked_at): Row) -> Result<TokenRow> {
    let texts: Vec<&str> = scopes.split_whitespace().collect();
    let scopes = Scopes::parse(&texts)
        .map_err(|e| Error::Internal(format!("token {id} has invalid scopes: {e}")))?;
    Ok(TokenRow {
        id,
        name,
        scopes,
        created_at,
        revoked_at,
    })
}

/// Every stored token, revoked ones included, oldest first.
pub async fn list(backend: &dyn Backend) -> Result<Vec<TokenRow>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(COLUMNS)
        .push(" FROM ")
        .ident(ddl::TOKENS_TABLE)
        .push(" ORDER BY ")
        .ident("created_at")
        .push(", ")
        .ident("id");
    backend
        .rows::<Row>(&sql)
        .await?
        .into_iter()
        .map(decode)
        .collect()
}

/// The unrevoked token with `hash`, if any.
pub async fn find(backend: &dyn Backend, hash: &str) -> Result<Option<TokenRow>> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("SELECT ")
        .idents(COLUMNS)
        .push(" FROM ")
        .ident(ddl::TOKENS_TABLE)
        .push(" WHERE ")
        .ident("token_hash")
        .push(" = ")
        .bind(Value::Text(hash.to_string()))
        .push(" AND ")
        .ident("revoked_at")
        .push(" IS NULL");
    backend
        .first_row::<Row>(&sql)
        .await?
        .map(decode)
        .transpose()
}

/// Revokes the token `id`; false if there is no such unrevoked token.
pub async fn revoke(backend: &dyn Backend, id: &str) -> Result<bool> {
    let mut sql = Sql::new(backend.dialect());
    sql.push("UPDATE ")
        .ident(ddl::TOKENS_TABLE)
        .push(" SET ")
        .ident("revoked_at")
        .push(" = ")
        .bind(Value::DateTime(now()))
        .push(" WHERE ")
        .ident("id")
        .push(" = ")
        .bind(Value::Text(id.to_string()))
        .push(" AND ")
        .ident("revoked_at")
        .push(" IS NULL");
    Ok(backend.execute(&sql).await? > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_random_and_hashed_whole() {
        let a = generate();
        let b = generate();
        assert_ne!(a.token, b.token);
        assert!(a.token.starts_with(&format!("cg_{}_", a.id)));
        assert_eq!(a.token.len(), 3 + 16 + 1 + 43);
        assert_eq!(a.hash, hash(&a.token));
        assert!(a.hash.starts_with("sha256:") && a.hash.len() == 7 + 64);
        assert!(well_formed(&a.token));
        assert!(!well_formed("cg_0000000000000000_short"));
        assert!(!well_formed(&a.token[1..]));
        assert_eq!(
            hash("abc"),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
