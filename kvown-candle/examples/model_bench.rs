//! kvown-candle's bench: `cargo run --release -p kvown-candle --example model_bench`.
//!
//! Prints a table and JSON (`--json PATH` writes it to a file) of:
//! * kvown's share of a model step (its batch-flow calls and the table reads that build each
//!   forward batch, over the whole step) for the tiny model and a ~100M-parameter Llama shape
//!   with random weights, at batch 1 and 32;
//! * paged decode against candle-transformers' `Llama` with its dense `Cache`, timed in
//!   alternation: tokens/s at batch 1, and continuous batching of 32 requests against the
//!   dense model serving them one after another;
//! * prompt tokens computed and time to first token with the prefix cache and without, on the
//!   shared-prompt chat workload;
//! * peak RSS of the paged pool against dense caches for the same 64 requests (each side in a
//!   child process of its own).
//!
//! Medians of `--repeats` runs; a paged / dense ratio is the median of the ratios of pairs
//! timed back to back, which goes first alternating (three times `--repeats` pairs at batch 1).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use candle_transformers::models::llama as dense;
use clap::Parser;
use kvown_candle::sampling::argmax;
use kvown_candle::workload::{ConversationSpec, Conversations, serve};
use kvown_candle::{LlamaConfig, PagedLlama, Request, ServeConfig, ServeStats, Server, random};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Parser)]
#[command(name = "model_bench")]
struct Args {
    /// Repeats of each timed comparison (medians are reported).
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Tokens generated per request in the decode comparisons.
    #[arg(long, default_value_t = 16)]
    new_tokens: usize,
    /// Prompt tokens per request in the decode comparisons.
    #[arg(long, default_value_t = 32)]
    prompt_tokens: usize,
    /// Skip the ~100M-parameter shape and the RSS comparison (the tiny model's rows only).
    #[arg(long)]
    tiny_only: bool,
    /// Write the JSON here as well.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Internal: measure one side's peak RSS (`paged` or `dense`) and print it.
    #[arg(long, hide = true)]
    rss_child: Option<String>,
}

/// A model shape and its random weights, both implementations built from them.
struct Shape {
    name: &'static str,
    config: LlamaConfig,
    weights: HashMap<String, Tensor>,
}

impl Shape {
    fn new(name: &'static str, config: LlamaConfig) -> Shape {
        let weights = random::random_weights(&config, 7).expect("random weights");
        Shape {
            name,
            config,
            weights,
        }
    }

    fn paged(&self) -> Arc<PagedLlama> {
        let model =
            PagedLlama::from_tensors(self.config.clone(), self.weights.clone(), "random".as_ref())
                .expect("the paged model");
        Arc::new(model)
    }

    fn dense(&self) -> (dense::Llama, dense::Config) {
        let json = serde_json::to_string(&self.config).expect("a config");
        let config: dense::LlamaConfig = serde_json::from_str(&json).expect("candle's config");
        let config = config.into_config(false);
        let vb =
            candle_nn::VarBuilder::from_tensors(self.weights.clone(), DType::F32, &Device::Cpu);
        (
            dense::Llama::load(vb, &config).expect("the dense model"),
            config,
        )
    }
}

/// `count` prompts of `len` random tokens.
fn prompts(count: usize, len: usize, vocab: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = SmallRng::seed_from_u64(seed);
    (0..count)
        .map(|_| (0..len).map(|_| rng.gen_range(1..vocab as u32)).collect())
        .collect()
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Two rates timed in alternation: the median of each, and the median of the pairs' ratios.
struct Paired {
    a: f64,
    b: f64,
    ratio: f64,
}

impl std::fmt::Display for Paired {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} / {:.1}: {:.2}x", self.a, self.b, self.ratio)
    }
}

/// Runs `a` and `b` back to back `repeats` times, `b` first every other time.
fn alternate(repeats: usize, mut a: impl FnMut() -> f64, mut b: impl FnMut() -> f64) -> Paired {
    let (mut first, mut second, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for repeat in 0..repeats {
        let (x, y) = match repeat % 2 {
            0 => {
                let x = a();
                (x, b())
            }
            _ => {
                let y = b();
                (a(), y)
            }
        };
        first.push(x);
        second.push(y);
        ratios.push(x / y);
    }
    Paired {
        a: median(first),
        b: median(second),
        ratio: median(ratios),
    }
}

/// A server big enough for `batch` requests of `prompt + new` tokens without eviction.
fn roomy(batch: usize, prompt: usize, new: usize) -> ServeConfig {
    let per_request = (prompt + new).next_multiple_of(16) + 16;
    ServeConfig {
        pool_tokens: batch * per_request,
        max_running: batch,
        max_context: per_request,
        chunk_size: batch * prompt,
        ..ServeConfig::default()
    }
}

/// A paged run: its counters, its wall time, and the time and tokens of the steps after the
/// first (which extends the prompts), decode alone.
struct PagedRun {
    stats: ServeStats,
    wall: Duration,
    decode: Duration,
    decode_tokens: u64,
}

/// Serves `prompts` on `model` at once.
fn run_paged(model: &Arc<PagedLlama>, prompts: &[Vec<u32>], new: usize) -> PagedRun {
    let prompt = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut server = Server::new(model.clone(), roomy(prompts.len(), prompt, new)).unwrap();
    for (rid, prompt) in prompts.iter().enumerate() {
        let request = Request {
            rid: rid as u64,
            prompt: prompt.clone(),
            max_new_tokens: new,
        };
        server.submit(request).unwrap();
    }
    let start = Instant::now();
    server.step().unwrap();
    let after_first = Instant::now();
    let decoded_first = server.stats().decode_tokens;
    while !server.is_idle() {
        server.step().unwrap();
    }
    let (wall, decode) = (start.elapsed(), after_first.elapsed());
    let stats = server.finish().unwrap();
    PagedRun {
        decode_tokens: stats.decode_tokens - decoded_first,
        stats,
        wall,
        decode,
    }
}

/// candle-transformers' Llama serving `prompts` one after another, each with its own dense
/// cache, greedy; returns the wall time of all and of the decode steps alone.
fn run_dense(
    model: &dense::Llama,
    config: &dense::Config,
    prompts: &[Vec<u32>],
    new: usize,
) -> (Duration, Duration) {
    let start = Instant::now();
    let mut decode = Duration::ZERO;
    for prompt in prompts {
        decode += generate_dense(model, config, prompt, new).1;
    }
    (start.elapsed(), decode)
}

/// `new` greedy tokens of `prompt` through candle-transformers' Llama with a dense cache of its
/// own; returns the cache and the time of the decode steps (all but the prefill).
fn generate_dense(
    model: &dense::Llama,
    config: &dense::Config,
    prompt: &[u32],
    new: usize,
) -> (dense::Cache, Duration) {
    let mut cache = dense::Cache::new(true, DType::F32, config, &Device::Cpu).unwrap();
    let forward = |tokens: &[u32], position, cache: &mut dense::Cache| {
        let input = Tensor::new(tokens, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = model.forward(&input, position, cache).unwrap();
        argmax(&logits.squeeze(0).unwrap().to_vec1::<f32>().unwrap())
    };
    let mut token = forward(prompt, 0, &mut cache);
    let decode_start = Instant::now();
    for position in prompt.len()..prompt.len() + new - 1 {
        token = forward(&[token], position, &mut cache);
    }
    (cache, decode_start.elapsed())
}

/// One row of the results table.
struct Row {
    name: String,
    value: String,
    goal: &'static str,
}

fn bookkeeping(shape: &Shape, args: &Args, rows: &mut Vec<Row>, json: &mut serde_json::Value) {
    let model = shape.paged();
    for batch in [1, 32] {
        let prompts = prompts(batch, args.prompt_tokens, shape.config.vocab_size, 1);
        let mut shares = Vec::new();
        let mut per_step = Vec::new();
        for _ in 0..args.repeats {
            let stats = run_paged(&model, &prompts, args.new_tokens).stats;
            shares.push(stats.kvown_ns as f64 / stats.step_ns as f64);
            per_step.push(stats.kvown_ns as f64 / stats.steps as f64 / 1e3);
        }
        let (share, micros) = (median(shares), median(per_step));
        rows.push(Row {
            name: format!("kvown share of a step, {}, batch {batch}", shape.name),
            value: format!("{:.3}% ({micros:.1} us/step)", share * 100.0),
            goal: if shape.name == "100M" { "< 1%" } else { "" },
        });
        json[format!("kvown_share_{}_batch{batch}", shape.name)] = serde_json::json!({
            "share": share, "kvown_us_per_step": micros,
        });
    }
}

fn decode_comparisons(
    shape: &Shape,
    args: &Args,
    rows: &mut Vec<Row>,
    json: &mut serde_json::Value,
) {
    let paged = shape.paged();
    let (dense_model, dense_config) = shape.dense();
    let new = args.new_tokens;
    let vocab = shape.config.vocab_size;
    // Batch 1: decode tokens/s, the two timed back to back, which goes first alternating;
    // three times the pairs, as a pair takes seconds and one step is a few milliseconds.
    let one = prompts(1, args.prompt_tokens, vocab, 2);
    let batch1 = alternate(
        3 * args.repeats,
        || {
            let run = run_paged(&paged, &one, new);
            run.decode_tokens as f64 / run.decode.as_secs_f64()
        },
        || {
            let (_, decode) = run_dense(&dense_model, &dense_config, &one, new);
            (new - 1) as f64 / decode.as_secs_f64()
        },
    );
    rows.push(Row {
        name: format!("decode tokens/s, batch 1, {}: paged / dense", shape.name),
        value: batch1.to_string(),
        goal: ">= 0.9x",
    });
    // 32 requests: continuous batching against the dense model one request at a time.
    let many = prompts(32, args.prompt_tokens, vocab, 3);
    let tokens = (32 * new) as f64;
    let batch32 = alternate(
        args.repeats,
        || tokens / run_paged(&paged, &many, new).wall.as_secs_f64(),
        || {
            tokens
                / run_dense(&dense_model, &dense_config, &many, new)
                    .0
                    .as_secs_f64()
        },
    );
    rows.push(Row {
        name: format!(
            "32 requests, tokens/s, {}: continuous batching / dense one by one",
            shape.name
        ),
        value: batch32.to_string(),
        goal: ">= 3x",
    });
    json[format!("decode_{}", shape.name)] = serde_json::json!({
        "batch1_paged_tokens_per_s": batch1.a,
        "batch1_dense_tokens_per_s": batch1.b,
        "batch1_ratio": batch1.ratio,
        "batch32_paged_tokens_per_s": batch32.a,
        "batch32_dense_sequential_tokens_per_s": batch32.b,
        "batch32_ratio": batch32.ratio,
    });
}

/// The shared-prompt chat workload: 16 conversations of 4 turns over 4 system prompts.
fn chat(vocab: usize) -> ConversationSpec {
    ConversationSpec {
        conversations: 16,
        turns: 4,
        system_prompts: 4,
        system_len: 128,
        user_len: 8..=32,
        max_new_tokens: 8..=24,
        vocab,
        seed: 5,
    }
}

fn prefix_cache(shape: &Shape, args: &Args, rows: &mut Vec<Row>, json: &mut serde_json::Value) {
    let model = shape.paged();
    let mut results = Vec::new();
    for cached in [true, false] {
        let config = ServeConfig {
            pool_tokens: 4096,
            max_running: 16,
            max_context: 512,
            chunk_size: 256,
            prefix_cache: cached.then_some(kvown_runtime::radix::EvictionPolicy::Lru),
            ..ServeConfig::default()
        };
        let (mut prefill, mut ttft) = (Vec::new(), Vec::new());
        for _ in 0..args.repeats {
            let mut server = Server::new(model.clone(), config.clone()).unwrap();
            let mut workload = Conversations::new(chat(shape.config.vocab_size));
            let finished = serve(&mut server, &mut workload, &mut ()).unwrap();
            let stats = server.finish().unwrap();
            prefill.push(stats.prefill_tokens as f64);
            ttft.push(median(
                finished
                    .iter()
                    .filter_map(|done| done.time_to_first_token)
                    .map(|t| t.as_secs_f64() * 1e3)
                    .collect(),
            ));
        }
        results.push((median(prefill), median(ttft)));
    }
    let ((with_tokens, with_ttft), (without_tokens, without_ttft)) = (results[0], results[1]);
    rows.push(Row {
        name: format!(
            "chat workload, {}: prompt tokens computed, cache / none",
            shape.name
        ),
        value: format!(
            "{with_tokens:.0} / {without_tokens:.0} = {:.2}x fewer",
            without_tokens / with_tokens
        ),
        goal: "",
    });
    rows.push(Row {
        name: format!("chat workload, {}: median TTFT, cache / none", shape.name),
        value: format!("{with_ttft:.2} ms / {without_ttft:.2} ms"),
        goal: "",
    });
    json[format!("prefix_cache_{}", shape.name)] = serde_json::json!({
        "prefill_tokens_with_cache": with_tokens,
        "prefill_tokens_without_cache": without_tokens,
        "median_ttft_ms_with_cache": with_ttft,
        "median_ttft_ms_without_cache": without_ttft,
    });
}

/// The shape whose K/V is the 100M shape's (12 layers, 4 K/V heads of 64) with a small
/// vocabulary and feed-forward layer, so that 64 requests compute in seconds.
fn kv_heavy() -> LlamaConfig {
    random::llama_config(1024, 768, 512, 12, 12, 4, 2048, true)
}

/// 64 single-turn requests over 8 system prompts of 128 tokens, each with 16 tokens of its
/// own and 8 to generate.
fn rss_requests(vocab: usize) -> Vec<Vec<u32>> {
    let systems = prompts(8, 128, vocab, 8);
    let users = prompts(64, 16, vocab, 9);
    users
        .into_iter()
        .enumerate()
        .map(|(i, user)| [systems[i % 8].clone(), user].concat())
        .collect()
}

/// The child's side of the RSS comparison: kilobytes of peak RSS above the RSS once the model
/// is loaded, and the K/V bytes the side holds.
fn rss_child(side: &str) {
    let shape = Shape::new("kv-heavy", kv_heavy());
    let requests = rss_requests(shape.config.vocab_size);
    let new = 8;
    let kv_bytes_per_token = 2 * 12 * 4 * 64 * 4;
    let (baseline, kv_bytes) = match side {
        "paged" => {
            let model = shape.paged();
            drop(shape);
            // Every request running at once; the pool holds each system prompt once.
            let unique: usize = 8 * 128 + 64 * (16 + new);
            let pool_tokens = (unique + 64 * 16).next_multiple_of(16);
            let config = ServeConfig {
                pool_tokens,
                max_running: 64,
                max_context: 256,
                chunk_size: 1024,
                ..ServeConfig::default()
            };
            let baseline = rss_kib("VmRSS");
            let mut server = Server::new(model, config).unwrap();
            for (rid, prompt) in requests.into_iter().enumerate() {
                let request = Request {
                    rid: rid as u64,
                    prompt,
                    max_new_tokens: new,
                };
                server.submit(request).unwrap();
            }
            while !server.is_idle() {
                server.step().unwrap();
            }
            let stats = server.finish().unwrap();
            assert_eq!(stats.retractions, 0, "the pool holds every request at once");
            (baseline, pool_tokens * kv_bytes_per_token)
        }
        _ => {
            let (model, config) = shape.dense();
            drop(shape);
            let baseline = rss_kib("VmRSS");
            // Every request's dense cache alive at once, as a server holding them would.
            let mut caches = Vec::new();
            for prompt in &requests {
                caches.push(generate_dense(&model, &config, prompt, new).0);
            }
            (baseline, 64 * (144 + new - 1) * kv_bytes_per_token)
        }
    };
    let peak = rss_kib("VmHWM");
    println!("{} {}", peak.saturating_sub(baseline), kv_bytes);
}

/// A `/proc/self/status` figure in KiB (0 where the file is missing).
fn rss_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with(field))
                .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn peak_rss(rows: &mut Vec<Row>, json: &mut serde_json::Value) {
    let exe = std::env::current_exe().expect("the bench binary");
    let measure = |side: &str| -> (f64, f64) {
        let out = std::process::Command::new(&exe)
            .args(["--rss-child", side])
            .output()
            .expect("the child runs");
        let text = String::from_utf8_lossy(&out.stdout);
        let mut fields = text
            .split_whitespace()
            .map(|x| x.parse::<f64>().unwrap_or(0.0));
        let kib = fields.next().unwrap_or(0.0);
        (
            kib / 1024.0,
            fields.next().unwrap_or(0.0) / (1 << 20) as f64,
        )
    };
    let (paged_mib, pool_mib) = measure("paged");
    let (dense_mib, dense_kv_mib) = measure("dense");
    rows.push(Row {
        name: "64 requests, peak RSS above the loaded model: paged pool / dense caches".into(),
        value: format!(
            "{paged_mib:.0} MiB / {dense_mib:.0} MiB (K/V held: {pool_mib:.0} MiB pool / \
             {dense_kv_mib:.0} MiB dense)"
        ),
        goal: "",
    });
    json["peak_rss"] = serde_json::json!({
        "paged_mib": paged_mib, "dense_mib": dense_mib,
        "paged_pool_kv_mib": pool_mib, "dense_kv_mib": dense_kv_mib,
    });
}

fn main() {
    let args = Args::parse();
    if let Some(side) = &args.rss_child {
        rss_child(side);
        return;
    }
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut json = serde_json::json!({});
    let tiny = Shape::new("tiny", random::tiny_config());
    bookkeeping(&tiny, &args, &mut rows, &mut json);
    decode_comparisons(&tiny, &args, &mut rows, &mut json);
    prefix_cache(&tiny, &args, &mut rows, &mut json);
    drop(tiny);
    if !args.tiny_only {
        let big = Shape::new("100M", random::llama_100m_config());
        bookkeeping(&big, &args, &mut rows, &mut json);
        decode_comparisons(&big, &args, &mut rows, &mut json);
        drop(big);
        peak_rss(&mut rows, &mut json);
    }
    json["repeats"] = args.repeats.into();
    json["prompt_tokens"] = args.prompt_tokens.into();
    json["new_tokens"] = args.new_tokens.into();
    json["wall_s"] = started.elapsed().as_secs_f64().into();
    println!("| measure | result | goal |\n|---|---|---|");
    for row in &rows {
        println!("| {} | {} | {} |", row.name, row.value, row.goal);
    }
    println!("\n{json:#}");
    if let Some(path) = &args.json {
        std::fs::write(path, format!("{json:#}\n")).expect("the JSON file");
    }
}
