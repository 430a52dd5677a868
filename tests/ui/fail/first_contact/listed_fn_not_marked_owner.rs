//! First hour: a function listed in `#[owned_by(..)]` but not marked `#[kvown::owner]`.

mod bank {
    #[kvown::guarded]
    pub struct Account {
        #[owned_by(deposit)]
        balance: u64,
    }

    pub fn deposit(account: &mut Account, amount: u64) {
        *account.balance_mut(owner) += amount;
    }
}

fn main() {}
