#!/usr/bin/env bash
# How many of kvown-runtime's public functions have a runnable example that calls them: a ```
# block that `cargo test -p kvown-runtime --doc` compiles and runs (not `ignore`, `no_run`,
# `text` or `compile_fail`), in the function's own doc comment or in the doc comment of its type
# or trait (one example may exercise several methods), whose visible lines call the function
# (`.name(`, `Type::name`, or `name(` for a free function; `# ` setup lines do not count).
#
#   scripts/doc-coverage.sh [--min PERCENT] [--missing] [--covered] [--by-file]
#
# Public functions are those written in kvown-runtime/src: a `pub fn` at a module's top level or
# in an inherent `impl` of a public type, and every method of a public trait, outside
# `#[cfg(test)]` modules. A name is public when it is declared `pub` in a public module's own
# file or re-exported with `pub use`. Trait implementations are not counted (the trait's method
# carries the example), nor `#[doc(hidden)]` functions, nor the accessors `#[kvown::guarded]`
# generates (the macro documents them). `--missing` lists the functions without an example,
# `--covered` those with one, `--by-file` prints a line per file, and `--min` fails (exit 1)
# when the share is below PERCENT.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec python3 - "$root/kvown-runtime/src" "$@" <<'PYTHON'
import argparse
import pathlib
import re
import sys

parser = argparse.ArgumentParser(prog="doc-coverage.sh")
parser.add_argument("src")
parser.add_argument("--min", type=float)
parser.add_argument("--missing", action="store_true")
parser.add_argument("--covered", action="store_true")
parser.add_argument("--by-file", action="store_true")
args = parser.parse_args()
src = pathlib.Path(args.src)
files = sorted(src.rglob("*.rs"))


def code_only(line, state):
    """`line` with comments and the contents of strings and char literals removed; `state`
    carries an open block comment or string into the next line."""
    out, i = [], 0
    while i < len(line):
        if state["block"]:
            end = line.find("*/", i)
            if end < 0:
                break
            state["block"], i = False, end + 2
        elif state["string"]:
            closing = '"' + "#" * state["hashes"]
            while i < len(line) and not line.startswith(closing, i):
                i += 2 if state["hashes"] == 0 and line[i] == "\\" else 1
            if i >= len(line):
                break
            state["string"], i = False, i + len(closing)
            out.append('""')
        elif line.startswith("//", i):
            break
        elif line.startswith("/*", i):
            state["block"], i = True, i + 2
        elif (raw := re.match(r'b?r(#*)"', line[i:])) and not (i and (line[i - 1].isalnum() or line[i - 1] == "_")):
            state["string"], state["hashes"], i = True, len(raw.group(1)), i + raw.end()
        elif line[i] == '"':
            state["string"], state["hashes"], i = True, 0, i + 1
        elif char := re.match(r"b?'(\\[^']+|[^'\\])'", line[i:]):
            out.append("' '")
            i += char.end()
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


RUNNABLE = {"rust", "should_panic", "edition2015", "edition2018", "edition2021", "edition2024"}


def runnable_code(docs):
    """The visible lines of the doc lines' code blocks that the doctest runner compiles and runs
    (rustdoc's hidden `# ` setup lines left out)."""
    inside, runnable, code = False, False, []
    for doc in docs:
        text = doc.strip()
        if text.startswith("```"):
            tags = {tag.strip() for tag in text[3:].split(",") if tag.strip()}
            inside, runnable = not inside, not inside and tags <= RUNNABLE
        elif inside and runnable and not (text == "#" or text.startswith("# ")):
            code.append(text)
    return "\n".join(code)


def calls(code, kind, owner, function):
    """Whether the example code calls `function` (a method of `owner`, or a free function)."""
    name = re.escape(function)
    if kind == "module":
        return re.search(rf"(?<![\w.]){name}\s*(\(|::<)", code) is not None
    if re.search(rf"\.{name}\s*(\(|::<)", code):
        return True
    owners = {owner} | aliases.get(owner, set())
    if kind == "trait":  # an associated function of a trait is called through its implementors
        return re.search(rf"\b\w+(<[^>]*>)?::{name}\b", code) is not None
    return any(re.search(rf"\b{re.escape(o)}(::<[^>]*>)?::{name}\b", code) for o in owners)


lib = (src / "lib.rs").read_text()
public_modules = set(re.findall(r"^pub mod (\w+)", lib, re.M))
glob_files = set()
public_names = set()


def module_is_public(path):
    """Whether the items declared `pub` in this file are reachable: lib.rs, a public module's own
    file, or a file whose items a public module re-exports with `*`."""
    parts = path.relative_to(src).parts
    if parts == ("lib.rs",):
        return True
    if parts[0].removesuffix(".rs") not in public_modules:
        return False
    return len(parts) == 1 or parts[1:] == ("mod.rs",) or path in glob_files


for path in files:
    text = path.read_text()
    for group in re.findall(r"^pub use [\w:]*\{([^}]*)\}", text, re.M):
        public_names.update(re.findall(r"\w+", group))
    public_names.update(re.findall(r"^pub use [\w:]*::(\w+);", text, re.M))
    for module in re.findall(r"^pub use (\w+)::\*;", text, re.M):
        glob_files.add(path.parent / f"{module}.rs")
aliases = {}  # a type -> the `pub type` names of its instances (`PagedAllocator`)
for path in files:
    text = path.read_text()
    if module_is_public(path):
        declared = r"^\s*pub (?:struct|enum|trait|type|union) (\w+)"
        public_names.update(re.findall(declared, text, re.M))
    for alias, target in re.findall(r"^\s*pub type (\w+)(?:<[^=]*>)? = (?:\w+::)*(\w+)", text, re.M):
        aliases.setdefault(target, set()).add(alias)


def classify(header, attributes, stack, path):
    """What the block opened by `{` after `header` is: (kind, name, public)."""
    parent_public = all(public for _, _, public in stack)
    if re.search(r"\bfn\b", header):
        return ("fn", None, False)
    if match := re.search(r"\bmod\s+(\w+)", header):
        if "cfg(test)" in attributes:
            return ("skip", None, False)
        return ("module", match.group(1), parent_public and re.search(r"\bpub\s+mod\b", header))
    if match := re.search(r"\btrait\s+(\w+)", header):
        public = re.search(r"\bpub\s+(unsafe\s+)?trait\b", header) and match.group(1) in public_names
        return ("trait", match.group(1), parent_public and bool(public))
    if re.match(r"\s*(unsafe\s+)?impl\b", header):
        rest = header.split("impl", 1)[1].strip()
        if rest.startswith("<"):  # the impl's generics
            depth = 0
            for end, c in enumerate(rest):
                depth += {"<": 1, ">": -1}.get(c, 0)
                if depth == 0:
                    break
            rest = rest[end + 1 :]
        if re.search(r"\bfor\b(?!\s*<)", rest):
            return ("trait_impl", None, False)
        name = re.match(r"\s*(?:[\w]+::)*(\w+)", rest).group(1)
        return ("impl", name, parent_public and name in public_names)
    return ("other", None, False)


found = []  # (file, function, has an example)
type_examples = {}  # a type or trait -> the code of the examples in its doc comments
pub_fn = re.compile(r"^\s*pub\s+(?:(?:const|unsafe|async)\s+)*fn\s+(\w+)")
any_fn = re.compile(r"^\s*(?:(?:const|unsafe|async)\s+)*fn\s+(\w+)")
for path in files:
    state = {"block": False, "string": False, "hashes": 0}
    stack, header, attributes, docs, attribute_depth = [], "", "", [], 0
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("///") and not state["string"] and not state["block"]:
            docs.append(stripped[3:])
            continue
        code = code_only(line, state)
        if not code.strip():
            continue
        if attribute_depth or code.lstrip().startswith("#["):
            attributes += code
            attribute_depth += code.count("[") - code.count("]")
            continue
        if match := re.match(r"\s*pub (?:struct|enum|trait|type|union) (\w+)", code):
            type_examples.setdefault(match.group(1), []).append(runnable_code(docs))
        kind, owner, public = stack[-1] if stack else ("module", None, True)
        function = None
        if kind in ("module", "impl") and (match := pub_fn.match(code)):
            function = match.group(1)
            public = public and (kind == "impl" or function in public_names or module_is_public(path))
        elif kind == "trait" and (match := any_fn.match(code)):
            function = match.group(1)
        if function and public and "doc(hidden)" not in attributes:
            name = f"{owner}::{function}" if kind != "module" or owner else function
            found.append((str(path.relative_to(src)), name, (kind, owner, function), runnable_code(docs)))
        for c in code:
            if c == "{":
                stack.append(classify(header, attributes, stack, path))
                header, attributes = "", ""
            elif c == "}":
                if stack:
                    stack.pop()
                header, attributes = "", ""
            elif c == ";":
                header, attributes = "", ""
            else:
                header += c
        header += " "
        docs = []

found = [
    (file, name, calls(code, *called) or any(calls(c, *called) for c in type_examples.get(called[1], [])))
    for file, name, called, code in found
]
total = len(found)
with_example = sum(has for _, _, has in found)
if args.by_file:
    per_file = {}
    for file, _, has in found:
        counts = per_file.setdefault(file, [0, 0])
        counts[0] += has
        counts[1] += 1
    for file, (done, count) in sorted(per_file.items()):
        print(f"{done:4d} / {count:<4d} {file}")
if args.covered:
    for file, name, has in found:
        if has:
            print(f"example: {file}: {name}")
if args.missing:
    for file, name, has in found:
        if not has:
            print(f"no example: {file}: {name}")
share = 100.0 * with_example / total if total else 100.0
print(f"kvown-runtime: {with_example} of {total} public functions have an example ({share:.1f}%)")
if args.min is not None and share < args.min:
    print(f"doc-coverage: below {args.min:g}%: `--missing` lists the functions without an example", file=sys.stderr)
    sys.exit(1)
PYTHON
