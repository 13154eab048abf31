"""Regroup the planted-bug catalogue by the file each bug is planted in: `python tools/regroup_mutants.py`.

Reads every `mutants/*.py` (with runpy, as tools/mutants.py does), and writes one catalogue per source file the
entries plant into, so that "the planted bugs of this module" is one file: `src/composetrain/transforms/ema.py`'s
are `mutants/transforms_ema.py`, the package's own `__init__.py`'s `mutants/composetrain.py`, a folder's
`__init__.py`'s the folder's name (`mutants/checking.py`), and a file outside the package its folder and name
(`mutants/tests_processes.py`). Each entry is written as a literal dict with its `file`, `find`, `replace`, `tests`
and `why`, and `from`: the catalogue (an issue, a review) it was first written in, kept when it already has one.
Entries keep their order (catalogues by name, then their own order). Catalogues that end up empty are removed; the
result is formatted by `ruff format`.

Run it again after adding a catalogue named by its issue (or any other way): its entries join their files'
catalogues. On catalogues already grouped it changes nothing.
"""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "mutants"
PACKAGE = "src/composetrain/"
KEYS = ("file", "find", "replace", "tests", "why", "from")
WIDTH = 100  # characters of a string piece on its own line (the lines stay within ruff's 120)


def catalogue_name(file: str) -> str:
    """The catalogue of the bugs planted in ``file`` (a path from the repository root)."""
    inside = file[len(PACKAGE) :] if file.startswith(PACKAGE) else file
    parts = inside.removesuffix(".py").split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1] or ["composetrain"]
    return "_".join(p.lstrip("_") for p in parts)


def load() -> list[tuple[str, dict]]:
    """(catalogue stem, entry) for every entry of every catalogue, catalogues by name, entries in their order."""
    found = []
    for path in sorted(CATALOGUE.glob("*.py")):
        for i, entry in enumerate(runpy.run_path(str(path))["MUTANTS"]):
            if not isinstance(entry, dict) or not {"file", "find", "replace", "tests"} <= set(entry):
                raise SystemExit(f"regroup_mutants: {path.stem}:{i + 1} needs file, find, replace and tests")
            unknown = set(entry) - set(KEYS)
            if unknown:
                raise SystemExit(f"regroup_mutants: {path.stem}:{i + 1} has keys it does not know: {sorted(unknown)}")
            found.append((path.stem, entry))
    return found


def pieces(text: str) -> list[str]:
    """``text`` cut into pieces of at most WIDTH characters, after each newline and else at spaces."""
    out: list[str] = []
    for line in text.splitlines(keepends=True):
        while len(line) > WIDTH:
            cut = line.rfind(" ", 0, WIDTH)
            cut = WIDTH if cut <= 0 else cut + 1
            out.append(line[:cut])
            line = line[cut:]
        out.append(line)
    return out or [""]


def literal(text: str, indent: str) -> str:
    """A string literal for ``text``, split into implicitly concatenated pieces when long or of several lines."""
    parts = pieces(text)
    if len(parts) == 1:
        return repr(text)
    inner = "".join(f"{indent}    {p!r}\n" for p in parts)
    return f"(\n{inner}{indent})"


def test_literal(test: str) -> str:
    """A test id is one word (ruff leaves a line of one word alone, however long): split only one with spaces."""
    return repr(test) if " " not in test else literal(test, "            ")


def render(file: str, entries: list[dict]) -> str:
    lines = [
        f'"""The planted bugs of {file}, replayed by tools/mutants.py.',
        "",
        "Grouped by tools/regroup_mutants.py (`from`: the catalogue each was first written in): add an entry here, or",
        "write a catalogue of your own and run it.",
        '"""',
        "",
    ]
    lines.append("MUTANTS = [")
    for entry in entries:
        lines.append("    {")
        for key in KEYS:
            value = entry[key]
            if key == "tests":
                tests = "".join(f"            {test_literal(t)},\n" for t in value)
                lines.append(f'        "tests": [\n{tests}        ],')
            else:
                lines.append(f'        "{key}": {literal(value, "        ")},')
        lines.append("    },")
    lines.append("]")
    return "\n".join(lines) + "\n"


def main() -> int:
    groups: dict[str, tuple[str, list[dict]]] = {}
    for stem, entry in load():
        entry = {"why": "", "from": stem, **entry, "tests": list(entry["tests"])}
        name = catalogue_name(entry["file"])
        file, entries = groups.setdefault(name, (entry["file"], []))
        if file != entry["file"]:
            raise SystemExit(f"regroup_mutants: {file} and {entry['file']} would share the catalogue {name}.py")
        entries.append(entry)
    written = []
    for name, (file, entries) in groups.items():
        path = CATALOGUE / f"{name}.py"
        path.write_text(render(file, entries))
        written.append(path)
    for path in CATALOGUE.glob("*.py"):
        if path not in written:
            path.unlink()
    ruff = [sys.executable, "-m", "ruff"]
    if subprocess.run([*ruff, "--version"], capture_output=True).returncode != 0:
        ruff = ["ruff"]
    subprocess.run([*ruff, "format", "-q", *map(str, written)], check=True)
    total = sum(len(e) for _, e in groups.values())
    print(f"{total} mutants in {len(written)} catalogues, one per file they plant into")
    return 0


if __name__ == "__main__":
    sys.exit(main())
