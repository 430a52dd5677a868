//! Rotary position embedding tables (Llama's, with Llama 3's frequency scaling), looked up per
//! token: a ragged batch gives every token its own position.

use candle_core::{Device, Tensor};

use crate::config::LlamaConfig;

/// `cos` and `sin` of every position and frequency, `[max_position_embeddings, head_dim / 2]`.
#[derive(Debug, Clone)]
pub(crate) struct RopeTables {
    cos: Tensor,
    sin: Tensor,
}

/// The inverse frequencies `theta^(-2i / head_dim)`, rescaled as Llama 3's `rope_scaling`
/// says (low frequencies divided by `factor`, a smooth blend between the two bounds).
fn inverse_frequencies(config: &LlamaConfig) -> Vec<f32> {
    let head_dim = config.head_dim();
    let plain = (0..head_dim)
        .step_by(2)
        .map(|i| 1.0 / config.rope_theta.powf(i as f32 / head_dim as f32));
    let Some(scaling) = config
        .rope_scaling
        .as_ref()
        .filter(|scaling| scaling.rope_type == "llama3")
    else {
        return plain.collect();
    };
    let original = scaling.original_max_position_embeddings as f32;
    let (low_wavelen, high_wavelen) = (
        original / scaling.low_freq_factor,
        original / scaling.high_freq_factor,
    );
    plain
        .map(|freq| {
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_wavelen {
                freq
            } else if wavelen > low_wavelen {
                freq / scaling.factor
            } else {
                let smooth = (original / wavelen - scaling.low_freq_factor)
                    / (scaling.high_freq_factor - scaling.low_freq_factor);
                (1.0 - smooth) * freq / scaling.factor + smooth * freq
            }
        })
        .collect()
}

impl RopeTables {
    /// The tables of `config`, in f32.
    pub(crate) fn new(config: &LlamaConfig) -> candle_core::Result<RopeTables> {
        let frequencies = inverse_frequencies(config);
        let positions = config.max_position_embeddings;
        let angles: Vec<f32> = (0..positions)
            .flat_map(|position| frequencies.iter().map(move |f| position as f32 * f))
            .collect();
        let angles = Tensor::from_vec(angles, (positions, frequencies.len()), &Device::Cpu)?;
        Ok(RopeTables {
            cos: angles.cos()?,
            sin: angles.sin()?,
        })
    }

    /// The rows of `positions` (a `u32` tensor, one per token): `(cos, sin)`, each `[tokens,
    /// head_dim / 2]`.
    pub(crate) fn at(&self, positions: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        Ok((
            self.cos.index_select(positions, 0)?,
            self.sin.index_select(positions, 0)?,
        ))
    }
}
