"""A ct.run job that one rank kills itself in, once: the elastic-restart and SLURM tests launch it.

    python tests/elastic_job.py --dir CKPT --out OUT [--kill RANK:WHERE] [--step-delay S]
        [--wait-for-signal] [--timeout S]

WHERE is ``rendezvous`` (after claiming its place, before the others joined), ``update:K`` (inside
the K-th micro-batch's forward), ``save:K`` (inside the K-th save, after its first file), ``eval:K``
(inside the K-th evaluation batch), ``agree:K`` (before the K-th agreement on stopping) or ``full:K``
(the K-th save finds the disk full: its first file raises ENOSPC, and the rank fails). With a
``hang-`` prefix (``hang-update:K``) the rank stops itself (SIGSTOP) instead: it hangs. The
kill happens once per job: a marker file next to CKPT says it happened, so the restarted attempt
runs through. Each rank writes OUT-rank<r>.pt at the end: its state, history, evals and attempt.
"""

import argparse
import errno
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct
import composetrain.checkpoint.files as checkpoint
from composetrain.core.metric_names import MEASURED

TIMED = MEASURED  # the history's timings (and what else measures the machine) differ from run to run


def dataset(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g, dtype=torch.float64)
    return TensorDataset(x, (x[:, 0] > 0).long())


def step(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).double().mean()}


def evaluate(model, batch):
    x, y = batch
    return {"acc": (model(x).argmax(-1) == y).double().mean()}


def rank_of_this_process():
    return int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))


def restart_count():
    """torchrun's count of restarts, or SLURM's of requeues (unset before the first), or None."""
    if "TORCHELASTIC_RESTART_COUNT" in os.environ:
        return os.environ["TORCHELASTIC_RESTART_COUNT"]
    return os.environ.get("SLURM_RESTART_COUNT", "0") if "SLURM_JOB_ID" in os.environ else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--kill", default=None, help="RANK:WHERE, once per job")
    p.add_argument("--step-delay", type=float, default=0.0)
    # ct.run's own default (300 s) unless given: restarted ranks import torch and build DDP (torch._dynamo) again,
    # which on a loaded machine (load 14 on 2 cores) takes a minute or two of wall-clock per rank, and any skew
    # between them counts against the rendezvous and the first collectives; a lost rank is noticed at once anyway
    p.add_argument("--timeout", type=float, default=None)
    p.add_argument("--no-requeue", action="store_true")
    args = p.parse_args()
    torch.set_num_threads(1)
    rank = rank_of_this_process()
    marker = Path(f"{args.dir}.killed")
    kill_rank, where, at, hang = None, None, 0, False
    if args.kill:
        kill_rank, _, rest = args.kill.partition(":")
        where, _, count = rest.partition(":")
        kill_rank, at = int(kill_rank), int(count or 0)
        hang = where.startswith("hang-")
        where = where.removeprefix("hang-")
    armed = rank == kill_rank and not marker.exists()
    calls = {"update": 0, "save": 0, "eval": 0, "agree": 0}

    def die(what, count=0):
        if armed and where == what and count == at:
            marker.write_text(f"rank {rank} at {args.kill}\n")
            print(f"KILLING rank {rank} at {args.kill}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP if hang else signal.SIGKILL)

    if armed and where == "rendezvous":
        import composetrain.launch.attempts as attempts

        original_wait = attempts._wait

        def dying_wait(*a, **k):
            die("rendezvous")  # its slot is claimed: the others see it, it never marks itself ready
            return original_wait(*a, **k)

        attempts._wait = dying_wait
    if armed and where == "full":
        original_write = checkpoint._write

        def full_write(obj, path):
            calls["save"] += 1
            if calls["save"] == at:
                marker.write_text(f"rank {rank} at {args.kill}\n")
                raise OSError(errno.ENOSPC, "No space left on device (injected)", str(path))
            return original_write(obj, path)

        checkpoint._write = full_write
    if armed and where == "save":
        original_write = checkpoint._write

        def dying_write(obj, path):
            written = original_write(obj, path)
            if path.name == "state.pt" or rank != 0:
                calls["save"] += 1
                die("save", calls["save"])
            return written

        checkpoint._write = dying_write

    if armed and where == "agree":
        import composetrain.driver.preemption as preemption

        original_check = preemption.StopSignal.check

        def dying_check(self, *args, **kwargs):
            calls["agree"] += 1
            die("agree", calls["agree"])
            return original_check(self, *args, **kwargs)

        preemption.StopSignal.check = dying_check

    def train(model, batch):
        calls["update"] += 1  # micro-batches: accumulate(2) calls this twice per update
        die("update", calls["update"])
        time.sleep(args.step_delay)
        return step(model, batch)

    def evaluation(model, batch):
        calls["eval"] += 1
        die("eval", calls["eval"])
        return evaluate(model, batch)

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.7))
    result = ct.run(
        ct.distributed(ct.accumulate(2)(train)),
        state,
        dataset(),
        batch_size=12,
        epochs=args.epochs,
        num_workers=0,
        checkpoint_dir=args.dir,
        checkpoint_every=2,
        eval_step=evaluation,
        eval_data=dataset(24, seed=1),
        eval_every=3,
        log_every=2,
        progress=False,
        seed=5,
        requeue=not args.no_requeue,
        **({} if args.timeout is None else {"timeout": args.timeout}),
    )
    out = Path(args.out)
    torch.save(
        {
            "state": state.state_dict(),
            "history": [{k: v for k, v in r.items() if k not in TIMED} for r in result.history],
            "evals": result.evals,
            "steps": result.steps,
            "preempted": result.preempted,
            "restart": restart_count(),
            "source": ct.detect().source,  # what ct.rendezvous read: torchrun's variables or SLURM's
        },
        out.with_name(f"{out.stem}-rank{rank}{out.suffix}"),
    )
    print("PREEMPTED" if result.preempted else "DONE", flush=True)


if __name__ == "__main__":
    sys.exit(main())
