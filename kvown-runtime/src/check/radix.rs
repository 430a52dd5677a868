//! The radix cache's checker: every counter and index of a [`RadixCache`] recomputed from its
//! nodes, the path a request's lock holds compared with the request, and the locks its holders
//! account for. It reads the tree through its read-only view of the nodes, and has each part of
//! the bookkeeping beside them check itself against them ([`RadixCache::check_bookkeeping`]).

use std::cmp::Reverse;
use std::collections::HashSet;

use crate::ids::KvSlot;
use crate::radix::{Namespace, NodeId, RadixCache, RadixError, TreePos};

/// Which part of a request's protected prefix differs from the path its lock holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixPart {
    /// The request's token.
    Token,
    /// The request's slot: in its row, or among the matched slots it has yet to write there.
    Slot,
}

impl std::fmt::Display for PrefixPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PrefixPart::Token => "token",
            PrefixPart::Slot => "slot",
        })
    }
}

/// One more than the largest [`NodeId::index`] of a live node: the length of a table of
/// per-node figures.
fn entries(tree: &RadixCache) -> usize {
    tree.node_views()
        .map(|node| node.id().index() + 1)
        .max()
        .unwrap_or(1)
}

/// Recomputes the bookkeeping of `tree` from its nodes and compares: the evictable and protected
/// token counters; child counts and the child index (each child found under its parent by its
/// namespace and first page, nothing else indexed; a node's namespace its parent's below the
/// root); positions (each key starts where its parent's ends, whole pages only); lock counts
/// (root 1, every other its own locks plus the sum of its children's); the eviction candidates
/// (exactly the unlocked leaves) and the eviction order (an entry at each candidate's rank); a
/// grown leaf's registrations in order inside it; no page cached twice, and the page index
/// holding exactly the cached pages; with events on, each cached page's recorded hash that of
/// its path.
///
/// ```
/// use kvown_runtime::check::check_radix;
/// use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
///
/// let mut tree = RadixCache::new(RadixConfig::new(2))?;
/// tree.insert(Insert::new(&[1, 2, 3, 4], &[2, 3, 4, 5]))?;
/// tree.match_prefix(&[1, 2]); // splits the node
/// check_radix(&tree)?;
/// # Ok::<(), kvown_runtime::radix::RadixError>(())
/// ```
///
/// Cost: O(cached pages + nodes); meant for tests and debug builds.
///
/// # Errors
/// [`RadixError::Inconsistent`] naming the first node and invariant found broken.
pub fn check_radix(tree: &RadixCache) -> Result<(), RadixError> {
    let stride = tree.config().page_size + 1;
    let root = tree.node_view(NodeId::ROOT).expect("the root is live");
    RadixError::expect_eq(NodeId::ROOT, "root lock count", 1, root.locks().0)?;
    RadixError::expect_eq(NodeId::ROOT, "root key length", 0, root.words())?;
    let mut child_counts = vec![0usize; entries(tree)];
    let mut child_locks = vec![0usize; entries(tree)];
    let mut pages = HashSet::new();
    let (mut evictable, mut protected) = (0, 0);
    for node in tree.node_views().filter(|node| node.id() != NodeId::ROOT) {
        let id = node.id();
        let parent = tree.node_view(node.parent());
        RadixError::expect_eq(id, "parent is live", 1, usize::from(parent.is_some()))?;
        let parent = parent.expect("checked live");
        RadixError::expect_eq(id, "key is non-empty", 1, usize::from(node.words() != 0))?;
        RadixError::expect_eq(id, "key is whole pages", 0, node.words() % stride)?;
        RadixError::expect_eq(id, "key start", parent.span().end, node.span().start)?;
        if parent.id() != NodeId::ROOT {
            RadixError::expect_eq(
                id,
                "namespace is the parent's",
                1,
                usize::from(node.namespace() == parent.namespace()),
            )?;
        }
        let (lock_ref, _) = node.locks();
        child_counts[parent.id().index()] += 1;
        child_locks[parent.id().index()] += lock_ref;
        if lock_ref == 0 {
            evictable += node.span().len();
        } else {
            protected += node.span().len();
        }
        for (_, page) in node.pages() {
            RadixError::expect_eq(id, "page cached once", 1, usize::from(pages.insert(page)))?;
        }
    }
    for node in tree.node_views() {
        let id = node.id();
        let (lock_ref, own_locks) = node.locks();
        RadixError::expect_eq(
            id,
            "child count",
            child_counts[id.index()],
            node.child_count(),
        )?;
        if id != NodeId::ROOT {
            RadixError::expect_eq(
                id,
                "lock count is own locks plus children's",
                own_locks + child_locks[id.index()],
                lock_ref,
            )?;
        }
    }
    tree.check_bookkeeping()?;
    let sizes = tree.sizes();
    RadixError::expect_eq(NodeId::ROOT, "evictable tokens", evictable, sizes.evictable)?;
    RadixError::expect_eq(NodeId::ROOT, "protected tokens", protected, sizes.protected)
}

/// The namespace of the live non-root `node` of `tree`; `None` for the root (shared by all)
/// and for a handle that names no node.
pub(crate) fn namespace_of(tree: &RadixCache, node: NodeId) -> Option<Namespace> {
    let node = tree
        .node_view(node)
        .filter(|node| node.id() != NodeId::ROOT)?;
    Some(node.namespace())
}

/// The first position of the path `[0, at.len)` of `tree` at which `tokens` or `slots` differ
/// from the tree's (the token where both do; a side that ends early differs where it ends), or
/// `None` when both agree with it or when `at` is not a live position (its node gone, or
/// `at.len` not a page boundary on its path).
///
/// Cost: O(at.len + nodes on the path); for the cache-level checker.
pub(crate) fn path_difference(
    tree: &RadixCache,
    at: TreePos,
    tokens: &[u32],
    slots: &[KvSlot],
) -> Option<(usize, PrefixPart)> {
    let page_size = tree.config().page_size;
    let mut node = tree.node_view(tree.node_at(at, at.len).ok()?)?;
    // The path's nodes with the part of each key on it, root side first.
    let mut path = Vec::new();
    let mut end = at.len;
    while end > 0 {
        let start = node.span().start;
        path.push((node, start, end));
        end = start;
        node = tree.node_view(node.parent())?;
    }
    for &(node, start, end) in path.iter().rev() {
        for (page, (page_tokens, page_id)) in
            node.pages().take((end - start) / page_size).enumerate()
        {
            let first_slot = page_id as usize * page_size;
            let first = start + page * page_size;
            for (offset, &token) in page_tokens.iter().enumerate() {
                let position = first + offset;
                if tokens.get(position) != Some(&token) {
                    return Some((position, PrefixPart::Token));
                }
                if slots.get(position).map(|&slot| slot as usize) != Some(first_slot + offset) {
                    return Some((position, PrefixPart::Slot));
                }
            }
        }
    }
    None
}

/// A node whose lock count differs from the locks the given holders account for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LockMismatch {
    /// The deepest such node.
    pub(crate) node: NodeId,
    /// Its lock count.
    pub(crate) locks: usize,
    /// The holders' locks on it and below it.
    pub(crate) held: usize,
}

/// Checks that the lock counts of `tree` are exactly the locks of `holders` (one lock each, on
/// the node given, the root ignored): every non-root node's count equals the holders at it or
/// below it. Returns the deepest node where they differ.
///
/// Cost: O(nodes + holders × depth); for the cache-level checker.
pub(crate) fn check_lock_holders(
    tree: &RadixCache,
    holders: impl IntoIterator<Item = NodeId>,
) -> Result<(), LockMismatch> {
    let held = held_locks(tree, holders);
    let mismatch = tree
        .node_views()
        .filter(|node| node.id() != NodeId::ROOT && node.locks().0 != held[node.id().index()])
        .max_by_key(|node| node.span().start);
    match mismatch {
        None => Ok(()),
        Some(node) => Err(LockMismatch {
            node: node.id(),
            locks: node.locks().0,
            held: held[node.id().index()],
        }),
    }
}

/// The locks of `tree` none of `holders` (one lock each, on the node given) accounts for, as
/// `(node, count)`: `count` locks were taken on `node` itself, deepest nodes first. These are
/// the locks of requests dropped before their release.
///
/// # Errors
/// The deepest node holding fewer locks than `holders` account for; a holder then claims a
/// lock the tree never gave.
pub(crate) fn leaked_locks(
    tree: &RadixCache,
    holders: impl IntoIterator<Item = NodeId>,
) -> Result<Vec<(NodeId, usize)>, LockMismatch> {
    let held = held_locks(tree, holders);
    let mut nodes: Vec<_> = tree
        .node_views()
        .filter(|node| node.id() != NodeId::ROOT)
        .collect();
    // Descendants first: a node ends strictly deeper than its parent.
    nodes.sort_unstable_by_key(|node| Reverse(node.span().end));
    // Locks found leaked at or below each node: a node's count includes its descendants'.
    let mut leaked_below = vec![0usize; entries(tree)];
    let mut leaked = Vec::new();
    for node in nodes {
        let index = node.id().index();
        let locks = node.locks().0;
        let held_here = held[index];
        let Some(here) = locks.checked_sub(held_here + leaked_below[index]) else {
            return Err(LockMismatch {
                node: node.id(),
                locks,
                held: held_here,
            });
        };
        if here > 0 {
            leaked.push((node.id(), here));
        }
        leaked_below[node.parent().index()] += leaked_below[index] + here;
    }
    Ok(leaked)
}

/// The locks `holders` (one each, on the node given) account for on every node, indexed by
/// arena entry: the holders at the node or below it. Unknown holders count nowhere.
fn held_locks(tree: &RadixCache, holders: impl IntoIterator<Item = NodeId>) -> Vec<usize> {
    let mut held = vec![0usize; entries(tree)];
    for holder in holders {
        let mut node = holder;
        while node != NodeId::ROOT {
            let Some(live) = tree.node_view(node) else {
                break;
            };
            held[node.index()] += 1;
            node = live.parent();
        }
    }
    held
}

/// Test fixture (page size 2): `[0, 1 | 2, 3]` on pages 1 and 2, then `[0, 1 | 9, 9]` on
/// page 3 splits it into a shared node (page 1) with two leaves, the first (returned) locked
/// once; the tree checks clean.
#[cfg(test)]
pub(crate) fn small_tree() -> (RadixCache, NodeId) {
    use crate::radix::{Insert, RadixConfig};
    let mut cache = RadixCache::new(RadixConfig::new(2)).unwrap();
    let locked = cache
        .insert(Insert::new(&[0, 1, 2, 3], &[2, 3, 4, 5]))
        .unwrap()
        .last_node;
    cache
        .insert(Insert::new(&[0, 1, 9, 9], &[2, 3, 6, 7]))
        .unwrap();
    cache.inc_lock_ref(locked).unwrap();
    check_radix(&cache).unwrap();
    (cache, locked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaked_locks_are_found_where_they_were_taken_and_released_exactly() {
        // A shared node with two leaves, the first locked by its holder (`small_tree`).
        // Besides the holder's lock on the leaf: a second lock on the leaf and two on the
        // shared node above it, none of them accounted for.
        let (mut cache, locked) = small_tree();
        let shared = cache.match_prefix(&[0, 1]).node;
        cache.inc_lock_ref(locked).unwrap();
        cache.inc_lock_ref(shared).unwrap();
        cache.inc_lock_ref(shared).unwrap();
        let leaked = leaked_locks(&cache, [locked]).unwrap();
        assert_eq!(leaked, vec![(locked, 1), (shared, 2)], "deepest first");

        cache.release_leaked_locks(&leaked);
        check_radix(&cache).unwrap();
        check_lock_holders(&cache, [locked]).unwrap();
        assert_eq!(leaked_locks(&cache, [locked]).unwrap(), vec![]);
        assert_eq!(cache.sizes().protected, 4, "the holder's path stays locked");

        // Holders claiming more locks than the tree gave: the deepest short node is named.
        assert_eq!(
            leaked_locks(&cache, [locked, locked]),
            Err(LockMismatch {
                node: locked,
                locks: 1,
                held: 2,
            })
        );
        // Without holders every lock is leaked, and releasing them all unlocks the tree.
        let all = leaked_locks(&cache, []).unwrap();
        assert_eq!(all, vec![(locked, 1)]);
        cache.release_leaked_locks(&all);
        check_radix(&cache).unwrap();
        assert_eq!(cache.sizes().protected, 0);
    }
}
