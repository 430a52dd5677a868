//! Errors of the KV data pools. Every failing call leaves the pool unchanged.

use super::element::KvDtype;
use crate::ids::KvSlot;
use crate::shared_error::PageOutOfRange;

/// Which of the two per-layer buffers a length error refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvTensor {
    /// The key buffer (rows of `kv_heads * head_dim`).
    K,
    /// The value buffer (rows of `kv_heads * v_head_dim`).
    V,
}

/// Why a KV pool call was refused. The pool is unchanged whenever one of these is returned.
#[derive(Debug, thiserror::Error)]
pub enum KvPoolError {
    /// A layout field is zero, `capacity` is not a multiple of `page_size`, the slot count does
    /// not fit in a [`KvSlot`], or the buffers would not fit in the address space.
    #[error("invalid KV layout: {reason}")]
    InvalidLayout {
        /// What is wrong with the layout.
        reason: String,
    },
    /// The layer index is past the pool's last layer.
    #[error("layer {layer} out of range: the pool has layers 0..{layers}")]
    BadLayer {
        /// Requested layer.
        layer: usize,
        /// Number of layers in the pool.
        layers: usize,
    },
    /// A slot is outside `0..slots`.
    #[error(
        "slot {slot} (index {index} of the slot list) out of range: valid slots are 0..{slots}"
    )]
    SlotOutOfRange {
        /// Position of the bad slot in the caller's list.
        index: usize,
        /// The bad slot.
        slot: KvSlot,
        /// Rows in each buffer (`capacity + page_size`).
        slots: usize,
    },
    /// A page is outside `0..pages`.
    #[error("page list entry {index}: {range}")]
    PageOutOfRange {
        /// Position of the bad page in the caller's list.
        index: usize,
        /// The bad page, and the pages in each buffer (`slots / page_size`).
        range: PageOutOfRange,
    },
    /// K or V data does not hold exactly one row per slot.
    #[error("{tensor:?} data has {got} elements, expected {expected} ({rows} slots x {row_len})")]
    DataLength {
        /// Which buffer the data is for.
        tensor: KvTensor,
        /// Elements required (`usize::MAX` when `rows x row_len` exceeds it).
        expected: usize,
        /// Elements given.
        got: usize,
        /// Slots in the call.
        rows: usize,
        /// Elements per row.
        row_len: usize,
    },
    /// K or V data given as device bytes does not hold exactly one row per slot.
    #[error("{tensor:?} data has {got} bytes, expected {expected} ({rows} slots x {row_bytes})")]
    DataBytes {
        /// Which buffer the data is for.
        tensor: KvTensor,
        /// Bytes required (`usize::MAX` when `rows x row_bytes` exceeds it).
        expected: usize,
        /// Bytes given.
        got: usize,
        /// Slots in the call.
        rows: usize,
        /// Bytes per row.
        row_bytes: usize,
    },
    /// The data's dtype is not the pool's.
    #[error("dtype mismatch: the pool stores {pool}, the data is {got}")]
    DtypeMismatch {
        /// The pool's dtype.
        pool: KvDtype,
        /// The data's dtype.
        got: KvDtype,
    },
    /// `copy_slots` / `copy_pages` got source and destination lists of different lengths.
    #[error("copy: {src} source entries but {dst} destination entries")]
    CopyLengthMismatch {
        /// Source entries.
        src: usize,
        /// Destination entries.
        dst: usize,
    },
    /// The system allocator refused a host K or V buffer.
    #[error(
        "the host cannot allocate a K/V buffer of {buffer_bytes} bytes ({pool_bytes} bytes for \
         the whole pool): give the pool fewer slots, layers or heads, or a narrower dtype"
    )]
    HostOutOfMemory {
        /// Bytes of the buffer refused (one layer's K or V).
        buffer_bytes: usize,
        /// Bytes of every layer's K and V together.
        pool_bytes: usize,
    },
    /// The system allocator refused the host buffer a call needs for the rows of its slots
    /// (`load_kv`'s result, `copy_slots`' scratch); the call changed nothing.
    #[error(
        "the host cannot allocate {bytes} bytes for {rows} K/V rows: pass fewer slots per call"
    )]
    HostRowsOutOfMemory {
        /// Rows the buffer was for (slots in the call).
        rows: usize,
        /// Bytes refused (`usize::MAX` when `rows x row bytes` exceeds it).
        bytes: usize,
    },
    /// The device backend failed (driver or launch error); see the source.
    #[error("KV backend failure: {0}")]
    Backend(#[source] Box<dyn std::error::Error + Send + Sync>),
}
