//! [`TableMirror`]: the batch flow's writes to the request-to-token table, for a copy of the
//! table elsewhere.

use crate::alloc::{ExtendShape, KvSlot};
use crate::slots::ReqRow;

/// One request of an extend, by its place in the request-to-token table
/// ([`TableMirror::extend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtendRow<'a> {
    /// The request's row.
    pub row: ReqRow,
    /// Slots written to positions `[0, prefix.len())` of a new row before its new slots (a
    /// matched prefix); empty for a row the request already holds.
    pub prefix: &'a [KvSlot],
}

/// Follows every write the batch flow makes to a [`KvCache`](super::KvCache)'s
/// request-to-token table, so that a copy of the table (kvown-cuda's `StagedMirror`, which
/// ships each step's writes to the GPU) stays equal to it. The batch flow calls it after the
/// host table and the allocator changed, never for a refused call. Every method does nothing by
/// default, and `()`, the mirror of a plain `KvCache<A>`, follows nothing: its calls compile
/// away.
///
/// ```
/// use kvown_runtime::alloc::{ExtendShape, KvSlot, PagedAllocator};
/// use kvown_runtime::batch::{Req, ScheduleBatch, alloc_for_extend, prepare_for_extend};
/// use kvown_runtime::cache::{ExtendRow, KvCache, TableMirror, TreeCache};
/// use kvown_runtime::slots::{ReqRow, ReqToTokenPool};
///
/// /// Counts the table positions written.
/// #[derive(Default)]
/// struct Counted(usize);
///
/// impl TableMirror for Counted {
///     fn extend<'a>(
///         &mut self,
///         shapes: &[ExtendShape],
///         _rows: impl Iterator<Item = ExtendRow<'a>>,
///         _out: &[KvSlot],
///     ) {
///         self.0 += shapes.iter().map(|shape| shape.seq_len).sum::<usize>();
///     }
/// }
///
/// let table = ReqToTokenPool::new(4, 32)?;
/// let allocator = PagedAllocator::new(64, 4, false)?;
/// let mut cache = KvCache::with_mirror(allocator, table, TreeCache::Disabled, Counted(0))?;
/// let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// assert_eq!(cache.mirror().0, 6);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait TableMirror {
    /// An extend (a prefill, a speculative reservation, a transfer's preallocation) wrote
    /// request `i`'s new slots, its share of `out` in request order, to positions
    /// `[shapes[i].prefix_len, shapes[i].seq_len)` of row `rows[i].row`, after its matched
    /// prefix `rows[i].prefix` at `[0, prefix.len())` for a new row. `out` is the call's
    /// `out_cache_loc`.
    fn extend<'a>(
        &mut self,
        shapes: &[ExtendShape],
        rows: impl Iterator<Item = ExtendRow<'a>>,
        out: &[KvSlot],
    ) {
        let _ = (shapes, rows, out);
    }

    /// A decode step wrote `out[i]` (the step's `out_cache_loc`) at flat index `writes[i]` of
    /// the table's entries (`row * max_context_len + position`).
    fn decode(&mut self, writes: impl ExactSizeIterator<Item = usize>, out: &[KvSlot]) {
        let _ = (writes, out);
    }

    /// The batch flow wrote `slots` to positions `[start_pos, start_pos + slots.len())` of
    /// `row` other than through an allocation (`cache_unfinished_req` pointing a row at the
    /// prefix cache's slots).
    fn row_written(&mut self, row: ReqRow, start_pos: usize, slots: &[KvSlot]) {
        let _ = (row, start_pos, slots);
    }
}

/// No copy of the table: every call does nothing.
impl TableMirror for () {}
