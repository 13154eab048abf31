"""The small ct.run job of the test_run_*.py files: in-process (``train``, ``state``, ``step``, ``dataset``), and
as a script for the process-level tests (resumable, killable, launchable by torchrun):

python tests/run_script.py --dir CKPT --epochs 3 --out final.pt [--checkpoint-every 3]
    [--max-steps N] [--slow-save K] [--step-delay S] [--hold FILE]
"""

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from helpers import process_group_threads  # the script's folder is on sys.path
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct
import composetrain.checkpoint.files as checkpoint
from composetrain.core.metric_names import MEASURED


def dataset(n=96):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    return TensorDataset(x, (x[:, 0] > 0).long())


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2)).double()


def step(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).double().mean()}


def state():
    m = model()
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    return ct.TrainState(m, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7))


QUICK = {"batch_size": 12, "num_workers": 0, "progress": False}  # batches of 12 read in this process, no bar


def run_plain(state, **options):
    """ct.run of the plain step on the dataset, QUICK unless ``options`` say otherwise: its result."""
    return ct.run(step, state, dataset(), **{**QUICK, **options})


def run_distributed(**options):
    """ct.run of ``distributed(step)`` from a fresh state on this rank, QUICK unless ``options`` say otherwise."""
    return ct.run(ct.distributed(step), state(), dataset(), **{**QUICK, **options})


def train(tmp=None, **options):
    """``accumulate(2)(step)`` trained in this process by ct.run with these tests' options; its state and result."""
    s = state()
    options = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 4, **options}
    result = ct.run(ct.accumulate(2)(step), s, dataset(), checkpoint_dir=tmp, **options)
    return s, result


def untimed(history):
    return [{k: v for k, v in r.items() if k not in MEASURED} for r in history]


def accuracy(model, batch):
    x, y = batch
    return {"acc": (model(x).argmax(-1) == y).double().mean()}


def launch(*args, env=None):
    """This script with ``args`` as a Job; use it in a ``with`` block (killed with all it started on the way out)."""
    from processes import Job  # not at the top: the script itself never needs the harness

    env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return Job([sys.executable, __file__, *args], env)


def finish(job, timeout=180):
    """Its exit code and output; killed with all it started, and the test failed, past ``timeout``."""
    with job:
        return job.finish(timeout)


def job_arguments() -> argparse.ArgumentParser:
    """The arguments every launched ct.run job of the tests takes: --dir, --out, --epochs, --max-steps."""
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--max-steps", type=int, default=None)
    return p


def job_options(args: argparse.Namespace, **more):
    """ct.run's options in a launched job: its arguments' epochs, steps and folder; batches of 12 read in this
    process, logged every 4 updates, seed 5."""
    return {
        "epochs": args.epochs,
        "max_steps": args.max_steps,
        "checkpoint_dir": args.dir,
        **QUICK,
        "log_every": 4,
        "seed": 5,
        **more,
    }


def main():
    p = job_arguments()
    p.add_argument("--checkpoint-every", type=int, default=None)
    p.add_argument("--slow-save", type=int, default=0, help="hang inside the Kth save, after its first file")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds to sleep in every step")
    p.add_argument("--hold", default=None, help="every step waits while this file exists")
    args = p.parse_args()
    torch.set_num_threads(1)

    saves = []
    if args.slow_save:
        original = checkpoint._write

        def slow(obj, path):
            written = original(obj, path)
            saves.append(path)
            if len(saves) == args.slow_save:
                print("SAVING", flush=True)
                time.sleep(600)
            return written

        checkpoint._write = slow

    def delayed(model, batch):
        time.sleep(args.step_delay)
        while args.hold and os.path.exists(args.hold):
            time.sleep(0.05)
        return step(model, batch)

    s = state()
    composed = ct.distributed(ct.accumulate(2)(delayed))
    result = ct.run(composed, s, dataset(), **job_options(args, checkpoint_every=args.checkpoint_every))
    rank = int(os.environ.get("RANK", "0"))  # ct.run has left the process group by now
    out = Path(args.out)
    torch.save(
        {
            "state": s.state_dict(),
            "history": result.history,
            "preempted": result.preempted,
            "steps": result.steps,
            "threads_left": process_group_threads(),
        },
        out.with_name(f"{out.stem}-rank{rank}{out.suffix}"),
    )
    print("DONE" if not result.preempted else "PREEMPTED", flush=True)


if __name__ == "__main__":
    sys.exit(main())
