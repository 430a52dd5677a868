//! Errors of the request-to-token pool.

use crate::ids::ReqRow;

/// Why a [`ReqToTokenPool`](super::ReqToTokenPool) call was rejected. The pool is unchanged
/// after any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SlotError {
    /// Fewer free rows than requests to admit. Nothing was assigned.
    #[error(
        "out of request rows: requested {requested}, {available} free; the admission budget \
         let too many requests in (lower the maximum number of running requests)"
    )]
    OutOfRows {
        /// Rows asked for.
        requested: usize,
        /// Rows free.
        available: usize,
    },
    /// Row 0 is the padding row; it is never allocated, freed or written through the pool.
    #[error("row 0 is the padding row and is never allocated, freed or written")]
    ReservedRow,
    /// A row index beyond the table.
    #[error("row {row} is out of range: this pool has rows 1..={size}")]
    RowOutOfRange {
        /// The offending row.
        row: ReqRow,
        /// Rows the pool manages (row 0 excluded).
        size: usize,
    },
    /// `free` of a row that is not held.
    #[error("double free of row {row}: it is not held (already freed, or never handed out)")]
    DoubleFree {
        /// The offending row.
        row: ReqRow,
    },
    /// A write to a row that is not held.
    #[error("row {row} is not held by a request; only held rows can be written")]
    RowNotHeld {
        /// The offending row.
        row: ReqRow,
    },
    /// Positions beyond the row width.
    #[error(
        "positions {start}..{end} of row {row} exceed the row width max_context_len = {row_width}"
    )]
    PositionOutOfRange {
        /// The row written.
        row: ReqRow,
        /// First position written.
        start: usize,
        /// One past the last position written.
        end: usize,
        /// `max_context_len`.
        row_width: usize,
    },
    /// `(size + 1) × max_context_len` entries, or the bookkeeping of `size + 1` rows, do not fit
    /// in the address space, or the system allocator refuses them.
    #[error(
        "a table of {rows} rows × {max_context_len} positions is more than this host can \
         allocate: give it fewer rows or a shorter max_context_len"
    )]
    TableTooLarge {
        /// `size + 1`.
        rows: usize,
        /// Row width.
        max_context_len: usize,
    },
}
