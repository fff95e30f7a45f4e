#!/usr/bin/env python3
"""Every line of the library (include/) and the examples (examples/) fits in 100 columns.

Usage: check_columns.py REPO_ROOT. Prints file:line: length for each longer line and exits 1 if any.
Code is formatted with clang-format (.clang-format: ColumnLimit 100, ReflowComments false); comments are
wrapped by hand, so this check is what keeps them within the limit (docs/decisions/0077).
"""
import pathlib
import sys

LIMIT = 100
SUFFIXES = {".hpp", ".h", ".cuh", ".cpp", ".cu"}


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    bad = 0
    for top in ("include", "examples"):
        for path in sorted((root / top).rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file():
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if len(line) > LIMIT:
                    print(f"{path.relative_to(root)}:{number}: {len(line)} columns (limit {LIMIT})")
                    bad += 1
    if bad:
        print(f"{bad} line(s) over {LIMIT} columns: run clang-format -i on the file for code, "
              "and wrap comments by hand", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
