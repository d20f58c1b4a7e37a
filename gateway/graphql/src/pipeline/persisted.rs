//! Persisted documents: requests that name a document by its SHA-256
//! instead of sending its text.
//!
//! - A **manifest** in the format graphql-codegen's client preset writes
//!   (`persisted-documents.json`: `{"<sha256 hex>": "<document>"}`), read
//!   from a file and read again with the definitions. Every entry's hash is
//!   checked against its document when it is read: a manifest with a wrong
//!   entry, or one that does not parse, is refused whole and the previous
//!   one stays.
//! - A request names a manifest document with `documentId` (`sha256:<hex>`
//!   or `<hex>`), as the GraphQL-over-HTTP persisted-documents proposal and
//!   the client preset do.
//! - Apollo's **automatic persisted queries**
//!   (`extensions.persistedQuery.sha256Hash`): a hash the manifest or the
//!   bounded store of registered documents knows runs; an unknown one is
//!   answered `PERSISTED_QUERY_NOT_FOUND`, after which the client sends the
//!   text with its hash and the document is registered.
//! - **Trusted documents** ([`DocumentsMode::OnlyPersisted`]): only the
//!   manifest's documents run, for every transport, except for a token
//!   with the `*:admin` scope (so the playground keeps working for
//!   operators); others are refused with `PERSISTED_DOCUMENT_REQUIRED`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Deserialize;
use sha2::{Digest as _, Sha256};

use super::{Refusal, RefusalKind};

/// Which documents run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DocumentsMode {
    /// Any document: sent as text, by id or by automatic persisted query.
    #[default]
    Any,
    /// Only the manifest's documents, except for `*:admin` tokens.
    OnlyPersisted,
}

/// The documents of a manifest by their SHA-256 (lowercase hex).
#[derive(Debug, Default)]
pub struct Manifest {
    documents: HashMap<String, Arc<str>>,
}

impl Manifest {
    /// Reads and checks the manifest at `path`.
    pub fn load(path: &Path) -> Result<Manifest, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "cannot read the persisted documents `{}`: {e}",
                path.display()
            )
        })?;
        Manifest::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Checks a manifest's text: a JSON object of SHA-256 hex → document,
    /// each hash that of its document.
    pub fn parse(text: &str) -> Result<Manifest, String> {
        let entries: HashMap<String, String> = serde_json::from_str(text).map_err(|e| {
            format!("not a manifest of persisted documents (a JSON object of \"<sha256 hex>\": \"<document>\"): {e}")
        })?;
        let mut documents = HashMap::with_capacity(entries.len());
        for (id, document) in entries {
            let Some(hash) = hex_id(&id) else {
                return Err(format!("`{id}` is not a SHA-256 in hex"));
            };
            let actual = sha256(&document);
            if actual != hash {
                return Err(format!(
                    "the document of `{id}` has the SHA-256 {actual}: the manifest does not match its documents"
                ));
            }
            documents.insert(hash, Arc::from(document));
        }
        Ok(Manifest { documents })
    }

    pub fn len(&self) -> usize {
        self.documents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.documents.is_empty()
    }

    fn get(&self, hash: &str) -> Option<Arc<str>> {
        self.documents.get(hash).cloned()
    }
}

/// The settings of persisted documents.
#[derive(Debug, Clone, Default)]
pub struct PersistedOptions {
    /// The manifest file, if any.
    pub manifest: Option<PathBuf>,
    pub mode: DocumentsMode,
    /// Bytes of document text the store of automatic persisted queries
    /// holds at most; 0 turns registration off.
    pub apq_bytes: u64,
}

/// Persisted documents as a gateway serves them.
pub struct Persisted {
    options: PersistedOptions,
    manifest: arc_swap::ArcSwap<Manifest>,
    apq: Option<moka::sync::Cache<String, Arc<str>>>,
    counts: Counts,
}

/// What persisted documents have served, for `/metrics`.
#[derive(Debug, Default)]
struct Counts {
    by_id: AtomicU64,
    apq_hits: AtomicU64,
    apq_misses: AtomicU64,
    apq_registered: AtomicU64,
    refused: AtomicU64,
}

/// The counts of [`Persisted::counts`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PersistedCounts {
    pub manifest_documents: u64,
    pub apq_documents: u64,
    /// Requests that named a manifest document by `documentId`.
    pub by_id: u64,
    pub apq_hits: u64,
    pub apq_misses: u64,
    pub apq_registered: u64,
    /// Free documents refused in trusted-documents mode.
    pub refused: u64,
}

/// The document a request runs, once persisted documents are resolved.
pub(crate) struct Resolved {
    pub(crate) query: String,
}

impl Persisted {
    /// Persisted documents with `options`; fails when the manifest cannot
    /// be read.
    pub fn new(options: PersistedOptions) -> Result<Persisted, String> {
        let manifest = match &options.manifest {
            Some(path) => Manifest::load(path)?,
            None => Manifest::default(),
        };
        let apq = (options.apq_bytes > 0).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(options.apq_bytes)
                .weigher(|_: &String, text: &Arc<str>| {
                    u32::try_from(text.len()).unwrap_or(u32::MAX)
                })
                .build()
        });
        Ok(Persisted {
            options,
            manifest: arc_swap::ArcSwap::from_pointee(manifest),
            apq,
            counts: Counts::default(),
        })
    }

    /// Reads the manifest file again; on failure the previous manifest
    /// stays and the reason is returned. `Ok(None)` without a manifest.
    pub fn reload(&self) -> Result<Option<usize>, String> {
        let Some(path) = &self.options.manifest else {
            return Ok(None);
        };
        let manifest = Manifest::load(path)?;
        let len = manifest.len();
        self.manifest.store(Arc::new(manifest));
        Ok(Some(len))
    }

    pub fn mode(&self) -> DocumentsMode {
        self.options.mode
    }

    pub fn counts(&self) -> PersistedCounts {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PersistedCounts {
            manifest_documents: self.manifest.load().len() as u64,
            apq_documents: self.apq.as_ref().map_or(0, |c| c.entry_count()),
            by_id: load(&self.counts.by_id),
            apq_hits: load(&self.counts.apq_hits),
            apq_misses: load(&self.counts.apq_misses),
            apq_registered: load(&self.counts.apq_registered),
            refused: load(&self.counts.refused),
        }
    }

    /// The text a request runs: its `query`, the manifest document its
    /// `documentId` names, or the document of its automatic persisted
    /// query; refused where the mode does not let it run. `trusted` is a
    /// caller that may send any document (a `*:admin` token).
    pub(crate) fn resolve(
        &self,
        query: Option<String>,
        document_id: Option<&str>,
        extensions: &async_graphql::Extensions,
        trusted: bool,
    ) -> Result<Resolved, Refusal> {
        let only_persisted = self.options.mode == DocumentsMode::OnlyPersisted && !trusted;
        if let Some(id) = document_id {
            if query.is_some() {
                return Err(Refusal::bad_request(
                    "send either `query` or `documentId`, not both",
                ));
            }
            let hash = hex_id(id).ok_or_else(|| {
                Refusal::bad_request(format!(
                    "`documentId` must be `sha256:` and 64 hexadecimal digits (got `{}`)",
                    shorten(id)
                ))
            })?;
            let document = self.manifest.load().get(&hash).ok_or_else(|| {
                Refusal::new(
                    RefusalKind::Invalid,
                    "PERSISTED_DOCUMENT_NOT_FOUND",
                    format!("no persisted document has the id `sha256:{hash}`"),
                )
            })?;
            self.counts.by_id.fetch_add(1, Ordering::Relaxed);
            return Ok(Resolved {
                query: document.to_string(),
            });
        }
        if let Some(persisted) = extensions.get("persistedQuery") {
            return self.automatic(query, persisted, only_persisted);
        }
        let Some(query) = query else {
            return Err(Refusal::bad_request(
                "the `query` parameter is required (or a `documentId`)",
            ));
        };
        if only_persisted && self.manifest.load().get(&sha256(&query)).is_none() {
            return Err(self.required());
        }
        Ok(Resolved { query })
    }

    /// An automatic persisted query: the hash in `extensions`, with or
    /// without the text.
    fn automatic(
        &self,
        query: Option<String>,
        persisted: &async_graphql::Value,
        only_persisted: bool,
    ) -> Result<Resolved, Refusal> {
        let value = persisted.clone().into_json().unwrap_or_default();
        if value.get("version").and_then(|v| v.as_i64()) != Some(1) {
            return Err(Refusal::new(
                RefusalKind::BadRequest,
                "PERSISTED_QUERY_NOT_SUPPORTED",
                "only version 1 of `extensions.persistedQuery` is supported",
            ));
        }
        let hash = value
            .get("sha256Hash")
            .and_then(|h| h.as_str())
            .and_then(hex_id)
            .ok_or_else(|| {
                Refusal::bad_request(
                    "`extensions.persistedQuery.sha256Hash` must be 64 hexadecimal digits",
                )
            })?;
        let known = self.manifest.load().get(&hash);
        match query {
            None => {
                let found = known.clone().or_else(|| {
                    (!only_persisted)
                        .then(|| self.apq.as_ref()?.get(&hash))
                        .flatten()
                });
                match found {
                    Some(document) => {
                        self.counts.apq_hits.fetch_add(1, Ordering::Relaxed);
                        Ok(Resolved {
                            query: document.to_string(),
                        })
                    }
                    None if only_persisted => Err(self.required()),
                    None => {
                        self.counts.apq_misses.fetch_add(1, Ordering::Relaxed);
                        Err(Refusal::new(
                            RefusalKind::Invalid,
                            "PERSISTED_QUERY_NOT_FOUND",
                            "PersistedQueryNotFound",
                        ))
                    }
                }
            }
            Some(query) => {
                if sha256(&query) != hash {
                    return Err(Refusal::new(
                        RefusalKind::BadRequest,
                        "PERSISTED_QUERY_HASH_MISMATCH",
                        "`extensions.persistedQuery.sha256Hash` is not the SHA-256 of `query`",
                    ));
                }
                if known.is_none() {
                    if only_persisted {
                        return Err(self.required());
                    }
                    if let Some(apq) = &self.apq {
                        apq.insert(hash, Arc::from(query.as_str()));
                        self.counts.apq_registered.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(Resolved { query })
            }
        }
    }

    fn required(&self) -> Refusal {
        self.counts.refused.fetch_add(1, Ordering::Relaxed);
        Refusal::new(
            RefusalKind::Forbidden,
            "PERSISTED_DOCUMENT_REQUIRED",
            "this gateway runs only persisted documents: send the `documentId` of a document of its manifest",
        )
    }
}

/// The lowercase hex of a document id: `sha256:<hex>` or `<hex>`.
fn hex_id(id: &str) -> Option<String> {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| hex.to_ascii_lowercase())
}

/// The SHA-256 of `text`, lowercase hex.
pub(crate) fn sha256(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// At most 80 characters of `text`, for an error message.
fn shorten(text: &str) -> String {
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUERY: &str = "{ trips { __typename } }";

    fn persisted(mode: DocumentsMode) -> Persisted {
        let persisted = Persisted::new(PersistedOptions {
            manifest: None,
            mode,
            apq_bytes: 1 << 20,
        })
        .unwrap();
        let manifest = format!("{{\"{}\": \"{QUERY}\"}}", sha256(QUERY));
        persisted
            .manifest
            .store(Arc::new(Manifest::parse(&manifest).unwrap()));
        persisted
    }

    fn code(result: Result<Resolved, Refusal>) -> String {
        let refusal = result.err().expect("a refusal");
        refusal.errors[0]["extensions"]["code"]
            .as_str()
            .unwrap()
            .to_string()
    }

    fn apq(hash: &str) -> async_graphql::Extensions {
        serde_json::from_value(serde_json::json!({
            "persistedQuery": {"version": 1, "sha256Hash": hash}
        }))
        .unwrap()
    }

    #[test]
    fn a_manifest_is_checked_entry_by_entry() {
        let good = format!("{{\"{}\": \"{QUERY}\"}}", sha256(QUERY));
        assert_eq!(Manifest::parse(&good).unwrap().len(), 1);
        let wrong = format!("{{\"{}\": \"{{ other }}\"}}", sha256(QUERY));
        assert!(Manifest::parse(&wrong)
            .unwrap_err()
            .contains("does not match"));
        assert!(Manifest::parse("[1]")
            .unwrap_err()
            .contains("not a manifest"));
        assert!(Manifest::parse("{\"abc\": \"{ a }\"}")
            .unwrap_err()
            .contains("not a SHA-256"));
    }

    #[test]
    fn documents_are_found_by_id_in_both_spellings() {
        let p = persisted(DocumentsMode::Any);
        let none = async_graphql::Extensions::default();
        let hash = sha256(QUERY);
        for id in [format!("sha256:{hash}"), hash.clone(), hash.to_uppercase()] {
            assert_eq!(
                p.resolve(None, Some(&id), &none, false).unwrap().query,
                QUERY
            );
        }
        let other = sha256("{ other }");
        assert_eq!(
            code(p.resolve(None, Some(&other), &none, false)),
            "PERSISTED_DOCUMENT_NOT_FOUND"
        );
        assert_eq!(
            code(p.resolve(None, Some("sha256:xyz"), &none, false)),
            "BAD_REQUEST"
        );
        assert_eq!(
            code(p.resolve(Some(QUERY.into()), Some(&hash), &none, false)),
            "BAD_REQUEST"
        );
        assert_eq!(p.counts().by_id, 3);
    }

    #[test]
    fn automatic_persisted_queries_register_after_a_miss() {
        let p = persisted(DocumentsMode::Any);
        let text = "{ payments { __typename } }";
        let hash = sha256(text);
        assert_eq!(
            code(p.resolve(None, None, &apq(&hash), false)),
            "PERSISTED_QUERY_NOT_FOUND"
        );
        assert_eq!(
            code(p.resolve(Some("{ x }".into()), None, &apq(&hash), false)),
            "PERSISTED_QUERY_HASH_MISMATCH"
        );
        assert_eq!(
            p.resolve(Some(text.into()), None, &apq(&hash), false)
                .unwrap()
                .query,
            text
        );
        assert_eq!(
            p.resolve(None, None, &apq(&hash), false).unwrap().query,
            text
        );
        // A manifest document is known to APQ without registering.
        assert_eq!(
            p.resolve(None, None, &apq(&sha256(QUERY)), false)
                .unwrap()
                .query,
            QUERY
        );
        let counts = p.counts();
        assert_eq!(
            (counts.apq_misses, counts.apq_registered, counts.apq_hits),
            (1, 1, 2)
        );
    }

    #[test]
    fn trusted_documents_mode_runs_only_the_manifest() {
        let p = persisted(DocumentsMode::OnlyPersisted);
        let none = async_graphql::Extensions::default();
        let free = "{ payments { __typename } }";
        assert_eq!(
            code(p.resolve(Some(free.into()), None, &none, false)),
            "PERSISTED_DOCUMENT_REQUIRED"
        );
        assert_eq!(
            code(p.resolve(Some(free.into()), None, &apq(&sha256(free)), false)),
            "PERSISTED_DOCUMENT_REQUIRED"
        );
        assert_eq!(
            code(p.resolve(None, None, &apq(&sha256(free)), false)),
            "PERSISTED_DOCUMENT_REQUIRED"
        );
        // The manifest's documents run, by id, by hash or as text.
        assert!(p.resolve(None, Some(&sha256(QUERY)), &none, false).is_ok());
        assert!(p.resolve(Some(QUERY.into()), None, &none, false).is_ok());
        assert!(p.resolve(None, None, &apq(&sha256(QUERY)), false).is_ok());
        // An admin token runs anything.
        assert!(p.resolve(Some(free.into()), None, &none, true).is_ok());
        assert_eq!(p.counts().refused, 3);
    }
}
