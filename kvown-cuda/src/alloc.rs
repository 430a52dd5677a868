//! [`CudaPagedAllocator`]: the paged slot allocator with its free list and request-to-token table
//! on the device, driven with the CPU allocator's shapes ([`ExtendShape`], [`DecodeShape`]).
//!
//! The host keeps only counts: the free list's head and length. Per-request page counts follow
//! from the host-side lengths, so the host checks for out-of-memory and computes every prefix sum
//! before the launch, and no step needs a device-to-host copy. The kernels write the new slots to
//! `out_cache_loc` and to the requests' table rows in the same launch.

use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use kvown_runtime::alloc::{AllocError, DecodeShape, ExtendShape, KvSlot, PageId, ReuseOrder};

use crate::detect::CudaDevice;
use crate::error::{CudaError, to_u32};

/// Threads per block of the allocation kernels.
const BLOCK: u32 = 256;

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
/// Each call validates its whole input on the host first and changes nothing on `Err`. Unlike the
/// CPU allocator it keeps no per-page state, so it cannot detect a `last_loc` outside an
/// allocated page or a double free of a page while others are still out (a free that would
/// overfill the free list is rejected).
#[derive(Debug)]
pub struct CudaPagedAllocator<R: ReuseOrder> {
    device: Arc<CudaDevice>,
    page_size: usize,
    num_pages: usize,
    free_pages: CudaSlice<u32>,
    free_head: usize,
    free_len: usize,
    req_to_token: CudaSlice<u32>,
    rows: usize,
    row_len: usize,
    reuse: PhantomData<R>,
}

fn launch_blocks(blocks: usize, threads: u32) -> Result<LaunchConfig, CudaError> {
    Ok(LaunchConfig {
        grid_dim: (to_u32("blocks", blocks)?, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    })
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
        if page_size == 0 {
            return Err(AllocError::ZeroPageSize.into());
        }
        let num_pages = size / page_size;
        let slot_end = (num_pages as u64 + 1) * page_size as u64;
        if slot_end > u64::from(u32::MAX) {
            return Err(AllocError::TooManySlots {
                num_pages,
                page_size,
                slot_end,
            }
            .into());
        }
        let table_len = rows.checked_mul(row_len).ok_or(CudaError::TooLarge {
            what: "rows * row_len",
            value: usize::MAX,
        })?;
        let stream = device.stream();
        let initial: Vec<u32> = (1..=num_pages as u32).collect();
        let free_pages = stream.clone_htod(&initial)?;
        let req_to_token = stream.alloc_zeros::<u32>(table_len.max(1))?;
        Ok(Self {
            device,
            page_size,
            num_pages,
            free_pages,
            free_head: 0,
            free_len: num_pages,
            req_to_token,
            rows,
            row_len,
            reuse: PhantomData,
        })
    }

    /// Slots per page.
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// Slots that can ever be handed out.
    pub fn capacity(&self) -> usize {
        self.num_pages * self.page_size
    }

    /// Slots free now (free pages × page size).
    pub fn available_size(&self) -> usize {
        self.free_len * self.page_size
    }

    fn out_of_memory(&self, pages: usize) -> CudaError {
        AllocError::OutOfMemory {
            requested: pages.saturating_mul(self.page_size),
            available: self.available_size(),
        }
        .into()
    }

    fn check_row(&self, request: usize, row: u32, end: usize) -> Result<(), CudaError> {
        if row as usize >= self.rows {
            return Err(CudaError::RowOutOfRange {
                request,
                row,
                rows: self.rows,
            });
        }
        if end > self.row_len {
            return Err(CudaError::RowOverflow {
                request,
                end,
                row_len: self.row_len,
            });
        }
        Ok(())
    }

    fn check_last_loc(
        &self,
        request: usize,
        last_loc: KvSlot,
        stored: usize,
    ) -> Result<(), CudaError> {
        let slot_end = (self.num_pages as u64 + 1) * self.page_size as u64;
        if u64::from(last_loc) >= slot_end || (last_loc as usize) < self.page_size {
            return Err(AllocError::LastLocNotAllocated { request, last_loc }.into());
        }
        if (last_loc as usize + 1) % self.page_size != stored % self.page_size {
            return Err(AllocError::LastLocMismatch {
                request,
                last_loc,
                prefix_len: stored,
                page_size: self.page_size,
            }
            .into());
        }
        Ok(())
    }

    /// Batched extend (sglang `alloc_extend`): request `i` gets slots for positions
    /// `[prefix_len, seq_len)`, written to the returned `out_cache_loc` (concatenated in batch
    /// order) and to `req_to_token[rows[i]][prefix_len..seq_len]`. Same slots as
    /// `PagedAllocator::alloc_extend` on the same free list.
    pub fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        rows: &[u32],
    ) -> Result<DeviceSlots, CudaError> {
        if reqs.len() != rows.len() {
            return Err(CudaError::RowCountMismatch {
                requests: reqs.len(),
                rows: rows.len(),
            });
        }
        let page_size = self.page_size;
        let mut params = Vec::with_capacity(reqs.len() * 6);
        let (mut out_start, mut page_start) = (0usize, 0usize);
        for (request, (shape, &row)) in reqs.iter().zip(rows).enumerate() {
            let ExtendShape {
                prefix_len,
                seq_len,
                ..
            } = *shape;
            let last = match shape.validate(request)? {
                None => 0,
                Some(last_loc) => {
                    self.check_last_loc(request, last_loc, prefix_len)?;
                    last_loc
                }
            };
            self.check_row(request, row, seq_len)?;
            let new_pages = seq_len.div_ceil(page_size) - prefix_len.div_ceil(page_size);
            params.extend([
                to_u32("prefix_len", prefix_len)?,
                to_u32("seq_len", seq_len)?,
                last,
                row,
                to_u32("out_start", out_start)?,
                to_u32("page_start", page_start)?,
            ]);
            out_start += seq_len - prefix_len;
            page_start += new_pages;
        }
        if page_start > self.free_len {
            return Err(self.out_of_memory(page_start));
        }
        if out_start == 0 {
            return Ok(DeviceSlots {
                slots: None,
                len: 0,
            });
        }
        let out = self.launch_alloc(true, &params, reqs.len(), out_start)?;
        self.consume(page_start);
        Ok(out)
    }

    /// Batched decode (sglang `alloc_decode`): one slot per request, `last_loc + 1` or, when
    /// `(seq_len - 1) % page_size == 0`, the first slot of the next free page; written to the
    /// returned `out_cache_loc` and to `req_to_token[rows[i]][seq_len - 1]`.
    pub fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        rows: &[u32],
    ) -> Result<DeviceSlots, CudaError> {
        if reqs.len() != rows.len() {
            return Err(CudaError::RowCountMismatch {
                requests: reqs.len(),
                rows: rows.len(),
            });
        }
        let mut params = Vec::with_capacity(reqs.len() * 4);
        let mut page_start = 0usize;
        for (request, (shape, &row)) in reqs.iter().zip(rows).enumerate() {
            let DecodeShape { seq_len, last_loc } = *shape;
            if seq_len < 2 {
                return Err(AllocError::DecodeSeqTooShort { request, seq_len }.into());
            }
            self.check_last_loc(request, last_loc, seq_len - 1)?;
            self.check_row(request, row, seq_len)?;
            params.extend([
                to_u32("seq_len", seq_len)?,
                last_loc,
                row,
                to_u32("page_start", page_start)?,
            ]);
            page_start += usize::from((seq_len - 1) % self.page_size == 0);
        }
        if page_start > self.free_len {
            return Err(self.out_of_memory(page_start));
        }
        if reqs.is_empty() {
            return Ok(DeviceSlots {
                slots: None,
                len: 0,
            });
        }
        let out = self.launch_alloc(false, &params, reqs.len(), reqs.len())?;
        self.consume(page_start);
        Ok(out)
    }

    fn consume(&mut self, pages: usize) {
        self.free_head = (self.free_head + pages) % self.num_pages.max(1);
        self.free_len -= pages;
    }

    /// Uploads `params` and launches `alloc_extend` (`extend`) or `alloc_decode`.
    fn launch_alloc(
        &mut self,
        extend: bool,
        params: &[u32],
        num_reqs: usize,
        out_len: usize,
    ) -> Result<DeviceSlots, CudaError> {
        let stream = self.device.stream().clone();
        let params = stream.clone_htod(params)?;
        let num_reqs = to_u32("requests", num_reqs)?;
        let capacity = to_u32("num_pages", self.num_pages.max(1))?;
        let head = to_u32("free_head", self.free_head)?;
        let row_len = to_u32("row_len", self.row_len)?;
        let page_size = to_u32("page_size", self.page_size)?;
        // SAFETY: DeviceRepr u32 buffer; every element is written by the kernel below (each
        // request covers its own [out_start, out_start + extend_len) or its own index).
        let mut out = unsafe { stream.alloc::<u32>(out_len) }?;
        let kernels = &self.device.kernels;
        let (function, config) = if extend {
            (
                &kernels.alloc_extend,
                launch_blocks(num_reqs as usize, BLOCK)?,
            )
        } else {
            let blocks = (num_reqs as usize).div_ceil(BLOCK as usize);
            (&kernels.alloc_decode, launch_blocks(blocks, BLOCK)?)
        };
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&params)
            .arg(&num_reqs)
            .arg(&self.free_pages)
            .arg(&capacity)
            .arg(&head)
            .arg(&mut self.req_to_token)
            .arg(&row_len)
            .arg(&mut out)
            .arg(&page_size);
        // SAFETY: the argument list matches the kernel signature in alloc.cu; the host validated
        // every row, position and page offset, so all indices are in bounds.
        unsafe { launch.launch(config) }?;
        Ok(DeviceSlots {
            slots: Some(out),
            len: out_len,
        })
    }

    /// Frees the pages holding `slots` (each page once): `Lifo` puts them, sorted, at the head of
    /// the free list; `Fifo` appends them in first-appearance order. Same order as the CPU
    /// allocator's `free`.
    pub fn free(&mut self, slots: &[KvSlot]) -> Result<(), CudaError> {
        let slot_end = (self.num_pages as u64 + 1) * self.page_size as u64;
        let mut seen = vec![false; self.num_pages + 1];
        let mut pages: Vec<PageId> = Vec::new();
        for &slot in slots {
            if u64::from(slot) >= slot_end {
                return Err(AllocError::SlotOutOfRange { slot, slot_end }.into());
            }
            let page = slot as usize / self.page_size;
            if page == 0 {
                return Err(AllocError::ReservedSlot {
                    slot,
                    page_size: self.page_size,
                }
                .into());
            }
            if !std::mem::replace(&mut seen[page], true) {
                pages.push(page as PageId);
            }
        }
        if pages.is_empty() {
            return Ok(());
        }
        if self.free_len + pages.len() > self.num_pages {
            return Err(CudaError::FreeListOverflow {
                pages: pages.len(),
                free: self.free_len,
                num_pages: self.num_pages,
            });
        }
        let first = if R::FREED_FIRST {
            pages.sort_unstable();
            (self.free_head + self.num_pages - pages.len()) % self.num_pages
        } else {
            (self.free_head + self.free_len) % self.num_pages
        };
        let stream = self.device.stream().clone();
        let device_pages = stream.clone_htod(&pages)?;
        let count = to_u32("pages", pages.len())?;
        let capacity = to_u32("num_pages", self.num_pages)?;
        let first_u32 = to_u32("first", first)?;
        let mut launch = stream.launch_builder(&self.device.kernels.free_pages_write);
        launch
            .arg(&mut self.free_pages)
            .arg(&capacity)
            .arg(&first_u32)
            .arg(&device_pages)
            .arg(&count);
        let config = launch_blocks(pages.len().div_ceil(BLOCK as usize), BLOCK)?;
        // SAFETY: arguments match free_pages_write in alloc.cu; positions are taken modulo the
        // ring's length and the ring has room for every page (checked above).
        unsafe { launch.launch(config) }?;
        if R::FREED_FIRST {
            self.free_head = first;
        }
        self.free_len += pages.len();
        Ok(())
    }

    /// Writes `slots` to `req_to_token[row][start..start + slots.len()]` (the prefix part of
    /// sglang `write_cache_indices`, e.g. slots matched in the prefix cache).
    pub fn write_row(&mut self, row: u32, start: usize, slots: &[KvSlot]) -> Result<(), CudaError> {
        let end = start + slots.len();
        self.check_row(0, row, end)?;
        if slots.is_empty() {
            return Ok(());
        }
        let base = row as usize * self.row_len;
        let mut target = self.req_to_token.slice_mut(base + start..base + end);
        self.device.stream().memcpy_htod(slots, &mut target)?;
        Ok(())
    }

    /// Reads `req_to_token[row][..len]` back to the host (synchronises the stream).
    pub fn read_row(&self, row: u32, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        self.check_row(0, row, len)?;
        let base = row as usize * self.row_len;
        Ok(self
            .device
            .stream()
            .clone_dtoh(&self.req_to_token.slice(base..base + len))?)
    }

    /// The free list, head first, copied from the device (synchronises the stream).
    pub fn free_list(&self) -> Result<Vec<PageId>, CudaError> {
        if self.free_len == 0 {
            return Ok(Vec::new());
        }
        let ring = self.device.stream().clone_dtoh(&self.free_pages)?;
        Ok((0..self.free_len)
            .map(|k| ring[(self.free_head + k) % self.num_pages])
            .collect())
    }
}
