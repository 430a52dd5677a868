//! First hour: a method owner that is not listed. The message names it `Order::reopen`.

mod orders {
    #[kvown::guarded]
    pub struct Order {
        #[owned_by(Order::ship, Order::cancel)]
        state: u8,
    }

    #[kvown::owners]
    impl Order {
        #[owner]
        pub fn ship(&mut self) {
            self.set_state(owner, 1);
        }

        #[owner]
        pub fn cancel(&mut self) {
            self.set_state(owner, 2);
        }

        #[owner]
        pub fn reopen(&mut self) {
            self.set_state(owner, 0);
        }
    }
}

fn main() {}
