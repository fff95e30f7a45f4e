#!/usr/bin/env python3
"""Checks the tree's citations of decision records (docs/decisions/NNNN-short-title.md).

Usage: check_decision_refs.py [ROOT] [--report]

Scans include/, examples/, tests/, bench/, tools/, scripts/, docs/, cmake/, README.md and CMakeLists.txt (text
files only) for three forms of citation:

  new    `docs/decisions/0052`, several as `docs/decisions/0010, 0021`; inside docs/decisions/ also the relative
         links `(0052-cudnn-convolutions.md)`. The cited record must exist.
  old    `ARCHITECTURE.md D52`, `docs/ARCHITECTURE.md D10, D21`, also with the D numbers on the next comment line:
         the decision log those numbers pointed into was moved to docs/decisions/ in issue 40.
  bare   `D52` on its own (`(D52)`, `D10, D21`, `D38's`), outside docs/decisions/: the same retired numbering.

Exit status 1, with one `file:line: ...` per problem, when a cited record does not exist or an old or bare form is
left (tools/rewrite_decision_refs.py rewrites those); 0 otherwise. --report prints the count of each form and
exits 0 whatever it found. Plain python3, no dependencies.
"""
import pathlib
import re
import sys

SCAN = ["include", "examples", "tests", "bench", "tools", "scripts", "docs", "cmake", "README.md", "CMakeLists.txt"]
SKIP_DIRS = {".git", "build", "__pycache__"}
SELF = {"tools/check_decision_refs.py", "tools/rewrite_decision_refs.py"}  # their help text shows the forms
RECORDS = "docs/decisions"

# A list of D numbers: D10, D21 / D10 and D21 / D34-D35 (a range, en dash or hyphen).
# A separator may break the line and go on after the next line's comment marker.
NEXT_LINE = r"(?:\n[ \t]*(?://+|#+|\*|--)?[ \t]*)?"
SEP = r"(?:\s*,[ \t]*" + NEXT_LINE + r"|\s+and[ \t]+|\s*[-–]\s*)"
D_LIST = r"D[0-9]{1,2}\b(?:" + SEP + r"D[0-9]{1,2}\b)*"
# The old form: the page's name, optional "§3", then the list, possibly after a line break and a comment marker.
OLD = re.compile(r"(?:docs/)?ARCHITECTURE\.md(?:\s*§3)?,?(?P<gap>[ \t]*" + NEXT_LINE + r")(?P<list>" + D_LIST + r")")
BARE = re.compile(r"(?<![\w/.-])(?P<list>" + D_LIST + r")")
NEW = re.compile(r"docs/decisions/(?P<first>[0-9]{4})(?P<rest>(?:\s*,\s*(?:and\s+)?0[0-9]{3}\b)*)")
LINK = re.compile(r"\((?P<n>[0-9]{4})-[a-z0-9-]+\.md\)")


def numbers(d_list):
    """The decision numbers a D list names, ranges expanded: 'D10, D21' -> [10, 21]; 'D34-D35' -> [34, 35]."""
    out = []
    parts = re.split("(" + SEP + ")", d_list)
    i = 0
    while i < len(parts):
        n = int(parts[i].strip()[1:])
        if i + 1 < len(parts) and re.fullmatch(r"\s*[-–]\s*", parts[i + 1]):
            m = int(parts[i + 2].strip()[1:])
            out.extend(range(n, m + 1))
            i += 4
        else:
            out.append(n)
            i += 2
    return out


def files(root):
    for entry in SCAN:
        p = root / entry
        if p.is_file():
            yield p
        elif p.is_dir():
            for f in sorted(p.rglob("*")):
                rel = f.relative_to(root)
                if f.is_file() and not (SKIP_DIRS & set(rel.parts)) and rel.as_posix() not in SELF:
                    yield f


def read_text(path):
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return None
    return None if "\x00" in text else text  # binary (fuzz corpora, images)


def line_of(text, offset):
    return text.count("\n", 0, offset) + 1


def record_numbers(root):
    return {int(f.name[:4]) for f in (root / RECORDS).glob("[0-9][0-9][0-9][0-9]-*.md")}


def citations(root, path, text):
    """(line, form, numbers, span) for every citation in text; form is 'new', 'link', 'old' or 'bare'."""
    rel = path.relative_to(root).as_posix()
    in_records = rel.startswith(RECORDS + "/")
    found = []
    for m in NEW.finditer(text):
        nums = [int(m.group("first"))] + [int(x) for x in re.findall(r"0[0-9]{3}", m.group("rest"))]
        found.append((line_of(text, m.start()), "new", nums, m.span()))
    if in_records:
        for m in LINK.finditer(text):
            found.append((line_of(text, m.start()), "link", [int(m.group("n"))], m.span()))
        return found  # the records' own prose ("formerly D16") is history, not a citation
    taken = []
    for m in OLD.finditer(text):
        found.append((line_of(text, m.start()), "old", numbers(m.group("list")), m.span()))
        taken.append(m.span("list"))
    for m in BARE.finditer(text):
        if any(a <= m.start() < b for a, b in taken):
            continue
        found.append((line_of(text, m.start()), "bare", numbers(m.group("list")), m.span()))
    return found


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    report = "--report" in argv
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent).resolve()
    have = record_numbers(root)
    if not have:
        print(f"{root / RECORDS}: no decision records found (NNNN-short-title.md)", file=sys.stderr)
        return 1
    counts = {"new": 0, "link": 0, "old": 0, "bare": 0}
    problems = []
    for path in files(root):
        text = read_text(path)
        if text is None:
            continue
        rel = path.relative_to(root).as_posix()
        for line, form, nums, _ in citations(root, path, text):
            counts[form] += len(nums)
            if form in ("old", "bare"):
                problems.append(f"{rel}:{line}: {form} citation of "
                                + ", ".join(f"D{n}" for n in nums) + ": cite docs/decisions/"
                                + ", ".join(f"{n:04d}" for n in nums)
                                + " (tools/rewrite_decision_refs.py rewrites it)")
            for n in nums:
                if n not in have:
                    problems.append(f"{rel}:{line}: cites decision {n:04d}, but {RECORDS}/{n:04d}-*.md does not exist")
    if report:
        print("citations (numbers cited): " + ", ".join(f"{k} {v}" for k, v in counts.items()))
        print(f"problems: {len(problems)}")
        return 0
    for p in problems:
        print(p)
    if problems:
        print(f"{len(problems)} problem(s) with decision citations; the form is described in {RECORDS}/README.md",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
