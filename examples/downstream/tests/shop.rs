//! The shop's behaviour, and its ownership table.

use kvown_downstream::ledger::{self, Overdraft};
use kvown_downstream::orders::{Order, OrderState};
use kvown_downstream::storage::Bin;

#[test]
fn owners_move_the_balance_and_a_refused_withdrawal_changes_nothing() {
    let mut account = ledger::open("Ada");
    ledger::deposit(&mut account, 500);
    assert_eq!(
        ledger::withdraw(&mut account, 800),
        Err(Overdraft {
            requested: 800,
            available: 500
        })
    );
    ledger::withdraw(&mut account, 200).unwrap();
    assert_eq!(account.balance(), 300);
}

#[test]
fn an_order_ships_or_cancels_once() {
    let mut order = Order::new(&["lamp"]);
    assert!(order.ship());
    assert!(!order.cancel());
    assert_eq!(order.state(), OrderState::Shipped);
}

#[test]
fn a_bin_hands_back_what_does_not_fit() {
    let mut bin = Bin::with_capacity(1);
    assert_eq!(bin.put('a'), Ok(()));
    assert_eq!(bin.put('b'), Err('b'));
    assert_eq!(bin.take(), Some('a'));
}

#[test]
fn private_items_work_the_same() {
    assert_eq!(kvown_downstream::recorded(3), 3);
}

#[test]
fn the_ownership_table_of_the_shop() {
    kvown::audit_table!("kvown_downstream")
        .unwrap()
        .assert_matches(&[
            ("Account", "balance", "deposit", 0),
            ("Account", "balance", "withdraw", 0),
            ("Order", "state", "Order::ship", 1),
            ("Order", "state", "Order::cancel", 1),
            ("Bin", "items", "Bin::put", 1),
            ("Bin", "items", "Bin::take", 1),
            ("Journal", "events", "record", 1),
            ("Journal", "events", "Journal::clear", 1),
        ]);
}
