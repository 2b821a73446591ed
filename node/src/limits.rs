//! Request rates per API key and per tenant: token buckets (`governor`, GCRA), one per key
//! and one per tenant, on each node. A request over either is 429 `rate_limited` with
//! `Retry-After`, counted in `sift_rate_limited_total{scope}` (`key` or `tenant`). Without a
//! configured rate, nothing is limited. A tenant whose limits set a rate of its own
//! (`PUT /v1/tenants/{name}/limits`) has a bucket of that rate instead of the node-wide one.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, DefaultKeyedRateLimiter, Quota, RateLimiter};

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
    /// The buckets of tenants with a rate of their own, with that rate (a bucket is made anew
    /// when the tenant's rate changes; one whose tenant has no rate of its own any more sits
    /// unused, so a request without one takes no lock here).
    own_rates: Mutex<HashMap<String, (Rate, Arc<DefaultDirectRateLimiter>)>>,
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
            own_rates: Mutex::default(),
            clock: DefaultClock::default(),
            checks: AtomicU64::new(0),
        }
    }

    /// Takes a token from the caller's key bucket, then from its tenant's (of `tenant_rate`,
    /// the tenant's own rate, when it has one); a refusal of either refuses the request (a
    /// request refused by its key takes nothing from the tenant).
    pub fn check(&self, principal: &Principal, tenant_rate: Option<Rate>) -> Result<(), Limited> {
        if self.checks.fetch_add(1, Ordering::Relaxed) % FORGET_EVERY == FORGET_EVERY - 1 {
            self.forget_idle();
        }
        let key = principal.key_id.as_deref().unwrap_or("");
        if let Some(limiter) = &self.per_key {
            limiter
                .check_key(&key.to_string())
                .map_err(|not_until| self.refuse("key", not_until))?;
        }
        let tenant = principal.tenant.as_str();
        match tenant_rate {
            Some(rate) => {
                let limiter = self.own_bucket(tenant, rate);
                limiter
                    .check()
                    .map_err(|not_until| self.refuse("tenant", not_until))?;
            }
            None => {
                if let Some(limiter) = &self.per_tenant {
                    limiter
                        .check_key(&tenant.to_string())
                        .map_err(|not_until| self.refuse("tenant", not_until))?;
                }
            }
        }
        Ok(())
    }

    fn refuse(
        &self,
        scope: &'static str,
        not_until: governor::NotUntil<<DefaultClock as Clock>::Instant>,
    ) -> Limited {
        let wait = not_until.wait_time_from(self.clock.now());
        metrics::counter!("sift_rate_limited_total", "scope" => scope).increment(1);
        Limited {
            scope,
            retry_after_secs: wait.as_secs_f64().ceil().max(1.0) as u64,
        }
    }

    /// The bucket of a tenant with a rate of its own, made anew when the rate changed.
    fn own_bucket(&self, tenant: &str, rate: Rate) -> Arc<DefaultDirectRateLimiter> {
        let mut own = self
            .own_rates
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        match own.get(tenant) {
            Some((had, limiter)) if *had == rate => limiter.clone(),
            _ => {
                let limiter = Arc::new(RateLimiter::direct(rate.quota()));
                own.insert(tenant.to_string(), (rate, limiter.clone()));
                limiter
            }
        }
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
        assert!(limits.check(&alice, None).is_ok());
        assert!(limits.check(&alice, None).is_ok());
        let refused = limits.check(&alice, None).unwrap_err();
        assert_eq!(refused.scope, "key");
        assert!((1..=60).contains(&refused.retry_after_secs), "{refused:?}");
        assert!(limits.check(&caller("bbbbbbbbbbbb", "acme"), None).is_ok());
    }

    #[test]
    fn the_keys_of_a_tenant_share_its_bucket() {
        let limits = RateLimits::new(None, Rate::new(1, Some(2)));
        assert!(limits.check(&caller("aaaaaaaaaaaa", "acme"), None).is_ok());
        assert!(limits.check(&caller("bbbbbbbbbbbb", "acme"), None).is_ok());
        let refused = limits
            .check(&caller("cccccccccccc", "acme"), None)
            .unwrap_err();
        assert_eq!(refused.scope, "tenant");
        assert!(
            limits
                .check(&caller("dddddddddddd", "globex"), None)
                .is_ok()
        );
    }

    #[test]
    fn a_tenant_with_a_rate_of_its_own_has_its_own_bucket() {
        // Node-wide: 1 a minute, a burst of 2; acme's own: a burst of 4, then of 1.
        let limits = RateLimits::new(None, Rate::new(1, Some(2)));
        let acme = caller("aaaaaaaaaaaa", "acme");
        let own = Rate::new(1, Some(4));
        for _ in 0..4 {
            assert!(limits.check(&acme, own).is_ok());
        }
        assert_eq!(limits.check(&acme, own).unwrap_err().scope, "tenant");
        // Another tenant still has the node-wide bucket.
        let globex = caller("bbbbbbbbbbbb", "globex");
        assert!(limits.check(&globex, None).is_ok());
        assert!(limits.check(&globex, None).is_ok());
        assert!(limits.check(&globex, None).is_err());
        // A changed rate is a new bucket; none of its own: back to the node-wide one, which
        // acme has not used yet.
        assert!(limits.check(&acme, Rate::new(1, Some(1))).is_ok());
        assert!(limits.check(&acme, Rate::new(1, Some(1))).is_err());
        assert!(limits.check(&acme, None).is_ok());
        assert!(limits.check(&acme, None).is_ok());
        assert!(limits.check(&acme, None).is_err());
    }

    #[test]
    fn no_rate_limits_nothing() {
        let limits = RateLimits::new(None, None);
        for _ in 0..1000 {
            assert!(limits.check(&caller("aaaaaaaaaaaa", "acme"), None).is_ok());
        }
        assert_eq!(Rate::new(0, None), None);
        assert_eq!(Rate::new(600, None).unwrap().burst.get(), 20);
    }
}
