//! A free owner's capability token is a type of the function's name: an owner named like a
//! primitive type would shadow that type in its module (here every `char` below would be the
//! token), so the name is refused.

#[kvown::guarded]
pub struct Lexer {
    #[owned_by(char)]
    pos: usize,
}

#[kvown::owner]
pub fn char(lexer: &mut Lexer, c: char) -> char {
    lexer.set_pos(owner, c as usize);
    c
}

fn main() {}
