//! kvown replicas behind NVIDIA Dynamo's KV-aware router: each replica publishes its prefix
//! cache's events on a ZMQ PUB socket on loopback (`kvown-events`, in the dialect chosen); a
//! router keeps `dynamo-kv-router`'s index of every replica from those events and sends each
//! request where its prompt is cached. The same workload (multi-turn conversations over
//! shared system prompts) runs under KV-aware routing and under round robin. The replicas,
//! the index, the workload and the router are `kvown-fleet`'s; this is the command line, the
//! report, the plot and the replicas as processes.
//!
//! `cargo run --release -p kvown-events --example fleet -- --replicas 4 [--dialect sglang]`

mod plot;
mod process;

use std::path::PathBuf;

use clap::{Parser, ValueEnum};
use kvown_events::{Dialect, NamespaceField};
use kvown_fleet::fleet::{self, FleetConfig, Policy, PolicyReport};
use kvown_fleet::workload::{self, WorkloadConfig};

/// Where namespaces go on the wire.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum NamespaceFieldArg {
    Lora,
    Salt,
}

impl NamespaceFieldArg {
    fn field(self) -> NamespaceField {
        match self {
            NamespaceFieldArg::Lora => NamespaceField::LoraName,
            NamespaceFieldArg::Salt => NamespaceField::CacheSalt,
        }
    }
}

#[derive(Debug, Parser)]
#[command(about = "kvown replicas behind Dynamo's KV-aware router, against round robin")]
struct Args {
    /// Replicas (threads, each with its own ZMQ PUB socket).
    #[arg(long, default_value_t = 4)]
    replicas: usize,
    /// Sessions in all.
    #[arg(long, default_value_t = 400)]
    sessions: usize,
    /// Sessions open at once.
    #[arg(long, default_value_t = 48)]
    concurrent_sessions: usize,
    /// Distinct system prompts.
    #[arg(long, default_value_t = 8)]
    system_prompts: usize,
    /// Tokens per system prompt.
    #[arg(long, default_value_t = 1024)]
    system_prompt_tokens: usize,
    /// Namespaces (0 the base model, the others adapters).
    #[arg(long, default_value_t = 2)]
    namespaces: u32,
    /// Tokens per KV page (the router's block size).
    #[arg(long, default_value_t = 16)]
    page_size: usize,
    /// KV slots (tokens) per replica.
    #[arg(long, default_value_t = 32_768)]
    pool_tokens: usize,
    /// Requests outstanding at most (1: deterministic).
    #[arg(long, default_value_t = 8)]
    in_flight: usize,
    /// How namespaces travel: as an adapter or as a cache salt.
    #[arg(long, value_enum, default_value_t = NamespaceFieldArg::Lora)]
    namespace_field: NamespaceFieldArg,
    /// The wire dialect: vllm, vllm-legacy or sglang.
    #[arg(long, default_value_t = Dialect::Vllm)]
    dialect: Dialect,
    /// The random seed.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Where to write the hit-rate plot.
    #[arg(long, default_value = "target/fleet/hit_rate.svg")]
    plot: PathBuf,
    /// Run each replica as a child process (default: a thread).
    #[arg(long)]
    processes: bool,
    /// Internal: serve as replica N, jobs on stdin, reports on stdout.
    #[arg(long, hide = true)]
    serve_replica: Option<usize>,
    /// Internal: the longest request of the run, for `--serve-replica`.
    #[arg(long, hide = true, default_value_t = 0)]
    max_context: usize,
}

fn main() {
    let args = Args::parse();
    if let Some(replica) = args.serve_replica {
        let config = fleet_config(&args, args.max_context);
        if let Err(error) = process::serve_replica(replica, &config) {
            eprintln!("fleet replica {replica}: {error}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(error) = run(&args) {
        eprintln!("fleet: {error}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let workload = WorkloadConfig {
        sessions: args.sessions,
        concurrent_sessions: args.concurrent_sessions,
        system_prompts: args.system_prompts,
        system_prompt_tokens: args.system_prompt_tokens,
        namespaces: args.namespaces,
        turns: (3, 8),
        user_tokens: (32, 256),
        reply_tokens: (32, 192),
        seed: args.seed,
    };
    let requests = workload::generate(&workload);
    let max_context = requests
        .iter()
        .map(|r| r.prompt.len() + r.reply.len() + 1)
        .max()
        .unwrap_or(1);
    let config = fleet_config(args, max_context);
    let prompt_tokens: usize = requests.iter().map(|r| r.prompt.len()).sum();
    println!(
        "workload: {} requests ({} sessions, {} open at once, turns 3-8, {} system prompts of {} \
         tokens over {} namespaces), {prompt_tokens} prompt tokens",
        requests.len(),
        args.sessions,
        args.concurrent_sessions,
        args.system_prompts,
        args.system_prompt_tokens,
        args.namespaces,
    );
    println!(
        "fleet: {} replicas ({}) x {} KV slots (pages of {}), {} requests in flight at most, \
         dialect {}, namespaces as {:?}",
        args.replicas,
        if args.processes {
            "processes"
        } else {
            "threads"
        },
        args.pool_tokens,
        args.page_size,
        args.in_flight,
        args.dialect,
        args.namespace_field,
    );
    let mut reports = Vec::new();
    for policy in [Policy::KvAware, Policy::RoundRobin] {
        let report = fleet::run(&config, &requests, policy)?;
        print_report(&report);
        reports.push(report);
    }
    let (aware, round_robin) = (&reports[0], &reports[1]);
    println!(
        "\nKV-aware over round robin: hit rate {:.1}% vs {:.1}%, prefill tokens computed {:.2}x \
         fewer",
        100.0 * aware.hit_rate(),
        100.0 * round_robin.hit_rate(),
        round_robin.computed_tokens() as f64 / aware.computed_tokens().max(1) as f64
    );
    let window = (requests.len() / 40).max(1);
    plot::hit_rate(&reports, window, &args.plot)?;
    println!("plot: {}", args.plot.display());
    Ok(())
}

/// The fleet of `args`, for requests of up to `max_context` tokens.
fn fleet_config(args: &Args, max_context: usize) -> FleetConfig {
    FleetConfig {
        replicas: args.replicas,
        page_size: args.page_size,
        pool_tokens: args.pool_tokens,
        max_context,
        max_in_flight: args.in_flight,
        dialect: args.dialect,
        namespace_field: args.namespace_field.field(),
        namespaces: args.namespaces,
        launch: if args.processes {
            process::launch
        } else {
            fleet::serve_jobs
        },
    }
}

fn print_report(report: &PolicyReport) {
    let requests = report.admissions.len().max(1) as f64;
    println!(
        "\n== {} ({:.2} s)",
        report.policy.name(),
        report.wall.as_secs_f64()
    );
    println!(
        "  prefix-cache hit rate   {:.1}% of {} prompt tokens",
        100.0 * report.hit_rate(),
        report.prompt_tokens()
    );
    println!("  prefill tokens computed {}", report.computed_tokens());
    println!(
        "  router cost per request {:.1} us deciding (hash, find_matches, pick), {:.1} us \
         applying events ({} events; {:.1} us waiting for them)",
        report.route_ns as f64 / requests / 1e3,
        report.ingest_ns as f64 / requests / 1e3,
        report.events,
        report.wait_ns as f64 / requests / 1e3,
    );
    println!("  replica  requests  computed tokens  cached pages  batches  publish us/request");
    for (index, replica) in report.replicas.iter().enumerate() {
        println!(
            "  {index:>7}  {:>8}  {:>15}  {:>12}  {:>7}  {:>18.1}",
            replica.requests,
            replica.computed_tokens,
            replica.cached_pages,
            replica.batches,
            replica.publish_ns as f64 / replica.requests.max(1) as f64 / 1e3
        );
    }
}
