"""Checkpoints: the save protocol (every file and folder fsynced, then one rename makes it a checkpoint)
and which checkpoint latest() picks after a save was interrupted at any point.

Observed through the system calls and the files, never the module's private functions: os.fsync,
os.replace and os.rename are wrapped in the ``os`` module that composetrain.checkpoint.files uses (pathlib
and shutil call the same ones), and torch.save stands for the writes.
"""

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Any

import pytest
import run_script
import torch

import composetrain as ct
import composetrain.checkpoint.files as checkpoint

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc to name synced files")


@dataclasses.dataclass
class Call:
    kind: str  # "write", "fsync", "rename", "mkdir"
    path: Path  # the file or folder written, synced or created; a rename's source
    dst: Path | None = None  # a rename's destination
    size: int | None = None  # a synced file's size when it was synced
    steps: frozenset[str] = frozenset()  # the step-* folders that existed at that moment


class Syscalls:
    """The calls a save makes, in order; ``fail_at = k`` makes the k-th one (1-based) raise, as a full
    disk or a failing device would, and a failing write leaves a partly written file behind."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
        self.root, self.calls, self.fail_at = root, [], None
        real = {name: getattr(checkpoint.os, name) for name in ("fsync", "fdatasync", "replace", "rename", "mkdir")}
        real_save = torch.save

        def fsync(fd, real=real["fsync"]):
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
            self._record("fsync", path, size=None if path.is_dir() else os.fstat(fd).st_size)
            return real(fd)

        def rename(src, dst, *args, real=real["rename"], **kwargs):
            self._record("rename", Path(src).resolve(), dst=Path(dst).resolve())
            return real(src, dst, *args, **kwargs)

        def mkdir(path, *args, real=real["mkdir"], **kwargs):
            self._record("mkdir", Path(path).resolve(), counted=False)
            return real(path, *args, **kwargs)

        def save(obj, f, *args, **kwargs):
            target = Path(f.name if hasattr(f, "name") else f).resolve()
            if self.root in target.parents:
                try:
                    self._record("write", target)
                except OSError:
                    if hasattr(f, "write"):
                        f.write(b"PK\x03\x04 half a file")
                    raise
            return real_save(obj, f, *args, **kwargs)

        monkeypatch.setattr(checkpoint.os, "fsync", fsync)
        monkeypatch.setattr(checkpoint.os, "fdatasync", lambda fd: fsync(fd, real["fdatasync"]))
        monkeypatch.setattr(checkpoint.os, "replace", lambda s, d, **k: rename(s, d, real=real["replace"], **k))
        monkeypatch.setattr(checkpoint.os, "rename", rename)
        monkeypatch.setattr(checkpoint.os, "mkdir", mkdir)
        monkeypatch.setattr(torch, "save", save)

    def _record(self, kind: str, path: Path, *, counted: bool = True, **fields: Any) -> None:
        steps = frozenset(p.name for p in self.root.glob("step-*"))
        self.calls.append(Call(kind, path, steps=steps, **fields))
        if counted and self.fail_at is not None and sum(c.kind != "mkdir" for c in self.calls) == self.fail_at:
            raise OSError(28, f"simulated failure at {kind} {path.name}")


def train(directory: Path, **options: Any) -> ct.TrainState:
    return run_script.train(directory, **options)[0]


def latest(directory: Path) -> Path | None:
    """The checkpoint a resumed run would load, chosen without any warning (nothing to skip)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        found = checkpoint.Checkpoints(directory, rank=0, world_size=1, keep=2).latest()
    return None if found is None else found[0]


@pytest.mark.parametrize("background", [True, False])  # step 3 written by a writer thread, or by the training's
def test_every_file_and_folder_is_fsynced_before_one_rename_creates_the_checkpoint(tmp_path, monkeypatch, background):
    root = tmp_path.resolve() / "run"
    syscalls = Syscalls(monkeypatch, root)
    train(root, max_steps=6, checkpoint_every=3, checkpoint_async=background)
    monkeypatch.undo()
    calls = syscalls.calls
    finals = sorted(root.glob("step-*"))
    assert [p.name for p in finals] == ["step-000000003", "step-000000006"]
    for final in finals:
        assert not any(c.kind == "mkdir" and c.path == final for c in calls), f"{final.name} was created in place"
        renames = [i for i, c in enumerate(calls) if c.kind == "rename" and c.dst == final]
        assert len(renames) == 1, f"{final.name} must appear through exactly one rename, got {len(renames)}"
        at = renames[0]
        temporary = calls[at].path
        assert temporary.parent == root and temporary.name != final.name  # same folder: an atomic rename
        before = calls[:at]
        assert all(final.name not in c.steps for c in [*before, calls[at]]), f"{final.name} existed before its rename"
        synced = {c.path: i for i, c in enumerate(before) if c.kind == "fsync"}
        files = sorted(p.name for p in final.iterdir())
        assert {"state.pt", "rank-0.pt"} <= set(files)
        for name in files:
            shown = sorted(str(p.relative_to(root)) for p in synced)
            assert temporary / name in synced, f"{name} was not fsynced before the rename, only {shown}"
            assert calls[synced[temporary / name]].size == (final / name).stat().st_size, f"{name}: synced too early"
        assert temporary in synced, "the temporary folder (its entries) was not fsynced before the rename"
        assert synced[temporary] > max(synced[temporary / name] for name in files)
        assert any(c.kind == "fsync" and c.path == root for c in calls[at + 1 :]), "the rename was not made durable"


def test_a_save_interrupted_at_any_point_is_never_chosen_and_never_visible(tmp_path, monkeypatch):
    root = tmp_path.resolve() / "run"
    train(root, max_steps=3)  # the checkpoint to fall back on
    assert latest(root) == root / "step-000000003"
    final = root / "step-000000006"
    failed_at = set()
    for k in range(1, 20):  # fail the save of step 6 at its 1st, 2nd, ... call, up to the rename itself
        syscalls = Syscalls(monkeypatch, root)
        syscalls.fail_at = k
        with pytest.raises(OSError, match="simulated failure"):
            train(root, max_steps=6)
        monkeypatch.undo()
        failed = [c for c in syscalls.calls if c.kind != "mkdir"][k - 1]
        failed_at.add(failed.kind)
        assert not final.exists(), f"failing at {failed.kind} {failed.path.name} left {final.name} behind"
        assert latest(root) == root / "step-000000003", f"after failing at {failed.kind} {failed.path.name}"
        if failed.kind == "rename" and failed.dst == final:
            break
    else:
        pytest.fail("no rename ever created step-000000006")
    assert failed_at == {"write", "fsync", "rename"}  # every kind of call failed once at least
    train(root, max_steps=6)  # and an uninterrupted save goes through
    assert latest(root) == final
