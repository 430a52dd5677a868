//! Storage bins: a generic guarded struct with method owners.

/// A bin of `T`s with a capacity. Only [`Bin::put`] and [`Bin::take`] change its contents.
#[kvown::guarded]
#[derive(Debug, Clone)]
pub struct Bin<T> {
    #[owned_by(Bin::put, Bin::take)]
    items: Vec<T>,
    /// How many items fit.
    pub capacity: usize,
}

#[kvown::owners]
impl<T> Bin<T> {
    /// Puts `item` in, or hands it back when the bin is full.
    #[owner]
    pub fn put(&mut self, item: T) -> Result<(), T> {
        if self.items().len() == self.capacity {
            return Err(item);
        }
        self.items_mut(owner).push(item);
        Ok(())
    }

    /// Takes the last item put in.
    #[owner]
    pub fn take(&mut self) -> Option<T> {
        self.items_mut(owner).pop()
    }
}

impl<T> Bin<T> {
    /// An empty bin.
    pub fn with_capacity(capacity: usize) -> Self {
        Bin::from(BinInit {
            items: Vec::with_capacity(capacity),
            capacity,
        })
    }
}
