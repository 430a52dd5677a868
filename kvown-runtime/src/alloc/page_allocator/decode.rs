//! The batched decode (sglang `alloc_decode`): one pass over the requests decides every slot,
//! for shapes a caller gave (checked in the same pass) and for the batch flow's checked rows
//! (written in the same pass).

use super::PageAllocator;
use crate::alloc::free_list::FreeHeads;
use crate::alloc::geometry::{PageMath, Specialised};
use crate::alloc::rules::{ContinuedPages, check_decode, check_latest, fill_mark, unmark_pages};
use crate::alloc::{
    AllocError, DecodeRequest, DecodeRequests, DecodeShape, KvSlot, PageState, ReuseOrder,
};

/// What one decode pass found: whether every request passed the checks (always, for a checked
/// batch), and how many new pages the batch opens.
struct DecodePass {
    valid: bool,
    new_pages: usize,
}

impl DecodePass {
    /// The decode rule for one request: its new slot, the next slot of its page, or the first
    /// slot of the next page of `free` (0 when `free` is short) when the token opens one.
    ///
    /// `CHECKED` (a batch the batch flow checked): records the slot in its page's fill mark
    /// and checks nothing. Otherwise: folds the request's validity into `valid` (its page held,
    /// `last_loc` at the offset its length implies and the last slot handed out in the page,
    /// by the fill marks as they were before the call) and marks a continued page `Pending`, so
    /// that a second request continuing it is invalid; the caller turns the marks back and sets
    /// the fill marks once the batch is known to succeed.
    #[inline(always)]
    fn next_slot<M: PageMath, const CHECKED: bool>(
        &mut self,
        math: M,
        state: &mut [PageState],
        fill: &mut [u16],
        free: FreeHeads<'_>,
        req: DecodeRequest<'_>,
    ) -> KvSlot {
        let stored = req.stored();
        let offset = math.offset(stored);
        if CHECKED {
            let slot = if offset == 0 {
                let page = free.get(self.new_pages);
                self.new_pages += 1;
                page.map_or(0, |page| math.first_slot(page))
            } else {
                req.last_loc() + 1
            };
            fill[math.page_of(slot)] = fill_mark(slot);
            return slot;
        }
        let last_loc = req.last_loc();
        let page = math.page_of(last_loc);
        let page_state = state.get(page).copied();
        let aligned = math.offset(last_loc as usize + 1) == offset;
        let well_formed = stored.wrapping_add(1) >= 2;
        let checked = well_formed & aligned & (fill.get(page) == Some(&fill_mark(last_loc)));
        if offset == 0 {
            let held = matches!(page_state, Some(PageState::Held | PageState::Pending));
            self.valid &= checked & held;
            let page = free.get(self.new_pages);
            self.new_pages += 1;
            page.map_or(0, |page| math.first_slot(page))
        } else {
            // `Pending`: an earlier request of the batch continues this page.
            let own = page_state == Some(PageState::Held);
            self.valid &= checked & own;
            if own {
                state[page] = PageState::Pending;
            }
            // Wrapping: a bogus `last_loc` (up to `KvSlot::MAX`) fails the batch, and its
            // slot is never used.
            last_loc.wrapping_add(1)
        }
    }
}

/// One pass of `reqs` through [`DecodePass::next_slot`], filling `out` (`reqs.len()` slots).
#[inline(always)]
fn decode_pass<M: PageMath, D: DecodeRequests, const CHECKED: bool>(
    math: M,
    state: &mut [PageState],
    fill: &mut [u16],
    free: FreeHeads<'_>,
    reqs: &mut D,
    out: &mut [KvSlot],
) -> DecodePass {
    let mut pass = DecodePass {
        valid: true,
        new_pages: 0,
    };
    reqs.assign(out, |req| {
        pass.next_slot::<M, CHECKED>(math, state, fill, free, req)
    });
    pass
}

impl<R: ReuseOrder> PageAllocator<R> {
    /// [`KvAllocator::alloc_decode`](crate::alloc::KvAllocator::alloc_decode): one pass decides
    /// every slot, then the batch's new pages are claimed. A checked batch has its pages made
    /// available first (out of memory is its only error, before anything changes) and its rows
    /// written in the pass. Shapes a caller gave are checked in the pass; when one is invalid,
    /// or the pages are short, everything the pass did is undone and the slow path names the
    /// error (or, in `need_sort` mode, merges the release list and decodes again).
    #[inline]
    pub(super) fn decode<D: DecodeRequests>(
        &mut self,
        mut reqs: D,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        let checked = reqs.checked_new_pages();
        let len = reqs.len();
        // sglang's `alloc_decode` merges the release list when `bs > len(free_pages)`.
        match checked {
            Some(new_pages) => {
                if cfg!(debug_assertions) {
                    self.verify_checked(&reqs, new_pages);
                }
                self.ensure_free_within(new_pages, len)?;
            }
            None if self.free.released_len() > 0 && len > self.free.free_len() => {
                let new_pages = self.validate_decode(&reqs)?;
                self.merge_or_oom(new_pages)?;
            }
            None => {}
        }
        let start = out.len();
        out.resize(start + len, 0);
        let (state, fill, free) = (&mut self.state[..], &mut self.fill[..], self.free.heads());
        let slots = &mut out[start..];
        let pass = match (self.geometry.specialised(), checked.is_some()) {
            (Specialised::PowerOfTwo(math), true) => {
                decode_pass::<_, _, true>(math, state, fill, free, &mut reqs, slots)
            }
            (Specialised::AnySize(math), true) => {
                decode_pass::<_, _, true>(math, state, fill, free, &mut reqs, slots)
            }
            (Specialised::PowerOfTwo(math), false) => {
                decode_pass::<_, _, false>(math, state, fill, free, &mut reqs, slots)
            }
            (Specialised::AnySize(math), false) => {
                decode_pass::<_, _, false>(math, state, fill, free, &mut reqs, slots)
            }
        };
        if pass.valid && pass.new_pages <= self.free.free_len() {
            for page in self.free.take_front(pass.new_pages) {
                self.state[page as usize] = PageState::Held;
            }
            match checked {
                Some(declared) => {
                    assert_eq!(
                        pass.new_pages, declared,
                        "a checked decode batch opened another number of pages than it declared"
                    );
                }
                None => self.settle_decode(&out[start..]),
            }
            return Ok(());
        }
        out.truncate(start);
        self.decode_refused(reqs, pass, out)
    }

    /// Turns the pages a valid pass of caller-given shapes marked back to `Held` and records
    /// each new slot in its page's fill mark: the page of each slot of `slots` is a page the
    /// pass marked or a claimed one, so one store of each per request does it.
    #[inline]
    fn settle_decode(&mut self, slots: &[KvSlot]) {
        for &slot in slots {
            let page = self.geometry.page_of(slot);
            self.state[page] = PageState::Held;
            self.fill[page] = fill_mark(slot);
        }
    }

    /// The rare outcomes of a pass of caller-given shapes, which left `out` as it was: the first
    /// invalid request's typed error, out of memory, or, in `need_sort` mode, a merge of the
    /// release list and the decode again.
    #[cold]
    #[inline(never)]
    fn decode_refused<D: DecodeRequests>(
        &mut self,
        reqs: D,
        pass: DecodePass,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        let last_locs = (0..reqs.len()).map(|request| reqs.shape(request).last_loc);
        unmark_pages(self.geometry, &mut self.state, last_locs);
        if !pass.valid {
            self.validate_decode(&reqs)?;
            unreachable!("the decode pass rejected a batch that validate_decode accepts")
        }
        self.merge_or_oom(pass.new_pages)?;
        self.decode(reqs, out)
    }

    /// Checks every request of a decode batch without changing anything: the first invalid
    /// request's typed error (the fill marks checked last, once every request passed the other
    /// checks), or the pages the batch opens.
    fn validate_decode<D: DecodeRequests>(&self, reqs: &D) -> Result<usize, AllocError> {
        let geometry = self.geometry;
        let mut continued = ContinuedPages::default();
        let mut opening = 0;
        for request in 0..reqs.len() {
            let DecodeShape { seq_len, last_loc } = reqs.shape(request);
            let opens = check_decode(geometry, &self.state, request, seq_len, last_loc)?;
            if opens {
                opening += 1;
            } else {
                continued.note(geometry.page_size(), request, last_loc)?;
            }
        }
        for request in 0..reqs.len() {
            check_latest(geometry, &self.fill, request, reqs.shape(request).last_loc)?;
        }
        Ok(opening)
    }

    /// Panics unless the checked batch `reqs` keeps its promise: every request passes the
    /// checks of [`Self::validate_decode`] and `new_pages` of them open a page. A failure is a
    /// bug of the batch flow.
    #[cold]
    #[inline(never)]
    fn verify_checked<D: DecodeRequests>(&self, reqs: &D, new_pages: usize) {
        match self.validate_decode(reqs) {
            Ok(opening) => assert_eq!(
                opening, new_pages,
                "a checked decode batch declared the wrong number of new pages"
            ),
            Err(error) => panic!("a checked decode batch fails its checks: {error}"),
        }
    }
}
