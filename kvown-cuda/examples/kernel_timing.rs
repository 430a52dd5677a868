//! Times each GPU step with CUDA events (median of many runs, non-zero inputs) and prints one
//! table: the batch flow's decode step for 1,024 requests at page 16 on the staged mirror
//! (`prepare_for_decode` + `alloc_for_decode`, the packet's copy and `scatter_step`), opening a
//! page and mid-page, shipped by a CUDA graph and by a plain copy + launch; an extend of 1,024 x
//! 1,000 tokens; store_kv (with its bandwidth next to a measured device-to-device copy); and
//! copy_pages. Each row also gives the host's time for the call (its median wall time), and
//! building-block rows time the driver calls a step is made of (a small allocation, a small
//! upload), so a row's time can be read as host submission or device work. Prints `skipped: <reason>` and exits 0
//! where no CUDA device works. `--json` prints the same rows as one JSON object instead
//! (`{"device", "arch", "runs", "rows": [{"call", "events_us", "host_us", "note"}]}`, or
//! `{"skipped": reason}`).

use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use cudarc::driver::{CudaSlice, CudaStream, sys::CUevent_flags};
use kvown_cuda::staging::default_slot_words;
use kvown_cuda::{CudaDevice, CudaKvPool, CudaStepLink, StagedMirror};
use kvown_runtime::alloc::{KvAllocator, PagedAllocator};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, prepare_for_decode, prepare_for_extend,
    release_kv_cache,
};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::kv::{KvDtype, KvLayout, KvPool, KvTensor};
use kvown_runtime::slots::ReqToTokenPool;

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

/// The staged mirror on `device` for `REQUESTS` requests of up to `WIDTH` tokens, in a
/// cache without a prefix cache; with `graph`, decode steps replay captured graphs.
type StagedCache = KvCache<PagedAllocator, StagedMirror<CudaStepLink>>;

/// Positions per request row.
const WIDTH: usize = 2048;

fn staged_cache(device: &Arc<CudaDevice>, graph: bool) -> Result<StagedCache, Error> {
    let host = PagedAllocator::new(REQUESTS * WIDTH, PAGE, false)?;
    let table = ReqToTokenPool::new(REQUESTS, WIDTH)?;
    let rows = REQUESTS + 1;
    let slot_words = default_slot_words(host.capacity(), rows, rows);
    let mut link = CudaStepLink::new(device.clone(), 4, slot_words, rows, WIDTH)?;
    if graph {
        link.capture_decode_graphs(rows)?;
    }
    let mirror = StagedMirror::new(link, &table, host.capacity())?;
    Ok(KvCache::with_mirror(
        host,
        table,
        TreeCache::Disabled,
        mirror,
    )?)
}

/// `REQUESTS` new requests with prompts of `len` tokens, extended.
fn admitted(cache: &mut StagedCache, len: usize) -> Result<ScheduleBatch, Error> {
    let reqs = (0..REQUESTS as u64)
        .map(|rid| Req::new(rid, (0..len as u32).map(|t| t + rid as u32).collect()))
        .collect();
    alloc_for_extend(prepare_for_extend(ScheduleBatch::new(reqs)), cache)
        .map_err(|failure| failure.error.to_string().into())
}

/// Decode steps of every request of `batch` (each starting on a page boundary), timed with
/// events on the staging stream: the medians of the steps whose tokens open a page and of
/// those that do not.
fn decode_steps(
    cache: &mut StagedCache,
    mut batch: ScheduleBatch,
) -> Result<(Timing, Timing), Error> {
    let stream = cache.mirror().ring().link().stream().clone();
    let context = stream.context();
    let flags = Some(CUevent_flags::CU_EVENT_DEFAULT);
    let (start, end) = (context.new_event(flags)?, context.new_event(flags)?);
    let (mut opening, mut mid) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    // One warm-up step, then the timed ones.
    for step in 0..=RUNS {
        let opens = batch.reqs()[0].kv().kv_allocated_len() % PAGE == 0;
        start.record(&stream)?;
        let clock = Instant::now();
        let prepared = prepare_for_decode(batch, cache).map_err(|(_, e)| e.to_string())?;
        batch = alloc_for_decode(prepared, cache).map_err(|f| f.error.to_string())?;
        let host = clock.elapsed().as_secs_f64() * 1e3;
        end.record(&stream)?;
        end.synchronize()?;
        let device = f64::from(start.elapsed_ms(&end)?);
        let samples = if opens { &mut opening } else { &mut mid };
        if step > 0 {
            samples.0.push(device);
            samples.1.push(host);
        }
    }
    let timing = |(device, host): (Vec<f64>, Vec<f64>)| Timing {
        device_ms: median(device),
        host_ms: median(host),
    };
    Ok((timing(opening), timing(mid)))
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

    // The staged mirror: 1,024 requests with 1,024-token prompts, then decode steps. One
    // step in 16 opens a page for every request; the rest write mid-page.
    for graph in [true, false] {
        let mut cache = staged_cache(&device, graph)?;
        let batch = admitted(&mut cache, 1024)?;
        let (opening, mid) = decode_steps(&mut cache, batch)?;
        let how = if graph { "graph" } else { "copy + launch" };
        report.row(
            &format!("decode step (1024, ps 16, {how})"),
            opening,
            "every request opens a page".into(),
        );
        report.row(
            &format!("decode step (1024, mid-page, {how})"),
            mid,
            "no request opens a page".into(),
        );
    }
    let mut cache = staged_cache(&device, false)?;
    let extend_stream = cache.mirror().ring().link().stream().clone();
    let cache = std::cell::RefCell::new(&mut cache);
    let extend = time(
        &extend_stream,
        || admitted(&mut cache.borrow_mut(), 1000),
        |mut batch| {
            let mut cache = cache.borrow_mut();
            for req in batch.reqs_mut() {
                release_kv_cache(req, &mut cache, false)?;
            }
            Ok(())
        },
    )?;
    report.row(
        "extend (1024 x 1000 tokens)",
        extend,
        "prepare + alloc_for_extend + copy + scatter".into(),
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

    report.finish()
}
