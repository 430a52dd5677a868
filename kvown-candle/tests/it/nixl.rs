//! Disaggregated serving with the K/V moved by NIXL: the chat workload served by a prefill node
//! and a decode node whose K/V goes through two NIXL agents of this process (kvown-nixl's
//! `NixlLoopback`: READs with merged slot runs, notices, the pools staged through registered
//! host memory). Every request's greedy tokens equal a single node's, and every transfer's K/V
//! digest on the decode node equals the prefill node's.
//!
//! Without NIXL's library the test writes "skipped: <reason>" and passes; with
//! `KVOWN_NIXL_REQUIRED=1` (CI) it fails with the reason.

use std::collections::BTreeMap;
use std::io::Write;

use kvown_candle::workload::Conversations;
use kvown_candle::{ServeConfig, ServeStats, Server, TransferLink};
use kvown_nixl::{AgentOptions, LoopbackCounters, NixlLoopback};
use kvown_runtime::kv::{KvDtype, KvPool, KvTensor, TransferError};
use kvown_runtime::radix::EvictionPolicy;

use crate::differential::tight;
use crate::fixture::tiny_model;
use crate::harness::conversations;

/// Whether NIXL can be used here; if not, says so (uncaptured) or, when CI requires it, fails.
fn nixl_or_skip() -> bool {
    let Err(reason) = kvown_nixl::available() else {
        return true;
    };
    if std::env::var("KVOWN_NIXL_REQUIRED").is_ok_and(|v| v == "1") {
        panic!("KVOWN_NIXL_REQUIRED=1, but NIXL is unavailable: {reason}");
    }
    // Straight to stderr: libtest captures only the print macros.
    let _ = writeln!(std::io::stderr(), "skipped: {reason}");
    false
}

/// Serves the chat workload of `seed` on `server` in waves: every opening turn at once, then
/// each wave's follow-ups once it has finished, made in request order (so both runs draw the
/// same user turns whatever order their requests finish in). Returns each request's output by
/// id and the counters, every slot and row of both nodes free again.
fn outputs(mut server: Server, seed: u64) -> (BTreeMap<u64, Vec<u32>>, ServeStats) {
    let mut workload = Conversations::new(conversations(seed));
    let mut wave = workload.opening_turns();
    let mut outputs = BTreeMap::new();
    while !wave.is_empty() {
        for request in wave {
            server.submit(request).expect("the request fits");
        }
        let mut finished = Vec::new();
        while !server.is_idle() {
            finished.extend(server.step().expect("a step").finished);
        }
        finished.sort_by_key(|done| done.rid);
        wave = finished
            .iter()
            .filter_map(|done| workload.follow_up(done))
            .collect();
        for done in finished {
            assert!(!done.aborted, "request {} was aborted", done.rid);
            outputs.insert(done.rid, done.output);
        }
    }
    let stats = server.finish().expect("nothing leaks on either node");
    (outputs, stats)
}

/// A disaggregated server of `config` whose link is a `NixlLoopback`, and the link's counters.
fn over_nixl(config: ServeConfig, name: &str) -> (Server, LoopbackCounters) {
    let mut counters = None;
    let server = Server::with_transfer(tiny_model(), config, |prefill, decode| {
        let name = format!("kvown-candle-{name}-{}", std::process::id());
        let link = NixlLoopback::new(
            Box::new(prefill),
            Box::new(decode),
            &name,
            &AgentOptions::default(),
        )?;
        counters = Some(link.counters());
        Ok::<TransferLink, TransferError>(Box::new(link))
    })
    .expect("a server over NIXL");
    (server, counters.expect("the link was made"))
}

/// The workload on one node and on two nodes over NIXL, with a pool of `dtype` small enough
/// (176 slots) that running requests are retracted.
fn greedy_tokens_over_nixl_equal_one_node(dtype: KvDtype, name: &str) {
    if !nixl_or_skip() {
        return;
    }
    let seed = 11;
    let config = ServeConfig {
        pool_dtype: dtype,
        check_every_step: true,
        ..tight(16, 176, EvictionPolicy::Lru)
    };
    let server = Server::new(tiny_model(), config.clone()).expect("a single node");
    let (expected, single) = outputs(server, seed);
    let (server, counters) = over_nixl(
        ServeConfig {
            disaggregated: true,
            ..config
        },
        name,
    );
    let (got, stats) = outputs(server, seed);
    assert_eq!(single.transfers, 0);
    assert_eq!(got.len(), expected.len(), "requests finished");
    for (rid, tokens) in &expected {
        assert_eq!(got.get(rid), Some(tokens), "request {rid}'s greedy tokens");
    }
    // Every admitted prompt moved, some in part (the decode node's prefix cache held the
    // rest), and the retracted ones again after their re-prefill (each counted only once its
    // digest matched: a mismatch fails the step).
    assert!(stats.prefix_hit_tokens > 0, "{stats:?}");
    assert!(stats.retractions > 0, "{stats:?}");
    assert!(stats.transfers > expected.len() as u64, "{stats:?}");
    assert!(stats.transferred_tokens > 0);
    let nixl = counters.get();
    let model = tiny_model();
    let layers = model.config().num_hidden_layers;
    let layout = *model.new_pool(16, 16, dtype).expect("a pool").layout();
    let slot_bytes =
        (layout.row_len(KvTensor::K) + layout.row_len(KvTensor::V)) * layers * dtype.size_bytes();
    assert_eq!(
        (nixl.link.completed, nixl.link.failed),
        (stats.transfers, 0)
    );
    assert_eq!(nixl.notices, stats.transfers, "one notice per READ");
    assert_eq!(
        nixl.link.bytes,
        stats.transferred_tokens * slot_bytes as u64
    );
    assert_eq!(nixl.staged_bytes, 2 * nixl.link.bytes);
    // Runs merged: far fewer descriptors than one per slot, layer and tensor.
    let one_per_slot = stats.transferred_tokens * 2 * layers as u64;
    assert!(
        nixl.link.descriptors > 0 && 4 * nixl.link.descriptors < one_per_slot,
        "{} descriptors for {} positions",
        nixl.link.descriptors,
        stats.transferred_tokens
    );
}

#[test]
fn greedy_tokens_over_nixl_equal_one_node_f32() {
    greedy_tokens_over_nixl_equal_one_node(KvDtype::F32, "f32");
}

#[test]
fn greedy_tokens_over_nixl_equal_one_node_bf16() {
    greedy_tokens_over_nixl_equal_one_node(KvDtype::Bf16, "bf16");
}
