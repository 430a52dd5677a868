//! Orders: the state moves only through the order's own `ship` and `cancel` methods.

/// Where an order is. A `Copy` enum: its getter returns it by value because the field says
/// `read = copy` (kvown judges `Copy` by syntax, and a user enum's name does not say it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OrderState {
    /// Placed, not shipped yet.
    #[default]
    Open,
    /// On its way.
    Shipped,
    /// Cancelled before shipping.
    Cancelled,
}

/// An order. Its state changes only in [`Order::ship`] and [`Order::cancel`].
#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Order {
    #[owned_by(Order::ship, Order::cancel, read = copy)]
    state: OrderState,
    /// What was ordered.
    pub items: Vec<String>,
}

#[kvown::owners]
impl Order {
    /// Ships an open order; returns whether it did.
    #[owner]
    pub fn ship(&mut self) -> bool {
        let open = self.state() == OrderState::Open;
        if open {
            self.set_state(owner, OrderState::Shipped);
        }
        open
    }

    /// Cancels an open order; returns whether it did.
    #[owner]
    pub fn cancel(&mut self) -> bool {
        let open = self.state() == OrderState::Open;
        if open {
            self.set_state(owner, OrderState::Cancelled);
        }
        open
    }
}

impl Order {
    /// A new open order.
    pub fn new(items: &[&str]) -> Self {
        Order::from(OrderInit {
            items: items.iter().map(|item| item.to_string()).collect(),
            ..Default::default()
        })
    }
}
