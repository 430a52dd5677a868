//! Accounts: the balance moves only through `deposit` and `withdraw`.

use std::fmt;

/// A customer's account. Anyone reads the balance; only [`deposit`] and [`withdraw`] change it.
#[kvown::guarded]
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Account {
    /// Cents on the account.
    #[owned_by(deposit, withdraw)]
    balance: u64,
    /// Who holds the account (an ordinary field: anyone may write it).
    pub holder: String,
}

/// Why a withdrawal was refused. Nothing changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overdraft {
    /// Cents asked for.
    pub requested: u64,
    /// Cents on the account.
    pub available: u64,
}

impl fmt::Display for Overdraft {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "asked for {} cents, {} available",
            self.requested, self.available
        )
    }
}

impl std::error::Error for Overdraft {}

/// Opens an empty account: the init struct is how a guarded struct is built.
pub fn open(holder: &str) -> Account {
    Account::from(AccountInit {
        balance: 0,
        holder: holder.to_string(),
    })
}

/// Moves `delta` cents in or out, on behalf of an owner of `balance`: the bound in the
/// signature shows that this helper writes the balance, and only owners can call it.
fn apply(account: &mut Account, owner: &impl AccountBalanceOwner, delta: i64) {
    let balance = account.balance_mut(owner);
    *balance = balance
        .checked_add_signed(delta)
        .expect("checked by the caller");
}

/// Adds `cents` to the account.
#[kvown::owner]
pub fn deposit(account: &mut Account, cents: u64) {
    apply(account, owner, cents as i64);
}

/// Takes `cents` from the account, or refuses (changing nothing) when the balance is short.
#[kvown::owner]
pub fn withdraw(account: &mut Account, cents: u64) -> Result<(), Overdraft> {
    if cents > account.balance() {
        return Err(Overdraft {
            requested: cents,
            available: account.balance(),
        });
    }
    apply(account, owner, -(cents as i64));
    Ok(())
}
