"""The README's main job must keep working: it really trains."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_digits_example_trains_to_high_accuracy():
    pytest.importorskip("sklearn")
    out = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "train_digits.py"), "--epochs", "6"],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert out.startswith("accumulate(4)(step)")
    assert out.count("epoch ") == 6
    losses = [float(x) for x in re.findall(r"train loss (\d+\.\d+)", out)]
    assert losses[-1] < losses[0] / 4
    assert float(re.search(r"test accuracy (\d\.\d+)", out).group(1)) > 0.9
