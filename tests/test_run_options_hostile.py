"""ct.run's options under hostile input, through a real ct.run: a log_file of the wrong kind, or one that
cannot be a file, and a DataLoader given with a batch_size or num_workers of the wrong kind or that says
otherwise, are refused naming run, the argument, what arrived and the fix, before any folder is made
and with the state unchanged; what is accepted trains as a plain PyTorch loop, bit for bit in float64."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import composetrain as ct

X = torch.randn(12, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
Y = torch.randn(12, 1, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
DATA = TensorDataset(X, Y)


def step(model, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(model(x), y)


def fresh():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1).double()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def refused(tmp_path, data, error, *fragments, **options):
    """ct.run refuses with ``error`` naming every fragment; nothing new under tmp_path, the state unchanged."""
    before = set(tmp_path.rglob("*"))
    model, opt = fresh()
    weights = copy.deepcopy(model.state_dict())
    state = ct.TrainState(model, opt)
    with pytest.raises(error) as caught:
        ct.run(step, state, data, progress=False, **options)
    message = str(caught.value)
    assert message.startswith("run: "), message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert set(tmp_path.rglob("*")) == before, sorted(map(str, set(tmp_path.rglob("*")) - before))
    assert state.step == 0 and not opt.state
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "f"
    path.write_text("x")
    return path


@pytest.mark.parametrize(
    ("log_file", "error", "shown"),
    [
        (b"m.jsonl", TypeError, "b'm.jsonl' (bytes)"),
        (123, TypeError, "123 (int)"),
        (True, TypeError, "True (bool)"),
        ("", ValueError, "'' (str)"),
        (0, TypeError, "0 (int)"),
    ],
)
def test_log_file_of_a_wrong_kind_is_refused_by_run(tmp_path, log_file, error, shown):
    refused(
        tmp_path,
        DATA,
        error,
        "log_file",
        shown,
        "log_file='runs/a/metrics.jsonl'",
        batch_size=4,
        num_workers=0,
        log_file=log_file,
        checkpoint_dir=tmp_path / "ck",
    )


def test_log_file_that_is_a_folder_is_refused_before_the_checkpoint_folder_is_made(tmp_path):
    folder = tmp_path / "dd"
    folder.mkdir()
    refused(
        tmp_path,
        DATA,
        PermissionError,
        "log_file",
        str(folder),
        "is a folder",
        batch_size=4,
        num_workers=0,
        log_file=folder,
        checkpoint_dir=tmp_path / "ck",
    )


def test_log_file_inside_a_file_is_refused_before_the_checkpoint_folder_is_made(tmp_path):
    inside = a_file(tmp_path) / "m.jsonl"
    refused(
        tmp_path,
        DATA,
        PermissionError,
        "log_file",
        str(inside),
        "a file, not a folder",
        batch_size=4,
        num_workers=0,
        log_file=inside,
        checkpoint_dir=tmp_path / "ck",
    )


@pytest.mark.parametrize(
    ("batch_size", "error", "shown"),
    [
        (True, TypeError, "True (bool)"),
        ("4", TypeError, "'4' (str)"),
        (4.0, TypeError, "4.0 (float)"),
        (-4, ValueError, "-4 (int)"),
        (torch.tensor(4), TypeError, "(Tensor)"),
    ],
)
def test_batch_size_of_a_wrong_kind_with_a_dataloader_is_refused_as_such(tmp_path, batch_size, error, shown):
    loader = DataLoader(DATA, batch_size=4 if batch_size is not True else 1)
    refused(tmp_path, loader, error, "batch_size must be a positive int", shown, "e.g.", batch_size=batch_size)


def test_batch_size_against_a_dataloader_without_one_says_so(tmp_path):
    loader = DataLoader(list(DataLoader(DATA, batch_size=4)), batch_size=None)
    refused(tmp_path, loader, ValueError, "batch_size=4", "batch_size=None", "leave it out", batch_size=4)


@pytest.mark.parametrize(("num_workers", "error"), [(2, ValueError), ("many", TypeError), (-1, ValueError)])
def test_num_workers_that_contradicts_a_dataloader_is_refused_never_ignored(tmp_path, num_workers, error):
    refused(tmp_path, DataLoader(DATA, batch_size=4), error, "num_workers", repr(num_workers), num_workers=num_workers)


def test_accepted_numpy_options_with_a_dataloader_train_as_a_plain_loop(tmp_path):
    loader = DataLoader(DATA, batch_size=4)
    model, opt = fresh()
    state = ct.TrainState(model, opt)
    ct.run(
        step,
        state,
        loader,
        batch_size=np.int64(4),
        num_workers=np.int64(0),
        shuffle=False,
        epochs=np.int32(2),
        log_file=tmp_path / "m.jsonl",
        progress=False,
    )
    reference, ref_opt = fresh()
    for _ in range(2):
        for batch in DataLoader(DATA, batch_size=4):
            ref_opt.zero_grad()
            step(reference, batch).backward()
            ref_opt.step()
    assert state.step == 6
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), reference.parameters(), strict=True))


@pytest.mark.parametrize("name", ["checkpoint_dir", "log_file", "tensorboard"])
def test_a_path_with_a_nul_byte_is_refused_naming_run_and_the_argument(tmp_path, name):
    refused(tmp_path, DATA, ValueError, name, "null", batch_size=4, num_workers=0, **{name: str(tmp_path / "a\0b")})


@pytest.mark.parametrize(
    ("log_file", "checkpoint_dir", "tensorboard", "named"),
    [
        ("ck", "ck", False, "log_file"),
        ("m", "m/ck", False, "log_file"),
        ("m", None, "m", "tensorboard"),
        ("m", None, "m/tb", "tensorboard"),
    ],
)
def test_paths_that_collide_are_refused_before_anything_is_made(tmp_path, log_file, checkpoint_dir, tensorboard, named):
    refused(
        tmp_path,
        DATA,
        ValueError,
        named,
        "e.g.",
        batch_size=4,
        num_workers=0,
        log_file=tmp_path / log_file,
        tensorboard=tensorboard and tmp_path / tensorboard,
        checkpoint_dir=checkpoint_dir and tmp_path / checkpoint_dir,
    )


class BytesPath:
    def __fspath__(self):
        return b"runs/a"


@pytest.mark.parametrize("name", ["checkpoint_dir", "log_file", "tensorboard"])
def test_a_pathlike_of_bytes_is_refused_naming_run_and_the_argument(tmp_path, name):
    refused(tmp_path, DATA, TypeError, name, "BytesPath", "e.g.", batch_size=4, num_workers=0, **{name: BytesPath()})
