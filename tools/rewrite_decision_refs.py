#!/usr/bin/env python3
"""Rewrites the retired citations of decisions into the form docs/decisions/README.md describes.

Usage: rewrite_decision_refs.py [ROOT] [--write] [--diff]

Finds what tools/check_decision_refs.py calls old and bare citations (`docs/ARCHITECTURE.md D10, D21`, with the
numbers possibly on the next comment line; `(D52)`) and rewrites each into `docs/decisions/0010, 0021`. Without
--write it changes nothing and prints what it would do (--diff: as a unified diff); with --write it rewrites the
files in place. A rewritten line that grows past 120 columns is split at a space before column 120, the rest
going onto a new line with the same comment marker and indentation (comment lines, and Markdown prose). What it
cannot rewrite safely is listed for a hand edit: a range of more than three numbers (`D1-D41`), and a line that
would grow past 120 columns outside a comment. Plain python3, no dependencies.
"""
import difflib
import pathlib
import re
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import check_decision_refs as check  # noqa: E402

MAX_COLS = 120
MARK = "\ue000"  # a private-use character: never in the tree
# A line that is all comment, per kind of file (a C++ line starting with # is the preprocessor's).
SLASH = re.compile(r"^(?P<p>[ \t]*(?://+!?|\*)[ \t]?)(?P<item>[ \t]*(?:- )?)")
HASH = re.compile(r"^(?P<p>[ \t]*#+[ \t]?)(?P<item>[ \t]*(?:- )?)")
NONE = re.compile(r"(?!)")
COMMENTS = {".hpp": SLASH, ".cpp": SLASH, ".cu": SLASH, ".cuh": SLASH, ".h": SLASH, ".c": SLASH,
            ".py": HASH, ".sh": HASH, ".cmake": HASH, ".txt": HASH, ".sbatch": HASH, ".yml": HASH, ".yaml": HASH}
COMMENT = NONE  # set per file by rewrite()


def cited(nums):
    return "docs/decisions/" + ", ".join(f"{n:04d}" for n in nums)


def body_start(line, markdown):
    """The column where a comment line's (or a Markdown prose line's) text starts, or None for other lines."""
    m = COMMENT.match(line)
    if m and not (markdown and line.lstrip().startswith("*")):
        return len(m.group("p")) + len(m.group("item"))
    if markdown and line.strip() and not line.lstrip().startswith(("|", "#", "```")):
        return len(re.match(r"^[ \t]*(?:[-*] |[0-9]+\. )?", line).group(0))
    return None


def continues(line, markdown):
    """True when line goes on with the sentence of the line above (not a new item, heading or blank)."""
    at = body_start(line, markdown)
    if at is None or at >= len(line):
        return False
    rest = line[at:]
    return line[:at].strip() == line[:at].strip().rstrip("- ") and rest[0] in "abcdefghijklmnopqrstuvwxyz(`'\""


def fit(lines, i, markdown):
    """Splits lines[i] at spaces until every line is at most MAX_COLS columns, carrying the overflow into the
    next line when that line goes on with the same sentence (a local rewrap). False when it cannot."""
    while len(lines[i]) > MAX_COLS:
        at = body_start(lines[i], markdown)
        if at is None:
            return False
        cut = -1
        for k in range(min(MAX_COLS, len(lines[i]) - 1), at + 10, -1):
            if lines[i][k] == " " and lines[i].count("`", 0, k) % 2 == 0:
                cut = k
                break
        if cut < 0:
            return False
        head, rest = lines[i][:cut].rstrip(), lines[i][cut + 1:].lstrip()
        lines[i] = head
        nxt = lines[i + 1] if i + 1 < len(lines) else None
        if nxt is not None and continues(nxt, markdown):
            n_at = body_start(nxt, markdown)
            lines[i + 1] = nxt[:n_at] + rest + " " + nxt[n_at:]
        else:
            ref = nxt if nxt is not None and continues(nxt, markdown) else lines[i]
            prefix = ref[:body_start(ref, markdown)]
            m = COMMENT.match(lines[i])
            if m:
                prefix = m.group("p") + " " * len(m.group("item"))
            lines.insert(i + 1, prefix + rest)
        i += 1
    return True


def rewrite(root, path, text):
    """(new text, number of citations rewritten, [hand-edit notes])."""
    rel = path.relative_to(root).as_posix()
    found = [c for c in check.citations(root, path, text) if c[1] in ("old", "bare")]
    notes = []
    done = 0
    for line, form, nums, (a, b) in sorted(found, key=lambda c: c[3][0], reverse=True):
        if len(nums) > 3 and re.search(r"[-–]\s*D", text[a:b]):
            notes.append(f"{rel}:{line}: range {text[a:b]!r}: rewrite by hand")
            continue
        # "docs/ARCHITECTURE.md D9", "ARCHITECTURE.md\n// D9" and "(D9)" all become "docs/decisions/0009"; a line break
        # inside the citation is dropped and the joined line rewrapped below.
        new = cited(nums)
        text = text[:a] + MARK + new + text[b:]  # MARK: this line changed (removed below)
        done += 1
    markdown = path.suffix == ".md"
    global COMMENT
    COMMENT = COMMENTS.get(path.suffix, NONE)
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if MARK in lines[i]:
            lines[i] = lines[i].replace(MARK, "")
            if len(lines[i]) > MAX_COLS and not (markdown and lines[i].lstrip().startswith("|")):
                if not fit(lines, i, markdown):
                    notes.append(f"{rel}: line now {len(lines[i])} columns, not splittable here: "
                                 f"{lines[i].strip()[:80]!r}...")
        i += 1
    out = lines
    return "\n".join(out), done, notes


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    write, diff = "--write" in argv, "--diff" in argv
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent).resolve()
    total_files = total = 0
    notes = []
    for path in check.files(root):
        text = check.read_text(path)
        if text is None:
            continue
        new, n, file_notes = rewrite(root, path, text)
        notes += file_notes
        if new == text:
            continue
        total_files += 1
        total += n
        rel = path.relative_to(root).as_posix()
        if diff:
            sys.stdout.writelines(difflib.unified_diff(text.splitlines(True), new.splitlines(True),
                                                       "a/" + rel, "b/" + rel))
        if write:
            path.write_text(new, encoding="utf-8")
    verb = "rewrote" if write else "would rewrite"
    print(f"{verb} {total} citation(s) in {total_files} file(s)")
    for note in notes:
        print(note)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
