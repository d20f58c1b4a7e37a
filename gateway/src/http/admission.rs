//! Admission control for GraphQL requests ("thick and thin pipe"): a cap on
//! requests executing at once, a rate limit per client address and one per
//! API token.
//!
//! Both answer at once when exceeded (503 `OVERLOADED`, 429 `RATE_LIMITED`)
//! instead of queueing: under overload a queue only adds latency to every
//! request and lets the backlog grow until the process falls over, while a
//! quick refusal lets clients back off and keeps the admitted requests fast.
//!
//! Anonymous clients are told apart by the IP address of the TCP peer.
//! Forwarded-for headers are not trusted, since any client can set them;
//! behind a proxy, limit per client at the proxy. Requests are admitted
//! after their body has been read (`graphql.rs`), so a client that stalls
//! while sending holds no permit.

use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Weak};
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::LimitsConfig;

/// How often idle clients are forgotten by the rate limiter.
const FORGET_IDLE_CLIENTS_EVERY: Duration = Duration::from_secs(60);

/// The client an address stands for in per-address limits: an IPv4
/// address itself (also when it arrives IPv4-mapped), an IPv6 address cut
/// to its leading `ipv6_prefix` bits, since one host usually holds a whole
/// /64 and could otherwise use a fresh address for every request.
pub fn client_key(address: IpAddr, ipv6_prefix: u8) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let bits = u32::from(ipv6_prefix.clamp(1, 128));
            let mask = u128::MAX << (128 - bits);
            IpAddr::V6((u128::from(v6) & mask).into())
        }
    }
}

/// The admission state shared by all requests.
pub struct Admission {
    /// Leading bits of an IPv6 address that name a client.
    ipv6_prefix: u8,
    concurrency: Option<Arc<Semaphore>>,
    rate: Option<Arc<DefaultKeyedRateLimiter<IpAddr>>>,
    token_rate: Option<Arc<DefaultKeyedRateLimiter<Arc<str>>>>,
    clock: DefaultClock,
}

/// Why a request was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The client sent more than its rate; it may retry after the delay.
    RateLimited { retry_after: Duration },
    /// Too many requests are executing.
    Overloaded,
}

/// Held while an admitted request executes.
pub struct Permit {
    _slot: Option<OwnedSemaphorePermit>,
}

impl Admission {
    /// Admission under `limits`; a limit of 0 is no limit. Starts a
    /// background task that forgets idle clients when called on a tokio
    /// runtime.
    pub fn new(limits: &LimitsConfig) -> Admission {
        let concurrency = (limits.max_concurrent_requests > 0)
            .then(|| Arc::new(Semaphore::new(limits.max_concurrent_requests)));
        let rate = NonZeroU32::new(limits.rate_limit_per_second)
            .map(|per_second| Arc::new(RateLimiter::keyed(Quota::per_second(per_second))));
        let token_rate = NonZeroU32::new(limits.rate_limit_per_token_per_second)
            .map(|per_second| Arc::new(RateLimiter::keyed(Quota::per_second(per_second))));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            if let Some(rate) = &rate {
                runtime.spawn(forget_idle_clients(Arc::downgrade(rate)));
            }
            if let Some(rate) = &token_rate {
                runtime.spawn(forget_idle_clients(Arc::downgrade(rate)));
            }
        }
        Admission {
            ipv6_prefix: limits.client_ipv6_prefix,
            concurrency,
            rate,
            token_rate,
            clock: DefaultClock::default(),
        }
    }

    /// Applies the per-address rate to a request from `address`. Every
    /// request is counted, before it is authenticated, so that clients
    /// sending invalid tokens are slowed down too.
    pub fn limit_address(&self, address: Option<IpAddr>) -> Result<(), Rejection> {
        match (&self.rate, address) {
            (Some(rate), Some(address)) => rate
                .check_key(&client_key(address, self.ipv6_prefix))
                .map_err(|not_until| Rejection::RateLimited {
                    retry_after: not_until.wait_time_from(self.clock.now()),
                }),
            _ => Ok(()),
        }
    }

    /// Admits an authenticated request: the per-token rate for requests
    /// with a token, then the concurrency limit.
    pub fn admit(&self, token: Option<&Arc<str>>) -> Result<Permit, Rejection> {
        if let (Some(rate), Some(token)) = (&self.token_rate, token) {
            if let Err(not_until) = rate.check_key(token) {
                return Err(Rejection::RateLimited {
                    retry_after: not_until.wait_time_from(self.clock.now()),
                });
            }
        }
        let slot = match &self.concurrency {
            None => None,
            Some(semaphore) => match semaphore.clone().try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => return Err(Rejection::Overloaded),
            },
        };
        Ok(Permit { _slot: slot })
    }
}

/// Drops the rate limiter's state of clients that are back to a full burst,
/// so that memory follows the active clients, not every client ever seen.
async fn forget_idle_clients<K>(rate: Weak<DefaultKeyedRateLimiter<K>>)
where
    K: std::hash::Hash + Eq + Clone,
{
    let mut tick = tokio::time::interval(FORGET_IDLE_CLIENTS_EVERY);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(rate) = rate.upgrade() else { return };
        rate.retain_recent();
        rate.shrink_to_fit();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(concurrent: usize, per_second: u32) -> LimitsConfig {
        LimitsConfig {
            max_concurrent_requests: concurrent,
            rate_limit_per_second: per_second,
            rate_limit_per_token_per_second: per_second,
            ..LimitsConfig::default()
        }
    }

    #[test]
    fn a_busy_gateway_refuses_at_once_and_recovers() {
        let admission = Admission::new(&limits(1, 0));
        let first = admission.admit(None).expect("first admitted");
        assert_eq!(admission.admit(None).err(), Some(Rejection::Overloaded));
        drop(first);
        assert!(admission.admit(None).is_ok());
    }

    #[test]
    fn the_rate_is_per_client() {
        let admission = Admission::new(&limits(0, 2));
        let a = Some("10.0.0.1".parse().unwrap());
        let b = Some("10.0.0.2".parse().unwrap());
        assert!(admission.limit_address(a).is_ok());
        assert!(admission.limit_address(a).is_ok());
        match admission.limit_address(a) {
            Err(Rejection::RateLimited { retry_after }) => {
                assert!(retry_after <= Duration::from_secs(1))
            }
            other => panic!("expected a rate limit, got {:?}", other.err()),
        }
        assert!(admission.limit_address(b).is_ok());
    }

    // Regression: IPv6 clients were keyed on the whole address, so one
    // host with a /64 escaped the rate and grew the limiter's memory.
    #[test]
    fn ipv6_clients_are_keyed_by_their_prefix() {
        let admission = Admission::new(&limits(0, 2));
        let address = |n: u16| Some(IpAddr::from([0x2001, 0xdb8, 0, 7, 0, 0, 0, n]));
        assert!(admission.limit_address(address(1)).is_ok());
        assert!(admission.limit_address(address(2)).is_ok());
        assert!(matches!(
            admission.limit_address(address(3)),
            Err(Rejection::RateLimited { .. })
        ));
        let other = Some(IpAddr::from([0x2001, 0xdb8, 0, 8, 0, 0, 0, 1]));
        assert!(admission.limit_address(other).is_ok(), "another /64");
        assert_eq!(
            client_key("::ffff:10.0.0.1".parse().unwrap(), 64),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_key("2001:db8::1:2:3:4".parse().unwrap(), 48),
            "2001:db8::".parse::<IpAddr>().unwrap()
        );
        assert_eq!(
            client_key("2001:db8::5".parse().unwrap(), 128),
            "2001:db8::5".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn the_rate_is_per_token_whatever_the_address() {
        let admission = Admission::new(&limits(0, 1));
        let token: Arc<str> = Arc::from("t1");
        assert!(admission.admit(Some(&token)).is_ok());
        assert!(matches!(
            admission.admit(Some(&token)),
            Err(Rejection::RateLimited { .. })
        ));
        assert!(admission.admit(Some(&Arc::from("t2"))).is_ok());
        assert!(admission.admit(None).is_ok());
    }

    #[test]
    fn zero_turns_the_limits_off() {
        let admission = Admission::new(&limits(0, 0));
        let permits: Vec<_> = (0..1000)
            .map(|_| {
                admission.limit_address(Some(IpAddr::from([10, 0, 0, 1])))?;
                admission.admit(Some(&Arc::from("t")))
            })
            .collect();
        assert!(permits.iter().all(Result::is_ok));
    }
}
