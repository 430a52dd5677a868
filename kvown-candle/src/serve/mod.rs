//! [`Server`]: a continuous-batching serving loop that runs a [`PagedLlama`] over kvown's batch
//! flow. Each step admits what fits (radix prefix cache, chunked prefill), extends it, decodes
//! the running batch (plain or speculative), retracts when decode does not fit, and releases
//! finished requests into the prefix cache; `disaggregated` computes prompts on a prefill node
//! and moves their K/V through kvown's `KvTransfer`. Every slot the model reads or writes is
//! one kvown handed out.

mod decode;
mod disagg;
mod extend;
#[cfg(feature = "fault-injection")]
mod fault;
mod spec;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvown_runtime::alloc::{KvAllocator, PagedAllocator, ceil_align};
use kvown_runtime::batch::{Req, ScheduleBatch};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::kv::{KvDtype, TransferError};
use kvown_runtime::radix::{CacheEvent, EvictionPolicy, RadixCache, RadixConfig};
use kvown_runtime::slots::ReqToTokenPool;

use crate::error::{RequestError, ServeError};
#[cfg(feature = "fault-injection")]
use crate::forward_batch::ForwardBatch;
use crate::model::PagedLlama;
use crate::pool::TensorKvPool;
use crate::sampling::Sampling;
pub use disagg::TransferLink;
use disagg::{PrefillNode, local_link};
#[cfg(feature = "fault-injection")]
pub use fault::Fault;

/// Where speculative decoding gets its drafts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Draft {
    /// Prompt lookup: the tokens that followed the latest earlier occurrence of the request's
    /// last few tokens.
    Ngram,
    /// The served model itself, one decode step per draft token, writing its K/V into the
    /// reserved slots that verification then rewrites.
    Model,
}

/// Speculative decoding: each step verifies up to `tokens` tokens per request (the last
/// sampled one and `tokens - 1` drafts) and keeps the run the model agrees with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpecConfig {
    /// The draft source.
    pub draft: Draft,
    /// Tokens verified per step, at least 2; kvown reserves twice as many slots ahead.
    pub tokens: usize,
}

impl SpecConfig {
    /// The reservation kvown keeps ahead of each request's committed length (the engine's
    /// double-buffered `2 x tokens`).
    pub fn reserve(&self) -> usize {
        2 * self.tokens
    }
}

/// How a [`Server`] is sized and what it does each step.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeConfig {
    /// Slots per page.
    pub page_size: usize,
    /// K/V slots in the pool (a multiple of `page_size`).
    pub pool_tokens: usize,
    /// Element type of the pool.
    pub pool_dtype: KvDtype,
    /// Requests holding K/V at once (rows of the request-to-token table).
    pub max_running: usize,
    /// Positions per request (the table's row width): prompt plus generation must fit.
    pub max_context: usize,
    /// Prompt tokens computed per step at most (chunked prefill); a longer prompt is extended
    /// over several steps.
    pub chunk_size: usize,
    /// The radix prefix cache and its eviction policy; `None` computes every prompt whole.
    pub prefix_cache: Option<EvictionPolicy>,
    /// Speculative decoding, when set.
    pub spec: Option<SpecConfig>,
    /// Compute prompts on a prefill node (its own allocator, prefix cache and pool, twice this
    /// pool's size) and move their K/V into this node's pool through a `LocalTransfer` (or the
    /// link given to [`Server::with_transfer`]), checking a digest of each request's K/V on
    /// both nodes.
    pub disaggregated: bool,
    /// Token choice.
    pub sampling: Sampling,
    /// Tokens that end a request early (the model's end-of-sequence tokens).
    pub stop_tokens: Vec<u32>,
    /// Run kvown's invariant checker after every step.
    pub check_every_step: bool,
    /// Return every computed row of logits in [`StepOutput::logits`].
    pub report_logits: bool,
    /// A fault to inject (kvown's mutation tests only).
    #[cfg(feature = "fault-injection")]
    pub fault: Option<Fault>,
}

impl Default for ServeConfig {
    /// Pages of 16, 4,096 slots in f32, 64 running requests of up to 1,024 positions, chunks of
    /// 512 tokens, an LRU radix cache, greedy, no speculation.
    fn default() -> ServeConfig {
        ServeConfig {
            page_size: 16,
            pool_tokens: 4096,
            pool_dtype: KvDtype::F32,
            max_running: 64,
            max_context: 1024,
            chunk_size: 512,
            prefix_cache: Some(EvictionPolicy::Lru),
            spec: None,
            disaggregated: false,
            sampling: Sampling::Greedy,
            stop_tokens: Vec::new(),
            check_every_step: false,
            report_logits: false,
            #[cfg(feature = "fault-injection")]
            fault: None,
        }
    }
}

impl ServeConfig {
    fn validate(&self) -> Result<(), ServeError> {
        let refuse = |reason: String| Err(ServeError::Config(reason));
        if self.page_size == 0
            || self.pool_tokens == 0
            || !self.pool_tokens.is_multiple_of(self.page_size)
        {
            return refuse(format!(
                "pool_tokens {} must be a positive multiple of page_size {} (at least 1)",
                self.pool_tokens, self.page_size
            ));
        }
        if self.max_running == 0 || self.chunk_size == 0 || self.max_context < 2 {
            return refuse(format!(
                "max_running ({}) and chunk_size ({}) must be at least 1, max_context ({}) at \
                 least 2",
                self.max_running, self.chunk_size, self.max_context
            ));
        }
        if let Some(spec) = self.spec
            && (spec.tokens < 2 || spec.reserve() > self.pool_tokens)
        {
            return refuse(format!(
                "spec tokens {} must be at least 2, and its reservation ({}) fit the pool",
                spec.tokens,
                spec.reserve()
            ));
        }
        self.sampling.validate().map_err(ServeError::Config)
    }

    /// The slot reservation speculative decoding keeps ahead of each request.
    fn spec_reserve(&self) -> Option<usize> {
        self.spec.map(|spec| spec.reserve())
    }
}

/// A generation request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Its id, unique among the requests in the server.
    pub rid: u64,
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (a stop token ends it earlier).
    pub max_new_tokens: usize,
}

/// One row of logits a step computed.
#[derive(Debug, Clone, PartialEq)]
pub struct StepLogits {
    /// The request.
    pub rid: u64,
    /// The position of the last token they follow: they are the logits after the request's
    /// tokens `0..=position`.
    pub position: usize,
    /// The logits (f32, one per vocabulary entry).
    pub logits: Vec<f32>,
    /// The token sampled from them (at `position + 1`), or `None` for a chunk of a prompt
    /// still being extended and a rejected draft.
    pub sampled: Option<u32>,
}

/// A request that left the server.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    /// The request.
    pub rid: u64,
    /// Its prompt.
    pub prompt: Vec<u32>,
    /// What it generated.
    pub output: Vec<u32>,
    /// Whether it was aborted (it cannot fit the pool alone) instead of finishing.
    pub aborted: bool,
    /// From submission to its first token.
    pub time_to_first_token: Option<Duration>,
}

/// What one step did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutput {
    /// Every row of logits computed, with `ServeConfig::report_logits`.
    pub logits: Vec<StepLogits>,
    /// Requests that finished (or were aborted).
    pub finished: Vec<Finished>,
    /// Requests retracted (to be re-prefilled later).
    pub retracted: Vec<u64>,
}

/// Counters of a server's run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServeStats {
    /// Steps taken.
    pub steps: u64,
    /// Requests finished.
    pub finished: u64,
    /// Requests aborted.
    pub aborted: u64,
    /// Retractions (a request retracted twice counts twice).
    pub retractions: u64,
    /// Prompt tokens whose K/V an extend computed (recomputation after retraction included).
    pub prefill_tokens: u64,
    /// Tokens whose K/V a decode or speculative step committed.
    pub decode_tokens: u64,
    /// Prompt tokens looked up in the prefix cache at admission (first admissions only).
    pub prefix_lookup_tokens: u64,
    /// Of those, the tokens the prefix cache supplied.
    pub prefix_hit_tokens: u64,
    /// Tokens evicted from the prefix cache.
    pub evicted_tokens: u64,
    /// Draft tokens proposed, and of those accepted.
    pub spec_drafted: u64,
    /// Draft tokens accepted.
    pub spec_accepted: u64,
    /// Prompts whose K/V moved from the prefill node, each with its digest equal on both nodes
    /// (a difference stops the server with [`ServeError::TransferCorrupt`]).
    pub transfers: u64,
    /// Positions whose K/V moved (the decode node's prefix cache held the rest).
    pub transferred_tokens: u64,
    /// Nanoseconds moving K/V: from each transfer's submit to the poll that saw it end.
    pub transfer_ns: u64,
    /// Nanoseconds in kvown: the batch flow's calls and reading the table into forward batches.
    pub kvown_ns: u64,
    /// Nanoseconds in the model's forward passes.
    pub model_ns: u64,
    /// Nanoseconds in steps, all of it.
    pub step_ns: u64,
    /// Highest pages in use (request-held plus cached).
    pub peak_pages_in_use: usize,
}

/// Per-request state the batch flow does not keep.
#[derive(Debug, Clone)]
struct Budget {
    max_new_tokens: usize,
    submitted: Instant,
    first_token: Option<Duration>,
}

/// One node's bookkeeping and K/V.
#[derive(Debug)]
struct Node {
    cache: KvCache<PagedAllocator>,
    pool: TensorKvPool,
}

impl Node {
    fn new(
        model: &PagedLlama,
        config: &ServeConfig,
        pool_tokens: usize,
        rows: usize,
    ) -> Result<Node, ServeError> {
        let allocator = PagedAllocator::new(pool_tokens, config.page_size, false)
            .map_err(|error| ServeError::Config(error.to_string()))?;
        let table = ReqToTokenPool::new(rows, config.max_context)
            .map_err(|error| ServeError::Config(error.to_string()))?;
        let tree = match config.prefix_cache {
            Some(policy) => TreeCache::Radix(
                RadixCache::new(RadixConfig::new(config.page_size).with_policy(policy))
                    .map_err(|error| ServeError::Config(error.to_string()))?,
            ),
            None => TreeCache::Disabled,
        };
        let mut cache = KvCache::new(allocator, table, tree)?;
        cache.enable_cache_events();
        let pool = model.new_pool(pool_tokens, config.page_size, config.pool_dtype)?;
        Ok(Node { cache, pool })
    }

    /// Tokens the prefix cache evicted since the last call (its events drained).
    fn take_evicted(&mut self) -> u64 {
        let pages: usize = self
            .cache
            .take_cache_events()
            .iter()
            .map(|event| match event {
                CacheEvent::Removed { hashes } => hashes.len(),
                _ => 0,
            })
            .sum();
        (pages * self.cache.page_size()) as u64
    }

    /// Evicts the whole prefix cache and fails unless every slot and row is free.
    fn drain(&mut self, name: &str) -> Result<(), ServeError> {
        let capacity = self.cache.allocator().capacity();
        self.cache.evict_shortfall(capacity)?;
        let rows = self.cache.req_to_token();
        if self.cache.available_size() != capacity || rows.available_size() != rows.size() {
            return Err(ServeError::Leak(format!(
                "{name}: {} of {capacity} slots and {} of {} rows free after releasing every \
                 request and evicting the cache",
                self.cache.available_size(),
                rows.available_size(),
                rows.size()
            )));
        }
        Ok(())
    }
}

/// Runs `call` and adds its time to `ns`.
fn timed<T>(ns: &mut u64, call: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = call();
    *ns += start.elapsed().as_nanos() as u64;
    out
}

/// A continuous-batching server of one [`PagedLlama`] over kvown.
///
/// ```
/// use std::sync::Arc;
/// use kvown_candle::{PagedLlama, Request, ServeConfig, Server, random};
///
/// let config = random::tiny_config();
/// let weights = random::random_weights(&config, 1)?;
/// let model = PagedLlama::from_tensors(config, weights, "in-memory".as_ref())?;
/// let mut server = Server::new(Arc::new(model), ServeConfig::default())?;
/// server.submit(Request { rid: 0, prompt: vec![1, 2, 3], max_new_tokens: 4 })?;
/// let mut outputs = Vec::new();
/// while !server.is_idle() {
///     outputs.extend(server.step()?.finished);
/// }
/// assert_eq!(outputs[0].output.len(), 4);
/// server.finish()?; // every slot and row back, or an error naming the leak
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Server {
    model: Arc<PagedLlama>,
    config: ServeConfig,
    node: Node,
    prefill: Option<PrefillNode>,
    waiting: VecDeque<Req>,
    chunked: Option<Req>,
    running: ScheduleBatch,
    budgets: HashMap<u64, Budget>,
    stats: ServeStats,
    #[cfg(feature = "fault-injection")]
    fault: Option<fault::FaultState>,
}

impl Server {
    /// A server of `model` sized by `config`.
    ///
    /// # Errors
    /// [`ServeError::Config`] for sizes that cannot work; [`ServeError::Pool`] when the pool
    /// cannot be allocated.
    pub fn new(model: Arc<PagedLlama>, config: ServeConfig) -> Result<Server, ServeError> {
        Server::build(model, config, local_link)
    }

    /// A disaggregated server of `model` whose K/V moves through the link `link` makes from
    /// handles on the prefill node's pool and this node's (a NIXL one, say, from kvown-nixl).
    ///
    /// # Errors
    /// As [`Server::new`]; [`ServeError::Config`] unless `config.disaggregated`;
    /// [`ServeError::Transfer`] with `link`'s own error.
    pub fn with_transfer(
        model: Arc<PagedLlama>,
        config: ServeConfig,
        link: impl FnOnce(TensorKvPool, TensorKvPool) -> Result<TransferLink, TransferError>,
    ) -> Result<Server, ServeError> {
        if !config.disaggregated {
            return Err(ServeError::Config(
                "a transfer link serves a disaggregated server: set disaggregated".into(),
            ));
        }
        Server::build(model, config, link)
    }

    fn build(
        model: Arc<PagedLlama>,
        config: ServeConfig,
        link: impl FnOnce(TensorKvPool, TensorKvPool) -> Result<TransferLink, TransferError>,
    ) -> Result<Server, ServeError> {
        config.validate()?;
        let node = Node::new(&model, &config, config.pool_tokens, config.max_running)?;
        let prefill = match config.disaggregated {
            true => Some(PrefillNode::new(&model, &config, &node.pool, link)?),
            false => None,
        };
        Ok(Server {
            #[cfg(feature = "fault-injection")]
            fault: config.fault.map(fault::FaultState::new),
            model,
            node,
            prefill,
            waiting: VecDeque::new(),
            chunked: None,
            running: ScheduleBatch::new(Vec::new()),
            budgets: HashMap::new(),
            stats: ServeStats::default(),
            config,
        })
    }

    /// Queues a request.
    ///
    /// # Errors
    /// [`RequestError`] (the server unchanged) for an empty prompt, nothing to generate, an id
    /// in use, a token past the vocabulary, a context longer than the table's row or the
    /// model's positions, or a request that would not fit the pool alone.
    pub fn submit(&mut self, request: Request) -> Result<(), RequestError> {
        let rid = request.rid;
        let prompt = request.prompt.len();
        if prompt == 0 {
            return Err(RequestError::EmptyPrompt { rid });
        }
        if request.max_new_tokens == 0 {
            return Err(RequestError::NothingToGenerate { rid });
        }
        if self.budgets.contains_key(&rid) {
            return Err(RequestError::DuplicateId { rid });
        }
        let vocab = self.model.config().vocab_size;
        if let Some(&token) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(RequestError::TokenOutOfVocab { rid, token, vocab });
        }
        // The last sampled token is never computed: prompt + max_new - 1 positions.
        let positions = prompt.saturating_add(request.max_new_tokens) - 1;
        let row_needed = self.row_need(positions);
        if row_needed > self.config.max_context {
            return Err(RequestError::ContextTooLong {
                rid,
                prompt,
                max_new_tokens: request.max_new_tokens,
                needed: row_needed,
                row_width: self.config.max_context,
            });
        }
        let max_positions = self.model.config().max_position_embeddings;
        if positions > max_positions {
            return Err(RequestError::PastModelPositions {
                rid,
                needed: positions,
                max_positions,
            });
        }
        if row_needed > self.config.pool_tokens {
            return Err(RequestError::LargerThanPool {
                rid,
                needed: row_needed,
                pool_tokens: self.config.pool_tokens,
            });
        }
        let req =
            Req::try_new(rid, request.prompt).map_err(|_| RequestError::EmptyPrompt { rid })?;
        self.budgets.insert(
            rid,
            Budget {
                max_new_tokens: request.max_new_tokens,
                submitted: Instant::now(),
                first_token: None,
            },
        );
        self.waiting.push_back(req);
        Ok(())
    }

    /// Slots a request computing `positions` positions holds at most: its pages, or with
    /// speculation its reservation ahead of the last commit before its final step.
    fn row_need(&self, positions: usize) -> usize {
        let held = match self.config.spec_reserve() {
            None => positions,
            Some(reserve) => positions
                .saturating_sub(1)
                .saturating_add(reserve)
                .max(positions),
        };
        held.checked_next_multiple_of(self.config.page_size)
            .unwrap_or(usize::MAX)
    }

    /// One scheduler iteration: admit and extend, decode (retracting if it does not fit),
    /// release what finished.
    ///
    /// # Errors
    /// A refused kvown call, model or transfer failure, or with `check_every_step` a broken
    /// invariant; the server should not be stepped again after one.
    pub fn step(&mut self) -> Result<StepOutput, ServeError> {
        let start = Instant::now();
        self.stats.steps += 1;
        let mut out = StepOutput::default();
        self.extend(&mut out)?;
        self.decode(&mut out)?;
        let (node, prefill) = (&mut self.node, &mut self.prefill);
        self.stats.evicted_tokens += timed(&mut self.stats.kvown_ns, || {
            node.take_evicted()
                + prefill
                    .as_mut()
                    .map_or(0, |prefill| prefill.node.take_evicted())
        });
        self.record_peak();
        if self.config.check_every_step {
            self.check()?;
        }
        self.stats.step_ns += start.elapsed().as_nanos() as u64;
        Ok(out)
    }

    /// kvown's invariant checker over every request that holds K/V, on both nodes.
    pub fn check(&self) -> Result<(), ServeError> {
        let held = self.running.reqs().iter().chain(self.chunked.as_ref());
        let invariant = |violation| ServeError::Invariant {
            step: self.stats.steps,
            violation,
        };
        self.node.cache.check(held).map_err(invariant)?;
        if let Some(prefill) = &self.prefill {
            prefill
                .node
                .cache
                .check(std::iter::empty::<&Req>())
                .map_err(invariant)?;
        }
        Ok(())
    }

    /// Whether no request is waiting, being extended or running.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.chunked.is_none() && self.running.is_empty()
    }

    /// Requests submitted and not yet finished.
    pub fn in_flight(&self) -> usize {
        self.budgets.len()
    }

    /// The run's counters.
    pub fn stats(&self) -> &ServeStats {
        &self.stats
    }

    /// The (decode) node's kvown bookkeeping.
    pub fn cache(&self) -> &KvCache<PagedAllocator> {
        &self.node.cache
    }

    /// The (decode) node's K/V pool.
    pub fn pool(&self) -> &TensorKvPool {
        &self.node.pool
    }

    /// The model.
    pub fn model(&self) -> &PagedLlama {
        &self.model
    }

    /// How many times the injected fault changed what the model read or computed.
    #[cfg(feature = "fault-injection")]
    pub fn faults_fired(&self) -> u32 {
        self.fault.as_ref().map_or(0, |fault| fault.fired)
    }

    /// Lets the injected fault, if any, change `forward` (`hook` is where in the step it is).
    #[cfg(feature = "fault-injection")]
    fn inject(
        &mut self,
        batch: &ScheduleBatch,
        mut forward: ForwardBatch,
        hook: fn(&mut fault::FaultState, &ScheduleBatch, &mut ForwardBatch, usize),
    ) -> ForwardBatch {
        if let Some(fault) = &mut self.fault {
            hook(fault, batch, &mut forward, self.config.page_size);
        }
        forward
    }

    /// Ends the run: every request must have finished; the prefix caches are evicted and every
    /// slot and row must be free again. Returns the counters.
    ///
    /// # Errors
    /// [`ServeError::Leak`] naming what is still held, or a request still in flight.
    pub fn finish(mut self) -> Result<ServeStats, ServeError> {
        if !self.is_idle() {
            return Err(ServeError::Leak(format!(
                "finish with {} requests still in flight",
                self.budgets.len()
            )));
        }
        self.check()?;
        self.node.drain("node")?;
        if let Some(prefill) = &mut self.prefill {
            prefill.node.drain("prefill node")?;
        }
        Ok(self.stats)
    }

    fn record_peak(&mut self) {
        let cache = &self.node.cache;
        let in_use = cache.allocator().capacity() - cache.available_size();
        self.stats.peak_pages_in_use = self.stats.peak_pages_in_use.max(in_use / cache.page_size());
    }

    /// Samples the token after `position` of `req` from `logits`; records its first-token
    /// time and, with `report_logits`, the row.
    fn sample(&mut self, req: &Req, position: usize, logits: &[f32], out: &mut StepOutput) -> u32 {
        let token = self.config.sampling.sample(logits, req.rid(), position);
        if let Some(budget) = self.budgets.get_mut(&req.rid()) {
            budget
                .first_token
                .get_or_insert_with(|| budget.submitted.elapsed());
        }
        self.report(req.rid(), position, logits, Some(token), out);
        token
    }

    /// With `report_logits`, records a row of logits.
    fn report(
        &self,
        rid: u64,
        position: usize,
        logits: &[f32],
        sampled: Option<u32>,
        out: &mut StepOutput,
    ) {
        if self.config.report_logits {
            out.logits.push(StepLogits {
                rid,
                position,
                logits: logits.to_vec(),
                sampled,
            });
        }
    }

    /// Output tokens `req` may still generate.
    fn outputs_left(&self, req: &Req) -> usize {
        self.budgets
            .get(&req.rid())
            .map_or(0, |budget| budget.max_new_tokens)
            .saturating_sub(req.output_ids().len())
    }

    /// Hands a request out of the server.
    fn finished(&mut self, req: &Req, aborted: bool, out: &mut StepOutput) {
        let budget = self.budgets.remove(&req.rid());
        match aborted {
            true => self.stats.aborted += 1,
            false => self.stats.finished += 1,
        }
        out.finished.push(Finished {
            rid: req.rid(),
            prompt: req.origin_input_ids().to_vec(),
            output: req.output_ids().to_vec(),
            aborted,
            time_to_first_token: budget.and_then(|budget| budget.first_token),
        });
    }

    /// Slots `req` holds at most over the rest of its life (its pages, or its speculative
    /// reservation at its last step).
    fn lifetime_need(&self, req: &Req) -> usize {
        let positions = (req.fill_ids().len() + self.outputs_left(req)).saturating_sub(1);
        self.row_need(positions)
    }

    /// Pages-worth of slots backing `[0, len)`.
    fn aligned(&self, len: usize) -> usize {
        ceil_align(len, self.config.page_size)
    }
}
