"""The README's main job must keep working: it really trains."""

import re
import sys
from pathlib import Path

import launching
import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_digits(*args: str) -> str:
    pytest.importorskip("sklearn")
    command = [sys.executable, str(ROOT / "examples" / "train_digits.py"), "--epochs", "6", *args]
    return launching.run(command, timeout=300)


def test_digits_example_trains_to_high_accuracy():
    out = run_digits()
    assert out.startswith("mixed_precision(dtype='fp32')(accumulate(4)(step))")
    assert out.count("epoch ") == 6
    losses = [float(x) for x in re.findall(r"train loss (\d+\.\d+)", out)]
    assert losses[-1] < losses[0] / 4
    assert float(re.search(r"test accuracy (\d\.\d+)", out).group(1)) > 0.9


def test_the_run_example_trains_evaluates_and_resumes(tmp_path):
    pytest.importorskip("sklearn")
    command = [sys.executable, str(ROOT / "examples" / "run_digits.py"), "--checkpoint-dir", str(tmp_path)]
    first = launching.run([*command, "--epochs", "3"], timeout=300)
    assert first.count("test acc") == 3
    again = launching.run([*command, "--epochs", "6"], timeout=300)
    accuracies = [float(a) for a in re.findall(r"test acc (\d\.\d+)", again)]
    assert len(accuracies) == 6 and accuracies[-1] > 0.85  # the first three came from the checkpoint
    assert (tmp_path / "metrics.jsonl").exists()


def test_digits_example_trains_in_bf16_with_clipping():
    out = run_digits("--precision", "bf16", "--clip", "1.0")
    assert out.startswith("clip_grad_norm(1.0)(mixed_precision(dtype='bf16')(accumulate(4)(step)))")
    assert float(re.search(r"test accuracy (\d\.\d+)", out).group(1)) > 0.9
