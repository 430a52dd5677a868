//! Owners that a `macro_rules!` generates: with the body written in the macro, and with the body
//! (or part of it) pasted in from the macro's caller, whose `owner` carries the caller's hygiene.

#[kvown::guarded]
pub struct Req {
    #[owned_by(in_macro, from_caller, mixed, Batch::grow)]
    len: u32,
}

macro_rules! owner_fn {
    ($name:ident ($($param:tt)*) $body:block) => {
        #[kvown::owner]
        pub fn $name($($param)*) $body
    };
}

macro_rules! counting_owner {
    ($name:ident, $req:ident, $($stmt:stmt;)*) => {
        #[kvown::owner]
        pub fn $name($req: &mut Req) {
            $($stmt;)*
            *$req.len_mut(owner) += 1;
        }
    };
}

macro_rules! owner_fn_in_macro {
    ($name:ident) => {
        #[kvown::owner]
        pub fn $name(r: &mut Req) {
            r.set_len(owner, 1);
        }
    };
}

owner_fn_in_macro!(in_macro);
owner_fn!(from_caller (r: &mut Req) { r.set_len(owner, 2); });
counting_owner!(mixed, r, r.set_len(owner, 3););

pub struct Batch;

macro_rules! owner_methods {
    ($($name:ident ($($param:tt)*) $body:block)*) => {
        #[kvown::owners]
        impl Batch {
            $(
                #[owner]
                pub fn $name($($param)*) $body
            )*
        }
    };
}

owner_methods! {
    grow(r: &mut Req) { *r.len_mut(owner) += 10; }
}

#[test]
fn compiles_and_runs() {
    let mut req = Req::from(ReqInit { len: 0 });
    in_macro(&mut req);
    from_caller(&mut req);
    mixed(&mut req);
    Batch::grow(&mut req);
    assert_eq!(req.len(), 14);
}
