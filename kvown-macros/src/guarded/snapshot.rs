//! The expansion of a small struct, kept readable and true: the snapshot in
//! `tests/expansion/guarded_req_kv_info.expanded.rs` (what `#[guarded]` generates, then what
//! rustdoc expands its `guarded_documented!` call to) is compared token by token with the
//! generated code. Re-bless (it is formatted with `rustfmt`) with
//! `KVOWN_BLESS=1 cargo test -p kvown-macros`.

use std::path::Path;

use proc_macro2::TokenStream;
use quote::{ToTokens, quote};

const SNAPSHOT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/tests/expansion/guarded_req_kv_info.expanded.rs"
);

const HEADER: &str = "// The expansion of `#[kvown::guarded]` on the struct below, then what rustdoc expands its\n\
// `guarded_documented!` call to (a snapshot test in\n\
// kvown-macros/src/guarded/snapshot.rs keeps it true):\n\
//\n\
// #[kvown::guarded]\n\
// #[derive(Debug, Default)]\n\
// pub struct ReqKvInfo {\n\
//     /// Tokens whose KV entries are committed.\n\
//     #[owned_by(alloc_for_extend, alloc_for_decode)]\n\
//     kv_committed_len: usize,\n\
//     pub rid: u64,\n\
// }\n\n";

/// Between the compiled expansion and the documented one.
const DOCUMENTED: &str =
    "\n// What rustdoc expands `guarded_documented!` to (compiled under `cfg(doc)` only):\n\n";

/// `#[guarded]`'s output and the documented form, as two token streams.
fn expansion() -> (TokenStream, TokenStream) {
    let input = quote! {
        #[derive(Debug, Default)]
        pub struct ReqKvInfo {
            /// Tokens whose KV entries are committed.
            #[owned_by(alloc_for_extend, alloc_for_decode)]
            kv_committed_len: usize,
            pub rid: u64,
        }
    };
    let documented = super::expand_documented(quote!(() #input));
    (super::expand(TokenStream::new(), input), documented)
}

/// The file's tokens as text, without the trailing commas that rustfmt adds or removes and
/// without whitespace (token spacing differs between the two token trees).
fn normalized(file: &syn::File) -> String {
    let text = file.to_token_stream().to_string();
    let mut out = String::with_capacity(text.len());
    let mut rest = text.as_str();
    while let Some(i) = rest.find(',') {
        out.push_str(&rest[..i]);
        let after = rest[i + 1..].trim_start();
        if !after.starts_with([')', ']', '}', '>']) {
            out.push(',');
        }
        rest = &rest[i + 1..];
    }
    out.push_str(rest);
    out.retain(|c| !c.is_whitespace());
    out
}

fn rustfmt(source: &str) -> String {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new("rustfmt")
        .args([
            "--edition",
            "2024",
            "--config",
            "reorder_imports=false,reorder_modules=false",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("rustfmt on PATH to bless the snapshot");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(source.as_bytes())
        .expect("write to rustfmt");
    let output = child.wait_with_output().expect("rustfmt output");
    assert!(output.status.success(), "rustfmt failed");
    String::from_utf8(output.stdout).expect("utf-8")
}

#[test]
fn guarded_expansion_matches_snapshot() {
    let (compiled, documented) = expansion();
    let as_file = |tokens: TokenStream| -> syn::File {
        syn::parse2(tokens).expect("the expansion is a valid file")
    };
    if std::env::var_os("KVOWN_BLESS").is_some() || !Path::new(SNAPSHOT).exists() {
        let text = format!(
            "{HEADER}{}{DOCUMENTED}{}",
            rustfmt(&as_file(compiled.clone()).to_token_stream().to_string()),
            rustfmt(&as_file(documented.clone()).to_token_stream().to_string())
        );
        std::fs::write(SNAPSHOT, text).expect("write the snapshot");
    }
    let generated = as_file(quote!(#compiled #documented));
    let snapshot = std::fs::read_to_string(SNAPSHOT).expect("read the snapshot");
    let expected: syn::File = syn::parse_str(&snapshot).expect("the snapshot parses");
    let (generated, expected) = (normalized(&generated), normalized(&expected));
    if generated != expected {
        let at = generated
            .bytes()
            .zip(expected.bytes())
            .position(|(a, b)| a != b)
            .unwrap_or(generated.len().min(expected.len()));
        let context = |s: &str| {
            let chars: Vec<char> = s.chars().collect();
            let at = s[..at].chars().count();
            chars[at.saturating_sub(80)..(at + 120).min(chars.len())]
                .iter()
                .collect::<String>()
        };
        panic!(
            "the expansion changed (review it, re-bless with KVOWN_BLESS=1):\n generated: ..{}..\n  snapshot: ..{}..",
            context(&generated),
            context(&expected)
        );
    }
}
