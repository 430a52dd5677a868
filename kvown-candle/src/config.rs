//! [`LlamaConfig`]: a Hugging Face Llama `config.json`, read with the field names
//! candle-transformers' `models::llama::LlamaConfig` reads, and checked for what [`PagedLlama`]
//! computes.
//!
//! [`PagedLlama`]: crate::PagedLlama

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::ModelError;

/// The architectures [`crate::PagedLlama`] computes, as `config.json` names them.
pub const SUPPORTED_ARCHITECTURES: [&str; 1] = ["LlamaForCausalLM"];

/// A Llama-family `config.json` (the fields candle-transformers' Llama reads, plus those that
/// tell a Llama from a look-alike it cannot compute).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// `["LlamaForCausalLM"]` for a Llama checkpoint.
    #[serde(default)]
    pub architectures: Vec<String>,
    /// `"llama"` for a Llama checkpoint.
    #[serde(default)]
    pub model_type: Option<String>,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU feed-forward layer.
    pub intermediate_size: usize,
    /// Tokens in the vocabulary (rows of the embedding and of the LM head).
    pub vocab_size: usize,
    /// Transformer blocks.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// K/V heads (grouped-query attention); the query heads' count when absent.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Per-head width, where the file states it; it must be `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f32,
    /// Llama 3's RoPE frequency scaling, when present.
    #[serde(default)]
    pub rope_scaling: Option<RopeScaling>,
    /// Positions the RoPE tables cover.
    pub max_position_embeddings: usize,
    /// Whether the LM head reuses the embedding matrix (no `lm_head.weight` tensor).
    #[serde(default)]
    pub tie_word_embeddings: Option<bool>,
    /// Beginning-of-sequence token.
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    /// End-of-sequence token(s): generation stops at any of them.
    #[serde(default)]
    pub eos_token_id: Option<EosTokens>,
    /// `"silu"` for Llama.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hidden_act: Option<String>,
    /// Biases on the attention projections (Llama has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_bias: Option<bool>,
    /// Biases on the feed-forward projections (Llama has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlp_bias: Option<bool>,
}

fn default_rope_theta() -> f32 {
    10_000.0
}

/// Llama 3's `rope_scaling` block.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RopeScaling {
    /// `"llama3"` (scaled) or `"default"` (unscaled); older checkpoints' `"linear"` and
    /// `"dynamic"` are refused.
    #[serde(alias = "type")]
    pub rope_type: String,
    /// Wavelength factor for the low frequencies.
    #[serde(default)]
    pub factor: f32,
    /// Low-frequency bound of the smooth interpolation.
    #[serde(default)]
    pub low_freq_factor: f32,
    /// High-frequency bound of the smooth interpolation.
    #[serde(default)]
    pub high_freq_factor: f32,
    /// The context the unscaled model was trained for.
    #[serde(default)]
    pub original_max_position_embeddings: usize,
}

/// `eos_token_id`: one token or several.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EosTokens {
    /// One end-of-sequence token.
    One(u32),
    /// Several; any of them ends a sequence.
    Many(Vec<u32>),
}

impl LlamaConfig {
    /// Reads and checks `path` (a `config.json`).
    ///
    /// # Errors
    /// [`ModelError::Io`] when it cannot be read, [`ModelError::ConfigParse`] when it is not a
    /// Llama config's JSON, [`ModelError::UnsupportedArchitecture`] when it names another
    /// architecture, [`ModelError::InvalidConfig`] when its sizes do not make a Llama
    /// ([`LlamaConfig::validate`]); each names the file.
    pub fn from_file(path: &Path) -> Result<LlamaConfig, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|source| ModelError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let config: LlamaConfig =
            serde_json::from_str(&text).map_err(|source| ModelError::ConfigParse {
                path: path.to_path_buf(),
                source,
            })?;
        config.validate(path)?;
        Ok(config)
    }

    /// Checks that the config describes a Llama that [`crate::PagedLlama`] computes; `path`
    /// names the file in the error.
    ///
    /// # Errors
    /// [`ModelError::UnsupportedArchitecture`] for another `architectures` / `model_type`
    /// (Mistral, Qwen2, ...: their attention differs), an activation other than SiLU, or
    /// biases; [`ModelError::InvalidConfig`] for a zero size, heads that do not divide the
    /// hidden size or the K/V heads, an odd head width, a `head_dim` other than
    /// `hidden_size / num_attention_heads`, or a RoPE scaling other than Llama 3's.
    pub fn validate(&self, path: &Path) -> Result<(), ModelError> {
        let unsupported = |found: String| ModelError::UnsupportedArchitecture {
            path: path.to_path_buf(),
            found,
        };
        if let Some(other) = self
            .architectures
            .iter()
            .find(|name| !SUPPORTED_ARCHITECTURES.contains(&name.as_str()))
        {
            return Err(unsupported(format!("architecture {other:?}")));
        }
        if let Some(kind) = self.model_type.as_deref().filter(|kind| *kind != "llama") {
            return Err(unsupported(format!("model_type {kind:?}")));
        }
        if let Some(act) = self.hidden_act.as_deref().filter(|act| *act != "silu") {
            return Err(unsupported(format!("hidden_act {act:?} (Llama uses silu)")));
        }
        if self.attention_bias == Some(true) || self.mlp_bias == Some(true) {
            return Err(unsupported("projection biases (Llama has none)".into()));
        }
        let invalid = |reason: String| ModelError::InvalidConfig {
            path: path.to_path_buf(),
            reason,
        };
        for (name, value) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("vocab_size", self.vocab_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads()),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if value == 0 {
                return Err(invalid(format!("{name} is 0")));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(invalid(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            )));
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads())
        {
            return Err(invalid(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.num_key_value_heads()
            )));
        }
        let head_dim = self.hidden_size / self.num_attention_heads;
        if !head_dim.is_multiple_of(2) {
            return Err(invalid(format!(
                "the head width {head_dim} is odd: RoPE rotates pairs"
            )));
        }
        if let Some(stated) = self.head_dim.filter(|&stated| stated != head_dim) {
            return Err(invalid(format!(
                "head_dim {stated} differs from hidden_size / num_attention_heads = {head_dim}"
            )));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(invalid(format!(
                "rms_norm_eps {} is not positive",
                self.rms_norm_eps
            )));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 1.0) {
            return Err(invalid(format!(
                "rope_theta {} is not above 1",
                self.rope_theta
            )));
        }
        if let Some(scaling) = &self.rope_scaling {
            match scaling.rope_type.as_str() {
                "default" => {}
                "llama3" => {
                    let positive = [
                        scaling.factor,
                        scaling.low_freq_factor,
                        scaling.high_freq_factor,
                    ]
                    .iter()
                    .all(|x| x.is_finite() && *x > 0.0);
                    if !positive
                        || scaling.high_freq_factor <= scaling.low_freq_factor
                        || scaling.original_max_position_embeddings == 0
                    {
                        return Err(invalid(format!(
                            "rope_scaling {scaling:?}: llama3 needs positive factors, \
                             high_freq_factor above low_freq_factor and a positive \
                             original_max_position_embeddings"
                        )));
                    }
                }
                other => {
                    return Err(invalid(format!(
                        "rope_scaling type {other:?}: only \"llama3\" and \"default\" are supported"
                    )));
                }
            }
        }
        Ok(())
    }

    /// K/V heads per token.
    pub fn num_key_value_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Whether the LM head is the embedding matrix.
    pub fn tied_embeddings(&self) -> bool {
        self.tie_word_embeddings.unwrap_or(false)
    }

    /// The end-of-sequence tokens (none when the config names none).
    pub fn eos_tokens(&self) -> Vec<u32> {
        match &self.eos_token_id {
            None => Vec::new(),
            Some(EosTokens::One(token)) => vec![*token],
            Some(EosTokens::Many(tokens)) => tokens.clone(),
        }
    }

    /// Parameters of the model this config describes (embedding, blocks, final norm, and the
    /// LM head unless tied).
    pub fn parameter_count(&self) -> usize {
        let (hidden, kv) = (
            self.hidden_size,
            self.num_key_value_heads() * self.head_dim(),
        );
        let attention = 2 * hidden * hidden + 2 * hidden * kv;
        let mlp = 3 * hidden * self.intermediate_size;
        let block = attention + mlp + 2 * hidden;
        let head = if self.tied_embeddings() {
            0
        } else {
            self.vocab_size * hidden
        };
        self.vocab_size * hidden + self.num_hidden_layers * block + hidden + head
    }
}
