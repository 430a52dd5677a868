//! The child index: finds a node's child by the child's namespace and first page in
//! O(page_size).
//!
//! One hash map for the whole tree, keyed by the parent's id and a 32-bit hash of the child's
//! namespace and first page. Children whose keys collide are chained through the index's own
//! table of links, so a lookup compares the actual namespace and first page and is exact.
//! (Only the root's children differ in namespace; below them a node's children share its.)

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use super::layout::KeyLayout;
use super::node::{Arena, Node, NodeId};
use super::{Namespace, RadixError};

/// Map from (parent, first-page hash) to the head of a chain of children, and the chains.
#[derive(Debug, Default)]
pub(super) struct ChildIndex {
    heads: HashMap<u64, NodeId, BuildHasherDefault<KeyHasher>>,
    /// Per arena entry ([`NodeId::index`]): the next node of its chain, [`NodeId::NONE`] at a
    /// chain's end.
    next: Vec<NodeId>,
}

/// The map key of a child of `parent` in `namespace` whose key starts with `first_page`.
fn child_key(parent: NodeId, namespace: Namespace, first_page: &[u32]) -> u64 {
    let page_hash = first_page
        .iter()
        .fold(u64::from(namespace.0), |hash, &token| {
            (hash.rotate_left(5) ^ u64::from(token)).wrapping_mul(0x517c_c1b7_2722_0a95)
        });
    ((parent.index() as u64) << 32) | (page_hash >> 32)
}

impl ChildIndex {
    /// The child of `parent` in `namespace` whose first page is `first_page`, if any.
    pub(super) fn find(
        &self,
        arena: &Arena,
        layout: KeyLayout,
        parent: NodeId,
        namespace: Namespace,
        first_page: &[u32],
    ) -> Option<NodeId> {
        let mut node = *self.heads.get(&child_key(parent, namespace, first_page))?;
        while node != NodeId::NONE {
            let entry = &arena[node];
            if entry.namespace() == namespace && entry.page_tokens(0, layout) == first_page {
                return Some(node);
            }
            node = self.next[node.index()];
        }
        None
    }

    /// Indexes `child` under its current parent and first page.
    pub(super) fn link(&mut self, arena: &Arena, layout: KeyLayout, child: NodeId) {
        let key = key_of(&arena[child], layout);
        let next = self.heads.insert(key, child).unwrap_or(NodeId::NONE);
        if child.index() >= self.next.len() {
            self.next.resize(child.index() + 1, NodeId::NONE);
        }
        self.next[child.index()] = next;
    }

    /// Removes `child` from the index (it must be indexed under its current parent and key).
    pub(super) fn unlink(&mut self, arena: &Arena, layout: KeyLayout, child: NodeId) {
        let key = key_of(&arena[child], layout);
        let next = std::mem::replace(&mut self.next[child.index()], NodeId::NONE);
        let head = self
            .heads
            .get_mut(&key)
            .expect("radix child index lost a node");
        if *head == child {
            if next == NodeId::NONE {
                self.heads.remove(&key);
            } else {
                *head = next;
            }
            return;
        }
        let mut prev = *head;
        while self.next[prev.index()] != child {
            prev = self.next[prev.index()];
        }
        self.next[prev.index()] = next;
    }

    /// Checks that the index holds exactly the nodes of `arena` but the root, each found under
    /// its parent by its namespace and first page.
    ///
    /// # Errors
    /// [`RadixError::Inconsistent`]: "child index entry" at the first node not found so,
    /// "indexed children" when the index reaches more nodes.
    pub(super) fn check(&self, arena: &Arena, layout: KeyLayout) -> Result<(), RadixError> {
        let mut live = 0;
        for (id, node) in arena.live().filter(|&(id, _)| id != NodeId::ROOT) {
            live += 1;
            let found = node.num_pages(layout) > 0
                && self.find(
                    arena,
                    layout,
                    node.parent(),
                    node.namespace(),
                    node.page_tokens(0, layout),
                ) == Some(id);
            RadixError::expect_eq(id, "child index entry", 1, usize::from(found))?;
        }
        RadixError::expect_eq(NodeId::ROOT, "indexed children", live, self.indexed())
    }

    /// Nodes reachable through the index (every chain walked to its end).
    fn indexed(&self) -> usize {
        let mut count = 0;
        for &head in self.heads.values() {
            let mut node = head;
            while node != NodeId::NONE {
                count += 1;
                node = self.next[node.index()];
            }
        }
        count
    }

    /// Approximate heap bytes of the map (buckets of (key, head) plus one control byte each)
    /// and of the chain links.
    pub(super) fn heap_bytes(&self) -> usize {
        let capacity = self.heads.capacity();
        let buckets = if capacity == 0 {
            0
        } else {
            (capacity * 8 / 7).next_power_of_two()
        };
        buckets * (size_of::<(u64, NodeId)>() + 1) + self.next.capacity() * size_of::<NodeId>()
    }
}

fn key_of(node: &Node, layout: KeyLayout) -> u64 {
    child_key(node.parent(), node.namespace(), node.page_tokens(0, layout))
}

/// Hasher for keys of one 64-bit word (already hashes, or node handles): a splitmix64
/// finalizer spreads every input bit.
#[derive(Debug, Default)]
pub(super) struct KeyHasher(u64);

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::check::check_radix;
    use crate::radix::{Insert, RadixCache, RadixConfig};

    /// Two two-token first pages whose child keys under the root collide: a birthday search
    /// over the 32-bit page hash (a few hundred thousand pages of scrambled tokens).
    fn colliding_pages() -> ([u32; 2], [u32; 2]) {
        let mut seen = HashMap::new();
        (0..4_000_000u32)
            .map(|i| [i, i.wrapping_mul(0x9e37_79b9).rotate_left(13)])
            .find_map(|page| {
                let first =
                    seen.insert(child_key(NodeId::ROOT, Namespace::DEFAULT, &page), page)?;
                Some((first, page))
            })
            .expect("a collision among four million 32-bit hashes")
    }

    /// Two namespaces whose children with the first page `[0]` collide under the root. A
    /// birthday search does not find such a pair (the fold is close to linear in the
    /// namespace, so nearby ids spread evenly); a lattice reduction of `k * C mod 2^59` gave
    /// the difference `1_508_582_398` between ids that collide.
    const COLLIDING: (Namespace, Namespace) = (Namespace(1), Namespace(1_508_582_399));

    // The same first page in two namespaces whose keys collide: one chain holds both, and only
    // the namespace tells them apart. A match, an insert, a split and an eviction in one never
    // find, split or free the other's.
    #[test]
    fn the_same_first_page_in_colliding_namespaces_is_told_apart_by_namespace() {
        use crate::alloc::{KvAllocator, KvSlot, PagedAllocator, SlotCalls};
        use crate::radix::TreePos;

        let (a, b) = COLLIDING;
        assert_eq!(
            child_key(NodeId::ROOT, a, &[0]),
            child_key(NodeId::ROOT, b, &[0]),
            "the hash changed: find two namespaces whose page [0] collides again"
        );
        let mut alloc = PagedAllocator::new(32, 1, false).unwrap();
        let slots = |alloc: &mut PagedAllocator, tokens| {
            let mut out: Vec<KvSlot> = Vec::new();
            alloc.alloc(tokens, &mut out).unwrap();
            out
        };
        let mut cache = RadixCache::new(RadixConfig::new(1)).unwrap();
        let key = [0, 7, 7];
        let a_slots = slots(&mut alloc, 3);
        cache.insert(Insert::new(a.key(&key), &a_slots)).unwrap();
        assert_eq!(
            cache.match_prefix(b.key(&key)),
            TreePos::ROOT,
            "{b} caches nothing"
        );
        let b_slots = slots(&mut alloc, 3);
        let outcome = cache.insert(Insert::new(b.key(&key), &b_slots)).unwrap();
        assert_eq!(outcome.prefix_len, 0);
        assert_eq!(cache.children.heads.len(), 1, "one chain of two children");
        check_radix(&cache).unwrap();
        // Splitting each copy relinks it in the chain; the other stays whole.
        let b_split = slots(&mut alloc, 1);
        let outcome = cache
            .insert(Insert::new(b.key(&key[..1]), &b_split))
            .unwrap();
        assert_eq!(outcome.prefix_len, 1);
        alloc.free_segment(&b_split, 0).unwrap();
        let a_more = slots(&mut alloc, 3);
        let outcome = cache
            .insert(Insert::new(a.key(&[0, 9, 9]), &a_more))
            .unwrap();
        assert_eq!(outcome.prefix_len, 1);
        alloc.free_segment(&a_more[..1], 0).unwrap();
        check_radix(&cache).unwrap();
        for (namespace, own) in [(a, &a_slots), (b, &b_slots)] {
            let hit = cache.match_prefix(namespace.key(&key));
            assert_eq!(hit.len, 3, "{namespace}");
            let mut read = vec![0; 3];
            cache.path_slots_into(hit, 0, &mut read).unwrap();
            assert_eq!(&read, own, "{namespace} reads its own KV");
        }
        // a's `[7, 7]` leaf is now the least recently used: evicting it leaves b's.
        assert_eq!(cache.match_prefix(a.key(&[0, 9, 9])).len, 3);
        assert_eq!(cache.evict(2, &mut alloc).unwrap(), 2);
        check_radix(&cache).unwrap();
        assert_eq!(cache.match_prefix(a.key(&key)).len, 1);
        assert_eq!(cache.match_prefix(b.key(&key)).len, 3);
        cache.evict(usize::MAX, &mut alloc).unwrap();
        assert_eq!(alloc.available_size(), alloc.capacity());
        check_radix(&cache).unwrap();
    }

    // Children whose keys collide share a chain: splitting the chain's head, then its other
    // node, relinks both, and every key is still found.
    #[test]
    fn colliding_children_are_chained_and_survive_splits() {
        let (a, b) = colliding_pages();
        assert_ne!(a, b);
        let mut cache = RadixCache::new(RadixConfig::new(2)).unwrap();
        let (a_key, b_key) = ([a[0], a[1], 7, 7], [b[0], b[1], 7, 7]);
        cache.insert(Insert::new(&a_key, &[2, 3, 4, 5])).unwrap();
        cache.insert(Insert::new(&b_key, &[6, 7, 8, 9])).unwrap();
        assert_eq!(cache.children.heads.len(), 1, "one chain of two children");
        check_radix(&cache).unwrap();
        for (first, slots) in [(b, [10, 11]), (a, [12, 13])] {
            // A key ending inside the node splits it: unlinked, then linked again as two.
            let outcome = cache.insert(Insert::new(&first, &slots)).unwrap();
            assert_eq!(outcome.prefix_len, 2);
            check_radix(&cache).unwrap();
        }
        for key in [a_key, b_key] {
            assert_eq!(cache.match_prefix(&key).len, 4, "{key:?}");
        }
        assert_eq!(cache.sizes().total(), 8);
    }
}
