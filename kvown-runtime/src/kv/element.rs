//! The three KV element types and the typed data that carries them across the pool interface.

use std::fmt;

use half::{bf16, f16};

/// Element type of a KV pool's buffers.
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::KvDtype;
///
/// assert_eq!(KvDtype::F32.size_bytes(), 4);
/// assert_eq!(KvDtype::Bf16.size_bytes(), 2);
/// assert_eq!(KvDtype::F16.to_string(), "f16");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float ([`half::f16`]).
    F16,
    /// bfloat16 ([`half::bf16`]).
    Bf16,
}

impl KvDtype {
    /// Every dtype a pool supports.
    pub const ALL: [KvDtype; 3] = [KvDtype::F32, KvDtype::F16, KvDtype::Bf16];

    /// Bytes per element.
    pub const fn size_bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
        })
    }
}

/// Borrowed K or V rows of one dtype, as passed to [`crate::kv::KvPool::store_kv`].
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::{KvDtype, KvSlice};
///
/// let rows = KvSlice::F32(&[1.0, 2.0, 3.0]);
/// assert_eq!((rows.dtype(), rows.len(), rows.is_empty()), (KvDtype::F32, 3, false));
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvSlice<'a> {
    /// f32 elements.
    F32(&'a [f32]),
    /// f16 elements.
    F16(&'a [f16]),
    /// bf16 elements.
    Bf16(&'a [bf16]),
}

impl KvSlice<'_> {
    /// The dtype of the elements.
    pub fn dtype(&self) -> KvDtype {
        match self {
            KvSlice::F32(_) => KvDtype::F32,
            KvSlice::F16(_) => KvDtype::F16,
            KvSlice::Bf16(_) => KvDtype::Bf16,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            KvSlice::F32(s) => s.len(),
            KvSlice::F16(s) => s.len(),
            KvSlice::Bf16(s) => s.len(),
        }
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Owned K or V rows of one dtype, as returned by [`crate::kv::KvPool::load_kv`].
///
/// # Examples
///
/// ```
/// use kvown_runtime::kv::{KvData, KvDtype};
///
/// let data = KvData::from(vec![half::f16::from_f32(0.5); 4]);
/// assert_eq!((data.dtype(), data.len(), data.is_empty()), (KvDtype::F16, 4, false));
/// assert_eq!(data.as_slice().len(), 4);
/// assert_eq!(data.clone().into_vec::<f32>(), None, "not f32 data");
/// assert_eq!(data.into_vec::<half::f16>().unwrap()[0].to_f32(), 0.5);
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum KvData {
    /// f32 elements.
    F32(Vec<f32>),
    /// f16 elements.
    F16(Vec<f16>),
    /// bf16 elements.
    Bf16(Vec<bf16>),
}

impl KvData {
    /// Borrows the elements.
    pub fn as_slice(&self) -> KvSlice<'_> {
        match self {
            KvData::F32(v) => KvSlice::F32(v),
            KvData::F16(v) => KvSlice::F16(v),
            KvData::Bf16(v) => KvSlice::Bf16(v),
        }
    }

    /// The dtype of the elements.
    pub fn dtype(&self) -> KvDtype {
        self.as_slice().dtype()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.as_slice().len()
    }

    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements as `T`, or `None` when `T` is not this data's dtype.
    pub fn into_vec<T: KvElement>(self) -> Option<Vec<T>> {
        T::from_data(self)
    }
}

impl<T: KvElement> From<Vec<T>> for KvData {
    fn from(values: Vec<T>) -> Self {
        T::into_data(values)
    }
}

/// An element type a KV pool can store: `f32`, [`half::f16`] or [`half::bf16`].
///
/// The conversions are exact: `T::as_kv_slice(T::from_kv_slice(s)?)` is `s`, the same slice
/// (bit for bit; `==` on floats would fail for NaN data).
///
/// # Examples
///
/// ```
/// use half::bf16;
/// use kvown_runtime::kv::{KvData, KvDtype, KvElement};
///
/// let values = vec![bf16::from_f32(1.5), bf16::from_f32(-2.0)];
/// assert_eq!(bf16::DTYPE, KvDtype::Bf16);
/// assert_eq!(f32::from_kv_slice(bf16::as_kv_slice(&values)), None, "a dtype mismatch");
/// assert_eq!(bf16::from_kv_slice(bf16::as_kv_slice(&values)), Some(&values[..]));
/// let data: KvData = bf16::into_data(values.clone());
/// assert_eq!(bf16::from_data(data), Some(values));
/// let one_and_a_half: bf16 = KvElement::from_f32(1.5); // rounds to nearest
/// assert_eq!(one_and_a_half.to_f32(), 1.5);
/// ```
pub trait KvElement: Copy + Default + PartialEq + fmt::Debug + Send + Sync + 'static {
    /// The dtype tag of `Self`.
    const DTYPE: KvDtype;
    /// Borrows `data` as `&[Self]`, or `None` when its dtype differs.
    fn from_kv_slice(data: KvSlice<'_>) -> Option<&[Self]>;
    /// Wraps `&[Self]` as typed data.
    fn as_kv_slice(values: &[Self]) -> KvSlice<'_>;
    /// Wraps an owned vector as typed data.
    fn into_data(values: Vec<Self>) -> KvData;
    /// Unwraps owned data, or `None` when its dtype differs.
    fn from_data(data: KvData) -> Option<Vec<Self>>;
    /// Converts from f32 (rounding to nearest for the 16-bit types); handy for test data.
    fn from_f32(value: f32) -> Self;
}

macro_rules! kv_element {
    ($ty:ty, $variant:ident, $from_f32:expr) => {
        impl KvElement for $ty {
            const DTYPE: KvDtype = KvDtype::$variant;

            fn from_kv_slice(data: KvSlice<'_>) -> Option<&[Self]> {
                match data {
                    KvSlice::$variant(values) => Some(values),
                    _ => None,
                }
            }

            fn as_kv_slice(values: &[Self]) -> KvSlice<'_> {
                KvSlice::$variant(values)
            }

            fn into_data(values: Vec<Self>) -> KvData {
                KvData::$variant(values)
            }

            fn from_data(data: KvData) -> Option<Vec<Self>> {
                match data {
                    KvData::$variant(values) => Some(values),
                    _ => None,
                }
            }

            fn from_f32(value: f32) -> Self {
                $from_f32(value)
            }
        }
    };
}

kv_element!(f32, F32, |value: f32| value);
kv_element!(f16, F16, f16::from_f32);
kv_element!(bf16, Bf16, bf16::from_f32);
