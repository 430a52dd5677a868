//! The allocation kernels of `src/kernels/alloc.cu` compiled as host C++ (with `cuda_shim.hpp`)
//! and driven through [`kvown_cuda::AllocPlanner`]: the same plans the CUDA allocator launches,
//! run on the CPU. This checks the kernels' index arithmetic and the host planning on machines
//! without a GPU; only the driver calls (upload, launch, copy back) are left to the GPU check.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::OnceLock;

use kvown_cuda::{ALLOC_BLOCK, AllocPlan, AllocPlanner, CudaError};
use kvown_runtime::alloc::{DecodeShape, ExtendShape, KvSlot, PageId, ReuseOrder};

/// Builds the emulator once per test binary; `Err` says why it cannot be built here.
fn emulator_binary() -> Result<&'static PathBuf, &'static str> {
    static BINARY: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".to_string());
            let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let output = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("kvown-alloc-emulator-{}", std::process::id()));
            let status = Command::new(&compiler)
                .args(["-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I"])
                .arg(crate_dir.join("src/kernels"))
                .arg("-I")
                .arg(crate_dir.join("tests/emulator"))
                .arg(crate_dir.join("tests/emulator/alloc_driver.cpp"))
                .arg("-o")
                .arg(&output)
                .status();
            match status {
                Err(error) => Err(format!("no C++ compiler `{compiler}` ({error})")),
                Ok(status) if status.success() => Ok(output),
                Ok(status) => panic!("the kernels do not compile as host C++ ({status})"),
            }
        })
        .as_ref()
        .map_err(String::as_str)
}

/// One running emulator process holding the ring and the table.
struct Process {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Process {
    fn start(binary: &PathBuf) -> Process {
        let mut child = Command::new(binary)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the emulator starts");
        let input = child.stdin.take().expect("piped stdin");
        let output = BufReader::new(child.stdout.take().expect("piped stdout"));
        Process {
            child,
            input,
            output,
        }
    }

    fn send(&mut self, command: &str) -> String {
        writeln!(self.input, "{command}").expect("the emulator reads");
        self.input.flush().expect("the emulator reads");
        let mut line = String::new();
        self.output
            .read_line(&mut line)
            .expect("the emulator answers");
        assert!(!line.is_empty(), "the emulator exited on `{command}`");
        line
    }

    fn send_ok(&mut self, command: &str) {
        assert_eq!(
            self.send(command).trim(),
            "ok",
            "emulator command `{command}`"
        );
    }

    fn send_buffer(&mut self, command: &str) -> Vec<u32> {
        let line = self.send(command);
        let mut words = line
            .split_whitespace()
            .map(|w| w.parse::<u32>().expect("u32"));
        let len = words.next().expect("a length") as usize;
        let buffer: Vec<u32> = words.collect();
        assert_eq!(buffer.len(), len, "emulator reply to `{command}`");
        buffer
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn buffer(values: &[u32]) -> String {
    let mut text = values.len().to_string();
    for value in values {
        text.push(' ');
        text.push_str(&value.to_string());
    }
    text
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
        let binary = emulator_binary()?;
        let planner = AllocPlanner::new(size, page_size, rows, row_len).expect("a valid pool");
        let mut process = Process::start(binary);
        process.send_ok(&format!("init {} {}", planner.num_pages(), rows * row_len));
        Ok(EmulatedAllocator { planner, process })
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
        let out = self.process.send_buffer(&command);
        self.planner.commit(&plan);
        out
    }
}

impl<R: ReuseOrder> super::DeviceAllocator for EmulatedAllocator<R> {
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
        let Some(plan) = self.planner.plan_free(slots)? else {
            return Ok(());
        };
        let blocks = plan.pages.len().div_ceil(ALLOC_BLOCK as usize);
        self.process.send_ok(&format!(
            "free_pages_write {blocks} {ALLOC_BLOCK} {} {} {}",
            self.planner.num_pages(),
            plan.first,
            buffer(&plan.pages)
        ));
        self.planner.commit_free(&plan);
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
        Ok(self.process.send_buffer(&format!("read {base} {len}")))
    }

    fn free_list(&mut self) -> Result<Vec<PageId>, CudaError> {
        let ring = self.process.send_buffer("ring");
        let (head, len) = (self.planner.free_head(), self.planner.free_len());
        Ok((0..len).map(|k| ring[(head + k) % ring.len()]).collect())
    }

    fn available_size(&self) -> usize {
        self.planner.available_size()
    }
}
