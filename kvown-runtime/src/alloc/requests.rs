//! [`DecodeRequests`]: the requests of one decode step as [`KvAllocator::alloc_decode`]
//! reads them, given by their shapes or by the batch flow's checked rows.
//!
//! [`KvAllocator::alloc_decode`]: super::KvAllocator::alloc_decode

use super::{DecodeShape, KvSlot};

/// One request of a decode batch, as an allocator reads it in [`DecodeRequests::assign`]: how
/// many tokens it stores and its last stored slot, which for a request in a table is read from
/// its row only when asked.
///
/// # Examples
///
/// ```
/// use kvown_runtime::alloc::{DecodeRequests, DecodeShape};
///
/// let shape = DecodeShape { seq_len: 5, last_loc: 7 };
/// let mut seen = Vec::new();
/// (&[shape]).assign(&mut [0], |req| {
///     seen.push((req.stored(), req.last_loc(), req.shape()));
///     8
/// });
/// assert_eq!(seen, [(4, 7, shape)], "the new token goes to position 4");
/// ```
#[derive(Debug, Clone, Copy)]
pub struct DecodeRequest<'a> {
    stored: usize,
    slots: &'a [KvSlot],
    /// One past the index of the last slot in `slots`.
    end: usize,
}

impl<'a> DecodeRequest<'a> {
    /// A request storing `stored` tokens whose last slot is `slots[end - 1]`.
    #[inline(always)]
    pub(crate) fn new(stored: usize, slots: &'a [KvSlot], end: usize) -> Self {
        DecodeRequest { stored, slots, end }
    }

    /// A request given by its shape.
    #[inline(always)]
    fn of(shape: &'a DecodeShape) -> Self {
        let stored = shape.seq_len.wrapping_sub(1);
        DecodeRequest::new(stored, std::slice::from_ref(&shape.last_loc), 1)
    }

    /// Tokens stored before the step: the new token's position (`seq_len - 1`; `usize::MAX`
    /// for a malformed shape of `seq_len` 0).
    #[inline(always)]
    pub fn stored(self) -> usize {
        self.stored
    }

    /// The slot of the last stored token.
    #[inline(always)]
    pub fn last_loc(self) -> KvSlot {
        self.slots[self.end.wrapping_sub(1)]
    }

    /// The request's shape.
    pub fn shape(self) -> DecodeShape {
        DecodeShape {
            seq_len: self.stored.wrapping_add(1),
            last_loc: self.last_loc(),
        }
    }
}

/// Seals [`DecodeRequests`] and [`DecodeStep`](crate::cache::DecodeStep): only this crate says
/// which batches are checked, and which steps record every write.
pub trait Sealed {}

/// The requests of one decode step: the [`DecodeShape`]s a caller gives (a slice, an array or
/// a `Vec` of them), or the rows of a batch the batch flow has checked (`prepare_for_decode`),
/// whose shapes it reads from the request-to-token table and whose rows it writes the new slots
/// to. Sealed: an allocator may trust a batch that says it is checked.
///
/// An allocator reads the shapes ([`DecodeRequests::shape`]), decides every slot, and hands
/// them out with [`DecodeRequests::assign`] once the batch cannot fail.
///
/// # Examples
///
/// ```
/// use kvown_runtime::alloc::{DecodeRequests, DecodeShape};
///
/// // What an allocator's decode sees of caller-given shapes.
/// let shapes = [DecodeShape { seq_len: 5, last_loc: 7 }, DecodeShape { seq_len: 9, last_loc: 20 }];
/// let mut reqs = &shapes;
/// assert_eq!((DecodeRequests::len(&reqs), DecodeRequests::is_empty(&reqs)), (2, false));
/// assert_eq!(reqs.shape(1), shapes[1]);
/// assert_eq!(reqs.checked_new_pages(), None, "not checked by the batch flow: check each");
/// let mut out = [0; 2];
/// reqs.assign(&mut out, |req| req.last_loc() + 1); // the slot after the last, say
/// assert_eq!(out, [8, 21]);
/// ```
pub trait DecodeRequests: Sealed {
    /// Requests in the batch.
    fn len(&self) -> usize;

    /// Whether the batch has no request.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Request `request`'s shape (`request < len()`).
    fn shape(&self, request: usize) -> DecodeShape;

    /// For a batch the batch flow checked, the pages its new tokens open: every request holds
    /// its own row, its `last_loc` is the last slot handed out in its page and its length
    /// fits, so the allocator may skip the per-request checks (debug builds verify them). `None`
    /// for shapes a caller gave, which the allocator checks.
    fn checked_new_pages(&self) -> Option<usize>;

    /// Hands every request, in batch order, to `slot_for`, and stores the slot it returns in
    /// `out[request]` (`out.len() == len()`) and, for a checked batch, in the request's row.
    /// Called once per allocation: for a checked batch, only when nothing can fail any more.
    fn assign(&mut self, out: &mut [KvSlot], slot_for: impl FnMut(DecodeRequest<'_>) -> KvSlot);
}

/// Shapes a caller gave, in a slice, an array or a `Vec`.
macro_rules! shape_lists {
    ($([$($param:tt)*] $list:ty;)*) => {$(
        impl<$($param)*> Sealed for $list {}

        impl<$($param)*> DecodeRequests for $list {
            #[inline]
            fn len(&self) -> usize {
                <[DecodeShape]>::len(&self[..])
            }

            #[inline]
            fn shape(&self, request: usize) -> DecodeShape {
                self[request]
            }

            #[inline]
            fn checked_new_pages(&self) -> Option<usize> {
                None
            }

            #[inline]
            fn assign(
                &mut self,
                out: &mut [KvSlot],
                mut slot_for: impl FnMut(DecodeRequest<'_>) -> KvSlot,
            ) {
                for (slot, shape) in out.iter_mut().zip(self.iter()) {
                    *slot = slot_for(DecodeRequest::of(shape));
                }
            }
        }
    )*};
}

shape_lists! {
    ['a] &'a [DecodeShape];
    ['a, const N: usize] &'a [DecodeShape; N];
    ['a] &'a Vec<DecodeShape>;
}
