//! The synthetic workload: prompts (some sharing a system prompt or continuing an earlier
//! conversation), output lengths, arrival steps and LoRA adapters, all drawn from the seed.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::cli::{Args, LenRange};

/// System prompts that shared-prefix requests start with.
const SYSTEM_PROMPTS: usize = 8;

/// The most prompt tokens [`generate`] may hold (1 GiB of `u32`): the workload is drawn up
/// front, every prompt in memory, so [`Args::validate`] refuses flags that could draw more.
pub const MAX_WORKLOAD_TOKENS: usize = 1 << 28;

/// The most prompt tokens the workload of `args` can hold: every prompt, system prompts
/// included, is at most `--prompt-len`'s max long (a follow-up quotes only a conversation
/// shorter than that). `None` past `usize::MAX`.
pub fn max_prompt_tokens(args: &Args) -> Option<usize> {
    args.requests
        .checked_add(SYSTEM_PROMPTS)?
        .checked_mul(args.prompt_len.max)
}

/// One request of the workload.
#[derive(Debug, Clone)]
pub struct Job {
    /// Request id (its index in the workload).
    pub rid: u64,
    /// Step at which it arrives.
    pub arrival_step: u64,
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Output tokens it generates before finishing.
    pub output_len: usize,
    /// Its LoRA adapter, the prefix-cache namespace it matches and caches in.
    pub adapter: u32,
    /// Its priority (`0..--priorities`), recorded with the prefixes it caches.
    pub priority: i32,
}

/// The token a request "samples" at output index `index`: a fixed function, so a multi-turn
/// follow-up can quote an earlier request's answer.
pub fn output_token(rid: u64, index: usize) -> u32 {
    (mix(rid, index as u64) % 50_000) as u32 + 1
}

/// A 64-bit mix of two values (splitmix64 finaliser).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut z = a
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(b)
        .wrapping_add(0x632B_E59B_D9B4_E019);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn draw(rng: &mut SmallRng, range: LenRange) -> usize {
    rng.gen_range(range.min..=range.max)
}

fn random_tokens(rng: &mut SmallRng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.gen_range(1..50_000)).collect()
}

/// Draws the workload described by `args`, whose size [`Args::validate`] has checked
/// ([`MAX_WORKLOAD_TOKENS`]).
pub fn generate(args: &Args) -> Vec<Job> {
    let mut rng = SmallRng::seed_from_u64(args.seed);
    let system_prompts: Vec<Vec<u32>> = (0..SYSTEM_PROMPTS)
        .map(|_| {
            let len = draw(&mut rng, args.prompt_len);
            random_tokens(&mut rng, len)
        })
        .collect();
    let mut jobs: Vec<Job> = Vec::with_capacity(args.requests);
    let mut step = 0u64;
    let mut credit = 0.0;
    for rid in 0..args.requests as u64 {
        while credit < 1.0 {
            credit += args.arrival_rate;
            step += 1;
        }
        credit -= 1.0;
        let prompt_len = draw(&mut rng, args.prompt_len);
        let output_len = draw(&mut rng, args.output_len);
        let mut prompt = Vec::with_capacity(prompt_len);
        // Drawn only with several adapters, so that one adapter keeps the workload of a seed.
        let mut adapter = match args.adapters {
            1 => 0,
            adapters => rng.gen_range(0..adapters),
        };
        // Likewise drawn only with several priorities.
        let mut priority = match args.priorities {
            1 => 0,
            priorities => rng.gen_range(0..priorities) as i32,
        };
        if rng.gen_bool(args.shared_prefix_fraction) {
            let follow_up = (rng.gen_bool(0.5) && !jobs.is_empty()).then(|| {
                let back = rng.gen_range(1..=jobs.len().min(32));
                &jobs[jobs.len() - back]
            });
            match follow_up {
                Some(parent)
                    if parent.prompt.len().saturating_add(parent.output_len)
                        < args.prompt_len.max =>
                {
                    prompt.extend_from_slice(&parent.prompt);
                    prompt.extend((0..parent.output_len).map(|i| output_token(parent.rid, i)));
                    adapter = parent.adapter;
                    priority = parent.priority;
                }
                _ => {
                    let system = &system_prompts[rng.gen_range(0..SYSTEM_PROMPTS)];
                    prompt.extend_from_slice(&system[..system.len().min(prompt_len * 3 / 4)]);
                }
            }
        }
        let own = prompt_len.saturating_sub(prompt.len()).max(1);
        prompt.extend(random_tokens(&mut rng, own));
        jobs.push(Job {
            rid,
            arrival_step: step,
            prompt,
            output_len,
            adapter,
            priority,
        });
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(flags: &[&str]) -> Vec<Job> {
        generate(&Args::from_flags(flags))
    }

    #[test]
    fn one_adapter_carries_every_request_and_several_share_them() {
        let base = jobs(&[]);
        assert!(base.iter().all(|job| job.adapter == 0));
        let spread = jobs(&["--adapters", "4"]);
        let used: std::collections::BTreeSet<u32> = spread.iter().map(|job| job.adapter).collect();
        assert_eq!(used.into_iter().collect::<Vec<_>>(), [0, 1, 2, 3]);
    }

    #[test]
    fn a_follow_up_keeps_its_conversations_adapter() {
        let jobs = jobs(&["--adapters", "8", "--shared-prefix-fraction", "1"]);
        let mut follow_ups = 0;
        for (index, job) in jobs.iter().enumerate() {
            // A follow-up quotes an earlier request's prompt and every output token.
            let parent = jobs[..index].iter().find(|parent| {
                let quoted = parent.prompt.len() + parent.output_len;
                job.prompt.len() > quoted
                    && job.prompt.starts_with(&parent.prompt)
                    && (0..parent.output_len)
                        .all(|i| job.prompt[parent.prompt.len() + i] == output_token(parent.rid, i))
            });
            if let Some(parent) = parent {
                follow_ups += 1;
                assert_eq!(job.adapter, parent.adapter, "request {}", job.rid);
                assert_eq!(job.priority, parent.priority, "request {}", job.rid);
            }
        }
        assert!(follow_ups > 20, "{follow_ups} follow-ups");
    }

    #[test]
    fn priorities_are_drawn_only_when_asked_for_and_leave_the_prompts_alone() {
        let base = jobs(&["--adapters", "8", "--shared-prefix-fraction", "1"]);
        assert!(base.iter().all(|job| job.priority == 0));
        let ranked = jobs(&[
            "--adapters",
            "8",
            "--shared-prefix-fraction",
            "1",
            "--priorities",
            "3",
        ]);
        let used: std::collections::BTreeSet<i32> = ranked.iter().map(|job| job.priority).collect();
        assert_eq!(used.into_iter().collect::<Vec<_>>(), [0, 1, 2]);
    }
}
