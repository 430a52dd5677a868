//! The batched extend and decode rules (sglang `alloc_extend_kernel` / `alloc_decode_kernel`)
//! as CPU code: per-request validation with page counts, and the extend's slot writer.
//!
//! Every page carries a fill mark besides its state: the low 16 bits of its last handed-out
//! slot ([`fill_mark`]), so that a continuation can be checked to start right after that slot.

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use super::geometry::PageGeometry;
use super::{AllocError, DecodeRow, DecodeShape, ExtendShape, KvSlot, PageId, PageState};
use crate::slots::ReqToTokenPool;

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
///
/// # Examples
///
/// ```
/// use kvown_runtime::alloc::ContinuedPages;
///
/// let mut continued = ContinuedPages::default();
/// continued.note(4, 0, 5)?; // request 0 continues page 1 (slots 4..8)
/// continued.note(4, 1, 9)?; // request 1 continues page 2
/// assert!(continued.note(4, 2, 6).is_err(), "request 2 continues page 1 too");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{DecodeRow, DecodeShape};
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut table = ReqToTokenPool::new(4, 16)?;
    /// let rows = table.alloc(2)?;
    /// table.write(rows[0], 0, &[4, 5, 6])?;
    /// table.write(rows[1], 0, &[8])?;
    /// let reqs = [DecodeRow { row: rows[0], len: 3 }, DecodeRow { row: rows[1], len: 1 }];
    /// let shapes = DecodeRow::read_shapes(reqs, &table)?;
    /// assert_eq!(shapes[0], DecodeShape { seq_len: 4, last_loc: 6 });
    /// let twice = [reqs[0], reqs[0]];
    /// assert!(DecodeRow::read_shapes(twice, &table).is_err(), "a row named twice");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::{DecodeRow, DecodeShape};
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut table = ReqToTokenPool::new(4, 16)?;
    /// let row = table.alloc(1)?[0];
    /// table.write(row, 0, &[4, 5])?;
    /// let shape = DecodeRow { row, len: 2 }.shape(&table, 0)?;
    /// assert_eq!(shape, DecodeShape { seq_len: 3, last_loc: 5 });
    /// assert!(DecodeRow { row, len: 16 }.shape(&table, 0).is_err(), "no position 16");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::alloc::ExtendShape;
    /// let continued = ExtendShape { prefix_len: 3, seq_len: 8, last_loc: Some(6) };
    /// assert_eq!(continued.validate(0)?, Some(6), "to check against its page");
    /// let fresh = ExtendShape { prefix_len: 0, seq_len: 8, last_loc: None };
    /// assert_eq!(fresh.validate(0)?, None);
    /// assert!(ExtendShape { prefix_len: 3, seq_len: 2, last_loc: Some(6) }.validate(0).is_err());
    /// assert!(ExtendShape { prefix_len: 3, seq_len: 8, last_loc: None }.validate(0).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
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
/// on error too. Whether its `last_loc` is the last slot handed out in its page is checked
/// after every request passed these ([`check_latest`]). Requests without a prefix do no more for it than before (the test sits in
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

/// `last_loc` must be the last slot handed out in its page, by the page's fill mark
/// ([`AllocError::LastLocNotLatest`]): a continuation from an earlier slot would hand out a
/// slot twice. Checked once every request of the batch passed the other checks, so that a
/// batch's other errors come first.
#[inline]
pub(crate) fn check_latest(
    geometry: PageGeometry,
    fill: &[u16],
    request: usize,
    last_loc: KvSlot,
) -> Result<(), AllocError> {
    let page = geometry.page_of(last_loc);
    let mark = fill.get(page).copied().unwrap_or(0);
    if mark == fill_mark(last_loc) {
        return Ok(());
    }
    Err(AllocError::LastLocNotLatest {
        request,
        last_loc,
        page: page as PageId,
        latest: last_handed(geometry, page as PageId, mark),
    })
}

/// The fill mark of a page whose last handed-out slot is `slot`: its low 16 bits, which tell
/// the slots of a page of up to 2^16 apart (larger pages are told apart modulo 2^16). The slot
/// itself, not the one after it: the decode pass stores the slot it hands out as it is.
#[inline(always)]
pub(crate) fn fill_mark(slot: KvSlot) -> u16 {
    slot as u16
}

/// The last handed-out slot of `page` by its fill `mark`.
pub(crate) fn last_handed(geometry: PageGeometry, page: PageId, mark: u16) -> KvSlot {
    let first = geometry.first_slot(page);
    first + KvSlot::from(mark.wrapping_sub(first as u16))
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
/// new pages off the front of `pages` and marking them held (and its partial last page, which
/// validation marked `Pending`, held again). The three parts of sglang's `alloc_extend_kernel` (`mem_cache/allocator/paged.py`, `alloc_extend_naive`): the rest of the old partial page
/// after `last_loc`, then new full pages in free-list order ([`claim_full_pages`], one pass
/// over their marks and one over their slot runs), then a partial last page.
#[inline]
pub(crate) fn fill_extend(
    geometry: PageGeometry,
    shape: &ExtendShape,
    pages: &mut &[PageId],
    marks: PageMarks<'_>,
    out: &mut Vec<KvSlot>,
) {
    let PageMarks { state, fill } = marks;
    let page_size = geometry.page_size();
    let offset = geometry.offset(shape.prefix_len);
    let extend_len = shape.seq_len - shape.prefix_len;
    let old_page_rest = match shape.last_loc {
        Some(last_loc) if offset != 0 => {
            let page = geometry.page_of(last_loc);
            state[page] = PageState::Held;
            let n1 = (page_size - offset).min(extend_len);
            fill[page] = fill_mark(last_loc + n1 as KvSlot);
            out.extend(last_loc + 1..last_loc + 1 + n1 as KvSlot);
            n1
        }
        _ => 0,
    };
    let rest = extend_len - old_page_rest;
    let tail = geometry.offset(rest);
    let taken = geometry.pages_for(rest).min(pages.len());
    let (mine, others) = pages.split_at(taken);
    *pages = others;
    let (full, last) = mine.split_at(geometry.whole_pages(rest).min(taken));
    claim_full_pages(geometry, full, PageMarks { state, fill }, out);
    if let [page] = *last {
        claim(geometry, page, tail, PageMarks { state, fill }, out);
    }
}

/// Marks `pages` held with every slot handed out, and appends their slot runs in order: the
/// marks in one pass, the runs in another ([`push_slot_runs`]).
#[inline]
fn claim_full_pages(
    geometry: PageGeometry,
    pages: &[PageId],
    marks: PageMarks<'_>,
    out: &mut Vec<KvSlot>,
) {
    let page_size = geometry.page_size() as KvSlot;
    for &page in pages {
        marks.state[page as usize] = PageState::Held;
        marks.fill[page as usize] = fill_mark((page + 1) * page_size - 1);
    }
    push_slot_runs(out, pages, geometry.page_size());
}

/// Appends the slot runs of whole `pages` of `page_size` slots, in order. Runs of the common
/// page sizes (16, 32, 64) are fixed-length arrays written into `out` grown a chunk of 1 KiB at
/// a time: no capacity check per page, and the chunk's zeroes are still in the L1 cache when
/// the runs overwrite them (a larger chunk makes glibc's `memset` a `rep stosb`, which callgrind
/// counts byte by byte). A page size of 1 is the page ids themselves.
#[inline]
pub(crate) fn push_slot_runs(out: &mut Vec<KvSlot>, pages: &[PageId], page_size: usize) {
    fn fixed<const N: usize>(out: &mut Vec<KvSlot>, pages: &[PageId]) {
        const CHUNK_BYTES: usize = 1024;
        let chunk_pages = (CHUNK_BYTES / (N * std::mem::size_of::<KvSlot>())).max(1);
        for chunk in pages.chunks(chunk_pages) {
            let start = out.len();
            out.resize(start + chunk.len() * N, 0);
            let (runs, _) = out[start..].as_chunks_mut::<N>();
            for (run, &page) in runs.iter_mut().zip(chunk) {
                let first = page * N as KvSlot;
                *run = std::array::from_fn(|i| first + i as KvSlot);
            }
        }
    }
    match page_size {
        1 => out.extend_from_slice(pages),
        16 => fixed::<16>(out, pages),
        32 => fixed::<32>(out, pages),
        64 => fixed::<64>(out, pages),
        _ => {
            out.reserve(pages.len() * page_size);
            for &page in pages {
                let first = page * page_size as KvSlot;
                out.extend(first..first + page_size as KvSlot);
            }
        }
    }
}

/// The per-page marks an allocation updates: the states and the fill marks.
pub(crate) struct PageMarks<'a> {
    /// One state per page.
    pub(crate) state: &'a mut [PageState],
    /// One fill mark per page ([`fill_mark`] of its last handed-out slot).
    pub(crate) fill: &'a mut [u16],
}

/// Marks `page` held with its first `len` slots handed out, and appends those.
#[inline]
fn claim(
    geometry: PageGeometry,
    page: PageId,
    len: usize,
    marks: PageMarks<'_>,
    out: &mut Vec<KvSlot>,
) {
    let first = geometry.first_slot(page);
    marks.state[page as usize] = PageState::Held;
    marks.fill[page as usize] = fill_mark(first + len as KvSlot - 1);
    push_slot_run(out, first, len);
}

/// Appends `first..first + len` to `out`. Runs of the common page sizes (16, 32, 64) are
/// written as fixed-length arrays, which compile to a few straight vector stores; other lengths
/// take the range loop.
#[inline(always)]
pub(crate) fn push_slot_run(out: &mut Vec<KvSlot>, first: KvSlot, len: usize) {
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
