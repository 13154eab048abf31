"""README promises two commands; CI must run the very same test command and build the documentation strictly; the
quick example runs. (The documentation's own checks, the code layout's among them: tests/test_docs.py.)"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands():
    text = (ROOT / "README.md").read_text()
    head = text[: text.index("## Quick example")]
    return re.findall(r"```bash\n(.+?)\n```", head)


def test_readme_opens_with_exactly_two_commands():
    main_job, tests = readme_commands()
    assert "examples/image_classifier.py" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command_verbatim():
    _, tests = readme_commands()
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines()


def test_every_benchmark_runs_in_the_benchmarks_session():
    """Each benchmarks/bench_*.py is run by `nox -s benchmarks` (the modules beside them are their shared parts)."""
    source = (ROOT / "noxfile.py").read_text()
    session = source[source.index("def benchmarks(") : source.index("\n@nox.session", source.index("def benchmarks("))]
    missing = [p.name for p in sorted((ROOT / "benchmarks").glob("bench_*.py")) if f'"{p.name}"' not in session]
    assert missing == []


def test_ci_gates_what_nox_lint_promises():
    """ruff's rules, ruff's layout and mypy, as `nox -s lint` runs them, each a command of .ci/run (set -e)."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci
    for command in (".venv/bin/ruff check .", ".venv/bin/ruff format --check .", ".venv/bin/mypy"):
        assert command in ci, command


def test_ci_builds_the_documentation_strictly_with_the_docs_extra():
    """`mkdocs build --strict` in CI (seconds), from the `[docs]` extra that `nox -s docs` installs too."""
    ci = (ROOT / ".ci" / "run").read_text()
    assert ".venv/bin/mkdocs build --strict" in ci
    assert '.venv/bin/pip install -e ".[lint,docs]"' in ci
    docs = re.search(r"(?m)^docs = \[(.*)\]$", (ROOT / "pyproject.toml").read_text()).group(1)
    assert '"mkdocs-material' in docs and '"mkdocstrings[python]' in docs
    nox = (ROOT / "noxfile.py").read_text()
    assert "def docs(" in nox and '"build", "--strict"' in nox


def test_readme_quick_example_runs():
    code = re.search(r"## Quick example\n\n```python\n(.+?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README quick example", "exec"), namespace)
    assert namespace["state"].step == 1
    assert repr(namespace["train_step"]) == "accumulate(4)(step)"
