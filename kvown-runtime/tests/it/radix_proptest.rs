//! Random operation sequences on the radix cache over page sizes 1, 3, 4 and 16, three
//! namespaces and every eviction policy (inserts of random priorities, hits or not), with the
//! cache's and the allocator's invariant checks after every step and every match and insert
//! checked against a model of what each namespace caches, and the cache-event stream (when on)
//! replayed after every step into exactly the pages of that model; and one eviction against the
//! same eviction made a node at a time.

use crate::common;
use crate::common::cache_events;

use cache_events::Replay;

use kvown_runtime::alloc::{KvAllocator, KvSlot, PageId, PagedAllocator, SlotCalls};
use std::collections::{HashMap, HashSet};

use kvown_runtime::check::check_radix;
use kvown_runtime::radix::{
    EvictionPolicy, Insert, InsertParams, Namespace, RadixCache, RadixConfig, TreePos,
};
use proptest::prelude::*;

const PAGES: usize = 48;

#[derive(Debug, Clone)]
enum Op {
    /// Insert a fresh key (from the root of a namespace) with newly allocated slots; maybe
    /// lock its end.
    Insert {
        namespace: u32,
        tokens: Vec<u32>,
        lock: bool,
        params: InsertParams,
    },
    /// A locked holder registers more pages from its position (an `insert` from it +
    /// `move_lock`).
    Extend {
        holder: usize,
        tokens: Vec<u32>,
        params: InsertParams,
    },
    /// Match a key in a namespace; maybe lock the match.
    Match {
        namespace: u32,
        tokens: Vec<u32>,
        lock: bool,
    },
    /// Release a holder's lock.
    Unlock { holder: usize },
    /// Evict a number of pages' worth of tokens.
    Evict { pages: usize },
    /// Turn cache events on, or restart their stream.
    EnableEvents,
}

/// Token ids from a tiny alphabet so keys share prefixes and diverge mid-node often.
fn tokens() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, 0..40)
}

/// A priority from a few values (so that ties and orders both occur), a hit or not.
fn params() -> impl Strategy<Value = InsertParams> {
    (-2i32..3, any::<bool>()).prop_map(|(priority, chunked)| InsertParams { priority, chunked })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u32..3, tokens(), any::<bool>(), params()).prop_map(
            |(namespace, tokens, lock, params)| Op::Insert { namespace, tokens, lock, params }
        ),
        2 => (any::<usize>(), tokens(), params())
            .prop_map(|(holder, tokens, params)| Op::Extend { holder, tokens, params }),
        2 => (0u32..3, tokens(), any::<bool>())
            .prop_map(|(namespace, tokens, lock)| Op::Match { namespace, tokens, lock }),
        2 => any::<usize>().prop_map(|holder| Op::Unlock { holder }),
        1 => (0usize..8).prop_map(|pages| Op::Evict { pages }),
        1 => Just(Op::EnableEvents),
    ]
}

/// A locked position, the key it stands for and its namespace.
struct Holder {
    at: TreePos,
    key: Vec<u32>,
    namespace: Namespace,
}

struct World {
    page_size: usize,
    cache: RadixCache,
    alloc: PagedAllocator,
    holders: Vec<Holder>,
    /// What the cache holds: the page of every cached (namespace, key prefix ending with that
    /// page).
    model: HashMap<(Namespace, Vec<u32>), PageId>,
    /// The cache-event stream replayed, while events are on.
    replay: Option<Replay>,
}

impl World {
    /// A world whose cache evicts by `policy` and has events on from the start when `events`.
    fn new(page_size: usize, policy: EvictionPolicy, events: bool) -> World {
        let mut cache = RadixCache::new(RadixConfig::new(page_size).with_policy(policy)).unwrap();
        if events {
            cache.enable_events();
        }
        World {
            page_size,
            cache,
            alloc: PagedAllocator::new(PAGES * page_size, page_size, false).unwrap(),
            holders: Vec::new(),
            model: HashMap::new(),
            replay: events.then(Replay::default),
        }
    }

    /// Drops from the model the pages no longer cached (after an eviction, before their ids
    /// can be handed out again).
    fn forget_evicted(&mut self) {
        let cached: HashSet<PageId> = self.cache.cached_pages().map(|(_, page)| page).collect();
        self.model.retain(|_, page| cached.contains(page));
    }

    /// The model's longest cached prefix of `key` in `namespace`, in whole pages, and its pages.
    fn modelled_prefix(&self, namespace: Namespace, key: &[u32]) -> Vec<PageId> {
        key.chunks_exact(self.page_size)
            .enumerate()
            .map_while(|(page, _)| {
                let prefix = key[..(page + 1) * self.page_size].to_vec();
                self.model.get(&(namespace, prefix)).copied()
            })
            .collect()
    }

    /// The page of each whole page of `slots`.
    fn pages_of(&self, slots: &[KvSlot]) -> Vec<PageId> {
        slots
            .iter()
            .step_by(self.page_size)
            .map(|&slot| slot / self.page_size as u32)
            .collect()
    }

    /// Records that `namespace` now caches `key[from..]` on the pages of `slots[from..]`.
    fn model_insert(&mut self, namespace: Namespace, key: &[u32], slots: &[KvSlot], from: usize) {
        let ps = self.page_size;
        for end in (from + ps..=key.len()).step_by(ps) {
            let page = slots[end - ps] / ps as u32;
            self.model.insert((namespace, key[..end].to_vec()), page);
        }
    }

    /// Page-aligned key made of `tokens` repeated per page (so every token spans a page).
    fn key(&self, tokens: &[u32]) -> Vec<u32> {
        tokens
            .iter()
            .flat_map(|&t| std::iter::repeat_n(t, self.page_size))
            .collect()
    }

    /// Allocates `len` slots, evicting the shortfall first; `None` when memory stays short.
    fn alloc(&mut self, len: usize) -> Option<Vec<KvSlot>> {
        self.cache
            .evict(
                len.saturating_sub(self.alloc.available_size()),
                &mut self.alloc,
            )
            .unwrap();
        self.forget_evicted();
        let mut out = Vec::new();
        self.alloc.alloc(len, &mut out).ok()?;
        Some(out)
    }

    fn apply(&mut self, op: Op) {
        match op {
            Op::Insert {
                namespace,
                tokens,
                lock,
                params,
            } => {
                let namespace = Namespace(namespace);
                let key = self.key(&tokens);
                let Some(slots) = self.alloc(key.len()) else {
                    return;
                };
                let cached = self.modelled_prefix(namespace, &key);
                let outcome = self
                    .cache
                    .insert(
                        Insert::new(namespace.key(&key), &slots)
                            .from(TreePos::ROOT)
                            .params(params),
                    )
                    .unwrap();
                assert_eq!(
                    outcome.prefix_len,
                    cached.len() * self.page_size,
                    "{namespace}"
                );
                self.alloc
                    .free_segment(&slots[..outcome.prefix_len], 0)
                    .unwrap();
                self.model_insert(namespace, &key, &slots, outcome.prefix_len);
                if lock {
                    self.lock(outcome.last_node, key, namespace);
                }
            }
            Op::Extend {
                holder,
                tokens,
                params,
            } => {
                if self.holders.is_empty() {
                    return;
                }
                let index = holder % self.holders.len();
                let (at, namespace) = (self.holders[index].at, self.holders[index].namespace);
                let mut key = self.holders[index].key.clone();
                key.extend(self.key(&tokens));
                let mut row = vec![0; at.len];
                self.cache.path_slots_into(at, 0, &mut row).unwrap();
                let Some(fresh) = self.alloc(key.len() - at.len) else {
                    return;
                };
                row.extend(fresh);
                let cached = self.modelled_prefix(namespace, &key);
                let outcome = self
                    .cache
                    .insert(
                        Insert::new(namespace.key(&key), &row)
                            .from(at)
                            .params(params),
                    )
                    .unwrap();
                assert_eq!(
                    outcome.prefix_len,
                    cached.len() * self.page_size,
                    "{namespace}"
                );
                self.model_insert(namespace, &key, &row, outcome.prefix_len);
                self.alloc
                    .free_segment(&row[at.len..outcome.prefix_len], at.len)
                    .unwrap();
                self.cache.move_lock(at.node, outcome.last_node).unwrap();
                let mut tree_row = vec![0; key.len()];
                let end = TreePos {
                    node: outcome.last_node,
                    len: key.len(),
                };
                self.cache.path_slots_into(end, 0, &mut tree_row).unwrap();
                assert_eq!(tree_row[outcome.prefix_len..], row[outcome.prefix_len..]);
                self.holders[index] = Holder {
                    at: end,
                    key,
                    namespace,
                };
            }
            Op::Match {
                namespace,
                tokens,
                lock,
            } => {
                let namespace = Namespace(namespace);
                let key = self.key(&tokens);
                let at = self.cache.match_prefix(namespace.key(&key));
                // The longest prefix this namespace caches, on the pages it cached it on.
                let mut slots = vec![0; at.len];
                self.cache.path_slots_into(at, 0, &mut slots).unwrap();
                assert_eq!(self.pages_of(&slots), self.modelled_prefix(namespace, &key));
                if lock {
                    let matched = key[..at.len].to_vec();
                    self.lock(at.node, matched, namespace);
                }
            }
            Op::Unlock { holder } => {
                if !self.holders.is_empty() {
                    let index = holder % self.holders.len();
                    let released = self.holders.swap_remove(index);
                    self.cache.dec_lock_ref(released.at.node).unwrap();
                }
            }
            Op::Evict { pages } => {
                let protected = self.cache.sizes().protected;
                let evictable = self.cache.sizes().evictable;
                let asked = pages * self.page_size;
                let evicted = self.cache.evict(asked, &mut self.alloc).unwrap();
                self.forget_evicted();
                assert!(evicted >= asked.min(evictable));
                assert_eq!(self.cache.sizes().protected, protected);
                assert_eq!(self.cache.sizes().evictable, evictable - evicted);
            }
            Op::EnableEvents => {
                self.cache.enable_events();
                self.replay.get_or_insert_default();
            }
        }
    }

    fn lock(&mut self, node: kvown_runtime::radix::NodeId, key: Vec<u32>, namespace: Namespace) {
        self.cache.inc_lock_ref(node).unwrap();
        let at = TreePos {
            node,
            len: key.len(),
        };
        self.holders.push(Holder { at, key, namespace });
    }

    /// Evicts one node per call (the first in the policy's order) until `tokens` are gone or
    /// nothing is evictable; returns the tokens evicted.
    fn evict_node_by_node(&mut self, tokens: usize) -> usize {
        let mut evicted = 0;
        while evicted < tokens {
            match self.cache.evict(1, &mut self.alloc).unwrap() {
                0 => break,
                node => evicted += node,
            }
        }
        self.forget_evicted();
        evicted
    }

    /// The cached pages, sorted.
    fn cached_pages(&self) -> Vec<PageId> {
        let mut pages: Vec<PageId> = self.cache.cached_pages().map(|(_, page)| page).collect();
        pages.sort_unstable();
        pages
    }

    /// The free pages, in page order.
    fn free_pages(&self) -> Vec<PageId> {
        (1..=PAGES as PageId)
            .filter(|&page| self.alloc.is_page_free(page))
            .collect()
    }

    /// The free list, head first.
    fn free_list(&self) -> Vec<PageId> {
        self.alloc.free_pages().collect()
    }

    fn verify(&mut self) {
        check_radix(&self.cache).unwrap();
        // The events since the last step, replayed: exactly the cached pages, each at its
        // (namespace, prefix) with its page id; none while events are off.
        let events = self.cache.take_events();
        match &mut self.replay {
            Some(replay) => {
                replay.apply(events);
                assert_eq!(replay.by_prefix(), self.model);
            }
            None => assert_eq!(events, []),
        }
        self.alloc.check().unwrap();
        let cache = &self.cache;
        assert_eq!(
            cache.sizes().evictable + cache.sizes().protected,
            cache.sizes().total()
        );
        // Every allocated slot is cached: free + cached == capacity, and no cached page is free.
        assert_eq!(
            self.alloc.available_size() + cache.sizes().total(),
            self.alloc.capacity()
        );
        assert!(
            cache
                .cached_pages()
                .all(|(_, page)| !self.alloc.is_page_free(page))
        );
        let page_size = cache.config().page_size;
        assert_eq!(
            cache.cached_pages().count() * page_size,
            cache.sizes().total()
        );
        // Each holder's locked prefix is still cached, on the pages its namespace cached it on.
        for holder in &self.holders {
            let mut row = vec![0; holder.at.len];
            cache.path_slots_into(holder.at, 0, &mut row).unwrap();
            let modelled = self.modelled_prefix(holder.namespace, &holder.key);
            assert_eq!(self.pages_of(&row), modelled[..row.len() / self.page_size]);
        }
        assert_eq!(self.model.len(), cache.sizes().total() / self.page_size);
    }
}

proptest! {
    #![proptest_config(common::proptest_config())]

    #[test]
    fn random_operations_keep_every_invariant(
        page_size in prop::sample::select(vec![1usize, 3, 4, 16]),
        policy in prop::sample::select(EvictionPolicy::ALL.to_vec()),
        ops in prop::collection::vec(op(), 1..60),
        events in any::<bool>(),
    ) {
        let mut world = World::new(page_size, policy, events);
        for op in ops {
            world.apply(op);
            world.verify();
        }
        while let Some(holder) = world.holders.pop() {
            world.cache.dec_lock_ref(holder.at.node).unwrap();
            world.verify();
        }
        prop_assert_eq!(world.cache.sizes().protected, 0);
        let total = world.cache.sizes().total();
        prop_assert_eq!(world.cache.evict(usize::MAX, &mut world.alloc).unwrap(), total);
        world.forget_evicted();
        prop_assert_eq!(world.alloc.available_size(), world.alloc.capacity());
        world.verify();
    }

    #[test]
    fn one_eviction_frees_what_evicting_a_node_at_a_time_frees(
        page_size in prop::sample::select(vec![1usize, 3, 4, 16]),
        policy in prop::sample::select(EvictionPolicy::ALL.to_vec()),
        ops in prop::collection::vec(op(), 1..60),
        pages in 1usize..PAGES,
        events in any::<bool>(),
    ) {
        // Two worlds from the same operations; one evicts in one call, the other one node per
        // call (`evict(1)`) until as many tokens are gone. Whole nodes go in the policy's order
        // either way, parents left childless included (ranked by what they inherit from their
        // victims in the one call, by what they absorbed node by node), so both must evict
        // the same nodes, and free them in the same order: one allocator call per node, as
        // sglang's `evict` frees, so the free lists end equal.
        let [mut at_once, mut node_by_node] =
            [(); 2].map(|()| World::new(page_size, policy, events));
        for op in ops {
            at_once.apply(op.clone());
            node_by_node.apply(op);
        }
        let asked = pages * page_size;
        let evicted = at_once.cache.evict(asked, &mut at_once.alloc).unwrap();
        at_once.forget_evicted();
        let stepwise = node_by_node.evict_node_by_node(asked);
        prop_assert_eq!(evicted, stepwise);
        prop_assert_eq!(at_once.cached_pages(), node_by_node.cached_pages());
        prop_assert_eq!(at_once.free_pages(), node_by_node.free_pages());
        prop_assert_eq!(at_once.free_list(), node_by_node.free_list());
        at_once.verify();
        node_by_node.verify();
        // The order left behind agrees too: the next eviction takes the same nodes.
        let again = at_once.cache.evict(asked, &mut at_once.alloc).unwrap();
        at_once.forget_evicted();
        prop_assert_eq!(again, node_by_node.evict_node_by_node(asked));
        prop_assert_eq!(at_once.cached_pages(), node_by_node.cached_pages());
        at_once.verify();
        node_by_node.verify();
    }
}
