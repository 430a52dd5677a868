//! First hour: writing an owned field directly. The fix: `set_balance(owner, ..)` or
//! `balance_mut(owner)` inside one of the field's owners.

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

    pub fn add_interest(account: &mut Account) {
        account.balance += account.balance / 100;
    }
}

fn main() {}
