//! Paged attention: a layer's K/V is written into the pool at the step's `out_cache_loc`, then
//! every request attends over the K/V its request-to-token row names, gathered from the pool:
//! one attention per request, causal within its extend (sglang's `torch_native` backend), or,
//! when every request decodes one token, one attention over their rows padded to the longest.

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Linear, VarBuilder, linear_no_bias};

use crate::config::LlamaConfig;
use crate::forward_batch::ForwardBatch;
use crate::pool::TensorKvPool;

/// What every layer of one step shares: RoPE rows and how attention finds each request's K/V.
pub(crate) struct StepInputs<'a> {
    pub(crate) batch: &'a ForwardBatch,
    /// `cos` rows of the tokens' positions, `[tokens, head_dim / 2]`.
    pub(crate) cos: Tensor,
    /// `sin` rows, likewise.
    pub(crate) sin: Tensor,
    /// The slots to gather and how the gathered rows are attended.
    pub(crate) gather: Gather,
}

/// How a step's attention reads its K/V from the pool.
pub(crate) enum Gather {
    /// One attention per request (sglang's `torch_native`): the requests' rows back to back
    /// (a `u32` tensor of the batch's context slots), and each extend's causal mask (`None` for
    /// a single token, which sees its whole row).
    PerRequest {
        index: Tensor,
        masks: Vec<Option<Tensor>>,
    },
    /// Every request decodes one token: one attention for all of them over their rows padded
    /// to the `longest` with the padding slot 0, which the additive `mask` (`[requests, 1, 1,
    /// longest]`) hides.
    Decode {
        index: Tensor,
        mask: Tensor,
        longest: usize,
    },
}

impl Gather {
    /// The gather of `batch`: [`Gather::Decode`] when two or more requests each compute one
    /// token, [`Gather::PerRequest`] otherwise.
    pub(crate) fn new(batch: &ForwardBatch) -> candle_core::Result<Gather> {
        let seqs = batch.seqs();
        let context = batch.context_slots();
        if seqs.len() < 2 || seqs.iter().any(|seq| seq.extend.len() != 1) {
            return Ok(Gather::PerRequest {
                index: Tensor::from_slice(context, context.len(), &Device::Cpu)?,
                masks: causal_masks(batch)?,
            });
        }
        let longest = seqs.iter().map(|seq| seq.context.len()).max().unwrap_or(0);
        let mut index = Vec::with_capacity(seqs.len() * longest);
        let mut mask = Vec::with_capacity(seqs.len() * longest);
        for seq in seqs {
            let row = &context[seq.context.clone()];
            index.extend_from_slice(row);
            index.resize(index.len() + longest - row.len(), 0);
            mask.extend((0..longest).map(|key| match key < row.len() {
                true => 0.0f32,
                false => f32::NEG_INFINITY,
            }));
        }
        Ok(Gather::Decode {
            index: Tensor::from_vec(index, seqs.len() * longest, &Device::Cpu)?,
            mask: Tensor::from_vec(mask, (seqs.len(), 1, 1, longest), &Device::Cpu)?,
            longest,
        })
    }

    fn index(&self) -> &Tensor {
        match self {
            Gather::PerRequest { index, .. } | Gather::Decode { index, .. } => index,
        }
    }
}

/// The causal masks of `batch`'s requests: query `i` of an extend from position `start` sees
/// keys `0..=start + i` (additive: 0 or minus infinity); `None` for a single token.
fn causal_masks(batch: &ForwardBatch) -> candle_core::Result<Vec<Option<Tensor>>> {
    batch
        .seqs()
        .iter()
        .map(|seq| {
            let (queries, keys, start) = (seq.extend.len(), seq.context.len(), seq.start());
            if queries == 1 {
                return Ok(None);
            }
            let mask: Vec<f32> = (0..queries)
                .flat_map(|i| {
                    (0..keys).map(move |j| match j > start + i {
                        true => f32::NEG_INFINITY,
                        false => 0.0,
                    })
                })
                .collect();
            Tensor::from_vec(mask, (queries, keys), &Device::Cpu).map(Some)
        })
        .collect()
}

/// One layer's attention: the projections and the head geometry.
#[derive(Debug, Clone)]
pub(crate) struct PagedAttention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl PagedAttention {
    /// Loads `self_attn.{q,k,v,o}_proj` from `vb`.
    pub(crate) fn load(vb: VarBuilder, config: &LlamaConfig) -> candle_core::Result<Self> {
        let hidden = config.hidden_size;
        let kv_width = config.num_key_value_heads() * config.head_dim();
        Ok(PagedAttention {
            q_proj: linear_no_bias(hidden, hidden, vb.pp("q_proj"))?,
            k_proj: linear_no_bias(hidden, kv_width, vb.pp("k_proj"))?,
            v_proj: linear_no_bias(hidden, kv_width, vb.pp("v_proj"))?,
            o_proj: linear_no_bias(hidden, hidden, vb.pp("o_proj"))?,
            heads: config.num_attention_heads,
            kv_heads: config.num_key_value_heads(),
            head_dim: config.head_dim(),
        })
    }

    /// The attention output of layer `layer` for the normed hidden states `x` (`[tokens,
    /// hidden]`), after storing the step's K/V in `pool`.
    pub(crate) fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        step: &StepInputs<'_>,
        pool: &mut TensorKvPool,
    ) -> Result<Tensor, crate::error::ModelError> {
        let tokens = x.dim(0)?;
        let q = self
            .q_proj
            .forward(x)?
            .reshape((1, tokens, self.heads, self.head_dim))?;
        let k = self
            .k_proj
            .forward(x)?
            .reshape((1, tokens, self.kv_heads, self.head_dim))?;
        let v = self
            .v_proj
            .forward(x)?
            .reshape((tokens, self.kv_heads, self.head_dim))?;
        let q = candle_nn::rotary_emb::rope_thd(&q, &step.cos, &step.sin)?.squeeze(0)?;
        let k = candle_nn::rotary_emb::rope_thd(&k, &step.cos, &step.sin)?;
        // This step's K/V first: an extend attends to its own tokens through its row too.
        pool.store(layer, step.batch.out_cache_loc(), &k, &v)?;
        let (keys, values) = pool.gather(layer, step.gather.index())?;
        let (keys, values) = (keys.to_dtype(DType::F32)?, values.to_dtype(DType::F32)?);
        let y = match &step.gather {
            Gather::Decode { mask, longest, .. } => {
                self.attend_decode(&q, &keys, &values, mask, *longest)?
            }
            Gather::PerRequest { masks, .. } => {
                let outputs = step
                    .batch
                    .seqs()
                    .iter()
                    .zip(masks)
                    .map(|(seq, mask)| {
                        let q = q.narrow(0, seq.extend.start, seq.extend.len())?;
                        let k = keys.narrow(0, seq.context.start, seq.context.len())?;
                        let v = values.narrow(0, seq.context.start, seq.context.len())?;
                        self.attend(&q, &k, &v, mask.as_ref())
                    })
                    .collect::<candle_core::Result<Vec<_>>>()?;
                Tensor::cat(&outputs, 0)?
            }
        };
        Ok(self.o_proj.forward(&y.to_dtype(x.dtype())?)?)
    }

    /// One token per request, all requests in one attention: `q` `[requests, heads, d]`, `k`
    /// and `v` `[requests * longest, kv_heads, d]` (f32, each request's row padded to the
    /// `longest`), `mask` hiding the padding; `[requests, heads * d]`.
    fn attend_decode(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &Tensor,
        longest: usize,
    ) -> candle_core::Result<Tensor> {
        let requests = q.dim(0)?;
        let group = self.heads / self.kv_heads;
        let (kv, d) = (self.kv_heads, self.head_dim);
        let q = q.to_dtype(DType::F32)?.reshape((requests * kv, group, d))?;
        let k = k
            .reshape((requests, longest, kv, d))?
            .permute((0, 2, 3, 1))?
            .contiguous()?
            .reshape((requests * kv, d, longest))?;
        let v = v
            .reshape((requests, longest, kv, d))?
            .transpose(1, 2)?
            .contiguous()?
            .reshape((requests * kv, longest, d))?;
        let scores = (q.matmul(&k)? / (d as f64).sqrt())?
            .reshape((requests, kv, group, longest))?
            .broadcast_add(mask)?
            .reshape((requests * kv, group, longest))?;
        candle_nn::ops::softmax_last_dim(&scores)?
            .matmul(&v)?
            .reshape((requests, self.heads * d))
    }

    /// One request's attention: `q` `[n, heads, d]`, `k` and `v` `[keys, kv_heads, d]` (f32),
    /// grouped-query (query head `h` reads K/V head `h / (heads / kv_heads)`), scaled by
    /// `1/sqrt(d)`, masked, softmaxed; `[n, heads * d]`.
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (queries, keys) = (q.dim(0)?, k.dim(0)?);
        let group = self.heads / self.kv_heads;
        // [kv_heads, group * n, d]: the query heads of one K/V head side by side.
        let q = q
            .transpose(0, 1)?
            .contiguous()?
            .to_dtype(DType::F32)?
            .reshape((self.kv_heads, group * queries, self.head_dim))?;
        // Strided views of the gathered rows: the matmul reads them in place.
        let k = k.permute((1, 2, 0))?; // [kv_heads, d, keys]
        let v = v.transpose(0, 1)?; // [kv_heads, keys, d]
        let scores = (q.matmul(&k)? / (self.head_dim as f64).sqrt())?;
        let scores = match mask {
            None => scores,
            Some(mask) => scores
                .reshape((self.kv_heads, group, queries, keys))?
                .broadcast_add(mask)?
                .reshape((self.kv_heads, group * queries, keys))?,
        };
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        weights
            .matmul(&v)?
            .reshape((self.heads, queries, self.head_dim))?
            .transpose(0, 1)?
            .reshape((queries, self.heads * self.head_dim))
    }
}
