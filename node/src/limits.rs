//! Request rates per API key and per tenant: token buckets (`governor`, GCRA), one per key
//! and one per tenant, on each node. A request over either is 429 `rate_limited` with
//! `Retry-After`, counted in `sift_rate_limited_total{scope}` (`key` or `tenant`). Without a
//! configured rate, nothing is limited.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use crate::auth::Principal;

/// A rate: requests per minute, with a burst allowed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rate {
    pub per_minute: NonZeroU32,
    pub burst: NonZeroU32,
}

impl Rate {
    /// `per_minute` requests a minute, `burst` at once (default: two seconds' worth, at
    /// least 1); `None` for a rate of 0 (no limit).
    pub fn new(per_minute: u32, burst: Option<u32>) -> Option<Rate> {
        let per_minute = NonZeroU32::new(per_minute)?;
        let burst = burst.and_then(NonZeroU32::new).unwrap_or_else(|| {
            NonZeroU32::new((per_minute.get() / 30).max(1)).unwrap_or(NonZeroU32::MIN)
        });
        Some(Rate { per_minute, burst })
    }

    fn quota(self) -> Quota {
        Quota::per_minute(self.per_minute).allow_burst(self.burst)
    }
}

/// The buckets of one node.
pub struct RateLimits {
    per_key: Option<DefaultKeyedRateLimiter<String>>,
    per_tenant: Option<DefaultKeyedRateLimiter<String>>,
    clock: DefaultClock,
    /// Checks made, to forget idle buckets every [`FORGET_EVERY`] of them.
    checks: AtomicU64,
}

/// How many checks pass between two sweeps of idle buckets.
const FORGET_EVERY: u64 = 4096;

/// A refused request: which bucket was empty, and when to come back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limited {
    pub scope: &'static str,
    pub retry_after_secs: u64,
}

impl RateLimits {
    pub fn new(per_key: Option<Rate>, per_tenant: Option<Rate>) -> RateLimits {
        RateLimits {
            per_key: per_key.map(|rate| RateLimiter::keyed(rate.quota())),
            per_tenant: per_tenant.map(|rate| RateLimiter::keyed(rate.quota())),
            clock: DefaultClock::default(),
            checks: AtomicU64::new(0),
        }
    }

    /// Takes a token from the caller's key bucket, then from its tenant's; a refusal of
    /// either refuses the request (a request refused by its key takes nothing from the
    /// tenant).
    pub fn check(&self, principal: &Principal) -> Result<(), Limited> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % FORGET_EVERY == FORGET_EVERY - 1 {
            self.forget_idle();
        }
        let key = principal.key_id.as_deref().unwrap_or("");
        for (scope, limiter, name) in [
            ("key", &self.per_key, key),
            ("tenant", &self.per_tenant, principal.tenant.as_str()),
        ] {
            let Some(limiter) = limiter else { continue };
            if let Err(not_until) = limiter.check_key(&name.to_string()) {
                let wait = not_until.wait_time_from(self.clock.now());
                metrics::counter!("sift_rate_limited_total", "scope" => scope).increment(1);
                return Err(Limited {
                    scope,
                    retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
                });
            }
        }
        Ok(())
    }

    /// Forgets the buckets that are full again (their keys are idle), so that the maps hold
    /// only recent callers.
    fn forget_idle(&self) {
        for limiter in [&self.per_key, &self.per_tenant].into_iter().flatten() {
            limiter.retain_recent();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sift_storage::meta::Role;

    fn caller(key: &str, tenant: &str) -> Principal {
        Principal {
            key_id: Some(key.into()),
            role: Role::Reader,
            tenant: tenant.into(),
            groups: Vec::new(),
        }
    }

    #[test]
    fn a_key_gets_its_burst_then_waits_and_other_keys_are_apart() {
        let limits = RateLimits::new(Rate::new(1, Some(2)), None);
        let alice = caller("aaaaaaaaaaaa", "acme");
        assert!(limits.check(&alice).is_ok());
        assert!(limits.check(&alice).is_ok());
        let refused = limits.check(&alice).unwrap_err();
        assert_eq!(refused.scope, "key");
        assert!((1..=60).contains(&refused.retry_after_secs), "{refused:?}");
        assert!(limits.check(&caller("bbbbbbbbbbbb", "acme")).is_ok());
    }

    #[test]
    fn the_keys_of_a_tenant_share_its_bucket() {
        let limits = RateLimits::new(None, Rate::new(1, Some(2)));
        assert!(limits.check(&caller("aaaaaaaaaaaa", "acme")).is_ok());
        assert!(limits.check(&caller("bbbbbbbbbbbb", "acme")).is_ok());
        let refused = limits.check(&caller("cccccccccccc", "acme")).unwrap_err();
        assert_eq!(refused.scope, "tenant");
        assert!(limits.check(&caller("dddddddddddd", "globex")).is_ok());
    }

    #[test]
    fn no_rate_limits_nothing() {
        let limits = RateLimits::new(None, None);
        for _ in 0..1000 {
            assert!(limits.check(&caller("aaaaaaaaaaaa", "acme")).is_ok());
        }
        assert_eq!(Rate::new(0, None), None);
        assert_eq!(Rate::new(600, None).unwrap().burst.get(), 20);
    }
}
