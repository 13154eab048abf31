"""A ct.run job whose tracker appends each record it gets to a file, killed by SIGKILL (its own) at a chosen update:

python tests/tracker_kill_script.py --dir CKPT --sent FILE [--kill-at N]

``--kill-at N``: the process kills itself in its N-th call of the step (counted in this process), before that
update; what the tracker file holds is what a real tracker would have received. ``--kill-in-tracker N``: killed
inside the tracker's N-th call, before it wrote the record (a network call cut short: the record never arrived).
"""

import argparse
import json
import os
import signal
import sys

import run_script
import torch
from run_workers import evaluate

import composetrain as ct

OPTIONS = {
    "batch_size": 12,
    "num_workers": 0,
    "progress": False,
    "seed": 5,
    "log_every": 3,
    "eval_step": evaluate,
    "eval_data": run_script.dataset(24),
    "eval_every": 4,
    "max_steps": 12,
    "checkpoint_every": 4,
}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--sent", required=True)
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--kill-in-tracker", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    calls = []

    def step(model, batch):
        calls.append(1)
        if len(calls) == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return run_script.step(model, batch)

    tracked = []

    def tracker(record):
        tracked.append(1)
        if len(tracked) == args.kill_in_tracker:
            os.kill(os.getpid(), signal.SIGKILL)
        with open(args.sent, "a") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    ct.run(step, run_script.state(), run_script.dataset(), checkpoint_dir=args.dir, on_record=tracker, **OPTIONS)
    print("DONE", flush=True)


if __name__ == "__main__":
    sys.exit(main())
