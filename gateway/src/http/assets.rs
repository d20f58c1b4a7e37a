//! The browser pages the gateway serves from its own binary: the GraphiQL
//! playground at `/` and the web explorer at `/ui/`.
//!
//! Every file comes from `web/` and is embedded at build time with
//! `include_bytes!`, so the pages work without internet access and
//! `cargo build` needs no Node: the explorer is plain ES modules and CSS,
//! and the playground's React and GraphiQL bundles are vendored copies of
//! pinned npm packages (`web/vendor.mjs` derives them from
//! `web/package-lock.json`; CI checks they match).
//!
//! Files are looked up in a fixed table, never on the file system, so no
//! request path can reach anything else. A unit test keeps the table equal
//! to the files under `web/playground/` and `web/explorer/`.
//!
//! Caching: vendored files carry their package version in their name and
//! never change under that name, so they are cached for a year as
//! `immutable`; every other file changes with the binary and is served
//! `no-cache` with an `ETag`, so browsers revalidate and get a 304 when
//! nothing changed. HTML pages carry a Content-Security-Policy that allows
//! same-origin scripts, styles and requests only: the explorer shows cell
//! bodies written by anyone, and the policy keeps a rendering mistake from
//! becoming script execution.

use std::collections::HashMap;
use std::sync::LazyLock;

use poem::http::{header, StatusCode};
use poem::web::{Path, Redirect};
use poem::{handler, Request, Response};

/// One embedded file, by its path under `web/`.
struct Asset {
    path: &'static str,
    bytes: &'static [u8],
}

/// Embeds `web/<path>` for each path.
macro_rules! embed {
    ($($path:literal),* $(,)?) => {
        &[$(Asset {
            path: $path,
            bytes: include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../web/", $path)),
        }),*]
    };
}

static ASSETS: &[Asset] = embed![
    "playground/index.html",
    "playground/playground.css",
    "playground/playground.js",
    "playground/examples.json",
    "playground/vendor/LICENSES.txt",
    "playground/vendor/graphiql-4.1.2.min.css",
    "playground/vendor/graphiql-4.1.2.min.js",
    "playground/vendor/react-18.3.1.production.min.js",
    "playground/vendor/react-dom-18.3.1.production.min.js",
    "explorer/index.html",
    "explorer/style.css",
    "explorer/app.js",
    "explorer/api.js",
    "explorer/catalog.js",
    "explorer/copy.js",
    "explorer/dom.js",
    "explorer/format.js",
    "explorer/live.js",
    "explorer/metrics.js",
    "explorer/queries.js",
    "explorer/settings.js",
    "explorer/topology.js",
    "explorer/views/breadcrumbs.js",
    "explorer/views/datastore.js",
    "explorer/views/health.js",
    "explorer/views/home.js",
    "explorer/views/index-query.js",
    "explorer/views/log.js",
    "explorer/views/not-found.js",
    "explorer/views/row.js",
    "explorer/views/settings.js",
    "explorer/views/tail.js",
    "explorer/views/triggers.js",
];

/// Path → (asset, ETag), built on first use.
static INDEX: LazyLock<HashMap<&'static str, (&'static Asset, String)>> = LazyLock::new(|| {
    ASSETS
        .iter()
        .map(|asset| {
            let hash = xxhash_rust::xxh3::xxh3_64(asset.bytes);
            (asset.path, (asset, format!("\"{hash:016x}\"")))
        })
        .collect()
});

/// What the playground page may load: GraphiQL sets inline styles and ships
/// its fonts as data URLs.
const PLAYGROUND_CSP: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self' 'unsafe-inline'; font-src 'self' data:; img-src 'self' data:; \
     connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// What the explorer page may load: only its own files and the gateway's
/// endpoints.
const EXPLORER_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("json") => "application/json",
        Some("svg") => "image/svg+xml",
        Some("png") => "image/png",
        _ => "text/plain; charset=utf-8",
    }
}

/// The response for `web/<path>`: the file, a 304 when the request already
/// holds this version, or a 404.
fn serve(path: &str, request: &Request, csp: &'static str) -> Response {
    let Some((asset, etag)) = INDEX.get(path) else {
        return Response::builder()
            .status(StatusCode::NOT_FOUND)
            .content_type("text/plain; charset=utf-8")
            .body("not found");
    };
    let cache = if path.contains("/vendor/") {
        "public, max-age=31536000, immutable"
    } else {
        "no-cache"
    };
    let builder = Response::builder()
        .header(header::ETAG, etag.as_str())
        .header(header::CACHE_CONTROL, cache)
        .header(header::X_CONTENT_TYPE_OPTIONS, "nosniff");
    let fresh = request
        .headers()
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| {
            value
                .split(',')
                .map(str::trim)
                .any(|tag| tag == "*" || tag.trim_start_matches("W/") == etag)
        });
    if fresh {
        return builder.status(StatusCode::NOT_MODIFIED).finish();
    }
    let builder = if path.ends_with(".html") {
        builder
            .header(header::CONTENT_SECURITY_POLICY, csp)
            .header(header::REFERRER_POLICY, "same-origin")
            // For browsers that predate `frame-ancestors` in the CSP.
            .header(header::X_FRAME_OPTIONS, "DENY")
    } else {
        builder
    };
    builder.content_type(content_type(path)).body(asset.bytes)
}

/// `GET /`: the GraphiQL playground.
#[handler]
pub(super) fn playground(request: &Request) -> Response {
    serve("playground/index.html", request, PLAYGROUND_CSP)
}

/// `GET /playground/*`: the playground's scripts, styles and examples.
#[handler]
pub(super) fn playground_file(Path(path): Path<String>, request: &Request) -> Response {
    serve(&format!("playground/{path}"), request, PLAYGROUND_CSP)
}

/// `GET /ui`: the explorer lives under `/ui/`, where its relative links
/// resolve.
#[handler]
pub(super) fn explorer_redirect() -> Redirect {
    Redirect::permanent("/ui/")
}

/// `GET /ui/` and `GET /ui/*`: the web explorer. Its pages are routed in the
/// browser (`#/…`), so every page is `index.html`.
#[handler]
pub(super) fn explorer_file(path: Option<Path<String>>, request: &Request) -> Response {
    let path = match path.as_ref().map(|Path(p)| p.as_str()) {
        None | Some("") => "index.html",
        Some(path) => path,
    };
    serve(&format!("explorer/{path}"), request, EXPLORER_CSP)
}

#[cfg(test)]
mod tests {
    use super::*;

    use poem::{get, Endpoint, Route};

    fn web_dir() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../web")
    }

    fn files_under(dir: &std::path::Path, prefix: &str, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).expect("readable web directory") {
            let entry = entry.expect("directory entry");
            let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
            if entry.file_type().expect("file type").is_dir() {
                files_under(&entry.path(), &format!("{name}/"), out);
            } else {
                out.push(name);
            }
        }
    }

    #[test]
    fn every_file_of_the_pages_is_embedded() {
        let mut on_disk = Vec::new();
        for dir in ["playground", "explorer"] {
            files_under(&web_dir().join(dir), &format!("{dir}/"), &mut on_disk);
        }
        on_disk.sort();
        let mut embedded: Vec<String> = ASSETS.iter().map(|a| a.path.to_string()).collect();
        embedded.sort();
        assert_eq!(
            embedded, on_disk,
            "update ASSETS in gateway/src/http/assets.rs"
        );
    }

    #[test]
    fn playground_tabs_are_the_readme_examples() {
        let readme = std::fs::read_to_string(web_dir().join("../README.md")).expect("README.md");
        let mut blocks = Vec::new();
        let mut rest = readme.as_str();
        while let Some(start) = rest.find("```graphql\n") {
            let body = &rest[start + "```graphql\n".len()..];
            let end = body.find("```").expect("closed code block");
            blocks.push(body[..end].to_string());
            rest = &body[end..];
        }
        assert!(!blocks.is_empty(), "README.md has graphql examples");
        let (asset, _) = INDEX.get("playground/examples.json").expect("embedded");
        let examples: Vec<serde_json::Value> =
            serde_json::from_slice(asset.bytes).expect("examples.json is JSON");
        let queries: Vec<String> = examples
            .iter()
            .map(|e| e["query"].as_str().expect("a query").to_string())
            .collect();
        assert_eq!(
            queries, blocks,
            "web/playground/examples.json must hold README.md's graphql blocks, in order"
        );
    }

    fn routes() -> impl Endpoint {
        Route::new()
            .at("/", get(playground))
            .at("/playground/*path", get(playground_file))
            .at("/ui", get(explorer_redirect))
            .at("/ui/", get(explorer_file))
            .at("/ui/*path", get(explorer_file))
    }

    async fn fetch(path: &str, if_none_match: Option<&str>) -> Response {
        let mut request = Request::builder().uri(path.parse().expect("uri"));
        if let Some(tag) = if_none_match {
            request = request.header(header::IF_NONE_MATCH, tag);
        }
        routes().get_response(request.finish()).await
    }

    fn header_of(response: &Response, name: header::HeaderName) -> &str {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    #[tokio::test]
    async fn pages_and_files_have_their_types_and_cache_rules() {
        let page = fetch("/", None).await;
        assert_eq!(page.status(), StatusCode::OK);
        assert_eq!(
            header_of(&page, header::CONTENT_TYPE),
            "text/html; charset=utf-8"
        );
        assert_eq!(header_of(&page, header::CACHE_CONTROL), "no-cache");
        assert!(header_of(&page, header::CONTENT_SECURITY_POLICY).contains("script-src 'self'"));
        let html = page.into_body().into_string().await.expect("utf-8");
        assert!(html.contains("vendor/graphiql-4.1.2.min.js"), "{html}");
        assert!(
            !html.contains("https://"),
            "the playground loads nothing remote"
        );

        let script = fetch("/playground/vendor/graphiql-4.1.2.min.js", None).await;
        assert_eq!(script.status(), StatusCode::OK);
        assert_eq!(
            header_of(&script, header::CONTENT_TYPE),
            "text/javascript; charset=utf-8"
        );
        assert_eq!(
            header_of(&script, header::CACHE_CONTROL),
            "public, max-age=31536000, immutable"
        );
        assert_eq!(
            header_of(&script, header::X_CONTENT_TYPE_OPTIONS),
            "nosniff"
        );

        let css = fetch("/playground/vendor/graphiql-4.1.2.min.css", None).await;
        assert_eq!(
            header_of(&css, header::CONTENT_TYPE),
            "text/css; charset=utf-8"
        );

        let explorer = fetch("/ui/", None).await;
        assert_eq!(explorer.status(), StatusCode::OK);
        assert_eq!(
            header_of(&explorer, header::CONTENT_TYPE),
            "text/html; charset=utf-8"
        );
        assert!(header_of(&explorer, header::CONTENT_SECURITY_POLICY).contains("style-src 'self';"));
        let module = fetch("/ui/app.js", None).await;
        assert_eq!(module.status(), StatusCode::OK);
        assert_eq!(
            header_of(&module, header::CONTENT_TYPE),
            "text/javascript; charset=utf-8"
        );
    }

    #[tokio::test]
    async fn ui_without_a_slash_redirects() {
        let response = fetch("/ui", None).await;
        assert_eq!(response.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(header_of(&response, header::LOCATION), "/ui/");
    }

    #[tokio::test]
    async fn a_known_version_is_not_sent_again() {
        let first = fetch("/ui/app.js", None).await;
        let etag = header_of(&first, header::ETAG).to_string();
        assert!(etag.starts_with('"'), "{etag}");
        let again = fetch("/ui/app.js", Some(&etag)).await;
        assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
        let weak = fetch("/ui/app.js", Some(&format!("\"other\", W/{etag}"))).await;
        assert_eq!(weak.status(), StatusCode::NOT_MODIFIED);
        let changed = fetch("/ui/app.js", Some("\"0000000000000000\"")).await;
        assert_eq!(changed.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn only_embedded_files_are_served() {
        for path in [
            "/ui/missing.js",
            "/ui/../Cargo.toml",
            "/ui/%2e%2e/README.md",
            "/playground/../../README.md",
            "/playground/package.json",
            "/ui/explorer/index.html",
        ] {
            let response = fetch(path, None).await;
            assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        }
    }
}
