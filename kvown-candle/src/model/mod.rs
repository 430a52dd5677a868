//! [`PagedLlama`]: a Llama-architecture transformer (RMSNorm, RoPE, grouped-query attention,
//! SwiGLU) that computes a ragged [`ForwardBatch`] and reads and writes its K/V only through a
//! [`TensorKvPool`] and the batch's request-to-token rows.

mod attention;
mod checkpoint;
mod rope;

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, Linear, RmsNorm, VarBuilder};
use kvown_runtime::kv::{KvDtype, KvLayout, KvPool, KvPoolError};

pub use checkpoint::expected_tensors;

use crate::config::LlamaConfig;
use crate::error::{BatchError, ModelError};
use crate::forward_batch::{ForwardBatch, LogitRows};
use crate::pool::TensorKvPool;
use attention::{Gather, PagedAttention, StepInputs};
use checkpoint::Weights;
use rope::RopeTables;

/// One transformer block.
#[derive(Debug, Clone)]
struct Block {
    input_norm: RmsNorm,
    attention: PagedAttention,
    post_norm: RmsNorm,
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Block {
    fn load(vb: VarBuilder, config: &LlamaConfig) -> candle_core::Result<Block> {
        let (hidden, inner) = (config.hidden_size, config.intermediate_size);
        let eps = config.rms_norm_eps;
        let mlp = vb.pp("mlp");
        Ok(Block {
            input_norm: candle_nn::rms_norm(hidden, eps, vb.pp("input_layernorm"))?,
            attention: PagedAttention::load(vb.pp("self_attn"), config)?,
            post_norm: candle_nn::rms_norm(hidden, eps, vb.pp("post_attention_layernorm"))?,
            gate_proj: candle_nn::linear_no_bias(hidden, inner, mlp.pp("gate_proj"))?,
            up_proj: candle_nn::linear_no_bias(hidden, inner, mlp.pp("up_proj"))?,
            down_proj: candle_nn::linear_no_bias(inner, hidden, mlp.pp("down_proj"))?,
        })
    }

    fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        step: &StepInputs<'_>,
        pool: &mut TensorKvPool,
    ) -> Result<Tensor, ModelError> {
        let attended = self
            .attention
            .forward(&self.input_norm.forward(x)?, layer, step, pool)?;
        let x = (attended + x)?;
        let h = self.post_norm.forward(&x)?;
        let gated =
            (candle_nn::ops::silu(&self.gate_proj.forward(&h)?)? * self.up_proj.forward(&h)?)?;
        Ok((self.down_proj.forward(&gated)? + x)?)
    }
}

/// Logits of one step: the rows each request asked for ([`LogitRows`]), in request order.
#[derive(Debug, Clone, PartialEq)]
pub struct Logits {
    vocab: usize,
    values: Vec<f32>,
    /// Per request, its rows' range.
    rows: Vec<Range<usize>>,
}

impl Logits {
    /// The logits rows of request `seq` (its index in the batch): one for
    /// [`LogitRows::Last`], one per new token for [`LogitRows::All`].
    pub fn rows(&self, seq: usize) -> std::slice::ChunksExact<'_, f32> {
        let rows = &self.rows[seq];
        self.values[rows.start * self.vocab..rows.end * self.vocab].chunks_exact(self.vocab)
    }

    /// The last row of request `seq`.
    pub fn last(&self, seq: usize) -> &[f32] {
        let end = self.rows[seq].end * self.vocab;
        &self.values[end - self.vocab..end]
    }

    /// Requests in the step.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether the step had no request.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }
}

/// A Llama whose attention reads and writes K/V through kvown: weights in f32 (a checkpoint's
/// f16 or bf16 weights are widened at load), K/V in a [`TensorKvPool`] of any of kvown's
/// dtypes. Immutable once loaded: one model serves any number of pools.
#[derive(Debug, Clone)]
pub struct PagedLlama {
    config: LlamaConfig,
    embed_tokens: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    rope: RopeTables,
}

impl PagedLlama {
    /// Loads a Hugging Face Llama checkpoint directory: `config.json` and every
    /// `*.safetensors` file.
    ///
    /// # Errors
    /// Typed errors that name the file or tensor at fault ([`ModelError`]): an unreadable or
    /// unsupported config, no weights, an unreadable weights file, a tensor missing, repeated
    /// or of the wrong shape. Everything is checked before the model is built.
    pub fn load(dir: &Path) -> Result<PagedLlama, ModelError> {
        let config = LlamaConfig::from_file(&dir.join("config.json"))?;
        let files = checkpoint::weight_files(dir)?;
        PagedLlama::from_weights(config, Weights::read(&files)?)
    }

    /// Loads the model `config` describes from `files` (safetensors).
    ///
    /// # Errors
    /// As [`PagedLlama::load`], less the config file's.
    pub fn from_files(config: LlamaConfig, files: &[PathBuf]) -> Result<PagedLlama, ModelError> {
        PagedLlama::from_weights(config, Weights::read(files)?)
    }

    /// The model `config` describes from tensors in memory (named as in a checkpoint; errors
    /// name `source` as their file).
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`], [`ModelError::TensorShape`].
    pub fn from_tensors(
        config: LlamaConfig,
        tensors: HashMap<String, Tensor>,
        source: &Path,
    ) -> Result<PagedLlama, ModelError> {
        config.validate(source)?;
        PagedLlama::from_weights(config, Weights::in_memory(tensors, source))
    }

    fn from_weights(config: LlamaConfig, weights: Weights) -> Result<PagedLlama, ModelError> {
        weights.check(&config)?;
        let vb = VarBuilder::from_tensors(weights.tensors, DType::F32, &Device::Cpu);
        let embed_tokens = candle_nn::embedding(
            config.vocab_size,
            config.hidden_size,
            vb.pp("model.embed_tokens"),
        )?;
        let lm_head = match config.tied_embeddings() {
            true => Linear::new(embed_tokens.embeddings().clone(), None),
            false => {
                candle_nn::linear_no_bias(config.hidden_size, config.vocab_size, vb.pp("lm_head"))?
            }
        };
        let blocks = (0..config.num_hidden_layers)
            .map(|layer| Block::load(vb.pp(format!("model.layers.{layer}")), &config))
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(PagedLlama {
            norm: candle_nn::rms_norm(
                config.hidden_size,
                config.rms_norm_eps,
                vb.pp("model.norm"),
            )?,
            rope: RopeTables::new(&config)?,
            embed_tokens,
            blocks,
            lm_head,
            config,
        })
    }

    /// The config the model was loaded with.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The pool layout this model's K/V needs: its layers, K/V heads and head width, for
    /// `capacity` slots in pages of `page_size`.
    pub fn kv_layout(&self, capacity: usize, page_size: usize) -> Result<KvLayout, KvPoolError> {
        KvLayout::new(
            self.config.num_hidden_layers,
            self.config.num_key_value_heads(),
            self.config.head_dim(),
            capacity,
            page_size,
        )
    }

    /// A zeroed pool for this model's K/V ([`PagedLlama::kv_layout`]) of `dtype`.
    pub fn new_pool(
        &self,
        capacity: usize,
        page_size: usize,
        dtype: KvDtype,
    ) -> Result<TensorKvPool, KvPoolError> {
        TensorKvPool::new(self.kv_layout(capacity, page_size)?, dtype)
    }

    /// Computes one step: every request's new tokens, their K/V stored at the batch's
    /// `out_cache_loc` in `pool`, attention over the K/V each request's row names; returns the
    /// logits each request asked for.
    ///
    /// # Errors
    /// [`ModelError::Batch`] before anything is computed or stored when the pool does not fit
    /// the model, or a token, position or slot is out of range.
    pub fn forward(
        &self,
        batch: &ForwardBatch,
        pool: &mut TensorKvPool,
    ) -> Result<Logits, ModelError> {
        self.check(batch, pool)?;
        if batch.is_empty() {
            return Ok(Logits {
                vocab: self.config.vocab_size,
                values: Vec::new(),
                rows: Vec::new(),
            });
        }
        let device = Device::Cpu;
        let tokens = Tensor::from_slice(batch.tokens(), batch.tokens().len(), &device)?;
        let positions = Tensor::from_slice(batch.positions(), batch.positions().len(), &device)?;
        let (cos, sin) = self.rope.at(&positions)?;
        let step = StepInputs {
            batch,
            cos,
            sin,
            gather: Gather::new(batch)?,
        };
        let mut x = self.embed_tokens.forward(&tokens)?;
        for (layer, block) in self.blocks.iter().enumerate() {
            x = block.forward(&x, layer, &step, pool)?;
        }
        let wanted = batch.logit_rows();
        let x = x.index_select(&Tensor::from_slice(&wanted, wanted.len(), &device)?, 0)?;
        let logits = self
            .lm_head
            .forward(&self.norm.forward(&x)?)?
            .to_dtype(DType::F32)?;
        let mut rows = Vec::with_capacity(batch.seqs().len());
        let mut next = 0;
        for seq in batch.seqs() {
            let count = match seq.logits {
                LogitRows::Last => 1,
                LogitRows::All => seq.extend.len(),
            };
            rows.push(next..next + count);
            next += count;
        }
        Ok(Logits {
            vocab: self.config.vocab_size,
            values: logits.flatten_all()?.to_vec1()?,
            rows,
        })
    }

    /// Everything [`PagedLlama::forward`] refuses, checked before it computes.
    fn check(&self, batch: &ForwardBatch, pool: &TensorKvPool) -> Result<(), BatchError> {
        let layout = pool.layout();
        let expected = (
            self.config.num_hidden_layers,
            self.config.num_key_value_heads(),
            self.config.head_dim(),
            self.config.head_dim(),
        );
        let found = (
            layout.layers(),
            layout.kv_heads(),
            layout.head_dim(),
            layout.v_head_dim(),
        );
        if expected != found {
            return Err(BatchError::PoolMismatch {
                detail: format!(
                    "(layers, kv heads, head dim, v head dim): the model needs {expected:?}, \
                     the pool has {found:?}"
                ),
            });
        }
        let vocab = self.config.vocab_size;
        let max_positions = self.config.max_position_embeddings;
        for seq in batch.seqs() {
            let rid = seq.rid;
            let tokens = &batch.tokens()[seq.extend.clone()];
            if let Some(&token) = tokens.iter().find(|&&token| token as usize >= vocab) {
                return Err(BatchError::TokenOutOfVocab { rid, token, vocab });
            }
            if seq.context.len() > max_positions {
                return Err(BatchError::PositionPastModel {
                    rid,
                    position: max_positions.max(seq.start()),
                    max_positions,
                });
            }
            let out = &batch.out_cache_loc()[seq.extend.clone()];
            let context = &batch.context_slots()[seq.context.clone()];
            if let Some(&slot) = out
                .iter()
                .chain(context)
                .find(|&&slot| slot as usize >= layout.slots())
            {
                return Err(BatchError::SlotOutOfRange {
                    rid,
                    slot,
                    slots: layout.slots(),
                });
            }
        }
        Ok(())
    }
}
