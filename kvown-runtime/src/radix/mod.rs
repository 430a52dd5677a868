//! Radix prefix cache (sglang `mem_cache/radix_cache.py`, `RadixCache`) over token ids and KV
//! slots.
//!
//! The tree maps page-aligned token sequences to the KV pages that hold them. It works on plain
//! data; the request-level steps of [`crate::batch`] (`init_next_round_input`,
//! `cache_unfinished_req`, and the release's `cache_finished_req`) are built on these
//! primitives:
//!
//! * [`RadixCache::new`] builds an empty cache from a [`RadixConfig`] (page size, eviction
//!   policy, events).
//! * [`RadixCache::match_prefix`] finds the longest cached whole-page prefix of a [`Key`],
//!   splitting the node where the match ends, and returns a [`TreePos`];
//!   [`RadixCache::path_slots_into`] copies the matched slots into a request's row without
//!   allocating.
//! * Keys live in [`Namespace`]s (`namespace.key(&tokens)`): the same tokens in two namespaces
//!   (two LoRA adapters, two cache salts) are two entries, and a match never crosses from one
//!   to the other. A plain token slice is a key of [`Namespace::DEFAULT`].
//! * [`RadixCache::insert`] adds a page-aligned key described by an [`Insert`] and returns how
//!   much of it was already cached; [`RadixCache::plan_insert`] checks and plans the same
//!   insert without changing anything, and [`InsertPlan::apply`] carries it out. **The caller
//!   frees its duplicates**: the slots it passed for positions `[cache_protected_len,
//!   prefix_len)` are not taken by the tree (the tree keeps its own), and must be freed by the
//!   caller exactly once, e.g. with `free_segment(&row[protected..prefix_len], protected)`.
//!   Slots at `[prefix_len, key.len())` now belong to the tree.
//! * [`RadixCache::inc_lock_ref`] / [`RadixCache::dec_lock_ref`] / [`RadixCache::move_lock`] pin
//!   a node and its path; tokens move between evictable and protected only on 0↔1 transitions.
//! * [`RadixCache::evict`] frees unlocked leaves through the allocator, one allocator call per
//!   node, in the order of the cache's [`EvictionPolicy`] (least recently used first by
//!   default).
//! * [`RadixCache::enable_events`] turns on a stream of [`CacheEvent`]s (pages stored and
//!   removed, named by a chained [`PageHash`]) for a router; [`RadixCache::take_events`]
//!   drains it. Off by default.
//! * [`check_radix`](crate::check::check_radix) recomputes the bookkeeping from the nodes.
//!
//! ```
//! use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
//! use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
//!
//! let mut allocator = PagedAllocator::new(64, 4, false)?;
//! let mut tree = RadixCache::new(RadixConfig::new(4))?;
//! let mut slots = Vec::new();
//! allocator.alloc(8, &mut slots)?; // two pages for an 8-token prompt
//! let prompt = [10, 11, 12, 13, 14, 15, 16, 17];
//! let inserted = tree.insert(Insert::new(&prompt, &slots))?;
//! assert_eq!(inserted.prefix_len, 0); // nothing was cached before
//!
//! // A request sharing the first page (and half of the second) matches one whole page.
//! let hit = tree.match_prefix(&[10, 11, 12, 13, 14, 15, 99]);
//! assert_eq!(hit.len, 4);
//! let mut prefix = vec![0; hit.len];
//! tree.path_slots_into(hit, 0, &mut prefix)?;
//! assert_eq!(prefix, slots[..4]);
//!
//! // Unlocked entries are evictable; eviction frees their pages through the allocator.
//! assert_eq!(tree.sizes().evictable, 8);
//! tree.evict(8, &mut allocator)?;
//! assert_eq!(allocator.available_size(), allocator.capacity());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The parts: `node.rs` (the arena of nodes, each with its eviction figures, their rank under a
//! policy, and a grown leaf's registrations), `children.rs` (the child index), `page_index.rs`
//! (the pages the tree holds), `order.rs` (eviction: the order's candidates, clock and plans,
//! and [`RadixCache::evict`], which frees the victims), `policy.rs` (the policies by name);
//! this file holds the cache's state and what every operation shares (splitting a node,
//! turning registrations into nodes, finding a position's node, counting tokens), then one
//! file per operation: `match_prefix.rs`, `insert.rs`, `lock.rs`, `events.rs`; `view.rs` is
//! the read-only view the checker in [`crate::check`] reads, and where it has each part of
//! the bookkeeping beside the nodes check itself against them.
//!
//! Storage: an arena of 64-byte nodes indexed by [`NodeId`] (an entry and its generation, so
//! a handle kept past its node's eviction is refused), with 48 bytes of eviction figures (16 of
//! them the node's own, 32 the header of a grown leaf's registrations, which take 16 bytes
//! each) and 4 of generation per node beside it; each node stores its key pages interleaved
//! with their page ids (4 bytes per page); one hash map indexes children by (parent,
//! namespace, first page), chaining colliding children through a link per node (8 bytes)
//! that the index keeps, and the eviction order keeps each candidate's position (4 bytes per
//! node). See [`RadixCache::bookkeeping_bytes`].
//!
//! Access times, hits and priorities are recorded where a match or insert ends and passed to
//! the parent when a leaf is removed; a running request's leaf grows in place, registration by
//! registration. Both rank the leaves as sglang's tree would (`docs/design.md`), which
//! `tests/it/eviction_replay.rs` checks against a model of its rules.

mod children;
mod error;
mod events;
mod insert;
mod layout;
mod lock;
mod match_prefix;
mod node;
mod order;
mod page_index;
mod policy;
mod view;

pub use error::RadixError;
pub use events::{CacheEvent, PageHash, StoredPage};
pub use insert::{Insert, InsertPlan};
pub use node::NodeId;
pub use policy::{EvictionPolicy, InsertParams, SLRU_PROTECTED_HITS, UnknownEvictionPolicy};

use crate::ids::{KvSlot, PageId};
use children::ChildIndex;
use events::EventLog;
use layout::KeyLayout;
use node::Arena;
use order::EvictionOrder;
use page_index::PageIndex;

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
/// use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
/// use kvown_runtime::radix::{Insert, Namespace, RadixCache, RadixConfig, TreePos};
///
/// let mut allocator = PagedAllocator::new(64, 4, false)?;
/// let mut tree = RadixCache::new(RadixConfig::new(4))?;
/// let (base, adapter) = (Namespace::DEFAULT, Namespace(7));
/// let prompt = [10, 11, 12, 13, 14, 15, 16, 17];
/// let mut slots = Vec::new();
/// allocator.alloc(8, &mut slots)?;
/// tree.insert(Insert::new(adapter.key(&prompt), &slots))?;
///
/// // The adapter's requests reuse its KV; the base model's do not see it.
/// assert_eq!(tree.match_prefix(adapter.key(&prompt)).len, 8);
/// assert_eq!(tree.match_prefix(base.key(&prompt)), TreePos::ROOT);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Namespace(pub u32);

impl Namespace {
    /// The namespace of requests that do not choose one ([`crate::batch::Req::new`]) and of a
    /// [`Key`] made from a plain token slice.
    pub const DEFAULT: Namespace = Namespace(0);

    /// The key of `tokens` in this namespace.
    ///
    /// ```
    /// use kvown_runtime::radix::{Key, Namespace};
    ///
    /// let key = Namespace(3).key(&[1, 2, 3, 4]);
    /// assert_eq!((key.namespace, key.tokens), (Namespace(3), &[1, 2, 3, 4][..]));
    /// assert_eq!(Key::from(&[1, 2]).namespace, Namespace::DEFAULT);
    /// ```
    pub fn key(self, tokens: &[u32]) -> Key<'_> {
        Key {
            namespace: self,
            tokens,
        }
    }
}

impl std::fmt::Display for Namespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "namespace {}", self.0)
    }
}

/// Token ids in a [`Namespace`]: what a match looks up and an insert adds. Anything that is a
/// slice of token ids (`&[u32]`, `&[u32; N]`, `&Vec<u32>`) converts into a key of
/// [`Namespace::DEFAULT`]; [`Namespace::key`] makes one in another namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Key<'a> {
    /// The key space the tokens are cached in.
    pub namespace: Namespace,
    /// The token ids.
    pub tokens: &'a [u32],
}

impl<'a, T: AsRef<[u32]> + ?Sized> From<&'a T> for Key<'a> {
    #[inline(always)]
    fn from(tokens: &'a T) -> Key<'a> {
        Namespace::DEFAULT.key(tokens.as_ref())
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

/// How to build a [`RadixCache`]: its page size, its eviction policy, and whether its events are
/// on. [`RadixCache::config`] gives back the one a cache was built with (with its events as
/// they are now).
///
/// ```
/// use kvown_runtime::radix::{EvictionPolicy, RadixCache, RadixConfig, RadixError};
///
/// let config = RadixConfig::new(16).with_policy(EvictionPolicy::Lfu);
/// let tree = RadixCache::new(config)?;
/// assert_eq!(tree.config(), config);
/// assert!(!config.events && config.with_events().events);
/// assert_eq!(RadixCache::new(RadixConfig::new(0)).unwrap_err(), RadixError::ZeroPageSize);
/// # Ok::<(), RadixError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RadixConfig {
    /// Slots per page (1 for the token allocator): the allocator's page size. Every cached
    /// length is a multiple of it.
    pub page_size: usize,
    /// The order in which evictions take unlocked leaves.
    pub policy: EvictionPolicy,
    /// Whether cache events are on ([`RadixCache::enable_events`]).
    pub events: bool,
}

impl RadixConfig {
    /// Pages of `page_size` slots, least recently used leaves evicted first
    /// ([`EvictionPolicy::Lru`]), events off.
    pub fn new(page_size: usize) -> RadixConfig {
        RadixConfig {
            page_size,
            policy: EvictionPolicy::Lru,
            events: false,
        }
    }

    /// This configuration with evictions following `policy`.
    pub fn with_policy(self, policy: EvictionPolicy) -> RadixConfig {
        RadixConfig { policy, ..self }
    }

    /// This configuration with cache events on from the start.
    pub fn with_events(self) -> RadixConfig {
        RadixConfig {
            events: true,
            ..self
        }
    }
}

/// The cache's token counters (sglang's `evictable_size()` and `protected_size()`).
///
/// # Examples
///
/// ```
/// use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
///
/// let mut tree = RadixCache::new(RadixConfig::new(2))?;
/// let leaf = tree.insert(Insert::new(&[1, 2, 3, 4], &[4, 5, 6, 7]))?.last_node;
/// tree.inc_lock_ref(leaf)?;
/// let sizes = tree.sizes();
/// assert_eq!((sizes.evictable, sizes.protected, sizes.total()), (0, 4, 4));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RadixSizes {
    /// Cached tokens in unlocked nodes: what [`RadixCache::evict`] can free.
    pub evictable: usize,
    /// Cached tokens in locked nodes.
    pub protected: usize,
}

impl RadixSizes {
    /// Cached tokens: `evictable + protected` (sglang's `total_size()`).
    pub fn total(self) -> usize {
        self.evictable + self.protected
    }
}

/// Where [`RadixCache::cut`] made a node end.
#[derive(Debug, Clone, Copy)]
struct Cut {
    /// The node that now ends at the position.
    upper: NodeId,
    /// The node that starts there, on the path of the node that was cut.
    lower: NodeId,
    /// Whether the position was inside a node (a split) rather than where one of a grown
    /// leaf's registrations ended (a node boundary in sglang's tree, `docs/design.md`).
    split: bool,
}

/// The radix prefix cache of one KV pool. All lengths are in tokens.
///
/// # Examples
///
/// ```
/// use kvown_runtime::radix::{CacheEvent, Insert, RadixCache, RadixConfig};
///
/// let mut tree = RadixCache::new(RadixConfig::new(2).with_events())?;
/// assert!(tree.config().events);
/// let short = tree.insert(Insert::new(&[1, 2], &[4, 5]))?.last_node;
/// let long = tree.insert(Insert::new(&[1, 2, 3, 4], &[4, 5, 6, 7]))?.last_node;
/// assert_eq!(tree.sizes().total(), 4);
/// tree.inc_lock_ref(short)?; // a running request protects its prefix [1, 2]
/// tree.move_lock(short, long)?; // ... and then all of [1, 2, 3, 4]
/// assert_eq!((tree.sizes().evictable, tree.sizes().protected), (0, 4));
/// let at = tree.match_prefix(&[1, 2, 3, 4, 5]);
/// let mut slots = [0; 2];
/// tree.path_slots_into(at, 2, &mut slots)?; // the slots of positions 2..4
/// assert_eq!(slots, [6, 7]);
/// tree.dec_lock_ref(long)?;
/// assert_eq!(tree.sizes().evictable, 4);
/// assert!(tree.take_events().iter().any(|event| matches!(event, CacheEvent::Stored { .. })));
/// tree.enable_events(); // restarts the stream: a snapshot of what is cached
/// assert!(matches!(tree.take_events()[0], CacheEvent::Cleared));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct RadixCache {
    layout: KeyLayout,
    arena: Arena,
    children: ChildIndex,
    /// The candidates of eviction in the policy's order, and the clock.
    order: EvictionOrder,
    sizes: RadixSizes,
    /// Every page the nodes hold, so that an insert can refuse one it would cache twice.
    pages: PageIndex,
    /// Cache events, when on ([`RadixCache::enable_events`]).
    events: Option<Box<EventLog>>,
}

impl RadixCache {
    /// An empty cache as `config` says.
    ///
    /// ```
    /// use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
    /// use kvown_runtime::radix::{EvictionPolicy, Insert, RadixCache, RadixConfig};
    ///
    /// let mut allocator = PagedAllocator::new(64, 4, false)?;
    /// let config = RadixConfig::new(4).with_policy(EvictionPolicy::Mru);
    /// let mut tree = RadixCache::new(config)?;
    /// let mut slots = Vec::new();
    /// allocator.alloc(8, &mut slots)?;
    /// tree.insert(Insert::new(&[1, 1, 1, 1], &slots[..4]))?;
    /// tree.insert(Insert::new(&[2, 2, 2, 2], &slots[4..]))?;
    /// tree.evict(4, &mut allocator)?;
    /// // The most recently used entry went first.
    /// assert_eq!(tree.match_prefix(&[1, 1, 1, 1]).len, 4);
    /// assert_eq!(tree.match_prefix(&[2, 2, 2, 2]).len, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// A page size of 0 is [`RadixError::ZeroPageSize`], one larger than any allocator's
    /// (`u32::MAX / 2`) [`RadixError::PageSizeTooLarge`].
    pub fn new(config: RadixConfig) -> Result<RadixCache, RadixError> {
        let page_size = config.page_size;
        if page_size == 0 {
            return Err(RadixError::ZeroPageSize);
        }
        // Page 1 of an allocator ends at slot `2 * page_size`, which must fit in a `u32`.
        let max = KvSlot::MAX as usize / 2;
        if page_size > max {
            return Err(RadixError::PageSizeTooLarge { page_size, max });
        }
        let mut cache = RadixCache {
            layout: KeyLayout::new(page_size),
            arena: Arena::new(),
            children: ChildIndex::default(),
            order: EvictionOrder::new(config.policy),
            sizes: RadixSizes::default(),
            pages: PageIndex::default(),
            events: None,
        };
        if config.events {
            cache.enable_events();
        }
        Ok(cache)
    }

    /// The configuration the cache was built with, its events as they are now.
    pub fn config(&self) -> RadixConfig {
        RadixConfig {
            page_size: self.layout.geometry().page_size(),
            policy: self.order.policy(),
            events: self.events.is_some(),
        }
    }

    /// The token counters: cached tokens in unlocked and in locked nodes.
    #[inline]
    pub fn sizes(&self) -> RadixSizes {
        self.sizes
    }

    /// Every page the tree holds, each once, with the node that holds it (for a page size of 1
    /// a page id is the slot; page `p` holds slots `p * page_size..(p + 1) * page_size`).
    ///
    /// ```
    /// use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
    ///
    /// let mut tree = RadixCache::new(RadixConfig::new(2))?;
    /// let leaf = tree.insert(Insert::new(&[7, 7, 8, 8], &[4, 5, 2, 3]))?.last_node;
    /// let pages: Vec<_> = tree.cached_pages().collect();
    /// assert_eq!(pages, [(leaf, 2), (leaf, 1)]);
    /// # Ok::<(), kvown_runtime::radix::RadixError>(())
    /// ```
    pub fn cached_pages(&self) -> impl Iterator<Item = (NodeId, PageId)> + '_ {
        let layout = self.layout;
        self.arena
            .live()
            .flat_map(move |(id, node)| node.page_ids(layout).map(move |page| (id, page)))
    }

    /// Heap and inline bytes of the cache's bookkeeping, token ids of the keys excluded: node
    /// table, page ids and spare vector capacity, grown leaves' registrations, child index,
    /// eviction order and its buffers, and the page index (one bit per page id up to the
    /// largest the tree has held); with events on, the queued events and the page hashes (8
    /// bytes per page id up to the largest held).
    ///
    /// ```
    /// use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
    ///
    /// let mut tree = RadixCache::new(RadixConfig::new(16))?;
    /// let empty = tree.bookkeeping_bytes();
    /// let key: Vec<u32> = (0..64).collect();
    /// let slots: Vec<u32> = (16..80).collect();
    /// tree.insert(Insert::new(&key, &slots))?;
    /// assert!(tree.bookkeeping_bytes() > empty);
    /// # Ok::<(), kvown_runtime::radix::RadixError>(())
    /// ```
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
            + self.order.heap_bytes()
            + self.pages.heap_bytes()
            + self.events.as_ref().map_or(0, |events| events.heap_bytes())
    }

    #[inline]
    fn ensure_live(&self, node: NodeId) -> Result<(), RadixError> {
        if self.arena.is_live(node) {
            Ok(())
        } else {
            Err(RadixError::UnknownNode { node })
        }
    }

    /// The node on whose key `at.len` lies (`at.node` or an ancestor split off above it);
    /// [`RadixError::HintOutOfRange`] names `key_len` as the length of the key `at` is in.
    pub(crate) fn node_at(&self, at: TreePos, key_len: usize) -> Result<NodeId, RadixError> {
        self.ensure_live(at.node)?;
        let mut node = at.node;
        while self.arena[node].start() > at.len {
            node = self.arena[node].parent();
        }
        let node_end = self.arena[node].end(self.layout);
        if at.len > node_end || !self.layout.geometry().is_aligned(at.len) {
            return Err(RadixError::HintOutOfRange {
                node: at.node,
                len: at.len,
                node_end,
                key_len,
                page_size: self.layout.geometry().page_size(),
            });
        }
        Ok(node)
    }

    /// Counts `tokens` new tokens of `node` as evictable or protected by its lock state.
    fn add_tokens(&mut self, node: NodeId, tokens: usize) {
        if self.arena[node].locks().0 == 0 {
            self.sizes.evictable += tokens;
        } else {
            self.sizes.protected += tokens;
        }
    }

    /// Records an insert of `params` that ended at `node`, when the policy reads what it
    /// records.
    #[inline(always)]
    fn record_insert(&mut self, node: NodeId, params: InsertParams) {
        if self.order.policy().reads_insert_figures() {
            self.arena.record_insert(node, None, Some(params));
        }
    }

    /// The namespace of the live non-root `node`; `None` for the root (shared by all) and for
    /// a handle that names no node.
    fn namespace_of(&self, node: NodeId) -> Option<Namespace> {
        (node != NodeId::ROOT && self.arena.is_live(node)).then(|| self.arena[node].namespace())
    }

    /// Number of leading whole pages of `key` equal to the pages of `node` from `first_page`.
    fn common_pages(&self, node: NodeId, first_page: usize, key: &[u32]) -> usize {
        let entry = &self.arena[node];
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        (first_page..entry.num_pages(layout))
            .zip(key.chunks_exact(page_size))
            .take_while(|&(page, tokens)| entry.page_tokens(page, layout) == tokens)
            .count()
    }

    /// Makes a node end at `pos` (page-aligned, strictly inside `node`'s key), as sglang's
    /// split at time `now`: `node`'s registrations become nodes, then the one holding `pos` is
    /// split unless it starts there.
    fn cut(&mut self, node: NodeId, pos: usize, now: u64) -> Cut {
        self.materialize(node);
        let mut lower = node;
        while self.arena[lower].start() > pos {
            lower = self.arena[lower].parent();
        }
        if self.arena[lower].start() == pos {
            let upper = self.arena[lower].parent();
            return Cut {
                upper,
                lower,
                split: false,
            };
        }
        let upper = self.split(lower, pos, now);
        Cut {
            upper,
            lower,
            split: true,
        }
    }

    /// Turns the earlier registrations of `node` into nodes above it, each with its figures
    /// (and the leaf's access time, never older than its own), as sglang's tree holds them
    /// ([`Arena::materialize`]), and indexes them. `node` keeps its handle, locks and children
    /// with its newest registration's pages.
    fn materialize(&mut self, node: NodeId) {
        let layout = self.layout;
        if self.arena.registration_count(node) == 0 {
            return;
        }
        self.children.unlink(&self.arena, layout, node);
        let made = self.arena.materialize(node, layout);
        let mut at = node;
        for _ in 0..=made {
            self.children.link(&self.arena, layout, at);
            at = self.arena[at].parent();
        }
    }

    /// Starts a new registration at the end of the leaf `node`, about to grow in place at
    /// `now` ([`Arena::open_registration`]); turns its earlier registrations into
    /// nodes first when they cannot keep another.
    #[inline]
    fn open_registration(&mut self, node: NodeId, now: u64) {
        if !self.arena.open_registration(node, self.layout, now) {
            self.materialize(node);
            let opened = self.arena.open_registration(node, self.layout, now);
            debug_assert!(opened, "a leaf without registrations takes one");
        }
    }

    /// The prompt split of a request's registration: after the request's key was inserted up to
    /// `end` (live, on its path), the whole pages of its first `prompt_len` tokens are inserted
    /// again with `priority` and no hit, so that a node (or a grown leaf's registration) ends
    /// where they do, split off now if none did, and records the insert; access times stay as
    /// they are. Applies, and returns `true`, only when those pages are a non-empty prefix
    /// shorter than `end.len`. sglang `RadixCache._insert_cache(split_prompt=True)`.
    pub(crate) fn split_prompt(&mut self, end: TreePos, prompt_len: usize, priority: i32) -> bool {
        let prompt_len = self.layout.geometry().floor_align(prompt_len);
        if prompt_len == 0 || prompt_len >= end.len {
            return false;
        }
        let params = InsertParams {
            priority,
            chunked: true,
        };
        let layout = self.layout;
        let mut node = end.node;
        while self.arena[node].start() >= prompt_len {
            node = self.arena[node].parent();
        }
        if prompt_len < self.arena[node].end(layout) {
            let end_page = layout
                .geometry()
                .whole_pages(prompt_len - self.arena[node].start());
            let record = self.order.policy().reads_insert_figures().then_some(params);
            if self.arena.record_insert(node, Some(end_page), record) {
                return true;
            }
            let now = self.order.tick();
            node = self.cut(node, prompt_len, now).upper;
        }
        self.record_insert(node, params);
        true
    }

    /// Splits `node` at path position `pos` (strictly inside its key, page-aligned) at time
    /// `now` ([`Arena::split`]) and relinks both parts in the child index; returns the new
    /// upper part. Counters do not change.
    fn split(&mut self, node: NodeId, pos: usize, now: u64) -> NodeId {
        debug_assert_eq!(
            self.arena.registration_count(node),
            0,
            "a grown leaf is cut, not split"
        );
        let layout = self.layout;
        self.children.unlink(&self.arena, layout, node);
        let upper = self.arena.split(node, pos, layout, now);
        self.children.link(&self.arena, layout, upper);
        self.children.link(&self.arena, layout, node);
        upper
    }
}
