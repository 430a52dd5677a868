//! Admission and extend: the chunked request and waiting requests are admitted while the pool
//! can hold their extends and the decode step to come (the running batch's next step, and each
//! admitted request's headroom), matched against the prefix cache, allocated, and computed.

use kvown_runtime::alloc::KvAllocator;
use kvown_runtime::batch::{
    Req, ScheduleBatch, alloc_for_extend, cache_unfinished_req, init_next_round_input,
    new_tokens_required_next_decode, prepare_for_extend, release_kv_cache,
};
use kvown_runtime::radix::TreePos;

#[cfg(feature = "fault-injection")]
use super::fault;
use super::{Server, StepOutput, timed};
use crate::error::{ModelError, ServeError};
use crate::forward_batch::ForwardBatch;

impl Server {
    /// Admits what fits and extends it, here or on the prefill node.
    pub(super) fn extend(&mut self, out: &mut StepOutput) -> Result<(), ServeError> {
        let admitted = self.admit()?;
        if admitted.is_empty() {
            return Ok(());
        }
        match self.prefill.is_some() {
            true => self.extend_remotely(admitted, out),
            false => self.extend_here(admitted, out),
        }
    }

    /// Slots an admitted request keeps free past its extend's pages for the decoding to come:
    /// a page (a plain step), or the speculative reservation; never more than it can still use.
    fn decode_headroom(&self, req: &Req) -> usize {
        let wanted = self
            .config
            .spec_reserve()
            .map_or(self.config.page_size, |reserve| self.aligned(reserve));
        let extended = self.aligned(req.extend_end());
        wanted.min(self.lifetime_need(req).saturating_sub(extended))
    }

    /// The chunked request first, then waiting requests in order, within the step's prefill
    /// budget, the table's rows and the pool (free plus evictable). A disaggregated node also
    /// keeps the prompts within what the prefill node's pool holds.
    fn admit(&mut self) -> Result<Vec<Req>, ServeError> {
        let mut ns = 0;
        let spec_reserve = self.config.spec_reserve();
        let mut budget = match self.prefill {
            Some(_) => usize::MAX,
            None => self.config.chunk_size,
        };
        let mut remote_budget = self
            .prefill
            .as_ref()
            .map(|prefill| prefill.node.cache.allocator().capacity());
        let mut reserved = timed(&mut ns, || {
            new_tokens_required_next_decode(
                self.running.reqs(),
                self.config.page_size,
                spec_reserve,
            )
        });
        let mut admitted = Vec::new();
        let mut chunked = self.chunked.take();
        loop {
            let mut req = match chunked.take() {
                Some(req) => req,
                None if self.running.len() + admitted.len() < self.config.max_running => {
                    match self.waiting.pop_front() {
                        Some(req) => req,
                        None => break,
                    }
                }
                None => break,
            };
            let continuing = req.kv().holds_kv();
            timed(&mut ns, || {
                init_next_round_input(&mut req, &mut self.node.cache, budget)
            })?;
            let prefix = req.prefix_len();
            let need =
                self.aligned(req.extend_end()) - self.aligned(prefix) + self.decode_headroom(&req);
            let remote_need = self.aligned(req.fill_ids().len());
            let fits_remote = remote_budget.is_none_or(|left| remote_need <= left);
            if reserved + need > self.node.cache.available_with_eviction() || !fits_remote {
                timed(&mut ns, || unlock(&mut req, self))?;
                match continuing {
                    true => self.chunked = Some(req),
                    false => self.waiting.push_front(req),
                }
                break;
            }
            if !continuing && req.retraction_count == 0 {
                self.stats.prefix_lookup_tokens += req.fill_ids().len() as u64;
                self.stats.prefix_hit_tokens += prefix as u64;
            }
            reserved += need;
            budget -= req.extend_end() - prefix;
            if let Some(left) = &mut remote_budget {
                *left -= remote_need;
            }
            admitted.push(req);
            if budget == 0 {
                break;
            }
        }
        self.stats.kvown_ns += ns;
        Ok(admitted)
    }

    /// Allocates and computes the admitted extends on this node; a request whose prompt is all
    /// in samples its first token and joins the running batch, one mid-way through a chunked
    /// prefill registers its pages with the prefix cache and waits for its next chunk.
    fn extend_here(&mut self, admitted: Vec<Req>, out: &mut StepOutput) -> Result<(), ServeError> {
        let mut ns = 0;
        let cache = &mut self.node.cache;
        let (batch, forward) = timed(&mut ns, || -> Result<_, ServeError> {
            let batch = alloc_for_extend(prepare_for_extend(ScheduleBatch::new(admitted)), cache)
                .map_err(|failure| failure.error)?;
            let forward = ForwardBatch::from_allocation(&batch, cache.req_to_token())
                .map_err(ModelError::from)?;
            Ok((batch, forward))
        })?;
        #[cfg(feature = "fault-injection")]
        let forward = self.inject(&batch, forward, fault::FaultState::on_extend);
        self.stats.prefill_tokens += forward.tokens().len() as u64;
        let logits = timed(&mut self.stats.model_ns, || {
            self.model.forward(&forward, &mut self.node.pool)
        })?;
        for (index, mut req) in batch.into_reqs().into_iter().enumerate() {
            let committed = req.kv().kv_committed_len();
            if committed < req.fill_ids().len() {
                self.report(req.rid(), committed - 1, logits.last(index), None, out);
                timed(&mut ns, || {
                    cache_unfinished_req(&mut req, &mut self.node.cache)
                })?;
                self.chunked = Some(req);
            } else {
                let token = self.sample(&req, committed - 1, logits.last(index), out);
                req.push_output(token);
                self.running.extend_reqs([req]);
            }
        }
        self.stats.kvown_ns += ns;
        self.release_finished(out)
    }
}

/// Drops the prefix lock `init_next_round_input` took for a request that is not admitted.
pub(super) fn unlock(req: &mut Req, server: &mut Server) -> Result<(), ServeError> {
    if !req.kv().holds_kv() && req.last_node() != TreePos::ROOT {
        release_kv_cache(req, &mut server.node.cache, false)?;
    }
    Ok(())
}
