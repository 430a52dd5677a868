//! Radix prefix cache (sglang `mem_cache/radix_cache.py`, `RadixCache`) over token ids and KV
//! slots.
//!
//! The tree maps page-aligned token sequences to the KV pages that hold them. It works on plain
//! data; the request-level steps of [`crate::batch`] (`init_next_round_input`,
//! `cache_unfinished_req`, and the release's `cache_finished_req`) are built on these
//! primitives:
//!
//! * [`RadixCache::match_prefix`] finds the longest cached whole-page prefix, splitting the node
//!   where the match ends, and returns a [`TreePos`]; [`RadixCache::path_slots_into`] copies the
//!   matched slots into a request's row without allocating.
//! * Keys live in [`Namespace`]s ([`RadixCache::match_prefix_in`], [`RadixCache::insert_in`]):
//!   the same tokens in two namespaces (two LoRA adapters, two cache salts) are two entries,
//!   and a match never crosses from one to the other.
//! * [`RadixCache::insert`] / [`RadixCache::insert_from`] add a page-aligned key and return how
//!   much of it was already cached. **The caller frees its duplicates**: the slots it passed for
//!   positions `[cache_protected_len, prefix_len)` are not taken by the tree (the tree keeps its
//!   own), and must be freed by the caller exactly once, e.g. with
//!   `free_segment(&row[protected..prefix_len], protected)`. Slots at `[prefix_len, key.len())`
//!   now belong to the tree.
//! * [`RadixCache::inc_lock_ref`] / [`RadixCache::dec_lock_ref`] / [`RadixCache::move_lock`] pin
//!   a node and its path; tokens move between evictable and protected only on 0↔1 transitions.
//! * [`RadixCache::evict`] frees unlocked leaves through the allocator, one allocator call per
//!   node, in the order of the cache's [`EvictionPolicy`] (least recently used first by
//!   default); [`RadixCache::evict_shortfall`] evicts what the allocator lacks (sglang's
//!   `evict_to_free_tokens` evicts `num_tokens - available_size()`).
//! * [`RadixCache::enable_events`] turns on a stream of [`CacheEvent`]s (pages stored and
//!   removed, named by a chained [`PageHash`]) for a router; [`RadixCache::take_events`]
//!   drains it. Off by default.
//!
//! ```
//! use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
//! use kvown_runtime::radix::RadixCache;
//!
//! let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
//! let mut tree = RadixCache::new(4);
//! let mut slots = Vec::new();
//! allocator.alloc(8, &mut slots).unwrap(); // two pages for an 8-token prompt
//! let prompt = [10, 11, 12, 13, 14, 15, 16, 17];
//! let inserted = tree.insert(&prompt, &slots).unwrap();
//! assert_eq!(inserted.prefix_len, 0); // nothing was cached before
//!
//! // A request sharing the first page (and half of the second) matches one whole page.
//! let hit = tree.match_prefix(&[10, 11, 12, 13, 14, 15, 99]);
//! assert_eq!(hit.len, 4);
//! let mut prefix = vec![0; hit.len];
//! tree.path_slots_into(hit, 0, &mut prefix).unwrap();
//! assert_eq!(prefix, slots[..4]);
//!
//! // Unlocked entries are evictable; eviction frees their pages through the allocator.
//! assert_eq!(tree.evictable_size(), 8);
//! tree.evict(8, &mut allocator).unwrap();
//! assert_eq!(allocator.available_size(), allocator.capacity());
//! ```
//!
//! Storage: an arena of 72-byte nodes indexed by [`NodeId`] (an entry and its generation, so
//! a handle kept past its node's eviction is refused), with 48 bytes of eviction figures (16 of
//! them the node's own, 32 the header of a grown leaf's registrations, which take 16 bytes
//! each) and 4 of generation per node beside it; each node stores its key pages interleaved
//! with their page ids (4 bytes per page); one hash map indexes children by (parent,
//! namespace, first page). See [`RadixCache::bookkeeping_bytes`].
//!
//! Access times are kept lazily: an insert stamps the node where it ends and the lower half of
//! a node it splits (a match stamps the nodes it passes), and a node takes the newer of its own
//! and a removed child's time; hits and priorities are recorded where an insert ends and
//! passed on the same way. Since only leaves are evicted, the leaf order equals sglang's, which
//! stamps the whole path. A running request's leaf grows in place where sglang adds a node per
//! registration; it keeps where each registration ends and what its node would carry, and is
//! evicted registration by registration, newest first, as sglang's nodes would be.
//! `tests/eviction_replay.rs` replays random sequences against a model of sglang's rules.

mod check;
mod children;
mod error;
mod events;
mod evict;
mod insert;
mod layout;
mod lock;
mod match_prefix;
mod node;
mod page_index;
mod policy;
mod registrations;

pub(crate) use check::LockMismatch;
pub use check::PrefixPart;
pub use error::RadixError;
pub use events::{CacheEvent, PageHash, StoredPage};
pub use node::NodeId;
pub use policy::{EvictionPolicy, InsertParams, SLRU_PROTECTED_HITS, UnknownEvictionPolicy};

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::ids::{KvSlot, PageId};
use children::ChildIndex;
use events::EventLog;
use evict::EvictionScratch;
pub(crate) use layout::KeyLayout;
use node::{Arena, NOT_EVICTABLE, Node};
use page_index::PageIndex;
use policy::Rank;

/// Outdated entries of the eviction order tolerated beyond twice the candidates before a
/// rebuild.
const ORDER_SLACK: usize = 64;

/// An entry of the eviction order: a candidate's rank when it was listed, and the candidate.
type OrderEntry = Reverse<(Rank, NodeId)>;

/// A position on a path of the tree: the first `len` tokens of some key end inside or at the end
/// of `node`. Returned by matches and inserts, where `node` ends exactly at `len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreePos {
    /// Node on whose key the position lies (the deepest matched node).
    pub node: NodeId,
    /// Tokens of the key up to the position; a multiple of the page size.
    pub len: usize,
}

impl TreePos {
    /// The empty prefix.
    pub const ROOT: TreePos = TreePos {
        node: NodeId::ROOT,
        len: 0,
    };
}

/// A separate space of cached prefixes: keys in different namespaces never share a node, so a
/// request only ever matches KV computed in its own namespace. Give requests whose KV differs
/// for the same tokens different namespaces: one per LoRA adapter, or per cache salt when
/// tenants must not reuse (or time) each other's prefixes (sglang's `extra_key`).
///
/// A namespace is a dense id, not a hash: two salts hashed to 32 bits can collide, and then
/// share prefixes; give each salt its own id (for instance from a map of the salts seen).
///
/// ```
/// use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
/// use kvown_runtime::radix::{Namespace, RadixCache, TreePos};
///
/// let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
/// let mut tree = RadixCache::new(4);
/// let (base, adapter) = (Namespace::DEFAULT, Namespace(7));
/// let prompt = [10, 11, 12, 13, 14, 15, 16, 17];
/// let mut slots = Vec::new();
/// allocator.alloc(8, &mut slots).unwrap();
/// tree.insert_in(adapter, &prompt, &slots).unwrap();
///
/// // The adapter's requests reuse its KV; the base model's do not see it.
/// assert_eq!(tree.match_prefix_in(adapter, &prompt).len, 8);
/// assert_eq!(tree.match_prefix_in(base, &prompt), TreePos::ROOT);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(pub u32);

impl Namespace {
    /// The namespace of requests that do not choose one ([`crate::batch::Req::new`]) and of
    /// [`RadixCache::match_prefix`] and [`RadixCache::insert`].
    pub const DEFAULT: Namespace = Namespace(0);
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "namespace {}", self.0)
    }
}

/// What an insert found and where the inserted key now ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertOutcome {
    /// Tokens of the key that were already cached. The caller's slots for `[protected,
    /// prefix_len)` are duplicates it must free; `[prefix_len, key.len())` now belong to the tree.
    pub prefix_len: usize,
    /// The node whose key ends exactly at `key.len()`: lock it to protect the whole key.
    pub last_node: NodeId,
}

/// The radix prefix cache of one KV pool. All lengths are in tokens.
#[derive(Debug)]
pub struct RadixCache {
    layout: KeyLayout,
    arena: Arena,
    children: ChildIndex,
    /// Unlocked non-root nodes without children: the eviction candidates.
    evictable_leaves: Vec<NodeId>,
    /// Which candidate an eviction takes first.
    policy: EvictionPolicy,
    /// The candidates in eviction order, kept across calls: every evictable leaf has an entry
    /// with its current rank; outdated entries are skipped when popped and dropped by a rebuild
    /// once they outnumber the candidates.
    order: BinaryHeap<OrderEntry>,
    evictable_size: usize,
    protected_size: usize,
    total_size: usize,
    /// Logical clock for access times; ticks once per match or insert.
    clock: u64,
    /// Reused buffers of eviction plans (boxed, so that the cache itself stays small).
    eviction: Box<EvictionScratch>,
    /// Every page the nodes hold, so that an insert can refuse one it would cache twice.
    pages: PageIndex,
    /// Cache events, when on ([`RadixCache::enable_events`]).
    events: Option<Box<EventLog>>,
}

impl RadixCache {
    /// An empty cache for pages of `page_size` slots (1 for the token allocator) that evicts
    /// least recently used leaves first ([`EvictionPolicy::Lru`]).
    ///
    /// # Panics
    /// If `page_size` is 0 or above `u32::MAX / 2`; [`RadixCache::try_new`] refuses it with a
    /// typed error instead.
    pub fn new(page_size: usize) -> RadixCache {
        RadixCache::with_policy(page_size, EvictionPolicy::Lru)
    }

    /// [`RadixCache::new`] for a page size that comes from outside: a page size of 0 is
    /// [`RadixError::ZeroPageSize`], one larger than any allocator's (`u32::MAX / 2`)
    /// [`RadixError::PageSizeTooLarge`].
    pub fn try_new(page_size: usize) -> Result<RadixCache, RadixError> {
        RadixCache::try_with_policy(page_size, EvictionPolicy::Lru)
    }

    /// An empty cache for pages of `page_size` slots whose evictions follow `policy`.
    ///
    /// ```
    /// use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
    /// use kvown_runtime::radix::{EvictionPolicy, RadixCache};
    ///
    /// let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
    /// let mut tree = RadixCache::with_policy(4, EvictionPolicy::Mru);
    /// let mut slots = Vec::new();
    /// allocator.alloc(8, &mut slots).unwrap();
    /// tree.insert(&[1, 1, 1, 1], &slots[..4]).unwrap();
    /// tree.insert(&[2, 2, 2, 2], &slots[4..]).unwrap();
    /// tree.evict(4, &mut allocator).unwrap();
    /// // The most recently used entry went first.
    /// assert_eq!(tree.match_prefix(&[1, 1, 1, 1]).len, 4);
    /// assert_eq!(tree.match_prefix(&[2, 2, 2, 2]).len, 0);
    /// ```
    ///
    /// # Panics
    /// If `page_size` is 0 or above `u32::MAX / 2`; [`RadixCache::try_with_policy`] refuses it
    /// with a typed error instead.
    pub fn with_policy(page_size: usize, policy: EvictionPolicy) -> RadixCache {
        RadixCache::try_with_policy(page_size, policy).unwrap_or_else(|error| panic!("{error}"))
    }

    /// [`RadixCache::with_policy`] for a page size that comes from outside: a page size of 0 is
    /// [`RadixError::ZeroPageSize`], one larger than any allocator's (`u32::MAX / 2`)
    /// [`RadixError::PageSizeTooLarge`].
    pub fn try_with_policy(
        page_size: usize,
        policy: EvictionPolicy,
    ) -> Result<RadixCache, RadixError> {
        if page_size == 0 {
            return Err(RadixError::ZeroPageSize);
        }
        // Page 1 of an allocator ends at slot `2 * page_size`, which must fit in a `u32`.
        let max = KvSlot::MAX as usize / 2;
        if page_size > max {
            return Err(RadixError::PageSizeTooLarge { page_size, max });
        }
        Ok(RadixCache {
            layout: KeyLayout::new(page_size),
            arena: Arena::new(),
            children: ChildIndex::default(),
            evictable_leaves: Vec::new(),
            policy,
            order: BinaryHeap::new(),
            evictable_size: 0,
            protected_size: 0,
            total_size: 0,
            clock: 0,
            eviction: Box::default(),
            pages: PageIndex::default(),
            events: None,
        })
    }

    /// Slots per page; every cached length is a multiple of it.
    pub fn page_size(&self) -> usize {
        self.layout.page_size()
    }

    /// The page arithmetic of this cache's keys.
    pub(crate) fn layout(&self) -> KeyLayout {
        self.layout
    }

    /// The order in which evictions take unlocked leaves.
    pub fn policy(&self) -> EvictionPolicy {
        self.policy
    }

    /// Cached tokens in unlocked nodes (what [`RadixCache::evict`] can free).
    pub fn evictable_size(&self) -> usize {
        self.evictable_size
    }

    /// Cached tokens in locked nodes.
    pub fn protected_size(&self) -> usize {
        self.protected_size
    }

    /// Cached tokens; always `evictable_size() + protected_size()`.
    pub fn total_size(&self) -> usize {
        self.total_size
    }

    /// Every page the tree holds, each once (for ps = 1 a page id is the slot).
    pub fn cached_pages(&self) -> impl Iterator<Item = PageId> + '_ {
        let layout = self.layout;
        self.arena
            .live()
            .flat_map(move |(_, node)| node.page_ids(layout))
    }

    /// Every page the tree holds, each once, with the node that holds it.
    pub fn cached_pages_by_node(&self) -> impl Iterator<Item = (NodeId, PageId)> + '_ {
        let layout = self.layout;
        self.arena
            .live()
            .flat_map(move |(id, node)| node.page_ids(layout).map(move |page| (id, page)))
    }

    /// Every slot the tree holds, each once.
    pub fn cached_slots(&self) -> impl Iterator<Item = KvSlot> + '_ {
        let page_size = self.layout.page_size() as u32;
        self.cached_pages()
            // Inclusive: the last page of the `u32` range ends at 2^32.
            .flat_map(move |page| page * page_size..=page * page_size + (page_size - 1))
    }

    /// Heap and inline bytes of the cache's bookkeeping, token ids of the keys excluded: node
    /// table, page ids and spare vector capacity, grown leaves' registrations, child index,
    /// leaf set, buffers, and the page
    /// index (one bit per page id up to the largest the tree has held); with events on, the
    /// queued events and the page hashes (8 bytes per page id up to the largest held).
    pub fn bookkeeping_bytes(&self) -> usize {
        let key_bytes: usize = self
            .arena
            .live()
            .map(|(_, node)| node.len(self.layout) * size_of::<u32>())
            .sum();
        let node_data_bytes: usize = self
            .arena
            .live()
            .map(|(_, node)| node.data.capacity() * size_of::<u32>())
            .sum();
        size_of::<RadixCache>()
            + self.arena.table_bytes()
            + (node_data_bytes - key_bytes)
            + self.children.heap_bytes()
            + self.evictable_leaves.capacity() * size_of::<NodeId>()
            + self.order.capacity() * size_of::<OrderEntry>()
            + self.eviction.heap_bytes()
            + self.pages.heap_bytes()
            + self.events.as_ref().map_or(0, |events| events.heap_bytes())
    }

    /// Advances the logical clock and returns the new time.
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    fn ensure_live(&self, node: NodeId) -> Result<(), RadixError> {
        if self.arena.is_live(node) {
            Ok(())
        } else {
            Err(RadixError::UnknownNode { node })
        }
    }

    /// Counts `tokens` new tokens of `node` as evictable or protected by its lock state.
    fn add_tokens(&mut self, node: NodeId, tokens: usize) {
        if self.arena[node].lock_ref == 0 {
            self.evictable_size += tokens;
        } else {
            self.protected_size += tokens;
        }
        self.total_size += tokens;
    }

    /// Puts `node` in or takes it out of the evictable-leaf set to match its state.
    fn refresh_leaf_status(&mut self, node: NodeId) {
        let entry = &self.arena[node];
        let evictable = node != NodeId::ROOT && entry.lock_ref == 0 && entry.child_count == 0;
        self.list_evictable(node, evictable);
    }

    /// Sets `node`'s access time, keeping the eviction order current when it is a candidate.
    fn stamp(&mut self, node: NodeId, now: u64) {
        self.arena[node].last_access = now;
        if self.arena[node].leaf_pos != NOT_EVICTABLE {
            self.push_order(node);
        }
    }

    /// The eviction rank of `node` as it stands.
    fn rank(&self, node: NodeId) -> Rank {
        self.policy
            .rank(self.arena[node].last_access, self.arena.stats(node))
    }

    /// Records candidate `node` at its current rank; rebuilds the order from the candidates
    /// when outdated entries make up most of it (amortized O(log n)).
    fn push_order(&mut self, node: NodeId) {
        self.order.push(Reverse((self.rank(node), node)));
        if self.order.len() > 2 * self.evictable_leaves.len() + ORDER_SLACK {
            let mut entries = std::mem::take(&mut self.order).into_vec();
            entries.clear();
            entries.extend(
                self.evictable_leaves
                    .iter()
                    .map(|&leaf| Reverse((self.rank(leaf), leaf))),
            );
            self.order = BinaryHeap::from(entries);
        }
    }

    /// Whether an entry of the eviction order at `rank` still describes candidate `node`.
    fn is_current_entry(&self, rank: Rank, node: NodeId) -> bool {
        self.arena.is_live(node)
            && self.arena[node].leaf_pos != NOT_EVICTABLE
            && self.rank(node) == rank
    }

    /// Makes `node`'s membership in the evictable-leaf set equal `listed`, in O(1).
    fn list_evictable(&mut self, node: NodeId, listed: bool) {
        let pos = self.arena[node].leaf_pos;
        if listed && pos == NOT_EVICTABLE {
            self.arena[node].leaf_pos = self.evictable_leaves.len() as u32;
            self.evictable_leaves.push(node);
            self.push_order(node);
        } else if !listed && pos != NOT_EVICTABLE {
            let pos = pos as usize;
            self.evictable_leaves.swap_remove(pos);
            if let Some(&moved) = self.evictable_leaves.get(pos) {
                self.arena[moved].leaf_pos = pos as u32;
            }
            self.arena[node].leaf_pos = NOT_EVICTABLE;
        }
    }

    /// The namespace of the live non-root `node`; `None` for the root (shared by all) and for
    /// a handle that names no node.
    pub(crate) fn namespace_of(&self, node: NodeId) -> Option<Namespace> {
        (node != NodeId::ROOT && self.arena.is_live(node)).then(|| self.arena[node].namespace)
    }

    /// Number of leading whole pages of `key` equal to the pages of `node` from `first_page`.
    fn common_pages(&self, node: NodeId, first_page: usize, key: &[u32]) -> usize {
        let entry = &self.arena[node];
        let layout = self.layout;
        let page_size = layout.page_size();
        (first_page..entry.num_pages(layout))
            .zip(key.chunks_exact(page_size))
            .take_while(|&(page, tokens)| entry.page_tokens(page, layout) == tokens)
            .count()
    }

    /// Splits `node` at path position `pos` (strictly inside its key, page-aligned) at time
    /// `now`. The new upper node takes the key before `pos` and is returned, created `now`
    /// ([`policy::NodeStats::split_upper`]); `node` keeps its handle, children, lock count,
    /// leaf status and figures with the key from `pos`. Counters do not change.
    fn split(&mut self, node: NodeId, pos: usize, now: u64) -> NodeId {
        debug_assert!(
            self.arena.registrations(node).is_none(),
            "a grown leaf is cut, not split"
        );
        let layout = self.layout;
        self.children.unlink(&mut self.arena, layout, node);
        let entry = &mut self.arena[node];
        let cut = layout.key_words(pos - entry.start());
        let lower = entry.data.split_off(cut);
        let mut upper_data = std::mem::replace(&mut entry.data, lower);
        upper_data.shrink_to_fit();
        let mut upper = Node::new(
            upper_data,
            entry.parent,
            entry.namespace,
            entry.start(),
            entry.last_access,
        );
        upper.lock_ref = entry.lock_ref;
        upper.child_count = 1;
        let upper_stats = self.arena.stats(node).split_upper(now);
        let upper = self.arena.alloc(upper, upper_stats);
        self.children.link(&mut self.arena, layout, upper);
        let entry = &mut self.arena[node];
        entry.parent = upper;
        entry.depth = pos as u32;
        self.children.link(&mut self.arena, layout, node);
        upper
    }
}
