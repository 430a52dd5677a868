//! Times each kernel with CUDA events (median of many runs, non-zero inputs) and prints one
//! table: alloc_extend, alloc_decode + table write for 1,024 requests at page 16, free,
//! store_kv (with its bandwidth next to a measured device-to-device copy), and copy_pages.
//! Prints `skipped: <reason>` and exits 0 where no CUDA device works.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, sys::CUevent_flags};
use kvown_cuda::{CudaDevice, CudaKvPool, CudaPagedAllocator};
use kvown_runtime::alloc::{DecodeShape, ExtendShape, KvSlot, Lifo};
use kvown_runtime::kv::{KvDtype, KvLayout, KvPool, KvTensor};

const RUNS: usize = 200;
const REQUESTS: usize = 1024;
const PAGE: usize = 16;

type Error = Box<dyn std::error::Error>;

/// Median milliseconds of `RUNS` runs of `body`, each bracketed by timing events; `after` runs
/// outside the timed region (e.g. to free what `body` allocated).
fn time<T>(
    stream: &Arc<CudaStream>,
    mut body: impl FnMut() -> Result<T, Error>,
    mut after: impl FnMut(T) -> Result<(), Error>,
) -> Result<f64, Error> {
    let warm = body()?;
    after(warm)?;
    let mut samples = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let value = body()?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        end.synchronize()?;
        samples.push(f64::from(start.elapsed_ms(&end)?));
        after(value)?;
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[RUNS / 2])
}

fn row(name: &str, ms: f64, note: String) {
    println!("| {name:<34} | {:>10.1} | {note}", ms * 1e3);
}

fn main() -> Result<(), Error> {
    let device = match CudaDevice::get() {
        Ok(device) => device,
        Err(reason) => {
            println!("skipped: {reason}");
            return Ok(());
        }
    };
    let stream = device.stream().clone();
    println!(
        "device: {} ({}), {RUNS} runs each, median",
        device.name(),
        device.arch()
    );
    println!("| {:<34} | {:>10} | note", "kernel", "median us");
    println!("|{}|{}|------", "-".repeat(36), "-".repeat(12));

    // Allocation: 1,024 requests of 1,000 prompt tokens, then decode steps that cross a page
    // boundary for every request (seq_len % 16 == 1), so each takes a page and writes its row.
    let size = REQUESTS * 2048;
    let rows: Vec<u32> = (0..REQUESTS as u32).collect();
    let alloc = CudaPagedAllocator::<Lifo>::new(device.clone(), size, PAGE, REQUESTS, 2048)?;
    let extend: Vec<ExtendShape> = (0..REQUESTS)
        .map(|_| ExtendShape {
            prefix_len: 0,
            seq_len: 1000,
            last_loc: None,
        })
        .collect();
    // The allocator is shared by the timed closure and the untimed `after`, so it sits in a cell.
    let alloc = std::cell::RefCell::new(alloc);
    let free = |out: kvown_cuda::DeviceSlots| -> Result<(), Error> {
        let host: Vec<KvSlot> = out.to_host(&device)?;
        Ok(alloc.borrow_mut().free(&host)?)
    };
    let extend_ms = time(
        &stream,
        || Ok(alloc.borrow_mut().alloc_extend(&extend, &rows)?),
        free,
    )?;
    row(
        "alloc_extend (1024 x 1000 tokens)",
        extend_ms,
        "host params upload + kernel".into(),
    );
    let prompt: Vec<ExtendShape> = (0..REQUESTS)
        .map(|_| ExtendShape {
            prefix_len: 0,
            seq_len: 1024,
            last_loc: None,
        })
        .collect();
    let prompt = alloc
        .borrow_mut()
        .alloc_extend(&prompt, &rows)?
        .to_host(&device)?;
    let decode: Vec<DecodeShape> = (0..REQUESTS)
        .map(|i| DecodeShape {
            seq_len: 1025,
            last_loc: prompt[i * 1024 + 1023],
        })
        .collect();
    let decode_ms = time(
        &stream,
        || Ok(alloc.borrow_mut().alloc_decode(&decode, &rows)?),
        free,
    )?;
    row(
        "alloc_decode + table (1024, ps 16)",
        decode_ms,
        "every request opens a page".into(),
    );
    let held = std::cell::RefCell::new(
        alloc
            .borrow_mut()
            .alloc_decode(&decode, &rows)?
            .to_host(&device)?,
    );
    let free_ms = time(
        &stream,
        || Ok(alloc.borrow_mut().free(&held.borrow())?),
        |()| {
            *held.borrow_mut() = alloc
                .borrow_mut()
                .alloc_decode(&decode, &rows)?
                .to_host(&device)?;
            Ok(())
        },
    )?;
    row(
        "free (1024 pages)",
        free_ms,
        "host dedup + sort + upload + kernel".into(),
    );

    // store_kv: 8 KV heads x 128 dims f16 (2 KiB rows), 16,384 tokens per call (a prefill-sized
    // batch: 64 MiB of K and V, large enough that two launches' overhead does not decide the
    // bandwidth), scattered over a 64 Ki-slot pool.
    let tokens = 16384usize;
    let layout = KvLayout::new(1, 8, 128, 64 * 1024, PAGE)?;
    let mut pool = CudaKvPool::new(device.clone(), layout, KvDtype::F16)?;
    let row_bytes = layout.row_len(KvTensor::K) * 2;
    let slots: Vec<u32> = (0..tokens as u32)
        .map(|t| PAGE as u32 + (t * 7919) % (64 * 1024))
        .collect();
    let slots = stream.clone_htod(&slots)?;
    let data: Vec<u8> = (0..tokens * row_bytes)
        .map(|i| (i * 31 % 251) as u8 + 1)
        .collect();
    let k: CudaSlice<u8> = stream.clone_htod(&data)?;
    let v: CudaSlice<u8> = stream.clone_htod(&data)?;
    let store_ms = time(
        &stream,
        || Ok(pool.store_kv_device(0, &slots, &k, &v)?),
        |()| Ok(()),
    )?;
    // Bytes moved: read + write of K and V rows.
    let moved = 2.0 * 2.0 * (tokens * row_bytes) as f64;
    let store_gbs = moved / (store_ms * 1e-3) / 1e9;
    row(
        "store_kv (16384 tok, 2 KiB rows, K+V)",
        store_ms,
        format!("{store_gbs:.0} GB/s (read+write)"),
    );
    let mut copy_dst: CudaSlice<u8> = stream.alloc_zeros(2 * tokens * row_bytes)?;
    let copy_src: CudaSlice<u8> = stream.clone_htod(&[data.clone(), data.clone()].concat())?;
    let copy_ms = time(
        &stream,
        || Ok(stream.memcpy_dtod(&copy_src, &mut copy_dst)?),
        |()| Ok(()),
    )?;
    let copy_gbs = moved / (copy_ms * 1e-3) / 1e9;
    row(
        "memcpy_dtod (same bytes)",
        copy_ms,
        format!(
            "{copy_gbs:.0} GB/s; store_kv at {:.0}%",
            100.0 * store_gbs / copy_gbs
        ),
    );

    let src_pages: Vec<u32> = (1..=256).collect();
    let dst_pages: Vec<u32> = (1001..=1256).collect();
    let copy_pages_ms = time(
        &stream,
        || Ok(pool.copy_pages(&src_pages, &dst_pages)?),
        |()| Ok(()),
    )?;
    row(
        "copy_pages (256 pages of 16, K+V)",
        copy_pages_ms,
        "includes two small htod copies".into(),
    );
    Ok(())
}
