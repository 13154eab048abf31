"""Count what the test suite checks, so that a reorganisation of tests/ can show it kept every check.

`python tools/count_tests.py` reads every `.py` file under tests/ (test modules and what they run in other
processes: helpers, scripts, rank functions) and counts, without importing anything:

- asserts: `assert` statements;
- raises: calls of `pytest.raises` / `pytest.warns` / `pytest.deprecated_call` (as a `with` context or a call);
- given: functions decorated with hypothesis's `@given` (each a property tested on many examples);
- tests: functions named `test_*` (before parametrisation).

`--collect` also runs `pytest --collect-only` (with PYTHONPATH=src) and gives the number of collected tests. A
move of a test or a worker function between files changes no total; a merged duplicate lowers them by its own
counts. `--by-file` prints the counts of each file too.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
CHECKERS = {"raises", "warns", "deprecated_call"}


def _is_pytest_checker(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr in CHECKERS
        and isinstance(node.value, ast.Name)
        and node.value.id == "pytest"
    )


def _is_given(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Name) and target.id == "given") or (
        isinstance(target, ast.Attribute) and target.attr == "given"
    )


def count(source: str) -> Counter[str]:
    """The asserts, pytest.raises/warns, @given functions and test functions of one file's source."""
    found: Counter[str] = Counter()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Assert):
            found["asserts"] += 1
        elif isinstance(node, ast.Call) and _is_pytest_checker(node.func):
            found["raises"] += 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found["given"] += any(_is_given(d) for d in node.decorator_list)
            found["tests"] += node.name.startswith("test_")
    return found


def collected() -> int:
    """The number of tests pytest collects from tests/."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider", "tests"]
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=False).stdout
    match = re.search(r"(\d+) tests? collected", out)
    if match is None:
        raise SystemExit(f"count_tests: pytest collected nothing countable; it printed:\n{out[-3000:]}")
    return int(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--collect", action="store_true", help="also count the tests pytest collects (slow)")
    parser.add_argument("--by-file", action="store_true", help="print each file's counts too")
    args = parser.parse_args()
    total: Counter[str] = Counter()
    for path in sorted(TESTS.glob("*.py")):
        found = count(path.read_text())
        total += found
        if args.by_file:
            print(f"{path.name:45} " + " ".join(f"{k}={found[k]}" for k in ("asserts", "raises", "given", "tests")))
    checks = total["asserts"] + total["raises"] + total["given"]
    print(
        f"asserts {total['asserts']}, pytest.raises/warns {total['raises']}, @given {total['given']}: "
        f"{checks} checks; {total['tests']} test functions"
    )
    if args.collect:
        print(f"{collected()} tests collected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
