//! The batched extend and decode rules (sglang `alloc_extend_kernel` / `alloc_decode_kernel`)
//! as CPU code: per-request validation with page counts, and the slot writers.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::free_list::FreeList;
use super::geometry::{PageGeometry, PageMath};
use super::{AllocError, DecodeRow, DecodeShape, ExtendShape, KvSlot, PageId, PageState};
use crate::slots::{ReqToTokenPool, TableEntries};

/// Whether `slot` lies in an allocated page: `Held`, or `Pending` while a batched allocation
/// has marked it as a request's partial last page (see [`mark_partial_page`]). (No page is
/// `Pending` outside a call, and no free is in progress during an allocation.)
#[inline]
fn is_held(state: &[PageState], geometry: PageGeometry, slot: KvSlot) -> bool {
    matches!(
        state.get(geometry.page_of(slot)),
        Some(PageState::Held | PageState::Pending)
    )
}

/// The partially filled pages the requests of one batch continue, each with the first request
/// that continues it: refuses a second one ([`AllocError::SharedPartialPage`]) where page states
/// are not marked (the decode error path, kvown-cuda's planner).
#[derive(Debug, Default)]
pub struct ContinuedPages {
    first: HashMap<PageId, usize>,
}

impl ContinuedPages {
    /// Notes that request `request` continues the page (of `page_size` slots) holding its
    /// `last_loc`; refuses it when an earlier request of the batch continues that page.
    pub fn note(
        &mut self,
        page_size: usize,
        request: usize,
        last_loc: KvSlot,
    ) -> Result<(), AllocError> {
        let page = last_loc / page_size as KvSlot;
        match self.first.entry(page) {
            Entry::Occupied(first) => Err(AllocError::SharedPartialPage {
                request,
                last_loc,
                page,
                first: *first.get(),
            }),
            Entry::Vacant(slot) => {
                slot.insert(request);
                Ok(())
            }
        }
    }
}

/// The partial last page of a validated extend request: the page of its `last_loc` when its
/// prefix does not end at a page boundary (its new slots start in that page), else `None`.
fn partial_page(geometry: PageGeometry, shape: &ExtendShape) -> Option<usize> {
    // The offset first: a prefix at a page boundary costs this one test.
    if geometry.offset(shape.prefix_len) == 0 {
        return None;
    }
    shape.last_loc.map(|last_loc| geometry.page_of(last_loc))
}

/// Marks `page`, the held partial last page of a request being validated, `Pending` for the
/// rest of the batch; `false`, changing nothing, when an earlier request of the batch marked it
/// already. The caller turns every mark back to `Held` before it returns.
#[inline(always)]
fn mark_partial_page(state: &mut [PageState], page: usize) -> bool {
    let marked = &mut state[page];
    if *marked == PageState::Pending {
        return false;
    }
    *marked = PageState::Pending;
    true
}

/// Turns the marks of a batch back to `Held`: every `Pending` page among the pages of
/// `last_locs` (no other page is `Pending` during an allocation). For the error paths.
#[cold]
#[inline(never)]
pub(crate) fn unmark_pages(
    geometry: PageGeometry,
    state: &mut [PageState],
    last_locs: impl Iterator<Item = KvSlot>,
) {
    for last_loc in last_locs {
        if let Some(page @ PageState::Pending) = state.get_mut(geometry.page_of(last_loc)) {
            *page = PageState::Held;
        }
    }
}

impl DecodeRow {
    /// The shapes of a decode batch given by rows, read from `table`; the first request that
    /// [`DecodeRow::shape`] rejects, or that names a row named before
    /// ([`AllocError::DecodeRowRepeated`]), is the error.
    pub fn read_shapes(
        reqs: impl IntoIterator<Item = DecodeRow>,
        table: &ReqToTokenPool,
    ) -> Result<Vec<DecodeShape>, AllocError> {
        let mut first_request = vec![None; table.size() + 1];
        reqs.into_iter()
            .enumerate()
            .map(|(request, req)| {
                let shape = req.shape(table, request)?;
                // `shape` checked that the row is held, so it is in the table.
                match first_request[req.row].replace(request) {
                    Some(first) => Err(AllocError::DecodeRowRepeated {
                        request,
                        row: req.row,
                        first,
                    }),
                    None => Ok(shape),
                }
            })
            .collect()
    }

    /// This request's decode shape, read from `table` (the slot at position `len - 1` of its
    /// row), as request `request` of a batch: [`AllocError::DecodeRowNotHeld`] when no
    /// request holds the row, [`AllocError::DecodePositionOutOfRange`] when `len` is not in
    /// `1..width`.
    pub fn shape(self, table: &ReqToTokenPool, request: usize) -> Result<DecodeShape, AllocError> {
        if !table.is_held(self.row) {
            return Err(AllocError::DecodeRowNotHeld {
                request,
                row: self.row,
            });
        }
        let width = table.max_context_len();
        match table.slot(self.row, self.len.wrapping_sub(1)) {
            Some(last_loc) if self.len < width => Ok(DecodeShape {
                seq_len: self.len + 1,
                last_loc,
            }),
            _ => Err(AllocError::DecodePositionOutOfRange {
                request,
                len: self.len,
                width,
            }),
        }
    }
}

impl ExtendShape {
    /// Checks the shape alone, as request `request` of a batch: `seq_len >= prefix_len`, and a
    /// `last_loc` exactly when there is a prefix. Returns the `last_loc` that a backend must
    /// still check against its pages (`None` for an empty prefix).
    pub fn validate(&self, request: usize) -> Result<Option<KvSlot>, AllocError> {
        let ExtendShape {
            prefix_len,
            seq_len,
            last_loc,
        } = *self;
        if seq_len < prefix_len {
            return Err(AllocError::PrefixExceedsSeq {
                request,
                prefix_len,
                seq_len,
            });
        }
        match (prefix_len, last_loc) {
            (0, None) => Ok(None),
            (0, Some(last_loc)) => Err(AllocError::UnexpectedLastLoc { request, last_loc }),
            (_, None) => Err(AllocError::MissingLastLoc {
                request,
                prefix_len,
            }),
            (_, Some(last_loc)) => Ok(Some(last_loc)),
        }
    }
}

/// Validates request `request` of the extend batch `reqs` and returns its new pages,
/// `ceil(seq/ps) − ceil(pre/ps)`. A request whose prefix ends inside a page marks that page
/// `Pending` ([`mark_partial_page`]), and is refused when an earlier request of the batch
/// marked it ([`AllocError::SharedPartialPage`]); the caller turns the marks back to `Held`,
/// on error too. Requests without a prefix do no more for it than before (the test sits in
/// the branch that checks `last_loc`), those with a page-aligned prefix one test.
#[inline]
pub(crate) fn check_extend(
    geometry: PageGeometry,
    state: &mut [PageState],
    reqs: &[ExtendShape],
    request: usize,
) -> Result<usize, AllocError> {
    let shape = &reqs[request];
    if let Some(last_loc) = shape.validate(request)? {
        check_last_loc(geometry, state, request, last_loc, shape.prefix_len)?;
        if geometry.offset(shape.prefix_len) != 0 {
            let page = geometry.page_of(last_loc);
            if !mark_partial_page(state, page) {
                return Err(shared_partial_page(geometry, reqs, request, page));
            }
        }
    }
    Ok(geometry.pages_for(shape.seq_len) - geometry.pages_for(shape.prefix_len))
}

/// The error of extend request `request` of `reqs`, whose partial last page `page` an earlier
/// request continues: names that first request.
#[cold]
#[inline(never)]
fn shared_partial_page(
    geometry: PageGeometry,
    reqs: &[ExtendShape],
    request: usize,
    page: usize,
) -> AllocError {
    let first = reqs[..request]
        .iter()
        .position(|shape| partial_page(geometry, shape) == Some(page))
        .expect("a page marked by an earlier request");
    AllocError::SharedPartialPage {
        request,
        last_loc: reqs[request]
            .last_loc
            .expect("a partial page has a last_loc"),
        page: page as PageId,
        first,
    }
}

/// Validates request `request` of a decode batch and returns whether it opens a new page.
#[inline]
pub(crate) fn check_decode(
    geometry: PageGeometry,
    state: &[PageState],
    request: usize,
    seq_len: usize,
    last_loc: KvSlot,
) -> Result<bool, AllocError> {
    if seq_len < 2 {
        return Err(AllocError::DecodeSeqTooShort { request, seq_len });
    }
    let stored = seq_len - 1;
    check_last_loc(geometry, state, request, last_loc, stored)?;
    Ok(geometry.offset(stored) == 0)
}

/// What [`fill_decode`] found: whether every request passed [`check_decode`], and how many
/// new pages the batch opens.
pub(crate) struct DecodeFill {
    /// Every request is valid.
    pub(crate) valid: bool,
    /// Requests whose new token opens a page.
    pub(crate) new_pages: usize,
}

impl Default for DecodeFill {
    fn default() -> Self {
        DecodeFill {
            valid: true,
            new_pages: 0,
        }
    }
}

impl DecodeFill {
    /// The decode rule for one request with `stored` tokens whose last one is at `last_loc`
    /// (`well_formed`: its shape passed the checks that need no page state): folds its
    /// validity into `valid` and returns its new slot, the first slot of the next page of
    /// `free` (0 when `free` is short) when the token opens one.
    ///
    /// A request whose token continues its page marks that page `Pending` (from `Held`); a
    /// later request of the batch continuing it too is invalid (the page is shared), one that
    /// opens a new page after it is not. The caller turns the marks back to `Held`.
    #[inline(always)]
    fn next_slot<M: PageMath>(
        &mut self,
        math: M,
        state: &mut [PageState],
        free: &FreeList,
        stored: usize,
        last_loc: KvSlot,
        well_formed: bool,
    ) -> KvSlot {
        let page = math.page_of(last_loc);
        let page_state = state.get(page).copied();
        let offset = math.offset(stored);
        let aligned = math.offset(last_loc as usize + 1) == offset;
        if offset == 0 {
            let held = matches!(page_state, Some(PageState::Held | PageState::Pending));
            self.valid &= well_formed & held & aligned;
            let page = free.peek(self.new_pages);
            self.new_pages += 1;
            page.map_or(0, |page| math.first_slot(page))
        } else {
            // `Pending`: an earlier request of the batch continues this page.
            let own = page_state == Some(PageState::Held);
            self.valid &= well_formed & own & aligned;
            if own {
                state[page] = PageState::Pending;
            }
            // Wrapping: a bogus `last_loc` (up to `KvSlot::MAX`) fails the batch, and its
            // slot is never used.
            last_loc.wrapping_add(1)
        }
    }
}

/// The whole decode rule in one branch-light pass: validates every request as
/// [`check_decode`] does, and that no two requests continue one page, and appends its slot to
/// `out` (the next slot of its page, or the first slot of the next page of `free` when the
/// token opens one). Takes nothing: the caller keeps `out` and claims the first `new_pages`
/// pages of `free` only when the batch is valid and `free` has that many; otherwise it
/// truncates `out` back (the slots written for missing pages are 0). Either way it turns the
/// pages the pass marked `Pending` back to `Held` ([`unmark_decode`], [`unmark_pages`]).
#[inline]
pub(crate) fn fill_decode<M: PageMath>(
    math: M,
    state: &mut [PageState],
    free: &FreeList,
    reqs: impl ExactSizeIterator<Item = DecodeShape>,
    out: &mut Vec<KvSlot>,
) -> DecodeFill {
    let start = out.len();
    out.resize(start + reqs.len(), 0);
    let mut fill = DecodeFill::default();
    for (slot, shape) in out[start..].iter_mut().zip(reqs) {
        let stored = shape.seq_len.wrapping_sub(1);
        *slot = fill.next_slot(
            math,
            state,
            free,
            stored,
            shape.last_loc,
            shape.seq_len >= 2,
        );
    }
    fill
}

/// Turns the marks of a valid decode batch whose new pages were claimed back to `Held`: the
/// page of each of its slots `slots` is a page the pass marked or a claimed one (already
/// `Held`), so one unconditional store per request does it.
#[inline]
pub(crate) fn unmark_decode<M: PageMath>(math: M, state: &mut [PageState], slots: &[KvSlot]) {
    for &slot in slots {
        state[math.page_of(slot)] = PageState::Held;
    }
}

/// The decode rule for a batch the batch flow checked ([`super::TrustedDecodeRows`]): reads
/// each request's last slot from `table`, writes its new slot there and to `out` (the next slot
/// of its page, or the first slot of the next page of `free` when the token opens one, 0 when
/// `free` is short), and returns how many pages it opened. Checks nothing but the bounds of
/// `table`; takes nothing from `free`. `on_write` is told each write's flat table index and
/// slot as it is made (a stager copies the step for the device in this same pass).
#[inline]
pub(crate) fn fill_trusted_decode<M: PageMath>(
    math: M,
    free: &FreeList,
    reqs: impl ExactSizeIterator<Item = DecodeRow>,
    table: TableEntries<'_>,
    out: &mut Vec<KvSlot>,
    mut on_write: impl FnMut(usize, KvSlot),
) -> usize {
    let start = out.len();
    out.resize(start + reqs.len(), 0);
    let TableEntries { entries, width } = table;
    let mut new_pages = 0;
    for (slot, req) in out[start..].iter_mut().zip(reqs) {
        let position = req.row * width + req.len;
        *slot = if math.offset(req.len) == 0 {
            let page = free.peek(new_pages);
            new_pages += 1;
            page.map_or(0, |page| math.first_slot(page))
        } else {
            entries[position - 1] + 1
        };
        entries[position] = *slot;
        on_write(position, *slot);
    }
    new_pages
}

/// `last_loc` must be a slot of an allocated page at the page offset `prefix_len` implies.
#[inline]
fn check_last_loc(
    geometry: PageGeometry,
    state: &[PageState],
    request: usize,
    last_loc: KvSlot,
    prefix_len: usize,
) -> Result<(), AllocError> {
    if !is_held(state, geometry, last_loc) {
        return Err(AllocError::LastLocNotAllocated { request, last_loc });
    }
    if geometry.offset(last_loc as usize + 1) != geometry.offset(prefix_len) {
        return Err(AllocError::LastLocMismatch {
            request,
            last_loc,
            prefix_len,
            page_size: geometry.page_size(),
        });
    }
    Ok(())
}

/// Writes the slots of positions `[prefix_len, seq_len)` of one validated request, taking its
/// new pages from `pages` and marking them held (and its partial last page, which validation
/// marked `Pending`, held again). The three parts of sglang's `alloc_extend_kernel` (`mem_cache/allocator/paged.py`, `alloc_extend_naive`): the rest of the old partial page
/// after `last_loc`, then new full pages in free-list order, then a partial last page.
#[inline]
pub(crate) fn fill_extend(
    geometry: PageGeometry,
    shape: &ExtendShape,
    pages: &mut impl Iterator<Item = PageId>,
    state: &mut [PageState],
    out: &mut Vec<KvSlot>,
) {
    let page_size = geometry.page_size();
    let offset = geometry.offset(shape.prefix_len);
    let extend_len = shape.seq_len - shape.prefix_len;
    let old_page_rest = match shape.last_loc {
        Some(last_loc) if offset != 0 => {
            state[geometry.page_of(last_loc)] = PageState::Held;
            let n1 = (page_size - offset).min(extend_len);
            out.extend(last_loc + 1..last_loc + 1 + n1 as KvSlot);
            n1
        }
        _ => 0,
    };
    let rest = extend_len - old_page_rest;
    let full_pages = geometry.whole_pages(rest);
    if page_size == 1 {
        for page in pages.by_ref().take(full_pages) {
            state[page as usize] = PageState::Held;
            out.push(page);
        }
        return;
    }
    for page in pages.by_ref().take(full_pages) {
        claim(geometry, page, page_size, state, out);
    }
    let tail = geometry.offset(rest);
    if tail > 0
        && let Some(page) = pages.next()
    {
        claim(geometry, page, tail, state, out);
    }
}

/// Marks `page` held and appends its first `len` slots.
#[inline]
fn claim(
    geometry: PageGeometry,
    page: PageId,
    len: usize,
    state: &mut [PageState],
    out: &mut Vec<KvSlot>,
) {
    state[page as usize] = PageState::Held;
    push_slot_run(out, geometry.first_slot(page), len);
}

/// Appends `first..first + len` to `out`. Runs of the common page sizes (16, 32, 64) are
/// written as fixed-length arrays, which compile to a few straight vector stores; other lengths
/// take the range loop.
#[inline(always)]
pub(super) fn push_slot_run(out: &mut Vec<KvSlot>, first: KvSlot, len: usize) {
    fn fixed<const N: usize>(out: &mut Vec<KvSlot>, first: KvSlot) {
        let slots: [KvSlot; N] = std::array::from_fn(|i| first + i as KvSlot);
        out.extend_from_slice(&slots);
    }
    match len {
        16 => fixed::<16>(out, first),
        32 => fixed::<32>(out, first),
        64 => fixed::<64>(out, first),
        _ => out.extend(first..first + len as KvSlot),
    }
}
