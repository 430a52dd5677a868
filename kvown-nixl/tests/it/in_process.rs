//! `NixlLoopback`: two agents of this process moving rows between two pools that are not
//! registered themselves, each staged through a registered host pool.

use std::time::{Duration, Instant};

use kvown_nixl::{AgentOptions, NixlLoopback, slot_runs};
use kvown_runtime::ids::KvSlot;
use kvown_runtime::kv::{
    KvDtype, KvPool, KvSlice, KvTensor, KvTransfer, TransferError, TransferId, new_host_pool,
};

use crate::agent_name;
use crate::nodes::{LAYERS, digest, layout};

/// Slots of each test pool.
const SLOTS: usize = 64;

/// A pool of the tests' layout, `SLOTS` slots.
fn pool() -> Box<dyn KvPool> {
    new_host_pool(layout(SLOTS), KvDtype::F32).unwrap()
}

/// A loopback pair between a pool whose `src` slots hold distinct rows and an empty pool;
/// returns the link and handles on both pools.
fn pair(test: &str, src: &[KvSlot]) -> Result<(NixlLoopback, SharedPools), String> {
    let prefill = kvown_runtime::kv::SharedPool::new(pool());
    let decode = kvown_runtime::kv::SharedPool::new(pool());
    let mut writer = prefill.clone();
    for layer in 0..LAYERS {
        let k: Vec<f32> = (0..src.len() * layout(SLOTS).row_len(KvTensor::K))
            .map(|i| (i + 1000 * layer) as f32)
            .collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        writer
            .store_kv(layer, src, KvSlice::F32(&k), KvSlice::F32(&v))
            .map_err(|e| e.to_string())?;
    }
    let link = NixlLoopback::new(
        Box::new(prefill.clone()),
        Box::new(decode.clone()),
        &agent_name(test, "loopback"),
        &AgentOptions::default(),
    )
    .map_err(|e| e.to_string())?;
    Ok((link, SharedPools { prefill, decode }))
}

/// Handles on the pair's two pools.
struct SharedPools {
    prefill: kvown_runtime::kv::SharedPool,
    decode: kvown_runtime::kv::SharedPool,
}

/// Polls `link` until transfer `id` ends (at most a minute).
fn wait(link: &mut NixlLoopback, id: TransferId) -> Result<Result<(), TransferError>, String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut done = Vec::new();
    while Instant::now() < deadline {
        link.poll(&mut done);
        if let Some((_, outcome)) = done.into_iter().find(|(ended, _)| *ended == id) {
            return Ok(outcome);
        }
        done = Vec::new();
    }
    Err(format!("transfer {id:?} did not end within a minute"))
}

/// Scattered runs of slots arrive whole; the READ is one descriptor per run, layer and tensor,
/// its notice reaches the prefill agent, and both staging copies are counted.
pub fn rows_staged_through_two_agents_arrive_whole() -> Result<(), String> {
    let src: Vec<KvSlot> = (8..16).chain(40..44).collect();
    let dst: Vec<KvSlot> = (20..24).chain(30..38).collect();
    let (mut link, pools) = pair("in-process-whole", &src)?;
    let id = link.submit(&src, &dst).map_err(|e| e.to_string())?;
    wait(&mut link, id)?.map_err(|e| e.to_string())?;
    let (there, here) = (digest(&pools.prefill, &src), digest(&pools.decode, &dst));
    if there != here {
        return Err(format!(
            "digest {here:x} on the decode side, {there:x} sent"
        ));
    }
    let stats = link.stats();
    let row = layout(SLOTS).row_len(KvTensor::K) + layout(SLOTS).row_len(KvTensor::V);
    let slot_bytes = (row * LAYERS * KvDtype::F32.size_bytes()) as u64;
    let descriptors = (slot_runs(&src, &dst, true).len() * 2 * LAYERS) as u64;
    let expected = (1, 0, 1, src.len() as u64 * slot_bytes, descriptors);
    let got = (
        stats.link.completed,
        stats.link.failed,
        stats.notices,
        stats.link.bytes,
        stats.link.descriptors,
    );
    if got != expected || stats.staged_bytes != 2 * stats.link.bytes {
        return Err(format!("stats {stats:?}, expected {expected:?}"));
    }
    if link.counters().get() != stats {
        return Err("the counters lag the stats".into());
    }
    Ok(())
}

/// A submit refused for lengths or a slot past the pool posts nothing and writes nothing.
pub fn a_refused_submit_posts_nothing() -> Result<(), String> {
    let src: Vec<KvSlot> = (0..4).collect();
    let (mut link, pools) = pair("in-process-refused", &src)?;
    let before = digest(&pools.decode, &(0..SLOTS as u32).collect::<Vec<_>>());
    let short = link.submit(&src, &[1, 2]);
    if !matches!(short, Err(TransferError::LengthMismatch { src: 4, dst: 2 })) {
        return Err(format!("lists of 4 and 2 slots: {short:?}"));
    }
    let past = link.submit(&src, &[1, 2, 3, SLOTS as u32 + 7]);
    if past.is_ok() {
        return Err("a destination slot past the pool was accepted".into());
    }
    let mut done = Vec::new();
    link.poll(&mut done);
    let after = digest(&pools.decode, &(0..SLOTS as u32).collect::<Vec<_>>());
    let stats = link.stats();
    if !done.is_empty() || stats.link.descriptors != 0 || stats.notices != 0 || after != before {
        return Err(format!("after refusals: {done:?}, {stats:?}"));
    }
    Ok(())
}
