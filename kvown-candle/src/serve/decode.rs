//! Decode: check that the running batch's next step fits (evicting, then retracting the
//! chunked request and running requests when it does not), compute one token per request,
//! and release the requests that finished into the prefix cache.

use std::collections::HashMap;

use kvown_runtime::batch::{
    Req, ScheduleBatch, alloc_for_decode, check_decode_mem, prepare_for_decode, release_kv_cache,
    reset_for_retract, retract_decode,
};

#[cfg(feature = "fault-injection")]
use super::fault;
use super::{Budget, Server, StepOutput, timed};
use crate::error::{ModelError, ServeError};
use crate::forward_batch::ForwardBatch;

/// Whether `req` is done: its budget spent or its last token one of `stop_tokens`.
pub(super) fn is_finished(req: &Req, budgets: &HashMap<u64, Budget>, stop_tokens: &[u32]) -> bool {
    let max_new = budgets
        .get(&req.rid())
        .map_or(0, |budget| budget.max_new_tokens);
    req.output_ids().len() >= max_new
        || req
            .output_ids()
            .last()
            .is_some_and(|token| stop_tokens.contains(token))
}

impl Server {
    /// Makes room for the running batch's next step, then runs it.
    pub(super) fn decode(&mut self, out: &mut StepOutput) -> Result<(), ServeError> {
        if self.running.is_empty() {
            return Ok(());
        }
        let mut ns = 0;
        let spec_reserve = self.config.spec_reserve();
        let mut fits = timed(&mut ns, || {
            check_decode_mem(self.running.reqs(), &mut self.node.cache, spec_reserve)
        })?;
        if !fits && self.chunked.is_some() {
            // The chunked request's pages are beyond `retract_decode`'s reach: it goes first.
            self.retract_chunked(&mut ns, out)?;
            fits = timed(&mut ns, || {
                check_decode_mem(self.running.reqs(), &mut self.node.cache, spec_reserve)
            })?;
        }
        if !fits {
            #[cfg(feature = "fault-injection")]
            if let Some(fault) = &mut self.fault {
                fault.before_retract(self.running.reqs(), self.node.cache.req_to_token());
            }
            let outcome = timed(&mut ns, || {
                retract_decode(&mut self.running, &mut self.node.cache, spec_reserve)
            })?;
            for req in outcome.retracted.into_iter().rev() {
                self.stats.retractions += 1;
                out.retracted.push(req.rid());
                self.waiting.push_front(req);
            }
            for req in outcome.aborted {
                self.finished(&req, true, out);
            }
        }
        self.stats.kvown_ns += ns;
        if self.running.is_empty() {
            return Ok(());
        }
        match self.config.spec {
            None => self.plain_decode(out)?,
            Some(spec) => self.spec_decode(spec, out)?,
        }
        self.release_finished(out)
    }

    /// Releases the chunked request's K/V (its registered pages stay cached, unlocked) and
    /// queues it first, to be re-prefilled.
    fn retract_chunked(&mut self, ns: &mut u64, out: &mut StepOutput) -> Result<(), ServeError> {
        let Some(mut req) = self.chunked.take() else {
            return Ok(());
        };
        #[cfg(feature = "fault-injection")]
        if let Some(fault) = &mut self.fault {
            fault.before_retract(std::slice::from_ref(&req), self.node.cache.req_to_token());
        }
        timed(ns, || {
            release_kv_cache(&mut req, &mut self.node.cache, false)?;
            reset_for_retract(&mut req)
        })?;
        self.stats.retractions += 1;
        out.retracted.push(req.rid());
        self.waiting.push_front(req);
        Ok(())
    }

    /// One token per running request: kvown allocates its slot, the model computes it.
    fn plain_decode(&mut self, out: &mut StepOutput) -> Result<(), ServeError> {
        let running = std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new()));
        let mut ns = 0;
        let cache = &mut self.node.cache;
        let (batch, forward) = timed(&mut ns, || -> Result<_, ServeError> {
            let prepared = prepare_for_decode(running, cache).map_err(|(_, error)| error)?;
            let batch = alloc_for_decode(prepared, cache).map_err(|failure| failure.error)?;
            let forward = ForwardBatch::from_allocation(&batch, cache.req_to_token())
                .map_err(ModelError::from)?;
            Ok((batch, forward))
        })?;
        self.stats.kvown_ns += ns;
        #[cfg(feature = "fault-injection")]
        let forward = self.inject(&batch, forward, fault::FaultState::on_decode);
        let logits = timed(&mut self.stats.model_ns, || {
            self.model.forward(&forward, &mut self.node.pool)
        })?;
        self.stats.decode_tokens += batch.len() as u64;
        let mut reqs = batch.into_reqs();
        for (index, req) in reqs.iter_mut().enumerate() {
            let position = req.kv().kv_committed_len() - 1;
            let token = self.sample(req, position, logits.last(index), out);
            req.push_output(token);
        }
        self.running = ScheduleBatch::new(reqs);
        Ok(())
    }

    /// Releases the running requests that finished, inserting their K/V into the prefix cache,
    /// as one free group.
    pub(super) fn release_finished(&mut self, out: &mut StepOutput) -> Result<(), ServeError> {
        let (budgets, stop_tokens) = (&self.budgets, &self.config.stop_tokens);
        let mut finished = self
            .running
            .take_if(|req| is_finished(req, budgets, stop_tokens));
        if finished.is_empty() {
            return Ok(());
        }
        let cache = &mut self.node.cache;
        timed(&mut self.stats.kvown_ns, || -> Result<(), ServeError> {
            let mut group = cache.free_group()?;
            for req in &mut finished {
                release_kv_cache(req, &mut group, true)?;
            }
            group.commit();
            Ok(())
        })?;
        for req in &finished {
            self.finished(req, false, out);
        }
        Ok(())
    }
}
