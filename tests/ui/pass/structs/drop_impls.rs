//! A guarded struct may implement `Drop`: nothing `#[guarded]` generates moves a field out of
//! `self` (`into_init`, which would, is generated only on request, `#[guarded(into_init)]`, for a
//! struct without a destructor). Owned and plain fields of `String`, `Vec` and generic types;
//! each destructor reads owned fields through their getters and writes a plain field.

use std::cell::RefCell;
use std::fmt::Debug;

thread_local! {
    static DROPPED: RefCell<Vec<String>> = const { RefCell::new(Vec::new()) };
}

fn record(line: String) {
    DROPPED.with(|dropped| dropped.borrow_mut().push(line));
}

#[kvown::guarded]
#[derive(Debug, Default)]
pub struct Span {
    #[owned_by(enter)]
    depth: usize,
    #[owned_by(enter)]
    path: String,
    pub name: String,
}

impl Drop for Span {
    fn drop(&mut self) {
        self.name.push('!');
        record(format!("{} {} at {}", self.name, self.path(), self.depth()));
    }
}

#[kvown::owner]
pub fn enter(span: &mut Span, step: &str) {
    *span.depth_mut(owner) += 1;
    span.path_mut(owner).push_str(step);
}

#[kvown::guarded]
pub struct Batch {
    #[owned_by(push)]
    items: Vec<String>,
    label: String,
}

impl Drop for Batch {
    fn drop(&mut self) {
        let view = self.fields_mut();
        view.label.push_str(" done");
        record(format!("{}: {:?}", view.label, view.items));
    }
}

#[kvown::owner]
pub fn push(batch: &mut Batch, item: &str) {
    batch.items_mut(owner).push(item.to_string());
}

#[kvown::guarded]
#[derive(Debug)]
pub struct Pool<T: Clone + Debug> {
    #[owned_by(Pool::put)]
    slots: Vec<T>,
    #[owned_by(Pool::put)]
    last: Option<T>,
    spare: T,
}

impl<T: Clone + Debug> Drop for Pool<T> {
    fn drop(&mut self) {
        record(format!(
            "{:?} {:?} {:?}",
            self.slots(),
            self.last(),
            self.spare
        ));
    }
}

#[kvown::owners]
impl<T: Clone + Debug> Pool<T> {
    #[owner]
    pub fn put(&mut self, value: T) {
        self.set_last(owner, Some(value.clone()));
        self.slots_mut(owner).push(value);
    }
}

#[test]
fn compiles_and_runs() {
    {
        let mut span = Span::from(SpanInit {
            name: "req".to_string(),
            ..Default::default()
        });
        enter(&mut span, "/a");
        enter(&mut span, "/b");
        let mut batch = Batch::from(BatchInit {
            items: Vec::new(),
            label: "batch".to_string(),
        });
        push(&mut batch, "x");
        let mut pool = Pool::from(PoolInit {
            slots: vec![1u8],
            last: None,
            spare: 9,
        });
        pool.put(2);
    }
    DROPPED.with(|dropped| {
        assert_eq!(
            *dropped.borrow(),
            ["[1, 2] Some(2) 9", "batch done: [\"x\"]", "req! /a/b at 2"]
        );
    });
}
