//! Cache events: a stream that tells a router which prefixes this cache holds (sglang's
//! `enable_kv_cache_events`, vLLM's KV events), so that it can send a request to the replica
//! that has its prefix.
//!
//! Off by default: a cache whose events are off pays one predictable branch where pages enter
//! or leave the tree. [`RadixCache::enable_events`] turns them on;
//! [`RadixCache::take_events`] drains the queue.
//!
//! Each page is named by a [`PageHash`] of its namespace and the whole token prefix up to and
//! including the page; the cache keeps each cached page's hash (8 bytes per page id up to the
//! largest it has held, counted by [`RadixCache::bookkeeping_bytes`]) so that a removal names
//! the hashes without rehashing the path, and a page stored below a cached one names its
//! parent's hash in O(1). Recomputing instead would cost a walk from the root and a hash of
//! the whole prefix for every page a running request registers: quadratic in its length.

use std::ops::Range;

use super::node::NodeId;
use super::{Namespace, RadixCache, RadixError};
use crate::ids::{KvSlot, PageId};

/// FNV-1a's 64-bit offset basis.
const FNV_OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
/// FNV-1a's 64-bit prime.
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The content hash of a cached page: a function of its [`Namespace`] and of every token from
/// the start of the key up to and including the page's last token, the same on every run,
/// platform and page size.
///
/// The exact function, for a router in another language: 64-bit FNV-1a (offset basis
/// `0xcbf29ce484222325`, prime `0x100000001b3`: for each byte, `h ^= byte; h *= prime`,
/// wrapping) over the byte string made of the namespace as a little-endian `u32`, then each
/// token of the prefix as a little-endian `u32`. FNV-1a's state is its hash, so the page hashes
/// chain: a page's hash is FNV-1a continued from its parent's hash (from the namespace's
/// [`PageHash::seed`] for the first page) over the page's tokens ([`PageHash::chain`]). In Go,
/// `h := fnv.New64a(); h.Write(le32(namespace))`, then per page `h.Write` its tokens (each
/// `le32`) and `h.Sum64()`.
///
/// For routing only: a replica matches tokens, never hashes, so a collision (or a prompt made
/// to collide) costs a cache miss on the replica a router picked, never a wrong reuse.
///
/// # Examples
///
/// ```
/// use kvown_runtime::radix::{Namespace, PageHash};
///
/// let key = [1, 2, 3, 4, 5]; // two pages of 2 tokens and a partial one
/// let seed = PageHash::seed(Namespace::DEFAULT);
/// let first = seed.chain(&key[..2]);
/// let pages: Vec<_> = PageHash::of_pages(Namespace::DEFAULT, &key, 2).collect();
/// assert_eq!(pages, [first, first.chain(&key[2..4])]);
/// assert_ne!(PageHash::of_pages(Namespace(1), &key, 2).next(), Some(first), "another namespace");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PageHash(pub u64);

impl PageHash {
    /// The hash of `namespace`'s empty prefix: FNV-1a of the namespace's four little-endian
    /// bytes. It names no page (a first page has no parent hash); its own hash chains from it.
    pub fn seed(namespace: Namespace) -> PageHash {
        PageHash(fnv1a(FNV_OFFSET_BASIS, &namespace.0.to_le_bytes()))
    }

    /// The hash of the page holding `tokens` whose parent (the page before it on its path, or
    /// the namespace's [`PageHash::seed`]) has hash `self`: FNV-1a continued over the tokens'
    /// little-endian bytes.
    pub fn chain(self, tokens: &[u32]) -> PageHash {
        PageHash(
            tokens
                .iter()
                .fold(self.0, |state, token| fnv1a(state, &token.to_le_bytes())),
        )
    }

    /// The hash of each whole page of `key` (pages of `page_size` tokens, a trailing partial
    /// page ignored) in `namespace`: what a router computes for a request to find the replica
    /// holding its longest prefix.
    ///
    /// # Panics
    /// If `page_size` is 0.
    pub fn of_pages(
        namespace: Namespace,
        key: &[u32],
        page_size: usize,
    ) -> impl Iterator<Item = PageHash> + '_ {
        key.chunks_exact(page_size)
            .scan(PageHash::seed(namespace), |hash, page| {
                *hash = hash.chain(page);
                Some(*hash)
            })
    }
}

impl std::fmt::Display for PageHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// 64-bit FNV-1a of `bytes`, continued from `state`.
fn fnv1a(state: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(state, |state, &byte| {
        (state ^ u64::from(byte)).wrapping_mul(FNV_PRIME)
    })
}

/// One page of a [`CacheEvent::Stored`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredPage {
    /// The page's content hash.
    pub hash: PageHash,
    /// The KV page that holds it (for a page size of 1, the slot).
    pub page: PageId,
    /// Where its tokens are in the event's `tokens`: one page's worth.
    pub tokens: Range<usize>,
}

/// A change to what the cache holds, in the order the cache made them. Replaying the stream
/// (insert the hashes a `Stored` names, delete those a `Removed` names, forget everything at
/// `Cleared`) gives, after every cache operation, exactly the hashes of the pages it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Pages entered the cache: a run of consecutive pages of one path, in key order, each the
    /// parent of the next. One event per run rather than per page: a prompt's pages enter
    /// together, and a router gets the chain and the tokens in one message with two allocations
    /// for all of them (vLLM's `BlockStored` has the same shape). A request that registers its
    /// pages as they fill stores one page per event.
    ///
    /// Its parent is cached when it arrives (the stream never names a page before its parent),
    /// and no page it names is cached yet.
    Stored {
        /// The key space of the pages.
        namespace: Namespace,
        /// Hash of the page before the first one on the path; `None` when the first page starts
        /// the key.
        parent_hash: Option<PageHash>,
        /// The pages, in key order.
        pages: Vec<StoredPage>,
        /// Every page's tokens, in key order; page `i` has `tokens[pages[i].tokens.clone()]`.
        tokens: Vec<u32>,
    },
    /// Pages left the cache (evicted). Consecutive removals are merged into one event (an
    /// eviction of several nodes is one event). Descendants come before their ancestors, so a
    /// router that deletes the hashes in order never holds a page whose parent it deleted.
    Removed {
        /// The hashes of the removed pages.
        hashes: Vec<PageHash>,
    },
    /// Forget everything known of this cache: the stream restarts here
    /// ([`RadixCache::enable_events`]), and the `Stored` events that follow it name every page
    /// already cached.
    Cleared,
}

impl CacheEvent {
    /// Heap bytes the event holds.
    fn heap_bytes(&self) -> usize {
        match self {
            CacheEvent::Stored { pages, tokens, .. } => {
                pages.capacity() * size_of::<StoredPage>() + tokens.capacity() * size_of::<u32>()
            }
            CacheEvent::Removed { hashes } => hashes.capacity() * size_of::<PageHash>(),
            CacheEvent::Cleared => 0,
        }
    }
}

/// The events not yet taken, and the hash of every cached page.
#[derive(Debug, Default)]
pub(super) struct EventLog {
    queue: Vec<CacheEvent>,
    /// The hash of the page each id names, for every page the tree holds (entries of pages it
    /// no longer holds are stale and never read).
    hashes: Vec<PageHash>,
}

impl EventLog {
    /// Heap bytes of the log, the box included.
    pub(super) fn heap_bytes(&self) -> usize {
        size_of::<EventLog>()
            + self.queue.capacity() * size_of::<CacheEvent>()
            + self.queue.iter().map(CacheEvent::heap_bytes).sum::<usize>()
            + self.hashes.capacity() * size_of::<PageHash>()
    }

    /// Queues a [`CacheEvent::Stored`] of `pages` (each page's tokens and id, in key order) in
    /// `namespace` below the page hashed `parent_hash`, and records their hashes.
    fn store<'a>(
        &mut self,
        namespace: Namespace,
        parent_hash: Option<PageHash>,
        pages: impl ExactSizeIterator<Item = (&'a [u32], PageId)>,
        page_size: usize,
    ) {
        let mut stored = Vec::with_capacity(pages.len());
        let mut tokens = Vec::with_capacity(pages.len() * page_size);
        let mut hash = parent_hash.unwrap_or_else(|| PageHash::seed(namespace));
        for (page_tokens, page) in pages {
            hash = hash.chain(page_tokens);
            let start = tokens.len();
            tokens.extend_from_slice(page_tokens);
            stored.push(StoredPage {
                hash,
                page,
                tokens: start..tokens.len(),
            });
            let index = page as usize;
            if index >= self.hashes.len() {
                self.hashes.resize(index + 1, PageHash(0));
            }
            self.hashes[index] = hash;
        }
        self.queue.push(CacheEvent::Stored {
            namespace,
            parent_hash,
            pages: stored,
            tokens,
        });
    }

    /// Queues the removal of `pages` (cached, in the order given), merged into the last event
    /// when that is a removal too.
    fn remove(&mut self, pages: impl Iterator<Item = PageId>) {
        if !matches!(self.queue.last(), Some(CacheEvent::Removed { .. })) {
            self.queue.push(CacheEvent::Removed { hashes: Vec::new() });
        }
        let Some(CacheEvent::Removed { hashes }) = self.queue.last_mut() else {
            unreachable!("a removal was just made the last event");
        };
        hashes.extend(pages.map(|page| self.hashes[page as usize]));
    }
}

impl RadixCache {
    /// Turns cache events on, or, when they are on, restarts the stream: drops the events not
    /// yet taken, then queues [`CacheEvent::Cleared`] and a [`CacheEvent::Stored`] per node for
    /// every page already cached (parents first). Call it again to resynchronise a consumer
    /// that lost events, or to cap the queue of one that fell behind at the size of the cache.
    ///
    /// From then on every change to the cached pages queues an event: a new leaf or a leaf
    /// extended (by an insert, or by a request registering a page as it fills) stores its new
    /// pages, an eviction removes them. A split changes no page and queues nothing.
    ///
    /// Cost: O(cached tokens + nodes × log nodes).
    pub fn enable_events(&mut self) {
        let mut log = self.events.take().unwrap_or_default();
        log.queue.clear();
        log.queue.push(CacheEvent::Cleared);
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        for id in self.nodes_parents_first() {
            let node = &self.arena[id];
            let parent_hash = self.last_page_hash(&log, node.parent());
            let pages = (0..node.num_pages(layout))
                .map(|page| (node.page_tokens(page, layout), node.page_id(page, layout)));
            log.store(node.namespace(), parent_hash, pages, page_size);
        }
        self.events = Some(log);
    }

    /// Takes the events queued since the last call, oldest first; none when events are off.
    /// The queue grows until it is drained: bounding its memory is the caller's job, by
    /// draining regularly (or restarting the stream, [`RadixCache::enable_events`]). Its bytes
    /// count in [`RadixCache::bookkeeping_bytes`].
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        self.events
            .as_mut()
            .map(|log| std::mem::take(&mut log.queue))
            .unwrap_or_default()
    }

    /// Every node but the root, each after its parent: a node starts where its parent ends, so
    /// by start position (ties by handle).
    fn nodes_parents_first(&self) -> Vec<NodeId> {
        let mut nodes: Vec<(usize, NodeId)> = self
            .arena
            .live()
            .filter(|&(id, _)| id != NodeId::ROOT)
            .map(|(id, node)| (node.start(), id))
            .collect();
        nodes.sort_unstable();
        nodes.into_iter().map(|(_, id)| id).collect()
    }

    /// The hash of the last page of `node`'s key: the parent hash of a page stored right after
    /// it. `None` for the root.
    fn last_page_hash(&self, log: &EventLog, node: NodeId) -> Option<PageHash> {
        let entry = &self.arena[node];
        let pages = entry.num_pages(self.layout);
        (node != NodeId::ROOT).then(|| {
            let page = entry.page_id(pages - 1, self.layout);
            log.hashes[page as usize]
        })
    }

    /// When events are on, queues the storing of the pages `tokens` / `slots` (whole pages)
    /// right after the end of `parent`: a new leaf under it in `namespace`, or, when `None`,
    /// pages about to be appended to the leaf `parent` (whose key has not grown yet).
    #[inline(always)]
    pub(super) fn record_stored(
        &mut self,
        parent: NodeId,
        namespace: Option<Namespace>,
        tokens: &[u32],
        slots: &[KvSlot],
    ) {
        if self.events.is_some() {
            self.queue_stored(parent, namespace, tokens, slots);
        }
    }

    /// Queues the storing of the pages `tokens` / `slots` right after the end of `parent` (the
    /// root, or a node whose key has not grown yet), in `namespace` or, when `None`, the
    /// parent's. Events must be on.
    #[cold]
    #[inline(never)]
    fn queue_stored(
        &mut self,
        parent: NodeId,
        namespace: Option<Namespace>,
        tokens: &[u32],
        slots: &[KvSlot],
    ) {
        let mut log = self.events.take().expect("events are on");
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        let namespace = namespace.unwrap_or(self.arena[parent].namespace());
        let parent_hash = self.last_page_hash(&log, parent);
        let pages = tokens
            .chunks_exact(page_size)
            .zip(slots.chunks_exact(page_size))
            .map(|(page_tokens, page_slots)| {
                (
                    page_tokens,
                    layout.geometry().page_of(page_slots[0]) as PageId,
                )
            });
        log.store(namespace, parent_hash, pages, page_size);
        self.events = Some(log);
    }

    /// When events are on, queues the removal of the pages of `leaf` from `first_page` on,
    /// which are about to be deleted: deepest page first.
    #[inline(always)]
    pub(super) fn record_removed(&mut self, leaf: NodeId, first_page: usize) {
        if let Some(log) = &mut self.events {
            let (node, layout) = (&self.arena[leaf], self.layout);
            let pages = (first_page..node.num_pages(layout)).rev();
            log.remove(pages.map(|page| node.page_id(page, layout)));
        }
    }

    /// With events on, checks that every cached page's recorded hash is its path's (each node
    /// against its parent's last page, parents first); nothing to check with events off. The
    /// nodes' keys must be whole, non-empty pages (the checker's node checks come first).
    ///
    /// # Errors
    /// [`RadixError::Inconsistent`] "page hash recorded for events" at the first node with a
    /// page whose recorded hash differs (hashes shown as `usize`, whole on 64-bit targets; 0
    /// for none recorded).
    pub(super) fn check_event_hashes(&self) -> Result<(), RadixError> {
        let Some(log) = &self.events else {
            return Ok(());
        };
        let layout = self.layout;
        for id in self.nodes_parents_first() {
            let node = &self.arena[id];
            let mut hash = self
                .last_page_hash(log, node.parent())
                .unwrap_or_else(|| PageHash::seed(node.namespace()));
            for page in 0..node.num_pages(layout) {
                hash = hash.chain(node.page_tokens(page, layout));
                let recorded = log.hashes.get(node.page_id(page, layout) as usize);
                if recorded != Some(&hash) {
                    return Err(RadixError::Inconsistent {
                        node: id,
                        what: "page hash recorded for events",
                        expected: hash.0 as usize,
                        found: recorded.map_or(0, |recorded| recorded.0 as usize),
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Insert, RadixConfig, TreePos};
    use super::*;
    use crate::check::check_radix;
    use crate::radix::RadixError;

    /// A cache with events on holding one locked page at slots `4..4 + page_size`, its events
    /// taken, and the position of its end.
    fn with_locked_page(page_size: usize) -> (RadixCache, TreePos) {
        let mut cache = RadixCache::new(RadixConfig::new(page_size).with_events()).unwrap();
        let key: Vec<u32> = (0..page_size as u32).collect();
        let slots: Vec<u32> = (page_size as u32..2 * page_size as u32).collect();
        let outcome = cache.insert(Insert::new(&key, &slots)).unwrap();
        cache.inc_lock_ref(outcome.last_node).unwrap();
        cache.take_events();
        let end = TreePos {
            node: outcome.last_node,
            len: page_size,
        };
        (cache, end)
    }

    // The insert that extends an own leaf without a walk queues what the walk's queues.
    #[test]
    fn extending_an_own_leaf_without_a_walk_queues_what_the_walk_queues() {
        for page_size in [1, 4] {
            let (mut fast, mut at) = with_locked_page(page_size);
            let (mut walked, _) = with_locked_page(page_size);
            let mut key: Vec<u32> = (0..page_size as u32).collect();
            let mut slots: Vec<u32> = (page_size as u32..2 * page_size as u32).collect();
            for page in 2..5 {
                let first = (page * page_size) as u32;
                key.extend((0..page_size as u32).map(|offset| 50 + first + offset));
                slots.extend((0..page_size as u32).map(|offset| first + offset));
                let insert = Insert::new(&key, &slots);
                fast.insert(insert.from(at)).unwrap();
                let earlier = TreePos {
                    len: at.len - page_size,
                    ..at
                };
                walked.insert(insert.from(earlier)).unwrap();
                at.len = key.len();
                let events = fast.take_events();
                assert_eq!(events, walked.take_events());
                let [
                    CacheEvent::Stored {
                        parent_hash, pages, ..
                    },
                ] = &events[..]
                else {
                    panic!("one store: {events:?}");
                };
                let hashes: Vec<PageHash> =
                    PageHash::of_pages(Namespace::DEFAULT, &key, page_size).collect();
                assert_eq!(*parent_hash, Some(hashes[page - 2]));
                assert_eq!(pages[0].hash, hashes[page - 1]);
                check_radix(&fast).unwrap();
            }
        }
    }

    #[test]
    fn the_check_finds_a_wrong_recorded_hash() {
        let (mut cache, at) = with_locked_page(4);
        check_radix(&cache).unwrap();
        let log = cache.events.as_mut().unwrap();
        log.hashes[1].0 ^= 1;
        let error = check_radix(&cache).unwrap_err();
        assert!(
            matches!(error, RadixError::Inconsistent { node, what: "page hash recorded for events", .. } if node == at.node),
            "{error}"
        );
    }

    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        // From the FNV reference test suite (64-bit FNV-1a).
        assert_eq!(fnv1a(FNV_OFFSET_BASIS, b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(FNV_OFFSET_BASIS, b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(FNV_OFFSET_BASIS, b"foobar"), 0x8594_4171_f739_67e8);
    }
}
