//! [`StagedMirror`]: the batch flow's table writes, staged for the device.

use kvown_runtime::alloc::{AllocError, ExtendShape, KvSlot};
use kvown_runtime::cache::{DecodeDone, DecodeStep, ExtendRow, TableMirror};
use kvown_runtime::slots::{ReqRow, ReqToTokenPool};

use super::packet::{DecodeWriter, HEADER, Layout, RUN_WORDS, Run, write_run};
use super::ring::{StagingRing, StagingStats, StepLink};
use crate::error::{CudaError, StagingError};

/// Ring slot size that holds any one call's main packet: its `out_cache_loc` (at most the
/// pool's `capacity` slots) with a run per request (at most one per table row), or a decode
/// packet of one write per row (or of a decode graph's `graph_batch`).
pub fn required_slot_words(capacity: usize, table_rows: usize, graph_batch: usize) -> usize {
    let runs = capacity.saturating_add(table_rows.saturating_mul(RUN_WORDS));
    let decode = table_rows.max(graph_batch).saturating_mul(2);
    HEADER.saturating_add(runs.max(decode))
}

/// The ring slot size [`StagedMirror::new`]'s callers should give their link: the required
/// size plus room for as many matched-prefix slots again as the pool holds, so that an extend
/// ships as one packet unless its new rows copy more than a pool's worth of prefix slots.
pub fn default_slot_words(capacity: usize, table_rows: usize, graph_batch: usize) -> usize {
    required_slot_words(capacity, table_rows, graph_batch).saturating_add(capacity)
}

/// Where the last step's `out_cache_loc` lies on the device: the slot area of ring slot
/// `slot`'s packet, `len` slots from word [`HEADER`]. It stays there until that ring slot is
/// reused, `depth` packets later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShippedOut {
    /// The ring slot.
    pub slot: usize,
    /// Slots in the `out_cache_loc`.
    pub len: usize,
}

/// A link whose device state can be read back, for checks (never needed by a step).
pub trait ReadBack: StepLink {
    /// `row[..len]` of the device table.
    fn read_row(&self, row: ReqRow, len: usize) -> Result<Vec<KvSlot>, CudaError>;
    /// The first `len` slots of ring slot `slot`'s device packet.
    fn read_out(&self, slot: usize, len: usize) -> Result<Vec<KvSlot>, CudaError>;
}

/// The device's copy of a [`KvCache`](kvown_runtime::cache::KvCache)'s request-to-token
/// table, as its [`TableMirror`]: the host allocator makes every decision (it validates, the
/// prefix cache and the checker read it), and each batch-flow step that writes the table
/// ships its writes and its `out_cache_loc` to the device as one packet through a staging ring
/// ([`StepLink`]): one copy and one scatter kernel.
///
/// The device needs nothing else: it keeps no free list (a freed page's slots are simply not
/// read again), and the host never waits for it, except when it runs a whole ring ahead
/// ([`StagingStats::waits`]).
///
/// | batch-flow step | packet |
/// |---|---|
/// | decode (`alloc_for_decode`) | `out_cache_loc` and one table write per request |
/// | extend (`alloc_for_extend`, speculative reserve, transfer preallocation) | `out_cache_loc`, a run per request of its new slots, and of its matched prefix for a new row |
/// | a row pointed at the prefix cache's slots (`cache_unfinished_req`) | that run |
/// | frees, evictions, raw allocator calls | none |
///
/// # Panics
///
/// A step panics when the link fails (a driver error) after the host applied it: the host
/// cannot take it back, and the device table would be stale for good (a decode step waits for
/// its ring slot before the allocator's pass, and a failed wait panics before that pass). A
/// write outside the device table (a mirror built for another table: the cache's rows are
/// checked at construction) panics before anything is shipped, and for a decode step before
/// the host's pass.
#[derive(Debug)]
pub struct StagedMirror<L: StepLink> {
    ring: StagingRing<L>,
    rows: usize,
    width: usize,
    last_out: Option<ShippedOut>,
    /// Runs of the packet being spilled (row writes that do not fit one slot).
    spill: Vec<Run>,
}

impl<L: StepLink> StagedMirror<L> {
    /// Mirrors `table` through `link`, whose device table must have `table`'s shape and whose
    /// ring slots must hold [`required_slot_words`] for a pool of `capacity` slots. The table
    /// may be in use already: the device needs no copy of it, only the rows written from now
    /// on.
    pub fn new(link: L, table: &ReqToTokenPool, capacity: usize) -> Result<Self, StagingError> {
        let host_shape = (table.size() + 1, table.max_context_len());
        if link.table_shape() != host_shape {
            return Err(StagingError::TableMismatch {
                host: host_shape,
                device: link.table_shape(),
            });
        }
        let entries = host_shape.0.saturating_mul(host_shape.1);
        if entries > 1 << 32 {
            return Err(StagingError::TableTooLarge { entries });
        }
        let graph_batch = link.decode_graph_batch().unwrap_or(0);
        let needed = required_slot_words(capacity, host_shape.0, graph_batch);
        let slot_words = link.slot_words();
        if slot_words < needed || u32::try_from(slot_words).is_err() || link.depth() == 0 {
            return Err(StagingError::RingTooSmall {
                slot_words,
                depth: link.depth(),
                needed,
            });
        }
        Ok(StagedMirror {
            ring: StagingRing::new(link),
            rows: host_shape.0,
            width: host_shape.1,
            last_out: None,
            spill: Vec::new(),
        })
    }

    /// The staging ring (its link and what it has shipped).
    pub fn ring(&self) -> &StagingRing<L> {
        &self.ring
    }

    /// What the ring has shipped.
    pub fn stats(&self) -> StagingStats {
        self.ring.stats()
    }

    /// Where the last step that handed out slots left its `out_cache_loc` on the device.
    pub fn last_out_cache_loc(&self) -> Option<ShippedOut> {
        self.last_out
    }

    /// Ships the acquired slot's first `words` words; a link failure panics (see the type's
    /// docs).
    fn ship(&mut self, words: usize, graph: bool) -> usize {
        self.ring
            .ship(words, graph)
            .unwrap_or_else(|error| panic!("staging a packet for the device failed: {error}"))
    }

    /// Ships the acquired slot's packet, whose first `len` slots are the step's
    /// `out_cache_loc`, and records where that lies on the device.
    fn ship_out(&mut self, words: usize, graph: bool, len: usize) {
        let slot = self.ship(words, graph);
        self.last_out = Some(ShippedOut { slot, len });
    }

    /// Ships row writes `(row, start, slots)` as packets without an `out_cache_loc`, as many
    /// as they need (a write longer than a slot is cut into runs).
    fn stage_row_writes<'a>(
        &mut self,
        writes: impl Iterator<Item = (ReqRow, usize, &'a [KvSlot])>,
    ) {
        let capacity = self.ring.link().slot_words();
        self.spill.clear();
        let mut n_slots = 0;
        for (row, start, slots) in writes {
            let mut done = 0;
            while done < slots.len() {
                let used = HEADER + n_slots + RUN_WORDS * (self.spill.len() + 1);
                let room = capacity.saturating_sub(used);
                if room == 0 {
                    self.ship_spill(n_slots);
                    n_slots = 0;
                    continue;
                }
                let take = room.min(slots.len() - done);
                let packet = acquire(&mut self.ring);
                packet[HEADER + n_slots..HEADER + n_slots + take]
                    .copy_from_slice(&slots[done..done + take]);
                self.spill.push(Run {
                    row: row as u32,
                    start: (start + done) as u32,
                    len: take as u32,
                    src: n_slots as u32,
                });
                n_slots += take;
                done += take;
            }
        }
        if !self.spill.is_empty() {
            self.ship_spill(n_slots);
        }
    }

    /// Ships the acquired slot holding `n_slots` slots and the runs of `spill`.
    fn ship_spill(&mut self, n_slots: usize) {
        let layout = Layout::runs(0, n_slots, self.spill.len());
        let packet = acquire(&mut self.ring);
        layout.write_header(packet);
        for (index, &run) in self.spill.iter().enumerate() {
            write_run(packet, &layout, index, run);
        }
        self.ship(layout.words(), false);
        self.spill.clear();
    }

    /// Ships an extend's packet: `out` (its new slots, in request order) and a run per request
    /// of them, with each new row's matched prefix (in the same packet when it fits one slot,
    /// in packets shipped before it otherwise).
    fn stage_extend(&mut self, reqs: &[ExtendShape], rows: &[ExtendRow<'_>], out: &[KvSlot]) {
        let prefix_slots: usize = rows.iter().map(|row| row.prefix.len()).sum();
        let prefix_runs = rows.iter().filter(|row| !row.prefix.is_empty()).count();
        let new_runs = reqs.iter().filter(|s| s.seq_len > s.prefix_len).count();
        let whole = Layout::runs(out.len(), out.len() + prefix_slots, prefix_runs + new_runs);
        let fits = whole.words() <= self.ring.link().slot_words();
        if !fits {
            let prefixes = rows.iter().map(|row| (row.row, 0, row.prefix));
            let before = self.ring.stats().packets;
            self.stage_row_writes(prefixes.filter(|(_, _, prefix)| !prefix.is_empty()));
            self.ring.count_spill(self.ring.stats().packets - before);
        }
        let layout = match fits {
            true => whole,
            false => Layout::runs(out.len(), out.len(), new_runs),
        };
        let packet = acquire(&mut self.ring);
        layout.write_header(packet);
        packet[HEADER..HEADER + out.len()].copy_from_slice(out);
        let (mut run, mut extra, mut offset) = (0, out.len(), 0);
        for (shape, row) in reqs.iter().zip(rows) {
            if fits && !row.prefix.is_empty() {
                let len = row.prefix.len();
                packet[HEADER + extra..HEADER + extra + len].copy_from_slice(row.prefix);
                let prefix = Run {
                    row: row.row as u32,
                    start: 0,
                    len: len as u32,
                    src: extra as u32,
                };
                write_run(packet, &layout, run, prefix);
                (run, extra) = (run + 1, extra + len);
            }
            let len = shape.seq_len - shape.prefix_len;
            if len > 0 {
                let new = Run {
                    row: row.row as u32,
                    start: shape.prefix_len as u32,
                    len: len as u32,
                    src: offset as u32,
                };
                write_run(packet, &layout, run, new);
                (run, offset) = (run + 1, offset + len);
            }
        }
        self.ship_out(layout.words(), false, out.len());
    }

    /// Panics unless every row of the step lies in the device table with room for its
    /// positions (checked before anything is shipped).
    fn check_extend_rows(&self, reqs: &[ExtendShape], rows: &[ExtendRow<'_>]) {
        assert_eq!(
            rows.len(),
            reqs.len(),
            "an extend of {} requests with {} rows",
            reqs.len(),
            rows.len()
        );
        for (index, (shape, row)) in reqs.iter().zip(rows).enumerate() {
            let end = shape.seq_len.max(row.prefix.len());
            assert!(
                row.row < self.rows && end <= self.width,
                "extend: request {index} writes positions up to {end} of row {}, outside the device \
                 table of {} rows of {} positions",
                row.row,
                self.rows,
                self.width
            );
        }
    }
}

/// The next ring slot's memory; a link failure panics (see [`StagedMirror`]'s docs).
fn acquire<L: StepLink>(ring: &mut StagingRing<L>) -> &mut [u32] {
    ring.acquire()
        .unwrap_or_else(|error| panic!("waiting for a staging slot failed: {error}"))
}

impl<L: ReadBack> StagedMirror<L> {
    /// Compares the device with the host: `row[..len]` of each `(row, len)` in `rows`, and the
    /// last `out_cache_loc` against `host_out` when given. Reads the device back: for checks.
    pub fn verify(
        &self,
        table: &ReqToTokenPool,
        rows: impl Iterator<Item = (ReqRow, usize)>,
        host_out: Option<&[KvSlot]>,
    ) -> Result<(), StagingError> {
        let link = self.ring.link();
        for (row, len) in rows {
            let host = &table
                .row(row)
                .map_err(|_| StagingError::RowNotHeld { row })?[..len];
            let device = link.read_row(row, len)?;
            if let Some(position) = (0..len).find(|&i| device[i] != host[i]) {
                return Err(StagingError::RowDiverged {
                    row,
                    position,
                    host: host[position],
                    device: device[position],
                });
            }
        }
        if let (Some(host), Some(shipped)) = (host_out, self.last_out) {
            let device = link.read_out(shipped.slot, shipped.len)?;
            if device != host {
                return Err(StagingError::OutDiverged {
                    host: host.to_vec(),
                    device,
                });
            }
        }
        Ok(())
    }
}

impl<L: StepLink> TableMirror for StagedMirror<L> {
    fn extend<'a>(
        &mut self,
        shapes: &[ExtendShape],
        rows: impl Iterator<Item = ExtendRow<'a>>,
        out: &[KvSlot],
    ) {
        let rows: Vec<ExtendRow<'a>> = rows.collect();
        self.check_extend_rows(shapes, &rows);
        self.stage_extend(shapes, &rows, out);
    }

    /// The step's packet: each write's flat table index, recorded in the ring slot as the
    /// allocator's pass makes the write, then its slots as one copy of the `out_cache_loc`,
    /// laid out for the decode graph when the batch fits one. A refused step ships nothing:
    /// the slot it was recorded in is written afresh by the next packet. A step whose table is
    /// larger than the device's panics before it runs.
    fn decode<'o>(&mut self, step: impl DecodeStep<'o>) -> Result<DecodeDone<'o>, AllocError> {
        let n = step.writes();
        let graph = self.ring.link().decode_graph_batch().filter(|&b| n <= b);
        let layout = Layout::decode(n, graph.unwrap_or(n));
        let entries = self.rows * self.width;
        assert!(
            step.index_bound() <= entries,
            "decode: table indices up to {} lie outside the device table of {entries} entries",
            step.index_bound()
        );
        let mut writer = DecodeWriter::new(acquire(&mut self.ring), &layout);
        let done = step.run(|request, index| writer.record(request, index))?;
        writer.finish(done.out());
        self.ship_out(layout.words(), graph.is_some(), n);
        Ok(done)
    }

    fn row_written(&mut self, row: ReqRow, start_pos: usize, slots: &[KvSlot]) {
        assert!(
            row < self.rows && start_pos + slots.len() <= self.width,
            "row_written: positions {start_pos}..{} of row {row} lie outside the device table \
             of {} rows of {} positions",
            start_pos + slots.len(),
            self.rows,
            self.width
        );
        self.stage_row_writes(std::iter::once((row, start_pos, slots)));
    }
}

#[cfg(test)]
mod tests {
    use kvown_runtime::alloc::{KvAllocator, PagedAllocator, SlotCalls};
    use kvown_runtime::cache::WrittenDecode;

    use super::super::packet::PacketView;
    use super::super::ring::HostLink;
    use super::*;

    #[test]
    fn construction_refuses_a_table_or_ring_that_does_not_fit() {
        let table = ReqToTokenPool::new(4, 64).unwrap();
        let error = StagedMirror::new(HostLink::new(2, 4096, (4, 64)), &table, 64);
        assert!(matches!(
            error,
            Err(StagingError::TableMismatch {
                host: (5, 64),
                device: (4, 64)
            })
        ));
        let needed = required_slot_words(64, 5, 0);
        let error = StagedMirror::new(HostLink::new(2, needed - 1, (5, 64)), &table, 64);
        assert!(matches!(error, Err(StagingError::RingTooSmall { needed: n, .. }) if n == needed));
        assert!(StagedMirror::new(HostLink::new(2, needed, (5, 64)), &table, 64).is_ok());
    }

    #[test]
    fn a_decode_ships_its_out_cache_loc_and_one_write_per_request() {
        let table = ReqToTokenPool::new(4, 64).unwrap();
        let link = HostLink::new(2, default_slot_words(64, 5, 0), (5, 64));
        let mut mirror = StagedMirror::new(link, &table, 64).unwrap();
        let step = WrittenDecode {
            indices: &[64 + 3, 2 * 64 + 9],
            out: &[21, 30],
        };
        mirror.decode(step).unwrap();
        let shipped = mirror.last_out_cache_loc().unwrap();
        let view = PacketView::parse(mirror.ring().link().shipped(shipped.slot)).unwrap();
        assert_eq!(view.out_cache_loc(), [21, 30]);
        assert_eq!(
            view.decode_writes().collect::<Vec<_>>(),
            [(64 + 3, 21), (2 * 64 + 9, 30)]
        );
        assert_eq!(mirror.stats().packets, 1);
    }

    /// Collects every run of the packets shipped from `link`'s slots into per-row tables.
    fn apply_runs(link: &HostLink, rows: usize, width: usize) -> Vec<Vec<KvSlot>> {
        let mut table = vec![vec![0; width]; rows];
        for k in 0..link.depth() {
            if link.shipped(k).is_empty() {
                continue;
            }
            for (run, from) in PacketView::parse(link.shipped(k)).unwrap().runs() {
                table[run.row as usize][run.start as usize..][..from.len()].copy_from_slice(from);
            }
        }
        table
    }

    #[test]
    fn prefixes_that_do_not_fit_one_slot_are_spilled_ahead_of_the_main_packet() {
        let slot_words = required_slot_words(64, 5, 0);
        // A ring deep enough to keep every packet of the step for reading back.
        let table = ReqToTokenPool::new(4, 64).unwrap();
        let mut host = PagedAllocator::new(64, 4, false).unwrap();
        let link = HostLink::new(8, slot_words, (5, 64));
        let mut mirror = StagedMirror::new(link, &table, host.capacity()).unwrap();
        // Four new rows sharing one matched prefix of three pages, each extended by a page:
        // 8 + 16 + 4 * 12 + 8 * 4 = 104 words, more than a slot's 92.
        let mut prefix = Vec::new();
        host.alloc(12, &mut prefix).unwrap();
        let shapes = [ExtendShape {
            prefix_len: 12,
            seq_len: 16,
            last_loc: Some(prefix[11]),
        }; 4];
        let mut out = Vec::new();
        host.alloc_extend(&shapes, &mut out).unwrap();
        let rows = (1..=4).map(|row| ExtendRow {
            row,
            prefix: &prefix,
        });
        mirror.extend(&shapes, rows, &out);
        let stats = mirror.stats();
        assert!(stats.spilled >= 1, "{stats:?}");
        assert_eq!(stats.packets, stats.spilled + 1);
        let table = apply_runs(mirror.ring().link(), 5, 64);
        for row in 1..=4 {
            assert_eq!(table[row][..12], prefix[..], "row {row}");
            assert_eq!(table[row][12..16], out[4 * (row - 1)..4 * row], "row {row}");
        }
        let shipped = mirror.last_out_cache_loc().unwrap();
        let view = PacketView::parse(mirror.ring().link().shipped(shipped.slot)).unwrap();
        assert_eq!(view.out_cache_loc(), out);
    }
}
