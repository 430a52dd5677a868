//! First hour: a plain function writes an owned field with `owner`, which only an owner's body
//! has. The fix: mark it `#[kvown::owner]` and list it in `#[owned_by(..)]`.

mod bank {
    #[kvown::guarded]
    pub struct Account {
        #[owned_by(deposit, withdraw)]
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

    pub fn reset(account: &mut Account) {
        account.set_balance(owner, 0);
    }
}

fn main() {}
