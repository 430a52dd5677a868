//! Speculative decoding over kvown's reservations: kvown reserves slots ahead of each
//! request's committed length, drafts are proposed (prompt lookup, or the model's own decode
//! steps writing into the reserved slots), one verification step computes the last sampled
//! token and every draft, and kvown commits the run the model agrees with plus its own next
//! token. Each verified token is the one plain decoding would have sampled at that position.

use kvown_runtime::batch::{
    ScheduleBatch, alloc_for_spec_decode, commit_spec_tokens, prepare_for_spec_decode,
};
use kvown_runtime::ids::KvSlot;

use super::{Draft, Server, SpecConfig, StepOutput, timed};
use crate::error::ServeError;
use crate::forward_batch::{ForwardBatch, LogitRows, SeqInput};
use crate::sampling::argmax;

/// Up to `want` tokens that followed the latest earlier occurrence of the last 3 (else 2,
/// else 1) tokens of `tokens` (prompt lookup decoding).
pub(crate) fn ngram_draft(tokens: &[u32], want: usize) -> Vec<u32> {
    for n in (1..=3).rev() {
        if want == 0 || tokens.len() <= n {
            continue;
        }
        let pattern = &tokens[tokens.len() - n..];
        let earlier = (0..tokens.len() - n)
            .rev()
            .find(|&start| &tokens[start..start + n] == pattern);
        if let Some(start) = earlier {
            let follow = &tokens[start + n..];
            return follow.iter().copied().take(want).collect();
        }
    }
    Vec::new()
}

/// One request of a speculative step: its committed length, its row up to its reservation,
/// and how many tokens it verifies at most.
struct SpecSeq {
    committed: usize,
    row: Vec<KvSlot>,
    verify_max: usize,
}

impl Server {
    /// One speculative step for the running batch.
    pub(super) fn spec_decode(
        &mut self,
        spec: SpecConfig,
        out: &mut StepOutput,
    ) -> Result<(), ServeError> {
        let running = std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new()));
        let mut ns = 0;
        let cache = &mut self.node.cache;
        let (mut batch, seqs) = timed(&mut ns, || -> Result<_, ServeError> {
            let prepared = prepare_for_spec_decode(running, cache, spec.reserve())
                .map_err(|(_, error)| error)?;
            let batch = alloc_for_spec_decode(prepared, cache).map_err(|failure| failure.error)?;
            let seqs = batch
                .reqs()
                .iter()
                .map(|req| -> Result<SpecSeq, ServeError> {
                    let kv = req.kv();
                    let row = cache
                        .req_to_token()
                        .row(req.held_row()?)
                        .map_err(|e| ServeError::Kv(e.into()))?;
                    Ok(SpecSeq {
                        committed: kv.kv_committed_len(),
                        row: row[..kv.kv_allocated_len()].to_vec(),
                        verify_max: 0,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok((batch, seqs))
        })?;
        self.stats.kvown_ns += ns;
        let mut seqs = seqs;
        for (seq, req) in seqs.iter_mut().zip(batch.reqs()) {
            seq.verify_max = spec.tokens.min(self.outputs_left(req)).max(1);
        }
        let drafts = match spec.draft {
            Draft::Ngram => batch
                .reqs()
                .iter()
                .zip(&seqs)
                .map(|(req, seq)| ngram_draft(req.fill_ids(), seq.verify_max - 1))
                .collect(),
            Draft::Model => self.model_drafts(&batch, &seqs)?,
        };
        let verify: Vec<Vec<u32>> = batch
            .reqs()
            .iter()
            .zip(&seqs)
            .zip(&drafts)
            .map(|((req, seq), draft)| {
                std::iter::once(req.fill_ids()[seq.committed])
                    .chain(draft.iter().copied())
                    .collect()
            })
            .collect();
        let mut forward = ForwardBatch::new();
        for ((req, seq), tokens) in batch.reqs().iter().zip(&seqs).zip(&verify) {
            let end = seq.committed + tokens.len();
            forward
                .push(SeqInput {
                    rid: req.rid(),
                    tokens,
                    start: seq.committed,
                    out_slots: &seq.row[seq.committed..end],
                    context: &seq.row[..end],
                    logits: LogitRows::All,
                })
                .map_err(crate::error::ModelError::from)?;
        }
        let logits = timed(&mut self.stats.model_ns, || {
            self.model.forward(&forward, &mut self.node.pool)
        })?;
        // Each verified row's token is what plain decoding samples there; the run stops after
        // the first that differs from its draft (that one is the bonus token).
        let mut accepted_tokens: Vec<Vec<u32>> = Vec::with_capacity(seqs.len());
        for (index, ((req, seq), draft)) in batch.reqs().iter().zip(&seqs).zip(&drafts).enumerate()
        {
            let mut tokens = Vec::new();
            for (offset, row) in logits.rows(index).enumerate() {
                let token = self.sample(req, seq.committed + offset, row, out);
                tokens.push(token);
                let stop = self.config.stop_tokens.contains(&token)
                    || tokens.len() >= self.outputs_left(req);
                if stop || draft.get(offset) != Some(&token) {
                    break;
                }
            }
            self.stats.spec_drafted += draft.len() as u64;
            self.stats.spec_accepted += (tokens.len() - 1) as u64;
            accepted_tokens.push(tokens);
        }
        let accepted: Vec<usize> = accepted_tokens.iter().map(Vec::len).collect();
        timed(&mut self.stats.kvown_ns, || {
            commit_spec_tokens(&mut batch, &accepted)
        })?;
        self.stats.decode_tokens += accepted.iter().sum::<usize>() as u64;
        for (req, tokens) in batch.reqs_mut().iter_mut().zip(accepted_tokens) {
            for token in tokens {
                req.push_output(token);
            }
        }
        self.running = batch;
        Ok(())
    }

    /// Drafts from the model itself: greedy decode steps from each request's committed
    /// position, their K/V written into its reserved slots (which verification rewrites).
    fn model_drafts(
        &mut self,
        batch: &ScheduleBatch,
        seqs: &[SpecSeq],
    ) -> Result<Vec<Vec<u32>>, ServeError> {
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); seqs.len()];
        let mut last: Vec<u32> = batch
            .reqs()
            .iter()
            .zip(seqs)
            .map(|(req, seq)| req.fill_ids()[seq.committed])
            .collect();
        let steps = seqs.iter().map(|seq| seq.verify_max - 1).max().unwrap_or(0);
        for step in 0..steps {
            let mut forward = ForwardBatch::new();
            let mut members = Vec::new();
            for (index, (req, seq)) in batch.reqs().iter().zip(seqs).enumerate() {
                if drafts[index].len() + 1 >= seq.verify_max {
                    continue;
                }
                let position = seq.committed + step;
                forward
                    .push(SeqInput {
                        rid: req.rid(),
                        tokens: std::slice::from_ref(&last[index]),
                        start: position,
                        out_slots: &seq.row[position..position + 1],
                        context: &seq.row[..position + 1],
                        logits: LogitRows::Last,
                    })
                    .map_err(crate::error::ModelError::from)?;
                members.push(index);
            }
            let logits = timed(&mut self.stats.model_ns, || {
                self.model.forward(&forward, &mut self.node.pool)
            })?;
            for (seq, &index) in members.iter().enumerate() {
                let token = argmax(logits.last(seq));
                drafts[index].push(token);
                last[index] = token;
            }
        }
        Ok(drafts)
    }
}

#[cfg(test)]
mod tests {
    use super::ngram_draft;

    #[test]
    fn prompt_lookup_follows_the_latest_earlier_match() {
        // The last 3 tokens (7, 8, 9) occurred at 1..4, followed by 4, 5.
        assert_eq!(ngram_draft(&[1, 7, 8, 9, 4, 5, 7, 8, 9], 2), [4, 5]);
        // No 3- or 2-gram match; the last token 6 occurred at 2, followed by 3, 6.
        assert_eq!(ngram_draft(&[1, 2, 6, 3, 6], 4), [3, 6]);
        assert!(ngram_draft(&[1, 2, 3], 4).is_empty());
        assert!(ngram_draft(&[5, 5, 5], 0).is_empty());
    }
}
