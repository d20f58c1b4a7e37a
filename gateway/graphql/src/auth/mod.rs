//! Who a request comes from and what it may do: API tokens with
//! per-datastore scopes.
//!
//! The store's `tokens` module makes, hashes and stores tokens
//! (`cellgate_tokens` on the first cluster) and parses and checks
//! `<datastore>:<access>` scopes. [`Authenticator`] turns an `Authorization: Bearer` header into a
//! [`Principal`]. Stored tokens are looked up by hash and the answer is
//! cached for [`CACHE_TTL`], so a revoked token stops working within that
//! time on every gateway without a restart, while a busy client costs one
//! lookup per second rather than one per request. Which GraphQL fields
//! need which access is decided in `graphql/access.rs`; this module knows
//! neither GraphQL nor HTTP.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

pub use cellgate_store::tokens::{self, Access, Scope, Scopes};

use cellgate_store::Store;
use serde::Deserialize;

/// How long the answer of a token lookup is reused.
pub const CACHE_TTL: Duration = Duration::from_secs(1);

/// Most cached lookups. The cache admits a new entry only over one used
/// less often (moka's TinyLFU), so a flood of random tokens neither grows
/// it without bound nor pushes the tokens in use out of it.
const CACHE_CAPACITY: u64 = 10_000;

/// The caller of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The token's id (stored tokens) or configured name; `None` when auth
    /// is off.
    pub token: Option<Arc<str>>,
    pub scopes: Scopes,
}

impl Principal {
    /// Everything allowed: auth is off.
    pub fn unrestricted() -> Principal {
        Principal {
            token: None,
            scopes: Scopes::all(),
        }
    }

    pub fn allows(&self, datastore: &str, access: Access) -> bool {
        self.scopes.allows(datastore, access)
    }
}

/// Why a request has no principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthError {
    /// No `Authorization` header (or not a bearer token).
    Missing,
    /// A token that is unknown or revoked.
    Invalid,
    /// The token store could not be read.
    Unavailable,
}

/// A token given by its hash in the configuration.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConfigToken {
    /// A name for logs and metrics.
    pub name: String,
    /// `sha256:<64 hex digits>` of the token.
    pub hash: String,
    /// Scopes such as `trips:read`, `payments:write`, `*:admin`.
    pub scopes: Vec<String>,
}

/// Authenticates requests against the configured and stored tokens.
pub struct Authenticator {
    enabled: bool,
    configured: HashMap<String, (Arc<str>, Scopes)>,
    store: Option<Store>,
    /// Lookups by token hash, for [`CACHE_TTL`]; `None`: unknown or revoked.
    cache: moka::sync::Cache<String, Option<Principal>>,
}

impl Authenticator {
    /// An authenticator for the configured `tokens` and those stored in
    /// `store`; `enabled` says whether auth is on. Fails on a configured
    /// token with an invalid hash or scope.
    pub fn new(
        tokens: &[ConfigToken],
        enabled: bool,
        store: Option<Store>,
    ) -> cellgate_store::Result<Self> {
        let mut configured = HashMap::new();
        for token in tokens {
            let hex = token.hash.strip_prefix("sha256:").unwrap_or("");
            if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(cellgate_store::Error::Config(format!(
                    "auth.tokens: the hash of `{}` is not sha256:<64 hex digits>",
                    token.name
                )));
            }
            let scopes = Scopes::parse(&token.scopes).map_err(|e| {
                cellgate_store::Error::Config(format!("auth.tokens: token `{}`: {e}", token.name))
            })?;
            configured.insert(
                format!("sha256:{}", hex.to_ascii_lowercase()),
                (Arc::from(token.name.as_str()), scopes),
            );
        }
        Ok(Authenticator {
            enabled,
            configured,
            store,
            cache: moka::sync::Cache::builder()
                .max_capacity(CACHE_CAPACITY)
                .time_to_live(CACHE_TTL)
                .build(),
        })
    }

    /// Whether requests need a token.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The principal of a request with this `Authorization` header. With
    /// auth off every request is [`Principal::unrestricted`].
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, AuthError> {
        if !self.enabled {
            return Ok(Principal::unrestricted());
        }
        let token = bearer(authorization).ok_or(AuthError::Missing)?;
        let hash = tokens::hash(token);
        if let Some((name, scopes)) = self.configured.get(&hash) {
            return Ok(Principal {
                token: Some(name.clone()),
                scopes: scopes.clone(),
            });
        }
        // Stored tokens have one shape; anything else needs no lookup.
        if !tokens::well_formed(token) {
            return Err(AuthError::Invalid);
        }
        if let Some(cached) = self.cache.get(&hash) {
            return cached.ok_or(AuthError::Invalid);
        }
        let Some(store) = &self.store else {
            return Err(AuthError::Invalid);
        };
        let found = match store.tokens_backend() {
            Ok(backend) => tokens::find(backend.as_ref(), &hash).await,
            Err(error) => Err(error),
        };
        let principal = match found {
            Ok(row) => row.map(|row| Principal {
                token: Some(Arc::from(row.id.as_str())),
                scopes: row.scopes,
            }),
            Err(error) => {
                tracing::warn!(%error, "cannot read the API tokens");
                return Err(AuthError::Unavailable);
            }
        };
        self.cache.insert(hash, principal.clone());
        principal.ok_or(AuthError::Invalid)
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(header: Option<&str>) -> Option<&str> {
    let header = header?.trim();
    let (scheme, token) = header.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bearer_tokens_are_read() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }

    #[tokio::test]
    async fn configured_tokens_are_matched_by_hash() {
        let token = tokens::generate();
        let config = vec![ConfigToken {
            name: "ci".into(),
            hash: token.hash.to_uppercase().replace("SHA256:", "sha256:"),
            scopes: vec!["trips:read".into()],
        }];
        let auth = Authenticator::new(&config, true, None).unwrap();
        let principal = auth
            .authenticate(Some(&format!("Bearer {}", token.token)))
            .await
            .unwrap();
        assert_eq!(principal.token.as_deref(), Some("ci"));
        assert!(principal.allows("trips", Access::Read));
        assert!(!principal.allows("trips", Access::Write));
        assert_eq!(
            auth.authenticate(Some("Bearer cg_other")).await,
            Err(AuthError::Invalid)
        );
        assert_eq!(auth.authenticate(None).await, Err(AuthError::Missing));
        let off = Authenticator::new(&config, false, None).unwrap();
        assert_eq!(off.authenticate(None).await, Ok(Principal::unrestricted()));
    }

    #[test]
    fn malformed_configured_tokens_are_refused() {
        let config = |hash: &str, scope: &str| {
            vec![ConfigToken {
                name: "x".into(),
                hash: hash.into(),
                scopes: vec![scope.into()],
            }]
        };
        let good = tokens::hash("t");
        assert!(Authenticator::new(&config(&good, "trips:read"), true, None).is_ok());
        assert!(Authenticator::new(&config("md5:00", "trips:read"), true, None).is_err());
        assert!(Authenticator::new(&config(&good, "trips:all"), true, None).is_err());
    }
}
