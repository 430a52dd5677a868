//! [`CudaKvPool`]: the [`KvPool`] backend with per-layer K and V buffers in device memory.
//!
//! Buffers are raw bytes; the kernels move rows as words of the widest size that divides the
//! row's byte length, so one set of kernels serves f32, f16 and bf16. Validation and every launch
//! argument come from [`KvPlanner`], which the host-emulation test shares.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DriverError, LaunchConfig, PushKernelArg};
use half::{bf16, f16};
use kvown_runtime::alloc::{KvSlot, PageId};
use kvown_runtime::kv::{KvData, KvDtype, KvLayout, KvPool, KvPoolError, KvSlice, KvTensor};

use crate::detect::CudaDevice;
use crate::kv_plan::{KvPlanner, PageCopy, RowLaunch};

/// Device-memory KV pool, zero-initialised, NHD layout, any of the three dtypes. Each call is
/// validated and planned on the host by a [`KvPlanner`] first and changes nothing on `Err`.
#[derive(Debug)]
pub struct CudaKvPool {
    device: Arc<CudaDevice>,
    planner: KvPlanner,
    k: Vec<CudaSlice<u8>>,
    v: Vec<CudaSlice<u8>>,
}

fn backend(error: DriverError) -> KvPoolError {
    KvPoolError::Backend(Box::new(error))
}

/// The bytes of `data` as a device buffer holds them (the host's byte order).
pub fn kv_bytes(data: KvSlice<'_>) -> &[u8] {
    match data {
        KvSlice::F32(values) => bytemuck::cast_slice(values),
        KvSlice::F16(values) => bytemuck::cast_slice(values),
        KvSlice::Bf16(values) => bytemuck::cast_slice(values),
    }
}

/// Elements of `dtype` from the bytes of a device buffer; the inverse of [`kv_bytes`]. `bytes`
/// must be a whole number of elements.
pub fn kv_data_from_bytes(dtype: KvDtype, bytes: &[u8]) -> KvData {
    match dtype {
        KvDtype::F32 => KvData::F32(bytemuck::pod_collect_to_vec::<u8, f32>(bytes)),
        KvDtype::F16 => KvData::F16(bytemuck::pod_collect_to_vec::<u8, f16>(bytes)),
        KvDtype::Bf16 => KvData::Bf16(bytemuck::pod_collect_to_vec::<u8, bf16>(bytes)),
    }
}

fn config(launch: &RowLaunch) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (launch.rows, 1, 1),
        block_dim: (launch.threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches `store_kv`: `buffer[slots[t]] = rows[t]`. Slots past `num_slots` are skipped.
fn store_rows(
    device: &CudaDevice,
    buffer: &mut CudaSlice<u8>,
    launch: &RowLaunch,
    rows: &CudaSlice<u8>,
    slots: &CudaSlice<u32>,
) -> Result<(), KvPoolError> {
    let mut args = device
        .stream()
        .launch_builder(&device.kernels.rows[launch.shape.word].store_kv);
    args.arg(buffer)
        .arg(rows)
        .arg(slots)
        .arg(&launch.rows)
        .arg(&launch.shape.row_words)
        .arg(&launch.num_slots);
    // SAFETY: arguments match store_kv_wN in kv.cu; callers pass `rows` holding one row of
    // row_words words per slot; the kernel skips slots past the buffer, and buffers are
    // cuMemAlloc'd, so rows of a multiple of N bytes are N-aligned.
    unsafe { args.launch(config(launch)) }.map_err(backend)?;
    Ok(())
}

/// A zeroed device array for the rows `launch` moves.
fn row_temporary(device: &CudaDevice, launch: &RowLaunch) -> Result<CudaSlice<u8>, KvPoolError> {
    device
        .stream()
        .alloc_zeros::<u8>(launch.rows as usize * launch.shape.row_bytes)
        .map_err(backend)
}

/// Launches `gather_kv`: `out[t] = buffer[slots[t]]`, `out` holding one row per slot
/// ([`row_temporary`]).
fn gather_rows(
    device: &CudaDevice,
    buffer: &CudaSlice<u8>,
    launch: &RowLaunch,
    slots: &CudaSlice<u32>,
    out: &mut CudaSlice<u8>,
) -> Result<(), KvPoolError> {
    let mut args = device
        .stream()
        .launch_builder(&device.kernels.rows[launch.shape.word].gather_kv);
    args.arg(out)
        .arg(buffer)
        .arg(slots)
        .arg(&launch.rows)
        .arg(&launch.shape.row_words)
        .arg(&launch.num_slots);
    // SAFETY: arguments match gather_kv_wN in kv.cu; `out` holds one row per slot; slots past
    // the buffer are skipped.
    unsafe { args.launch(config(launch)) }.map_err(backend)?;
    Ok(())
}

impl CudaKvPool {
    /// A zeroed pool on `device`. Fails with [`KvPoolError::Backend`] when the device cannot
    /// hold the buffers or the rows are too long for the kernels' 32-bit word index.
    pub fn new(
        device: Arc<CudaDevice>,
        layout: KvLayout,
        dtype: KvDtype,
    ) -> Result<Self, KvPoolError> {
        let planner = KvPlanner::new(layout, dtype);
        // Rows the kernels cannot index would fail every later call: refuse them here.
        planner.plan_rows(0)?;
        let stream = device.stream().clone();
        let buffers = |tensor| -> Result<Vec<CudaSlice<u8>>, KvPoolError> {
            let bytes = layout.slots() * planner.shape(tensor).row_bytes;
            (0..layout.layers())
                .map(|_| stream.alloc_zeros::<u8>(bytes).map_err(backend))
                .collect()
        };
        let k = buffers(KvTensor::K)?;
        let v = buffers(KvTensor::V)?;
        Ok(Self {
            device,
            planner,
            k,
            v,
        })
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
        let rows = slots.len();
        match self
            .planner
            .plan_store_device(layer, rows, k.len(), v.len())?
        {
            Some(launches) => self.store(layer, &launches, slots, k, v),
            None => Ok(()),
        }
    }

    /// Launches `store_kv` into `layer`'s K and V buffers.
    fn store(
        &mut self,
        layer: usize,
        launches: &[RowLaunch; 2],
        slots: &CudaSlice<u32>,
        k: &CudaSlice<u8>,
        v: &CudaSlice<u8>,
    ) -> Result<(), KvPoolError> {
        for (launch, rows) in launches.iter().zip([k, v]) {
            let buffer = match launch.tensor {
                KvTensor::K => &mut self.k[layer],
                KvTensor::V => &mut self.v[layer],
            };
            store_rows(&self.device, buffer, launch, rows, slots)?;
        }
        Ok(())
    }
}

impl KvPool for CudaKvPool {
    fn layout(&self) -> &KvLayout {
        self.planner.layout()
    }

    fn dtype(&self) -> KvDtype {
        self.planner.dtype()
    }

    fn store_kv(
        &mut self,
        layer: usize,
        slots: &[KvSlot],
        k: KvSlice<'_>,
        v: KvSlice<'_>,
    ) -> Result<(), KvPoolError> {
        let Some(launches) = self.planner.plan_store(layer, slots, k, v)? else {
            return Ok(());
        };
        let stream = self.device.stream();
        let device_slots = stream.clone_htod(slots).map_err(backend)?;
        let k = stream.clone_htod(kv_bytes(k)).map_err(backend)?;
        let v = stream.clone_htod(kv_bytes(v)).map_err(backend)?;
        self.store(layer, &launches, &device_slots, &k, &v)
    }

    fn load_kv(&self, layer: usize, slots: &[KvSlot]) -> Result<(KvData, KvData), KvPoolError> {
        let Some(launches) = self.planner.plan_load(layer, slots)? else {
            let empty = kv_data_from_bytes(self.dtype(), &[]);
            return Ok((empty.clone(), empty));
        };
        let stream = self.device.stream();
        let device_slots = stream.clone_htod(slots).map_err(backend)?;
        let load = |launch: &RowLaunch| -> Result<KvData, KvPoolError> {
            let buffer = match launch.tensor {
                KvTensor::K => &self.k[layer],
                KvTensor::V => &self.v[layer],
            };
            let mut rows = row_temporary(&self.device, launch)?;
            gather_rows(&self.device, buffer, launch, &device_slots, &mut rows)?;
            let bytes = stream.clone_dtoh(&rows).map_err(backend)?;
            Ok(kv_data_from_bytes(self.dtype(), &bytes))
        };
        Ok((load(&launches[0])?, load(&launches[1])?))
    }

    /// Gathers every source row into a temporary, then scatters it, per buffer: overlapping
    /// `src` and `dst` read the old rows. The device memory it needs (the slot lists and one
    /// temporary per tensor, reused layer after layer) is taken before the first copy, so a
    /// device short of memory fails the call before any row changed.
    fn copy_slots(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError> {
        let Some(launches) = self.planner.plan_copy_slots(src, dst)? else {
            return Ok(());
        };
        let stream = self.device.stream().clone();
        let src = stream.clone_htod(src).map_err(backend)?;
        let dst = stream.clone_htod(dst).map_err(backend)?;
        let mut temporaries = [
            row_temporary(&self.device, &launches[0])?,
            row_temporary(&self.device, &launches[1])?,
        ];
        for (launch, rows) in launches.iter().zip(&mut temporaries) {
            let buffers = match launch.tensor {
                KvTensor::K => &mut self.k,
                KvTensor::V => &mut self.v,
            };
            // Stream order: a layer's gather waits for the last layer's store out of `rows`.
            for buffer in buffers.iter_mut() {
                gather_rows(&self.device, buffer, launch, &src, rows)?;
                store_rows(&self.device, buffer, launch, rows, &dst)?;
            }
        }
        Ok(())
    }

    /// Disjoint page lists use the one-pass `copy_pages` kernel; overlapping ones fall back to
    /// [`KvPool::copy_slots`] over the pages' slots.
    fn copy_pages(&mut self, src: &[PageId], dst: &[PageId]) -> Result<(), KvPoolError> {
        let (num_pages, page_size, launches) = match self.planner.plan_copy_pages(src, dst)? {
            None => return Ok(()),
            Some(PageCopy::Slots { src, dst }) => return self.copy_slots(&src, &dst),
            Some(PageCopy::Pages {
                num_pages,
                page_size,
                launches,
            }) => (num_pages, page_size, launches),
        };
        let stream = self.device.stream().clone();
        let src = stream.clone_htod(src).map_err(backend)?;
        let dst = stream.clone_htod(dst).map_err(backend)?;
        for launch in &launches {
            let function = &self.device.kernels.rows[launch.shape.word].copy_pages;
            let buffers = match launch.tensor {
                KvTensor::K => &mut self.k,
                KvTensor::V => &mut self.v,
            };
            for buffer in buffers.iter_mut() {
                let mut args = stream.launch_builder(function);
                args.arg(buffer)
                    .arg(&src)
                    .arg(&dst)
                    .arg(&num_pages)
                    .arg(&page_size)
                    .arg(&launch.shape.row_words)
                    .arg(&launch.num_slots);
                // SAFETY: arguments match copy_pages_wN in kv.cu; pages were validated and the
                // two lists are disjoint, so no block reads a row another block writes.
                unsafe { args.launch(config(launch)) }.map_err(backend)?;
            }
        }
        Ok(())
    }
}
