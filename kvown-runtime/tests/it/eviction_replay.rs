//! Eviction replayed against a model of sglang's radix cache: random sequences of inserts,
//! matches, locks, evictions and running requests, over page sizes 1, 4 and 16 and every
//! [`EvictionPolicy`], where every eviction must free the same pages as the model, in the same
//! order, and every insert, match and eviction must report the same lengths; the evictable and
//! protected sizes must agree after every step.
//!
//! The model restates the rules of sglang 0.5.23's `RadixCache` in Rust, a node per node as
//! sglang keeps them (`python/sglang/srt/mem_cache/radix_cache.py`): `TreeNode.__init__`,
//! `_match_prefix_helper`, `_split_node` (the upper part a new node: fresh access and creation
//! times, the hit count copied, the lower part's priority), `_insert_helper`, `_inc_hit_count`,
//! `evict` (one `free_segment` call per node), `inc_lock_ref`, `dec_lock_ref`, `_delete_leaf`,
//! `_update_leaf_status`, and a running request's registrations and finish; the eviction orders
//! are the strategies of `mem_cache/evict_policy.py`. Times come from a counter standing for
//! `time.monotonic()`: each call sglang makes returns the next value, in sglang's order, so no
//! two calls tie.
//!
//! Where the model keeps an earlier sglang's rule: an insert counts a hit unless it registers a
//! running request (`chunked`); sglang 0.5.23 counts one on the nodes past the request's
//! `cache_inserted_len` (a difference listed in the README). `checkpoint` matches the key
//! again after its insert; that match only restamps the path the insert has just stamped (and
//! locked), which changes no order here, so it is left out (`batch_replay.rs` replays it).
//!
//! Three properties:
//! * [`replay_without_requests`]: inserts, matches (some locked), unlocks and evictions.
//! * [`replay_requests_registering_from_the_root`]: running requests too, which insert from the
//!   root, so that kvown adds a node per registration as sglang does (no leaf grows in place).
//! * [`replay_requests_growing_their_leaf`]: the requests insert from their locked position, as
//!   kvown's batch flow does, and kvown grows their leaf in place where sglang adds a node per
//!   registration; kvown must still evict it as sglang's chain of nodes, newest part first.
//!
//! Run the growth-free ones alone with `cargo test -p kvown-runtime --test it
//! eviction_replay:: -- --skip grow`.

use crate::common;
use crate::common::faulty;
use crate::common::sglang_radix;

use std::fmt::{self, Write as _};

use faulty::{Faults, Faulty};
use kvown_runtime::alloc::{KvAllocator, KvSlot, PageId, PagedAllocator, SlotCalls};
use kvown_runtime::check::check_radix;
use kvown_runtime::radix::{
    EvictionPolicy, Insert, InsertParams, NodeId, RadixCache, RadixConfig, TreePos,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use sglang_radix::Model;

/// Pages of the pool: more than any sequence allocates (at most 40 operations, each taking at
/// most [`MAX_REQUEST_PAGES`] fresh pages).
const POOL_PAGES: usize = 700;

/// Longest key of an insert, a match or a request's prompt, in pages.
const MAX_PAGES: usize = 12;

/// Longest key a running request grows to, in pages.
const MAX_REQUEST_PAGES: usize = 16;

/// The page sizes replayed.
const PAGE_SIZES: [usize; 3] = [1, 4, 16];

// ---------------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------------

/// A key in pages: `cut` pages (modulo its length + 1) of an earlier key of the sequence
/// (`base`, modulo their number; none before the first), then `tail`. Page `u` is the tokens
/// `[u / 2; page_size - 1] ++ [u]` (`[u]` at page size 1), so that pages 0 and 1 (2 and 3)
/// differ in their last token only.
#[derive(Debug, Clone)]
struct KeySpec {
    base: usize,
    cut: usize,
    tail: Vec<u32>,
}

/// One step of a sequence, replayed on kvown and on the model.
#[derive(Debug, Clone)]
enum Op {
    /// Insert a key from the root on fresh pages (`insert` with `InsertParams`); the caller
    /// frees its duplicates.
    Insert {
        key: KeySpec,
        priority: i32,
        chunked: bool,
    },
    /// Match a key with `partial` (modulo the page size) more tokens; lock the match if asked.
    Match {
        key: KeySpec,
        partial: usize,
        lock: bool,
    },
    /// Release a match's lock.
    Unlock { holder: usize },
    /// Evict this many pages' worth of tokens (`usize::MAX`: more than everything).
    Evict { pages: usize },
    /// A request arrives: match its prompt, lock the match, insert the prompt (on fresh pages
    /// for what is not cached; `chunked` for a chunked prefill) and move the lock to its end
    /// (`cache_unfinished_req`).
    Start {
        key: KeySpec,
        priority: i32,
        chunked: bool,
    },
    /// A running request registers `pages` more pages (`cache_unfinished_req`, chunked).
    Register { req: usize, pages: Vec<u32> },
    /// A request finishes with `pages` more pages: its whole key inserted as a hit, its lock
    /// released (`cache_finished_req`).
    Finish { req: usize, pages: Vec<u32> },
}

fn units(len: std::ops::Range<usize>) -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, len)
}

fn key_spec(tail: std::ops::Range<usize>) -> impl Strategy<Value = KeySpec> {
    (0usize..8, 0usize..8, units(tail)).prop_map(|(base, cut, tail)| KeySpec { base, cut, tail })
}

fn priority() -> impl Strategy<Value = i32> {
    -2i32..3
}

fn evict_pages() -> impl Strategy<Value = usize> {
    prop_oneof![Just(1usize), 1usize..12, Just(usize::MAX)]
}

/// Inserts, matches, unlocks and evictions.
fn plain_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (key_spec(0..5), priority(), any::<bool>())
            .prop_map(|(key, priority, chunked)| Op::Insert { key, priority, chunked }),
        2 => (key_spec(0..4), 0usize..16, any::<bool>())
            .prop_map(|(key, partial, lock)| Op::Match { key, partial, lock }),
        1 => (0usize..8).prop_map(|holder| Op::Unlock { holder }),
        3 => evict_pages().prop_map(|pages| Op::Evict { pages }),
    ]
}

/// [`plain_op`] and the steps of running requests.
fn request_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => plain_op(),
        2 => (key_spec(0..4), priority(), any::<bool>())
            .prop_map(|(key, priority, chunked)| Op::Start { key, priority, chunked }),
        4 => (0usize..4, units(1..4)).prop_map(|(req, pages)| Op::Register { req, pages }),
        1 => (0usize..4, units(0..3)).prop_map(|(req, pages)| Op::Finish { req, pages }),
    ]
}

// ---------------------------------------------------------------------------------------------
// The replay
// ---------------------------------------------------------------------------------------------

/// A lock taken on a match, on both sides.
struct Holder {
    node: NodeId,
    model: usize,
}

/// A running request: its key (whole pages, all registered), where kvown and the model hold
/// its lock.
struct Request {
    units: Vec<u32>,
    at: TreePos,
    model: usize,
    priority: i32,
}

/// Where requests insert from in kvown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hint {
    /// [`TreePos::ROOT`]: kvown adds a node for each registration, as sglang does.
    Root,
    /// The request's locked position, as kvown's batch flow does: kvown grows the request's
    /// leaf in place.
    Lock,
}

/// kvown's cache and the model, fed the same operations.
struct World {
    page_size: usize,
    policy: EvictionPolicy,
    hint: Hint,
    tree: RadixCache,
    /// A pool that keeps what each `free_page_ids` call freed (the tree frees an eviction's
    /// pages with one).
    alloc: Faulty<PagedAllocator>,
    /// The pages of each `free_page_ids` call of the last eviction.
    freed: Vec<Vec<PageId>>,
    model: Model,
    holders: Vec<Holder>,
    requests: Vec<Request>,
    /// Every key used so far, in pages (what [`KeySpec::base`] picks from).
    keys: Vec<Vec<u32>>,
    /// What each step did, for failure messages.
    trace: Vec<String>,
}

/// A step's outcome: a failure names what differs.
type Step = Result<(), String>;

/// `Err` with both sides when they differ.
fn same<T: PartialEq + fmt::Debug>(what: &str, kvown: T, model: T) -> Step {
    if kvown == model {
        Ok(())
    } else {
        Err(format!("{what}: kvown {kvown:?}, model {model:?}"))
    }
}

impl World {
    fn new(page_size: usize, policy: EvictionPolicy, hint: Hint) -> World {
        World {
            page_size,
            policy,
            hint,
            tree: RadixCache::new(RadixConfig::new(page_size).with_policy(policy)).unwrap(),
            alloc: Faulty {
                inner: PagedAllocator::new(POOL_PAGES * page_size, page_size, false).unwrap(),
                faults: Faults::default(),
            },
            freed: Vec::new(),
            model: Model::new(page_size, policy),
            holders: Vec::new(),
            requests: Vec::new(),
            keys: Vec::new(),
            trace: Vec::new(),
        }
    }

    /// The pages of `spec`, remembered for later keys.
    fn resolve(&mut self, spec: &KeySpec) -> Vec<u32> {
        let mut units = match self.keys.len() {
            0 => Vec::new(),
            n => {
                let base = &self.keys[spec.base % n];
                base[..spec.cut % (base.len() + 1)].to_vec()
            }
        };
        units.extend_from_slice(&spec.tail);
        units.truncate(MAX_PAGES);
        self.keys.push(units.clone());
        units
    }

    /// The tokens of pages `units`.
    fn tokens(&self, units: &[u32]) -> Vec<u32> {
        let ps = self.page_size;
        units
            .iter()
            .flat_map(|&u| {
                let fill = if ps == 1 { u } else { u / 2 };
                std::iter::repeat_n(fill, ps - 1).chain([u])
            })
            .collect()
    }

    /// The page of each page of `slots`.
    fn pages(&self, slots: &[KvSlot]) -> Vec<PageId> {
        slots
            .chunks_exact(self.page_size)
            .map(|page| page[0] / self.page_size as KvSlot)
            .collect()
    }

    /// Fresh slots for `tokens` tokens.
    fn fresh(&mut self, tokens: usize) -> Vec<KvSlot> {
        let mut slots = Vec::new();
        self.alloc
            .alloc(tokens, &mut slots)
            .expect("the pool is large enough");
        slots
    }

    /// kvown's slots of the path to `at`.
    fn path_slots(&self, at: TreePos) -> Vec<KvSlot> {
        let mut slots = vec![0; at.len];
        self.tree.path_slots_into(at, 0, &mut slots).unwrap();
        slots
    }

    /// Inserts `units` with `slots` (the tree's own for `[0, protected)`, fresh after) on both
    /// sides, from `from` in kvown, and frees the caller's duplicates `[protected, prefix_len)`.
    /// Returns kvown's and the model's ends of the key.
    fn insert(
        &mut self,
        units: &[u32],
        slots: &[KvSlot],
        protected: usize,
        from: TreePos,
        params: InsertParams,
    ) -> Result<(TreePos, usize), String> {
        let key = self.tokens(units);
        let pages = self.pages(slots);
        let outcome = self
            .tree
            .insert(Insert::new(&key, slots).from(from).params(params))
            .unwrap();
        let (prefix_len, model_end) =
            self.model
                .insert(&key, &pages, params.priority, params.chunked);
        self.trace.push(format!(
            "insert {units:?} pages {pages:?} priority {} {} -> prefix {} pages",
            params.priority,
            if params.chunked { "chunked" } else { "hit" },
            prefix_len / self.page_size,
        ));
        same("prefix_len", outcome.prefix_len, prefix_len)?;
        self.alloc
            .free_segment(&slots[protected..prefix_len], protected)
            .unwrap();
        let end = TreePos {
            node: outcome.last_node,
            len: key.len(),
        };
        same(
            "the inserted key's pages",
            self.pages(&self.path_slots(end)),
            self.model.path_pages(model_end),
        )?;
        Ok((end, model_end))
    }

    /// Matches `tokens` on both sides.
    fn match_prefix(&mut self, tokens: &[u32]) -> Result<(TreePos, usize), String> {
        let at = self.tree.match_prefix(tokens);
        let (len, node) = self.model.match_prefix(tokens);
        same("match length", at.len, len)?;
        same(
            "the matched pages",
            self.pages(&self.path_slots(at)),
            self.model.path_pages(node),
        )?;
        Ok((at, node))
    }

    /// Moves a lock from `from` to `to` on both sides (the root is never locked).
    fn relock(&mut self, from: (NodeId, usize), to: (NodeId, usize)) {
        match (from.0 == NodeId::ROOT, to.0 == NodeId::ROOT) {
            (true, true) => {}
            (true, false) => self.tree.inc_lock_ref(to.0).unwrap(),
            (false, true) => self.tree.dec_lock_ref(from.0).unwrap(),
            (false, false) => self.tree.move_lock(from.0, to.0).unwrap(),
        }
        // `cache_unfinished_req`: the old node is released before the new one is locked.
        self.model.dec_lock_ref(from.1);
        self.model.inc_lock_ref(to.1);
    }

    /// Inserts `units` (request `index`'s whole key, some pages new) as `cache_unfinished_req`
    /// does (and moves the request's lock to the key's end) or, when `finished`, as
    /// `cache_finished_req` does (and releases the lock).
    fn register(&mut self, index: usize, units: Vec<u32>, chunked: bool, finished: bool) -> Step {
        let (at, model_at, priority) = {
            let req = &self.requests[index];
            (req.at, req.model, req.priority)
        };
        let mut slots = self.path_slots(at);
        let new_tokens = (units.len() * self.page_size).saturating_sub(at.len);
        let fresh = self.fresh(new_tokens);
        slots.extend(fresh);
        let from = match self.hint {
            Hint::Root => TreePos::ROOT,
            Hint::Lock => at,
        };
        let params = InsertParams { priority, chunked };
        let (end, model_end) = self.insert(&units, &slots, at.len, from, params)?;
        if finished {
            if at.node != NodeId::ROOT {
                self.tree.dec_lock_ref(at.node).unwrap();
            }
            self.model.dec_lock_ref(model_at);
            self.requests.swap_remove(index);
            self.trace.push("request finished, lock released".into());
        } else {
            self.relock((at.node, model_at), (end.node, model_end));
            let req = &mut self.requests[index];
            req.units = units;
            req.at = end;
            req.model = model_end;
        }
        Ok(())
    }

    fn apply(&mut self, op: &Op) -> Step {
        match op {
            Op::Insert {
                key,
                priority,
                chunked,
            } => {
                let units = self.resolve(key);
                let slots = self.fresh(units.len() * self.page_size);
                let params = InsertParams {
                    priority: *priority,
                    chunked: *chunked,
                };
                self.insert(&units, &slots, 0, TreePos::ROOT, params)?;
            }
            Op::Match { key, partial, lock } => {
                let units = self.resolve(key);
                let mut tokens = self.tokens(&units);
                tokens.extend(std::iter::repeat_n(7, partial % self.page_size));
                let (at, node) = self.match_prefix(&tokens)?;
                self.trace.push(format!(
                    "match {units:?} (+{} tokens) -> {} pages{}",
                    partial % self.page_size,
                    at.len / self.page_size,
                    if *lock && at.len > 0 { ", locked" } else { "" }
                ));
                if *lock && at.len > 0 {
                    self.tree.inc_lock_ref(at.node).unwrap();
                    self.model.inc_lock_ref(node);
                    self.holders.push(Holder {
                        node: at.node,
                        model: node,
                    });
                }
            }
            Op::Unlock { holder } => {
                if !self.holders.is_empty() {
                    let holder = self.holders.swap_remove(holder % self.holders.len());
                    self.tree.dec_lock_ref(holder.node).unwrap();
                    self.model.dec_lock_ref(holder.model);
                    self.trace.push("unlock a match".into());
                }
            }
            Op::Evict { pages } => {
                let asked = pages.saturating_mul(self.page_size);
                self.alloc.faults.take_freed_pages();
                let evicted = self.tree.evict(asked, &mut self.alloc).unwrap();
                self.freed = self.alloc.faults.take_freed_pages();
                let (model_evicted, model) = self.model.evict(asked);
                self.trace.push(format!(
                    "evict {} pages: kvown frees {:?}, model {model:?}",
                    if *pages == usize::MAX {
                        "all".to_string()
                    } else {
                        pages.to_string()
                    },
                    self.freed,
                ));
                same("pages freed, call by call, in order", &self.freed, &model)?;
                same("tokens evicted", evicted, model_evicted)?;
            }
            Op::Start {
                key,
                priority,
                chunked,
            } => {
                let mut units = self.resolve(key);
                if units.is_empty() {
                    units.push(0);
                }
                let tokens = self.tokens(&units);
                let (at, node) = self.match_prefix(&tokens)?;
                self.trace.push(format!(
                    "request {} starts: prompt {units:?} priority {priority}, {} pages matched",
                    self.requests.len(),
                    at.len / self.page_size
                ));
                if at.len > 0 {
                    self.tree.inc_lock_ref(at.node).unwrap();
                    self.model.inc_lock_ref(node);
                }
                self.requests.push(Request {
                    units: Vec::new(),
                    at,
                    model: node,
                    priority: *priority,
                });
                let index = self.requests.len() - 1;
                self.register(index, units, *chunked, false)?;
            }
            Op::Register { req, pages } => self.extend_request(*req, pages, false)?,
            Op::Finish { req, pages } => self.extend_request(*req, pages, true)?,
        }
        Ok(())
    }

    /// The sizes, the cached pages and the pool's accounting agree after a step.
    /// Request `req` (modulo their number) registers `pages` more, or finishes with them.
    fn extend_request(&mut self, req: usize, pages: &[u32], finished: bool) -> Step {
        if self.requests.is_empty() {
            return Ok(());
        }
        let index = req % self.requests.len();
        let mut units = self.requests[index].units.clone();
        units.extend_from_slice(pages);
        units.truncate(MAX_REQUEST_PAGES.max(self.requests[index].units.len()));
        let verb = if finished {
            "finishes with"
        } else {
            "registers"
        };
        self.trace.push(format!("request {index} {verb} {pages:?}"));
        self.keys.push(units.clone());
        self.register(index, units, !finished, finished)
    }

    fn verify(&self) -> Step {
        check_radix(&self.tree).map_err(|e| format!("kvown's check: {e}"))?;
        same(
            "evictable_size",
            self.tree.sizes().evictable,
            self.model.evictable_size,
        )?;
        same(
            "protected_size",
            self.tree.sizes().protected,
            self.model.protected_size,
        )?;
        let mut cached: Vec<PageId> = self.tree.cached_pages().map(|(_, page)| page).collect();
        cached.sort_unstable();
        same("cached pages", cached, self.model.cached_pages())?;
        // Every page is free or the tree's: no request holds a page the tree does not.
        same(
            "available + cached",
            self.alloc.available_size() + self.tree.sizes().total(),
            self.alloc.capacity(),
        )
    }

    /// Releases every lock, evicts everything, and checks that the pool is whole again.
    fn finish(&mut self) -> Step {
        while let Some(req) = self.requests.pop() {
            if req.at.node != NodeId::ROOT {
                self.tree.dec_lock_ref(req.at.node).unwrap();
            }
            self.model.dec_lock_ref(req.model);
        }
        while let Some(holder) = self.holders.pop() {
            self.tree.dec_lock_ref(holder.node).unwrap();
            self.model.dec_lock_ref(holder.model);
        }
        self.trace.push("every lock released".into());
        self.verify()?;
        self.apply(&Op::Evict { pages: usize::MAX })?;
        self.verify()?;
        same(
            "available after evicting everything",
            self.alloc.available_size(),
            self.alloc.capacity(),
        )
    }

    /// A failure message: where, the step, what each side did so far, and the model's tree.
    fn report(&self, index: usize, op: Option<&Op>, error: &str) -> String {
        let mut out = format!(
            "page size {}, {} policy, requests insert from {:?}: ",
            self.page_size, self.policy, self.hint
        );
        match op {
            Some(op) => {
                let _ = write!(out, "op #{index} {op:?}");
            }
            None => out.push_str("at the end"),
        }
        let _ = writeln!(out, "\n  {error}\nsteps:");
        for line in &self.trace {
            let _ = writeln!(out, "  {line}");
        }
        let _ = write!(out, "model:\n{}", self.model.dump());
        out
    }
}

/// Replays `ops` at every page size and policy; the first difference fails with a report.
fn replay(ops: &[Op], hint: Hint) -> Result<(), TestCaseError> {
    for page_size in PAGE_SIZES {
        for policy in EvictionPolicy::ALL {
            replay_one(ops, page_size, policy, hint).map_err(TestCaseError::fail)?;
        }
    }
    Ok(())
}

fn replay_one(ops: &[Op], page_size: usize, policy: EvictionPolicy, hint: Hint) -> Step {
    let mut world = World::new(page_size, policy, hint);
    for (index, op) in ops.iter().enumerate() {
        world
            .apply(op)
            .and_then(|()| world.verify())
            .map_err(|error| world.report(index, Some(op), &error))?;
    }
    world
        .finish()
        .map_err(|error| world.report(ops.len(), None, &error))
}

proptest! {
    #![proptest_config(common::proptest_config())]

    #[test]
    fn replay_without_requests(ops in prop::collection::vec(plain_op(), 1..40)) {
        replay(&ops, Hint::Root)?;
    }

    #[test]
    fn replay_requests_registering_from_the_root(
        ops in prop::collection::vec(request_op(), 1..40),
    ) {
        replay(&ops, Hint::Root)?;
    }

    #[test]
    fn replay_requests_growing_their_leaf(ops in prop::collection::vec(request_op(), 1..40)) {
        replay(&ops, Hint::Lock)?;
    }
}

/// A key of new pages `units`.
fn fresh_key(units: &[u32]) -> KeySpec {
    KeySpec {
        base: 0,
        cut: 0,
        tail: units.to_vec(),
    }
}

/// An insert of new pages `units` at priority 0, as a hit.
fn insert_op(units: &[u32]) -> Op {
    Op::Insert {
        key: fresh_key(units),
        priority: 0,
        chunked: false,
    }
}

/// Applies `ops` to `world`, checking both sides after each.
fn run(world: &mut World, ops: &[Op]) {
    for (index, op) in ops.iter().enumerate() {
        if let Err(error) = world.apply(op).and_then(|()| world.verify()) {
            panic!("{}", world.report(index, Some(op), &error));
        }
    }
}

/// Page size 1, LRU: inserting `[1, 3]` splits `[1, 2]`; its lower part `[2]` and the new leaf
/// `[3]` under `[1]` are both newer than the leaf `[3]` inserted before, which goes first.
#[test]
fn a_split_leaves_the_older_leaf_first_in_line() {
    let mut world = World::new(1, EvictionPolicy::Lru, Hint::Root);
    run(
        &mut world,
        &[insert_op(&[1, 2]), insert_op(&[3]), insert_op(&[1, 3])],
    );
    let page_of_3 = world.model.lookup(&[3]);
    assert_eq!(page_of_3.len(), 1);
    run(&mut world, &[Op::Evict { pages: 1 }]);
    assert_eq!(world.freed, [page_of_3]);
    assert_eq!(world.model.lookup(&[3]), []);
    assert_eq!(world.model.lookup(&[1, 3]).len(), 2);
}

/// Page size 1, LRU: a request locks `[1]`, registers page `[2]` and finishes; sglang holds
/// `[2]` in a node of its own below `[1]`, so evicting one token frees the page of `[2]` alone.
/// kvown grows the request's leaf in place (the request inserts from its lock, as the batch
/// flow does) and must still evict only the newest registration.
#[test]
fn a_grown_leaf_evicts_only_its_newest_registration() {
    let mut world = World::new(1, EvictionPolicy::Lru, Hint::Lock);
    run(
        &mut world,
        &[
            insert_op(&[1]),
            Op::Start {
                key: KeySpec {
                    base: 0,
                    cut: 1,
                    tail: Vec::new(),
                },
                priority: 0,
                chunked: true,
            },
            Op::Register {
                req: 0,
                pages: vec![2],
            },
            Op::Finish {
                req: 0,
                pages: Vec::new(),
            },
        ],
    );
    let pages = world.model.lookup(&[1, 2]);
    assert_eq!(pages.len(), 2);
    run(&mut world, &[Op::Evict { pages: 1 }]);
    assert_eq!(world.freed, [vec![pages[1]]]);
    assert_eq!(world.model.lookup(&[1, 2]), pages[..1]);
}

/// Page size 1, priority policy: a leaf inserted at priority -1 has priority -1
/// (`_insert_helper` makes the leaf at the insert's priority), below the 0 of an earlier leaf,
/// so it goes first although it is newer.
#[test]
fn a_leaf_inserted_at_a_negative_priority_goes_first() {
    let mut world = World::new(1, EvictionPolicy::Priority, Hint::Root);
    let low = Op::Insert {
        key: fresh_key(&[2]),
        priority: -1,
        chunked: false,
    };
    run(&mut world, &[insert_op(&[1]), low]);
    let page_of_2 = world.model.lookup(&[2]);
    run(&mut world, &[Op::Evict { pages: 1 }]);
    assert_eq!(world.freed, [page_of_2]);
}

/// Page size 1, MRU: inserting `[1, 3]` splits `[1, 2]`; the lower part `[2]` takes the
/// insert's access time, and the new leaf `[3]`, a fresh `TreeNode`, a later one, so it is the
/// most recently used and goes first.
#[test]
fn a_leaf_added_below_a_split_is_newer_than_the_split_off_part() {
    let mut world = World::new(1, EvictionPolicy::Mru, Hint::Root);
    run(&mut world, &[insert_op(&[1, 2]), insert_op(&[1, 3])]);
    let pages = world.model.lookup(&[1, 3]);
    run(&mut world, &[Op::Evict { pages: 1 }]);
    assert_eq!(world.freed, [vec![pages[1]]]);
}

/// Page size 1, FIFO, the case issue 42 found: matching `[1]` splits `[1, 2]`, and the upper
/// part `[1]` is a new node (sglang `_split_node`), created after `[3]`. Evicting two tokens
/// frees `[2]` (the oldest leaf, keeping its creation time) then `[3]`, one free per node; `[1]`
/// is younger than `[3]` and stays.
#[test]
fn under_fifo_a_split_off_upper_part_is_younger_than_older_leaves() {
    let mut world = World::new(1, EvictionPolicy::Fifo, Hint::Root);
    run(
        &mut world,
        &[insert_op(&[1, 2]), insert_op(&[3]), match_op(&[1], false)],
    );
    let pages = world.model.lookup(&[1, 2]);
    let page_of_3 = world.model.lookup(&[3]);
    run(&mut world, &[Op::Evict { pages: 2 }]);
    assert_eq!(world.freed, [vec![pages[1]], page_of_3]);
    assert_eq!(world.model.lookup(&[1]), pages[..1]);
}

/// Page size 1, FILO: as above, with `[3]` locked while `[2]` is evicted; then `[1]`, created by
/// the match, is the newest node and goes before `[3]`.
#[test]
fn under_filo_a_split_off_upper_part_goes_before_older_leaves() {
    let mut world = World::new(1, EvictionPolicy::Filo, Hint::Root);
    run(
        &mut world,
        &[
            insert_op(&[1, 2]),
            insert_op(&[3]),
            match_op(&[1], false),
            match_op(&[3], true),
            Op::Evict { pages: 1 },
            Op::Unlock { holder: 0 },
        ],
    );
    let page_of_1 = world.model.lookup(&[1]);
    run(&mut world, &[Op::Evict { pages: 1 }]);
    assert_eq!(world.freed, [page_of_1]);
    assert_eq!(world.model.lookup(&[3]).len(), 1);
}

/// A match of new pages `units`, locked when `lock`.
fn match_op(units: &[u32], lock: bool) -> Op {
    Op::Match {
        key: fresh_key(units),
        partial: 0,
        lock,
    }
}

/// sglang 0.5.23's real code run on CPU (`RadixCache.evict` over `PagedTokenToKVPoolAllocator`,
/// page size 4) frees this sequence's two nodes with one call each, each node's pages in key
/// order, not sorted: `[[3, 1], [4]]`, leaving the free list headed `[4, 3, 1, 5]`. So does
/// kvown.
#[test]
fn an_evicted_nodes_pages_are_freed_in_key_order_one_call_per_node() {
    let mut alloc = Faulty {
        inner: PagedAllocator::new(32, 4, false).unwrap(),
        faults: Faults::default(),
    };
    let take = |alloc: &mut Faulty<PagedAllocator>, tokens: usize| {
        let mut slots = Vec::new();
        alloc.alloc(tokens, &mut slots).unwrap();
        slots
    };
    let (a, b) = (take(&mut alloc, 8), take(&mut alloc, 4));
    alloc.free(&a[..4]).unwrap();
    alloc.free(&b).unwrap();
    let mut tree = RadixCache::new(RadixConfig::new(4)).unwrap();
    let v = take(&mut alloc, 8);
    tree.insert(Insert::new(&(0..8).collect::<Vec<u32>>(), &v))
        .unwrap();
    let w = take(&mut alloc, 4);
    tree.insert(Insert::new(&[9; 4], &w)).unwrap();
    alloc.faults.take_freed_pages();
    assert_eq!(tree.evict(12, &mut alloc), Ok(12));
    assert_eq!(alloc.faults.take_freed_pages(), [vec![3, 1], vec![4]]);
    let head: Vec<PageId> = alloc.inner.free_pages().take(4).collect();
    assert_eq!(head, [4, 3, 1, 5]);
}
