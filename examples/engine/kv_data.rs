//! Synthetic K/V data through a [`KvPool`]: each stored row is a function of (adapter, token,
//! position, layer), so a sample read back by `load_kv` through a request's row proves that the
//! slot the allocator, the table and the prefix cache agree on holds that token's K/V, computed
//! with the request's own adapter (a prefix reused across adapters would read another's).

use half::f16;
use kvown::alloc::KvSlot;
use kvown::batch::ScheduleBatch;
use kvown::kv::{self, KvData, KvDtype, KvLayout, KvPool, KvSlice};
use kvown::radix::Namespace;

use crate::workload::mix;

/// Layers of the synthetic model.
pub const LAYERS: usize = 2;
/// KV heads of the synthetic model.
pub const KV_HEADS: usize = 2;
/// Head dimension of the synthetic model.
pub const HEAD_DIM: usize = 64;
/// Element type of the K/V buffers.
pub const DTYPE: KvDtype = KvDtype::F16;
/// Bytes of one slot's K/V: every layer's K and V row.
pub const SLOT_BYTES: usize = LAYERS * 2 * KV_HEADS * HEAD_DIM * DTYPE.size_bytes();

/// The pool layout for `pool_tokens` slots of pages of `page_size`.
pub fn layout(pool_tokens: usize, page_size: usize) -> Result<KvLayout, String> {
    let capacity = pool_tokens / page_size * page_size;
    KvLayout::new(LAYERS, KV_HEADS, HEAD_DIM, capacity, page_size).map_err(|e| e.to_string())
}

/// One token to store: its slot, its id, its position and its request's adapter.
#[derive(Debug, Clone, Copy)]
pub struct TokenKv {
    /// Where its K/V goes.
    pub slot: KvSlot,
    /// The request's adapter (prefix-cache namespace): its K/V differs from another's.
    pub adapter: Namespace,
    /// Token id.
    pub token: u32,
    /// Position in its request.
    pub position: usize,
}

/// The tokens an extend batch computed, in `out_cache_loc` order: what to store.
pub fn extended_tokens(batch: &ScheduleBatch) -> Vec<TokenKv> {
    let mut stores = Vec::with_capacity(batch.out_cache_loc().len());
    let mut slots = batch.out_cache_loc().iter();
    for (req, positions) in batch.out_positions() {
        for position in positions {
            stores.push(TokenKv {
                slot: *slots.next().expect("one slot per extended token"),
                adapter: req.namespace(),
                token: req.fill_ids()[position],
                position,
            });
        }
    }
    stores
}

/// The KV pool and reusable row buffers.
pub struct KvStore {
    pool: Box<dyn KvPool>,
    k: Vec<f16>,
    v: Vec<f16>,
    /// Rows stored so far.
    pub rows_stored: u64,
    /// Samples read back and verified.
    pub samples_verified: u64,
}

fn push_row(out: &mut Vec<f16>, t: &TokenKv, layer: usize, tensor: u64) {
    let seed = mix(
        u64::from(t.token) << 32 | t.position as u64,
        u64::from(t.adapter.0) << 32 | (layer as u64) << 1 | tensor,
    );
    let base = (seed % 1024) as f32;
    out.extend((0..KV_HEADS * HEAD_DIM).map(|i| f16::from_f32((base + i as f32) / 8.0)));
}

impl KvStore {
    /// Wraps `pool`.
    pub fn new(pool: Box<dyn KvPool>) -> Self {
        KvStore {
            pool,
            k: Vec::new(),
            v: Vec::new(),
            rows_stored: 0,
            samples_verified: 0,
        }
    }

    /// Stores the synthetic K/V of `tokens` in every layer.
    pub fn store(&mut self, tokens: &[TokenKv]) -> Result<(), String> {
        if tokens.is_empty() {
            return Ok(());
        }
        let slots: Vec<KvSlot> = tokens.iter().map(|t| t.slot).collect();
        for layer in 0..LAYERS {
            self.k.clear();
            self.v.clear();
            for t in tokens {
                push_row(&mut self.k, t, layer, 0);
                push_row(&mut self.v, t, layer, 1);
            }
            self.pool
                .store_kv(layer, &slots, KvSlice::F16(&self.k), KvSlice::F16(&self.v))
                .map_err(|e| format!("store_kv layer {layer}: {e}"))?;
        }
        self.rows_stored += tokens.len() as u64;
        Ok(())
    }

    /// [`kv::digest`] of `slots`: equal on two nodes exactly when they hold the same bytes there
    /// (both processes run this binary).
    pub fn digest(&self, slots: &[KvSlot]) -> Result<u64, String> {
        kv::digest(self.pool.as_ref(), slots)
            .map_err(|e| format!("digest of {} rows: {e}", slots.len()))
    }

    /// Reads `sample` back in every layer and compares it with what was stored for it.
    pub fn verify(&mut self, sample: TokenKv) -> Result<(), String> {
        for layer in 0..LAYERS {
            let (k, v) = self
                .pool
                .load_kv(layer, &[sample.slot])
                .map_err(|e| format!("load_kv layer {layer}: {e}"))?;
            let (mut want_k, mut want_v) = (Vec::new(), Vec::new());
            push_row(&mut want_k, &sample, layer, 0);
            push_row(&mut want_v, &sample, layer, 1);
            if k != KvData::F16(want_k) || v != KvData::F16(want_v) {
                return Err(format!(
                    "K/V mismatch at slot {} (token {} at position {}, layer {layer}, {})",
                    sample.slot, sample.token, sample.position, sample.adapter
                ));
            }
        }
        self.samples_verified += 1;
        Ok(())
    }
}
