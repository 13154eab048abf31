"""The README's sharding example runs as written, as one script under torchrun: the trained model stays
usable after ct.run (full_state_dict, load_checkpoint), and the job still exits cleanly."""

import os
import sys
from pathlib import Path

import torch
from processes import Job, free_port

SCRIPT = str(Path(__file__).resolve().parent / "readme_shard_script.py")


def test_the_readme_sharding_example_runs_as_one_script(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node=2",
        f"--master-port={free_port()}",
        SCRIPT,
        str(tmp_path),
    ]
    with Job(command, env) as job:
        code, out = job.finish(300)
    assert code == 0, out[-6000:]  # both ranks ended cleanly: no hang, no abort in the group's teardown
    assert out.count("DONE") == 2 and "terminate called" not in out, out[-6000:]
    for r in range(2):  # the group ct.run kept was destroyed at exit, its threads with it
        assert (tmp_path / f"threads-at-exit-{r}.txt").read_text() in ("[]", "None"), r
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for r in ranks:
        assert r["steps"] == 2 and r["group_alive"] and r["sharded"] == ["DTensor"]
    assert ranks[1]["weights"] == {}  # rank 0 gets the whole state dict
    weights, gathered = ranks[0]["weights"], ranks[0]["gathered"]
    assert sorted(weights) == sorted(gathered)
    for name, p in gathered.items():
        assert torch.equal(weights[name], p), name
