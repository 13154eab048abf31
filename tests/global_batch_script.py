"""tests/global_batch_workers.py's job as a launched process (torchrun's workers), for the elastic shrink test:

python tests/global_batch_script.py --dir CKPT --out OUT.pt [--kill-node RANK:UPDATE] [--checkpoint-every K]

Each rank that finishes writes OUT-rank<r>.pt: the job's result, the world size and torchrun's restart count.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
from global_batch_workers import job  # the script's folder is on sys.path


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kill-node", default=None, help="RANK:UPDATE: that rank's agent and itself are killed there, once")
    p.add_argument("--checkpoint-every", type=int, default=None)
    args = p.parse_args()
    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    spec = {"checkpoint_every": args.checkpoint_every}
    if args.kill_node:
        killed, update = map(int, args.kill_node.split(":"))
        spec["kill_node"] = {"rank": killed, "update": update, "marker": f"{args.dir}.killed"}
    result = job(rank, world, args.dir, spec)
    result["world"], result["restart"] = world, os.environ.get("TORCHELASTIC_RESTART_COUNT")
    out = Path(args.out)
    torch.save(result, out.with_name(f"{out.stem}-rank{rank}{out.suffix}"))
    print("DONE", flush=True)


if __name__ == "__main__":
    sys.exit(main())
