"""The planted-bug catalogue (mutants/*.py, one file per module the bugs are planted in) still applies to today's code.

`nox -s mutants` replays every mutant against its tests (too slow for CI); this checks, in
seconds, that each one still names exactly one place in the source, compiles, and names tests
that exist (the file and the function: a test moved or renamed without its mutants is found), so
that a refactor cannot silently retire the catalogue.
"""

import ast
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
tool = runpy.run_path(str(ROOT / "tools" / "mutants.py"))
MUTANTS = tool["load"]()


def test_the_catalogue_is_not_empty():
    assert len(MUTANTS) >= 504


def test_each_catalogue_holds_the_planted_bugs_of_one_file_and_says_where_each_came_from():
    """mutants/<folder>_<module>.py holds the bugs planted in that module, each with the catalogue (the issue) it was
    first written for: a catalogue written per issue is filed there by ``python tools/regroup_mutants.py``."""
    regroup = runpy.run_path(str(ROOT / "tools" / "regroup_mutants.py"))
    for mutant in MUTANTS:
        catalogue = mutant.name.split(":")[0]
        where = regroup["catalogue_name"](mutant.file)
        assert where == catalogue, f"{mutant.name} belongs in mutants/{where}.py: run python tools/regroup_mutants.py"
        assert mutant.origin, f"{mutant.name} does not say which catalogue it was written in (its 'from')"


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_applies_to_the_current_code(mutant):
    assert tool["problem"](mutant) is None


def defined_tests(path: Path) -> set[str]:
    """The test ids a file defines, as a mutant names them: ``name`` for a function, ``Class::name`` for a method."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            methods = [f.name for f in node.body if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))]
            found |= {f"{node.name}::{name}" for name in methods}
    return found


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.name for m in MUTANTS])
def test_each_mutant_names_tests_that_exist(mutant):
    """Every test a mutant names is a test file, and the function (or method) it names is in that file: a test moved
    to another file, or renamed, without its mutants following would otherwise leave them naming nothing."""
    for test in mutant.tests:
        path, _, name = test.partition("::")
        assert (ROOT / path).is_file() and path.startswith("tests/test_"), test
        if name:
            assert name.split("[")[0] in defined_tests(ROOT / path), f"{test}: no such test in {path}"


def test_a_mutant_that_no_longer_matches_is_reported(tmp_path):
    (tmp_path / "m.py").write_text("x = 1\n")
    (tmp_path / "t.py").write_text("")
    stale = tool["Mutant"]("t:1", "m.py", "x = 2", "x = 3", ("t.py",))
    assert "occurs 0 times" in tool["problem"](stale, tmp_path)
    broken = tool["Mutant"]("t:2", "m.py", "x = 1", "x = (", ("t.py",))
    assert "does not compile" in tool["problem"](broken, tmp_path)
    assert tool["problem"](tool["Mutant"]("t:3", "m.py", "x = 1", "x = 2", ("t.py",)), tmp_path) is None
