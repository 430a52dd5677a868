//! First hour: building a guarded struct with a struct literal. The fix: the init struct,
//! `Account::from(AccountInit { .. })`.

mod bank {
    #[kvown::guarded]
    #[derive(Default)]
    pub struct Account {
        #[owned_by(deposit)]
        balance: u64,
        pub holder: String,
    }

    #[kvown::owner]
    pub fn deposit(account: &mut Account, amount: u64) {
        *account.balance_mut(owner) += amount;
    }

    pub fn open(holder: &str) -> Account {
        Account { balance: 0, holder: holder.to_string() }
    }
}

fn main() {}
