"""README promises two commands; CI must run the very same test command."""

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
