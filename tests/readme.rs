//! The README quotes the compiler error a user meets; keep the quote equal to the trybuild
//! snapshot it names, so a toolchain bump that rewords the error updates both.

const README: &str = include_str!("../README.md");
const SNAPSHOT: &str = include_str!("ui/fail/sglang/prepare_for_decode_writes_committed.stderr");

#[test]
fn readme_quotes_the_blessed_compiler_error() {
    let quoted: Vec<&str> = SNAPSHOT.lines().take(13).collect();
    assert!(
        quoted[0].contains("`prepare_for_decode` is not an owner of `ReqKvInfo::kv_committed_len`"),
        "the snapshot no longer starts with the ownership error: {}",
        quoted[0]
    );
    assert!(
        README.contains(&quoted.join("\n")),
        "README.md must quote the first 13 lines of the sglang snapshot verbatim"
    );
}
