//! Per-layer K/V data pools (sglang `MHATokenToKVPool`): the [`KvPool`] backend interface and its
//! host implementation [`HostKvPool`]. The CUDA implementation lives in the `kvown-cuda` crate.
//!
//! A pool stores, per layer, a K and a V buffer of [`KvLayout::slots`] rows in NHD layout (a row
//! holds every KV head of one token). Rows are addressed by [`KvSlot`], the values the allocators
//! in [`crate::alloc`] hand out. Every call validates all its inputs before it writes, so a call
//! that returns `Err` leaves the pool unchanged.

mod element;
mod error;
mod host;
mod layout;

pub use element::{KvData, KvDtype, KvElement, KvSlice};
pub use error::{KvPoolError, KvTensor};
pub use host::{HostKvPool, new_host_pool};
pub use layout::KvLayout;

use crate::alloc::{KvSlot, PageId};

/// A backend holding the K and V buffers of every layer.
pub trait KvPool: Send {
    /// The pool's shape.
    fn layout(&self) -> &KvLayout;

    /// The element type of every buffer.
    fn dtype(&self) -> KvDtype;

    /// Writes one K row and one V row per slot into `layer` (sglang `set_kv_buffer`):
    /// `K[layer][slots[t]] = k[t]`, same for V. `k` holds `slots.len()` rows of
    /// `kv_heads * head_dim`, `v` rows of `kv_heads * v_head_dim`, both of the pool's dtype.
    /// With a repeated slot (padding slot 0), which of its rows lands is backend-defined.
    fn store_kv(
        &mut self,
        layer: usize,
        slots: &[KvSlot],
        k: KvSlice<'_>,
        v: KvSlice<'_>,
    ) -> Result<(), KvPoolError>;

    /// Reads the K and V rows of `slots` in `layer`, in slot-list order.
    fn load_kv(&self, layer: usize, slots: &[KvSlot]) -> Result<(KvData, KvData), KvPoolError>;

    /// Copies the K and V rows of `src[i]` to `dst[i]` in every layer (sglang `move_kv_cache`).
    /// All rows are read before any is written, so `src` and `dst` may overlap.
    fn copy_slots(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError>;

    /// Copies whole pages `src[i]` to `dst[i]` in every layer (copy-on-write of a shared last
    /// page, retraction). Same read-before-write guarantee as [`KvPool::copy_slots`].
    fn copy_pages(&mut self, src: &[PageId], dst: &[PageId]) -> Result<(), KvPoolError> {
        if src.len() != dst.len() {
            return Err(KvPoolError::CopyLengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        let layout = *self.layout();
        layout.check_pages(src)?;
        layout.check_pages(dst)?;
        self.copy_slots(&layout.page_slots(src), &layout.page_slots(dst))
    }
}
