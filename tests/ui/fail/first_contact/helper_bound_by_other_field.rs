//! First hour: a helper bound by the owner trait of another field. The fix: bound it by the
//! trait of the field it writes (`AccountBalanceOwner`), or by both.

mod bank {
    #[kvown::guarded]
    pub struct Account {
        #[owned_by(deposit)]
        balance: u64,
        #[owned_by(deposit)]
        frozen: bool,
    }

    fn credit(account: &mut Account, owner: &impl AccountFrozenOwner, amount: u64) {
        *account.balance_mut(owner) += amount;
    }

    #[kvown::owner]
    pub fn deposit(account: &mut Account, amount: u64) {
        if !account.frozen() {
            credit(account, owner, amount);
        }
        account.set_frozen(owner, false);
    }
}

fn main() {}
