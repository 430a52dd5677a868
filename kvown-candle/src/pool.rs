//! [`TensorKvPool`]: kvown's per-layer K/V pool with candle tensors as its storage, the pool a
//! [`crate::PagedLlama`] writes each step's K/V into and gathers a request's K/V from.
//!
//! Per layer, K is one tensor `[slots, kv_heads, head_dim]` and V one `[slots, kv_heads,
//! v_head_dim]`, row `s` holding the token that kvown put in slot `s` (NHD, as kvown's
//! [`KvLayout`] and sglang's `MHATokenToKVPool`). A step's K/V is written in place at its
//! `out_cache_loc` ([`TensorKvPool::store`]: no tensor is allocated); a request's K/V is read
//! through its request-to-token row ([`TensorKvPool::gather`]: one gathered tensor per layer).
//! It implements kvown's [`KvPool`], so a [`kvown_runtime::kv::LocalTransfer`] moves K/V
//! between two of them.

use candle_core::{CpuStorage, DType, Device, InplaceOp1, InplaceOp2, Layout, Tensor};
use half::{bf16, f16};
use kvown_runtime::ids::KvSlot;
use kvown_runtime::kv::{KvData, KvDtype, KvLayout, KvPool, KvPoolError, KvSlice, KvTensor};

/// K/V buffers of every layer as CPU candle tensors, zero at first.
///
/// [`TensorKvPool::share`] gives a second handle on the same buffers (candle tensors share
/// their storage): a model writes through one while a transfer reads or writes through
/// another. Every write validates its inputs first, so a refused call leaves the pool unchanged.
#[derive(Debug)]
pub struct TensorKvPool {
    layout: KvLayout,
    dtype: KvDtype,
    k: Vec<Tensor>,
    v: Vec<Tensor>,
}

/// The candle dtype of a kvown K/V dtype.
pub fn candle_dtype(dtype: KvDtype) -> DType {
    match dtype {
        KvDtype::F32 => DType::F32,
        KvDtype::F16 => DType::F16,
        KvDtype::Bf16 => DType::BF16,
    }
}

/// The kvown K/V dtype of a candle dtype, or `None` for a dtype a pool cannot hold.
pub fn kv_dtype(dtype: DType) -> Option<KvDtype> {
    match dtype {
        DType::F32 => Some(KvDtype::F32),
        DType::F16 => Some(KvDtype::F16),
        DType::BF16 => Some(KvDtype::Bf16),
        _ => None,
    }
}

fn backend(error: candle_core::Error) -> KvPoolError {
    KvPoolError::Backend(Box::new(error))
}

impl TensorKvPool {
    /// A zeroed pool of `layout` with elements of `dtype`, its memory taken now. Fails with
    /// [`KvPoolError::HostOutOfMemory`] when the system refuses a buffer (nothing stays
    /// allocated then).
    pub fn new(layout: KvLayout, dtype: KvDtype) -> Result<TensorKvPool, KvPoolError> {
        let buffers = |tensor| -> Result<Vec<Tensor>, KvPoolError> {
            let row_len = layout.row_len(tensor);
            let dims = (
                layout.slots(),
                layout.kv_heads(),
                row_len / layout.kv_heads(),
            );
            (0..layout.layers())
                .map(|_| zeroed(dims, dtype, &layout))
                .collect()
        };
        Ok(TensorKvPool {
            layout,
            dtype,
            k: buffers(KvTensor::K)?,
            v: buffers(KvTensor::V)?,
        })
    }

    /// A second handle on the same buffers: what one writes, the other reads.
    pub fn share(&self) -> TensorKvPool {
        TensorKvPool {
            layout: self.layout,
            dtype: self.dtype,
            k: self.k.clone(),
            v: self.v.clone(),
        }
    }

    /// The candle dtype of the buffers.
    pub fn candle_dtype(&self) -> DType {
        candle_dtype(self.dtype)
    }

    /// Writes the step's K and V of `layer` in place: row `t` of `k` (`[n, kv_heads,
    /// head_dim]`, any dtype: it is converted) into slot `slots[t]`, same for `v` (sglang
    /// `set_kv_buffer`). A repeated slot gets its last row.
    ///
    /// # Errors
    /// Nothing is written when the layer or a slot is out of range, or the tensors are not one
    /// row per slot.
    pub fn store(
        &mut self,
        layer: usize,
        slots: &[KvSlot],
        k: &Tensor,
        v: &Tensor,
    ) -> Result<(), KvPoolError> {
        self.layout.check_layer(layer)?;
        self.layout.check_slots(slots)?;
        let rows = |tensor: &Tensor, which| -> Result<Tensor, KvPoolError> {
            let row_len = self.layout.row_len(which);
            if tensor.elem_count() != slots.len() * row_len {
                return Err(KvPoolError::DataLength {
                    tensor: which,
                    expected: slots.len() * row_len,
                    got: tensor.elem_count(),
                    rows: slots.len(),
                    row_len,
                });
            }
            tensor
                .to_dtype(self.candle_dtype())
                .and_then(|t| t.contiguous())
                .map_err(backend)
        };
        let (k, v) = (rows(k, KvTensor::K)?, rows(v, KvTensor::V)?);
        scatter_tensor(&self.k[layer], slots, &k)?;
        scatter_tensor(&self.v[layer], slots, &v)
    }

    /// Reads the K and V rows of `layer` at the slots in `index` (a `u32` tensor: a request's
    /// row, or several rows one after another), as `[n, kv_heads, head_dim]` tensors in index
    /// order. The caller checks the slots (a [`crate::ForwardBatch`] has).
    pub fn gather(&self, layer: usize, index: &Tensor) -> Result<(Tensor, Tensor), KvPoolError> {
        self.layout.check_layer(layer)?;
        let k = self.k[layer].index_select(index, 0).map_err(backend)?;
        let v = self.v[layer].index_select(index, 0).map_err(backend)?;
        Ok((k, v))
    }

    /// The whole K (or V) buffer of `layer`, `[slots, kv_heads, head_dim]`.
    pub fn buffer(&self, layer: usize, tensor: KvTensor) -> Result<&Tensor, KvPoolError> {
        self.layout.check_layer(layer)?;
        Ok(match tensor {
            KvTensor::K => &self.k[layer],
            KvTensor::V => &self.v[layer],
        })
    }

    fn slot_index(slots: &[KvSlot]) -> Result<Tensor, KvPoolError> {
        Tensor::from_slice(slots, slots.len(), &Device::Cpu).map_err(backend)
    }
}

/// A zeroed `[slots, heads, width]` tensor of `dtype`, or `HostOutOfMemory`.
fn zeroed(
    dims: (usize, usize, usize),
    dtype: KvDtype,
    layout: &KvLayout,
) -> Result<Tensor, KvPoolError> {
    let len = dims.0 * dims.1 * dims.2;
    fn buffer<T: Clone + Default>(
        len: usize,
        dtype: KvDtype,
        layout: &KvLayout,
    ) -> Result<Vec<T>, KvPoolError> {
        let mut values = Vec::new();
        values
            .try_reserve_exact(len)
            .map_err(|_| KvPoolError::HostOutOfMemory {
                buffer_bytes: len * dtype.size_bytes(),
                pool_bytes: layout.pool_bytes(dtype),
            })?;
        values.resize(len, T::default());
        Ok(values)
    }
    let device = Device::Cpu;
    match dtype {
        KvDtype::F32 => Tensor::from_vec(buffer::<f32>(len, dtype, layout)?, dims, &device),
        KvDtype::F16 => Tensor::from_vec(buffer::<f16>(len, dtype, layout)?, dims, &device),
        KvDtype::Bf16 => Tensor::from_vec(buffer::<bf16>(len, dtype, layout)?, dims, &device),
    }
    .map_err(backend)
}

/// Writes the rows of `rows` (contiguous, the buffer's dtype, one row per slot) into `buffer`
/// in place; `rows` sharing the buffer's storage is refused, not a deadlock.
fn scatter_tensor(buffer: &Tensor, slots: &[KvSlot], rows: &Tensor) -> Result<(), KvPoolError> {
    buffer
        .inplace_op2(rows, &ScatterTensor { slots })
        .map_err(backend)
}

/// Writes `data` (one row per slot, the buffer's dtype) into `buffer` in place.
fn scatter_slice(buffer: &Tensor, slots: &[KvSlot], data: KvSlice<'_>) -> Result<(), KvPoolError> {
    buffer
        .inplace_op1(&ScatterSlice { slots, data })
        .map_err(backend)
}

/// `buffer[slots[t]] = rows[t]`, rows of `rows.len() / slots.len()` elements. Slots must be
/// validated.
fn scatter_rows<T: Copy>(buffer: &mut [T], slots: &[KvSlot], rows: &[T]) {
    let Some(row_len) = rows.len().checked_div(slots.len()) else {
        return;
    };
    for (&slot, row) in slots.iter().zip(rows.chunks_exact(row_len)) {
        let start = slot as usize * row_len;
        buffer[start..start + row_len].copy_from_slice(row);
    }
}

/// Writes `data` into a pool buffer's storage, which must be a whole contiguous tensor.
fn scatter_into(
    storage: &mut CpuStorage,
    layout: &Layout,
    slots: &[KvSlot],
    data: KvSlice<'_>,
) -> candle_core::Result<()> {
    if layout.contiguous_offsets() != Some((0, layout.shape().elem_count())) {
        candle_core::bail!("a K/V buffer is not a whole contiguous tensor");
    }
    match (storage, data) {
        (CpuStorage::F32(buffer), KvSlice::F32(rows)) => scatter_rows(buffer, slots, rows),
        (CpuStorage::F16(buffer), KvSlice::F16(rows)) => scatter_rows(buffer, slots, rows),
        (CpuStorage::BF16(buffer), KvSlice::Bf16(rows)) => scatter_rows(buffer, slots, rows),
        (_, rows) => {
            candle_core::bail!("K/V rows of {} for a buffer of another dtype", rows.dtype())
        }
    }
    Ok(())
}

/// The in-place write of [`KvPool::store_kv`]: host rows into a buffer.
struct ScatterSlice<'a> {
    slots: &'a [KvSlot],
    data: KvSlice<'a>,
}

impl InplaceOp1 for ScatterSlice<'_> {
    fn name(&self) -> &'static str {
        "kvown-scatter-slice"
    }

    fn cpu_fwd(&self, storage: &mut CpuStorage, layout: &Layout) -> candle_core::Result<()> {
        scatter_into(storage, layout, self.slots, self.data)
    }
}

/// The in-place write of [`TensorKvPool::store`]: a tensor's rows into a buffer.
struct ScatterTensor<'a> {
    slots: &'a [KvSlot],
}

impl InplaceOp2 for ScatterTensor<'_> {
    fn name(&self) -> &'static str {
        "kvown-scatter-tensor"
    }

    fn cpu_fwd(
        &self,
        storage: &mut CpuStorage,
        layout: &Layout,
        rows: &CpuStorage,
        rows_layout: &Layout,
    ) -> candle_core::Result<()> {
        let Some((start, end)) = rows_layout.contiguous_offsets() else {
            candle_core::bail!("K/V rows must be contiguous");
        };
        let data = match rows {
            CpuStorage::F32(values) => KvSlice::F32(&values[start..end]),
            CpuStorage::F16(values) => KvSlice::F16(&values[start..end]),
            CpuStorage::BF16(values) => KvSlice::Bf16(&values[start..end]),
            _ => candle_core::bail!("K/V rows must be f32, f16 or bf16"),
        };
        scatter_into(storage, layout, self.slots, data)
    }
}

impl KvPool for TensorKvPool {
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
        scatter_slice(&self.k[layer], slots, k)?;
        scatter_slice(&self.v[layer], slots, v)
    }

    fn load_kv(&self, layer: usize, slots: &[KvSlot]) -> Result<(KvData, KvData), KvPoolError> {
        self.layout.check_layer(layer)?;
        self.layout.check_slots(slots)?;
        let (k, v) = self.gather(layer, &Self::slot_index(slots)?)?;
        Ok((to_data(&k)?, to_data(&v)?))
    }

    fn copy_slots(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError> {
        self.layout.check_copy(src, dst)?;
        let index = Self::slot_index(src)?;
        // Every layer's rows are read (gathered into new tensors) before any is written.
        let rows = (0..self.layout.layers())
            .map(|layer| self.gather(layer, &index))
            .collect::<Result<Vec<_>, _>>()?;
        for (layer, (k, v)) in rows.iter().enumerate() {
            scatter_tensor(&self.k[layer], dst, k)?;
            scatter_tensor(&self.v[layer], dst, v)?;
        }
        Ok(())
    }
}

/// A gathered tensor's elements as kvown's typed data.
fn to_data(tensor: &Tensor) -> Result<KvData, KvPoolError> {
    let flat = tensor.flatten_all().map_err(backend)?;
    Ok(match tensor.dtype() {
        DType::F32 => KvData::F32(flat.to_vec1().map_err(backend)?),
        DType::F16 => KvData::F16(flat.to_vec1().map_err(backend)?),
        _ => KvData::Bf16(flat.to_vec1().map_err(backend)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        KvLayout::new(2, 2, 4, 16, 4).unwrap()
    }

    #[test]
    fn store_then_gather_through_a_shared_handle() {
        for dtype in KvDtype::ALL {
            let mut pool = TensorKvPool::new(layout(), dtype).unwrap();
            let reader = pool.share();
            let k = Tensor::arange(0f32, 16.0, &Device::Cpu)
                .unwrap()
                .reshape((2, 2, 4))
                .unwrap();
            let v = (&k + 100.0).unwrap();
            pool.store(1, &[7, 3], &k, &v).unwrap();
            let index = Tensor::new(&[3u32, 7], &Device::Cpu).unwrap();
            let (k_back, v_back) = reader.gather(1, &index).unwrap();
            let as_f32 = |t: &Tensor| -> Vec<f32> {
                t.to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap()
            };
            let expected: Vec<f32> = (8..16).chain(0..8).map(|x| x as f32).collect();
            assert_eq!(as_f32(&k_back), expected, "{dtype}");
            let expected_v: Vec<f32> = expected.iter().map(|x| x + 100.0).collect();
            assert_eq!(as_f32(&v_back), expected_v, "{dtype}");
            // Layer 0 untouched.
            let (k0, _) = reader.gather(0, &index).unwrap();
            assert!(as_f32(&k0).iter().all(|x| *x == 0.0));
        }
    }

    #[test]
    fn a_refused_store_writes_nothing() {
        let mut pool = TensorKvPool::new(layout(), KvDtype::F32).unwrap();
        let k = Tensor::ones((2, 2, 4), DType::F32, &Device::Cpu).unwrap();
        // Slot 20 is past the 16 + 4 slots.
        assert!(matches!(
            pool.store(0, &[1, 20], &k, &k),
            Err(KvPoolError::SlotOutOfRange { slot: 20, .. })
        ));
        // Three slots for two rows.
        assert!(matches!(
            pool.store(0, &[1, 2, 3], &k, &k),
            Err(KvPoolError::DataLength { rows: 3, .. })
        ));
        assert!(matches!(
            pool.store(2, &[1, 2], &k, &k),
            Err(KvPoolError::BadLayer { layer: 2, .. })
        ));
        let (k_back, v_back) = pool.load_kv(0, &[1, 2, 3]).unwrap();
        assert_eq!(k_back, KvData::F32(vec![0.0; 24]));
        assert_eq!(v_back, KvData::F32(vec![0.0; 24]));
    }

    #[test]
    fn the_kv_pool_interface_round_trips_and_copies() {
        let mut pool = TensorKvPool::new(layout(), KvDtype::Bf16).unwrap();
        let rows: Vec<bf16> = (0..16).map(|x| bf16::from_f32(x as f32)).collect();
        pool.store_kv(0, &[4, 5], KvSlice::Bf16(&rows), KvSlice::Bf16(&rows))
            .unwrap();
        assert_eq!(
            pool.load_kv(0, &[5]).unwrap().0,
            KvData::Bf16(rows[8..].to_vec())
        );
        pool.copy_pages(&[1], &[3]).unwrap();
        assert_eq!(
            pool.load_kv(0, &[12, 13]).unwrap(),
            pool.load_kv(0, &[4, 5]).unwrap()
        );
        assert!(matches!(
            pool.store_kv(0, &[4], KvSlice::F32(&[0.0; 8]), KvSlice::F32(&[0.0; 8])),
            Err(KvPoolError::DtypeMismatch { .. })
        ));
    }
}
