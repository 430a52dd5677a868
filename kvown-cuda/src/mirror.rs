//! [`MirroredAllocator`]: the runtime's [`KvAllocator`] on a device. The host's
//! [`PageAllocator`] stays authoritative; every operation it accepts is replayed on a device half
//! ([`DeviceAllocOps`], [`CudaPagedAllocator`] on a GPU), so that the device free list, the device
//! request-to-token table and the device `out_cache_loc` equal the host's after every call,
//! without any device-to-host copy.
//!
//! The host goes first: it validates everything (per-page states, typed errors, nothing changed
//! on error), and the prefix cache and the invariant checker read slot values on the host. The
//! device half then replays what the host did:
//!
//! * an allocation takes as many pages from the head of the device free list as the host took
//!   from its own; the lists were equal, so the kernels produce the host's slots and write them
//!   to the device `out_cache_loc` and to the requests' device rows in the same launch;
//! * a free puts the pages the host has just put on its free list, read from the host list (its
//!   head for `Lifo`, its tail for `Fifo`), on the device list in the same order, so sorted
//!   frees, unsorted segment frees and free groups all come out the same;
//! * a row the batch flow writes outside an allocation ([`KvAllocator::row_written`]) is
//!   written to the device row.

use std::fmt::Debug;
use std::sync::Arc;

use kvown_runtime::alloc::{
    AllocError, AsPageAllocator, DecodeRow, DecodeShape, ExtendShape, KvAllocator, KvSlot,
    PageAllocator, PageId, ReuseOrder,
};
use kvown_runtime::slots::{ReqRow, ReqToTokenPool};

use crate::alloc::{CudaPagedAllocator, DeviceSlots};
use crate::detect::CudaDevice;
use crate::error::{CudaError, MirrorError};
use crate::plan::{NO_ROW, extend_fits_u32};

/// The device half of a [`MirroredAllocator`]: a paged allocator whose free list and
/// request-to-token table live where kernels read them, driven with operations the host
/// allocator has already accepted. [`CudaPagedAllocator`] implements it on a GPU.
///
/// Counts (`available_size`) are host-side bookkeeping of the device half: reading them copies
/// nothing from the device.
pub trait DeviceAllocOps {
    /// Reuse order of the device free list; the host allocator's must be the same.
    type Order: ReuseOrder;
    /// One allocation's `out_cache_loc`, where kernels read it.
    type Slots: Debug;

    /// Slots per page.
    fn page_size(&self) -> usize;
    /// Pages managed (page 0, the padding page, excluded).
    fn num_pages(&self) -> usize;
    /// Slots free now (free pages × page size).
    fn available_size(&self) -> usize;
    /// Rows of the device request-to-token table.
    fn rows(&self) -> usize;
    /// Slots per device request-to-token row.
    fn row_len(&self) -> usize;
    /// Batched extend as [`CudaPagedAllocator::alloc_extend`]: the next pages of the free list,
    /// slots to `out_cache_loc` and to `rows[i]` (none for [`NO_ROW`]).
    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        rows: &[u32],
    ) -> Result<Self::Slots, CudaError>;
    /// Batched decode as [`CudaPagedAllocator::alloc_decode`].
    fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        rows: &[u32],
    ) -> Result<Self::Slots, CudaError>;
    /// Puts distinct `pages` on the free list in the order given, as
    /// [`CudaPagedAllocator::free_pages`].
    fn free_pages(&mut self, pages: &[PageId]) -> Result<(), CudaError>;
    /// Writes `slots` to positions `start..` of `row`, as [`CudaPagedAllocator::write_row`].
    fn write_row(&mut self, row: u32, start: usize, slots: &[KvSlot]) -> Result<(), CudaError>;
    /// The free list, head first. Copies from the device: for checks, never needed by a step.
    fn free_list(&self) -> Result<Vec<PageId>, CudaError>;
    /// `row[..len]` of the device table. Copies from the device: for checks.
    fn read_row(&self, row: u32, len: usize) -> Result<Vec<KvSlot>, CudaError>;
    /// The slots of one allocation's `out_cache_loc`. Copies from the device: for checks.
    fn slots_to_host(&self, slots: &Self::Slots) -> Result<Vec<KvSlot>, CudaError>;
}

impl<R: ReuseOrder> DeviceAllocOps for CudaPagedAllocator<R> {
    type Order = R;
    type Slots = DeviceSlots;

    fn page_size(&self) -> usize {
        self.planner().page_size()
    }

    fn num_pages(&self) -> usize {
        self.planner().num_pages()
    }

    fn available_size(&self) -> usize {
        self.planner().available_size()
    }

    fn rows(&self) -> usize {
        self.planner().rows()
    }

    fn row_len(&self) -> usize {
        self.planner().row_len()
    }

    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        rows: &[u32],
    ) -> Result<DeviceSlots, CudaError> {
        CudaPagedAllocator::alloc_extend(self, reqs, rows)
    }

    fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        rows: &[u32],
    ) -> Result<DeviceSlots, CudaError> {
        CudaPagedAllocator::alloc_decode(self, reqs, rows)
    }

    fn free_pages(&mut self, pages: &[PageId]) -> Result<(), CudaError> {
        CudaPagedAllocator::free_pages(self, pages)
    }

    fn write_row(&mut self, row: u32, start: usize, slots: &[KvSlot]) -> Result<(), CudaError> {
        CudaPagedAllocator::write_row(self, row, start, slots)
    }

    fn free_list(&self) -> Result<Vec<PageId>, CudaError> {
        CudaPagedAllocator::free_list(self)
    }

    fn read_row(&self, row: u32, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        CudaPagedAllocator::read_row(self, row, len)
    }

    fn slots_to_host(&self, slots: &DeviceSlots) -> Result<Vec<KvSlot>, CudaError> {
        CudaPagedAllocator::slots_to_host(self, slots)
    }
}

/// A [`KvAllocator`] whose state is a host [`PageAllocator`] (authoritative: it validates, the
/// prefix cache and the checker read it) mirrored on a device half `D`. After every call the
/// device free list equals the host's, the device rows of the requests the batch flow allocated
/// for equal the host rows up to their allocated length, and [`MirroredAllocator::last_out_cache_loc`]
/// holds the slots of the last allocation on the device. Errors are the host's, and a call that
/// fails changes neither side.
///
/// Allocations without rows (`alloc`, `alloc_extend`, `alloc_decode`) write slots to the device
/// `out_cache_loc` only; the batch flow uses the `*_rows` variants.
///
/// # Panics
///
/// A call panics when the device fails to replay an operation the host has already applied (a
/// driver error): the host cannot take the operation back and the device copy would be stale
/// for good, so kernels must not read it. A batch whose rows do not fit the device table (a
/// caller bug: the batch flow's rows come from the table checked at construction) panics before
/// either side changes, and so does a rowless extend or decode whose positions the device's
/// `u32` positions cannot hold (an extend's `seq_len` rounded up to a page, a decode's
/// `seq_len`, past `u32::MAX`) unless the host is sure to refuse it (then it gets the host's
/// error).
#[derive(Debug)]
pub struct MirroredAllocator<D: DeviceAllocOps> {
    host: PageAllocator<D::Order>,
    device: D,
    last_out_cache_loc: Option<D::Slots>,
    /// The rows of the batch being replayed, as kernel indices.
    rows: Vec<u32>,
    /// The pages the host has just put on its free list, in list order.
    freed: Vec<PageId>,
}

impl<D: DeviceAllocOps> MirroredAllocator<D> {
    /// Mirrors `host` on `device`, for the request-to-token table `table`. Both allocators must
    /// be fresh (every page free, in the initial order, no open free group), have the same pages,
    /// and the device table must hold `table`'s rows. `need_sort` is refused: its release list
    /// is merged and sorted lazily on the host, which the device free list does not follow.
    /// The device free list is read back once to check its order
    /// ([`MirrorError::FreeListDiverged`] for a device that has every page back in another
    /// order).
    pub fn new(
        host: PageAllocator<D::Order>,
        device: D,
        table: &ReqToTokenPool,
    ) -> Result<Self, MirrorError> {
        if host.need_sort() {
            return Err(MirrorError::NeedSort);
        }
        let page_size = host.page_size();
        let num_pages = host.num_pages();
        if host.in_free_group() || !host.free_pages().eq(1..=num_pages as PageId) {
            return Err(MirrorError::HostInUse {
                free_pages: host.available_size() / page_size,
                num_pages,
                in_free_group: host.in_free_group(),
            });
        }
        if (device.page_size(), device.num_pages()) != (page_size, num_pages) {
            return Err(MirrorError::PoolMismatch {
                host_pages: num_pages,
                host_page_size: page_size,
                device_pages: device.num_pages(),
                device_page_size: device.page_size(),
            });
        }
        if device.available_size() != host.capacity() {
            return Err(MirrorError::DeviceInUse {
                free_pages: device.available_size() / page_size,
                num_pages,
            });
        }
        // Every page free is not enough: pages given back in another order would be handed
        // out in that order.
        let host_free: Vec<PageId> = host.free_pages().collect();
        same_free_lists(&host_free, &device.free_list()?)?;
        let (rows, row_len) = (table.size() + 1, table.max_context_len());
        if device.rows() < rows || device.row_len() < row_len {
            return Err(MirrorError::TableTooSmall {
                rows,
                row_len,
                device_rows: device.rows(),
                device_row_len: device.row_len(),
            });
        }
        Ok(Self {
            host,
            device,
            last_out_cache_loc: None,
            rows: Vec::new(),
            freed: Vec::new(),
        })
    }

    /// The host allocator, the authoritative state.
    pub fn host(&self) -> &PageAllocator<D::Order> {
        &self.host
    }

    /// The device half.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The device `out_cache_loc` of the last successful allocation (extend, decode,
    /// speculative reservation or plain `alloc`): the same slots, in the same order, as the host
    /// call appended to its `out`. `None` before the first allocation.
    pub fn last_out_cache_loc(&self) -> Option<&D::Slots> {
        self.last_out_cache_loc.as_ref()
    }

    /// Checks the device copy against the host by copying it back (for tests and checked runs,
    /// never needed by a step): the free list, and `row[..len]` of each `(row, len)` in `rows`
    /// against the host `table`. The first difference is the error.
    ///
    /// # Panics
    /// When a `(row, len)` is not a row of `table` at least `len` slots wide.
    pub fn verify(
        &self,
        table: &ReqToTokenPool,
        rows: impl IntoIterator<Item = (ReqRow, usize)>,
    ) -> Result<(), MirrorError> {
        let host_free: Vec<PageId> = self.host.free_pages().collect();
        same_free_lists(&host_free, &self.device.free_list()?)?;
        for (row, len) in rows {
            let host_row = table
                .row(row)
                .ok()
                .and_then(|slots| slots.get(..len))
                .unwrap_or_else(|| panic!("verify: row {row} of length {len} is not in the table"));
            let device_row = self.device.read_row(kernel_row(row), len)?;
            if let Some(position) = (0..len).find(|&i| host_row[i] != device_row[i]) {
                return Err(MirrorError::RowDiverged {
                    row,
                    position,
                    host: host_row[position],
                    device: device_row[position],
                });
            }
        }
        Ok(())
    }

    /// Takes the kernel rows of a batch into `self.rows`, before the host is asked: one row per
    /// request, with `ends`, the end of the positions each request's step writes. A row the
    /// device table lacks, an end past its rows' width, or a row count that differs from the
    /// requests' is a caller bug that panics here, with nothing changed on either side.
    fn set_rows(
        &mut self,
        rows: impl Iterator<Item = ReqRow>,
        ends: impl ExactSizeIterator<Item = usize>,
    ) {
        self.rows.clear();
        let count = ends.len();
        let (device_rows, row_len) = (self.device.rows(), self.device.row_len());
        let mut ends = ends;
        for row in rows {
            let row = kernel_row(row);
            let end = ends.next().expect("one request-to-token row per request");
            assert!(
                (row as usize) < device_rows,
                "request row {row} is outside the device table of {device_rows} rows"
            );
            assert!(
                end <= row_len,
                "request row {row} is written up to position {end}, past the device table's \
                 {row_len} positions"
            );
            self.rows.push(row);
        }
        assert_eq!(
            self.rows.len(),
            count,
            "one request-to-token row per request"
        );
    }

    /// Sets `self.rows` to `count` requests without a row: the replay writes `out_cache_loc` only.
    fn set_no_rows(&mut self, count: usize) {
        self.rows.clear();
        self.rows.resize(count, NO_ROW);
    }

    /// The device computes an extend's positions, rounded up to a page, its new slots and the
    /// batch's `out_cache_loc` in `u32`: a batch past that (possible only without a row to bound
    /// it, or with nearly 2^32 slots) is a caller bug that panics here, before the host is
    /// asked, unless the host refuses it anyway (then it gets the host's error).
    fn check_extend_positions(&self, reqs: &[ExtendShape]) {
        let Err(error) = extend_fits_u32(self.host.page_size(), reqs) else {
            return;
        };
        if !self.host_refuses(|host| host.alloc_extend(reqs, &mut Vec::new())) {
            panic!("an extend the device cannot compute in u32: {error}");
        }
    }

    /// The device takes a decode's position (`seq_len`) as a `u32`: a batch past that (possible
    /// only without a row to bound it) is a caller bug that panics here, before the host is
    /// asked, unless the host refuses it anyway (then it gets the host's error).
    fn check_decode_positions(&self, reqs: &[DecodeShape]) {
        let Some(shape) = reqs.iter().find(|shape| shape.seq_len > u32::MAX as usize) else {
            return;
        };
        if !self.host_refuses(|host| host.alloc_decode(reqs, &mut Vec::new())) {
            panic!(
                "a decode to position {} is past u32::MAX, the device's position range",
                shape.seq_len
            );
        }
    }

    /// Whether the host refuses `call`, tried on a copy of it (O(pool pages): only for a batch
    /// the device cannot compute, to tell a caller bug from a batch the host rejects anyway).
    fn host_refuses(
        &self,
        call: impl FnOnce(&mut PageAllocator<D::Order>) -> Result<(), AllocError>,
    ) -> bool {
        call(&mut self.host.clone()).is_err()
    }

    /// Replays a batched extend the host has applied, for the rows in `self.rows`.
    fn replay_extend(&mut self, reqs: &[ExtendShape]) {
        let out = replayed("alloc_extend", self.device.alloc_extend(reqs, &self.rows));
        self.last_out_cache_loc = Some(out);
        self.debug_assert_synced();
    }

    /// Replays a batched decode the host has applied, for the rows in `self.rows`.
    fn replay_decode(&mut self, reqs: &[DecodeShape]) {
        let out = replayed("alloc_decode", self.device.alloc_decode(reqs, &self.rows));
        self.last_out_cache_loc = Some(out);
        self.debug_assert_synced();
    }

    /// Runs a free-list operation on the host, then puts the pages it freed (if any) on the
    /// device list in the host's order.
    fn mirror_free(
        &mut self,
        free: impl FnOnce(&mut PageAllocator<D::Order>) -> Result<(), AllocError>,
    ) -> Result<(), AllocError> {
        let before = self.host.free_page_count();
        free(&mut self.host)?;
        let freed = self.host.free_page_count() - before;
        if freed == 0 {
            return Ok(());
        }
        self.freed.clear();
        if <D::Order as ReuseOrder>::FREED_FIRST {
            self.freed.extend(self.host.free_pages().take(freed));
        } else {
            // Appended: the freed pages follow those that were free before the call.
            self.freed.extend(self.host.free_pages().skip(before));
        }
        replayed("free", self.device.free_pages(&self.freed));
        self.debug_assert_synced();
        Ok(())
    }

    fn debug_assert_synced(&self) {
        debug_assert_eq!(
            self.device.available_size(),
            self.host.available_size(),
            "the device free list has the host's length"
        );
    }
}

impl<R: ReuseOrder> MirroredAllocator<CudaPagedAllocator<R>> {
    /// Mirrors `host` on a new [`CudaPagedAllocator`] on `device`, with the same pages and a
    /// device table of `table`'s shape.
    pub fn on_cuda(
        device: Arc<CudaDevice>,
        host: PageAllocator<R>,
        table: &ReqToTokenPool,
    ) -> Result<Self, MirrorError> {
        let device_half = CudaPagedAllocator::new(
            device,
            host.capacity(),
            host.page_size(),
            table.size() + 1,
            table.max_context_len(),
        )?;
        Self::new(host, device_half, table)
    }
}

/// [`MirrorError::FreeListDiverged`] at the first position where the free lists differ.
fn same_free_lists(host_free: &[PageId], device_free: &[PageId]) -> Result<(), MirrorError> {
    if device_free == host_free {
        return Ok(());
    }
    let position = host_free
        .iter()
        .zip(device_free)
        .position(|(host, device)| host != device)
        .unwrap_or(host_free.len().min(device_free.len()));
    Err(MirrorError::FreeListDiverged {
        position,
        host: host_free.get(position).copied(),
        device: device_free.get(position).copied(),
    })
}

/// The value of a device replay. The host has applied the operation and cannot take it back, so
/// a failure leaves the device copy stale for good: panic rather than let kernels read it.
fn replayed<T>(operation: &str, result: Result<T, CudaError>) -> T {
    result.unwrap_or_else(|error| {
        panic!(
            "device mirror lost: replaying {operation} failed after the host applied it: {error}"
        )
    })
}

/// A request row as a kernel index (the table was checked to fit the device table, whose rows
/// stay below [`NO_ROW`]).
fn kernel_row(row: ReqRow) -> u32 {
    u32::try_from(row)
        .ok()
        .filter(|&row| row != NO_ROW)
        .unwrap_or_else(|| panic!("request row {row} is not a device row"))
}

impl<D: DeviceAllocOps> KvAllocator for MirroredAllocator<D> {
    fn page_size(&self) -> usize {
        self.host.page_size()
    }

    fn capacity(&self) -> usize {
        self.host.capacity()
    }

    fn available_size(&self) -> usize {
        self.host.available_size()
    }

    /// Whole pages, as an extend from 0 of a request with no row ([`NO_ROW`]).
    fn alloc(&mut self, num_tokens: usize, out: &mut Vec<KvSlot>) -> Result<(), AllocError> {
        let shape = [ExtendShape {
            prefix_len: 0,
            seq_len: num_tokens,
            last_loc: None,
        }];
        self.check_extend_positions(&shape);
        self.host.alloc(num_tokens, out)?;
        self.set_no_rows(1);
        self.replay_extend(&shape);
        Ok(())
    }

    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.check_extend_positions(reqs);
        self.set_no_rows(reqs.len());
        self.host.alloc_extend(reqs, out)?;
        self.replay_extend(reqs);
        Ok(())
    }

    fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.check_decode_positions(reqs);
        self.host.alloc_decode(reqs, out)?;
        self.set_no_rows(reqs.len());
        self.replay_decode(reqs);
        Ok(())
    }

    fn free(&mut self, slots: &[KvSlot]) -> Result<(), AllocError> {
        self.mirror_free(|host| host.free(slots))
    }

    fn free_segment(&mut self, slots: &[KvSlot], start_pos: usize) -> Result<(), AllocError> {
        self.mirror_free(|host| host.free_segment(slots, start_pos))
    }

    fn free_segments(&mut self, segments: &[(&[KvSlot], usize)]) -> Result<(), AllocError> {
        self.mirror_free(|host| host.free_segments(segments))
    }

    fn free_page_ids(&mut self, pages: &[PageId]) -> Result<(), AllocError> {
        self.mirror_free(|host| host.free_page_ids(pages))
    }

    fn free_group_begin(&mut self) -> Result<(), AllocError> {
        self.host.free_group_begin()
    }

    fn free_group_end(&mut self) -> Result<(), AllocError> {
        self.mirror_free(PageAllocator::free_group_end)
    }

    fn in_free_group(&self) -> bool {
        self.host.in_free_group()
    }

    fn alloc_extend_rows(
        &mut self,
        reqs: &[ExtendShape],
        rows: impl Iterator<Item = ReqRow>,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError> {
        self.check_extend_positions(reqs);
        self.set_rows(rows, reqs.iter().map(|req| req.seq_len));
        self.host.alloc_extend(reqs, out)?;
        self.replay_extend(reqs);
        Ok(())
    }

    fn alloc_decode_table<I>(
        &mut self,
        reqs: I,
        table: &mut ReqToTokenPool,
        out: &mut Vec<KvSlot>,
    ) -> Result<(), AllocError>
    where
        I: ExactSizeIterator<Item = DecodeRow> + Clone,
    {
        let shapes = DecodeRow::read_shapes(reqs.clone(), table)?;
        let ends = shapes.iter().map(|shape| shape.seq_len);
        self.set_rows(reqs.clone().map(|req| req.row), ends);
        self.host.alloc_decode_table(reqs, table, out)?;
        self.replay_decode(&shapes);
        Ok(())
    }

    fn row_written(&mut self, row: ReqRow, start_pos: usize, slots: &[KvSlot]) {
        if !slots.is_empty() {
            replayed(
                "a row write",
                self.device.write_row(kernel_row(row), start_pos, slots),
            );
        }
    }
}

impl<D: DeviceAllocOps> AsPageAllocator for MirroredAllocator<D> {
    type Order = D::Order;

    fn page_allocator(&self) -> &PageAllocator<D::Order> {
        &self.host
    }
}
