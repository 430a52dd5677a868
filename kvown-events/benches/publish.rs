//! What publishing the prefix cache's events costs a replica: the encoder's cost per event in
//! each dialect (on the events of a real W2c run), and `W2c_published/W2c`, a W2c step with the
//! cache's
//! events on, drained, encoded (default dialect) and sent on a ZMQ PUB socket to a subscriber
//! on loopback, over a plain W2c step (`benches/README.md` at the workspace root defines W2c and W2e; the loops
//! are the same code, `benches/workloads/`). Both sides of a ratio are timed in alternation,
//! `STEPS` steps each, and the median of the repeats is reported.
//!
//! `cargo bench -p kvown-events --bench publish [-- --repeats 7 --json PATH]`
//!
//! `-- --encoder-only DIALECT` times only that dialect's encoder, for an instruction count
//! under callgrind (`--repeats 1` against `--repeats 2`: the difference is one pass over the
//! events).

#[path = "../../benches/workloads/mod.rs"]
#[allow(dead_code)]
mod workloads;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use kvown::radix::CacheEvent;
use kvown_events::{
    Context, Dialect, EventEncoder, EventPublisher, EventSubscriber, PublisherConfig,
    PublisherThread,
};
use workloads::{DecodeLoop, PAGE_SIZE};

/// Steps per measurement (and of warm-up), as `examples/bench.rs` times W2c.
const STEPS: usize = 2000;

fn main() {
    let mut repeats = 7;
    let mut json = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/bench/kvown-events.json"
    )
    .to_owned();
    let mut encoder_only = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--repeats" => repeats = args.next().and_then(|n| n.parse().ok()).expect("a count"),
            "--json" => json = args.next().expect("a path"),
            "--encoder-only" => {
                let dialect = args.next().expect("a dialect");
                encoder_only = Some(dialect.parse::<Dialect>().unwrap_or_else(|e| panic!("{e}")));
            }
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    let encoder = EventEncoder::new(PAGE_SIZE).expect("a page size");
    let mut figures = Vec::new();
    let batches = w2c_event_batches();
    if let Some(dialect) = encoder_only {
        let encoder = encoder.with_dialect(dialect);
        report(&encode_cost(&encoder, &batches, repeats), &json);
        return;
    }
    for dialect in Dialect::ALL {
        let encoder = encoder.clone().with_dialect(dialect);
        figures.extend(encode_cost(&encoder, &batches, repeats));
    }
    let context = Context::new();
    let config = PublisherConfig {
        replay_endpoint: None,
        ..PublisherConfig::default()
    };
    let mut inline =
        EventPublisher::bind(&context, &config, encoder.clone()).expect("bind on loopback");
    let mut threaded =
        PublisherThread::spawn(&context, &config, encoder.clone(), 1024).expect("bind on loopback");
    let stop = Arc::new(AtomicBool::new(false));
    let readers =
        [inline.endpoint(), threaded.endpoint()].map(|endpoint| reader(&context, endpoint, &stop));
    // W2c_published: the events handed to the publisher thread (the way to run it);
    // W2c_published_inline: encoded and sent on the engine's thread.
    let mut published = DecodeLoop::with_events();
    let mut published_step = || {
        black_box(&mut published).step_publishing_events(&mut |events| {
            threaded.publish(events).expect("publish");
        })
    };
    let mut inline_loop = DecodeLoop::with_events();
    let mut inline_step = || {
        black_box(&mut inline_loop).step_publishing_events(&mut |events| {
            inline
                .publish_events(unix_seconds(), &events)
                .expect("publish");
        })
    };
    let mut w2c = DecodeLoop::new(true);
    let mut w2c_step = || black_box(&mut w2c).step();
    let mut w2e = DecodeLoop::with_events();
    let mut w2e_step = || black_box(&mut w2e).step_draining_events();
    // Wall time shares the two cores with the publisher's threads, ZMQ's I/O thread and the
    // subscriber; the engine thread's own CPU time is what publishing costs the engine.
    let mut pair = |names: [&str; 2], top: &mut dyn FnMut(), bottom: &mut dyn FnMut()| {
        for (clock, name) in [Clock::Wall, Clock::ThreadCpu].into_iter().zip(names) {
            let top = step_timer(clock, &mut *top);
            let ratio = paired(repeats, top, step_timer(clock, &mut *bottom));
            figures.push((name.to_owned(), "ratio", ratio));
        }
    };
    // `_cpu`: the engine thread's CPU time, not the wall time.
    let names = ["W2c_published/W2c", "W2c_published/W2c_cpu"];
    pair(names, &mut published_step, &mut w2c_step);
    let names = ["W2c_published_inline/W2c", "W2c_published_inline/W2c_cpu"];
    pair(names, &mut inline_step, &mut w2c_step);
    let names = ["W2c_published/W2e", "W2c_published/W2e_cpu"];
    pair(names, &mut published_step, &mut w2e_step);
    let steps: [(&str, &mut dyn FnMut()); 4] = [
        ("W2c", &mut w2c_step),
        ("W2e", &mut w2e_step),
        ("W2c_published", &mut published_step),
        ("W2c_published_inline", &mut inline_step),
    ];
    for (name, step) in steps {
        let mut timer = step_timer(Clock::Wall, step);
        let times = Stats::of((0..repeats).map(|_| timer()));
        figures.push((name.to_owned(), "us/step", times));
    }
    let loops = [
        (&w2c, "W2c"),
        (&w2e, "W2e"),
        (&published, "W2c_published"),
        (&inline_loop, "W2c_published_inline"),
    ];
    for (decode, name) in loops {
        if let Err(violation) = decode.check() {
            panic!("{name}: invariant violated after the run: {violation}");
        }
    }
    let sent = [
        inline.next_seq(),
        threaded.finish().expect("the publisher thread"),
    ];
    stop.store(true, Ordering::Relaxed);
    for ((reader, sent), name) in readers.into_iter().zip(sent).zip(["inline", "thread"]) {
        let received = reader.join().expect("the reader");
        assert!(
            received > 0,
            "{name}: the subscriber received none of {sent} batches"
        );
        println!("{name} publisher: {sent} batches sent, {received} received on loopback");
    }
    report(&figures, &json);
}

/// The events of `STEPS` W2c steps, a batch per step.
fn w2c_event_batches() -> Vec<Vec<CacheEvent>> {
    let mut decode = DecodeLoop::with_events();
    let mut batches: Vec<Vec<CacheEvent>> = Vec::new();
    for _ in 0..STEPS {
        decode.step_publishing_events(&mut |events| batches.push(events));
    }
    batches
}

/// The encoder's cost on `batches`: ns per event, ns per page, bytes per page, named after its
/// dialect.
fn encode_cost(
    encoder: &EventEncoder,
    batches: &[Vec<CacheEvent>],
    repeats: usize,
) -> Vec<(String, &'static str, Stats)> {
    let events: usize = batches.iter().map(Vec::len).sum();
    let pages: usize = batches
        .iter()
        .flatten()
        .map(|event| match event {
            CacheEvent::Stored { pages, .. } => pages.len(),
            CacheEvent::Removed { hashes } => hashes.len(),
            CacheEvent::Cleared => 0,
        })
        .sum();
    assert!(events > 0, "W2c with events on queued none");
    let mut out = Vec::new();
    let mut bytes = 0;
    let nanos: Vec<f64> = (0..repeats)
        .map(|_| {
            let start = Instant::now();
            bytes = 0;
            for batch in batches {
                encoder
                    .encode(0.0, black_box(batch), &mut out)
                    .expect("encode");
                bytes += out.len();
            }
            start.elapsed().as_nanos() as f64
        })
        .collect();
    let dialect = encoder.dialect();
    println!(
        "encoder ({dialect}): {events} events naming {pages} pages in {} batches (one per W2c \
         step)",
        batches.len()
    );
    vec![
        (
            format!("encode per event {dialect}"),
            "ns",
            Stats::of(nanos.iter().map(|n| n / events as f64)),
        ),
        (
            format!("encode per page {dialect}"),
            "ns",
            Stats::of(nanos.iter().map(|n| n / pages as f64)),
        ),
        (
            format!("wire bytes per page {dialect}"),
            "B",
            Stats::of([bytes as f64 / pages as f64]),
        ),
    ]
}

/// A subscriber thread on `endpoint` reading (and decoding) until `stop`; it returns the
/// batches it read.
fn reader(context: &Context, endpoint: &str, stop: &Arc<AtomicBool>) -> thread::JoinHandle<u64> {
    let mut subscriber = EventSubscriber::connect(context, endpoint, None, "").expect("connect");
    let stop = Arc::clone(stop);
    thread::spawn(move || {
        let mut received = 0;
        while !stop.load(Ordering::Relaxed) {
            // Joined late, without replays: gaps are expected, and reported as lost.
            match subscriber.recv(Duration::from_millis(10)) {
                Ok(Some(batch)) => {
                    received += 1;
                    if let Err(error) = batch.decoded {
                        panic!("subscriber: batch {}: {error}", batch.seq);
                    }
                }
                Ok(None) | Err(kvown_events::SubscribeError::Lost { .. }) => {}
                Err(error) => panic!("subscriber: {error}"),
            }
        }
        received
    })
}

/// What a measurement reads.
#[derive(Debug, Clone, Copy)]
enum Clock {
    /// Elapsed time.
    Wall,
    /// CPU time of the measuring thread (`CLOCK_THREAD_CPUTIME_ID`).
    ThreadCpu,
}

impl Clock {
    fn now_ns(self, start: Instant) -> f64 {
        match self {
            Clock::Wall => start.elapsed().as_nanos() as f64,
            Clock::ThreadCpu => {
                let mut time = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 0,
                };
                // SAFETY: `time` is a valid timespec for the call to fill.
                let status =
                    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut time) };
                assert_eq!(status, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
                time.tv_sec as f64 * 1e9 + time.tv_nsec as f64
            }
        }
    }
}

/// `STEPS` steps of warm-up, and a measurement of `STEPS` steps on `clock` in us per step.
fn step_timer(clock: Clock, mut step: impl FnMut()) -> impl FnMut() -> f64 {
    for _ in 0..STEPS {
        step();
    }
    move || {
        let start = Instant::now();
        let before = clock.now_ns(start);
        for _ in 0..STEPS {
            step();
        }
        (clock.now_ns(start) - before) / 1e3 / STEPS as f64
    }
}

/// `repeats` ratios of back-to-back measurements, which side runs first alternating.
fn paired(repeats: usize, mut top: impl FnMut() -> f64, mut bottom: impl FnMut() -> f64) -> Stats {
    Stats::of((0..repeats).map(|repeat| {
        if repeat % 2 == 0 {
            let a = top();
            a / bottom()
        } else {
            let b = bottom();
            top() / b
        }
    }))
}

/// Median, minimum and maximum of some measurements.
#[derive(Debug, Clone, Copy)]
struct Stats {
    median: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn of(values: impl IntoIterator<Item = f64>) -> Stats {
        let mut values: Vec<f64> = values.into_iter().collect();
        values.sort_by(f64::total_cmp);
        Stats {
            median: values[values.len() / 2],
            min: values[0],
            max: values[values.len() - 1],
        }
    }
}

/// Prints the figures and writes them as JSON at `path`.
fn report(figures: &[(String, &str, Stats)], path: &str) {
    let mut json = String::from("{\n");
    for (index, (name, unit, stats)) in figures.iter().enumerate() {
        println!(
            "{name:<32} {:>9.3} {unit:<5} (min {:.3}, max {:.3})",
            stats.median, stats.min, stats.max
        );
        let comma = if index + 1 < figures.len() { "," } else { "" };
        json.push_str(&format!(
            "  \"{name}\": {{\"unit\": \"{unit}\", \"median\": {:.4}, \"min\": {:.4}, \"max\": {:.4}}}{comma}\n",
            stats.median, stats.min, stats.max
        ));
    }
    json.push_str("}\n");
    if let Some(parent) = std::path::Path::new(path).parent() {
        std::fs::create_dir_all(parent).expect("the JSON's folder");
    }
    std::fs::write(path, json).expect("the JSON");
    println!("json: {path}");
}

/// Seconds since the Unix epoch, the batches' timestamp.
fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}
