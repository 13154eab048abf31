"""Cases for the sharded fixes of issues 19 and 20, run on every rank of a processes.Pool.

Each case returns what the parent compares with a plain single-process loop on the global batch.

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import distributed_workers
import sharded_workers
import torch
import torch.distributed as dist
import torch.nn.functional as F
from sharded_workers import full
from torch import nn

import composetrain as ct


class Gated(nn.Module):
    """A block with a 0-dim parameter of its own (inside a sharding unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.gate = nn.Parameter(torch.tensor(0.3))

    def forward(self, x):
        return x + self.gate * self.lin(x).tanh()


class ClipLike(nn.Module):
    """CLIP's shape of the problem: a 0-dim ``logit_scale`` on the root, besides 0-dim gates in the blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(distributed_workers.IN, 8)
        self.blocks = nn.ModuleList(Gated() for _ in range(2))
        self.head = nn.Linear(8, distributed_workers.CLASSES)
        self.logit_scale = nn.Parameter(torch.tensor(0.5))
        self.rare = nn.Parameter(torch.tensor(0.2))  # used only by batches holding a rare sample

    def forward(self, x):
        rare = x[:, :1] > 1.5  # in these batches, on one rank at each update: its gradient None on the other
        x = self.inp(x).tanh()
        for block in self.blocks:
            x = block(x)
        logits = self.head(x) * self.logit_scale.exp()
        # on one class's logit: a constant added to every logit has no gradient under cross-entropy
        one_class = torch.zeros_like(logits)
        one_class[:, 0] = 1
        return logits + self.rare * rare.to(logits.dtype) * one_class if rare.any() else logits


SIZES = [[6, 6], [4, 4]]  # two updates, each rank's batch of the global one


def batches(rank: int | None, world: int) -> list[Any]:
    out = []
    for i, sizes in enumerate(SIZES):
        batch = distributed_workers.global_batch("classify", sizes[:1] * world, 40 + i, torch.float64)
        out.append(batch if rank is None else distributed_workers.shard(batch, sizes[:1] * world, rank))
    return out


def clip_like(seed: int) -> ClipLike:
    torch.manual_seed(seed)
    model = ClipLike().double()
    with torch.no_grad():  # 0-dim parameters that differ by seed too: rank 0's must win
        for p in model.parameters():
            if p.dim() == 0:
                p.add_(0.1 * seed)
    return model


def record(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "params": {n: full(p) for n, p in model.named_parameters()},
        "kinds": {n: type(p).__name__ for n, p in model.named_parameters()},
        "optimizer": {
            k: {name: full(v) for name, v in entries.items()} for k, entries in optimizer.state_dict()["state"].items()
        },
    }


def plain_loop(kind: str, world: int) -> dict[str, Any]:
    """The reference, written out: one process, the global batches, forward, backward, clip, step."""
    model = clip_like(0)
    optimizer = make_optimizer(kind, model)
    for x, y in batches(None, world):
        x1, y1, x2, y2 = x[: len(x) // 2], y[: len(y) // 2], x[len(x) // 2 :], y[len(y) // 2 :]
        for xs, ys in ((x1, y1), (x2, y2)):  # accumulate(2) splits the global batch in halves
            (F.cross_entropy(model(xs), ys) * (len(xs) / len(x))).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return record(model, optimizer)


def make_optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "adagrad":  # Adagrad creates its state (sum, step) in __init__
        return torch.optim.Adagrad(model.parameters(), lr=0.05, initial_accumulator_value=0.1)
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def scalar_parameters(rank: int, world: int, kind: str) -> dict[str, Any]:
    """sharded(clip_grad_norm(accumulate(2))) on a model with 0-dim parameters, from rank-specific weights."""
    model = clip_like(rank)  # rank 0's weights must win, as under DDP
    state = ct.TrainState(model, make_optimizer(kind, model))
    step = ct.sharded(ct.clip_grad_norm(0.5)(ct.accumulate(2)(distributed_workers.classify)))
    for batch in batches(rank, world):
        step(state, batch)
    return record(state.model, state.optimizer)


def half_sharded(rank: int, world: int) -> dict[str, str]:
    """fully_shard failing on the root after the units were sharded (injected): what every later use says."""
    import torch.distributed.fsdp as fsdp

    def outcome(call: Any) -> str:
        try:
            call()
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "no error"

    batch = batches(rank, world)[0]
    state = sharded_workers.make_state("classify", 0, torch.float64)  # blocks (units), then the root
    real = fsdp.fully_shard

    def failing_at_root(module, **kwargs):
        if module is state.model:
            raise RuntimeError("injected failure at the root")
        return real(module, **kwargs)

    fsdp.fully_shard = failing_at_root
    try:
        found = {"first": outcome(lambda: ct.sharded(distributed_workers.classify)(state, batch))}
    finally:
        fsdp.fully_shard = real
    found["retry"] = outcome(lambda: ct.sharded(distributed_workers.classify)(state, batch))
    found["distributed"] = outcome(lambda: ct.distributed(distributed_workers.classify)(state, batch))
    found["plain"] = outcome(lambda: ct.train_step(distributed_workers.classify)(state, batch))
    found["apply_sharding"] = outcome(lambda: ct.apply_sharding(ct.sharded(distributed_workers.classify), state))
    return found


def unfrozen_outside_the_optimizer(rank: int, world: int) -> list[list[str]]:
    """A parameter frozen when the optimizer was built, unfrozen after: its .grad is cleared after each update
    like every other one (the names of parameters still holding a gradient after each of 3 updates)."""
    model = sharded_workers.make_state("classify", 0, torch.float64).model
    frozen = model.head.weight
    frozen.requires_grad_(False)
    state = ct.TrainState(model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1))
    step = ct.sharded(distributed_workers.classify)
    left = []
    for i in range(3):
        if i == 1:
            state.model.head.weight.requires_grad_(True)
        step(state, batches(rank, world)[i % 2])
        left.append([n for n, p in state.model.named_parameters() if p.grad is not None])
    return left


def no_decay_first(model: nn.Module) -> torch.optim.Optimizer:
    """The common setup: biases (no weight decay) in a group before the weights, not model order."""
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    weights = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    groups = [{"params": biases, "weight_decay": 0.0}, {"params": weights, "weight_decay": 0.1}]
    return torch.optim.AdamW(groups, lr=1e-2)


def order_state() -> ct.TrainState:
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Linear(distributed_workers.IN, 8),
        nn.Tanh(),
        nn.Linear(8, 8),
        nn.Tanh(),
        nn.Linear(8, 8),
        nn.Tanh(),
        nn.Linear(8, distributed_workers.CLASSES),
    ).double()
    return ct.TrainState(model, no_decay_first(model))


def order_data(world: int) -> torch.utils.data.TensorDataset:
    x, y = distributed_workers.global_batch("classify", [24 * world], 9, torch.float64)
    return torch.utils.data.TensorDataset(x, y)


ORDER_STEP = ct.sharded(ct.accumulate(2)(distributed_workers.classify), modules=nn.Linear)


def resume_in_optimizer_order(rank: int, world: int, folder: str) -> dict[str, Any]:
    """ct.run stopped after 2 updates and resumed to 4, against 4 straight; and load_checkpoint of the
    2-update checkpoint after apply_sharding, against the state that saved it."""
    options = {"batch_size": 6, "num_workers": 0, "progress": False, "seed": 1, "log_every": 1}
    straight = order_state()
    ct.run(ORDER_STEP, straight, order_data(world), max_steps=4, checkpoint_dir=f"{folder}/a", **options)
    cut = order_state()
    ct.run(ORDER_STEP, cut, order_data(world), max_steps=2, checkpoint_dir=f"{folder}/b", **options)
    at_two = record(cut.model, cut.optimizer)
    saved = sorted(Path(folder, "b").glob("step-*"))[-1]
    resumed = order_state()
    ct.run(ORDER_STEP, resumed, order_data(world), max_steps=4, checkpoint_dir=f"{folder}/b", **options)
    loaded = order_state()
    ct.apply_sharding(ORDER_STEP, loaded)
    ct.load_checkpoint(loaded, saved)
    dist.barrier()
    return {
        "straight": record(straight.model, straight.optimizer),
        "resumed": record(resumed.model, resumed.optimizer),
        "at_two": at_two,
        "loaded": record(loaded.model, loaded.optimizer),
        "steps": [straight.step, resumed.step, loaded.step],
    }


def gathered_after_the_group_is_gone(rank: int, world: int) -> dict[str, str]:
    """full_state_dict of a sharded model whose group was destroyed since (as ct.run used to): what it says.
    The pool's group is then made again."""
    from processes import free_port

    state = sharded_workers.make_state("classify", 0, torch.float64)
    ct.sharded(distributed_workers.classify)(state, batches(rank, world)[0])
    found = {"alive": str(sorted(ct.full_state_dict(state.model)) == sorted(state.model.state_dict()) or rank)}
    found["kinds"] = str(sorted({type(p).__name__ for p in state.model.parameters()}))
    state.release_runtime()
    port = torch.tensor(free_port() if rank == 0 else 0)
    dist.broadcast(port, src=0)
    dist.destroy_process_group()
    try:
        ct.full_state_dict(state.model)
        found["gone"] = "no error"
    except Exception as e:
        found["gone"] = f"{type(e).__name__}: {e}"
    finally:
        store = dist.TCPStore("127.0.0.1", int(port), world, is_master=rank == 0, wait_for_workers=True)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    return found


def trained_adagrad(rank: int, world: int) -> dict[str, str]:
    """Adagrad after one plain update (its sums no longer the initial ones): refused, the state untouched."""
    model = clip_like(0)
    state = ct.TrainState(model, make_optimizer("adagrad", model))
    ct.train_step(distributed_workers.classify)(state, batches(rank, world)[0])
    try:
        ct.sharded(distributed_workers.classify)(state, batches(rank, world)[1])
        found = {"error": "no error"}
    except Exception as e:
        found = {"error": f"{type(e).__name__}: {e}"}
    found["untouched"] = str(not any(type(p).__name__ == "DTensor" for p in state.model.parameters()))
    return found


def fp16_with_scalars(rank: int, world: int) -> str:
    """fp16 loss scaling with 0-dim parameters beside DTensors, which GradScaler cannot unscale: what it says."""
    model = clip_like(0).float()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batches(rank, world)[0]
    try:
        ct.sharded(ct.mixed_precision(dtype="fp16")(distributed_workers.classify))(state, (x.float(), y))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def bf16_with_scalars(rank: int | None, world: int) -> dict[str, Any]:
    """sharded(mixed_precision(bf16)(clip(accumulate(2)))) with 0-dim parameters; rank None: one process."""
    model = clip_like(rank or 0).float()
    state = ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    inner = ct.mixed_precision(dtype="bf16")(ct.clip_grad_norm(0.5)(ct.accumulate(2)(distributed_workers.classify)))
    step = inner if rank is None else ct.sharded(inner)
    for x, y in batches(rank, world):
        step(state, (x.float(), y))
    return {n: full(p) for n, p in state.model.named_parameters()}
