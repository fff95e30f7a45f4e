#!/usr/bin/env python3
"""Which test suites include each public header: the table at the end of tests/README.md.

Usage: tests_index.py [ROOT]            print the table
       tests_index.py [ROOT] --write    rewrite the table in tests/README.md (between its markers)
       tests_index.py [ROOT] --check    exit 1 (naming the fix) when tests/README.md's table differs from it

A suite is a folder of tests/: unit/<layer>, <group>/<name> (integration, interop, gpu, package), or a top-level
folder (fuzz, support). A header counts as covered by a suite when one of the suite's files includes it directly
(`#include <ddp/...>` or "ddp/..."); headers reached only through <ddp/ddp.hpp> or other headers show "-", so the
gaps stay visible. Plain python3, no dependencies.
"""
import pathlib
import re
import sys

BEGIN = "<!-- tests_index.py: begin -->"
END = "<!-- tests_index.py: end -->"
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](ddp/[^>"]+)[>"]', re.M)
GROUPS = {"unit", "integration", "interop", "gpu", "package"}


def suite_of(rel):
    parts = rel.parts  # ("tests", ...)
    if len(parts) > 3 and parts[1] in GROUPS:
        return f"{parts[1]}/{parts[2]}"
    return parts[1]


def table(root):
    headers = sorted(p.relative_to(root / "include").as_posix()
                     for p in (root / "include" / "ddp").rglob("*") if p.suffix in (".hpp", ".cuh"))
    covered = {h: set() for h in headers}
    for f in sorted((root / "tests").rglob("*")):
        if f.suffix not in (".cpp", ".cu", ".hpp", ".cuh") or not f.is_file():
            continue
        for inc in INCLUDE.findall(f.read_text(errors="replace")):
            if inc in covered:
                covered[inc].add(suite_of(f.relative_to(root)))
    lines = ["| header | suites that include it |", "| --- | --- |"]
    for h in headers:
        suites = ", ".join(f"`{s}`" for s in sorted(covered[h])) or "-"
        lines.append(f"| `{h}` | {suites} |")
    return "\n".join(lines) + "\n"


def main(argv):
    args = [a for a in argv if not a.startswith("--")]
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent).resolve()
    t = table(root)
    if "--check" not in argv and "--write" not in argv:
        sys.stdout.write(t)
        return 0
    path = root / "tests" / "README.md"
    readme = path.read_text()
    if BEGIN not in readme or END not in readme:
        print(f"tests/README.md: the markers {BEGIN} and {END} are missing; put them around the header table")
        return 1
    head, rest = readme.split(BEGIN, 1)
    current, tail = rest.split(END, 1)
    if "--write" in argv:
        path.write_text(head + BEGIN + "\n" + t + END + tail)
        return 0
    if current.strip("\n") + "\n" != t:
        print("tests/README.md: the header table is out of date (a header or a test's includes changed); "
              "regenerate it with: python3 tools/tests_index.py --write")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
