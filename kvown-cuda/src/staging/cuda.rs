//! [`CudaStepLink`]: the staging ring in pinned host memory, shipped to a device table by one
//! async copy and one `scatter_step` launch per packet, on a stream of its own.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{
    CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, PinnedHostSlice, result,
};
use kvown_runtime::alloc::KvSlot;
use kvown_runtime::slots::ReqRow;

use super::mirror::ReadBack;
use super::packet::HEADER;
use super::ring::StepLink;
use crate::detect::CudaDevice;
use crate::error::CudaError;

/// Threads per block of `scatter_step`.
const BLOCK: u32 = 256;
/// Most blocks of one `scatter_step` launch (its loops stride over the rest).
const MAX_BLOCKS: u32 = 1024;

/// The `(blocks, threads per block)` of the `scatter_step` launch that ships a packet of
/// `words` words: a thread per word, up to 1,024 blocks (the kernel's loops stride over the
/// rest), so that a decode write or a run's slot gets a thread of its own.
pub fn scatter_launch(words: usize) -> (u32, u32) {
    let blocks = u32::try_from(words.div_ceil(BLOCK as usize)).unwrap_or(MAX_BLOCKS);
    (blocks.clamp(1, MAX_BLOCKS), BLOCK)
}

/// The GPU's [`StepLink`]: `depth` ring slots of pinned host memory, a device packet buffer per
/// slot, the device request-to-token table, and an event per slot recorded after its packet's
/// copy and scatter. Every call is asynchronous on the link's own stream (order other work that
/// reads the table or an `out_cache_loc` after it with [`CudaStepLink::stream`]); nothing is
/// allocated per packet.
///
/// With [`CudaStepLink::capture_decode_graphs`], a decode packet of up to a fixed batch is
/// shipped by replaying a captured CUDA graph of the slot's copy and scatter: the buffers sit
/// at fixed addresses, and the kernel reads the packet's counts from the packet.
pub struct CudaStepLink {
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    /// Ring slots; `host` holds their addresses, taken once.
    _pinned: Vec<PinnedHostSlice<u32>>,
    host: Vec<*mut u32>,
    packets: Vec<CudaSlice<u32>>,
    packet_ptrs: Vec<CUdeviceptr>,
    table: CudaSlice<u32>,
    table_ptr: CUdeviceptr,
    events: Vec<CudaEvent>,
    slot_words: usize,
    rows: usize,
    width: usize,
    graphs: Vec<CudaGraph>,
    graph_batch: Option<usize>,
}

// SAFETY: the raw pointers are the addresses of the pinned slots this link owns (`_pinned`),
// written only through `&mut self`; nothing else refers to them.
unsafe impl Send for CudaStepLink {}

impl std::fmt::Debug for CudaStepLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaStepLink")
            .field("device", &self.device.name())
            .field("depth", &self.host.len())
            .field("slot_words", &self.slot_words)
            .field("table", &(self.rows, self.width))
            .field("graph_batch", &self.graph_batch)
            .finish()
    }
}

impl CudaStepLink {
    /// A ring of `depth` slots of `slot_words` words, and a zeroed device table of `rows` rows
    /// of `width` positions (a `ReqToTokenPool` of `rows - 1` requests).
    pub fn new(
        device: Arc<CudaDevice>,
        depth: usize,
        slot_words: usize,
        rows: usize,
        width: usize,
    ) -> Result<Self, CudaError> {
        let entries = rows
            .checked_mul(width)
            .filter(|&entries| entries <= 1 << 32)
            .ok_or(CudaError::TooLarge {
                what: "request-to-token table entries",
                value: rows.saturating_mul(width),
            })?;
        if depth == 0 || u32::try_from(slot_words).is_err() || slot_words < HEADER {
            return Err(CudaError::TooLarge {
                what: "staging slot words (or a ring of no slot)",
                value: slot_words,
            });
        }
        let stream = device.context().new_stream()?;
        let table = stream.alloc_zeros::<u32>(entries)?;
        let table_ptr = raw_ptr(&table, &stream);
        let (mut pinned, mut host, mut packets, mut packet_ptrs, mut events) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for _ in 0..depth {
            // SAFETY: the slot is written by the ring before any of it is shipped.
            let mut slot = unsafe { device.context().alloc_pinned::<u32>(slot_words) }?;
            host.push(slot.as_mut_ptr()?);
            pinned.push(slot);
            let packet = stream.alloc_zeros::<u32>(slot_words)?;
            packet_ptrs.push(raw_ptr(&packet, &stream));
            packets.push(packet);
            events.push(device.context().new_event(None)?);
        }
        Ok(CudaStepLink {
            device,
            stream,
            _pinned: pinned,
            host,
            packets,
            packet_ptrs,
            table,
            table_ptr,
            events,
            slot_words,
            rows,
            width,
            graphs: Vec::new(),
            graph_batch: None,
        })
    }

    /// The stream packets are shipped on: work that reads the table or an `out_cache_loc`
    /// goes after them on it (or waits for it).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device request-to-token table, row after row.
    pub fn table(&self) -> &CudaSlice<u32> {
        &self.table
    }

    /// Ring slot `k`'s device packet (its `out_cache_loc` starts at word [`HEADER`]).
    pub fn packet(&self, k: usize) -> &CudaSlice<u32> {
        &self.packets[k]
    }

    /// Captures, for every ring slot, a CUDA graph of the copy and the scatter of a decode
    /// packet of up to `batch` requests; decode packets are then laid out at fixed offsets
    /// and shipped by replaying their slot's graph. Each replay copies `HEADER + 2 * batch`
    /// words whatever the batch.
    pub fn capture_decode_graphs(&mut self, batch: usize) -> Result<(), CudaError> {
        let words = HEADER + 2 * batch;
        if words > self.slot_words {
            return Err(CudaError::TooLarge {
                what: "decode graph batch (two words per request must fit a slot)",
                value: batch,
            });
        }
        self.stream.synchronize()?;
        let mut graphs = Vec::with_capacity(self.host.len());
        for k in 0..self.host.len() {
            self.stream
                .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            let queued = self.copy_and_scatter(k, words);
            let graph = self.stream.end_capture(sys::CUgraphInstantiate_flags(0));
            queued?;
            let graph = graph?.ok_or(CudaError::TooLarge {
                what: "an empty decode graph for slot",
                value: k,
            })?;
            graph.upload()?;
            graphs.push(graph);
        }
        self.graphs = graphs;
        self.graph_batch = Some(batch);
        Ok(())
    }

    /// Queues slot `k`'s copy of `words` words to its device packet and the scatter.
    fn copy_and_scatter(&self, k: usize, words: usize) -> Result<(), CudaError> {
        let cu_stream = self.stream.cu_stream();
        // SAFETY: `host[k]` is a pinned allocation of `slot_words >= words` words that this
        // link owns; the ring does not write it again before this slot's event completes.
        let source = unsafe { std::slice::from_raw_parts(self.host[k], words) };
        // SAFETY: the destination is slot `k`'s device packet, `slot_words` words long.
        unsafe { result::memcpy_htod_async(self.packet_ptrs[k], source, cu_stream) }?;
        let (blocks, threads) = scatter_launch(words);
        let (mut packet, mut table) = (self.packet_ptrs[k], self.table_ptr);
        let mut row_stride = self.width as u32;
        let mut table_len = (self.rows * self.width) as u64;
        let mut params: [*mut c_void; 4] = [
            (&raw mut packet).cast(),
            (&raw mut table).cast(),
            (&raw mut row_stride).cast(),
            (&raw mut table_len).cast(),
        ];
        let function = self.device.kernels.scatter_step.cu_function();
        // SAFETY: the parameters match `scatter_step(const u32*, u32*, u32, u64)`; both
        // pointers are live device allocations of this link.
        unsafe {
            result::launch_kernel(
                function,
                (blocks, 1, 1),
                (threads, 1, 1),
                0,
                cu_stream,
                &mut params,
            )
        }?;
        Ok(())
    }
}

/// A device allocation's address, taken once (cudarc's bookkeeping for it is done here).
fn raw_ptr(slice: &CudaSlice<u32>, stream: &CudaStream) -> CUdeviceptr {
    let (ptr, _record) = slice.device_ptr(stream);
    ptr
}

impl StepLink for CudaStepLink {
    fn depth(&self) -> usize {
        self.host.len()
    }

    fn slot_words(&self) -> usize {
        self.slot_words
    }

    fn table_shape(&self) -> (usize, usize) {
        (self.rows, self.width)
    }

    fn decode_graph_batch(&self) -> Option<usize> {
        self.graph_batch
    }

    fn slot_mut(&mut self, k: usize) -> &mut [u32] {
        // SAFETY: as in `copy_and_scatter`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.host[k], self.slot_words) }
    }

    fn ship(&mut self, k: usize, words: usize, graph: bool) -> Result<(), CudaError> {
        match graph {
            true => self.graphs[k].launch()?,
            false => self.copy_and_scatter(k, words)?,
        }
        self.events[k].record(&self.stream)?;
        Ok(())
    }

    fn is_free(&self, k: usize) -> Result<bool, CudaError> {
        Ok(self.events[k].try_is_complete()?)
    }

    fn wait_free(&mut self, k: usize) -> Result<(), CudaError> {
        Ok(self.events[k].synchronize()?)
    }
}

impl ReadBack for CudaStepLink {
    fn read_row(&self, row: ReqRow, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        let start = row * self.width;
        Ok(self
            .stream
            .clone_dtoh(&self.table.slice(start..start + len))?)
    }

    fn read_out(&self, slot: usize, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        Ok(self
            .stream
            .clone_dtoh(&self.packets[slot].slice(HEADER..HEADER + len))?)
    }
}
