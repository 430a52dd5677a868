//! kvown-nixl's integration tests: two processes on loopback moving K/V through NIXL, the
//! faults a pair of nodes must survive, and two agents of one process (`NixlLoopback`). The binary is also the peer process of those tests
//! (`peer`), so it runs libtest's interface through `libtest-mimic` (`harness = false`).
//!
//! Without NIXL's library the tests are reported ignored, with the reason; with
//! `KVOWN_NIXL_REQUIRED=1` (CI) they run and fail with it.

mod faults;
mod in_process;
mod loopback;
mod nodes;
mod peer;

use libtest_mimic::{Arguments, Failed, Trial};

/// A test: `Err` with what went wrong.
type Test = fn() -> Result<(), String>;

/// Every test, by name.
const TESTS: &[(&str, Test)] = &[
    (
        "loopback::merged_runs_move_every_byte_and_decode_as_one_node",
        loopback::merged_runs_move_every_byte_and_decode_as_one_node,
    ),
    (
        "loopback::one_descriptor_per_slot_moves_the_same_bytes",
        loopback::one_descriptor_per_slot_moves_the_same_bytes,
    ),
    (
        "loopback::a_prompt_cached_whole_on_the_decode_node_moves_nothing_and_frees_the_source",
        loopback::a_prompt_cached_whole_on_the_decode_node_moves_nothing_and_frees_the_source,
    ),
    (
        "in_process::rows_staged_through_two_agents_arrive_whole",
        in_process::rows_staged_through_two_agents_arrive_whole,
    ),
    (
        "in_process::a_refused_submit_posts_nothing",
        in_process::a_refused_submit_posts_nothing,
    ),
    (
        "faults::decode_killed_mid_transfer_leaves_the_prefill_node_whole",
        faults::decode_killed_mid_transfer_leaves_the_prefill_node_whole,
    ),
    (
        "faults::prefill_killed_after_preallocation_cancels_on_the_decode_node",
        faults::prefill_killed_after_preallocation_cancels_on_the_decode_node,
    ),
    (
        "faults::decode_out_of_slots_waits_or_rejects",
        faults::decode_out_of_slots_waits_or_rejects,
    ),
    (
        "faults::unknown_or_stale_metadata_is_refused_and_a_restarted_peer_reloaded",
        faults::unknown_or_stale_metadata_is_refused_and_a_restarted_peer_reloaded,
    ),
    (
        "faults::a_transfer_that_never_completes_times_out_and_is_cancelled",
        faults::a_transfer_that_never_completes_times_out_and_is_cancelled,
    ),
];

/// A name unique to this process for an agent of `test`.
pub fn agent_name(test: &str, role: &str) -> String {
    format!("{test}-{role}-{}", std::process::id())
}

fn main() {
    if let Some(code) = peer::run_if_peer() {
        std::process::exit(code);
    }
    let args = Arguments::from_args();
    let required = std::env::var("KVOWN_NIXL_REQUIRED").is_ok_and(|v| v == "1");
    let unavailable = kvown_nixl::available().err();
    if let (Some(reason), false) = (&unavailable, required) {
        eprintln!("kvown-nixl: tests ignored: {reason}");
    }
    let trials = TESTS
        .iter()
        .map(|&(name, test)| {
            Trial::test(name, move || test().map_err(Failed::from))
                .with_ignored_flag(unavailable.is_some() && !required)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}
