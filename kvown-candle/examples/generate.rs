//! Serves a Llama through kvown: `cargo run --release -p kvown-candle --example generate`.
//!
//! With no model given, a tiny Llama with deterministic random weights is written to a
//! safetensors checkpoint and loaded back through the real loader, and a multi-turn chat
//! workload (shared system prompts, follow-ups that hit the prefix cache) is served in a pool
//! small enough to evict and retract. `--model-dir DIR` serves a local Hugging Face Llama
//! checkpoint instead (`config.json`, `*.safetensors`; with `--features tokenizers`,
//! `tokenizer.json` turns `--prompt` text into tokens and the outputs back into text). Nothing
//! is downloaded. `--disaggregated --transfer nixl` moves each prompt's K/V from the prefill node
//! to the decode node through NIXL (two agents of this process). Prints a summary and exits 1
//! if anything leaked or no request finished.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use kvown_candle::workload::{ConversationSpec, Conversations, serve};
use kvown_candle::{
    Draft, Finished, PagedLlama, Request, Sampling, ServeConfig, ServeStats, Server, SpecConfig,
    TransferLink, random,
};
use kvown_nixl::{AgentOptions, LoopbackCounters, LoopbackStats, NixlLoopback};
use kvown_runtime::kv::{KvDtype, TransferError};
use kvown_runtime::radix::EvictionPolicy;

/// Serve a Llama-architecture model whose K/V lives in kvown's paged cache.
#[derive(Debug, Parser)]
#[command(name = "generate")]
struct Args {
    /// A local Hugging Face Llama checkpoint (config.json, *.safetensors); the tiny random
    /// model when absent.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// A prompt to serve (repeat the flag for several); needs `--features tokenizers` and a
    /// tokenizer.json. Without prompts, the chat workload runs.
    #[arg(long)]
    prompt: Vec<String>,
    /// A prompt as comma-separated token ids (repeatable).
    #[arg(long, value_delimiter = ';')]
    prompt_ids: Vec<String>,
    /// Tokens to generate per prompt given with --prompt / --prompt-ids.
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Conversations of the chat workload.
    #[arg(long, default_value_t = 16)]
    conversations: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Slots per page.
    #[arg(long, default_value_t = 16)]
    page_size: usize,
    /// K/V slots in the pool (a multiple of --page-size).
    #[arg(long, default_value_t = 512)]
    pool_tokens: usize,
    /// Element type of the K/V pool.
    #[arg(long, value_enum, default_value_t = Dtype::F32)]
    pool_dtype: Dtype,
    /// Requests holding K/V at once.
    #[arg(long, default_value_t = 16)]
    max_running: usize,
    /// Positions per request (the request-to-token table's row).
    #[arg(long, default_value_t = 512)]
    max_context: usize,
    /// Prompt tokens computed per step (chunked prefill).
    #[arg(long, default_value_t = 64)]
    chunk_size: usize,
    /// The prefix cache's eviction policy (lru, lfu, fifo, mru, filo, priority, slru).
    #[arg(long, default_value = "lru")]
    eviction_policy: EvictionPolicy,
    /// Compute every prompt whole: no prefix cache.
    #[arg(long)]
    no_prefix_cache: bool,
    /// Speculative decoding.
    #[arg(long)]
    spec: bool,
    /// Where drafts come from under --spec.
    #[arg(long, value_enum, default_value_t = DraftSource::Ngram, requires = "spec")]
    draft: DraftSource,
    /// Tokens verified per speculative step.
    #[arg(long, default_value_t = 4, requires = "spec")]
    spec_tokens: usize,
    /// Compute prompts on a prefill node and move their K/V through kvown's KvTransfer.
    #[arg(long)]
    disaggregated: bool,
    /// With --disaggregated: how K/V moves. `nixl` reads it through two NIXL agents of this
    /// process (kvown-nixl's NixlLoopback; needs NIXL's library: scripts/install-nixl.sh).
    #[arg(long, value_enum, default_value_t = Transfer::Local, requires = "disaggregated")]
    transfer: Transfer,
    /// Sample at this temperature (greedy when absent).
    #[arg(long)]
    temperature: Option<f32>,
    /// Seed of the workload, the random weights and the sampler.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Run kvown's invariant checker after every step.
    #[arg(long)]
    check: bool,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum Dtype {
    F32,
    F16,
    Bf16,
}

/// How a `--disaggregated` pair moves K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Transfer {
    /// A `LocalTransfer` copies the rows between the two pools.
    Local,
    /// A NIXL READ per request between two agents of this process, each pool staged through
    /// registered host memory.
    Nixl,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum DraftSource {
    Ngram,
    Model,
}

/// The model and, with a tokenizer, its text codec.
struct Loaded {
    model: PagedLlama,
    name: String,
    #[cfg(feature = "tokenizers")]
    text: Option<kvown_candle::text::TextCodec>,
}

fn load(args: &Args) -> Result<Loaded, String> {
    let Some(dir) = &args.model_dir else {
        // The embedded default, through the same loader a checkpoint takes.
        let dir = std::env::temp_dir().join(format!("kvown-candle-tiny-{}", std::process::id()));
        let config = random::tiny_config();
        random::write_random_checkpoint(&dir, &config, args.seed).map_err(|e| e.to_string())?;
        let model = PagedLlama::load(&dir).map_err(|e| e.to_string());
        let _ = std::fs::remove_dir_all(&dir);
        return Ok(Loaded {
            model: model?,
            name: format!(
                "tiny random Llama ({} parameters, seed {})",
                config.parameter_count(),
                args.seed
            ),
            #[cfg(feature = "tokenizers")]
            text: None,
        });
    };
    let model = PagedLlama::load(dir).map_err(|e| e.to_string())?;
    Ok(Loaded {
        name: format!(
            "{} ({} parameters)",
            dir.display(),
            model.config().parameter_count()
        ),
        #[cfg(feature = "tokenizers")]
        text: kvown_candle::text::TextCodec::load(dir).map_err(|e| e.to_string())?,
        model,
    })
}

fn serve_config(args: &Args, loaded: &Loaded) -> ServeConfig {
    ServeConfig {
        page_size: args.page_size,
        pool_tokens: args.pool_tokens,
        pool_dtype: match args.pool_dtype {
            Dtype::F32 => KvDtype::F32,
            Dtype::F16 => KvDtype::F16,
            Dtype::Bf16 => KvDtype::Bf16,
        },
        max_running: args.max_running,
        max_context: args.max_context,
        chunk_size: args.chunk_size,
        prefix_cache: (!args.no_prefix_cache).then_some(args.eviction_policy),
        spec: args.spec.then_some(SpecConfig {
            draft: match args.draft {
                DraftSource::Ngram => Draft::Ngram,
                DraftSource::Model => Draft::Model,
            },
            tokens: args.spec_tokens,
        }),
        disaggregated: args.disaggregated,
        sampling: match args.temperature {
            Some(temperature) => Sampling::Temperature {
                temperature,
                seed: args.seed,
            },
            None => Sampling::Greedy,
        },
        stop_tokens: loaded.model.config().eos_tokens(),
        check_every_step: args.check,
        ..ServeConfig::default()
    }
}

/// The prompts given on the command line, as tokens.
fn prompts(args: &Args, loaded: &Loaded) -> Result<Vec<Vec<u32>>, String> {
    let mut prompts = Vec::new();
    for ids in &args.prompt_ids {
        let tokens = ids
            .split(',')
            .map(|id| id.trim().parse::<u32>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--prompt-ids {ids:?}: {e}"))?;
        prompts.push(tokens);
    }
    #[cfg(not(feature = "tokenizers"))]
    if !args.prompt.is_empty() {
        let _ = loaded;
        return Err("--prompt needs `--features tokenizers` (or give --prompt-ids)".into());
    }
    #[cfg(feature = "tokenizers")]
    for text in &args.prompt {
        let codec = loaded
            .text
            .as_ref()
            .ok_or("--prompt needs a tokenizer.json in --model-dir")?;
        prompts.push(codec.encode(text).map_err(|e| e.to_string())?);
    }
    Ok(prompts)
}

/// An output as text when a tokenizer is loaded, as token ids otherwise.
fn render(loaded: &Loaded, tokens: &[u32]) -> String {
    #[cfg(feature = "tokenizers")]
    if let Some(text) = loaded.text.as_ref().and_then(|t| t.decode(tokens).ok()) {
        return format!("{text:?}");
    }
    let _ = loaded;
    format!("{tokens:?}")
}

fn median(mut values: Vec<Duration>) -> Option<Duration> {
    values.sort();
    values.get(values.len() / 2).copied()
}

/// The run's figures, in the order they print.
fn summary(
    stats: &ServeStats,
    finished: &[Finished],
    wall: Duration,
) -> Vec<(&'static str, serde_json::Value)> {
    let generated: usize = finished.iter().map(|done| done.output.len()).sum();
    let ttft = median(
        finished
            .iter()
            .filter_map(|done| done.time_to_first_token)
            .collect(),
    );
    let share = |ns: u64| ns as f64 / stats.step_ns.max(1) as f64;
    vec![
        ("requests_finished", stats.finished.into()),
        ("requests_aborted", stats.aborted.into()),
        ("steps", stats.steps.into()),
        ("tokens_generated", generated.into()),
        (
            "generated_tokens_per_s",
            (generated as f64 / wall.as_secs_f64()).into(),
        ),
        ("median_ttft_ms", ttft.map(|t| t.as_secs_f64() * 1e3).into()),
        ("prefill_tokens_computed", stats.prefill_tokens.into()),
        ("decode_tokens", stats.decode_tokens.into()),
        (
            "prefix_hit_rate",
            (stats.prefix_hit_tokens as f64 / stats.prefix_lookup_tokens.max(1) as f64).into(),
        ),
        ("evicted_tokens", stats.evicted_tokens.into()),
        ("retractions", stats.retractions.into()),
        ("spec_drafted", stats.spec_drafted.into()),
        ("spec_accepted", stats.spec_accepted.into()),
        ("transfers", stats.transfers.into()),
        ("transferred_tokens", stats.transferred_tokens.into()),
        (
            "transfer_us_per_request",
            (stats.transfer_ns as f64 / 1e3 / stats.transfers.max(1) as f64).into(),
        ),
        ("kvown_share_of_step_time", share(stats.kvown_ns).into()),
        ("model_share_of_step_time", share(stats.model_ns).into()),
        ("peak_pages_in_use", stats.peak_pages_in_use.into()),
        ("wall_s", wall.as_secs_f64().into()),
    ]
}

/// What NIXL did, for the summary: bytes read, descriptors, notices, the READs' rate and the
/// staging copies.
fn nixl_summary(nixl: &LoopbackStats) -> Vec<(&'static str, serde_json::Value)> {
    let link = &nixl.link;
    vec![
        ("nixl_reads", link.completed.into()),
        ("nixl_failed", link.failed.into()),
        ("nixl_bytes", link.bytes.into()),
        ("nixl_descriptors", link.descriptors.into()),
        ("nixl_notices", nixl.notices.into()),
        (
            "nixl_read_gb_per_s",
            (link.bytes as f64 / link.busy.as_secs_f64().max(f64::MIN_POSITIVE) / 1e9).into(),
        ),
        (
            "nixl_staging_us_per_read",
            (nixl.staging.as_secs_f64() * 1e6 / link.completed.max(1) as f64).into(),
        ),
    ]
}

/// The server `args` ask for, and with `--transfer nixl` its link's counters.
fn server(args: &Args, loaded: &Loaded) -> Result<(Server, Option<LoopbackCounters>), String> {
    let model = Arc::new(loaded.model.clone());
    let config = serve_config(args, loaded);
    if args.transfer == Transfer::Local {
        return Ok((Server::new(model, config).map_err(|e| e.to_string())?, None));
    }
    kvown_nixl::available().map_err(|e| format!("--transfer nixl: {e}"))?;
    let mut counters = None;
    let server = Server::with_transfer(model, config, |prefill, decode| {
        let name = format!("kvown-candle-generate-{}", std::process::id());
        let options = AgentOptions::default();
        let link = NixlLoopback::new(Box::new(prefill), Box::new(decode), &name, &options)?;
        counters = Some(link.counters());
        Ok::<TransferLink, TransferError>(Box::new(link))
    })
    .map_err(|e| e.to_string())?;
    Ok((server, counters))
}

fn run(args: &Args) -> Result<(), String> {
    let loaded = load(args)?;
    let (mut server, nixl) = server(args, &loaded)?;
    let prompts = prompts(args, &loaded)?;
    let start = Instant::now();
    let finished = if prompts.is_empty() {
        let mut workload = Conversations::new(ConversationSpec {
            conversations: args.conversations,
            turns: args.turns,
            system_prompts: 4,
            system_len: 48,
            user_len: 8..=32,
            max_new_tokens: 8..=24,
            vocab: loaded.model.config().vocab_size,
            seed: args.seed,
        });
        serve(&mut server, &mut workload, &mut ()).map_err(|e| e.to_string())?
    } else {
        for (rid, prompt) in prompts.into_iter().enumerate() {
            let request = Request {
                rid: rid as u64,
                prompt,
                max_new_tokens: args.max_new_tokens,
            };
            server.submit(request).map_err(|e| e.to_string())?;
        }
        let mut finished = Vec::new();
        while !server.is_idle() {
            finished.extend(server.step().map_err(|e| e.to_string())?.finished);
        }
        finished
    };
    let wall = start.elapsed();
    let stats = server.finish().map_err(|e| e.to_string())?;
    let mut summary = summary(&stats, &finished, wall);
    if let Some(nixl) = &nixl {
        summary.extend(nixl_summary(&nixl.get()));
    }
    if args.json {
        let object: serde_json::Map<String, serde_json::Value> = summary
            .into_iter()
            .map(|(key, value)| (key.to_string(), value))
            .collect();
        println!("{:#}", serde_json::Value::Object(object));
    } else {
        println!("model: {}", loaded.name);
        for (key, value) in &summary {
            println!("  {key:<26} {value}");
        }
        let mut shown: Vec<&Finished> = finished.iter().filter(|done| !done.aborted).collect();
        shown.sort_by_key(|done| std::cmp::Reverse(done.prompt.len()));
        for done in shown.iter().take(3) {
            println!(
                "request {} ({} prompt tokens): {}",
                done.rid,
                done.prompt.len(),
                render(&loaded, &done.output)
            );
        }
        println!("every slot and row free again after the run: ok");
    }
    if stats.finished == 0 {
        return Err("no request finished".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("generate: {error}");
            ExitCode::FAILURE
        }
    }
}
