//! Two tensor pools behind kvown's `KvTransfer`: K/V a prefill pool computed moves into a
//! decode pool, which the model then reads as if it had computed it; a server whose link fails
//! or corrupts a transfer stops with the error and holds nothing for that request.

use kvown_candle::forward_batch::{ForwardBatch, LogitRows, SeqInput};
use kvown_candle::workload::{Conversations, serve};
use kvown_candle::{ServeConfig, ServeError, Server, TensorKvPool};
use kvown_runtime::kv::{
    KvDtype, KvPool, KvSlice, KvTensor, KvTransfer, LocalTransfer, TransferError, TransferId,
};
use kvown_runtime::radix::EvictionPolicy;

use crate::differential::tight;
use crate::fixture::tiny_model;
use crate::harness::conversations;

#[test]
fn kv_moved_by_a_local_transfer_reads_back_as_computed() {
    let model = tiny_model();
    let (mut prefill, mut decode) = (
        model.new_pool(64, 16, KvDtype::Bf16).unwrap(),
        model.new_pool(64, 16, KvDtype::Bf16).unwrap(),
    );
    let prompt = [3u32, 14, 15, 92, 65];
    let compute = |slots: &[u32], pool: &mut kvown_candle::TensorKvPool| {
        let mut batch = ForwardBatch::new();
        batch
            .push(SeqInput {
                rid: 1,
                tokens: &prompt,
                start: 0,
                out_slots: slots,
                context: slots,
                logits: LogitRows::Last,
            })
            .unwrap();
        model.forward(&batch, pool).unwrap()
    };
    let src = [16, 17, 18, 19, 20];
    let direct = compute(&src, &mut prefill);
    let mut link = LocalTransfer::new(Box::new(prefill.share()), Box::new(decode.share())).unwrap();
    let dst = [40, 41, 42, 43, 44];
    let id = link.submit(&src, &dst).unwrap();
    let mut done = Vec::new();
    link.poll(&mut done);
    assert!(matches!(done.as_slice(), [(ended, Ok(()))] if *ended == id));
    for layer in 0..2 {
        assert_eq!(
            decode.load_kv(layer, &dst).unwrap(),
            prefill.load_kv(layer, &src).unwrap()
        );
    }
    // The decode pool's copy gives the next token the same logits as the prefill pool's.
    let next = |slots: &[u32], out: u32, pool: &mut kvown_candle::TensorKvPool| {
        let mut context = slots.to_vec();
        context.push(out);
        let mut batch = ForwardBatch::new();
        batch
            .push(SeqInput {
                rid: 1,
                tokens: &[7],
                start: slots.len(),
                out_slots: &[out],
                context: &context,
                logits: LogitRows::Last,
            })
            .unwrap();
        model.forward(&batch, pool).unwrap()
    };
    assert_eq!(next(&src, 21, &mut prefill), next(&dst, 45, &mut decode));
    assert_eq!(direct.len(), 1);
}

/// A link that copies through a `LocalTransfer` but fails its `nth` transfer, or with
/// `corrupt` lets it complete with one row changed on the decode side.
struct Faulty {
    inner: LocalTransfer,
    decode: TensorKvPool,
    nth: u64,
    seen: u64,
    corrupt: bool,
}

impl KvTransfer for Faulty {
    fn submit(&mut self, src: &[u32], dst: &[u32]) -> Result<TransferId, TransferError> {
        let fault = self.seen == self.nth && !dst.is_empty();
        self.seen += 1;
        if fault && !self.corrupt {
            self.inner.fail_next();
        }
        let id = self.inner.submit(src, dst)?;
        if fault && self.corrupt {
            let layout = *self.decode.layout();
            let k = vec![0.5f32; layout.row_len(KvTensor::K)];
            let v = vec![0.5f32; layout.row_len(KvTensor::V)];
            self.decode
                .store_kv(1, &dst[..1], KvSlice::F32(&k), KvSlice::F32(&v))
                .map_err(TransferError::from)?;
        }
        Ok(id)
    }

    fn poll(&mut self, done: &mut Vec<(TransferId, Result<(), TransferError>)>) {
        self.inner.poll(done);
    }
}

/// Serves the chat workload over a `Faulty` link: the server stops with the link's error and
/// both nodes' accounting stays whole (the request whose K/V did not arrive holds nothing).
fn a_faulty_transfer_stops_the_server_holding_nothing_for_it(corrupt: bool) -> ServeError {
    let config = ServeConfig {
        disaggregated: true,
        check_every_step: true,
        ..tight(16, 224, EvictionPolicy::Lru)
    };
    let mut server = Server::with_transfer(tiny_model(), config, |prefill, decode| {
        Ok(Box::new(Faulty {
            inner: LocalTransfer::new(Box::new(prefill), Box::new(decode.share()))?,
            decode,
            nth: 3,
            seen: 0,
            corrupt,
        }))
    })
    .unwrap();
    let mut workload = Conversations::new(conversations(5));
    let error = serve(&mut server, &mut workload, &mut ()).unwrap_err();
    assert_eq!(server.stats().transfers, 3, "{error}");
    server.check().unwrap();
    error
}

#[test]
fn a_failed_transfer_is_cancelled_on_the_decode_node() {
    let error = a_faulty_transfer_stops_the_server_holding_nothing_for_it(false);
    assert!(
        matches!(error, ServeError::Transfer(TransferError::Failed(_))),
        "{error}"
    );
}

#[test]
fn a_corrupt_transfer_fails_its_digest_and_is_cancelled() {
    let error = a_faulty_transfer_stops_the_server_holding_nothing_for_it(true);
    assert!(
        matches!(error, ServeError::TransferCorrupt { sent, received, .. } if sent != received),
        "{error}"
    );
}

#[test]
fn a_transfer_link_needs_a_disaggregated_server() {
    let refused = Server::with_transfer(tiny_model(), ServeConfig::default(), |_, _| {
        unreachable!("no link is made for a single node")
    });
    assert!(matches!(refused, Err(ServeError::Config(_))));
}
