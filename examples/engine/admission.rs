//! sglang's estimate of the running requests' future growth, for `--admission ratio`.
//!
//! sglang's `PrefillAdder` (`python/sglang/srt/managers/schedule_policy.py`) takes from the
//! available and evictable tokens, for each running request, `min(max_new_tokens - generated,
//! CLIP_MAX_NEW_TOKENS) * new_token_ratio`, and for each request it admits the extend plus
//! `min(max_new_tokens, CLIP_MAX_NEW_TOKENS)`, not discounted. The scheduler
//! (`python/sglang/srt/managers/scheduler.py`) lowers `new_token_ratio` linearly every decode
//! step that fits, raises it after a retraction to an estimate from the requests still running
//! (`ScheduleBatch.retract_decode`), and puts it back to its initial value when idle.

/// Longest remaining output an estimate counts (sglang `SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`).
pub const CLIP_MAX_NEW_TOKENS: usize = 4096;

/// Decode steps each running request is granted in the estimate after a retraction (sglang
/// `SGLANG_RETRACT_DECODE_STEPS`).
pub const RETRACT_DECODE_STEPS: usize = 20;

/// sglang's `new_token_ratio`: the share of its remaining output a running request is expected
/// to still decode.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTokenRatio {
    init: f64,
    min: f64,
    decay: f64,
    current: f64,
}

impl NewTokenRatio {
    /// Starts at `init` and decays to `init * min_factor` over `decay_steps` decode steps.
    pub fn new(init: f64, min_factor: f64, decay_steps: u64) -> Self {
        let min = init * min_factor;
        NewTokenRatio {
            init,
            min,
            decay: (init - min) / decay_steps as f64,
            current: init,
        }
    }

    /// The ratio now.
    #[cfg(test)]
    pub fn current(&self) -> f64 {
        self.current
    }

    /// A decode step that fit: one step of the linear decay, never below the minimum.
    pub fn decay(&mut self) {
        self.current = (self.current - self.decay).max(self.min);
    }

    /// An idle step: back to the initial ratio.
    pub fn reset(&mut self) {
        self.current = self.init;
    }

    /// After a retraction: `(outputs decoded + RETRACT_DECODE_STEPS per request) / (outputs in
    /// all + 1)` over the requests still running, given as `(decoded, output_len)`, at most 1.
    /// With none left, the initial ratio.
    pub fn after_retraction(&mut self, running: impl IntoIterator<Item = (usize, usize)>) {
        let (mut decoded, mut outputs, mut requests) = (0, 0, 0);
        for (done, total) in running {
            decoded += done;
            outputs += total;
            requests += 1;
        }
        self.current = if requests == 0 {
            self.init
        } else {
            let expected = decoded + RETRACT_DECODE_STEPS * requests;
            (expected as f64 / (outputs + 1) as f64).min(1.0)
        };
    }

    /// Tokens the running requests, given by their remaining outputs, are expected to still
    /// need: the sum of `min(remaining, CLIP_MAX_NEW_TOKENS) * ratio`, rounded up.
    pub fn running_growth(&self, remaining: impl IntoIterator<Item = usize>) -> usize {
        let tokens: f64 = remaining
            .into_iter()
            .map(|rest| rest.min(CLIP_MAX_NEW_TOKENS) as f64 * self.current)
            .sum();
        tokens.ceil() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_decays_linearly_to_its_minimum_and_stays_there() {
        let mut ratio = NewTokenRatio::new(0.7, 0.14, 600);
        assert_eq!(ratio.current(), 0.7);
        ratio.decay();
        assert!((ratio.current() - (0.7 - 0.7 * 0.86 / 600.0)).abs() < 1e-12);
        for _ in 1..300 {
            ratio.decay();
        }
        let halfway = 0.7 - 0.7 * 0.86 / 2.0;
        assert!((ratio.current() - halfway).abs() < 1e-9, "{ratio:?}");
        for _ in 0..299 {
            ratio.decay();
        }
        assert!(
            ratio.current() > 0.7 * 0.14,
            "one step short of the minimum"
        );
        ratio.decay();
        assert!((ratio.current() - 0.7 * 0.14).abs() < 1e-9, "{ratio:?}");
        for _ in 0..1000 {
            ratio.decay();
        }
        assert_eq!(ratio.current(), 0.7 * 0.14);
        ratio.reset();
        assert_eq!(ratio.current(), 0.7);
    }

    #[test]
    fn a_retraction_sets_the_ratio_from_the_requests_still_running() {
        let mut ratio = NewTokenRatio::new(0.7, 0.14, 600);
        for _ in 0..600 {
            ratio.decay();
        }
        // 100 + 50 decoded, 2 x 20 steps of headroom, over 400 + 600 outputs (+ 1).
        ratio.after_retraction([(100, 400), (50, 600)]);
        assert!(
            (ratio.current() - 190.0 / 1001.0).abs() < 1e-12,
            "{ratio:?}"
        );
        // Near their ends the estimate passes 1 and is capped.
        ratio.after_retraction([(30, 40), (10, 16)]);
        assert_eq!(ratio.current(), 1.0);
        // The decay resumes from the estimate, not from the initial ratio.
        ratio.decay();
        assert!((ratio.current() - (1.0 - 0.7 * 0.86 / 600.0)).abs() < 1e-12);
        ratio.after_retraction([]);
        assert_eq!(ratio.current(), 0.7);
    }

    #[test]
    fn running_growth_discounts_and_clips_the_remaining_outputs() {
        let ratio = NewTokenRatio::new(0.5, 0.14, 600);
        // 0.5 x (3 + 10 + 4096), rounded up.
        assert_eq!(ratio.running_growth([3, 10, 10_000]), 2055);
        assert_eq!(ratio.running_growth([]), 0);
    }
}
