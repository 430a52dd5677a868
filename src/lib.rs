//! kvown: compile-time single-owner field writes, and a paged KV-cache allocator built on them.
//!
//! # Single-owner fields
//!
//! A field of a [`macro@guarded`] struct marked `#[owned_by(f, g, Type::method)]` can be
//! **written only inside the listed functions**. Everyone reads it for free. A write anywhere
//! else is a compile error that names the function, the field and its owners. This is the
//! compile-time form of a rule like sglang's "only `alloc_for_extend` / `alloc_for_decode` may
//! change `kv_committed_len`" (sglang #37085: `prepare_for_decode` wrote it too).
//!
//! To start, read `examples/downstream` in the repository: a shop written as a user's crate (an
//! account balance written through a helper bound by its owner trait, orders with method owners,
//! a generic storage bin, a private module). `docs/macro-messages.md` quotes the error each
//! first-hour mistake gets, and its fix.
//!
//! ```
//! #[kvown::guarded]
//! #[derive(Debug, Default)]
//! pub struct ReqKvInfo {
//!     #[owned_by(alloc_for_extend, alloc_for_decode)]
//!     kv_committed_len: usize,
//!     pub rid: u64, // not owned: an ordinary field
//! }
//!
//! #[kvown::owner]
//! pub fn alloc_for_extend(req: &mut ReqKvInfo, seq_len: usize) {
//!     req.set_kv_committed_len(owner, seq_len); // `owner`: this function's capability
//! }
//!
//! #[kvown::owner]
//! pub fn alloc_for_decode(req: &mut ReqKvInfo) {
//!     *req.kv_committed_len_mut(owner) += 1;
//! }
//!
//! pub fn prepare_for_decode(req: &mut ReqKvInfo) -> usize {
//!     alloc_for_decode(req); // calling an owner is fine
//!     req.kv_committed_len() // reads are free, zero-cost
//! }
//!
//! fn main() {
//!     let mut req = ReqKvInfo::default();
//!     alloc_for_extend(&mut req, 7);
//!     assert_eq!(prepare_for_decode(&mut req), 8);
//! }
//! ```
//!
//! ## The contract
//!
//! * **Reads**: `x.field()`, anywhere the struct is visible. By value when the type is `Copy`
//!   by its syntax (primitives, shared references, tuples/arrays/`Option`s of those), else
//!   `&T`; `#[owned_by(.., read = copy)]` / `read = ref` overrides. Getters are `const fn`.
//!   A `Copy` enum or struct of your own reads by reference unless its field says
//!   `read = copy`: a macro sees the type's name, not its impls, and stable Rust cannot pick a
//!   return type by whether a type is `Copy`.
//! * **Writes**: `x.set_field(owner, value)` and `x.field_mut(owner) -> &mut T`, where `owner`
//!   is the capability of a listed owner. `field_mut` is `const fn`, and so is `set_field`
//!   for `Copy` fields, so `const fn` owners can write too.
//! * **Owners**: `#[kvown::owner]` on a free function binds `owner: &f` at the top of its
//!   body (`#[kvown::owner(token = cap)]` renames the binding). For methods put
//!   `#[kvown::owners]` on the inherent `impl` block and `#[owner]` on each owner method, and
//!   list it as `Type::method`. Owners may be generic (with where-clauses and `impl Trait`
//!   arguments), `async`, `const` or `unsafe`, and may live in other modules.
//! * **Owner paths** in `#[owned_by(..)]` resolve like `use` paths from the struct's module:
//!   `alloc`, `super::sched::alloc`, `crate::sched::alloc`, `batch::Batch::retract` (a path
//!   whose next-to-last segment starts with an uppercase letter names a method).
//! * **Nothing else writes**: `x.field = ..`, `+=`, `x.field.0 = ..`, `&mut x.field`,
//!   `mem::swap`, struct literals, `..base` updates and patterns naming an owned field fail
//!   everywhere, the struct's own module included (the struct is sealed in a hidden child
//!   module). Owned fields cannot be `pub` or interior-mutable (`Cell`, `RefCell`, atomics,
//!   `Mutex`, `RwLock`, `OnceCell`, `UnsafeCell`, ...): the macro rejects both.
//!
//! ## Helpers: delegation shows in the signature
//!
//! Each owned field has an owner trait named `<Struct><FieldInCamelCase>Owner`, exported next
//! to the struct and implemented exactly by its owners' capabilities. A helper that writes on
//! an owner's behalf takes the capability as a parameter bounded by it:
//!
//! ```
//! # #[kvown::guarded]
//! # #[derive(Default)]
//! # pub struct ReqKvInfo {
//! #     #[owned_by(alloc_for_decode)]
//! #     kv_committed_len: usize,
//! #     #[owned_by(alloc_for_decode)]
//! #     kv_allocated_len: usize,
//! # }
//! fn commit(req: &mut ReqKvInfo, owner: &impl ReqKvInfoKvCommittedLenOwner) {
//!     *req.kv_committed_len_mut(owner) += 1;
//! }
//!
//! // Several fields: `&(impl A + B)`, or a named generic `O: A + B`.
//! fn grow(
//!     req: &mut ReqKvInfo,
//!     owner: &(impl ReqKvInfoKvCommittedLenOwner + ReqKvInfoKvAllocatedLenOwner),
//! ) {
//!     commit(req, owner);
//!     req.set_kv_allocated_len(owner, req.kv_committed_len().next_multiple_of(16));
//! }
//!
//! #[kvown::owner]
//! pub fn alloc_for_decode(req: &mut ReqKvInfo) {
//!     grow(req, owner);
//! }
//! # fn main() {
//! #     let mut req = ReqKvInfo::default();
//! #     alloc_for_decode(&mut req);
//! #     assert_eq!((req.kv_committed_len(), req.kv_allocated_len()), (1, 16));
//! # }
//! ```
//!
//! A helper bounded for one field cannot write another, and code without a capability cannot
//! call the helper.
//!
//! ## The error a non-owner gets
//!
//! ```compile_fail,E0277
//! # #[kvown::guarded]
//! # pub struct ReqKvInfo {
//! #     #[owned_by(alloc_for_extend, alloc_for_decode)]
//! #     kv_committed_len: usize,
//! # }
//! # #[kvown::owner]
//! # pub fn alloc_for_extend(req: &mut ReqKvInfo) { req.set_kv_committed_len(owner, 1); }
//! # #[kvown::owner]
//! # pub fn alloc_for_decode(req: &mut ReqKvInfo) { *req.kv_committed_len_mut(owner) += 1; }
//! #[kvown::owner]
//! pub fn prepare_for_decode(req: &mut ReqKvInfo) {
//!     *req.kv_committed_len_mut(owner) += 1;
//! }
//! # fn main() {}
//! ```
//!
//! rustc 1.95 reports (from `tests/ui/fail/sglang/`):
//!
//! ```text
//! error[E0277]: `prepare_for_decode` is not an owner of `ReqKvInfo::kv_committed_len`; owners: alloc_for_extend, alloc_for_decode
//!   --> tests/ui/fail/sglang/prepare_for_decode_writes_committed.rs:25:31
//!    |
//! 25 |     *req.kv_committed_len_mut(owner) += 1;
//!    |          -------------------- ^^^^^ not an owner of `ReqKvInfo::kv_committed_len`
//!    |          |
//!    |          required by a bound introduced by this call
//!    |
//! help: the trait `sealed_ReqKvInfo::ReqKvInfoKvCommittedLenOwner` is not implemented for `prepare_for_decode`
//!   --> tests/ui/fail/sglang/prepare_for_decode_writes_committed.rs:22:1
//!    |
//! 22 | #[kvown::owner]
//!    | ^^^^^^^^^^^^^^^
//!    = note: only the owners listed in `#[owned_by(..)]` on `ReqKvInfo::kv_committed_len` may write it: to make a function one, mark it `#[kvown::owner]` (a method: `#[owner]` in a `#[kvown::owners]` impl block) and add it to that list
//!    = note: a helper writing on an owner's behalf takes `owner: &impl ReqKvInfoKvCommittedLenOwner`; reads are free: `.kv_committed_len()`
//! ...
//! ```
//!
//! A plain function has no `owner` at all (E0425), and a direct write hits the seal (E0616):
//!
//! ```compile_fail,E0616
//! # #[kvown::guarded]
//! # pub struct ReqKvInfo {
//! #     #[owned_by(alloc_for_decode)]
//! #     kv_committed_len: usize,
//! # }
//! # #[kvown::owner]
//! # pub fn alloc_for_decode(req: &mut ReqKvInfo) { *req.kv_committed_len_mut(owner) += 1; }
//! fn prepare_for_decode(req: &mut ReqKvInfo) {
//!     req.kv_committed_len += 1; // even in the struct's own module
//! }
//! # fn main() {}
//! ```
//!
//! ## The capability never escapes
//!
//! `#[owner] fn f` defines, next to the function, a token type also named `f` (types and
//! functions live in different namespaces). Both move into a hidden child module
//! (`sealed_fn_f`, the token one level further down, re-exported `#[doc(hidden)]`), so only
//! `f`'s body can build the token: a struct literal elsewhere, even in `f`'s own module or from a
//! `macro_rules!`, fails with E0451. The body sees only a borrow `owner: &f` of a local it cannot
//! name. The token is neither `Clone` nor `Copy` (nor can it be made `Copy`), so it cannot be
//! returned, stored in a `static`, moved into a `'static` closure or `std::thread::spawn`ed
//! thread, or moved out. Closures and `std::thread::scope` threads inside the owner work. The
//! owner traits are sealed, and an owner listed in `#[owned_by(..)]` must be a genuine token, so
//! implementing one for your own type or declaring a `struct f;` does not create an owner. The `tests/ui/fail/` suite shows
//! each of these failing with its error.
//!
//! ## Building and borrowing a sealed struct
//!
//! A struct literal of a guarded struct does not compile (it would set owned fields). Build it
//! from the generated init struct `<Struct>Init` (renamed by `#[guarded(init = Name)]`), which
//! has the same fields and is nameable where a literal was legal:
//! `ReqKvInfo::from(ReqKvInfoInit { kv_committed_len: 0, rid: 7 })`, with
//! `..Default::default()` when the struct derives `Default`. Getters borrow the whole struct;
//! `x.fields_mut()` borrows every field at once (owned fields `&T`, others `&mut T`) for split
//! borrows. `#[guarded(into_init)]` adds `x.into_init()`, which takes a value apart into its init
//! struct: it moves every field out of `self`, which a struct with a `Drop` impl forbids (E0509),
//! so it is generated only when asked for.
//!
//! ```
//! #[kvown::guarded(into_init)]
//! #[derive(Debug, Clone, PartialEq, Default)]
//! pub struct Req {
//!     #[owned_by(alloc)]
//!     pages: Vec<u32>,
//!     scratch: Vec<u32>,
//!     rid: u64,
//! }
//!
//! #[kvown::owner]
//! fn alloc(req: &mut Req) {
//!     req.pages_mut(owner).extend([3, 4]);
//! }
//!
//! fn main() {
//!     let mut req = Req::from(ReqInit { rid: 7, ..Default::default() });
//!     alloc(&mut req);
//!     let view = req.fields_mut();
//!     view.scratch.extend(view.pages.iter().map(|p| p * 10)); // read one, write another
//!     assert_eq!(req.clone().into_init().scratch, [30, 40]);
//! }
//! ```
//!
//! ## `Drop` and unsized parameters
//!
//! A guarded struct may implement `Drop`: nothing `#[guarded]` generates moves a field out of
//! `self` unless `into_init` is asked for. The destructor reads owned fields through their
//! getters and, like any other code, cannot write them (`tests/ui/pass/structs/drop_impls.rs`).
//!
//! ```
//! #[kvown::guarded]
//! #[derive(Debug, Default)]
//! pub struct Span {
//!     #[owned_by(enter)]
//!     depth: usize,
//!     pub name: String,
//! }
//!
//! impl Drop for Span {
//!     fn drop(&mut self) {
//!         println!("leaving {} at depth {}", self.name, self.depth());
//!     }
//! }
//!
//! #[kvown::owner]
//! pub fn enter(span: &mut Span) {
//!     *span.depth_mut(owner) += 1;
//! }
//! # fn main() { enter(&mut Span::default()); }
//! ```
//!
//! A `?Sized` type parameter is fine: a struct whose parameter appears only behind
//! `PhantomData`, a reference or a pointer is built and converted for an unsized argument
//! (`Id<str>`, `Id<dyn Trait>`); what moves fields by value (`From`, `into_init`, a setter) asks
//! `Sized` only of the field types that name the parameter, so a struct with an unsized tail
//! (`payload: T`) is built sized and used behind a reference.
//!
//! ## Attribute options
//!
//! * `#[kvown::guarded(crate = path, init = Name, into_init)]`; `crate = path` when the `kvown`
//!   dependency is renamed (serde-style), `init` renames the init struct, `into_init` adds
//!   `into_init(self)` (for a struct without a destructor).
//! * `#[owned_by(owner, ..., read = copy | ref)]`.
//! * `#[kvown::owner(token = name, crate = path)]`; `#[kvown::owners(crate = path)]` with
//!   `#[owner(token = name)]` on methods.
//!
//! Misuse the macros can see is a spanned error, all of them in one build: a `pub` owned field,
//! an interior-mutable owned field, a duplicate or empty owner list, `#[owner]` on a trait-impl
//! method or on a method without `#[owners]`, a parameter already named like the capability
//! binding, and unknown arguments.
//!
//! ## What `#[guarded]` expands to
//!
//! For `struct ReqKvInfo` with owned `kv_committed_len`: a hidden module `sealed_ReqKvInfo`
//! (`use super::*` inside) holding the struct with owned fields private and the others widened
//! one level (so each keeps its written reach), a private seal trait per field, the owner trait
//! `ReqKvInfoKvCommittedLenOwner` (with `#[diagnostic::on_unimplemented]`) implemented for the
//! listed owners' tokens, one impl block with the getters, `set_` and `_mut` accessors and
//! `fields_mut`, `From<ReqKvInfoInit>`, and one audit registration for the struct; then `pub use`
//! of the struct and its owner traits. Beside it, in the struct's own module, `ReqKvInfoInit` and
//! the view `ReqKvInfoFieldsMut`, and a call of a hidden macro that only rustdoc expands (behind
//! `cfg(doc)`), into the struct as written, so that it is documented in place. The exact
//! expansion of a small struct is a snapshot test in `kvown-macros`
//! (`kvown-macros/tests/expansion/`); `scripts/compile-cost.sh` measures what it costs to
//! compile against plain and serde-derived structs (README, "What the macros cost").
//!
//! ## Zero cost
//!
//! In a release build a guarded write compiles to the same code as a plain field write: LLVM
//! merges the benchmark's `guarded_write_loop` and `plain_write_loop`
//! (`benches/workloads/guarded.rs`) into one function (`scripts/asm-check.sh` checks this on the
//! assembly), and `benches/guarded_write.rs` measures both.
//!
//! ## The audit register
//!
//! Every guarded struct registers at link time, with its owned fields and the sites of their
//! owners (one registration per struct). [`audit_table!()`](audit_table)
//! returns the calling crate's ownership table (struct, field, owner, direct writes,
//! delegations, module, site; [`audit::AuditTable::collect`] has every linked crate's),
//! `Display` prints it, and [`audit::AuditTable::assert_matches`] panics with the owner sites
//! that were added, removed or recounted: a snapshot test catches a new owner, which no
//! compile-time check does. An empty register is an error, not an empty table, so a test
//! binary that forgot to link the audited crate fails loudly.
//!
//! ```standalone_crate
//! # #[kvown::guarded]
//! # pub struct SeqLens {
//! #     #[owned_by(alloc_for_decode)]
//! #     kv_committed_len: usize,
//! # }
//! # #[kvown::owner]
//! # pub fn alloc_for_decode(req: &mut SeqLens) { *req.kv_committed_len_mut(owner) += 1; }
//! # fn main() {
//! let table = kvown::audit_table!().expect("this crate's guarded structs are linked");
//! table.assert_matches(&[("SeqLens", "kv_committed_len", "alloc_for_decode", 1)]);
//! println!("{table}"); // this crate's rows only
//! # }
//! ```
//!
//! Write counts are syntactic: `x.set_f(cap, ..)`, `x.f_mut(cap)` and `T::set_f(x, cap, ..)`
//! calls in the owner's body count as writes of every field named `f` the owner owns, where `cap`
//! is `owner` or a local it was moved into (`let cap = owner;`), in that local's scope and until
//! a pattern rebinds the name; macro arguments and `macro_rules!` bodies are scanned for the
//! same calls (counted where written). Any other use
//! of `owner` (a helper call, a macro it is handed to, a struct or tuple it is stored in) counts
//! as a delegation. Items nested in the body (a helper `fn` there) are not the body's writes.
//!
//! ## Known limits
//!
//! * Whole-struct replacement (`*r = ReqKvInfo::from(..)`, `mem::swap(r, other)`) is possible
//!   for any holder of `&mut ReqKvInfo`: the seal is per field, not per value.
//! * Code inside an owner's body is trusted, including items and closures nested in it.
//! * Owners live in the same crate as the struct (the token impls are generated there).
//! * `#[guarded]`, `#[owner]` and `#[owners]` items must be module-level items (not inside a
//!   function body): the hidden module's `use super::*` sees the enclosing module, not a block.
//! * `#[guarded]` must come before `#[derive]`; a third-party derive placed after it runs inside
//!   the seal (trust only derives you know). `super::` inside string attributes and doc links
//!   resolves from the hidden module (use `crate::`); `type_name` and some compiler messages
//!   show the hidden module (`sealed_ReqKvInfo::ReqKvInfo`, `sealed_fn_alloc::alloc`), and a
//!   method owner's token is re-exported as `Type_method` (`docs/macro-messages.md` explains
//!   each message and why it reads the way it does).
//! * Audit write counts are syntactic and matched by field name. (Owner sites are matched to
//!   declared owners exactly, by their capability token's type, whatever path, re-export or
//!   renamed import names them.)
//! * Interior-mutable owned fields are refused by type name: a type alias, a renamed import, a
//!   wrapper struct around a `Cell` or a type parameter is not seen (stable Rust cannot ask
//!   whether a type is `Freeze`).
//! * A method owner's token is re-exported as `Type_method` in the impl block's module (a glob
//!   import of that module from the same crate brings it, and each free owner's token, along:
//!   `#[doc(hidden)]` types, never re-exported beyond the crate), so `#[owners]` needs
//!   the impl's type as one UpperCamelCase identifier without `_`, and a free `#[owner]` cannot
//!   start with an upper-case letter. Owned field names cannot start with `set_`, end with
//!   `_mut`, be `fields` or `into_init`, or differ from another owned field's only in `_`s.
//!   An owned field `from` makes `Struct::from` its getter: build such a struct with
//!   `StructInit { .. }.into()`.
//! * Field types and generics are compiled inside the seal: items and macro calls in them are
//!   refused (declare the `const` or type alias outside the struct and name it).
//! * `#[owner]` on an associated function of an impl without `#[owners]` (or in a trait) gets
//!   rustc's ``module is not supported in `trait`s or `impl`s``: the macro cannot see where it
//!   is applied.
//! * Two guarded structs in one module can ask for the same owner trait name (`Req` with
//!   `kv_len` and `ReqKv` with `len` both make `ReqKvLenOwner`, E0252); a `#[repr(packed)]`
//!   struct cannot be guarded (accessors borrow its fields, E0793); construction through `From`
//!   is not `const`.
//! * rustc's wording drifts between versions: the `.stderr` snapshots are blessed with the
//!   toolchain pinned in `rust-toolchain.toml`.
//!
//! # The paged KV allocator
//!
//! With the default feature `allocator`, the runtime is re-exported here ([`alloc`], [`slots`],
//! [`radix`], [`kv`], [`batch`], [`cache`], [`check`], [`error`], [`ids`]). A crate that wants
//! only the macros writes `kvown = { version = "0.1", default-features = false }` and compiles
//! them with their support crate (`kvown-ownership`: the tokens' seal and the audit register),
//! no allocator. The runtime is an LLM serving
//! engine's KV-cache bookkeeping (sglang's `mem_cache`, target state after #37085) with the
//! per-request ladder `cache_protected_len <= kv_committed_len <= kv_allocated_len` in guarded
//! fields. One extend and two decode steps, then release, with the invariant checker and the
//! accounting identity:
//!
//! ```
//! use kvown::alloc::{KvAllocator, PagedAllocator};
//! use kvown::batch::{
//!     ScheduleBatch, alloc_for_decode, alloc_for_extend, prepare_for_decode, prepare_for_extend,
//!     release_kv_cache,
//! };
//! use kvown::cache::{KvCache, TreeCache};
//! use kvown::radix::{RadixCache, RadixConfig};
//! use kvown::batch::Req;
//! use kvown::slots::ReqToTokenPool;
//! use kvown::batch::init_next_round_input;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let page_size = 16;
//! let allocator = PagedAllocator::new(4096, page_size, false)?;
//! let rows = ReqToTokenPool::new(8, 1024)?;
//! let tree = RadixCache::new(RadixConfig::new(page_size))?;
//! let mut cache = KvCache::new(allocator, rows, TreeCache::Radix(tree))?;
//!
//! let mut req = Req::new(1, (0..40).collect());
//! init_next_round_input(&mut req, &mut cache, usize::MAX)?; // match, lock, extend range
//! let prepared = prepare_for_extend(ScheduleBatch::new(vec![req]));
//! let mut batch = alloc_for_extend(prepared, &mut cache).map_err(|failure| failure.error)?;
//! assert_eq!(batch.out_cache_loc().len(), 40); // one KV slot per prompt token
//!
//! for token in [7, 8] {
//!     batch.reqs_mut()[0].push_output(token); // the sampled token whose KV the step writes
//!     let prepared = prepare_for_decode(batch, &cache).map_err(|(_, error)| error)?;
//!     batch = alloc_for_decode(prepared, &mut cache).map_err(|failure| failure.error)?;
//! }
//! let kv = batch.reqs()[0].kv();
//! assert_eq!((kv.kv_committed_len(), kv.kv_allocated_len()), (42, 42));
//! cache.check(batch.reqs())?; // ladder, page ownership, free + cached + owned == capacity
//!
//! let mut reqs = batch.into_reqs();
//! release_kv_cache(&mut reqs[0], &mut cache, true)?; // whole pages go to the prefix cache
//! assert_eq!(cache.tree().evictable_size(), 32);
//! assert_eq!(cache.available_size() + 32, cache.allocator().capacity());
//! cache.check(&reqs)?;
//! # Ok(())
//! # }
//! ```
#![forbid(unsafe_code)]

pub use kvown_macros::{guarded, owner, owners};
pub use kvown_ownership::audit;
// The runtime's user-facing modules: the batch flow and the cache it keeps consistent, the
// prefix cache, the K/V pools, the checkers, the errors and ids.
#[cfg(feature = "allocator")]
pub use kvown_runtime::{batch, cache, check, error, ids, kv, radix, slots};

/// The KV slot allocators, as a user calls them: [`PagedAllocator`](alloc::PagedAllocator) and
/// [`TokenAllocator`](alloc::TokenAllocator) through [`KvAllocator`](alloc::KvAllocator) and
/// [`SlotCalls`](alloc::SlotCalls), their shapes, orders and errors. What a new allocator or a
/// wrapper implements against (the page engine, reuse orders, `AllocatorLayer`,
/// `AsPageAllocator`, geometry) is in `kvown_runtime::alloc`.
#[cfg(feature = "allocator")]
pub mod alloc {
    pub use kvown_runtime::alloc::{
        AllocError, DecodeRequest, DecodeRequests, DecodeRow, DecodeShape, ExtendShape, FreeGroup,
        FreeOrder, KvAllocator, KvSlot, PageId, PageState, PagedAllocator, SlotCalls,
        TokenAllocator, ceil_align,
    };
}

#[doc(hidden)]
pub use kvown_ownership::__private;

/// The ownership table of the calling crate, in one line: `kvown::audit_table!()`.
///
/// Expands to [`audit::AuditTable::collect_crate`] for the crate the call is written in
/// (`module_path!()` there), so the table lists that crate's guarded fields only, not those of
/// kvown's own runtime or of other linked crates. `kvown::audit_table!("ledger")` names the
/// crate instead: what an integration test (a crate of its own) writes to audit its library.
/// Returns `Result<AuditTable, AuditError>`; a crate without registered fields is an error.
///
/// ```standalone_crate
/// #[kvown::guarded]
/// pub struct Account {
///     #[owned_by(deposit)]
///     balance: u64,
/// }
///
/// #[kvown::owner]
/// pub fn deposit(account: &mut Account, amount: u64) {
///     *account.balance_mut(owner) += amount;
/// }
///
/// # fn main() {
/// let table = kvown::audit_table!().expect("this crate has guarded fields");
/// table.assert_matches(&[("Account", "balance", "deposit", 1)]);
/// assert_eq!(table.rows().len(), 1); // none of kvown's own rows
/// println!("{table}");
/// # }
/// ```
#[macro_export]
macro_rules! audit_table {
    () => {
        $crate::audit::AuditTable::collect_crate(::core::module_path!())
    };
    ($crate_name:expr) => {
        $crate::audit::AuditTable::collect_crate($crate_name)
    };
}
