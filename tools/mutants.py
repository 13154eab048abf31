"""Replay the planted bugs of `mutants/*.py` against the test suite: each must be caught.

A mutant is a plausible bug written down as data: one exact piece of source, what it becomes, and
the tests that must fail with it. The catalogue holds one file per source file the bugs are planted in
(`mutants/transforms_ema.py` for `src/composetrain/transforms/ema.py`; `tools/regroup_mutants.py` files
new entries there), each entry naming in `from` the catalogue (the issue) it was first written for.
`python tools/mutants.py [NAME ...]` copies the tree once, then for each mutant plants it, runs its
tests, and puts the code back; it prints a table and exits 1 if any mutant survived. `nox -s mutants`
runs it. `tests/test_mutants.py` (in CI) only checks that every mutant still applies to the current
code and names tests that exist, so that the catalogue does not rot.

Why a catalogue rather than random mutation alone: the bugs worth catching are the ones a careful
engineer would write (an alias instead of a copy, a dropped fsync, a check in the wrong order).
Once planted by hand they are kept, and every later change to the module is tested against them.
"""

from __future__ import annotations

import argparse
import os
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "mutants"
KEYS = {"file", "find", "replace", "tests", "why", "from"}


@dataclass(frozen=True)
class Mutant:
    """One planted bug: in `file`, the single occurrence of `find` becomes `replace`."""

    name: str
    file: str
    find: str
    replace: str
    tests: tuple[str, ...]
    why: str = ""
    origin: str = ""  # the entry's `from`: the catalogue (issue) it was first written for


def load(names: list[str] | None = None) -> list[Mutant]:
    """Every mutant of the catalogue (or of the catalogue files named), in file order."""
    mutants = []
    for path in sorted(CATALOGUE.glob("*.py")):
        if names and path.stem not in names:
            continue
        for i, m in enumerate(runpy.run_path(str(path))["MUTANTS"]):
            name = f"{path.stem}:{i + 1}"
            if not isinstance(m, dict) or not {"file", "find", "replace", "tests"} <= set(m):
                raise ValueError(f"mutants: {name} needs file, find, replace and tests, got {m!r}")
            if set(m) - KEYS:
                raise ValueError(f"mutants: {name} has keys it does not know: {sorted(set(m) - KEYS)}")
            found = (m["file"], m["find"], m["replace"], tuple(m["tests"]), m.get("why", ""), m.get("from", ""))
            mutants.append(Mutant(name, *found))
    return mutants


def problem(m: Mutant, root: Path = ROOT) -> str | None:
    """Why `m` cannot be planted in the tree at `root` (None when it can)."""
    path = root / m.file
    if not path.is_file():
        return f"{m.file} does not exist"
    count = path.read_text().count(m.find)
    if count != 1:
        return f"{m.find!r} occurs {count} times in {m.file} (must be exactly once)"
    if m.find == m.replace:
        return "replace equals find"
    mutated = path.read_text().replace(m.find, m.replace)
    try:
        compile(mutated, str(path), "exec")
    except SyntaxError as e:
        return f"the mutant does not compile: {e}"
    for test in m.tests:
        if not (root / test.split("::")[0]).is_file():
            return f"test {test} does not exist"
    return None


def run(mutants: list[Mutant], timeout: float) -> list[tuple[Mutant, str, float]]:
    """Plant each mutant in a copy of the tree and run its tests there; (mutant, verdict, seconds)."""
    results = []
    with tempfile.TemporaryDirectory(prefix="ct-mutants-") as tmp:
        copy = Path(tmp) / "tree"
        for part in ("src", "tests", "examples", "benchmarks", "docs", "README.md", "mkdocs.yml", "pyproject.toml"):
            src = ROOT / part
            if src.is_dir():
                shutil.copytree(src, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
            elif src.exists():
                shutil.copy2(src, copy / part)
        env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
        for m in mutants:
            why = problem(m, copy)
            if why is not None:
                results.append((m, f"NOT APPLIED: {why}", 0.0))
                print(f"{m.name:36} {results[-1][1]}", flush=True)
                continue
            path = copy / m.file
            original = path.read_text()
            path.write_text(original.replace(m.find, m.replace))
            start = time.monotonic()
            try:
                cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", *m.tests]
                rc = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, timeout=timeout).returncode
                verdict = "caught" if rc == 1 else ("SURVIVED" if rc == 0 else f"error (pytest exit {rc})")
            except subprocess.TimeoutExpired:
                verdict = "caught (timed out)"
            finally:
                path.write_text(original)
            results.append((m, verdict, time.monotonic() - start))
            print(f"{m.name:36} {verdict:20} {results[-1][2]:6.1f}s  {m.origin}: {m.why}", flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="catalogue files to run (stems of mutants/*.py); default all")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant (a hang counts as caught)")
    args = parser.parse_args()
    results = run(load(args.names), args.timeout)
    caught = sum(v.startswith("caught") for _, v, _ in results)
    print(f"\n{caught} of {len(results)} mutants caught")
    return 0 if caught == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
