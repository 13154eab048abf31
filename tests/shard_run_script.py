"""A sharded ct.run job for the launch tests: resumable, launchable by torchrun.

python tests/shard_run_script.py --dir CKPT --out OUT.pt [--epochs E] [--max-steps N]
Each rank saves its local shards, its step and the gloo threads left after ct.run to OUT-rank<r>.pt.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import process_group_threads  # the script's folder is on sys.path
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct


def dataset(n=96):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    return TensorDataset(x, (x[:, 0] > 0).long())


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 16)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Dropout(0.2)) for _ in range(2))
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def step(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).double().mean()}


def state():
    torch.manual_seed(1)
    m = Net().double()
    opt = torch.optim.AdamW(m.parameters(), lr=0.01)
    return ct.TrainState(m, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.7))


def local(t):
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--max-steps", type=int, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    s = state()
    result = ct.run(
        ct.sharded(ct.clip_grad_norm(1.0)(ct.accumulate(2)(step))),
        s,
        dataset(),
        batch_size=12,
        epochs=args.epochs,
        max_steps=args.max_steps,
        num_workers=0,
        checkpoint_dir=args.dir,
        log_every=4,
        progress=False,
        seed=5,
    )
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
