"""README promises two commands; CI must run the very same test command; its code layout names every module."""

import re
from pathlib import Path

import pytest

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


def test_readme_quick_example_runs():
    code = re.search(r"## Quick example\n\n```python\n(.+?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    namespace: dict = {}
    exec(compile(code, "README quick example", "exec"), namespace)
    assert namespace["state"].step == 1
    assert repr(namespace["train_step"]) == "accumulate(4)(step)"


def readme_section(title: str) -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_readme_snippets_compile_and_use_only_public_names():
    import composetrain as ct

    blocks = re.findall(r"```python\n(.+?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(blocks) > 10
    for i, code in enumerate(blocks):
        compile(code, f"README python block {i}", "exec")
        used = set(re.findall(r"\bct\.([A-Za-z_]\w*)", code))
        assert used <= set(ct.__all__), f"README python block {i} uses {sorted(used - set(ct.__all__))}"


def test_readme_api_table_lists_every_public_name_once():
    import composetrain as ct

    listed = re.findall(r"^\| `([A-Za-z_]\w*)", readme_section("API"), re.M)
    assert sorted(listed) == sorted(ct.__all__)


@pytest.mark.parametrize(
    ("name", "module", "call"), [("to_wandb", "wandb", "log"), ("to_mlflow", "mlflow", "log_metrics")]
)
def test_the_tracker_recipes_log_every_value_of_a_record_eval_ema_too(name, module, call):
    """The W&B and MLflow recipes' functions, run on ct.run's records (a fake tracker module records what they log):
    an evaluation of ct.ema's weights ("eval_ema") is logged beside "eval", and a log record's numbers."""
    import types

    source = re.search(rf"(def {name}\(record\):\n(?:    .*\n)+)", (ROOT / "README.md").read_text()).group(1)
    logged = []
    fake = types.SimpleNamespace(**{call: lambda values, step: logged.append((step, values))})
    namespace = {module: fake}
    exec(compile(source, f"README {name}", "exec"), namespace)
    namespace[name]({"step": 4, "epoch": 1, "eval": {"acc": 0.5}, "eval_ema": {"acc": 0.625}})
    namespace[name]({"step": 4, "epoch": 1, "loss": 0.25, "lr": 0.1, "skipped": 0})
    assert logged[0] == (4, {"eval/acc": 0.5, "eval_ema/acc": 0.625})
    assert logged[1][0] == 4 and {"train/loss": 0.25, "train/lr": 0.1}.items() <= logged[1][1].items()


PACKAGE = ROOT / "src" / "composetrain"


def code_layout() -> str:
    """The README's "Code layout" paragraph, up to the next bold-titled one."""
    text = (ROOT / "README.md").read_text()
    start = text.index("**Code layout.**")
    return text[start : text.index("\n**", start)]


def layout_entries(layout: str) -> dict[str, str]:
    """Each numbered folder's entry (``1. `core/`: ...``) by folder, and the text before them by "" (the root)."""
    parts = re.split(r"(?m)^\d+\. `(\w+)/`:", layout)
    return {"": parts[0], **dict(zip(parts[1::2], parts[2::2], strict=True))}


def layout_problems(layout: str, files: set[str]) -> list[str]:
    """What the layout and the tree (``files``: each module's path under the package) disagree on: a module without
    its line in its folder's entry, a module named there that does not exist (an ``__init__.py`` may go unnamed)."""
    entries = layout_entries(layout)
    named = {
        f"{folder}/{name}".lstrip("/")
        for folder, text in entries.items()
        for name in re.findall(r"`(?:composetrain/)?(\w+\.py)`", text)
    }
    found = [
        f"{path}: no line in the README's code layout"
        for path in sorted(files - named)
        if not path.endswith("__init__.py") or "/" not in path
    ]
    found += [f"{path}: named in the README's code layout, but no such module" for path in sorted(named - files)]
    return found


def package_files() -> set[str]:
    return {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*.py")}


def test_the_code_layout_names_every_module_and_only_modules_that_exist():
    assert layout_problems(code_layout(), package_files()) == []


def test_the_code_layout_numbers_the_folders_in_their_layers_order():
    from test_layers import LAYERS

    assert [folder for folder in layout_entries(code_layout()) if folder] == list(LAYERS)


def test_a_module_added_without_its_line_or_a_line_without_its_module_is_found():
    files = package_files()
    assert layout_problems(code_layout(), files | {"driver/added.py"}) == [
        "driver/added.py: no line in the README's code layout"
    ]
    assert layout_problems(code_layout(), files - {"transforms/clip.py"}) == [
        "transforms/clip.py: named in the README's code layout, but no such module"
    ]
    assert layout_problems(code_layout(), files | {"added.py"}) == ["added.py: no line in the README's code layout"]
