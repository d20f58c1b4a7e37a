//! Admission control for GraphQL requests ("thick and thin pipe"): a cap on
//! requests executing at once and a per-client rate limit.
//!
//! Both answer at once when exceeded (503 `OVERLOADED`, 429 `RATE_LIMITED`)
//! instead of queueing: under overload a queue only adds latency to every
//! request and lets the backlog grow until the process falls over, while a
//! quick refusal lets clients back off and keeps the admitted requests fast.
//!
//! Clients are told apart by the IP address of the TCP peer. Forwarded-for
//! headers are not trusted, since any client can set them; behind a proxy,
//! limit per client at the proxy.

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

/// The admission state shared by all requests.
pub struct Admission {
    concurrency: Option<Arc<Semaphore>>,
    rate: Option<Arc<DefaultKeyedRateLimiter<IpAddr>>>,
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
        if let (Some(rate), Ok(runtime)) = (&rate, tokio::runtime::Handle::try_current()) {
            runtime.spawn(forget_idle_clients(Arc::downgrade(rate)));
        }
        Admission {
            concurrency,
            rate,
            clock: DefaultClock::default(),
        }
    }

    /// Admits a request from `client` (`None` when the peer is not an IP
    /// socket, which is not rate limited) or says why not.
    pub fn admit(&self, client: Option<IpAddr>) -> Result<Permit, Rejection> {
        if let (Some(rate), Some(client)) = (&self.rate, client) {
            if let Err(not_until) = rate.check_key(&client) {
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
async fn forget_idle_clients(rate: Weak<DefaultKeyedRateLimiter<IpAddr>>) {
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
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(admission.admit(Some(a)).is_ok());
        assert!(admission.admit(Some(a)).is_ok());
        match admission.admit(Some(a)) {
            Err(Rejection::RateLimited { retry_after }) => {
                assert!(retry_after <= Duration::from_secs(1))
            }
            other => panic!("expected a rate limit, got {:?}", other.err()),
        }
        assert!(admission.admit(Some(b)).is_ok());
    }

    #[test]
    fn zero_turns_the_limits_off() {
        let admission = Admission::new(&limits(0, 0));
        let permits: Vec<_> = (0..1000)
            .map(|_| admission.admit(Some(IpAddr::from([10, 0, 0, 1]))))
            .collect();
        assert!(permits.iter().all(Result::is_ok));
    }
}
