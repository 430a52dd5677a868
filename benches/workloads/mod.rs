//! The benchmark workloads, shared by `examples/bench.rs` (table / JSON) and
//! `benches/allocator.rs` (criterion). `benches/README.md` defines each one precisely.
//!
//! Every workload panics with the kvown error when a call that must succeed fails: a benchmark
//! that silently measures an error path is worse than none.

use std::time::{Duration, Instant};

use kvown::alloc::{FreeOrder, KvAllocator, KvSlot, PagedAllocator, SlotCalls};
use kvown::batch::Req;
use kvown::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, prepare_for_decode, prepare_for_extend,
    release_kv_cache,
};
use kvown::batch::{cache_unfinished_req, init_next_round_input};
use kvown::cache::{KvCache, TableMirror, TreeCache};
use kvown::check::check_radix;
use kvown::check::reclaim_leaks;
use kvown::radix::{
    CacheEvent, EvictionPolicy, Insert, InsertParams, RadixCache, RadixConfig, TreePos,
};
use kvown::slots::ReqToTokenPool;
use kvown_cuda::StagedMirror;
use kvown_cuda::staging::{HostLink, default_slot_words};

/// The table mirror of the CUDA path with its device left out: each step's packet staged into
/// a ring of host memory that ships nothing ([`HostLink`]). Its cost over no mirror is what the
/// CUDA path adds to the host step, apart from the driver calls.
pub type HostStaged = StagedMirror<HostLink>;

/// Ring slots of [`HostStaged`], as the engine's CUDA backend uses.
const STAGING_DEPTH: usize = 4;

/// A mirror of `table`, for `allocator`'s pool, staged into a ring of host memory.
pub fn host_staged(allocator: &PagedAllocator, table: &ReqToTokenPool) -> HostStaged {
    let rows = table.size() + 1;
    let slot_words = default_slot_words(allocator.capacity(), rows, 0);
    let link = HostLink::new(STAGING_DEPTH, slot_words, (rows, table.max_context_len()));
    StagedMirror::new(link, table, allocator.capacity()).expect("the ring fits the table")
}

/// Slots per page in every workload.
pub const PAGE_SIZE: usize = 16;

/// The synthetic token at `position` of request `rid` (distinct first tokens per request, so
/// requests share no prefix).
fn token(rid: u64, position: usize) -> u32 {
    (rid as u32).wrapping_mul(2_654_435_761) ^ position as u32
}

/// `len` tokens of request `rid`, with room to grow to `capacity` without reallocating.
fn prompt(rid: u64, len: usize, capacity: usize) -> Vec<u32> {
    let mut tokens = Vec::with_capacity(capacity);
    tokens.extend((0..len).map(|position| token(rid, position)));
    tokens
}

/// The radix prefix cache when `radix`, none otherwise: the W2c / W3c side of a workload.
fn prefix_cache(radix: bool) -> TreeCache {
    if radix {
        TreeCache::Radix(RadixCache::new(RadixConfig::new(PAGE_SIZE)).expect("page size"))
    } else {
        TreeCache::Disabled
    }
}

/// W1, pool churn: a 65,536-page allocator; one cycle allocates `k` pages in one call and
/// frees them page by page, last allocated first: as slots (`W1_k*`) or as page ids
/// (`W1p_k*`).
pub struct PoolChurn {
    allocator: PagedAllocator,
    pages: usize,
    /// The cycle's slots or page ids (both `u32`).
    out: Vec<u32>,
}

impl PoolChurn {
    /// Pages in the pool.
    pub const POOL_PAGES: usize = 65_536;

    /// A fresh pool churning `pages` pages per cycle.
    pub fn new(pages: usize) -> Self {
        let allocator = PagedAllocator::new(Self::POOL_PAGES * PAGE_SIZE, PAGE_SIZE, false)
            .expect("a valid pool");
        PoolChurn {
            allocator,
            pages,
            out: Vec::with_capacity(pages * PAGE_SIZE),
        }
    }

    /// One `W1_k*` cycle: `alloc` of `k × 16` slots, then `free` of each page's 16 slots, last
    /// page first.
    #[inline]
    pub fn cycle(&mut self) {
        self.out.clear();
        self.allocator
            .alloc(self.pages * PAGE_SIZE, &mut self.out)
            .expect("the pool has room");
        for page in self.out.chunks_exact(PAGE_SIZE).rev() {
            self.allocator.free(page).expect("the page is held");
        }
    }

    /// One `W1p_k*` cycle: `alloc_page_ids` of `k` pages, then `free_page_ids` of each page id,
    /// last page first.
    #[inline]
    pub fn cycle_page_ids(&mut self) {
        self.out.clear();
        self.allocator
            .alloc_page_ids(self.pages, &mut self.out)
            .expect("the pool has room");
        for page in self.out.iter().rev() {
            self.allocator
                .free_page_ids(std::slice::from_ref(page), FreeOrder::Given)
                .expect("the page is held");
        }
    }

    /// Bytes of allocator bookkeeping per page of the pool.
    pub fn bookkeeping_bytes_per_page(&self) -> f64 {
        self.allocator.bookkeeping_bytes() as f64 / Self::POOL_PAGES as f64
    }
}

/// The parts of a decode step ([`DecodeLoop::step_timed`]), in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Finding the finished requests and taking them out of the batch.
    TakeFinished,
    /// `release_kv_cache` of each finished request, in one free group.
    Release,
    /// Building the replacements and extending them (`init_next_round_input`,
    /// `prepare_for_extend`, `alloc_for_extend`, page registration with W2c).
    Replacements,
    /// Pushing one output token to every request: the sampler's work, not the allocator's.
    TokenAppend,
    /// `prepare_for_decode`.
    PrepareDecode,
    /// `alloc_for_decode` (with W2c, the eviction of the shortfall when the pool is short).
    AllocDecode,
    /// W2c: `cache_unfinished_req` for every request whose last page just filled.
    RegisterPages,
}

#[allow(
    dead_code,
    reason = "used by examples/bench.rs, not by benches/allocator.rs"
)]
impl Phase {
    /// Every phase, in step order.
    pub const ALL: [Phase; 7] = [
        Phase::TakeFinished,
        Phase::Release,
        Phase::Replacements,
        Phase::TokenAppend,
        Phase::PrepareDecode,
        Phase::AllocDecode,
        Phase::RegisterPages,
    ];

    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::TakeFinished => "take finished",
            Phase::Release => "release",
            Phase::Replacements => "replacements",
            Phase::TokenAppend => "token append",
            Phase::PrepareDecode => "prepare_for_decode",
            Phase::AllocDecode => "alloc_for_decode",
            Phase::RegisterPages => "register pages",
        }
    }
}

/// Told by [`DecodeLoop::step_timed`] when each phase of a step ends. `()` ignores it (the
/// untimed step).
pub trait PhaseClock {
    /// `phase` just ended (phases a step skips end too, empty).
    fn end(&mut self, phase: Phase);
}

impl PhaseClock for () {
    #[inline(always)]
    fn end(&mut self, _: Phase) {}
}

/// Wall time per phase, summed over the steps it timed (one clock read per phase).
#[allow(
    dead_code,
    reason = "used by examples/bench.rs, not by benches/allocator.rs"
)]
#[derive(Debug)]
pub struct PhaseTimes {
    last: Instant,
    totals: [Duration; Phase::ALL.len()],
}

#[allow(
    dead_code,
    reason = "used by examples/bench.rs, not by benches/allocator.rs"
)]
impl PhaseTimes {
    /// Starts timing now.
    pub fn start() -> Self {
        PhaseTimes {
            last: Instant::now(),
            totals: [Duration::ZERO; Phase::ALL.len()],
        }
    }

    /// The time summed for each phase, in [`Phase::ALL`] order.
    pub fn totals(&self) -> impl Iterator<Item = (Phase, Duration)> + '_ {
        Phase::ALL.into_iter().zip(self.totals)
    }
}

impl PhaseClock for PhaseTimes {
    fn end(&mut self, phase: Phase) {
        let now = Instant::now();
        self.totals[phase as usize] += now - self.last;
        self.last = now;
    }
}

/// W2 / W2c, decode step: 256 running requests, request `i` starting at
/// `512 + (i * 7919 mod 1536)` tokens; a request that reaches 2,048 tokens is released and
/// replaced by a fresh 512-token request. One step = release the finished, extend their
/// replacements, then one decode token for every request (`prepare_for_decode` +
/// `alloc_for_decode`). With the radix cache (W2c) every full page is registered as it fills
/// (`cache_unfinished_req` when `kv_committed_len % 16 == 0`, and after each extend), and
/// finished requests are inserted on release; eviction makes room when the pool is short.
pub struct DecodeLoop<M = ()> {
    cache: KvCache<PagedAllocator, M>,
    running: Option<ScheduleBatch>,
    next_rid: u64,
    radix: bool,
    /// W2e: pages named by the cache events drained so far (stored plus removed).
    event_pages: u64,
}

impl DecodeLoop {
    /// The loop with the prefix cache on (`radix`, W2c) or off (W2), all requests admitted.
    pub fn new(radix: bool) -> Self {
        DecodeLoop::with_mirror(radix, |_, _| ())
    }

    /// W2e: W2c with the prefix cache's events on from the start (the queue is drained by
    /// [`DecodeLoop::step_draining_events`]).
    pub fn with_events() -> Self {
        let mut workload = DecodeLoop::new(true);
        assert!(
            workload.cache.enable_cache_events(),
            "W2c has a radix cache"
        );
        workload.drain_events();
        workload.event_pages = 0;
        workload
    }
}

impl DecodeLoop<HostStaged> {
    /// W2_staged / W2c_staged: W2 / W2c with the CUDA path's table mirror, its device left out
    /// ([`HostStaged`]).
    pub fn staged(radix: bool) -> Self {
        DecodeLoop::with_mirror(radix, host_staged)
    }
}

impl<M: TableMirror> DecodeLoop<M> {
    /// Requests running at every step.
    pub const RUNNING: usize = 256;
    /// Length at which a request finishes.
    pub const FINISH_LEN: usize = 2048;
    /// Prompt length of a replacement.
    pub const REPLACEMENT_LEN: usize = 512;

    /// The loop with the prefix cache on (`radix`, W2c) or off (W2), all requests admitted,
    /// with the table mirror `make` builds for the pool and the table.
    fn with_mirror(radix: bool, make: impl FnOnce(&PagedAllocator, &ReqToTokenPool) -> M) -> Self {
        let pool_tokens = Self::RUNNING * (Self::FINISH_LEN + PAGE_SIZE);
        let allocator = PagedAllocator::new(pool_tokens, PAGE_SIZE, false).expect("a valid pool");
        let rows =
            ReqToTokenPool::new(Self::RUNNING, Self::FINISH_LEN).expect("a valid request table");
        let mirror = make(&allocator, &rows);
        let tree = prefix_cache(radix);
        let mut workload = DecodeLoop {
            cache: KvCache::with_mirror(allocator, rows, tree, mirror).expect("page sizes agree"),
            running: Some(ScheduleBatch::new(Vec::new())),
            next_rid: Self::RUNNING as u64,
            radix,
            event_pages: 0,
        };
        let reqs = (0..Self::RUNNING)
            .map(|i| {
                let len = Self::REPLACEMENT_LEN + (i * 7919) % 1536;
                Req::new(i as u64, prompt(i as u64, len, Self::FINISH_LEN))
            })
            .collect();
        workload.admit(reqs);
        workload
    }

    /// One W2e step: [`DecodeLoop::step`], then the cache's events drained as a router feed
    /// would, every event's pages counted.
    #[inline]
    pub fn step_draining_events(&mut self) {
        self.step();
        self.drain_events();
    }

    /// W2c_published (`kvown-events/benches/publish.rs`): one [`DecodeLoop::step`], then the
    /// cache's events taken and handed to `publish`, as a replica feeding a router would.
    #[allow(
        dead_code,
        reason = "used by kvown-events/benches/publish.rs, not by this crate's benches"
    )]
    #[inline]
    pub fn step_publishing_events(&mut self, publish: &mut impl FnMut(Vec<CacheEvent>)) {
        self.step();
        publish(self.cache.take_cache_events());
    }

    /// Takes the queued cache events and adds the pages they name to the count.
    fn drain_events(&mut self) {
        for event in self.cache.take_cache_events() {
            self.event_pages += match event {
                CacheEvent::Stored { pages, .. } => pages.len() as u64,
                CacheEvent::Removed { hashes } => hashes.len() as u64,
                CacheEvent::Cleared => 0,
            };
        }
    }

    /// W2e: pages the drained events named, stored plus removed.
    #[allow(
        dead_code,
        reason = "used by examples/bench.rs, not by benches/allocator.rs"
    )]
    pub fn event_pages(&self) -> u64 {
        self.event_pages
    }

    /// Extends `reqs` and adds them to the running batch (registering their pages with W2c).
    fn admit(&mut self, mut reqs: Vec<Req>) {
        for req in &mut reqs {
            init_next_round_input(req, &mut self.cache, usize::MAX).expect("match and lock");
        }
        let mut batch = alloc_for_extend(
            prepare_for_extend(ScheduleBatch::new(reqs)),
            &mut self.cache,
        )
        .unwrap_or_else(|failure| panic!("extend: {}", failure.error));
        if self.radix {
            for req in batch.reqs_mut() {
                cache_unfinished_req(req, &mut self.cache).expect("register pages");
            }
        }
        self.running
            .as_mut()
            .expect("the running batch is home")
            .extend_reqs(batch.into_reqs());
    }

    /// One decode step, replacements included.
    #[inline]
    pub fn step(&mut self) {
        self.step_timed(&mut ());
    }

    /// [`DecodeLoop::step`], telling `clock` when each [`Phase`] ends.
    #[inline]
    pub fn step_timed(&mut self, clock: &mut impl PhaseClock) {
        let mut running = self.running.take().expect("the running batch is home");
        let done = |req: &Req| req.kv().kv_committed_len() >= Self::FINISH_LEN;
        if !running.reqs().iter().any(done) {
            clock.end(Phase::TakeFinished);
            clock.end(Phase::Release);
            clock.end(Phase::Replacements);
        } else {
            let mut finished = running.take_if(done);
            clock.end(Phase::TakeFinished);
            let mut group = self.cache.free_group().expect("no open group");
            for req in &mut finished {
                release_kv_cache(req, &mut group, true).expect("release");
            }
            group.commit();
            clock.end(Phase::Release);
            let replacements = finished
                .iter()
                .map(|_| {
                    let rid = self.next_rid;
                    self.next_rid += 1;
                    Req::new(rid, prompt(rid, Self::REPLACEMENT_LEN, Self::FINISH_LEN))
                })
                .collect();
            self.running = Some(running);
            self.admit(replacements);
            running = self.running.take().expect("the running batch is home");
            clock.end(Phase::Replacements);
        }
        for req in running.reqs_mut() {
            let position = req.fill_ids().len();
            req.push_output(token(req.rid(), position));
        }
        clock.end(Phase::TokenAppend);
        let prepared = prepare_for_decode(running, &self.cache)
            .unwrap_or_else(|(_, error)| panic!("prepare_for_decode: {error}"));
        clock.end(Phase::PrepareDecode);
        let mut running = alloc_for_decode(prepared, &mut self.cache)
            .unwrap_or_else(|failure| panic!("alloc_for_decode: {}", failure.error));
        clock.end(Phase::AllocDecode);
        if self.radix {
            for req in running.reqs_mut() {
                if req.kv().kv_committed_len() % PAGE_SIZE == 0 {
                    cache_unfinished_req(req, &mut self.cache).expect("register the full page");
                }
            }
        }
        clock.end(Phase::RegisterPages);
        self.running = Some(running);
    }

    /// Bytes of radix bookkeeping per cached page (W2c), `None` without the cache.
    pub fn radix_bytes_per_cached_page(&self) -> Option<f64> {
        let tree = self.cache.tree().radix()?;
        let pages = tree.sizes().total() / PAGE_SIZE;
        Some(tree.bookkeeping_bytes() as f64 / pages.max(1) as f64)
    }

    /// Runs the invariant checker over the running requests.
    pub fn check(&self) -> Result<(), String> {
        let running = self.running.as_ref().expect("the running batch is home");
        self.cache.check(running.reqs()).map_err(|v| v.to_string())
    }

    /// `reclaim_leaks` with the running requests; the workload leaks nothing, so it fails
    /// unless nothing is reclaimed.
    pub fn reclaim_nothing(&mut self) -> Result<(), String> {
        let running = self.running.as_mut().expect("the running batch is home");
        match reclaim_leaks(&mut self.cache, running.reqs_mut()) {
            Ok(reclaimed) if reclaimed.is_empty() => Ok(()),
            Ok(reclaimed) => Err(format!("the workload leaked: {reclaimed}")),
            Err(error) => Err(error.to_string()),
        }
    }
}

/// stage_decode_1024: decode steps of 1,024 requests at page 16 (`prepare_for_decode` +
/// `alloc_for_decode`, a token appended to each request first, as W2 does), with no table
/// mirror or with [`HostStaged`]. Every request starts at 1,024 tokens, so one step in 16
/// opens a page for all of them; [`WideDecode::recycle`] releases them all and admits fresh
/// ones when the rows are about to fill.
pub struct WideDecode<M = ()> {
    cache: KvCache<PagedAllocator, M>,
    running: Option<ScheduleBatch>,
    next_rid: u64,
}

impl WideDecode {
    /// On the host allocator.
    pub fn new() -> Self {
        WideDecode::with_mirror(|_, _| ())
    }
}

impl WideDecode<HostStaged> {
    /// With the CUDA path's table mirror, its device left out.
    pub fn staged() -> Self {
        WideDecode::with_mirror(host_staged)
    }
}

impl<M: TableMirror> WideDecode<M> {
    /// Requests decoding at every step.
    pub const REQUESTS: usize = 1024;
    /// Prompt length of every request.
    pub const PROMPT_LEN: usize = 1024;
    /// Positions per row.
    pub const WIDTH: usize = 2048;

    fn with_mirror(make: impl FnOnce(&PagedAllocator, &ReqToTokenPool) -> M) -> Self {
        let pool_tokens = Self::REQUESTS * (Self::WIDTH + PAGE_SIZE);
        let allocator = PagedAllocator::new(pool_tokens, PAGE_SIZE, false).expect("a valid pool");
        let rows = ReqToTokenPool::new(Self::REQUESTS, Self::WIDTH).expect("a valid table");
        let mirror = make(&allocator, &rows);
        let tree = TreeCache::Disabled;
        let mut workload = WideDecode {
            cache: KvCache::with_mirror(allocator, rows, tree, mirror).expect("page sizes agree"),
            running: None,
            next_rid: 0,
        };
        workload.recycle();
        workload
    }

    /// Times `steps` decode steps; whenever the rows are full first, checks the invariants and
    /// recycles the requests, untimed.
    pub fn time_steps(&mut self, steps: u64) -> Duration {
        let mut total = Duration::ZERO;
        let mut left = steps;
        while left > 0 {
            if self.steps_left() == 0 {
                if let Err(violation) = self.check() {
                    panic!("decode_1024: invariant violated: {violation}");
                }
                self.recycle();
            }
            let run = left.min(self.steps_left() as u64);
            let start = Instant::now();
            for _ in 0..run {
                std::hint::black_box(&mut *self).step();
            }
            total += start.elapsed();
            left -= run;
        }
        total
    }

    /// Decode steps left before a request's row is full.
    fn steps_left(&self) -> usize {
        let running = self.running.as_ref().expect("the batch is home");
        Self::WIDTH - 1 - running.reqs()[0].kv().kv_allocated_len()
    }

    /// Releases every request and admits `REQUESTS` fresh ones, extended.
    fn recycle(&mut self) {
        if let Some(mut running) = self.running.take() {
            for req in running.reqs_mut() {
                release_kv_cache(req, &mut self.cache, false).expect("release");
            }
        }
        let reqs = (0..Self::REQUESTS)
            .map(|_| {
                let rid = self.next_rid;
                self.next_rid += 1;
                Req::new(rid, prompt(rid, Self::PROMPT_LEN, Self::WIDTH))
            })
            .collect();
        let batch = alloc_for_extend(
            prepare_for_extend(ScheduleBatch::new(reqs)),
            &mut self.cache,
        )
        .unwrap_or_else(|failure| panic!("extend: {}", failure.error));
        self.running = Some(batch);
    }

    /// One decode step of every request.
    #[inline]
    pub fn step(&mut self) {
        let mut running = self.running.take().expect("the batch is home");
        for req in running.reqs_mut() {
            let position = req.fill_ids().len();
            req.push_output(token(req.rid(), position));
        }
        let prepared = prepare_for_decode(running, &self.cache)
            .unwrap_or_else(|(_, error)| panic!("prepare_for_decode: {error}"));
        let running = alloc_for_decode(prepared, &mut self.cache)
            .unwrap_or_else(|failure| panic!("alloc_for_decode: {}", failure.error));
        self.running = Some(running);
    }

    /// Runs the invariant checker over the running requests.
    fn check(&self) -> Result<(), String> {
        let running = self.running.as_ref().expect("the batch is home");
        self.cache.check(running.reqs()).map_err(|v| v.to_string())
    }
}

/// A 64-bit mix of `value` (splitmix64's finaliser): the E1 cycle's pseudo-random draws.
fn mix(value: u64) -> u64 {
    let mut z = value.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// E1, eviction cost per policy: a radix cache of one policy over a pool of
/// [`EvictionChurn::POOL_PAGES`] pages, kept full of unlocked entries, each key three pages: one
/// of 16 shared prefixes, one of 256 middle pages under it (4,096 in all), and a page of its
/// own. One cycle admits and finishes one such request: match its key and lock the match,
/// evict the shortfall of its uncached pages (about one page), allocate them, insert the key
/// with a priority of 0..4 (one hit), unlock, then insert it again 0..2 times (more hits), all
/// drawn from the cycle number.
pub struct EvictionChurn {
    tree: RadixCache,
    allocator: PagedAllocator,
    cycles: u64,
    key: Vec<u32>,
    /// The key's slots; only those of its uncached pages are read by an insert.
    slots: Vec<KvSlot>,
    /// The slots of the pages one cycle allocates.
    allocated: Vec<KvSlot>,
}

impl EvictionChurn {
    /// Pages in the pool, all held by the cache after warm-up (bar the few an eviction frees
    /// past the shortfall).
    pub const POOL_PAGES: usize = 20_480;
    /// Shared first pages of the keys.
    pub const PREFIXES: u64 = 16;
    /// Middle pages under each prefix.
    pub const MIDDLES: u64 = 256;
    /// Pages per key.
    const KEY_PAGES: usize = 3;

    /// A cache evicting by `policy`, filled and warmed up: cycles until as many pages have been
    /// inserted as twice the pool holds.
    pub fn new(policy: EvictionPolicy) -> Self {
        let allocator =
            PagedAllocator::new(Self::POOL_PAGES * PAGE_SIZE, PAGE_SIZE, false).expect("a pool");
        let mut churn = EvictionChurn {
            tree: RadixCache::new(RadixConfig::new(PAGE_SIZE).with_policy(policy))
                .expect("page size"),
            allocator,
            cycles: 0,
            key: vec![0; Self::KEY_PAGES * PAGE_SIZE],
            slots: vec![0; Self::KEY_PAGES * PAGE_SIZE],
            allocated: Vec::with_capacity(Self::KEY_PAGES * PAGE_SIZE),
        };
        while churn.cycles < 2 * Self::POOL_PAGES as u64 {
            churn.cycle();
        }
        churn
    }

    /// One cycle: a request's admission (match, lock, evict the shortfall, allocate) and its
    /// insert on finishing (unlock), plus 0..2 repeated inserts of the same key.
    #[inline]
    pub fn cycle(&mut self) {
        let draw = mix(self.cycles);
        self.cycles += 1;
        let prefix = draw % Self::PREFIXES;
        // Page numbers: the prefixes, then the middle pages, then one per cycle.
        let middle = Self::PREFIXES + prefix * Self::MIDDLES + (draw >> 8) % Self::MIDDLES;
        let own = Self::PREFIXES * (1 + Self::MIDDLES) + self.cycles;
        for (page, id) in self
            .key
            .chunks_exact_mut(PAGE_SIZE)
            .zip([prefix, middle, own])
        {
            for (offset, key_token) in page.iter_mut().enumerate() {
                *key_token = token(id, offset);
            }
        }
        let at = self.tree.match_prefix(&self.key);
        if at != TreePos::ROOT {
            self.tree.inc_lock_ref(at.node).expect("lock the match");
        }
        let uncached = self.key.len() - at.len;
        self.tree
            .evict(
                uncached.saturating_sub(self.allocator.available_size()),
                &mut self.allocator,
            )
            .expect("evict");
        self.allocated.clear();
        self.allocator
            .alloc(uncached, &mut self.allocated)
            .expect("room after the eviction");
        self.slots[at.len..].copy_from_slice(&self.allocated);
        let params = InsertParams {
            priority: ((draw >> 16) % 4) as i32,
            chunked: false,
        };
        let insert = Insert::new(&self.key, &self.slots).params(params);
        self.tree
            .insert(insert.from(at))
            .expect("insert the new page");
        if at != TreePos::ROOT {
            self.tree.dec_lock_ref(at.node).expect("unlock the match");
        }
        for _ in 0..(draw >> 24) % 3 {
            self.tree.insert(insert).expect("a repeated insert");
        }
    }

    /// Cycles run so far, warm-up included.
    #[allow(
        dead_code,
        reason = "used by examples/bench.rs, not by benches/allocator.rs"
    )]
    pub fn cycles(&self) -> u64 {
        self.cycles
    }

    /// Runs the radix cache's own consistency check, and checks that every page of the pool is
    /// either free or cached.
    pub fn check(&self) -> Result<(), String> {
        check_radix(&self.tree).map_err(|error| error.to_string())?;
        let held = self.allocator.available_size() + self.tree.sizes().total();
        if held != Self::POOL_PAGES * PAGE_SIZE {
            return Err(format!(
                "{held} slots free or cached of {}",
                Self::POOL_PAGES * PAGE_SIZE
            ));
        }
        Ok(())
    }
}

/// W3, extend: a batch of 64 fresh prompts, request `i` of `512 + (i * 7919 mod 3585)`
/// tokens (512..=4096), through `init_next_round_input` + `prepare_for_extend` +
/// `alloc_for_extend`. Building the requests and releasing them afterwards are outside the
/// measured part; each batch reuses the previous one's `out_cache_loc` storage
/// (`ScheduleBatch::with_buffer`), as a serving loop would.
///
/// W3 runs with the prefix cache off. W3c runs with it on: every batch's prompts are new (their
/// first tokens are the batch's own), each request's whole pages are registered right after its
/// extend (`cache_unfinished_req`, measured), and released requests are inserted, so from the
/// second batch on the pool is full of cached prompts and each extend evicts what it lacks.
pub struct ExtendBatch {
    cache: KvCache<PagedAllocator>,
    radix: bool,
    /// Batches handed out so far: the next batch's requests are numbered from
    /// `batches * BATCH`.
    batches: u64,
    /// The `out_cache_loc` storage handed from each released batch to the next one.
    out_buffer: Vec<KvSlot>,
}

impl ExtendBatch {
    /// Prompts per batch.
    pub const BATCH: usize = 64;
    /// Longest prompt.
    pub const MAX_LEN: usize = 4096;

    /// An empty pool large enough for one batch, with the prefix cache on (`radix`, W3c) or
    /// off (W3).
    pub fn new(radix: bool) -> Self {
        let allocator =
            PagedAllocator::new(Self::BATCH * (Self::MAX_LEN + PAGE_SIZE), PAGE_SIZE, false)
                .expect("a valid pool");
        let rows = ReqToTokenPool::new(Self::BATCH, Self::MAX_LEN).expect("a valid request table");
        ExtendBatch {
            cache: KvCache::new(allocator, rows, prefix_cache(radix)).expect("page sizes agree"),
            radix,
            batches: 0,
            out_buffer: Vec::new(),
        }
    }

    /// Prompt length of request `i` of a batch.
    pub fn prompt_len(i: usize) -> usize {
        512 + (i * 7919) % 3585
    }

    /// Tokens extended per batch (W3's, and its floor `ref_extend`'s).
    pub fn tokens() -> usize {
        (0..Self::BATCH).map(Self::prompt_len).sum()
    }

    /// Fresh requests for the next batch, with prompts no earlier batch had (not measured).
    pub fn fresh_reqs(&mut self) -> Vec<Req> {
        let first = self.batches * Self::BATCH as u64;
        self.batches += 1;
        (0..Self::BATCH)
            .map(|i| {
                let rid = first + i as u64;
                Req::new(rid, prompt(rid, Self::prompt_len(i), 0))
            })
            .collect()
    }

    /// The measured part: match, prepare and allocate the extend of `reqs`, and with the
    /// prefix cache register their whole pages.
    #[inline]
    pub fn extend(&mut self, mut reqs: Vec<Req>) -> ScheduleBatch {
        for req in &mut reqs {
            init_next_round_input(req, &mut self.cache, usize::MAX).expect("match");
        }
        let batch = ScheduleBatch::with_buffer(reqs, std::mem::take(&mut self.out_buffer));
        let mut batch = alloc_for_extend(prepare_for_extend(batch), &mut self.cache)
            .unwrap_or_else(|failure| panic!("extend: {}", failure.error));
        if self.radix {
            // `reqs_mut` forgets `out_cache_loc` (its storage stays for the next batch): a
            // serving loop reads it before it registers the pages.
            for req in batch.reqs_mut() {
                cache_unfinished_req(req, &mut self.cache).expect("register the prompt");
            }
        }
        batch
    }

    /// Runs the invariant checker with no request held (after a [`ExtendBatch::release`]):
    /// every page is free or cached.
    #[allow(
        dead_code,
        reason = "used by examples/bench.rs, not by benches/allocator.rs"
    )]
    pub fn check(&self) -> Result<(), String> {
        self.cache.check(&[]).map_err(|v| v.to_string())
    }

    /// Releases a batch from [`ExtendBatch::extend`] (not measured); with the prefix cache the
    /// requests are inserted, and their pages stay cached.
    pub fn release(&mut self, batch: ScheduleBatch) {
        let mut group = self.cache.free_group().expect("no open group");
        let (reqs, out_buffer) = batch.into_parts();
        self.out_buffer = out_buffer;
        for mut req in reqs {
            release_kv_cache(&mut req, &mut group, self.radix).expect("release");
        }
        group.commit();
    }
}

/// R, release: one request of `k` pages (`16 k` tokens) extended into a pool of `2 k` pages (not
/// measured), then released by `release_kv_cache` (measured). `R_k*` runs with the prefix cache
/// off: the release frees the request's pages. `R_k*c` runs with it on: the release inserts the
/// request's pages into the radix cache (a new prompt each time, so one new node of `k`
/// pages), and the next extend evicts them (not measured).
#[allow(
    dead_code,
    reason = "used by examples/bench.rs, not by benches/allocator.rs"
)]
pub struct ReleaseOne {
    cache: KvCache<PagedAllocator>,
    radix: bool,
    pages: usize,
    next_rid: u64,
    out_buffer: Vec<KvSlot>,
}

#[allow(
    dead_code,
    reason = "used by examples/bench.rs, not by benches/allocator.rs"
)]
impl ReleaseOne {
    /// A pool of `2 pages` pages and one request row, with the prefix cache on (`radix`) or off.
    pub fn new(pages: usize, radix: bool) -> Self {
        let tokens = pages * PAGE_SIZE;
        let allocator = PagedAllocator::new(2 * tokens, PAGE_SIZE, false).expect("a valid pool");
        let rows = ReqToTokenPool::new(1, tokens).expect("a valid request table");
        ReleaseOne {
            cache: KvCache::new(allocator, rows, prefix_cache(radix)).expect("page sizes agree"),
            radix,
            pages,
            next_rid: 0,
            out_buffer: Vec::new(),
        }
    }

    /// A new request of `16 k` tokens, extended (not measured): it holds `k` pages.
    pub fn extended(&mut self) -> Req {
        let rid = self.next_rid;
        self.next_rid += 1;
        let mut req = Req::new(rid, prompt(rid, self.pages * PAGE_SIZE, 0));
        init_next_round_input(&mut req, &mut self.cache, usize::MAX).expect("match");
        let batch = ScheduleBatch::with_buffer(vec![req], std::mem::take(&mut self.out_buffer));
        let batch = alloc_for_extend(prepare_for_extend(batch), &mut self.cache)
            .unwrap_or_else(|failure| panic!("extend: {}", failure.error));
        let (mut reqs, out_buffer) = batch.into_parts();
        self.out_buffer = out_buffer;
        reqs.pop().expect("one request")
    }

    /// The measured part: the release of `req` (with the prefix cache, its insert).
    #[inline]
    pub fn release(&mut self, req: &mut Req) {
        release_kv_cache(req, &mut self.cache, self.radix).expect("release");
    }

    /// Runs the invariant checker with no request held (after a release): every page is free
    /// or cached.
    pub fn check(&self) -> Result<(), String> {
        self.cache.check(&[]).map_err(|v| v.to_string())
    }
}
