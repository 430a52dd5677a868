//! Making a node end at a position: splitting a node in two (sglang `_split_node`), and turning
//! the registrations of a leaf grown in place into the chain of nodes sglang holds for them.

use super::node::{Node, NodeId};
use super::{RadixCache, TreePos};

/// Where [`RadixCache::cut`] made a node end.
#[derive(Debug, Clone, Copy)]
pub(super) struct Cut {
    /// The node that now ends at the position.
    pub(super) upper: NodeId,
    /// The node that starts there, on the path of the node that was cut.
    pub(super) lower: NodeId,
    /// Whether the position was inside a node (sglang's split) rather than where one of the
    /// leaf's registrations ended (where sglang had a node boundary already).
    pub(super) split: bool,
}

impl RadixCache {
    /// Makes a node end at `pos` (page-aligned, strictly inside `node`'s key), as sglang's
    /// split at time `now`: `node`'s registrations become nodes, then the one holding `pos` is
    /// split unless it starts there.
    pub(super) fn cut(&mut self, node: NodeId, pos: usize, now: u64) -> Cut {
        self.materialize(node);
        let mut lower = node;
        while self.arena[lower].start() > pos {
            lower = self.arena[lower].parent;
        }
        if self.arena[lower].start() == pos {
            let upper = self.arena[lower].parent;
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
    /// (and the leaf's access time, never older than its own), as sglang's tree holds them.
    /// `node` keeps its handle, locks and children with its newest registration's pages.
    pub(super) fn materialize(&mut self, node: NodeId) {
        let start = self.arena[node].start();
        let page_size = self.layout.page_size();
        let mut lower = node;
        for (end_page, stats) in self.arena.take_registrations(node) {
            let upper = self.split(lower, start + end_page * page_size, stats.created);
            *self.arena.stats_mut(upper) = stats;
            lower = upper;
        }
    }

    /// Starts a new registration at the end of the leaf `node`, about to grow in place at
    /// `now` ([`super::node::Arena::open_registration`]); turns its earlier registrations into
    /// nodes first when they cannot keep another.
    #[inline]
    pub(super) fn open_registration(&mut self, node: NodeId, now: u64) {
        if !self.arena.open_registration(node, self.layout, now) {
            self.materialize(node);
            let opened = self.arena.open_registration(node, self.layout, now);
            debug_assert!(opened, "a leaf without registrations takes one");
        }
    }

    /// The prompt split of a request's registration (sglang `_insert_cache` with
    /// `split_prompt`): after the request's key was inserted up to `end` (live, on its path),
    /// its first `prompt_len` tokens (page-aligned, `0 < prompt_len < end.len`) are inserted
    /// again with `priority` and no hit. So a node ends at `prompt_len` (a grown leaf's
    /// registration may: sglang's node for it), split off at the time of this call if none
    /// did, and records the insert. Access times are left as they are: sglang's `checkpoint`
    /// stamps the whole key's path again right after, so the prompt's nodes are no newer than
    /// the key's end.
    pub(crate) fn split_prompt(&mut self, end: TreePos, prompt_len: usize, priority: i32) {
        debug_assert!(0 < prompt_len && prompt_len < end.len);
        let params = super::InsertParams {
            priority,
            chunked: true,
        };
        let layout = self.layout;
        let mut node = end.node;
        while self.arena[node].start() >= prompt_len {
            node = self.arena[node].parent;
        }
        if prompt_len < self.arena[node].end(layout) {
            let end_page = layout.whole_pages(prompt_len - self.arena[node].start());
            let record = self.order.policy().reads_insert_figures().then_some(params);
            if self.arena.record_at_registration(node, end_page, record) {
                return;
            }
            let now = self.order.tick();
            node = self.cut(node, prompt_len, now).upper;
        }
        self.record_insert(node, params);
    }

    /// Splits `node` at path position `pos` (strictly inside its key, page-aligned) at time
    /// `now`. The new upper node takes the key before `pos` and is returned, created `now`
    /// ([`super::policy::NodeStats::split_upper`]); `node` keeps its handle, children, lock
    /// count, candidacy and figures with the key from `pos`. Counters do not change.
    pub(super) fn split(&mut self, node: NodeId, pos: usize, now: u64) -> NodeId {
        debug_assert_eq!(
            self.arena.registration_count(node),
            0,
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
        entry.set_start(pos);
        self.children.link(&mut self.arena, layout, node);
        upper
    }
}
