//! The `Host` check against DNS rebinding.
//!
//! A page on `evil.example` can make its own name resolve to 127.0.0.1
//! once the browser has loaded it; its scripts then talk to a loopback
//! gateway as a same-origin server, through the visitor's browser, and the
//! only trace of the trick is the `Host: evil.example` header. So every
//! request's host must be one the gateway answers to (`http.allowed_hosts`
//! in `config.rs`): an IP address (a rebinding page cannot send one),
//! `localhost` or a name under `.localhost`, or a configured name.
//! Otherwise the answer is 403 `HOST_NOT_ALLOWED`, before any route runs.
//! With auth on and no names configured any host is accepted: a browser
//! holds no API token for such a page to use (tokens travel in
//! `Authorization`, never in cookies).

use std::net::IpAddr;

use crate::config::HttpConfig;

/// The host names a gateway answers to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowedHosts {
    any: bool,
    /// Exact names, lowercase.
    names: Vec<String>,
    /// Domains whose every subdomain is allowed, lowercase, with the dot.
    suffixes: Vec<String>,
}

impl AllowedHosts {
    /// The hosts of `config`; `auth_on` says whether requests need a token.
    pub fn new(config: &HttpConfig, auth_on: bool) -> AllowedHosts {
        let mut hosts = AllowedHosts {
            any: auth_on && config.allowed_hosts.is_empty(),
            names: Vec::new(),
            suffixes: vec![".localhost".to_string()],
        };
        for name in &config.allowed_hosts {
            let name = name.trim().trim_end_matches('.').to_ascii_lowercase();
            if name == "*" {
                hosts.any = true;
            } else if name.starts_with('.') {
                hosts.suffixes.push(name);
            } else {
                hosts.names.push(name);
            }
        }
        hosts
    }

    /// Whether a request with this `Host` header (or HTTP/2 authority) may
    /// go on. A request without one is not from a browser.
    pub fn allows(&self, host: Option<&str>) -> bool {
        if self.any {
            return true;
        }
        let Some(host) = host else { return true };
        let name = host_name(host).trim_end_matches('.').to_ascii_lowercase();
        if name.parse::<IpAddr>().is_ok() || name == "localhost" {
            return true;
        }
        self.names.contains(&name)
            || self
                .suffixes
                .iter()
                .any(|suffix| name.ends_with(suffix.as_str()))
    }
}

/// The name of a `Host` value, without port or IPv6 brackets.
fn host_name(host: &str) -> &str {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(names: &[&str], auth_on: bool) -> AllowedHosts {
        let config = HttpConfig {
            allowed_hosts: names.iter().map(|n| n.to_string()).collect(),
        };
        AllowedHosts::new(&config, auth_on)
    }

    #[test]
    fn loopback_names_and_addresses_are_always_allowed() {
        let none = hosts(&[], false);
        for host in [
            "127.0.0.1:8080",
            "127.0.0.1",
            "[::1]:8080",
            "[::1]",
            "10.1.2.3:80",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:3000",
            "localhost.:8080",
        ] {
            assert!(none.allows(Some(host)), "{host}");
        }
        assert!(none.allows(None));
    }

    #[test]
    fn other_names_need_listing() {
        let none = hosts(&[], false);
        for host in [
            "evil.example",
            "evil.example:8080",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "evillocalhost",
        ] {
            assert!(!none.allows(Some(host)), "{host}");
        }
        let listed = hosts(&["cellgate.internal", ".example.com"], false);
        assert!(listed.allows(Some("cellgate.internal:8080")));
        assert!(listed.allows(Some("CellGate.Internal")));
        assert!(listed.allows(Some("api.example.com")));
        assert!(!listed.allows(Some("example.com.evil.example")));
        assert!(!listed.allows(Some("other.internal")));
    }

    #[test]
    fn auth_on_without_a_list_or_a_star_allows_any_host() {
        assert!(hosts(&[], true).allows(Some("evil.example")));
        assert!(hosts(&["*"], false).allows(Some("evil.example")));
        // A configured list applies with auth on too.
        assert!(!hosts(&["cellgate.internal"], true).allows(Some("evil.example")));
    }
}
