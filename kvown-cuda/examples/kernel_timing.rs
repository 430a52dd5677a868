//! Times each kernel with CUDA events (median of many runs, non-zero inputs) and prints one
//! table: alloc_extend, alloc_decode + table write for 1,024 requests at page 16, free,
//! store_kv (with its bandwidth next to a measured device-to-device copy), and copy_pages.
//! Each row also gives the host's time for the call (its median wall time), and building-block
//! rows time the driver calls a step is made of (a small allocation, a small upload), so a row's
//! time can be read as host submission or device work. Prints `skipped: <reason>` and exits 0
//! where no CUDA device works. `--json` prints the same rows as one JSON object instead
//! (`{"device", "arch", "runs", "rows": [{"call", "events_us", "host_us", "note"}]}`, or
//! `{"skipped": reason}`).

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use cudarc::driver::{CudaSlice, CudaStream, sys::CUevent_flags};
use kvown_cuda::{CudaDevice, CudaKvPool, CudaPagedAllocator};
use kvown_runtime::alloc::{DecodeShape, ExtendShape, KvSlot, Lifo};
use kvown_runtime::kv::{KvDtype, KvLayout, KvPool, KvTensor};

const RUNS: usize = 200;
const REQUESTS: usize = 1024;
const PAGE: usize = 16;

type Error = Box<dyn std::error::Error>;

/// Medians of one timed call over `RUNS` runs.
#[derive(Clone, Copy)]
struct Timing {
    /// Between the events recorded before and after the call, in milliseconds: device work plus
    /// any gap while the device waited for the host to submit it.
    device_ms: f64,
    /// The host's wall time for the call, in milliseconds.
    host_ms: f64,
}

fn median(mut samples: Vec<f64>) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// Times `RUNS` runs of `body`, each bracketed by timing events (created beforehand, so their
/// creation is not timed) and by the host clock; `after` runs outside the timed region (e.g. to
/// free what `body` allocated).
fn time<T>(
    stream: &Arc<CudaStream>,
    mut body: impl FnMut() -> Result<T, Error>,
    mut after: impl FnMut(T) -> Result<(), Error>,
) -> Result<Timing, Error> {
    let warm = body()?;
    after(warm)?;
    let context = stream.context();
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (context.new_event(flags)?, context.new_event(flags)?);
    let mut device = Vec::with_capacity(RUNS);
    let mut host = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        start.record(stream)?;
        let clock = Instant::now();
        let value = body()?;
        host.push(clock.elapsed().as_secs_f64() * 1e3);
        end.record(stream)?;
        end.synchronize()?;
        device.push(f64::from(start.elapsed_ms(&end)?));
        after(value)?;
    }
    Ok(Timing {
        device_ms: median(device),
        host_ms: median(host),
    })
}

/// `REQUESTS` prompts of `seq_len` tokens each, on an empty prefix.
fn prompts(seq_len: usize) -> Vec<ExtendShape> {
    let fresh = ExtendShape {
        prefix_len: 0,
        seq_len,
        last_loc: None,
    };
    vec![fresh; REQUESTS]
}

/// Command line.
#[derive(Parser)]
#[command(about = "Times kvown-cuda's kernels with CUDA events")]
struct Args {
    /// Print the rows as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// One timed call, in microseconds.
#[derive(serde::Serialize)]
struct Row {
    call: String,
    events_us: f64,
    host_us: f64,
    note: String,
}

/// The table, printed row by row, or gathered and printed as JSON at the end.
#[derive(serde::Serialize)]
struct Report {
    device: String,
    arch: String,
    runs: usize,
    rows: Vec<Row>,
    #[serde(skip)]
    json: bool,
}

impl Report {
    fn new(device: &CudaDevice, json: bool) -> Self {
        let report = Report {
            device: device.name().to_owned(),
            arch: device.arch().to_owned(),
            runs: RUNS,
            rows: Vec::new(),
            json,
        };
        if !json {
            println!(
                "device: {} ({}), {RUNS} runs each, median",
                report.device, report.arch
            );
            println!(
                "| {:<38} | {:>9} | {:>7} | note",
                "call", "events us", "host us"
            );
            println!(
                "|{}|{}|{}|------",
                "-".repeat(40),
                "-".repeat(11),
                "-".repeat(9)
            );
        }
        report
    }

    fn row(&mut self, call: &str, timing: Timing, note: String) {
        let row = Row {
            call: call.to_owned(),
            events_us: timing.device_ms * 1e3,
            host_us: timing.host_ms * 1e3,
            note,
        };
        if !self.json {
            println!(
                "| {:<38} | {:>9.1} | {:>7.1} | {}",
                row.call, row.events_us, row.host_us, row.note
            );
        }
        self.rows.push(row);
    }

    fn finish(self) -> Result<(), Error> {
        if self.json {
            println!("{}", serde_json::to_string_pretty(&self)?);
        }
        Ok(())
    }
}

fn main() -> Result<(), Error> {
    let args = Args::parse();
    let device = match CudaDevice::get() {
        Ok(device) => device,
        Err(reason) => {
            if args.json {
                println!("{}", serde_json::json!({ "skipped": reason.to_string() }));
            } else {
                println!("skipped: {reason}");
            }
            return Ok(());
        }
    };
    let stream = device.stream().clone();
    let mut report = Report::new(&device, args.json);

    // Building blocks: the driver calls an allocation step may make.
    let words: Vec<u32> = (0..4 * REQUESTS as u32).collect();
    let alloc_small = time(
        &stream,
        // SAFETY: u32 is DeviceRepr; the buffer is dropped unread.
        || Ok(unsafe { stream.alloc::<u32>(REQUESTS) }?),
        |buffer| {
            drop(buffer);
            Ok(())
        },
    )?;
    report.row(
        "block: device alloc + free (4 KiB)",
        alloc_small,
        "stream-ordered pool".into(),
    );
    let mut kept: CudaSlice<u32> = stream.alloc_zeros(words.len())?;
    let upload = time(
        &stream,
        || Ok(stream.memcpy_htod(&words, &mut kept)?),
        |()| Ok(()),
    )?;
    report.row(
        "block: upload 16 KiB (pageable)",
        upload,
        "into a kept buffer".into(),
    );
    // SAFETY: u32 is DeviceRepr; every element is written before the copies read it.
    let mut pinned = unsafe { stream.context().alloc_pinned::<u32>(words.len()) }?;
    pinned.as_mut_slice()?.copy_from_slice(&words);
    let pinned_upload = time(
        &stream,
        || Ok(stream.memcpy_htod(&pinned, &mut kept)?),
        |()| Ok(()),
    )?;
    report.row(
        "block: upload 16 KiB (pinned)",
        pinned_upload,
        "page-locked, write-combined".into(),
    );

    // Allocation: 1,024 requests of 1,000 prompt tokens, then decode steps that cross a page
    // boundary for every request (seq_len % 16 == 1), so each takes a page and writes its row.
    let size = REQUESTS * 2048;
    let rows: Vec<u32> = (0..REQUESTS as u32).collect();
    let alloc = CudaPagedAllocator::<Lifo>::new(device.clone(), size, PAGE, REQUESTS, 2048)?;
    let extend = prompts(1000);
    // The allocator is shared by the timed closure and the untimed `after`, so it sits in a cell.
    let alloc = std::cell::RefCell::new(alloc);
    let free = |out: kvown_cuda::DeviceSlots| -> Result<(), Error> {
        let host: Vec<KvSlot> = out.to_host(&device)?;
        Ok(alloc.borrow_mut().free(&host)?)
    };
    let extend = time(
        &stream,
        || Ok(alloc.borrow_mut().alloc_extend(&extend, &rows)?),
        free,
    )?;
    report.row(
        "alloc_extend (1024 x 1000 tokens)",
        extend,
        "host params upload + kernel".into(),
    );
    let prompt = alloc
        .borrow_mut()
        .alloc_extend(&prompts(1024), &rows)?
        .to_host(&device)?;
    let decode: Vec<DecodeShape> = (0..REQUESTS)
        .map(|i| DecodeShape {
            seq_len: 1025,
            last_loc: prompt[i * 1024 + 1023],
        })
        .collect();
    let decode_timing = time(
        &stream,
        || Ok(alloc.borrow_mut().alloc_decode(&decode, &rows)?),
        free,
    )?;
    report.row(
        "alloc_decode + table (1024, ps 16)",
        decode_timing,
        "every request opens a page".into(),
    );
    // The same requests one token later. Their `last_loc + 1` is the first slot of the page after
    // their own (the planner keeps no page state to notice); the work timed is the same.
    let mid_page: Vec<DecodeShape> = decode
        .iter()
        .map(|shape| DecodeShape {
            seq_len: shape.seq_len + 1,
            last_loc: shape.last_loc + 1,
        })
        .collect();
    report.row(
        "alloc_decode + table (1024, mid-page)",
        time(
            &stream,
            || Ok(alloc.borrow_mut().alloc_decode(&mid_page, &rows)?),
            |_| Ok(()),
        )?,
        "no request opens a page".into(),
    );
    let held = std::cell::RefCell::new(
        alloc
            .borrow_mut()
            .alloc_decode(&decode, &rows)?
            .to_host(&device)?,
    );
    let free_timing = time(
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
    report.row(
        "free (1024 pages)",
        free_timing,
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
    let store = time(
        &stream,
        || Ok(pool.store_kv_device(0, &slots, &k, &v)?),
        |()| Ok(()),
    )?;
    // Bytes moved: read + write of K and V rows.
    let moved = 2.0 * 2.0 * (tokens * row_bytes) as f64;
    let store_gbs = moved / (store.device_ms * 1e-3) / 1e9;
    report.row(
        "store_kv (16384 tok, 2 KiB rows, K+V)",
        store,
        format!("{store_gbs:.0} GB/s (read+write)"),
    );
    let mut copy_dst: CudaSlice<u8> = stream.alloc_zeros(2 * tokens * row_bytes)?;
    let copy_src: CudaSlice<u8> = stream.clone_htod(&[data.clone(), data.clone()].concat())?;
    let copy = time(
        &stream,
        || Ok(stream.memcpy_dtod(&copy_src, &mut copy_dst)?),
        |()| Ok(()),
    )?;
    let copy_gbs = moved / (copy.device_ms * 1e-3) / 1e9;
    report.row(
        "memcpy_dtod (same bytes)",
        copy,
        format!(
            "{copy_gbs:.0} GB/s; store_kv at {:.0}%",
            100.0 * store_gbs / copy_gbs
        ),
    );

    let src_pages: Vec<u32> = (1..=256).collect();
    let dst_pages: Vec<u32> = (1001..=1256).collect();
    let copy_pages = time(
        &stream,
        || Ok(pool.copy_pages(&src_pages, &dst_pages)?),
        |()| Ok(()),
    )?;
    report.row(
        "copy_pages (256 pages of 16, K+V)",
        copy_pages,
        "includes two small htod copies".into(),
    );

    // cudarc gives every buffer it allocates two events, for ordering across streams, unless
    // the context's event tracking is off. The same decode with tracking off for the buffers
    // allocated from here on (the per-call `out_cache_loc`).
    // SAFETY: this program uses one stream, so no buffer needs cross-stream ordering.
    unsafe { device.context().disable_event_tracking() };
    report.row(
        "alloc_decode, cudarc event tracking off",
        time(
            &stream,
            || Ok(alloc.borrow_mut().alloc_decode(&decode, &rows)?),
            free,
        )?,
        "every request opens a page".into(),
    );
    report.finish()
}
