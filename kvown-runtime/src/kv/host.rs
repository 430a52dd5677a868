//! [`HostKvPool`]: the K/V buffers in host memory, one contiguous `Vec<T>` per layer and tensor.

use super::KvPool;
use super::element::{KvData, KvDtype, KvElement, KvSlice};
use super::error::{KvPoolError, KvTensor};
use super::layout::KvLayout;
use crate::ids::KvSlot;

/// Host-memory KV pool of element type `T`, zero-initialised, NHD layout.
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::{HostKvPool, KvLayout, KvTensor};
///
/// let mut pool = HostKvPool::<f32>::new(KvLayout::new(2, 1, 4, 8, 4)?)?;
/// pool.buffer_mut(1, KvTensor::V)?[4..8].fill(1.0); // V row of slot 1, layer 1
/// assert_eq!(pool.buffer(1, KvTensor::V)?[4..8], [1.0; 4]);
/// assert_eq!(pool.buffer(0, KvTensor::K)?.len(), 12 * 4, "12 slots of 4 elements, zeroed");
/// assert!(pool.buffer(2, KvTensor::K).is_err(), "no layer 2");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone)]
pub struct HostKvPool<T: KvElement> {
    layout: KvLayout,
    k: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
}

/// A boxed host pool of the given dtype, for callers that pick the dtype at run time; fails
/// as [`HostKvPool::new`] does.
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::{KvDtype, KvLayout, new_host_pool};
///
/// let pool = new_host_pool(KvLayout::new(2, 1, 4, 8, 4)?, KvDtype::Bf16)?;
/// assert_eq!(pool.dtype(), KvDtype::Bf16);
/// assert_eq!(pool.layout().slots(), 12);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn new_host_pool(layout: KvLayout, dtype: KvDtype) -> Result<Box<dyn KvPool>, KvPoolError> {
    Ok(match dtype {
        KvDtype::F32 => Box::new(HostKvPool::<f32>::new(layout)?),
        KvDtype::F16 => Box::new(HostKvPool::<half::f16>::new(layout)?),
        KvDtype::Bf16 => Box::new(HostKvPool::<half::bf16>::new(layout)?),
    })
}

impl<T: KvElement> HostKvPool<T> {
    /// A pool with every element zero, written at once (the memory is taken now, not at the
    /// first store). Fails with [`KvPoolError::HostOutOfMemory`] when the system allocator
    /// refuses a buffer; nothing stays allocated then.
    pub fn new(layout: KvLayout) -> Result<Self, KvPoolError> {
        let buffers = |tensor| -> Result<Vec<Vec<T>>, KvPoolError> {
            let len = layout.slots() * layout.row_len(tensor);
            (0..layout.layers())
                .map(|_| zeroed::<T>(len, &layout))
                .collect()
        };
        Ok(Self {
            layout,
            k: buffers(KvTensor::K)?,
            v: buffers(KvTensor::V)?,
        })
    }

    /// The whole buffer of `tensor` in `layer` (`slots()` rows), or `BadLayer`.
    pub fn buffer(&self, layer: usize, tensor: KvTensor) -> Result<&[T], KvPoolError> {
        self.layout.check_layer(layer)?;
        Ok(match tensor {
            KvTensor::K => &self.k[layer],
            KvTensor::V => &self.v[layer],
        })
    }

    /// The whole buffer of `tensor` in `layer`, writable, or `BadLayer`. Each buffer is one
    /// allocation that never moves or resizes while the pool lives (moving the pool moves no
    /// buffer), so its address can be registered with a transfer engine that writes rows into it.
    pub fn buffer_mut(&mut self, layer: usize, tensor: KvTensor) -> Result<&mut [T], KvPoolError> {
        self.layout.check_layer(layer)?;
        Ok(match tensor {
            KvTensor::K => &mut self.k[layer],
            KvTensor::V => &mut self.v[layer],
        })
    }
}

/// `len` zero elements of one of `layout`'s buffers, or `HostOutOfMemory`.
fn zeroed<T: KvElement>(len: usize, layout: &KvLayout) -> Result<Vec<T>, KvPoolError> {
    let mut buffer = Vec::new();
    buffer
        .try_reserve_exact(len)
        .map_err(|_| KvPoolError::HostOutOfMemory {
            buffer_bytes: len * size_of::<T>(),
            pool_bytes: layout.pool_bytes(T::DTYPE),
        })?;
    buffer.resize(len, T::default());
    Ok(buffer)
}

/// `buffer[slots[t]] = rows[t]` for rows of `row_len`. Slots must be validated.
fn scatter_rows<T: Copy>(buffer: &mut [T], row_len: usize, slots: &[KvSlot], rows: &[T]) {
    for (&slot, row) in slots.iter().zip(rows.chunks_exact(row_len)) {
        let start = slot as usize * row_len;
        buffer[start..start + row_len].copy_from_slice(row);
    }
}

/// Reserves room in `out` for `rows` rows of `row_len`, or `HostRowsOutOfMemory` (a request
/// for more slots than host memory holds fails here, before anything is read or written).
fn reserve_rows<T>(out: &mut Vec<T>, rows: usize, row_len: usize) -> Result<(), KvPoolError> {
    let refused = || KvPoolError::HostRowsOutOfMemory {
        rows,
        bytes: rows.saturating_mul(row_len).saturating_mul(size_of::<T>()),
    };
    let len = rows.checked_mul(row_len).ok_or_else(refused)?;
    out.try_reserve_exact(len.saturating_sub(out.len()))
        .map_err(|_| refused())
}

/// Appends `buffer[slots[t]]` for every `t` to `out`, which has room for them
/// ([`reserve_rows`]). Slots must be validated.
fn gather_rows<T: Copy>(buffer: &[T], row_len: usize, slots: &[KvSlot], out: &mut Vec<T>) {
    for &slot in slots {
        let start = slot as usize * row_len;
        out.extend_from_slice(&buffer[start..start + row_len]);
    }
}

fn typed<'a, T: KvElement>(data: KvSlice<'a>) -> &'a [T] {
    T::from_kv_slice(data).expect("dtype validated before the write")
}

impl<T: KvElement> KvPool for HostKvPool<T> {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }

    fn dtype(&self) -> KvDtype {
        T::DTYPE
    }

    fn store_kv(
        &mut self,
        layer: usize,
        slots: &[KvSlot],
        k: KvSlice<'_>,
        v: KvSlice<'_>,
    ) -> Result<(), KvPoolError> {
        self.layout.check_store(T::DTYPE, layer, slots, k, v)?;
        let (k_row, v_row) = (
            self.layout.row_len(KvTensor::K),
            self.layout.row_len(KvTensor::V),
        );
        scatter_rows(&mut self.k[layer], k_row, slots, typed::<T>(k));
        scatter_rows(&mut self.v[layer], v_row, slots, typed::<T>(v));
        Ok(())
    }

    fn load_kv(&self, layer: usize, slots: &[KvSlot]) -> Result<(KvData, KvData), KvPoolError> {
        self.layout.check_layer(layer)?;
        self.layout.check_slots(slots)?;
        let (mut k, mut v) = (Vec::new(), Vec::new());
        reserve_rows(&mut k, slots.len(), self.layout.row_len(KvTensor::K))?;
        reserve_rows(&mut v, slots.len(), self.layout.row_len(KvTensor::V))?;
        gather_rows(
            &self.k[layer],
            self.layout.row_len(KvTensor::K),
            slots,
            &mut k,
        );
        gather_rows(
            &self.v[layer],
            self.layout.row_len(KvTensor::V),
            slots,
            &mut v,
        );
        Ok((T::into_data(k), T::into_data(v)))
    }

    fn copy_slots(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError> {
        self.layout.check_copy(src, dst)?;
        // One scratch for every buffer, taken before the first row moves.
        let widest = self
            .layout
            .row_len(KvTensor::K)
            .max(self.layout.row_len(KvTensor::V));
        let mut rows = Vec::new();
        reserve_rows(&mut rows, src.len(), widest)?;
        for (tensor, buffers) in [(KvTensor::K, &mut self.k), (KvTensor::V, &mut self.v)] {
            let row_len = self.layout.row_len(tensor);
            for buffer in buffers.iter_mut() {
                rows.clear();
                gather_rows(buffer, row_len, src, &mut rows);
                scatter_rows(buffer, row_len, dst, &rows);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::{bf16, f16};

    fn layout() -> KvLayout {
        KvLayout::with_v_head_dim(2, 2, 3, 2, 8, 4).unwrap()
    }

    /// Distinct, non-zero values: element `i` of a call tagged `tag`.
    fn values<T: KvElement>(tag: f32, len: usize) -> Vec<T> {
        (0..len).map(|i| T::from_f32(tag + i as f32)).collect()
    }

    fn round_trip<T: KvElement>() {
        let mut pool = HostKvPool::<T>::new(layout()).unwrap();
        let slots = [4, 11, 0];
        let k = values::<T>(1.0, 3 * 6);
        let v = values::<T>(100.0, 3 * 4);
        pool.store_kv(1, &slots, T::as_kv_slice(&k), T::as_kv_slice(&v))
            .unwrap();
        let (k_out, v_out) = pool.load_kv(1, &slots).unwrap();
        assert_eq!(k_out.into_vec::<T>().unwrap(), k);
        assert_eq!(v_out.into_vec::<T>().unwrap(), v);
        // Layer 0 and untouched rows of layer 1 stay zero.
        assert!(
            pool.buffer(0, KvTensor::K)
                .unwrap()
                .iter()
                .all(|x| *x == T::default())
        );
        let (k_other, _) = pool.load_kv(1, &[5]).unwrap();
        assert_eq!(k_other.into_vec::<T>().unwrap(), vec![T::default(); 6]);
        assert_eq!(pool.dtype(), T::DTYPE);
    }

    #[test]
    fn store_then_load_every_dtype() {
        round_trip::<f32>();
        round_trip::<f16>();
        round_trip::<bf16>();
    }

    #[test]
    fn store_writes_rows_in_nhd_layout() {
        let mut pool = HostKvPool::<f32>::new(layout()).unwrap();
        let k = values::<f32>(1.0, 6);
        let v = values::<f32>(50.0, 4);
        pool.store_kv(0, &[2], KvSlice::F32(&k), KvSlice::F32(&v))
            .unwrap();
        assert_eq!(&pool.buffer(0, KvTensor::K).unwrap()[12..18], &k[..]);
        assert_eq!(&pool.buffer(0, KvTensor::V).unwrap()[8..12], &v[..]);
    }

    /// A row written through `buffer_mut` is what `load_kv` reads, and the buffer keeps its
    /// address when the pool moves (what a transfer engine's registration relies on).
    #[test]
    fn buffer_mut_writes_rows_at_an_address_that_survives_moving_the_pool() {
        let mut pool = HostKvPool::<f32>::new(layout()).unwrap();
        let buffer = pool.buffer_mut(1, KvTensor::V).unwrap();
        buffer[4..8].copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let address = buffer.as_ptr();
        let moved = Box::new(pool);
        assert_eq!(moved.buffer(1, KvTensor::V).unwrap().as_ptr(), address);
        let (_, v) = moved.load_kv(1, &[1]).unwrap();
        assert_eq!(v, KvData::F32(vec![1.0, 2.0, 3.0, 4.0]));
        let mut moved = *moved;
        assert!(matches!(
            moved.buffer_mut(2, KvTensor::K),
            Err(KvPoolError::BadLayer { .. })
        ));
    }

    #[test]
    fn copy_slots_reads_before_writing() {
        let mut pool = HostKvPool::<f32>::new(layout()).unwrap();
        for layer in 0..2 {
            let k = values::<f32>(10.0 * layer as f32 + 1.0, 2 * 6);
            let v = values::<f32>(10.0 * layer as f32 + 5.0, 2 * 4);
            pool.store_kv(layer, &[1, 2], KvSlice::F32(&k), KvSlice::F32(&v))
                .unwrap();
        }
        let before: Vec<_> = (0..2).map(|l| pool.load_kv(l, &[1, 2]).unwrap()).collect();
        // Overlapping shift: 1 -> 2 and 2 -> 3.
        pool.copy_slots(&[1, 2], &[2, 3]).unwrap();
        for (layer, (k, v)) in before.into_iter().enumerate() {
            assert_eq!(pool.load_kv(layer, &[2, 3]).unwrap(), (k, v));
        }
    }

    #[test]
    fn copy_pages_copies_every_row_of_the_page() {
        let mut pool = HostKvPool::<f32>::new(layout()).unwrap();
        let k = values::<f32>(1.0, 4 * 6);
        let v = values::<f32>(70.0, 4 * 4);
        pool.store_kv(1, &[4, 5, 6, 7], KvSlice::F32(&k), KvSlice::F32(&v))
            .unwrap();
        pool.copy_pages(&[1], &[2]).unwrap();
        assert_eq!(
            pool.load_kv(1, &[8, 9, 10, 11]).unwrap(),
            pool.load_kv(1, &[4, 5, 6, 7]).unwrap()
        );
    }

    #[test]
    fn a_pool_the_system_cannot_allocate_is_an_error() {
        // 2^44 elements a row: 2^56 bytes a K buffer, past what x86-64 or AArch64 can map.
        let huge = KvLayout::new(1, 1 << 22, 1 << 22, 4, 4).unwrap();
        for dtype in KvDtype::ALL {
            let error = new_host_pool(huge, dtype).err().expect("refused");
            let element = dtype.size_bytes();
            assert!(matches!(
                error,
                KvPoolError::HostOutOfMemory { buffer_bytes, pool_bytes }
                    if buffer_bytes == (8 * element) << 44
                        && pool_bytes == 2 * buffer_bytes
            ));
        }
    }

    /// A one-layer f32 pool of 2 rows whose K rows are 2^23 elements (32 MiB, V rows 1), and
    /// a list naming slot 1 2^24 times: its K rows take 2^49 bytes, more than x86-64 or
    /// AArch64 hands a process without asking, whatever the overcommit policy.
    fn pool_and_slots_past_host_memory() -> (HostKvPool<f32>, Vec<KvSlot>) {
        let layout = KvLayout::with_v_head_dim(1, 1 << 11, 1 << 12, 1, 1, 1).unwrap();
        let mut pool = HostKvPool::<f32>::new(layout).unwrap();
        let row = vec![7.0f32; 1 << 23];
        pool.store_kv(0, &[1], KvSlice::F32(&row), KvSlice::F32(&[8.0; 1 << 11]))
            .unwrap();
        (pool, vec![1; 1 << 24])
    }

    #[test]
    fn loading_more_rows_than_the_host_holds_is_an_error() {
        let (pool, slots) = pool_and_slots_past_host_memory();
        let error = pool.load_kv(0, &slots).expect_err("2^49 bytes refused");
        assert!(matches!(
            error,
            KvPoolError::HostRowsOutOfMemory { rows, bytes } if rows == 1 << 24 && bytes == 1 << 49
        ));
        assert!(error.to_string().contains("pass fewer slots per call"));
    }

    #[test]
    fn copying_more_rows_than_the_host_holds_is_an_error_and_copies_nothing() {
        let (mut pool, src) = pool_and_slots_past_host_memory();
        let dst = vec![0; src.len()];
        let error = pool.copy_slots(&src, &dst).expect_err("2^49 bytes refused");
        assert!(matches!(
            error,
            KvPoolError::HostRowsOutOfMemory { rows, bytes } if rows == 1 << 24 && bytes == 1 << 49
        ));
        for tensor in [KvTensor::K, KvTensor::V] {
            let buffer = pool.buffer(0, tensor).unwrap();
            let row_len = buffer.len() / 2;
            assert!(
                buffer[..row_len].iter().all(|&x| x == 0.0),
                "slot 0 untouched"
            );
            assert!(
                buffer[row_len..].iter().all(|&x| x != 0.0),
                "slot 1 as stored"
            );
        }
    }

    #[test]
    fn boxed_pool_has_the_requested_dtype() {
        for dtype in KvDtype::ALL {
            assert_eq!(new_host_pool(layout(), dtype).unwrap().dtype(), dtype);
        }
    }
}
