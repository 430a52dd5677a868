//! CUDA vs CPU: the device allocator against `PagedAllocator` / `TokenAllocator`, and
//! `CudaKvPool` against `HostKvPool`, on seeded random batches (page sizes 1, 16, 64; prefix
//! hits; out-of-memory edges). The GPU tests run only where a CUDA device works; elsewhere each
//! prints `skipped: <reason>` and passes. The same allocator scenarios also run against the
//! allocation kernels compiled as host C++ (`emulator/`), so the kernels' index arithmetic and
//! the host planning are checked on every machine with a C++ compiler.

mod emulator;
mod mirror;

use std::sync::Arc;

use emulator::EmulatedAllocator;
use half::{bf16, f16};
use kvown_cuda::{CudaDevice, CudaError, CudaKvPool, CudaPagedAllocator};
use kvown_runtime::alloc::{
    AllocError, DecodeShape, ExtendShape, Fifo, KvAllocator, KvSlot, Lifo, PageAllocator, PageId,
    PagedAllocator, ReuseOrder, TokenAllocator,
};
use kvown_runtime::kv::{HostKvPool, KvData, KvDtype, KvElement, KvLayout, KvPool};

fn device() -> Option<Arc<CudaDevice>> {
    match CudaDevice::get() {
        Ok(device) => Some(device),
        Err(reason) => {
            skip_notice(&format!("skipped: {reason}"));
            None
        }
    }
}

/// A device allocator under test: the CUDA one, or its kernels emulated on the host.
trait DeviceAllocator {
    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        rows: &[u32],
    ) -> Result<Vec<KvSlot>, CudaError>;
    fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        rows: &[u32],
    ) -> Result<Vec<KvSlot>, CudaError>;
    fn free(&mut self, slots: &[KvSlot]) -> Result<(), CudaError>;
    fn write_row(&mut self, row: u32, start: usize, slots: &[KvSlot]) -> Result<(), CudaError>;
    fn read_row(&mut self, row: u32, len: usize) -> Result<Vec<KvSlot>, CudaError>;
    fn free_list(&mut self) -> Result<Vec<PageId>, CudaError>;
    fn available_size(&self) -> usize;
}

/// The CUDA allocator, with its slots copied back for comparison.
struct Gpu<R: ReuseOrder> {
    allocator: CudaPagedAllocator<R>,
    device: Arc<CudaDevice>,
}

impl<R: ReuseOrder> DeviceAllocator for Gpu<R> {
    fn alloc_extend(
        &mut self,
        reqs: &[ExtendShape],
        rows: &[u32],
    ) -> Result<Vec<KvSlot>, CudaError> {
        self.allocator
            .alloc_extend(reqs, rows)
            .and_then(|slots| slots.to_host(&self.device))
    }

    fn alloc_decode(
        &mut self,
        reqs: &[DecodeShape],
        rows: &[u32],
    ) -> Result<Vec<KvSlot>, CudaError> {
        self.allocator
            .alloc_decode(reqs, rows)
            .and_then(|slots| slots.to_host(&self.device))
    }

    fn free(&mut self, slots: &[KvSlot]) -> Result<(), CudaError> {
        self.allocator.free(slots)
    }

    fn write_row(&mut self, row: u32, start: usize, slots: &[KvSlot]) -> Result<(), CudaError> {
        self.allocator.write_row(row, start, slots)
    }

    fn read_row(&mut self, row: u32, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        self.allocator.read_row(row, len)
    }

    fn free_list(&mut self) -> Result<Vec<PageId>, CudaError> {
        self.allocator.free_list()
    }

    fn available_size(&self) -> usize {
        self.allocator.available_size()
    }
}

/// Builds the device allocator under test (`size` slots, pages of `page_size`, a table of
/// `ROWS x ROW_LEN`) in reuse order `R`, or `None`, with a skip notice, where it cannot run.
trait MakeDevice {
    fn make<R: ReuseOrder + 'static>(
        &self,
        size: usize,
        page_size: usize,
    ) -> Option<Box<dyn DeviceAllocator>>;
}

/// The real device.
struct OnGpu(Arc<CudaDevice>);

impl MakeDevice for OnGpu {
    fn make<R: ReuseOrder + 'static>(
        &self,
        size: usize,
        page_size: usize,
    ) -> Option<Box<dyn DeviceAllocator>> {
        let allocator =
            CudaPagedAllocator::<R>::new(self.0.clone(), size, page_size, ROWS, ROW_LEN)
                .expect("device allocator");
        Some(Box::new(Gpu {
            allocator,
            device: self.0.clone(),
        }))
    }
}

/// The allocation kernels compiled as host C++.
struct OnHost;

impl MakeDevice for OnHost {
    fn make<R: ReuseOrder + 'static>(
        &self,
        size: usize,
        page_size: usize,
    ) -> Option<Box<dyn DeviceAllocator>> {
        match EmulatedAllocator::<R>::new(size, page_size, ROWS, ROW_LEN) {
            Ok(emulated) => Some(Box::new(emulated)),
            Err(reason) => {
                skip_notice(&format!("skipped: {reason}"));
                None
            }
        }
    }
}

/// xorshift64*: deterministic, dependency-free randomness.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// A request's row and the slots of its positions, as the CPU side recorded them.
struct Live {
    row: u32,
    slots: Vec<KvSlot>,
}

const ROWS: usize = 48;
const ROW_LEN: usize = 700;

/// Expects both results to be the same error, or both `Ok` with equal slots.
fn same(
    cpu: Result<Vec<KvSlot>, AllocError>,
    gpu: Result<Vec<KvSlot>, CudaError>,
    what: &str,
) -> Option<Vec<KvSlot>> {
    match (cpu, gpu) {
        (Ok(cpu), Ok(gpu)) => {
            assert_eq!(cpu, gpu, "{what}: out_cache_loc differs");
            Some(cpu)
        }
        (Err(cpu), Err(CudaError::Alloc(gpu))) => {
            assert_eq!(cpu, gpu, "{what}: errors differ");
            None
        }
        (cpu, gpu) => panic!("{what}: CPU {cpu:?} but GPU {gpu:?}"),
    }
}

fn run_allocator<R: ReuseOrder>(
    gpu: &mut dyn DeviceAllocator,
    mut cpu: PageAllocator<R>,
    page_size: usize,
    seed: u64,
    steps: usize,
) {
    let mut rng = Rng(seed);
    let mut live: Vec<Live> = Vec::new();
    let mut cached: Vec<Vec<KvSlot>> = Vec::new();
    let mut free_rows: Vec<u32> = (0..ROWS as u32).collect();
    let (mut extends, mut decodes, mut ooms) = (0, 0, 0);
    for step in 0..steps {
        let what = format!("page {page_size} seed {seed} step {step}");
        match rng.below(10) {
            // Extend a batch of new requests, some reusing a cached prefix.
            0..=3 => {
                let count = 1 + rng.below(4.min(free_rows.len()).max(1));
                let mut shapes = Vec::new();
                let mut rows = Vec::new();
                let mut prefixes = Vec::new();
                for _ in 0..count.min(free_rows.len()) {
                    let row = free_rows.swap_remove(rng.below(free_rows.len()));
                    let prefix: Vec<KvSlot> = if !cached.is_empty() && rng.chance(50) {
                        let mut entry = cached.swap_remove(rng.below(cached.len()));
                        let keep = 1 + rng.below(entry.len());
                        // Pages wholly past the kept prefix go back to the allocators.
                        let whole_from = keep.div_ceil(page_size) * page_size;
                        if whole_from < entry.len() {
                            let tail = entry.split_off(whole_from);
                            cpu.free(&tail).unwrap();
                            gpu.free(&tail).unwrap();
                        }
                        entry.truncate(keep);
                        entry
                    } else {
                        Vec::new()
                    };
                    // Mostly modest, sometimes large enough to run out of memory.
                    let extend = if rng.chance(10) {
                        rng.below(ROW_LEN - prefix.len())
                    } else {
                        rng.below(80)
                    };
                    shapes.push(ExtendShape {
                        prefix_len: prefix.len(),
                        seq_len: prefix.len() + extend,
                        last_loc: prefix.last().copied(),
                    });
                    gpu.write_row(row, 0, &prefix).unwrap();
                    rows.push(row);
                    prefixes.push(prefix);
                }
                let mut out = Vec::new();
                let cpu_result = cpu.alloc_extend(&shapes, &mut out).map(|()| out);
                let gpu_result = gpu.alloc_extend(&shapes, &rows);
                match same(cpu_result, gpu_result, &what) {
                    Some(out) => {
                        extends += 1;
                        let mut offset = 0;
                        for ((shape, row), mut slots) in shapes.iter().zip(rows).zip(prefixes) {
                            let n = shape.seq_len - shape.prefix_len;
                            slots.extend_from_slice(&out[offset..offset + n]);
                            offset += n;
                            live.push(Live { row, slots });
                        }
                    }
                    None => {
                        ooms += 1;
                        // Refused: give prefixes back to the cache and rows back to the pool.
                        cached.extend(prefixes.into_iter().filter(|p| !p.is_empty()));
                        free_rows.extend(rows);
                    }
                }
            }
            // Decode every live request that has room.
            4..=7 => {
                let batch: Vec<usize> = (0..live.len())
                    .filter(|&i| !live[i].slots.is_empty() && live[i].slots.len() < ROW_LEN)
                    .collect();
                let shapes: Vec<DecodeShape> = batch
                    .iter()
                    .map(|&i| DecodeShape {
                        seq_len: live[i].slots.len() + 1,
                        last_loc: *live[i].slots.last().unwrap(),
                    })
                    .collect();
                let rows: Vec<u32> = batch.iter().map(|&i| live[i].row).collect();
                let mut out = Vec::new();
                let cpu_result = cpu.alloc_decode(&shapes, &mut out).map(|()| out);
                let gpu_result = gpu.alloc_decode(&shapes, &rows);
                match same(cpu_result, gpu_result, &what) {
                    Some(out) => {
                        decodes += 1;
                        for (&i, slot) in batch.iter().zip(out) {
                            live[i].slots.push(slot);
                        }
                    }
                    None => ooms += 1,
                }
            }
            // Finish a request: free it, or keep its slots as a cached prefix.
            _ => {
                if live.is_empty() {
                    continue;
                }
                let done = live.swap_remove(rng.below(live.len()));
                assert_eq!(
                    gpu.read_row(done.row, done.slots.len()).unwrap(),
                    done.slots,
                    "{what}: row"
                );
                if !done.slots.is_empty() {
                    if rng.chance(40) {
                        cached.push(done.slots);
                    } else {
                        cpu.free(&done.slots).unwrap();
                        gpu.free(&done.slots).unwrap();
                    }
                }
                free_rows.push(done.row);
            }
        }
        let cpu_free: Vec<_> = cpu.free_pages().collect();
        assert_eq!(
            gpu.free_list().unwrap(),
            cpu_free,
            "{what}: free lists differ"
        );
        assert_eq!(gpu.available_size(), cpu.available_size(), "{what}");
    }
    println!("page {page_size} seed {seed}: {extends} extends, {decodes} decodes, {ooms} refused");
}

/// Every allocator configuration of the scenarios: LIFO pages of 16 and 64, and page size 1
/// in both reuse orders (the paged allocator and the token one).
fn allocator_scenarios(make: &impl MakeDevice, seeds: std::ops::RangeInclusive<u64>, steps: usize) {
    for seed in seeds {
        for page_size in [16, 64] {
            let size = page_size * (40 + 20 * seed as usize);
            let cpu = PagedAllocator::new(size, page_size, false).unwrap();
            let Some(mut device) = make.make::<Lifo>(size, page_size) else {
                return;
            };
            run_allocator::<Lifo>(&mut *device, cpu, page_size, seed, steps);
        }
        let cpu = PagedAllocator::new(900, 1, false).unwrap();
        let Some(mut device) = make.make::<Lifo>(900, 1) else {
            return;
        };
        run_allocator::<Lifo>(&mut *device, cpu, 1, seed, steps);
        let cpu = TokenAllocator::new(900, false).unwrap();
        let Some(mut device) = make.make::<Fifo>(900, 1) else {
            return;
        };
        run_allocator::<Fifo>(&mut *device, cpu, 1, seed, steps);
    }
}

#[test]
fn allocator_matches_cpu_on_random_batches() {
    let Some(device) = device() else { return };
    allocator_scenarios(&OnGpu(device), 1..=4, 300);
}

#[test]
fn emulated_kernels_match_cpu_on_random_batches() {
    allocator_scenarios(&OnHost, 1..=2, 200);
}

/// Exactly all four pages fits; one token more does not; a refusal changes nothing.
fn out_of_memory_edges(make: &impl MakeDevice) {
    let page_size = 16;
    let Some(mut device) = make.make::<Lifo>(4 * page_size, page_size) else {
        return;
    };
    let mut cpu = PagedAllocator::new(4 * page_size, page_size, false).unwrap();
    for (seq_len, fits) in [
        (4 * page_size + 1, false),
        (4 * page_size, true),
        (1, false),
    ] {
        let shape = [ExtendShape {
            prefix_len: 0,
            seq_len,
            last_loc: None,
        }];
        let mut out = Vec::new();
        let cpu_result = cpu.alloc_extend(&shape, &mut out).map(|()| out);
        let device_result = device.alloc_extend(&shape, &[0]);
        assert_eq!(
            same(cpu_result, device_result, "oom edge").is_some(),
            fits,
            "seq_len {seq_len}"
        );
        assert_eq!(
            device.free_list().unwrap(),
            cpu.free_pages().collect::<Vec<_>>()
        );
    }
}

#[test]
fn allocator_out_of_memory_edges_match() {
    let Some(device) = device() else { return };
    out_of_memory_edges(&OnGpu(device));
}

#[test]
fn emulated_out_of_memory_edges_match() {
    out_of_memory_edges(&OnHost);
}

fn values<T: KvElement>(rng: &mut Rng, len: usize) -> Vec<T> {
    (0..len)
        .map(|_| T::from_f32(rng.below(20_000) as f32 / 7.0 - 1000.0))
        .collect()
}

fn snapshot(pool: &dyn KvPool) -> Vec<(KvData, KvData)> {
    let all: Vec<KvSlot> = (0..pool.layout().slots() as KvSlot).collect();
    (0..pool.layout().layers())
        .map(|layer| pool.load_kv(layer, &all).unwrap())
        .collect()
}

fn run_pool<T: KvElement>(device: &Arc<CudaDevice>, layout: KvLayout, seed: u64) {
    let mut rng = Rng(seed);
    let mut host = HostKvPool::<T>::new(layout);
    let mut gpu = CudaKvPool::new(device.clone(), layout, T::DTYPE).unwrap();
    let slots = layout.slots();
    let k_row = layout.row_len(kvown_runtime::kv::KvTensor::K);
    let v_row = layout.row_len(kvown_runtime::kv::KvTensor::V);
    for _ in 0..20 {
        let layer = rng.below(layout.layers());
        // Distinct slots, so the winner of a duplicate write is not in question.
        let mut chosen: Vec<KvSlot> = (0..slots as KvSlot).collect();
        let n = 1 + rng.below(slots.min(64));
        for i in 0..n {
            let j = i + rng.below(slots - i);
            chosen.swap(i, j);
        }
        chosen.truncate(n);
        let k = values::<T>(&mut rng, n * k_row);
        let v = values::<T>(&mut rng, n * v_row);
        host.store_kv(layer, &chosen, T::as_kv_slice(&k), T::as_kv_slice(&v))
            .unwrap();
        gpu.store_kv(layer, &chosen, T::as_kv_slice(&k), T::as_kv_slice(&v))
            .unwrap();
        assert_eq!(
            gpu.load_kv(layer, &chosen).unwrap(),
            host.load_kv(layer, &chosen).unwrap()
        );
    }
    // Overlapping slot copy, disjoint page copy, overlapping page copy.
    let shift: Vec<KvSlot> = (1..6).collect();
    let shifted: Vec<KvSlot> = (2..7).collect();
    host.copy_slots(&shift, &shifted).unwrap();
    gpu.copy_slots(&shift, &shifted).unwrap();
    let pages = layout.pages() as u32;
    for (src, dst) in [(vec![1], vec![pages - 1]), (vec![1, 2], vec![2, 1])] {
        host.copy_pages(&src, &dst).unwrap();
        gpu.copy_pages(&src, &dst).unwrap();
    }
    assert_eq!(
        snapshot(&gpu),
        snapshot(&host),
        "{} pool after copies",
        T::DTYPE
    );
}

#[test]
fn kv_pool_matches_host_pool() {
    let Some(device) = device() else { return };
    for (seed, page_size) in [(1u64, 1usize), (2, 16), (3, 64)] {
        // Row bytes chosen to hit every word width: 2 heads x 3 dims of f16 = 12 bytes (w4),
        // 8 x 128 (w16), 1 x 1 of f16 (w2), V 2 x 2 of f32 = 16 bytes.
        let layouts = [
            KvLayout::with_v_head_dim(2, 2, 3, 2, 4 * page_size, page_size).unwrap(),
            KvLayout::new(3, 8, 128, 4 * page_size, page_size).unwrap(),
            KvLayout::with_v_head_dim(1, 1, 1, 5, 3 * page_size, page_size).unwrap(),
        ];
        for layout in layouts {
            run_pool::<f32>(&device, layout, seed);
            run_pool::<f16>(&device, layout, seed);
            run_pool::<bf16>(&device, layout, seed);
        }
    }
    assert!(KvDtype::ALL.len() == 3);
}

/// Prints a skip notice to the real stderr: the test harness captures `println!`/`eprintln!`
/// of passing tests, but a skipped GPU check must be visible in every run's output.
fn skip_notice(message: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{message}");
}
