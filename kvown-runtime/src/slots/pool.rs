//! [`ReqToTokenPool`]: the `(size + 1) × max_context_len` table of KV slots and its free rows.

use std::iter::repeat_n;

use super::SlotError;
use crate::ids::{KvSlot, ReqRow};

/// Request-to-token table: rows `1..=size` for running requests plus padding row 0, each
/// `max_context_len` KV slots wide, zero-initialised (unwritten entries read as slot 0).
///
/// * `alloc` takes rows from the **tail** of the free-row list, in list order, all or nothing.
/// * `free` appends the row to the list (reused first, LIFO) and leaves its contents.
/// * Every assignment bumps the row's generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReqToTokenPool {
    size: usize,
    max_context_len: usize,
    table: Vec<KvSlot>,
    free_rows: Vec<ReqRow>,
    held: Vec<bool>,
    /// The request each held row was assigned to, when the batch flow recorded it.
    assigned_to: Vec<Option<u64>>,
    req_generation: Vec<u64>,
}

/// `items` in a vector, or `None` when the system allocator refuses the vector.
fn collected<T>(items: impl ExactSizeIterator<Item = T>) -> Option<Vec<T>> {
    let mut vector = Vec::new();
    vector.try_reserve_exact(items.len()).ok()?;
    vector.extend(items);
    Some(vector)
}

/// The entries of a [`ReqToTokenPool`] (row `r`, position `p` at `r * width + p`), borrowed
/// for one pass.
pub(crate) struct TableEntries<'a> {
    /// Every row's slots, row after row.
    pub(crate) entries: &'a mut [KvSlot],
    /// Positions per row.
    pub(crate) width: usize,
}

impl ReqToTokenPool {
    /// A pool of `size` request rows of `max_context_len` positions, all free: `[1, …, size]`.
    ///
    /// Fails with [`SlotError::TableTooLarge`] when the table, or the per-row bookkeeping,
    /// would exceed the address space (`isize::MAX` bytes) or the system allocator refuses it.
    /// The table is zeroed at once: its memory is taken now, not at the first write.
    ///
    /// # Examples
    ///
    /// ```
    /// use kvown_runtime::slots::ReqToTokenPool;
    ///
    /// let pool = ReqToTokenPool::new(8, 16)?;
    /// assert_eq!((pool.size(), pool.available_size()), (8, 8));
    /// assert!(ReqToTokenPool::new(usize::MAX, 2).is_err(), "more than the address space");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn new(size: usize, max_context_len: usize) -> Result<Self, SlotError> {
        let too_large = SlotError::TableTooLarge {
            rows: size.saturating_add(1),
            max_context_len,
        };
        let addressable = |count: usize, element: usize| {
            count
                .checked_mul(element)
                .is_some_and(|bytes| bytes <= isize::MAX as usize)
        };
        let Some(rows) = size.checked_add(1) else {
            return Err(too_large);
        };
        let entries = match rows.checked_mul(max_context_len) {
            Some(entries)
                if addressable(entries, size_of::<KvSlot>())
                    && addressable(rows, size_of::<Option<u64>>()) =>
            {
                entries
            }
            _ => return Err(too_large),
        };
        Self::allocate(size, max_context_len, entries).ok_or(too_large)
    }

    /// The pool for sizes checked against the address space, or `None` when the system
    /// allocator refuses one of its vectors.
    fn allocate(size: usize, max_context_len: usize, entries: usize) -> Option<Self> {
        let rows = size + 1;
        Some(Self {
            size,
            max_context_len,
            table: collected(repeat_n(0, entries))?,
            free_rows: collected(1..rows)?,
            held: collected(repeat_n(false, rows))?,
            assigned_to: collected(repeat_n(None, rows))?,
            req_generation: collected(repeat_n(0, rows))?,
        })
    }

    /// Rows available to requests (row 0 excluded).
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(8, 16)?;
    /// pool.alloc(3)?;
    /// assert_eq!(pool.size(), 8, "held rows count too");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn size(&self) -> usize {
        self.size
    }

    /// Positions per row.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let pool = ReqToTokenPool::new(8, 16)?;
    /// assert_eq!(pool.max_context_len(), 16);
    /// assert_eq!(pool.row(1)?.len(), 16);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn max_context_len(&self) -> usize {
        self.max_context_len
    }

    /// Rows free now.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(8, 16)?;
    /// pool.alloc(3)?;
    /// assert_eq!(pool.available_size(), 5);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn available_size(&self) -> usize {
        self.free_rows.len()
    }

    /// The free-row list; `alloc` takes from its end, `free` appends to it.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(4, 16)?;
    /// assert_eq!(pool.free_rows(), [1, 2, 3, 4]);
    /// pool.alloc(2)?; // rows 3 and 4, from the end
    /// pool.free(3)?; // appended: reused first
    /// assert_eq!(pool.free_rows(), [1, 2, 3]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn free_rows(&self) -> &[ReqRow] {
        &self.free_rows
    }

    /// Whether `row` is held by a request (false for row 0 and out-of-range rows).
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(8, 16)?;
    /// let rows = pool.alloc(1)?;
    /// assert!(pool.is_held(rows[0]));
    /// assert!(!pool.is_held(1) && !pool.is_held(0) && !pool.is_held(99));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn is_held(&self, row: ReqRow) -> bool {
        self.held.get(row).copied().unwrap_or(false)
    }

    /// The request (by rid) the batch flow assigned the held `row` to; `None` for a free row, an
    /// out-of-range one, or one taken with [`ReqToTokenPool::alloc`] directly. The invariant
    /// checker names it when no live request holds the row any more (a leak).
    ///
    /// # Examples
    ///
    /// ```
    /// use kvown_runtime::batch::{Req, ScheduleBatch, alloc_for_extend, prepare_for_extend};
    /// # use kvown_runtime::{alloc::PagedAllocator, cache::{KvCache, TreeCache}};
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// # let allocator = PagedAllocator::new(64, 4, false)?;
    /// # let mut cache = KvCache::new(allocator, ReqToTokenPool::new(4, 32)?, TreeCache::Disabled)?;
    ///
    /// let batch = prepare_for_extend(ScheduleBatch::new(vec![Req::new(7, vec![1, 2, 3])]));
    /// let batch = alloc_for_extend(batch, &mut cache).map_err(|f| f.error)?;
    /// let row = batch.reqs()[0].held_row()?;
    /// assert_eq!(cache.req_to_token().assigned_to(row), Some(7));
    ///
    /// let mut pool = ReqToTokenPool::new(4, 32)?;
    /// let rows = pool.alloc(1)?;
    /// assert_eq!(pool.assigned_to(rows[0]), None, "taken directly");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn assigned_to(&self, row: ReqRow) -> Option<u64> {
        self.assigned_to.get(row).copied().flatten()
    }

    /// Records that the held `row` now belongs to request `rid` (the batch flow's extend).
    pub(crate) fn record_assignment(&mut self, row: ReqRow, rid: u64) {
        debug_assert!(self.is_held(row));
        self.assigned_to[row] = Some(rid);
    }

    /// How many times `row` has been assigned since the pool was created or cleared.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(1, 16)?;
    /// assert_eq!(pool.req_generation(1)?, 0);
    /// pool.alloc(1)?;
    /// pool.free(1)?;
    /// pool.alloc(1)?;
    /// assert_eq!(pool.req_generation(1)?, 2);
    /// assert!(pool.req_generation(2).is_err(), "out of range");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn req_generation(&self, row: ReqRow) -> Result<u64, SlotError> {
        self.check_range(row)?;
        Ok(self.req_generation[row])
    }

    /// Assigns `count` rows, in batch order, from the tail of the free-row list (a fresh pool of
    /// size 8 gives `[7, 8]` for 2), bumping each row's generation. All or nothing.
    ///
    /// Requests that already hold a row keep it and are not counted here.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(8, 16)?;
    /// assert_eq!(pool.alloc(2)?, [7, 8]);
    /// assert!(pool.alloc(7).is_err(), "6 rows left: nothing taken");
    /// assert_eq!(pool.available_size(), 6);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn alloc(&mut self, count: usize) -> Result<Vec<ReqRow>, SlotError> {
        self.next_rows(count)?;
        let rows = self.free_rows.split_off(self.free_rows.len() - count);
        for &row in &rows {
            self.held[row] = true;
            self.req_generation[row] += 1;
        }
        Ok(rows)
    }

    /// The rows [`ReqToTokenPool::alloc`] would assign for `count`, in its order, without
    /// assigning them: a caller whose next step can fail takes them only once it has not.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(8, 16)?;
    /// assert_eq!(pool.next_rows(2)?, [7, 8]);
    /// assert_eq!(pool.available_size(), 8, "nothing taken");
    /// assert_eq!(pool.alloc(2)?, [7, 8]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn next_rows(&self, count: usize) -> Result<&[ReqRow], SlotError> {
        let available = self.free_rows.len();
        if count > available {
            return Err(SlotError::OutOfRows {
                requested: count,
                available,
            });
        }
        Ok(&self.free_rows[available - count..])
    }

    /// Returns `row` to the free-row list (appended, so reused first). Its contents stay.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(8, 16)?;
    /// let rows = pool.alloc(1)?;
    /// pool.write(rows[0], 0, &[4, 5])?;
    /// pool.free(rows[0])?;
    /// assert_eq!(pool.row(rows[0])?[..2], [4, 5], "contents stay");
    /// assert!(pool.free(rows[0]).is_err(), "a double free");
    /// assert!(pool.free(0).is_err(), "the padding row");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn free(&mut self, row: ReqRow) -> Result<(), SlotError> {
        self.check_range(row)?;
        if row == 0 {
            return Err(SlotError::ReservedRow);
        }
        if !self.held[row] {
            return Err(SlotError::DoubleFree { row });
        }
        self.held[row] = false;
        self.assigned_to[row] = None;
        self.free_rows.push(row);
        Ok(())
    }

    /// The slots of `row` (any row, held or not, including padding row 0).
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let pool = ReqToTokenPool::new(8, 4)?;
    /// assert_eq!(pool.row(0)?, [0, 0, 0, 0], "zeroed; row 0 reads too");
    /// assert!(pool.row(9).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    #[inline]
    pub fn row(&self, row: ReqRow) -> Result<&[KvSlot], SlotError> {
        self.check_range(row)?;
        let start = row * self.max_context_len;
        Ok(&self.table[start..start + self.max_context_len])
    }

    /// The slot at `position` of `row`, or `None` when either is out of range (one bounds
    /// check).
    #[inline]
    pub(crate) fn slot(&self, row: ReqRow, position: usize) -> Option<KvSlot> {
        if position >= self.max_context_len {
            return None;
        }
        let index = row.checked_mul(self.max_context_len)? + position;
        self.table.get(index).copied()
    }

    /// The slots of a held `row`, writable.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(8, 4)?;
    /// assert!(pool.row_mut(8).is_err(), "not held");
    /// let rows = pool.alloc(1)?;
    /// pool.row_mut(rows[0])?[3] = 12;
    /// assert_eq!(pool.row(rows[0])?, [0, 0, 0, 12]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn row_mut(&mut self, row: ReqRow) -> Result<&mut [KvSlot], SlotError> {
        self.check_writable(row)?;
        let start = row * self.max_context_len;
        Ok(&mut self.table[start..start + self.max_context_len])
    }

    /// The table's entries, for a pass that reads and writes many rows (the trusted decode
    /// step).
    #[inline]
    pub(crate) fn entries_mut(&mut self) -> TableEntries<'_> {
        TableEntries {
            entries: &mut self.table,
            width: self.max_context_len,
        }
    }

    /// Writes `slot` at `position` of `row`, which the caller knows is held (only the slice
    /// bounds are checked).
    #[inline]
    pub(crate) fn set_held(&mut self, row: ReqRow, position: usize, slot: KvSlot) {
        debug_assert!(self.check_writable(row).is_ok(), "row {row} is not held");
        debug_assert!(position < self.max_context_len);
        self.table[row * self.max_context_len + position] = slot;
    }

    /// Writes `values` to positions `start_pos..start_pos + values.len()` of a held `row`.
    /// Nothing is written on error.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(8, 4)?;
    /// let row = pool.alloc(1)?[0];
    /// pool.write(row, 1, &[8, 9])?;
    /// assert_eq!(pool.row(row)?, [0, 8, 9, 0]);
    /// assert!(pool.write(row, 3, &[1, 2]).is_err(), "past the row: nothing written");
    /// assert_eq!(pool.row(row)?[3], 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(
        &mut self,
        row: ReqRow,
        start_pos: usize,
        values: &[KvSlot],
    ) -> Result<(), SlotError> {
        let row_width = self.max_context_len;
        let end = start_pos.saturating_add(values.len());
        if end > row_width {
            self.check_range(row)?;
            return Err(SlotError::PositionOutOfRange {
                row,
                start: start_pos,
                end,
                row_width,
            });
        }
        self.row_mut(row)?[start_pos..end].copy_from_slice(values);
        Ok(())
    }

    /// Every row free again (`[1, …, size]`), generations zeroed. Row contents stay.
    ///
    /// # Examples
    ///
    /// ```
    /// # use kvown_runtime::slots::ReqToTokenPool;
    /// let mut pool = ReqToTokenPool::new(4, 16)?;
    /// pool.alloc(3)?;
    /// pool.clear();
    /// assert_eq!(pool.free_rows(), [1, 2, 3, 4]);
    /// assert_eq!(pool.req_generation(4)?, 0);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn clear(&mut self) {
        self.free_rows.clear();
        self.free_rows.extend(1..=self.size);
        self.held.fill(false);
        self.assigned_to.fill(None);
        self.req_generation.fill(0);
    }

    fn check_range(&self, row: ReqRow) -> Result<(), SlotError> {
        if row > self.size {
            return Err(SlotError::RowOutOfRange {
                row,
                size: self.size,
            });
        }
        Ok(())
    }

    fn check_writable(&self, row: ReqRow) -> Result<(), SlotError> {
        self.check_range(row)?;
        if row == 0 {
            return Err(SlotError::ReservedRow);
        }
        if !self.held[row] {
            return Err(SlotError::RowNotHeld { row });
        }
        Ok(())
    }
}
