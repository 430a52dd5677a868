//! Stateful property test of the batch flow: random interleavings of admission (shared
//! prefixes in two namespaces, chunked prefill, re-admission of retracted requests), decode (checked with
//! retraction, or unchecked to induce OOM), speculative reserve/commit, finish, abort, grouped
//! release, eviction, match-then-drop, oversized admissions, requests passed to another
//! cache, releases and page registrations whose free the allocator refuses, checks that leave
//! a request out (as if dropped: the checker must name it), and requests dropped for good and
//! reclaimed (exactly their row, pages and lock come back), over page sizes 1, 3, 4 and
//! 16 with the radix cache on and off. The invariant checker runs after every
//! step, every failed call must leave the state exactly unchanged, and at the end releasing
//! everything and evicting the whole cache gives the pool back in full.

use crate::common;
use crate::common::faulty;

use std::cmp::Reverse;
use std::ops::DerefMut;

use faulty::{Faults, Faulty};
use kvown_runtime::alloc::{
    AllocError, KvAllocator, KvSlot, PageAllocator, PageId, PagedAllocator, ReuseOrder,
    TokenAllocator, ceil_align, floor_align,
};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, check_decode_mem,
    commit_spec_tokens, new_tokens_required_next_decode, prepare_for_decode, prepare_for_extend,
    prepare_for_spec_decode, release_kv_cache, retract_decode,
};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::check::Violation;
use kvown_runtime::check::{ReclaimError, Reclaimed, reclaim_leaks};
use kvown_runtime::error::KvError;
use kvown_runtime::error::OutOfMemory;
use kvown_runtime::radix::{Namespace, RadixCache, RadixConfig, RadixError, TreePos};
use kvown_runtime::slots::ReqToTokenPool;
use proptest::prelude::*;

/// Positions per request row.
const WIDTH: usize = 128;

#[derive(Debug, Clone)]
struct Cfg {
    page_size: usize,
    radix: bool,
    /// Draft steps per speculative decode; `None` for plain decode.
    spec_steps: Option<usize>,
    pool_pages: usize,
    rows: usize,
    chunk: usize,
    /// Page size 1 only: the FIFO token allocator instead of the paged one.
    token_alloc: bool,
    need_sort: bool,
}

impl Cfg {
    fn reserve(&self) -> Option<usize> {
        self.spec_steps.map(|steps| 2 * (steps + 1))
    }
}

#[derive(Debug, Clone)]
struct NewReq {
    /// Its prefix-cache namespace: requests of one family share prefixes only within one.
    namespace: u32,
    family: u32,
    shared: usize,
    suffix: usize,
}

#[derive(Debug, Clone)]
enum Op {
    /// One extend batch: optionally every chunking request, some waiting (retracted or
    /// rejected) requests, and new ones; `in_free_group` makes it inside an open free group,
    /// where it may take free slots but not evict.
    Admit {
        new: Vec<NewReq>,
        readmit: usize,
        with_chunking: bool,
        in_free_group: bool,
    },
    /// New requests of (nearly) a full row each, without chunking: usually out of memory or rows.
    Oversize {
        count: usize,
        extra: usize,
    },
    /// A decode step of the running batch. `checked`: `check_decode_mem` then `retract_decode`
    /// when it does not fit; otherwise allocate directly (and maybe fail with OOM).
    Decode {
        checked: bool,
        accepts: Vec<usize>,
        overcommit: Option<usize>,
    },
    Finish {
        pick: usize,
    },
    Abort {
        pick: usize,
        chunking: bool,
    },
    FinishGroup {
        picks: Vec<usize>,
    },
    /// `evict_shortfall(tokens)`; `refused` first has the allocator refuse the eviction's
    /// free, which must change nothing.
    Evict {
        tokens: usize,
        refused: bool,
    },
    MatchDrop {
        req: NewReq,
    },
    /// A running (or chunking) request passed to every batch-flow call of a second cache: each
    /// refuses it and neither cache changes.
    OtherCache {
        pick: usize,
        chunking: bool,
    },
    /// The checker runs with one running (or chunking) request left out, as if it had been
    /// dropped: it must name that request's row, its assignment and exactly its own pages.
    OmitFromCheck {
        pick: usize,
        chunking: bool,
    },
    /// A running (or chunking) request is dropped without its release, and
    /// `reclaim_leaks` gives back exactly its row, its own pages and its prefix lock;
    /// `refused` first has the allocator refuse the free, which must change nothing.
    DropAndReclaim {
        pick: usize,
        chunking: bool,
        refused: bool,
    },
    /// The allocator refuses every free while a running (or chunking) request is released or
    /// registers its committed pages: the call fails changing nothing, or needs no free.
    RefusedFree {
        pick: usize,
        chunking: bool,
        call: RefusedCall,
    },
}

/// The call of [`Op::RefusedFree`].
#[derive(Debug, Clone, Copy)]
enum RefusedCall {
    /// `release_kv_cache`, inserting into the prefix cache or not.
    Release { insert: bool },
    /// `cache_unfinished_req`.
    Register,
}

fn new_req() -> impl Strategy<Value = NewReq> {
    (
        0u32..2,
        0u32..3,
        prop_oneof![Just(0usize), 1usize..48],
        0usize..24,
    )
        .prop_map(|(namespace, family, shared, suffix)| NewReq {
            namespace,
            family,
            shared,
            suffix,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (
            prop::collection::vec(new_req(), 0..4),
            0usize..3,
            any::<bool>(),
            prop::bool::weighted(0.2),
        )
            .prop_map(|(new, readmit, with_chunking, in_free_group)| Op::Admit {
                new,
                readmit,
                with_chunking,
                in_free_group
            }),
        1 => (1usize..4, 0usize..2).prop_map(|(count, extra)| Op::Oversize { count, extra }),
        10 => (
            prop::bool::weighted(0.85),
            prop::collection::vec(0usize..8, 8),
            prop::option::weighted(0.15, any::<usize>()),
        )
            .prop_map(|(checked, accepts, overcommit)| Op::Decode {
                checked,
                accepts,
                overcommit
            }),
        1 => any::<usize>().prop_map(|pick| Op::Finish { pick }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, chunking)| Op::Abort { pick, chunking }),
        1 => prop::collection::vec(any::<usize>(), 1..4).prop_map(|picks| Op::FinishGroup { picks }),
        1 => (0usize..400, any::<bool>()).prop_map(|(tokens, refused)| Op::Evict { tokens, refused }),
        1 => new_req().prop_map(|req| Op::MatchDrop { req }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, chunking)| Op::OtherCache { pick, chunking }),
        1 => (
            any::<usize>(),
            any::<bool>(),
            prop_oneof![
                any::<bool>().prop_map(|insert| RefusedCall::Release { insert }),
                Just(RefusedCall::Register),
            ],
        )
            .prop_map(|(pick, chunking, call)| Op::RefusedFree { pick, chunking, call }),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(pick, chunking)| Op::OmitFromCheck { pick, chunking }),
        1 => (any::<usize>(), any::<bool>(), any::<bool>())
            .prop_map(|(pick, chunking, refused)| Op::DropAndReclaim { pick, chunking, refused }),
    ]
}

fn cfg(page_size: usize, radix: bool) -> impl Strategy<Value = Cfg> {
    (
        prop::option::of(1usize..4),
        32usize..256,
        3usize..9,
        3usize..40,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            move |(spec_steps, pool_tokens, rows, chunk, token_alloc, need_sort)| Cfg {
                page_size,
                radix,
                spec_steps,
                pool_pages: (pool_tokens / page_size).max(2),
                rows,
                chunk,
                token_alloc: token_alloc && page_size == 1,
                need_sort,
            },
        )
}

/// Everything a failed allocation must leave untouched.
#[derive(Debug, PartialEq)]
struct Snapshot<R: ReuseOrder> {
    allocator: PageAllocator<R>,
    req_to_token: ReqToTokenPool,
    tree: String,
    reqs: Vec<ReqState>,
}

/// A request's observable state, iteration clocks aside.
#[derive(Debug, PartialEq)]
struct ReqState {
    rid: u64,
    row: Option<usize>,
    protected: usize,
    committed: usize,
    allocated: usize,
    prefix_len: usize,
    extend_end: usize,
    last_node: TreePos,
    tokens: Vec<u32>,
    clocks: (u64, u64),
}

impl ReqState {
    fn of(req: &Req) -> ReqState {
        let kv = req.kv();
        ReqState {
            rid: req.rid(),
            row: kv.req_pool_idx(),
            protected: kv.cache_protected_len(),
            committed: kv.kv_committed_len(),
            allocated: kv.kv_allocated_len(),
            prefix_len: req.prefix_len(),
            extend_end: req.extend_end(),
            last_node: req.last_node(),
            tokens: req.fill_ids().to_vec(),
            clocks: (kv.extend_batch_idx(), kv.decode_batch_idx()),
        }
    }

    /// The state with one clock ticked (a cancelled prepare keeps its tick).
    fn ticked(mut self, extend: bool) -> ReqState {
        if extend {
            self.clocks.0 += 1;
        } else {
            self.clocks.1 += 1;
        }
        self
    }
}

/// The allocator, and the prefix cache's evictable size and pages: what a refused eviction
/// keeps.
fn eviction_state<R: ReuseOrder>(cache: &Cache<R>) -> (PageAllocator<R>, usize, Vec<PageId>) {
    let mut pages: Vec<PageId> = match cache.tree().radix() {
        Some(tree) => tree.cached_pages().map(|(_, page)| page).collect(),
        None => Vec::new(),
    };
    pages.sort_unstable();
    let evictable = cache.tree().evictable_size();
    (cache.allocator().inner.clone(), evictable, pages)
}

/// The cache under test.
type Cache<R> = KvCache<Faulty<PageAllocator<R>>>;

/// The simulation, over the cache `C` gives: its own, or the guard of a free group open on it.
struct Sim<R: ReuseOrder, C = Box<Cache<R>>> {
    cfg: Cfg,
    cache: C,
    /// Arms the cache's allocator to refuse frees.
    free_faults: Faults,
    /// A second cache of the same shape that no request of the simulation belongs to (none
    /// inside a free group, whose steps do not use it).
    other: Option<Box<KvCache<PageAllocator<R>>>>,
    running: ScheduleBatch,
    chunking: Vec<Req>,
    waiting: Vec<Req>,
    next_rid: u64,
}

impl<R: ReuseOrder> Sim<R>
where
    PageAllocator<R>: KvAllocator,
{
    fn new(cfg: Cfg, allocator: PageAllocator<R>) -> Self {
        let tree = if cfg.radix {
            TreeCache::Radix(RadixCache::new(RadixConfig::new(cfg.page_size)).unwrap())
        } else {
            TreeCache::Disabled
        };
        let pool = ReqToTokenPool::new(cfg.rows, WIDTH).unwrap();
        let other_tree =
            TreeCache::Radix(RadixCache::new(RadixConfig::new(cfg.page_size)).unwrap());
        let other = KvCache::new(allocator.clone(), pool.clone(), other_tree).unwrap();
        let free_faults = Faults::default();
        let allocator = Faulty {
            inner: allocator,
            faults: free_faults.clone(),
        };
        Sim {
            cache: Box::new(KvCache::new(allocator, pool, tree).unwrap()),
            free_faults,
            other: Some(Box::new(other)),
            cfg,
            running: ScheduleBatch::new(Vec::new()),
            chunking: Vec::new(),
            waiting: Vec::new(),
            next_rid: 1,
        }
    }
}

impl<R: ReuseOrder, C: DerefMut<Target = Cache<R>>> Sim<R, C>
where
    PageAllocator<R>: KvAllocator,
{
    fn ps(&self) -> usize {
        self.cfg.page_size
    }

    fn tree_total(&self) -> usize {
        self.cache
            .tree()
            .radix()
            .map_or(0, |tree| tree.sizes().total())
    }

    /// Every request of the simulation: running, chunking and waiting.
    fn live_reqs(&self) -> impl Iterator<Item = &Req> {
        self.running
            .reqs()
            .iter()
            .chain(&self.chunking)
            .chain(&self.waiting)
    }

    /// `reclaim_leaks` with every live request.
    fn reclaim(&mut self) -> Result<Reclaimed, ReclaimError> {
        let live = self
            .running
            .reqs_mut()
            .iter_mut()
            .chain(&mut self.chunking)
            .chain(&mut self.waiting);
        reclaim_leaks(&mut self.cache, live)
    }

    /// Runs the checker over every live request and `extra`; inside a free group, where it
    /// refuses to run, only that refusal is checked.
    fn check_with(&self, extra: &[Req]) {
        let all = self.live_reqs().chain(extra);
        match self.cache.check(all) {
            Err(Violation::OpenFreeGroup) if self.cache.in_free_group() => {}
            Err(violation) => panic!("invariant broken: {violation}"),
            Ok(()) => assert!(!self.cache.in_free_group()),
        }
    }

    fn check(&self) {
        self.check_with(&[]);
    }

    fn snapshot(&self, reqs: &[Req]) -> Snapshot<R> {
        Snapshot {
            allocator: self.cache.allocator().inner.clone(),
            req_to_token: self.cache.req_to_token().clone(),
            tree: format!("{:?}", self.cache.tree()),
            reqs: self
                .running
                .reqs()
                .iter()
                .chain(&self.chunking)
                .chain(reqs)
                .map(ReqState::of)
                .collect(),
        }
    }

    fn make_req(&mut self, spec: &NewReq, len_override: Option<usize>) -> Req {
        let rid = self.next_rid;
        self.next_rid += 1;
        let mut tokens: Vec<u32> = match len_override {
            Some(len) => (0..len as u32)
                .map(|i| 1_000_000 + rid as u32 * 1000 + i)
                .collect(),
            None => (0..spec.shared as u32)
                .map(|i| spec.family * 1000 + i)
                .chain((0..spec.suffix as u32).map(|i| 100_000 + rid as u32 * 100 + i))
                .collect(),
        };
        if tokens.is_empty() {
            tokens.push(7);
        }
        Req::new_in(Namespace(spec.namespace), rid, tokens)
    }

    /// The output token a request samples at `position` (identical prompts give identical
    /// continuations, so finished requests insert duplicates).
    fn sample(req: &mut Req) {
        let position = req.fill_ids().len() as u32;
        req.push_output(500 + position % 7);
    }

    /// What `alloc_for_extend` must answer for `reqs` (matched), from the spec's formulas.
    fn expected_extend(&self, reqs: &[Req]) -> Result<(), KvError> {
        let ps = self.ps();
        let (mut rows, mut tokens) = (0, 0);
        for req in reqs {
            let seq = req.extend_end().max(req.prefix_len());
            if seq > WIDTH {
                return Err(KvError::RowTooShort {
                    rid: req.rid(),
                    needed: seq,
                    width: WIDTH,
                });
            }
            rows += usize::from(!req.kv().holds_kv());
            tokens += ceil_align(seq, ps) - ceil_align(req.prefix_len(), ps);
        }
        let rows_available = self.cache.req_to_token().available_size();
        if rows > rows_available {
            return Err(KvError::OutOfRows {
                requested: rows,
                available: rows_available,
            });
        }
        let available = self.cache.available_size();
        let evictable = self.cache.tree().evictable_size();
        if available + evictable < tokens {
            return Err(KvError::OutOfMemory(OutOfMemory {
                requested: tokens,
                available,
                evictable,
            }));
        }
        if available < tokens && self.cache.in_free_group() {
            return Err(KvError::FreeGroupOpen {
                requested: tokens,
                available,
                evictable,
            });
        }
        Ok(())
    }

    /// The slots an extend continues from: the tree path for a fresh match, the row for a
    /// chunked request.
    fn prefix_slots(&self, req: &Req) -> Vec<KvSlot> {
        let mut slots = vec![0; req.prefix_len()];
        match req.kv().req_pool_idx() {
            Some(row) => {
                let len = slots.len();
                slots.copy_from_slice(&self.cache.req_to_token().row(row).unwrap()[..len])
            }
            None => {
                if let Some(tree) = self.cache.tree().radix() {
                    tree.path_slots_into(req.last_node(), 0, &mut slots)
                        .unwrap();
                }
            }
        }
        slots
    }

    fn admit(&mut self, new: &[NewReq], readmit: usize, with_chunking: bool, in_free_group: bool) {
        let mut reqs = Vec::new();
        if with_chunking {
            reqs.append(&mut self.chunking);
        }
        let readmit = readmit.min(self.waiting.len());
        reqs.extend(self.waiting.drain(..readmit));
        for spec in new {
            let req = self.make_req(spec, None);
            reqs.push(req);
        }
        let chunk = self.cfg.chunk;
        if in_free_group {
            // Committing the group releases what it deferred (a chunk's registration frees the
            // pages another request of the batch cached first).
            let mut group = self.cache.free_group().unwrap();
            let mut inside = Sim {
                cfg: self.cfg.clone(),
                cache: &mut *group,
                free_faults: self.free_faults.clone(),
                other: None,
                running: std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new())),
                chunking: std::mem::take(&mut self.chunking),
                waiting: std::mem::take(&mut self.waiting),
                next_rid: self.next_rid,
            };
            inside.extend(reqs, chunk);
            self.running = inside.running;
            self.chunking = inside.chunking;
            self.waiting = inside.waiting;
            self.next_rid = inside.next_rid;
            group.commit();
            self.check();
        } else {
            self.extend(reqs, chunk);
        }
    }

    fn oversize(&mut self, count: usize, extra: usize) {
        let spec = NewReq {
            namespace: 0,
            family: 0,
            shared: 0,
            suffix: 0,
        };
        let reqs = (0..count)
            .map(|_| self.make_req(&spec, Some(WIDTH + extra)))
            .collect();
        self.extend(reqs, usize::MAX);
    }

    fn extend(&mut self, mut reqs: Vec<Req>, chunk: usize) {
        if reqs.is_empty() {
            return;
        }
        let ps = self.ps();
        for req in &mut reqs {
            let holding = req.kv().holds_kv();
            let before = (req.prefix_len(), req.kv().cache_protected_len());
            init_next_round_input(req, &mut self.cache, chunk).unwrap();
            if holding {
                assert_eq!(
                    (req.prefix_len(), req.kv().cache_protected_len()),
                    before,
                    "a continuing chunk keeps its prefix"
                );
            } else {
                let matched = req.prefix_len();
                assert_eq!(req.last_node().len, matched);
                assert_eq!(req.kv().cache_protected_len(), matched);
                assert_eq!(matched % ps, 0, "matches are page-aligned");
                assert!(matched < req.fill_ids().len(), "the last token is computed");
                if !self.cfg.radix {
                    assert_eq!(matched, 0);
                }
            }
            assert!(req.extend_end() > req.prefix_len());
            assert!(req.extend_end() <= req.fill_ids().len());
        }
        self.check_with(&reqs);
        let expected = self.expected_extend(&reqs);
        let before = self.snapshot(&reqs);
        let prefixes: Vec<Vec<KvSlot>> = reqs.iter().map(|req| self.prefix_slots(req)).collect();
        let (available, tree_total) = (self.cache.available_size(), self.tree_total());
        let consumed: usize = reqs
            .iter()
            .map(|req| ceil_align(req.extend_end(), ps) - ceil_align(req.prefix_len(), ps))
            .sum();
        let shapes: Vec<(usize, usize)> = reqs
            .iter()
            .map(|req| (req.prefix_len(), req.extend_end()))
            .collect();
        let clocks: Vec<u64> = reqs.iter().map(|r| r.kv().extend_batch_idx()).collect();

        match alloc_for_extend(
            prepare_for_extend(ScheduleBatch::new(reqs)),
            &mut self.cache,
        ) {
            Ok(batch) => {
                assert_eq!(expected, Ok(()), "extend succeeded but should have failed");
                let evicted = tree_total - self.tree_total();
                assert_eq!(self.cache.available_size() + consumed, available + evicted);
                let out = batch.out_cache_loc();
                let total: usize = shapes.iter().map(|(p, s)| s - p).sum();
                assert_eq!(out.len(), total, "one new slot per extended token");
                let mut offset = 0;
                for (i, req) in batch.reqs().iter().enumerate() {
                    let (prefix, seq) = shapes[i];
                    let kv = req.kv();
                    let row = self
                        .cache
                        .req_to_token()
                        .row(kv.req_pool_idx().unwrap())
                        .unwrap();
                    assert_eq!(
                        &row[..prefix],
                        &prefixes[i][..],
                        "row[0:prefix] is the prefix"
                    );
                    assert_eq!(
                        &row[prefix..seq],
                        &out[offset..offset + seq - prefix],
                        "row[prefix:seq] is the request's out_cache_loc segment"
                    );
                    offset += seq - prefix;
                    assert_eq!((kv.kv_allocated_len(), kv.kv_committed_len()), (seq, seq));
                    assert_eq!(kv.extend_batch_idx(), clocks[i] + 1);
                    assert!(!req.is_retracted, "an extended request is running again");
                }
                self.check_with(batch.reqs());
                for mut req in batch.into_reqs() {
                    if req.extend_end() == req.fill_ids().len() {
                        Self::sample(&mut req);
                        self.running.extend_reqs([req]);
                    } else {
                        let committed = req.kv().kv_committed_len();
                        let row_before = self
                            .cache
                            .req_to_token()
                            .row(req.kv().req_pool_idx().unwrap())
                            .unwrap()[..committed]
                            .to_vec();
                        cache_unfinished_req(&mut req, &mut self.cache).unwrap();
                        let kv = req.kv();
                        let expected_protected = if self.cfg.radix {
                            floor_align(committed, ps)
                        } else {
                            0
                        };
                        assert_eq!(kv.cache_protected_len(), expected_protected);
                        assert_eq!(kv.kv_committed_len(), committed);
                        assert_eq!(req.prefix_len(), committed);
                        let row = self
                            .cache
                            .req_to_token()
                            .row(kv.req_pool_idx().unwrap())
                            .unwrap();
                        assert_eq!(
                            &row[expected_protected..committed],
                            &row_before[expected_protected..],
                            "the unaligned tail stays the request's own"
                        );
                        self.chunking.push(req);
                    }
                }
            }
            Err(failure) => {
                assert_eq!(Err(failure.error.clone()), expected);
                let batch = failure.batch.cancel();
                let after = self.snapshot(batch.reqs());
                let n = after.reqs.len();
                let mut expected_state = before;
                let ticked: Vec<ReqState> = expected_state
                    .reqs
                    .drain(n - batch.len()..)
                    .map(|s| s.ticked(true))
                    .collect();
                expected_state.reqs.extend(ticked);
                assert_eq!(after, expected_state, "a failed extend changes nothing");
                self.check_with(batch.reqs());
                for mut req in batch.into_reqs() {
                    let too_long = matches!(
                        failure.error,
                        KvError::RowTooShort { rid, .. } if rid == req.rid()
                    );
                    if req.kv().holds_kv() {
                        if too_long {
                            release_kv_cache(&mut req, &mut self.cache, false).unwrap();
                        } else {
                            self.chunking.push(req);
                        }
                        continue;
                    }
                    // A matched request that was not allocated drops only its lock.
                    let result = release_kv_cache(&mut req, &mut self.cache, false);
                    if req.last_node() == TreePos::ROOT && result.is_err() {
                        assert_eq!(result, Err(KvError::NotHeld { rid: req.rid() }));
                    } else {
                        result.unwrap();
                    }
                    assert_eq!(req.last_node(), TreePos::ROOT);
                    assert_eq!(req.kv().cache_protected_len(), 0);
                    if !too_long && self.waiting.len() < 6 {
                        self.waiting.push(req);
                    }
                }
            }
        }
        self.check();
    }

    /// Finishes running requests that could outgrow their row in the next step.
    fn cap_lengths(&mut self) {
        let step = self.cfg.reserve().unwrap_or(1) + self.ps();
        while let Some(index) = self
            .running
            .reqs()
            .iter()
            .position(|req| req.kv().kv_committed_len() + step > WIDTH)
        {
            let mut req = self.take_running(index).unwrap();
            self.finish(&mut req, true);
        }
    }

    /// Releases `req` (finish with insert, or abort) and checks what came back.
    fn finish(&mut self, req: &mut Req, insert: bool) {
        let kv = req.kv();
        let owned = ceil_align(kv.kv_allocated_len(), self.ps()) - kv.cache_protected_len();
        let (available, tree_total) = (self.cache.available_size(), self.tree_total());
        release_kv_cache(req, &mut self.cache, insert).unwrap();
        let inserted = self.tree_total() - tree_total;
        if !insert || !self.cfg.radix {
            assert_eq!(inserted, 0, "nothing is inserted without insert");
        }
        assert_eq!(
            self.cache.available_size(),
            available + owned - inserted,
            "release frees [protected, ceil_align(allocated)) minus what the tree took"
        );
        let kv = req.kv();
        assert!(!kv.holds_kv());
        assert_eq!(
            (
                kv.cache_protected_len(),
                kv.kv_committed_len(),
                kv.kv_allocated_len()
            ),
            (0, 0, 0)
        );
        assert_eq!(req.last_node(), TreePos::ROOT);
        assert_eq!(
            release_kv_cache(req, &mut self.cache, insert),
            Err(KvError::NotHeld { rid: req.rid() }),
            "double release is refused"
        );
        self.check_with(std::slice::from_ref(req));
    }

    fn take_running(&mut self, pick: usize) -> Option<Req> {
        if self.running.is_empty() {
            return None;
        }
        let rid = self.running.reqs()[pick % self.running.len()].rid();
        self.running.take_if(|req| req.rid() == rid).pop()
    }

    fn finish_one(&mut self, pick: usize) {
        if let Some(mut req) = self.take_running(pick) {
            self.finish(&mut req, true);
        }
    }

    /// Takes a chunking request (when `chunking` and there is one) or a running one, and says
    /// which it was.
    fn take_picked(&mut self, pick: usize, chunking: bool) -> Option<(Req, bool)> {
        if chunking && !self.chunking.is_empty() {
            let index = pick % self.chunking.len();
            Some((self.chunking.remove(index), true))
        } else {
            self.take_running(pick).map(|req| (req, false))
        }
    }

    /// Returns a request from [`Sim::take_picked`] to where it came from.
    fn put_back(&mut self, req: Req, from_chunking: bool) {
        if from_chunking {
            self.chunking.push(req);
        } else {
            self.running.extend_reqs([req]);
        }
    }

    fn abort(&mut self, pick: usize, chunking: bool) {
        if let Some((mut req, _)) = self.take_picked(pick, chunking) {
            self.finish(&mut req, false);
        }
    }

    fn finish_group(&mut self, picks: &[usize]) {
        let mut reqs: Vec<Req> = picks.iter().filter_map(|&p| self.take_running(p)).collect();
        if reqs.is_empty() {
            return;
        }
        let owned: usize = reqs
            .iter()
            .map(|r| {
                ceil_align(r.kv().kv_allocated_len(), self.ps()) - r.kv().cache_protected_len()
            })
            .sum();
        let (available, tree_total) = (self.cache.available_size(), self.tree_total());
        let mut group = self.cache.free_group().unwrap();
        for req in &mut reqs {
            release_kv_cache(req, &mut group, true).unwrap();
            assert_eq!(
                group.available_size(),
                available,
                "frees are deferred inside a group"
            );
        }
        assert_eq!(
            group.check(self.running.reqs()),
            Err(Violation::OpenFreeGroup)
        );
        // Evicting inside the group would free nothing until it ends: refused, nothing changed.
        let capacity = group.allocator().capacity();
        let evictable = group.tree().evictable_size();
        let before = eviction_state(&group);
        match group.evict_shortfall(capacity) {
            Err(KvError::FreeGroupOpen {
                requested,
                available: free,
                evictable: listed,
            }) => {
                assert_eq!((requested, free, listed), (capacity, available, evictable));
                assert_eq!(
                    eviction_state(&group),
                    before,
                    "a refused eviction changes nothing"
                );
            }
            Ok(0) => assert!(evictable == 0 || available >= capacity),
            other => panic!("an eviction inside a free group gave {other:?}"),
        }
        group.commit();
        let inserted = self.tree_total() - tree_total;
        assert_eq!(self.cache.available_size(), available + owned - inserted);
        self.check_with(&reqs);
    }

    /// [`eviction_state`] of the cache.
    fn eviction_state(&self) -> (PageAllocator<R>, usize, Vec<PageId>) {
        eviction_state(&self.cache)
    }

    fn evict(&mut self, tokens: usize, refused: bool) {
        let available = self.cache.available_size();
        let evictable = self.cache.tree().evictable_size();
        let protected = self.cache.tree().protected_size();
        if refused {
            let before = self.eviction_state();
            self.free_faults.set_frees_left(Some(0));
            let result = self.cache.evict_shortfall(tokens);
            self.free_faults.set_frees_left(None);
            match result {
                Err(KvError::Radix(RadixError::Free { tokens: chosen, .. })) => {
                    assert!(
                        available < tokens && evictable > 0,
                        "nothing to evict was refused"
                    );
                    assert!(chosen >= (tokens - available).min(evictable));
                    assert_eq!(
                        self.eviction_state(),
                        before,
                        "a refused eviction changes nothing"
                    );
                }
                Ok(evicted) => {
                    assert_eq!(evicted, 0);
                    assert!(
                        available >= tokens || evictable == 0,
                        "an eviction took no free"
                    );
                }
                Err(error) => panic!("a refused eviction failed with {error}"),
            }
            self.check_with(&[]);
        }
        let evicted = self.cache.evict_shortfall(tokens).unwrap();
        if available >= tokens {
            assert_eq!(evicted, 0, "only the shortfall is evicted");
        } else {
            assert!(evicted >= (tokens - available).min(evictable));
        }
        assert_eq!(self.cache.available_size(), available + evicted);
        assert_eq!(self.cache.tree().evictable_size(), evictable - evicted);
        assert_eq!(
            self.cache.tree().protected_size(),
            protected,
            "locked nodes stay"
        );
    }

    fn match_drop(&mut self, spec: &NewReq) {
        let mut req = self.make_req(spec, None);
        let evictable = self.cache.tree().evictable_size();
        let protected = self.cache.tree().protected_size();
        init_next_round_input(&mut req, &mut self.cache, self.cfg.chunk).unwrap();
        self.check_with(std::slice::from_ref(&req));
        let matched = req.prefix_len();
        if matched > 0 {
            // Left out of the check (as if dropped), its lock is found at its node.
            match self.cache.check(self.live_reqs()) {
                Err(Violation::LockCount { node, locks, held }) => {
                    assert_eq!(node, req.last_node().node);
                    assert_eq!(locks, held + 1, "one lock is unaccounted for");
                }
                other => panic!("a left-out lock gave {other:?}"),
            }
        }
        let available = self.cache.available_size();
        let result = release_kv_cache(&mut req, &mut self.cache, true);
        if matched == 0 {
            assert_eq!(result, Err(KvError::NotHeld { rid: req.rid() }));
        } else {
            result.unwrap();
            assert_eq!(req.prefix_len(), 0);
            assert_eq!(req.last_node(), TreePos::ROOT);
            assert_eq!(req.kv().cache_protected_len(), 0);
        }
        assert_eq!(self.cache.available_size(), available, "nothing is freed");
        assert_eq!(
            self.cache.tree().evictable_size(),
            evictable,
            "the lock is dropped"
        );
        assert_eq!(self.cache.tree().protected_size(), protected);
        self.check_with(std::slice::from_ref(&req));
    }

    fn other_cache(&mut self, pick: usize, chunking: bool) {
        let Some((mut req, from_chunking)) = self.take_picked(pick, chunking) else {
            return;
        };
        let before = self.snapshot(std::slice::from_ref(&req));
        let other_state = |other: &KvCache<PageAllocator<R>>| {
            (
                other.allocator().clone(),
                other.req_to_token().clone(),
                format!("{:?}", other.tree()),
            )
        };
        let mut other_cache = self.other.take().expect("the second cache is home");
        let other_before = other_state(&other_cache);
        let expected = KvError::OtherCache {
            rid: req.rid(),
            bound: self.cache.id(),
            used: other_cache.id(),
        };
        let other = &mut *other_cache;
        assert_eq!(
            release_kv_cache(&mut req, other, true),
            Err(expected.clone())
        );
        assert_eq!(cache_unfinished_req(&mut req, other), Err(expected.clone()));
        assert_eq!(
            init_next_round_input(&mut req, other, usize::MAX),
            Err(expected.clone())
        );
        let (batch, error) = prepare_for_decode(ScheduleBatch::new(vec![req]), other).unwrap_err();
        assert_eq!(error, expected);
        let failure = alloc_for_extend(prepare_for_extend(batch), other).unwrap_err();
        assert_eq!(failure.error, expected);
        let req = failure.batch.cancel().into_reqs().pop().unwrap();
        assert_eq!(other_state(&other_cache), other_before);
        self.other = Some(other_cache);
        // The cancelled extend kept its clock tick, unless the request holds a speculative
        // reservation, which refuses every extend; nothing else moved.
        let after = self.snapshot(std::slice::from_ref(&req));
        let mut expected_reqs = before.reqs;
        let last = expected_reqs.pop().expect("the request is in the snapshot");
        let reserved = last.allocated > last.committed;
        expected_reqs.push(if reserved { last } else { last.ticked(true) });
        assert_eq!(after.reqs, expected_reqs);
        assert_eq!(
            (after.allocator, after.req_to_token, after.tree),
            (before.allocator, before.req_to_token, before.tree)
        );
        self.put_back(req, from_chunking);
    }

    fn retract(&mut self) {
        let reserve = self.cfg.reserve();
        let n = self.running.len();
        let before: Vec<(u64, usize, usize, u32)> = self
            .running
            .reqs()
            .iter()
            .map(|r| {
                (
                    r.rid(),
                    r.output_ids().len(),
                    r.origin_input_ids().len(),
                    r.retraction_count,
                )
            })
            .collect();
        // Fewest outputs first; longest prompt first among equals; later index first on ties.
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| (before[i].1, Reverse(before[i].2), Reverse(i)));
        let tree_total = self.tree_total();
        let outcome = retract_decode(&mut self.running, &mut self.cache, reserve).unwrap();
        let (k, a) = (outcome.retracted.len(), outcome.aborted.len());
        assert_eq!(k + a + self.running.len(), n);
        assert!(a <= 1);
        if n >= 2 {
            assert!(k >= 1, "retracts at least once");
        } else {
            assert_eq!(k, 0, "the last request is kept or aborted, never retracted");
        }
        if a == 1 {
            assert!(self.running.is_empty(), "only the last request is aborted");
        } else {
            assert!(!self.running.is_empty(), "keeps at least one request");
        }
        let popped: Vec<u64> = outcome
            .retracted
            .iter()
            .chain(&outcome.aborted)
            .map(Req::rid)
            .collect();
        let expected: Vec<u64> = order[..k + a].iter().map(|&i| before[i].0).collect();
        assert_eq!(popped, expected, "retraction order");
        // The kept requests in sglang's keep order (`filter_batch(keep_indices=sorted_indices)`):
        // the retraction order reversed, most outputs first.
        let kept: Vec<u64> = order[k + a..].iter().rev().map(|&i| before[i].0).collect();
        let now: Vec<u64> = self.running.reqs().iter().map(Req::rid).collect();
        assert_eq!(
            now, kept,
            "the kept requests in retraction order, most outputs first"
        );
        assert!(self.tree_total() <= tree_total, "nothing is inserted");
        for req in outcome.retracted.iter().chain(&outcome.aborted) {
            let kv = req.kv();
            assert!(!kv.holds_kv());
            assert_eq!(
                (
                    kv.cache_protected_len(),
                    kv.kv_committed_len(),
                    kv.kv_allocated_len()
                ),
                (0, 0, 0)
            );
        }
        for req in &outcome.retracted {
            let count = before.iter().find(|b| b.0 == req.rid()).unwrap().3;
            assert_eq!(req.retraction_count, count + 1);
            assert!(req.is_retracted);
            assert_eq!(
                (req.kv().extend_batch_idx(), req.kv().decode_batch_idx()),
                (0, 0)
            );
            assert_eq!(req.prefix_len(), 0);
        }
        if !self.running.is_empty() {
            let fits = check_decode_mem(self.running.reqs(), &mut self.cache, reserve).unwrap();
            assert!(fits, "retraction stops only when the rest fits");
        }
        self.check_with(&outcome.retracted);
        for req in outcome.retracted {
            if self.waiting.len() < 6 {
                self.waiting.insert(0, req);
            }
        }
    }

    fn decode(&mut self, checked: bool, accepts: &[usize], overcommit: Option<usize>) {
        self.cap_lengths();
        self.check();
        if self.running.is_empty() {
            return;
        }
        let reserve = self.cfg.reserve();
        let ps = self.ps();
        if checked {
            let needed = new_tokens_required_next_decode(self.running.reqs(), ps, reserve);
            let available_before = self.cache.available_size();
            let fits = check_decode_mem(self.running.reqs(), &mut self.cache, reserve).unwrap();
            assert_eq!(fits, self.cache.available_size() >= needed);
            if available_before >= needed {
                assert_eq!(self.cache.available_size(), available_before, "no eviction");
            }
            self.check();
            if !fits {
                self.retract();
                if self.running.is_empty() {
                    return;
                }
            }
        }
        let needed = new_tokens_required_next_decode(self.running.reqs(), ps, reserve);
        let expected = {
            let available = self.cache.available_size();
            let evictable = self.cache.tree().evictable_size();
            if available + evictable < needed {
                Err(KvError::OutOfMemory(OutOfMemory {
                    requested: needed,
                    available,
                    evictable,
                }))
            } else {
                Ok(())
            }
        };
        if checked {
            assert_eq!(expected, Ok(()), "a checked decode step fits");
        }
        let before = self.snapshot(&[]);
        let lens: Vec<(usize, usize)> = self
            .running
            .reqs()
            .iter()
            .map(|r| (r.kv().kv_committed_len(), r.kv().kv_allocated_len()))
            .collect();
        let rows: Vec<Vec<KvSlot>> = self
            .running
            .reqs()
            .iter()
            .map(|r| {
                self.cache
                    .req_to_token()
                    .row(r.kv().req_pool_idx().unwrap())
                    .unwrap()
                    .to_vec()
            })
            .collect();
        let (available, tree_total) = (self.cache.available_size(), self.tree_total());
        let running = std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new()));
        let result = match reserve {
            None => {
                let prepared = prepare_for_decode(running, &self.cache).unwrap();
                alloc_for_decode(prepared, &mut self.cache).map_err(|f| (f.error, f.batch.cancel()))
            }
            Some(reserve) => {
                let prepared = prepare_for_spec_decode(running, &self.cache, reserve).unwrap();
                alloc_for_spec_decode(prepared, &mut self.cache)
                    .map_err(|f| (f.error, f.batch.cancel()))
            }
        };
        match result {
            Err((error, batch)) => {
                assert_eq!(Err(error), expected);
                self.running = batch;
                let after = self.snapshot(&[]);
                let mut expected_state = before;
                let running = self.running.len();
                expected_state.reqs = expected_state
                    .reqs
                    .into_iter()
                    .enumerate()
                    .map(|(i, s)| if i < running { s.ticked(false) } else { s })
                    .collect();
                assert_eq!(after, expected_state, "a failed decode changes nothing");
            }
            Ok(batch) => {
                assert_eq!(expected, Ok(()), "decode succeeded but should have failed");
                self.running = batch;
                let evicted = tree_total - self.tree_total();
                assert_eq!(self.cache.available_size() + needed, available + evicted);
                match reserve {
                    None => self.verify_decode(&lens, &rows),
                    Some(reserve) => {
                        self.verify_spec(&lens, &rows, reserve);
                        self.check();
                        self.commit(accepts, overcommit);
                    }
                }
            }
        }
        self.check();
    }

    fn verify_decode(&mut self, lens: &[(usize, usize)], rows: &[Vec<KvSlot>]) {
        let ps = self.ps();
        let out = self.running.out_cache_loc().to_vec();
        assert_eq!(out.len(), self.running.len());
        for (i, req) in self.running.reqs().iter().enumerate() {
            let kv = req.kv();
            let (committed, allocated) = lens[i];
            assert_eq!(committed, allocated, "non-spec never over-allocates");
            assert_eq!(kv.kv_allocated_len(), allocated + 1);
            assert_eq!(kv.kv_committed_len(), committed + 1);
            let row = self
                .cache
                .req_to_token()
                .row(kv.req_pool_idx().unwrap())
                .unwrap();
            assert_eq!(row[allocated], out[i], "decode writes row[seq_old]");
            assert_eq!(&row[..allocated], &rows[i][..allocated]);
            if allocated % ps == 0 {
                assert_eq!(
                    out[i] as usize % ps,
                    0,
                    "a new page starts at its first slot"
                );
            } else {
                assert_eq!(out[i], row[allocated - 1] + 1, "continues the partial page");
            }
        }
        for req in self.running.reqs_mut() {
            Self::sample(req);
        }
    }

    fn verify_spec(&self, lens: &[(usize, usize)], rows: &[Vec<KvSlot>], reserve: usize) {
        let ps = self.ps();
        assert!(self.running.out_cache_loc().is_empty());
        for (i, req) in self.running.reqs().iter().enumerate() {
            let kv = req.kv();
            let (committed, allocated) = lens[i];
            let target = allocated.max(ceil_align(committed + reserve, ps));
            assert_eq!(kv.kv_allocated_len(), target, "reserve never shrinks");
            assert_eq!(
                kv.kv_committed_len(),
                committed,
                "reserving commits nothing"
            );
            let row = self
                .cache
                .req_to_token()
                .row(kv.req_pool_idx().unwrap())
                .unwrap();
            assert_eq!(&row[..allocated], &rows[i][..allocated]);
        }
    }

    fn commit(&mut self, accepts: &[usize], overcommit: Option<usize>) {
        let steps = self.cfg.spec_steps.unwrap();
        let headroom: Vec<usize> = self
            .running
            .reqs()
            .iter()
            .map(|r| r.kv().kv_allocated_len() - r.kv().kv_committed_len())
            .collect();
        if let Some(pick) = overcommit {
            let before = self.snapshot(&[]);
            let index = pick % headroom.len();
            let mut bad = vec![1; headroom.len()];
            bad[index] = headroom[index] + 1;
            let req = &self.running.reqs()[index];
            let expected = KvError::CommitBeyondAllocation {
                rid: req.rid(),
                accepted: bad[index],
                would_be: req.kv().kv_committed_len() + bad[index],
                allocated: req.kv().kv_allocated_len(),
            };
            assert_eq!(commit_spec_tokens(&mut self.running, &bad), Err(expected));
            assert_eq!(
                commit_spec_tokens(&mut self.running, &bad[1..]),
                Err(KvError::BatchLengthMismatch {
                    expected: bad.len(),
                    got: bad.len() - 1
                })
            );
            assert_eq!(
                self.snapshot(&[]),
                before,
                "a refused commit changes nothing"
            );
        }
        // 0 stands for a request found finished or retracted at resolve time.
        let accepted: Vec<usize> = (0..headroom.len())
            .map(|i| accepts.get(i).copied().unwrap_or(1) % (steps + 2))
            .collect();
        let committed: Vec<usize> = self
            .running
            .reqs()
            .iter()
            .map(|r| r.kv().kv_committed_len())
            .collect();
        commit_spec_tokens(&mut self.running, &accepted).unwrap();
        for (i, req) in self.running.reqs_mut().iter_mut().enumerate() {
            assert_eq!(req.kv().kv_committed_len(), committed[i] + accepted[i]);
            for _ in 0..accepted[i] {
                Self::sample(req);
            }
        }
    }

    fn omit_from_check(&mut self, pick: usize, chunking: bool) {
        let Some((req, from_chunking)) = self.take_picked(pick, chunking) else {
            return;
        };
        let kv = req.kv();
        let own_pages =
            (ceil_align(kv.kv_allocated_len(), self.ps()) - kv.cache_protected_len()) / self.ps();
        assert_eq!(
            self.cache.check(self.live_reqs()),
            Err(Violation::UnclaimedRow {
                row: req.held_row().unwrap(),
                assigned_to: Some(req.rid()),
                unclaimed_pages: own_pages,
            }),
            "the checker names the left-out request and exactly its pages"
        );
        self.put_back(req, from_chunking);
    }

    fn drop_and_reclaim(&mut self, pick: usize, chunking: bool, refused: bool) {
        let Some((req, _)) = self.take_picked(pick, chunking) else {
            return;
        };
        let kv = req.kv();
        let row = req.held_row().unwrap();
        let ps = self.ps();
        let mut own_pages: Vec<PageId> = self.cache.req_to_token().row(row).unwrap()
            [kv.cache_protected_len()..kv.kv_allocated_len()]
            .iter()
            .map(|&slot| slot / ps as PageId)
            .collect();
        own_pages.sort_unstable();
        own_pages.dedup();
        let lock = req.last_node();
        let (rid, available) = (req.rid(), self.cache.available_size());
        drop(req);

        if refused && !own_pages.is_empty() {
            let before = self.snapshot(&[]);
            self.free_faults.set_frees_left(Some(0));
            let result = self.reclaim();
            self.free_faults.set_frees_left(None);
            assert!(
                matches!(result, Err(ReclaimError::Free { pages, .. }) if pages == own_pages.len()),
                "{result:?}"
            );
            assert_eq!(
                self.snapshot(&[]),
                before,
                "a refused reclaim changes nothing"
            );
        }
        let reclaimed = self.reclaim().unwrap();
        assert_eq!(reclaimed.rows, vec![(row, Some(rid))]);
        assert!(!reclaimed.is_empty());
        assert_eq!(
            reclaimed.pages, own_pages,
            "exactly the request's own pages"
        );
        let expected_locks = if lock == TreePos::ROOT {
            vec![]
        } else {
            vec![(lock.node, 1)]
        };
        assert_eq!(reclaimed.locks, expected_locks, "exactly its one lock");
        assert_eq!(
            self.cache.available_size(),
            available + own_pages.len() * ps
        );
        assert!(
            self.reclaim().unwrap().is_empty(),
            "a second reclaim finds nothing"
        );
    }

    fn refused_free(&mut self, pick: usize, chunking: bool, call: RefusedCall) {
        let Some((mut req, from_chunking)) = self.take_picked(pick, chunking) else {
            return;
        };
        let before = self.snapshot(std::slice::from_ref(&req));
        self.free_faults.set_frees_left(Some(0));
        let result = match call {
            RefusedCall::Release { insert } => release_kv_cache(&mut req, &mut self.cache, insert),
            RefusedCall::Register => cache_unfinished_req(&mut req, &mut self.cache),
        };
        self.free_faults.set_frees_left(None);
        match result {
            Err(KvError::Alloc(AllocError::NotAllocated { .. })) => assert_eq!(
                self.snapshot(std::slice::from_ref(&req)),
                before,
                "a call whose free is refused changes nothing"
            ),
            Err(error) => panic!("{call:?} failed with {error} instead of the refused free"),
            Ok(()) => {
                // Only a registration without duplicates to free goes through.
                assert!(
                    matches!(call, RefusedCall::Register),
                    "a release always frees"
                );
                let kv = req.kv();
                let registered = if self.cfg.radix {
                    floor_align(kv.kv_committed_len(), self.ps())
                } else {
                    0
                };
                assert_eq!(kv.cache_protected_len(), registered);
            }
        }
        self.put_back(req, from_chunking);
    }

    fn apply(&mut self, op: &Op) {
        match op {
            Op::Admit {
                new,
                readmit,
                with_chunking,
                in_free_group,
            } => self.admit(new, *readmit, *with_chunking, *in_free_group),
            Op::Oversize { count, extra } => self.oversize(*count, *extra),
            Op::Decode {
                checked,
                accepts,
                overcommit,
            } => self.decode(*checked, accepts, *overcommit),
            Op::Finish { pick } => self.finish_one(*pick),
            Op::Abort { pick, chunking } => self.abort(*pick, *chunking),
            Op::FinishGroup { picks } => self.finish_group(picks),
            Op::Evict { tokens, refused } => self.evict(*tokens, *refused),
            Op::MatchDrop { req } => self.match_drop(req),
            Op::OtherCache { pick, chunking } => self.other_cache(*pick, *chunking),
            Op::RefusedFree {
                pick,
                chunking,
                call,
            } => self.refused_free(*pick, *chunking, *call),
            Op::OmitFromCheck { pick, chunking } => self.omit_from_check(*pick, *chunking),
            Op::DropAndReclaim {
                pick,
                chunking,
                refused,
            } => self.drop_and_reclaim(*pick, *chunking, *refused),
        }
        self.check();
    }

    fn drain(mut self) {
        while let Some(mut req) = self.take_running(0) {
            self.finish(&mut req, true);
        }
        while let Some(mut req) = self.chunking.pop() {
            self.finish(&mut req, false);
        }
        self.check();
        assert_eq!(self.cache.tree().protected_size(), 0, "no lock is left");
        let capacity = self.cache.allocator().capacity();
        self.cache.evict_shortfall(capacity + 1).unwrap();
        assert_eq!(self.cache.available_size(), capacity);
        assert_eq!(self.tree_total(), 0);
        assert_eq!(
            self.cache.req_to_token().available_size(),
            self.cfg.rows,
            "every row is back"
        );
        self.check();
    }
}

fn run(cfg: Cfg, ops: &[Op]) {
    let tokens = cfg.pool_pages * cfg.page_size;
    if cfg.token_alloc {
        let allocator = TokenAllocator::new(tokens, cfg.need_sort).unwrap();
        run_with(Sim::new(cfg, allocator), ops);
    } else {
        let allocator = PagedAllocator::new(tokens, cfg.page_size, cfg.need_sort).unwrap();
        run_with(Sim::new(cfg, allocator), ops);
    }
}

fn run_with<R: ReuseOrder>(mut sim: Sim<R>, ops: &[Op])
where
    PageAllocator<R>: KvAllocator,
{
    sim.check();
    for op in ops {
        sim.apply(op);
    }
    sim.drain();
}

proptest! {
    #![proptest_config(common::proptest_config())]

    #[test]
    fn batch_flow_page_1_radix(cfg in cfg(1, true), ops in prop::collection::vec(op(), 1..80)) {
        run(cfg, &ops);
    }

    #[test]
    fn batch_flow_page_1_no_cache(cfg in cfg(1, false), ops in prop::collection::vec(op(), 1..80)) {
        run(cfg, &ops);
    }

    #[test]
    fn batch_flow_page_4_radix(cfg in cfg(4, true), ops in prop::collection::vec(op(), 1..80)) {
        run(cfg, &ops);
    }

    #[test]
    fn batch_flow_page_4_no_cache(cfg in cfg(4, false), ops in prop::collection::vec(op(), 1..80)) {
        run(cfg, &ops);
    }

    // A page size that is not a power of two: the division paths, not the masks.
    #[test]
    fn batch_flow_page_3_radix(cfg in cfg(3, true), ops in prop::collection::vec(op(), 1..80)) {
        run(cfg, &ops);
    }

    #[test]
    fn batch_flow_page_3_no_cache(cfg in cfg(3, false), ops in prop::collection::vec(op(), 1..80)) {
        run(cfg, &ops);
    }

    #[test]
    fn batch_flow_page_16_radix(cfg in cfg(16, true), ops in prop::collection::vec(op(), 1..80)) {
        run(cfg, &ops);
    }

    #[test]
    fn batch_flow_page_16_no_cache(cfg in cfg(16, false), ops in prop::collection::vec(op(), 1..80)) {
        run(cfg, &ops);
    }
}
