//! The differential check catches the bugs a cache manager can have: each fault is planted in
//! an otherwise correct run, fires, and the run fails on the oracle's logits, not on kvown's
//! own invariant checker (which the faults leave intact: they change only what the model reads).

use kvown_candle::ServeConfig;
use kvown_candle::serve::Fault;
use kvown_runtime::radix::EvictionPolicy;

use crate::differential::tight;
use crate::harness::{F32_TOLERANCE, Mismatch, conversations, run};

/// Runs the shared workload with `fault` planted in `config` and checks that the oracle
/// comparison catches it.
fn caught(fault: Fault, config: ServeConfig) {
    let config = ServeConfig {
        fault: Some(fault),
        ..config
    };
    let outcome = run(config, conversations(1), F32_TOLERANCE);
    assert!(outcome.faults_fired > 0, "{fault:?} never fired");
    match outcome.result {
        Err(mismatch @ (Mismatch::Logits { .. } | Mismatch::Token { .. })) => {
            eprintln!("{fault:?} caught: {mismatch}")
        }
        other => panic!("{fault:?} was not caught by the oracle: {other:?}"),
    }
}

#[test]
fn a_row_entry_naming_another_requests_slot_is_caught() {
    caught(Fault::CrossRequestSlot, tight(16, 256, EvictionPolicy::Lru));
    caught(Fault::CrossRequestSlot, tight(1, 300, EvictionPolicy::Lru));
}

#[test]
fn a_prefix_hit_that_skips_one_page_too_many_is_caught() {
    caught(
        Fault::PrefixSkipsExtraPage,
        tight(16, 256, EvictionPolicy::Lru),
    );
    caught(
        Fault::PrefixSkipsExtraPage,
        tight(1, 300, EvictionPolicy::Lru),
    );
}

#[test]
fn slots_reused_before_a_retracted_request_is_prefilled_again_are_caught() {
    caught(
        Fault::StaleSlotsAfterRetraction,
        tight(16, 256, EvictionPolicy::Lru),
    );
    caught(
        Fault::StaleSlotsAfterRetraction,
        tight(1, 300, EvictionPolicy::Lru),
    );
}
