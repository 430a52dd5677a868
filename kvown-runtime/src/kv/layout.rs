//! Shape of a KV pool and the validation every backend runs before it writes.

use super::element::{KvDtype, KvSlice};
use super::error::{KvPoolError, KvTensor};
use crate::ids::{KvSlot, PageId};
use crate::shared_error::PageOutOfRange;

/// Shape of a KV pool (sglang `MHATokenToKVPool`, NHD layout).
///
/// Each of the `layers` layers has a K buffer of `slots()` rows of `kv_heads * head_dim` elements
/// and a V buffer of `slots()` rows of `kv_heads * v_head_dim`. `slots() = capacity + page_size`:
/// page 0 (slots `0..page_size`) is padding that dummy tokens may write.
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::{KvDtype, KvLayout, KvTensor};
///
/// // 2 layers, 4 KV heads of 8 elements, 64 slots in pages of 16.
/// let layout = KvLayout::new(2, 4, 8, 64, 16)?;
/// assert_eq!((layout.layers(), layout.kv_heads(), layout.head_dim()), (2, 4, 8));
/// assert_eq!((layout.capacity(), layout.page_size()), (64, 16));
/// assert_eq!((layout.slots(), layout.pages()), (80, 5), "the padding page 0 included");
/// assert_eq!(layout.v_head_dim(), 8, "the K head size unless set apart");
/// assert_eq!(layout.row_len(KvTensor::K), 32);
/// assert_eq!(layout.pool_bytes(KvDtype::F32), 2 * 80 * (32 + 32) * 4);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    v_head_dim: usize,
    capacity: usize,
    page_size: usize,
}

impl KvLayout {
    /// A layout with `v_head_dim == head_dim`. Fails when a field is zero, `capacity` is not a
    /// multiple of `page_size`, `capacity + page_size` slots do not fit in a [`KvSlot`], or the
    /// pool's K and V buffers would not fit in the address space (counted at 4 bytes an element,
    /// the widest [`KvDtype`]), so no size computed from a layout overflows.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::KvLayout;
    /// assert!(KvLayout::new(2, 4, 8, 64, 16).is_ok());
    /// assert!(KvLayout::new(2, 4, 8, 60, 16).is_err(), "capacity not whole pages");
    /// assert!(KvLayout::new(0, 4, 8, 64, 16).is_err(), "no layers");
    /// ```
    pub fn new(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
        page_size: usize,
    ) -> Result<Self, KvPoolError> {
        Self::with_v_head_dim(layers, kv_heads, head_dim, head_dim, capacity, page_size)
    }

    /// A layout whose V rows have `v_head_dim` elements per head (MLA-style K/V split).
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::{KvLayout, KvTensor};
    /// let layout = KvLayout::with_v_head_dim(1, 1, 192, 128, 64, 16)?;
    /// assert_eq!((layout.head_dim(), layout.v_head_dim()), (192, 128));
    /// assert_eq!(layout.row_len(KvTensor::V), 128);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn with_v_head_dim(
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        v_head_dim: usize,
        capacity: usize,
        page_size: usize,
    ) -> Result<Self, KvPoolError> {
        let invalid = |reason: String| Err(KvPoolError::InvalidLayout { reason });
        let fields = [
            ("layers", layers),
            ("kv_heads", kv_heads),
            ("head_dim", head_dim),
            ("v_head_dim", v_head_dim),
            ("capacity", capacity),
            ("page_size", page_size),
        ];
        if let Some((name, _)) = fields.iter().find(|(_, value)| *value == 0) {
            return invalid(format!("{name} must be positive"));
        }
        if !capacity.is_multiple_of(page_size) {
            return invalid(format!(
                "capacity {capacity} is not a multiple of page_size {page_size}"
            ));
        }
        let slots = match capacity.checked_add(page_size) {
            Some(slots) if slots <= KvSlot::MAX as usize => slots,
            _ => {
                return invalid(format!(
                    "capacity {capacity} + page_size {page_size} slots exceed the KvSlot range"
                ));
            }
        };
        let widest_element = size_of::<f32>();
        let pool_bytes = kv_heads
            .checked_mul(head_dim.max(v_head_dim))
            .and_then(|row| row.checked_mul(slots))
            .and_then(|buffer| buffer.checked_mul(2 * widest_element))
            .and_then(|layer| layer.checked_mul(layers));
        if pool_bytes.is_none_or(|bytes| bytes > isize::MAX as usize) {
            return invalid(format!(
                "{layers} layers of K and V buffers of {slots} rows of {kv_heads} heads x \
                 {head_dim} / {v_head_dim} elements exceed the address space"
            ));
        }
        Ok(Self {
            layers,
            kv_heads,
            head_dim,
            v_head_dim,
            capacity,
            page_size,
        })
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.layers
    }
    /// KV heads per token.
    pub fn kv_heads(&self) -> usize {
        self.kv_heads
    }
    /// Elements per K head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }
    /// Elements per V head.
    pub fn v_head_dim(&self) -> usize {
        self.v_head_dim
    }
    /// Slots the allocator may hand out (padding page excluded).
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Slots per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }
    /// Rows in every buffer: `capacity + page_size`. Valid slots are `0..slots()`.
    pub fn slots(&self) -> usize {
        self.capacity + self.page_size
    }
    /// Pages in every buffer, the padding page 0 included: `slots() / page_size`.
    pub fn pages(&self) -> usize {
        self.slots() / self.page_size
    }
    /// Elements per row of the given buffer.
    pub fn row_len(&self, tensor: KvTensor) -> usize {
        match tensor {
            KvTensor::K => self.kv_heads * self.head_dim,
            KvTensor::V => self.kv_heads * self.v_head_dim,
        }
    }
    /// Bytes of every layer's K and V buffers with elements of `dtype` (fits: the layout was
    /// checked at the widest dtype).
    pub fn pool_bytes(&self, dtype: KvDtype) -> usize {
        let row = self.row_len(KvTensor::K) + self.row_len(KvTensor::V);
        self.layers * self.slots() * row * dtype.size_bytes()
    }

    /// Checks that `layer` exists.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::KvLayout;
    /// let layout = KvLayout::new(2, 1, 4, 8, 4)?;
    /// assert!(layout.check_layer(1).is_ok());
    /// assert!(layout.check_layer(2).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_layer(&self, layer: usize) -> Result<(), KvPoolError> {
        if layer < self.layers {
            Ok(())
        } else {
            Err(KvPoolError::BadLayer {
                layer,
                layers: self.layers,
            })
        }
    }

    /// Checks that every slot is in `0..slots()`; the error names the first bad one.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::KvLayout;
    /// let layout = KvLayout::new(1, 1, 4, 8, 4)?; // slots 0..12
    /// assert!(layout.check_slots(&[0, 11]).is_ok());
    /// let error = layout.check_slots(&[3, 12]).unwrap_err();
    /// assert!(error.to_string().contains("12"), "{error}");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_slots(&self, slots: &[KvSlot]) -> Result<(), KvPoolError> {
        let limit = self.slots();
        match slots.iter().position(|&slot| slot as usize >= limit) {
            None => Ok(()),
            Some(index) => Err(KvPoolError::SlotOutOfRange {
                index,
                slot: slots[index],
                slots: limit,
            }),
        }
    }

    /// Checks that every page is in `0..pages()`; the error names the first bad one.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::KvLayout;
    /// let layout = KvLayout::new(1, 1, 4, 8, 4)?; // pages 0..3
    /// assert!(layout.check_pages(&[0, 2]).is_ok());
    /// assert!(layout.check_pages(&[3]).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_pages(&self, pages: &[PageId]) -> Result<(), KvPoolError> {
        let limit = self.pages();
        match pages.iter().position(|&page| page as usize >= limit) {
            None => Ok(()),
            Some(index) => Err(KvPoolError::PageOutOfRange {
                index,
                range: PageOutOfRange {
                    page: pages[index],
                    pages: limit,
                },
            }),
        }
    }

    /// Checks one buffer's data: dtype `dtype` and exactly one row per slot.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::{KvDtype, KvLayout, KvSlice, KvTensor};
    /// let layout = KvLayout::new(1, 2, 2, 8, 4)?; // rows of 4 elements
    /// let rows = [0.0f32; 8];
    /// assert!(layout.check_data(KvTensor::K, KvDtype::F32, 2, KvSlice::F32(&rows)).is_ok());
    /// assert!(layout.check_data(KvTensor::K, KvDtype::F32, 3, KvSlice::F32(&rows)).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_data(
        &self,
        tensor: KvTensor,
        dtype: KvDtype,
        rows: usize,
        data: KvSlice<'_>,
    ) -> Result<(), KvPoolError> {
        if data.dtype() != dtype {
            return Err(KvPoolError::DtypeMismatch {
                pool: dtype,
                got: data.dtype(),
            });
        }
        let row_len = self.row_len(tensor);
        // Saturating: no slice holds `usize::MAX` elements, so a product past it never matches.
        let expected = rows.saturating_mul(row_len);
        if data.len() != expected {
            return Err(KvPoolError::DataLength {
                tensor,
                expected,
                got: data.len(),
                rows,
                row_len,
            });
        }
        Ok(())
    }

    /// Everything [`crate::kv::KvPool::store_kv`] validates, in one call.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::{KvDtype, KvLayout, KvSlice};
    /// let layout = KvLayout::new(2, 1, 4, 8, 4)?;
    /// let row = KvSlice::F32(&[1.0; 4]);
    /// assert!(layout.check_store(KvDtype::F32, 1, &[5], row, row).is_ok());
    /// assert!(layout.check_store(KvDtype::F32, 2, &[5], row, row).is_err(), "no layer 2");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_store(
        &self,
        dtype: KvDtype,
        layer: usize,
        slots: &[KvSlot],
        k: KvSlice<'_>,
        v: KvSlice<'_>,
    ) -> Result<(), KvPoolError> {
        self.check_layer(layer)?;
        self.check_slots(slots)?;
        self.check_data(KvTensor::K, dtype, slots.len(), k)?;
        self.check_data(KvTensor::V, dtype, slots.len(), v)
    }

    /// Everything [`crate::kv::KvPool::copy_slots`] validates, in one call.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::KvLayout;
    /// let layout = KvLayout::new(1, 1, 4, 8, 4)?;
    /// assert!(layout.check_copy(&[4, 5], &[8, 9]).is_ok());
    /// assert!(layout.check_copy(&[4, 5], &[8]).is_err(), "lengths differ");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn check_copy(&self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError> {
        if src.len() != dst.len() {
            return Err(KvPoolError::CopyLengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        self.check_slots(src)?;
        self.check_slots(dst)
    }

    /// The slots of `pages`, page by page (`page * page_size + 0..page_size`). Pages are not
    /// checked here; call [`KvLayout::check_pages`] first.
    ///
    /// # Panics
    /// In debug builds, on a page whose slots pass `u32::MAX` (one `check_pages` refuses);
    /// release builds wrap.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::KvLayout;
    /// let layout = KvLayout::new(1, 1, 4, 8, 4)?;
    /// assert_eq!(layout.page_slots(&[2, 1]), [8, 9, 10, 11, 4, 5, 6, 7]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn page_slots(&self, pages: &[PageId]) -> Vec<KvSlot> {
        let page_size = self.page_size as KvSlot;
        pages
            .iter()
            .flat_map(|&page| (0..page_size).map(move |offset| page * page_size + offset))
            .collect()
    }
}
