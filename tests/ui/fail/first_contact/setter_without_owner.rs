//! First hour: calling the setter without the capability. The fix: pass `owner` first.

mod bank {
    #[kvown::guarded]
    pub struct Account {
        #[owned_by(deposit)]
        balance: u64,
    }

    #[kvown::owner]
    pub fn deposit(account: &mut Account, amount: u64) {
        account.set_balance(account.balance() + amount);
    }
}

fn main() {}
