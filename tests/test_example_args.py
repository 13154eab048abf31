"""The examples refuse arguments they cannot train with as usage errors (exit code 2, one line naming the
option), before any data is read or any torch error can surface."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def load(name):
    for module in ("sklearn", "torchvision", "einops"):
        pytest.importorskip(module)
    if str(EXAMPLES) not in sys.path:  # as when run as a script: examples/cli.py sits beside it
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("name", "args", "said"),
    [
        ("language_model", ["--samples", "0"], r"--samples: must be at least 1, got 0"),
        ("language_model", ["--batch-size", "0"], r"--batch-size: must be at least 1, got 0"),
        ("language_model", ["--width", "3"], r"--width: must be at least 4, got 3"),
        ("language_model", ["--width", "30"], r"--width 30 must be a multiple of the 4 attention heads"),
        ("language_model", ["--context", "1"], r"--context: must be at least 4, got 1"),
        ("language_model", ["--context", "100000"], r"--context 100000 is longer than the held-out text allows"),
        ("language_model", ["--accumulate", "two"], r"--accumulate: 'two' is not an integer"),
        ("image_classifier", ["--width", "3"], r"--width: must be at least 8, got 3"),
        ("image_classifier", ["--width", "12"], r"--width 12 must be a multiple of 8"),
        ("image_classifier", ["--batch-size", "0"], r"--batch-size: must be at least 1, got 0"),
        ("image_classifier", ["--epochs", "-1"], r"--epochs: must be at least 1, got -1"),
        ("cached_images", ["--workers", "-1"], r"--workers: must be at least 0, got -1"),
        ("cached_images", ["--workers", "many"], r"--workers: 'many' is not an integer"),
        ("cached_images", ["--size", "0"], r"--size: must be at least 1, got 0"),
        ("pretrain_tokens", ["--seq-len", "4"], r"--seq-len: must be at least 8, got 4"),
        ("pretrain_tokens", ["--width", "30"], r"--width 30 must be a multiple of the 4 attention heads"),
        ("pretrain_tokens", ["--batch-size", "0"], r"--batch-size: must be at least 1, got 0"),
        ("run_digits", ["--batch-size", "0"], r"--batch-size: must be at least 1, got 0"),
        ("run_digits", ["--accumulate", "0"], r"--accumulate: must be at least 1, got 0"),
        ("train_digits", ["--batch-size", "0"], r"--batch-size: must be at least 1, got 0"),
        ("train_digits", ["--batch-size", "5000"], r"--batch-size 5000 is more than the 1437 training images"),
    ],
)
def test_a_bad_argument_is_a_usage_error(name, args, said, monkeypatch, capsys, tmp_path):
    module = load(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *args])  # run_digits and train_digits read sys.argv
    monkeypatch.chdir(tmp_path)  # nothing written where the tests run, should a check be missing
    with pytest.raises(SystemExit) as stopped:
        module.main(*([args] if name in ("language_model", "image_classifier", "pretrain_tokens") else []))
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "error: " in err.splitlines()[-1] and "Traceback" not in err
    assert re.search(said, err.splitlines()[-1]), err


# -- train_digits' float options --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--lr", "nan"], r"--lr: must be a positive finite number, got 'nan'"),
        (["--lr", "inf"], r"--lr: must be a positive finite number, got 'inf'"),
        (["--lr", "-1"], r"--lr: must be a positive finite number, got '-1'"),
        (["--lr", "0"], r"--lr: must be a positive finite number, got '0'"),
        (["--lr", "fast"], r"--lr: must be a positive finite number, got 'fast'"),
        (["--clip", "-1"], r"--clip: must be a positive finite number, got '-1'"),
        (["--clip", "nan"], r"--clip: must be a positive finite number, got 'nan'"),
        (["--seed", "-1"], r"--seed: must be at least 0, got -1"),
        (["--seed", str(2**64)], r"--seed: must be below 2\*\*63, got 18446744073709551616"),
    ],
)
def test_a_bad_number_is_a_usage_error(args, said, monkeypatch, capsys, tmp_path):
    module = load("train_digits")
    monkeypatch.setattr(sys, "argv", ["train_digits.py", *args])
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and re.search(said, err.splitlines()[-1]), err
