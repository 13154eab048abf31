"""tools/rewrite_imports.py applies tools/moved_modules.txt: earlier names become today's, and today's stay."""

import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
tool = runpy.run_path(str(ROOT / "tools" / "rewrite_imports.py"))
MOVES = tool["load_map"]()


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("from composetrain.steps import train_step", "from composetrain.core.steps import train_step"),
        ("from composetrain.driver import checkpoint", "from composetrain.checkpoint import files as checkpoint"),
        ('patch("composetrain._util.show")', 'patch("composetrain.core.util.show")'),
        ("src/composetrain/state.py", "src/composetrain/core/state.py"),
    ],
)
def test_an_earlier_name_becomes_todays(old, new):
    assert tool["rewrite"](old, MOVES) == new


@pytest.mark.parametrize(
    "today",
    [
        "from composetrain.core.tokens import shifted_tokens",  # a module added to core/ after core.py moved
        "from composetrain.core.metric_names import metric_names",
        "from composetrain.core.protocol import TrainStep",
        "src/composetrain/core/state.py",
    ],
)
def test_a_module_of_todays_tree_is_left_as_it_is(today):
    assert tool["rewrite"](today, MOVES) == today


def test_every_name_moved_to_is_in_todays_tree():
    modules = tool["modules"]()
    assert [new for new in MOVES.values() if new not in modules and new.rpartition(".")[0] not in modules] == []


def test_no_module_moved_from_is_in_todays_tree():
    modules = tool["modules"]()
    assert {old for old in MOVES if old in modules} == {"composetrain.core"}  # core.py became the folder core/
