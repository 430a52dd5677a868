//! [`CudaKvPool`]: the [`KvPool`] backend with per-layer K and V buffers in device memory.
//!
//! Buffers are raw bytes; the kernels move rows as words of the widest size that divides the
//! row's byte length, so one set of kernels serves f32, f16 and bf16.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DriverError, LaunchConfig, PushKernelArg};
use half::{bf16, f16};
use kvown_runtime::alloc::{KvSlot, PageId};
use kvown_runtime::kv::{KvData, KvDtype, KvLayout, KvPool, KvPoolError, KvSlice, KvTensor};

use crate::detect::CudaDevice;
use crate::kernels::WORD_BYTES;

/// Device-memory KV pool, zero-initialised, NHD layout, any of the three dtypes.
#[derive(Debug)]
pub struct CudaKvPool {
    device: Arc<CudaDevice>,
    layout: KvLayout,
    dtype: KvDtype,
    k: Vec<CudaSlice<u8>>,
    v: Vec<CudaSlice<u8>>,
}

fn backend(error: DriverError) -> KvPoolError {
    KvPoolError::Backend(Box::new(error))
}

fn bytes_of(data: KvSlice<'_>) -> &[u8] {
    match data {
        KvSlice::F32(values) => bytemuck::cast_slice(values),
        KvSlice::F16(values) => bytemuck::cast_slice(values),
        KvSlice::Bf16(values) => bytemuck::cast_slice(values),
    }
}

fn data_from_bytes(dtype: KvDtype, bytes: &[u8]) -> KvData {
    match dtype {
        KvDtype::F32 => KvData::F32(bytemuck::pod_collect_to_vec::<u8, f32>(bytes)),
        KvDtype::F16 => KvData::F16(bytemuck::pod_collect_to_vec::<u8, f16>(bytes)),
        KvDtype::Bf16 => KvData::Bf16(bytemuck::pod_collect_to_vec::<u8, bf16>(bytes)),
    }
}

/// How one tensor's rows are moved: word width index and words per row.
#[derive(Debug, Clone, Copy)]
struct RowShape {
    word: usize,
    row_words: u32,
    row_bytes: usize,
}

impl RowShape {
    fn new(layout: &KvLayout, dtype: KvDtype, tensor: KvTensor) -> Self {
        let row_bytes = layout.row_len(tensor) * dtype.size_bytes();
        let word = WORD_BYTES
            .iter()
            .position(|&bytes| row_bytes.is_multiple_of(bytes))
            .expect("rows are a whole number of 2-byte elements");
        Self {
            word,
            row_words: (row_bytes / WORD_BYTES[word]) as u32,
            row_bytes,
        }
    }

    /// One block per row; threads cover the row's words, a multiple of 32 up to 256.
    fn config(&self, rows: usize) -> LaunchConfig {
        let threads = self.row_words.clamp(32, 256).next_multiple_of(32);
        LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads, 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

/// Rows per launch: grids are at most `i32::MAX` blocks wide.
fn check_rows(rows: usize) -> Result<(), KvPoolError> {
    if rows > i32::MAX as usize {
        return Err(KvPoolError::Backend(
            format!(
                "{rows} rows in one call exceed the launch limit of {}",
                i32::MAX
            )
            .into(),
        ));
    }
    Ok(())
}

/// Launches `store_kv`: `buffer[slots[t]] = rows[t]`. Slots past `num_slots` are skipped.
fn store_rows(
    device: &CudaDevice,
    buffer: &mut CudaSlice<u8>,
    shape: RowShape,
    rows: &CudaSlice<u8>,
    slots: &CudaSlice<u32>,
    num_slots: u32,
) -> Result<(), KvPoolError> {
    let num_rows = slots.len() as u32;
    let mut launch = device
        .stream()
        .launch_builder(&device.kernels.rows[shape.word].store_kv);
    launch
        .arg(buffer)
        .arg(rows)
        .arg(slots)
        .arg(&num_rows)
        .arg(&shape.row_words)
        .arg(&num_slots);
    // SAFETY: arguments match store_kv_wN in kv.cu; callers pass `rows` holding one row of
    // row_words words per slot; the kernel skips slots past the buffer, and buffers are
    // cuMemAlloc'd, so rows of a multiple of N bytes are N-aligned.
    unsafe { launch.launch(shape.config(slots.len())) }.map_err(backend)?;
    Ok(())
}

/// Launches `gather_kv` into a new device array: `out[t] = buffer[slots[t]]`.
fn gather_rows(
    device: &CudaDevice,
    buffer: &CudaSlice<u8>,
    shape: RowShape,
    slots: &CudaSlice<u32>,
    num_slots: u32,
) -> Result<CudaSlice<u8>, KvPoolError> {
    let stream = device.stream();
    let mut out = stream
        .alloc_zeros::<u8>(slots.len() * shape.row_bytes)
        .map_err(backend)?;
    let num_rows = slots.len() as u32;
    let mut launch = stream.launch_builder(&device.kernels.rows[shape.word].gather_kv);
    launch
        .arg(&mut out)
        .arg(buffer)
        .arg(slots)
        .arg(&num_rows)
        .arg(&shape.row_words)
        .arg(&num_slots);
    // SAFETY: arguments match gather_kv_wN in kv.cu; `out` holds one row per slot; slots past
    // the buffer are skipped.
    unsafe { launch.launch(shape.config(slots.len())) }.map_err(backend)?;
    Ok(out)
}

impl CudaKvPool {
    /// A zeroed pool on `device`.
    pub fn new(
        device: Arc<CudaDevice>,
        layout: KvLayout,
        dtype: KvDtype,
    ) -> Result<Self, KvPoolError> {
        let stream = device.stream().clone();
        let buffers = |tensor| -> Result<Vec<CudaSlice<u8>>, KvPoolError> {
            let bytes = layout.slots() * layout.row_len(tensor) * dtype.size_bytes();
            (0..layout.layers())
                .map(|_| stream.alloc_zeros::<u8>(bytes).map_err(backend))
                .collect()
        };
        let k = buffers(KvTensor::K)?;
        let v = buffers(KvTensor::V)?;
        Ok(Self {
            device,
            layout,
            dtype,
            k,
            v,
        })
    }

    fn shape(&self, tensor: KvTensor) -> RowShape {
        RowShape::new(&self.layout, self.dtype, tensor)
    }

    fn num_slots(&self) -> u32 {
        self.layout.slots() as u32
    }

    /// [`KvPool::store_kv`] with slots and rows already on the device (no host copies): the
    /// `store_kv` kernel alone. `k` and `v` must hold one row per slot, as bytes; slots at or
    /// past `layout().slots()` are skipped by the kernel.
    pub fn store_kv_device(
        &mut self,
        layer: usize,
        slots: &CudaSlice<u32>,
        k: &CudaSlice<u8>,
        v: &CudaSlice<u8>,
    ) -> Result<(), KvPoolError> {
        self.layout.check_layer(layer)?;
        let rows = slots.len();
        check_rows(rows)?;
        let element = self.dtype.size_bytes();
        for (tensor, data) in [(KvTensor::K, k), (KvTensor::V, v)] {
            let shape = self.shape(tensor);
            if data.len() != rows * shape.row_bytes {
                return Err(KvPoolError::DataLength {
                    tensor,
                    expected: rows * shape.row_bytes / element,
                    got: data.len() / element,
                    rows,
                    row_len: self.layout.row_len(tensor),
                });
            }
        }
        if rows == 0 {
            return Ok(());
        }
        let (k_shape, v_shape, num_slots) = (
            self.shape(KvTensor::K),
            self.shape(KvTensor::V),
            self.num_slots(),
        );
        store_rows(
            &self.device,
            &mut self.k[layer],
            k_shape,
            k,
            slots,
            num_slots,
        )?;
        store_rows(
            &self.device,
            &mut self.v[layer],
            v_shape,
            v,
            slots,
            num_slots,
        )
    }
}

impl KvPool for CudaKvPool {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn dtype(&self) -> KvDtype {
        self.dtype
    }

    fn store_kv(
        &mut self,
        layer: usize,
        slots: &[KvSlot],
        k: KvSlice<'_>,
        v: KvSlice<'_>,
    ) -> Result<(), KvPoolError> {
        self.layout.check_store(self.dtype, layer, slots, k, v)?;
        check_rows(slots.len())?;
        if slots.is_empty() {
            return Ok(());
        }
        let stream = self.device.stream();
        let device_slots = stream.clone_htod(slots).map_err(backend)?;
        let k = stream.clone_htod(bytes_of(k)).map_err(backend)?;
        let v = stream.clone_htod(bytes_of(v)).map_err(backend)?;
        self.store_kv_device(layer, &device_slots, &k, &v)
    }

    fn load_kv(&self, layer: usize, slots: &[KvSlot]) -> Result<(KvData, KvData), KvPoolError> {
        self.layout.check_layer(layer)?;
        self.layout.check_slots(slots)?;
        check_rows(slots.len())?;
        if slots.is_empty() {
            let empty = data_from_bytes(self.dtype, &[]);
            return Ok((empty.clone(), empty));
        }
        let stream = self.device.stream();
        let device_slots = stream.clone_htod(slots).map_err(backend)?;
        let load = |tensor, buffer| -> Result<KvData, KvPoolError> {
            let shape = self.shape(tensor);
            let rows = gather_rows(&self.device, buffer, shape, &device_slots, self.num_slots())?;
            let bytes = stream.clone_dtoh(&rows).map_err(backend)?;
            Ok(data_from_bytes(self.dtype, &bytes))
        };
        Ok((
            load(KvTensor::K, &self.k[layer])?,
            load(KvTensor::V, &self.v[layer])?,
        ))
    }

    /// Gathers every source row into a temporary, then scatters it, per buffer: overlapping
    /// `src` and `dst` read the old rows.
    fn copy_slots(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError> {
        self.layout.check_copy(src, dst)?;
        check_rows(src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        let stream = self.device.stream().clone();
        let src = stream.clone_htod(src).map_err(backend)?;
        let dst = stream.clone_htod(dst).map_err(backend)?;
        let num_slots = self.num_slots();
        for tensor in [KvTensor::K, KvTensor::V] {
            let shape = self.shape(tensor);
            let buffers = match tensor {
                KvTensor::K => &mut self.k,
                KvTensor::V => &mut self.v,
            };
            for buffer in buffers.iter_mut() {
                let rows = gather_rows(&self.device, buffer, shape, &src, num_slots)?;
                store_rows(&self.device, buffer, shape, &rows, &dst, num_slots)?;
            }
        }
        Ok(())
    }

    /// Disjoint page lists use the one-pass `copy_pages` kernel; overlapping ones fall back to
    /// [`KvPool::copy_slots`] over the pages' slots.
    fn copy_pages(&mut self, src: &[PageId], dst: &[PageId]) -> Result<(), KvPoolError> {
        if src.len() != dst.len() {
            return Err(KvPoolError::CopyLengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        self.layout.check_pages(src)?;
        self.layout.check_pages(dst)?;
        let mut in_src = vec![false; self.layout.pages()];
        src.iter().for_each(|&page| in_src[page as usize] = true);
        if dst.iter().any(|&page| in_src[page as usize]) {
            return self.copy_slots(&self.layout.page_slots(src), &self.layout.page_slots(dst));
        }
        let rows = src.len() * self.layout.page_size();
        check_rows(rows)?;
        if rows == 0 {
            return Ok(());
        }
        let stream = self.device.stream().clone();
        let src = stream.clone_htod(src).map_err(backend)?;
        let dst = stream.clone_htod(dst).map_err(backend)?;
        let num_pages = src.len() as u32;
        let page_size = self.layout.page_size() as u32;
        let num_slots = self.num_slots();
        for tensor in [KvTensor::K, KvTensor::V] {
            let shape = self.shape(tensor);
            let function = &self.device.kernels.rows[shape.word].copy_pages;
            let buffers = match tensor {
                KvTensor::K => &mut self.k,
                KvTensor::V => &mut self.v,
            };
            for buffer in buffers.iter_mut() {
                let mut launch = stream.launch_builder(function);
                launch
                    .arg(buffer)
                    .arg(&src)
                    .arg(&dst)
                    .arg(&num_pages)
                    .arg(&page_size)
                    .arg(&shape.row_words)
                    .arg(&num_slots);
                // SAFETY: arguments match copy_pages_wN in kv.cu; pages were validated and the
                // two lists are disjoint, so no block reads a row another block writes.
                unsafe { launch.launch(shape.config(rows)) }.map_err(backend)?;
            }
        }
        Ok(())
    }
}
