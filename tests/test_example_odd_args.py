"""train_digits refuses a learning rate, clipping norm or seed it cannot train with as a usage error (exit code 2,
one line naming the option), as the examples do for their integer options; a NaN rate used to train to NaN."""

import re
import sys

import pytest
from test_example_args import load


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
