//! The batch flow replayed against a model of sglang 0.5.23's: random scenarios of arrivals,
//! admission (with chunked prefill), decode steps, finishes, and retraction (forced, and under
//! memory pressure), at page sizes 1 (the token allocator) and 16, with the radix cache on (under
//! the policies that read no hit count) and off, driven the way sglang's scheduler drives its
//! own. After every operation the two must agree on `out_cache_loc`, each request's row, lengths
//! and row contents, the free list in order, the free request rows in order, the evictable and
//! protected sizes and the cached pages.
//!
//! The model restates sglang's rules (`python/sglang/srt/`), a function per function:
//! * `mem_cache/allocator/paged.py`, `PagedTokenToKVPoolAllocator`: `alloc_extend` (the three
//!   parts of `alloc_extend_naive`), `alloc_decode`, `free_segment` (the pages of
//!   `free_index[::page_size]`, in row order, put in front of the free list), `free_group_begin`
//!   / `free_group_end` (the deferred pages put in front, in call order); `token.py`,
//!   `TokenToKVPoolAllocator`: `alloc` from the front, `free` appended.
//! * `mem_cache/memory_pool.py`, `ReqToTokenPool`: `alloc_rows` from the tail, `free` appended.
//! * `mem_cache/radix_cache.py` (`common/sglang_radix.rs`): `match_prefix`, `insert`,
//!   `_split_node`, `evict` (one free per node), locks; `checkpoint` (`_insert_cache` with the
//!   prompt split, the duplicates freed, the second `match_prefix`, the row pointed at the tree,
//!   the lock moved).
//! * `mem_cache/common.py`: `match_kv_cache`, `release_kv_cache` (checkpoint, the row's tail,
//!   the over-allocation, the row), `evict_from_tree_cache` / `evict_to_free_tokens` (what the
//!   free slots lack of the demand).
//! * `mem_cache/allocation.py`: `alloc_for_extend` (`alloc_req_slots`, then
//!   `alloc_token_slots(extend_num_tokens)` at page size 1 or `alloc_paged_token_slots_extend`,
//!   whose demand is `extend_num_tokens + len(reqs) * page_size`), `alloc_for_decode_default`
//!   (`alloc_token_slots(bs)`, or `alloc_paged_token_slots_decode`, demand `bs * page_size`).
//! * `managers/schedule_batch.py`: `check_decode_mem`, `retract_decode` (the order of
//!   `_get_decode_retraction_order`, `release_req` with its eviction of `remaining_req_count *
//!   SGLANG_RETRACT_DECODE_STEPS`, `filter_batch(keep_indices=sorted_indices)`),
//!   `reset_for_retract`.
//! * The scheduler (`managers/scheduler.py`, `scheduler_components/batch_result_processor.py`):
//!   a prefill's results processed in a free group, where a request that goes on to decode is
//!   checkpointed (`checkpoint_kv_cache`) and one that finished released with its KV inserted; a
//!   chunk checkpointed before the next one; a decode step's results processed in a free group,
//!   the finished released; retraction when `check_decode_mem` fails.
//!
//! Where kvown differs on purpose, the replay states it: a released request's record is zero in
//! kvown, where sglang keeps its committed and protected lengths (compared only while a request
//! holds a row). The admission is the driver's (a request is admitted when the batch's pages fit
//! in what is free or evictable), so no allocation runs out of memory, as sglang's scheduler
//! guarantees.
//!
//! Soak: `PROPTEST_CASES=3000 cargo test --release -p kvown-runtime --test it batch_replay::`.

use crate::common;
use crate::common::sglang_radix;

use std::fmt::{self, Write as _};

use kvown_runtime::alloc::{
    KvSlot, PageAllocator, PageId, PagedAllocator, ReuseOrder, TokenAllocator,
};
use kvown_runtime::batch::{
    Req, ScheduleBatch, alloc_for_decode, alloc_for_extend, cache_unfinished_req, check_decode_mem,
    init_next_round_input, prepare_for_decode, prepare_for_extend, release_kv_cache,
    retract_decode,
};
use kvown_runtime::cache::{EvictionRules, KvCache, TreeCache};
use kvown_runtime::radix::{EvictionPolicy, RadixCache, RadixConfig, TreePos};
use kvown_runtime::slots::ReqToTokenPool;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sglang_radix::{Model, ROOT};

/// Request rows of both pools.
const ROWS: usize = 6;

/// Positions per row: more than any request reaches.
const WIDTH: usize = 160;

/// The policies replayed: those whose order reads no hit count (sglang 0.5.23 counts a hit only
/// past a request's `cache_inserted_len`, which kvown does not keep; see the README).
const POLICIES: [EvictionPolicy; 5] = [
    EvictionPolicy::Lru,
    EvictionPolicy::Fifo,
    EvictionPolicy::Filo,
    EvictionPolicy::Mru,
    EvictionPolicy::Priority,
];

// ---------------------------------------------------------------------------------------------
// sglang's allocator, request rows and requests
// ---------------------------------------------------------------------------------------------

/// `PagedTokenToKVPoolAllocator` (page size above 1) or `TokenToKVPoolAllocator` (page size 1,
/// where a page is a slot), `need_sort` off.
#[derive(Debug)]
struct SgAllocator {
    page_size: usize,
    /// The free list, head first.
    free: Vec<PageId>,
    /// Pages deferred by the open free group, in call order (`free_page_ids_group`).
    group: Option<Vec<PageId>>,
}

impl SgAllocator {
    /// `clear`: pages `1..=pages` free.
    fn new(pages: usize, page_size: usize) -> Self {
        SgAllocator {
            page_size,
            free: (1..=pages as PageId).collect(),
            group: None,
        }
    }

    fn available(&self) -> usize {
        self.free.len() * self.page_size
    }

    /// `_release_page_ids` (paged: in front) or `free` (token: appended).
    fn release(&mut self, pages: &[PageId]) {
        if self.page_size == 1 {
            self.free.extend_from_slice(pages);
        } else {
            self.free.splice(0..0, pages.iter().copied());
        }
    }

    /// `free_page_ids` (paged) or `free` (token; a page is a slot), deferred in a free group.
    fn free_page_ids(&mut self, pages: &[PageId]) {
        match &mut self.group {
            Some(group) => group.extend_from_slice(pages),
            None => self.release(pages),
        }
    }

    /// `free_segment`: the page of every `page_size`-th slot from a page-aligned start.
    fn free_segment(&mut self, slots: &[KvSlot]) {
        let pages: Vec<PageId> = slots
            .iter()
            .step_by(self.page_size)
            .map(|&slot| slot / self.page_size as KvSlot)
            .collect();
        self.free_page_ids(&pages);
    }

    fn free_group_begin(&mut self) {
        self.group = Some(Vec::new());
    }

    /// `free_group_end`: the deferred pages released as one call, in call order.
    fn free_group_end(&mut self) {
        let pages = self.group.take().expect("a group is open");
        self.release(&pages);
    }

    /// `alloc_extend` (`alloc_extend_naive`'s three parts per request) or, at page size 1,
    /// `alloc(extend_num_tokens)`; `shapes` are `(prefix_len, seq_len, last_loc)`.
    fn alloc_extend(&mut self, shapes: &[(usize, usize, Option<KvSlot>)]) -> Vec<KvSlot> {
        let ps = self.page_size;
        let new_pages: usize = shapes
            .iter()
            .map(|&(prefix, seq, _)| seq.div_ceil(ps) - prefix.div_ceil(ps))
            .sum();
        assert!(new_pages <= self.free.len(), "sglang out of memory");
        let pages: Vec<PageId> = self.free.drain(..new_pages).collect();
        let mut pages = pages.iter();
        let mut out = Vec::new();
        for &(prefix, seq, last_loc) in shapes {
            let first_new = seq.min(prefix.div_ceil(ps) * ps);
            for i in 0..first_new - prefix {
                out.push(last_loc.expect("a partial page has a last slot") + 1 + i as KvSlot);
            }
            let mut position = first_new;
            while position < seq {
                let page = *pages.next().expect("counted") as usize;
                let end = seq.min(position + ps);
                out.extend((position..end).map(|p| (page * ps + p % ps) as KvSlot));
                position = end;
            }
        }
        out
    }

    /// `alloc_decode` (a new page when the token opens one) or, at page size 1, `alloc(bs)`;
    /// `shapes` are `(positions stored before, last slot)`.
    fn alloc_decode(&mut self, shapes: &[(usize, KvSlot)]) -> Vec<KvSlot> {
        let ps = self.page_size;
        let new_pages = shapes.iter().filter(|(len, _)| len % ps == 0).count();
        assert!(new_pages <= self.free.len(), "sglang out of memory");
        let mut pages = self.free.drain(..new_pages).collect::<Vec<_>>().into_iter();
        shapes
            .iter()
            .map(|&(len, last)| match len % ps {
                0 => pages.next().expect("counted") * ps as KvSlot,
                _ => last + 1,
            })
            .collect()
    }
}

/// sglang's `Req` and its `ReqKvInfo`, as far as the batch flow reads them.
#[derive(Debug, Clone)]
struct SgReq {
    rid: u64,
    origin: Vec<u32>,
    outputs: Vec<u32>,
    priority: i32,
    max_new: usize,
    row: Option<usize>,
    protected: usize,
    inserted: usize,
    committed: usize,
    allocated: usize,
    /// The matched prefix's slots (`prefix_indices`) of a request without a row.
    prefix: Vec<KvSlot>,
    /// The node its lock holds (`req.lock`; the root for none).
    last_node: usize,
    extend_end: usize,
}

impl SgReq {
    fn fill(&self) -> Vec<u32> {
        [&self.origin[..], &self.outputs[..]].concat()
    }

    /// The next extend starts here: the committed length of a request holding a row.
    fn prefix_len(&self) -> usize {
        match self.row {
            Some(_) => self.committed,
            None => self.prefix.len(),
        }
    }
}

/// How often a scenario reached each rule (for [`the_scenarios_reach_every_rule`]).
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    /// Evictions by cause: before an extend, before a decode, by `check_decode_mem`, after a
    /// retraction's release.
    evictions: [usize; 4],
    /// Evictions whose demand exceeded the allocation's need.
    beyond_need: usize,
    /// Prompt re-inserts (`split_prompt`).
    prompt_splits: usize,
    /// Matched prefixes adopted at admission.
    hits: usize,
    chunks: usize,
    retracted: usize,
    pressure_retractions: usize,
    aborted: usize,
    finished: usize,
}

/// Why the model evicts (the index into [`Coverage::evictions`]).
#[derive(Debug, Clone, Copy)]
enum Cause {
    Extend,
    Decode,
    Check,
    Retract,
}

/// sglang's pool, rows, table and tree, and the last `out_cache_loc`.
#[derive(Debug)]
struct Sglang {
    coverage: Coverage,
    alloc: SgAllocator,
    /// `ReqToTokenPool.free_slots`.
    free_rows: Vec<usize>,
    table: Vec<Vec<KvSlot>>,
    tree: Option<Model>,
    out_cache_loc: Vec<KvSlot>,
}

impl Sglang {
    fn page_size(&self) -> usize {
        self.alloc.page_size
    }

    /// `evict_from_tree_cache` / `evict_to_free_tokens`: what the free slots lack of
    /// `num_tokens`, evicted node by node, each node's pages with one `free_segment`.
    fn evict_to_free_tokens(&mut self, num_tokens: usize, cause: Cause) {
        let Some(tree) = &mut self.tree else { return };
        let available = self.alloc.available();
        if num_tokens > available {
            let (evicted, frees) = tree.evict(num_tokens - available);
            self.coverage.evictions[cause as usize] += usize::from(evicted > 0);
            for pages in frees {
                self.alloc.free_page_ids(&pages);
            }
        }
    }

    fn evictable(&self) -> usize {
        self.tree.as_ref().map_or(0, |tree| tree.evictable_size)
    }

    fn protected(&self) -> usize {
        self.tree.as_ref().map_or(0, |tree| tree.protected_size)
    }

    /// The slots of the tree path ending at `node`.
    fn path_slots(&self, node: usize) -> Vec<KvSlot> {
        let ps = self.page_size();
        let tree = self.tree.as_ref().expect("a tree");
        tree.path_pages(node)
            .iter()
            .flat_map(|&page| (0..ps).map(move |offset| page * ps as KvSlot + offset as KvSlot))
            .collect()
    }

    fn lock(&mut self, node: usize) {
        if let Some(tree) = &mut self.tree {
            tree.inc_lock_ref(node);
        }
    }

    fn unlock(&mut self, node: usize) {
        if let Some(tree) = &mut self.tree {
            tree.dec_lock_ref(node);
        }
    }

    /// `init_next_round_input` with `match_kv_cache` for a request without a row: match
    /// `fill[..len - 1]` (`_compute_max_prefix_len`), adopt the hit; then the extend's end.
    fn init_next_round_input(&mut self, req: &mut SgReq, max_extend: usize) {
        if req.row.is_none() {
            let fill = req.fill();
            let (len, node) = match &mut self.tree {
                Some(tree) => tree.match_prefix(&fill[..fill.len() - 1]),
                None => (0, ROOT),
            };
            req.prefix = match node {
                ROOT => Vec::new(),
                node => self.path_slots(node)[..len].to_vec(),
            };
            req.last_node = node;
            req.protected = len;
            self.coverage.hits += usize::from(len > 0);
        }
        let fill_len = req.origin.len() + req.outputs.len();
        req.extend_end = fill_len.min(req.prefix_len().saturating_add(max_extend.max(1)));
    }

    /// `alloc_for_extend`: rows, eviction for the demand, `alloc_extend`, the table.
    fn alloc_for_extend(&mut self, reqs: &mut [SgReq]) {
        let ps = self.page_size();
        let needing = reqs.iter().filter(|req| req.row.is_none()).count();
        let at = self.free_rows.len() - needing;
        let mut new_rows = self.free_rows.split_off(at).into_iter();
        let shapes: Vec<(usize, usize, Option<KvSlot>)> = reqs
            .iter()
            .map(|req| {
                let prefix = req.prefix_len();
                let last = match req.row {
                    Some(row) => prefix.checked_sub(1).map(|p| self.table[row][p]),
                    None => req.prefix.last().copied(),
                };
                (prefix, req.extend_end, last)
            })
            .collect();
        let tokens: usize = shapes.iter().map(|&(prefix, seq, _)| seq - prefix).sum();
        let demand = match ps {
            1 => tokens,
            _ => tokens + reqs.len() * ps,
        };
        let needed: usize = shapes
            .iter()
            .map(|&(prefix, seq, _)| (seq.div_ceil(ps) - prefix.div_ceil(ps)) * ps)
            .sum();
        let evictable = self.evictable();
        self.coverage.beyond_need += usize::from(
            evictable > 0 && needed <= self.alloc.available() && demand > self.alloc.available(),
        );
        self.evict_to_free_tokens(demand, Cause::Extend);
        let out = self.alloc.alloc_extend(&shapes);
        let mut offset = 0;
        for (req, &(prefix, seq, _)) in reqs.iter_mut().zip(&shapes) {
            if req.row.is_none() {
                let row = new_rows.next().expect("a row each");
                self.table[row][..prefix].copy_from_slice(&req.prefix);
                req.prefix.clear();
                req.row = Some(row);
            }
            let row = req.row.expect("a row");
            self.table[row][prefix..seq].copy_from_slice(&out[offset..offset + seq - prefix]);
            offset += seq - prefix;
            req.allocated = seq;
            req.committed = seq;
        }
        self.out_cache_loc = out;
    }

    /// `RadixCache.checkpoint(req, up_to)`: `_insert_cache` (the key's whole pages inserted,
    /// `cache_inserted_len` raised, the prompt's whole pages inserted again at the priority
    /// plus one when they are a shorter prefix, the duplicates freed), then `match_prefix` of the
    /// key, the row pointed at the tree's slots, the protected length and the lock moved.
    fn checkpoint(&mut self, req: &mut SgReq, up_to: usize) {
        let ps = self.page_size();
        let Some(tree) = &mut self.tree else { return };
        let row = req.row.expect("a row");
        let fill = req.fill();
        let key_len = up_to / ps * ps;
        let key = &fill[..key_len];
        let pages: Vec<PageId> = self.table[row][..key_len]
            .iter()
            .step_by(ps)
            .map(|&slot| slot / ps as KvSlot)
            .collect();
        let (prefix_len, _) = tree.insert(key, &pages, req.priority, true);
        req.inserted = req.inserted.max(key_len);
        let prompt_len = up_to.min(req.origin.len()) / ps * ps;
        if 0 < prompt_len && prompt_len < key_len {
            self.coverage.prompt_splits += 1;
            let priority = req.priority.saturating_add(1);
            tree.insert(
                &key[..prompt_len],
                &pages[..prompt_len / ps],
                priority,
                true,
            );
        }
        let (len, node) = tree.match_prefix(key);
        assert_eq!(len, key_len, "the key is cached");
        if prefix_len > req.protected {
            let duplicates = self.table[row][req.protected..prefix_len].to_vec();
            self.alloc.free_segment(&duplicates);
        }
        let cached = self.path_slots(node);
        self.table[row][req.protected..len].copy_from_slice(&cached[req.protected..]);
        req.protected = len;
        self.unlock(req.last_node);
        self.lock(node);
        req.last_node = node;
    }

    /// `release_kv_cache(req, checkpoint)`: the checkpoint, `[protected, committed)` freed, the
    /// lock dropped, the over-allocation from `ceil_align(committed)` freed, the row freed.
    fn release(&mut self, req: &mut SgReq, checkpoint: bool) {
        let ps = self.page_size();
        let row = req.row.expect("a row");
        let owned = req.committed;
        if checkpoint {
            self.checkpoint(req, owned);
        }
        let tail = self.table[row][req.protected..owned].to_vec();
        if !tail.is_empty() {
            self.alloc.free_segment(&tail);
        }
        self.unlock(req.last_node);
        req.last_node = ROOT;
        let over_start = owned.div_ceil(ps) * ps;
        if over_start < req.allocated {
            let over = self.table[row][over_start..req.allocated].to_vec();
            self.alloc.free_segment(&over);
        }
        self.free_rows.push(row);
        req.row = None;
        req.allocated = 0;
    }

    /// `new_tokens_required_next_decode` then `check_decode_capacity`.
    fn check_decode_mem(&mut self, reqs: &[SgReq]) -> bool {
        let ps = self.page_size();
        let needed = reqs.iter().filter(|req| req.committed % ps == 0).count() * ps;
        self.evict_to_free_tokens(needed, Cause::Check);
        self.alloc.available() >= needed
    }

    /// `alloc_for_decode_default`: eviction for `bs` slots or `bs` pages, then one slot each.
    fn alloc_for_decode(&mut self, reqs: &mut [SgReq]) {
        self.evict_to_free_tokens(reqs.len() * self.page_size(), Cause::Decode);
        let shapes: Vec<(usize, KvSlot)> = reqs
            .iter()
            .map(|req| {
                let row = req.row.expect("a row");
                (req.allocated, self.table[row][req.allocated - 1])
            })
            .collect();
        let out = self.alloc.alloc_decode(&shapes);
        for (req, &slot) in reqs.iter_mut().zip(&out) {
            let row = req.row.expect("a row");
            self.table[row][req.allocated] = slot;
            req.allocated += 1;
            req.committed += 1;
        }
        self.out_cache_loc = out;
    }

    /// `retract_decode`: returns the retracted and the aborted, in the order taken out; the batch
    /// keeps the rest in `sorted_indices` order.
    fn retract_decode(&mut self, batch: &mut Vec<SgReq>, steps: usize) -> (Vec<SgReq>, Vec<SgReq>) {
        let mut sorted: Vec<usize> = (0..batch.len()).collect();
        // `sort(key=(len(output_ids), -len(origin_input_ids)), reverse=True)`, stable.
        sorted.sort_by(|&a, &b| {
            let key = |i: usize| {
                (
                    batch[i].outputs.len(),
                    std::cmp::Reverse(batch[i].origin.len()),
                )
            };
            key(b).cmp(&key(a))
        });
        let (mut retracted, mut aborted) = (Vec::new(), Vec::new());
        let mut first = true;
        loop {
            if !first {
                let left: Vec<SgReq> = sorted.iter().map(|&i| batch[i].clone()).collect();
                if self.check_decode_mem(&left) {
                    break;
                }
            }
            if sorted.len() == 1 {
                break;
            }
            first = false;
            let index = sorted.pop().expect("two or more");
            let mut req = batch[index].clone();
            self.release(&mut req, false);
            self.evict_to_free_tokens(sorted.len() * steps, Cause::Retract);
            req.protected = 0;
            req.inserted = 0;
            retracted.push(req);
        }
        if sorted.len() <= 1 {
            let left: Vec<SgReq> = sorted.iter().map(|&i| batch[i].clone()).collect();
            if !self.check_decode_mem(&left) {
                let index = sorted.pop().expect("one");
                let mut req = batch[index].clone();
                self.release(&mut req, false);
                aborted.push(req);
            }
        }
        *batch = sorted.iter().map(|&i| batch[i].clone()).collect();
        (retracted, aborted)
    }
}

// ---------------------------------------------------------------------------------------------
// Scenarios
// ---------------------------------------------------------------------------------------------

/// One step of a scenario, replayed on kvown and on the model.
#[derive(Debug, Clone)]
enum Op {
    /// A request arrives: the first `cut` tokens (modulo its length + 1) of an earlier prompt
    /// (`base`, modulo their number), then `tail` new tokens; it finishes after `max_new`
    /// outputs.
    Arrive {
        base: usize,
        cut: usize,
        tail: usize,
        max_new: usize,
        priority: i32,
    },
    /// Admission: the chunked request first, then up to `take` waiting requests while they fit,
    /// each extending at most `chunk` pages (none: the whole prompt); the batch is extended and
    /// its results processed in a free group.
    Admit { take: usize, chunk: Option<usize> },
    /// A decode step: `check_decode_mem`, `retract_decode` when it fails, the decode, and its
    /// results processed in a free group (the finished released).
    Decode,
    /// `retract_decode` whatever the memory: at least one request goes when two or more run.
    Retract,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0usize..8, 0usize..80, 0usize..40, 1usize..12, -1i32..2).prop_map(
            |(base, cut, tail, max_new, priority)| Op::Arrive { base, cut, tail, max_new, priority }
        ),
        3 => (1usize..4, prop_oneof![Just(None), (1usize..4).prop_map(Some)])
            .prop_map(|(take, chunk)| Op::Admit { take, chunk }),
        6 => Just(Op::Decode),
        1 => Just(Op::Retract),
    ]
}

/// What a scenario runs on: the page size, the pool, the tree and its policy.
#[derive(Debug, Clone, Copy)]
struct Setup {
    page_size: usize,
    pages: usize,
    policy: Option<EvictionPolicy>,
}

fn setup() -> impl Strategy<Value = Setup> {
    let policy = prop_oneof![
        1 => Just(None),
        3 => prop::sample::select(POLICIES.to_vec()).prop_map(Some),
    ];
    (prop_oneof![Just(1usize), Just(16)], policy).prop_flat_map(|(page_size, policy)| {
        let pages = match page_size {
            1 => 24usize..96,
            _ => 3usize..10,
        };
        pages.prop_map(move |pages| Setup {
            page_size,
            pages,
            policy,
        })
    })
}

/// The output token `index` of request `rid`: a few values, so that outputs are shared too.
fn output_token(rid: u64, index: usize) -> u32 {
    200 + ((rid as usize / 3 + index) % 4) as u32
}

// ---------------------------------------------------------------------------------------------
// The replay
// ---------------------------------------------------------------------------------------------

/// A request on both sides.
struct Pair {
    kvown: Req,
    sglang: SgReq,
}

/// kvown's batch flow and the model, fed the same scenario.
struct World<R: ReuseOrder> {
    setup: Setup,
    cache: KvCache<PageAllocator<R>>,
    sglang: Sglang,
    waiting: Vec<Pair>,
    chunked: Option<Pair>,
    running: ScheduleBatch,
    running_sglang: Vec<SgReq>,
    finished: Vec<Pair>,
    /// Every prompt so far (what [`Op::Arrive`] picks its base from).
    prompts: Vec<Vec<u32>>,
    /// kvown's `out_cache_loc` of the last allocation.
    out_cache_loc: Vec<KvSlot>,
    next_rid: u64,
    trace: Vec<String>,
}

/// A step's outcome: a failure names what differs.
type Step = Result<(), String>;

fn same<T: PartialEq + fmt::Debug>(what: &str, kvown: T, sglang: T) -> Step {
    if kvown == sglang {
        Ok(())
    } else {
        Err(format!("{what}: kvown {kvown:?}, sglang {sglang:?}"))
    }
}

/// A kvown call that must succeed.
fn ok<T, E: fmt::Display>(what: &str, result: Result<T, E>) -> Result<T, String> {
    result.map_err(|error| format!("kvown {what}: {error}"))
}

impl<R: ReuseOrder> World<R> {
    fn new(setup: Setup, allocator: PageAllocator<R>) -> Self {
        let tree = match setup.policy {
            Some(policy) => TreeCache::Radix(
                RadixCache::new(RadixConfig::new(setup.page_size).with_policy(policy)).unwrap(),
            ),
            None => TreeCache::Disabled,
        };
        let rows = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
        World {
            setup,
            cache: KvCache::new(allocator, rows, tree).unwrap(),
            sglang: Sglang {
                coverage: Coverage::default(),
                alloc: SgAllocator::new(setup.pages, setup.page_size),
                free_rows: (1..=ROWS).collect(),
                table: vec![vec![0; WIDTH]; ROWS + 1],
                tree: setup
                    .policy
                    .map(|policy| Model::new(setup.page_size, policy)),
                out_cache_loc: Vec::new(),
            },
            waiting: Vec::new(),
            chunked: None,
            running: ScheduleBatch::new(Vec::new()),
            running_sglang: Vec::new(),
            finished: Vec::new(),
            prompts: Vec::new(),
            out_cache_loc: Vec::new(),
            next_rid: 1,
            trace: Vec::new(),
        }
    }

    fn page_size(&self) -> usize {
        self.setup.page_size
    }

    fn apply(&mut self, op: &Op) -> Step {
        match *op {
            Op::Arrive {
                base,
                cut,
                tail,
                max_new,
                priority,
            } => self.arrive(base, cut, tail, max_new, priority),
            Op::Admit { take, chunk } => self.admit(take, chunk),
            Op::Decode => self.decode(),
            Op::Retract => self.retract(),
        }
    }

    fn arrive(
        &mut self,
        base: usize,
        cut: usize,
        tail: usize,
        max_new: usize,
        priority: i32,
    ) -> Step {
        let rid = self.next_rid;
        self.next_rid += 1;
        let mut prompt = match self.prompts.len() {
            0 => Vec::new(),
            n => {
                let base = &self.prompts[base % n];
                base[..cut % (base.len() + 1)].to_vec()
            }
        };
        prompt.extend((0..tail.max(1)).map(|i| ((rid as usize * 7 + i) % 5) as u32));
        // Whole requests fit a row and, alone, the pool (with a page to spare for decoding).
        let room = (self.setup.pages - 1) * self.page_size();
        prompt.truncate(
            (WIDTH - max_new - 1)
                .min(room.saturating_sub(max_new + 1))
                .max(1),
        );
        self.prompts.push(prompt.clone());
        self.trace.push(format!(
            "arrive rid {rid}: {} tokens, max_new {max_new}, priority {priority}",
            prompt.len()
        ));
        let sglang = SgReq {
            rid,
            origin: prompt.clone(),
            outputs: Vec::new(),
            priority,
            max_new,
            row: None,
            protected: 0,
            inserted: 0,
            committed: 0,
            allocated: 0,
            prefix: Vec::new(),
            last_node: ROOT,
            extend_end: 0,
        };
        let kvown = Req::new(rid, prompt).with_priority(priority);
        self.waiting.push(Pair { kvown, sglang });
        Ok(())
    }

    /// Slots the extend of `pair` takes in new pages.
    fn pages_needed(&self, pair: &Pair) -> usize {
        let ps = self.page_size();
        let (prefix, end) = (pair.kvown.prefix_len(), pair.kvown.extend_end());
        (end.div_ceil(ps) - prefix.div_ceil(ps)) * ps
    }

    fn admit(&mut self, take: usize, chunk: Option<usize>) -> Step {
        let max_extend = chunk.map_or(usize::MAX, |pages| pages * self.page_size());
        let mut admitted: Vec<Pair> = Vec::new();
        if let Some(mut pair) = self.chunked.take() {
            ok(
                "init_next_round_input",
                init_next_round_input(&mut pair.kvown, &mut self.cache, max_extend),
            )?;
            self.sglang
                .init_next_round_input(&mut pair.sglang, max_extend);
            admitted.push(pair);
        }
        let mut needed: usize = admitted.iter().map(|pair| self.pages_needed(pair)).sum();
        if needed > self.cache.available_with_eviction() {
            // The chunk does not fit now: it waits (nothing changed but its extend's end).
            self.chunked = admitted.pop();
            return Ok(());
        }
        let mut rows = 0;
        let limit = admitted.len() + take;
        while admitted.len() < limit
            && !self.waiting.is_empty()
            && admitted
                .last()
                .is_none_or(|pair| pair.kvown.extend_end() == pair.kvown.fill_ids().len())
        {
            let mut pair = self.waiting.remove(0);
            ok(
                "init_next_round_input",
                init_next_round_input(&mut pair.kvown, &mut self.cache, max_extend),
            )?;
            self.sglang
                .init_next_round_input(&mut pair.sglang, max_extend);
            self.sglang.lock(pair.sglang.last_node);
            let need = self.pages_needed(&pair);
            let room = self.cache.available_with_eviction();
            if rows + 1 > self.cache.req_to_token().available_size() || needed + need > room {
                // Not admitted: its lock goes (sglang never took it).
                if pair.kvown.last_node() != TreePos::ROOT {
                    ok(
                        "release_kv_cache",
                        release_kv_cache(&mut pair.kvown, &mut self.cache, false),
                    )?;
                }
                self.sglang.unlock(pair.sglang.last_node);
                pair.sglang.last_node = ROOT;
                self.waiting.insert(0, pair);
                break;
            }
            needed += need;
            rows += 1;
            admitted.push(pair);
        }
        if admitted.is_empty() {
            return Ok(());
        }
        self.trace.push(format!(
            "admit {:?}",
            admitted
                .iter()
                .map(|pair| (
                    pair.kvown.rid(),
                    pair.kvown.prefix_len(),
                    pair.kvown.extend_end()
                ))
                .collect::<Vec<_>>()
        ));
        let (kvown, mut sglang): (Vec<Req>, Vec<SgReq>) = admitted
            .into_iter()
            .map(|pair| (pair.kvown, pair.sglang))
            .unzip();
        let batch = ok(
            "alloc_for_extend",
            alloc_for_extend(
                prepare_for_extend(ScheduleBatch::new(kvown)),
                &mut self.cache,
            )
            .map_err(|failure| failure.error),
        )?;
        self.sglang.alloc_for_extend(&mut sglang);
        self.out_cache_loc = batch.out_cache_loc().to_vec();
        same(
            "extend out_cache_loc",
            &self.out_cache_loc,
            &self.sglang.out_cache_loc,
        )?;
        // `process_batch_result_prefill`, in a free group.
        let mut group = ok("free_group", self.cache.free_group())?;
        self.sglang.alloc.free_group_begin();
        let mut continuing = Vec::new();
        for (mut kvown, mut sglang) in batch.into_reqs().into_iter().zip(sglang) {
            if kvown.extend_end() < kvown.fill_ids().len() {
                // A chunk: checkpointed before the next (`stash_chunked_request`).
                ok(
                    "cache_unfinished_req",
                    cache_unfinished_req(&mut kvown, &mut group),
                )?;
                let up_to = sglang.extend_end;
                self.sglang.checkpoint(&mut sglang, up_to);
                self.sglang.coverage.chunks += 1;
                self.chunked = Some(Pair { kvown, sglang });
                continue;
            }
            let token = output_token(kvown.rid(), kvown.output_ids().len());
            kvown.push_output(token);
            sglang.outputs.push(token);
            if sglang.outputs.len() >= sglang.max_new {
                ok(
                    "release_kv_cache",
                    release_kv_cache(&mut kvown, &mut group, true),
                )?;
                self.sglang.release(&mut sglang, true);
                self.finished.push(Pair { kvown, sglang });
            } else {
                ok(
                    "cache_unfinished_req",
                    cache_unfinished_req(&mut kvown, &mut group),
                )?;
                let up_to = sglang.extend_end;
                self.sglang.checkpoint(&mut sglang, up_to);
                continuing.push(Pair { kvown, sglang });
            }
        }
        group.commit();
        self.sglang.alloc.free_group_end();
        for pair in continuing {
            self.running.extend_reqs([pair.kvown]);
            self.running_sglang.push(pair.sglang);
        }
        Ok(())
    }

    /// `retract_decode` on both; the retracted wait again, the aborted are done.
    fn retract_both(&mut self) -> Step {
        let steps = self.cache.eviction_rules().retract_decode_steps;
        let outcome = ok(
            "retract_decode",
            retract_decode(&mut self.running, &mut self.cache, None),
        )?;
        let (retracted, aborted) = self.sglang.retract_decode(&mut self.running_sglang, steps);
        let rids = |reqs: &[Req]| reqs.iter().map(Req::rid).collect::<Vec<_>>();
        let sg_rids = |reqs: &[SgReq]| reqs.iter().map(|req| req.rid).collect::<Vec<_>>();
        same("retracted", rids(&outcome.retracted), sg_rids(&retracted))?;
        same("aborted", rids(&outcome.aborted), sg_rids(&aborted))?;
        self.trace.push(format!(
            "retract {:?}, abort {:?}",
            rids(&outcome.retracted),
            rids(&outcome.aborted)
        ));
        self.sglang.coverage.retracted += retracted.len();
        self.sglang.coverage.aborted += aborted.len();
        for (kvown, sglang) in outcome.retracted.into_iter().zip(retracted) {
            self.waiting.push(Pair { kvown, sglang });
        }
        for (kvown, sglang) in outcome.aborted.into_iter().zip(aborted) {
            self.finished.push(Pair { kvown, sglang });
        }
        Ok(())
    }

    fn retract(&mut self) -> Step {
        if self.running.is_empty() {
            return Ok(());
        }
        self.retract_both()
    }

    fn decode(&mut self) -> Step {
        if self.running.is_empty() {
            return Ok(());
        }
        let fits = ok(
            "check_decode_mem",
            check_decode_mem(self.running.reqs(), &mut self.cache, None),
        )?;
        let fits_sglang = self.sglang.check_decode_mem(&self.running_sglang.clone());
        same("check_decode_mem", fits, fits_sglang)?;
        if !fits {
            self.sglang.coverage.pressure_retractions += 1;
            self.retract_both()?;
            if self.running.is_empty() {
                return Ok(());
            }
        }
        let batch = std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new()));
        let prepared = ok(
            "prepare_for_decode",
            prepare_for_decode(batch, &self.cache).map_err(|(_, error)| error),
        )?;
        self.running = ok(
            "alloc_for_decode",
            alloc_for_decode(prepared, &mut self.cache).map_err(|failure| failure.error),
        )?;
        self.sglang.alloc_for_decode(&mut self.running_sglang);
        self.out_cache_loc = self.running.out_cache_loc().to_vec();
        self.trace.push(format!("decode {:?}", self.out_cache_loc));
        same(
            "decode out_cache_loc",
            &self.out_cache_loc,
            &self.sglang.out_cache_loc,
        )?;
        // `process_batch_result_decode`, in a free group: the output, the finished released.
        let mut group = ok("free_group", self.cache.free_group())?;
        self.sglang.alloc.free_group_begin();
        for (kvown, sglang) in self
            .running
            .reqs_mut()
            .iter_mut()
            .zip(&mut self.running_sglang)
        {
            let token = output_token(kvown.rid(), kvown.output_ids().len());
            kvown.push_output(token);
            sglang.outputs.push(token);
        }
        let done: Vec<bool> = self
            .running_sglang
            .iter()
            .map(|req| req.outputs.len() >= req.max_new)
            .collect();
        let mut index = 0;
        let finished = self.running.take_if(|_| {
            index += 1;
            done[index - 1]
        });
        let mut kept = Vec::new();
        let mut finished_sglang = Vec::new();
        for (req, done) in std::mem::take(&mut self.running_sglang)
            .into_iter()
            .zip(&done)
        {
            match done {
                true => finished_sglang.push(req),
                false => kept.push(req),
            }
        }
        self.running_sglang = kept;
        for (mut kvown, mut sglang) in finished.into_iter().zip(finished_sglang) {
            ok(
                "release_kv_cache",
                release_kv_cache(&mut kvown, &mut group, true),
            )?;
            self.sglang.release(&mut sglang, true);
            self.trace.push(format!("finish rid {}", kvown.rid()));
            self.sglang.coverage.finished += 1;
            self.finished.push(Pair { kvown, sglang });
        }
        group.commit();
        self.sglang.alloc.free_group_end();
        Ok(())
    }

    /// Every request's row, lengths and row contents; the lists and sizes.
    fn verify(&self) -> Step {
        let running = self.running.reqs().iter().zip(&self.running_sglang);
        same(
            "running order",
            self.running.reqs().iter().map(Req::rid).collect::<Vec<_>>(),
            self.running_sglang.iter().map(|req| req.rid).collect(),
        )?;
        let others = self
            .waiting
            .iter()
            .chain(&self.chunked)
            .chain(&self.finished)
            .map(|pair| (&pair.kvown, &pair.sglang));
        for (kvown, sglang) in running.chain(others) {
            let what = format!("rid {}", sglang.rid);
            let kv = kvown.kv();
            same(&format!("{what} row"), kv.req_pool_idx(), sglang.row)?;
            same(
                &format!("{what} allocated"),
                kv.kv_allocated_len(),
                sglang.allocated,
            )?;
            match sglang.row {
                Some(row) => {
                    same(
                        &format!("{what} committed"),
                        kv.kv_committed_len(),
                        sglang.committed,
                    )?;
                    same(
                        &format!("{what} protected"),
                        kv.cache_protected_len(),
                        sglang.protected,
                    )?;
                    let table = &self.cache.req_to_token().row(row).unwrap()[..sglang.allocated];
                    same(
                        &format!("{what} row slots"),
                        table,
                        &self.sglang.table[row][..sglang.allocated],
                    )?;
                }
                // kvown zeroes a released record; sglang keeps its lengths (a README difference).
                None => same(
                    &format!("{what} record without a row"),
                    (kv.kv_committed_len(), kv.cache_protected_len()),
                    (0, 0),
                )?,
            }
        }
        let allocator = self.cache.allocator();
        same(
            "free list",
            allocator.free_pages().collect::<Vec<_>>(),
            self.sglang.alloc.free.clone(),
        )?;
        same(
            "free rows",
            self.cache.req_to_token().free_rows().to_vec(),
            self.sglang.free_rows.clone(),
        )?;
        same(
            "evictable",
            self.cache.tree().evictable_size(),
            self.sglang.evictable(),
        )?;
        same(
            "protected",
            self.cache.tree().protected_size(),
            self.sglang.protected(),
        )?;
        if let (Some(tree), Some(model)) = (self.cache.tree().radix(), &self.sglang.tree) {
            let mut cached: Vec<PageId> = tree.cached_pages().map(|(_, page)| page).collect();
            cached.sort_unstable();
            same("cached pages", cached, model.cached_pages())?;
        }
        let held: Vec<&Req> = self
            .running
            .reqs()
            .iter()
            .chain(self.chunked.as_ref().map(|pair| &pair.kvown))
            .chain(self.waiting.iter().map(|pair| &pair.kvown))
            .collect();
        ok("check", self.cache.check(held))
    }

    fn report(&self, index: usize, op: &Op, error: &str) -> String {
        let mut out = format!("{:?}: op #{index} {op:?}\n  {error}\nsteps:\n", self.setup);
        for line in &self.trace {
            let _ = writeln!(out, "  {line}");
        }
        if let Some(model) = &self.sglang.tree {
            let _ = write!(out, "sglang's tree:\n{}", model.dump());
        }
        out
    }
}

fn replay_with<R: ReuseOrder>(
    setup: Setup,
    allocator: PageAllocator<R>,
    ops: &[Op],
) -> Result<Coverage, String> {
    let mut world = World::new(setup, allocator);
    for (index, op) in ops.iter().enumerate() {
        world
            .apply(op)
            .and_then(|()| world.verify())
            .map_err(|error| world.report(index, op, &error))?;
        let (free, tree) = (&world.sglang.alloc.free, world.sglang.evictable());
        world
            .trace
            .push(format!("    free list {free:?}, evictable {tree}"));
    }
    Ok(world.sglang.coverage)
}

fn replay(setup: Setup, ops: &[Op]) -> Result<Coverage, String> {
    let slots = setup.pages * setup.page_size;
    match setup.page_size {
        1 => replay_with(setup, TokenAllocator::new(slots, false).unwrap(), ops),
        _ => replay_with(
            setup,
            PagedAllocator::new(slots, setup.page_size, false).unwrap(),
            ops,
        ),
    }
}

proptest! {
    #![proptest_config(common::proptest_config())]

    #[test]
    fn the_batch_flow_replays_sglangs(setup in setup(), ops in prop::collection::vec(op(), 1..60)) {
        replay(setup, &ops).map_err(TestCaseError::fail)?;
    }
}

/// The scenarios reach every rule the replay checks, at both page sizes (counted over 200
/// deterministic scenarios each, radix on): evictions for each cause, demands beyond the need
/// (page size 16), prompt splits, prefix hits, chunks, retractions under memory pressure and
/// forced ones, finishes.
#[test]
fn the_scenarios_reach_every_rule() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    assert_eq!(
        EvictionRules::default().retract_decode_steps,
        20,
        "sglang's SGLANG_RETRACT_DECODE_STEPS"
    );
    for page_size in [1, 16] {
        let mut runner = TestRunner::deterministic();
        let mut total = Coverage::default();
        for _ in 0..200 {
            let (mut setup, ops) = (setup(), prop::collection::vec(op(), 1..60))
                .new_tree(&mut runner)
                .unwrap()
                .current();
            setup.page_size = page_size;
            setup.pages = if page_size == 1 {
                setup.pages.max(24)
            } else {
                setup.pages.min(9)
            };
            setup.policy = Some(setup.policy.unwrap_or_default());
            let coverage = replay(setup, &ops).unwrap();
            for (sum, count) in total.evictions.iter_mut().zip(coverage.evictions) {
                *sum += count;
            }
            total.beyond_need += coverage.beyond_need;
            total.prompt_splits += coverage.prompt_splits;
            total.hits += coverage.hits;
            total.chunks += coverage.chunks;
            total.retracted += coverage.retracted;
            total.pressure_retractions += coverage.pressure_retractions;
            total.aborted += coverage.aborted;
            total.finished += coverage.finished;
        }
        eprintln!("page size {page_size}: {total:?}");
        // At page size 1 sglang's demands are the needs: a decode's eviction and one beyond the
        // need never happen (`check_decode_mem` has evicted the decode's need already).
        let paged = page_size > 1;
        let [extend, decode, check, retract] = total.evictions.map(|n| n > 0);
        let reached = extend
            && (decode || !paged)
            && check
            && retract
            && (total.beyond_need > 0 || !paged)
            && total.prompt_splits > 0
            && total.hits > 0
            && total.chunks > 0
            && total.pressure_retractions > 0
            && total.retracted > total.pressure_retractions
            && total.finished > 0;
        assert!(reached, "page size {page_size}: {total:?}");
    }
}
