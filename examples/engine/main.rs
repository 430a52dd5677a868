//! `cargo run --release --example engine`: a continuous-batching serving loop over kvown's
//! paged allocator, radix prefix cache and KV pool, on a synthetic workload.
//!
//! Every step admits requests (memory checked against the running requests' estimated growth,
//! prefix cache counted, long prompts chunked), extends them, runs a decode or speculative step
//! (retracting when it does not fit), stores synthetic K/V through the pool and releases
//! finished requests into the prefix cache. At the end the invariant checker runs, the cache is
//! evicted and the pool must be whole again; any leak or violation exits non-zero. See `--help`
//! for the workload flags.
//!
//! On CUDA (`--backend cuda`, or `auto` where a GPU works) the K/V pool is on the device and the
//! cache's table mirror is a `StagedMirror`: the host allocator runs the batch flow, and each
//! step ships its `out_cache_loc` and request-to-token writes to the device table through a
//! pinned staging ring (one copy and one scatter kernel; a decode step replays a captured CUDA
//! graph). The
//! checks (at the end, and every step with `--check`) then also copy the held rows of the device
//! table back and compare them with the host's. On the host nothing changes.

mod admission;
mod cli;
mod device_copy;
mod disagg;
mod kv_data;
mod plot;
mod replay;
mod report;
mod scheduler;
mod workload;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvown::alloc::{KvAllocator, PagedAllocator};
use kvown::cache::{EvictionDemand, EvictionRules, KvCache, TableMirror, TreeCache};
use kvown::kv::{KvPool, new_host_pool};
use kvown::radix::{RadixCache, RadixConfig};
use kvown::slots::ReqToTokenPool;
use kvown_cuda::staging::default_slot_words;
use kvown_cuda::{Backend, CudaDevice, CudaKvPool, CudaStepLink, StagedMirror};

use cli::{Args, BackendChoice};
use device_copy::DeviceCopy;
use disagg::PrefillLink;
use disagg::nixl::NixlLink;
use report::Summary;
use scheduler::Engine;

/// The most steps in a row in which no request arrives or completes before the loop gives up (a
/// scheduler that stops making progress); a small workload gives up sooner
/// ([`Args::stall_steps`]).
const MAX_STALLED_STEPS: u64 = 10_000_000;

/// Gives the run up when, for `limit` steps in a row, no request arrives and none completes.
/// (A run may take many more steps than that in all: a low `--arrival-rate` spaces out the
/// arrivals, each of which is progress.)
struct Watchdog {
    limit: u64,
    /// (requests yet to arrive, requests completed) when last seen changing.
    seen: (usize, u64),
    since_step: u64,
}

impl Watchdog {
    fn new(limit: u64) -> Self {
        Watchdog {
            limit,
            seen: (usize::MAX, 0),
            since_step: 0,
        }
    }

    /// Records the state after `step`: `pending` requests yet to arrive, `completed` finished
    /// or aborted.
    fn observe(&mut self, step: u64, pending: usize, completed: u64) -> Result<(), String> {
        if (pending, completed) != self.seen {
            self.seen = (pending, completed);
            self.since_step = step;
        } else if step - self.since_step >= self.limit {
            return Err(format!(
                "no progress: no request arrived or completed in {} steps (at step {step})",
                self.limit
            ));
        }
        Ok(())
    }
}

/// The CUDA device to run on (`None`: the host), and the summary's line saying which and why.
fn backend(args: &Args) -> Result<(Option<Arc<CudaDevice>>, String), String> {
    let flag = match args.backend {
        BackendChoice::Cpu => return Ok((None, "host (CPU), because --backend cpu".to_string())),
        BackendChoice::Auto if args.transfer_over_nixl() => {
            let why = "host (CPU), because --transfer nixl registers host memory";
            return Ok((None, why.to_string()));
        }
        BackendChoice::Auto => "auto",
        BackendChoice::Cuda => "cuda",
    };
    let backend = Backend::auto();
    match &backend {
        Backend::Cuda(device) => Ok((
            Some(device.clone()),
            format!(
                "{backend} (--backend {flag}): K/V pool on the device, each step's table writes \
                 staged to it"
            ),
        )),
        Backend::Host { reason } if args.backend == BackendChoice::Cuda => {
            Err(format!("--backend cuda: CUDA is unavailable: {reason}"))
        }
        Backend::Host { .. } => Ok((None, format!("{backend} (--backend auto)"))),
    }
}

/// The request-to-token table: rows for the running requests, wide enough for the longest job
/// or for the whole pool and one more position, whichever is less (a request that cannot fit
/// the pool is aborted before it takes a row; the one more is the next token's position that
/// `prealloc_for_transfer` asks a row to have, which a request filling the pool needs under
/// `--disaggregated`).
fn request_table(args: &Args, jobs: &[workload::Job]) -> Result<ReqToTokenPool, String> {
    let longest = jobs
        .iter()
        .map(|job| job.prompt.len().saturating_add(job.output_len))
        .max()
        .unwrap_or(1);
    let pool = args.pool_tokens / args.page_size * args.page_size;
    let width = longest
        .saturating_add(args.spec_reserve().unwrap_or(1) + args.page_size)
        .min(pool.saturating_add(1));
    // One row per running request (no more than there are requests) and one for the request
    // whose chunked prefill continues next step.
    let rows = args.max_running.min(jobs.len()) + 1;
    ReqToTokenPool::new(rows, width).map_err(|e| e.to_string())
}

/// The host's bookkeeping for `jobs`: the paged allocator, the request table and the radix
/// cache.
fn host_bookkeeping(
    args: &Args,
    jobs: &[workload::Job],
) -> Result<(PagedAllocator, ReqToTokenPool, TreeCache), String> {
    // Under disaggregation both nodes sort their freed pages, as sglang's do.
    let allocator = PagedAllocator::new(args.pool_tokens, args.page_size, args.disaggregated)
        .map_err(|e| e.to_string())?;
    let table = request_table(args, jobs)?;
    let config = RadixConfig::new(args.page_size).with_policy(args.eviction_policy);
    let tree = TreeCache::Radix(RadixCache::new(config).map_err(|e| e.to_string())?);
    Ok((allocator, table, tree))
}

/// The cache over `allocator`, `table` and `tree`, with `mirror` following its table, evicting
/// as `--eviction-demand` says.
fn new_cache<M: TableMirror>(
    args: &Args,
    allocator: PagedAllocator,
    table: ReqToTokenPool,
    tree: TreeCache,
    mirror: M,
) -> Result<KvCache<PagedAllocator, M>, String> {
    let mut cache =
        KvCache::with_mirror(allocator, table, tree, mirror).map_err(|e| e.to_string())?;
    let demand = match args.eviction_demand {
        cli::EvictionDemand::Sglang => EvictionDemand::Sglang,
        cli::EvictionDemand::Shortfall => EvictionDemand::Shortfall,
    };
    cache.set_eviction_rules(EvictionRules {
        demand,
        ..EvictionRules::default()
    });
    Ok(cache)
}

fn run(args: &Args) -> Result<Summary, String> {
    args.validate()?;
    let jobs = workload::generate(args);
    let (device, backend) = backend(args)?;
    let layout = kv_data::layout(args.pool_tokens, args.page_size)?;
    let (allocator, table, tree) = host_bookkeeping(args, &jobs)?;
    match device {
        None => {
            let cache = new_cache(args, allocator, table, tree, ())?;
            if args.transfer_over_nixl() {
                let link = NixlLink::start(&args.flags, layout)?;
                let pool = link.decode_pool();
                let link = PrefillLink::Nixl(Box::new(link));
                return serve(args, cache, pool, jobs, backend, Some(link));
            }
            let pool = new_host_pool(layout, kv_data::DTYPE)
                .map_err(|e| format!("KV pool on the host: {e}"))?;
            serve(args, cache, pool, jobs, backend, None)
        }
        Some(device) => {
            let mirror = staged_on_cuda(&device, &allocator, &table)
                .map_err(|e| format!("staging ring on {backend}: {e}"))?;
            let cache = new_cache(args, allocator, table, tree, mirror)?;
            let pool = CudaKvPool::new(device, layout, kv_data::DTYPE)
                .map_err(|e| format!("KV pool on {backend}: {e}"))?;
            serve(args, cache, Box::new(pool), jobs, backend, None)
        }
    }
}

/// Packets in flight before the host waits for the device.
const STAGING_DEPTH: usize = 4;

/// `table` mirrored on `device`: a device table of its shape, a pinned ring sized for
/// `allocator`'s pool, and the decode step's copy and scatter captured as a CUDA graph for a
/// batch of every row.
fn staged_on_cuda(
    device: &Arc<CudaDevice>,
    allocator: &PagedAllocator,
    table: &ReqToTokenPool,
) -> Result<StagedMirror<CudaStepLink>, String> {
    let rows = table.size() + 1;
    let slot_words = default_slot_words(allocator.capacity(), rows, rows);
    let mut link = CudaStepLink::new(
        device.clone(),
        STAGING_DEPTH,
        slot_words,
        rows,
        table.max_context_len(),
    )
    .map_err(|e| e.to_string())?;
    link.capture_decode_graphs(rows)
        .map_err(|e| format!("capturing the decode graphs: {e}"))?;
    StagedMirror::new(link, table, allocator.capacity()).map_err(|e| e.to_string())
}

/// Runs the workload over `cache` (its table on the host, or mirrored on a device) and `pool` to
/// the end;
/// with `--disaggregated`, through `link` (`--transfer nixl`'s, already started) or a local
/// prefill node made here.
fn serve<M: TableMirror + DeviceCopy>(
    args: &Args,
    cache: KvCache<PagedAllocator, M>,
    pool: Box<dyn KvPool>,
    jobs: Vec<workload::Job>,
    backend: String,
    link: Option<PrefillLink>,
) -> Result<Summary, String> {
    let pool_pages = cache.allocator().capacity() / args.page_size;
    let (pool, link) = match (args.disaggregated, link) {
        (true, None) => {
            let (pool, link) = disagg::local::pair(args, &jobs, pool)?;
            (pool, Some(PrefillLink::Local(Box::new(link))))
        }
        (_, link) => (pool, link),
    };
    let mut engine = Engine::new(args, cache, kv_data::KvStore::new(pool), jobs);
    if let Some(link) = link {
        engine = engine.with_prefill_link(link);
    }

    let progress = ProgressBar::new(args.requests as u64);
    if args.json {
        progress.set_draw_target(ProgressDrawTarget::hidden());
    }
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} requests  {msg}")
            .map_err(|e| e.to_string())?,
    );
    let mut watchdog = Watchdog::new(args.stall_steps(MAX_STALLED_STEPS));
    let start = Instant::now();
    while !engine.is_done() {
        engine.step()?;
        watchdog.observe(
            engine.stats.steps,
            engine.pending_arrivals(),
            engine.completed(),
        )?;
        if args.check {
            engine.check()?;
        }
        if engine.stats.steps.is_multiple_of(64) {
            progress.set_position(engine.completed());
            progress.set_message(format!(
                "step {}, {} retractions",
                engine.stats.steps, engine.stats.retractions
            ));
        }
    }
    let wall_seconds = start.elapsed().as_secs_f64();
    progress.finish_and_clear();
    engine.finish()?;

    let mut warnings = Vec::new();
    let mut plot = args.plot.display().to_string();
    let default_plot = args.plot.as_os_str() == cli::DEFAULT_PLOT;
    if let Err(error) = plot::occupancy(&engine.stats, pool_pages, &args.plot, default_plot) {
        plot.push_str(" (not written: see the warning after the summary)");
        warnings.push(error);
    }
    if engine.stats.aborted > 0 {
        warnings.push(format!(
            "{} of {} requests were aborted: they cannot fit the pool of {} slots alone; pass \
             --pool-tokens {} to run every request the flags can draw",
            engine.stats.aborted,
            args.requests,
            pool_pages * args.page_size,
            args.pool_for_every_request()
        ));
    }
    let (median, p99) = report::step_time_percentiles(&engine.stats);
    let stats = &engine.stats;
    // Tokens looked up at admission and tokens the prefix cache supplied: a rate.
    let hit_rate = |(lookup, hit): (u64, u64)| hit as f64 / lookup.max(1) as f64;
    let by_priority = &stats.prefix_tokens_by_priority;
    let totals = by_priority
        .iter()
        .fold((0, 0), |(lookup, hit), &(l, h)| (lookup + l, hit + h));
    Ok(Summary {
        requests: args.requests,
        finished: stats.finished,
        aborted: stats.aborted,
        steps: stats.steps,
        tokens_prefilled: stats.tokens_prefilled,
        tokens_decoded: stats.tokens_decoded,
        prefix_cache_hit_rate: hit_rate(totals),
        prefix_cache_hit_rate_by_priority: by_priority.iter().copied().map(hit_rate).collect(),
        retractions: stats.retractions,
        transfers: engine.transfers(),
        admission: args.admission_summary(),
        eviction_policy: args.eviction_policy.name(),
        eviction_demand: args.eviction_demand.name(),
        peak_pages_in_use: stats.peak_pages_in_use,
        pool_pages,
        kvown_ns_per_step_median: median,
        kvown_ns_per_step_p99: p99,
        kv_rows_stored: engine.kv().rows_stored,
        kv_samples_verified: engine.kv().samples_verified,
        cache_events: stats.cache_events,
        checked_every_step: args.check,
        backend,
        wall_seconds,
        plot,
        leak_check: "passed",
        warnings,
    })
}

fn main() -> ExitCode {
    if let Some(outcome) = disagg::process::run_if_asked() {
        return match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("engine: prefill process: FAILED: {error}");
                ExitCode::FAILURE
            }
        };
    }
    let args = Args::try_parse_flags(std::env::args_os()).unwrap_or_else(|error| error.exit());
    let summary = match run(&args) {
        Ok(summary) => summary,
        Err(error) => {
            eprintln!("engine: FAILED: {error}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        match serde_json::to_string_pretty(&summary) {
            Ok(json) => println!("{json}"),
            Err(error) => {
                eprintln!("engine: JSON: {error}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        summary.print_table();
    }
    // After the summary, which they do not replace.
    for warning in &summary.warnings {
        eprintln!("engine: warning: {warning}");
    }
    if !summary.served() {
        eprintln!("engine: FAILED: no request finished (see the warning above)");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Runs the engine on the CPU with `flags` after the defaults, plotting to a temporary file
    /// named after `test`.
    fn run_with(test: &str, flags: &[&str]) -> Summary {
        let plot = std::env::temp_dir().join(format!("kvown-engine-{test}.svg"));
        let plot = plot.to_str().expect("a UTF-8 temporary path");
        let args =
            Args::from_flags(&[&["--backend", "cpu", "--json", "--plot", plot], flags].concat());
        run(&args).expect("the engine runs")
    }

    proptest! {
        // 48 cases (quick in a debug `cargo test`), or `PROPTEST_CASES` for a soak run.
        #![proptest_config(match std::env::var_os("PROPTEST_CASES") {
            Some(_) => ProptestConfig::default(),
            None => ProptestConfig::with_cases(48),
        })]

        /// Small random workloads in pools that every request fits alone, tight or with a few
        /// pages to spare, with and without speculation, prefix sharing (over one to three
        /// adapters), chunked prefill and every eviction policy,
        /// under either admission policy (the ratio from timid to reckless, decaying slowly
        /// or fast), with and without cache events: every request finishes, with the checker
        /// passing on every step (and with events, their replay holding as many pages as the
        /// cache after every step and exactly its pages at the end).
        #[test]
        fn every_request_that_fits_the_pool_alone_finishes(
            page in prop::sample::select(vec![1usize, 2, 3, 4, 16]),
            (prompt_min, prompt_max) in (1usize..40, 0usize..40).prop_map(|(a, b)| (a, a + b)),
            (output_min, output_max) in (1usize..40, 0usize..40).prop_map(|(a, b)| (a, a + b)),
            spec_tokens in prop::option::of(1usize..4),
            spare_pages in 0usize..3,
            max_running in 1usize..6,
            chunk in 1usize..64,
            requests in 2usize..20,
            shared in prop::sample::select(vec!["0", "0.5", "1"]),
            adapters in prop::sample::select(vec!["1", "2", "3"]),
            eviction in prop::sample::select(
                vec!["lru", "lfu", "fifo", "mru", "filo", "priority", "slru"]
            ),
            priorities in prop::sample::select(vec!["1", "3"]),
            cache_events in any::<bool>(),
            disaggregated in any::<bool>(),
            seed in 0u64..1000,
            ratio in prop::option::of((
                prop::sample::select(vec!["0.01", "0.7", "1"]),
                prop::sample::select(vec!["3", "600"]),
            )),
        ) {
            // The most positions a request ever holds (prompts never pass --prompt-len's max):
            // all but its last output's, or with speculation a reservation on top of all but
            // the last two.
            let computed = prompt_max + output_max - 1;
            let held =
                spec_tokens.map_or(computed, |tokens| computed.max(computed - 1 + 2 * tokens));
            let pool = (held.div_ceil(page) + spare_pages) * page;
            let (prompt, output) = (
                format!("{prompt_min}..{prompt_max}"),
                format!("{output_min}..{output_max}"),
            );
            let numbers = [pool, page, max_running, chunk, requests].map(|n| n.to_string());
            let seed = seed.to_string();
            let mut flags = vec![
                "--check", "--prompt-len", &prompt, "--output-len", &output,
                "--pool-tokens", &numbers[0], "--page-size", &numbers[1],
                "--max-running", &numbers[2], "--chunk-size", &numbers[3],
                "--requests", &numbers[4], "--shared-prefix-fraction", shared, "--seed", &seed,
                "--adapters", adapters, "--eviction-policy", eviction, "--priorities", priorities,
            ];
            if cache_events {
                flags.push("--cache-events");
            }
            if disaggregated {
                flags.push("--disaggregated");
            }
            let spec = spec_tokens.map(|tokens| tokens.to_string());
            if let Some(tokens) = &spec {
                flags.extend(["--spec", "--spec-tokens", tokens]);
            }
            match ratio {
                Some((init, decay_steps)) => flags.extend([
                    "--admission", "ratio", "--new-token-ratio", init,
                    "--new-token-ratio-decay-steps", decay_steps,
                ]),
                None => flags.extend(["--admission", "next-step"]),
            }
            let summary = run_with("fits-alone", &flags);
            prop_assert_eq!((summary.finished, summary.aborted), (requests as u64, 0));
            prop_assert_eq!(summary.cache_events.is_some(), cache_events);
            // Every admission of a disaggregated run is one transfer (a retracted request is
            // transferred again when re-admitted).
            if let Some(report) = summary.transfers {
                prop_assert!(disaggregated && report.transfers >= requests as u64);
            }
        }
    }

    /// A prefill/decode pair serves the workload the single engine serves: every request
    /// finishes, each prompt's K/V moves once (no retraction in this pool), and the K/V the
    /// decode node reads back, transferred or computed there, is what was stored for it.
    #[test]
    fn a_disaggregated_pair_serves_what_one_engine_serves() {
        let flags = [
            "--requests",
            "60",
            "--prompt-len",
            "16..160",
            "--output-len",
            "1..48",
            "--pool-tokens",
            "16384",
            "--max-running",
            "8",
            "--check",
        ];
        let single = run_with("aggregated", &flags);
        let pair = run_with(
            "disaggregated",
            &[&flags[..], &["--disaggregated"]].concat(),
        );
        assert_eq!(
            (pair.finished, pair.aborted),
            (single.finished, single.aborted)
        );
        assert_eq!((pair.finished, pair.retractions), (60, 0));
        let report = pair.transfers.expect("a pair's transfers");
        assert_eq!(report.transfers, 60);
        assert_eq!(single.transfers, None);
        assert_eq!(pair.tokens_decoded, single.tokens_decoded);
        assert!(pair.kv_samples_verified > 0);
    }

    /// `--transfer nixl` runs the prefill node as a second process (this test binary, started
    /// again) and reads its K/V through NIXL: it serves exactly what the pair in one process
    /// serves (same steps, tokens, hits and pages), the same bytes move, and every request's
    /// K/V digest on the decode node equals the prefill node's; and as one engine does, every
    /// request finishes with the same tokens decoded. Without NIXL's library it is skipped
    /// with the reason, unless `KVOWN_NIXL_REQUIRED=1` (CI), where that fails.
    #[test]
    fn a_pair_in_two_processes_over_nixl_serves_what_one_process_serves() {
        if let Err(reason) = kvown_nixl::available() {
            let required = std::env::var("KVOWN_NIXL_REQUIRED").is_ok_and(|v| v == "1");
            assert!(!required, "KVOWN_NIXL_REQUIRED=1: {reason}");
            eprintln!("skipped: {reason}");
            return;
        }
        let flags = [
            "--requests",
            "40",
            "--prompt-len",
            "16..300",
            "--output-len",
            "1..32",
            "--pool-tokens",
            "4096",
            "--max-running",
            "6",
            "--check",
        ];
        let single = run_with("nixl-single", &flags);
        let pair = [&flags[..], &["--disaggregated"]].concat();
        let local = run_with("nixl-local", &pair);
        let nixl = run_with("nixl-nixl", &[&pair[..], &["--transfer", "nixl"]].concat());
        let outcome = |s: &Summary| {
            let tokens = (s.tokens_prefilled, s.tokens_decoded);
            let rate = s.prefix_cache_hit_rate;
            (s.finished, s.steps, tokens, rate, s.peak_pages_in_use)
        };
        assert_eq!(outcome(&nixl), outcome(&local));
        assert!(
            local.prefix_cache_hit_rate > 0.0,
            "some prompts reuse a prefix"
        );
        let (over_nixl, in_process) = (nixl.transfers.unwrap(), local.transfers.unwrap());
        assert_eq!((over_nixl.link, in_process.link), ("nixl", "local"));
        assert_eq!(over_nixl.transfers, in_process.transfers);
        assert_eq!(over_nixl.bytes, in_process.bytes);
        let descriptors = over_nixl.descriptors.expect("NIXL counts its descriptors");
        // At least one run (two layers, K and V) per transfer, fewer than one per slot.
        let slots = over_nixl.bytes / kv_data::SLOT_BYTES as u64;
        assert!(descriptors >= 4 * over_nixl.transfers && descriptors < 4 * slots);
        assert_eq!(
            (nixl.finished, nixl.aborted),
            (single.finished, single.aborted)
        );
        assert_eq!(nixl.tokens_decoded, single.tokens_decoded);
    }

    #[test]
    fn cache_events_change_nothing_and_replay_to_the_cache() {
        // A pool of 512 tokens under 40 requests sharing prefixes: the cache stores, is hit
        // and evicts.
        let flags = [
            "--requests",
            "40",
            "--prompt-len",
            "16..200",
            "--output-len",
            "1..64",
            "--pool-tokens",
            "512",
            "--max-running",
            "4",
            "--check",
        ];
        for policy in ["lru", "slru"] {
            let flags = [&flags[..], &["--eviction-policy", policy]].concat();
            let without = run_with("events-off", &flags);
            let with = run_with("events-on", &[&flags[..], &["--cache-events"]].concat());
            let outcome = |s: &Summary| {
                let rate = s.prefix_cache_hit_rate;
                let tokens = (s.tokens_prefilled, s.tokens_decoded);
                (
                    s.finished,
                    s.steps,
                    tokens,
                    rate,
                    s.retractions,
                    s.peak_pages_in_use,
                )
            };
            assert_eq!(outcome(&with), outcome(&without), "{policy}");
            assert!(without.prefix_cache_hit_rate > 0.0, "{policy}: no hits");
            assert_eq!(without.cache_events, None);
            let counts = with.cache_events.expect("--cache-events counts");
            assert!(
                counts.pages_removed > 0,
                "{policy}: nothing evicted: {counts:?}"
            );
            assert!(counts.pages_stored > counts.pages_removed, "{counts:?}");
            // At least a `Cleared` and one event per stored or removed run.
            assert!(
                counts.events > 1
                    && counts.events <= 1 + counts.pages_stored + counts.pages_removed
            );
        }
    }

    #[test]
    fn a_request_whose_life_fits_its_extend_pages_is_admitted_without_headroom() {
        // One page of 16 slots, requests of at most 8 + 4 tokens: each fits the page whole,
        // but the headroom of a spare page kept it waiting forever.
        let flags = [
            "--pool-tokens",
            "16",
            "--page-size",
            "16",
            "--requests",
            "3",
        ];
        let lengths = ["--prompt-len", "4..8", "--output-len", "2..4"];
        for admission in ["next-step", "ratio"] {
            let policy = ["--admission", admission];
            let summary = run_with("tiny-pool", &[&flags[..], &lengths, &policy].concat());
            assert_eq!((summary.finished, summary.aborted), (3, 0), "{admission}");
        }
    }

    #[test]
    fn a_batch_the_prefill_node_refuses_is_offered_again_a_request_fewer() {
        // Found by the property test above: two admitted prompts that fit the decode node
        // (thanks to its prefix cache) did not fit the prefill node's pool of 80 slots together,
        // and the same pair was offered to it every step, stalling the run.
        let flags = [
            "--requests",
            "18",
            "--prompt-len",
            "18..49",
            "--output-len",
            "22..24",
            "--shared-prefix-fraction",
            "1",
            "--adapters",
            "2",
            "--priorities",
            "3",
            "--spec",
            "--spec-tokens",
            "2",
            "--eviction-policy",
            "filo",
            "--page-size",
            "2",
            "--pool-tokens",
            "80",
            "--max-running",
            "2",
            "--chunk-size",
            "29",
            "--admission",
            "next-step",
            "--seed",
            "89",
            "--check",
            "--disaggregated",
            "--cache-events",
        ];
        let summary = run_with("prefill-refuses-the-pair", &flags);
        assert_eq!((summary.finished, summary.aborted), (18, 0));
    }

    #[test]
    fn a_request_that_fits_the_pool_alone_is_not_aborted_for_the_chunked_one() {
        // Each request's life takes the whole pool (1 + 81 tokens, 81 of them computed, in six
        // pages of 16). The second one, prefilling a chunk per step, held pages outside the
        // running batch, and the first, unable to grow, was aborted as if it could not fit.
        // `ratio` admission reserves the first request's whole life and never gets there.
        let flags = [
            "--admission",
            "next-step",
            "--pool-tokens",
            "96",
            "--prompt-len",
            "1",
            "--output-len",
            "81",
            "--max-running",
            "2",
            "--chunk-size",
            "1",
            "--requests",
            "2",
            "--seed",
            "0",
            "--check",
        ];
        let summary = run_with("chunked-holds-pages", &flags);
        assert_eq!((summary.finished, summary.aborted), (2, 0));
        assert!(summary.retractions > 0, "the chunked request is retracted");
    }

    #[test]
    fn the_watchdog_counts_steps_without_an_arrival_or_a_completion() {
        let mut watchdog = Watchdog::new(3);
        // An arrival or a completion every few steps: a long run, never stalled.
        for step in 1..=30 {
            let pending = 30 - step as usize / 2;
            assert_eq!(watchdog.observe(step, pending, 0), Ok(()), "step {step}");
        }
        for step in 31..=33 {
            assert_eq!(watchdog.observe(step, 15, 1), Ok(()), "step {step}");
        }
        let error = watchdog.observe(34, 15, 1).unwrap_err();
        assert!(error.contains("no progress"), "{error}");
    }

    #[test]
    fn a_request_whose_computed_positions_fill_the_pool_is_not_aborted() {
        // The last output token's K/V is never computed: 1 + 96 tokens need 96 positions, six
        // pages of 16, with or without a page boundary after them. The lifetime need counted
        // 98 (the whole sequence and one more) and aborted requests that fit exactly.
        for (pool, page, prompt, output, spec) in [
            ("96", "16", "1", "96", None),
            ("7", "1", "4", "4", None),
            // Speculative: at most 4 + 4 - 2 positions committed when the last reservation of
            // 2 x 2 is made.
            ("10", "1", "4", "4", Some("2")),
            ("16", "16", "5", "4", Some("4")),
        ] {
            let mut flags = vec![
                "--pool-tokens",
                pool,
                "--page-size",
                page,
                "--prompt-len",
                prompt,
                "--output-len",
                output,
                "--requests",
                "3",
                "--check",
            ];
            if let Some(tokens) = spec {
                flags.extend(["--spec", "--spec-tokens", tokens]);
            }
            for admission in ["next-step", "ratio"] {
                let flags = [&flags[..], &["--admission", admission]].concat();
                let summary = run_with("exact-fit", &flags);
                assert_eq!((summary.finished, summary.aborted), (3, 0), "{flags:?}");
            }
        }
    }

    #[test]
    fn a_request_whose_output_cannot_fit_the_pool_is_aborted() {
        // Output lengths are numbers, not tokens: one past the pool is aborted, and the summary
        // warns with the pool that runs them all. The table was as wide as the longest job (16
        // TB for 10^12 tokens, an abort on allocation), and near usize::MAX the lengths
        // overflowed (a follow-up prompt of usize::MAX tokens, a panic; or a table narrower
        // than a job, a failed extend). Seed 3 draws at least one short output of the three.
        for output in ["8..1000000000000", "8..18446744073709551615"] {
            for spec in [false, true] {
                let mut flags = vec!["--output-len", output, "--requests", "3", "--check"];
                if spec {
                    flags.push("--spec");
                }
                let summary = run_with("huge-output", &flags);
                assert_eq!(summary.finished + summary.aborted, 3, "{flags:?}");
                assert!(summary.aborted > 0, "{flags:?}");
                let warning = summary.warnings.join("\n");
                assert!(
                    warning.contains("requests were aborted") && warning.contains("--pool-tokens"),
                    "{warning}"
                );
            }
        }
        // Where every output is past the pool, the run is refused before it starts.
        for output in [
            "1000000000000",
            "18446744073709551000..18446744073709551615",
        ] {
            let args = Args::from_flags(&["--backend", "cpu", "--output-len", output]);
            let error = run(&args).unwrap_err();
            assert!(error.contains("no request fits the pool"), "{error}");
        }
    }

    /// A plot that cannot be written (its directory missing) is a warning kept with the
    /// summary, and the run succeeds; the run creates no directory for it.
    #[test]
    fn an_unwritable_plot_is_a_warning_after_the_summary() {
        let missing = std::env::temp_dir().join("kvown-engine-no-such-dir");
        let _ = std::fs::remove_dir_all(&missing);
        let plot = missing.join("sub").join("plot.svg");
        let flags = [
            "--backend",
            "cpu",
            "--json",
            "--requests",
            "3",
            "--plot",
            plot.to_str().expect("a UTF-8 temporary path"),
        ];
        let summary = run(&Args::from_flags(&flags)).expect("the run succeeds without its plot");
        assert_eq!(summary.finished, 3);
        assert!(summary.served());
        assert_eq!(summary.warnings.len(), 1, "{:?}", summary.warnings);
        assert!(
            summary.warnings[0].contains("was not written")
                && summary.warnings[0].contains("does not exist"),
            "{:?}",
            summary.warnings
        );
        assert!(summary.plot.contains("not written"), "{}", summary.plot);
        assert!(!missing.exists(), "the run created the plot's directory");
        // A directory as the plot's path: the drawing itself fails, and is a warning too.
        let flags = ["--backend", "cpu", "--requests", "3", "--plot"];
        let dir = std::env::temp_dir();
        let args = Args::from_flags(&[&flags[..], &[dir.to_str().unwrap()]].concat());
        let summary = run(&args).expect("the run succeeds without its plot");
        assert!(
            summary.warnings[0].contains("was not written"),
            "{:?}",
            summary.warnings
        );
    }

    #[test]
    fn any_max_running_is_bounded_by_the_requests() {
        // `--max-running usize::MAX` overflowed sizing the request table.
        let flags = ["--max-running", "18446744073709551615", "--requests", "20"];
        let summary = run_with("max-running", &flags);
        assert_eq!(summary.finished, 20);
    }
}
