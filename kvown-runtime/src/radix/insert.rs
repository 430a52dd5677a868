//! Inserting page-aligned keys with their slots: an [`Insert`] describes the insert,
//! [`RadixCache::plan_insert`] checks it and finds where the key leaves the tree without changing
//! anything, and [`InsertPlan::apply`] carries it out; [`RadixCache::insert`] does both.

use std::fmt;

use super::layout::KeyLayout;
use super::node::NodeId;
use super::{InsertOutcome, InsertParams, Key, RadixCache, RadixError, TreePos};
use crate::alloc::{AsPageAllocator, KvSlot, PageAllocator, PageState, ReuseOrder};
use crate::ids::PageId;

/// One insert: a page-aligned [`Key`] with its `slots` (one per token, whole pages), and how it
/// is made. Built with [`Insert::new`] and the methods that change one part each:
///
/// * [`Insert::from`]: a position the caller got from a match or insert of the same key and
///   has locked, up to which the key is trusted to be cached (default [`TreePos::ROOT`]: the
///   whole key is walked);
/// * [`Insert::params`]: how the insert counts for eviction (default: priority 0, a hit);
/// * [`Insert::allocated_in`]: the allocator every page the insert hands over must be
///   allocated in (default: the caller is trusted).
///
/// ```
/// use kvown_runtime::alloc::{PagedAllocator, SlotCalls};
/// use kvown_runtime::radix::{Insert, InsertParams, Namespace, RadixCache, RadixConfig, TreePos};
///
/// let mut allocator = PagedAllocator::new(64, 4, false)?;
/// let mut tree = RadixCache::new(RadixConfig::new(4))?;
/// let key = [1, 2, 3, 4, 5, 6, 7, 8];
/// let mut row = Vec::new();
/// allocator.alloc(8, &mut row)?;
/// // A request in namespace 2 registers its first page, locks it, then its second page.
/// let first = tree.insert(Insert::new(Namespace(2).key(&key[..4]), &row[..4]))?;
/// tree.inc_lock_ref(first.last_node)?;
/// let at = TreePos { node: first.last_node, len: 4 };
/// let registration = InsertParams { priority: 5, chunked: true };
/// let second = Insert::new(Namespace(2).key(&key), &row)
///     .from(at)
///     .params(registration)
///     .allocated_in(&allocator);
/// let outcome = tree.insert(second)?;
/// assert_eq!((outcome.prefix_len, outcome.last_node), (4, first.last_node)); // grown in place
/// assert_eq!(tree.sizes().protected, 8);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Insert<'a> {
    key: Key<'a>,
    slots: &'a [KvSlot],
    from: TreePos,
    params: InsertParams,
    allocator: Option<&'a dyn PageStates>,
}

impl<'a> Insert<'a> {
    /// An insert of `key` with `slots` from the root, recording the default [`InsertParams`],
    /// trusting the caller that the pages it hands over are allocated.
    #[inline(always)]
    pub fn new(key: impl Into<Key<'a>>, slots: &'a [KvSlot]) -> Insert<'a> {
        Insert {
            key: key.into(),
            slots,
            from: TreePos::ROOT,
            params: InsertParams::default(),
            allocator: None,
        }
    }

    /// This insert trusting that `key[..at.len]` is already cached on the path through
    /// `at.node`: a position of the key's namespace (or [`TreePos::ROOT`], every namespace's)
    /// that the caller got from a match or insert of the same key and whose node it has
    /// locked. Only `key[at.len..]` and `slots[at.len..]` are read.
    #[inline(always)]
    pub fn from(mut self, at: TreePos) -> Insert<'a> {
        self.from = at;
        self
    }

    /// This insert recording `params` for eviction: the insert's priority, and whether it is a
    /// hit (not `chunked`). The batch flow records the request's priority
    /// ([`crate::batch::Req::with_priority`]), a hit when a finished request is inserted and
    /// none when a running one registers its pages.
    #[inline(always)]
    pub fn params(mut self, params: InsertParams) -> Insert<'a> {
        self.params = params;
        self
    }

    /// This insert refusing, with [`RadixError::PageNotAllocated`] and changing nothing, a page
    /// of `slots[from.len..]` (the pages the tree takes, and the duplicates the caller frees)
    /// that `allocator` does not hold as allocated. A page inserted without being allocated
    /// would be handed out again by the allocator, and its eviction refused for as long as it
    /// is the next victim. Without it the insert trusts the caller;
    /// [`PageLedger`](crate::check::PageLedger) and
    /// [`KvCache::check`](crate::cache::KvCache::check) find such a page afterwards.
    ///
    /// ```
    /// use kvown_runtime::alloc::PagedAllocator;
    /// use kvown_runtime::radix::{Insert, RadixCache, RadixConfig, RadixError};
    ///
    /// let allocator = PagedAllocator::new(64, 4, false)?;
    /// let mut tree = RadixCache::new(RadixConfig::new(4))?;
    /// // Page 2 (slots 8..12) was never handed out.
    /// let insert = Insert::new(&[1, 2, 3, 4], &[8, 9, 10, 11]).allocated_in(&allocator);
    /// let refused = tree.insert(insert);
    /// assert!(matches!(refused, Err(RadixError::PageNotAllocated { page: 2, .. })));
    /// assert_eq!(tree.sizes().total(), 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn allocated_in<A: AsPageAllocator>(mut self, allocator: &'a A) -> Insert<'a> {
        self.allocator = Some(allocator.page_allocator());
        self
    }
}

/// What an insert asks of the allocator named by [`Insert::allocated_in`].
trait PageStates: fmt::Debug {
    /// The state of `page`, or `None` beyond the last page.
    fn page_state(&self, page: PageId) -> Option<PageState>;
}

impl<R: ReuseOrder> PageStates for PageAllocator<R> {
    fn page_state(&self, page: PageId) -> Option<PageState> {
        PageAllocator::page_state(self, page)
    }
}

/// An insert checked and planned by [`RadixCache::plan_insert`]: how much of the key is cached
/// already, and what [`InsertPlan::apply`] will do. It holds the cache, so nothing changes the
/// tree between the plan and its application; the caller may meanwhile free its duplicates
/// through the allocator, so that a refused free leaves everything as it was.
#[must_use = "a plan changes nothing until it is applied"]
pub struct InsertPlan<'a> {
    cache: &'a mut RadixCache,
    key: Key<'a>,
    slots: &'a [KvSlot],
    params: InsertParams,
    /// Tokens of the key already cached: the outcome's `prefix_len`.
    prefix_len: usize,
    /// The node the step acts on.
    node: NodeId,
    step: InsertStep,
}

impl fmt::Debug for InsertPlan<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InsertPlan")
            .field("key", &self.key)
            .field("params", &self.params)
            .field("prefix_len", &self.prefix_len)
            .field("node", &self.node)
            .field("step", &self.step)
            .finish_non_exhaustive()
    }
}

impl InsertPlan<'_> {
    /// Tokens of the key already cached ([`InsertOutcome::prefix_len`]): the caller's slots for
    /// `[protected, prefix_len)` are duplicates, to free before or after applying.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
    /// let mut tree = RadixCache::new(RadixConfig::new(1))?;
    /// tree.insert(Insert::new(&[1, 2], &[4, 5]))?;
    /// let plan = tree.plan_insert(Insert::new(&[1, 2, 3], &[6, 7, 8]))?;
    /// assert_eq!(plan.prefix_len(), 2, "slots 6 and 7 are duplicates to free");
    /// assert_eq!(plan.apply().prefix_len, 2);
    /// assert_eq!(tree.sizes().total(), 3);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn prefix_len(&self) -> usize {
        self.prefix_len
    }

    /// Carries out the insert: the tree takes the slots of `[prefix_len, key.len())`, a node
    /// ends exactly at `key.len()` ([`InsertOutcome::last_node`], stamped as accessed, with the
    /// insert's [`InsertParams`] recorded). It cannot fail.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
    /// let mut tree = RadixCache::new(RadixConfig::new(1))?;
    /// let plan = tree.plan_insert(Insert::new(&[1, 2], &[4, 5]))?;
    /// let outcome = plan.apply();
    /// assert_eq!(tree.match_prefix(&[1, 2]).node, outcome.last_node);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline(always)]
    pub fn apply(self) -> InsertOutcome {
        let InsertPlan {
            cache,
            key,
            slots,
            params,
            prefix_len,
            node,
            step,
        } = self;
        if step == InsertStep::AppendPage {
            cache.apply_append(key.tokens, slots, params, prefix_len, node)
        } else {
            cache.apply_insert(key, slots, params, prefix_len, node, step)
        }
    }
}

/// What a plan found: the cached length, the node its step acts on, and the step.
type Planned = (usize, NodeId, InsertStep);

/// What an insert does where the key leaves the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum InsertStep {
    /// The whole key is cached and ends where `node` ends.
    Cached,
    /// `node` ends at `prefix_len`, is a leaf and holds only the caller's lock, and the key
    /// has one page more: it is appended to the leaf.
    AppendPage,
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
    /// Inserts the key `insert` describes with its slots, and returns how much of it was cached
    /// already and where it ends: [`RadixCache::plan_insert`], then [`InsertPlan::apply`].
    ///
    /// The uncached suffix becomes a new unlocked leaf, or, when the key leaves the tree at the
    /// end of `from.node` and that node is a leaf whose only lock is the caller's, is appended
    /// to it in place (so its tokens are protected by that lock). A node ends exactly at
    /// `key.len()` afterwards (splitting one if needed); it is returned as
    /// [`InsertOutcome::last_node`] and stamped as accessed. The tree takes the slots of
    /// `[prefix_len, key.len())`; the caller frees its duplicates.
    ///
    /// Cost: O(key length - `from.len` + nodes on the path below `from`) plus at most one
    /// split; extending the caller's own leaf by one page is O(page size), amortized.
    ///
    /// # Errors
    /// As [`RadixCache::plan_insert`]; nothing changes.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
    /// let mut tree = RadixCache::new(RadixConfig::new(2))?;
    /// assert_eq!(tree.insert(Insert::new(&[1, 2, 3, 4], &[4, 5, 6, 7]))?.prefix_len, 0);
    /// let again = tree.insert(Insert::new(&[1, 2, 3, 4, 5, 6], &[8, 9, 10, 11, 2, 3]))?;
    /// assert_eq!(again.prefix_len, 4, "slots 8..12 duplicate cached ones: free them");
    /// assert_eq!(tree.match_prefix(&[1, 2, 3, 4, 5, 6]).len, 6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn insert(&mut self, insert: Insert<'_>) -> Result<InsertOutcome, RadixError> {
        Ok(self.plan_insert(insert)?.apply())
    }

    /// Checks `insert` and finds where its key leaves the tree and how much of it is cached
    /// ([`InsertPlan::prefix_len`]), changing nothing but, perhaps, the page index's capacity
    /// (counted by [`RadixCache::bookkeeping_bytes`]). A caller that must free its duplicates
    /// before the tree takes its slots plans, frees, then applies.
    ///
    /// ```
    /// use kvown_runtime::alloc::{PagedAllocator, SlotCalls};
    /// use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
    ///
    /// let mut allocator = PagedAllocator::new(64, 4, false)?;
    /// let mut tree = RadixCache::new(RadixConfig::new(4))?;
    /// let key = [1, 2, 3, 4, 5, 6, 7, 8];
    /// let (mut first, mut second) = (Vec::new(), Vec::new());
    /// allocator.alloc(4, &mut first)?;
    /// tree.insert(Insert::new(&key[..4], &first))?;
    /// // A second request computed the same first page: its copy is a duplicate.
    /// allocator.alloc(8, &mut second)?;
    /// let plan = tree.plan_insert(Insert::new(&key, &second))?;
    /// allocator.free_segment(&second[..plan.prefix_len()], 0)?; // may fail: the tree is as it was
    /// let outcome = plan.apply();
    /// assert_eq!(outcome.prefix_len, 4);
    /// assert_eq!(tree.sizes().total(), 8);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    ///
    /// # Errors
    /// Refuses unaligned or overlong keys ([`RadixError::UnalignedKey`],
    /// [`RadixError::KeyTooLong`]), `slots` of another length or not in whole pages, an
    /// unknown or unlocked `from.node`, a `from.len` off its path, a `from.node` of another
    /// namespace ([`RadixError::NamespaceMismatch`]), new pages that are cached already
    /// ([`RadixError::PageCached`]) or named twice ([`RadixError::PageRepeated`]), and, with
    /// [`Insert::allocated_in`], pages not allocated there ([`RadixError::PageNotAllocated`]).
    #[inline(always)]
    pub fn plan_insert<'a>(&'a mut self, insert: Insert<'a>) -> Result<InsertPlan<'a>, RadixError> {
        let (prefix_len, node, step) = match self.plan_append(&insert) {
            Some(planned) => planned?,
            None => self.plan_general(&insert)?,
        };
        Ok(InsertPlan {
            cache: self,
            key: insert.key,
            slots: insert.slots,
            params: insert.params,
            prefix_len,
            node,
            step,
        })
    }

    /// [`RadixCache::plan_insert`] for the commonest insert, a running request registering the
    /// page it filled: one page more at the end of a leaf whose only lock is the caller's, no
    /// allocator to ask. Checked without a walk; `None` when the insert is not that one (or is
    /// refused for its namespace: the general plan names the refusal).
    #[inline(always)]
    fn plan_append(&self, insert: &Insert<'_>) -> Option<Result<Planned, RadixError>> {
        let Insert {
            key,
            slots,
            from,
            allocator,
            ..
        } = *insert;
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        // `from.len` ends a node, so it is page-aligned, and so is the key.
        let one_page = key.tokens.len() == from.len + page_size && slots.len() == key.tokens.len();
        let fits = key.tokens.len() <= u32::MAX as usize;
        if allocator.is_some() || !(one_page && fits && self.is_own_leaf_end(from)) {
            return None;
        }
        if self.arena[from.node].namespace() != key.namespace {
            return None;
        }
        let new = &slots[from.len..];
        if page_size > 1
            && let Err(error) = validate_pages(new, from.len, layout)
        {
            return Some(Err(error));
        }
        let page = layout.geometry().page_of(new[0]) as PageId;
        if self.pages.contains(page) {
            return Some(Err(RadixError::PageCached {
                position: from.len,
                page,
            }));
        }
        Some(Ok((from.len, from.node, InsertStep::AppendPage)))
    }

    /// [`RadixCache::insert`] of the commonest registration, one page more at the end of the
    /// caller's own leaf ([`RadixCache::plan_append`]), planned and applied in one go: the
    /// batch flow's page registration, without the plumbing of an [`InsertPlan`] (60 to 130
    /// instructions of a registration, W2c in `benches/`). `None`, changing nothing, when the
    /// insert is not that one.
    #[inline(always)]
    pub(crate) fn insert_own_page(
        &mut self,
        insert: &Insert<'_>,
    ) -> Option<Result<InsertOutcome, RadixError>> {
        let planned = self.plan_append(insert)?;
        Some(planned.map(|(pos, node, _)| {
            self.apply_append(insert.key.tokens, insert.slots, insert.params, pos, node)
        }))
    }

    /// [`RadixCache::plan_insert`] in general: the allocated check, then the caller's own leaf
    /// extended without a walk, or a walk down from `from`.
    #[inline(always)]
    fn plan_general(&mut self, insert: &Insert<'_>) -> Result<Planned, RadixError> {
        let Insert {
            key, slots, from, ..
        } = *insert;
        if let Some(allocator) = insert.allocator {
            self.ensure_allocated(allocator, from.len, slots)?;
        }
        if from.len < key.tokens.len() && self.is_own_leaf_end(from) {
            // Registering pages as they fill: no walk, and the hint is known to be good.
            let held = self.arena[from.node].namespace();
            if held != key.namespace {
                return Err(RadixError::NamespaceMismatch {
                    node: from.node,
                    node_namespace: held,
                    namespace: key.namespace,
                });
            }
            self.validate_key(key.tokens, slots)?;
            let new = &slots[from.len..];
            if self.layout.geometry().page_size() > 1 {
                validate_pages(new, from.len, self.layout)?;
            }
            self.validate_new_pages(new, from.len)?;
            return Ok((from.len, from.node, InsertStep::ExtendLeaf));
        }
        let (prefix_len, node, step) = self.plan_walk(key, from, slots)?;
        self.validate_new_pages(&slots[prefix_len..], prefix_len)?;
        Ok((prefix_len, node, step))
    }

    /// Refuses, with [`RadixError::PageNotAllocated`], a page of `slots[start..]` that
    /// `allocator` does not hold as allocated.
    fn ensure_allocated(
        &self,
        allocator: &dyn PageStates,
        start: usize,
        slots: &[KvSlot],
    ) -> Result<(), RadixError> {
        let page_size = self.layout.geometry().page_size();
        let Some(taken) = slots.get(start..) else {
            return Ok(());
        };
        for (index, page_slots) in taken.chunks(page_size).enumerate() {
            let page = self.layout.geometry().page_of(page_slots[0]) as PageId;
            let state = allocator.page_state(page);
            if state != Some(PageState::Held) {
                return Err(RadixError::PageNotAllocated {
                    position: start + index * page_size,
                    page,
                    state,
                });
            }
        }
        Ok(())
    }

    /// Checks that the pages `slots` (whole pages from key position `start`) would hand the
    /// tree are not cached yet and each named once; leaves the page index as it found it.
    fn validate_new_pages(&mut self, slots: &[KvSlot], start: usize) -> Result<(), RadixError> {
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        let pages = || {
            slots
                .chunks_exact(page_size)
                .map(move |page_slots| layout.geometry().page_of(page_slots[0]) as PageId)
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
    /// `from` comparing pages to the node where the key leaves the tree or ends; returns the
    /// cached length, the node the step acts on, and the step.
    #[inline(never)]
    fn plan_walk(
        &self,
        key: Key<'_>,
        from: TreePos,
        slots: &[KvSlot],
    ) -> Result<Planned, RadixError> {
        if let Some(held) = self.namespace_of(from.node)
            && held != key.namespace
        {
            return Err(RadixError::NamespaceMismatch {
                node: from.node,
                node_namespace: held,
                namespace: key.namespace,
            });
        }
        let (namespace, key) = (key.namespace, key.tokens);
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        let mut node = self.validate_insert(from, key, slots)?;
        let mut pos = from.len;
        let mut extend_in_place = node == from.node;
        let step = loop {
            let entry = &self.arena[node];
            let node_end = entry.end(layout);
            if pos < node_end {
                let first_page = layout.geometry().whole_pages(pos - entry.start());
                pos += self.common_pages(node, first_page, &key[pos..]) * page_size;
                if pos == self.arena[node].start() {
                    // Entered by the hint at a node start and the first page differs: the key
                    // continues in a sibling.
                    node = self.arena[node].parent();
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
                && entry.child_count() == 0
                && entry.locks().0 == 1
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
        Ok((pos, node, step))
    }

    /// Carries out a plan of [`RadixCache::plan_append`]: appends the page of `key[pos..]` to
    /// the leaf `node`, which ends at `pos`, and records `params` there.
    #[inline(always)]
    fn apply_append(
        &mut self,
        key: &[u32],
        slots: &[KvSlot],
        params: InsertParams,
        pos: usize,
        node: NodeId,
    ) -> InsertOutcome {
        let now = self.order.tick();
        self.open_registration(node, now);
        self.append_page(node, &key[pos..], &slots[pos..]);
        self.record_insert(node, params);
        self.order.stamp(&mut self.arena, node, now);
        InsertOutcome {
            prefix_len: pos,
            last_node: node,
        }
    }

    /// Carries out a plan of [`RadixCache::plan_general`] with no change to the tree since:
    /// `step` at `node`, the key cached up to `pos`; records `params` at the node where the key
    /// ends.
    #[inline(always)]
    fn apply_insert(
        &mut self,
        key: Key<'_>,
        slots: &[KvSlot],
        params: InsertParams,
        pos: usize,
        mut node: NodeId,
        step: InsertStep,
    ) -> InsertOutcome {
        let (namespace, key) = (key.namespace, key.tokens);
        let mut now = self.order.tick();
        match step {
            InsertStep::Cached => {}
            InsertStep::ExtendLeaf | InsertStep::AppendPage => {
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
                    self.order.stamp(&mut self.arena, cut.lower, now);
                    now = self.order.tick();
                }
                node = cut.upper;
                if pos < key.len() {
                    node = self.add_leaf(node, namespace, pos, key, slots, now);
                }
            }
        }
        self.record_insert(node, params);
        self.order.stamp(&mut self.arena, node, now);
        InsertOutcome {
            prefix_len: pos,
            last_node: node,
        }
    }

    /// Whether `from` is the end of a live leaf whose only lock is the caller's: the case that
    /// an insert extends in place without a walk, and the common one when a request registers
    /// its pages as they fill.
    #[inline(always)]
    fn is_own_leaf_end(&self, from: TreePos) -> bool {
        from.node != NodeId::ROOT && self.arena.is_live(from.node) && {
            let entry = &self.arena[from.node];
            entry.child_count() == 0 && entry.locks().0 == 1 && entry.end(self.layout) == from.len
        }
    }

    /// Checks an insert's arguments; returns the node on whose key `from.len` lies.
    fn validate_insert(
        &self,
        from: TreePos,
        key: &[u32],
        slots: &[KvSlot],
    ) -> Result<NodeId, RadixError> {
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        self.validate_key(key, slots)?;
        self.ensure_live(from.node)?;
        if self.arena[from.node].locks().0 == 0 {
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
    #[inline(always)]
    fn validate_key(&self, key: &[u32], slots: &[KvSlot]) -> Result<(), RadixError> {
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        if !layout.geometry().is_aligned(key.len()) {
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
        namespace: super::Namespace,
        pos: usize,
        key: &[u32],
        slots: &[KvSlot],
        now: u64,
    ) -> NodeId {
        let layout = self.layout;
        self.record_stored(parent, Some(namespace), &key[pos..], &slots[pos..]);
        let mut data = Vec::with_capacity(layout.key_words(key.len() - pos));
        append_pages(&mut data, &key[pos..], &slots[pos..], layout);
        self.hold_pages(&slots[pos..]);
        let leaf = self.arena.add_node(data, parent, namespace, pos, now);
        self.children.link(&self.arena, layout, leaf);
        self.order.refresh(&self.arena, parent);
        self.order.refresh(&self.arena, leaf);
        self.add_tokens(leaf, key.len() - pos);
        leaf
    }

    /// Appends `suffix` (whole pages) with its slots to the leaf `node`, which ends where the
    /// suffix starts.
    #[inline(always)]
    fn extend_leaf(&mut self, node: NodeId, suffix: &[u32], slots: &[KvSlot]) {
        let layout = self.layout;
        self.record_stored(node, None, suffix, slots);
        let data = &mut self.arena[node].data;
        reserve_growth(data, layout.key_words(suffix.len()));
        append_pages(data, suffix, slots, layout);
        self.hold_pages(slots);
        self.add_tokens(node, suffix.len());
    }

    /// Appends one page, `tokens` with its `slots`, to the leaf `node`, which ends where the
    /// page starts: [`RadixCache::extend_leaf`] for one page.
    #[inline(always)]
    fn append_page(&mut self, node: NodeId, tokens: &[u32], slots: &[KvSlot]) {
        let layout = self.layout;
        self.record_stored(node, None, tokens, slots);
        let data = &mut self.arena[node].data;
        reserve_growth(data, layout.words_per_page());
        append_page(data, tokens, slots[0], layout);
        let fresh = self
            .pages
            .insert(layout.geometry().page_of(slots[0]) as PageId);
        debug_assert!(fresh, "plan_insert refuses a page the tree holds");
        self.add_tokens(node, layout.geometry().page_size());
    }

    /// Records the pages of `slots` (whole pages that [`RadixCache::plan_insert`] found new)
    /// in the page index.
    fn hold_pages(&mut self, slots: &[KvSlot]) {
        let layout = self.layout;
        let page_size = layout.geometry().page_size();
        for page_slots in slots.chunks_exact(page_size) {
            let fresh = self
                .pages
                .insert(layout.geometry().page_of(page_slots[0]) as PageId);
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
    let page_size = layout.geometry().page_size();
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
    data.push(layout.geometry().page_of(first_slot) as PageId);
}

/// Checks that `slots` (starting at key position `start`, page-aligned) are whole pages: each
/// page's slots are the run `first, first + 1, …` of a page-aligned `first`. One branch-free
/// pass per page (vectorised); the offending slot is looked for only when a page fails.
#[inline(always)]
fn validate_pages(slots: &[KvSlot], start: usize, layout: KeyLayout) -> Result<(), RadixError> {
    let page_size = layout.geometry().page_size();
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
        broken |= differs != 0 || !layout.geometry().is_aligned(first as usize);
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
    use super::super::{
        EvictionPolicy, Insert, InsertParams, RadixCache, RadixConfig, RadixError, TreePos,
    };
    use crate::check::check_radix;

    /// A cache holding one locked two-page prompt, and the position of its end; LFU, whose
    /// order reads every figure an insert records.
    fn with_locked_prompt(page_size: usize) -> (RadixCache, TreePos) {
        let config = RadixConfig::new(page_size).with_policy(EvictionPolicy::Lfu);
        let mut cache = RadixCache::new(config).unwrap();
        let len = 2 * page_size;
        let key: Vec<u32> = (0..len as u32).collect();
        let slots: Vec<u32> = (page_size as u32..(page_size + len) as u32).collect();
        let outcome = cache.insert(Insert::new(&key, &slots)).unwrap();
        cache.inc_lock_ref(outcome.last_node).unwrap();
        let end = TreePos {
            node: outcome.last_node,
            len,
        };
        (cache, end)
    }

    // The plan of one page more at the end of the caller's own leaf skips the walk; a position
    // a page earlier on the same leaf walks to the same step. Both leave the same tree.
    #[test]
    fn extending_an_own_leaf_without_a_walk_equals_the_walk() {
        for page_size in [1, 4, 16] {
            let (mut fast, mut at) = with_locked_prompt(page_size);
            let (mut walked, _) = with_locked_prompt(page_size);
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
                let insert = Insert::new(&key, &slots).params(params);
                let outcome = fast.insert(insert.from(at)).unwrap();
                assert_eq!(outcome.last_node, at.node, "page size {page_size}");
                let earlier = TreePos {
                    len: at.len - page_size,
                    ..at
                };
                assert_eq!(walked.insert(insert.from(earlier)).unwrap(), outcome);
                at.len = key.len();
                // The node table and the eviction figures beside it, the order included.
                assert_eq!(format!("{fast:?}"), format!("{walked:?}"));
                assert_eq!(fast.bookkeeping_bytes(), walked.bookkeeping_bytes());
                check_radix(&fast).unwrap();
            }
        }
    }

    #[test]
    fn one_page_more_of_an_own_leaf_that_is_broken_or_cached_is_refused() {
        let page_size = 4;
        let (mut cache, at) = with_locked_prompt(page_size);
        let before = format!("{cache:?}");
        let key: Vec<u32> = (0..8).chain(100..104).collect();
        // Slots of the prompt, then a page whose slots are not a run.
        let broken: Vec<u32> = (4..12).chain([12, 13, 15, 14]).collect();
        assert_eq!(
            cache.insert(Insert::new(&key, &broken).from(at)),
            Err(RadixError::BrokenPage {
                position: 2 * page_size + 2,
                found: 15,
                expected: 14,
            })
        );
        assert_eq!(format!("{cache:?}"), before);
        // A page the tree holds already (the leaf's first).
        let cached: Vec<u32> = (4..12).chain(4..8).collect();
        assert_eq!(
            cache.insert(Insert::new(&key, &cached).from(at)),
            Err(RadixError::PageCached {
                position: 2 * page_size,
                page: 1,
            })
        );
        assert_eq!(format!("{cache:?}"), before);
    }
}
