//! [`CudaPagedAllocator`]: the paged slot allocator with its free list and request-to-token table
//! on the device, driven with the CPU allocator's shapes ([`ExtendShape`], [`DecodeShape`]).
//!
//! The host keeps only counts: the free list's head and length. Per-request page counts follow
//! from the host-side lengths, so the host checks for out-of-memory and computes every prefix sum
//! before the launch, and no step needs a device-to-host copy. The kernels write the new slots to
//! `out_cache_loc` and to the requests' table rows in the same launch.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, LaunchConfig, PushKernelArg};
use kvown_runtime::alloc::{DecodeShape, ExtendShape, KvSlot, PageId, ReuseOrder};

use crate::detect::CudaDevice;
use crate::error::{CudaError, to_u32};
use crate::plan::{ALLOC_BLOCK, AllocPlan, AllocPlanner, FreePlan};

/// Slots allocated by one batched call, on the device (the batch's `out_cache_loc`).
#[derive(Debug)]
pub struct DeviceSlots {
    slots: Option<CudaSlice<u32>>,
    len: usize,
}

impl DeviceSlots {
    /// Number of slots.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the batch allocated nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device buffer, `None` when empty.
    pub fn device(&self) -> Option<&CudaSlice<u32>> {
        self.slots.as_ref()
    }

    /// Copies the slots to the host (synchronises the stream).
    pub fn to_host(&self, device: &CudaDevice) -> Result<Vec<KvSlot>, CudaError> {
        match &self.slots {
            Some(slots) => Ok(device.stream().clone_dtoh(slots)?),
            None => Ok(Vec::new()),
        }
    }
}

/// Paged allocator on the device with reuse order `R` (`Lifo`: freed pages reused first, as
/// `PagedAllocator`; `Fifo`: reused last, as `TokenAllocator`), plus the request-to-token table
/// (`rows` rows of `row_len` slots, zero-initialised). Pages are `1..=num_pages`; page 0 is padding.
///
/// Each call is planned and validated on the host by an [`AllocPlanner`] first and changes
/// nothing on `Err`. Unlike the CPU allocator it keeps no per-page state, so it cannot detect a
/// `last_loc` outside an allocated page or a double free of a page while others are still out (a
/// free that would overfill the free list is rejected).
///
/// A call allocates no device memory but its `out_cache_loc`: its kernel inputs go through a
/// staging buffer the allocator keeps (grown when a batch needs more). Every call runs on the
/// device's one stream, so an upload always waits for the launch that read the previous one.
#[derive(Debug)]
pub struct CudaPagedAllocator<R: ReuseOrder> {
    device: Arc<CudaDevice>,
    planner: AllocPlanner<R>,
    free_pages: CudaSlice<u32>,
    req_to_token: CudaSlice<u32>,
    staging: CudaSlice<u32>,
}

/// Copies `words` to the front of `staging`, replacing it by a larger buffer (the next power of
/// two) when it is too short, and returns the device view of them.
fn stage<'a>(
    stream: &Arc<CudaStream>,
    staging: &'a mut CudaSlice<u32>,
    words: &[u32],
) -> Result<CudaView<'a, u32>, CudaError> {
    if staging.len() < words.len() {
        // SAFETY: u32 is DeviceRepr; a launch reads only the prefix copied below.
        *staging = unsafe { stream.alloc::<u32>(words.len().next_power_of_two()) }?;
    }
    stream.memcpy_htod(words, &mut staging.slice_mut(..words.len()))?;
    Ok(staging.slice(..words.len()))
}

fn launch_blocks(blocks: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (ALLOC_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl<R: ReuseOrder> CudaPagedAllocator<R> {
    /// An allocator over `size / page_size` pages, all free in order `[1, 2, …]`, and a table of
    /// `rows × row_len` zero slots.
    pub fn new(
        device: Arc<CudaDevice>,
        size: usize,
        page_size: usize,
        rows: usize,
        row_len: usize,
    ) -> Result<Self, CudaError> {
        let planner = AllocPlanner::new(size, page_size, rows, row_len)?;
        let stream = device.stream();
        let initial: Vec<u32> = (1..=planner.num_pages() as u32).collect();
        let free_pages = stream.clone_htod(&initial)?;
        let req_to_token = stream.alloc_zeros::<u32>((rows * row_len).max(1))?;
        let staging = stream.alloc_zeros::<u32>(1)?;
        Ok(Self {
            device,
            planner,
            free_pages,
            req_to_token,
            staging,
        })
    }

    /// The host-side state: free-list head and length, table shape.
    pub fn planner(&self) -> &AllocPlanner<R> {
        &self.planner
    }

    /// Slots free now (free pages × page size).
    pub fn available_size(&self) -> usize {
        self.planner.available_size()
    }

    /// Batched extend (sglang `alloc_extend`): request `i` gets slots for positions
    /// `[prefix_len, seq_len)`, written to the returned `out_cache_loc` (concatenated in batch
    /// order) and to `req_to_token[rows[i]][prefix_len..seq_len]` (no row for
    /// [`NO_ROW`](crate::NO_ROW)). Same slots as `PagedAllocator::alloc_extend` on the same
    /// free list.
    pub fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        rows: &[u32],
    ) -> Result<DeviceSlots, CudaError> {
        let plan = self.planner.plan_extend(reqs, rows)?;
        self.launch_alloc(true, plan)
    }

    /// Batched decode (sglang `alloc_decode`): one slot per request, `last_loc + 1` or, when
    /// `(seq_len - 1) % page_size == 0`, the first slot of the next free page; written to the
    /// returned `out_cache_loc` and to `req_to_token[rows[i]][seq_len - 1]` (no row for
    /// [`NO_ROW`](crate::NO_ROW)).
    pub fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        rows: &[u32],
    ) -> Result<DeviceSlots, CudaError> {
        let plan = self.planner.plan_decode(reqs, rows)?;
        self.launch_alloc(false, plan)
    }

    /// Uploads `plan`, launches `alloc_extend` (`extend`) or `alloc_decode`, and commits it.
    fn launch_alloc(&mut self, extend: bool, plan: AllocPlan) -> Result<DeviceSlots, CudaError> {
        if plan.out_len == 0 {
            return Ok(DeviceSlots {
                slots: None,
                len: 0,
            });
        }
        let stream = self.device.stream().clone();
        let params = stage(&stream, &mut self.staging, &plan.params)?;
        let capacity = to_u32("num_pages", self.planner.num_pages().max(1))?;
        let row_len = to_u32("row_len", self.planner.row_len())?;
        let page_size = to_u32("page_size", self.planner.page_size())?;
        // SAFETY: DeviceRepr u32 buffer; every element is written by the kernel below (each
        // request covers its own [out_start, out_start + extend_len) or its own index).
        let mut out = unsafe { stream.alloc::<u32>(plan.out_len) }?;
        let kernels = &self.device.kernels;
        let function = if extend {
            &kernels.alloc_extend
        } else {
            &kernels.alloc_decode
        };
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&params)
            .arg(&plan.num_reqs)
            .arg(&self.free_pages)
            .arg(&capacity)
            .arg(&plan.free_head)
            .arg(&mut self.req_to_token)
            .arg(&row_len)
            .arg(&mut out)
            .arg(&page_size);
        // SAFETY: the argument list matches the kernel signature in alloc.cu; the planner
        // validated every row, position and page offset, so all indices are in bounds.
        unsafe { launch.launch(launch_blocks(plan.blocks)) }?;
        self.planner.commit(&plan);
        Ok(DeviceSlots {
            slots: Some(out),
            len: plan.out_len,
        })
    }

    /// Frees the pages holding `slots` (each page once): `Lifo` puts them, sorted, at the head of
    /// the free list; `Fifo` appends them in first-appearance order. Same order as the CPU
    /// allocator's `free`.
    pub fn free(&mut self, slots: &[KvSlot]) -> Result<(), CudaError> {
        let plan = self.planner.plan_free(slots)?;
        self.launch_free(plan)
    }

    /// Puts distinct `pages` on the free list in the order given: `Lifo` at the head (`pages[0]`
    /// becomes the head), `Fifo` at the tail (the CPU allocator's order for `free_segment`).
    pub fn free_pages(&mut self, pages: &[PageId]) -> Result<(), CudaError> {
        let plan = self.planner.plan_free_pages(pages)?;
        self.launch_free(plan)
    }

    /// Uploads the pages of `plan`, launches `free_pages_write`, and commits it.
    fn launch_free(&mut self, plan: Option<FreePlan>) -> Result<(), CudaError> {
        let Some(plan) = plan else {
            return Ok(());
        };
        let stream = self.device.stream().clone();
        let device_pages = stage(&stream, &mut self.staging, &plan.pages)?;
        let count = to_u32("pages", plan.pages.len())?;
        let capacity = to_u32("num_pages", self.planner.num_pages())?;
        let mut launch = stream.launch_builder(&self.device.kernels.free_pages_write);
        launch
            .arg(&mut self.free_pages)
            .arg(&capacity)
            .arg(&plan.first)
            .arg(&device_pages)
            .arg(&count);
        let blocks = to_u32("blocks", plan.pages.len().div_ceil(ALLOC_BLOCK as usize))?;
        // SAFETY: arguments match free_pages_write in alloc.cu; positions are taken modulo the
        // ring's length and the ring has room for every page (checked by the planner).
        unsafe { launch.launch(launch_blocks(blocks)) }?;
        self.planner.commit_free(&plan);
        Ok(())
    }

    /// Writes `slots` to `req_to_token[row][start..start + slots.len()]` (the prefix part of
    /// sglang `write_cache_indices`, e.g. slots matched in the prefix cache).
    pub fn write_row(&mut self, row: u32, start: usize, slots: &[KvSlot]) -> Result<(), CudaError> {
        let range = self.planner.row_range(row, start, slots.len())?;
        if slots.is_empty() {
            return Ok(());
        }
        let mut target = self.req_to_token.slice_mut(range);
        self.device.stream().memcpy_htod(slots, &mut target)?;
        Ok(())
    }

    /// Copies the slots of one of this allocator's allocations to the host (synchronises the
    /// stream).
    pub fn slots_to_host(&self, slots: &DeviceSlots) -> Result<Vec<KvSlot>, CudaError> {
        slots.to_host(&self.device)
    }

    /// Reads `req_to_token[row][..len]` back to the host (synchronises the stream).
    pub fn read_row(&self, row: u32, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        let range = self.planner.row_range(row, 0, len)?;
        Ok(self
            .device
            .stream()
            .clone_dtoh(&self.req_to_token.slice(range))?)
    }

    /// The free list, head first, copied from the device (synchronises the stream).
    pub fn free_list(&self) -> Result<Vec<PageId>, CudaError> {
        let (head, len, ring_len) = (
            self.planner.free_head(),
            self.planner.free_len(),
            self.planner.num_pages(),
        );
        if len == 0 {
            return Ok(Vec::new());
        }
        let ring = self.device.stream().clone_dtoh(&self.free_pages)?;
        Ok((0..len).map(|k| ring[(head + k) % ring_len]).collect())
    }
}
