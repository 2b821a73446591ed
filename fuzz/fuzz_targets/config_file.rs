//! The node's config file as `sift serve --config` reads it: TOML into `FileConfig`, then the
//! checks of `Config::check`. A config that passes must be one the node can run: every queue
//! and semaphore it sizes fits tokio's limit and every deadline it adds to a clock fits an
//! `Instant`. Built only with `--features node`: sift-node pulls in the whole engine.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use sift_node::config::{Config, FileConfig};

/// tokio's `Semaphore::MAX_PERMITS`: a larger semaphore or bounded channel panics.
const MAX_PERMITS: usize = usize::MAX >> 3;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(file) = toml::from_str::<FileConfig>(text) else {
        return;
    };
    let Ok(config) = Config::check(file) else {
        return;
    };
    for permits in [
        config.options.ingest_queue_capacity,
        config.options.search_permits_per_shard,
        config.runs.max_concurrent_runs,
        config.runs.max_queued_runs,
        config.connections.max_connections,
    ] {
        assert!(permits <= MAX_PERMITS, "{permits} permits");
    }
    let now = Instant::now();
    let durations: [Duration; 9] = [
        config.options.shard_deadline,
        config.options.hedge_after,
        config.options.remote_write_timeout,
        config.options.repair_interval,
        config.options.reassign_after,
        config.options.replace_after,
        config.connections.header_read_timeout,
        config.runs.queue_timeout,
        config.runs.retention,
    ];
    let presets = config.agents.iter().flat_map(|preset| {
        [
            Duration::from_secs(preset.budget.deadline_secs),
            Duration::from_secs(preset.budget.tool_timeout_secs),
        ]
    });
    let providers = config.llm.providers.iter().flat_map(|provider| {
        [
            provider.connect_timeout_ms,
            provider.first_token_timeout_ms,
            provider.idle_timeout_ms,
            provider.breaker_open_ms,
            provider.backoff_ms,
        ]
        .map(Duration::from_millis)
    });
    for duration in durations.into_iter().chain(presets).chain(providers) {
        // A run's deadline also gets a grace period added: a minute of headroom.
        let later = duration.checked_add(Duration::from_secs(60));
        assert!(
            later.and_then(|later| now.checked_add(later)).is_some(),
            "{duration:?}"
        );
    }
});
