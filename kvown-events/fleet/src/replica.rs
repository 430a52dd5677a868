//! One kvown engine replica: a paged KV cache with a radix prefix cache and its events on,
//! driven through the runtime's batch flow (match, extend, decode, release, retract). It
//! computes nothing: what it measures is which prompt tokens its prefix cache spares.

use std::collections::HashMap;

use kvown_runtime::alloc::PagedAllocator;
use kvown_runtime::batch::Req;
use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_decode, alloc_for_extend, prepare_for_decode, prepare_for_extend,
    release_kv_cache, reset_for_retract,
};
use kvown_runtime::batch::{cache_unfinished_req, init_next_round_input};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::error::KvError;
use kvown_runtime::radix::{CacheEvent, Namespace, RadixCache, RadixConfig, TreePos};
use kvown_runtime::slots::ReqToTokenPool;

/// What a prompt's admission found in the prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Admission {
    /// Prompt tokens whose KV the prefix cache held.
    pub cached_tokens: usize,
    /// Prompt tokens the prefill computes.
    pub computed_tokens: usize,
}

/// A replica: its KV cache (events on), the requests it is decoding, and the reply each
/// still has to produce.
pub struct Replica {
    cache: KvCache<PagedAllocator>,
    running: ScheduleBatch,
    replies: HashMap<u64, Vec<u32>>,
    next_rid: u64,
    register_pages: bool,
}

impl Replica {
    /// A replica with `pool_tokens` KV slots in pages of `page_size`, room for `max_running`
    /// requests of up to `max_context` tokens, and its cache events on (the stream opens
    /// with `Cleared`). With `register_pages`, a decoding request hands each page to the
    /// prefix cache as it fills.
    pub fn new(
        pool_tokens: usize,
        page_size: usize,
        max_running: usize,
        max_context: usize,
        register_pages: bool,
    ) -> Replica {
        let allocator = PagedAllocator::new(pool_tokens, page_size, false).expect("pool");
        let rows = ReqToTokenPool::new(max_running + 1, max_context).expect("rows");
        let tree = RadixCache::new(RadixConfig::new(page_size)).expect("page size");
        let tree = TreeCache::Radix(tree);
        let mut cache = KvCache::new(allocator, rows, tree).expect("cache");
        assert!(cache.enable_cache_events());
        Replica {
            cache,
            running: ScheduleBatch::new(Vec::new()),
            replies: HashMap::new(),
            next_rid: 0,
            register_pages,
        }
    }

    /// Requests decoding.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Pages the prefix cache holds.
    pub fn cached_pages(&self) -> usize {
        self.cache
            .tree()
            .radix()
            .map_or(0, |tree| tree.sizes().total())
            / self.cache.page_size()
    }

    /// The events since the last call.
    pub fn take_events(&mut self) -> Vec<CacheEvent> {
        self.cache.take_cache_events()
    }

    /// Restarts the event stream: `Cleared`, then a store of every cached page.
    pub fn restart_events(&mut self) {
        self.cache.enable_cache_events();
    }

    /// Evicts unlocked cached pages until `tokens` slots are free (or nothing is left to
    /// evict); returns the tokens evicted.
    pub fn evict(&mut self, tokens: usize) -> Result<usize, KvError> {
        self.cache.evict_shortfall(tokens)
    }

    /// How many leading tokens of `tokens` the replica's own prefix match finds in
    /// `namespace`: the match step a request runs before its prefill (its lock dropped again).
    pub fn probe(&mut self, namespace: Namespace, tokens: &[u32]) -> Result<usize, KvError> {
        // The match leaves a request's last token to compute: one token more makes it look
        // at all of `tokens`.
        let mut key = tokens.to_vec();
        key.push(u32::MAX);
        let mut req = Req::new_in(namespace, self.take_rid(), key);
        init_next_round_input(&mut req, &mut self.cache, usize::MAX)?;
        let matched = req.prefix_len();
        if req.last_node() != TreePos::ROOT {
            release_kv_cache(&mut req, &mut self.cache, false)?;
        }
        Ok(matched)
    }

    /// Admits a request for `prompt` in `namespace` that will reply `reply` (at least one
    /// token): matches its prefix, prefills the rest (evicting what it must) and produces the
    /// first reply token. On failure (no room) the request is dropped and nothing stays held.
    pub fn admit(
        &mut self,
        namespace: Namespace,
        prompt: Vec<u32>,
        reply: Vec<u32>,
    ) -> Result<Admission, KvError> {
        let prompt_len = prompt.len();
        let req = Req::new_in(namespace, self.take_rid(), prompt);
        let admission = self.extend(req, reply)?;
        debug_assert_eq!(
            admission.cached_tokens + admission.computed_tokens,
            prompt_len
        );
        Ok(admission)
    }

    /// Serves a whole request: admits it and decodes until its reply is out (as the only
    /// request, so it cannot be retracted), then releases it into the prefix cache.
    pub fn serve(
        &mut self,
        namespace: Namespace,
        prompt: Vec<u32>,
        reply: Vec<u32>,
    ) -> Result<Admission, KvError> {
        let admission = self.admit(namespace, prompt, reply)?;
        while self.running() > 0 {
            self.decode_step()?;
        }
        Ok(admission)
    }

    /// One decode step for every running request (each produces its next reply token); the
    /// requests whose reply is out are released into the prefix cache. When the step does
    /// not fit, the running request admitted last is retracted and returned (its KV released
    /// without caching, ready for [`Replica::readmit`]) and the step is not run.
    pub fn decode_step(&mut self) -> Result<Option<Req>, KvError> {
        if self.running.is_empty() {
            return Ok(None);
        }
        let running = std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new()));
        let prepared = match prepare_for_decode(running, &self.cache) {
            Ok(prepared) => prepared,
            Err((running, error)) => {
                self.running = running;
                return Err(error);
            }
        };
        match alloc_for_decode(prepared, &mut self.cache) {
            Ok(batch) => self.running = batch,
            Err(failure) => {
                self.running = failure.batch.cancel();
                return self.retract_last().map(Some);
            }
        }
        for req in self.running.reqs_mut() {
            let reply = &self.replies[&req.rid()];
            if let Some(&token) = reply.get(req.output_ids().len()) {
                req.push_output(token);
            }
        }
        if self.register_pages {
            let mut reqs =
                std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new())).into_reqs();
            for req in &mut reqs {
                cache_unfinished_req(req, &mut self.cache)?;
            }
            self.running.extend_reqs(reqs);
        }
        self.release_finished()?;
        Ok(None)
    }

    /// Retracts the running request admitted last: its KV is released without caching and it
    /// is returned, ready for [`Replica::readmit`].
    pub fn retract_last(&mut self) -> Result<Req, KvError> {
        let last = self.running.reqs().last().map(Req::rid);
        let mut taken = self.running.take_if(|req| Some(req.rid()) == last);
        let mut req = taken.pop().expect("retract_last needs a running request");
        release_kv_cache(&mut req, &mut self.cache, false)?;
        reset_for_retract(&mut req)?;
        Ok(req)
    }

    /// Admits a retracted request again: it matches what it can of its prompt and reply so
    /// far, and recomputes the rest.
    pub fn readmit(&mut self, req: Req) -> Result<Admission, KvError> {
        let reply = self
            .replies
            .remove(&req.rid())
            .expect("a retracted request's reply");
        self.extend(req, reply)
    }

    /// Matches, prefills and produces the first (or next) reply token of `req`.
    fn extend(&mut self, mut req: Req, reply: Vec<u32>) -> Result<Admission, KvError> {
        assert!(!reply.is_empty(), "a request replies at least one token");
        init_next_round_input(&mut req, &mut self.cache, usize::MAX)?;
        let cached_tokens = req.prefix_len();
        let computed_tokens = req.fill_ids().len() - cached_tokens;
        let prepared = prepare_for_extend(ScheduleBatch::new(vec![req]));
        let batch = match alloc_for_extend(prepared, &mut self.cache) {
            Ok(batch) => batch,
            Err(failure) => {
                let mut reqs = failure.batch.cancel().into_reqs();
                if reqs[0].last_node() != TreePos::ROOT {
                    release_kv_cache(&mut reqs[0], &mut self.cache, false)?;
                }
                return Err(failure.error);
            }
        };
        let mut reqs = batch.into_reqs();
        let req = &mut reqs[0];
        req.push_output(reply[req.output_ids().len()]);
        self.replies.insert(req.rid(), reply);
        self.running.extend_reqs(reqs);
        self.release_finished()?;
        Ok(Admission {
            cached_tokens,
            computed_tokens,
        })
    }

    /// Releases the requests whose reply is out, caching their KV.
    fn release_finished(&mut self) -> Result<(), KvError> {
        let replies = &self.replies;
        let finished = self
            .running
            .take_if(|req| req.output_ids().len() >= replies[&req.rid()].len());
        for mut req in finished {
            self.replies.remove(&req.rid());
            release_kv_cache(&mut req, &mut self.cache, true)?;
        }
        Ok(())
    }

    fn take_rid(&mut self) -> u64 {
        self.next_rid += 1;
        self.next_rid
    }
}
