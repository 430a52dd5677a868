#!/usr/bin/env bash
# The user-facing READMEs are manuals, not lab notebooks: this fails on a git commit hash or a
# numbered work period ("seventeenth session", "stop 24", "round 3") in README.md,
# benches/README.md and each crate's README. History belongs in CHANGELOG.md and `git log`.
#
#   scripts/docs-lint.sh [FILE...]     (default: the READMEs above)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(README.md benches/README.md kvown-*/README.md)

# A commit hash: 7 to 40 lowercase hex digits, at least one letter and one digit, standing alone
# (not part of a longer word, a number with a decimal point or a 0x literal).
hash='(?<![0-9A-Za-z_.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![0-9A-Za-z_])'
ordinal='(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|[a-z]+teenth|twentieth|thirtieth|(twenty|thirty)-[a-z]+|[0-9]+(st|nd|rd|th))'
period='(sessions?|stops?|rounds?|work periods?|sprints?|iterations?)'
# "seventeenth session", "12th stop", "session 17", "stop 24", "round 3", "sessions 5-7".
work_period="(?i)\\b(${ordinal}[ -]${period}|${period}[ -]#?[0-9]+)\\b"

status=0
for file in "${files[@]}"; do
    [ -f "$file" ] || { echo "docs-lint: $file: no such file" >&2; status=1; continue; }
    if grep -nP "$hash" "$file" | sed "s|^|$file:|; s|\$|  <- a commit hash|"; then status=1; fi
    if grep -nP "$work_period" "$file" | sed "s|^|$file:|; s|\$|  <- a numbered work period|"; then
        status=1
    fi
done
if [ "$status" -ne 0 ]; then
    echo "docs-lint: the READMEs must not log work: move history to CHANGELOG.md or git log" >&2
else
    echo "docs-lint: ${#files[@]} files clean"
fi
exit "$status"
