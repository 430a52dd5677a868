//! `CudaKvPool` against the host pool: random shapes and dtypes reaching every kernel word
//! width; stores with padding slot 0, gathers, slot and page copies, refused calls; every byte
//! compared after every step, on the GPU where one works and on `kv.cu` compiled as host C++.

use std::collections::BTreeSet;

use kvown_cuda::kernels::WORD_BYTES;
use kvown_cuda::{CudaKvPool, KvPlanner, PageCopy, kv_bytes, kv_data_from_bytes};
use kvown_runtime::alloc::{KvSlot, PageId};
use kvown_runtime::kv::{KvData, KvDtype, KvLayout, KvPool, KvPoolError, KvTensor, new_host_pool};

use super::emulator::EmulatedKvPool;
use super::{OnGpu, OnHost, Rng, device, or_skip};

/// Builds the K/V pool under test, or `None`, with a skip notice, where it cannot run.
trait MakePool {
    fn make_pool(&self, layout: KvLayout, dtype: KvDtype) -> Option<Box<dyn KvPool>>;
}

impl MakePool for OnGpu {
    fn make_pool(&self, layout: KvLayout, dtype: KvDtype) -> Option<Box<dyn KvPool>> {
        let pool = CudaKvPool::new(self.0.clone(), layout, dtype).expect("device pool");
        Some(Box::new(pool))
    }
}

impl MakePool for OnHost {
    fn make_pool(&self, layout: KvLayout, dtype: KvDtype) -> Option<Box<dyn KvPool>> {
        let pool = or_skip(EmulatedKvPool::new(layout, dtype))?;
        Some(Box::new(pool))
    }
}

/// What a set of pool runs exercised: the kernel shapes and the two ways of copying pages.
#[derive(Debug, Default)]
struct Coverage {
    /// Word widths (bytes) of the row kernels launched.
    widths: BTreeSet<usize>,
    /// A row had more words than its block has threads (the stride loop).
    strided: bool,
    /// A row had fewer words than its block has threads (idle threads).
    short: bool,
    /// Page copies by the one-pass `copy_pages` kernel, and by the `copy_slots` fallback.
    page_kernel: usize,
    page_fallback: usize,
    /// Stores with dummy tokens writing padding slot 0.
    padded: usize,
    /// Calls both pools refused.
    refused: usize,
}

impl Coverage {
    fn record_shapes(&mut self, planner: &KvPlanner) {
        for launch in planner.plan_rows(1).unwrap().unwrap() {
            self.widths.insert(WORD_BYTES[launch.shape.word]);
            self.strided |= launch.shape.row_words > launch.threads;
            self.short |= launch.shape.row_words < launch.threads;
        }
    }

    fn record_page_copy(&mut self, planner: &KvPlanner, src: &[PageId], dst: &[PageId]) {
        match planner.plan_copy_pages(src, dst).unwrap() {
            Some(PageCopy::Pages { .. }) => self.page_kernel += 1,
            Some(PageCopy::Slots { .. }) => self.page_fallback += 1,
            None => {}
        }
    }

    fn assert_complete(&self) {
        assert_eq!(self.widths, WORD_BYTES.into(), "word widths: {self:?}");
        assert!(self.strided && self.short, "row lengths: {self:?}");
        assert!(self.page_kernel > 0 && self.page_fallback > 0, "{self:?}");
        assert!(self.padded > 0 && self.refused > 0, "{self:?}");
    }
}

/// A pool shape: 1 to 3 layers, 1 to 4 KV heads, head dims 1 to 160 (V's sometimes different),
/// pages of 1, 4, 16 or 64, any dtype.
fn random_pool(rng: &mut Rng) -> (KvLayout, KvDtype) {
    let page_size = [1, 4, 16, 64][rng.below(4)];
    let pages = 3 + rng.below(96 / page_size);
    let head_dim = 1 + rng.below(160);
    let v_head_dim = if rng.chance(50) {
        head_dim
    } else {
        1 + rng.below(160)
    };
    let layout = KvLayout::with_v_head_dim(
        1 + rng.below(3),
        1 + rng.below(4),
        head_dim,
        v_head_dim,
        pages * page_size,
        page_size,
    )
    .unwrap();
    (layout, KvDtype::ALL[rng.below(KvDtype::ALL.len())])
}

/// `n` distinct values below `len`, in random order.
fn distinct(rng: &mut Rng, len: usize, n: usize) -> Vec<u32> {
    let mut values: Vec<u32> = (0..len as u32).collect();
    for i in 0..n {
        let j = i + rng.below(len - i);
        values.swap(i, j);
    }
    values.truncate(n);
    values
}

/// A batch's `out_cache_loc` shaped like the allocators' output: runs of consecutive slots past
/// the padding page (so pages repeat), each slot once, then slot 0 for `padding` dummy tokens.
fn out_cache_loc(rng: &mut Rng, layout: &KvLayout, padding: usize) -> Vec<KvSlot> {
    let (slots, page_size) = (layout.slots(), layout.page_size());
    let mut taken = vec![false; slots];
    let mut out = Vec::new();
    for _ in 0..1 + rng.below(6) {
        let start = page_size + rng.below(slots - page_size);
        let end = (start + 1 + rng.below(2 * page_size + 3)).min(slots);
        let fresh = (start..end).filter(|&slot| !std::mem::replace(&mut taken[slot], true));
        out.extend(fresh.map(|slot| slot as KvSlot));
    }
    out.extend(std::iter::repeat_n(0, padding));
    out
}

/// `rows` rows of random non-zero bytes, then `padding` copies of one more: the dummy tokens'
/// rows, equal so that slot 0 ends up the same whichever of its writes lands.
fn random_rows(rng: &mut Rng, rows: usize, padding: usize, row_bytes: usize) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..(rows + 1) * row_bytes)
        .map(|_| 1 + rng.below(255) as u8)
        .collect();
    let dummy = bytes.split_off(rows * row_bytes);
    for _ in 0..padding {
        bytes.extend_from_slice(&dummy);
    }
    bytes
}

/// The bytes of K then V rows.
fn kv_pair_bytes((k, v): &(KvData, KvData)) -> Vec<u8> {
    [kv_bytes(k.as_slice()), kv_bytes(v.as_slice())].concat()
}

/// Every byte of every buffer, read through `load_kv`.
fn snapshot(pool: &dyn KvPool) -> Vec<u8> {
    let all: Vec<KvSlot> = (0..pool.layout().slots() as KvSlot).collect();
    let layers: Vec<Vec<u8>> = (0..pool.layout().layers())
        .map(|layer| kv_pair_bytes(&pool.load_kv(layer, &all).unwrap()))
        .collect();
    layers.concat()
}

fn assert_same_bytes(device: &[u8], host: &[u8], what: &str) {
    assert_eq!(device.len(), host.len(), "{what}: lengths differ");
    if device == host {
        return;
    }
    let differing: Vec<usize> = (0..host.len()).filter(|&i| device[i] != host[i]).collect();
    let first = differing[0];
    panic!(
        "{what}: {} of {} bytes differ, the first at byte {first} (device {:#04x}, host {:#04x})",
        differing.len(),
        host.len(),
        device[first],
        host[first]
    );
}

/// Both calls succeeded, or both failed with the same message.
fn same_outcome(device: Result<(), KvPoolError>, host: Result<(), KvPoolError>, what: &str) {
    match (device, host) {
        (Ok(()), Ok(())) => {}
        (Err(device), Err(host)) => assert_eq!(device.to_string(), host.to_string(), "{what}"),
        (device, host) => panic!("{what}: device {device:?} but host {host:?}"),
    }
}

const POOL_STEPS: usize = 16;

/// One random pool, driven through random stores with gathers, slot copies, page copies and
/// refused calls, in step with the host pool; every byte is compared after every step.
fn run_pool(make: &impl MakePool, seed: u64, coverage: &mut Coverage) -> Option<()> {
    let mut rng = Rng(seed);
    let (layout, dtype) = random_pool(&mut rng);
    let mut device = make.make_pool(layout, dtype)?;
    let mut host = new_host_pool(layout, dtype).unwrap();
    let planner = KvPlanner::new(layout, dtype);
    coverage.record_shapes(&planner);
    let (slots, pages) = (layout.slots(), layout.pages());
    let row_bytes = |tensor| layout.row_len(tensor) * dtype.size_bytes();
    for step in 0..POOL_STEPS {
        let what = format!("seed {seed} ({layout:?}, {dtype}) step {step}");
        match rng.below(10) {
            // Store a batch, then gather its slots and some others (repeats, never written).
            0..=4 => {
                let layer = rng.below(layout.layers());
                let padding = if rng.chance(30) { 1 + rng.below(4) } else { 0 };
                coverage.padded += usize::from(padding > 0);
                let out = out_cache_loc(&mut rng, &layout, padding);
                let real = out.len() - padding;
                let [k, v] = [KvTensor::K, KvTensor::V].map(|tensor| {
                    let rows = random_rows(&mut rng, real, padding, row_bytes(tensor));
                    kv_data_from_bytes(dtype, &rows)
                });
                same_outcome(
                    device.store_kv(layer, &out, k.as_slice(), v.as_slice()),
                    host.store_kv(layer, &out, k.as_slice(), v.as_slice()),
                    &what,
                );
                let mut read = out;
                read.extend((0..rng.below(8)).map(|_| rng.below(slots) as KvSlot));
                assert_same_bytes(
                    &kv_pair_bytes(&device.load_kv(layer, &read).unwrap()),
                    &kv_pair_bytes(&host.load_kv(layer, &read).unwrap()),
                    &format!("{what}: gather"),
                );
            }
            // Copy slots: distinct destinations, any sources (overlaps included).
            5 | 6 => {
                let n = 1 + rng.below(slots.min(2 * layout.page_size() + 8));
                let dst = distinct(&mut rng, slots, n);
                let src: Vec<KvSlot> = (0..n).map(|_| rng.below(slots) as KvSlot).collect();
                same_outcome(
                    device.copy_slots(&src, &dst),
                    host.copy_slots(&src, &dst),
                    &what,
                );
            }
            // Copy pages: distinct destinations, disjoint from the sources or a permutation
            // of them.
            7 | 8 => {
                let n = 1 + rng.below(pages / 2);
                let order = distinct(&mut rng, pages, pages);
                let dst = order[..n].to_vec();
                let src: Vec<PageId> = if rng.chance(50) {
                    (0..n).map(|_| order[n + rng.below(pages - n)]).collect()
                } else {
                    let mut src = dst.clone();
                    src.rotate_left(rng.below(n));
                    src
                };
                coverage.record_page_copy(&planner, &src, &dst);
                same_outcome(
                    device.copy_pages(&src, &dst),
                    host.copy_pages(&src, &dst),
                    &what,
                );
            }
            // Calls both pools must refuse, changing nothing.
            _ => {
                coverage.refused += 1;
                let (k, v) = host.load_kv(0, &[1]).unwrap();
                let past = slots as KvSlot;
                let bad_call = rng.below(4);
                let call = |pool: &mut dyn KvPool| match bad_call {
                    0 => pool.store_kv(0, &[past], k.as_slice(), v.as_slice()),
                    1 => pool.load_kv(layout.layers(), &[1]).map(drop),
                    2 => pool.copy_slots(&[1, 2], &[3]),
                    _ => pool.copy_pages(&[1], &[pages as PageId]),
                };
                let (device_result, host_result) = (call(&mut *device), call(&mut *host));
                assert!(
                    host_result.is_err(),
                    "{what}: the host pool accepted a bad call"
                );
                same_outcome(device_result, host_result, &what);
            }
        }
        assert_same_bytes(&snapshot(&*device), &snapshot(&*host), &what);
    }
    Some(())
}

/// `run_pool` for every seed; asserts that together they reached every kernel shape.
fn pool_scenarios(make: &impl MakePool, seeds: std::ops::RangeInclusive<u64>) {
    let mut coverage = Coverage::default();
    for seed in seeds {
        if run_pool(make, seed, &mut coverage).is_none() {
            return;
        }
    }
    println!("{coverage:?}");
    coverage.assert_complete();
}

#[test]
fn gpu_kv_pool_matches_host_pool() {
    let Some(device) = device() else { return };
    pool_scenarios(&OnGpu(device), 1..=64);
}

#[test]
fn emulated_kv_kernels_match_host_pool() {
    pool_scenarios(&OnHost, 1..=32);
}
