//! First hour: a typo in `#[owned_by(..)]`. rustc suggests the declared owner of the closest
//! name.

mod bank {
    #[kvown::guarded]
    pub struct Account {
        #[owned_by(deposit, withdrow)]
        balance: u64,
    }

    #[kvown::owner]
    pub fn deposit(account: &mut Account, amount: u64) {
        *account.balance_mut(owner) += amount;
    }

    #[kvown::owner]
    pub fn withdraw(account: &mut Account, amount: u64) {
        *account.balance_mut(owner) -= amount;
    }
}

fn main() {}
