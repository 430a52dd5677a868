//! First hour: a typo in a method owner, `Meter::tik` for `Meter::tick`.

mod meter {
    #[kvown::guarded]
    pub struct Reading {
        #[owned_by(Meter::tik)]
        count: u64,
    }

    pub struct Meter {
        reading: Reading,
    }

    #[kvown::owners]
    impl Meter {
        #[owner]
        pub fn tick(&mut self) {
            *self.reading.count_mut(owner) += 1;
        }
    }
}

fn main() {}
