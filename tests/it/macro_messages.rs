//! `docs/macro-messages.md` quotes compiler messages; keep each quote equal to the start of the
//! trybuild snapshot it names (`<!-- snapshot: path -->` before a ```text block), so a toolchain
//! bump that rewords a message updates both.

use std::path::Path;

const DOC: &str = include_str!("../../docs/macro-messages.md");
const MARKER: &str = "<!-- snapshot: ";

/// `(snapshot path, quoted text)` for every marked quote of the document.
fn quotes() -> Vec<(&'static str, String)> {
    let mut found = Vec::new();
    let mut rest = DOC;
    while let Some(start) = rest.find(MARKER) {
        rest = &rest[start + MARKER.len()..];
        let end = rest.find(" -->").expect("a closed marker");
        let path = &rest[..end];
        let block = rest
            .find("```text\n")
            .expect("a text block after the marker")
            + 8;
        let close = rest[block..].find("\n```").expect("a closed text block");
        found.push((path, rest[block..block + close].to_string()));
        rest = &rest[block + close..];
    }
    found
}

#[test]
fn every_quote_is_the_start_of_its_snapshot() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let quotes = quotes();
    assert!(quotes.len() >= 10, "found only {} quotes", quotes.len());
    for (path, quote) in quotes {
        let snapshot =
            std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(
            snapshot.starts_with(&quote),
            "docs/macro-messages.md quotes {path}, which now starts:\n{}",
            snapshot
                .lines()
                .take(quote.lines().count())
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}
