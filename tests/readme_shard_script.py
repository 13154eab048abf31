"""The README's sharding example, run as written (one script, under torchrun) after a prelude that
defines what it names: python tests/readme_shard_script.py FOLDER (the working folder for runs/big).

Each rank then writes FOLDER/rank<r>.pt: whether the trained model was still usable (its whole weights
from ct.full_state_dict against its gathered parameters, the checkpoint loaded back), and that the
process group ct.run created is still there; the process must then exit cleanly (no hang, no abort)."""

import atexit
import os
import re
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct

README = Path(__file__).resolve().parents[1] / "README.md"


def example() -> str:
    blocks = re.findall(r"```python\n(.+?)```", README.read_text(), re.S)
    found = [b for b in blocks if "ct.sharded(" in b and "ct.full_state_dict" in b]
    assert len(found) == 1, f"the README's sharding example: {len(found)} blocks found"
    return found[0]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.lin(x).tanh()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = self.inp(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def step(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def threads_at_exit(path: str) -> None:
    """Registered before ct.run, so it runs after whatever ct.run left to the interpreter's exit: the group's
    threads must be gone by then (one running into the interpreter's teardown can abort the process)."""
    import gc

    from helpers import process_group_threads  # the script's folder is on sys.path

    gc.collect()
    Path(path).write_text(repr(process_group_threads()))


def main() -> None:
    os.chdir(sys.argv[1])
    atexit.register(threads_at_exit, str(Path(sys.argv[1]) / f"threads-at-exit-{os.environ['RANK']}.txt"))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Net().double()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 4, dtype=torch.float64, generator=g)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    scope = {"ct": ct, "model": model, "optimizer": optimizer, "step": step, "dataset": dataset, "Block": Block}
    exec(compile(example(), "README sharding example", "exec"), scope)
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
