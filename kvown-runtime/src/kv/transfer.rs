//! Moving a request's K/V from a prefill node's pool to a decode node's ([`KvTransfer`]), for
//! prefill/decode disaggregation. [`LocalTransfer`] does it in one process; a transfer engine
//! between machines sits behind the same trait.
//!
//! The decode side preallocates the request's row and slots first
//! ([`crate::batch::prealloc_for_transfer`]), which gives the destination slots; the sender
//! knows its source slots from the request's row. Both lists are in position order, so slot
//! `src[i]`'s K and V rows (every layer) go to `dst[i]`.
//!
//! How an existing engine fits: NIXL registers both pools' buffers once and posts one
//! descriptor list per request (a `(address, length)` pair per layer, K and V, and slot run);
//! Mooncake's transfer engine does the same with its batch transfer API. `submit` posts the
//! descriptors and returns at once, `poll` reports the completions (or failures) the engine
//! has seen, and the decode side then commits ([`crate::batch::commit_transfer`]) or cancels
//! ([`crate::batch::cancel_transfer`]) each request.

use super::{KvPool, KvPoolError};
use crate::ids::KvSlot;

/// Names one submitted transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransferId(pub u64);

/// Why a transfer was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    /// The two slot lists differ in length.
    #[error("{src} source slots but {dst} destination slots: a transfer pairs them one to one")]
    LengthMismatch {
        /// Source slots.
        src: usize,
        /// Destination slots.
        dst: usize,
    },
    /// The two pools do not hold the same rows (layers, heads, dims or dtype differ).
    #[error(
        "the sender's and the receiver's pools differ in shape ({detail}); both must hold the same model's K/V"
    )]
    PoolMismatch {
        /// What differs.
        detail: String,
    },
    /// A pool refused a read or a write (a slot past its end, say).
    #[error("a pool refused the transfer: {0}")]
    Pool(#[from] KvPoolError),
    /// The transfer engine reports a failure.
    #[error("the transfer failed: {0}")]
    Failed(String),
}

/// Moves K/V rows between a sender's pool and a receiver's.
///
/// # Examples
///
/// ```
/// # use kvown_runtime::kv::{HostKvPool, KvLayout, KvTransfer, LocalTransfer};
/// # let layout = KvLayout::new(1, 1, 2, 8, 4)?;
/// # let pool = || HostKvPool::<f32>::new(layout).map(Box::new);
/// let mut link = LocalTransfer::new(pool()?, pool()?)?;
/// let id = link.submit(&[4, 5], &[8, 9])?; // may return before the rows moved
/// let mut done = Vec::new();
/// link.poll(&mut done); // then reports each ended transfer once
/// assert_eq!(done.len(), 1);
/// assert!(done[0].0 == id && done[0].1.is_ok());
/// assert!(link.submit(&[4, 5], &[8]).is_err(), "the lists pair slots one to one");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub trait KvTransfer {
    /// Starts moving the K and V rows of every layer of `src` (sender slots) to `dst`
    /// (receiver slots), pairwise. May return before the data has moved.
    fn submit(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<TransferId, TransferError>;
    /// Appends to `done` the transfers that ended since the last call, each with its outcome.
    fn poll(&mut self, done: &mut Vec<(TransferId, Result<(), TransferError>)>);
}

/// A prefill pool and a decode pool in one process: [`KvTransfer::submit`] copies the rows
/// layer by layer at once (all or nothing: every layer is read before any is written), and
/// [`KvTransfer::poll`] reports it done. [`LocalTransfer::fail_next`] makes the next submitted
/// transfer fail without copying, as a broken link would.
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::{HostKvPool, KvLayout, KvPool, KvSlice, KvTransfer, LocalTransfer};
///
/// let layout = KvLayout::new(1, 1, 2, 8, 4)?;
/// let (prefill, decode) = (HostKvPool::<f32>::new(layout)?, HostKvPool::<f32>::new(layout)?);
/// let mut link = LocalTransfer::new(Box::new(prefill), Box::new(decode))?;
/// link.prefill_pool().store_kv(0, &[4], KvSlice::F32(&[1.0, 2.0]), KvSlice::F32(&[3.0, 4.0]))?;
/// let id = link.submit(&[4], &[9])?; // prefill slot 4 to decode slot 9
/// let mut done = Vec::new();
/// link.poll(&mut done);
/// assert!(matches!(done[..], [(ended, Ok(()))] if ended == id));
/// let (k, _) = link.decode_pool().load_kv(0, &[9])?;
/// assert_eq!(k.into_vec::<f32>().unwrap(), [1.0, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct LocalTransfer {
    prefill: Box<dyn KvPool>,
    decode: Box<dyn KvPool>,
    next_id: u64,
    ended: Vec<(TransferId, Result<(), TransferError>)>,
    fail_next: bool,
}

impl std::fmt::Debug for LocalTransfer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTransfer")
            .field("layout", self.prefill.layout())
            .field("next_id", &self.next_id)
            .field("pending", &self.ended.len())
            .finish()
    }
}

impl LocalTransfer {
    /// Pairs `prefill` (the sender) with `decode` (the receiver); their layouts' rows and
    /// dtypes must agree.
    pub fn new(prefill: Box<dyn KvPool>, decode: Box<dyn KvPool>) -> Result<Self, TransferError> {
        let (from, to) = (prefill.layout(), decode.layout());
        let shape = |l: &super::KvLayout| {
            (
                l.layers(),
                l.row_len(super::KvTensor::K),
                l.row_len(super::KvTensor::V),
            )
        };
        if shape(from) != shape(to) || prefill.dtype() != decode.dtype() {
            return Err(TransferError::PoolMismatch {
                detail: format!(
                    "(layers, K row, V row, dtype): sender {:?} {:?}, receiver {:?} {:?}",
                    shape(from),
                    prefill.dtype(),
                    shape(to),
                    decode.dtype()
                ),
            });
        }
        Ok(LocalTransfer {
            prefill,
            decode,
            next_id: 0,
            ended: Vec::new(),
            fail_next: false,
        })
    }

    /// The sender's pool, where the prefill side stores its K/V.
    pub fn prefill_pool(&mut self) -> &mut dyn KvPool {
        self.prefill.as_mut()
    }

    /// The receiver's pool, where the decode side stores and reads its K/V.
    pub fn decode_pool(&mut self) -> &mut dyn KvPool {
        self.decode.as_mut()
    }

    /// Makes the next submitted transfer fail, copying nothing.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::kv::{HostKvPool, KvLayout, KvTransfer, LocalTransfer};
    /// # let layout = KvLayout::new(1, 1, 2, 8, 4)?;
    /// # let pool = || HostKvPool::<f32>::new(layout).map(Box::new);
    /// let mut link = LocalTransfer::new(pool()?, pool()?)?;
    /// link.fail_next();
    /// link.submit(&[4], &[9])?;
    /// let mut done = Vec::new();
    /// link.poll(&mut done);
    /// assert!(done[0].1.is_err(), "the link dropped");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn fail_next(&mut self) {
        self.fail_next = true;
    }

    fn copy(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), TransferError> {
        let layers = self.prefill.layout().layers();
        let rows = (0..layers)
            .map(|layer| self.prefill.load_kv(layer, src))
            .collect::<Result<Vec<_>, _>>()?;
        for (layer, (k, v)) in rows.iter().enumerate() {
            self.decode
                .store_kv(layer, dst, k.as_slice(), v.as_slice())?;
        }
        Ok(())
    }
}

impl KvTransfer for LocalTransfer {
    fn submit(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<TransferId, TransferError> {
        if src.len() != dst.len() {
            return Err(TransferError::LengthMismatch {
                src: src.len(),
                dst: dst.len(),
            });
        }
        let id = TransferId(self.next_id);
        self.next_id += 1;
        let outcome = match std::mem::take(&mut self.fail_next) {
            true => Err(TransferError::Failed(
                "the link dropped (LocalTransfer::fail_next)".into(),
            )),
            false => self.copy(src, dst),
        };
        self.ended.push((id, outcome));
        Ok(id)
    }

    fn poll(&mut self, done: &mut Vec<(TransferId, Result<(), TransferError>)>) {
        done.append(&mut self.ended);
    }
}

/// A K/V pool with several owners: clones share one pool (behind a mutex), so a node can store
/// and read its K/V through one clone while a [`LocalTransfer`] writes into it through another.
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::{HostKvPool, KvLayout, KvPool, KvSlice, SharedPool};
///
/// let pool = HostKvPool::<f32>::new(KvLayout::new(1, 1, 2, 8, 4)?)?;
/// let mut writer = SharedPool::new(Box::new(pool));
/// let reader = writer.clone();
/// writer.store_kv(0, &[4], KvSlice::F32(&[1.0, 2.0]), KvSlice::F32(&[0.0; 2]))?;
/// assert_eq!(reader.load_kv(0, &[4])?.0.into_vec::<f32>().unwrap(), [1.0, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Clone)]
pub struct SharedPool {
    pool: std::sync::Arc<std::sync::Mutex<Box<dyn KvPool>>>,
    layout: super::KvLayout,
    dtype: super::KvDtype,
}

impl std::fmt::Debug for SharedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPool")
            .field("layout", &self.layout)
            .field("dtype", &self.dtype)
            .finish()
    }
}

impl SharedPool {
    /// Shares `pool`.
    pub fn new(pool: Box<dyn KvPool>) -> Self {
        let (layout, dtype) = (*pool.layout(), pool.dtype());
        SharedPool {
            pool: std::sync::Arc::new(std::sync::Mutex::new(pool)),
            layout,
            dtype,
        }
    }

    /// The pool, locked. A clone whose holder panicked mid-call poisons nothing here: every
    /// pool call validates before it writes, so the pool is whole whatever the panic.
    fn lock(&self) -> std::sync::MutexGuard<'_, Box<dyn KvPool>> {
        self.pool
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl KvPool for SharedPool {
    fn layout(&self) -> &super::KvLayout {
        &self.layout
    }

    fn dtype(&self) -> super::KvDtype {
        self.dtype
    }

    fn store_kv(
        &mut self,
        layer: usize,
        slots: &[KvSlot],
        k: super::KvSlice<'_>,
        v: super::KvSlice<'_>,
    ) -> Result<(), KvPoolError> {
        self.lock().store_kv(layer, slots, k, v)
    }

    fn load_kv(
        &self,
        layer: usize,
        slots: &[KvSlot],
    ) -> Result<(super::KvData, super::KvData), KvPoolError> {
        self.lock().load_kv(layer, slots)
    }

    fn copy_slots(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError> {
        self.lock().copy_slots(src, dst)
    }

    fn copy_pages(
        &mut self,
        src: &[crate::ids::PageId],
        dst: &[crate::ids::PageId],
    ) -> Result<(), KvPoolError> {
        self.lock().copy_pages(src, dst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{KvData, KvDtype, KvLayout, KvSlice, new_host_pool};

    fn pool() -> Box<dyn KvPool> {
        new_host_pool(KvLayout::new(2, 1, 2, 8, 4).unwrap(), KvDtype::F32).unwrap()
    }

    /// A row stored through one clone of a shared pool is what a transfer reads from another,
    /// and lands in the receiver's pool, where the receiver's own clone reads it.
    #[test]
    fn shared_pools_and_a_local_transfer_move_rows_between_owners() {
        let (prefill, decode) = (SharedPool::new(pool()), SharedPool::new(pool()));
        let mut link =
            LocalTransfer::new(Box::new(prefill.clone()), Box::new(decode.clone())).unwrap();
        let mut writer = prefill.clone();
        for layer in 0..2 {
            let k = [layer as f32, 1.0, 2.0, 3.0];
            writer
                .store_kv(layer, &[4, 5], KvSlice::F32(&k), KvSlice::F32(&[9.0; 4]))
                .unwrap();
        }
        let id = link.submit(&[4, 5], &[6, 7]).unwrap();
        let mut done = Vec::new();
        link.poll(&mut done);
        assert!(matches!(done.as_slice(), [(ended, Ok(()))] if *ended == id));
        let (k, v) = decode.load_kv(1, &[6, 7]).unwrap();
        assert_eq!(k, KvData::F32(vec![1.0, 1.0, 2.0, 3.0]));
        assert_eq!(v, KvData::F32(vec![9.0; 4]));
        assert!(matches!(
            link.submit(&[4], &[6, 7]),
            Err(TransferError::LengthMismatch { src: 1, dst: 2 })
        ));
        link.fail_next();
        let failed = link.submit(&[4], &[3]).unwrap();
        link.poll(&mut done);
        assert!(matches!(done.last(), Some((id, Err(TransferError::Failed(_)))) if *id == failed));
        assert_eq!(
            decode.load_kv(0, &[3]).unwrap().0,
            KvData::F32(vec![0.0; 2])
        );
    }
}
