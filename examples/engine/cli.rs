//! Command-line flags of the engine example.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use clap::error::ErrorKind;
use clap::parser::ValueSource;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

use kvown::radix::EvictionPolicy;

use crate::report::AdmissionSummary;
use crate::workload::{MAX_WORKLOAD_TOKENS, max_prompt_tokens};

/// An inclusive range of lengths, written `min..max` (or a single `n`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LenRange {
    /// Smallest length drawn.
    pub min: usize,
    /// Largest length drawn.
    pub max: usize,
}

impl FromStr for LenRange {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let parse = |part: &str| {
            part.trim()
                .parse::<usize>()
                .map_err(|error| format!("`{part}` is not a length: {error}"))
        };
        let (min, max) = match text.split_once("..") {
            Some((min, max)) => (parse(min)?, parse(max.trim_start_matches('='))?),
            None => (parse(text)?, parse(text)?),
        };
        if min == 0 || min > max {
            return Err(format!("`{text}`: need 1 <= min <= max"));
        }
        Ok(LenRange { min, max })
    }
}

impl fmt::Display for LenRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.min, self.max)
    }
}

/// Where the K/V data lives (on CUDA, with each step's table writes staged to the device too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendChoice {
    /// CUDA when a GPU works, the host otherwise.
    Auto,
    /// The host pool and allocator, always.
    Cpu,
    /// CUDA, or fail with the reason it is unavailable.
    Cuda,
}

/// How a `--disaggregated` pair moves K/V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TransferChoice {
    /// The prefill node in this process; its rows copied into the decode node's pool by a
    /// `LocalTransfer`.
    Local,
    /// The prefill node in a second process, started by this one; each request's rows read
    /// through NIXL (UCX on loopback, host memory) into the decode node's pool.
    Nixl,
}

/// What admission reserves for the decoding still to come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Admission {
    /// The running batch's next decode step, and one page (or the speculative reservation) per
    /// admitted request; growth past that is met by retraction.
    NextStep,
    /// sglang's estimate: each running request's remaining output times the new-token ratio,
    /// and each admitted request's whole remaining output (both clipped at 4096 tokens).
    Ratio,
}

/// How much of the prefix cache the batch flow evicts before an allocation (kvown's
/// `EvictionDemand`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EvictionDemand {
    /// sglang's over-estimate: an extend's tokens plus a page per request, a page per decoding
    /// request.
    Sglang,
    /// Only what the allocation lacks.
    Shortfall,
}

impl EvictionDemand {
    /// The name as the flag spells it.
    pub fn name(self) -> &'static str {
        match self {
            EvictionDemand::Sglang => "sglang",
            EvictionDemand::Shortfall => "shortfall",
        }
    }
}

/// The limits `--help` states after the flags.
const LIMITS: &str = "\
Limits (checked before anything is allocated or drawn; a run past one exits non-zero naming it):
  --requests                at most 10000000, and --requests x the longest --prompt-len (plus 8
                            system prompts) at most 268435456 tokens: the workload is drawn up
                            front, every prompt in memory (1 GiB at the limit)
  --requests/--arrival-rate the arrivals span at most 10000000 steps (every step is recorded)
  --pool-tokens             a whole number of pages of --page-size, at most 134217728 slots (the
                            synthetic model's K/V take 1 KiB a slot: 128 GiB at the limit), and
                            enough for the shortest request (prompt + output - 1 positions, in
                            whole pages; with --spec, 2 x --spec-tokens more); longer requests
                            are aborted, and the summary warns how large a pool runs them all
  --plot                    its directory must exist; a plot that cannot be written is a warning
                            after the summary, not a failure";

/// Where the occupancy plot goes by default: the workspace's `target` directory, wherever the
/// engine is run from.
pub const DEFAULT_PLOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/target/kvown-occupancy.svg");

/// A continuous-batching serving loop over kvown's allocator, radix cache and KV pool, on a
/// synthetic workload.
#[derive(Debug, Parser)]
#[command(name = "engine", version, after_help = LIMITS)]
pub struct Args {
    /// Requests in the workload (limits below).
    #[arg(long, default_value_t = 400)]
    pub requests: usize,
    /// Mean requests arriving per step.
    #[arg(long, default_value_t = 1.0)]
    pub arrival_rate: f64,
    /// Prompt lengths, drawn uniformly from `min..max`.
    #[arg(long, default_value = "32..2048")]
    pub prompt_len: LenRange,
    /// Output lengths, drawn uniformly from `min..max`.
    #[arg(long, default_value = "8..512")]
    pub output_len: LenRange,
    /// Fraction of requests that share a prefix: half a system prompt, half a multi-turn
    /// follow-up of an earlier request.
    #[arg(long, default_value_t = 0.5)]
    pub shared_prefix_fraction: f64,
    /// LoRA adapters the requests are spread over, each a prefix-cache namespace: a request
    /// reuses only prefixes computed with its own adapter (a follow-up keeps its
    /// conversation's).
    #[arg(long, default_value_t = 1)]
    pub adapters: u32,
    /// Request priorities: each conversation gets one of `0..N` (a follow-up keeps its
    /// conversation's), recorded with the prefixes it caches; the summary gives the hit rate
    /// per priority. Matters to `--eviction-policy priority`.
    #[arg(long, default_value_t = 1)]
    pub priorities: u32,
    /// Speculative decoding: reserve `2 × spec-tokens` slots ahead and commit accepted runs.
    #[arg(long)]
    pub spec: bool,
    /// With `--spec`: tokens verified per speculative step (drafts + 1).
    #[arg(long, default_value_t = 4, requires = "spec")]
    pub spec_tokens: usize,
    /// With `--spec`: probability that each draft token is accepted (given the previous one
    /// was).
    #[arg(long, default_value_t = 0.7, requires = "spec")]
    pub accept_rate: f64,
    /// Which cached prefix an eviction drops first: lru, lfu, fifo, mru, filo, priority or
    /// slru (sglang's `--radix-eviction-policy`). The workload's requests all have priority 0,
    /// so `priority` evicts as `lru` does.
    #[arg(long, default_value_t = EvictionPolicy::Lru)]
    pub eviction_policy: EvictionPolicy,
    /// What is evicted from the prefix cache before an allocation: sglang's demand (an extend's
    /// tokens plus a page per request, a page per decoding request, less what is free) or only
    /// the allocation's shortfall.
    #[arg(long, value_enum, default_value_t = EvictionDemand::Sglang)]
    pub eviction_demand: EvictionDemand,
    /// Slots per page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// KV slots in the pool: whole pages, enough for the shortest request (limits below).
    #[arg(long, default_value_t = 65536)]
    pub pool_tokens: usize,
    /// Most requests running (decoding or prefilling) at once.
    #[arg(long, default_value_t = 64)]
    pub max_running: usize,
    /// Prefill tokens per step (chunked prefill splits longer prompts).
    #[arg(long, default_value_t = 2048)]
    pub chunk_size: usize,
    /// What admission reserves for future decoding.
    #[arg(long, value_enum, default_value_t = Admission::Ratio)]
    pub admission: Admission,
    /// `--admission ratio`: the initial new-token ratio (sglang `SGLANG_INIT_NEW_TOKEN_RATIO`).
    #[arg(long, default_value_t = 0.7)]
    pub new_token_ratio: f64,
    /// `--admission ratio`: the lowest ratio, as a fraction of the initial one (sglang
    /// `SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR`).
    #[arg(long, default_value_t = 0.14)]
    pub min_new_token_ratio_factor: f64,
    /// `--admission ratio`: decode steps over which the ratio falls from the initial to the
    /// lowest (sglang `SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS`).
    #[arg(long, default_value_t = 600)]
    pub new_token_ratio_decay_steps: u64,
    /// Random seed of the workload and the acceptance draws.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Where the K/V data lives.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,
    /// Print the summary as JSON (and hide the progress bar).
    #[arg(long)]
    pub json: bool,
    /// Run the invariant checker after every step (it always runs at the end).
    #[arg(long)]
    pub check: bool,
    /// Serve as a prefill/decode pair in one process: each admitted prompt is computed on a
    /// prefill node (its own allocator, prefix cache and K/V pool), its K/V moved into this
    /// decode node's preallocated slots (`prealloc_for_transfer`, `LocalTransfer`), and decoded
    /// here. Both allocators run in `need_sort` mode, as sglang's do under disaggregation; the
    /// prefill node takes whole prompts (no chunking). The summary counts the transfers.
    #[arg(long)]
    pub disaggregated: bool,
    /// With `--disaggregated`: how K/V moves. `nixl` runs the prefill node as a second process
    /// and needs NIXL's library (scripts/install-nixl.sh) and the host pool (`--backend auto`
    /// picks the host for it).
    #[arg(long, value_enum, default_value_t = TransferChoice::Local, requires = "disaggregated")]
    pub transfer: TransferChoice,
    /// Turn the prefix cache's events on and drain them every step into a router's replay
    /// (the page hashes this replica holds); at the end the replay must equal the hashes of
    /// the pages the cache holds, or the run fails. The summary counts the events.
    #[arg(long)]
    pub cache_events: bool,
    /// Where to write the pool-occupancy plot (SVG). Its directory must exist (the default's,
    /// the workspace's `target`, is created if missing); a plot that cannot be written is a
    /// warning after the summary.
    #[arg(long, default_value = DEFAULT_PLOT)]
    pub plot: PathBuf,
    /// The flags as given (after the program's name), for the prefill process of
    /// `--transfer nixl`, which builds the same prefill node from them.
    #[arg(skip)]
    pub flags: Vec<String>,
}

/// The lowest `--arrival-rate`: one request every 10,000 steps.
const MIN_ARRIVAL_RATE: f64 = 1e-4;

/// The most steps the arrivals may span (`--requests / --arrival-rate`). Every step keeps its
/// occupancy and timing (about 65 bytes a step measured), so a span of 10^10 steps
/// (`--requests 1000000 --arrival-rate 0.0001`) would need hours and hundreds of gigabytes.
const MAX_ARRIVAL_STEPS: f64 = 1e7;

/// The most `--requests`: the workload is drawn up front, every prompt in memory.
const MAX_REQUESTS: usize = 10_000_000;

/// The most `--pool-tokens`: the synthetic model's K/V take 1 KiB a slot (2 layers, 2 heads of
/// 64 f16 each for K and V), so 128 GiB at the limit, more than a GPU holds. Checked before the
/// allocator's bookkeeping (9 bytes a page) is taken.
const MAX_POOL_TOKENS: usize = 1 << 27;

/// The flags of `--admission ratio`, by clap id.
const RATIO_FLAGS: [&str; 3] = [
    "new_token_ratio",
    "min_new_token_ratio_factor",
    "new_token_ratio_decay_steps",
];

impl Args {
    /// Parses the command line (the program name first), refusing flags that would be ignored:
    /// the speculative ones without `--spec` (clap's `requires`) and the ratio's with
    /// `--admission next-step`.
    pub fn try_parse_flags<I, T>(flags: I) -> Result<Args, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let flags: Vec<std::ffi::OsString> = flags.into_iter().map(Into::into).collect();
        let mut command = Args::command();
        let matches = command.try_get_matches_from_mut(&flags)?;
        let mut args = Args::from_arg_matches(&matches)?;
        args.flags = flags
            .iter()
            .skip(1)
            .map(|flag| flag.to_string_lossy().into_owned())
            .collect();
        if args.admission == Admission::NextStep {
            let given = RATIO_FLAGS
                .into_iter()
                .find(|id| matches.value_source(id) == Some(ValueSource::CommandLine));
            if let Some(id) = given {
                let flag = id.replace('_', "-");
                let message = format!(
                    "--{flag} applies to `--admission ratio` only; it would be ignored with \
                     `--admission next-step`"
                );
                return Err(command.error(ErrorKind::ArgumentConflict, message));
            }
        }
        Ok(args)
    }

    /// Rejects flag combinations the engine cannot run.
    pub fn validate(&self) -> Result<(), String> {
        if self.requests == 0 || self.max_running == 0 || self.chunk_size == 0 {
            return Err("--requests, --max-running and --chunk-size must be positive".into());
        }
        // Below this the workload's arrival steps (counted one by one) would run for hours.
        if self.arrival_rate.is_nan() || self.arrival_rate < MIN_ARRIVAL_RATE {
            return Err(format!(
                "--arrival-rate must be at least {MIN_ARRIVAL_RATE} requests per step"
            ));
        }
        if self.requests > MAX_REQUESTS {
            return Err(format!("--requests must be at most {MAX_REQUESTS}"));
        }
        if self.requests as f64 / self.arrival_rate > MAX_ARRIVAL_STEPS {
            return Err(format!(
                "--requests / --arrival-rate: the arrivals must span at most {MAX_ARRIVAL_STEPS} \
                 steps"
            ));
        }
        if !(0.0..=1.0).contains(&self.shared_prefix_fraction)
            || !(0.0..=1.0).contains(&self.accept_rate)
        {
            return Err("--shared-prefix-fraction and --accept-rate must be in [0, 1]".into());
        }
        if self.spec_tokens == 0 {
            return Err("--spec-tokens must be positive".into());
        }
        if self.adapters == 0 {
            return Err("--adapters must be positive (1: every request on the base model)".into());
        }
        if !(1..=1 << 16).contains(&self.priorities) {
            return Err(
                "--priorities must be in 1..=65536 (1: every request at priority 0)".into(),
            );
        }
        if self.page_size == 0 {
            return Err("--page-size must be positive".into());
        }
        if self.pool_tokens < self.page_size {
            return Err("--pool-tokens must hold at least one page of --page-size".into());
        }
        if self.pool_tokens > MAX_POOL_TOKENS {
            return Err(format!(
                "--pool-tokens must be at most {MAX_POOL_TOKENS} (the synthetic K/V take 1 KiB a \
                 slot: 128 GiB at the limit)"
            ));
        }
        // The pool holds whole pages only: a remainder would be unused.
        let usable = self.pool_tokens / self.page_size * self.page_size;
        if usable != self.pool_tokens {
            return Err(format!(
                "--pool-tokens {} is not a whole number of pages of --page-size {}: pass {usable}",
                self.pool_tokens, self.page_size
            ));
        }
        if self.spec && self.spec_tokens > usable / 2 {
            return Err(
                "--spec-tokens: the reservation, 2 x --spec-tokens, must fit in the whole pages \
                 of --pool-tokens"
                    .into(),
            );
        }
        if self.transfer == TransferChoice::Nixl && self.backend == BackendChoice::Cuda {
            return Err(
                "--transfer nixl registers host memory with NIXL: pass --backend cpu (or auto)"
                    .into(),
            );
        }
        // Written to fail on NaN too.
        if !(self.new_token_ratio > 0.0 && self.new_token_ratio <= 1.0) {
            return Err("--new-token-ratio must be in (0, 1]".into());
        }
        if !(0.0..=1.0).contains(&self.min_new_token_ratio_factor) {
            return Err("--min-new-token-ratio-factor must be in [0, 1]".into());
        }
        if self.new_token_ratio_decay_steps == 0 {
            return Err("--new-token-ratio-decay-steps must be positive".into());
        }
        self.validate_workload_size()?;
        let shortest = self.lifetime_slots(self.prompt_len.min, self.output_len.min);
        if shortest > usable {
            return Err(format!(
                "no request fits the pool: the shortest (--prompt-len {} and --output-len {}) \
                 needs {shortest} slots of K/V, and --pool-tokens gives {usable}; pass \
                 --pool-tokens {shortest} or more ({} runs every request), or shorter \
                 --prompt-len / --output-len",
                self.prompt_len.min,
                self.output_len.min,
                self.pool_for_every_request()
            ));
        }
        Ok(())
    }

    /// The workload is drawn up front: refuses flags whose prompts could exceed
    /// [`MAX_WORKLOAD_TOKENS`], naming the most requests that fit.
    fn validate_workload_size(&self) -> Result<(), String> {
        match max_prompt_tokens(self) {
            Some(tokens) if tokens <= MAX_WORKLOAD_TOKENS => Ok(()),
            _ => {
                let requests = (MAX_WORKLOAD_TOKENS / self.prompt_len.max).saturating_sub(8);
                let prompt = MAX_WORKLOAD_TOKENS / self.requests.saturating_add(8);
                let fewer = match requests {
                    0 => String::new(),
                    requests => format!("--requests {requests} or fewer, or "),
                };
                Err(format!(
                    "--requests {} x --prompt-len max {} could draw more than \
                     {MAX_WORKLOAD_TOKENS} prompt tokens (the workload is drawn up front, every \
                     prompt in memory): pass {fewer}--prompt-len max {prompt} or less",
                    self.requests, self.prompt_len.max,
                ))
            }
        }
    }

    /// Slots a request of `prompt` tokens and `output` outputs could ever hold, in whole pages
    /// (the scheduler's `lifetime_need`): its last output is never computed, so
    /// `prompt + output - 1` positions, and with `--spec` a reservation of `2 x --spec-tokens`
    /// on top of all but the last two. Saturates at `usize::MAX`.
    pub fn lifetime_slots(&self, prompt: usize, output: usize) -> usize {
        let computed = prompt.saturating_add(output) - 1;
        let held = match self.spec_reserve() {
            None => computed,
            Some(reserve) => computed
                .saturating_sub(1)
                .saturating_add(reserve)
                .max(computed),
        };
        held.checked_next_multiple_of(self.page_size)
            .unwrap_or(usize::MAX)
    }

    /// The pool that every request of the workload fits alone: the longest prompt with the
    /// longest output.
    pub fn pool_for_every_request(&self) -> usize {
        self.lifetime_slots(self.prompt_len.max, self.output_len.max)
    }

    /// Steps in a row without an arrival or a completion after which the run is a stall
    /// (`--check` runs take long enough that a stall should fail, not hang): a running request
    /// takes at most its prompt and output in steps, each retraction starting it again, so 64
    /// times that per request of the workload, plus 10,000, capped at `cap`.
    pub fn stall_steps(&self, cap: u64) -> u64 {
        let life = self.prompt_len.max.saturating_add(self.output_len.max) as u64;
        life.saturating_mul(64)
            .saturating_mul(self.requests as u64)
            .saturating_add(10_000)
            .min(cap)
    }

    /// Whether the pair runs in two processes linked by NIXL.
    pub fn transfer_over_nixl(&self) -> bool {
        self.disaggregated && self.transfer == TransferChoice::Nixl
    }

    /// The admission policy and its parameters, for the summary.
    pub fn admission_summary(&self) -> AdmissionSummary {
        match self.admission {
            Admission::NextStep => AdmissionSummary::NextStep,
            Admission::Ratio => AdmissionSummary::Ratio {
                new_token_ratio: self.new_token_ratio,
                min_new_token_ratio: self.new_token_ratio * self.min_new_token_ratio_factor,
                decay_steps: self.new_token_ratio_decay_steps,
            },
        }
    }

    /// Slots reserved ahead per request in speculative mode (`2 × tokens per step`), `None`
    /// without speculation.
    pub fn spec_reserve(&self) -> Option<usize> {
        self.spec.then_some(2 * self.spec_tokens)
    }
}

#[cfg(test)]
impl Args {
    /// The engine's flags: `flags` after the defaults.
    pub fn from_flags(flags: &[&str]) -> Args {
        Args::try_parse_flags(std::iter::once("engine").chain(flags.iter().copied()))
            .expect("flags that parse")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_small_workload_is_a_stall_long_before_the_cap() {
        let small = Args::from_flags(&[
            "--requests",
            "3",
            "--prompt-len",
            "4..8",
            "--output-len",
            "2..4",
        ]);
        // (8 + 4) tokens x 64 x 3 requests + 10,000.
        assert_eq!(small.stall_steps(10_000_000), 12 * 64 * 3 + 10_000);
        assert_eq!(Args::from_flags(&[]).stall_steps(10_000_000), 10_000_000);
        assert_eq!(small.stall_steps(100), 100);
    }

    #[test]
    fn the_defaults_run() {
        assert_eq!(Args::from_flags(&[]).validate(), Ok(()));
    }

    #[test]
    fn the_admission_summary_shows_small_ratios() {
        let summary = |flags: &[&str]| Args::from_flags(flags).admission_summary().to_string();
        assert_eq!(
            summary(&[]),
            "ratio (new-token ratio 0.7, decaying to 0.098 over 600 decode steps)"
        );
        // The lowest ratio, 0.00014, is not 0.
        assert_eq!(
            summary(&["--new-token-ratio", "0.001"]),
            "ratio (new-token ratio 0.001, decaying to 0.00014 over 600 decode steps)"
        );
        assert_eq!(
            summary(&[
                "--new-token-ratio",
                "1e-30",
                "--min-new-token-ratio-factor",
                "0.5"
            ]),
            "ratio (new-token ratio 1e-30, decaying to 5e-31 over 600 decode steps)"
        );
        assert_eq!(
            summary(&["--min-new-token-ratio-factor", "0"]),
            "ratio (new-token ratio 0.7, decaying to 0 over 600 decode steps)"
        );
        assert_eq!(summary(&["--admission", "next-step"]), "next-step");
    }

    #[test]
    fn flags_that_would_be_ignored_are_refused() {
        let parse = |flags: &[&str]| {
            Args::try_parse_flags(std::iter::once("engine").chain(flags.iter().copied()))
        };
        use clap::error::ErrorKind::{ArgumentConflict, MissingRequiredArgument};
        for (flags, kind, named) in [
            (
                &["--spec-tokens", "8"][..],
                MissingRequiredArgument,
                "--spec",
            ),
            (&["--accept-rate", "0.5"], MissingRequiredArgument, "--spec"),
            (
                &["--transfer", "nixl"],
                MissingRequiredArgument,
                "--disaggregated",
            ),
            (
                &["--admission", "next-step", "--new-token-ratio", "0.5"],
                ArgumentConflict,
                "--new-token-ratio applies to `--admission ratio` only",
            ),
            (
                &[
                    "--min-new-token-ratio-factor",
                    "0.5",
                    "--admission",
                    "next-step",
                ],
                ArgumentConflict,
                "--min-new-token-ratio-factor applies",
            ),
            (
                &["--admission=next-step", "--new-token-ratio-decay-steps=3"],
                ArgumentConflict,
                "--new-token-ratio-decay-steps applies",
            ),
        ] {
            let error = parse(flags).unwrap_err();
            assert_eq!(error.kind(), kind, "{flags:?}: {error}");
            assert!(error.to_string().contains(named), "{flags:?}: {error}");
        }
        // The same flags where they apply, and the defaults under either policy.
        for flags in [
            &["--spec", "--spec-tokens", "8", "--accept-rate", "0.5"][..],
            &["--admission", "ratio", "--new-token-ratio", "0.5"],
            &["--new-token-ratio-decay-steps", "3"],
            &["--admission", "next-step"],
            &["--disaggregated", "--transfer", "nixl"],
        ] {
            assert!(parse(flags).is_ok(), "{flags:?}");
        }
    }

    #[test]
    fn validate_names_the_flag_at_fault() {
        for (flags, message) in [
            (
                &["--requests", "0"][..],
                "--requests, --max-running and --chunk-size",
            ),
            (
                &[
                    "--requests",
                    "18446744073709551615",
                    "--arrival-rate",
                    "1e30",
                ],
                "--requests must be at most",
            ),
            (&["--arrival-rate", "0"], "--arrival-rate must be at least"),
            (
                &["--arrival-rate", "1e-20"],
                "--arrival-rate must be at least",
            ),
            (
                &["--requests", "1000001", "--arrival-rate", "0.1"],
                "--requests / --arrival-rate",
            ),
            (
                &["--requests", "1001", "--arrival-rate", "0.0001"],
                "--requests / --arrival-rate",
            ),
            (
                &["--spec", "--accept-rate", "1.5"],
                "--accept-rate must be in [0, 1]",
            ),
            (
                &["--spec", "--spec-tokens", "0"],
                "--spec-tokens must be positive",
            ),
            (&["--page-size", "0"], "--page-size must be positive"),
            (
                &["--disaggregated", "--transfer", "nixl", "--backend", "cuda"],
                "--transfer nixl registers host memory",
            ),
            (
                &["--pool-tokens", "8", "--page-size", "16"],
                "--pool-tokens must hold",
            ),
            (
                &["--spec", "--pool-tokens", "64", "--spec-tokens", "33"],
                "2 x --spec-tokens",
            ),
            (
                &["--spec", "--spec-tokens", "18446744073709551615"],
                "2 x --spec-tokens",
            ),
            (
                &["--new-token-ratio", "0"],
                "--new-token-ratio must be in (0, 1]",
            ),
            (
                &["--new-token-ratio", "1.5"],
                "--new-token-ratio must be in (0, 1]",
            ),
            (
                &["--new-token-ratio", "NaN"],
                "--new-token-ratio must be in (0, 1]",
            ),
            (
                &["--min-new-token-ratio-factor=-0.1"],
                "--min-new-token-ratio-factor must be in [0, 1]",
            ),
            (
                &["--new-token-ratio-decay-steps", "0"],
                "--new-token-ratio-decay-steps must be positive",
            ),
        ] {
            let error = Args::from_flags(flags).validate().unwrap_err();
            assert!(error.contains(message), "{flags:?}: {error}");
        }
        // One-token requests: a reservation of 2 x 32 fills the pool of 64 exactly.
        let one_token = ["--prompt-len", "1", "--output-len", "1"];
        let spec = ["--spec", "--pool-tokens", "64", "--spec-tokens", "32"];
        assert_eq!(
            Args::from_flags(&[&spec[..], &one_token].concat()).validate(),
            Ok(())
        );
        // 100 slots are one page of 64 and 36 unused: refused, naming the size to pass.
        let error = Args::from_flags(&["--pool-tokens", "100", "--page-size", "64"])
            .validate()
            .unwrap_err();
        assert!(
            error.contains("not a whole number of pages") && error.contains("pass 64"),
            "{error}"
        );
        assert_eq!(
            Args::from_flags(&["--requests", "1000", "--arrival-rate", "0.0001"]).validate(),
            Ok(())
        );
        // Without --spec nothing is reserved: a pool under 2 x the default --spec-tokens runs.
        assert_eq!(
            Args::from_flags(
                &[&["--pool-tokens", "4", "--page-size", "1"][..], &one_token].concat()
            )
            .validate(),
            Ok(())
        );
    }

    /// Every size the engine allocates or draws from is checked before it does: flags that
    /// aborted the process (a 14 GB prompt, 10^7 requests drawn up front, a 2^32-slot pool)
    /// are refused naming the flag and what would fit.
    #[test]
    fn sizes_that_aborted_the_process_are_refused_before_anything_is_allocated() {
        for (flags, message) in [
            (
                &["--requests", "10000000"][..],
                "pass --requests 131064 or fewer, or --prompt-len max 26 or less",
            ),
            (
                &["--prompt-len", "1..4000000000"],
                "--requests 400 x --prompt-len max 4000000000 could draw more than 268435456 \
                 prompt tokens (the workload is drawn up front, every prompt in memory): pass \
                 --prompt-len max 657930 or less",
            ),
            (
                &["--pool-tokens", "4294967294", "--page-size", "1"],
                "--pool-tokens must be at most 134217728",
            ),
            (
                &["--pool-tokens", "1000000000", "--page-size", "1"],
                "--pool-tokens must be at most",
            ),
        ] {
            let error = Args::from_flags(flags).validate().unwrap_err();
            assert!(error.contains(message), "{flags:?}: {error}");
        }
    }

    /// A pool that not even the shortest request fits is refused (it ran, aborted every
    /// request and exited 0), with the pool that the shortest and the longest request need.
    #[test]
    fn a_pool_no_request_fits_is_refused_with_the_sizes_that_would() {
        let error = Args::from_flags(&["--pool-tokens", "16"])
            .validate()
            .unwrap_err();
        // The shortest: 32 + 8 - 1 positions in pages of 16; the longest 2048 + 512 - 1.
        assert!(error.contains("no request fits the pool"), "{error}");
        assert!(
            error.contains("pass --pool-tokens 48 or more (2560 runs every request)"),
            "{error}"
        );
        assert_eq!(
            Args::from_flags(&["--pool-tokens", "48"]).validate(),
            Ok(())
        );
        // With --spec the shortest reserves 2 x 6 past the 38 positions it has committed then.
        let spec = ["--pool-tokens", "48", "--spec", "--spec-tokens", "6"];
        let error = Args::from_flags(&spec).validate().unwrap_err();
        assert!(error.contains("pass --pool-tokens 64 or more"), "{error}");
    }

    #[test]
    fn help_states_the_limits_and_version_is_printed() {
        let parse = |flag: &str| Args::try_parse_flags(["engine", flag]).unwrap_err();
        let help = parse("--help").to_string();
        for limit in [
            "Limits",
            "268435456",
            "134217728",
            "whole number of pages",
            "--plot",
        ] {
            assert!(help.contains(limit), "--help lacks {limit}: {help}");
        }
        let version = parse("--version");
        assert_eq!(version.kind(), ErrorKind::DisplayVersion);
        assert!(
            version.to_string().contains(env!("CARGO_PKG_VERSION")),
            "{version}"
        );
    }
}
