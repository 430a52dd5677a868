//! [`RegisteredPool`]: a host K/V pool whose buffers are registered with a NIXL agent, so a
//! peer can read its rows and this node's transfers can write into them.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use half::{bf16, f16};
use kvown_runtime::ids::{KvSlot, PageId};
use kvown_runtime::kv::{
    HostKvPool, KvData, KvDtype, KvElement, KvLayout, KvPool, KvPoolError, KvSlice, KvTensor,
};

use crate::agent::{Agent, AgentInner};
use crate::descs::RegList;
use crate::error::NixlError;
use crate::ffi::check;
use crate::metadata::PoolDescriptor;

/// A host pool ([`HostKvPool`]) registered with an agent (`nixl_capi_register_mem`, one region
/// per layer and tensor). Clones share the pool; the last one dropped deregisters it, then
/// frees it. It is a [`KvPool`], so a node stores and reads its K/V through it as through any
/// pool.
///
/// The registration covers every buffer for the pool's whole life: a buffer never moves or
/// resizes ([`HostKvPool::buffer_mut`]). NIXL writes a row only inside this crate's calls on a
/// transfer that targets it (the agent has no progress thread), and those calls hold the pool's
/// lock, so no pool call runs while NIXL writes.
#[derive(Clone)]
pub struct RegisteredPool {
    inner: Arc<Mutex<Registered>>,
    descriptor: PoolDescriptor,
    layout: KvLayout,
    dtype: KvDtype,
}

impl std::fmt::Debug for RegisteredPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegisteredPool")
            .field("layout", &self.layout)
            .field("dtype", &self.dtype)
            .finish()
    }
}

/// The pool and its registration.
pub(crate) struct Registered {
    pool: Box<dyn KvPool>,
    agent: Arc<AgentInner>,
    regions: Vec<(usize, usize)>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        // Deregister before the buffers are freed (the pool drops after this body). A failure
        // cannot be acted on in a destructor: the agent forgets the regions when it is destroyed.
        let api = self.agent.api.as_ref();
        if let Ok(mut list) = RegList::new(api)
            && self
                .regions
                .iter()
                .all(|&(addr, len)| list.push(addr, len).is_ok())
        {
            // SAFETY: valid agent and list naming what `register` registered.
            unsafe {
                (api.nixl_capi_deregister_mem)(self.agent.raw, list.raw, std::ptr::null_mut());
            }
        }
    }
}

/// A host pool before registration: the pool, its buffers' regions `(address, bytes)` and
/// its descriptor.
struct HostPool {
    pool: Box<dyn KvPool>,
    regions: Vec<(usize, usize)>,
    descriptor: PoolDescriptor,
}

/// A zeroed host pool of `T`, its buffers' regions and its descriptor.
fn host_pool<T: KvElement>(layout: KvLayout) -> Result<HostPool, NixlError> {
    let mut pool = HostKvPool::<T>::new(layout).map_err(NixlError::Pool)?;
    let mut regions = Vec::with_capacity(2 * layout.layers());
    let (mut k_buffers, mut v_buffers) = (Vec::new(), Vec::new());
    for tensor in [KvTensor::K, KvTensor::V] {
        for layer in 0..layout.layers() {
            let buffer = pool.buffer_mut(layer, tensor).map_err(NixlError::Pool)?;
            let addr = buffer.as_mut_ptr() as usize;
            regions.push((addr, std::mem::size_of_val(buffer)));
            match tensor {
                KvTensor::K => k_buffers.push(addr as u64),
                KvTensor::V => v_buffers.push(addr as u64),
            }
        }
    }
    let element = T::DTYPE.size_bytes();
    let descriptor = PoolDescriptor {
        dtype: T::DTYPE.to_string(),
        slots: layout.slots(),
        k_row_bytes: layout.row_len(KvTensor::K) * element,
        v_row_bytes: layout.row_len(KvTensor::V) * element,
        k_buffers,
        v_buffers,
    };
    Ok(HostPool {
        pool: Box::new(pool),
        regions,
        descriptor,
    })
}

impl RegisteredPool {
    /// A zeroed host pool of `layout` and `dtype`, registered with `agent`. Fails as
    /// [`HostKvPool::new`] does, or when NIXL refuses the registration (nothing stays
    /// registered then).
    pub fn new(agent: &Agent, layout: KvLayout, dtype: KvDtype) -> Result<Self, NixlError> {
        let HostPool {
            pool,
            regions,
            descriptor,
        } = match dtype {
            KvDtype::F32 => host_pool::<f32>(layout)?,
            KvDtype::F16 => host_pool::<f16>(layout)?,
            KvDtype::Bf16 => host_pool::<bf16>(layout)?,
        };
        let api = agent.inner.api.as_ref();
        let mut list = RegList::new(api)?;
        for &(addr, len) in &regions {
            list.push(addr, len)?;
        }
        // SAFETY: valid agent and list; the regions are the pool's buffers, which live (at
        // these addresses) until `Registered::drop` deregisters them.
        check("nixl_capi_register_mem", unsafe {
            (api.nixl_capi_register_mem)(agent.inner.raw, list.raw, std::ptr::null_mut())
        })?;
        Ok(RegisteredPool {
            inner: Arc::new(Mutex::new(Registered {
                pool,
                agent: agent.inner.clone(),
                regions,
            })),
            descriptor,
            layout,
            dtype,
        })
    }

    /// Where the pool's rows are, for the peer ([`crate::Agent::metadata`]).
    pub fn descriptor(&self) -> &PoolDescriptor {
        &self.descriptor
    }

    /// The pool, locked: held across NIXL calls that may write its rows.
    pub(crate) fn lock(&self) -> MutexGuard<'_, Registered> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `agent` is the agent this pool is registered with.
    pub(crate) fn registered_with(&self, agent: &Agent) -> bool {
        Arc::ptr_eq(&self.lock().agent, &agent.inner)
    }
}

impl KvPool for RegisteredPool {
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
        self.lock().pool.store_kv(layer, slots, k, v)
    }

    fn load_kv(&self, layer: usize, slots: &[KvSlot]) -> Result<(KvData, KvData), KvPoolError> {
        self.lock().pool.load_kv(layer, slots)
    }

    fn copy_slots(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError> {
        self.lock().pool.copy_slots(src, dst)
    }

    fn copy_pages(&mut self, src: &[PageId], dst: &[PageId]) -> Result<(), KvPoolError> {
        self.lock().pool.copy_pages(src, dst)
    }
}
