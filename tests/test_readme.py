"""README promises two commands; CI must run the very same test command."""

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
