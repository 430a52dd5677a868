//! A `Drop` impl is code like any other: it reads an owned field for free, but cannot write it.

#[kvown::guarded]
pub struct Span {
    #[owned_by(enter)]
    depth: usize,
    pub name: String,
}

#[kvown::owner]
pub fn enter(span: &mut Span) {
    *span.depth_mut(owner) += 1;
}

impl Drop for Span {
    fn drop(&mut self) {
        eprintln!("leaving {} at {}", self.name, self.depth());
        self.depth -= 1;
    }
}

fn main() {}
