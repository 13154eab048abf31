"""Apply tools/moved_modules.txt to a tree: `python tools/rewrite_imports.py [ROOT ...]` (default: the repository).

Rewrites, in every .py and .md file under each ROOT (skipping .git, .venv, .nox, build folders):
- dotted names that start with a moved module, wherever they stand: imports, ``import a.b as c``, strings such as
  ``patch("composetrain.x.y.attr")`` and prose (``composetrain.x`` -> ``composetrain.layer.x``);
- ``from PARENT import NAME`` where ``PARENT.NAME`` is a moved module (``from composetrain.driver import checkpoint``
  -> ``from composetrain.checkpoint import files as checkpoint``);
- file paths ``composetrain/x/y.py`` of moved modules
  (``src/composetrain/state.py`` -> ``src/composetrain/core/state.py``).
A name that already reads as a new module, or as a module of today's tree (``composetrain.core.tokens``, under the
old ``composetrain.core``), is left alone, so running it twice changes nothing.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src"
SKIP = {".git", ".venv", ".nox", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache"}
# this tool and its test, which write earlier names on purpose
KEEP = {Path(__file__).resolve(), HERE.parent / "tests" / "test_rewrite_imports.py"}
# public functions with a module of their name: `from composetrain import accumulate` is the function, not the module
PUBLIC = {"accumulate", "distributed", "rendezvous", "sharded"}


def load_map(path: Path = HERE / "moved_modules.txt") -> dict[str, str]:
    moves = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            old, new = line.split()
            moves[old] = new
    return moves


def modules(src: Path = SRC) -> set[str]:
    """Every module of today's tree under ``src``, by dotted name (a package by its folder's)."""
    found = set()
    for path in (src / "composetrain").rglob("*.py"):
        parts = path.relative_to(src).with_suffix("").parts
        found.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


def rewrite(text: str, moves: dict[str, str], existing: set[str] | None = None) -> str:
    """``text`` with the moved names rewritten; ``existing``: today's modules (default: the repository's)."""
    targets = set(moves.values()) | (modules() if existing is None else existing)

    def dotted(match: re.Match[str]) -> str:
        parts = match[0].split(".")
        prefixes = [".".join(parts[:n]) for n in range(len(parts), 0, -1)]  # longest first
        old = next((p for p in prefixes if p in moves), None)
        if old is None:
            return match[0]
        new_at = next((p for p in prefixes if p in targets), None)
        if new_at is not None and len(new_at) > len(old):  # already rewritten (composetrain.core.protocol...)
            return match[0]
        return moves[old] + match[0][len(old) :]

    def from_import(match: re.Match[str]) -> str:
        indent, parent, names = match[1], match[2], match[3]
        if "(" in names:
            return match[0]
        kept, lines = [], []
        for item in names.split(","):
            bits = item.split()
            if not bits:
                continue
            name, alias = bits[0], (bits[2] if len(bits) == 3 else bits[0])
            full = f"{parent}.{name}"
            if full in moves and not (parent == "composetrain" and name in PUBLIC):
                new_parent, _, new_name = moves[full].rpartition(".")
                as_ = "" if alias == new_name else f" as {alias}"
                lines.append(f"{indent}from {new_parent} import {new_name}{as_}")
            else:
                kept.append(item.strip())
        if not lines:
            return match[0]
        if kept:
            lines.insert(0, f"{indent}from {parent} import {', '.join(kept)}")
        return "\n".join(lines)

    text = re.sub(r"(?m)^([ \t]*)from\s+(composetrain(?:\.\w+)*)\s+import\s+([^\n#]+?)[ \t]*$", from_import, text)
    text = re.sub(r"(?<![\w.])composetrain(?:\.\w+)+", dotted, text)
    paths = {old.replace(".", "/") + ".py": new.replace(".", "/") + ".py" for old, new in moves.items()}
    if paths:
        pattern = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
        text = re.sub(rf"(?<![\w/.])(?:src/)?({pattern})(?!\w)", lambda m: m[0].replace(m[1], paths[m[1]]), text)
    return text


def files(root: Path) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.suffix in (".py", ".md") and path.is_file() and not SKIP & set(path.relative_to(root).parts):
            found.append(path)
    return found


def main(argv: list[str]) -> int:
    moves = load_map()
    roots = [Path(a) for a in argv] or [HERE.parent]
    changed = 0
    for root in roots:
        for path in files(root):
            if path.resolve() in KEEP:
                continue
            text = path.read_text()
            new = rewrite(text, moves)
            if new != text:
                path.write_text(new)
                changed += 1
                print(path)
    print(f"{changed} file(s) rewritten", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
