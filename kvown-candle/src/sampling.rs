//! Choosing the next token from a row of logits: greedy, or temperature sampling seeded per
//! request and position, so a token does not depend on which batch computed it.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How the server picks each token.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Sampling {
    /// The highest logit (the first of equals).
    #[default]
    Greedy,
    /// A draw from `softmax(logits / temperature)`, with a generator seeded from `seed`, the
    /// request and the position: the same request gets the same tokens however it is batched,
    /// retracted or speculated.
    Temperature {
        /// Above 0: lower is closer to greedy.
        temperature: f32,
        /// The run's seed.
        seed: u64,
    },
}

/// The index of the highest logit (the first of equals; NaN never wins).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (index, &value) in logits.iter().enumerate() {
        if value > logits[best] || logits[best].is_nan() {
            best = index;
        }
    }
    best as u32
}

impl Sampling {
    /// The token that follows `logits`, the logits after position `position` of request `rid`.
    pub fn sample(&self, logits: &[f32], rid: u64, position: usize) -> u32 {
        match *self {
            Sampling::Greedy => argmax(logits),
            Sampling::Temperature { temperature, seed } => {
                let stream = seed
                    ^ rid.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                    ^ (position as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
                let mut rng = SmallRng::seed_from_u64(stream);
                let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f64> = logits
                    .iter()
                    .map(|&logit| (f64::from(logit - top) / f64::from(temperature)).exp())
                    .collect();
                let total: f64 = weights.iter().sum();
                let mut draw = rng.gen_range(0.0..total);
                for (index, weight) in weights.iter().enumerate() {
                    if draw < *weight {
                        return index as u32;
                    }
                    draw -= weight;
                }
                argmax(logits)
            }
        }
    }

    /// Checks the temperature: a positive, finite number.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Sampling::Temperature { temperature, .. }
                if !(temperature.is_finite() && temperature > 0.0) =>
            {
                Err(format!(
                    "temperature {temperature} must be positive and finite"
                ))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_first_highest() {
        assert_eq!(argmax(&[0.5, 2.0, 2.0, -1.0]), 1);
        assert_eq!(Sampling::Greedy.sample(&[f32::NAN, 1.0], 0, 0), 1);
    }

    #[test]
    fn temperature_sampling_repeats_per_request_and_position() {
        let sampling = Sampling::Temperature {
            temperature: 1.0,
            seed: 3,
        };
        let logits = [0.1f32, 0.3, 0.2, 0.25];
        let draws: Vec<u32> = (0..64).map(|p| sampling.sample(&logits, 9, p)).collect();
        let again: Vec<u32> = (0..64).map(|p| sampling.sample(&logits, 9, p)).collect();
        assert_eq!(draws, again);
        // Flat logits: every token is drawn somewhere in 64 positions.
        assert!((0..4).all(|token| draws.contains(&token)));
        // A very low temperature is greedy.
        let cold = Sampling::Temperature {
            temperature: 1e-4,
            seed: 3,
        };
        assert!((0..16).all(|p| cold.sample(&logits, 9, p) == 1));
        assert!(
            Sampling::Temperature {
                temperature: 0.0,
                seed: 0
            }
            .validate()
            .is_err()
        );
    }
}
