//! The staging ring: `depth` slots of host memory that packets are written into and shipped
//! from, each reused only once the device has copied what it last held.

use crate::error::CudaError;

/// The device side of a staging ring: where the ring's host memory lives, and what shipping a
/// slot does. [`CudaStepLink`](super::CudaStepLink) is the GPU's (pinned memory, one async
/// copy and one scatter launch per packet, an event per slot); [`HostLink`] keeps the packets
/// in host memory and ships nothing.
pub trait StepLink {
    /// Slots in the ring.
    fn depth(&self) -> usize;
    /// Words each slot holds.
    fn slot_words(&self) -> usize;
    /// The device table's shape: `(rows, positions per row)`.
    fn table_shape(&self) -> (usize, usize);
    /// With `Some(batch)`, decode packets of up to `batch` requests are laid out at fixed
    /// offsets (flat indices `batch` words after the slot area's start) and shipped by replaying
    /// a captured graph.
    fn decode_graph_batch(&self) -> Option<usize>;
    /// The host memory of slot `k`. The ring writes it only while slot `k` is free.
    fn slot_mut(&mut self, k: usize) -> &mut [u32];
    /// Ships the first `words` words of slot `k` (one copy to the device and one scatter), and
    /// marks slot `k` busy until that copy completes. `graph`: a decode packet in the fixed
    /// layout, shipped by replaying slot `k`'s decode graph.
    fn ship(&mut self, k: usize, words: usize, graph: bool) -> Result<(), CudaError>;
    /// Whether slot `k`'s last copy has completed. Never blocks.
    fn is_free(&self, k: usize) -> Result<bool, CudaError>;
    /// Blocks until slot `k`'s last copy has completed.
    fn wait_free(&mut self, k: usize) -> Result<(), CudaError>;
}

/// What a ring has shipped.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StagingStats {
    /// Packets shipped (each one copy and one scatter).
    pub packets: u64,
    /// Words shipped.
    pub words: u64,
    /// Times the host found the next slot still being copied and waited for it: the host ran
    /// a whole ring ahead of the device.
    pub waits: u64,
    /// Packets shipped ahead of a call's main packet because its row writes did not fit one
    /// slot (long matched prefixes).
    pub spilled: u64,
}

/// A ring of `depth` packet slots over a [`StepLink`], used in order.
#[derive(Debug)]
pub struct StagingRing<L> {
    link: L,
    next: usize,
    /// Whether the next slot was found free and is being written (no second check).
    acquired: bool,
    stats: StagingStats,
}

impl<L: StepLink> StagingRing<L> {
    /// A ring over `link`'s slots, starting at slot 0.
    pub fn new(link: L) -> Self {
        StagingRing {
            link,
            next: 0,
            acquired: false,
            stats: StagingStats::default(),
        }
    }

    /// The link.
    pub fn link(&self) -> &L {
        &self.link
    }

    /// What the ring has shipped.
    pub fn stats(&self) -> StagingStats {
        self.stats
    }

    /// The next slot's memory, once the device has copied what it last held (waiting for that
    /// when the host is a whole ring ahead).
    pub(crate) fn acquire(&mut self) -> Result<&mut [u32], CudaError> {
        let k = self.next;
        if !self.acquired && !self.link.is_free(k)? {
            self.stats.waits += 1;
            self.link.wait_free(k)?;
        }
        self.acquired = true;
        Ok(self.link.slot_mut(k))
    }

    /// Ships the first `words` words of the acquired slot and moves to the next; returns the
    /// slot shipped.
    pub(crate) fn ship(&mut self, words: usize, graph: bool) -> Result<usize, CudaError> {
        let k = self.next;
        self.link.ship(k, words, graph)?;
        self.acquired = false;
        self.next = (k + 1) % self.link.depth();
        self.stats.packets += 1;
        self.stats.words += words as u64;
        Ok(k)
    }

    /// Counts `packets` shipped ahead of their call's main packet.
    pub(crate) fn count_spill(&mut self, packets: u64) {
        self.stats.spilled += packets;
    }
}

/// A link whose ring is plain host memory and whose ship does nothing but note the packet: the
/// staging's host cost alone (the bench), and the packets for tests to read.
#[derive(Debug, Clone)]
pub struct HostLink {
    slots: Vec<Vec<u32>>,
    shipped: Vec<usize>,
    table_shape: (usize, usize),
}

impl HostLink {
    /// `depth` slots of `slot_words` words for a table of `table_shape` `(rows, width)`.
    ///
    /// # Panics
    /// When `depth` is 0: a ring has at least one slot.
    pub fn new(depth: usize, slot_words: usize, table_shape: (usize, usize)) -> Self {
        assert!(depth > 0, "a ring has at least one slot");
        HostLink {
            slots: vec![vec![0; slot_words]; depth],
            shipped: vec![0; depth],
            table_shape,
        }
    }

    /// The words last shipped from slot `k`.
    pub fn shipped(&self, k: usize) -> &[u32] {
        &self.slots[k][..self.shipped[k]]
    }
}

impl StepLink for HostLink {
    fn depth(&self) -> usize {
        self.slots.len()
    }

    fn slot_words(&self) -> usize {
        self.slots[0].len()
    }

    fn table_shape(&self) -> (usize, usize) {
        self.table_shape
    }

    fn decode_graph_batch(&self) -> Option<usize> {
        None
    }

    fn slot_mut(&mut self, k: usize) -> &mut [u32] {
        &mut self.slots[k]
    }

    fn ship(&mut self, k: usize, words: usize, _graph: bool) -> Result<(), CudaError> {
        self.shipped[k] = words;
        Ok(())
    }

    fn is_free(&self, _k: usize) -> Result<bool, CudaError> {
        Ok(true)
    }

    fn wait_free(&mut self, _k: usize) -> Result<(), CudaError> {
        Ok(())
    }
}
