//! A node of the tests: a NIXL agent, kvown's cache (paged allocator, radix cache) and a
//! registered K/V pool, with a toy model whose K/V rows are a function of the tokens before them
//! and whose next token is a hash of every K/V byte of the request. A wrong byte anywhere in a
//! transferred row therefore changes the tokens that follow.

use std::ops::Range;

use kvown_nixl::{Agent, AgentOptions, NixlError, PeerMetadata, RegisteredPool};
use kvown_runtime::alloc::{KvAllocator, KvSlot, PagedAllocator};
use kvown_runtime::batch::{
    Req, ScheduleBatch, alloc_for_decode, alloc_for_extend, init_next_round_input,
    prepare_for_decode, prepare_for_extend, release_kv_cache,
};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::kv::{self, KvDtype, KvLayout, KvPool, KvSlice};
use kvown_runtime::radix::{RadixCache, RadixConfig, TreePos};
use kvown_runtime::slots::ReqToTokenPool;

/// Layers of the toy model.
pub const LAYERS: usize = 2;
/// K/V heads.
const KV_HEADS: usize = 2;
/// Head dimension.
const HEAD_DIM: usize = 8;
/// Slots per page.
pub const PAGE_SIZE: usize = 4;
/// Request rows.
const ROWS: usize = 8;
/// Positions per row.
pub const WIDTH: usize = 256;

/// The geometry of a node.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    /// Pages in the pool.
    pub pages: usize,
}

/// The tests' K/V layout: `LAYERS` layers of `KV_HEADS` heads of `HEAD_DIM`, `slots` slots in
/// pages of `PAGE_SIZE`.
pub fn layout(slots: usize) -> KvLayout {
    KvLayout::new(LAYERS, KV_HEADS, HEAD_DIM, slots, PAGE_SIZE).expect("layout")
}

/// The K (V is its negation) row of the token at `position` after `tokens[..position]`, in
/// `layer`.
fn k_row(tokens: &[u32], position: usize, layer: usize) -> [f32; KV_HEADS * HEAD_DIM] {
    let mut hash = 0x9e37_79b9u32.wrapping_add(layer as u32);
    for &token in &tokens[..=position] {
        hash = hash.rotate_left(5).wrapping_mul(31) ^ token;
    }
    std::array::from_fn(|i| (hash.rotate_left(i as u32 * 3) % 10_007) as f32)
}

/// Stores the K/V of `tokens[positions]` at `slots` in every layer.
fn store(pool: &mut dyn KvPool, tokens: &[u32], positions: Range<usize>, slots: &[KvSlot]) {
    for layer in 0..LAYERS {
        let k: Vec<f32> = positions
            .clone()
            .flat_map(|p| k_row(tokens, p, layer))
            .collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        pool.store_kv(layer, slots, KvSlice::F32(&k), KvSlice::F32(&v))
            .expect("slots of the pool");
    }
}

/// [`kv::digest`] of `slots`, which are the pool's.
pub fn digest(pool: &dyn KvPool, slots: &[KvSlot]) -> u64 {
    kv::digest(pool, slots).expect("slots of the pool")
}

/// The toy model's next token after the K/V at `slots`.
fn next_token(pool: &dyn KvPool, slots: &[KvSlot]) -> u32 {
    (digest(pool, slots) % 50_000) as u32 + 1
}

/// What a prefill computed: the request (holding its row), the slots of its positions, its
/// first output token and the digest of its K/V.
#[derive(Debug)]
pub struct Prefilled {
    /// The request on the prefill node.
    pub req: Req,
    /// Slots of positions `0..prompt`.
    pub slots: Vec<KvSlot>,
    /// The first output token.
    pub first_token: u32,
    /// [`digest`] of `slots`.
    pub digest: u64,
}

/// One node.
pub struct Node {
    /// Its NIXL agent.
    pub agent: Agent,
    /// Its allocator, table and prefix cache.
    pub cache: KvCache<PagedAllocator>,
    /// Its registered pool.
    pub pool: RegisteredPool,
}

impl Node {
    /// A node of `geometry`, its agent named `name`.
    pub fn new(name: &str, options: &AgentOptions, geometry: Geometry) -> Result<Node, NixlError> {
        let agent = Agent::with_options(name, options)?;
        let slots = geometry.pages * PAGE_SIZE;
        let pool = RegisteredPool::new(&agent, layout(slots), KvDtype::F32)?;
        let allocator = PagedAllocator::new(slots, PAGE_SIZE, true).expect("allocator");
        let table = ReqToTokenPool::new(ROWS, WIDTH).expect("table");
        let tree = TreeCache::Radix(RadixCache::new(RadixConfig::new(PAGE_SIZE)).unwrap());
        let cache = KvCache::new(allocator, table, tree).expect("cache");
        Ok(Node { agent, cache, pool })
    }

    /// This node's metadata for its peer.
    pub fn metadata(&self) -> PeerMetadata {
        self.agent
            .metadata(self.pool.descriptor())
            .expect("metadata")
    }

    /// The slots of `req`'s positions `range`.
    pub fn slots(&self, req: &Req, range: Range<usize>) -> Vec<KvSlot> {
        let row = req.kv().req_pool_idx().expect("a request holding a row");
        self.cache.req_to_token().row(row).expect("its row")[range].to_vec()
    }

    /// Computes the prompt of request `rid` here (its cached prefix reused), stores its K/V and
    /// samples its first token. `Err` when the pool cannot take it now (nothing held then).
    pub fn prefill(&mut self, rid: u64, tokens: &[u32]) -> Result<Prefilled, String> {
        let mut req = Req::new(rid, tokens.to_vec());
        init_next_round_input(&mut req, &mut self.cache, usize::MAX).map_err(|e| e.to_string())?;
        let cached = req.prefix_len();
        let batch = match alloc_for_extend(
            prepare_for_extend(ScheduleBatch::new(vec![req])),
            &mut self.cache,
        ) {
            Ok(batch) => batch,
            Err(failure) => {
                let error = failure.error.to_string();
                let mut req = failure
                    .batch
                    .cancel()
                    .into_reqs()
                    .pop()
                    .expect("one request");
                self.unlock(&mut req);
                return Err(error);
            }
        };
        let req = batch.into_reqs().pop().expect("one request");
        let slots = self.slots(&req, 0..tokens.len());
        store(
            &mut self.pool,
            tokens,
            cached..tokens.len(),
            &slots[cached..],
        );
        let first_token = next_token(&self.pool, &slots);
        let digest = digest(&self.pool, &slots);
        Ok(Prefilled {
            req,
            slots,
            first_token,
            digest,
        })
    }

    /// Drops the prefix lock of a request that holds no row.
    pub fn unlock(&mut self, req: &mut Req) {
        if !req.kv().holds_kv() && req.last_node() != TreePos::ROOT {
            release_kv_cache(req, &mut self.cache, false).expect("unlock");
        }
    }

    /// Releases `req` into the prefix cache.
    pub fn release(&mut self, mut req: Req) {
        release_kv_cache(&mut req, &mut self.cache, true).expect("release");
    }

    /// Decodes `req` (its K/V committed here) until it has `outputs` output tokens, storing
    /// each new position's K/V; then releases it into the prefix cache. Returns its outputs.
    pub fn decode(&mut self, req: Req, outputs: usize) -> Result<Vec<u32>, String> {
        let mut batch = ScheduleBatch::new(vec![req]);
        while batch.reqs()[0].output_ids().len() < outputs {
            let prepared =
                prepare_for_decode(batch, &self.cache).map_err(|(_, e)| e.to_string())?;
            batch = alloc_for_decode(prepared, &mut self.cache)
                .map_err(|failure| failure.error.to_string())?;
            let slot = batch.out_cache_loc()[0];
            let req = &batch.reqs()[0];
            let position = req.kv().kv_allocated_len() - 1;
            let tokens = req.fill_ids().to_vec();
            store(&mut self.pool, &tokens, position..position + 1, &[slot]);
            let slots = self.slots(req, 0..position + 1);
            let token = next_token(&self.pool, &slots);
            batch.reqs_mut()[0].push_output(token);
        }
        let req = batch.into_reqs().pop().expect("one request");
        let outputs = req.output_ids().to_vec();
        self.release(req);
        Ok(outputs)
    }

    /// The invariant checker, with `held` the requests holding K/V here.
    pub fn check<'a>(&self, held: impl IntoIterator<Item = &'a Req>) -> Result<(), String> {
        self.cache
            .check(held)
            .map_err(|violation| violation.to_string())
    }

    /// Evicts the prefix cache and checks that every slot and row is back.
    pub fn finish(&mut self) -> Result<(), String> {
        self.check([])?;
        let capacity = self.cache.allocator().capacity();
        self.cache
            .evict_shortfall(capacity)
            .map_err(|e| e.to_string())?;
        let rows = self.cache.req_to_token();
        let free = (self.cache.available_size(), rows.available_size());
        match free == (capacity, rows.size()) {
            true => Ok(()),
            false => Err(format!(
                "leak: {} of {capacity} slots and {} of {} rows free",
                free.0,
                free.1,
                rows.size()
            )),
        }
    }
}

/// Prompts of `count` requests in three families sharing prefixes of 0, 13 or 31 tokens, each
/// with its own tail.
pub fn prompts(count: usize) -> Vec<Vec<u32>> {
    (0..count)
        .map(|rid| {
            let family = (rid % 3) as u32;
            let shared = [0, 13, 31][rid % 3];
            let own = 5 + (rid * 7) % 23;
            (0..shared as u32)
                .map(|i| 1_000 * (family + 1) + i)
                .chain((0..own as u32).map(|i| 100_000 * (rid as u32 + 1) + i))
                .collect()
        })
        .collect()
}
