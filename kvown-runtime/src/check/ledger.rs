//! Who holds each page and each request slot: the census behind [`KvCache::check`], and
//! [`PageLedger`], the same census for callers that drive the allocators, the request-to-token
//! pool and the prefix cache by hand.
//!
//! [`KvCache::check`]: crate::cache::KvCache::check

use super::{Holder, Violation};
use crate::alloc::{
    AsPageAllocator, KvAllocator, KvSlot, PageAllocator, PageId, PageState, ReuseOrder,
};
use crate::radix::RadixCache;
use crate::shared_error::PageOutOfRange;

/// Who holds each page (by page id; `None`: no one known), and which slots the requests'
/// runs named; a second claim by another holder is a violation that names both.
pub(crate) struct PageHolders {
    pub(crate) pages: Vec<Option<Holder>>,
    page_size: usize,
    /// One bit per slot a request's run named.
    request_slots: Vec<u64>,
}

impl PageHolders {
    /// No page held by anyone, for `pages` pages (page 0 included) of `page_size` slots.
    pub(crate) fn new(pages: usize, page_size: usize) -> PageHolders {
        PageHolders {
            pages: vec![None; pages],
            page_size,
            request_slots: vec![0; (pages * page_size).div_ceil(64)],
        }
    }

    /// Claims the pages of the allocator's free and release lists for [`Holder::Free`].
    pub(crate) fn claim_free<R: ReuseOrder>(
        &mut self,
        allocator: &PageAllocator<R>,
    ) -> Result<(), Violation> {
        for page in allocator.free_pages().chain(allocator.released_pages()) {
            self.claim(page as usize, Holder::Free)?;
        }
        Ok(())
    }

    /// Claims every page of the prefix cache for the node that holds it.
    pub(crate) fn claim_tree(&mut self, tree: &RadixCache) -> Result<(), Violation> {
        for (node, page) in tree.cached_pages() {
            self.claim(page as usize, Holder::Tree(node))?;
        }
        Ok(())
    }

    /// Whether the prefix cache holds `page`.
    pub(crate) fn is_tree(&self, page: usize) -> bool {
        matches!(self.pages.get(page), Some(Some(Holder::Tree(_))))
    }

    /// Claims a whole `page` for `holder`.
    pub(crate) fn claim(&mut self, page: usize, holder: Holder) -> Result<(), Violation> {
        let pages = self.pages.len();
        let Some(held) = self.pages.get_mut(page) else {
            return Err(Violation::PageOutOfRange {
                range: PageOutOfRange {
                    page: PageId::try_from(page).unwrap_or(PageId::MAX),
                    pages,
                },
                holder,
            });
        };
        match *held {
            None => {
                *held = Some(holder);
                Ok(())
            }
            Some(first) => Err(Violation::PageHeldTwice {
                page,
                first,
                second: holder,
            }),
        }
    }

    /// Claims `page` for a request's `run` of slots in it. Against another request's claim,
    /// a slot both named is reported as [`Violation::SlotHeldTwice`].
    pub(crate) fn claim_run(
        &mut self,
        page: usize,
        run: &[KvSlot],
        holder: Holder,
    ) -> Result<(), Violation> {
        if let Err(twice) = self.claim(page, holder) {
            let Violation::PageHeldTwice {
                first: first @ Holder::Request(_),
                ..
            } = twice
            else {
                return Err(twice);
            };
            return match run.iter().find(|&&slot| self.named(slot)) {
                Some(&slot) if first != holder => Err(Violation::SlotHeldTwice {
                    slot,
                    page,
                    first,
                    second: holder,
                }),
                _ => Err(twice),
            };
        }
        for &slot in run {
            self.request_slots[slot as usize / 64] |= 1 << (slot % 64);
        }
        Ok(())
    }

    /// Whether a request's run named `slot`.
    fn named(&self, slot: KvSlot) -> bool {
        self.request_slots
            .get(slot as usize / 64)
            .is_some_and(|bits| bits & (1 << (slot % 64)) != 0)
    }

    /// The slots' page size.
    pub(crate) fn page_size(&self) -> usize {
        self.page_size
    }
}

/// A census of who holds each page of an allocator, for callers that keep their own
/// bookkeeping around the raw allocator, [`ReqToTokenPool`](crate::slots::ReqToTokenPool) and
/// [`RadixCache`]: the page census of [`KvCache::check`](crate::cache::KvCache::check) without
/// the request ladder.
///
/// Claim what each holder's own lists say it holds; [`PageLedger::finish`] then checks that
/// every page is held by exactly one holder (the free list, a prefix-cache node, a request),
/// that every page claimed outside the free list is allocated, and that every allocated page is
/// claimed. A slot two requests name is reported with both ([`Violation::SlotHeldTwice`]).
///
/// The allocator alone cannot see one request continuing another's partially filled page from
/// that request's last slot: it checks that a `last_loc` is the last slot handed out in its
/// page, not whose page it is. This census is what catches it:
///
/// ```
/// use kvown_runtime::alloc::{AllocError, DecodeShape, ExtendShape, KvAllocator, PagedAllocator};
/// use kvown_runtime::check::{Holder, PageLedger, Violation};
///
/// let mut allocator = PagedAllocator::new(64, 4, false)?;
/// let (mut a, mut b) = (Vec::new(), Vec::new());
/// allocator.alloc_extend(&[ExtendShape { prefix_len: 0, seq_len: 1, last_loc: None }], &mut a)?;
/// // Request 2 passes request 1's last slot as its own last_loc: the allocator cannot tell.
/// let foreign = ExtendShape { prefix_len: 1, seq_len: 3, last_loc: Some(a[0]) };
/// allocator.alloc_extend(&[foreign], &mut b)?;
/// // Request 1's own decode is refused: slot 4 is no longer the page's last (the fill marks).
/// let decode = DecodeShape { seq_len: 2, last_loc: a[0] };
/// let stale = allocator.alloc_decode(&[decode], &mut a).unwrap_err();
/// assert!(matches!(stale, AllocError::LastLocNotLatest { latest: 6, .. }));
///
/// let mut ledger = PageLedger::new(&allocator)?;
/// ledger.claim_slots(Holder::Request(1), &a)?;
/// let twice = ledger.claim_slots(Holder::Request(2), &b).unwrap_err();
/// assert!(matches!(twice, Violation::PageHeldTwice { page: 1, .. }));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct PageLedger<'a, R: ReuseOrder> {
    allocator: &'a PageAllocator<R>,
    holders: PageHolders,
}

impl<'a, R: ReuseOrder> PageLedger<'a, R> {
    /// A census of `allocator`'s pages with its free and release lists claimed by
    /// [`Holder::Free`], after the allocator's own check.
    ///
    /// # Errors
    /// [`Violation::OpenFreeGroup`] inside a free group, or what the allocator's check finds.
    pub fn new<A: AsPageAllocator<Order = R>>(allocator: &'a A) -> Result<Self, Violation> {
        let allocator = allocator.page_allocator();
        if allocator.in_free_group() {
            return Err(Violation::OpenFreeGroup);
        }
        allocator.check()?;
        let mut holders = PageHolders::new(allocator.num_pages() + 1, allocator.page_size());
        holders.claim_free(allocator)?;
        Ok(PageLedger { allocator, holders })
    }

    /// Claims every page of `tree` for the node holding it, after the tree's own check.
    ///
    /// # Errors
    /// What the tree's check finds, or a page held twice or out of range.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{PagedAllocator, SlotCalls};
    /// # use kvown_runtime::check::{Holder, PageLedger};
    /// # use kvown_runtime::radix::{Insert, RadixCache, RadixConfig};
    /// let mut allocator = PagedAllocator::new(32, 4, false)?;
    /// let mut slots = Vec::new();
    /// allocator.alloc(8, &mut slots)?;
    /// let mut tree = RadixCache::new(RadixConfig::new(4))?;
    /// tree.insert(Insert::new(&[1, 2, 3, 4], &slots[..4]))?;
    /// let mut ledger = PageLedger::new(&allocator)?;
    /// ledger.claim_tree(&tree)?; // page 1
    /// ledger.claim_slots(Holder::Request(9), &slots[4..])?; // page 2
    /// ledger.finish()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn claim_tree(&mut self, tree: &RadixCache) -> Result<(), Violation> {
        super::check_radix(tree)?;
        self.holders.claim_tree(tree)
    }

    /// Claims the pages of `slots` for `holder` (a request's own slots, in row order: each
    /// run of slots in one page claims that page once).
    ///
    /// # Errors
    /// [`Violation::SlotHeldTwice`] for a slot another request claimed,
    /// [`Violation::PageHeldTwice`] for a page another holder claimed, or
    /// [`Violation::PageOutOfRange`].
    pub fn claim_slots(&mut self, holder: Holder, slots: &[KvSlot]) -> Result<(), Violation> {
        let page_size = self.holders.page_size();
        for run in slots.chunk_by(|a, b| *a as usize / page_size == *b as usize / page_size) {
            self.holders
                .claim_run(run[0] as usize / page_size, run, holder)?;
        }
        Ok(())
    }

    /// Checks the census against the allocator: every claimed page outside the free list is
    /// allocated, and every allocated page is claimed.
    ///
    /// # Errors
    /// [`Violation::PageNotAllocated`], or [`Violation::UnclaimedPages`] naming the lowest
    /// page nobody claims and how many there are.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{PagedAllocator, SlotCalls};
    /// # use kvown_runtime::check::PageLedger;
    /// let mut allocator = PagedAllocator::new(32, 4, false)?;
    /// allocator.alloc(4, &mut Vec::new())?; // a page nobody claims
    /// let error = PageLedger::new(&allocator)?.finish().unwrap_err();
    /// assert!(error.to_string().contains("1"), "{error}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn finish(self) -> Result<(), Violation> {
        for (page, holder) in self.holders.pages.iter().enumerate() {
            let state = self.allocator.page_state(page as u32);
            match (holder, state) {
                (Some(Holder::Free), _) | (Some(_), Some(PageState::Held)) | (None, _) => {}
                (&Some(holder), state) => {
                    return Err(Violation::PageNotAllocated {
                        page,
                        holder,
                        state: state.unwrap_or(PageState::Reserved),
                    });
                }
            }
        }
        let mut unclaimed = (1..self.holders.pages.len()).filter(|&page| {
            self.holders.pages[page].is_none() && self.allocator.is_page_allocated(page as u32)
        });
        if let Some(first) = unclaimed.next() {
            return Err(Violation::UnclaimedPages {
                first: first as u32,
                count: 1 + unclaimed.count(),
            });
        }
        Ok(())
    }
}
