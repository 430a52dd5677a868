//! Two tensor pools behind kvown's `KvTransfer`: K/V a prefill pool computed moves into a
//! decode pool, which the model then reads as if it had computed it.

use kvown_candle::forward_batch::{ForwardBatch, LogitRows, SeqInput};
use kvown_runtime::kv::{KvDtype, KvPool, KvTransfer, LocalTransfer};

use crate::fixture::tiny_model;

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
