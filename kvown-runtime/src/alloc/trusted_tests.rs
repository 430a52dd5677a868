//! [`KvAllocator::alloc_decode_trusted`] (a batch the batch flow checked) against
//! [`KvAllocator::alloc_decode_table`] (every request checked): on valid batches of distinct
//! held rows in any order, both give the same result, `out`, table and allocator, over page
//! sizes 1, 3 and 16, with and without `need_sort`, out of memory included. Debug builds reject
//! a batch that breaks the promise. (A unit test: only this crate can build the trusted batch.)

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/common/held_rows.rs"]
mod held_rows;

use held_rows::held_rows;
use proptest::prelude::*;

use super::{DecodeRow, KvAllocator, KvSlot, PagedAllocator, TokenAllocator, TrustedDecodeRows};
use crate::slots::ReqToTokenPool;

/// Rows of the table; every one is held.
const ROWS: usize = 6;

/// Runs each batch (an order of the rows; rows that cannot decode are left out) through the
/// trusted and the checked path side by side.
fn run<A>(
    allocator: A,
    width: usize,
    lens: &[usize],
    batches: &[Vec<usize>],
) -> Result<(), TestCaseError>
where
    A: KvAllocator + Clone + PartialEq + std::fmt::Debug,
{
    let mut trusted = allocator;
    let (mut table, mut row_lens) = held_rows(&mut trusted, ROWS, width, lens);
    let mut checked = trusted.clone();
    let mut checked_table = table.clone();
    for order in batches {
        let reqs: Vec<DecodeRow> = order
            .iter()
            .map(|&row| DecodeRow {
                row,
                len: row_lens[row],
            })
            .filter(|req| (1..width).contains(&req.len))
            .collect();
        let new_pages = reqs
            .iter()
            .filter(|req| req.len % trusted.page_size() == 0)
            .count();
        let (table_before, allocator_before) = (table.clone(), trusted.clone());
        let mut out = vec![7];
        let batch = TrustedDecodeRows::new(reqs.iter().copied(), new_pages);
        let result = trusted.alloc_decode_trusted(batch, &mut table, &mut out);
        let mut checked_out = vec![7];
        let checked_result =
            checked.alloc_decode_table(reqs.iter().copied(), &mut checked_table, &mut checked_out);
        prop_assert_eq!(&result, &checked_result);
        prop_assert_eq!(&out, &checked_out);
        prop_assert_eq!(&table, &checked_table);
        prop_assert_eq!(&trusted, &checked);
        match result {
            Ok(()) => {
                for req in &reqs {
                    row_lens[req.row] += 1;
                }
            }
            Err(error) => {
                prop_assert_eq!(&table, &table_before, "{}", error);
                prop_assert_eq!(&trusted, &allocator_before, "{}", error);
                prop_assert_eq!(&out, &vec![7]);
            }
        }
    }
    Ok(())
}

/// Pool pages, `need_sort`, the rows' starting lengths (`0..width`), and the batches (each an
/// order of some of the rows).
fn scenario(width: usize) -> impl Strategy<Value = (usize, bool, Vec<usize>, Vec<Vec<usize>>)> {
    let order = Just((1..=ROWS).collect::<Vec<_>>())
        .prop_shuffle()
        .prop_flat_map(|rows| (0..=ROWS).prop_map(move |n| rows[..n].to_vec()));
    (
        3usize..24,
        any::<bool>(),
        prop::collection::vec(0..width, ROWS),
        prop::collection::vec(order, 1..12),
    )
}

proptest! {
    #![proptest_config(common::proptest_config())]

    #[test]
    fn trusted_decode_matches_the_checked_path_page_size_1(
        (pages, need_sort, lens, batches) in scenario(6)
    ) {
        run(TokenAllocator::new(pages, need_sort).unwrap(), 6, &lens, &batches)?;
    }

    #[test]
    fn trusted_decode_matches_the_checked_path_page_size_3(
        (pages, need_sort, lens, batches) in scenario(14)
    ) {
        run(PagedAllocator::new(pages * 3, 3, need_sort).unwrap(), 14, &lens, &batches)?;
    }

    #[test]
    fn trusted_decode_matches_the_checked_path_page_size_16(
        (pages, need_sort, lens, batches) in scenario(66)
    ) {
        run(PagedAllocator::new(pages * 16, 16, need_sort).unwrap(), 66, &lens, &batches)?;
    }
}

/// A pool of 8 pages of 4 and a table whose rows 1..=6 hold 3 tokens each (rows 1 and 2 in
/// pages 1 and 2, ...), and the trusted batch of rows `rows` at length 3.
fn small(rows: &[usize]) -> (PagedAllocator, ReqToTokenPool, Vec<DecodeRow>) {
    let mut allocator = PagedAllocator::new(32, 4, false).unwrap();
    let (table, _) = held_rows(&mut allocator, ROWS, 8, &[3; ROWS]);
    let reqs = rows.iter().map(|&row| DecodeRow { row, len: 3 }).collect();
    (allocator, table, reqs)
}

#[test]
fn trusted_decode_continues_each_page() {
    let (mut allocator, mut table, reqs) = small(&[2, 1]);
    let mut out = Vec::new();
    let batch = TrustedDecodeRows::new(reqs.iter().copied(), 0);
    allocator
        .alloc_decode_trusted(batch, &mut table, &mut out)
        .unwrap();
    let last: Vec<KvSlot> = [2, 1]
        .iter()
        .map(|&row| table.row(row).unwrap()[2])
        .collect();
    assert_eq!(out, [last[0] + 1, last[1] + 1]);
    assert_eq!(table.row(2).unwrap()[3], out[0]);
    allocator.check().unwrap();
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "a trusted decode batch fails its checks")]
fn debug_builds_reject_a_trusted_batch_that_repeats_a_row() {
    let (mut allocator, mut table, reqs) = small(&[1, 1]);
    let batch = TrustedDecodeRows::new(reqs.iter().copied(), 0);
    let _ = allocator.alloc_decode_trusted(batch, &mut table, &mut Vec::new());
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "declared the wrong number of new pages")]
fn debug_builds_reject_a_trusted_batch_with_the_wrong_page_count() {
    let (mut allocator, mut table, reqs) = small(&[1]);
    let batch = TrustedDecodeRows::new(reqs.iter().copied(), 1);
    let _ = allocator.alloc_decode_trusted(batch, &mut table, &mut Vec::new());
}
