"""Launching tests/elastic_job.py under torchrun, and comparing runs (shared by test_elastic and test_slurm)."""

import os
import sys
from pathlib import Path

import torch
from processes import Job, free_port, wait_all

HERE = Path(__file__).resolve().parent
JOB = str(HERE / "elastic_job.py")


def environment():
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_", "TORCHELASTIC_"))
    }
    return {**env, "OMP_NUM_THREADS": "1"}


def torchrun(tmp_path, name, *, nodes=1, backend="static", kill=None, timeout=800):
    """Runs elastic_job.py under torchrun with --max-restarts=1: 2 processes on one node, or 2 "nodes" of one
    process each on localhost. Returns each rank's result, whether the kill happened, and what torchrun printed.
    ``timeout`` exceeds two attempts' worst waits (the job's own 300 s each), so that a stuck job ends with its
    own error naming what it waited for; a run takes under a minute even on a loaded machine."""
    out = tmp_path / name
    job = [JOB, "--dir", str(out), "--out", f"{out}.pt", *(["--kill", kill] if kill else [])]
    port = free_port()
    common = [sys.executable, "-m", "torch.distributed.run", "--max-restarts=1", "--monitor-interval=0.5"]
    store = None
    if nodes == 1:
        where = f"--rdzv-endpoint=127.0.0.1:{port}" if backend == "c10d" else f"--master-port={port}"
        rdzv = [f"--rdzv-backend={backend}", where]
        commands = [[*common, "--nproc-per-node=2", *rdzv, *job]]
    elif backend == "static":
        commands = [
            [
                *common,
                "--nnodes=2",
                "--nproc-per-node=1",
                "--rdzv-backend=static",
                f"--node-rank={n}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                *job,
            ]
            for n in range(2)
        ]
    else:
        # the rendezvous store lives here, not in one of the agents: the agent hosting it may exit first
        # and the other's last look at the store would fail (a torchrun teardown race)
        store = torch.distributed.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
        rdzv = ["--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={name}"]
        rdzv += ["--rdzv-conf=is_host=0", "--local-addr=127.0.0.1"]
        commands = [[*common, "--nnodes=2", "--nproc-per-node=1", *rdzv, *job]] * 2
    jobs = [Job(c, environment()) for c in commands]
    wait_all(jobs, timeout=timeout)
    del store  # alive until every agent is done
    results = [torch.load(tmp_path / f"{name}-rank{r}.pt", weights_only=False) for r in range(2)]
    return results, Path(f"{out}.killed").exists(), "\n".join(j.output() for j in jobs)


def assert_bit_identical(results, reference):
    for got, want in zip(results, reference, strict=True):
        for k, v in want["state"]["model"].items():
            assert torch.equal(v, got["state"]["model"][k]), k
        assert got["state"]["optimizer"]["state"].keys() == want["state"]["optimizer"]["state"].keys()
        for i, s in want["state"]["optimizer"]["state"].items():
            assert torch.equal(s["momentum_buffer"], got["state"]["optimizer"]["state"][i]["momentum_buffer"])
        assert (got["steps"], got["history"], got["evals"]) == (want["steps"], want["history"], want["evals"])
    assert reference[0]["steps"] == 12 and len(reference[0]["evals"]) == 4
