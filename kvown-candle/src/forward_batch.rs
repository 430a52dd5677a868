//! [`ForwardBatch`]: one ragged model step as kvown's batch flow describes it (sglang's
//! `ForwardBatch`): the new tokens of every request and their positions, the slots their K/V
//! goes to (`out_cache_loc`), and each request's request-to-token row up to its new length,
//! the only way attention finds its K/V.

use std::ops::Range;

use kvown_runtime::batch::ScheduleBatch;
use kvown_runtime::ids::KvSlot;
use kvown_runtime::slots::ReqToTokenPool;

use crate::error::BatchError;

/// Which logits a request wants from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// Its last new token's (prefill, decode).
    Last,
    /// Every new token's (speculative verification).
    All,
}

/// One request's part of a step.
#[derive(Debug, Clone, Copy)]
pub struct SeqInput<'a> {
    /// The request.
    pub rid: u64,
    /// Its new tokens, at positions `start..start + tokens.len()`.
    pub tokens: &'a [u32],
    /// The position of the first new token (the prefix already in the pool).
    pub start: usize,
    /// Where the new tokens' K/V goes, one slot per token (its part of `out_cache_loc`).
    pub out_slots: &'a [KvSlot],
    /// Its request-to-token row, positions `0..start + tokens.len()`: the slots attention reads.
    pub context: &'a [KvSlot],
    /// Which logits it wants.
    pub logits: LogitRows,
}

/// A request's spans in a [`ForwardBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeqSpan {
    /// The request.
    pub rid: u64,
    /// Its new tokens' indices in the batch's tokens.
    pub extend: Range<usize>,
    /// Its row's indices in the batch's context slots.
    pub context: Range<usize>,
    /// Which logits it wants.
    pub logits: LogitRows,
}

impl SeqSpan {
    /// Position of its first new token.
    pub fn start(&self) -> usize {
        self.context.len() - self.extend.len()
    }
}

/// A ragged step: extends and decodes of any lengths side by side.
#[derive(Debug, Clone, Default)]
pub struct ForwardBatch {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    out_cache_loc: Vec<KvSlot>,
    context_slots: Vec<KvSlot>,
    seqs: Vec<SeqSpan>,
}

impl ForwardBatch {
    /// An empty batch.
    pub fn new() -> ForwardBatch {
        ForwardBatch::default()
    }

    /// Adds one request's part.
    ///
    /// # Errors
    /// Nothing is added when the extend is empty ([`BatchError::EmptyExtend`]), or the slots do
    /// not match the tokens and positions ([`BatchError::ContextLength`]).
    pub fn push(&mut self, seq: SeqInput<'_>) -> Result<(), BatchError> {
        if seq.tokens.is_empty() {
            return Err(BatchError::EmptyExtend { rid: seq.rid });
        }
        let end = seq.start.checked_add(seq.tokens.len());
        if end != Some(seq.context.len()) || seq.out_slots.len() != seq.tokens.len() {
            return Err(BatchError::ContextLength {
                rid: seq.rid,
                start: seq.start,
                extend: seq.tokens.len(),
                out_slots: seq.out_slots.len(),
                context: seq.context.len(),
            });
        }
        let extend = self.tokens.len()..self.tokens.len() + seq.tokens.len();
        let context = self.context_slots.len()..self.context_slots.len() + seq.context.len();
        self.tokens.extend_from_slice(seq.tokens);
        // Positions past u32 are refused by the model (no table is that long).
        self.positions.extend(
            (seq.start..seq.start + seq.tokens.len())
                .map(|position| u32::try_from(position).unwrap_or(u32::MAX)),
        );
        self.out_cache_loc.extend_from_slice(seq.out_slots);
        self.context_slots.extend_from_slice(seq.context);
        self.seqs.push(SeqSpan {
            rid: seq.rid,
            extend,
            context,
            logits: seq.logits,
        });
        Ok(())
    }

    /// The step kvown just allocated for `batch` (after `alloc_for_extend` or
    /// `alloc_for_decode`): each request's new positions ([`ScheduleBatch::out_positions`])
    /// with their tokens, their slots from `out_cache_loc`, and its row from `table`; the last
    /// token's logits each.
    pub fn from_allocation(
        batch: &ScheduleBatch,
        table: &ReqToTokenPool,
    ) -> Result<ForwardBatch, BatchError> {
        let mut forward = ForwardBatch::new();
        let mut offset = 0;
        for (req, positions) in batch.out_positions() {
            let out_slots = &batch.out_cache_loc()[offset..offset + positions.len()];
            offset += positions.len();
            let row = req
                .kv()
                .req_pool_idx()
                .and_then(|row| table.row(row).ok())
                .unwrap_or(&[]);
            forward.push(SeqInput {
                rid: req.rid(),
                tokens: &req.fill_ids()[positions.clone()],
                start: positions.start,
                out_slots,
                context: row.get(..positions.end).unwrap_or(&[]),
                logits: LogitRows::Last,
            })?;
        }
        Ok(forward)
    }

    /// Every new token, in request order.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Every new token's position.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// Where every new token's K/V goes.
    pub fn out_cache_loc(&self) -> &[KvSlot] {
        &self.out_cache_loc
    }

    /// Every request's row (up to its new length), one after another.
    pub fn context_slots(&self) -> &[KvSlot] {
        &self.context_slots
    }

    /// The requests' spans, in order.
    pub fn seqs(&self) -> &[SeqSpan] {
        &self.seqs
    }

    /// Whether the batch has no request.
    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    /// The rows of the logits the requests want, in request order (indices into the tokens).
    pub fn logit_rows(&self) -> Vec<u32> {
        self.seqs
            .iter()
            .flat_map(|seq| match seq.logits {
                LogitRows::Last => seq.extend.end - 1..seq.extend.end,
                LogitRows::All => seq.extend.clone(),
            })
            .map(|row| row as u32)
            .collect()
    }

    /// The batch's context slots, for a fault that rewrites what a row says (test-only).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn context_slots_mut(&mut self) -> &mut [KvSlot] {
        &mut self.context_slots
    }

    /// Drops the first `count` new tokens of request `seq` (fewer than it has), keeping its
    /// row: its extend then starts `count` positions later (test-only fault).
    #[cfg(feature = "fault-injection")]
    pub(crate) fn drop_leading_tokens(&mut self, seq: usize, count: usize) {
        let start = self.seqs[seq].extend.start;
        self.tokens.drain(start..start + count);
        self.positions.drain(start..start + count);
        self.out_cache_loc.drain(start..start + count);
        self.seqs[seq].extend.end -= count;
        for later in &mut self.seqs[seq + 1..] {
            later.extend.start -= count;
            later.extend.end -= count;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ragged_batch_keeps_each_requests_spans() {
        let mut batch = ForwardBatch::new();
        batch
            .push(SeqInput {
                rid: 1,
                tokens: &[5, 6, 7],
                start: 2,
                out_slots: &[12, 13, 14],
                context: &[10, 11, 12, 13, 14],
                logits: LogitRows::All,
            })
            .unwrap();
        batch
            .push(SeqInput {
                rid: 2,
                tokens: &[9],
                start: 3,
                out_slots: &[40],
                context: &[20, 21, 22, 40],
                logits: LogitRows::Last,
            })
            .unwrap();
        assert_eq!(batch.positions(), [2, 3, 4, 3]);
        assert_eq!(batch.out_cache_loc(), [12, 13, 14, 40]);
        assert_eq!(batch.seqs()[1].context, 5..9);
        assert_eq!(batch.seqs()[1].start(), 3);
        assert_eq!(batch.logit_rows(), [0, 1, 2, 3]);
    }

    #[test]
    fn slots_that_do_not_match_the_tokens_are_refused() {
        let mut batch = ForwardBatch::new();
        let refused = batch.push(SeqInput {
            rid: 3,
            tokens: &[1, 2],
            start: 1,
            out_slots: &[5, 6],
            context: &[4, 5],
            logits: LogitRows::Last,
        });
        assert!(matches!(
            refused,
            Err(BatchError::ContextLength { rid: 3, .. })
        ));
        let empty = batch.push(SeqInput {
            rid: 4,
            tokens: &[],
            start: 0,
            out_slots: &[],
            context: &[],
            logits: LogitRows::Last,
        });
        assert_eq!(empty, Err(BatchError::EmptyExtend { rid: 4 }));
        assert!(batch.is_empty());
    }
}
