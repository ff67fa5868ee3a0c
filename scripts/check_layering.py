#!/usr/bin/env python3
"""Layering check: every module under src/metronome/ includes only itself and the modules below it.

"Below" is read from the one table that defines it, the layering table of docs/architecture.md
(between the `layering:begin` and `layering:end` markers): each row names a module and the modules
it uses directly; a module may include any module it reaches through those rows (the transitive
closure). The same rule is checked for the `metronome::<module>` targets each
src/metronome/<module>/CMakeLists.txt links, so the link graph cannot run ahead of the include graph.

Fails (exit 1) naming every offending file:line and include, or the table row that is malformed
(unknown module, a module missing from the table, a cycle). Usage: scripts/check_layering.py [repo]
"""

import pathlib
import re
import sys

BEGIN = "<!-- layering:begin -->"
END = "<!-- layering:end -->"
INCLUDE = re.compile(r'^\s*#\s*include\s+"metronome/([a-z0-9_]+)/[^"]+"')
TARGET = re.compile(r"metronome::([a-z0-9_]+)")


def read_table(doc: pathlib.Path) -> dict[str, set[str]]:
    text = doc.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        sys.exit(f"check_layering: {doc}: the markers {BEGIN} / {END} are missing")
    uses: dict[str, set[str]] = {}
    for line in text.split(BEGIN, 1)[1].split(END, 1)[0].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue  # header, separator or prose
        module = cells[0].strip("`")
        deps = set(re.findall(r"`([a-z0-9_]+)`", cells[1]))
        if module in uses:
            sys.exit(f"check_layering: {doc}: module `{module}` has two rows")
        uses[module] = deps
    for module, deps in uses.items():
        for d in sorted(deps - uses.keys()):
            sys.exit(f"check_layering: {doc}: `{module}` uses `{d}`, which has no row")
    return uses


def closure(uses: dict[str, set[str]]) -> dict[str, set[str]]:
    below: dict[str, set[str]] = {}

    def visit(module: str, path: list[str]) -> set[str]:
        if module in path:
            sys.exit("check_layering: cycle in the layering table: " + " -> ".join(path + [module]))
        if module not in below:
            reach: set[str] = set()
            for d in uses[module]:
                reach |= {d} | visit(d, path + [module])
            below[module] = reach
        return below[module]

    for m in uses:
        visit(m, [])
    return below


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    doc = root / "docs" / "architecture.md"
    uses = read_table(doc)
    below = closure(uses)
    src = root / "src" / "metronome"
    problems: list[str] = []
    modules = sorted(p.name for p in src.iterdir() if p.is_dir())
    for module in modules:
        if module not in uses:
            problems.append(f"src/metronome/{module}/: module has no row in {doc.name}'s table")
            continue
        allowed = below[module] | {module}
        for f in sorted((src / module).rglob("*")):
            if f.suffix not in (".h", ".cc"):
                continue
            for n, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) not in allowed:
                    problems.append(f"{f.relative_to(root)}:{n}: {line.strip()}: `{module}` may "
                                    f"not include `{m.group(1)}` (it uses: "
                                    f"{', '.join(sorted(below[module])) or 'nothing'})")
        cmake = src / module / "CMakeLists.txt"
        if cmake.exists():
            for n, line in enumerate(cmake.read_text(encoding="utf-8").splitlines(), 1):
                for target in TARGET.findall(line.split("#", 1)[0]):
                    if target not in allowed:
                        problems.append(f"{cmake.relative_to(root)}:{n}: links metronome::{target}"
                                        f", which is not below `{module}`")
    for module in sorted(uses.keys() - set(modules)):
        problems.append(f"{doc.name}: table row `{module}` names no folder under src/metronome/")
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"check_layering: {len(problems)} problem(s); the table is in {doc}", file=sys.stderr)
        return 1
    print(f"check_layering: {len(modules)} modules include and link only the modules below them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
