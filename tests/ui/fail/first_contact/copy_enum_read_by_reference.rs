//! First hour: a `Copy` enum field reads by reference unless the field says `read = copy`
//! (kvown cannot see that a user's enum is `Copy`).

mod orders {
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum OrderState {
        Open,
        Shipped,
    }

    #[kvown::guarded]
    pub struct Order {
        #[owned_by(Order::ship)]
        state: OrderState,
    }

    #[kvown::owners]
    impl Order {
        #[owner]
        pub fn ship(&mut self) {
            if self.state() == OrderState::Open {
                self.set_state(owner, OrderState::Shipped);
            }
        }
    }
}

fn main() {}
