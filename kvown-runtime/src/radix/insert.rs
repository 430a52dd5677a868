//! Inserting page-aligned keys with their slots.

use super::layout::KeyLayout;
use super::node::{Node, NodeId};
use super::policy::NodeStats;
use super::{InsertOutcome, InsertParams, Namespace, RadixCache, RadixError, TreePos};
use crate::alloc::{AsPageAllocator, KvSlot};

/// Where an insert leaves the tree and what it does there, found by
/// [`RadixCache::plan_insert`] without changing anything and carried out by
/// [`RadixCache::apply_insert`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a plan changes nothing until it is applied"]
pub(crate) struct InsertPlan {
    /// Tokens of the key already cached: the outcome's `prefix_len`.
    prefix_len: usize,
    /// The node the step acts on.
    node: NodeId,
    /// The key space of the insert (of a new leaf).
    namespace: Namespace,
    step: InsertStep,
}

impl InsertPlan {
    /// Tokens of the key already cached ([`InsertOutcome::prefix_len`]).
    pub(crate) fn prefix_len(self) -> usize {
        self.prefix_len
    }
}

/// What an insert does where the key leaves the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InsertStep {
    /// The whole key is cached and ends where `node` ends.
    Cached,
    /// `node` ends at `prefix_len`, is a leaf and holds only the caller's lock: the suffix is
    /// appended to it.
    ExtendLeaf,
    /// `node` ends at `prefix_len` and has no child for the key's next page: the suffix becomes
    /// a new leaf under it.
    AddLeaf,
    /// The key ends or leaves the tree inside `node`: it is split at `prefix_len`, and the
    /// suffix (if any) becomes a new leaf under the upper part.
    Split,
}

impl RadixCache {
    /// Inserts `key` (page-aligned) with `slots` (one per key token, whole pages) from the root,
    /// in [`Namespace::DEFAULT`]: [`RadixCache::insert_in`] with it, the same as
    /// [`RadixCache::insert_from`] with [`TreePos::ROOT`].
    ///
    /// Cost: O(key length + nodes on the path).
    pub fn insert(&mut self, key: &[u32], slots: &[KvSlot]) -> Result<InsertOutcome, RadixError> {
        self.insert_in(Namespace::DEFAULT, key, slots)
    }

    /// Inserts `key` with `slots` from the root in `namespace`, sharing nodes only with keys of
    /// that namespace: [`RadixCache::insert_from_in`] with [`TreePos::ROOT`].
    ///
    /// Cost: O(key length + nodes on the path).
    pub fn insert_in(
        &mut self,
        namespace: Namespace,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<InsertOutcome, RadixError> {
        self.insert_from_in(namespace, TreePos::ROOT, key, slots)
    }

    /// Inserts `key` with `slots`, trusting that `key[..from.len]` is already cached on the path
    /// through `from` (a position this caller got from a match or insert of the same key and
    /// whose node it has locked). Only `key[from.len..]` and `slots[from.len..]` are read. In
    /// [`Namespace::DEFAULT`]: [`RadixCache::insert_from_in`] with it. A position of another
    /// namespace is refused when it names a node, but the empty one, [`TreePos::ROOT`], is every
    /// namespace's: continue a match of [`RadixCache::match_prefix_in`] with `insert_from_in`.
    ///
    /// The uncached suffix becomes a new unlocked leaf, or, when the key leaves the tree at the
    /// end of `from.node` and that node is a leaf whose only lock is the caller's, is appended
    /// to it in place (so its tokens are protected by that lock). A node ends exactly at
    /// `key.len()` afterwards (splitting one if needed); it is returned as
    /// [`InsertOutcome::last_node`] and stamped as accessed. The tree takes the slots of
    /// `[prefix_len, key.len())`; the caller frees its duplicates.
    ///
    /// The pages it takes must be the caller's to give: allocated and not yet the tree's (the
    /// batch flow passes a request's own pages). The tree refuses a page it already holds or
    /// one the slots name twice; whether the caller allocated a page it cannot know:
    /// [`RadixCache::insert_allocated`] asks the allocator.
    ///
    /// Cost: O(key.len() - from.len + nodes on the path below `from`) plus at most one split;
    /// extending the caller's own leaf by one page is O(page size), amortized.
    ///
    /// # Errors
    /// Refuses (changing nothing but, perhaps, the page index's capacity, counted by
    /// [`RadixCache::bookkeeping_bytes`]) unaligned or overlong keys, `slots` of another length or not
    /// in whole pages, an unknown or unlocked `from.node`, a `from.len` off its path, and new
    /// pages that are cached already ([`RadixError::PageCached`]) or named twice
    /// ([`RadixError::PageRepeated`]), and a `from.node` of another namespace
    /// ([`RadixError::NamespaceMismatch`]).
    #[inline]
    pub fn insert_from(
        &mut self,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<InsertOutcome, RadixError> {
        self.insert_from_in(Namespace::DEFAULT, from, key, slots)
    }

    /// [`RadixCache::insert_from`] in `namespace`: `from` is a position of that namespace (the
    /// result of [`RadixCache::match_prefix_in`] or of an insert in it, or [`TreePos::ROOT`]),
    /// and the key shares nodes only with keys of that namespace.
    ///
    /// # Errors
    /// As [`RadixCache::insert_from`]; [`RadixError::NamespaceMismatch`] when `from.node` is a
    /// node of another namespace.
    #[inline]
    pub fn insert_from_in(
        &mut self,
        namespace: Namespace,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<InsertOutcome, RadixError> {
        self.insert_from_with(namespace, from, key, slots, InsertParams::default())
    }

    /// [`RadixCache::insert_from_in`] recording `params` for eviction: the insert's priority,
    /// and whether it is a hit (not `chunked`). The other inserts record the default, priority
    /// 0 and a hit; the batch flow records the request's priority
    /// ([`crate::batch::Req::with_priority`]), a hit when a finished request is inserted and
    /// none when a running one registers its pages.
    ///
    /// # Errors
    /// As [`RadixCache::insert_from_in`].
    #[inline]
    pub fn insert_from_with(
        &mut self,
        namespace: Namespace,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
        params: InsertParams,
    ) -> Result<InsertOutcome, RadixError> {
        let plan = self.plan_insert(namespace, from, key, slots)?;
        Ok(self.apply_insert(plan, key, slots, params))
    }

    /// [`RadixCache::insert_from_in`] for pages that must come from `allocator`: every page of
    /// `slots[from.len..]` (the pages the tree takes, and the duplicates the caller frees) must
    /// be held as allocated there, or the insert is refused with
    /// [`RadixError::PageNotAllocated`], changing nothing. A page inserted without being
    /// allocated would be handed out again by the allocator, and its eviction refused for as
    /// long as it is the next victim. The plain inserts cannot see the allocator and trust the
    /// caller; [`PageLedger`](crate::check::PageLedger) and
    /// [`KvCache::check`](crate::cache::KvCache::check) find such a page afterwards.
    ///
    /// ```
    /// use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
    /// use kvown_runtime::radix::{Namespace, RadixCache, RadixError, TreePos};
    ///
    /// let allocator = PagedAllocator::new(64, 4, false)?;
    /// let mut tree = RadixCache::new(4);
    /// // Page 2 (slots 8..12) was never handed out.
    /// let refused = tree.insert_allocated(&allocator, Namespace::DEFAULT, TreePos::ROOT, &[1, 2, 3, 4], &[8, 9, 10, 11]);
    /// assert!(matches!(refused, Err(RadixError::PageNotAllocated { page: 2, .. })));
    /// assert_eq!(tree.total_size(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// As [`RadixCache::insert_from_in`], and [`RadixError::PageNotAllocated`].
    pub fn insert_allocated<A: AsPageAllocator>(
        &mut self,
        allocator: &A,
        namespace: Namespace,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<InsertOutcome, RadixError> {
        let allocator = allocator.page_allocator();
        let page_size = self.layout.page_size();
        if let Some(taken) = slots.get(from.len..) {
            for (index, page_slots) in taken.chunks(page_size).enumerate() {
                let page = self.layout.page_of(page_slots[0]);
                if !allocator.is_page_allocated(page) {
                    return Err(RadixError::PageNotAllocated {
                        position: from.len + index * page_size,
                        page,
                        state: allocator.page_state(page),
                    });
                }
            }
        }
        self.insert_from_in(namespace, from, key, slots)
    }

    /// The checks and the walk of [`RadixCache::insert_from`], changing nothing (the page
    /// index may grow its capacity): where the key leaves the tree and how much of it is cached
    /// ([`InsertPlan::prefix_len`]). A caller that must free its duplicates before the tree
    /// takes its slots (so that a refused free leaves everything as it was) plans, frees, then
    /// applies the plan with the same `key` and `slots`, changing the tree in between in no way.
    /// The key goes in `namespace`, which must be that of `from.node` unless it is the root
    /// ([`RadixError::NamespaceMismatch`]).
    #[inline(always)]
    pub(crate) fn plan_insert(
        &mut self,
        namespace: Namespace,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<InsertPlan, RadixError> {
        if let Some(held) = self.namespace_of(from.node)
            && held != namespace
        {
            return Err(RadixError::NamespaceMismatch {
                node: from.node,
                node_namespace: held,
                namespace,
            });
        }
        let plan = if from.len < key.len() && self.is_own_leaf_end(from) {
            // The common case of registering pages as they fill: no walk, and the hint is
            // known to be good.
            self.validate_key(key, slots)?;
            if self.layout.page_size() > 1 {
                validate_pages(&slots[from.len..], from.len, self.layout)?;
            }
            InsertPlan {
                prefix_len: from.len,
                node: from.node,
                namespace,
                step: InsertStep::ExtendLeaf,
            }
        } else {
            self.plan_walk(namespace, from, key, slots)?
        };
        self.validate_new_pages(&slots[plan.prefix_len..], plan.prefix_len)?;
        Ok(plan)
    }

    /// Checks that the pages `slots` (whole pages from key position `start`) would hand the
    /// tree are not cached yet and each named once; leaves the page index as it found it.
    fn validate_new_pages(&mut self, slots: &[KvSlot], start: usize) -> Result<(), RadixError> {
        let layout = self.layout;
        let page_size = layout.page_size();
        let pages = || {
            slots
                .chunks_exact(page_size)
                .map(move |page_slots| layout.page_of(page_slots[0]))
        };
        // One read-only pass finds a cached page and whether the pages run one way (as the
        // allocators hand them out), which rules out a repeat.
        let (mut increasing, mut decreasing, mut previous) = (true, true, None);
        for (index, page) in pages().enumerate() {
            if self.pages.contains(page) {
                return Err(RadixError::PageCached {
                    position: start + index * page_size,
                    page,
                });
            }
            if let Some(previous) = previous {
                increasing &= page > previous;
                decreasing &= page < previous;
            }
            previous = Some(page);
        }
        if increasing || decreasing {
            return Ok(());
        }
        // Otherwise mark each page in turn: one found marked was named earlier by this insert.
        let marked = pages().take_while(|&page| self.pages.insert(page)).count();
        for page in pages().take(marked) {
            self.pages.remove(page);
        }
        let Some(page) = pages().nth(marked) else {
            return Ok(());
        };
        let first = pages()
            .position(|earlier| earlier == page)
            .expect("the repeated page is among the pages");
        Err(RadixError::PageRepeated {
            first: start + first * page_size,
            second: start + marked * page_size,
            page,
        })
    }

    /// [`RadixCache::plan_insert`] in general: checks the arguments, then walks down from
    /// `from` comparing pages to the node where the key leaves the tree or ends.
    #[inline(never)]
    fn plan_walk(
        &self,
        namespace: Namespace,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<InsertPlan, RadixError> {
        let layout = self.layout;
        let page_size = layout.page_size();
        let mut node = self.validate_insert(from, key, slots)?;
        let mut pos = from.len;
        let mut extend_in_place = node == from.node;
        let step = loop {
            let entry = &self.arena[node];
            let node_end = entry.end(layout);
            if pos < node_end {
                let first_page = layout.whole_pages(pos - entry.start());
                pos += self.common_pages(node, first_page, &key[pos..]) * page_size;
                if pos == self.arena[node].start() {
                    // Entered by the hint at a node start and the first page differs: the key
                    // continues in a sibling.
                    node = self.arena[node].parent;
                    continue;
                }
                if pos < node_end {
                    break InsertStep::Split;
                }
            }
            if pos == key.len() {
                break InsertStep::Cached;
            }
            let entry = &self.arena[node];
            if extend_in_place
                && node != NodeId::ROOT
                && entry.child_count == 0
                && entry.lock_ref == 1
            {
                break InsertStep::ExtendLeaf;
            }
            extend_in_place = false;
            let first_page = &key[pos..pos + page_size];
            match self
                .children
                .find(&self.arena, layout, node, namespace, first_page)
            {
                Some(child) => node = child,
                None => break InsertStep::AddLeaf,
            }
        };
        Ok(InsertPlan {
            prefix_len: pos,
            node,
            namespace,
            step,
        })
    }

    /// Carries out `plan`, made by [`RadixCache::plan_insert`] for this `key` and `slots` with
    /// no change to the tree since, and records `params` at the node where the key ends: it
    /// cannot fail.
    #[inline(always)]
    pub(crate) fn apply_insert(
        &mut self,
        plan: InsertPlan,
        key: &[u32],
        slots: &[KvSlot],
        params: InsertParams,
    ) -> InsertOutcome {
        let InsertPlan {
            prefix_len: pos,
            mut node,
            namespace,
            step,
        } = plan;
        let mut now = self.tick();
        match step {
            InsertStep::Cached => {}
            InsertStep::ExtendLeaf => {
                self.open_registration(node, now);
                self.extend_leaf(node, &key[pos..], &slots[pos..]);
            }
            InsertStep::AddLeaf => node = self.add_leaf(node, namespace, pos, key, slots, now),
            InsertStep::Split => {
                let cut = self.cut(node, pos, now);
                if cut.split {
                    // sglang's `_insert_helper` stamps the node it walks into before it splits
                    // it, and the lower half keeps that node: it takes the insert's time. What
                    // the split or the insert then creates is newer (`TreeNode.__init__` reads
                    // the clock again).
                    self.stamp(cut.lower, now);
                    now = self.tick();
                }
                node = cut.upper;
                if pos < key.len() {
                    node = self.add_leaf(node, namespace, pos, key, slots, now);
                }
            }
        }
        self.record_insert(node, params);
        self.stamp(node, now);
        InsertOutcome {
            prefix_len: pos,
            last_node: node,
        }
    }

    /// Whether `from` is the end of a live leaf whose only lock is the caller's: the case that
    /// [`RadixCache::insert_from`] extends in place, and the common one when a request
    /// registers its pages as they fill.
    #[inline]
    fn is_own_leaf_end(&self, from: TreePos) -> bool {
        from.node != NodeId::ROOT && self.arena.is_live(from.node) && {
            let entry = &self.arena[from.node];
            entry.child_count == 0 && entry.lock_ref == 1 && entry.end(self.layout) == from.len
        }
    }

    /// [`RadixCache::insert_from_with`] for the commonest registration, one page more of the
    /// caller's own leaf: when `from` ends a leaf whose only lock is the caller's and `tokens`
    /// / `slots` are one page, checks the page (its slots the run of a page-aligned first slot),
    /// appends it to the leaf and stamps the leaf; the leaf then ends at `from.len` plus a page.
    /// `None`, changing nothing, when the case does not apply (the caller inserts in general).
    /// The outcome is the general insert's, without its plan, walk and lock move.
    #[inline(always)]
    pub(crate) fn append_own_page(
        &mut self,
        from: TreePos,
        tokens: &[u32],
        slots: &[KvSlot],
        params: InsertParams,
    ) -> Option<Result<(), RadixError>> {
        let layout = self.layout;
        let page_size = layout.page_size();
        let one_page = tokens.len() == page_size && slots.len() == page_size;
        // Positions count in `u32` (a node's depth); a key reaching past that goes the general
        // way, which refuses it.
        let fits = from.len + page_size <= u32::MAX as usize;
        if !(one_page && fits && self.is_own_leaf_end(from)) {
            return None;
        }
        if let Err(error) = validate_pages(slots, from.len, layout) {
            return Some(Err(error));
        }
        let page = layout.page_of(slots[0]);
        if !self.pages.insert(page) {
            return Some(Err(RadixError::PageCached {
                position: from.len,
                page,
            }));
        }
        self.record_extended(from.node, tokens, slots);
        let now = self.tick();
        self.open_registration(from.node, now);
        let data = &mut self.arena[from.node].data;
        reserve_growth(data, layout.words_per_page());
        append_page(data, tokens, slots[0], layout);
        self.add_tokens(from.node, page_size);
        self.record_insert(from.node, params);
        self.stamp(from.node, now);
        Some(Ok(()))
    }

    /// The prompt split of a request's registration (sglang `_insert_cache` with
    /// `split_prompt`): after the request's key was inserted up to `end` (live, on its path),
    /// its first `prompt_len` tokens (page-aligned, `0 < prompt_len < end.len`) are inserted
    /// again with `params` (the request's priority plus one, no hit). So a node ends at
    /// `prompt_len` (a grown leaf's registration may: sglang's node for it), split off at the
    /// time of this call if none did, and records `params`. Access times are left as they are:
    /// sglang's `checkpoint` stamps the whole key's path again right after, so the prompt's
    /// nodes are no newer than the key's end.
    pub(crate) fn split_prompt(&mut self, end: TreePos, prompt_len: usize, params: InsertParams) {
        debug_assert!(0 < prompt_len && prompt_len < end.len);
        let layout = self.layout;
        let mut node = end.node;
        while self.arena[node].start() >= prompt_len {
            node = self.arena[node].parent;
        }
        if prompt_len < self.arena[node].end(layout) {
            let end_page = layout.whole_pages(prompt_len - self.arena[node].start());
            let registration = self
                .arena
                .registrations(node)
                .and_then(|registrations| registrations.ending_at(end_page));
            if let Some(index) = registration {
                if self.policy.reads_insert_figures() {
                    self.arena.registrations_mut(node).record(index, params);
                }
                return;
            }
            let now = self.tick();
            node = self.cut(node, prompt_len, now).upper;
        }
        self.record_insert(node, params);
    }

    /// Checks an insert's arguments; returns the node on whose key `from.len` lies.
    fn validate_insert(
        &self,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<NodeId, RadixError> {
        let layout = self.layout;
        let page_size = layout.page_size();
        self.validate_key(key, slots)?;
        self.ensure_live(from.node)?;
        if self.arena[from.node].lock_ref == 0 {
            return Err(RadixError::HintNotLocked { node: from.node });
        }
        if from.len > key.len() {
            return Err(RadixError::HintOutOfRange {
                node: from.node,
                len: from.len,
                node_end: self.arena[from.node].end(layout),
                key_len: key.len(),
                page_size,
            });
        }
        let node = self.node_at(from, key.len())?;
        validate_pages(&slots[from.len..], from.len, layout)?;
        Ok(node)
    }

    /// Checks what an insert's key and slots must be wherever it starts: whole pages, no longer
    /// than a `u32` position can count, one slot per token.
    fn validate_key(&self, key: &[u32], slots: &[KvSlot]) -> Result<(), RadixError> {
        let layout = self.layout;
        let page_size = layout.page_size();
        if !layout.is_aligned(key.len()) {
            return Err(RadixError::UnalignedKey {
                len: key.len(),
                page_size,
            });
        }
        if key.len() > u32::MAX as usize {
            return Err(RadixError::KeyTooLong {
                len: key.len(),
                max: u32::MAX as usize,
            });
        }
        if slots.len() != key.len() {
            return Err(RadixError::LengthMismatch {
                key: key.len(),
                slots: slots.len(),
            });
        }
        Ok(())
    }

    /// Adds `key[pos..]` with its slots as a new unlocked leaf under `parent`, in `namespace`
    /// (the parent's, unless the parent is the root).
    fn add_leaf(
        &mut self,
        parent: NodeId,
        namespace: Namespace,
        pos: usize,
        key: &[u32],
        slots: &[KvSlot],
        now: u64,
    ) -> NodeId {
        let layout = self.layout;
        self.record_stored(parent, namespace, &key[pos..], &slots[pos..]);
        let mut data = Vec::with_capacity(layout.key_words(key.len() - pos));
        append_pages(&mut data, &key[pos..], &slots[pos..], layout);
        self.hold_pages(&slots[pos..]);
        let leaf = self.arena.alloc(
            Node::new(data, parent, namespace, pos, now),
            NodeStats::new(now),
        );
        self.children.link(&mut self.arena, layout, leaf);
        self.arena[parent].child_count += 1;
        self.refresh_leaf_status(parent);
        self.refresh_leaf_status(leaf);
        self.add_tokens(leaf, key.len() - pos);
        leaf
    }

    /// Appends `suffix` (whole pages) with its slots to the leaf `node`, which ends where the
    /// suffix starts.
    fn extend_leaf(&mut self, node: NodeId, suffix: &[u32], slots: &[KvSlot]) {
        let layout = self.layout;
        self.record_extended(node, suffix, slots);
        let data = &mut self.arena[node].data;
        reserve_growth(data, layout.key_words(suffix.len()));
        append_pages(data, suffix, slots, layout);
        self.hold_pages(slots);
        self.add_tokens(node, suffix.len());
    }

    /// Records an insert of `params` that ended at `node`, when the policy reads what it
    /// records.
    #[inline(always)]
    fn record_insert(&mut self, node: NodeId, params: InsertParams) {
        if self.policy.reads_insert_figures() {
            self.arena.stats_mut(node).record(params);
        }
    }

    /// Records the pages of `slots` (whole pages that [`RadixCache::plan_insert`] found new)
    /// in the page index.
    fn hold_pages(&mut self, slots: &[KvSlot]) {
        let layout = self.layout;
        let page_size = layout.page_size();
        for page_slots in slots.chunks_exact(page_size) {
            let fresh = self.pages.insert(layout.page_of(page_slots[0]));
            debug_assert!(fresh, "plan_insert refuses a page the tree holds");
        }
    }
}

/// Makes room for `needed` more words in a growing leaf's `data`, doubling it when short:
/// appends stay amortized O(1), each token copied about once. The spare is given back when the
/// last lock on the leaf goes (`unlock_path`), so only leaves that are still growing carry it.
#[inline(always)]
fn reserve_growth(data: &mut Vec<u32>, needed: usize) {
    if data.capacity() - data.len() < needed {
        data.reserve_exact(needed.max(data.len()));
    }
}

/// Appends each page of `key` followed by its page id (taken from the page's first slot).
fn append_pages(data: &mut Vec<u32>, key: &[u32], slots: &[KvSlot], layout: KeyLayout) {
    let page_size = layout.page_size();
    for (tokens, page_slots) in key
        .chunks_exact(page_size)
        .zip(slots.chunks_exact(page_size))
    {
        append_page(data, tokens, page_slots[0], layout);
    }
}

/// Appends one page: its `tokens`, then the id of the page whose first slot is `first_slot`.
#[inline(always)]
fn append_page(data: &mut Vec<u32>, tokens: &[u32], first_slot: KvSlot, layout: KeyLayout) {
    data.extend_from_slice(tokens);
    data.push(layout.page_of(first_slot));
}

/// Checks that `slots` (starting at key position `start`, page-aligned) are whole pages: each
/// page's slots are the run `first, first + 1, …` of a page-aligned `first`. One branch-free
/// pass per page (vectorised); the offending slot is looked for only when a page fails.
#[inline(always)]
fn validate_pages(slots: &[KvSlot], start: usize, layout: KeyLayout) -> Result<(), RadixError> {
    let page_size = layout.page_size();
    let mut broken = false;
    for page_slots in slots.chunks_exact(page_size) {
        let first = page_slots[0];
        let expected = (0..page_size as u32).map(|offset| first.wrapping_add(offset));
        let differs = page_slots
            .iter()
            .zip(expected)
            .fold(0, |differs, (&found, expected)| {
                differs | (found ^ expected)
            });
        broken |= differs != 0 || !layout.is_aligned(first as usize);
    }
    if broken {
        return Err(first_broken_page(slots, start, page_size));
    }
    Ok(())
}

/// The error [`validate_pages`] reports: the first page that is misaligned or not a run.
#[cold]
#[inline(never)]
fn first_broken_page(slots: &[KvSlot], start: usize, page_size: usize) -> RadixError {
    for (page, page_slots) in slots.chunks_exact(page_size).enumerate() {
        let position = start + page * page_size;
        let first = page_slots[0];
        if !(first as usize).is_multiple_of(page_size) {
            return RadixError::MisalignedPage {
                position,
                slot: first,
                page_size,
            };
        }
        let expected = (0..page_size as u32).map(|offset| first.wrapping_add(offset));
        if let Some((offset, (&found, expected))) = page_slots
            .iter()
            .zip(expected)
            .enumerate()
            .find(|(_, (found, expected))| **found != *expected)
        {
            return RadixError::BrokenPage {
                position: position + offset,
                found,
                expected,
            };
        }
    }
    unreachable!("validate_pages found a broken page that first_broken_page does not")
}

#[cfg(test)]
mod tests {
    use super::super::{EvictionPolicy, InsertParams, Namespace, RadixCache, RadixError, TreePos};

    /// A cache holding one locked two-page prompt, and the position of its end; LFU, whose
    /// order reads every figure an insert records.
    fn with_locked_prompt(page_size: usize) -> (RadixCache, TreePos) {
        let mut cache = RadixCache::with_policy(page_size, EvictionPolicy::Lfu);
        let len = 2 * page_size;
        let key: Vec<u32> = (0..len as u32).collect();
        let slots: Vec<u32> = (page_size as u32..(page_size + len) as u32).collect();
        let outcome = cache.insert(&key, &slots).unwrap();
        cache.inc_lock_ref(outcome.last_node).unwrap();
        let end = TreePos {
            node: outcome.last_node,
            len,
        };
        (cache, end)
    }

    #[test]
    fn appending_an_own_page_equals_the_general_insert() {
        for page_size in [1, 4, 16] {
            let (mut fast, mut at) = with_locked_prompt(page_size);
            let (mut general, _) = with_locked_prompt(page_size);
            let mut key: Vec<u32> = (0..at.len as u32).collect();
            let mut slots: Vec<u32> = (page_size as u32..(page_size + at.len) as u32).collect();
            for round in 0..5 {
                let params = InsertParams {
                    priority: round - 2,
                    chunked: round % 2 == 0,
                };
                let page = slots.len() / page_size + 1;
                let first = (page * page_size) as u32;
                key.extend((0..page_size as u32).map(|offset| 1000 + first + offset));
                slots.extend((0..page_size as u32).map(|offset| first + offset));
                let new_page = at.len..key.len();
                fast.append_own_page(at, &key[new_page.clone()], &slots[new_page], params)
                    .expect("one page more of an own leaf")
                    .unwrap();
                let outcome = general
                    .insert_from_with(Namespace::DEFAULT, at, &key, &slots, params)
                    .unwrap();
                general.move_lock(at.node, outcome.last_node).unwrap();
                assert_eq!(outcome.last_node, at.node, "page size {page_size}");
                at.len = key.len();
                // The node table and the eviction figures beside it, the order included.
                assert_eq!(format!("{fast:?}"), format!("{general:?}"));
                assert_eq!(fast.bookkeeping_bytes(), general.bookkeeping_bytes());
                fast.check().unwrap();
            }
        }
    }

    #[test]
    fn appending_declines_what_is_not_one_page_of_an_own_leaf() {
        let page_size = 4;
        let (mut cache, at) = with_locked_prompt(page_size);
        let before = format!("{cache:?}");
        let page: Vec<u32> = (100..104).collect();
        let slots: Vec<u32> = (12..16).collect();
        // Two pages, half a page, a position inside the leaf, the root.
        let two: Vec<u32> = (100..108).collect();
        let two_slots: Vec<u32> = (12..20).collect();
        let inside = TreePos {
            len: page_size,
            ..at
        };
        let declined = |cache: &mut RadixCache, from: TreePos, tokens: &[u32], slots: &[u32]| {
            cache
                .append_own_page(from, tokens, slots, InsertParams::default())
                .is_none()
        };
        assert!(declined(&mut cache, at, &two, &two_slots));
        assert!(declined(&mut cache, at, &page[..2], &slots[..2]));
        assert!(declined(&mut cache, at, &page, &two_slots));
        assert!(declined(&mut cache, at, &two, &slots));
        assert!(declined(&mut cache, inside, &page, &slots));
        assert!(declined(&mut cache, TreePos::ROOT, &page, &slots));
        // A second lock on the leaf: it is no longer the caller's alone.
        cache.inc_lock_ref(at.node).unwrap();
        assert!(declined(&mut cache, at, &page, &slots));
        cache.dec_lock_ref(at.node).unwrap();
        assert_eq!(format!("{cache:?}"), before);
        // One page of the own leaf whose slots are not a page: refused, nothing changed.
        let broken = [12, 13, 15, 14];
        assert_eq!(
            cache.append_own_page(at, &page, &broken, InsertParams::default()),
            Some(Err(RadixError::BrokenPage {
                position: 2 * page_size + 2,
                found: 15,
                expected: 14,
            }))
        );
        assert_eq!(format!("{cache:?}"), before);
        // One page of the own leaf that the tree holds already (the leaf's first): refused.
        let cached: Vec<u32> = (4..8).collect();
        assert_eq!(
            cache.append_own_page(at, &page, &cached, InsertParams::default()),
            Some(Err(RadixError::PageCached {
                position: 2 * page_size,
                page: 1,
            }))
        );
        assert_eq!(format!("{cache:?}"), before);
    }
}
