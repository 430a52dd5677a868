//! The device mirror under the real batch flow: a `KvCache<MirroredAllocator<_>>` whose device
//! half is the `alloc.cu` kernels compiled as host C++ (and the GPU, where one works), driven by
//! seeded random steps: admission with shared prefixes, re-admission and chunked prefill
//! (`init_next_round_input`, `prepare_for_extend` / `alloc_for_extend`, `cache_unfinished_req`),
//! plain or speculative decode (`check_decode_mem` with `retract_decode`, or unchecked so that it
//! runs out of memory), finish, abort, grouped release, eviction, and requests dropped without
//! their release and reclaimed (`reclaim_leaks`), with the prefix cache on and off, over
//! page sizes 1 (both reuse orders), 16 and 64.
//!
//! After every step the device free list, the device row of every request holding KV and the
//! last device `out_cache_loc` must equal the host's, and the invariant checker must pass; a
//! refused allocation must leave the host and the whole device table exactly as they were.

use kvown_cuda::{CudaError, DeviceAllocOps, MirrorError, MirroredAllocator};
use kvown_runtime::alloc::{
    DecodeShape, ExtendShape, KvAllocator, KvSlot, Lifo, PageAllocator, PageId, PagedAllocator,
    ReuseOrder, TokenAllocator,
};
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, check_decode_mem,
    commit_spec_tokens, prepare_for_decode, prepare_for_extend, prepare_for_spec_decode,
    release_kv_cache, retract_decode,
};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::error::KvError;
use kvown_runtime::radix::{RadixCache, TreePos};
use kvown_runtime::reclaim::reclaim_leaks;
use kvown_runtime::request::Req;
use kvown_runtime::slots::ReqToTokenPool;
use kvown_runtime::tree_cache::{cache_unfinished_req, init_next_round_input};

use super::{EmulatedAllocator, MakeDevice, OnGpu, OnHost, Rng, device};

/// Request rows of the table (row 0, padding, comes on top).
const ROWS: usize = 8;
/// Positions per request row.
const WIDTH: usize = 192;

/// One scenario: the pool, the reuse order, the prefix cache, plain or speculative decode.
#[derive(Debug, Clone, Copy)]
struct Cfg {
    page_size: usize,
    pages: usize,
    /// Page size 1 only: the FIFO token allocator instead of the LIFO paged one.
    fifo: bool,
    radix: bool,
    /// Slots reserved ahead per speculative step; `None` for plain decode.
    spec_reserve: Option<usize>,
    /// Longest extend per request per step (chunked prefill).
    chunk: usize,
    seed: u64,
}

/// What a run did, to show that every path was taken.
#[derive(Debug, Default)]
struct Counts {
    extends: usize,
    chunks_cached: usize,
    prefix_hits: usize,
    decodes: usize,
    refused: usize,
    retracted: usize,
    released: usize,
    groups: usize,
    evicted: usize,
    reclaimed: usize,
}

/// Everything a refused allocation must leave as it was, on both sides.
#[derive(Debug, PartialEq)]
struct Snapshot<R: ReuseOrder> {
    host: PageAllocator<R>,
    host_table: ReqToTokenPool,
    device_free: Vec<PageId>,
    device_table: Vec<Vec<KvSlot>>,
    device_out: Option<Vec<KvSlot>>,
}

struct Sim<D: DeviceAllocOps> {
    cfg: Cfg,
    rng: Rng,
    cache: KvCache<MirroredAllocator<D>>,
    running: ScheduleBatch,
    /// Chunked prefills between chunks (they hold KV).
    chunking: Vec<Req>,
    /// Retracted or refused requests (they hold nothing).
    waiting: Vec<Req>,
    next_rid: u64,
    /// The host's slots of the last allocation, in `out_cache_loc` order.
    host_out: Option<Vec<KvSlot>>,
    counts: Counts,
}

impl<D: DeviceAllocOps> Sim<D> {
    fn new(cfg: Cfg, host: PageAllocator<D::Order>, half: D) -> Self {
        let table = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
        let mirror = MirroredAllocator::new(host, half, &table).unwrap();
        let tree = if cfg.radix {
            TreeCache::Radix(RadixCache::new(cfg.page_size))
        } else {
            TreeCache::Disabled
        };
        Sim {
            cfg,
            rng: Rng(cfg.seed),
            cache: KvCache::new(mirror, table, tree).unwrap(),
            running: ScheduleBatch::new(Vec::new()),
            chunking: Vec::new(),
            waiting: Vec::new(),
            next_rid: 1,
            host_out: None,
            counts: Counts::default(),
        }
    }

    fn device(&self) -> &D {
        self.cache.allocator().device()
    }

    /// The checker, then the device against the host: free list, the rows of `extra` and of
    /// every request holding KV up to their allocated length, the last `out_cache_loc`.
    fn compare(&self, extra: &[Req], what: &str) {
        let held = || {
            self.running
                .reqs()
                .iter()
                .chain(&self.chunking)
                .chain(extra)
        };
        if let Err(violation) = self.cache.check(held()) {
            panic!("{what}: invariant broken: {violation}");
        }
        let mirror = self.cache.allocator();
        let rows = held().filter_map(|req| {
            let row = req.kv().req_pool_idx()?;
            Some((row, req.kv().kv_allocated_len()))
        });
        if let Err(divergence) = mirror.verify(self.cache.req_to_token(), rows) {
            panic!("{what}: {divergence}");
        }
        let device_out = mirror
            .last_out_cache_loc()
            .map(|slots| self.device().slots_to_host(slots).unwrap());
        assert_eq!(device_out, self.host_out, "{what}: out_cache_loc");
    }

    fn snapshot(&self) -> Snapshot<D::Order> {
        let mirror = self.cache.allocator();
        Snapshot {
            host: mirror.host().clone(),
            host_table: self.cache.req_to_token().clone(),
            device_free: self.device().free_list().unwrap(),
            device_table: (0..=ROWS)
                .map(|row| self.device().read_row(row as u32, WIDTH).unwrap())
                .collect(),
            device_out: mirror
                .last_out_cache_loc()
                .map(|slots| self.device().slots_to_host(slots).unwrap()),
        }
    }

    /// A new request: a prefix shared within one of three families, then its own tokens;
    /// `len` gives an unshared prompt of that length instead.
    fn new_req(&mut self, len: Option<usize>) -> Req {
        let rid = self.next_rid;
        self.next_rid += 1;
        let own = |count: usize| (0..count as u32).map(move |i| 100_000 * rid as u32 + i);
        let tokens = match len {
            Some(len) => own(len).collect(),
            None => {
                let family = self.rng.below(3) as u32;
                let shared = [0, 8, 40, 70][self.rng.below(4)];
                let suffix = 1 + self.rng.below(40);
                (0..shared as u32)
                    .map(|i| 1000 * family + i)
                    .chain(own(suffix))
                    .collect()
            }
        };
        Req::new(rid, tokens)
    }

    /// The token a request samples next (identical prompts continue identically, so finished
    /// requests insert duplicates into the prefix cache).
    fn sample(req: &mut Req) {
        let position = req.fill_ids().len() as u32;
        req.push_output(500 + position % 7);
    }

    /// An extend batch of continuing chunks, re-admitted and new requests, with no admission
    /// control, so that it sometimes runs out of pages or rows.
    fn admit(&mut self) {
        let mut reqs = Vec::new();
        if self.rng.chance(70) {
            reqs.append(&mut self.chunking);
        }
        let readmit = self.rng.below(3).min(self.waiting.len());
        reqs.extend(self.waiting.drain(..readmit));
        for _ in 0..self.rng.below(4) {
            let req = self.new_req(None);
            reqs.push(req);
        }
        self.extend(reqs, self.cfg.chunk);
    }

    /// One long prompt, unchunked: usually out of memory, sometimes longer than a row.
    fn oversize(&mut self) {
        let len = WIDTH - 8 + self.rng.below(10);
        let req = self.new_req(Some(len));
        self.extend(vec![req], usize::MAX);
    }

    fn extend(&mut self, mut reqs: Vec<Req>, chunk: usize) {
        if reqs.is_empty() {
            return;
        }
        for req in &mut reqs {
            init_next_round_input(req, &mut self.cache, chunk).unwrap();
            if !req.kv().holds_kv() && req.prefix_len() > 0 {
                self.counts.prefix_hits += 1;
            }
        }
        self.compare(&reqs, "match");
        let before = self.snapshot();
        match alloc_for_extend(
            prepare_for_extend(ScheduleBatch::new(reqs)),
            &mut self.cache,
        ) {
            Ok(batch) => {
                self.counts.extends += 1;
                self.host_out = Some(batch.out_cache_loc().to_vec());
                self.compare(batch.reqs(), "extend");
                for mut req in batch.into_reqs() {
                    if req.kv().kv_committed_len() < req.fill_ids().len() {
                        cache_unfinished_req(&mut req, &mut self.cache).unwrap();
                        self.counts.chunks_cached += 1;
                        self.chunking.push(req);
                    } else {
                        Self::sample(&mut req);
                        self.running.extend_reqs([req]);
                    }
                }
            }
            Err(failure) => {
                self.counts.refused += 1;
                let batch = failure.batch.cancel();
                assert_eq!(
                    self.snapshot(),
                    before,
                    "a refused extend ({}) changes neither host nor device",
                    failure.error
                );
                self.compare(batch.reqs(), "refused extend");
                for mut req in batch.into_reqs() {
                    let too_long = matches!(
                        failure.error,
                        KvError::RowTooShort { rid, .. } if rid == req.rid()
                    );
                    if req.kv().holds_kv() && !too_long {
                        self.chunking.push(req);
                        continue;
                    }
                    if req.kv().holds_kv() || req.last_node() != TreePos::ROOT {
                        release_kv_cache(&mut req, &mut self.cache, false).unwrap();
                    }
                    if !too_long && self.waiting.len() < 6 {
                        self.waiting.push(req);
                    }
                }
            }
        }
    }

    /// Finishes the running requests that the next step could push past their row.
    fn cap_lengths(&mut self) {
        let step = self.cfg.spec_reserve.unwrap_or(1) + self.cfg.page_size;
        let full = self
            .running
            .take_if(|req| req.kv().kv_committed_len() + step > WIDTH);
        for mut req in full {
            self.release(&mut req, true);
        }
    }

    fn decode(&mut self, checked: bool) {
        self.cap_lengths();
        if self.running.is_empty() {
            return;
        }
        let reserve = self.cfg.spec_reserve;
        if checked && !check_decode_mem(self.running.reqs(), &mut self.cache, reserve).unwrap() {
            let outcome = retract_decode(&mut self.running, &mut self.cache, reserve).unwrap();
            self.counts.retracted += outcome.retracted.len();
            for req in outcome.retracted {
                if self.waiting.len() < 6 {
                    self.waiting.push(req);
                }
            }
            self.compare(&[], "retract");
            if self.running.is_empty() {
                return;
            }
        }
        let before = self.snapshot();
        let old_lens: Vec<usize> = self
            .running
            .reqs()
            .iter()
            .map(|req| req.kv().kv_allocated_len())
            .collect();
        let running = std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new()));
        let result = match reserve {
            None => alloc_for_decode(
                prepare_for_decode(running, &self.cache).unwrap(),
                &mut self.cache,
            )
            .map_err(|failure| (failure.error, failure.batch.cancel())),
            Some(reserve) => alloc_for_spec_decode(
                prepare_for_spec_decode(running, &self.cache, reserve).unwrap(),
                &mut self.cache,
            )
            .map_err(|failure| (failure.error, failure.batch.cancel())),
        };
        match result {
            Err((error, batch)) => {
                self.counts.refused += 1;
                self.running = batch;
                assert_eq!(
                    self.snapshot(),
                    before,
                    "a refused decode ({error}) changes neither host nor device"
                );
            }
            Ok(batch) => {
                self.counts.decodes += 1;
                self.running = batch;
                match reserve {
                    None => {
                        self.host_out = Some(self.running.out_cache_loc().to_vec());
                        self.compare(&[], "decode");
                        for req in self.running.reqs_mut() {
                            Self::sample(req);
                        }
                    }
                    Some(_) => {
                        self.host_out = Some(self.reserved_slots(&old_lens));
                        self.compare(&[], "speculative reserve");
                        self.commit();
                    }
                }
            }
        }
    }

    /// The slots a speculative reservation took, in `out_cache_loc` order: each request's row
    /// from its old allocated length to its new one.
    fn reserved_slots(&self, old_lens: &[usize]) -> Vec<KvSlot> {
        let table = self.cache.req_to_token();
        self.running
            .reqs()
            .iter()
            .zip(old_lens)
            .flat_map(|(req, &old)| {
                let row = table.row(req.kv().req_pool_idx().unwrap()).unwrap();
                row[old..req.kv().kv_allocated_len()].to_vec()
            })
            .collect()
    }

    /// Commits a random accepted run per request (0 to everything reserved).
    fn commit(&mut self) {
        let accepted: Vec<usize> = self
            .running
            .reqs()
            .iter()
            .map(|req| req.kv().kv_allocated_len() - req.kv().kv_committed_len())
            .map(|headroom| self.rng.below(headroom + 1))
            .collect();
        commit_spec_tokens(&mut self.running, &accepted).unwrap();
        for (req, &count) in self.running.reqs_mut().iter_mut().zip(&accepted) {
            for _ in 0..count {
                Self::sample(req);
            }
        }
    }

    fn release(&mut self, req: &mut Req, insert: bool) {
        release_kv_cache(req, &mut self.cache, insert).unwrap();
        self.counts.released += 1;
    }

    fn take_running(&mut self) -> Option<Req> {
        if self.running.is_empty() {
            return None;
        }
        let rid = self.running.reqs()[self.rng.below(self.running.len())].rid();
        self.running.take_if(|req| req.rid() == rid).pop()
    }

    fn finish(&mut self) {
        if let Some(mut req) = self.take_running() {
            self.release(&mut req, true);
        }
    }

    fn abort(&mut self) {
        let req = if self.rng.chance(50) && !self.chunking.is_empty() {
            let index = self.rng.below(self.chunking.len());
            Some(self.chunking.swap_remove(index))
        } else {
            self.take_running()
        };
        if let Some(mut req) = req {
            self.release(&mut req, false);
        }
    }

    /// Releases several running requests as one free group.
    fn finish_group(&mut self) {
        let count = 1 + self.rng.below(3);
        let mut reqs: Vec<Req> = (0..count).filter_map(|_| self.take_running()).collect();
        if reqs.is_empty() {
            return;
        }
        self.cache.free_group_begin().unwrap();
        for req in &mut reqs {
            self.release(req, true);
        }
        self.cache.free_group_end().unwrap();
        self.counts.groups += 1;
    }

    /// Drops a running request without its release, as a server that lost it would, and
    /// reclaims what it held: the device follows the host's free of its pages.
    fn drop_and_reclaim(&mut self) {
        let Some(req) = self.take_running() else {
            return;
        };
        drop(req);
        let live = self
            .running
            .reqs_mut()
            .iter_mut()
            .chain(&mut self.chunking)
            .chain(&mut self.waiting);
        let reclaimed = reclaim_leaks(&mut self.cache, live).unwrap();
        assert_eq!(reclaimed.rows.len(), 1, "{reclaimed}");
        self.counts.reclaimed += reclaimed.pages.len();
    }

    fn evict(&mut self) {
        let tokens = self.rng.below(self.cache.allocator().capacity());
        self.counts.evicted += self.cache.evict_shortfall(tokens).unwrap();
    }

    fn step(&mut self) {
        match self.rng.below(20) {
            0..=5 => self.admit(),
            6..=12 => {
                let checked = self.rng.chance(80);
                self.decode(checked);
            }
            13..=14 => self.finish(),
            15 => self.abort(),
            16 => self.finish_group(),
            17 => self.evict(),
            18 => self.oversize(),
            _ => self.drop_and_reclaim(),
        }
    }

    fn run(mut self, steps: usize) -> Counts {
        self.compare(&[], "start");
        for step in 0..steps {
            self.step();
            self.compare(&[], &format!("{:?} step {step}", self.cfg));
        }
        while let Some(mut req) = self.take_running() {
            self.release(&mut req, true);
        }
        while let Some(mut req) = self.chunking.pop() {
            self.release(&mut req, false);
        }
        let capacity = self.cache.allocator().capacity();
        self.cache.evict_shortfall(capacity).unwrap();
        self.compare(&[], "drained");
        assert_eq!(self.cache.available_size(), capacity, "every page is back");
        self.counts
    }
}

/// Every scenario: page sizes 1 (LIFO and FIFO), 16 and 64, prefix cache on and off, plain and
/// speculative decode.
fn scenarios(halves: &impl MakeDevice, seeds: std::ops::RangeInclusive<u64>, steps: usize) {
    let mut total = Counts::default();
    for seed in seeds {
        for (page_size, pages, fifo) in [
            (1, 360, false),
            (1, 360, true),
            (16, 26, false),
            (64, 8, false),
        ] {
            for radix in [true, false] {
                for spec_reserve in [None, Some(6)] {
                    let cfg = Cfg {
                        page_size,
                        pages,
                        fifo,
                        radix,
                        spec_reserve,
                        chunk: [64, 24, 200][seed as usize % 3],
                        seed: seed * 1_000 + page_size as u64,
                    };
                    let Some(counts) = run_scenario(halves, cfg, steps) else {
                        return;
                    };
                    println!("{cfg:?}: {counts:?}");
                    total.extends += counts.extends;
                    total.chunks_cached += counts.chunks_cached;
                    total.prefix_hits += counts.prefix_hits;
                    total.decodes += counts.decodes;
                    total.refused += counts.refused;
                    total.retracted += counts.retracted;
                    total.groups += counts.groups;
                    total.evicted += counts.evicted;
                    total.reclaimed += counts.reclaimed;
                }
            }
        }
    }
    println!("total: {total:?}");
    for (path, count) in [
        ("extends", total.extends),
        ("cached chunks", total.chunks_cached),
        ("prefix hits", total.prefix_hits),
        ("decodes", total.decodes),
        ("refused allocations", total.refused),
        ("retractions", total.retracted),
        ("free groups", total.groups),
        ("evictions", total.evicted),
        ("reclaimed pages", total.reclaimed),
    ] {
        assert!(count > 0, "no {path}: the scenarios miss a path");
    }
}

fn run_scenario(halves: &impl MakeDevice, cfg: Cfg, steps: usize) -> Option<Counts> {
    let size = cfg.pages * cfg.page_size;
    if cfg.fifo {
        let half = halves.make(size, 1, ROWS + 1, WIDTH)?;
        let host = TokenAllocator::new(size, false).unwrap();
        Some(Sim::new(cfg, host, half).run(steps))
    } else {
        let half = halves.make(size, cfg.page_size, ROWS + 1, WIDTH)?;
        let host = PagedAllocator::new(size, cfg.page_size, false).unwrap();
        Some(Sim::new(cfg, host, half).run(steps))
    }
}

#[test]
fn emulated_mirror_follows_the_host_through_the_batch_flow() {
    scenarios(&OnHost, 1..=2, 150);
}

#[test]
fn gpu_mirror_follows_the_host_through_the_batch_flow() {
    let Some(device) = device() else { return };
    scenarios(&OnGpu(device), 1..=3, 200);
}

/// A mirror outside a cache against its host: free lists, the last `out_cache_loc`, and row 1
/// untouched (these calls have no rows).
fn assert_follows<D: DeviceAllocOps>(mirror: &MirroredAllocator<D>, out: &[KvSlot], what: &str) {
    let device = mirror.device();
    let host_free: Vec<PageId> = mirror.host().free_pages().collect();
    assert_eq!(device.free_list().unwrap(), host_free, "{what}: free lists");
    let last = mirror.last_out_cache_loc().expect("an allocation happened");
    assert_eq!(
        device.slots_to_host(last).unwrap(),
        out,
        "{what}: out_cache_loc"
    );
    assert_eq!(
        device.read_row(1, 16).unwrap(),
        [0; 16],
        "{what}: no row is written"
    );
}

/// The calls the batch flow does not make: a plain `alloc` (an extend with no row), an extend
/// and a decode without rows, frees in the host's three orders: segments in row order
/// (unsorted), a free group (sorted at its end) and a plain free (sorted), and an allocation
/// and a free by page ids.
fn rowless_calls_follow_the_host(halves: &impl MakeDevice) {
    let page_size = 4;
    let table = ReqToTokenPool::new(2, 16).unwrap();
    let Some(half) = halves.make::<Lifo>(64, page_size, 3, 16) else {
        return;
    };
    let host = PagedAllocator::new(64, page_size, false).unwrap();
    let mut mirror = MirroredAllocator::new(host, half, &table).unwrap();
    let mut whole = Vec::new();
    mirror.alloc(3 * page_size, &mut whole).unwrap();
    assert_follows(&mirror, &whole, "alloc");
    let mut extended = Vec::new();
    let extend = [0, 0].map(|_| ExtendShape {
        prefix_len: 0,
        seq_len: 6,
        last_loc: None,
    });
    mirror.alloc_extend(&extend, &mut extended).unwrap();
    assert_follows(&mirror, &extended, "alloc_extend");
    let decode = [DecodeShape {
        seq_len: 7,
        last_loc: extended[5],
    }];
    let mut decoded = Vec::new();
    mirror.alloc_decode(&decode, &mut decoded).unwrap();
    assert_follows(&mirror, &decoded, "alloc_decode");
    // The second request's pages, then the first's: not sorted.
    mirror
        .free_segments(&[(&extended[6..], 0), (&extended[..6], 0)])
        .unwrap();
    assert_follows(&mirror, &decoded, "free_segments");
    mirror.free_group_begin().unwrap();
    mirror.free(&whole[8..]).unwrap();
    mirror.free(&whole[..4]).unwrap();
    mirror.free_group_end().unwrap();
    assert_follows(&mirror, &decoded, "free group");
    mirror.free(&whole[4..8]).unwrap();
    assert_follows(&mirror, &decoded, "free");
    // Page ids: the provided method allocates through `alloc`, which the mirror follows.
    let mut pages = Vec::new();
    mirror.alloc_page_ids(2, &mut pages).unwrap();
    let slots: Vec<KvSlot> = pages
        .iter()
        .flat_map(|&page| page * page_size as KvSlot..(page + 1) * page_size as KvSlot)
        .collect();
    assert_follows(&mirror, &slots, "alloc_page_ids");
    mirror.free_page_ids(&pages).unwrap();
    assert_follows(&mirror, &slots, "free_page_ids");
    assert_eq!(mirror.available_size(), 64);
}

#[test]
fn emulated_rowless_calls_follow_the_host() {
    rowless_calls_follow_the_host(&OnHost);
}

#[test]
fn gpu_rowless_calls_follow_the_host() {
    let Some(device) = device() else { return };
    rowless_calls_follow_the_host(&OnGpu(device));
}

/// A mirror is refused, with the reason, where the device half could not follow the host.
#[test]
fn mirror_refuses_what_it_cannot_follow() {
    let table = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
    let half = || OnHost.make::<Lifo>(64, 4, ROWS + 1, WIDTH);
    let Some(fresh) = half() else { return };
    let need_sort = PagedAllocator::new(64, 4, true).unwrap();
    assert!(matches!(
        MirroredAllocator::new(need_sort, fresh, &table),
        Err(MirrorError::NeedSort)
    ));

    let mut used = PagedAllocator::new(64, 4, false).unwrap();
    used.alloc(4, &mut Vec::new()).unwrap();
    assert!(matches!(
        MirroredAllocator::new(used, half().unwrap(), &table),
        Err(MirrorError::HostInUse {
            free_pages: 15,
            num_pages: 16,
            in_free_group: false
        })
    ));

    let other_pages = PagedAllocator::new(64, 16, false).unwrap();
    assert!(matches!(
        MirroredAllocator::new(other_pages, half().unwrap(), &table),
        Err(MirrorError::PoolMismatch {
            host_page_size: 16,
            device_page_size: 4,
            ..
        })
    ));

    let wider = ReqToTokenPool::new(ROWS, WIDTH + 1).unwrap();
    let host = || PagedAllocator::new(64, 4, false).unwrap();
    assert!(matches!(
        MirroredAllocator::new(host(), half().unwrap(), &wider),
        Err(MirrorError::TableTooSmall {
            rows: 9,
            row_len: 193,
            ..
        })
    ));

    let mut busy = half().unwrap();
    let shape = ExtendShape {
        prefix_len: 0,
        seq_len: 4,
        last_loc: None,
    };
    DeviceAllocOps::alloc_extend(&mut busy, &[shape], &[kvown_cuda::NO_ROW]).unwrap();
    assert!(matches!(
        MirroredAllocator::new(host(), busy, &table),
        Err(MirrorError::DeviceInUse {
            free_pages: 15,
            num_pages: 16
        })
    ));
}

/// A batch whose rows the device table lacks, or that writes past their width, is a caller bug:
/// it panics before the host (or the device) changes (the width was checked only by the device
/// replay, after the host had allocated).
#[test]
fn rows_outside_the_device_table_panic_before_anything_changes() {
    let table = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
    let Some(half) = OnHost.make::<Lifo>(1024, 4, ROWS + 1, WIDTH) else {
        return;
    };
    let host = PagedAllocator::new(1024, 4, false).unwrap();
    let mut mirror = MirroredAllocator::new(host, half, &table).unwrap();
    let shape = |seq_len| ExtendShape {
        prefix_len: 0,
        seq_len,
        last_loc: None,
    };
    let before: Vec<PageId> = mirror.host().free_pages().collect();
    let outside = ROWS + 1;
    for (row, seq_len) in [(outside, 8), (1, WIDTH + 4)] {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            mirror.alloc_extend_rows(&[shape(seq_len)], [row].into_iter(), &mut Vec::new())
        }));
        assert!(result.is_err(), "row {row} up to {seq_len} must be refused");
        assert_eq!(mirror.host().free_pages().collect::<Vec<_>>(), before);
        assert_eq!(mirror.device().available_size(), 1024);
    }
}

/// A mirror on the emulated kernels.
type EmulatedMirror = MirroredAllocator<EmulatedAllocator<Lifo>>;

/// A mirror over 16 pages of 4 slots on the emulated kernels (a table of 2 rows of 16) with 8
/// slots allocated: the mirror, those slots and the host's free list after them (`None` when
/// the emulated kernels cannot be built).
fn mirror_with_two_pages_held() -> Option<(EmulatedMirror, Vec<KvSlot>, Vec<PageId>)> {
    let table = ReqToTokenPool::new(2, 16).unwrap();
    let half = OnHost.make::<Lifo>(64, 4, 3, 16)?;
    let host = PagedAllocator::new(64, 4, false).unwrap();
    let mut mirror = MirroredAllocator::new(host, half, &table).unwrap();
    let mut held = Vec::new();
    mirror.alloc(8, &mut held).unwrap();
    let before = mirror.host().free_pages().collect();
    Some((mirror, held, before))
}

/// The device computes an extend's positions, rounded up to a page, in u32: a rowless extend
/// near u32::MAX is refused before the host allocates (the kernel wrapped and handed out a
/// slot of a page already in use).
#[test]
fn a_rowless_extend_past_the_devices_position_range_panics_before_anything_changes() {
    let Some((mut mirror, held, before)) = mirror_with_two_pages_held() else {
        return;
    };
    let prefix_len = u32::MAX as usize - 1;
    let shape = ExtendShape {
        prefix_len,
        seq_len: prefix_len + 1,
        last_loc: Some(held[1]),
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        mirror.alloc_extend(&[shape], &mut Vec::new())
    }));
    assert!(result.is_err(), "the extend must be refused");
    assert_eq!(mirror.host().free_pages().collect::<Vec<_>>(), before);
    assert_eq!(mirror.device().available_size(), 56);
}

/// An allocation past the device's `u32` positions that the host refuses anyway (it needs more
/// pages than are free) gets the host's error, as from the host alone, not the panic kept for
/// allocations the host would make.
#[test]
fn allocations_the_host_refuses_are_errors_whatever_their_positions() {
    use kvown_runtime::alloc::AllocError;
    let table = ReqToTokenPool::new(2, 16).unwrap();
    let Some(half) = OnHost.make::<Lifo>(64, 4, 3, 16) else {
        return;
    };
    let host = PagedAllocator::new(64, 4, false).unwrap();
    let mut mirror = MirroredAllocator::new(host, half, &table).unwrap();
    let huge = 1 << 40;
    assert!(matches!(
        mirror.alloc(huge, &mut Vec::new()),
        Err(AllocError::OutOfMemory { .. })
    ));
    let shape = ExtendShape {
        prefix_len: 0,
        seq_len: huge,
        last_loc: None,
    };
    assert!(matches!(
        mirror.alloc_extend(&[shape], &mut Vec::new()),
        Err(AllocError::OutOfMemory { .. })
    ));
    // Decodes past u32 positions with a last slot in no held page, or at the wrong offset.
    let decode = |last_loc| DecodeShape {
        seq_len: u32::MAX as usize + 2,
        last_loc,
    };
    assert!(matches!(
        mirror.alloc_decode(&[decode(7)], &mut Vec::new()),
        Err(AllocError::LastLocNotAllocated { .. })
    ));
    let mut held = Vec::new();
    mirror.alloc(4, &mut held).unwrap();
    assert!(matches!(
        mirror.alloc_decode(&[decode(held[0])], &mut Vec::new()),
        Err(AllocError::LastLocMismatch { .. })
    ));
    assert_eq!(mirror.device().available_size(), 60);
    assert_eq!(mirror.host().free_page_count(), 15);
}

/// A rowless decode's position is a `u32` on the device too: a decode to position `u32::MAX`
/// or past it, which the host accepts (it opens a page here), is refused before the host
/// allocates (the device planner refused it after the host had taken the page, so the replay
/// panicked with the two halves apart).
#[test]
fn a_rowless_decode_past_the_devices_position_range_panics_before_anything_changes() {
    let Some((mut mirror, held, before)) = mirror_with_two_pages_held() else {
        return;
    };
    // `seq_len - 1` stored tokens fill whole pages: the new token opens one.
    let shape = DecodeShape {
        seq_len: u32::MAX as usize + 2,
        last_loc: held[3],
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        mirror.alloc_decode(&[shape], &mut Vec::new())
    }));
    let message = result.expect_err("the decode must be refused");
    let message = message
        .downcast_ref::<String>()
        .map(String::as_str)
        .unwrap_or_default();
    assert!(!message.contains("device mirror lost"), "{message}");
    assert_eq!(mirror.host().free_pages().collect::<Vec<_>>(), before);
    assert_eq!(mirror.device().available_size(), 56);
}

/// A device row write or read past a row is refused with the row's bounds, also when its end
/// is past `usize` (it overflowed: a panic in debug builds, a wrapped end that passed the
/// check in release builds).
#[test]
fn device_row_ranges_past_usize_are_refused() {
    let Some(mut half) = OnHost.make::<Lifo>(64, 4, 3, 16) else {
        return;
    };
    for start in [17, usize::MAX] {
        assert!(
            matches!(
                half.write_row(1, start, &[5]),
                Err(CudaError::RowOverflow { row_len: 16, .. })
            ),
            "{start}"
        );
    }
    assert!(matches!(
        half.read_row(1, 17),
        Err(CudaError::RowOverflow { row_len: 16, .. })
    ));
    half.write_row(2, 15, &[7]).unwrap();
    assert_eq!(half.read_row(2, 16).unwrap()[15], 7);
}

/// `verify` reports the first slot where a device row and the host's differ.
#[test]
fn verify_reports_a_row_that_differs() {
    let mut table = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
    let Some(half) = OnHost.make::<Lifo>(64, 4, ROWS + 1, WIDTH) else {
        return;
    };
    let host = PagedAllocator::new(64, 4, false).unwrap();
    let mut mirror = MirroredAllocator::new(host, half, &table).unwrap();
    let row = table.alloc(1).unwrap()[0];
    let shape = ExtendShape {
        prefix_len: 0,
        seq_len: 6,
        last_loc: None,
    };
    let mut out = Vec::new();
    mirror
        .alloc_extend_rows(&[shape], [row].into_iter(), &mut out)
        .unwrap();
    table.write(row, 0, &out).unwrap();
    mirror.verify(&table, [(row, 6)]).unwrap();
    let mut changed = out.clone();
    changed[4] += 1;
    table.write(row, 0, &changed).unwrap();
    assert!(matches!(
        mirror.verify(&table, [(row, 6)]),
        Err(MirrorError::RowDiverged { position: 4, .. })
    ));
}

/// A device half with every page back, but not in the order it handed them out, is refused
/// with the first place where its free list and the host's part (it was accepted: both counts
/// were full, and its next allocation took page 2 where the host took page 1).
#[test]
fn a_device_with_its_pages_back_in_another_order_is_refused() {
    let table = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
    let Some(mut half) = OnHost.make::<Lifo>(64, 4, ROWS + 1, WIDTH) else {
        return;
    };
    let shape = ExtendShape {
        prefix_len: 0,
        seq_len: 8,
        last_loc: None,
    };
    half.alloc_extend(&[shape], &[kvown_cuda::NO_ROW]).unwrap();
    half.free_pages(&[2, 1]).unwrap();
    let host = PagedAllocator::new(64, 4, false).unwrap();
    assert!(matches!(
        MirroredAllocator::new(host, half, &table),
        Err(MirrorError::FreeListDiverged {
            position: 0,
            host: Some(1),
            device: Some(2)
        })
    ));
}
