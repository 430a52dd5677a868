//! Per-layer K/V data pools (sglang `MHATokenToKVPool`): the [`KvPool`] backend interface and its
//! host implementation [`HostKvPool`]. The CUDA implementation lives in the `kvown-cuda` crate.
//!
//! A pool stores, per layer, a K and a V buffer of [`KvLayout::slots`] rows in NHD layout (a row
//! holds every KV head of one token). Rows are addressed by [`KvSlot`], the values the allocators
//! in [`crate::alloc`] hand out. Every call validates all its inputs before it writes, so a call
//! that returns `Err` leaves the pool unchanged.
//!
//! ```
//! use kvown_runtime::kv::{HostKvPool, KvData, KvLayout, KvPool, KvSlice};
//!
//! // 2 layers, 1 KV head of 4 elements, 8 slots of capacity in pages of 4 (+ the padding page).
//! let mut pool = HostKvPool::<f32>::new(KvLayout::new(2, 1, 4, 8, 4).unwrap()).unwrap();
//! let k = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0];
//! let v = [0.5; 8];
//! pool.store_kv(1, &[4, 9], KvSlice::F32(&k), KvSlice::F32(&v)).unwrap();
//! let (k_back, _) = pool.load_kv(1, &[9]).unwrap();
//! assert_eq!(k_back, KvData::F32(vec![5.0, 6.0, 7.0, 8.0]));
//! // Slot 12 is past the pool: a typed error, nothing written.
//! assert!(pool.store_kv(0, &[12], KvSlice::F32(&k[..4]), KvSlice::F32(&v[..4])).is_err());
//! ```

mod digest;
mod element;
mod error;
mod host;
mod layout;
mod transfer;

pub use digest::digest;
pub use element::{KvData, KvDtype, KvElement, KvSlice};
pub use error::{KvPoolError, KvTensor};
pub use host::{HostKvPool, new_host_pool};
pub use layout::KvLayout;
pub use transfer::{KvTransfer, LocalTransfer, SharedPool, TransferError, TransferId};

use crate::ids::{KvSlot, PageId};

/// A backend holding the K and V buffers of every layer.
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::{HostKvPool, KvDtype, KvLayout, KvPool, KvSlice};
///
/// let mut pool = HostKvPool::<f32>::new(KvLayout::new(1, 1, 2, 8, 4)?)?;
/// assert_eq!((pool.dtype(), pool.layout().page_size()), (KvDtype::F32, 4));
/// pool.store_kv(0, &[4, 5], KvSlice::F32(&[1.0, 2.0, 3.0, 4.0]), KvSlice::F32(&[0.0; 4]))?;
/// pool.copy_slots(&[5], &[9])?; // slot 5's rows, every layer, to slot 9
/// pool.copy_pages(&[1], &[2])?; // page 1 (slots 4..8) to page 2 (slots 8..12)
/// let (k, _) = pool.load_kv(0, &[8, 9])?;
/// assert_eq!(k.into_vec::<f32>().unwrap(), [1.0, 2.0, 3.0, 4.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait KvPool: Send {
    /// The pool's shape.
    fn layout(&self) -> &KvLayout;

    /// The element type of every buffer.
    fn dtype(&self) -> KvDtype;

    /// Writes one K row and one V row per slot into `layer` (sglang `set_kv_buffer`):
    /// `K[layer][slots[t]] = k[t]`, same for V. `k` holds `slots.len()` rows of
    /// `kv_heads * head_dim`, `v` rows of `kv_heads * v_head_dim`, both of the pool's dtype.
    /// A repeated slot (padding slot 0) gets backend-defined data: the host writes the last of
    /// its rows, a device writes them in parallel, word by word, so the slot may hold a mix.
    fn store_kv(
        &mut self,
        layer: usize,
        slots: &[KvSlot],
        k: KvSlice<'_>,
        v: KvSlice<'_>,
    ) -> Result<(), KvPoolError>;

    /// Reads the K and V rows of `slots` in `layer`, in slot-list order. The host pool fails
    /// with [`KvPoolError::HostRowsOutOfMemory`] when host memory cannot hold them.
    fn load_kv(&self, layer: usize, slots: &[KvSlot]) -> Result<(KvData, KvData), KvPoolError>;

    /// Copies the K and V rows of `src[i]` to `dst[i]` in every layer (sglang `move_kv_cache`).
    /// All rows are read before any is written, so `src` and `dst` may overlap. A destination
    /// named twice gets backend-defined data, as a repeated slot of [`KvPool::store_kv`]. The
    /// host pool takes its scratch for the rows first: when host memory cannot hold it the call
    /// fails with [`KvPoolError::HostRowsOutOfMemory`] and copies nothing.
    fn copy_slots(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError>;

    /// Copies whole pages `src[i]` to `dst[i]` in every layer (copy-on-write of a shared last
    /// page, retraction). Same read-before-write guarantee, and the same caveat for a destination
    /// named twice, as [`KvPool::copy_slots`].
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
