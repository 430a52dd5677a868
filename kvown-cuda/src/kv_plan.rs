//! [`KvPlanner`]: the host half of the device KV pool. It validates every call (the checks the
//! host pool runs) and turns it into the exact `kv.cu` launches (kernel width, grid, block and
//! scalar arguments) without touching the device. [`crate::CudaKvPool`] uploads the data and
//! launches them; the host-emulation test runs the same launches through `kv.cu` compiled for
//! the CPU.

use kvown_runtime::alloc::{KvSlot, PageId};
use kvown_runtime::kv::{KvDtype, KvLayout, KvPoolError, KvSlice, KvTensor};

use crate::kernels::WORD_BYTES;

/// Most threads per block of the KV row kernels; longer rows are strided over.
pub const ROW_BLOCK_MAX: u32 = 256;

/// How one tensor's rows are moved: `row_words` words of `WORD_BYTES[word]` bytes, the widest
/// width that divides the row's byte length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowShape {
    /// Index into [`WORD_BYTES`] of the kernel variant (`_w{WORD_BYTES[word]}`).
    pub word: usize,
    /// Words per row: the kernels' `row_words` argument (saturated at `u32::MAX`; rows past
    /// `u32::MAX - ROW_BLOCK_MAX` words are refused by [`KvPlanner::plan_rows`]).
    pub row_words: u32,
    /// Bytes per row.
    pub row_bytes: usize,
}

/// One launch of a `kv.cu` kernel over one buffer of `tensor`, one block per row moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowLaunch {
    /// The tensor whose buffers the launch moves rows of.
    pub tensor: KvTensor,
    /// Kernel width and row size.
    pub shape: RowShape,
    /// Rows moved: the grid's width, and `num_rows` of `store_kv` / `gather_kv`.
    pub rows: u32,
    /// Threads per block: the row's words rounded up to a multiple of 32, from 32 to
    /// [`ROW_BLOCK_MAX`].
    pub threads: u32,
    /// Rows of the pool buffer: the kernels' `num_slots` bound.
    pub num_slots: u32,
}

/// How a validated `copy_pages(src, dst)` runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PageCopy {
    /// The lists overlap: `copy_slots` over the pages' slots (every row read before any write).
    Slots {
        /// Source slots, page by page.
        src: Vec<KvSlot>,
        /// Destination slots, page by page.
        dst: Vec<KvSlot>,
    },
    /// The lists are disjoint: one `copy_pages_wN` launch per buffer, with these launches.
    Pages {
        /// The kernel's `num_pages` argument.
        num_pages: u32,
        /// The kernel's `page_size` argument.
        page_size: u32,
        /// The K launch, then the V launch.
        launches: [RowLaunch; 2],
    },
}

/// The shape and dtype of a device KV pool, and the launches each [`kvown_runtime::kv::KvPool`]
/// call makes. Every `plan_*` changes nothing and returns `Err` exactly where the host pool does
/// (plus the kernels' grid-size and row-length limits), `Ok(None)` when there is nothing to
/// launch.
#[derive(Debug, Clone, Copy)]
pub struct KvPlanner {
    layout: KvLayout,
    dtype: KvDtype,
}

impl KvPlanner {
    /// A planner for a pool of `layout` with elements of `dtype`.
    pub fn new(layout: KvLayout, dtype: KvDtype) -> Self {
        Self { layout, dtype }
    }

    /// The pool's shape.
    pub fn layout(&self) -> &KvLayout {
        &self.layout
    }

    /// The pool's element type.
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    /// How rows of `tensor` are moved.
    pub fn shape(&self, tensor: KvTensor) -> RowShape {
        let row_bytes = self.layout.row_len(tensor) * self.dtype.size_bytes();
        let word = WORD_BYTES
            .iter()
            .position(|&bytes| row_bytes.is_multiple_of(bytes))
            .expect("rows are a whole number of 2-byte elements");
        RowShape {
            word,
            row_words: u32::try_from(row_bytes / WORD_BYTES[word]).unwrap_or(u32::MAX),
            row_bytes,
        }
    }

    /// The K and V launches that move `rows` rows of each tensor (`store_kv_wN`, `gather_kv_wN`
    /// or `copy_pages_wN`); `None` for no rows (a grid cannot be empty).
    pub fn plan_rows(&self, rows: usize) -> Result<Option<[RowLaunch; 2]>, KvPoolError> {
        if rows > i32::MAX as usize {
            return Err(KvPoolError::Backend(
                format!(
                    "{rows} rows in one call exceed the launch limit of {}",
                    i32::MAX
                )
                .into(),
            ));
        }
        // Threads stride over a row's words by up to ROW_BLOCK_MAX in u32: the last step must
        // not wrap.
        for tensor in [KvTensor::K, KvTensor::V] {
            let shape = self.shape(tensor);
            let words = shape.row_bytes / WORD_BYTES[shape.word];
            if words > (u32::MAX - ROW_BLOCK_MAX) as usize {
                return Err(KvPoolError::Backend(
                    format!(
                        "{tensor:?} rows of {words} words of {} bytes exceed the kernels' \
                         32-bit word index",
                        WORD_BYTES[shape.word]
                    )
                    .into(),
                ));
            }
        }
        if rows == 0 {
            return Ok(None);
        }
        let launch = |tensor| {
            let shape = self.shape(tensor);
            RowLaunch {
                tensor,
                shape,
                rows: rows as u32,
                threads: shape
                    .row_words
                    .clamp(32, ROW_BLOCK_MAX)
                    .next_multiple_of(32),
                num_slots: self.layout.slots() as u32,
            }
        };
        Ok(Some([launch(KvTensor::K), launch(KvTensor::V)]))
    }

    /// `store_kv(layer, slots, k, v)`: one `store_kv_wN` launch per tensor.
    pub fn plan_store(
        &self,
        layer: usize,
        slots: &[KvSlot],
        k: KvSlice<'_>,
        v: KvSlice<'_>,
    ) -> Result<Option<[RowLaunch; 2]>, KvPoolError> {
        self.layout.check_store(self.dtype, layer, slots, k, v)?;
        self.plan_rows(slots.len())
    }

    /// `store_kv_device(layer, slots, k, v)` with `rows` device slots and K and V data of
    /// `k_bytes` and `v_bytes` bytes: one `store_kv_wN` launch per tensor. The slots are on the
    /// device, so only the layer and the data lengths (in bytes) are checked.
    pub fn plan_store_device(
        &self,
        layer: usize,
        rows: usize,
        k_bytes: usize,
        v_bytes: usize,
    ) -> Result<Option<[RowLaunch; 2]>, KvPoolError> {
        self.layout.check_layer(layer)?;
        for (tensor, got) in [(KvTensor::K, k_bytes), (KvTensor::V, v_bytes)] {
            let row_bytes = self.shape(tensor).row_bytes;
            // Saturating, as `KvLayout::check_data`: no buffer is `usize::MAX` bytes long.
            let expected = rows.saturating_mul(row_bytes);
            if got != expected {
                return Err(KvPoolError::DataBytes {
                    tensor,
                    expected,
                    got,
                    rows,
                    row_bytes,
                });
            }
        }
        self.plan_rows(rows)
    }

    /// `load_kv(layer, slots)`: one `gather_kv_wN` launch per tensor.
    pub fn plan_load(
        &self,
        layer: usize,
        slots: &[KvSlot],
    ) -> Result<Option<[RowLaunch; 2]>, KvPoolError> {
        self.layout.check_layer(layer)?;
        self.layout.check_slots(slots)?;
        self.plan_rows(slots.len())
    }

    /// `copy_slots(src, dst)`: per buffer, a `gather_kv_wN` of `src` into a temporary, then a
    /// `store_kv_wN` of it to `dst`, with the same launch.
    pub fn plan_copy_slots(
        &self,
        src: &[KvSlot],
        dst: &[KvSlot],
    ) -> Result<Option<[RowLaunch; 2]>, KvPoolError> {
        self.layout.check_copy(src, dst)?;
        self.plan_rows(src.len())
    }

    /// `copy_pages(src, dst)`: the one-pass page kernel when the lists are disjoint, otherwise
    /// `copy_slots` over the pages' slots.
    pub fn plan_copy_pages(
        &self,
        src: &[PageId],
        dst: &[PageId],
    ) -> Result<Option<PageCopy>, KvPoolError> {
        if src.len() != dst.len() {
            return Err(KvPoolError::CopyLengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        self.layout.check_pages(src)?;
        self.layout.check_pages(dst)?;
        // Sorted, not a flag per pool page: the cost follows the pages copied, not the pool.
        let mut sorted_src = src.to_vec();
        sorted_src.sort_unstable();
        if dst
            .iter()
            .any(|page| sorted_src.binary_search(page).is_ok())
        {
            return Ok(Some(PageCopy::Slots {
                src: self.layout.page_slots(src),
                dst: self.layout.page_slots(dst),
            }));
        }
        let page_size = self.layout.page_size();
        Ok(self
            .plan_rows(src.len() * page_size)?
            .map(|launches| PageCopy::Pages {
                num_pages: src.len() as u32,
                page_size: page_size as u32,
                launches,
            }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A grid is at most `i32::MAX` rows wide: that many rows plan two launches, one more is a
    /// typed error, and none plans nothing.
    #[test]
    fn plan_rows_takes_rows_up_to_the_launch_limit() {
        let layout = KvLayout::new(1, 2, 8, 16, 4).unwrap();
        let planner = KvPlanner::new(layout, KvDtype::F16);
        assert!(planner.plan_rows(0).unwrap().is_none());
        let limit = i32::MAX as usize;
        let [k, v] = planner.plan_rows(limit).unwrap().expect("launches");
        assert_eq!((k.tensor, v.tensor), (KvTensor::K, KvTensor::V));
        assert_eq!((k.rows, v.rows), (limit as u32, limit as u32));
        let error = planner.plan_rows(limit + 1).unwrap_err();
        assert!(
            matches!(error, KvPoolError::Backend(_)) && error.to_string().contains("2147483648"),
            "{error}"
        );
    }

    /// A row too long for the kernels' `u32` word index is a typed error, not a launch with
    /// its word count cut to 32 bits (here to 0 words: a store that wrote nothing). The layout
    /// is valid: its two rows of 2^35 f32 elements fit the address space.
    #[test]
    fn rows_past_the_kernels_word_range_are_refused() {
        let layout = KvLayout::new(1, 1 << 35, 1, 1, 1).unwrap();
        let planner = KvPlanner::new(layout, KvDtype::F32);
        let error = planner.plan_rows(1).unwrap_err();
        assert!(
            matches!(error, KvPoolError::Backend(_)) && error.to_string().contains("words"),
            "{error}"
        );
        let error = planner.plan_load(0, &[1]).unwrap_err();
        assert!(matches!(error, KvPoolError::Backend(_)), "{error}");
        // The longest row a kernel thread can stride over without wrapping its index.
        let words = (u32::MAX - ROW_BLOCK_MAX) as usize;
        let fits = KvLayout::new(1, words, 8, 1, 1).unwrap();
        let [k, _] = KvPlanner::new(fits, KvDtype::F16)
            .plan_rows(1)
            .unwrap()
            .expect("launches");
        assert_eq!(k.shape.row_words as usize, words);
        let over = KvLayout::new(1, words + 1, 8, 1, 1).unwrap();
        assert!(KvPlanner::new(over, KvDtype::F16).plan_rows(1).is_err());
    }

    /// Device data is checked and reported in bytes: data a part of an element too long or too
    /// short is refused with its byte count (an element count rounded either way would read
    /// "8 elements, expected 8").
    #[test]
    fn device_data_of_the_wrong_byte_length_is_refused_in_bytes() {
        // Rows of 2 heads x 4 elements: 16 bytes of f16.
        let layout = KvLayout::new(1, 2, 4, 4, 4).unwrap();
        let planner = KvPlanner::new(layout, KvDtype::F16);
        assert!(planner.plan_store_device(0, 1, 16, 16).unwrap().is_some());
        assert!(planner.plan_store_device(0, 0, 0, 0).unwrap().is_none());
        for (k_bytes, v_bytes, tensor, got) in [
            (17, 16, KvTensor::K, 17),
            (15, 16, KvTensor::K, 15),
            (16, 17, KvTensor::V, 17),
        ] {
            let error = planner
                .plan_store_device(0, 1, k_bytes, v_bytes)
                .unwrap_err();
            assert!(
                matches!(
                    error,
                    KvPoolError::DataBytes {
                        tensor: t,
                        expected: 16,
                        got: g,
                        rows: 1,
                        row_bytes: 16
                    } if t == tensor && g == got
                ),
                "{error}"
            );
        }
        assert_eq!(
            planner
                .plan_store_device(0, 1, 17, 16)
                .unwrap_err()
                .to_string(),
            "K data has 17 bytes, expected 16 (1 slots x 16)"
        );
        assert!(matches!(
            planner.plan_store_device(1, 1, 16, 16),
            Err(KvPoolError::BadLayer { layer: 1, .. })
        ));
    }
}
