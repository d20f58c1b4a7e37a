//! Parsed filter strings, kept by their text.
//!
//! A filter's parse depends on its text alone, and clients send the same
//! few filters again and again, so each text is parsed (pest) once per
//! process: parsing was about a seventh of the gateway's CPU on index
//! pages queried with a `filter:` string, parsed twice per request (the
//! limits check, then the plan). Only filters that parse are kept, within
//! [`BUDGET`] bytes of text; a filter text is kept no matter how it is
//! planned, since planning checks it against an index each time.

use std::sync::{Arc, LazyLock};

use index_dsl::{Filter, FilterError};
use quick_cache::sync::Cache;
use quick_cache::Weighter;

/// Bytes of filter text (plus a fixed cost per filter) kept at most.
pub const BUDGET: u64 = 8 * 1024 * 1024;

/// Bytes counted per kept filter besides its text: the parsed conditions.
const OVERHEAD: usize = 512;

/// A text longer than this is parsed every time (it would crowd out many
/// short ones).
const LONGEST_KEPT: usize = 16 * 1024;

#[derive(Clone)]
struct TextBytes;

impl Weighter<String, Arc<Filter>> for TextBytes {
    fn weight(&self, text: &String, _: &Arc<Filter>) -> u64 {
        (text.len() + OVERHEAD) as u64
    }
}

static PARSED: LazyLock<Cache<String, Arc<Filter>, TextBytes>> =
    LazyLock::new(|| Cache::with_weighter(4096, BUDGET, TextBytes));

/// The filter `text` parses to (`index_dsl::parse_filter`), parsed once
/// per process for any text up to 16 KiB.
pub fn parse_filter(text: &str) -> Result<Arc<Filter>, FilterError> {
    if text.len() > LONGEST_KEPT {
        return index_dsl::parse_filter(text).map(Arc::new);
    }
    if let Some(parsed) = PARSED.get(text) {
        return Ok(parsed);
    }
    let parsed = Arc::new(index_dsl::parse_filter(text)?);
    PARSED.insert(text.to_owned(), parsed.clone());
    Ok(parsed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_text_parses_as_index_dsl_parses_it_and_is_kept() {
        let text = "city_uuid = \"7d0b2b1e-4c3a-4a8e-9b59-1a2b3c4d5e6f\" and fare_total < 30.5";
        let first = parse_filter(text).unwrap();
        assert_eq!(*first, index_dsl::parse_filter(text).unwrap());
        let again = parse_filter(text).unwrap();
        assert!(
            Arc::ptr_eq(&first, &again),
            "the second parse is the kept one"
        );
        let other = parse_filter("status in (\"completed\", \"canceled\")").unwrap();
        assert_eq!(other.conditions.len(), 1);
        assert!(!Arc::ptr_eq(&first, &other));
    }

    #[test]
    fn errors_are_index_dsl_errors_and_are_not_kept() {
        let text = "fare_total <";
        let err = parse_filter(text).unwrap_err();
        assert_eq!(
            err.to_string(),
            index_dsl::parse_filter(text).unwrap_err().to_string()
        );
        assert!(PARSED.get(text).is_none());
    }

    #[test]
    fn long_texts_are_parsed_every_time() {
        let text = vec!["fare_total > 1"; 2000].join(" and ");
        assert!(text.len() > LONGEST_KEPT);
        let first = parse_filter(&text).unwrap();
        assert_eq!(first.conditions.len(), 2000);
        assert!(!Arc::ptr_eq(&first, &parse_filter(&text).unwrap()));
    }
}
