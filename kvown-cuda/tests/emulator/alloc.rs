//! [`EmulatedAllocator`]: the device allocator with the `alloc.cu` kernels compiled as host C++
//! (`alloc_driver.cpp`), driven through [`AllocPlanner`]: the same plans the CUDA allocator
//! launches, run on the CPU. It implements the library's [`DeviceAllocOps`], so the tests drive
//! it exactly as they drive `CudaPagedAllocator`.

use std::cell::RefCell;

use kvown_cuda::{ALLOC_BLOCK, AllocPlan, AllocPlanner, CudaError, DeviceAllocOps, FreePlan};
use kvown_runtime::alloc::{DecodeShape, ExtendShape, KvSlot, PageId, ReuseOrder};

use super::{Driver, Process};

static DRIVER: Driver = Driver::new("alloc_driver.cpp");

/// A buffer in the driver's format: its length, then its elements.
fn buffer(values: &[u32]) -> String {
    let mut text = values.len().to_string();
    for value in values {
        text.push(' ');
        text.push_str(&value.to_string());
    }
    text
}

/// Sends `command` and parses the buffer the driver answers with.
fn send_buffer(process: &RefCell<Process>, command: &str) -> Vec<u32> {
    let line = process.borrow_mut().send(command);
    let mut words = line
        .split_whitespace()
        .map(|w| w.parse::<u32>().expect("u32"));
    let len = words.next().expect("a length") as usize;
    let buffer: Vec<u32> = words.collect();
    assert_eq!(buffer.len(), len, "emulator reply to `{command}`");
    buffer
}

/// The device allocator with its kernels emulated on the host. The driver process sits in a
/// `RefCell` so that read-backs work through `&self`, as on the device.
pub struct EmulatedAllocator<R: ReuseOrder> {
    planner: AllocPlanner<R>,
    process: RefCell<Process>,
}

impl<R: ReuseOrder> EmulatedAllocator<R> {
    /// Like `CudaPagedAllocator::new`; `Err` says why the emulator cannot run here.
    pub fn new(
        size: usize,
        page_size: usize,
        rows: usize,
        row_len: usize,
    ) -> Result<Self, &'static str> {
        let mut process = DRIVER.start()?;
        let planner = AllocPlanner::new(size, page_size, rows, row_len).expect("a valid pool");
        process.send_ok(&format!("init {} {}", planner.num_pages(), rows * row_len));
        Ok(EmulatedAllocator {
            planner,
            process: RefCell::new(process),
        })
    }

    /// Frees the pages holding `slots`, as `CudaPagedAllocator::free` does.
    pub fn free(&mut self, slots: &[KvSlot]) -> Result<(), CudaError> {
        let plan = self.planner.plan_free(slots)?;
        self.launch_free(plan);
        Ok(())
    }

    /// Runs `free_pages_write` for `plan`, as `CudaPagedAllocator` launches it, and commits it.
    fn launch_free(&mut self, plan: Option<FreePlan>) {
        let Some(plan) = plan else {
            return;
        };
        let blocks = plan.pages.len().div_ceil(ALLOC_BLOCK as usize);
        self.process.get_mut().send_ok(&format!(
            "free_pages_write {blocks} {ALLOC_BLOCK} {} {} {}",
            self.planner.num_pages(),
            plan.first,
            buffer(&plan.pages)
        ));
        self.planner.commit_free(&plan);
    }

    fn launch_alloc(&mut self, kernel: &str, plan: AllocPlan) -> Vec<KvSlot> {
        if plan.out_len == 0 {
            return Vec::new();
        }
        let command = format!(
            "{kernel} {} {ALLOC_BLOCK} {} {} {} {} {} {} {}",
            plan.blocks,
            plan.num_reqs,
            buffer(&plan.params),
            self.planner.num_pages().max(1),
            plan.free_head,
            self.planner.row_len(),
            plan.out_len,
            self.planner.page_size(),
        );
        let out = send_buffer(&self.process, &command);
        self.planner.commit(&plan);
        out
    }
}

impl<R: ReuseOrder> DeviceAllocOps for EmulatedAllocator<R> {
    type Order = R;
    type Slots = Vec<KvSlot>;

    fn page_size(&self) -> usize {
        self.planner.page_size()
    }

    fn num_pages(&self) -> usize {
        self.planner.num_pages()
    }

    fn available_size(&self) -> usize {
        self.planner.available_size()
    }

    fn rows(&self) -> usize {
        self.planner.rows()
    }

    fn row_len(&self) -> usize {
        self.planner.row_len()
    }

    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        rows: &[u32],
    ) -> Result<Vec<KvSlot>, CudaError> {
        let plan = self.planner.plan_extend(reqs, rows)?;
        Ok(self.launch_alloc("alloc_extend", plan))
    }

    fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        rows: &[u32],
    ) -> Result<Vec<KvSlot>, CudaError> {
        let plan = self.planner.plan_decode(reqs, rows)?;
        Ok(self.launch_alloc("alloc_decode", plan))
    }

    fn free_pages(&mut self, pages: &[PageId]) -> Result<(), CudaError> {
        let plan = self.planner.plan_free_pages(pages)?;
        self.launch_free(plan);
        Ok(())
    }

    fn write_row(&mut self, row: u32, start: usize, slots: &[KvSlot]) -> Result<(), CudaError> {
        let range = self.planner.row_range(row, start, slots.len())?;
        self.process
            .get_mut()
            .send_ok(&format!("write {} {}", range.start, buffer(slots)));
        Ok(())
    }

    fn free_list(&self) -> Result<Vec<PageId>, CudaError> {
        let ring = send_buffer(&self.process, "ring");
        let (head, len) = (self.planner.free_head(), self.planner.free_len());
        Ok((0..len).map(|k| ring[(head + k) % ring.len()]).collect())
    }

    fn read_row(&self, row: u32, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        let range = self.planner.row_range(row, 0, len)?;
        Ok(send_buffer(
            &self.process,
            &format!("read {} {len}", range.start),
        ))
    }

    /// The emulator's `out_cache_loc` is already on the host.
    fn slots_to_host(&self, slots: &Vec<KvSlot>) -> Result<Vec<KvSlot>, CudaError> {
        Ok(slots.clone())
    }
}
