//! The zero-cost workload: the same write loop over a guarded field and over a plain field.
//!
//! [`guarded_write_loop`] writes `BenchReq::kv_committed_len` through its owner's capability
//! (`set_kv_committed_len(owner, ..)`), [`plain_write_loop`] writes `PlainReq::kv_committed_len`
//! directly. The two structs have the same layout, so in a release build the two functions
//! compile to the same machine code: `benches/guarded_write.rs` and the `guarded_vs_plain` row of
//! `examples/bench.rs` measure the ratio, and `scripts/asm-check.sh` compares the assembly of the
//! bench example. Both are `#[inline(never)]` so they exist as symbols and a caller cannot
//! specialise one of them. It lives with the benchmarks, not in the library, so that `BenchReq`
//! does not register in the audit table of every program that links kvown.
//!
//! Recorded (rustc 1.95.0, x86_64 Linux, 2 cores shared, release profile):
//! `scripts/asm-check.sh` finds `guarded_write_loop` emitted as an alias of `plain_write_loop`
//! (LLVM merged the two: identical code). `cargo bench --bench guarded_write` (16 rounds):
//! 256 requests 1.816 µs guarded vs 1.861 µs plain (ratio 0.98), 4096 requests 31.59 µs vs
//! 33.25 µs (0.95): one function measured twice, so the ratio is noise around 1.00.

/// A request whose committed length only [`guarded_write_loop`] may write.
#[kvown::guarded]
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BenchReq {
    #[owned_by(guarded_write_loop)]
    kv_committed_len: usize,
    /// Request id, mixed into the written value so the loop cannot be folded away.
    pub rid: usize,
}

/// The unguarded twin of [`BenchReq`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PlainReq {
    /// Written directly.
    pub kv_committed_len: usize,
    /// Request id.
    pub rid: usize,
}

/// `len` guarded requests with ids `0..len`.
pub fn guarded_batch(len: usize) -> Vec<BenchReq> {
    (0..len)
        .map(|rid| {
            BenchReq::from(BenchReqInit {
                kv_committed_len: 0,
                rid,
            })
        })
        .collect()
}

/// `len` plain requests with ids `0..len`.
pub fn plain_batch(len: usize) -> Vec<PlainReq> {
    (0..len)
        .map(|rid| PlainReq {
            kv_committed_len: 0,
            rid,
        })
        .collect()
}

/// `rounds` passes over `reqs`, each writing every committed length through the capability.
#[kvown::owner]
#[inline(never)]
pub fn guarded_write_loop(reqs: &mut [BenchReq], rounds: usize) {
    for round in 0..rounds {
        for req in reqs.iter_mut() {
            let next = step(req.kv_committed_len(), round, req.rid);
            req.set_kv_committed_len(owner, next);
        }
    }
}

/// The same loop as [`guarded_write_loop`], writing the plain field.
#[inline(never)]
pub fn plain_write_loop(reqs: &mut [PlainReq], rounds: usize) {
    for round in 0..rounds {
        for req in reqs.iter_mut() {
            let next = step(req.kv_committed_len, round, req.rid);
            req.kv_committed_len = next;
        }
    }
}

/// A non-linear update, so the compiler cannot replace the rounds by a closed form.
#[inline(always)]
fn step(len: usize, round: usize, rid: usize) -> usize {
    len.wrapping_mul(31).wrapping_add(round ^ rid)
}

/// Runs both loops on fresh batches of `len` requests for `rounds` rounds and returns the sums of
/// the committed lengths (guarded, plain), which are equal: a check that both do the same work.
pub fn guarded_vs_plain_checksums(len: usize, rounds: usize) -> (usize, usize) {
    let mut guarded = guarded_batch(len);
    let mut plain = plain_batch(len);
    guarded_write_loop(&mut guarded, rounds);
    plain_write_loop(&mut plain, rounds);
    let sum = |it: &mut dyn Iterator<Item = usize>| it.fold(0usize, usize::wrapping_add);
    (
        sum(&mut guarded.iter().map(BenchReq::kv_committed_len)),
        sum(&mut plain.iter().map(|r| r.kv_committed_len)),
    )
}
