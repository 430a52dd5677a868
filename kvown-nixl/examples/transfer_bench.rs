//! `cargo run --release -p kvown-nixl --example transfer_bench`: what moving one request's K/V through
//! NIXL costs, between two processes on this machine.
//!
//! * GB/s of one request's K/V (4,096 tokens by default) read through NIXL by the decode node
//!   (this process) from a source process, against `memcpy` of the same bytes (the same runs)
//!   between two buffers of this process, in the same run;
//! * descriptors per request: contiguous slots on both sides (one run), the decode side's pages
//!   scattered (a run per page), and one descriptor per slot (runs not merged, NIXL told not to
//!   merge either);
//! * the cost of the polling a node does every step: the decode node's
//!   `NixlTransfer::poll_outcomes` with nothing in flight and with one READ in flight (over UCX's
//!   `tcp`, from a source that is made to pause, so that it stays in flight), and the source
//!   node's `Holds::poll` (NIXL's notifications) with nothing to report.
//!
//! Medians of `--repeats` runs; `--json` prints them as JSON. The source is this binary started
//! again with `KVOWN_NIXL_BENCH_SOURCE` set.

use std::time::{Duration, Instant};

use clap::Parser;
use kvown_nixl::channel::{Channel, Listener};
use kvown_nixl::{Agent, Holds, NixlError, NixlTransfer, PeerMetadata, RegisteredPool, slot_runs};
use kvown_runtime::kv::{KvDtype, KvLayout, KvPool, KvSlice, KvTensor};
use serde::{Deserialize, Serialize};

/// The environment variable that makes this binary the source process.
const SOURCE_ENV: &str = "KVOWN_NIXL_BENCH_SOURCE";

/// The model geometry and the workload.
#[derive(Debug, Clone, Parser, Serialize, Deserialize)]
#[command(name = "transfer_bench")]
struct Args {
    /// Tokens of the request.
    #[arg(long, default_value_t = 4096)]
    tokens: usize,
    /// Layers (the default geometry is Llama-3.2-1B's: 16 layers, 8 K/V heads of 64, bf16).
    #[arg(long, default_value_t = 16)]
    layers: usize,
    /// K/V heads.
    #[arg(long, default_value_t = 8)]
    kv_heads: usize,
    /// Head dimension.
    #[arg(long, default_value_t = 64)]
    head_dim: usize,
    /// Slots per page.
    #[arg(long, default_value_t = 16)]
    page_size: usize,
    /// Timed repeats of each measurement (the median is reported).
    #[arg(long, default_value_t = 7)]
    repeats: usize,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

impl Args {
    /// Room for the request twice over (for scattering its pages), in whole pages.
    fn layout(&self) -> KvLayout {
        let pages = 2 * self.tokens.div_ceil(self.page_size);
        KvLayout::new(
            self.layers,
            self.kv_heads,
            self.head_dim,
            pages * self.page_size,
            self.page_size,
        )
        .expect("a valid geometry")
    }
}

/// Parent to source.
#[derive(Debug, Serialize, Deserialize)]
enum Command {
    /// Measure `Holds::poll` with nothing held, `calls` times.
    TimeHoldsPoll { calls: u32 },
    /// Make no NIXL call for this long (a READ over `tcp` then waits).
    Pause { millis: u64 },
    /// Exit.
    Quit,
}

/// Source to parent.
#[derive(Debug, Serialize, Deserialize)]
enum Answer {
    /// The source's metadata.
    Metadata(Vec<u8>),
    /// Nanoseconds per `Holds::poll`.
    HoldsPollNs(f64),
}

/// One measured way of moving the request.
#[derive(Debug, Serialize)]
struct Row {
    /// How the slots lie.
    layout: &'static str,
    /// Descriptors per request.
    descriptors: usize,
    /// NIXL READ, median GB/s.
    nixl_gbps: f64,
    /// memcpy of the same runs, median GB/s.
    memcpy_gbps: f64,
    /// NIXL READ median milliseconds.
    nixl_ms: f64,
}

/// Everything measured.
#[derive(Debug, Serialize)]
struct Report {
    geometry: Args,
    bytes_per_request: usize,
    rows: Vec<Row>,
    decode_poll_outcomes_ns: f64,
    decode_poll_one_in_flight_ns: f64,
    source_holds_poll_ns: f64,
}

fn main() -> Result<(), String> {
    if let Ok(socket) = std::env::var(SOURCE_ENV) {
        return source(socket.as_ref()).map_err(|e| e.to_string());
    }
    let args = Args::parse();
    let report = measure(&args).map_err(|e| e.to_string())?;
    match args.json {
        true => println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("plain data")
        ),
        false => print_table(&report),
    }
    Ok(())
}

/// The source process: a registered pool holding the request, serving until told to quit.
fn source(socket: &std::path::Path) -> Result<(), NixlError> {
    let args: Args = serde_json::from_str(&std::env::var("KVOWN_NIXL_BENCH_ARGS").unwrap())
        .expect("the parent's arguments");
    let agent = Agent::new(&format!("bench-source-{}", std::process::id()))?;
    let mut pool = RegisteredPool::new(&agent, args.layout(), KvDtype::Bf16)?;
    fill(&mut pool, &args);
    let mut channel = Channel::connect(socket)?;
    channel.send(&Answer::Metadata(
        agent.metadata(pool.descriptor())?.to_bytes(),
    ))?;
    let mut holds: Holds<()> = Holds::new(Duration::from_secs(60));
    loop {
        match channel.recv::<Command>(Some(Duration::from_millis(1)))? {
            Some(Command::TimeHoldsPoll { calls }) => {
                let mut gone = Vec::new();
                let start = Instant::now();
                for _ in 0..calls {
                    holds.poll(&agent, &mut gone)?;
                }
                let ns = start.elapsed().as_nanos() as f64 / f64::from(calls);
                channel.send(&Answer::HoldsPollNs(ns))?;
            }
            Some(Command::Pause { millis }) => std::thread::sleep(Duration::from_millis(millis)),
            Some(Command::Quit) => return Ok(()),
            // Read the notices of the transfers as a source node would.
            None => holds.poll(&agent, &mut Vec::new())?,
        }
    }
}

/// Stores a pattern in every row of the request's slots.
fn fill(pool: &mut RegisteredPool, args: &Args) {
    let slots: Vec<u32> = source_slots(args);
    let row = args.kv_heads * args.head_dim;
    for layer in 0..args.layers {
        let values: Vec<half::bf16> = (0..slots.len() * row)
            .map(|i| half::bf16::from_f32((i % 251) as f32 + layer as f32))
            .collect();
        pool.store_kv(
            layer,
            &slots,
            KvSlice::Bf16(&values),
            KvSlice::Bf16(&values),
        )
        .expect("slots of the pool");
    }
}

/// The source's slots: the request's positions in consecutive slots from page 1.
fn source_slots(args: &Args) -> Vec<u32> {
    (0..args.tokens)
        .map(|i| (args.page_size + i) as u32)
        .collect()
}

/// The decode node's slots: consecutive, or its pages in a scattered order (every other page,
/// from the end), so that no two pages of the request are adjacent.
fn decode_slots(args: &Args, scattered: bool) -> Vec<u32> {
    let pages = args.tokens.div_ceil(args.page_size);
    (0..args.tokens)
        .map(|i| {
            let (page, offset) = (i / args.page_size, i % args.page_size);
            let page = match scattered {
                false => 1 + page,
                true => 2 * (pages - page),
            };
            (page * args.page_size + offset) as u32
        })
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn measure(args: &Args) -> Result<Report, NixlError> {
    let listener = Listener::bind_temp("kvown-nixl-bench")?;
    let mut child = std::process::Command::new(std::env::current_exe().expect("this binary"))
        .env(SOURCE_ENV, listener.path())
        .env(
            "KVOWN_NIXL_BENCH_ARGS",
            serde_json::to_string(args).unwrap(),
        )
        .spawn()
        .map_err(|e| NixlError::PeerLost {
            detail: format!("starting the source: {e}"),
        })?;
    let mut channel = listener.accept(Duration::from_secs(60), || Ok(()))?;
    let Some(Answer::Metadata(bytes)) = channel.recv(Some(Duration::from_secs(60)))? else {
        return Err(NixlError::PeerLost {
            detail: "no metadata from the source".into(),
        });
    };
    let agent = Agent::new(&format!("bench-decode-{}", std::process::id()))?;
    let pool = RegisteredPool::new(&agent, args.layout(), KvDtype::Bf16)?;
    let peer = agent.load_peer(&PeerMetadata::from_bytes(&bytes)?)?;
    let bytes_per_request = args.tokens * peer.pool.slot_bytes();
    let src = source_slots(args);
    let mut rows = Vec::new();
    for (layout, scattered, merge) in [
        ("contiguous, merged", false, true),
        ("pages scattered, merged", true, true),
        ("one descriptor per slot", true, false),
    ] {
        let dst = decode_slots(args, scattered);
        let mut link =
            NixlTransfer::new(&agent, pool.clone(), peer.clone())?.with_merged_runs(merge);
        let mut nixl = Vec::new();
        for _ in 0..args.repeats {
            let start = Instant::now();
            let id = link.submit_tagged(&src, &dst, Some(0))?;
            link.wait(id)?;
            nixl.push(start.elapsed().as_secs_f64());
        }
        let memcpy = memcpy_seconds(args, &src, &dst, merge);
        let nixl = median(nixl);
        rows.push(Row {
            layout,
            descriptors: link.descriptors(&src, &dst),
            nixl_gbps: bytes_per_request as f64 / nixl / 1e9,
            memcpy_gbps: bytes_per_request as f64 / median(memcpy) / 1e9,
            nixl_ms: nixl * 1e3,
        });
    }
    verify(&pool, args)?;
    let mut link = NixlTransfer::new(&agent, pool.clone(), peer)?;
    let calls = 100_000;
    let mut done = Vec::new();
    let start = Instant::now();
    for _ in 0..calls {
        link.poll_outcomes(&mut done);
    }
    let decode_poll_outcomes_ns = start.elapsed().as_nanos() as f64 / f64::from(calls);
    let decode_poll_one_in_flight_ns = poll_in_flight(args, &mut channel, &bytes)?;
    channel.send(&Command::TimeHoldsPoll { calls: 10_000 })?;
    let Some(Answer::HoldsPollNs(source_holds_poll_ns)) =
        channel.recv(Some(Duration::from_secs(60)))?
    else {
        return Err(NixlError::PeerLost {
            detail: "no answer from the source".into(),
        });
    };
    channel.send(&Command::Quit)?;
    let _ = child.wait();
    Ok(Report {
        geometry: args.clone(),
        bytes_per_request,
        rows,
        decode_poll_outcomes_ns,
        decode_poll_one_in_flight_ns,
        source_holds_poll_ns,
    })
}

/// Nanoseconds per `poll_outcomes` with one READ in flight: a second decode agent restricted
/// to UCX's `tcp` reads one page while the source pauses, so the READ waits for it.
fn poll_in_flight(args: &Args, channel: &mut Channel, metadata: &[u8]) -> Result<f64, NixlError> {
    let options = kvown_nixl::AgentOptions {
        ucx_transports: Some("tcp".into()),
    };
    let agent = Agent::with_options(&format!("bench-tcp-{}", std::process::id()), &options)?;
    let pool = RegisteredPool::new(&agent, args.layout(), KvDtype::Bf16)?;
    let peer = agent.load_peer(&PeerMetadata::from_bytes(metadata)?)?;
    let mut link = NixlTransfer::new(&agent, pool, peer)?;
    let pause = Duration::from_millis(500);
    channel.send(&Command::Pause {
        millis: pause.as_millis() as u64,
    })?;
    let slots: Vec<u32> = (0..args.page_size as u32)
        .map(|i| args.page_size as u32 + i)
        .collect();
    let id = link.submit_tagged(&slots, &slots, None)?;
    let (mut done, mut calls) = (Vec::new(), 0u32);
    let start = Instant::now();
    while start.elapsed() < pause / 2 && link.in_flight() == 1 {
        link.poll_outcomes(&mut done);
        calls += 1;
    }
    let ns = start.elapsed().as_nanos() as f64 / f64::from(calls.max(1));
    if link.in_flight() != 1 {
        return Err(NixlError::PoolMismatch {
            detail: "the READ did not stay in flight while the source paused".into(),
        });
    }
    link.wait(id)?;
    Ok(ns)
}

/// Seconds per `memcpy` of the request's runs (every layer, K and V) between two buffers of
/// this process laid out as the pools are, one repeat each.
fn memcpy_seconds(args: &Args, src: &[u32], dst: &[u32], merge: bool) -> Vec<f64> {
    let layout = args.layout();
    let row_bytes = layout.row_len(KvTensor::K) * 2;
    let buffer = layout.slots() * row_bytes;
    let (from, mut to) = (
        vec![1u8; buffer * 2 * args.layers],
        vec![0u8; buffer * 2 * args.layers],
    );
    let runs = slot_runs(src, dst, merge);
    (0..args.repeats)
        .map(|_| {
            let start = Instant::now();
            for region in 0..2 * args.layers {
                let base = region * buffer;
                for run in &runs {
                    let (s, d) = (
                        base + run.src as usize * row_bytes,
                        base + run.dst as usize * row_bytes,
                    );
                    let len = run.len as usize * row_bytes;
                    to[d..d + len].copy_from_slice(&from[s..s + len]);
                }
            }
            std::hint::black_box(&to);
            start.elapsed().as_secs_f64()
        })
        .collect()
}

/// Fails unless the decode pool holds the source's pattern at the scattered slots (the last
/// layout read).
fn verify(pool: &RegisteredPool, args: &Args) -> Result<(), NixlError> {
    let dst = decode_slots(args, true);
    let row = args.kv_heads * args.head_dim;
    for layer in [0, args.layers - 1] {
        let (k, _) = pool.load_kv(layer, &dst).expect("slots of the pool");
        let expected: Vec<half::bf16> = (0..dst.len() * row)
            .map(|i| half::bf16::from_f32((i % 251) as f32 + layer as f32))
            .collect();
        if k.into_vec::<half::bf16>() != Some(expected) {
            return Err(NixlError::PoolMismatch {
                detail: format!("layer {layer} read back differs from the source's"),
            });
        }
    }
    Ok(())
}

fn print_table(report: &Report) {
    let g = &report.geometry;
    println!(
        "one request of {} tokens: {} layers x {} K/V heads x {} dims, bf16 = {:.1} MiB",
        g.tokens,
        g.layers,
        g.kv_heads,
        g.head_dim,
        report.bytes_per_request as f64 / (1 << 20) as f64
    );
    println!(
        "{:<26} {:>12} {:>10} {:>12} {:>14} {:>9}",
        "slots", "descriptors", "NIXL ms", "NIXL GB/s", "memcpy GB/s", "NIXL/cpy"
    );
    for row in &report.rows {
        println!(
            "{:<26} {:>12} {:>10.2} {:>12.2} {:>14.2} {:>9.2}",
            row.layout,
            row.descriptors,
            row.nixl_ms,
            row.nixl_gbps,
            row.memcpy_gbps,
            row.nixl_gbps / row.memcpy_gbps
        );
    }
    println!(
        "polling per call: decode NixlTransfer::poll_outcomes {:.0} ns with nothing in flight, \
         {:.0} ns with one READ in flight; source Holds::poll (NIXL notifications) {:.0} ns",
        report.decode_poll_outcomes_ns,
        report.decode_poll_one_in_flight_ns,
        report.source_holds_poll_ns
    );
}
