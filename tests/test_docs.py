"""The documentation (README.md and docs/) is tested like code: every python block runs, with small settings, or says
why it cannot; every public name has its entry in the API reference; the site builds with `mkdocs build --strict`;
the README stays short and answers the three questions users ask first within two clicks; the facts the pages state
about the code (its layout, the API table, the tracker recipes) are checked against it.

A block's directives are HTML comments right before it (only blank lines between), invisible on the site:
- ``<!-- setup: NAME, NAME -->``: add those names of ``tests/docs_setups.py`` to the page's namespace first;
- ``<!-- small: OLD -> NEW ; OLD -> NEW -->``: run the block with each OLD text (which must occur) replaced by NEW;
- ``<!-- not-run: REASON -->``: compiled, not run, for the reason given;
- ``<!-- tested-by: tests/test_x.py -->``: run by that test file, which reads this page.
A page's blocks run in order in one namespace, in a fresh working folder.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
KINDS = ("setup", "small", "not-run", "tested-by")


@dataclass
class Block:
    page: Path
    line: int
    code: str
    directives: dict[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def runs_here(self) -> bool:
        return "not-run" not in self.directives and "tested-by" not in self.directives

    def setups(self) -> list[str]:
        return [s.strip() for s in self.directives.get("setup", "").split(",") if s.strip()]

    def replacements(self) -> list[tuple[str, str]]:
        pairs = [p for p in self.directives.get("small", "").split(" ; ") if p.strip()]
        return [tuple(p.strip().split(" -> ", 1)) for p in pairs]  # type: ignore[misc]

    def runnable_code(self) -> str:
        code = self.code
        for old, new in self.replacements():
            assert old in code, f"{self.where}: small setting {old!r} is not in the block"
            code = code.replace(old, new)
        return code


def directives_before(text: str) -> dict[str, str]:
    """The ``<!-- kind: value -->`` comments at the end of ``text`` (only whitespace after and between them)."""
    found: dict[str, str] = {}
    rest = text.rstrip()
    while rest.endswith("-->"):
        start = rest.rfind("<!--")
        comment = rest[start + 4 : -3].strip()
        kind, _, value = comment.partition(":")
        assert kind.strip() in KINDS, f"unknown directive <!-- {comment} -->"
        assert kind.strip() not in found, f"directive {kind.strip()} given twice"
        found[kind.strip()] = " ".join(value.split())
        rest = rest[:start].rstrip()
    return found


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for m in re.finditer(r"^```python\n(.*?)^```[ \t]*$", text, re.M | re.S):
        line = text.count("\n", 0, m.start()) + 1
        found.append(Block(page, line, m.group(1), directives_before(text[: m.start()])))
    return found


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]
RUN_PAGES = [p for p in PAGES if any(b.runs_here() for b in blocks(p))]


def test_every_python_block_runs_or_says_why():
    """Each block is run here (with the setups it names, which exist), run by a named test that reads its page, or
    marked not runnable with a reason."""
    from docs_setups import SETUPS

    assert len(ALL_BLOCKS) > 40
    for b in ALL_BLOCKS:
        assert not ("not-run" in b.directives and "tested-by" in b.directives), b.where
        if "not-run" in b.directives:
            assert len(b.directives["not-run"]) > 10, f"{b.where}: say why it cannot run"
        if "tested-by" in b.directives:
            test = ROOT / b.directives["tested-by"]
            assert test.is_file(), f"{b.where}: no {test}"
            assert str(b.page.relative_to(ROOT)) in test.read_text(), f"{b.where}: {test.name} does not read this page"
        assert set(b.setups()) <= set(SETUPS), f"{b.where}: unknown setup {set(b.setups()) - set(SETUPS)}"
        b.runnable_code()  # each small setting applies


def test_the_directives_are_read_as_written():
    text = "x\n<!-- setup: a, b -->\n\n<!-- small: epochs=90 -> epochs=1 ; x -> y -->\n"
    assert directives_before(text) == {"setup": "a, b", "small": "epochs=90 -> epochs=1 ; x -> y"}
    assert directives_before("text <!-- not-run: why --> more\n") == {}
    b = Block(ROOT / "README.md", 1, "run(epochs=90, x)\n", directives_before(text))
    assert b.setups() == ["a", "b"] and b.runnable_code() == "run(epochs=1, y)\n"
    with pytest.raises(AssertionError, match="unknown directive"):
        directives_before("<!-- sutep: a -->")


def test_every_block_compiles_and_uses_only_public_names():
    import composetrain as ct

    for b in ALL_BLOCKS:
        compile(b.code, b.where, "exec")
        used = set(re.findall(r"\bct\.([A-Za-z_]\w*)", b.code))
        assert used <= set(ct.__all__), f"{b.where} uses {sorted(used - set(ct.__all__))}"


@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUN_PAGES])
def test_the_pages_code_runs(page, tmp_path, monkeypatch):
    """The page's blocks, in order, in one namespace, in a fresh working folder."""
    import warnings

    from docs_setups import SETUPS, Env

    monkeypatch.chdir(tmp_path)
    env = Env(tmp_path, monkeypatch)
    namespace: dict = {"__name__": "docs_page"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the pages' small settings draw warnings (short schedules, tiny batches)
        for b in blocks(page):
            if not b.runs_here():
                continue
            for name in b.setups():
                namespace.update(SETUPS[name](env))
            exec(compile(b.runnable_code(), b.where, "exec"), namespace)


# -- the API reference -----------------------------------------------------------------------------------------------


def reference_entries(pages: list[Path]) -> list[str]:
    return [n for p in pages for n in re.findall(r"^::: composetrain\.(\w+)$", p.read_text(), re.M)]


def undocumented(names: list[str], entries: list[str]) -> list[str]:
    """Public names without exactly one ``::: composetrain.NAME`` entry, and entries that are not public names."""
    problems = [f"{n}: {entries.count(n)} entries in docs/api" for n in names if entries.count(n) != 1]
    return problems + [f"{n}: documented, but not in composetrain.__all__" for n in sorted(set(entries) - set(names))]


def test_every_public_name_has_its_entry_in_the_api_reference():
    import composetrain as ct

    assert undocumented(ct.__all__, reference_entries(sorted((DOCS / "api").glob("*.md")))) == []


def test_a_public_name_added_without_its_entry_is_found():
    import composetrain as ct

    entries = reference_entries(sorted((DOCS / "api").glob("*.md")))
    assert undocumented([*ct.__all__, "added"], entries) == ["added: 0 entries in docs/api"]
    assert undocumented([n for n in ct.__all__ if n != "run"], entries) == [
        "run: documented, but not in composetrain.__all__"
    ]


def test_the_api_table_lists_every_public_name_once():
    import composetrain as ct

    listed = re.findall(r"^\| \[`([A-Za-z_]\w*)", (DOCS / "api" / "index.md").read_text(), re.M)
    assert sorted(listed) == sorted(ct.__all__)


def test_the_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: no broken link or anchor, no page left out of the navigation, no reference entry that
    does not resolve, no docstring warning. Needs the [docs] extra (CI installs it)."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(module, reason=f"{module} is not installed: pip install -e '.[docs]'")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")]
    start = time.monotonic()
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "api" / "transforms" / "index.html").is_file()
    print(f"mkdocs build --strict: {time.monotonic() - start:.1f} s")


# -- the README ------------------------------------------------------------------------------------------------------


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def links(page: Path) -> list[tuple[Path, str]]:
    """The Markdown pages (and anchors) that ``page`` links to."""
    found = []
    for target in re.findall(r"\]\(([^)\s]+\.md(?:#[\w-]+)?)\)", page.read_text()):
        path, _, anchor = target.partition("#")
        found.append(((page.parent / path).resolve(), anchor))
    return found


def section(page: Path, anchor: str) -> str:
    """The text of the section ``anchor`` names (the whole page without one)."""
    text = page.read_text()
    if not anchor:
        return text
    for m in re.finditer(r"^(#+) (.+)$", text, re.M):
        slug = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", m.group(2)).strip().lower())
        if slug == anchor:
            end = re.search(rf"^#{{1,{len(m.group(1))}}} ", text[m.end() :], re.M)
            return text[m.start() : m.end() + end.start() if end else None]
    raise AssertionError(f"{page}: no section #{anchor}")


def within_two_clicks(question) -> list[str]:
    """The pages (and sections) reached from the README in at most two clicks whose text (its lines joined) answers."""

    def answer(text: str) -> bool:
        return question(" ".join(text.split()))

    readme = ROOT / "README.md"
    found = ["README.md (no click)"] if answer(readme.read_text()) else []
    for page, anchor in links(readme):
        if answer(section(page, anchor)):
            found.append(f"{page.relative_to(ROOT)}#{anchor} (one click)")
        for second, anchor2 in links(page):
            if second.is_relative_to(DOCS) and answer(section(second, anchor2)):
                found.append(f"{second.relative_to(ROOT)}#{anchor2} (two clicks)")
    return found


@pytest.mark.parametrize(
    ("question", "answer"),
    [
        (
            "resume on another number of processes",
            lambda t: (
                "global_batch_size" in t
                and "a requeued job that gets 3 nodes instead of 4 continues where it stopped" in t
            ),
        ),
        (
            "why did my cache rebuild",
            lambda t: "## Why did my cache rebuild?" in t and "rebuild=True" in t and "starts over" in t,
        ),
        (
            "which order do transforms go in",
            lambda t: "| from the outside in | transform | not with |" in t and "`mixed_precision`" in t,
        ),
    ],
)
def test_the_readme_answers_the_three_questions_within_two_clicks(question, answer):
    assert within_two_clicks(answer), f"{question}: no page within two clicks of the README answers it"


def test_the_readme_links_into_the_docs_resolve():
    for page, anchor in links(ROOT / "README.md"):
        assert page.is_file(), page
        section(page, anchor)


# -- facts the pages state about the code ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "module", "call"), [("to_wandb", "wandb", "log"), ("to_mlflow", "mlflow", "log_metrics")]
)
def test_the_tracker_recipes_log_every_value_of_a_record_eval_ema_too(name, module, call):
    """The W&B and MLflow recipes' functions, run on ct.run's records (a fake tracker module records what they log):
    an evaluation of ct.ema's weights ("eval_ema") is logged beside "eval", and a log record's numbers."""
    import types

    source = re.search(rf"(def {name}\(record\):\n(?:    .*\n)+)", (DOCS / "driver" / "trackers.md").read_text()).group(
        1
    )
    logged = []
    fake = types.SimpleNamespace(**{call: lambda values, step: logged.append((step, values))})
    namespace = {module: fake}
    exec(compile(source, f"docs/driver/trackers.md {name}", "exec"), namespace)
    namespace[name]({"step": 4, "epoch": 1, "eval": {"acc": 0.5}, "eval_ema": {"acc": 0.625}})
    namespace[name]({"step": 4, "epoch": 1, "loss": 0.25, "lr": 0.1, "skipped": 0})
    assert logged[0] == (4, {"eval/acc": 0.5, "eval_ema/acc": 0.625})
    assert logged[1][0] == 4 and {"train/loss": 0.25, "train/lr": 0.1}.items() <= logged[1][1].items()


PACKAGE = ROOT / "src" / "composetrain"


def code_layout() -> str:
    """docs/code-layout.md's "Code layout" paragraph, to the end of the page."""
    text = (DOCS / "code-layout.md").read_text()
    return text[text.index("**Code layout.**") :]


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
        f"{path}: no line in the code layout"
        for path in sorted(files - named)
        if not path.endswith("__init__.py") or "/" not in path
    ]
    found += [f"{path}: named in the code layout, but no such module" for path in sorted(named - files)]
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
        "driver/added.py: no line in the code layout"
    ]
    assert layout_problems(code_layout(), files - {"transforms/clip.py"}) == [
        "transforms/clip.py: named in the code layout, but no such module"
    ]
    assert layout_problems(code_layout(), files | {"added.py"}) == ["added.py: no line in the code layout"]


def api_table_problems(text: str) -> list[str]:
    """What the API table's signatures (``name(a, *, b=1, ...)``) and the code's disagree on: an argument the
    function lacks, a default other than the code's, a keyword-only argument shown positional (or the reverse), a
    required argument left out."""
    import inspect

    import composetrain as ct

    problems = []
    for name, shown in re.findall(r"^\| \[`(\w+)\((.*?)\)`\]", text, re.M):
        params = inspect.signature(getattr(ct, name)).parameters
        varargs = any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values())
        keyword_only, listed = False, set()
        for arg in (a.strip() for a in re.split(r",\s*(?![^()]*\))", shown)):
            if arg in ("*", "..."):
                keyword_only = keyword_only or arg == "*"
                continue
            arg_name, given, default = arg.lstrip("*").partition("=")
            p = params.get(arg_name)
            if p is None:
                if not varargs:  # compose(f, g, h): names of *transforms
                    problems.append(f"{name}: no argument {arg_name} (it has {', '.join(params)})")
                continue
            listed.add(arg_name)
            if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and keyword_only != (p.kind is p.KEYWORD_ONLY):
                problems.append(f"{name}: {arg_name} is {p.kind.description}")
            if given and eval(default, {"torch": __import__("torch")}) != p.default:
                problems.append(f"{name}: {arg_name}={default}, but its default is {p.default!r}")
        problems += [
            f"{name}: required argument {n} left out"
            for n, p in params.items()
            if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in listed
        ]
    return problems


def test_the_api_tables_signatures_are_the_codes():
    assert api_table_problems((DOCS / "api" / "index.md").read_text()) == []


def test_a_signature_that_differs_from_the_code_is_found():
    assert api_table_problems("| [`load_checkpoint(state, folder)`][x] | ... |\n") == [
        "load_checkpoint: no argument folder (it has state, checkpoint)",
        "load_checkpoint: required argument checkpoint left out",
    ]
    assert api_table_problems("| [`ema(decay, every=2)`][x] | ... |\n") == [
        "ema: every is keyword-only",
        "ema: every=2, but its default is 1",
    ]


def test_the_checkpoint_defaults_the_pages_and_the_docstring_state_are_the_codes():
    """Every 10 minutes, in the background: what ``CheckpointOptions`` resolves a run with a folder to."""
    import composetrain as ct
    from composetrain.driver.options import ASYNC_DEFAULT, DEFAULT_INTERVAL, CheckpointOptions

    options = CheckpointOptions(checkpoint_dir="runs/a")
    assert (options.checkpoint_every, options.checkpoint_async) == (DEFAULT_INTERVAL, ASYNC_DEFAULT) == ("10min", True)
    docstring = " ".join(ct.run.__doc__.split())
    assert "checkpoint_async: write saves in the background (default True with a checkpoint_dir;" in docstring
    assert "Default: every 10 minutes" in docstring
    for page in ("driver/run.md", "api/index.md"):
        text = (DOCS / page).read_text()
        assert "(default every 10 minutes), `checkpoint_async` (default True:" in text, page
    checkpoints = " ".join((DOCS / "driver" / "checkpoints.md").read_text().split())
    assert "saves **every 10 minutes**" in checkpoints and "(`checkpoint_async=True`, the default;" in checkpoints


def test_no_page_keeps_a_template_placeholder():
    """A ``{NAME}`` left by the pages' generation (docs/driver/evaluation.md showed "{SNIPPETS}" to readers)."""
    left = [f"{p.relative_to(ROOT)}: {m}" for p in PAGES for m in re.findall(r"\{[A-Z][A-Z_]{2,}\}", p.read_text())]
    assert left == []
