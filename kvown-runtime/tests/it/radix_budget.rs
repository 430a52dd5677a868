//! The radix cache's budget on the decode workload of the issue: 256 running requests, page
//! size 16, each full page registered into the tree as it fills (16 registrations per step).
//!
//! `bytes_per_cached_page_stay_within_budget` asserts at most 64 bookkeeping bytes per cached
//! page. The time of the same registrations is a benchmark (W2c in `benches/`), not a test.

use kvown_runtime::alloc::{KvAllocator, KvSlot, PagedAllocator, SlotCalls};
use kvown_runtime::check::check_radix;
use kvown_runtime::radix::{Insert, RadixCache, RadixConfig, TreePos};

const REQUESTS: usize = 256;
const PAGE_SIZE: usize = 16;
const PROMPT_PAGES: usize = 8;
const SHARED_PAGES: usize = 4;

/// One running request: its key, its row, and its locked position in the tree.
struct Request {
    key: Vec<u32>,
    row: Vec<KvSlot>,
    at: TreePos,
}

struct Workload {
    cache: RadixCache,
    alloc: PagedAllocator,
    requests: Vec<Request>,
    step: u64,
}

impl Workload {
    /// Every request's prompt (a shared system prefix plus its own pages) cached and locked.
    fn new(decode_pages: usize) -> Workload {
        let pages = REQUESTS * (PROMPT_PAGES + decode_pages + 1);
        let mut alloc = PagedAllocator::new(pages * PAGE_SIZE, PAGE_SIZE, false).unwrap();
        let mut cache = RadixCache::new(RadixConfig::new(PAGE_SIZE)).unwrap();
        let mut requests = Vec::with_capacity(REQUESTS);
        for request in 0..REQUESTS as u32 {
            let key: Vec<u32> = (0..(PROMPT_PAGES * PAGE_SIZE) as u32)
                .map(|i| {
                    if (i as usize) < SHARED_PAGES * PAGE_SIZE {
                        i
                    } else {
                        request * 100_000 + i
                    }
                })
                .collect();
            let matched = cache.match_prefix(&key);
            let mut row = vec![0; matched.len];
            cache.path_slots_into(matched, 0, &mut row).unwrap();
            alloc.alloc(key.len() - matched.len, &mut row).unwrap();
            cache.inc_lock_ref(matched.node).unwrap();
            let outcome = cache.insert(Insert::new(&key, &row).from(matched)).unwrap();
            cache.move_lock(matched.node, outcome.last_node).unwrap();
            let at = TreePos {
                node: outcome.last_node,
                len: key.len(),
            };
            requests.push(Request { key, row, at });
        }
        Workload {
            cache,
            alloc,
            requests,
            step: 0,
        }
    }

    /// One decode step: every request gets a token; then the 1/16 whose page filled register
    /// it as one batch.
    fn step(&mut self) {
        self.step += 1;
        let step = self.step;
        let mut filled = Vec::with_capacity(REQUESTS / PAGE_SIZE + 1);
        for (index, request) in self.requests.iter_mut().enumerate() {
            request.key.push(index as u32 * 7 + step as u32);
            if request.key.len() % PAGE_SIZE == 1 {
                self.alloc.alloc(PAGE_SIZE, &mut request.row).unwrap();
            }
            if request.key.len().is_multiple_of(PAGE_SIZE) {
                filled.push(index);
            }
        }
        for index in filled {
            let request = &mut self.requests[index];
            let outcome = self
                .cache
                .insert(Insert::new(&request.key, &request.row).from(request.at))
                .unwrap();
            self.cache
                .move_lock(request.at.node, outcome.last_node)
                .unwrap();
            request.at = TreePos {
                node: outcome.last_node,
                len: request.key.len(),
            };
        }
    }

    fn bytes_per_page(&self) -> f64 {
        let pages = self.cache.sizes().total() / PAGE_SIZE;
        self.cache.bookkeeping_bytes() as f64 / pages as f64
    }
}

#[test]
fn bytes_per_cached_page_stay_within_budget() {
    let decode_pages = 8;
    let mut workload = Workload::new(decode_pages);
    for _ in 0..decode_pages * PAGE_SIZE {
        workload.step();
    }
    check_radix(&workload.cache).unwrap();
    let cached_pages = REQUESTS * (PROMPT_PAGES - SHARED_PAGES + decode_pages) + SHARED_PAGES;
    assert_eq!(workload.cache.sizes().total(), cached_pages * PAGE_SIZE);
    assert_eq!(
        workload.cache.sizes().protected,
        workload.cache.sizes().total()
    );
    let per_page = workload.bytes_per_page();
    println!("bookkeeping: {per_page:.1} bytes per cached page");
    assert!(per_page <= 64.0, "{per_page:.1} bytes per cached page");
    // The floor: every cached page keeps its page id (4 bytes) beside its tokens.
    assert!(per_page >= 4.0, "{per_page:.1} bytes per cached page");
    assert_eq!(
        workload.alloc.available_size() % PAGE_SIZE,
        0,
        "allocator stays page-aligned"
    );
}
