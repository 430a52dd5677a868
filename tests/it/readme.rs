//! The README quotes compiler errors, code and figures whose sources live elsewhere in the
//! repository. These tests keep each quote equal to its source, so a toolchain bump that rewords
//! an error, an API change or new figures update both.

const README: &str = include_str!("../../README.md");
const PERFORMANCE: &str = include_str!("../../docs/performance.md");
const BENCH: &str = include_str!("../../examples/bench.rs");
const RUNTIME_DOCS: &str = include_str!("../../kvown-runtime/src/lib.rs");

/// `(snapshot, lines quoted from its start, text the first line must contain)`.
const QUOTES: &[(&str, usize, &str)] = &[
    (
        include_str!("../ui/fail/sglang/prepare_for_decode_writes_committed.stderr"),
        13,
        "`prepare_for_decode` is not an owner of `ReqKvInfo::kv_committed_len`",
    ),
    (
        include_str!("../ui/fail/typestate/read_committed_between_prepare_and_alloc.stderr"),
        5,
        "no method named `reqs` found for struct `ScheduleBatch<ExtendPrepared>`",
    ),
    // "When it does not compile".
    (
        include_str!("../ui/fail/first_contact/owner_not_listed.stderr"),
        15,
        "`charge_fee` is not an owner of `Account::balance`",
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
            README.contains(&format!("```text\n{}\n", quoted.join("\n"))),
            "README.md must quote the first {lines} lines of the snapshot verbatim:\n{}",
            quoted.join("\n")
        );
    }
}

#[test]
fn readme_is_a_manual_of_at_most_400_lines() {
    let lines = README.lines().count();
    assert!(
        lines <= 400,
        "README.md has {lines} lines; keep it a manual"
    );
}

#[test]
fn readme_gives_the_main_job_and_test_commands() {
    for command in [
        "cargo run --release --example engine",
        "cargo test --workspace",
    ] {
        assert!(
            README.lines().any(|line| line.starts_with(command)),
            "README.md must give `{command}` at the start of a line"
        );
    }
}

/// The lines of the fenced block that follows the first line containing `marker`.
fn block_after<'a>(text: &'a str, marker: &str) -> Vec<&'a str> {
    let start = text.find(marker).expect("marker present");
    let mut lines = text[start..]
        .lines()
        .skip_while(|line| !line.starts_with("```"));
    lines.next().expect("an opening fence");
    lines.take_while(|line| !line.starts_with("```")).collect()
}

#[test]
fn readme_allocator_example_is_the_runtime_doctest() {
    // The README shows the doctest with its comments and assertions left out: every other line
    // must appear, in order, in the crate documentation that `cargo test` runs.
    let doctest: Vec<&str> = RUNTIME_DOCS
        .lines()
        .filter_map(|line| line.strip_prefix("//! ").or(line.strip_prefix("//!")))
        .collect();
    let mut rest = doctest.iter();
    for line in block_after(README, "A request's life") {
        if line.is_empty() {
            continue;
        }
        assert!(
            rest.any(|doc| *doc == line),
            "README.md's allocator example line is not in kvown-runtime's crate doctest (in \
             order): {line}"
        );
    }
}

/// The rows of the Markdown table whose header starts with `header`.
fn table<'a>(text: &'a str, header: &str) -> Vec<&'a str> {
    let start = text.find(header).expect("table present");
    text[start..]
        .lines()
        .take_while(|line| line.starts_with('|'))
        .collect()
}

const PERFORMANCE_TABLE: &str = "| workload | kvown | floor (not kvown) |";

#[test]
fn readme_performance_table_is_the_one_in_docs_performance() {
    let readme = table(README, PERFORMANCE_TABLE);
    assert!(readme.len() > 2, "README.md's performance table has rows");
    assert_eq!(
        readme,
        table(PERFORMANCE, PERFORMANCE_TABLE),
        "README.md's performance table must equal docs/performance.md's current table"
    );
}

/// The bench's targets as `(workload, "<=" or ">=", bound)`, read from its `TARGETS` array.
fn bench_targets() -> Vec<(String, &'static str, f64)> {
    let start = BENCH.find("const TARGETS").expect("bench.rs has TARGETS");
    let end = start + BENCH[start..].find("];").expect("TARGETS ends");
    BENCH[start..end]
        .lines()
        .filter_map(|line| line.trim().strip_prefix("(\""))
        .map(|entry| {
            let (name, rest) = entry
                .split_once("\", Bound::")
                .expect("(name, Bound, value)");
            let (bound, value) = rest.split_once(", ").expect("(name, Bound, value)");
            let symbol = match bound {
                "AtMost" => "<=",
                "AtLeast" => ">=",
                other => panic!("unknown bound {other}"),
            };
            let value = value.trim_end_matches("),").parse().expect("a number");
            (name.to_string(), symbol, value)
        })
        .collect()
}

#[test]
fn readme_targets_are_the_bench_targets() {
    let targets = bench_targets();
    assert!(targets.len() >= 3, "TARGETS parsed: {targets:?}");
    let rows = table(README, PERFORMANCE_TABLE);
    let cells: Vec<&str> = rows
        .iter()
        .map(|row| row.split('|').nth(5).expect("a target column").trim())
        .filter(|cell| !cell.is_empty() && *cell != "target" && !cell.starts_with("---"))
        .collect();
    for cell in &cells {
        let (name, rest) = cell
            .strip_prefix('`')
            .and_then(|cell| cell.split_once("` "))
            .unwrap_or_else(|| panic!("a target reads `name` <= value: {cell}"));
        let (symbol, value) = rest.split_once(' ').expect("a bound and a value");
        let value: f64 = value.parse().expect("a number");
        assert!(
            targets
                .iter()
                .any(|(n, s, v)| n == name && *s == symbol && *v == value),
            "README.md's target {cell} is not in examples/bench.rs's TARGETS: {targets:?}"
        );
    }
    assert_eq!(
        cells.len(),
        targets.len(),
        "every target of examples/bench.rs appears in README.md's table"
    );
}

/// The leading number of `cell` (`"22 ns/page, 2.9x"` -> 22).
fn leading_number(cell: &str) -> f64 {
    let number: String = cell
        .trim()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.' || *c == 'e')
        .collect();
    number
        .parse()
        .unwrap_or_else(|_| panic!("a number: {cell}"))
}

#[test]
fn readme_peer_ratios_follow_from_the_figures() {
    // Each peer cell reads `<figure> <unit>, <peer / kvown>x`, kvown's figure in column 2.
    for row in table(README, PERFORMANCE_TABLE).iter().skip(2) {
        let columns: Vec<&str> = row.split('|').map(str::trim).collect();
        let kvown = leading_number(columns[2]);
        for peer in &columns[6..8] {
            let Some((figure, ratio)) = peer.split_once(", ") else {
                assert!(
                    peer.is_empty(),
                    "a peer cell reads `figure unit, ratio x`: {peer}"
                );
                continue;
            };
            let ratio: f64 = ratio.trim_end_matches('x').parse().expect("a ratio");
            let exact = leading_number(figure) / kvown;
            // Shown to two significant digits, or as a whole number from 10 up.
            let shown = if exact >= 10.0 {
                exact.round()
            } else {
                (exact * 10.0).round() / 10.0
            };
            assert!(
                (shown - ratio).abs() < 1e-9,
                "{row}: {figure} / {kvown} is {exact:.3}, shown as {ratio}"
            );
        }
    }
}
