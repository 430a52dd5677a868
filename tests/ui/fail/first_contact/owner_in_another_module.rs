//! First hour: an owner that lives in another module, listed by its bare name. The fix: list it
//! by its path from the struct's module, `#[owned_by(teller::deposit)]`.

mod bank {
    #[kvown::guarded]
    pub struct Account {
        #[owned_by(deposit)]
        balance: u64,
    }

    pub mod teller {
        use super::Account;

        #[kvown::owner]
        pub fn deposit(account: &mut Account, amount: u64) {
            *account.balance_mut(owner) += amount;
        }
    }
}

fn main() {}
