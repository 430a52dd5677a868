//! A request-to-token table whose rows hold KV, for the decode-by-rows tests
//! (`alloc_decode_table`).

use kvown_runtime::alloc::{ExtendShape, KvAllocator};
use kvown_runtime::slots::ReqToTokenPool;

/// A table of `rows` rows of `width` positions, the pool's first `lens.len()` rows held, held
/// row `r` extended from 0 to its length in `lens` while `allocator` has room (a row it has no
/// room for stays empty). Returns the table and each row's length, indexed by row.
pub fn held_rows<A: KvAllocator>(
    allocator: &mut A,
    rows: usize,
    width: usize,
    lens: &[usize],
) -> (ReqToTokenPool, Vec<usize>) {
    let mut table = ReqToTokenPool::new(rows, width).unwrap();
    let held = table.alloc(lens.len()).unwrap();
    let mut row_lens = vec![0; rows + 1];
    for (&row, &len) in held.iter().zip(lens) {
        let mut out = Vec::new();
        let shape = ExtendShape {
            prefix_len: 0,
            seq_len: len,
            last_loc: None,
        };
        if allocator.alloc_extend(&[shape], &mut out).is_ok() {
            table.write(row, 0, &out).unwrap();
            row_lens[row] = len;
        }
    }
    (table, row_lens)
}
