//! Llama checkpoints with deterministic random weights: the embedded tiny default (written to
//! safetensors and loaded back through the real loader) and a ~100M-parameter shape for the
//! bench. Nothing is downloaded.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::config::LlamaConfig;
use crate::error::ModelError;
use crate::model::expected_tensors;

/// A Llama config with the given sizes and Llama's defaults elsewhere (RoPE base 10,000,
/// RMSNorm epsilon 1e-5, no RoPE scaling, untied LM head unless `tied`).
#[allow(
    clippy::too_many_arguments,
    reason = "one argument per size of a Llama"
)]
pub fn llama_config(
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: usize,
    max_position_embeddings: usize,
    tied: bool,
) -> LlamaConfig {
    LlamaConfig {
        architectures: vec!["LlamaForCausalLM".into()],
        model_type: Some("llama".into()),
        hidden_size,
        intermediate_size,
        vocab_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads: Some(num_key_value_heads),
        head_dim: None,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        rope_scaling: None,
        max_position_embeddings,
        tie_word_embeddings: Some(tied),
        bos_token_id: None,
        eos_token_id: None,
        hidden_act: Some("silu".into()),
        attention_bias: Some(false),
        mlp_bias: Some(false),
    }
}

/// The embedded default: 2 layers, hidden 64, 4 query heads over 2 K/V heads (GQA), a SwiGLU
/// of 128, a vocabulary of 256 and 512 positions (about 100k parameters).
pub fn tiny_config() -> LlamaConfig {
    llama_config(256, 64, 128, 2, 4, 2, 512, false)
}

/// A ~100M-parameter Llama shape (12 layers, hidden 768, 12 query heads over 4 K/V heads, a
/// SwiGLU of 2048, a 32,000-token vocabulary, tied embeddings), for the bench.
pub fn llama_100m_config() -> LlamaConfig {
    llama_config(32_000, 768, 2048, 12, 12, 4, 2048, true)
}

/// Deterministic random weights for `config` from `seed`, named as a checkpoint's: each
/// matrix uniform with unit variance gain (`±sqrt(3 / fan_in)`), the embedding uniform in
/// `±1`, each norm's gain `1 ± 0.1`.
pub fn random_weights(
    config: &LlamaConfig,
    seed: u64,
) -> Result<HashMap<String, Tensor>, ModelError> {
    let mut rng = SmallRng::seed_from_u64(seed);
    expected_tensors(config)
        .into_iter()
        .map(|(name, shape)| {
            let len: usize = shape.iter().product();
            let values: Vec<f32> = match shape.as_slice() {
                [_] => (0..len).map(|_| 1.0 + rng.gen_range(-0.1..0.1)).collect(),
                _ if name == "model.embed_tokens.weight" => {
                    (0..len).map(|_| rng.gen_range(-1.0..1.0)).collect()
                }
                [_, fan_in] => {
                    let bound = (3.0 / *fan_in as f32).sqrt();
                    (0..len).map(|_| rng.gen_range(-bound..bound)).collect()
                }
                _ => unreachable!("Llama tensors are vectors and matrices"),
            };
            let tensor = Tensor::from_vec(values, shape, &Device::Cpu)?;
            Ok((name, tensor))
        })
        .collect()
}

/// Writes a checkpoint of `config` with [`random_weights`] into `dir` (created if needed):
/// `config.json` and `model.safetensors`, as a Hugging Face checkpoint has them.
pub fn write_random_checkpoint(
    dir: &Path,
    config: &LlamaConfig,
    seed: u64,
) -> Result<(), ModelError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| ModelError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let config_path = dir.join("config.json");
    let json = serde_json::to_string_pretty(config).expect("a config serializes");
    std::fs::write(&config_path, json).map_err(io(&config_path))?;
    let weights_path = dir.join("model.safetensors");
    candle_core::safetensors::save(&random_weights(config, seed)?, &weights_path).map_err(
        |source| ModelError::Safetensors {
            path: weights_path.clone(),
            source,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shapes_have_the_parameters_they_promise() {
        assert!((90_000..110_000).contains(&tiny_config().parameter_count()));
        let big = llama_100m_config().parameter_count();
        assert!((95_000_000..105_000_000).contains(&big), "{big}");
    }

    #[test]
    fn random_weights_repeat_for_a_seed() {
        let config = tiny_config();
        let (a, b) = (
            random_weights(&config, 7).unwrap(),
            random_weights(&config, 7).unwrap(),
        );
        let c = random_weights(&config, 8).unwrap();
        let flat = |weights: &HashMap<String, Tensor>| -> Vec<f32> {
            weights["model.layers.1.mlp.up_proj.weight"]
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        assert_eq!(flat(&a), flat(&b));
        assert_ne!(flat(&a), flat(&c));
    }
}
