//! The packet: one batch-flow call's results as 32-bit words, in the layout `scatter_step`
//! (`src/kernels/scatter.cu`) reads. The kernel source documents the layout; the word indices
//! here are the same, by name.
//!
//! A packet has a header, a slot area (the step's `out_cache_loc`, then any slots that runs copy
//! from beyond it), decode writes (a flat table index per `out_cache_loc` slot) and runs (a
//! stretch of one row written from the slot area).

/// Words before the slot area.
pub const HEADER: usize = 8;

const N_OUT: usize = 0;
const N_DECODE: usize = 1;
const N_RUNS: usize = 2;
const FLAT_AT: usize = 3;
const RUNS_AT: usize = 4;
const N_SLOTS: usize = 5;

/// Words per run: row, start position, length, first slot in the slot area.
pub const RUN_WORDS: usize = 4;

/// One stretch of a request-to-token row: positions `start..start + len` of `row` get the slot
/// area's words `src..src + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The request's row.
    pub row: u32,
    /// First position written.
    pub start: u32,
    /// Positions written.
    pub len: u32,
    /// Index of the first slot in the slot area.
    pub src: u32,
}

impl Run {
    fn words(self) -> [u32; RUN_WORDS] {
        [self.row, self.start, self.len, self.src]
    }
}

/// Why words do not read as a packet.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// A section ends past the words given.
    #[error("packet section {section} ends at word {end}, past the {len} words given")]
    Truncated {
        /// Which section.
        section: &'static str,
        /// One past its last word.
        end: usize,
        /// Words given.
        len: usize,
    },
    /// A decode write or a run reads past the slot area.
    #[error("packet {section} reads slot {end} of a slot area of {n_slots}")]
    SlotOutOfRange {
        /// Which section.
        section: &'static str,
        /// One past the last slot read.
        end: usize,
        /// Slots in the slot area.
        n_slots: usize,
    },
}

/// Counts and offsets of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) n_out: usize,
    pub(crate) n_decode: usize,
    pub(crate) n_runs: usize,
    pub(crate) flat_at: usize,
    pub(crate) runs_at: usize,
    pub(crate) n_slots: usize,
}

impl Layout {
    /// A packet whose slot area holds `n_slots` slots, the first `n_out` of them the step's
    /// `out_cache_loc`, followed by `n_runs` runs (no decode writes).
    pub(crate) fn runs(n_out: usize, n_slots: usize, n_runs: usize) -> Self {
        let runs_at = HEADER + n_slots;
        Layout {
            n_out,
            n_decode: 0,
            n_runs,
            flat_at: runs_at,
            runs_at,
            n_slots,
        }
    }

    /// A decode packet of `n` writes whose flat indices start `stride` words after the slot
    /// area's start (`n` for the compact layout; a graph's batch size for the fixed one).
    pub(crate) fn decode(n: usize, stride: usize) -> Self {
        debug_assert!(n <= stride);
        let flat_at = HEADER + stride;
        Layout {
            n_out: n,
            n_decode: n,
            n_runs: 0,
            flat_at,
            runs_at: flat_at + n,
            n_slots: n,
        }
    }

    /// Words the packet spans.
    pub(crate) fn words(&self) -> usize {
        self.runs_at + RUN_WORDS * self.n_runs
    }

    /// Writes the header. Every count fits `u32`: the packet fits a ring slot, whose size the
    /// stager checked against `u32` when it was built.
    pub(crate) fn write_header(&self, packet: &mut [u32]) {
        let word = |value: usize| u32::try_from(value).expect("a ring slot's offsets fit u32");
        packet[..HEADER].copy_from_slice(&[
            word(self.n_out),
            word(self.n_decode),
            word(self.n_runs),
            word(self.flat_at),
            word(self.runs_at),
            word(self.n_slots),
            0,
            0,
        ]);
    }
}

/// Writes a run's words at run index `index` of a packet laid out as `layout`.
pub(crate) fn write_run(packet: &mut [u32], layout: &Layout, index: usize, run: Run) {
    let at = layout.runs_at + RUN_WORDS * index;
    packet[at..at + RUN_WORDS].copy_from_slice(&run.words());
}

/// A decode packet being filled as the allocator writes the table: request `i`'s flat table
/// index goes to the decode section as its write is made, and the slots (the step's
/// `out_cache_loc`) are copied in one piece at the end.
pub(crate) struct DecodeWriter<'a> {
    slots: &'a mut [u32],
    flats: &'a mut [u32],
}

impl<'a> DecodeWriter<'a> {
    /// A writer of `layout`'s decode writes into `packet`, whose header it writes.
    pub(crate) fn new(packet: &'a mut [u32], layout: &Layout) -> Self {
        layout.write_header(packet);
        let (head, flats) = packet.split_at_mut(layout.flat_at);
        DecodeWriter {
            slots: &mut head[HEADER..HEADER + layout.n_decode],
            flats: &mut flats[..layout.n_decode],
        }
    }

    /// Records request `request`'s flat table index (which the caller checked against the
    /// device table). The caller records every request of the packet.
    ///
    /// # Panics
    /// When `request` is not below the packet's count.
    #[inline(always)]
    pub(crate) fn record(&mut self, request: usize, flat: usize) {
        self.flats[request] = flat as u32;
    }

    /// Copies the writes' slots, in request order.
    ///
    /// # Panics
    /// When `slots` are not the packet's count.
    pub(crate) fn finish(self, slots: &[u32]) {
        assert!(
            slots.len() == self.slots.len(),
            "a decode packet of {} writes got {} slots",
            self.slots.len(),
            slots.len()
        );
        self.slots.copy_from_slice(slots);
    }
}

/// A packet read back (from a ring slot, or from the device for a check).
#[derive(Debug, Clone, Copy)]
pub struct PacketView<'a> {
    words: &'a [u32],
    n_out: usize,
    n_slots: usize,
    flats: &'a [u32],
    runs: &'a [u32],
}

impl<'a> PacketView<'a> {
    /// Reads `words` as a packet, checking that every section lies inside them and every slot
    /// read lies in the slot area.
    pub fn parse(words: &'a [u32]) -> Result<Self, PacketError> {
        let section = |name, at: usize, len: usize| {
            let end = at.saturating_add(len);
            words.get(at..end).ok_or(PacketError::Truncated {
                section: name,
                end,
                len: words.len(),
            })
        };
        let header = section("header", 0, HEADER)?;
        let value = |index: usize| header[index] as usize;
        let (n_out, n_decode, n_slots) = (value(N_OUT), value(N_DECODE), value(N_SLOTS));
        let slots = section("slots", HEADER, n_slots)?;
        let flats = section("decode", value(FLAT_AT), n_decode)?;
        let runs = section(
            "runs",
            value(RUNS_AT),
            value(N_RUNS).saturating_mul(RUN_WORDS),
        )?;
        let out_of_range = |name, end| PacketError::SlotOutOfRange {
            section: name,
            end,
            n_slots,
        };
        if n_out.max(n_decode) > slots.len() {
            return Err(out_of_range("out_cache_loc", n_out.max(n_decode)));
        }
        for run in runs.chunks_exact(RUN_WORDS) {
            let end = run[3] as usize + run[2] as usize;
            if end > n_slots {
                return Err(out_of_range("run", end));
            }
        }
        Ok(PacketView {
            words,
            n_out,
            n_slots,
            flats,
            runs,
        })
    }

    /// The step's `out_cache_loc` (empty for a packet that only writes rows).
    pub fn out_cache_loc(&self) -> &'a [u32] {
        &self.words[HEADER..HEADER + self.n_out]
    }

    /// The decode writes: `(flat table index, slot)`.
    pub fn decode_writes(&self) -> impl Iterator<Item = (u32, u32)> + 'a {
        let slots = &self.words[HEADER..HEADER + self.n_slots];
        self.flats.iter().copied().zip(slots.iter().copied())
    }

    /// The runs, each with the slots it writes.
    pub fn runs(&self) -> impl Iterator<Item = (Run, &'a [u32])> + 'a {
        let slots = &self.words[HEADER..HEADER + self.n_slots];
        self.runs.chunks_exact(RUN_WORDS).map(move |words| {
            let run = Run {
                row: words[0],
                start: words[1],
                len: words[2],
                src: words[3],
            };
            let from = run.src as usize;
            (run, &slots[from..from + run.len as usize])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_packet_reads_back_as_written_in_both_layouts() {
        for stride in [3, 8] {
            let layout = Layout::decode(3, stride);
            let mut packet = vec![u32::MAX; layout.words()];
            let mut writer = DecodeWriter::new(&mut packet, &layout);
            for (request, flat) in [17, 40, 99].into_iter().enumerate() {
                writer.record(request, flat);
            }
            writer.finish(&[5, 6, 12]);
            let view = PacketView::parse(&packet).unwrap();
            assert_eq!(view.out_cache_loc(), [5, 6, 12]);
            let writes: Vec<_> = view.decode_writes().collect();
            assert_eq!(writes, [(17, 5), (40, 6), (99, 12)], "stride {stride}");
            assert_eq!(view.runs().count(), 0);
        }
    }

    #[test]
    fn a_run_packet_reads_back_as_written() {
        // out_cache_loc [4, 5, 6], then two prefix slots [9, 10] that a run copies.
        let layout = Layout::runs(3, 5, 2);
        let mut packet = vec![0; layout.words()];
        layout.write_header(&mut packet);
        packet[HEADER..HEADER + 5].copy_from_slice(&[4, 5, 6, 9, 10]);
        let prefix = Run {
            row: 2,
            start: 0,
            len: 2,
            src: 3,
        };
        let new = Run {
            row: 2,
            start: 2,
            len: 3,
            src: 0,
        };
        write_run(&mut packet, &layout, 0, prefix);
        write_run(&mut packet, &layout, 1, new);
        let view = PacketView::parse(&packet).unwrap();
        assert_eq!(view.out_cache_loc(), [4, 5, 6]);
        let runs: Vec<_> = view.runs().collect();
        assert_eq!(runs, [(prefix, &[9, 10][..]), (new, &[4, 5, 6][..])]);
    }

    #[test]
    fn parse_refuses_sections_past_the_words_and_runs_past_the_slots() {
        let layout = Layout::runs(0, 2, 1);
        let mut packet = vec![0; layout.words()];
        layout.write_header(&mut packet);
        let run = Run {
            row: 1,
            start: 0,
            len: 3,
            src: 0,
        };
        write_run(&mut packet, &layout, 0, run);
        assert_eq!(
            PacketView::parse(&packet).unwrap_err(),
            PacketError::SlotOutOfRange {
                section: "run",
                end: 3,
                n_slots: 2
            }
        );
        assert!(matches!(
            PacketView::parse(&packet[..layout.words() - 1]),
            Err(PacketError::Truncated {
                section: "runs",
                ..
            })
        ));
    }
}
