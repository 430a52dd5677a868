//! One number for the K/V a set of slots holds, to check that a copy or a transfer moved the
//! bytes it should.

use std::hash::{DefaultHasher, Hasher};

use super::{KvData, KvPool, KvPoolError};
use crate::ids::KvSlot;

/// A hash of the K and V rows of `slots` in every layer, in slot order, over the elements' bits.
///
/// Two pools give the same digest exactly when they hold the same bytes at those slots (up to
/// hash collisions), whatever their backend, as long as both are hashed by one build of a program
/// (the hash is std's [`DefaultHasher`], whose algorithm may change between Rust releases): two
/// processes of one binary, such as the prefill and decode nodes of a disaggregated pair, compare
/// alike. A slot past the pool is the pool's own `load_kv` error.
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::{HostKvPool, KvLayout, KvPool, KvSlice, digest};
///
/// let layout = KvLayout::new(2, 1, 2, 8, 4)?;
/// let (mut a, mut b) = (HostKvPool::<f32>::new(layout.clone())?, HostKvPool::<f32>::new(layout)?);
/// for layer in 0..2 {
///     a.store_kv(layer, &[4], KvSlice::F32(&[1.0, 2.0]), KvSlice::F32(&[3.0, 4.0]))?;
///     b.store_kv(layer, &[9], KvSlice::F32(&[1.0, 2.0]), KvSlice::F32(&[3.0, 4.0]))?;
/// }
/// assert_eq!(digest(&a, &[4])?, digest(&b, &[9])?);
/// assert_ne!(digest(&a, &[4])?, digest(&a, &[5])?);
/// assert!(digest(&a, &[12]).is_err()); // past the pool's 12 slots
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn digest(pool: &(impl KvPool + ?Sized), slots: &[KvSlot]) -> Result<u64, KvPoolError> {
    let mut hasher = DefaultHasher::new();
    for layer in 0..pool.layout().layers() {
        let (k, v) = pool.load_kv(layer, slots)?;
        for rows in [k, v] {
            match rows {
                KvData::F32(rows) => rows.iter().for_each(|x| hasher.write_u32(x.to_bits())),
                KvData::F16(rows) => rows.iter().for_each(|x| hasher.write_u16(x.to_bits())),
                KvData::Bf16(rows) => rows.iter().for_each(|x| hasher.write_u16(x.to_bits())),
            }
        }
    }
    Ok(hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{HostKvPool, KvLayout, KvSlice};

    fn pool_with(slot: KvSlot, k: f32) -> HostKvPool<f32> {
        let mut pool = HostKvPool::<f32>::new(KvLayout::new(3, 1, 2, 8, 4).unwrap()).unwrap();
        for layer in 0..3 {
            let v = [layer as f32, 0.5];
            pool.store_kv(layer, &[slot], KvSlice::F32(&[k, 1.0]), KvSlice::F32(&v))
                .unwrap();
        }
        pool
    }

    #[test]
    fn same_rows_hash_alike_and_any_changed_element_or_order_differs() {
        let (a, b) = (pool_with(4, 2.0), pool_with(6, 2.0));
        assert_eq!(digest(&a, &[4, 5]).unwrap(), digest(&b, &[6, 5]).unwrap());
        assert_ne!(
            digest(&a, &[4]).unwrap(),
            digest(&pool_with(4, 2.5), &[4]).unwrap()
        );
        assert_ne!(digest(&a, &[4, 5]).unwrap(), digest(&a, &[5, 4]).unwrap());
        // -0.0 and 0.0 compare equal as floats but are other bits.
        assert_ne!(
            digest(&pool_with(4, 0.0), &[4]).unwrap(),
            digest(&pool_with(4, -0.0), &[4]).unwrap()
        );
    }

    #[test]
    fn a_slot_past_the_pool_is_the_pools_error() {
        let pool = pool_with(4, 1.0);
        let refused = pool.load_kv(0, &[4, 12]).unwrap_err().to_string();
        assert_eq!(digest(&pool, &[4, 12]).unwrap_err().to_string(), refused);
    }
}
