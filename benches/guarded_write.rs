//! Zero cost of `#[guarded]`: the same write loop over a guarded field (through the owner's
//! capability) and over a plain field. The ratio of the two times should be ~1.00; the assembly
//! comparison is `scripts/asm-check.sh`.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};

#[path = "workloads/guarded.rs"]
#[allow(dead_code)] // the checksum helper serves the bench example
mod guarded;
use guarded::{guarded_batch, guarded_write_loop, plain_batch, plain_write_loop};

const ROUNDS: usize = 16;

fn guarded_vs_plain(c: &mut Criterion) {
    let mut group = c.benchmark_group("guarded_vs_plain");
    for len in [256usize, 4096] {
        group.throughput(Throughput::Elements((len * ROUNDS) as u64));
        let mut guarded = guarded_batch(len);
        group.bench_with_input(BenchmarkId::new("guarded", len), &len, |b, _| {
            b.iter(|| guarded_write_loop(black_box(&mut guarded), black_box(ROUNDS)))
        });
        let mut plain = plain_batch(len);
        group.bench_with_input(BenchmarkId::new("plain", len), &len, |b, _| {
            b.iter(|| plain_write_loop(black_box(&mut plain), black_box(ROUNDS)))
        });
    }
    group.finish();
}

criterion_group!(benches, guarded_vs_plain);
criterion_main!(benches);
