//! The serving loop against the oracle: continuous batching of 36 requests (shared system
//! prompts, multi-turn follow-ups) in a pool small enough that the prefix cache evicts and
//! running requests are retracted, chunked prefill, page sizes 1 and 16, every eviction policy,
//! speculative decoding and disaggregated prefill.

use kvown_candle::{Draft, ServeConfig, SpecConfig};
use kvown_runtime::kv::KvDtype;
use kvown_runtime::radix::EvictionPolicy;

use crate::harness::{F32_TOLERANCE, Report, conversations, must_match};

/// A pool of `pool_tokens` slots in pages of `page_size`, 8 running requests, prompts computed
/// in chunks of 32 tokens, the radix cache under `policy`.
pub fn tight(page_size: usize, pool_tokens: usize, policy: EvictionPolicy) -> ServeConfig {
    ServeConfig {
        page_size,
        pool_tokens,
        max_running: 8,
        max_context: 256,
        chunk_size: 32,
        prefix_cache: Some(policy),
        ..ServeConfig::default()
    }
}

/// What every run of the shared workload must have gone through (a chunked prompt unless the
/// prompts are computed on a prefill node).
fn assert_exercised(report: &Report, what: &str) {
    let stats = &report.stats;
    assert_eq!(
        stats.finished, 36,
        "{what}: every request finished: {stats:?}"
    );
    assert_eq!(report.ended_early, 0, "{what}");
    assert!(
        stats.prefix_hit_tokens > 0,
        "{what}: the radix cache hit: {stats:?}"
    );
    assert!(
        stats.evicted_tokens > 0,
        "{what}: the prefix cache evicted: {stats:?}"
    );
    assert!(
        stats.retractions > 0,
        "{what}: a request was retracted: {stats:?}"
    );
    assert!(
        report.chunk_rows > 0 || stats.transfers > 0,
        "{what}: a prompt was chunked: {stats:?}"
    );
    eprintln!(
        "{what}: {} steps, {} rows checked (max difference {:e}), {} prefix-hit tokens, {} \
         evicted, {} retractions, {} of {} drafts accepted, {} transfers",
        stats.steps,
        report.rows_checked,
        report.max_difference,
        stats.prefix_hit_tokens,
        stats.evicted_tokens,
        stats.retractions,
        stats.spec_accepted,
        stats.spec_drafted,
        stats.transfers
    );
}

#[test]
fn every_eviction_policy_with_pages_of_16() {
    for policy in EvictionPolicy::ALL {
        let report = must_match(tight(16, 224, policy), conversations(1), F32_TOLERANCE);
        assert_exercised(&report, &format!("page 16, {policy}"));
    }
}

#[test]
fn every_eviction_policy_with_pages_of_1() {
    for policy in EvictionPolicy::ALL {
        let report = must_match(tight(1, 300, policy), conversations(2), F32_TOLERANCE);
        assert_exercised(&report, &format!("page 1, {policy}"));
    }
}

#[test]
fn speculative_decoding_with_prompt_lookup_drafts() {
    let config = ServeConfig {
        spec: Some(SpecConfig {
            draft: Draft::Ngram,
            tokens: 4,
        }),
        ..tight(16, 256, EvictionPolicy::Lru)
    };
    let report = must_match(config, conversations(3), F32_TOLERANCE);
    assert_exercised(&report, "spec, n-gram drafts");
    assert!(report.stats.spec_accepted > 0, "{:?}", report.stats);
}

#[test]
fn speculative_decoding_with_the_model_as_its_own_draft() {
    let config = ServeConfig {
        spec: Some(SpecConfig {
            draft: Draft::Model,
            tokens: 3,
        }),
        ..tight(16, 192, EvictionPolicy::Lru)
    };
    let report = must_match(config, conversations(4), F32_TOLERANCE);
    assert_exercised(&report, "spec, model drafts");
    let stats = &report.stats;
    // The model agrees with its own greedy drafts.
    assert_eq!(stats.spec_accepted, stats.spec_drafted, "{stats:?}");
    assert!(stats.spec_accepted > 0);
}

#[test]
fn disaggregated_prefill_moves_kv_through_the_transfer() {
    let config = ServeConfig {
        disaggregated: true,
        ..tight(16, 256, EvictionPolicy::Lru)
    };
    let report = must_match(config, conversations(5), F32_TOLERANCE);
    assert_exercised(&report, "disaggregated");
    // Every admission's prompt came through the link, re-admissions included.
    assert!(report.stats.transfers >= 36, "{:?}", report.stats);
}

#[test]
fn a_bf16_pool_stays_within_bf16_rounding_of_the_oracle() {
    let config = ServeConfig {
        pool_dtype: KvDtype::Bf16,
        ..tight(16, 256, EvictionPolicy::Lru)
    };
    let report = must_match(config, conversations(6), 0.05);
    assert_exercised(&report, "bf16 pool");
    // Rounding K/V to bf16 is visible: the pool really holds bf16.
    assert!(
        report.max_difference > F32_TOLERANCE,
        "{}",
        report.max_difference
    );
}

#[test]
fn temperature_sampling_reads_the_same_logits() {
    let config = ServeConfig {
        sampling: kvown_candle::Sampling::Temperature {
            temperature: 0.8,
            seed: 11,
        },
        spec: Some(SpecConfig {
            draft: Draft::Ngram,
            tokens: 3,
        }),
        ..tight(16, 256, EvictionPolicy::Lru)
    };
    let report = must_match(config, conversations(7), F32_TOLERANCE);
    assert_exercised(&report, "temperature, spec");
}
