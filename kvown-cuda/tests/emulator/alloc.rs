//! [`EmulatedAllocator`]: the device allocator with the `alloc.cu` kernels compiled as host C++
//! (`alloc_driver.cpp`), driven through [`AllocPlanner`]: the same plans the CUDA allocator
//! launches, run on the CPU.

use kvown_cuda::{ALLOC_BLOCK, AllocPlan, AllocPlanner, CudaError, FreePlan};
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
fn send_buffer(process: &mut Process, command: &str) -> Vec<u32> {
    let line = process.send(command);
    let mut words = line
        .split_whitespace()
        .map(|w| w.parse::<u32>().expect("u32"));
    let len = words.next().expect("a length") as usize;
    let buffer: Vec<u32> = words.collect();
    assert_eq!(buffer.len(), len, "emulator reply to `{command}`");
    buffer
}

/// The device allocator with its kernels emulated on the host.
pub struct EmulatedAllocator<R: ReuseOrder> {
    planner: AllocPlanner<R>,
    process: Process,
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
        Ok(EmulatedAllocator { planner, process })
    }

    /// Puts distinct `pages` on the free list in the order given, as
    /// `CudaPagedAllocator::free_pages` does.
    pub fn free_pages(&mut self, pages: &[PageId]) -> Result<(), CudaError> {
        let plan = self.planner.plan_free_pages(pages)?;
        self.launch_free(plan);
        Ok(())
    }

    /// Runs `free_pages_write` for `plan`, as `CudaPagedAllocator` launches it, and commits it.
    fn launch_free(&mut self, plan: Option<FreePlan>) {
        let Some(plan) = plan else {
            return;
        };
        let blocks = plan.pages.len().div_ceil(ALLOC_BLOCK as usize);
        self.process.send_ok(&format!(
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
        let out = send_buffer(&mut self.process, &command);
        self.planner.commit(&plan);
        out
    }
}

impl<R: ReuseOrder> crate::DeviceAllocator for EmulatedAllocator<R> {
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

    fn free(&mut self, slots: &[KvSlot]) -> Result<(), CudaError> {
        let plan = self.planner.plan_free(slots)?;
        self.launch_free(plan);
        Ok(())
    }

    fn write_row(&mut self, row: u32, start: usize, slots: &[KvSlot]) -> Result<(), CudaError> {
        self.planner.check_row(0, row, start + slots.len())?;
        let base = row as usize * self.planner.row_len();
        self.process
            .send_ok(&format!("write {} {}", base + start, buffer(slots)));
        Ok(())
    }

    fn read_row(&mut self, row: u32, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        self.planner.check_row(0, row, len)?;
        let base = row as usize * self.planner.row_len();
        Ok(send_buffer(
            &mut self.process,
            &format!("read {base} {len}"),
        ))
    }

    fn free_list(&mut self) -> Result<Vec<PageId>, CudaError> {
        let ring = send_buffer(&mut self.process, "ring");
        let (head, len) = (self.planner.free_head(), self.planner.free_len());
        Ok((0..len).map(|k| ring[(head + k) % ring.len()]).collect())
    }

    fn available_size(&self) -> usize {
        self.planner.available_size()
    }
}
