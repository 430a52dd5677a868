//! First hour: reading an owned field as a field. The fix: call its getter, `balance()`.

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
}

fn is_overdrawn(account: &bank::Account) -> bool {
    account.balance == 0
}

fn main() {}
