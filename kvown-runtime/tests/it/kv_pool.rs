//! KV data pool behaviour through the public API: error cases leave the pool unchanged, and a
//! property test checks store/load round trips against a model of the last write per slot.

use std::collections::HashMap;

use crate::common;
use half::{bf16, f16};
use kvown_runtime::alloc::KvSlot;
use kvown_runtime::error::PageOutOfRange;
use kvown_runtime::kv::{
    HostKvPool, KvData, KvDtype, KvElement, KvLayout, KvPool, KvPoolError, KvSlice, KvTensor,
    new_host_pool,
};
use proptest::prelude::*;

/// 3 layers, 2 heads, K head_dim 4, V head_dim 2, 12 slots + one padding page of 4.
fn layout() -> KvLayout {
    KvLayout::with_v_head_dim(3, 2, 4, 2, 12, 4).unwrap()
}

const K_ROW: usize = 8;
const V_ROW: usize = 4;

/// A pool whose every row holds distinct non-zero values, and a snapshot of all its rows.
fn filled_pool() -> (HostKvPool<f32>, Vec<(KvData, KvData)>) {
    let mut pool = HostKvPool::<f32>::new(layout()).unwrap();
    let all: Vec<KvSlot> = (0..16).collect();
    for layer in 0..3 {
        let k: Vec<f32> = (0..16 * K_ROW)
            .map(|i| (layer * 1000 + i) as f32 + 0.5)
            .collect();
        let v: Vec<f32> = (0..16 * V_ROW)
            .map(|i| -((layer * 1000 + i) as f32))
            .collect();
        pool.store_kv(layer, &all, KvSlice::F32(&k), KvSlice::F32(&v))
            .unwrap();
    }
    let snapshot = snapshot(&pool);
    (pool, snapshot)
}

fn snapshot(pool: &dyn KvPool) -> Vec<(KvData, KvData)> {
    let all: Vec<KvSlot> = (0..pool.layout().slots() as KvSlot).collect();
    (0..pool.layout().layers())
        .map(|layer| pool.load_kv(layer, &all).unwrap())
        .collect()
}

#[test]
fn layout_rejects_bad_shapes() {
    for (args, needle) in [
        ((0, 2, 4, 12, 4), "layers must be positive"),
        ((1, 2, 4, 10, 4), "not a multiple of page_size"),
        ((1, 2, 4, 12, 0), "page_size must be positive"),
        ((1, 2, 4, u32::MAX as usize, 1), "exceed the KvSlot range"),
        ((usize::MAX, 2, 4, 12, 4), "exceed the address space"),
        (
            (1, usize::MAX, usize::MAX, 12, 4),
            "exceed the address space",
        ),
        ((1, usize::MAX / 2, 4, 12, 4), "exceed the address space"),
    ] {
        let (layers, heads, dim, capacity, page) = args;
        let err = KvLayout::new(layers, heads, dim, capacity, page).unwrap_err();
        assert!(err.to_string().contains(needle), "{err} lacks {needle:?}");
    }
    // At the address space's edge: 16 slots of one 1-element head, K and V at 4 bytes each, are
    // 128 bytes a layer; one layer more no longer fits.
    let edge = isize::MAX as usize / 128;
    KvLayout::new(edge, 1, 1, 12, 4).unwrap();
    assert!(KvLayout::new(edge + 1, 1, 1, 12, 4).is_err());
    // The V head may be the wider one.
    let wide_v = usize::MAX / 16;
    assert!(KvLayout::with_v_head_dim(1, 1, 1, wide_v, 12, 4).is_err());
    let ok = layout();
    assert_eq!((ok.slots(), ok.pages()), (16, 4));
    assert_eq!(
        (ok.row_len(KvTensor::K), ok.row_len(KvTensor::V)),
        (K_ROW, V_ROW)
    );
}

// A layout at the address space's edge has rows so wide that a call naming many slots (a slot
// may repeat) asks for more elements than a usize counts: a length error, not an overflow.
#[test]
fn data_for_more_rows_than_a_usize_counts_is_a_length_error() {
    let head_dim = 1 << 58;
    let wide = KvLayout::new(1, 1, head_dim, 1, 1).unwrap();
    let slots = [1 as KvSlot; 64];
    let error = wide
        .check_store(
            KvDtype::F32,
            0,
            &slots,
            KvSlice::F32(&[]),
            KvSlice::F32(&[]),
        )
        .unwrap_err();
    assert!(
        matches!(
            error,
            KvPoolError::DataLength {
                tensor: KvTensor::K,
                expected: usize::MAX,
                got: 0,
                rows: 64,
                row_len
            } if row_len == head_dim
        ),
        "{error}"
    );
}

#[test]
fn store_errors_leave_the_pool_unchanged() {
    let (mut pool, before) = filled_pool();
    let k = vec![9.0f32; 2 * K_ROW];
    let v = vec![9.0f32; 2 * V_ROW];
    let k16 = vec![f16::ONE; 2 * K_ROW];

    let err = pool
        .store_kv(3, &[1, 2], KvSlice::F32(&k), KvSlice::F32(&v))
        .unwrap_err();
    assert!(
        matches!(
            err,
            KvPoolError::BadLayer {
                layer: 3,
                layers: 3
            }
        ),
        "{err}"
    );

    // The first slot is valid, so a write-as-you-go pool would have changed row 1.
    let err = pool
        .store_kv(0, &[1, 16], KvSlice::F32(&k), KvSlice::F32(&v))
        .unwrap_err();
    assert!(
        matches!(
            err,
            KvPoolError::SlotOutOfRange {
                index: 1,
                slot: 16,
                slots: 16
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("valid slots are 0..16"), "{err}");

    let err = pool
        .store_kv(0, &[1], KvSlice::F32(&k), KvSlice::F32(&v[..V_ROW]))
        .unwrap_err();
    assert!(
        matches!(
            err,
            KvPoolError::DataLength {
                tensor: KvTensor::K,
                expected: 8,
                got: 16,
                rows: 1,
                row_len: 8
            }
        ),
        "{err}"
    );
    let err = pool
        .store_kv(0, &[1, 2], KvSlice::F32(&k), KvSlice::F32(&v[1..]))
        .unwrap_err();
    assert!(
        matches!(
            err,
            KvPoolError::DataLength {
                tensor: KvTensor::V,
                expected: 8,
                got: 7,
                ..
            }
        ),
        "{err}"
    );

    let err = pool
        .store_kv(0, &[1, 2], KvSlice::F16(&k16), KvSlice::F32(&v))
        .unwrap_err();
    assert!(
        matches!(
            err,
            KvPoolError::DtypeMismatch {
                pool: KvDtype::F32,
                got: KvDtype::F16
            }
        ),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "dtype mismatch: the pool stores f32, the data is f16"
    );

    assert_eq!(snapshot(&pool), before);
}

#[test]
fn load_errors_name_the_problem() {
    let (pool, _) = filled_pool();
    assert!(matches!(
        pool.load_kv(5, &[0]),
        Err(KvPoolError::BadLayer { layer: 5, .. })
    ));
    assert!(matches!(
        pool.load_kv(0, &[0, 3, 99]),
        Err(KvPoolError::SlotOutOfRange {
            index: 2,
            slot: 99,
            ..
        })
    ));
    let (k, v) = pool.load_kv(0, &[]).unwrap();
    assert!(k.is_empty() && v.is_empty());
}

#[test]
fn copy_errors_leave_the_pool_unchanged() {
    let (mut pool, before) = filled_pool();
    assert!(matches!(
        pool.copy_slots(&[1, 2], &[3]),
        Err(KvPoolError::CopyLengthMismatch { src: 2, dst: 1 })
    ));
    assert!(matches!(
        pool.copy_slots(&[1, 2], &[3, 16]),
        Err(KvPoolError::SlotOutOfRange {
            index: 1,
            slot: 16,
            ..
        })
    ));
    assert!(matches!(
        pool.copy_slots(&[40, 2], &[3, 4]),
        Err(KvPoolError::SlotOutOfRange {
            index: 0,
            slot: 40,
            ..
        })
    ));
    let err = pool.copy_pages(&[1, 2], &[3, 4]).unwrap_err();
    assert!(
        matches!(
            err,
            KvPoolError::PageOutOfRange {
                index: 1,
                range: PageOutOfRange { page: 4, pages: 4 }
            }
        ),
        "{err}"
    );
    assert!(matches!(
        pool.copy_pages(&[1], &[2, 3]),
        Err(KvPoolError::CopyLengthMismatch { src: 1, dst: 2 })
    ));
    assert_eq!(snapshot(&pool), before);
}

#[test]
fn copy_slots_copies_every_layer() {
    let (mut pool, before) = filled_pool();
    pool.copy_slots(&[5, 6, 7], &[6, 7, 1]).unwrap();
    for (layer, (k_before, _)) in before.iter().enumerate() {
        let KvData::F32(k_before) = k_before else {
            unreachable!()
        };
        let (k, _) = pool.load_kv(layer, &[6, 7, 1]).unwrap();
        let expected: Vec<f32> = [5, 6, 7]
            .iter()
            .flat_map(|&s| k_before[s * K_ROW..(s + 1) * K_ROW].iter().copied())
            .collect();
        assert_eq!(k, KvData::F32(expected));
    }
}

/// A 2-layer f32 pool of 3 pages of 4 slots (page 0 the padding), each K and V row one
/// element: `K[layer][slot] = 100 * layer + slot`, `V = -K`.
fn numbered_pool() -> HostKvPool<f32> {
    let mut pool = HostKvPool::<f32>::new(KvLayout::new(2, 1, 1, 8, 4).unwrap()).unwrap();
    let slots: Vec<KvSlot> = (0..12).collect();
    for layer in 0..2 {
        let k: Vec<f32> = slots.iter().map(|&s| (100 * layer + s) as f32).collect();
        let v: Vec<f32> = k.iter().map(|x| -x).collect();
        pool.store_kv(layer as usize, &slots, KvSlice::F32(&k), KvSlice::F32(&v))
            .unwrap();
    }
    pool
}

fn k_rows(pool: &HostKvPool<f32>, layer: usize) -> Vec<f32> {
    let (k, _) = pool.load_kv(layer, &(0..12).collect::<Vec<_>>()).unwrap();
    let KvData::F32(k) = k else {
        unreachable!("an f32 pool loads f32 rows")
    };
    k
}

// `KvPool::store_kv`: "A repeated slot ... the host writes the last of its rows".
#[test]
fn the_host_pool_keeps_the_last_row_stored_to_a_repeated_slot() {
    let mut pool = numbered_pool();
    pool.store_kv(
        1,
        &[0, 5, 0],
        KvSlice::F32(&[1.0, 2.0, 3.0]),
        KvSlice::F32(&[-1.0, -2.0, -3.0]),
    )
    .unwrap();
    let (k, v) = pool.load_kv(1, &[0, 5]).unwrap();
    assert_eq!(k, KvData::F32(vec![3.0, 2.0]));
    assert_eq!(v, KvData::F32(vec![-3.0, -2.0]));
}

// `KvPool::copy_pages`: whole pages `src[i]` -> `dst[i]` in every layer, all read before any
// is written (so two pages can be swapped).
#[test]
fn copy_pages_copies_whole_pages_in_every_layer_and_may_swap_them() {
    let mut pool = numbered_pool();
    pool.copy_pages(&[1, 2], &[2, 1]).unwrap();
    for layer in 0..2 {
        let base = (100 * layer) as f32;
        let expected: Vec<f32> = [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7]
            .iter()
            .map(|&s| base + s as f32)
            .collect();
        assert_eq!(k_rows(&pool, layer), expected, "layer {layer}");
        let (_, v) = pool.load_kv(layer, &[4, 8]).unwrap();
        assert_eq!(v, KvData::F32(vec![-(base + 8.0), -(base + 4.0)]));
    }
}

/// Store calls: each a layer and a list of (slot, seed) rows.
fn store_calls() -> impl Strategy<Value = Vec<(usize, Vec<(KvSlot, u16)>)>> {
    proptest::collection::vec(
        (
            0usize..3,
            proptest::collection::vec((0 as KvSlot..16, any::<u16>()), 0..10),
        ),
        1..12,
    )
}

/// Distinct non-zero row values derived from a seed; V rows are negative.
fn row<T: KvElement>(seed: u16, len: usize, sign: f32) -> Vec<T> {
    (0..len)
        .map(|i| T::from_f32(sign * (seed as f32 + i as f32 + 1.0)))
        .collect()
}

fn run_model<T: KvElement>(calls: &[(usize, Vec<(KvSlot, u16)>)]) {
    let mut pool = new_host_pool(layout(), T::DTYPE).unwrap();
    let mut model: HashMap<(usize, KvSlot), (Vec<T>, Vec<T>)> = HashMap::new();
    for (layer, rows) in calls {
        let slots: Vec<KvSlot> = rows.iter().map(|&(slot, _)| slot).collect();
        let k: Vec<T> = rows
            .iter()
            .flat_map(|&(_, s)| row::<T>(s, K_ROW, 1.0))
            .collect();
        let v: Vec<T> = rows
            .iter()
            .flat_map(|&(_, s)| row::<T>(s, V_ROW, -1.0))
            .collect();
        pool.store_kv(*layer, &slots, T::as_kv_slice(&k), T::as_kv_slice(&v))
            .unwrap();
        for &(slot, seed) in rows {
            model.insert(
                (*layer, slot),
                (row(seed, K_ROW, 1.0), row(seed, V_ROW, -1.0)),
            );
        }
    }
    let zero = (vec![T::default(); K_ROW], vec![T::default(); V_ROW]);
    for layer in 0..3 {
        let slots: Vec<KvSlot> = (0..16).collect();
        let (k, v) = pool.load_kv(layer, &slots).unwrap();
        let (k, v) = (k.into_vec::<T>().unwrap(), v.into_vec::<T>().unwrap());
        for slot in slots {
            let s = slot as usize;
            let (mk, mv) = model.get(&(layer, slot)).unwrap_or(&zero);
            assert_eq!(
                &k[s * K_ROW..(s + 1) * K_ROW],
                &mk[..],
                "K layer {layer} slot {slot}"
            );
            assert_eq!(
                &v[s * V_ROW..(s + 1) * V_ROW],
                &mv[..],
                "V layer {layer} slot {slot}"
            );
        }
    }
}

proptest! {
    #![proptest_config(common::beside_source(ProptestConfig::default()))]

    /// Loading returns, per slot, the row of the last store to it (zero if never stored).
    #[test]
    fn store_load_round_trip(calls in store_calls()) {
        run_model::<f32>(&calls);
        run_model::<f16>(&calls);
        run_model::<bf16>(&calls);
    }
}

#[test]
fn the_layout_and_element_types_report_what_they_were_built_with() {
    let layout = layout();
    assert_eq!(
        (
            layout.layers(),
            layout.kv_heads(),
            layout.head_dim(),
            layout.v_head_dim(),
            layout.capacity(),
            layout.page_size()
        ),
        (3, 2, 4, 2, 12, 4)
    );
    assert_eq!(layout.page_slots(&[1, 3]), [4, 5, 6, 7, 12, 13, 14, 15]);
    let sizes = KvDtype::ALL.map(KvDtype::size_bytes);
    assert_eq!(sizes, [4, 2, 2]);
    let data = KvData::F16(vec![f16::ONE; 3]);
    assert_eq!((data.len(), data.is_empty()), (3, false));
    assert_eq!(
        (data.as_slice().len(), data.as_slice().is_empty()),
        (3, false)
    );
    let empty = KvData::Bf16(Vec::new());
    assert!(empty.is_empty() && empty.as_slice().is_empty());
}
