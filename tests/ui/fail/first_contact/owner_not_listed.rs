//! First hour: a new `#[kvown::owner]` that is not listed in `#[owned_by(..)]`. The fix: add it
//! to the list.

mod bank {
    #[kvown::guarded]
    pub struct Account {
        #[owned_by(deposit)]
        balance: u64,
    }

    #[kvown::owner]
    pub fn deposit(account: &mut Account, amount: u64) {
        *account.balance_mut(owner) += amount;
    }

    #[kvown::owner]
    pub fn charge_fee(account: &mut Account, fee: u64) {
        *account.balance_mut(owner) -= fee;
    }
}

fn main() {}
