//! Parsed GraphQL documents, cached by their text.
//!
//! Clients send the same few documents over and over with different
//! variables, and parsing one (async-graphql's pest grammar) cost about a
//! tenth of the CPU of a simple index query. A document depends only on
//! its text, so the parse is done once per distinct text and later
//! requests get a copy of the syntax tree, which is much cheaper to clone
//! than to parse (names are shared `Arc<str>`s).
//!
//! The cache is bounded by the total length of the cached texts (a syntax
//! tree is a small multiple of its text), and moka's admission policy
//! keeps a stream of one-off documents from evicting the frequent ones.
//! Texts that fail to parse are not cached: the parse error is cheap and
//! caching it would let garbage take the place of real documents.
//!
//! A cached document also remembers whether a request with its text has
//! passed validation, and, from then on, its direct form (`direct.rs`).
//! Both depend on the schema, so a gateway that serves a new schema (a
//! reload of the definitions) starts a new cache with [`Documents::renewed`]
//! and serves each request from the cache of the schema it runs on.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use async_graphql::parser::types::ExecutableDocument;
use async_graphql::ServerError;

use crate::direct::Direct;

/// A parsed document, shared by the requests that send its text.
pub struct Parsed {
    pub document: ExecutableDocument,
    /// Whether a request with this text was executed without any error,
    /// so the document passed validation.
    validated: AtomicBool,
    direct: OnceLock<Option<Direct>>,
}

impl Parsed {
    fn new(document: ExecutableDocument) -> Parsed {
        Parsed {
            document,
            validated: AtomicBool::new(false),
            direct: OnceLock::new(),
        }
    }

    /// Records that a request with this text was answered without errors.
    pub fn validated(&self) {
        self.validated.store(true, Ordering::Relaxed);
    }

    /// The direct form of the document once it has passed validation,
    /// compiled by `compile` the first time it is asked for.
    pub fn direct(
        &self,
        compile: impl FnOnce(&ExecutableDocument) -> Option<Direct>,
    ) -> Option<&Direct> {
        if !self.validated.load(Ordering::Relaxed) {
            return None;
        }
        self.direct.get_or_init(|| compile(&self.document)).as_ref()
    }
}

/// Documents longer than this are parsed every time: they are rare, and
/// one of them would take the room of hundreds of ordinary ones.
const MAX_CACHED_TEXT: usize = 64 * 1024;

/// The cache of parsed documents; shared by all requests.
pub struct Documents {
    /// `None` when caching is off.
    cache: Option<moka::sync::Cache<String, Arc<Parsed>>>,
    capacity_bytes: u64,
    /// Shared with the caches that replace this one, so they never go back.
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    hits: AtomicU64,
    misses: AtomicU64,
    direct: AtomicU64,
}

impl Documents {
    /// A cache holding documents whose texts add up to at most
    /// `capacity_bytes` (0 turns caching off).
    pub fn new(capacity_bytes: u64) -> Documents {
        let cache = (capacity_bytes > 0).then(|| {
            moka::sync::Cache::builder()
                .max_capacity(capacity_bytes)
                .weigher(|text: &String, _| u32::try_from(text.len()).unwrap_or(u32::MAX))
                .build()
        });
        Documents {
            cache,
            capacity_bytes,
            counts: Arc::default(),
        }
    }

    /// An empty cache of the same size whose counts continue this one's,
    /// for a new schema.
    pub fn renewed(&self) -> Documents {
        Documents {
            counts: self.counts.clone(),
            ..Documents::new(self.capacity_bytes)
        }
    }

    /// The parsed document of `text`: from the cache, or parsed now (and
    /// cached when it parses).
    pub fn parse(&self, text: &str) -> Result<Arc<Parsed>, ServerError> {
        if let Some(document) = self.cache.as_ref().and_then(|cache| cache.get(text)) {
            self.counts.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(document);
        }
        self.counts.misses.fetch_add(1, Ordering::Relaxed);
        let document = Arc::new(Parsed::new(async_graphql::parser::parse_query(text)?));
        if let Some(cache) = self
            .cache
            .as_ref()
            .filter(|_| text.len() <= MAX_CACHED_TEXT)
        {
            cache.insert(text.to_string(), document.clone());
        }
        Ok(document)
    }

    /// Counts a request answered by a document's direct form.
    pub fn answered_directly(&self) {
        self.counts.direct.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests answered by a document's direct form, since start.
    pub fn direct_count(&self) -> u64 {
        self.counts.direct.load(Ordering::Relaxed)
    }

    /// Requests answered from the cache and requests that parsed, since
    /// start.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.counts.hits.load(Ordering::Relaxed),
            self.counts.misses.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_text_is_parsed_once() {
        let documents = Documents::new(1 << 20);
        let text = "query Q($id: UUID!) { trips { row(rowKey: $id) { rowKey } } }";
        let first = documents.parse(text).expect("parses");
        let second = documents.parse(text).expect("parses");
        assert!(Arc::ptr_eq(&first, &second));
        assert_eq!(documents.counts(), (1, 1));
    }

    #[test]
    fn texts_that_do_not_parse_are_not_cached() {
        let documents = Documents::new(1 << 20);
        assert!(documents.parse("query {").is_err());
        assert!(documents.parse("query {").is_err());
        assert_eq!(documents.counts(), (0, 2));
        let cache = documents.cache.as_ref().expect("caching is on");
        cache.run_pending_tasks();
        assert_eq!(cache.entry_count(), 0);
    }

    #[test]
    fn a_renewed_cache_is_empty_and_keeps_counting() {
        let documents = Documents::new(1 << 20);
        let text = "{ __typename }";
        let old = documents.parse(text).expect("parses");
        old.validated();
        let renewed = documents.renewed();
        let new = renewed.parse(text).expect("parses");
        assert!(!Arc::ptr_eq(&old, &new));
        assert!(new.direct(|_| unreachable!("not validated")).is_none());
        assert_eq!(renewed.counts(), (0, 2));
        assert_eq!(documents.counts(), (0, 2));
    }

    #[test]
    fn a_zero_capacity_caches_nothing() {
        let documents = Documents::new(0);
        let text = "{ __typename }";
        documents.parse(text).expect("parses");
        documents.parse(text).expect("parses");
        assert_eq!(documents.counts(), (0, 2));
    }
}
