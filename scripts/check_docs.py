#!/usr/bin/env python3
"""Checks that the documentation stays a reference, not a lab notebook (CONTRIBUTING.md):

- README.md is at most 150 lines and docs/performance.md at most 400;
- README.md and docs/*.md (docs/history/ aside) hold no dated run log: no yyyy-mm-dd date and no
  HH:MM time of day (a figure changes by replacing its table, not by appending a dated section);
- every docs/<name>.md path that code, scripts, tests or deploy files mention exists, and every
  relative link to a .md file in README.md and docs/*.md points at one that exists.

Run from anywhere; prints one line per problem (file:line: what) and exits 1 if there is any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAX_LINES = {"README.md": 150, "docs/performance.md": 400}
# Where code may cite a doc. Build trees and vendored packages are not ours.
CODE_DIRS = ["src", "scripts", "tests", "apps", "deploy", "bench", "experiments", "web"]
SKIP_DIRS = {"node_modules", "build", ".git"}
CODE_SUFFIXES = {".h", ".cc", ".cpp", ".c", ".sh", ".py", ".txt", ".cmake", ".js", ".html",
                 ".css", ".yaml", ".yml", ".json", ".cfg", ".conf", ".md", ""}

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
TIME_OF_DAY = re.compile(r"(?<![\d:.])(?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d)?(?![\d:])")
DOC_PATH = re.compile(r"\bdocs/[A-Za-z0-9_./-]*?\.md\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+\.md)(?:#[^)]*)?\)")


def doc_files():
    docs = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
    return [p for p in docs if p.is_file()]


def code_files():
    for top in CODE_DIRS:
        base = ROOT / top
        if not base.is_dir():
            continue
        for path in sorted(base.rglob("*")):
            if SKIP_DIRS.intersection(path.relative_to(ROOT).parts):
                continue
            if path.is_file() and path.suffix in CODE_SUFFIXES:
                yield path


def read_lines(path):
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError:
        return []


def main():
    problems = []
    for name, limit in MAX_LINES.items():
        path = ROOT / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        n = len(read_lines(path))
        if n > limit:
            problems.append(f"{name}: {n} lines, more than {limit}")

    for path in doc_files():
        rel = path.relative_to(ROOT)
        for i, line in enumerate(read_lines(path), 1):
            for rx, what in ((DATE, "a date"), (TIME_OF_DAY, "a time of day")):
                m = rx.search(line)
                if m:
                    problems.append(f"{rel}:{i}: {what} ({m.group(0)}): a dated run log belongs in "
                                    "git history or docs/history/, the doc says what holds now")
            for m in MD_LINK.finditer(line):
                target = m.group(1)
                if "://" in target:
                    continue
                if not (path.parent / target).resolve().is_file():
                    problems.append(f"{rel}:{i}: link to {target}, which does not exist")

    for path in code_files():
        rel = path.relative_to(ROOT)
        for i, line in enumerate(read_lines(path), 1):
            for m in DOC_PATH.finditer(line):
                if not (ROOT / m.group(0)).is_file():
                    problems.append(f"{rel}:{i}: cites {m.group(0)}, which does not exist")

    for p in problems:
        print(p)
    if problems:
        print(f"check_docs: {len(problems)} problem(s)")
        return 1
    print("check_docs: README and docs sizes, no dated run logs, every cited doc exists")
    return 0


if __name__ == "__main__":
    sys.exit(main())
