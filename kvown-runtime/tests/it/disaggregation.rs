//! A prefill node and a decode node in one process: the prefill side computes prompts (extend)
//! and stores their K/V; the decode side matches its own prefix cache, preallocates each
//! request's row and slots (`prealloc_for_transfer`), receives the K/V through
//! [`LocalTransfer`], commits (`commit_transfer`) and decodes. Some transfers fail and some are
//! cancelled (`cancel_transfer`). Both allocators run in `need_sort` mode, as sglang's do under
//! disaggregation.
//!
//! After every step both checkers pass, and every decoding request's K/V read back on the
//! decode side equals what the prefill side stored for those tokens (or, for positions the
//! decode side computed itself, what it stored). At the end every page is back on both sides.

use kvown_runtime::alloc::{KvAllocator, KvSlot, PagedAllocator};
use kvown_runtime::batch::Req;
use kvown_runtime::batch::init_next_round_input;
use kvown_runtime::batch::{
    PreallocFailure, ScheduleBatch, TransferTicket, alloc_for_decode, alloc_for_extend,
    cancel_transfer, commit_transfer, prealloc_for_transfer, prepare_for_decode,
    prepare_for_extend, release_kv_cache,
};
use kvown_runtime::cache::{KvCache, TreeCache};
use kvown_runtime::error::KvError;
use kvown_runtime::kv::{
    KvData, KvDtype, KvLayout, KvPool, KvSlice, KvTransfer, LocalTransfer, TransferId,
    new_host_pool,
};
use kvown_runtime::radix::{RadixCache, RadixConfig, TreePos};
use kvown_runtime::slots::ReqToTokenPool;

const LAYERS: usize = 2;
const DIM: usize = 4;
const ROWS: usize = 12;
const WIDTH: usize = 160;
/// Length at which a decoding request finishes.
const FINISH_LEN: usize = 60;

/// The K row (V is its negation) of the token at `position` after `tokens[..position]`: a
/// function of the whole prefix, as a model's K/V is.
fn kv_row(tokens: &[u32], position: usize, layer: usize) -> [f32; DIM] {
    let mut hash = 0x9e37_79b9u32.wrapping_add(layer as u32);
    for &token in &tokens[..=position] {
        hash = hash.rotate_left(5).wrapping_mul(31) ^ token;
    }
    std::array::from_fn(|i| (hash.rotate_left(i as u32 * 7) % 10_000) as f32)
}

/// Stores the K/V of `tokens[positions]` at `slots` in every layer of `pool`.
fn store(
    pool: &mut dyn KvPool,
    tokens: &[u32],
    positions: std::ops::Range<usize>,
    slots: &[KvSlot],
) {
    for layer in 0..LAYERS {
        let k: Vec<f32> = positions
            .clone()
            .flat_map(|p| kv_row(tokens, p, layer))
            .collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        pool.store_kv(layer, slots, KvSlice::F32(&k), KvSlice::F32(&v))
            .unwrap();
    }
}

/// Panics unless `pool` holds, at `slots`, the K/V of `tokens[..slots.len()]`.
fn assert_holds(pool: &dyn KvPool, tokens: &[u32], slots: &[KvSlot], what: &str) {
    for layer in 0..LAYERS {
        let (k, v) = pool.load_kv(layer, slots).unwrap();
        let expected: Vec<f32> = (0..slots.len())
            .flat_map(|p| kv_row(tokens, p, layer))
            .collect();
        let negated: Vec<f32> = expected.iter().map(|x| -x).collect();
        assert_eq!(k, KvData::F32(expected), "{what}: K of layer {layer}");
        assert_eq!(v, KvData::F32(negated), "{what}: V of layer {layer}");
    }
}

/// xorshift64*.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1) as u64) as usize
    }
}

fn node(pages: usize, page_size: usize) -> KvCache<PagedAllocator> {
    let allocator = PagedAllocator::new(pages * page_size, page_size, true).unwrap();
    let table = ReqToTokenPool::new(ROWS, WIDTH).unwrap();
    KvCache::new(
        allocator,
        table,
        TreeCache::Radix(RadixCache::new(RadixConfig::new(page_size)).unwrap()),
    )
    .unwrap()
}

struct Pair {
    rng: Rng,
    prefill: KvCache<PagedAllocator>,
    decode: KvCache<PagedAllocator>,
    link: LocalTransfer,
    /// Decode-side requests whose K/V is in flight, with their transfer.
    in_flight: Vec<(TransferId, TransferTicket)>,
    running: ScheduleBatch,
    next_rid: u64,
    counts: [usize; 5],
}

const COMMITTED: usize = 0;
const FAILED: usize = 1;
const CANCELLED: usize = 2;
const PREFIX_HITS: usize = 3;
const REFUSED: usize = 4;

impl Pair {
    fn new(page_size: usize, pages: usize, seed: u64) -> Pair {
        let layout = KvLayout::new(LAYERS, 1, DIM, pages * page_size, page_size).unwrap();
        let pool = || new_host_pool(layout, KvDtype::F32).unwrap();
        Pair {
            rng: Rng(seed),
            prefill: node(pages, page_size),
            decode: node(pages, page_size),
            link: LocalTransfer::new(pool(), pool()).unwrap(),
            in_flight: Vec::new(),
            running: ScheduleBatch::new(Vec::new()),
            next_rid: 1,
            counts: [0; 5],
        }
    }

    /// A prompt from one of three families (a shared system prompt) and its own tail.
    fn prompt(&mut self, rid: u64) -> Vec<u32> {
        let family = self.rng.below(3) as u32;
        let shared = [0, 12, 33][self.rng.below(3)];
        let own = 1 + self.rng.below(30);
        (0..shared as u32)
            .map(|i| 1_000 * family + i)
            .chain((0..own as u32).map(|i| 100_000 * rid as u32 + i))
            .collect()
    }

    /// Prefills a new request on the prefill node and hands its K/V to the decode node.
    fn prefill_one(&mut self) {
        let rid = self.next_rid;
        self.next_rid += 1;
        let tokens = self.prompt(rid);
        let mut req = Req::new(rid, tokens.clone());
        init_next_round_input(&mut req, &mut self.prefill, usize::MAX).unwrap();
        let cached = req.prefix_len();
        let batch = match alloc_for_extend(
            prepare_for_extend(ScheduleBatch::new(vec![req])),
            &mut self.prefill,
        ) {
            Ok(batch) => batch,
            Err(failure) => {
                let mut req = failure.batch.cancel().into_reqs().pop().unwrap();
                release_kv_cache(&mut req, &mut self.prefill, false).unwrap();
                self.counts[REFUSED] += 1;
                return;
            }
        };
        let mut req = batch.into_reqs().pop().unwrap();
        let row = req.kv().req_pool_idx().unwrap();
        let slots = self.prefill.req_to_token().row(row).unwrap()[..tokens.len()].to_vec();
        // The prefix the prefill node had cached is stored already; it computes the rest.
        let computed = cached..tokens.len();
        store(
            self.link.prefill_pool(),
            &tokens,
            computed.clone(),
            &slots[computed],
        );
        req.push_output(7);
        let mut decode_req = Req::new(rid, tokens);
        decode_req.push_output(7);
        self.hand_over(decode_req, &slots);
        release_kv_cache(&mut req, &mut self.prefill, true).unwrap();
    }

    /// The decode side: match, preallocate, submit the transfer of the positions it lacks.
    fn hand_over(&mut self, mut req: Req, prefill_slots: &[KvSlot]) {
        init_next_round_input(&mut req, &mut self.decode, usize::MAX).unwrap();
        if req.prefix_len() > 0 {
            self.counts[PREFIX_HITS] += 1;
        }
        let ticket = match prealloc_for_transfer(req, &mut self.decode) {
            Ok(ticket) => ticket,
            Err(failure) => {
                let PreallocFailure { mut req, error } = *failure;
                assert!(
                    matches!(error, KvError::OutOfMemory(_) | KvError::OutOfRows { .. }),
                    "{error}"
                );
                // It holds nothing but, maybe, the lock on its matched prefix.
                if req.last_node() != TreePos::ROOT {
                    release_kv_cache(&mut req, &mut self.decode, false).unwrap();
                }
                self.counts[REFUSED] += 1;
                return;
            }
        };
        assert_eq!(ticket.destination().len(), ticket.positions().len());
        if self.rng.below(10) == 0 {
            self.link.fail_next();
        }
        let src = &prefill_slots[ticket.positions()];
        let id = self.link.submit(src, ticket.destination()).unwrap();
        self.in_flight.push((id, ticket));
    }

    /// Commits the transfers that completed, cancels the failed ones and, now and then, one
    /// still in flight.
    fn receive(&mut self) {
        let mut done = Vec::new();
        self.link.poll(&mut done);
        if !self.in_flight.is_empty() && self.rng.below(8) == 0 {
            let index = self.rng.below(self.in_flight.len());
            let (id, ticket) = self.in_flight.swap_remove(index);
            done.retain(|(ended, _)| *ended != id);
            self.cancel(ticket);
            self.counts[CANCELLED] += 1;
        }
        for (id, outcome) in done {
            let index = self.in_flight.iter().position(|(i, _)| *i == id).unwrap();
            let (_, ticket) = self.in_flight.swap_remove(index);
            match outcome {
                Ok(()) => {
                    let req = commit_transfer(ticket);
                    self.running.extend_reqs([req]);
                    self.counts[COMMITTED] += 1;
                }
                Err(_) => {
                    self.cancel(ticket);
                    self.counts[FAILED] += 1;
                }
            }
        }
    }

    fn cancel(&mut self, ticket: TransferTicket) {
        let before = self.decode.available_size();
        let req = cancel_transfer(ticket, &mut self.decode).unwrap();
        assert!(!req.kv().holds_kv());
        assert!(self.decode.available_size() >= before);
    }

    /// One decode step of every running request, its new token's K/V stored; requests that
    /// reached their length finish.
    fn decode_step(&mut self) {
        let done = self
            .running
            .take_if(|req| req.fill_ids().len() >= FINISH_LEN);
        for mut req in done {
            release_kv_cache(&mut req, &mut self.decode, true).unwrap();
        }
        if self.running.is_empty() {
            return;
        }
        let running = std::mem::replace(&mut self.running, ScheduleBatch::new(Vec::new()));
        let prepared = prepare_for_decode(running, &self.decode).unwrap();
        let batch = match alloc_for_decode(prepared, &mut self.decode) {
            Ok(batch) => batch,
            Err(failure) => {
                self.running = failure.batch.cancel();
                let capacity = self.decode.allocator().capacity();
                self.decode.evict_shortfall(capacity).unwrap();
                return;
            }
        };
        self.running = batch;
        let slots = self.running.out_cache_loc().to_vec();
        for (req, slot) in self.running.reqs_mut().iter_mut().zip(slots) {
            let position = req.kv().kv_allocated_len() - 1;
            let tokens = req.fill_ids().to_vec();
            store(
                self.link.decode_pool(),
                &tokens,
                position..position + 1,
                &[slot],
            );
            req.push_output(11 + (position % 5) as u32);
        }
    }

    /// Both checkers, and the decode side's K/V of every running request.
    fn check(&mut self, what: &str) {
        let in_flight = self.in_flight.iter().map(|(_, ticket)| ticket.req());
        let held = self.running.reqs().iter().chain(in_flight);
        if let Err(violation) = self.decode.check(held) {
            panic!("{what}: decode side: {violation}");
        }
        if let Err(violation) = self.prefill.check([]) {
            panic!("{what}: prefill side: {violation}");
        }
        for req in self.running.reqs() {
            let row = req.kv().req_pool_idx().unwrap();
            let len = req.kv().kv_committed_len();
            let slots = &self.decode.req_to_token().row(row).unwrap()[..len];
            assert_holds(self.link.decode_pool(), req.fill_ids(), slots, what);
        }
    }

    fn run(mut self, steps: usize) -> [usize; 5] {
        for step in 0..steps {
            match self.rng.below(5) {
                0 => self.prefill_one(),
                1 => self.receive(),
                _ => self.decode_step(),
            }
            self.check(&format!("step {step}"));
        }
        self.receive();
        while let Some((_, ticket)) = self.in_flight.pop() {
            self.cancel(ticket);
        }
        for mut req in self.running.take_if(|_| true) {
            release_kv_cache(&mut req, &mut self.decode, true).unwrap();
        }
        self.check("drained");
        for cache in [&mut self.prefill, &mut self.decode] {
            let capacity = cache.allocator().capacity();
            cache.evict_shortfall(capacity).unwrap();
            assert_eq!(cache.available_size(), capacity, "every page is back");
        }
        self.counts
    }
}

#[test]
fn a_prefill_decode_pair_moves_kv_and_leaks_nothing() {
    let mut total = [0; 5];
    for (page_size, pages) in [(1, 900), (4, 160), (16, 40)] {
        for seed in 1..=3 {
            let counts = Pair::new(page_size, pages, seed * 7 + page_size as u64).run(240);
            println!("page size {page_size}, seed {seed}: {counts:?}");
            for (sum, count) in total.iter_mut().zip(counts) {
                *sum += count;
            }
        }
    }
    let names = ["committed", "failed", "cancelled", "prefix hits", "refused"];
    for (name, count) in names.iter().zip(total) {
        assert!(count > 0, "no {name} transfer: the scenarios miss a path");
    }
}

/// A request whose K/V is in flight holds its slots with nothing committed (the checker
/// accepts that ladder); committed, it decodes like any other.
#[test]
fn a_request_in_flight_commits_then_decodes() {
    let mut decode = node(16, 4);
    let mut req = Req::new(1, (0..10).collect());
    req.push_output(3);
    init_next_round_input(&mut req, &mut decode, usize::MAX).unwrap();
    let ticket = prealloc_for_transfer(req, &mut decode).unwrap();
    assert_eq!(ticket.positions(), 0..10);
    let kv = ticket.req().kv();
    assert_eq!((kv.kv_committed_len(), kv.kv_allocated_len()), (0, 10));
    decode.check([ticket.req()]).unwrap();
    let batch = ScheduleBatch::new(vec![commit_transfer(ticket)]);
    let batch = alloc_for_decode(prepare_for_decode(batch, &decode).unwrap(), &mut decode)
        .map_err(|failure| failure.error)
        .unwrap();
    let req = &batch.reqs()[0];
    assert_eq!(req.kv().kv_committed_len(), 11);
}
