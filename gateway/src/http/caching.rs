//! HTTP caching of `GET /graphql` answers, from what the operation read
//! (`cellgate_graphql::Cacheability`):
//!
//! | answer | headers |
//! |---|---|
//! | only cells named by their full key, every one found | `Cache-Control: public, max-age=31536000, immutable` (`private` with an `Authorization` header), `ETag` of the request |
//! | any other query without errors | `Cache-Control: no-cache` (`private, no-cache`), `ETag` of the answer |
//! | POST, mutations, errors, refusals | `Cache-Control: no-store` |
//!
//! Every answer has `Vary: Accept, Authorization`. A GET whose
//! `If-None-Match` names the current tag is answered `304` without a body.
//! The tag of a full-key read is computed from the request alone (the
//! answer never changes once complete), so its `304` is given without
//! running the query; other tags hash the answer.

use poem::http::{header, HeaderValue, StatusCode};
use poem::{Request, Response};
use sha2::{Digest as _, Sha256};

/// A year, the longest `max-age` caches are asked to honour.
const IMMUTABLE: &str = "max-age=31536000, immutable";

/// What an answer may be cached as.
pub(super) struct Caching {
    pub cache_control: String,
    pub etag: Option<String>,
}

impl Caching {
    /// Never cached.
    pub fn no_store() -> Caching {
        Caching {
            cache_control: "no-store".to_string(),
            etag: None,
        }
    }

    /// The same forever, tagged by `material` (the request).
    pub fn immutable(request: &Request, media: &str, material: &[u8]) -> Caching {
        Caching {
            cache_control: format!("{}, {IMMUTABLE}", visibility(request)),
            etag: Some(tag(media, material)),
        }
    }

    /// Cached if revalidated, tagged by `body` (the answer).
    pub fn revalidate(request: &Request, media: &str, body: &[u8]) -> Caching {
        let cache_control = match visibility(request) {
            "private" => "private, no-cache".to_string(),
            _ => "no-cache".to_string(),
        };
        Caching {
            cache_control,
            etag: Some(tag(media, body)),
        }
    }

    /// Whether `request`'s `If-None-Match` names this answer's tag.
    pub fn not_modified(&self, request: &Request) -> bool {
        let (Some(etag), Some(wanted)) = (&self.etag, request.header(header::IF_NONE_MATCH)) else {
            return false;
        };
        wanted.split(',').any(|candidate| {
            let candidate = candidate.trim();
            candidate == "*" || candidate.strip_prefix("W/").unwrap_or(candidate) == etag
        })
    }

    /// `304 Not Modified` with the caching headers and no body.
    pub fn not_modified_response(&self) -> Response {
        let mut response = Response::builder()
            .status(StatusCode::NOT_MODIFIED)
            .finish();
        self.apply(&mut response);
        response
    }

    /// Sets the caching headers of `response`.
    pub fn apply(&self, response: &mut Response) {
        let headers = response.headers_mut();
        if let Ok(value) = HeaderValue::from_str(&self.cache_control) {
            headers.insert(header::CACHE_CONTROL, value);
        }
        if let Some(value) = self
            .etag
            .as_ref()
            .and_then(|e| HeaderValue::from_str(e).ok())
        {
            headers.insert(header::ETAG, value);
        }
        headers.insert(
            header::VARY,
            HeaderValue::from_static("accept, authorization"),
        );
    }
}

/// Whether an answer may be kept by shared caches: not when the request
/// carried credentials.
fn visibility(request: &Request) -> &'static str {
    if request.headers().contains_key(header::AUTHORIZATION) {
        "private"
    } else {
        "public"
    }
}

/// A strong entity tag: 128 bits of the SHA-256 of the media type and
/// `material`.
fn tag(media: &str, material: &[u8]) -> String {
    let mut hash = Sha256::new();
    hash.update(media.as_bytes());
    hash.update([0]);
    hash.update(material);
    let hex: String = hash.finalize()[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("\"{hex}\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> Request {
        let mut builder = Request::builder();
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        builder.finish()
    }

    #[test]
    fn tags_depend_on_the_media_type_and_the_material() {
        assert_eq!(tag("a", b"x"), tag("a", b"x"));
        assert_ne!(tag("a", b"x"), tag("b", b"x"));
        assert_ne!(tag("a", b"x"), tag("a", b"y"));
        assert_eq!(tag("a", b"x").len(), 34);
    }

    #[test]
    fn if_none_match_takes_lists_weak_tags_and_a_star() {
        let caching = Caching::revalidate(&request(&[]), "m", b"body");
        let etag = caching.etag.clone().unwrap();
        for given in [
            etag.clone(),
            format!("W/{etag}"),
            format!("\"x\", {etag}"),
            "*".into(),
        ] {
            assert!(
                caching.not_modified(&request(&[("if-none-match", &given)])),
                "{given}"
            );
        }
        assert!(!caching.not_modified(&request(&[("if-none-match", "\"x\"")])));
        assert!(!caching.not_modified(&request(&[])));
        assert!(!Caching::no_store().not_modified(&request(&[("if-none-match", "*")])));
    }

    #[test]
    fn answers_to_a_token_are_private() {
        let with = request(&[("authorization", "Bearer t")]);
        assert_eq!(
            Caching::immutable(&with, "m", b"r").cache_control,
            "private, max-age=31536000, immutable"
        );
        assert_eq!(
            Caching::immutable(&request(&[]), "m", b"r").cache_control,
            "public, max-age=31536000, immutable"
        );
        assert_eq!(
            Caching::revalidate(&with, "m", b"r").cache_control,
            "private, no-cache"
        );
    }
}
