//! Reference loops that are not kvown, as floors for what a workload can cost on the machine at
//! hand (`benches/README.md`, "Notes on the misses"): W1's cycle over a bare page stack, the
//! W2 decode rule alone over dense arrays, W3's extend as two streaming writes. No typed errors, no per-request records, no prefix
//! cache.

use crate::workloads::{DecodeLoop, ExtendBatch, PAGE_SIZE, PoolChurn};

/// W1_k1 with nothing but what its cycle must do: a free stack of page ids (LIFO, as
/// `PagedAllocator`), a held flag per page checked and set on both sides, the page's 16 slots
/// written on allocation and their in-page range checked on free. The page size is a
/// compile-time constant; no free groups, no release list, and a bad free panics.
pub struct BareChurn {
    free: Vec<u32>,
    held: Vec<bool>,
    out: Vec<u32>,
}

impl BareChurn {
    /// W1's 65,536 pages, all free, page 1 on top of the stack.
    pub fn new() -> Self {
        let pages = PoolChurn::POOL_PAGES as u32;
        BareChurn {
            free: (1..=pages).rev().collect(),
            held: vec![false; pages as usize + 1],
            out: Vec::with_capacity(PAGE_SIZE),
        }
    }

    /// One cycle: take a page and write its slots to `out`, then free it by those slots.
    #[inline]
    pub fn cycle(&mut self) {
        const SLOTS: u32 = PAGE_SIZE as u32;
        self.out.clear();
        let page = self.free.pop().expect("the pool has room");
        self.held[page as usize] = true;
        let first = page * SLOTS;
        self.out.extend(first..first + SLOTS);
        for slots in self.out.chunks_exact(PAGE_SIZE).rev() {
            let page = slots[PAGE_SIZE - 1] / SLOTS;
            let first = page * SLOTS;
            let outside = slots.iter().fold(false, |outside, &slot| {
                outside | (slot.wrapping_sub(first) >= SLOTS)
            });
            let held = self.held.get(page as usize) == Some(&true);
            assert!(held && !outside, "a bad free of page {page}");
            self.held[page as usize] = false;
            self.free.push(page);
        }
    }
}

/// 256 requests decoding one token per step, lengths and rows in dense vectors, the same
/// `257 x 2,048` request-to-token table as W2, pages from a free stack. A request that reaches
/// 2,048 tokens gives back the pages past its first 512 tokens and restarts at 512 (a
/// replacement that reuses the prompt's pages: no extend is modelled). With `append`, each step
/// also pushes one token per request into that request's own token vector, as W2's harness
/// does.
pub struct DenseDecode {
    lens: Vec<u32>,
    rows: Vec<u32>,
    table: Vec<u32>,
    free_pages: Vec<u32>,
    out: Vec<u32>,
    tokens: Option<Vec<Vec<u32>>>,
}

impl DenseDecode {
    const WIDTH: usize = <DecodeLoop>::FINISH_LEN;

    /// The loop with W2's starting lengths, every request's prefix written in the table.
    pub fn new(append: bool) -> Self {
        let running = <DecodeLoop>::RUNNING;
        let lens: Vec<u32> = (0..running)
            .map(|i| (<DecodeLoop>::REPLACEMENT_LEN + (i * 7919) % 1536) as u32)
            .collect();
        let rows: Vec<u32> = (1..=running as u32).collect();
        let mut table = vec![0; (running + 1) * Self::WIDTH];
        let pages_per_row = Self::WIDTH / PAGE_SIZE;
        // Row r's positions live in pages r * pages_per_row ..: the first slot of page p is
        // p * PAGE_SIZE. Pages past every row's reach form the free stack.
        for (&row, &len) in rows.iter().zip(&lens) {
            let base = row as usize * Self::WIDTH;
            for position in 0..len as usize {
                let page = row as usize * pages_per_row + position / PAGE_SIZE;
                table[base + position] = (page * PAGE_SIZE + position % PAGE_SIZE) as u32;
            }
        }
        let first_free = (running + 1) * pages_per_row;
        let free_pages = (first_free as u32..(first_free + running * pages_per_row) as u32)
            .rev()
            .collect();
        let tokens = append.then(|| {
            lens.iter()
                .map(|&len| {
                    let mut tokens = Vec::with_capacity(Self::WIDTH);
                    tokens.extend(0..len);
                    tokens
                })
                .collect()
        });
        DenseDecode {
            lens,
            rows,
            table,
            free_pages,
            out: vec![0; running],
            tokens,
        }
    }

    /// One step: one new slot per request, written to its row and to `out`.
    #[inline]
    pub fn step(&mut self) {
        let page_size = PAGE_SIZE as u32;
        for i in 0..self.lens.len() {
            let len = self.lens[i] as usize;
            let base = self.rows[i] as usize * Self::WIDTH;
            let slot = if len.is_multiple_of(PAGE_SIZE) {
                self.free_pages.pop().expect("a page per opening token") * page_size
            } else {
                self.table[base + len - 1] + 1
            };
            self.table[base + len] = slot;
            self.out[i] = slot;
            self.lens[i] += 1;
            if let Some(tokens) = &mut self.tokens {
                tokens[i].push(slot);
            }
            if len + 1 == Self::WIDTH {
                let kept = <DecodeLoop>::REPLACEMENT_LEN;
                for position in (kept..Self::WIDTH).step_by(PAGE_SIZE) {
                    self.free_pages
                        .push(self.table[base + position] / page_size);
                }
                self.lens[i] = kept as u32;
                if let Some(tokens) = &mut self.tokens {
                    tokens[i].truncate(kept);
                }
            }
        }
        std::hint::black_box(&self.out);
    }
}

/// The bulk floors of W1_k1024, W1p_k1024 and R_k1024: what moving `k` pages costs on this
/// machine with nothing but the bytes to move. A stack of page ids (LIFO) and a held flag per
/// page, as [`BareChurn`]; the `k` ids move as one slice, the slot runs of a page size known at
/// compile time are written and read back page by page. No typed errors, a bad free panics.
pub struct BulkChurn {
    free: Vec<u32>,
    held: Vec<bool>,
    pages: usize,
    out: Vec<u32>,
}

impl BulkChurn {
    /// W1's 65,536 pages, all free, page 1 on top of the stack, moving `pages` pages a cycle.
    pub fn new(pages: usize) -> Self {
        let pool = PoolChurn::POOL_PAGES as u32;
        BulkChurn {
            free: (1..=pool).rev().collect(),
            held: vec![false; pool as usize + 1],
            pages,
            out: Vec::with_capacity(pages * PAGE_SIZE),
        }
    }

    /// The `k` pages off the top of the stack as one slice, each marked held.
    #[inline]
    fn take(&mut self) -> std::vec::Drain<'_, u32> {
        let rest = self.free.len() - self.pages;
        for &page in &self.free[rest..] {
            self.held[page as usize] = true;
        }
        self.free.drain(rest..)
    }

    /// Checks that `page` is held, clears it and pushes it back.
    #[inline]
    fn give_back(held: &mut [bool], free: &mut Vec<u32>, page: u32) {
        assert!(
            held.get(page as usize) == Some(&true),
            "a bad free of page {page}"
        );
        held[page as usize] = false;
        free.push(page);
    }

    /// `ref_bulk_slots`: take `k` pages and write their slot runs to `out` (a run of 16 written
    /// as one array), then read the runs back, last page first: each run's in-page range
    /// checked, its page given back.
    #[inline]
    pub fn cycle_slots(&mut self) {
        const SLOTS: u32 = PAGE_SIZE as u32;
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        for page in self.take().rev() {
            let first = page * SLOTS;
            let run: [u32; PAGE_SIZE] = std::array::from_fn(|i| first + i as u32);
            out.extend_from_slice(&run);
        }
        let (runs, _) = out.as_chunks::<PAGE_SIZE>();
        for run in runs.iter().rev() {
            let page = run[PAGE_SIZE - 1] / SLOTS;
            let first = page * SLOTS;
            let outside = run.iter().fold(0, |differ, &slot| differ | (slot ^ first));
            assert!(outside < SLOTS, "a bad free of page {page}");
            Self::give_back(&mut self.held, &mut self.free, page);
        }
        self.out = out;
    }

    /// `ref_bulk_ids`: take `k` page ids into `out` as one slice, then give each back, last
    /// first.
    #[inline]
    pub fn cycle_ids(&mut self) {
        let mut out = std::mem::take(&mut self.out);
        out.clear();
        out.extend(self.take().rev());
        for &page in out.iter().rev() {
            Self::give_back(&mut self.held, &mut self.free, page);
        }
        self.out = out;
    }
}

/// The floor of W3: an extend of W3's 64 prompts with nothing but its bytes to move. Each
/// prompt's pages come off a stack of page ids as one slice, their slot runs are written into
/// `out_cache_loc` (the last page's run cut at the prompt's end), then each prompt's slots are
/// copied into its row of a dense request-to-token table. No requests, no checks, no errors.
pub struct ExtendFloor {
    free: Vec<u32>,
    out: Vec<u32>,
    table: Vec<u32>,
}

impl ExtendFloor {
    /// A stack holding as many pages as W3's pool, all free.
    pub fn new() -> Self {
        let rows = ExtendBatch::BATCH;
        let pages = (rows * (ExtendBatch::MAX_LEN + PAGE_SIZE) / PAGE_SIZE) as u32;
        ExtendFloor {
            free: (1..=pages).rev().collect(),
            out: Vec::new(),
            table: vec![0; rows * ExtendBatch::MAX_LEN],
        }
    }

    /// `ref_extend`, the measured part: every prompt's slot runs written to `out_cache_loc`,
    /// then copied into its row.
    #[inline]
    pub fn extend(&mut self) {
        const SLOTS: u32 = PAGE_SIZE as u32;
        self.out.clear();
        for i in 0..ExtendBatch::BATCH {
            let len = ExtendBatch::prompt_len(i);
            let pages = len.div_ceil(PAGE_SIZE);
            let start = self.free.len() - pages;
            let end = self.out.len() + len;
            for &page in self.free[start..].iter().rev() {
                let first = page * SLOTS;
                let run: [u32; PAGE_SIZE] = std::array::from_fn(|i| first + i as u32);
                self.out.extend_from_slice(&run);
            }
            self.out.truncate(end);
            self.free.truncate(start);
        }
        let mut offset = 0;
        for (i, row) in self
            .table
            .chunks_exact_mut(ExtendBatch::MAX_LEN)
            .enumerate()
        {
            let len = ExtendBatch::prompt_len(i);
            row[..len].copy_from_slice(&self.out[offset..offset + len]);
            offset += len;
        }
        std::hint::black_box(&self.table);
    }

    /// Gives the pages of the last extend back (not measured): one per run of `out_cache_loc`
    /// in one page.
    pub fn release(&mut self) {
        let runs = self
            .out
            .chunk_by(|a, b| a / PAGE_SIZE as u32 == b / PAGE_SIZE as u32);
        self.free.extend(runs.map(|run| run[0] / PAGE_SIZE as u32));
    }
}
