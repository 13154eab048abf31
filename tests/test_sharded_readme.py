"""The sharding example of docs/scale/sharded.md runs as written, as one script under torchrun: the trained model stays
usable after ct.run (full_state_dict, load_checkpoint), and the job still exits cleanly."""

import atexit
import os
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import Block, Net, process_group_threads
from processes import Job, free_port
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct

SCRIPT = str(Path(__file__).resolve())  # this file, as a script: its main block at the end


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


# -- the script: python tests/test_sharded_readme.py FOLDER (the working folder for runs/big) ---------------------
# docs/scale/sharded.md's sharding example, run as written (one script, under torchrun) after a prelude that defines
# what it names. Each rank then writes FOLDER/rank<r>.pt: whether the trained model was still usable (its whole
# weights from ct.full_state_dict against its gathered parameters, the checkpoint loaded back), and that the process
# group ct.run created is still there; the process must then exit cleanly (no hang, no abort).

PAGE = Path(__file__).resolve().parents[1] / "docs" / "scale" / "sharded.md"


def example() -> str:
    blocks = re.findall(r"```python\n(.+?)```", PAGE.read_text(), re.S)
    found = [b for b in blocks if "ct.sharded(" in b and "ct.full_state_dict" in b]
    assert len(found) == 1, f"docs/scale/sharded.md's sharding example: {len(found)} blocks found"
    return found[0]


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def threads_at_exit(path: str) -> None:
    """Registered before ct.run, so it runs after whatever ct.run left to the interpreter's exit: the group's
    threads must be gone by then (one running into the interpreter's teardown can abort the process)."""
    import gc

    gc.collect()
    Path(path).write_text(repr(process_group_threads()))


def main() -> None:
    os.chdir(sys.argv[1])
    atexit.register(threads_at_exit, str(Path(sys.argv[1]) / f"threads-at-exit-{os.environ['RANK']}.txt"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net(4, 8, 2, output_layer="head", layers=lambda: nn.ModuleList(Block(8) for _ in range(2))).double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, dtype=torch.float64, generator=g)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    scope = {"ct": ct, "model": model, "optimizer": optimizer, "step": step, "dataset": dataset, "Block": Block}
    exec(compile(example(), "docs/scale/sharded.md sharding example", "exec"), scope)
    state, weights = scope["state"], scope["weights"]
    rank = dist.get_rank()
    gathered = {n: p.full_tensor() for n, p in state.model.named_parameters()}  # a collective, every rank
    torch.save(
        {
            "weights": weights,
            "gathered": gathered,
            "steps": state.step,
            "group_alive": dist.is_initialized(),
            "sharded": sorted({type(p).__name__ for p in state.model.parameters()}),
        },
        f"rank{rank}.pt",
    )
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
