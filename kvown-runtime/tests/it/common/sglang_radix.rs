//! A model of sglang 0.5.23's `RadixCache` (`python/sglang/srt/mem_cache/radix_cache.py`), a
//! node per node as sglang keeps them, for the replay tests (`eviction_replay.rs`,
//! `batch_replay.rs`).

use std::fmt::Write as _;

use kvown_runtime::alloc::PageId;
use kvown_runtime::radix::EvictionPolicy;

/// The root's index in [`Model::nodes`].
pub const ROOT: usize = 0;

/// sglang's `TreeNode`: a run of whole pages of tokens and their page ids. A deleted node stays
/// in the table with `live` false (sglang drops the object).
#[derive(Debug, Clone)]
pub struct MNode {
    pub key: Vec<u32>,
    /// One page id per page of `key`.
    pub value: Vec<PageId>,
    pub children: Vec<usize>,
    pub parent: usize,
    pub lock_ref: u32,
    pub last_access: u64,
    pub creation: u64,
    pub hits: u64,
    pub priority: i64,
    pub live: bool,
}

/// sglang's `RadixCache` over one pool, with its logical clock.
#[derive(Debug)]
pub struct Model {
    pub page_size: usize,
    pub policy: EvictionPolicy,
    pub nodes: Vec<MNode>,
    pub clock: u64,
    pub evictable_size: usize,
    pub protected_size: usize,
}

impl Model {
    /// `RadixCache.reset`: a root with an empty key, locked once forever, at the lowest
    /// priority.
    pub fn new(page_size: usize, policy: EvictionPolicy) -> Model {
        let mut model = Model {
            page_size,
            policy,
            nodes: Vec::new(),
            clock: 0,
            evictable_size: 0,
            protected_size: 0,
        };
        let root = model.new_node(ROOT, Vec::new(), Vec::new(), i64::MIN);
        model.nodes[root].lock_ref = 1;
        model
    }

    /// `time.monotonic()`: the next tick, never equal to an earlier one.
    pub fn now(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// `TreeNode.__init__`: a fresh node reads the clock twice, last access first, then
    /// creation. Not linked to its parent yet.
    pub fn new_node(
        &mut self,
        parent: usize,
        key: Vec<u32>,
        value: Vec<PageId>,
        priority: i64,
    ) -> usize {
        let last_access = self.now();
        let creation = self.now();
        self.nodes.push(MNode {
            key,
            value,
            children: Vec::new(),
            parent,
            lock_ref: 0,
            last_access,
            creation,
            hits: 0,
            priority,
            live: true,
        });
        self.nodes.len() - 1
    }

    /// `_key_match_paged` (`_key_match_page_size1` at page size 1): the tokens of the whole
    /// pages the two keys share from their start.
    pub fn common_len(&self, a: &[u32], b: &[u32]) -> usize {
        let ps = self.page_size;
        a.chunks_exact(ps)
            .zip(b.chunks_exact(ps))
            .take_while(|(x, y)| x == y)
            .count()
            * ps
    }

    /// `node.children[get_child_key(key)]`: the child of `node` whose key starts with `page`.
    pub fn child(&self, node: usize, page: &[u32]) -> Option<usize> {
        self.nodes[node]
            .children
            .iter()
            .copied()
            .find(|&child| &self.nodes[child].key[..self.page_size] == page)
    }

    /// A step of sglang's two walks: the child of `node` that `rest` enters, stamped with
    /// `access`, and how many tokens the two share.
    pub fn walk_into(&mut self, node: usize, rest: &[u32], access: u64) -> Option<(usize, usize)> {
        let child = self.child(node, &rest[..self.page_size])?;
        self.nodes[child].last_access = access;
        Some((child, self.common_len(&self.nodes[child].key, rest)))
    }

    /// `match_prefix` and `_match_prefix_helper`: the key cut to whole pages (an empty one
    /// returns the root without reading the clock); one access time stamps the root and every
    /// child walked into; a match ending strictly inside a child splits it and stops at the
    /// upper part. Returns the matched length and the node where it ends. Never locks.
    pub fn match_prefix(&mut self, key: &[u32]) -> (usize, usize) {
        let key = &key[..key.len() / self.page_size * self.page_size];
        if key.is_empty() {
            return (0, ROOT);
        }
        let access = self.now();
        self.nodes[ROOT].last_access = access;
        let (mut node, mut pos) = (ROOT, 0);
        while pos < key.len() {
            let Some((child, common)) = self.walk_into(node, &key[pos..], access) else {
                break;
            };
            pos += common;
            if common < self.nodes[child].key.len() {
                node = self.split(child, common);
                break;
            }
            node = child;
        }
        (pos, node)
    }

    /// `_split_node`: a fresh upper node, `TreeNode(priority=child.priority)` (new ticks for
    /// its access and creation times), takes the first `at` tokens of `child` and has `child` as
    /// its only child; it copies `child`'s lock count and hit count. `child` keeps its identity,
    /// times and counts with the rest of its key.
    pub fn split(&mut self, child: usize, at: usize) -> usize {
        let parent = self.nodes[child].parent;
        let key = self.nodes[child].key[..at].to_vec();
        let value = self.nodes[child].value[..at / self.page_size].to_vec();
        let upper = self.new_node(parent, key, value, self.nodes[child].priority);
        let lower = &self.nodes[child];
        let (lock_ref, hits) = (lower.lock_ref, lower.hits);
        let upper_node = &mut self.nodes[upper];
        upper_node.lock_ref = lock_ref;
        upper_node.hits = hits;
        upper_node.children = vec![child];
        let lower = &mut self.nodes[child];
        lower.key.drain(..at);
        lower.value.drain(..at / self.page_size);
        lower.parent = upper;
        let slot = self.nodes[parent]
            .children
            .iter()
            .position(|&c| c == child)
            .expect("a child is among its parent's children");
        self.nodes[parent].children[slot] = upper;
        upper
    }

    /// `_inc_hit_count`: a hit, unless the insert registers a running request's chunk.
    pub fn inc_hit_count(&mut self, node: usize, chunked: bool) {
        if !chunked {
            self.nodes[node].hits += 1;
        }
    }

    /// `_insert_helper`: one access time stamps the root and every node walked into; a node
    /// matched whole takes the insert's priority (the higher) and a hit; where the key leaves a
    /// node strictly inside it, the node is split and the upper part takes them instead, and the
    /// walk stops there. A remaining key becomes a fresh unlocked leaf under the last node, at
    /// the insert's priority, with a hit, taking the caller's pages for it. Returns the tokens
    /// already cached (the caller frees its own pages for them) and the node where the key ends.
    pub fn insert(
        &mut self,
        key: &[u32],
        pages: &[PageId],
        priority: i32,
        chunked: bool,
    ) -> (usize, usize) {
        let priority = i64::from(priority);
        let access = self.now();
        let root = &mut self.nodes[ROOT];
        root.last_access = access;
        root.priority = root.priority.max(priority);
        let (mut node, mut pos) = (ROOT, 0);
        while pos < key.len() {
            let Some((child, common)) = self.walk_into(node, &key[pos..], access) else {
                break;
            };
            pos += common;
            node = if common < self.nodes[child].key.len() {
                // The upper part's only child starts with a page the key does not have: the
                // walk ends at it.
                self.split(child, common)
            } else {
                child
            };
            self.nodes[node].priority = self.nodes[node].priority.max(priority);
            self.inc_hit_count(node, chunked);
        }
        let prefix_len = pos;
        if pos < key.len() {
            let leaf = self.new_node(
                node,
                key[pos..].to_vec(),
                pages[pos / self.page_size..].to_vec(),
                priority,
            );
            self.inc_hit_count(leaf, chunked);
            self.nodes[node].children.push(leaf);
            self.evictable_size += key.len() - pos;
            node = leaf;
        }
        (prefix_len, node)
    }

    /// `inc_lock_ref`: every node from `node` up to the root (excluded) counts one more lock;
    /// a node's tokens become protected when its count leaves 0.
    pub fn inc_lock_ref(&mut self, mut node: usize) {
        while node != ROOT {
            let entry = &mut self.nodes[node];
            if entry.lock_ref == 0 {
                self.evictable_size -= entry.key.len();
                self.protected_size += entry.key.len();
            }
            entry.lock_ref += 1;
            node = entry.parent;
        }
    }

    /// `dec_lock_ref`: the reverse of [`Model::inc_lock_ref`]; tokens become evictable when a
    /// count reaches 0.
    pub fn dec_lock_ref(&mut self, mut node: usize) {
        while node != ROOT {
            let entry = &mut self.nodes[node];
            if entry.lock_ref == 1 {
                self.evictable_size += entry.key.len();
                self.protected_size -= entry.key.len();
            }
            entry.lock_ref -= 1;
            node = entry.parent;
        }
    }

    /// `_update_leaf_status`'s test for `evictable_leaves`: a live unlocked node without
    /// children (the root is locked).
    pub fn is_evictable_leaf(&self, node: usize) -> bool {
        let entry = &self.nodes[node];
        entry.live && entry.lock_ref == 0 && entry.children.is_empty()
    }

    /// The strategies' `get_priority` (`evict_policy.py`): candidates go in increasing order.
    pub fn eviction_key(&self, node: usize) -> (i64, i64) {
        let n = &self.nodes[node];
        let (last, created) = (n.last_access as i64, n.creation as i64);
        match self.policy {
            EvictionPolicy::Lru => (0, last),
            EvictionPolicy::Lfu => (n.hits as i64, last),
            EvictionPolicy::Fifo => (0, created),
            EvictionPolicy::Mru => (0, -last),
            EvictionPolicy::Filo => (0, -created),
            EvictionPolicy::Priority => (n.priority, last),
            EvictionPolicy::Slru => (i64::from(n.hits >= 2), last),
        }
    }

    /// `evict`: a heap of the evictable leaves by the strategy's key; pops until `num_tokens`
    /// are evicted or none is left, freeing each leaf's pages in key order with one allocator
    /// call (`free_segment(x.value)`) and deleting it; a parent left without children and
    /// unlocked goes on the heap with its key as it stands. Returns the tokens evicted and the
    /// pages of each free call, in order.
    pub fn evict(&mut self, num_tokens: usize) -> (usize, Vec<Vec<PageId>>) {
        let mut heap: Vec<usize> = (0..self.nodes.len())
            .filter(|&node| self.is_evictable_leaf(node))
            .collect();
        let (mut evicted, mut freed) = (0, Vec::new());
        while evicted < num_tokens && !heap.is_empty() {
            let first = (0..heap.len())
                .min_by_key(|&i| self.eviction_key(heap[i]))
                .expect("the heap is not empty");
            let leaf = heap.swap_remove(first);
            freed.push(self.nodes[leaf].value.clone());
            evicted += self.nodes[leaf].key.len();
            self.delete_leaf(leaf);
            let parent = self.nodes[leaf].parent;
            if self.nodes[parent].children.is_empty() && self.nodes[parent].lock_ref == 0 {
                heap.push(parent);
            }
        }
        (evicted, freed)
    }

    /// `_delete_leaf`: unlinks the leaf from its parent and uncounts its tokens.
    pub fn delete_leaf(&mut self, leaf: usize) {
        let parent = self.nodes[leaf].parent;
        self.nodes[parent].children.retain(|&c| c != leaf);
        self.evictable_size -= self.nodes[leaf].key.len();
        self.nodes[leaf].live = false;
    }

    /// The pages of the path from the root to `node`, in key order.
    pub fn path_pages(&self, mut node: usize) -> Vec<PageId> {
        let mut parts = Vec::new();
        while node != ROOT {
            parts.push(&self.nodes[node].value);
            node = self.nodes[node].parent;
        }
        parts.into_iter().rev().flatten().copied().collect()
    }

    /// The pages of the longest cached whole-page prefix of `key`, read without touching
    /// anything.
    pub fn lookup(&self, key: &[u32]) -> Vec<PageId> {
        let (mut node, mut pos, mut pages) = (ROOT, 0, Vec::new());
        while pos < key.len() {
            let Some(child) = self.child(node, &key[pos..pos + self.page_size]) else {
                break;
            };
            let common = self.common_len(&self.nodes[child].key, &key[pos..]);
            pages.extend_from_slice(&self.nodes[child].value[..common / self.page_size]);
            pos += common;
            node = child;
            if common < self.nodes[child].key.len() {
                break;
            }
        }
        pages
    }

    /// Every cached page, sorted.
    pub fn cached_pages(&self) -> Vec<PageId> {
        let mut pages: Vec<PageId> = self.nodes[1..]
            .iter()
            .filter(|n| n.live)
            .flat_map(|n| n.value.iter().copied())
            .collect();
        pages.sort_unstable();
        pages
    }

    /// The live tree, a node per line, indented by depth.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        let mut stack = vec![(ROOT, 0)];
        while let Some((node, depth)) = stack.pop() {
            let n = &self.nodes[node];
            let _ = writeln!(
                out,
                "{:indent$}#{node} pages {:?} lock {} access {} created {} hits {} prio {}",
                "",
                n.value,
                n.lock_ref,
                n.last_access,
                n.creation,
                n.hits,
                n.priority,
                indent = 2 * depth
            );
            stack.extend(n.children.iter().rev().map(|&c| (c, depth + 1)));
        }
        out
    }
}
