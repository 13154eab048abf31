"""A sharded checkpoint's files: every shard file and the metadata fsynced before the folder is renamed
into place, a full disk raised as an ordinary error with its cause, and metadata that points outside
its folder refused. One process with a process group of one: FSDP2 gives it DTensors, DCP writes them."""

import errno
import json
import os
import pickle
import threading
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from test_checkpoint import Syscalls
from torch import nn

import composetrain as ct
from composetrain.checkpoint import checksums
from composetrain.checkpoint import files as checkpoint
from composetrain.checkpoint.shards import ShardFiles

pytestmark = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads /proc to name synced files")


@pytest.fixture(scope="module")
def group(tmp_path_factory):
    assert not dist.is_initialized()
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def sharded_state():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)).double()
    fully_shard(model, mesh=init_device_mesh("cpu", (1,)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4, dtype=torch.float64)).sum().backward()
    optimizer.step()
    state = ct.TrainState(model, optimizer)
    state.step = 1
    return state


def save(root, state):
    found = checkpoint.Checkpoints(root, rank=0, world_size=1, keep=2, shards=ShardFiles(state))
    payload = {
        "state": state.state_dict(),
        "settings": {"updates_per_epoch": 4},
        "epoch": 0,
        "position": 1,
        "history": [],
        "evals": [],
    }
    local = {"window": [], "order": None, "generators": []}
    try:
        return found.save(state.step, payload, local)
    finally:
        found.close()


def test_shard_files_and_metadata_are_fsynced_before_the_rename(group, tmp_path, monkeypatch):
    root = tmp_path.resolve() / "run"
    state = sharded_state()
    real_save = torch.save
    syscalls = Syscalls(monkeypatch, root)
    monkeypatch.setattr(torch, "save", real_save)  # DCP writes into its own streams: the fsyncs tell enough
    final = save(root, state)
    monkeypatch.undo()
    calls = syscalls.calls
    (at,) = [i for i, c in enumerate(calls) if c.kind == "rename" and c.dst == final]
    temporary = calls[at].path
    shards = temporary / "shards"
    files = sorted(p.name for p in (final / "shards").iterdir())
    assert ".metadata" in files and any(name.endswith(".distcp") for name in files), files
    synced = {}
    for i, c in enumerate(calls[:at]):
        if c.kind == "fsync":
            synced[c.path] = (i, c.size)
    renamed = {c.dst: (i, c.path) for i, c in enumerate(calls[:at]) if c.kind == "rename"}
    last = []
    for name in files:
        path = shards / name
        if path in renamed:  # written under another name, then renamed (DCP's .metadata)
            i, source = renamed[path]
            assert source in synced and synced[source][0] < i, f"{name} was renamed before it was fsynced"
            path = source
        assert path in synced, f"{name} was not fsynced before the checkpoint's rename"
        assert synced[path][1] == (final / "shards" / name).stat().st_size, f"{name} was fsynced too early"
        last.append(renamed.get(shards / name, synced[path])[0])
    assert shards in synced and synced[shards][0] > max(last), "shards/ was not fsynced after its files"
    assert temporary in synced and synced[temporary][0] > synced[shards][0]


def test_a_full_disk_during_a_sharded_save_is_an_ordinary_error_with_its_cause(group, tmp_path, monkeypatch):
    root = tmp_path / "run"
    state = sharded_state()
    real = os.fsync

    def full(fd):
        if "shards" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(fd)

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match=r"run: no space left .* checkpoint step 1 ") as caught:
        save(root, state)
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC
    assert not [p for p in root.iterdir() if "step" in p.name]


def test_shard_metadata_that_points_outside_its_folder_is_refused(group, tmp_path):
    state = sharded_state()
    final = save(tmp_path / "run", state)
    metadata = final / "shards" / ".metadata"
    loaded = pickle.loads(metadata.read_bytes())
    for info in loaded.storage_data.values():
        outside = final.parent / "outside.distcp"  # shards/../../ of the checkpoint: beside it
        os.replace(final / "shards" / info.relative_path, outside)
        info.relative_path = "../../outside.distcp"
        break
    metadata.write_bytes(pickle.dumps(loaded))
    with pytest.raises(ValueError, match=r"outside .*shards"):
        ct.load_checkpoint(sharded_state(), final)


@pytest.mark.parametrize("name", [".metadata", "data"])
def test_a_fifo_among_the_shards_is_never_opened(group, tmp_path, name):
    final = save(tmp_path / "run", sharded_state())
    shards = final / "shards"
    fifo = shards / ".metadata" if name == ".metadata" else next(shards.glob("*.distcp"))
    fifo.unlink()
    os.mkfifo(fifo)
    outcome = []

    def load():
        try:
            ct.load_checkpoint(sharded_state(), final)
        except ValueError as e:
            outcome.append(str(e))

    loading = threading.Thread(target=load, daemon=True)
    loading.start()
    loading.join(30)
    if loading.is_alive():  # opened the FIFO and waits for a writer: give it one, and fail
        with open(os.open(fifo, os.O_WRONLY), "wb"):
            pass
        loading.join(30)
        pytest.fail(f"load_checkpoint opened the FIFO {fifo.name} and waited for a writer")
    assert outcome and f"{fifo.name} is a FIFO, not a regular file" in outcome[0], outcome


def test_load_checkpoint_expands_the_home_folder(group, tmp_path, monkeypatch):
    state = sharded_state()
    save(tmp_path / "run", state)
    monkeypatch.setenv("HOME", str(tmp_path))
    other = sharded_state()
    with torch.no_grad():
        for p in other.model.parameters():
            p.zero_()
    ct.load_checkpoint(other, "~/run/step-000000001")
    for (k, a), b in zip(state.model.state_dict().items(), other.model.state_dict().values(), strict=True):
        assert torch.equal(a.full_tensor(), b.full_tensor()), k


def saved_with_a_flipped_shard(folder):
    """A sharded checkpoint saved into ``folder``, then one bit of the first layer's weight flipped in the shard file
    that holds it: (the checkpoint's folder, that file)."""
    state = sharded_state()
    final = save(folder, state)
    raw = state.model[0].weight.to_local().detach().contiguous().numpy().tobytes()
    (shard,) = [p for p in (final / "shards").glob("*.distcp") if raw in p.read_bytes()]
    data = bytearray(shard.read_bytes())
    data[data.find(raw)] ^= 1
    shard.write_bytes(bytes(data))
    return final, shard


def test_a_flipped_bit_in_a_shard_file_is_found_by_its_checksum(group, tmp_path):
    """DCP reads a shard file whose tensor bytes changed without a word; ct.run's checksum finds it, and the
    checkpoint is set aside as corrupt before DCP reads anything."""
    final, shard = saved_with_a_flipped_shard(tmp_path / "run")
    found = checkpoint.Checkpoints(tmp_path / "run", rank=0, world_size=1, keep=2, shards=ShardFiles(sharded_state()))
    try:
        with (
            pytest.warns(UserWarning, match=rf"skipping unreadable checkpoint .*: shards/{shard.name} does not match"),
            pytest.raises(RuntimeError, match=r"no checkpoint in .* could be read"),  # the only one: not started over
        ):
            found.latest()
    finally:
        found.close()
    assert [p.name for p in (tmp_path / "run").glob("corrupt-*")] == [f"corrupt-{final.name}"]


def _latest(root):
    found = checkpoint.Checkpoints(root, rank=0, world_size=1, keep=2, shards=ShardFiles(sharded_state()))
    try:
        return found.latest()
    finally:
        found.close()


def test_a_flipped_shard_file_whose_checksum_is_missing_from_the_list_is_corrupt_too(group, tmp_path):
    """The shard files checked are those in the folder, each needing its checksum (as state.pt does), not those the
    list names: a checksums.json that lost a shard's entry must not let that shard load unchecked."""
    final, shard = saved_with_a_flipped_shard(tmp_path / "run")
    sums = json.loads((final / "checksums.json").read_text())
    del sums["sha256"][f"shards/{shard.name}"]
    (final / "checksums.json").write_text(json.dumps(sums))
    with (
        pytest.warns(UserWarning, match=rf"shards/{shard.name} has no checksum"),
        pytest.raises(RuntimeError, match=r"no checkpoint in .* could be read"),
    ):
        _latest(tmp_path / "run")
    assert [p.name for p in (tmp_path / "run").glob("corrupt-*")] == [f"corrupt-{final.name}"]


def test_a_checksum_list_naming_files_outside_the_checkpoint_reads_none_of_them(group, tmp_path, monkeypatch):
    state = sharded_state()
    final = save(tmp_path / "run", state)
    secret = tmp_path / "secret"
    secret.write_text("not the checkpoint's")
    sums = json.loads((final / "checksums.json").read_text())
    sums["sha256"]["shards/../../../secret"] = checksums.digest(secret)  # even a true checksum
    (final / "checksums.json").write_text(json.dumps(sums))
    read = []
    original = checksums.digest
    monkeypatch.setattr(checksums, "digest", lambda p: (read.append(Path(p).resolve()), original(p))[1])
    loaded = _latest(tmp_path / "run")
    assert secret not in read and all(final in p.parents for p in read), read
    assert loaded is not None  # the checkpoint's own files are whole: it loads
    for a, b in zip(state.model.state_dict().values(), loaded[1]["state"]["model"].values(), strict=True):
        assert torch.equal(a.full_tensor(), b.full_tensor())
