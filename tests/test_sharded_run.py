"""ct.run with ct.sharded: DCP checkpoints (each rank its shards), exact resume, resharding on load."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers import Net, full, optimizer_state, process_group_threads
from processes import Job, Pool, free_port
from run_script import dataset, job_arguments, job_options, step, untimed
from torch import nn

import composetrain as ct

SCRIPT = str(Path(__file__).resolve())  # this file, as a script: its main block at the end


def torchrun(*args, nproc=2):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        command = [sys.executable, SCRIPT, *args]
    else:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nproc-per-node={nproc}",
            f"--master-port={free_port()}",
            SCRIPT,
            *args,
        ]
    with Job(command, env) as job:
        code, out = job.finish(300)
    assert code == 0, out[-6000:]


def result(path, rank):
    return torch.load(str(path).replace(".pt", f"-rank{rank}.pt"), weights_only=False)


def whole(parts):
    """A tensor from its Shard(0) pieces in rank order (as FSDP2 splits it)."""
    return torch.cat(parts) if parts[0].dim() else parts[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two ranks: straight for 2 epochs (a); stopped after 3 updates and resumed (b); one process (c)."""
    tmp = tmp_path_factory.mktemp("sharded-run")
    torchrun("--dir", str(tmp / "a"), "--out", str(tmp / "a.pt"), "--epochs", "2")
    torchrun("--dir", str(tmp / "b"), "--out", str(tmp / "b.pt"), "--max-steps", "3")
    torchrun("--dir", str(tmp / "b"), "--out", str(tmp / "b.pt"), "--epochs", "2")
    torchrun("--dir", str(tmp / "c"), "--out", str(tmp / "c.pt"), "--epochs", "2", nproc=1)
    return tmp


def test_each_rank_writes_its_own_shards_and_resuming_is_bit_identical(runs):
    final = sorted((runs / "a").glob("step-*"))[-1]
    assert sorted(p.name for p in (final / "shards").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for rank in range(2):
        a, b = result(runs / "a.pt", rank), result(runs / "b.pt", rank)
        assert a["step"] == b["step"] == 8  # 48 samples per rank, batches of 12, 2 epochs
        for name, p in a["params"].items():  # this rank's shards
            assert torch.equal(p, b["params"][name]), name
        for key, entries in a["optimizer"].items():
            for name, v in entries.items():
                assert torch.equal(v, b["optimizer"][key][name]), (key, name)
        assert untimed(a["history"]) == untimed(b["history"])


@pytest.mark.parametrize("run", ["a", "b"])  # b resumed from a DCP checkpoint
def test_the_group_outlives_the_run_and_release_then_destroy_leaves_no_thread(runs, run):
    # ct.run keeps the group it created for the sharded model (still usable after the run); released and
    # destroyed by hand, the group is gone with its threads although the state still holds its sharded model
    assert [result(runs / f"{run}.pt", rank)["kept"] for rank in range(2)] == [True, True]
    left = [result(runs / f"{run}.pt", rank)["threads_left"] for rank in range(2)]
    assert left in ([[], []], [None, None]), left


def test_a_checkpoint_of_two_ranks_loads_whole_into_one_process(runs):
    final = sorted((runs / "a").glob("step-*"))[-1]
    state = run_state()
    ct.load_checkpoint(state, final)
    shards = [result(runs / "a.pt", rank) for rank in range(2)]
    assert state.step == 8
    for name, p in state.model.named_parameters():
        assert type(p) is torch.nn.Parameter
        assert torch.equal(p.detach(), whole([s["params"][name] for s in shards])), name
    for key, entries in state.optimizer.state_dict()["state"].items():
        for name, v in entries.items():
            assert torch.equal(v, whole([s["optimizer"][key][name] for s in shards])), (key, name)


def test_a_checkpoint_of_one_process_loads_sharded_on_two_ranks(runs):
    final = sorted((runs / "c").glob("step-*"))[-1]
    alone = result(runs / "c.pt", 0)
    pool = Pool(2)
    try:
        loaded = pool.run(__name__, "load_on_ranks", str(final))
    finally:
        pool.close()
    for r in loaded:
        assert r["kinds"] == ["DTensor"] and r["step"] == alone["step"] == 16
        for name, p in alone["params"].items():
            assert torch.equal(r["params"][name], p), name
        for key, entries in alone["optimizer"].items():
            for name, v in entries.items():
                assert torch.equal(r["optimizer"][key][name], v), (key, name)
    consolidated = loaded[0]["consolidated"]  # ct.full_state_dict: whole tensors on rank 0 only
    assert loaded[1]["consolidated"] == {}
    assert {k: type(v) for k, v in consolidated.items()} == {k: torch.Tensor for k in alone["params"]}
    assert all(torch.equal(consolidated[k], alone["params"][k]) for k in alone["params"])


class _Planted:
    def __init__(self, target):
        self.target = target

    def __reduce__(self):  # unpickling this would run Path(target).touch()
        return (Path.touch, (Path(self.target),))


@pytest.mark.parametrize("where", ["metadata", "bytes entry"])
def test_loading_shards_runs_no_code(runs, tmp_path, where):
    """DCP itself unpickles .metadata with pickle.load, and non-tensor entries with weights_only=False."""
    import pickle
    import shutil

    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    final = sorted((runs / "a").glob("step-*"))[-1]
    copy = tmp_path / final.name
    shutil.copytree(final, copy)
    marker = tmp_path / "code-ran"
    metadata = copy / "shards" / ".metadata"
    if where == "metadata":
        metadata.write_bytes(pickle.dumps(_Planted(marker)))
    else:  # well-formed metadata that declares a model entry as bytes (read with torch.load(weights_only=False))
        meta = pickle.loads(metadata.read_bytes())
        meta.state_dict_metadata["state/model/inp.weight"] = BytesStorageMetadata()
        metadata.write_bytes(pickle.dumps(meta))
    with pytest.raises(ValueError, match=r"which is not DCP metadata|lists entries that are not tensors"):
        ct.load_checkpoint(run_state(), copy)
    assert not marker.exists()


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# A checkpoint loaded on the ranks.


def run_state() -> ct.TrainState:
    """run_script's data through a ModuleList of blocks (sharded's units) with dropout, AdamW and a StepLR."""
    torch.manual_seed(1)
    m = Net(
        6,
        16,
        2,
        output_layer="head",
        blocks=lambda: nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.2)) for _ in range(2)),
    ).double()
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    return ct.TrainState(m, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7))


def load_on_ranks(rank: int, world: int, checkpoint: str) -> dict[str, Any]:
    """A checkpoint of another number of ranks, loaded into a state sharded over these: whole tensors."""
    state = run_state()
    ct.apply_sharding(ct.sharded(step), state)
    ct.load_checkpoint(state, checkpoint)
    return {
        "params": {n: full(p) for n, p in state.model.named_parameters()},
        "optimizer": optimizer_state(state),
        "step": state.step,
        "kinds": sorted({type(p).__name__ for p in state.model.parameters()}),
        "consolidated": ct.full_state_dict(state.model),
    }


# -- the launched script: a sharded ct.run job, resumable, launchable by torchrun ---------------------------------
#
# python tests/test_sharded_run.py --dir CKPT --out OUT.pt [--epochs E] [--max-steps N]
# Each rank saves its local shards, its step and the gloo threads left after ct.run to OUT-rank<r>.pt.


def local(t):
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def main():
    args = job_arguments().parse_args()
    torch.set_num_threads(1)
    s = run_state()
    result = ct.run(ct.sharded(ct.clip_grad_norm(1.0)(ct.accumulate(2)(step))), s, dataset(), **job_options(args))
    rank = int(os.environ.get("RANK", "0"))
    kept = dist.is_initialized()  # ct.run leaves its group to the sharded model, until the process exits
    params = {n: local(p) for n, p in s.model.named_parameters()}
    if kept:  # ended early, as the README says: release the state's hold on it, then destroy it
        s.release_runtime()
        dist.destroy_process_group()
    torch.save(
        {
            "params": params,
            "kept": kept,
            "optimizer": {k: {n: local(v) for n, v in e.items()} for k, e in s.optimizer.state_dict()["state"].items()},
            "step": s.step,
            "history": result.history,
            "threads_left": process_group_threads(),
        },
        args.out.replace(".pt", f"-rank{rank}.pt"),
    )
    print("DONE", flush=True)


if __name__ == "__main__":
    sys.exit(main())
