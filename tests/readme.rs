//! The README quotes compiler errors a user meets; keep each quote equal to the trybuild
//! snapshot it comes from, so a toolchain bump that rewords an error updates both.

const README: &str = include_str!("../README.md");

/// `(snapshot, lines quoted from its start, text the first line must contain)`.
const QUOTES: &[(&str, usize, &str)] = &[
    (
        include_str!("ui/fail/sglang/prepare_for_decode_writes_committed.stderr"),
        13,
        "`prepare_for_decode` is not an owner of `ReqKvInfo::kv_committed_len`",
    ),
    (
        include_str!("ui/fail/typestate/read_committed_between_prepare_and_alloc.stderr"),
        5,
        "no method named `reqs` found for struct `ScheduleBatch<ExtendPrepared>`",
    ),
];

#[test]
fn readme_quotes_the_blessed_compiler_errors() {
    for &(snapshot, lines, headline) in QUOTES {
        let quoted: Vec<&str> = snapshot.lines().take(lines).collect();
        assert!(
            quoted[0].contains(headline),
            "the snapshot no longer starts with the intended error: {}",
            quoted[0]
        );
        assert!(
            README.contains(&quoted.join("\n")),
            "README.md must quote the first {lines} lines of the snapshot verbatim:\n{}",
            quoted.join("\n")
        );
    }
}
