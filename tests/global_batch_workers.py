"""The job of tests/test_resume_anywhere.py, run by ct.run with global_batch_size on every rank of a processes.Pool (its
process group already up) or alone in the test process: the same function on 1, 2 or 3 processes.

A module of its own because the spawned ranks of ``processes.Pool`` import it by name.
"""

import os
import signal
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct

N, G = 40, 6  # 6 updates of 6 samples and a last, short one of 4 per epoch: 7 updates, shared 2+1+1 on 3 ranks


def dataset(n=N):
    """Samples carry their index, so that a step can say which samples each update trained on."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    return TensorDataset(x, (x[:, 0] > 0).long(), torch.arange(n))


class Net(nn.Module):
    """Blocks for ct.sharded's units; dropout only where a test asks for random draws."""

    def __init__(self, dropout=0.0):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Dropout(dropout)) for _ in range(2))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def state(dropout=0.0):
    torch.manual_seed(1)
    model = Net(dropout).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7))


def job(rank, world, directory=None, spec=None):
    """The job trained to its end, or stopped by SIGTERM (to rank 0) inside update ``stop_at``: what each rank saw.
    ``spec``: ``stop_at``, ``sharded``, ``dropout``, ``accumulate`` (micro-batches, default 2; 1: none),
    ``samples``, ``kill_node`` and ct.run's options, overriding the job's (a pool passes arguments by position only).

    Returns: the whole parameters (rank 0's; {} on the others), the history and evaluations, which samples each
    update read on this rank (``seen``: (update, indices) per micro-batch), the global seed its generators had at
    its first forward, the records ``on_record`` got (rank 0), and whether it was pre-empted.
    """
    options = dict(spec or {})
    stop_at, sharded, dropout = options.pop("stop_at", None), options.pop("sharded", False), options.pop("dropout", 0)
    kill = options.pop("kill_node", None)  # {"rank", "update", "marker"}: that rank's whole node dies there, once
    micro_batches = options.pop("accumulate", 2)  # 1: no accumulate
    s = state(dropout)
    seen, seeds, records, signalled = [], [], [], []

    def step(model, batch):
        x, y, i = batch
        if not seeds:
            seeds.append(torch.initial_seed())
        seen.append((s.step + 1, i.tolist()))
        if stop_at is not None and s.step + 1 == stop_at and rank == 0 and not signalled:
            signalled.append(True)
            os.kill(os.getpid(), signal.SIGTERM)  # saved after this update, every rank stops with it
        if kill and rank == kill["rank"] and s.step + 1 == kill["update"] and not Path(kill["marker"]).exists():
            Path(kill["marker"]).write_text(f"rank {rank} of {world} at update {kill['update']}\n")
            os.kill(os.getppid(), signal.SIGKILL)  # its torchrun agent: the node is gone, not only the process
            os.kill(os.getpid(), signal.SIGKILL)
        logits = model(x)
        return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).double().mean()}

    parallel = ct.sharded if sharded else ct.distributed
    options = {
        "global_batch_size": G,
        "epochs": 2,
        "num_workers": 0,
        "progress": False,
        "log_every": 3,
        "seed": 5,
        "checkpoint_dir": directory,
        "on_record": records.append,
        **options,
    }
    composed = parallel(ct.accumulate(micro_batches)(step) if micro_batches > 1 else step)
    result = ct.run(composed, s, dataset(options.pop("samples", N)), **options)
    params = ct.full_state_dict(s.model)
    return {
        "params": params if rank == 0 else {},
        "history": result.history,
        "evals": result.evals,
        "seen": seen,
        "seed": seeds[0] if seeds else None,
        "records": records,
        "preempted": result.preempted,
        "steps": result.steps,
    }


def refused(rank, world, directory, spec=None):
    """The job's error, on every rank, and whether it changed anything: the parameters, the checkpoint folder."""
    options = dict(spec or {})
    parallel = ct.sharded if options.pop("sharded", False) else ct.distributed
    s = state()
    before = [p.detach().clone() for p in s.model.parameters()]
    folder = Path(directory)
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else None
    options = {"global_batch_size": G, "epochs": 2, "num_workers": 0, "progress": False, **options}
    try:
        ct.run(
            parallel(ct.accumulate(2)(_plain)),
            s,
            dataset(options.pop("samples", N)),
            checkpoint_dir=directory,
            **options,
        )
        error = None
    except (ValueError, TypeError) as e:
        error = f"{type(e).__name__}: {e}"
    after = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else None
    unchanged = all(torch.equal(p, q) for p, q in zip(before, s.model.parameters(), strict=True))
    # what a lock left is the run's own bookkeeping, not a change (its files name their holder)
    return {"error": error, "params_unchanged": unchanged, "files_before": files, "files_after": _unlocked(after)}


def _unlocked(files):
    return None if files is None else [f for f in files if not Path(f).name.startswith(".lock-")]


def _plain(model, batch):
    x, y, _ = batch
    return F.cross_entropy(model(x), y)


def per_process(rank, world, directory):
    """A run in batch_size mode (per process), stopped after 2 updates: its checkpoint is tied to this world size."""
    s = state()
    ct.run(
        ct.distributed(_plain),
        s,
        dataset(),
        batch_size=3,
        max_steps=2,
        num_workers=0,
        progress=False,
        checkpoint_dir=directory,
    )
    return s.step
