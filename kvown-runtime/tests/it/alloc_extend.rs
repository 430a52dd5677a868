//! `alloc_extend` (the three-part rule of sglang's `alloc_extend_kernel`, `mem_cache/allocator/`
//! `paged.py`) and `alloc_decode`, including a worked example, the edge cases of the paged
//! allocator's shapes, many-page requests, mixed decode batches and bad shapes.

use kvown_runtime::alloc::{
    AllocError, DecodeShape, ExtendShape, KvAllocator, KvSlot, PageId, PagedAllocator, SlotCalls,
};
use kvown_runtime::error::OutOfMemory;

/// A paged allocator with every page held except `free`, which is its free list in that order.
/// The page of each slot of `partial` is handed out up to that slot (a request's partial last
/// page, continued from there); every other held page is handed out whole.
fn with_free_list(
    num_pages: usize,
    page_size: usize,
    free: &[PageId],
    partial: &[KvSlot],
) -> PagedAllocator {
    let mut allocator = PagedAllocator::new(num_pages * page_size, page_size, false).unwrap();
    let mut all = Vec::new();
    allocator.alloc(num_pages * page_size, &mut all).unwrap();
    for &page in free.iter().rev() {
        allocator.free(&[page * page_size as KvSlot]).unwrap();
    }
    // The partial pages go back to the head, and one request each takes them again, up to
    // their last slot.
    for &last in partial.iter().rev() {
        allocator.free(&[last]).unwrap();
    }
    for &last in partial {
        let filled = last as usize % page_size + 1;
        let slots = extend(&mut allocator, &[shape(0, filled, None)]);
        assert_eq!(slots.last(), Some(&last));
    }
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), free);
    allocator
}

fn shape(prefix_len: usize, seq_len: usize, last_loc: Option<KvSlot>) -> ExtendShape {
    ExtendShape {
        prefix_len,
        seq_len,
        last_loc,
    }
}

fn extend(allocator: &mut PagedAllocator, reqs: &[ExtendShape]) -> Vec<KvSlot> {
    let mut out = Vec::new();
    allocator
        .alloc_extend(reqs, &mut out)
        .expect("alloc_extend");
    out
}

#[test]
fn worked_example_of_spec_4_5() {
    let mut allocator = with_free_list(10, 4, &[7, 3, 9, 5, 10], &[9]);
    let out = extend(&mut allocator, &[shape(6, 13, Some(9)), shape(0, 5, None)]);
    assert_eq!(out[..7], [10, 11, 28, 29, 30, 31, 12]);
    assert_eq!(out[7..], [36, 37, 38, 39, 20]);
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [10]);
    allocator.check().unwrap();
}

#[test]
fn prefix_zero_takes_only_new_pages() {
    let mut allocator = with_free_list(8, 4, &[6, 2, 8], &[]);
    assert_eq!(
        extend(&mut allocator, &[shape(0, 6, None)]),
        [24, 25, 26, 27, 8, 9]
    );
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [8]);
}

#[test]
fn page_aligned_prefix_has_no_part_one() {
    let mut allocator = with_free_list(8, 4, &[6, 2, 8], &[]);
    assert_eq!(
        extend(&mut allocator, &[shape(4, 9, Some(7))]),
        [24, 25, 26, 27, 8]
    );
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [8]);
}

#[test]
fn prefix_and_seq_in_one_page_use_only_part_one() {
    let mut allocator = with_free_list(8, 4, &[6, 2, 8], &[16]);
    assert_eq!(extend(&mut allocator, &[shape(5, 7, Some(16))]), [17, 18]);
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [6, 2, 8]);
}

#[test]
fn page_aligned_seq_has_no_part_three() {
    let mut allocator = with_free_list(8, 4, &[6, 2, 8], &[13]);
    assert_eq!(
        extend(&mut allocator, &[shape(2, 8, Some(13))]),
        [14, 15, 24, 25, 26, 27]
    );
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [2, 8]);
}

#[test]
fn empty_extend_writes_nothing_and_takes_nothing() {
    let mut allocator = with_free_list(8, 4, &[6, 2, 8], &[16]);
    let before = allocator.clone();
    assert!(extend(&mut allocator, &[shape(5, 5, Some(16)), shape(0, 0, None)]).is_empty());
    assert_eq!(allocator, before);
}

#[test]
fn many_shapes_use_prefix_sum_offsets_and_request_order() {
    let mut allocator = with_free_list(12, 4, &[11, 4, 9, 2, 7, 12, 5], &[14, 25, 32]);
    let reqs = [
        shape(3, 4, Some(14)),
        shape(0, 9, None),
        shape(2, 2, Some(25)),
        shape(5, 12, Some(32)),
        shape(8, 11, Some(43)),
    ];
    let out = extend(&mut allocator, &reqs);
    let expected: Vec<KvSlot> = [
        vec![15],
        vec![44, 45, 46, 47, 16, 17, 18, 19, 36],
        vec![],
        vec![33, 34, 35, 8, 9, 10, 11],
        vec![28, 29, 30],
    ]
    .concat();
    assert_eq!(out, expected);
    let consumed: usize = reqs
        .iter()
        .map(|r| r.seq_len.div_ceil(4) - r.prefix_len.div_ceil(4))
        .sum();
    assert_eq!(consumed, 5);
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [12, 5]);
    allocator.check().unwrap();
}

#[test]
fn a_request_needing_many_pages_is_filled_completely() {
    let page_size = 4;
    let num_pages = 6000;
    let mut allocator = PagedAllocator::new(num_pages * page_size, page_size, false).unwrap();
    let seq_len = 5000 * page_size + 3;
    let out = extend(&mut allocator, &[shape(0, seq_len, None)]);
    let expected: Vec<KvSlot> = (page_size as KvSlot..(seq_len + page_size) as KvSlot).collect();
    assert_eq!(out, expected);
    assert_eq!(allocator.available_size(), (num_pages - 5001) * page_size);
    allocator.check().unwrap();
}

#[test]
fn extend_out_of_memory_changes_nothing() {
    let mut allocator = with_free_list(8, 4, &[6, 2], &[4]);
    let before = allocator.clone();
    let mut out = vec![7];
    assert_eq!(
        allocator.alloc_extend(&[shape(0, 5, None), shape(1, 6, Some(4))], &mut out),
        Err(AllocError::OutOfMemory(OutOfMemory {
            requested: 12,
            available: 8,
            evictable: 0
        }))
    );
    assert_eq!(out, [7]);
    assert_eq!(allocator, before);
}

#[test]
fn bad_extend_shapes_are_typed_and_change_nothing() {
    let mut allocator = with_free_list(8, 4, &[6, 2], &[]);
    let before = allocator.clone();
    let cases = [
        (
            shape(5, 4, Some(16)),
            AllocError::PrefixExceedsSeq {
                request: 1,
                prefix_len: 5,
                seq_len: 4,
            },
        ),
        (
            shape(3, 4, None),
            AllocError::MissingLastLoc {
                request: 1,
                prefix_len: 3,
            },
        ),
        (
            shape(0, 4, Some(16)),
            AllocError::UnexpectedLastLoc {
                request: 1,
                last_loc: 16,
            },
        ),
        (
            shape(3, 4, Some(16)),
            AllocError::LastLocMismatch {
                request: 1,
                last_loc: 16,
                prefix_len: 3,
                page_size: 4,
            },
        ),
        (
            shape(3, 4, Some(10)),
            AllocError::LastLocNotAllocated {
                request: 1,
                last_loc: 10,
            },
        ),
        (
            shape(3, 4, Some(2)),
            AllocError::LastLocNotAllocated {
                request: 1,
                last_loc: 2,
            },
        ),
    ];
    for (bad, error) in cases {
        let mut out = vec![1];
        assert_eq!(
            allocator.alloc_extend(&[shape(0, 4, None), bad], &mut out),
            Err(error)
        );
        assert_eq!(out, [1]);
        assert_eq!(allocator, before);
    }
}

fn decode(seq_len: usize, last_loc: KvSlot) -> DecodeShape {
    DecodeShape { seq_len, last_loc }
}

#[test]
fn decode_opens_a_page_only_when_seq_mod_page_size_is_one() {
    let mut allocator = with_free_list(8, 4, &[6, 2, 8], &[12, 30]);
    let mut out = Vec::new();
    allocator
        .alloc_decode(&[decode(10, 12), decode(13, 19), decode(8, 30)], &mut out)
        .unwrap();
    assert_eq!(out, [13, 24, 31]);
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [2, 8]);
    allocator.check().unwrap();
}

#[test]
fn decode_gives_page_crossers_consecutive_free_pages_in_batch_order() {
    let mut allocator = with_free_list(8, 4, &[6, 2, 8], &[13, 4]);
    let mut out = vec![0];
    allocator
        .alloc_decode(
            &[decode(5, 19), decode(7, 13), decode(9, 31), decode(2, 4)],
            &mut out,
        )
        .unwrap();
    assert_eq!(out, [0, 24, 14, 8, 5]);
    assert_eq!(allocator.free_pages().collect::<Vec<_>>(), [8]);
}

#[test]
fn failing_decode_is_typed_and_changes_nothing() {
    let mut allocator = with_free_list(8, 4, &[6], &[]);
    let before = allocator.clone();
    let cases = [
        (
            decode(1, 4),
            AllocError::DecodeSeqTooShort {
                request: 1,
                seq_len: 1,
            },
        ),
        (
            decode(6, 5),
            AllocError::LastLocMismatch {
                request: 1,
                last_loc: 5,
                prefix_len: 5,
                page_size: 4,
            },
        ),
        (
            decode(5, 27),
            AllocError::LastLocNotAllocated {
                request: 1,
                last_loc: 27,
            },
        ),
        // The largest slot id: its successor does not fit (this overflowed in debug builds).
        (
            decode(6, KvSlot::MAX),
            AllocError::LastLocNotAllocated {
                request: 1,
                last_loc: KvSlot::MAX,
            },
        ),
        (
            decode(5, 7),
            AllocError::OutOfMemory(OutOfMemory {
                requested: 8,
                available: 4,
                evictable: 0,
            }),
        ),
    ];
    for (bad, error) in cases {
        let mut out = vec![3];
        assert_eq!(
            allocator.alloc_decode(&[decode(9, 35), bad], &mut out),
            Err(error)
        );
        assert_eq!(out, [3]);
        assert_eq!(allocator, before);
    }
}
