//! `#[owner]` applies to functions.

#[kvown::owner]
pub struct NotAFunction;

#[kvown::owners]
impl NotAFunction {
    pub fn plain(&self) {}
}

fn main() {}
