//! The end-of-run summary, as a table or as JSON.

use std::fmt;

use serde::Serialize;

use crate::disagg::TransferReport;
use crate::replay::EventCounts;
use crate::scheduler::Stats;

/// What the run did and what it cost.
#[derive(Debug, Serialize)]
pub struct Summary {
    /// Requests in the workload.
    pub requests: usize,
    /// Requests that finished normally.
    pub finished: u64,
    /// Requests aborted because they could not fit alone.
    pub aborted: u64,
    /// Scheduler steps.
    pub steps: u64,
    /// Tokens whose K/V extends computed (recomputation after retraction included).
    pub tokens_prefilled: u64,
    /// Tokens committed by decode steps.
    pub tokens_decoded: u64,
    /// Prefix-cache hit rate: cached tokens / tokens looked up at admission.
    pub prefix_cache_hit_rate: f64,
    /// The hit rate of the requests of each priority, `0..--priorities`.
    pub prefix_cache_hit_rate_by_priority: Vec<f64>,
    /// Requests retracted.
    pub retractions: u64,
    /// With `--disaggregated`: what the transfers from the prefill node did.
    pub transfers: Option<TransferReport>,
    /// The admission policy (`--admission`) and its parameters.
    pub admission: AdmissionSummary,
    /// The prefix cache's eviction policy (`--eviction-policy`).
    pub eviction_policy: &'static str,
    /// What is evicted before an allocation (`--eviction-demand`).
    pub eviction_demand: &'static str,
    /// Highest pages in use (request-owned plus cached).
    pub peak_pages_in_use: usize,
    /// Pages in the pool.
    pub pool_pages: usize,
    /// Median nanoseconds per step spent in kvown calls.
    pub kvown_ns_per_step_median: u64,
    /// 99th-percentile nanoseconds per step spent in kvown calls.
    pub kvown_ns_per_step_p99: u64,
    /// K/V rows stored through the pool.
    pub kv_rows_stored: u64,
    /// K/V samples read back and verified.
    pub kv_samples_verified: u64,
    /// With `--cache-events`: the events drained during the run and the pages they stored and
    /// removed (their replay matched the cache at the end); `null` without.
    pub cache_events: Option<EventCounts>,
    /// Whether the invariant checker ran every step.
    pub checked_every_step: bool,
    /// Backend holding the K/V data, and why it was chosen.
    pub backend: String,
    /// Wall-clock seconds of the loop.
    pub wall_seconds: f64,
    /// Where the occupancy plot was written (or, marked so, where it could not be).
    pub plot: String,
    /// Leak check: pool and request table back at full capacity after releasing and evicting.
    pub leak_check: &'static str,
    /// What the run could not do but did not fail for (printed after the summary): requests
    /// aborted for a pool too small, a plot that could not be written.
    pub warnings: Vec<String>,
}

impl Summary {
    /// Whether the run served its workload: some request finished. A workload whose every
    /// request was aborted for want of pool exits non-zero.
    pub fn served(&self) -> bool {
        self.finished > 0
    }
}

/// The admission policy and its parameters: one line in the table, in JSON an object tagged by
/// `policy` (`"next-step"` or `"ratio"`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "policy", rename_all = "kebab-case")]
pub enum AdmissionSummary {
    /// `--admission next-step`.
    NextStep,
    /// `--admission ratio`: the new-token ratio falls from `new_token_ratio` to
    /// `min_new_token_ratio` over `decay_steps` decode steps.
    Ratio {
        /// The initial ratio (`--new-token-ratio`).
        new_token_ratio: f64,
        /// The lowest ratio (`--new-token-ratio` x `--min-new-token-ratio-factor`).
        min_new_token_ratio: f64,
        /// `--new-token-ratio-decay-steps`.
        decay_steps: u64,
    },
}

impl fmt::Display for AdmissionSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            AdmissionSummary::NextStep => f.write_str("next-step"),
            // Debug writes small values with an exponent, as they were likely typed.
            AdmissionSummary::Ratio {
                new_token_ratio,
                min_new_token_ratio,
                decay_steps,
            } => write!(
                f,
                "ratio (new-token ratio {new_token_ratio:?}, decaying to {} over {decay_steps} \
                 decode steps)",
                three_significant_digits(min_new_token_ratio)
            ),
        }
    }
}

/// `value` (finite, not negative) rounded to three significant digits, written as `{:?}` writes
/// a float (an exponent below 1e-4) without a trailing `.0`.
fn three_significant_digits(value: f64) -> String {
    let rounded: f64 = format!("{value:.2e}")
        .parse()
        .expect("a float written by format!");
    let text = format!("{rounded:?}");
    text.strip_suffix(".0").unwrap_or(&text).to_string()
}

fn percentile(sorted: &[u64], fraction: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let index = ((sorted.len() - 1) as f64 * fraction).round() as usize;
    sorted[index]
}

/// Per-step kvown time: (median, p99) in nanoseconds.
pub fn step_time_percentiles(stats: &Stats) -> (u64, u64) {
    let mut sorted = stats.kvown_ns_per_step.clone();
    sorted.sort_unstable();
    (percentile(&sorted, 0.5), percentile(&sorted, 0.99))
}

/// The table row of the hit rates per priority.
const HIT_RATE_BY_PRIORITY: &str = "hit rate by priority";

/// The table row of the cache events.
const CACHE_EVENTS: &str = "cache events";
/// The row of `--disaggregated`'s transfers.
const TRANSFERS: &str = "K/V transfers";

impl Summary {
    /// The hit rates per priority, `0: 6.1 %, 1: 7.2 %`.
    fn hit_rates_by_priority(&self) -> String {
        let rates: Vec<String> = (0..)
            .zip(&self.prefix_cache_hit_rate_by_priority)
            .map(|(priority, rate)| format!("{priority}: {:.1} %", 100.0 * rate))
            .collect();
        rates.join(", ")
    }

    /// The cache events' row: `812 (2315 pages stored, 1180 removed; replay matched the cache)`.
    fn cache_events_row(&self) -> String {
        self.cache_events.map_or(String::new(), |counts| {
            format!(
                "{} ({} pages stored, {} removed; replay matched the cache)",
                counts.events, counts.pages_stored, counts.pages_removed
            )
        })
    }

    /// Prints the summary as an aligned table.
    pub fn print_table(&self) {
        let rows = [
            (
                "requests",
                format!(
                    "{} ({} finished, {} aborted)",
                    self.requests, self.finished, self.aborted
                ),
            ),
            ("steps", self.steps.to_string()),
            ("tokens prefilled", self.tokens_prefilled.to_string()),
            ("tokens decoded", self.tokens_decoded.to_string()),
            (
                "prefix-cache hit rate",
                format!("{:.1} %", 100.0 * self.prefix_cache_hit_rate),
            ),
            ("retractions", self.retractions.to_string()),
            (
                TRANSFERS,
                self.transfers.map_or(String::new(), |t| t.to_string()),
            ),
            ("admission", self.admission.to_string()),
            ("eviction policy", self.eviction_policy.to_string()),
            ("eviction demand", self.eviction_demand.to_string()),
            (HIT_RATE_BY_PRIORITY, self.hit_rates_by_priority()),
            (
                "peak pages in use",
                format!("{} of {}", self.peak_pages_in_use, self.pool_pages),
            ),
            (
                "kvown time per step",
                format!(
                    "median {:.2} us, p99 {:.2} us",
                    self.kvown_ns_per_step_median as f64 / 1e3,
                    self.kvown_ns_per_step_p99 as f64 / 1e3
                ),
            ),
            (
                "K/V rows stored",
                format!(
                    "{} ({} samples read back and verified)",
                    self.kv_rows_stored, self.kv_samples_verified
                ),
            ),
            (
                "invariant checker",
                if self.checked_every_step {
                    "every step and at the end".to_string()
                } else {
                    "at the end (--check: every step)".to_string()
                },
            ),
            (CACHE_EVENTS, self.cache_events_row()),
            ("leak check", self.leak_check.to_string()),
            ("backend", self.backend.clone()),
            ("wall time", format!("{:.2} s", self.wall_seconds)),
            ("occupancy plot", self.plot.clone()),
        ];
        // Hit rates by priority only when there are several.
        let several_priorities = self.prefix_cache_hit_rate_by_priority.len() > 1;
        let rows: Vec<_> = rows
            .into_iter()
            .filter(|&(name, _)| name != HIT_RATE_BY_PRIORITY || several_priorities)
            .filter(|&(name, _)| name != CACHE_EVENTS || self.cache_events.is_some())
            .filter(|&(name, _)| name != TRANSFERS || self.transfers.is_some())
            .collect();
        let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
        for (name, value) in rows {
            println!("{name:<width$}  {value}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_is_an_object_tagged_by_policy_in_json() {
        let json = |admission| serde_json::to_value(admission).expect("serializable");
        assert_eq!(
            json(AdmissionSummary::NextStep),
            serde_json::json!({ "policy": "next-step" })
        );
        let ratio = AdmissionSummary::Ratio {
            new_token_ratio: 0.5,
            min_new_token_ratio: 0.25,
            decay_steps: 3,
        };
        assert_eq!(
            json(ratio),
            serde_json::json!({
                "policy": "ratio",
                "new_token_ratio": 0.5,
                "min_new_token_ratio": 0.25,
                "decay_steps": 3,
            })
        );
    }
}
