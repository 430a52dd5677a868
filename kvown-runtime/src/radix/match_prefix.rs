//! Prefix matching and reading the slots of a matched path.

use super::node::NodeId;
use super::{Key, RadixCache, RadixError, TreePos};
use crate::alloc::KvSlot;

impl RadixCache {
    /// Longest prefix of `key` in whole pages (a tail shorter than a page never matches) cached
    /// in the key's namespace; what other namespaces cache is never matched. A plain token
    /// slice is a key of [`Namespace::DEFAULT`](super::Namespace::DEFAULT);
    /// `namespace.key(&tokens)` names another.
    ///
    /// Splits the node where the match ends, so the returned node ends exactly at the returned
    /// length; stamps the access time of every node on the path. Does not lock: call
    /// [`RadixCache::inc_lock_ref`] on the returned node before the next eviction. An empty match
    /// returns [`TreePos::ROOT`].
    ///
    /// ```
    /// use kvown_runtime::radix::{Insert, Namespace, RadixCache, RadixConfig};
    ///
    /// let mut tree = RadixCache::new(RadixConfig::new(2))?;
    /// tree.insert(Insert::new(&[1, 2, 3, 4], &[2, 3, 4, 5]))?;
    /// assert_eq!(tree.match_prefix(&[1, 2, 3, 9]).len, 2);
    /// assert_eq!(tree.match_prefix(Namespace(1).key(&[1, 2, 3, 4])).len, 0);
    /// # Ok::<(), kvown_runtime::radix::RadixError>(())
    /// ```
    ///
    /// Cost: O(matched tokens + nodes on the path) plus one split.
    pub fn match_prefix<'k>(&mut self, key: impl Into<Key<'k>>) -> TreePos {
        let Key { namespace, tokens } = key.into();
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        let key = &tokens[..layout.geometry().floor_align(tokens.len())];
        let now = self.order.tick();
        let mut node = NodeId::ROOT;
        let mut pos = 0;
        while pos < key.len() {
            let Some(child) = self.children.find(
                &self.arena,
                layout,
                node,
                namespace,
                &key[pos..pos + page_size],
            ) else {
                break;
            };
            let pages = self.common_pages(child, 0, &key[pos..]);
            if pages < self.arena[child].num_pages(layout)
                && self.arena.registration_count(child) > 0
            {
                // The match ends inside a leaf grown in place: walk sglang's nodes instead.
                self.materialize(child);
                continue;
            }
            self.order.stamp(&mut self.arena, child, now);
            pos += pages * page_size;
            if pages < self.arena[child].num_pages(layout) {
                node = self.split(child, pos, now);
                break;
            }
            node = child;
        }
        TreePos { node, len: pos }
    }

    /// Copies the tree's slots for path positions `[start, at.len)` into `out`, walking up from
    /// `at.node`; `out.len()` must be `at.len - start` ([`RadixError::LengthMismatch`]
    /// otherwise), and `start` at most `at.len` ([`RadixError::StartPastEnd`]).
    ///
    /// `at` is a position from a match or insert, possibly older: later splits and in-place
    /// extensions do not invalidate it as long as its node is live (e.g. locked).
    ///
    /// Cost: O(out.len() + nodes on the path between the two positions).
    pub fn path_slots_into(
        &self,
        at: TreePos,
        start: usize,
        out: &mut [KvSlot],
    ) -> Result<(), RadixError> {
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        let mut node = self.node_at(at, at.len)?;
        if start > at.len {
            return Err(RadixError::StartPastEnd { start, end: at.len });
        }
        if out.len() != at.len - start {
            return Err(RadixError::LengthMismatch {
                key: at.len - start,
                slots: out.len(),
            });
        }
        let mut end = at.len;
        while end > start {
            let entry = &self.arena[node];
            let from = entry.start().max(start);
            // One page id lookup per page: node starts are page-aligned, so a position's offset
            // in its page is `position % page_size`, and `end` (a node start or `at.len`, both
            // page-aligned) never falls inside a page.
            let mut position = from;
            while position < end {
                let offset = layout.geometry().offset(position);
                let run = page_size - offset;
                let page = entry.page_id(
                    layout.geometry().whole_pages(position - entry.start()),
                    layout,
                );
                let first = page * page_size as u32 + offset as u32;
                let run_out = &mut out[position - start..position - start + run];
                // By offset, not `first..`: the run may end the last page of the `u32` range,
                // whose end `first..` would step to.
                for (offset, slot) in run_out.iter_mut().enumerate() {
                    *slot = first + offset as u32;
                }
                position += run;
            }
            end = from;
            node = entry.parent();
        }
        Ok(())
    }
}
