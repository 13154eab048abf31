"""An elastic torchrun job that shrinks: two "nodes" (torchrun agents of one process each, ``--nnodes=1:2``, c10d
rendezvous) train ``global_batch_size``'s job; one node dies whole (its agent and its worker, SIGKILL) inside an
update; the other agent restarts its worker in a group of one, which continues from the newest checkpoint (written
by two processes) and ends as the job run straight through on one process.
"""

import sys
import time
from pathlib import Path

import pytest
import torch
from elastic_runs import environment
from global_batch_workers import job
from processes import Job, free_port

SCRIPT = str(Path(__file__).resolve().parent / "global_batch_script.py")


def test_a_job_whose_node_dies_continues_on_the_nodes_left(tmp_path):
    out = tmp_path / "job"
    port = free_port()
    # the rendezvous store lives here, not in one agent (the killed one may host it): as elastic_runs does
    store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--max-restarts=1",
        "--monitor-interval=0.5",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=shrink",
        # both nodes join the first round (they start together); a round after a loss waits this long for it
        "--rdzv-conf=is_host=0,last_call_timeout=20",
        "--local-addr=127.0.0.1",
        SCRIPT,
        "--dir",
        str(out),
        "--out",
        f"{out}.pt",
        "--kill-node",
        "1:9",
        "--checkpoint-every",
        "2",
    ]
    agents = [Job(command, environment()) for _ in range(2)]
    try:
        deadline = time.monotonic() + 800
        while any(a.poll() is None for a in agents) and time.monotonic() < deadline:
            time.sleep(0.5)
        printed = "\n-----\n".join(f"exit {a.poll()}:\n{a.output()[-4000:]}" for a in agents)
        assert all(a.poll() is not None for a in agents), f"still running after 800 s:\n{printed}"
        assert sorted(a.returncode for a in agents) == [-9, 0], printed  # the dead node's agent, the survivor
    finally:
        for a in agents:
            a.kill_all()
        del store
    assert (tmp_path / "job.killed").read_text().startswith("rank 1 of 2 at update 9")
    survivor = torch.load(tmp_path / "job-rank0.pt", weights_only=False)
    assert (survivor["world"], survivor["restart"], survivor["steps"]) == (1, "1", 14)
    straight = job(0, 1, str(tmp_path / "straight"))
    worst = max(
        ((v - survivor["params"][k]).abs() / v.abs().clamp_min(1e-300)).max().item()
        for k, v in straight["params"].items()
    )
    print(f"shrunk from 2 processes to 1 at update 9: largest relative difference {worst:.3g}")
    assert worst <= 1e-12
    assert [r["step"] for r in survivor["history"]] == [r["step"] for r in straight["history"]]
    for a, b in zip(survivor["history"], straight["history"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-12, abs=0)
