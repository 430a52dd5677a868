//! The staged mirror under the real batch flow: a `KvCache<_, StagedMirror<_>>` whose
//! link ships each step's packet to the `scatter.cu` kernel compiled as host C++ (and to the
//! GPU, where one works), driven by seeded random steps: admission with shared prefixes,
//! re-admission and chunked prefill (`init_next_round_input`, `prepare_for_extend` /
//! `alloc_for_extend`, `cache_unfinished_req`), plain or speculative decode (`check_decode_mem`
//! with `retract_decode`, or unchecked so that it runs out of memory), finish, abort, grouped
//! release, eviction, and requests dropped without their release and reclaimed
//! (`reclaim_leaks`), with the prefix cache on and off, over page sizes 1 (both reuse orders),
//! 16 and 64, with decode graphs' fixed layout and without, and with a device that runs behind
//! the host through a ring of two slots.
//!
//! After every step the device row of every request holding KV and the last device
//! `out_cache_loc` must equal the host's, and the invariant checker must pass; a refused
//! allocation must leave the host, the device table and the ring exactly as they were.

use kvown_cuda::staging::{ReadBack, StagingStats, default_slot_words};
use kvown_cuda::{CudaStepLink, StagedMirror, StagingError};
use kvown_runtime::alloc::{
    ExtendShape, KvAllocator, KvSlot, PageAllocator, PagedAllocator, ReuseOrder, SlotCalls,
    TokenAllocator,
};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, check_decode_mem,
    commit_spec_tokens, prepare_for_decode, prepare_for_extend, prepare_for_spec_decode,
    release_kv_cache, retract_decode,
};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{ExtendRow, KvCache, TableMirror, TreeCache, WrittenDecode};
use kvown_runtime::check::reclaim_leaks;
use kvown_runtime::error::KvError;
use kvown_runtime::radix::{RadixCache, RadixConfig, TreePos};
use kvown_runtime::slots::ReqToTokenPool;

use super::emulator::{EmulatedLink, Pace};
use super::{OnGpu, OnHost, Rng, device, or_skip};

/// Request rows of the table (row 0, padding, comes on top).
const ROWS: usize = 8;
/// Positions per request row.
const WIDTH: usize = 192;

/// Builds the links under test: the GPU's, or the emulated kernels at a pace.
trait MakeLink {
    type Link: ReadBack;
    /// A link of `depth` slots of `slot_words` words for a table of `ROWS + 1` rows of
    /// `WIDTH`, laying decode packets of up to `graph` requests out for a graph; `None`, with
    /// a skip notice, where it cannot run.
    fn make(&self, depth: usize, slot_words: usize, graph: Option<usize>) -> Option<Self::Link>;
}

impl MakeLink for OnGpu {
    type Link = CudaStepLink;

    fn make(&self, depth: usize, slot_words: usize, graph: Option<usize>) -> Option<Self::Link> {
        let mut link = CudaStepLink::new(self.0.clone(), depth, slot_words, ROWS + 1, WIDTH)
            .expect("a device link");
        if let Some(batch) = graph {
            link.capture_decode_graphs(batch).expect("decode graphs");
        }
        Some(link)
    }
}

/// The emulated kernels, at a pace.
struct Emulated(Pace);

impl MakeLink for Emulated {
    type Link = EmulatedLink;

    fn make(&self, depth: usize, slot_words: usize, graph: Option<usize>) -> Option<Self::Link> {
        let link = or_skip(EmulatedLink::new(
            depth,
            slot_words,
            (ROWS + 1, WIDTH),
            self.0,
        ))?;
        Some(match graph {
            Some(batch) => link.with_decode_graphs(batch),
            None => link,
        })
    }
}

impl MakeLink for OnHost {
    type Link = EmulatedLink;

    fn make(&self, depth: usize, slot_words: usize, graph: Option<usize>) -> Option<Self::Link> {
        Emulated(Pace::Immediate).make(depth, slot_words, graph)
    }
}

/// One scenario: the pool, the reuse order, the prefix cache, plain or speculative decode, the
/// ring.
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
    /// Ring slots.
    depth: usize,
    /// Decode packets laid out for graphs of this batch.
    graph: Option<usize>,
    /// Compare the device with the host every this many steps (each comparison reads the
    /// device back, which lets a lagging device catch up).
    check_every: usize,
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
    /// Of `refused`, the decode steps (the allocator ran out of pages).
    refused_decodes: usize,
    retracted: usize,
    released: usize,
    groups: usize,
    evicted: usize,
    reclaimed: usize,
    ring_waits: u64,
}

/// Everything a refused allocation must leave as it was.
#[derive(Debug, PartialEq)]
struct Snapshot<R: ReuseOrder> {
    host: PageAllocator<R>,
    host_table: ReqToTokenPool,
    /// `None` in steps that leave the device alone.
    device_table: Option<Vec<Vec<KvSlot>>>,
    device_out: Option<Vec<KvSlot>>,
    stats: StagingStats,
}

struct Sim<R: ReuseOrder, L: ReadBack> {
    cfg: Cfg,
    rng: Rng,
    cache: KvCache<PageAllocator<R>, StagedMirror<L>>,
    running: ScheduleBatch,
    /// Chunked prefills between chunks (they hold KV).
    chunking: Vec<Req>,
    /// Retracted or refused requests (they hold nothing).
    waiting: Vec<Req>,
    next_rid: u64,
    /// The host's slots of the last allocation, in `out_cache_loc` order.
    host_out: Option<Vec<KvSlot>>,
    /// Whether this step reads the device back.
    device_checks: bool,
    counts: Counts,
}

impl<R: ReuseOrder, L: ReadBack> Sim<R, L> {
    fn new(cfg: Cfg, host: PageAllocator<R>, link: L) -> Self {
        let table = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
        let mirror = StagedMirror::new(link, &table, host.capacity()).unwrap();
        let tree = if cfg.radix {
            TreeCache::Radix(RadixCache::new(RadixConfig::new(cfg.page_size)).unwrap())
        } else {
            TreeCache::Disabled
        };
        Sim {
            cfg,
            rng: Rng(cfg.seed),
            cache: KvCache::with_mirror(host, table, tree, mirror).unwrap(),
            running: ScheduleBatch::new(Vec::new()),
            chunking: Vec::new(),
            waiting: Vec::new(),
            next_rid: 1,
            host_out: None,
            device_checks: true,
            counts: Counts::default(),
        }
    }

    /// The checker, then the device against the host: the rows of `extra` and of every
    /// request holding KV up to their allocated length, the last `out_cache_loc`.
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
        if !self.device_checks {
            return;
        }
        let rows = held().filter_map(|req| {
            let row = req.kv().req_pool_idx()?;
            Some((row, req.kv().kv_allocated_len()))
        });
        let mirror = self.cache.mirror();
        let host_out = self.host_out.as_deref();
        if let Err(divergence) = mirror.verify(self.cache.req_to_token(), rows, host_out) {
            panic!("{what}: {divergence}");
        }
    }

    fn snapshot(&self) -> Snapshot<R> {
        let mirror = self.cache.mirror();
        let link = mirror.ring().link();
        Snapshot {
            host: self.cache.allocator().clone(),
            host_table: self.cache.req_to_token().clone(),
            device_table: self.device_checks.then(|| {
                (0..=ROWS)
                    .map(|row| link.read_row(row, WIDTH).unwrap())
                    .collect()
            }),
            device_out: mirror
                .last_out_cache_loc()
                .filter(|_| self.device_checks)
                .map(|out| link.read_out(out.slot, out.len).unwrap()),
            stats: mirror.stats(),
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
                self.counts.refused_decodes += 1;
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
        let mut group = self.cache.free_group().unwrap();
        for req in &mut reqs {
            release_kv_cache(req, &mut group, true).unwrap();
        }
        group.commit();
        self.counts.released += reqs.len();
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
            self.device_checks = step % self.cfg.check_every == 0;
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
        self.device_checks = true;
        self.compare(&[], "drained");
        self.counts.ring_waits = self.cache.mirror().stats().waits;
        assert_eq!(self.cache.available_size(), capacity, "every page is back");
        self.counts
    }
}

/// Every scenario: page sizes 1 (LIFO and FIFO), 16 and 64, prefix cache on and off, plain and
/// speculative decode, rings of 2 to 4 slots with and without decode graphs; the device
/// compared with the host every `check_every` steps. Returns the total counts.
fn scenarios(
    links: &impl MakeLink,
    seeds: std::ops::RangeInclusive<u64>,
    steps: usize,
    check_every: usize,
) -> Counts {
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
                    let ring = [(3, None), (2, Some(ROWS)), (4, Some(ROWS / 2))];
                    let (depth, graph) = ring[(seed as usize + usize::from(radix)) % 3];
                    let cfg = Cfg {
                        page_size,
                        pages,
                        fifo,
                        radix,
                        spec_reserve,
                        chunk: [64, 24, 200][seed as usize % 3],
                        depth,
                        graph,
                        check_every,
                        seed: seed * 1_000 + page_size as u64,
                    };
                    let Some(counts) = run_scenario(links, cfg, steps) else {
                        return total;
                    };
                    println!("{cfg:?}: {counts:?}");
                    total.extends += counts.extends;
                    total.chunks_cached += counts.chunks_cached;
                    total.prefix_hits += counts.prefix_hits;
                    total.decodes += counts.decodes;
                    total.refused += counts.refused;
                    total.refused_decodes += counts.refused_decodes;
                    total.retracted += counts.retracted;
                    total.groups += counts.groups;
                    total.evicted += counts.evicted;
                    total.reclaimed += counts.reclaimed;
                    total.ring_waits += counts.ring_waits;
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
        ("refused decodes", total.refused_decodes),
        ("retractions", total.retracted),
        ("free groups", total.groups),
        ("evictions", total.evicted),
        ("reclaimed pages", total.reclaimed),
    ] {
        assert!(count > 0, "no {path}: the scenarios miss a path");
    }
    total
}

fn run_scenario(links: &impl MakeLink, cfg: Cfg, steps: usize) -> Option<Counts> {
    let size = cfg.pages * cfg.page_size;
    let slot_words = default_slot_words(size, ROWS + 1, cfg.graph.unwrap_or(0));
    let link = links.make(cfg.depth, slot_words, cfg.graph)?;
    Some(if cfg.fifo {
        let host = TokenAllocator::new(size, false).unwrap();
        Sim::new(cfg, host, link).run(steps)
    } else {
        let host = PagedAllocator::new(size, cfg.page_size, false).unwrap();
        Sim::new(cfg, host, link).run(steps)
    })
}

#[test]
fn emulated_device_follows_the_host_through_the_batch_flow() {
    scenarios(&OnHost, 1..=2, 150, 1);
}

/// A device that runs behind the host: packets queue until the host waits for a slot or
/// reads the device back, so the ring wraps with every slot in flight and the host waits.
#[test]
fn emulated_device_running_behind_follows_the_host() {
    let total = scenarios(&Emulated(Pace::Lagging), 3..=4, 120, 8);
    assert!(total.ring_waits > 0, "the host never ran a ring ahead");
}

#[test]
fn gpu_device_follows_the_host_through_the_batch_flow() {
    let Some(device) = device() else { return };
    scenarios(&OnGpu(device), 1..=3, 200, 1);
}

/// A staged mirror outside a cache, for a table of `ROWS` rows and a pool of 64 pages of 4
/// slots (whose allocator is returned with it), on emulated kernels at `pace` with a ring of
/// `depth`.
fn raw_mirror(
    pace: Pace,
    depth: usize,
) -> Option<(StagedMirror<EmulatedLink>, PagedAllocator, ReqToTokenPool)> {
    let table = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
    let host = PagedAllocator::new(64 * 4, 4, false).unwrap();
    let link = Emulated(pace).make(depth, default_slot_words(256, ROWS + 1, 0), None)?;
    let mirror = StagedMirror::new(link, &table, host.capacity()).unwrap();
    Some((mirror, host, table))
}

/// The mirror follows table writes only: allocations and frees made outside the batch flow
/// ship nothing, and each write it is told ships one packet the device applies.
#[test]
fn the_mirror_ships_table_writes_only() {
    let Some((mut mirror, mut host, mut table)) = raw_mirror(Pace::Immediate, 3) else {
        return;
    };
    let mut whole = Vec::new();
    host.alloc(8, &mut whole).unwrap();
    host.free(&whole).unwrap();
    assert_eq!(mirror.stats().packets, 0, "the mirror never saw them");
    let shape = ExtendShape {
        prefix_len: 0,
        seq_len: 6,
        last_loc: None,
    };
    let mut out = Vec::new();
    host.alloc_extend(&[shape], &mut out).unwrap();
    let row = table.alloc(1).unwrap()[0];
    table.write(row, 0, &out).unwrap();
    mirror.extend(
        &[shape],
        std::iter::once(ExtendRow { row, prefix: &[] }),
        &out,
    );
    mirror
        .verify(&table, std::iter::once((row, 6)), Some(&out))
        .unwrap();
    table.write(row, 6, &[77]).unwrap();
    let step = WrittenDecode {
        indices: &[row * WIDTH + 6],
        out: &[77],
    };
    mirror.decode(step).unwrap();
    mirror
        .verify(&table, std::iter::once((row, 7)), Some(&[77]))
        .unwrap();
    assert_eq!(mirror.stats().packets, 2);
}

/// A step whose rows the device table lacks, or that writes past their width, is a caller
/// bug (a mirror built for another table): it panics before anything is shipped.
#[test]
fn rows_outside_the_device_table_panic_before_anything_is_shipped() {
    let Some((mut mirror, _host, _table)) = raw_mirror(Pace::Immediate, 3) else {
        return;
    };
    let shape = |seq_len| ExtendShape {
        prefix_len: 0,
        seq_len,
        last_loc: None,
    };
    for (row, seq_len) in [(ROWS + 1, 8), (1, WIDTH + 4)] {
        let rows = [ExtendRow { row, prefix: &[] }];
        let out = vec![4; seq_len];
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            mirror.extend(&[shape(seq_len)], rows.into_iter(), &out)
        }));
        assert!(result.is_err(), "row {row} up to {seq_len} must be refused");
        assert_eq!(mirror.stats().packets, 0);
    }
    for write in [
        Box::new(|mirror: &mut StagedMirror<EmulatedLink>| mirror.row_written(ROWS + 1, 0, &[4]))
            as Box<dyn Fn(&mut StagedMirror<EmulatedLink>)>,
        Box::new(|mirror| {
            let step = WrittenDecode {
                indices: &[(ROWS + 1) * WIDTH],
                out: &[4],
            };
            mirror.decode(step).unwrap();
        }),
    ] {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write(&mut mirror)));
        assert!(result.is_err(), "a write outside the table must be refused");
        assert_eq!(mirror.stats().packets, 0);
    }
}

/// Three row writes through a ring of two slots on a device that has run none of them: the
/// third needs slot 0 again. With the slot's event the host waits for the device first, and
/// the device ends up with every write; a link without events lets the host overwrite slot 0
/// before its copy ran, and the device loses the first write.
#[test]
fn a_ring_slot_is_rewritten_only_after_its_copy_ran() {
    let Some((mut guarded, _, mut table)) = raw_mirror(Pace::Lagging, 2) else {
        return;
    };
    let rows = table.alloc(3).unwrap();
    let slots = |row: usize| [10 * row as KvSlot, 10 * row as KvSlot + 1];
    for &row in &rows {
        table.write(row, 0, &slots(row)).unwrap();
    }
    let write = |mirror: &mut StagedMirror<EmulatedLink>| {
        for &row in &rows {
            mirror.row_written(row, 0, &slots(row));
        }
    };
    write(&mut guarded);
    assert_eq!(guarded.stats().waits, 1, "the host waited once");
    guarded
        .verify(&table, rows.iter().map(|&row| (row, 2)), None)
        .unwrap();

    let (mut unguarded, _, _) = raw_mirror(Pace::LaggingWithoutEvents, 2).unwrap();
    write(&mut unguarded);
    assert_eq!(unguarded.stats().waits, 0);
    let error = unguarded
        .verify(&table, rows.iter().map(|&row| (row, 2)), None)
        .unwrap_err();
    assert!(
        matches!(error, StagingError::RowDiverged { row, .. } if row == rows[0]),
        "{error}"
    );
}
