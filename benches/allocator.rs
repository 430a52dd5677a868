//! Criterion benches of the allocator workloads (`benches/README.md` defines them; the
//! workloads live in `benches/workloads/`, shared with `examples/bench.rs`).

#[path = "workloads/mod.rs"]
mod workloads;

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};

use kvown::radix::EvictionPolicy;
use workloads::{DecodeLoop, EvictionChurn, ExtendBatch, PoolChurn, WideDecode};

fn pool_churn(c: &mut Criterion) {
    let mut group = c.benchmark_group("W1_pool_churn");
    for pages in [1, 32, 1024] {
        let mut churn = PoolChurn::new(pages);
        group.throughput(Throughput::Elements(pages as u64));
        group.bench_function(format!("k{pages}"), |b| {
            b.iter(|| black_box(&mut churn).cycle())
        });
        group.bench_function(format!("page_ids_k{pages}"), |b| {
            b.iter(|| black_box(&mut churn).cycle_page_ids())
        });
    }
    group.finish();
    let bytes = PoolChurn::new(1).bookkeeping_bytes_per_page();
    println!("W1: allocator bookkeeping {bytes:.2} bytes per page");
}

fn decode_step(c: &mut Criterion) {
    let mut group = c.benchmark_group("W2_decode_step");
    for (name, radix) in [("W2", false), ("W2c", true)] {
        let mut decode = DecodeLoop::new(radix);
        for _ in 0..2000 {
            decode.step();
        }
        group.bench_function(name, |b| b.iter(|| black_box(&mut decode).step()));
        if let Err(violation) = decode.check() {
            panic!("{name}: invariant violated after the run: {violation}");
        }
        if let Some(bytes) = decode.radix_bytes_per_cached_page() {
            println!("{name}: radix bookkeeping {bytes:.2} bytes per cached page");
        }
    }
    // W2e: W2c with the cache's events on, drained every step.
    let mut decode = DecodeLoop::with_events();
    for _ in 0..2000 {
        decode.step_draining_events();
    }
    group.bench_function("W2e", |b| {
        b.iter(|| black_box(&mut decode).step_draining_events())
    });
    if let Err(violation) = decode.check() {
        panic!("W2e: invariant violated after the run: {violation}");
    }
    group.finish();
}

/// The CUDA path's host share: W2 and W2c on the staged allocator (its device left out), and a
/// 1,024-request decode step on the host allocator and on the staged one.
fn staging(c: &mut Criterion) {
    let mut group = c.benchmark_group("staging");
    for (name, radix) in [("W2_staged", false), ("W2c_staged", true)] {
        let mut decode = DecodeLoop::staged(radix);
        for _ in 0..2000 {
            decode.step();
        }
        group.bench_function(name, |b| b.iter(|| black_box(&mut decode).step()));
        if let Err(violation) = decode.check() {
            panic!("{name}: invariant violated after the run: {violation}");
        }
    }
    group.bench_function("decode_1024", |b| {
        b.iter_custom(|steps| WideDecode::new().time_steps(steps))
    });
    group.bench_function("decode_1024_staged", |b| {
        b.iter_custom(|steps| WideDecode::staged().time_steps(steps))
    });
    group.finish();
}

/// E1: one admission, insert and eviction of about a page in a full radix cache, per policy.
fn eviction(c: &mut Criterion) {
    let mut group = c.benchmark_group("E1_eviction");
    for policy in EvictionPolicy::ALL {
        let mut churn = EvictionChurn::new(policy);
        group.bench_function(policy.name(), |b| b.iter(|| black_box(&mut churn).cycle()));
        if let Err(problem) = churn.check() {
            panic!("E1_{policy}: inconsistent after the run: {problem}");
        }
    }
    group.finish();
}

/// The invariant checker and `reclaim_leaks` (nothing to reclaim) on W2c's state after 2,000
/// steps: 256 running requests, about 33,000 pages, the prefix cache full.
fn checker(c: &mut Criterion) {
    let mut group = c.benchmark_group("checker");
    let mut decode = DecodeLoop::new(true);
    for _ in 0..2000 {
        decode.step();
    }
    group.bench_function("check_W2c", |b| {
        b.iter(|| black_box(&decode).check().expect("W2c's state passes"))
    });
    group.bench_function("reclaim_W2c", |b| {
        b.iter(|| {
            black_box(&mut decode)
                .reclaim_nothing()
                .expect("W2c leaks nothing")
        })
    });
    group.finish();
}

fn extend(c: &mut Criterion) {
    let mut group = c.benchmark_group("W3_extend");
    for (name, radix) in [("batch64", false), ("batch64_prefix_cache", true)] {
        let mut extend = ExtendBatch::new(radix);
        group.throughput(Throughput::Elements(ExtendBatch::tokens() as u64));
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let mut measured = Duration::ZERO;
                for _ in 0..iters {
                    let reqs = extend.fresh_reqs();
                    let start = Instant::now();
                    let batch = extend.extend(black_box(reqs));
                    measured += start.elapsed();
                    extend.release(batch);
                }
                measured
            })
        });
    }
    group.finish();
}

criterion_group!(
    benches,
    pool_churn,
    decode_step,
    staging,
    checker,
    extend,
    eviction
);
criterion_main!(benches);
