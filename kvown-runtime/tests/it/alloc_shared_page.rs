//! Two requests of one batch whose last slots lie in the same partially filled page: the
//! batched `alloc_extend` and `alloc_decode` gave both the page's next slots (one slot handed
//! out twice, or two requests writing one page). Such a batch is refused with
//! [`AllocError::SharedPartialPage`], naming the page and both requests, and changes nothing.
//! Requests whose prefix ends at a page boundary open new pages, so they may share a last page.
//! Across calls the fill marks keep a page's continuation to the request holding its last
//! slot: one that continues from an earlier slot is refused (`AllocError::LastLocNotLatest`).

use kvown_runtime::alloc::{
    AllocError, DecodeRow, DecodeShape, ExtendShape, KvAllocator, KvSlot, PagedAllocator,
    SlotCalls, TokenAllocator,
};
use kvown_runtime::error::OutOfMemory;
use kvown_runtime::slots::ReqToTokenPool;

fn shape(prefix_len: usize, seq_len: usize, last_loc: Option<KvSlot>) -> ExtendShape {
    ExtendShape {
        prefix_len,
        seq_len,
        last_loc,
    }
}

fn decode(seq_len: usize, last_loc: KvSlot) -> DecodeShape {
    DecodeShape { seq_len, last_loc }
}

fn shared(request: usize, last_loc: KvSlot, page: u32, first: usize) -> AllocError {
    AllocError::SharedPartialPage {
        request,
        last_loc,
        page,
        first,
    }
}

/// Page size `page_size`: page 1 handed out up to its second slot (a request's partial last
/// page), page 2 whole.
fn two_pages_held(page_size: usize, need_sort: bool) -> PagedAllocator {
    let mut allocator = PagedAllocator::new(16 * page_size, page_size, need_sort).unwrap();
    let mut out = Vec::new();
    allocator
        .alloc_extend(&[shape(0, 2, None)], &mut out)
        .unwrap();
    allocator.alloc(page_size, &mut out).unwrap();
    allocator
}

/// `call` (an allocation into `out`) fails with `error` and changes neither the allocator nor
/// `out`.
fn refused(
    allocator: &mut PagedAllocator,
    call: impl FnOnce(&mut PagedAllocator, &mut Vec<KvSlot>) -> Result<(), AllocError>,
    error: AllocError,
) {
    let before = allocator.clone();
    let mut out = vec![99];
    assert_eq!(call(allocator, &mut out), Err(error));
    assert_eq!(out, [99]);
    assert_eq!(*allocator, before);
    allocator.check().unwrap();
}

/// `alloc_extend` of `reqs` fails with `error` and changes nothing.
fn extend_refused(allocator: &mut PagedAllocator, reqs: &[ExtendShape], error: AllocError) {
    refused(allocator, |a, out| a.alloc_extend(reqs, out), error);
}

/// `alloc_decode` of `reqs` fails with `error` and changes nothing.
fn decode_refused(allocator: &mut PagedAllocator, reqs: &[DecodeShape], error: AllocError) {
    refused(allocator, |a, out| a.alloc_decode(reqs, out), error);
}

/// The reported case: two requests with 2 tokens in page 1 (slots 4..8), one `last_loc`. Both
/// were given slots 6 and 7.
#[test]
fn extend_refuses_two_requests_in_one_partial_page() {
    let mut allocator = two_pages_held(4, false);
    extend_refused(
        &mut allocator,
        &[shape(2, 4, Some(5)), shape(2, 4, Some(5))],
        shared(1, 5, 1, 0),
    );
    let error = shared(1, 5, 1, 0).to_string();
    assert!(
        error.contains("page 1") && error.contains("request 1") && error.contains("request 0"),
        "{error}"
    );
    // Other last slots of the page (request 1 would be given slot 5, request 2's own), an
    // extend of no token, and the third request against the first.
    extend_refused(
        &mut allocator,
        &[shape(2, 3, Some(5)), shape(1, 3, Some(4))],
        shared(1, 4, 1, 0),
    );
    extend_refused(
        &mut allocator,
        &[shape(2, 2, Some(5)), shape(3, 4, Some(6))],
        shared(1, 6, 1, 0),
    );
    extend_refused(
        &mut allocator,
        &[
            shape(3, 4, Some(6)),
            shape(0, 9, None),
            shape(1, 2, Some(8)),
            shape(1, 6, Some(4)),
        ],
        shared(3, 4, 1, 0),
    );
}

#[test]
fn decode_refuses_two_requests_in_one_partial_page() {
    let mut allocator = two_pages_held(4, false);
    decode_refused(
        &mut allocator,
        &[decode(3, 5), decode(3, 5)],
        shared(1, 5, 1, 0),
    );
    decode_refused(
        &mut allocator,
        &[decode(4, 10), decode(3, 5), decode(5, 7), decode(2, 4)],
        shared(3, 4, 1, 1),
    );
}

/// A request refused for another reason after one marked its page, or a batch out of memory:
/// the marks are undone (the allocator equals its clone, `check` passes).
#[test]
fn other_errors_after_a_marked_page_change_nothing() {
    let mut allocator = two_pages_held(4, false);
    extend_refused(
        &mut allocator,
        &[shape(2, 4, Some(5)), shape(2, 4, Some(13))],
        AllocError::LastLocNotAllocated {
            request: 1,
            last_loc: 13,
        },
    );
    extend_refused(
        &mut allocator,
        &[shape(2, 4, Some(5)), shape(0, 57, None)],
        AllocError::OutOfMemory(OutOfMemory {
            requested: 60,
            available: 56,
            evictable: 0,
        }),
    );
    decode_refused(
        &mut allocator,
        &[decode(3, 5), decode(3, 6)],
        AllocError::LastLocMismatch {
            request: 1,
            last_loc: 6,
            prefix_len: 2,
            page_size: 4,
        },
    );
    let mut full = PagedAllocator::new(8, 4, false).unwrap();
    full.alloc_extend(&[shape(0, 2, None)], &mut Vec::new())
        .unwrap();
    full.alloc(4, &mut Vec::new()).unwrap();
    decode_refused(
        &mut full,
        &[decode(3, 5), decode(5, 11)],
        AllocError::OutOfMemory(OutOfMemory {
            requested: 4,
            available: 0,
            evictable: 0,
        }),
    );
}

/// Requests whose stored tokens end at a page boundary open new pages: they may share a full
/// last page with each other, in one batch or across calls, and with a request continuing its
/// own partial page; no request continues the full page.
#[test]
fn requests_at_a_page_boundary_may_share_a_last_page() {
    let mut allocator = two_pages_held(4, false);
    let mut out = Vec::new();
    allocator
        .alloc_extend(&[shape(4, 5, Some(11)), shape(4, 6, Some(11))], &mut out)
        .unwrap();
    assert_eq!(out, [12, 16, 17]);
    out.clear();
    allocator
        .alloc_extend(&[shape(4, 5, Some(11)), shape(2, 3, Some(5))], &mut out)
        .unwrap();
    assert_eq!(out, [20, 6]);
    allocator.check().unwrap();

    let mut allocator = two_pages_held(4, false);
    // A request continuing the full page from inside it would be handed a slot its holders
    // have: refused.
    decode_refused(
        &mut allocator,
        &[decode(5, 11), decode(3, 9)],
        AllocError::LastLocNotLatest {
            request: 1,
            last_loc: 9,
            page: 2,
            latest: 11,
        },
    );
    let mut out = Vec::new();
    allocator
        .alloc_decode(&[decode(5, 11), decode(3, 5), decode(5, 11)], &mut out)
        .unwrap();
    assert_eq!(out, [12, 6, 16]);
    assert!(allocator.is_page_allocated(1) && allocator.is_page_allocated(2));
    allocator.check().unwrap();
}

/// The case the fill marks close: request B continues request A's partial page from A's last
/// slot (the allocator cannot tell whose page it is, and hands B the next slot), then A decodes
/// from its own last slot, now an earlier one: A would be handed B's slot 9 too, and `check`
/// passes. A's decode is refused, naming the page's last slot, and changes nothing.
#[test]
fn a_continuation_from_a_slot_before_the_pages_last_is_refused() {
    let mut allocator = PagedAllocator::new(64, 4, false).unwrap();
    let mut a = Vec::new();
    allocator
        .alloc_extend(&[shape(0, 5, None)], &mut a)
        .unwrap();
    assert_eq!(a, [4, 5, 6, 7, 8]);
    let mut b = Vec::new();
    allocator
        .alloc_extend(&[shape(5, 6, Some(a[4]))], &mut b)
        .unwrap();
    assert_eq!(b, [9], "B was handed A's next slot: 8 was the page's last");
    let stale = AllocError::LastLocNotLatest {
        request: 0,
        last_loc: 8,
        page: 2,
        latest: 9,
    };
    decode_refused(&mut allocator, &[decode(6, a[4])], stale.clone());
    extend_refused(&mut allocator, &[shape(5, 7, Some(a[4]))], stale.clone());
    // Through a table too, and with an opening request before it in the batch.
    let mut table = ReqToTokenPool::new(4, 8).unwrap();
    let row = table.alloc(1).unwrap()[0];
    table.write(row, 0, &a).unwrap();
    let table_before = table.clone();
    let mut out = vec![99];
    let reqs = std::iter::once(DecodeRow { row, len: 5 });
    assert_eq!(
        allocator.alloc_decode_table(reqs, &mut table, &mut out),
        Err(stale)
    );
    assert_eq!((out, table), (vec![99], table_before));
    // Continuing from the page's last slot still works, for whoever holds it.
    let mut next = Vec::new();
    allocator
        .alloc_decode(&[decode(7, b[0])], &mut next)
        .unwrap();
    assert_eq!(next, [10]);
    allocator.check().unwrap();
}

/// Any page size (3: the division path) and `need_sort`, where a decode that finds its pages
/// only after merging the release list runs its pass twice.
#[test]
fn other_page_sizes_and_need_sort() {
    let mut allocator = two_pages_held(3, false); // pages 1, 2: slots 3..9
    decode_refused(
        &mut allocator,
        &[decode(2, 3), decode(3, 4)],
        shared(1, 4, 1, 0),
    );
    extend_refused(
        &mut allocator,
        &[shape(1, 3, Some(6)), shape(2, 9, Some(7))],
        shared(1, 7, 2, 0),
    );

    // Pages 1..=4: page 1 up to slot 5, page 2 up to slot 10, page 3 whole.
    let mut allocator = PagedAllocator::new(16, 4, true).unwrap();
    let mut held = Vec::new();
    allocator
        .alloc_extend(&[shape(0, 2, None), shape(0, 3, None)], &mut held)
        .unwrap();
    allocator.alloc(8, &mut held).unwrap();
    allocator.free(&held[9..]).unwrap(); // page 4 waits in the release list
    assert_eq!(allocator.free_page_count(), 0);
    decode_refused(
        &mut allocator,
        &[decode(3, 5), decode(5, 15), decode(4, 6)],
        shared(2, 6, 1, 0),
    );
    let mut out = Vec::new();
    allocator
        .alloc_decode(&[decode(3, 5), decode(5, 15), decode(4, 10)], &mut out)
        .unwrap();
    assert_eq!(out, [6, 16, 11]);
    allocator.check().unwrap();
}

/// `alloc_decode_table` reads the shapes from the table and calls `alloc_decode`: two rows
/// whose last slots lie in one partial page are refused there, table and `out` unchanged.
#[test]
fn decode_by_rows_refuses_two_rows_in_one_partial_page() {
    let mut allocator = two_pages_held(4, false);
    let mut table = ReqToTokenPool::new(4, 8).unwrap();
    let rows = table.alloc(2).unwrap();
    table.write(rows[0], 0, &[4, 5]).unwrap();
    table.write(rows[1], 0, &[4, 5]).unwrap();
    let (allocator_before, table_before) = (allocator.clone(), table.clone());
    let reqs = rows.iter().map(|&row| DecodeRow { row, len: 2 });
    let mut out = vec![99];
    assert_eq!(
        allocator.alloc_decode_table(reqs.clone(), &mut table, &mut out),
        Err(shared(1, 5, 1, 0))
    );
    assert_eq!((out, &table), (vec![99], &table_before));
    assert_eq!(allocator, allocator_before);
}

/// Page size 1 has no partial pages: every new token opens its own page, so requests naming
/// one last slot get distinct slots (the allocator has no way to know they conflict, and they
/// take nothing from one another).
#[test]
fn page_size_one_has_no_shared_partial_page() {
    let mut allocator = TokenAllocator::new(16, false).unwrap();
    let mut held = Vec::new();
    allocator.alloc(2, &mut held).unwrap();
    assert_eq!(held, [1, 2]);
    let mut out = Vec::new();
    allocator
        .alloc_decode(&[decode(3, 2), decode(3, 2)], &mut out)
        .unwrap();
    allocator
        .alloc_extend(&[shape(2, 4, Some(2)), shape(2, 3, Some(2))], &mut out)
        .unwrap();
    assert_eq!(out, [3, 4, 5, 6, 7]);
    allocator.check().unwrap();
}
