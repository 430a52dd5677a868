//! [`TableMirror`]: the batch flow's writes to the request-to-token table, for a copy of the
//! table elsewhere.

use crate::alloc::{AllocError, ExtendShape, KvSlot, Sealed};
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
/// ships each step's writes to the GPU) stays equal to it. The batch flow tells it an extend
/// or a row write after the host table and the allocator changed, never for a refused call; a
/// decode step it hands over to run ([`TableMirror::decode`]), so that the mirror sees each
/// write in the allocator's own pass. Every method does nothing more than the batch flow needs
/// by default, and `()`, the mirror of a plain `KvCache<A>`, follows nothing: its calls compile
/// away.
///
/// ```
/// use kvown_runtime::alloc::{AllocError, ExtendShape, KvSlot, PagedAllocator};
/// use kvown_runtime::batch::*;
/// use kvown_runtime::cache::{DecodeDone, DecodeStep, ExtendRow, KvCache, TableMirror, TreeCache};
/// use kvown_runtime::slots::ReqToTokenPool;
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
///
///     fn decode<'o>(&mut self, step: impl DecodeStep<'o>) -> Result<DecodeDone<'o>, AllocError> {
///         let mut written = 0;
///         let done = step.run(|_request, _index| written += 1)?;
///         self.0 += written; // only once the step succeeded
///         Ok(done)
///     }
/// }
///
/// let table = ReqToTokenPool::new(4, 32)?;
/// let allocator = PagedAllocator::new(64, 4, false)?;
/// let mut cache = KvCache::with_mirror(allocator, table, TreeCache::Disabled, Counted(0))?;
/// let prepared = prepare_for_extend(ScheduleBatch::new(vec![Req::new(1, vec![7; 6])]));
/// let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
/// assert_eq!(cache.mirror().0, 6);
/// batch.reqs_mut()[0].push_output(8);
/// let prepared = prepare_for_decode(batch, &cache).map_err(|(_, error)| error)?;
/// alloc_for_decode(prepared, &mut cache).map_err(|failure| failure.error)?;
/// assert_eq!(cache.mirror().0, 7);
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

    /// A decode step: runs `step`, the allocator's pass that hands each request its slot and
    /// writes it to the request's row, telling each write to the recorder it is given as the
    /// write is made ([`DecodeStep::run`]), and returns what the run returned: its
    /// [`DecodeDone`] (which only a run makes, so a mirror cannot skip the step) or its error
    /// unchanged. The writes of a refused step are to be dropped: the allocator refuses before
    /// it writes anything.
    #[inline(always)]
    fn decode<'o>(&mut self, step: impl DecodeStep<'o>) -> Result<DecodeDone<'o>, AllocError> {
        step.run(|_, _| {})
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

/// One decode step's table writes, made as a [`TableMirror`] runs them
/// ([`TableMirror::decode`]): the batch flow's pass over its checked requests, or writes made
/// already ([`WrittenDecode`]). Sealed: a mirror may trust a step to record every write.
pub trait DecodeStep<'o>: Sealed {
    /// The writes the step makes when it succeeds: one per request.
    fn writes(&self) -> usize;

    /// A bound on the flat indices the step writes: the entries of the table it writes
    /// (`rows * max_context_len`), every index below it.
    fn index_bound(&self) -> usize;

    /// Makes the writes, calling `record(request, index)` once for each request
    /// `0..writes()`, in order, with its write's flat index into the table's entries
    /// (`row * max_context_len + position`), and returns the step's `out_cache_loc`
    /// ([`DecodeDone::out`]): `out[request]` is the slot written at that index. A refused step
    /// returns the allocator's error, and whatever `record` saw is no write.
    fn run(self, record: impl FnMut(usize, usize)) -> Result<DecodeDone<'o>, AllocError>;
}

/// A decode step that ran ([`DecodeStep::run`]): what [`TableMirror::decode`] returns, made
/// only by a run, so that a mirror cannot answer a step it did not run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeDone<'o> {
    out: &'o [KvSlot],
}

impl<'o> DecodeDone<'o> {
    /// What a step that wrote `out` returns.
    pub(crate) fn new(out: &'o [KvSlot]) -> DecodeDone<'o> {
        DecodeDone { out }
    }

    /// The step's `out_cache_loc`: each request's new slot, in request order.
    pub fn out(&self) -> &'o [KvSlot] {
        self.out
    }
}

/// A decode step whose writes were made outside the batch flow: `out[i]` at flat index
/// `indices[i]` of the table's entries. It never fails.
///
/// ```
/// use kvown_runtime::cache::{DecodeStep, WrittenDecode};
///
/// let step = WrittenDecode { indices: &[35, 70], out: &[21, 30] };
/// assert_eq!((step.writes(), step.index_bound()), (2, 71));
/// let mut seen = Vec::new();
/// assert_eq!(step.run(|request, index| seen.push((request, index)))?.out(), [21, 30]);
/// assert_eq!(seen, [(0, 35), (1, 70)]);
/// # Ok::<(), kvown_runtime::alloc::AllocError>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrittenDecode<'o> {
    /// Each write's flat index.
    pub indices: &'o [usize],
    /// Each write's slot.
    pub out: &'o [KvSlot],
}

impl Sealed for WrittenDecode<'_> {}

impl<'o> DecodeStep<'o> for WrittenDecode<'o> {
    fn writes(&self) -> usize {
        self.indices.len()
    }

    /// One past the largest index.
    fn index_bound(&self) -> usize {
        self.indices.iter().max().map_or(0, |&index| index + 1)
    }

    fn run(self, mut record: impl FnMut(usize, usize)) -> Result<DecodeDone<'o>, AllocError> {
        for (request, &index) in self.indices.iter().enumerate() {
            record(request, index);
        }
        Ok(DecodeDone::new(self.out))
    }
}
