//! `KvAllocator::alloc_decode_table` (the checked decode by rows) on random tables and batches
//! with invalid requests mixed in: a batch fails exactly when one of its requests is invalid
//! (by the test's own reading of the table) or the pool is short; a success follows the decode
//! rule and writes each new slot into its row; a failure leaves the table, the allocator and
//! `out` exactly as they were. And the batch flow's decode (`alloc_for_decode`, whose allocator
//! trusts the rows `prepare_for_decode` checked and writes them in its pass) against it: the
//! same slots, rows and allocator state, step after step.

use crate::common;
use crate::common::held_rows;

use held_rows::held_rows;
use kvown_runtime::alloc::{
    AllocError, AsPageAllocator, DecodeRow, ExtendShape, KvAllocator, PagedAllocator, SlotCalls,
    TokenAllocator,
};
use kvown_runtime::batch::{
    Req, ScheduleBatch, alloc_for_decode, alloc_for_extend, prepare_for_decode, prepare_for_extend,
};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::error::OutOfMemory;
use kvown_runtime::slots::{ReqRow, ReqToTokenPool};
use proptest::prelude::*;

/// Table rows in every scenario (the pool hands out the last `HELD_ROWS`: rows 1 and 2 stay
/// free, rows 9 and up do not exist).
const TABLE_ROWS: usize = 8;
const HELD_ROWS: usize = 6;

/// One decode request: `pick` names a row (0, free rows and rows past the table included),
/// `tweak` mostly keeps its true length and sometimes breaks it (0 stored tokens, one
/// position too far, the full width).
fn decode_row(pick: usize, tweak: u8, lens: &[usize], width: usize) -> DecodeRow {
    let len = lens.get(pick).copied().unwrap_or(1);
    let len = match tweak {
        0 => 0,
        1 => len + 1,
        2 => width,
        _ => len,
    };
    DecodeRow { row: pick, len }
}

/// Runs `steps` decode batches, each checked against what the test knows of the table.
fn run<A>(allocator: A, width: usize, lens: Vec<usize>, steps: Steps) -> Result<(), TestCaseError>
where
    A: KvAllocator + Clone + PartialEq + std::fmt::Debug,
{
    let mut allocator = allocator;
    let page_size = allocator.page_size();
    let (mut table, mut row_lens) = held_rows(&mut allocator, TABLE_ROWS, width, &lens);
    for batch in steps {
        let reqs: Vec<DecodeRow> = batch
            .iter()
            .map(|&(pick, tweak)| decode_row(pick, tweak, &row_lens, width))
            .collect();
        let mut rows: Vec<ReqRow> = reqs.iter().map(|req| req.row).collect();
        rows.sort_unstable();
        rows.dedup();
        // Valid: each request names a held row once, at its true length, with room after it.
        let valid = rows.len() == reqs.len()
            && reqs.iter().all(|req| {
                table.is_held(req.row)
                    && req.len == row_lens[req.row]
                    && (1..width).contains(&req.len)
            });
        let needed = reqs.iter().filter(|req| req.len % page_size == 0).count() * page_size;
        let (table_before, allocator_before) = (table.clone(), allocator.clone());
        let mut out = vec![7];
        let result = allocator.alloc_decode_table(reqs.iter().copied(), &mut table, &mut out);
        match result {
            Ok(()) => {
                prop_assert!(valid && needed <= allocator_before.available_size());
                prop_assert_eq!(out.len(), 1 + reqs.len());
                for (req, &slot) in reqs.iter().zip(&out[1..]) {
                    let row = table.row(req.row).unwrap();
                    let last = row[req.len - 1];
                    prop_assert_eq!(row[req.len], slot, "{:?}: the row holds the new slot", req);
                    let opens_page = req.len % page_size == 0;
                    prop_assert!(
                        opens_page || slot == last + 1,
                        "{req:?}: {slot} after {last}"
                    );
                    prop_assert!(
                        !opens_page || (slot as usize).is_multiple_of(page_size),
                        "{req:?}: {slot}"
                    );
                }
                prop_assert_eq!(
                    allocator.available_size(),
                    allocator_before.available_size() - needed
                );
                for req in &reqs {
                    row_lens[req.row] += 1;
                }
            }
            Err(error) => {
                match error {
                    AllocError::OutOfMemory(_) => {
                        prop_assert!(valid && needed > allocator_before.available_size());
                    }
                    _ => prop_assert!(!valid, "{}", error),
                }
                prop_assert_eq!(&table, &table_before, "{}", error);
                prop_assert_eq!(&allocator, &allocator_before, "{}", error);
                prop_assert_eq!(&out, &vec![7]);
            }
        }
    }
    Ok(())
}

/// Decode batches of `(pick, tweak)` requests ([`decode_row`]).
type Steps = Vec<Vec<(usize, u8)>>;

/// Pool pages, `need_sort`, the held rows' starting lengths, and the batches.
fn scenario(page_size: usize) -> impl Strategy<Value = (usize, bool, Vec<usize>, Steps)> {
    let width = 4 * page_size + 2;
    (
        3usize..24,
        any::<bool>(),
        prop::collection::vec(0..width, HELD_ROWS),
        prop::collection::vec(
            prop::collection::vec((0usize..TABLE_ROWS + 3, 0u8..24), 1..8),
            1..12,
        ),
    )
}

proptest! {
    #![proptest_config(common::proptest_config())]

    #[test]
    fn decode_by_rows_follows_the_rule_page_size_1((pages, need_sort, lens, steps) in scenario(1)) {
        run(TokenAllocator::new(pages, need_sort).unwrap(), 6, lens, steps)?;
    }

    #[test]
    fn decode_by_rows_follows_the_rule_page_size_3((pages, need_sort, lens, steps) in scenario(3)) {
        run(PagedAllocator::new(pages * 3, 3, need_sort).unwrap(), 14, lens, steps)?;
    }

    #[test]
    fn decode_by_rows_follows_the_rule_page_size_16((pages, need_sort, lens, steps) in scenario(16)) {
        run(PagedAllocator::new(pages * 16, 16, need_sort).unwrap(), 66, lens, steps)?;
    }
}

/// Extends a request of each length in `lens` (in a table of `width` positions), then runs each
/// batch of `batches` (an order of some of the requests) through `prepare_for_decode` /
/// `alloc_for_decode` and, on copies of the allocator and the table from before the step,
/// through `alloc_decode_table`: both succeed or both fail, with the same slots, table and
/// allocator.
fn batch_flow_matches_rows<A>(
    allocator: A,
    width: usize,
    lens: &[usize],
    batches: &[Vec<usize>],
) -> Result<(), TestCaseError>
where
    A: KvAllocator + AsPageAllocator + Clone + PartialEq + std::fmt::Debug,
{
    let table = ReqToTokenPool::new(lens.len(), width).unwrap();
    let mut cache = KvCache::new(allocator, table, TreeCache::Disabled).unwrap();
    let reqs = lens
        .iter()
        .enumerate()
        .map(|(rid, &len)| Req::new(rid as u64, vec![7; len]))
        .collect();
    let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), &mut cache);
    let mut reqs: Vec<Option<Req>> = match batch {
        Ok(batch) => batch.into_reqs().into_iter().map(Some).collect(),
        Err(_) => return Ok(()),
    };
    for order in batches {
        // Requests whose row is full sit the step out.
        let fits = |req: &Option<Req>| {
            req.as_ref()
                .is_some_and(|req| req.kv().kv_allocated_len() + 1 < width)
        };
        let picked: Vec<Req> = order
            .iter()
            .filter_map(|&i| fits(&reqs[i]).then(|| reqs[i].take()).flatten())
            .collect();
        let rows: Vec<DecodeRow> = picked
            .iter()
            .map(|req| DecodeRow {
                row: req.held_row().unwrap(),
                len: req.kv().kv_allocated_len(),
            })
            .collect();
        let before = (cache.allocator().clone(), cache.req_to_token().clone());
        let (mut by_rows, mut table) = before.clone();
        let mut out = Vec::new();
        let rows_result = by_rows.alloc_decode_table(rows.iter().copied(), &mut table, &mut out);
        let mut batch = ScheduleBatch::new(picked);
        for req in batch.reqs_mut() {
            req.push_output(7);
        }
        let prepared = prepare_for_decode(batch, &cache)
            .map_err(|(_, error)| error)
            .unwrap();
        let picked = match alloc_for_decode(prepared, &mut cache) {
            Ok(batch) => {
                prop_assert!(rows_result.is_ok(), "{:?}", rows_result);
                prop_assert_eq!(batch.out_cache_loc(), &out[..]);
                batch.into_reqs()
            }
            Err(failure) => {
                prop_assert!(rows_result.is_err(), "{}", failure.error);
                prop_assert_eq!((&by_rows, &table), (&before.0, &before.1));
                failure.batch.cancel().into_reqs()
            }
        };
        prop_assert_eq!(cache.allocator(), &by_rows);
        prop_assert_eq!(cache.req_to_token(), &table);
        for req in picked {
            let index = req.rid() as usize;
            reqs[index] = Some(req);
        }
        cache.check(reqs.iter().flatten()).unwrap();
    }
    Ok(())
}

/// Pool pages, `need_sort`, six requests' prompt lengths (`1..width`), and the batches (each
/// an order of some of them).
fn flow_scenario(
    width: usize,
) -> impl Strategy<Value = (usize, bool, Vec<usize>, Vec<Vec<usize>>)> {
    let order = Just((0..HELD_ROWS).collect::<Vec<_>>())
        .prop_shuffle()
        .prop_flat_map(|rows| (0..=HELD_ROWS).prop_map(move |n| rows[..n].to_vec()));
    (
        3usize..24,
        any::<bool>(),
        prop::collection::vec(1..width, HELD_ROWS),
        prop::collection::vec(order, 1..12),
    )
}

proptest! {
    #![proptest_config(common::proptest_config())]

    #[test]
    fn the_batch_flows_decode_matches_decode_by_rows_page_size_1(
        (pages, need_sort, lens, batches) in flow_scenario(6)
    ) {
        let allocator = TokenAllocator::new(pages, need_sort).unwrap();
        batch_flow_matches_rows(allocator, 6, &lens, &batches)?;
    }

    #[test]
    fn the_batch_flows_decode_matches_decode_by_rows_page_size_3(
        (pages, need_sort, lens, batches) in flow_scenario(14)
    ) {
        let allocator = PagedAllocator::new(pages * 3, 3, need_sort).unwrap();
        batch_flow_matches_rows(allocator, 14, &lens, &batches)?;
    }

    #[test]
    fn the_batch_flows_decode_matches_decode_by_rows_page_size_16(
        (pages, need_sort, lens, batches) in flow_scenario(66)
    ) {
        let allocator = PagedAllocator::new(pages * 16, 16, need_sort).unwrap();
        batch_flow_matches_rows(allocator, 66, &lens, &batches)?;
    }
}

/// A pool of 4 pages of 4 slots, a table of 4 rows of 8 positions; row 4 holds 3 tokens
/// (page 1), row 3 holds 4 (page 2, full).
fn small() -> (PagedAllocator, ReqToTokenPool) {
    let mut allocator = PagedAllocator::new(16, 4, false).unwrap();
    let mut table = ReqToTokenPool::new(4, 8).unwrap();
    assert_eq!(table.alloc(2).unwrap(), [3, 4]);
    let mut out = Vec::new();
    let shape = |seq_len| ExtendShape {
        prefix_len: 0,
        seq_len,
        last_loc: None,
    };
    allocator
        .alloc_extend(&[shape(3), shape(4)], &mut out)
        .unwrap();
    table.write(4, 0, &out[..3]).unwrap();
    table.write(3, 0, &out[3..]).unwrap();
    (allocator, table)
}

#[test]
fn a_decode_by_rows_writes_each_new_slot_after_the_last() {
    let (mut allocator, mut table) = small();
    let mut out = Vec::new();
    let reqs = [DecodeRow { row: 4, len: 3 }, DecodeRow { row: 3, len: 4 }];
    allocator
        .alloc_decode_table(reqs.into_iter(), &mut table, &mut out)
        .unwrap();
    // Row 4 continues page 1 (slots 4..7); row 3 opens page 3, the next free page.
    assert_eq!(out, [7, 12]);
    assert_eq!(table.row(4).unwrap()[..4], [4, 5, 6, 7]);
    assert_eq!(table.row(3).unwrap()[..5], [8, 9, 10, 11, 12]);
    assert_eq!(allocator.available_size(), 4);
    allocator.check().unwrap();
}

#[test]
fn an_invalid_request_names_itself_and_changes_nothing() {
    let not_held = |row| AllocError::DecodeRowNotHeld { request: 1, row };
    let out_of_range = |len| AllocError::DecodePositionOutOfRange {
        request: 1,
        len,
        width: 8,
    };
    let cases = [
        (DecodeRow { row: 2, len: 1 }, not_held(2), "row 2 is free"),
        (
            DecodeRow { row: 9, len: 1 },
            not_held(9),
            "row 9 is past the table",
        ),
        (
            DecodeRow { row: 4, len: 0 },
            out_of_range(0),
            "no stored token",
        ),
        (DecodeRow { row: 4, len: 8 }, out_of_range(8), "no room"),
    ];
    for (bad, expected, why) in cases {
        let (mut allocator, mut table) = small();
        let (allocator_before, table_before) = (allocator.clone(), table.clone());
        let mut out = vec![1];
        let reqs = [DecodeRow { row: 3, len: 4 }, bad];
        let error = allocator
            .alloc_decode_table(reqs.into_iter(), &mut table, &mut out)
            .unwrap_err();
        assert_eq!(error, expected, "{why}");
        assert_eq!(allocator, allocator_before, "{why}");
        assert_eq!(table, table_before, "{why}");
        assert_eq!(out, [1], "{why}");
    }
}

#[test]
fn a_length_past_the_stored_tokens_reads_an_unallocated_last_slot() {
    let (mut allocator, mut table) = small();
    let table_before = table.clone();
    // Row 4 holds 3 tokens: position 3 was never written (slot 0, the padding page).
    let reqs = [DecodeRow { row: 4, len: 4 }];
    let error = allocator
        .alloc_decode_table(reqs.into_iter(), &mut table, &mut Vec::new())
        .unwrap_err();
    assert_eq!(
        error,
        AllocError::LastLocNotAllocated {
            request: 0,
            last_loc: 0
        }
    );
    assert_eq!(table, table_before);
}

#[test]
fn out_of_memory_changes_no_row() {
    let (mut allocator, mut table) = small();
    // Fill the pool: pages 3 and 4 go to a raw allocation.
    allocator.alloc(8, &mut Vec::new()).unwrap();
    let (allocator_before, table_before) = (allocator.clone(), table.clone());
    // Row 4 continues its page, row 3 needs a new page: none.
    let reqs = [DecodeRow { row: 4, len: 3 }, DecodeRow { row: 3, len: 4 }];
    let error = allocator
        .alloc_decode_table(reqs.into_iter(), &mut table, &mut Vec::new())
        .unwrap_err();
    assert_eq!(
        error,
        AllocError::OutOfMemory(OutOfMemory {
            requested: 4,
            available: 0,
            evictable: 0
        })
    );
    assert_eq!(allocator, allocator_before);
    assert_eq!(table, table_before);
}

#[test]
fn need_sort_merges_the_release_list_when_the_free_list_is_short() {
    let mut allocator = PagedAllocator::new(16, 4, true).unwrap();
    let mut table = ReqToTokenPool::new(1, 8).unwrap();
    let row = table.alloc(1).unwrap()[0];
    let mut out = Vec::new();
    allocator.alloc(16, &mut out).unwrap();
    table.write(row, 0, &out[..4]).unwrap();
    // Pages 2..4 go to the release list; the free list is empty.
    allocator.free(&out[4..]).unwrap();
    let mut decoded = Vec::new();
    allocator
        .alloc_decode_table(
            [DecodeRow { row, len: 4 }].into_iter(),
            &mut table,
            &mut decoded,
        )
        .unwrap();
    // The merge sorts the released pages: page 2 comes first.
    assert_eq!(decoded, [8]);
    assert_eq!(table.row(row).unwrap()[4], 8);
    allocator.check().unwrap();
}

#[test]
fn a_row_named_twice_is_refused_before_anything_changes() {
    let (mut allocator, mut table) = small();
    let (allocator_before, table_before) = (allocator.clone(), table.clone());
    // The second request would read the slot the first one writes.
    let reqs = [
        DecodeRow { row: 4, len: 3 },
        DecodeRow { row: 3, len: 4 },
        DecodeRow { row: 4, len: 4 },
    ];
    let error = allocator
        .alloc_decode_table(reqs.into_iter(), &mut table, &mut Vec::new())
        .unwrap_err();
    assert_eq!(
        error,
        AllocError::DecodeRowRepeated {
            request: 2,
            row: 4,
            first: 0
        }
    );
    assert_eq!(allocator, allocator_before);
    assert_eq!(table, table_before);
}
