/// The private field of every owner capability token.
///
/// It is deliberately neither `Clone` nor `Copy`, so a user cannot add `impl Copy` to a token
/// (E0204), and the token field that holds it is private to the owner's sealed module, so a
/// token cannot be built outside its owner's body (E0451), whoever can name `OwnerSeal`.
#[derive(Debug)]
pub struct OwnerSeal(());

impl OwnerSeal {
    /// Makes a seal. Harmless on its own: a token also needs its private field named.
    #[doc(hidden)]
    #[inline(always)]
    pub const fn new() -> Self {
        OwnerSeal(())
    }
}
