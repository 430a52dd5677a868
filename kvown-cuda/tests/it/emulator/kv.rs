//! [`EmulatedKvPool`]: the K/V pool with the `kv.cu` kernels compiled as host C++
//! (`kv_driver.cpp`), planned by [`KvPlanner`] as `CudaKvPool` plans: the same launches, with
//! the same uploads and temporaries, in the driver's numbered buffers instead of device memory.

use std::cell::RefCell;

use kvown_cuda::kernels::WORD_BYTES;
use kvown_cuda::{KvPlanner, PageCopy, RowLaunch, kv_bytes, kv_data_from_bytes};
use kvown_runtime::alloc::{KvSlot, PageId};
use kvown_runtime::kv::{KvData, KvDtype, KvLayout, KvPool, KvPoolError, KvSlice, KvTensor};

use super::{Driver, Process};

static DRIVER: Driver = Driver::new("kv_driver.cpp");

/// A buffer in the driver's memory.
type BufferId = u32;

/// The driver's memory and launches, one method per cudarc call the device pool makes.
struct Memory(Process);

impl Memory {
    /// `alloc_zeros`.
    fn zeros(&mut self, bytes: usize) -> BufferId {
        parse_id(&self.0.send(&format!("zeros {bytes}")))
    }

    /// `clone_htod`; `bytes` is never empty (the planner launches nothing for no rows).
    fn upload(&mut self, bytes: &[u8]) -> BufferId {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut command = String::with_capacity(7 + 2 * bytes.len());
        command.push_str("upload ");
        for &byte in bytes {
            command.push(DIGITS[usize::from(byte >> 4)] as char);
            command.push(DIGITS[usize::from(byte & 15)] as char);
        }
        parse_id(&self.0.send(&command))
    }

    /// `clone_dtoh`.
    fn download(&mut self, buffer: BufferId) -> Vec<u8> {
        let hex = self.0.send(&format!("download {buffer}"));
        let nibble = |digit: u8| match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => panic!("emulator sent a bad hex digit {digit:#04x}"),
        };
        hex.as_bytes()
            .chunks_exact(2)
            .map(|pair| nibble(pair[0]) << 4 | nibble(pair[1]))
            .collect()
    }

    /// Dropping a `CudaSlice`.
    fn release(&mut self, buffers: &[BufferId]) {
        for buffer in buffers {
            self.0.send_ok(&format!("release {buffer}"));
        }
    }

    /// `launch_builder(kernel_wN)...launch(config)`: `launch.rows` blocks of `launch.threads`.
    fn launch(&mut self, kernel: &str, launch: &RowLaunch, args: &[u32]) {
        let mut command = format!(
            "{kernel}_w{} {} {}",
            WORD_BYTES[launch.shape.word], launch.rows, launch.threads
        );
        for arg in args {
            command.push_str(&format!(" {arg}"));
        }
        self.0.send_ok(&command);
    }

    /// `store_kv_wN`: `buffer[slots[t]] = rows[t]`.
    fn store_rows(
        &mut self,
        buffer: BufferId,
        launch: &RowLaunch,
        rows: BufferId,
        slots: BufferId,
    ) {
        let args = [
            buffer,
            rows,
            slots,
            launch.rows,
            launch.shape.row_words,
            launch.num_slots,
        ];
        self.launch("store_kv", launch, &args);
    }

    /// A zeroed buffer for the rows `launch` moves.
    fn row_temporary(&mut self, launch: &RowLaunch) -> BufferId {
        self.zeros(launch.rows as usize * launch.shape.row_bytes)
    }

    /// `gather_kv_wN`: `out[t] = buffer[slots[t]]`, `out` holding one row per slot.
    fn gather_rows(
        &mut self,
        buffer: BufferId,
        launch: &RowLaunch,
        slots: BufferId,
        out: BufferId,
    ) {
        let args = [
            out,
            buffer,
            slots,
            launch.rows,
            launch.shape.row_words,
            launch.num_slots,
        ];
        self.launch("gather_kv", launch, &args);
    }
}

fn parse_id(reply: &str) -> BufferId {
    reply.parse().expect("a buffer id")
}

/// The device K/V pool with its kernels emulated on the host.
pub struct EmulatedKvPool {
    planner: KvPlanner,
    memory: RefCell<Memory>,
    k: Vec<BufferId>,
    v: Vec<BufferId>,
}

impl EmulatedKvPool {
    /// Like `CudaKvPool::new`; `Err` says why the emulator cannot run here.
    pub fn new(layout: KvLayout, dtype: KvDtype) -> Result<Self, &'static str> {
        let mut memory = Memory(DRIVER.start()?);
        let planner = KvPlanner::new(layout, dtype);
        let mut buffers = |tensor| -> Vec<BufferId> {
            let bytes = layout.slots() * planner.shape(tensor).row_bytes;
            (0..layout.layers()).map(|_| memory.zeros(bytes)).collect()
        };
        let k = buffers(KvTensor::K);
        let v = buffers(KvTensor::V);
        Ok(Self {
            planner,
            memory: RefCell::new(memory),
            k,
            v,
        })
    }

    fn buffers(&self, tensor: KvTensor) -> &[BufferId] {
        match tensor {
            KvTensor::K => &self.k,
            KvTensor::V => &self.v,
        }
    }
}

impl KvPool for EmulatedKvPool {
    fn layout(&self) -> &KvLayout {
        self.planner.layout()
    }

    fn dtype(&self) -> KvDtype {
        self.planner.dtype()
    }

    fn store_kv(
        &mut self,
        layer: usize,
        slots: &[KvSlot],
        k: KvSlice<'_>,
        v: KvSlice<'_>,
    ) -> Result<(), KvPoolError> {
        let Some(launches) = self.planner.plan_store(layer, slots, k, v)? else {
            return Ok(());
        };
        let mut memory = self.memory.borrow_mut();
        let slots = memory.upload(bytemuck::cast_slice(slots));
        let k = memory.upload(kv_bytes(k));
        let v = memory.upload(kv_bytes(v));
        for (launch, rows) in launches.iter().zip([k, v]) {
            memory.store_rows(self.buffers(launch.tensor)[layer], launch, rows, slots);
        }
        memory.release(&[slots, k, v]);
        Ok(())
    }

    fn load_kv(&self, layer: usize, slots: &[KvSlot]) -> Result<(KvData, KvData), KvPoolError> {
        let Some(launches) = self.planner.plan_load(layer, slots)? else {
            let empty = kv_data_from_bytes(self.dtype(), &[]);
            return Ok((empty.clone(), empty));
        };
        let mut memory = self.memory.borrow_mut();
        let slots = memory.upload(bytemuck::cast_slice(slots));
        let [k, v] = launches.map(|launch| {
            let out = memory.row_temporary(&launch);
            memory.gather_rows(self.buffers(launch.tensor)[layer], &launch, slots, out);
            let bytes = memory.download(out);
            memory.release(&[out]);
            kv_data_from_bytes(self.dtype(), &bytes)
        });
        memory.release(&[slots]);
        Ok((k, v))
    }

    fn copy_slots(&mut self, src: &[KvSlot], dst: &[KvSlot]) -> Result<(), KvPoolError> {
        let Some(launches) = self.planner.plan_copy_slots(src, dst)? else {
            return Ok(());
        };
        let mut memory = self.memory.borrow_mut();
        let src = memory.upload(bytemuck::cast_slice(src));
        let dst = memory.upload(bytemuck::cast_slice(dst));
        // As `CudaKvPool::copy_slots`: one temporary per tensor, reused layer after layer.
        let temporaries = launches.map(|launch| memory.row_temporary(&launch));
        for (launch, &rows) in launches.iter().zip(&temporaries) {
            for &buffer in self.buffers(launch.tensor) {
                memory.gather_rows(buffer, launch, src, rows);
                memory.store_rows(buffer, launch, rows, dst);
            }
        }
        memory.release(&[src, dst]);
        memory.release(&temporaries);
        Ok(())
    }

    fn copy_pages(&mut self, src: &[PageId], dst: &[PageId]) -> Result<(), KvPoolError> {
        let (num_pages, page_size, launches) = match self.planner.plan_copy_pages(src, dst)? {
            None => return Ok(()),
            Some(PageCopy::Slots { src, dst }) => return self.copy_slots(&src, &dst),
            Some(PageCopy::Pages {
                num_pages,
                page_size,
                launches,
            }) => (num_pages, page_size, launches),
        };
        let mut memory = self.memory.borrow_mut();
        let src = memory.upload(bytemuck::cast_slice(src));
        let dst = memory.upload(bytemuck::cast_slice(dst));
        for launch in &launches {
            for &buffer in self.buffers(launch.tensor) {
                memory.launch(
                    "copy_pages",
                    launch,
                    &[
                        buffer,
                        src,
                        dst,
                        num_pages,
                        page_size,
                        launch.shape.row_words,
                        launch.num_slots,
                    ],
                );
            }
        }
        memory.release(&[src, dst]);
        Ok(())
    }
}
