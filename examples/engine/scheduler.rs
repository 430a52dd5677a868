//! The continuous-batching loop: admission (with memory checks and chunked prefill), extend,
//! decode (plain or speculative) with retraction, and release. Every bookkeeping write goes
//! through kvown's owner functions; the time spent in kvown calls is measured per step.

use std::collections::VecDeque;
use std::time::Instant;

use kvown::alloc::{KvAllocator, KvSlot, PagedAllocator, ceil_align};
use kvown::batch::Req;
use kvown::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, alloc_for_spec_decode, check_decode_mem,
    commit_spec_tokens, commit_transfer, new_tokens_required_next_decode, prealloc_for_transfer,
    prepare_for_decode, prepare_for_extend, prepare_for_spec_decode, release_kv_cache,
    reset_for_retract, retract_decode,
};
use kvown::batch::{cache_unfinished_req, init_next_round_input};
use kvown::cache::{KvCache, TableMirror};
use kvown::radix::{Namespace, TreePos};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::admission::{CLIP_MAX_NEW_TOKENS, NewTokenRatio};
use crate::cli::{Admission, Args};
use crate::device_copy::DeviceCopy;
use crate::disagg::{PrefillLink, TransferReport};
use crate::kv_data::{KvStore, TokenKv, extended_tokens};
use crate::replay::{CacheReplay, EventCounts};
use crate::workload::{Job, output_token};

/// Pool occupancy after one step, in pages.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Occupancy {
    /// Pages requests own.
    pub request_owned: usize,
    /// Cached pages nobody locks (evictable).
    pub cached_evictable: usize,
    /// Cached pages locked by running requests.
    pub cached_locked: usize,
    /// Free pages.
    pub free: usize,
}

/// Counters of one run.
#[derive(Debug, Default)]
pub struct Stats {
    /// Steps taken.
    pub steps: u64,
    /// Requests that finished normally.
    pub finished: u64,
    /// Requests aborted because they cannot fit the pool alone.
    pub aborted: u64,
    /// Retraction events (requests retracted).
    pub retractions: u64,
    /// Steps at which a retraction happened.
    pub retraction_steps: Vec<u64>,
    /// Tokens whose K/V was computed by extends (recomputation after retraction included).
    pub tokens_prefilled: u64,
    /// Tokens committed by decode steps.
    pub tokens_decoded: u64,
    /// Per request priority (`0..--priorities`): tokens looked up in the prefix cache at
    /// admission, and of those the tokens it supplied.
    pub prefix_tokens_by_priority: Vec<(u64, u64)>,
    /// Highest pages in use (request-owned plus cached).
    pub peak_pages_in_use: usize,
    /// Nanoseconds spent in kvown calls, per step.
    pub kvown_ns_per_step: Vec<u64>,
    /// Occupancy after each step.
    pub occupancy: Vec<Occupancy>,
    /// With `--cache-events`, what the replay applied during the run (set by
    /// [`Engine::finish`], before the end-of-run checks add their own events).
    pub cache_events: Option<EventCounts>,
}

/// The engine: waiting queue, the chunked request, the running batch and the KV state, with its
/// table followed by mirror `M` (none, or its device copy).
pub struct Engine<'a, M> {
    args: &'a Args,
    cache: KvCache<PagedAllocator, M>,
    kv: KvStore,
    rng: SmallRng,
    arrivals: VecDeque<Job>,
    output_len: Vec<usize>,
    waiting: VecDeque<Req>,
    chunked: Option<Req>,
    running: ScheduleBatch,
    /// The `out_cache_loc` storage handed from each extend batch to the next.
    extend_buffer: Vec<KvSlot>,
    /// The new-token ratio under `--admission ratio`.
    new_token_ratio: Option<NewTokenRatio>,
    /// With `--cache-events`: the router's replay of the cache's events.
    replay: Option<CacheReplay>,
    /// With `--disaggregated`: the link to the prefill node that computes the prompts.
    prefill: Option<PrefillLink>,
    step_ns: u64,
    /// The run's counters.
    pub stats: Stats,
}

/// Runs `call` and adds its time to `ns`.
pub fn timed<T>(ns: &mut u64, call: impl FnOnce() -> T) -> T {
    let start = Instant::now();
    let out = call();
    *ns += start.elapsed().as_nanos() as u64;
    out
}

impl<'a, M: TableMirror + DeviceCopy> Engine<'a, M> {
    /// An engine over `cache` and `kv` for the workload `jobs`.
    pub fn new(
        args: &'a Args,
        mut cache: KvCache<PagedAllocator, M>,
        kv: KvStore,
        jobs: Vec<Job>,
    ) -> Self {
        let replay = args.cache_events.then(|| {
            assert!(
                cache.enable_cache_events(),
                "the engine's cache is a radix cache"
            );
            CacheReplay::default()
        });
        Engine {
            args,
            cache,
            kv,
            rng: SmallRng::seed_from_u64(args.seed ^ 0x5EED),
            output_len: jobs.iter().map(|job| job.output_len).collect(),
            arrivals: jobs.into(),
            waiting: VecDeque::new(),
            chunked: None,
            running: ScheduleBatch::new(Vec::new()),
            extend_buffer: Vec::new(),
            new_token_ratio: (args.admission == Admission::Ratio).then(|| {
                NewTokenRatio::new(
                    args.new_token_ratio,
                    args.min_new_token_ratio_factor,
                    args.new_token_ratio_decay_steps,
                )
            }),
            replay,
            prefill: None,
            step_ns: 0,
            stats: Stats {
                prefix_tokens_by_priority: vec![(0, 0); args.priorities as usize],
                ..Stats::default()
            },
        }
    }

    /// The engine as the decode node of a prefill/decode pair (`--disaggregated`): the
    /// prefill node at the other end of `link` computes the prompts.
    pub fn with_prefill_link(mut self, link: PrefillLink) -> Self {
        self.prefill = Some(link);
        self
    }

    /// With `--disaggregated`, what the transfers from the prefill node did.
    pub fn transfers(&self) -> Option<TransferReport> {
        self.prefill.as_ref().map(PrefillLink::report)
    }

    /// Whether every request has finished or been aborted.
    pub fn is_done(&self) -> bool {
        self.arrivals.is_empty()
            && self.waiting.is_empty()
            && self.chunked.is_none()
            && self.running.is_empty()
    }

    /// Requests of the workload that have not arrived yet.
    pub fn pending_arrivals(&self) -> usize {
        self.arrivals.len()
    }

    /// Requests finished or aborted so far.
    pub fn completed(&self) -> u64 {
        self.stats.finished + self.stats.aborted
    }

    /// The K/V store.
    pub fn kv(&self) -> &KvStore {
        &self.kv
    }

    /// Every request that holds KV or a prefix lock.
    fn held_reqs(&self) -> impl Iterator<Item = &Req> {
        self.running.reqs().iter().chain(self.chunked.as_ref())
    }

    /// Runs the invariant checker on both nodes of a pair (or the one node): [`Self::check_here`]
    /// and the prefill node's.
    pub fn check(&mut self) -> Result<(), String> {
        let step = self.stats.steps;
        if let Some(link) = &mut self.prefill {
            link.check()
                .map_err(|problem| format!("step {step}: {problem}"))?;
        }
        self.check_here()
    }

    /// Runs the invariant checker over every request that holds KV on this node and, on a
    /// device, compares the device copy of the free list and of their rows with the host's.
    fn check_here(&self) -> Result<(), String> {
        let at_step = |problem: String| format!("step {}: {problem}", self.stats.steps);
        self.cache
            .check(self.held_reqs())
            .map_err(|violation| at_step(violation.to_string()))?;
        if let Some(replay) = &self.replay {
            let tree = self.cache.tree();
            let cached = (tree.evictable_size() + tree.protected_size()) / self.cache.page_size();
            if replay.held().len() != cached {
                return Err(at_step(format!(
                    "the replayed cache events hold {} pages, the cache {cached}",
                    replay.held().len()
                )));
            }
        }
        let rows = self
            .held_reqs()
            .filter_map(|req| Some((req.kv().req_pool_idx()?, req.kv().kv_allocated_len())));
        self.cache
            .mirror()
            .verify_device(self.cache.req_to_token(), rows)
            .map_err(at_step)
    }

    /// One scheduler iteration: arrivals, an extend batch, a decode step, releases.
    pub fn step(&mut self) -> Result<(), String> {
        self.stats.steps += 1;
        self.step_ns = 0;
        while self
            .arrivals
            .front()
            .is_some_and(|job| job.arrival_step <= self.stats.steps)
        {
            let job = self.arrivals.pop_front().expect("front exists");
            let adapter = Namespace(job.adapter);
            let req = Req::new_in(adapter, job.rid, job.prompt).with_priority(job.priority);
            self.waiting.push_back(req);
        }
        let extended = self.extend()?;
        if !extended && self.running.is_empty() {
            // Idle: nothing to prefill or decode.
            if let Some(ratio) = &mut self.new_token_ratio {
                ratio.reset();
            }
        }
        self.decode()?;
        self.replay_cache_events()?;
        self.stats.kvown_ns_per_step.push(self.step_ns);
        self.record_occupancy();
        Ok(())
    }

    /// With `--cache-events`, drains the cache's events (a kvown call, timed) into the replay,
    /// as a router's feed would every step.
    fn replay_cache_events(&mut self) -> Result<(), String> {
        let Some(replay) = &mut self.replay else {
            return Ok(());
        };
        let events = timed(&mut self.step_ns, || self.cache.take_cache_events());
        replay
            .apply(events)
            .map_err(|problem| format!("step {}: {problem}", self.stats.steps))
    }

    /// With `--cache-events`, at the end of the run: the replay against the tree. Restarting
    /// the stream queues `Cleared` and a `Stored` of every cached page, built from the tree's
    /// nodes (their hashes checked against their paths by the checker); replayed on their own,
    /// they must give the live replay's hashes and page ids, and their page ids must be exactly
    /// the pages the tree holds.
    fn verify_cache_events(&mut self) -> Result<(), String> {
        let Some(replay) = &self.replay else {
            return Ok(());
        };
        self.stats.cache_events = Some(replay.counts());
        self.cache.enable_cache_events();
        let mut snapshot = CacheReplay::default();
        snapshot
            .apply(self.cache.take_cache_events())
            .map_err(|problem| format!("the restarted stream: {problem}"))?;
        replay.compare(&snapshot)?;
        let tree = self
            .cache
            .tree()
            .radix()
            .expect("the engine's cache is a radix cache");
        let mut cached: Vec<_> = tree.cached_pages().map(|(_, page)| page).collect();
        let mut named: Vec<_> = snapshot.held().values().copied().collect();
        cached.sort_unstable();
        named.sort_unstable();
        if cached != named {
            return Err(format!(
                "the restarted stream names {} pages, the tree holds {}",
                named.len(),
                cached.len()
            ));
        }
        Ok(())
    }

    /// Slots a request could ever hold. Its last output token is sampled but never computed,
    /// so its K/V covers the rest of the sequence: `computed = prompt + outputs - 1` positions.
    /// A plain decode step allocates the one position it commits; a speculative one reserves
    /// `committed + reserve` before it, with at most `computed - 1` positions committed then.
    /// An output length near `usize::MAX` saturates to `usize::MAX` (more than any pool).
    fn lifetime_need(&self, req: &Req) -> usize {
        let rest = self.outputs_left(req);
        let computed = req.fill_ids().len().saturating_add(rest) - 1;
        let held = match self.args.spec_reserve() {
            None => computed,
            Some(reserve) => (computed - 1).saturating_add(reserve).max(computed),
        };
        held.checked_next_multiple_of(self.cache.page_size())
            .unwrap_or(usize::MAX)
    }

    /// Output tokens `req` has yet to produce.
    fn outputs_left(&self, req: &Req) -> usize {
        self.output_len[req.rid() as usize] - req.output_ids().len()
    }

    /// Slots an admitted request reserves past its extend's pages for the decoding to come,
    /// never more than it can still use (`lifetime_need` less those pages; one whose whole life
    /// fits in them needs none, or it would be neither admitted nor aborted): under `next-step`
    /// one page, or the speculative reservation; under `ratio` its remaining output (clipped),
    /// or the speculative reservation if larger (it decodes in this step), once its prompt is
    /// all in (a request mid-way in chunked prefill reserves none).
    fn decode_headroom(&self, req: &Req, lifetime_need: usize) -> usize {
        let page_size = self.cache.page_size();
        let extended = ceil_align(req.extend_end(), page_size);
        let wanted = match self.new_token_ratio {
            None => self
                .args
                .spec_reserve()
                .map_or(page_size, |r| ceil_align(r, page_size)),
            Some(_) if req.extend_end() < req.fill_ids().len() => 0,
            Some(_) => {
                let growth = self
                    .outputs_left(req)
                    .min(CLIP_MAX_NEW_TOKENS)
                    .max(self.args.spec_reserve().unwrap_or(0));
                ceil_align(req.extend_end() + growth, page_size) - extended
            }
        };
        wanted.min(lifetime_need - extended)
    }

    /// Drops the prefix lock `init_next_round_input` took for a request that is not admitted.
    fn unlock(&mut self, req: &mut Req) -> Result<(), String> {
        if !req.kv().holds_kv() && req.last_node() != TreePos::ROOT {
            timed(&mut self.step_ns, || {
                release_kv_cache(req, &mut self.cache, false)
            })
            .map_err(|e| format!("unlock request {}: {e}", req.rid()))?;
        }
        Ok(())
    }

    /// Admits the chunked request and waiting requests within the prefill budget, the
    /// request limit and the memory the pool can give (evictable prefix cache counted), then
    /// allocates and stores their extend. Returns whether it extended any.
    fn extend(&mut self) -> Result<bool, String> {
        let page_size = self.cache.page_size();
        let spec_reserve = self.args.spec_reserve();
        // A prefill node takes whole prompts.
        let mut budget = match self.prefill {
            Some(_) => usize::MAX,
            None => self.args.chunk_size,
        };
        let next_step = timed(&mut self.step_ns, || {
            new_tokens_required_next_decode(self.running.reqs(), page_size, spec_reserve)
        });
        // Under `ratio`, the running batch's estimated growth, but never less than its next
        // step: the requests admitted now decode in this step too.
        let mut reserved = self.new_token_ratio.as_ref().map_or(next_step, |ratio| {
            let remaining = self.running.reqs().iter().map(|req| self.outputs_left(req));
            ratio.running_growth(remaining).max(next_step)
        });
        let mut admitted = Vec::new();
        let mut candidates: Vec<Req> = self.chunked.take().into_iter().collect();
        loop {
            let mut req = match candidates.pop() {
                Some(req) => req,
                None if self.running.len() + admitted.len() < self.args.max_running => {
                    match self.waiting.pop_front() {
                        Some(req) => req,
                        None => break,
                    }
                }
                None => break,
            };
            let lifetime_need = self.lifetime_need(&req);
            if lifetime_need > self.cache.allocator().capacity() {
                self.stats.aborted += 1;
                continue;
            }
            let continuing = req.kv().holds_kv();
            timed(&mut self.step_ns, || {
                init_next_round_input(&mut req, &mut self.cache, budget)
            })
            .map_err(|e| format!("init_next_round_input {}: {e}", req.rid()))?;
            let prefix = req.prefix_len();
            let need = ceil_align(req.extend_end(), page_size) - ceil_align(prefix, page_size)
                + self.decode_headroom(&req, lifetime_need);
            if reserved + need > self.cache.available_with_eviction() {
                self.unlock(&mut req)?;
                if continuing {
                    self.chunked = Some(req);
                } else {
                    self.waiting.push_front(req);
                }
                break;
            }
            if !continuing {
                let (lookup, hit) = (req.fill_ids().len() as u64, prefix as u64);
                let by_priority =
                    &mut self.stats.prefix_tokens_by_priority[req.priority() as usize];
                by_priority.0 += lookup;
                by_priority.1 += hit;
            }
            reserved += need;
            budget -= req.extend_end() - prefix;
            admitted.push(req);
            if budget == 0 {
                break;
            }
        }
        if admitted.is_empty() {
            return Ok(false);
        }
        if let Some(mut node) = self.prefill.take() {
            let extended = self.extend_remotely(&mut node, admitted);
            self.prefill = Some(node);
            return extended;
        }
        let batch = ScheduleBatch::with_buffer(admitted, std::mem::take(&mut self.extend_buffer));
        let batch = timed(&mut self.step_ns, || {
            alloc_for_extend(prepare_for_extend(batch), &mut self.cache)
                .map_err(|failure| failure.error)
        })
        .map_err(|error| format!("alloc_for_extend after admission: {error}"))?;
        let stores = extended_tokens(&batch);
        self.stats.tokens_prefilled += stores.len() as u64;
        self.kv.store(&stores)?;
        let (reqs, buffer) = batch.into_parts();
        self.extend_buffer = buffer;
        for mut req in reqs {
            if req.kv().kv_committed_len() < req.fill_ids().len() {
                timed(&mut self.step_ns, || {
                    cache_unfinished_req(&mut req, &mut self.cache)
                })
                .map_err(|e| format!("cache_unfinished_req {}: {e}", req.rid()))?;
                self.chunked = Some(req);
            } else {
                let index = req.output_ids().len();
                req.push_output(output_token(req.rid(), index));
                self.running.extend_reqs([req]);
            }
        }
        self.release_finished()?;
        Ok(true)
    }

    /// `--disaggregated`: the admitted requests' prompts computed on `node`, their K/V moved
    /// into the slots this node preallocates for them, then committed and running here. When
    /// the prefill node cannot take them all now, the last admitted waits (its prefix locks
    /// here dropped) and the rest are tried again: the prefill node holds no request between
    /// steps, so one request, which fits the pool alone, is always taken. (Offering the same
    /// batch again every step could refuse it forever: the two nodes' prefix caches differ, so
    /// a batch that fits here may not fit there.)
    fn extend_remotely(
        &mut self,
        node: &mut PrefillLink,
        mut admitted: Vec<Req>,
    ) -> Result<bool, String> {
        let (remote, computed) = loop {
            if let Some(prefilled) = node.prefill(&admitted, &mut self.step_ns)? {
                break prefilled;
            }
            let mut req = admitted
                .pop()
                .expect("the caller admits at least one request");
            self.unlock(&mut req)?;
            self.waiting.push_front(req);
            if admitted.is_empty() {
                return Ok(false);
            }
        };
        self.stats.tokens_prefilled += computed;
        for (mut req, remote) in admitted.into_iter().zip(remote) {
            let index = req.output_ids().len();
            req.push_output(output_token(req.rid(), index));
            let ticket = timed(&mut self.step_ns, || {
                prealloc_for_transfer(req, &mut self.cache)
            })
            .map_err(|failure| {
                format!(
                    "prealloc_for_transfer {}: {}",
                    failure.req.rid(),
                    failure.error
                )
            })?;
            let row = ticket
                .req()
                .kv()
                .req_pool_idx()
                .expect("a ticket holds a row");
            let fill = ticket.positions().end;
            let rows = self
                .cache
                .req_to_token()
                .row(row)
                .map_err(|e| e.to_string())?;
            let decode = (&self.kv, &rows[..fill]);
            node.send(remote, &ticket, decode, &mut self.step_ns)?;
            let req = timed(&mut self.step_ns, || commit_transfer(ticket));
            self.running.extend_reqs([req]);
        }
        self.release_finished()?;
        Ok(true)
    }

    /// Checks decode memory (retracting when the step does not fit), updates the new-token
    /// ratio, then runs one decode or speculative step for the running batch.
    fn decode(&mut self) -> Result<(), String> {
        if self.running.is_empty() {
            return Ok(());
        }
        let retractions_before = self.stats.retractions;
        let spec_reserve = self.args.spec_reserve();
        let mut fits = self.decode_fits()?;
        if !fits && self.chunked.is_some() {
            // The chunked request holds pages outside the running batch, where `retract_decode`
            // cannot reach them: it goes first, or a running request that fits the pool alone
            // could be aborted for want of them.
            self.retract_chunked()?;
            fits = self.decode_fits()?;
        }
        if !fits {
            let outcome = timed(&mut self.step_ns, || {
                retract_decode(&mut self.running, &mut self.cache, spec_reserve)
            })
            .map_err(|e| format!("retract_decode: {e}"))?;
            self.record_retractions(outcome.retracted.len());
            self.stats.aborted += outcome.aborted.len() as u64;
            for req in outcome.retracted.into_iter().rev() {
                self.waiting.push_front(req);
            }
        }
        self.update_new_token_ratio(self.stats.retractions > retractions_before);
        if self.running.is_empty() {
            return Ok(());
        }
        let running = std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new()));
        self.running = match spec_reserve {
            None => self.plain_decode(running)?,
            Some(reserve) => self.spec_decode(running, reserve)?,
        };
        self.sample_verify()?;
        self.release_finished()
    }

    /// sglang's update at a decode step: after a retraction, the estimate from the requests
    /// still running; otherwise one step of decay.
    fn update_new_token_ratio(&mut self, retracted: bool) {
        let Some(ratio) = &mut self.new_token_ratio else {
            return;
        };
        if retracted {
            let output_len = &self.output_len;
            ratio.after_retraction(
                self.running
                    .reqs()
                    .iter()
                    .map(|req| (req.output_ids().len(), output_len[req.rid() as usize])),
            );
        } else {
            ratio.decay();
        }
    }

    /// Whether the running batch's next decode step fits, evicting the prefix-cache shortfall.
    fn decode_fits(&mut self) -> Result<bool, String> {
        let spec_reserve = self.args.spec_reserve();
        timed(&mut self.step_ns, || {
            check_decode_mem(self.running.reqs(), &mut self.cache, spec_reserve)
        })
        .map_err(|e| format!("check_decode_mem: {e}"))
    }

    /// Releases the chunked request's KV (its cached prefix stays in the tree, unlocked) and
    /// re-queues it first, to recompute on re-admission.
    fn retract_chunked(&mut self) -> Result<(), String> {
        let Some(mut req) = self.chunked.take() else {
            return Ok(());
        };
        timed(&mut self.step_ns, || {
            release_kv_cache(&mut req, &mut self.cache, false)?;
            reset_for_retract(&mut req)
        })
        .map_err(|e| format!("retract chunked request {}: {e}", req.rid()))?;
        self.record_retractions(1);
        self.waiting.push_front(req);
        Ok(())
    }

    /// Counts `count` retractions at this step.
    fn record_retractions(&mut self, count: usize) {
        self.stats.retractions += count as u64;
        if count > 0 && self.stats.retraction_steps.last() != Some(&self.stats.steps) {
            self.stats.retraction_steps.push(self.stats.steps);
        }
    }

    fn plain_decode(&mut self, running: ScheduleBatch) -> Result<ScheduleBatch, String> {
        let cache = &mut self.cache;
        let mut batch = timed(&mut self.step_ns, || {
            let prepared = prepare_for_decode(running, cache).map_err(|(_, e)| e)?;
            alloc_for_decode(prepared, cache).map_err(|failure| failure.error)
        })
        .map_err(|e| format!("decode after check_decode_mem passed: {e}"))?;
        let stores: Vec<TokenKv> = batch
            .out_positions()
            .zip(batch.out_cache_loc())
            .map(|((req, positions), &slot)| {
                let position = positions.start;
                TokenKv {
                    slot,
                    adapter: req.namespace(),
                    token: req.fill_ids()[position],
                    position,
                }
            })
            .collect();
        self.kv.store(&stores)?;
        self.stats.tokens_decoded += stores.len() as u64;
        for req in batch.reqs_mut() {
            let index = req.output_ids().len();
            req.push_output(output_token(req.rid(), index));
        }
        Ok(batch)
    }

    fn spec_decode(
        &mut self,
        running: ScheduleBatch,
        reserve: usize,
    ) -> Result<ScheduleBatch, String> {
        let cache = &mut self.cache;
        let mut batch = timed(&mut self.step_ns, || {
            let prepared = prepare_for_spec_decode(running, cache, reserve).map_err(|(_, e)| e)?;
            alloc_for_spec_decode(prepared, cache).map_err(|failure| failure.error)
        })
        .map_err(|e| format!("speculative reserve after check_decode_mem passed: {e}"))?;
        let accepted: Vec<usize> = batch
            .reqs()
            .iter()
            .map(|req| {
                let mut run = 1;
                while run < self.args.spec_tokens && self.rng.gen_bool(self.args.accept_rate) {
                    run += 1;
                }
                run.min(self.output_len[req.rid() as usize] - req.output_ids().len())
            })
            .collect();
        let starts: Vec<usize> = batch
            .reqs()
            .iter()
            .map(|r| r.kv().kv_committed_len())
            .collect();
        timed(&mut self.step_ns, || {
            commit_spec_tokens(&mut batch, &accepted)
        })
        .map_err(|e| format!("commit_spec_tokens: {e}"))?;
        let mut stores = Vec::new();
        for ((req, &count), &start) in batch.reqs_mut().iter_mut().zip(&accepted).zip(&starts) {
            for _ in 0..count {
                let index = req.output_ids().len();
                req.push_output(output_token(req.rid(), index));
            }
            let row = req
                .kv()
                .req_pool_idx()
                .expect("a running request holds a row");
            let table = self
                .cache
                .req_to_token()
                .row(row)
                .map_err(|e| e.to_string())?;
            let committed = start..start + count;
            for ((position, &slot), &token) in committed
                .clone()
                .zip(&table[committed.clone()])
                .zip(&req.fill_ids()[committed])
            {
                stores.push(TokenKv {
                    slot,
                    adapter: req.namespace(),
                    token,
                    position,
                });
            }
        }
        self.kv.store(&stores)?;
        self.stats.tokens_decoded += stores.len() as u64;
        Ok(batch)
    }

    /// Reads back the K/V of one random committed position of one random running request.
    fn sample_verify(&mut self) -> Result<(), String> {
        if self.running.is_empty() {
            return Ok(());
        }
        let req = &self.running.reqs()[self.rng.gen_range(0..self.running.len())];
        let position = self.rng.gen_range(0..req.kv().kv_committed_len());
        let row = req
            .kv()
            .req_pool_idx()
            .expect("a running request holds a row");
        let slot = self
            .cache
            .req_to_token()
            .row(row)
            .map_err(|e| e.to_string())?[position];
        let token = req.fill_ids()[position];
        self.kv.verify(TokenKv {
            slot,
            adapter: req.namespace(),
            token,
            position,
        })
    }

    /// Releases the running requests that produced all their outputs, inserting their KV
    /// into the prefix cache, as one free group.
    fn release_finished(&mut self) -> Result<(), String> {
        let output_len = &self.output_len;
        let mut finished = self
            .running
            .take_if(|req| req.output_ids().len() >= output_len[req.rid() as usize]);
        if finished.is_empty() {
            return Ok(());
        }
        let cache = &mut self.cache;
        timed(&mut self.step_ns, || {
            let mut group = cache.free_group()?;
            for req in &mut finished {
                release_kv_cache(req, &mut group, true)?;
            }
            group.commit();
            Ok::<_, kvown::error::KvError>(())
        })
        .map_err(|e| format!("release: {e}"))?;
        self.stats.finished += finished.len() as u64;
        Ok(())
    }

    fn record_occupancy(&mut self) {
        let page_size = self.cache.page_size();
        let tree = self.cache.tree();
        let free = self.cache.available_size() / page_size;
        let cached_evictable = tree.evictable_size() / page_size;
        let cached_locked = tree.protected_size() / page_size;
        let total = self.cache.allocator().capacity() / page_size;
        let request_owned = total - free - cached_evictable - cached_locked;
        self.stats.peak_pages_in_use = self.stats.peak_pages_in_use.max(total - free);
        self.stats.occupancy.push(Occupancy {
            request_owned,
            cached_evictable,
            cached_locked,
            free,
        });
    }

    /// Ends the run: the checker over the (empty) request set, full eviction, and the pool
    /// and the request table back at full capacity.
    pub fn finish(&mut self) -> Result<(), String> {
        if !self.is_done() {
            return Err("finish called with requests still in flight".into());
        }
        self.check()?;
        if let Some(link) = &mut self.prefill {
            link.finish()?;
        }
        self.verify_cache_events()?;
        evict_everything(&mut self.cache)?;
        // The eviction's events empty the replay.
        self.replay_cache_events()?;
        self.check_here()?;
        check_whole(&self.cache)
    }
}

/// Evicts all the prefix cache of `cache` holds (the end of a run, every request released).
pub fn evict_everything<M: TableMirror>(
    cache: &mut KvCache<PagedAllocator, M>,
) -> Result<(), String> {
    let capacity = cache.allocator().capacity();
    cache
        .evict_shortfall(capacity)
        .map(|_| ())
        .map_err(|e| format!("final eviction: {e}"))
}

/// Fails, naming what is missing, unless every slot and request row of `cache` is free: after
/// every request's release and the final eviction, anything else is a leak.
pub fn check_whole<M: TableMirror>(cache: &KvCache<PagedAllocator, M>) -> Result<(), String> {
    let (free, capacity) = (cache.available_size(), cache.allocator().capacity());
    let rows = cache.req_to_token();
    if free != capacity || rows.available_size() != rows.size() {
        return Err(format!(
            "leak: {free} of {capacity} slots free, {} of {} request rows free after \
             releasing everything and evicting the cache",
            rows.available_size(),
            rows.size()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use kvown::kv::new_host_pool;

    use super::*;
    use crate::{host_bookkeeping, kv_data, workload};

    /// An engine on the host over the workload `args` describe.
    fn host_engine(args: &Args) -> Engine<'_, ()> {
        let jobs = workload::generate(args);
        let (allocator, table, tree) = host_bookkeeping(args, &jobs).expect("bookkeeping");
        let cache = KvCache::new(allocator, table, tree).expect("a cache");
        let layout = kv_data::layout(args.pool_tokens, args.page_size).expect("a layout");
        let store = KvStore::new(new_host_pool(layout, kv_data::DTYPE).unwrap());
        Engine::new(args, cache, store, jobs)
    }

    /// Two requests of 16 prompt and `output` output tokens arriving at step 1, no shared
    /// prefixes, pages of 16, a pool of `pool_pages`; then `flags`.
    fn two_requests(output: &str, pool_pages: usize, flags: &[&str]) -> Args {
        let pool = (pool_pages * 16).to_string();
        let workload = [
            "--requests",
            "2",
            "--arrival-rate",
            "2",
            "--prompt-len",
            "16",
            "--output-len",
            output,
            "--shared-prefix-fraction",
            "0",
            "--page-size",
            "16",
            "--pool-tokens",
            &pool,
        ];
        Args::from_flags(&[&workload[..], flags].concat())
    }

    fn ratio(engine: &Engine<'_, ()>) -> f64 {
        engine
            .new_token_ratio
            .as_ref()
            .expect("--admission ratio")
            .current()
    }

    #[test]
    fn ratio_admission_reserves_the_admitted_and_the_running_requests_growth() {
        // Each request lives in 16 + 63 computed positions, five pages; the pool has nine.
        let running_after_two_steps = |admission| {
            let args = two_requests("64", 9, &["--admission", admission]);
            let mut engine = host_engine(&args);
            (0..2)
                .map(|_| {
                    engine.step().expect("a step");
                    engine.running.len()
                })
                .collect::<Vec<_>>()
        };
        // next-step: a page of prompt and a page of headroom each; both fit at step 1.
        assert_eq!(running_after_two_steps("next-step"), [2, 2]);
        // ratio, step 1: the first request reserves its whole life (5 pages), and the second's
        // 5 more do not fit. Step 2: the first (2 pages held) is expected to grow by
        // 62 x 0.699 = 44 slots, and 44 + 80 slots do not fit the 112 free; without the
        // running request's estimate they would.
        assert_eq!(running_after_two_steps("ratio"), [1, 1]);
    }

    #[test]
    fn ratio_admission_reserves_an_admitted_requests_speculative_step() {
        // Lives of 16 + 1 positions, and with a reservation of 2 x 16 ahead of the 16 committed
        // at the first speculative step, three pages each, in a pool of five. The admitted
        // request decodes in the same step, so it must leave room for that reservation (two
        // pages past its prompt's), not only for its one remaining output (one page): the
        // second request waits instead of being admitted and retracted in the same step.
        let args = two_requests(
            "2",
            5,
            &["--admission", "ratio", "--spec", "--spec-tokens", "16"],
        );
        let mut engine = host_engine(&args);
        engine.step().expect("a step");
        assert_eq!(
            (engine.stats.finished, engine.waiting.len()),
            (1, 1),
            "the first request finished, the second waits"
        );
        assert_eq!(
            engine.stats.retractions, 0,
            "nothing admitted was retracted"
        );
        while !engine.is_done() {
            engine.step().expect("a step");
        }
        assert_eq!((engine.stats.finished, engine.stats.retractions), (2, 0));
    }

    #[test]
    fn the_new_token_ratio_decays_per_decode_step_and_resets_when_idle() {
        // One request of 16 + 8 tokens arrives at step 100, another at step 200.
        let args = Args::from_flags(&[
            "--admission",
            "ratio",
            "--requests",
            "2",
            "--arrival-rate",
            "0.01",
            "--prompt-len",
            "16",
            "--output-len",
            "8",
        ]);
        let mut engine = host_engine(&args);
        let decay = 0.7 * 0.86 / 600.0;
        for _ in 0..99 {
            engine.step().expect("a step");
            assert_eq!(ratio(&engine), 0.7, "idle at step {}", engine.stats.steps);
        }
        // Steps 100-106: the first output comes from the extend, the other seven from decode
        // steps, each one step of decay.
        for decoded in 1..=7 {
            engine.step().expect("a step");
            let expected = 0.7 - decoded as f64 * decay;
            assert!((ratio(&engine) - expected).abs() < 1e-12, "{decoded}");
        }
        assert_eq!(engine.stats.finished, 1);
        engine.step().expect("a step");
        assert_eq!(ratio(&engine), 0.7, "idle again");
    }

    #[test]
    fn a_retraction_sets_the_new_token_ratio_from_the_request_left_running() {
        // Lives of 16 + 199 positions, 14 pages each, in a pool of 20. A ratio of 0.05 expects
        // the first request to need 10 more slots at step 2 and lets the second in; the two
        // outgrow the pool and the second (fewer outputs) is retracted.
        let args = two_requests(
            "200",
            20,
            &["--admission", "ratio", "--new-token-ratio", "0.05"],
        );
        let mut engine = host_engine(&args);
        engine.step().expect("a step");
        while engine.stats.retractions == 0 {
            assert!(
                ratio(&engine) < 0.05,
                "decaying at step {}",
                engine.stats.steps
            );
            assert!(engine.stats.steps < 400, "no retraction");
            engine.step().expect("a step");
        }
        assert_eq!(engine.running.len(), 1);
        // Its outputs when the estimate was made (before this step's decode), 20 steps of
        // headroom, over 200 outputs + 1.
        let decoded = engine.running.reqs()[0].output_ids().len() - 1;
        let expected = (decoded + 20) as f64 / 201.0;
        assert!(
            expected < 1.0,
            "{decoded} decoded: the cap would hide the estimate"
        );
        assert_eq!(ratio(&engine), expected);
    }
}
