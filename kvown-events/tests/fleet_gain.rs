//! The measured gain of KV-aware routing over round robin, on the fleet example's workload
//! (multi-turn conversations over shared system prompts, two namespaces), scaled down: three
//! replica threads publishing on ZMQ, Dynamo's index in the router, one request in flight at a
//! time so the run is deterministic.

// The example reads the timings and the series; the test, the totals.
#[allow(dead_code)]
#[path = "../examples/fleet/fleet.rs"]
mod fleet;
#[path = "../examples/fleet/indexer.rs"]
mod indexer;
// Shared with the differential test, which drives the rest of it.
#[allow(dead_code)]
#[path = "../examples/fleet/replica.rs"]
mod replica;
#[path = "../examples/fleet/workload.rs"]
mod workload;

use fleet::{FleetConfig, Policy};
use kvown_events::NamespaceLabels;
use workload::WorkloadConfig;

#[test]
fn kv_aware_routing_computes_well_under_half_the_prefill_of_round_robin() {
    let workload = WorkloadConfig {
        sessions: 60,
        concurrent_sessions: 16,
        system_prompts: 4,
        system_prompt_tokens: 256,
        namespaces: 2,
        turns: (3, 8),
        user_tokens: (32, 256),
        reply_tokens: (32, 192),
        seed: 7,
    };
    let requests = workload::generate(&workload);
    let config = FleetConfig {
        replicas: 3,
        page_size: 16,
        pool_tokens: 8192,
        max_context: 4096,
        max_in_flight: 1,
        labels: NamespaceLabels::lora_names(),
        launch: fleet::serve_jobs,
    };
    let aware = fleet::run(&config, &requests, Policy::KvAware).unwrap();
    let round_robin = fleet::run(&config, &requests, Policy::RoundRobin).unwrap();
    assert_eq!(aware.prompt_tokens(), round_robin.prompt_tokens());
    // Measured: 77.8% against 44.3%, 2.51x fewer prefill tokens.
    assert!(
        aware.hit_rate() > round_robin.hit_rate() + 0.25,
        "hit rate {:.3} vs {:.3}",
        aware.hit_rate(),
        round_robin.hit_rate()
    );
    assert!(
        aware.computed_tokens() * 2 < round_robin.computed_tokens(),
        "prefill {} vs {}",
        aware.computed_tokens(),
        round_robin.computed_tokens()
    );
    // Every replica took part, and the router took in every replica's events.
    for report in [&aware, &round_robin] {
        assert!(report.replicas.iter().all(|replica| replica.requests > 0));
        let batches: u64 = report.replicas.iter().map(|replica| replica.batches).sum();
        assert!(
            report.events >= batches,
            "{} events, {batches} batches",
            report.events
        );
    }
}
