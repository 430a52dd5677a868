//! The host half of a CUDA allocation step: [`AllocPlanner`] validating a batch and building
//! its kernel parameters, with no GPU. A device step's time is this plus the upload and the
//! launch (`examples/kernel_timing.rs` on a GPU), so this is the part a CPU can measure.
//!
//! Batches: 1,024 requests at page 16, each holding its own pages. `decode_new_page`: every
//! request opens a page (seq_len % 16 == 1); `decode_mid_page`: none does (each continues its
//! partial page, so the shared-partial-page check runs for all); `extend_1000`: 1,000 new tokens
//! each on an empty prefix. A plan is not committed, so one planner serves every iteration, as
//! one serves every step of an engine.

use criterion::{Criterion, criterion_group, criterion_main};
use kvown_cuda::AllocPlanner;
use kvown_runtime::alloc::{DecodeShape, ExtendShape, Lifo};

const REQUESTS: usize = 1024;
const PAGE: usize = 16;
const ROW_LEN: usize = 2048;

fn planner() -> AllocPlanner<Lifo> {
    AllocPlanner::new(REQUESTS * ROW_LEN, PAGE, REQUESTS, ROW_LEN).expect("planner")
}

/// Request `i` has stored `stored` tokens, the last one in page `1 + i`.
fn decode_batch(stored: usize) -> Vec<DecodeShape> {
    (0..REQUESTS)
        .map(|i| DecodeShape {
            seq_len: stored + 1,
            last_loc: ((1 + i) * PAGE + (stored - 1) % PAGE) as u32,
        })
        .collect()
}

fn bench(c: &mut Criterion) {
    let rows: Vec<u32> = (0..REQUESTS as u32).collect();
    let mut group = c.benchmark_group("planner_1024_ps16");
    for (name, stored) in [("decode_new_page", 1024), ("decode_mid_page", 1025)] {
        let batch = decode_batch(stored);
        let mut planner = planner();
        group.bench_function(name, |b| {
            b.iter(|| planner.plan_decode(&batch, &rows).expect("valid batch"))
        });
    }
    let extend: Vec<ExtendShape> = (0..REQUESTS)
        .map(|_| ExtendShape {
            prefix_len: 0,
            seq_len: 1000,
            last_loc: None,
        })
        .collect();
    let mut planner = planner();
    group.bench_function("extend_1000", |b| {
        b.iter(|| planner.plan_extend(&extend, &rows).expect("valid batch"))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
