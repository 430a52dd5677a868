//! [`EmulatedLink`]: a staging link whose device is the `scatter.cu` kernel compiled as host
//! C++ (`scatter_driver.cpp`), with the device memory a `CudaStepLink` has (a packet buffer per
//! ring slot, the table). Like a GPU it runs behind the host: a shipped packet is copied from
//! its ring slot and scattered only when the device gets to it, so a ring slot rewritten before
//! its copy ran would reach the device rewritten.

use std::cell::RefCell;
use std::collections::VecDeque;

use kvown_cuda::CudaError;
use kvown_cuda::staging::{ReadBack, StepLink, packet::HEADER, scatter_launch};
use kvown_runtime::alloc::KvSlot;
use kvown_runtime::slots::ReqRow;

use super::{Driver, Process};

static DRIVER: Driver = Driver::new("scatter_driver.cpp");

/// When the emulated device runs the packets shipped to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// Each packet as it is shipped.
    Immediate,
    /// Only when the host waits for a slot or reads the device back: the host runs ahead.
    Lagging,
    /// Lagging, and claiming every slot free: a link without events, to show what they guard.
    LaggingWithoutEvents,
}

/// A packet shipped and not yet run: its ring slot and the words its copy takes.
type Shipped = (usize, usize);

pub struct EmulatedLink {
    slots: Vec<Vec<u32>>,
    table_shape: (usize, usize),
    graph_batch: Option<usize>,
    pace: Pace,
    /// The device's queue and the emulator, behind `RefCell`s so that read-backs (which run
    /// the queue first, as a copy on the stream would) work through `&self`.
    queue: RefCell<VecDeque<Shipped>>,
    process: RefCell<Process>,
}

impl EmulatedLink {
    /// `depth` slots of `slot_words` words, a table of `rows` rows of `width`; `Err` says why
    /// the emulator cannot run here.
    pub fn new(
        depth: usize,
        slot_words: usize,
        (rows, width): (usize, usize),
        pace: Pace,
    ) -> Result<Self, &'static str> {
        let mut process = DRIVER.start()?;
        process.send_ok(&format!(
            "init {depth} {slot_words} {} {width}",
            rows * width
        ));
        Ok(EmulatedLink {
            slots: vec![vec![0xdead_beef; slot_words]; depth],
            table_shape: (rows, width),
            graph_batch: None,
            pace,
            queue: RefCell::new(VecDeque::new()),
            process: RefCell::new(process),
        })
    }

    /// Lays decode packets of up to `batch` requests out for a graph, as
    /// `CudaStepLink::capture_decode_graphs` does; each then copies `HEADER + 2 * batch` words.
    pub fn with_decode_graphs(mut self, batch: usize) -> Self {
        self.graph_batch = Some(batch);
        self
    }

    /// Runs the oldest queued packet: copies its ring slot's words as they are now, and
    /// scatters them.
    fn run_one(&self) -> Option<usize> {
        let (k, words) = self.queue.borrow_mut().pop_front()?;
        let mut command = format!("copy {k} {words}");
        for word in &self.slots[k][..words] {
            command.push(' ');
            command.push_str(&word.to_string());
        }
        let mut process = self.process.borrow_mut();
        process.send_ok(&command);
        let (blocks, threads) = scatter_launch(words);
        process.send_ok(&format!("scatter {k} {blocks} {threads}"));
        Some(k)
    }

    /// Runs every queued packet.
    pub fn run_all(&self) {
        while self.run_one().is_some() {}
    }

    fn read(&self, command: String) -> Vec<u32> {
        self.run_all();
        let line = self.process.borrow_mut().send(&command);
        let mut words = line.split_whitespace().map(|w| w.parse::<u32>().unwrap());
        let len = words.next().unwrap() as usize;
        let values: Vec<u32> = words.collect();
        assert_eq!(values.len(), len, "reply to `{command}`");
        values
    }
}

impl StepLink for EmulatedLink {
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
        self.graph_batch
    }

    fn slot_mut(&mut self, k: usize) -> &mut [u32] {
        &mut self.slots[k]
    }

    fn ship(&mut self, k: usize, words: usize, graph: bool) -> Result<(), CudaError> {
        let words = match (graph, self.graph_batch) {
            (true, Some(batch)) => HEADER + 2 * batch,
            (true, None) => panic!("a graph shipped by a link that captured none"),
            (false, _) => words,
        };
        self.queue.get_mut().push_back((k, words));
        if self.pace == Pace::Immediate {
            self.run_all();
        }
        Ok(())
    }

    fn is_free(&self, k: usize) -> Result<bool, CudaError> {
        if self.pace == Pace::LaggingWithoutEvents {
            return Ok(true);
        }
        Ok(!self.queue.borrow().iter().any(|&(queued, _)| queued == k))
    }

    fn wait_free(&mut self, k: usize) -> Result<(), CudaError> {
        while self.queue.get_mut().iter().any(|&(queued, _)| queued == k) {
            self.run_one();
        }
        Ok(())
    }
}

impl ReadBack for EmulatedLink {
    fn read_row(&self, row: ReqRow, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        Ok(self.read(format!("read {} {len}", row * self.table_shape.1)))
    }

    fn read_out(&self, slot: usize, len: usize) -> Result<Vec<KvSlot>, CudaError> {
        Ok(self.read(format!("read_packet {slot} {HEADER} {len}")))
    }
}
