"""Cases for ct.sharded run on every rank of a processes.Pool, and their single-process references.

A case names its composition as the composed step prints (``step`` for the step, ``n`` for the case's
accumulation count): ``"sharded(clip_grad_norm(0.5)(accumulate(n)(step)))"``; checkpoint_activations
recomputes every block. The global batch of each update is the ranks' shards concatenated in rank order;
the reference is the composition without ``sharded`` on it, in one process.

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from __future__ import annotations

from typing import Any

import distributed_workers
import torch
import torch.distributed as dist
from helpers import composed, without
from torch import nn

import composetrain as ct


class Net(nn.Module):
    """An input layer, a ModuleList of blocks (sharded's default units) and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(distributed_workers.IN, 8)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(8, distributed_workers.CLASSES)

    def forward(self, x):
        x = self.inp(x).tanh()
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class TokenNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(distributed_workers.VOCAB, 6)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(6, 6), nn.Tanh())])
        self.head = nn.Linear(6, distributed_workers.VOCAB)

    def forward(self, x):
        x = self.emb(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def make_state(kind: str, seed: int, dtype: torch.dtype, optimizer: str = "sgd") -> ct.TrainState:
    torch.manual_seed(seed)
    model = (TokenNet() if kind == "tokens" else Net()).to(dtype)
    if optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))


def build(printed: str, n: int, kind: str) -> ct.TrainStep:
    """The composition ``printed`` (as the step prints: ``"sharded(accumulate(n)(step))"``)."""
    step = distributed_workers.token_step if kind == "tokens" else distributed_workers.classify
    weight = distributed_workers.real_tokens if kind == "tokens" else None
    parts = {
        "sharded": ct.sharded,
        "sharded(sync_every_micro_batch=True)": ct.sharded(sync_every_micro_batch=True),
        "accumulate(n)": ct.accumulate(n, weight=weight),
        "clip_grad_norm(0.5)": ct.clip_grad_norm(0.5),
        "mixed_precision(dtype='bf16')": ct.mixed_precision(dtype="bf16"),
        "checkpoint_activations(Sequential)": ct.checkpoint_activations(nn.Sequential),  # every block
        "compile(backend='aot_eager')": ct.compile(backend="aot_eager"),
    }
    return composed(printed, parts, step)


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from the ranks' shards (a collective) or as it is."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def optimizer_state(state: ct.TrainState) -> dict[int, dict[str, torch.Tensor]]:
    return {
        k: {name: full(v) for name, v in entries.items()}
        for k, entries in state.optimizer.state_dict()["state"].items()
    }


def train(case: dict[str, Any], rank: int | None) -> dict[str, Any]:
    """The case's updates; rank None is the single-process reference on the global batches."""
    dtype = torch.float32 if "mixed_precision" in case["composition"] else torch.float64
    printed = (
        case["composition"]
        if rank is not None
        else without(case["composition"], "sharded(sync_every_micro_batch=True)", "sharded")
    )
    # ranks start from different weights: sharded must broadcast rank 0's, the reference's
    state = make_state(case["kind"], case["seed"] + (rank or 0), dtype, case.get("optimizer", "sgd"))
    step = build(printed, case["n"], case["kind"])
    losses, metrics = [], []
    for i, sizes in enumerate(case["sizes"]):
        batch = distributed_workers.global_batch(case["kind"], sizes, case["seed"] * 100 + i, dtype)
        out = step(state, batch if rank is None else distributed_workers.shard(batch, sizes, rank))
        losses.append(out.loss)
        metrics.append({k: v.detach().clone() for k, v in out.metrics.items()})
    return {
        "params": {n: full(p) for n, p in state.model.named_parameters()},
        "optimizer": optimizer_state(state),
        "losses": losses,
        "metrics": metrics,
        "step": state.step,
        "lr": state.scheduler.get_last_lr(),
        "kinds": sorted({type(p).__name__ for p in state.model.parameters()}),
    }


def run_case(rank: int, world: int, case: dict[str, Any]) -> dict[str, Any]:
    return train(case, rank)


def dtypes_under_bf16(rank: int, world: int) -> dict[str, Any]:
    """What sharded(mixed_precision(bf16)) computes in: the forward's output, parameters, gradients."""
    seen: dict[str, Any] = {}

    def step(model, batch):
        x, y = batch
        logits = model(x)
        seen["output"] = logits.dtype
        return torch.nn.functional.cross_entropy(logits.float(), y)

    class Spy(ct.TrainStep):
        def update(self, state, ctx):
            seen["grads"] = sorted({str(p.grad.dtype) for p in state.model.parameters()})
            seen["grad_kinds"] = sorted({type(p.grad).__name__ for p in state.model.parameters()})
            return self._inner().update(state, ctx)

    state = make_state("classify", 0, torch.float32)
    ct.sharded(ct.mixed_precision(dtype="bf16")(Spy(ct.train_step(step))))(
        state,
        distributed_workers.shard(
            distributed_workers.global_batch("classify", [4] * world, 0, torch.float32), [4] * world, rank
        ),
    )
    seen["params"] = sorted({str(p.dtype) for p in state.model.parameters()})
    seen["output"] = str(seen["output"])
    return seen


def local_bytes(rank: int, world: int, sharded: bool) -> dict[str, int]:
    """This rank's bytes of parameters, gradients (at the update) and optimizer state, AdamW."""
    counted: dict[str, int] = {}

    def size(t: torch.Tensor) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    class Count(ct.TrainStep):
        def update(self, state, ctx):
            counted["grads"] = sum(size(p.grad) for p in state.model.parameters() if p.grad is not None)
            return self._inner().update(state, ctx)

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(64, 64) for _ in range(4))).double()
    state = ct.TrainState(model, torch.optim.AdamW(model.parameters()))
    step = Count(ct.train_step(lambda m, b: m(b).pow(2).mean()))
    (ct.sharded(step, modules=nn.Linear) if sharded else step)(state, torch.randn(8, 64, dtype=torch.float64))
    counted["params"] = sum(size(p) for p in state.model.parameters())
    counted["optimizer"] = sum(
        size(v) for entries in state.optimizer.state.values() for v in entries.values() if v.dim() > 0
    )
    return counted


def found_inf_on_one_rank(rank: int, world: int, dtype: str) -> dict[str, Any]:
    """A gradient that is not finite in the last rank's shard only: every rank must skip the update."""

    class Poison(ct.TrainStep):  # after the last backward, gradients are sharded: poison one local entry
        def grads(self, state, batch, ctx):
            done = self._inner().grads(state, batch, ctx)
            if ctx.last_backward and rank == world - 1 and state.step == 1:
                state.model[1].weight.grad.to_local()[-1, 0] = float("nan")
            return done

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    train = ct.sharded(ct.mixed_precision(dtype=dtype)(Poison(ct.train_step(lambda m, b: m(b).float().pow(2).mean()))))
    train(state, torch.ones(2, 4))  # shards the model, one clean update
    before = {n: full(p) for n, p in state.model.named_parameters()}
    momentum = optimizer_state(state)
    out = train(state, torch.ones(2, 4))
    after = {n: full(p) for n, p in state.model.named_parameters()}
    later = optimizer_state(state)
    return {
        "skipped": bool(out.skipped),
        "unchanged": all(torch.equal(before[n], after[n]) for n in before)
        and all(torch.equal(momentum[k][s], later[k][s]) for k in momentum for s in momentum[k]),
        "step": state.step,
    }


def barrier(rank: int, world: int) -> None:
    dist.barrier()


def refusals(rank: int, world: int) -> dict[str, str]:
    """The errors bad inputs give at the first update (each state is left as it was)."""

    def outcome(call: Any) -> str:
        try:
            call()
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return "no error"

    batch = distributed_workers.shard(
        distributed_workers.global_batch("classify", [4] * world, 0, torch.float64), [4] * world, rank
    )
    found = {}
    state = make_state("classify", 0, torch.float64)
    found["unknown"] = outcome(
        lambda: ct.sharded(modules=["blocks.0", "block.7"])(distributed_workers.classify)(state, batch)
    )
    found["unknown_untouched"] = str(type(state.model).__name__ == "Net" and not state.optimizer.state)
    found["class"] = outcome(lambda: ct.sharded(modules=nn.Conv2d)(distributed_workers.classify)(state, batch))
    trained = make_state("classify", 0, torch.float64)
    ct.train_step(distributed_workers.classify)(trained, batch)  # momentum exists for the unsharded parameters
    found["optimizer"] = outcome(lambda: ct.sharded(distributed_workers.classify)(trained, batch))
    model = make_state("classify", 0, torch.float64).model
    model.blocks[1][0].weight = model.blocks[0][0].weight  # one tensor in two units
    tied = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    found["tied"] = outcome(lambda: ct.sharded(distributed_workers.classify)(tied, batch))
    found["tied_in_one_unit"] = outcome(lambda: ct.sharded(modules=["inp"])(distributed_workers.classify)(tied, batch))
    found["container"] = outcome(lambda: ct.sharded(modules=["blocks"])(distributed_workers.classify)(state, batch))
    uneven = distributed_workers.shard(
        distributed_workers.global_batch("classify", [4, 5], 0, torch.float64), [4, 5], rank
    )
    found["unequal"] = outcome(lambda: ct.sharded(ct.accumulate(2)(distributed_workers.classify))(state, uneven))
    return found


def reduce_scatters(rank: int, world: int, n: int, every: bool) -> list[int]:
    """FSDP2's gradient reduce-scatters per update, counted at torch.distributed's entry point."""
    calls: list[int] = []
    original = dist.reduce_scatter_single

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    state = make_state("classify", 0, torch.float64)
    step = ct.sharded(ct.accumulate(n)(distributed_workers.classify), sync_every_micro_batch=every)
    dist.reduce_scatter_single = counting
    try:
        per_update = []
        for i in range(2):
            before = len(calls)
            batch = distributed_workers.global_batch("classify", [8] * world, i, torch.float64)
            step(state, distributed_workers.shard(batch, [8] * world, rank))
            per_update.append(len(calls) - before)
    finally:
        dist.reduce_scatter_single = original
    return per_update


def load_on_ranks(rank: int, world: int, checkpoint: str) -> dict[str, Any]:
    """A checkpoint of another number of ranks, loaded into a state sharded over these: whole tensors."""
    import shard_run_script

    state = shard_run_script.state()
    ct.apply_sharding(ct.sharded(shard_run_script.step), state)
    ct.load_checkpoint(state, checkpoint)
    return {
        "params": {n: full(p) for n, p in state.model.named_parameters()},
        "optimizer": optimizer_state(state),
        "step": state.step,
        "kinds": sorted({type(p).__name__ for p in state.model.parameters()}),
        "consolidated": ct.full_state_dict(state.model),
    }


def holds(root: Any, target: Any) -> bool:
    """Whether ``target`` can be reached from ``root`` through object references (not through
    modules, classes or a function's globals, which reach everything)."""
    import gc
    import types

    todo, seen = [root], {id(root)}
    while todo:
        obj = todo.pop()
        if obj is target:
            return True
        if isinstance(obj, (types.ModuleType, type)):
            continue
        if isinstance(obj, types.FunctionType):
            found = [c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None]
            found += list(obj.__defaults__ or ())
        else:
            found = gc.get_referents(obj)
            if hasattr(obj, "__dict__"):
                found.append(vars(obj))
        for r in found:
            if id(r) not in seen:
                seen.add(id(r))
                todo.append(r)
    return False


def released(rank: int, world: int) -> dict[str, Any]:
    """A sharded state whose runtime is released (as ct.run does before destroying its group)."""
    batch = distributed_workers.shard(
        distributed_workers.global_batch("classify", [4] * world, 0, torch.float64), [4] * world, rank
    )
    state = make_state("classify", 0, torch.float64)
    step = ct.sharded(distributed_workers.classify)
    step(state, batch)
    found: dict[str, Any] = {"held_before": holds(state, dist.group.WORLD)}
    state.release_runtime()
    found["held_after"] = holds(state, dist.group.WORLD)
    before = {n: p.to_local().clone() for n, p in state.model.named_parameters()}
    try:
        step(state, batch)
        found["next_step"] = "no error"
    except Exception as e:
        found["next_step"] = f"{type(e).__name__}: {e}"
    found["untouched"] = all(torch.equal(p.to_local(), before[n]) for n, p in state.model.named_parameters())
    fresh = make_state("classify", 0, torch.float64)  # the group itself lives on: another state trains on it
    found["fresh_loss"] = float(step(fresh, batch).loss)
    return found


FP16_UPDATES = 8  # rank batches of 6, two micro-batches of 3 each


def fp16_batch(rank: int, world: int, i: int, poisoned: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch of update ``i``; at update ``poisoned`` the last rank's inputs are too large
    for fp16 (inf once autocast casts them, NaN after the first layer): the update must be skipped."""
    x, y = distributed_workers.shard(
        distributed_workers.global_batch("classify", [6] * world, 500 + i, torch.float32), [6] * world, rank
    )
    return (x * 1e6 if i == poisoned and rank == world - 1 else x), y


def fp16_scaling(growth_interval: int) -> dict[str, Any]:
    """mixed_precision's loss scaling as a checkpoint holds it: GradScaler's defaults (as
    composetrain's _scaling.DYNAMIC), but growing after ``growth_interval`` clean updates."""
    scaler = {"scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": growth_interval}
    return {"mode": ("fp16", None), "scaler": {**scaler, "_growth_tracker": 0}, "consecutive_skips": 0}


def fp16_record(model: nn.Module, optimizer: torch.optim.Optimizer, scale: float, skipped: bool, loss: Any) -> Any:
    return {
        "params": {n: full(p) for n, p in model.named_parameters()},
        "optimizer": {
            k: {name: full(v) for name, v in entries.items()} for k, entries in optimizer.state_dict()["state"].items()
        },
        "scale": scale,
        "skipped": bool(skipped),
        "loss": loss.detach().clone(),
    }


def fp16_composetrain(
    rank: int, world: int, printed: str, growth_interval: int, poisoned: int, optimizer: str
) -> list[dict[str, Any]]:
    """ct.sharded + ct.mixed_precision('fp16') + ct.accumulate(2) (+ clip_grad_norm(0.5)), nested as
    ``printed`` says (as the step prints: ``"sharded(mixed_precision(dtype='fp16')(accumulate(2)(step)))"``):
    one record per update."""
    parts = {
        "sharded": ct.sharded,
        "mixed_precision(dtype='fp16')": ct.mixed_precision(dtype="fp16"),
        "accumulate(2)": ct.accumulate(2),
        "clip_grad_norm(0.5)": ct.clip_grad_norm(0.5),
    }
    train = composed(printed, parts, distributed_workers.classify)
    state = fp16_state(optimizer)
    saved = state.state_dict()  # the scaler's growth interval arrives as a checkpoint would bring it
    state.load_state_dict({**saved, "transforms": {"mixed_precision": fp16_scaling(growth_interval)}})
    records = []
    for i in range(FP16_UPDATES):
        out = train(state, fp16_batch(rank, world, i, poisoned))
        scale = state.state_dict()["transforms"]["mixed_precision"]["scaler"]["scale"]
        records.append(fp16_record(state.model, state.optimizer, scale, bool(out.skipped), out.loss))
    return records


def fp16_state(optimizer: str) -> ct.TrainState:
    """float32 weights, the same on every rank; no scheduler (the textbook loop would step it on a skip too)."""
    torch.manual_seed(11)
    model = Net()
    return ct.TrainState(model, fp16_optimizer(model, optimizer))


def fp16_optimizer(model: nn.Module, optimizer: str) -> torch.optim.Optimizer:
    if optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def fp16_textbook(rank: int, world: int, clip: bool, growth_interval: int, poisoned: int, optimizer: str) -> Any:
    """The FSDP2 + GradScaler loop as torch documents it, by hand: one record per update."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = fp16_state(optimizer).model
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    for block in reversed(model.blocks):  # sharded's default units, innermost (last) first, then the root
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = fp16_optimizer(model, optimizer)  # built on the sharded parameters
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=growth_interval
    )
    records = []
    for i in range(FP16_UPDATES):
        x, y = fp16_batch(rank, world, i, poisoned)
        micro = [(x[:3], y[:3]), (x[3:], y[3:])]
        shares = []
        for j, (mx, my) in enumerate(micro):
            model.set_requires_gradient_sync(j == len(micro) - 1)  # reduce-scatter after the last backward only
            with torch.autocast("cpu", dtype=torch.float16):
                loss, _ = distributed_workers.classify(model, (mx, my))
            share = loss * (len(mx) / len(x))
            scaler.scale(share).backward()
            shares.append(share.detach())
        model.set_requires_gradient_sync(True)
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        total = sum(shares[1:], shares[0])
        records.append(fp16_record(model, opt, scaler.get_scale(), scaler.get_scale() < before, total))
    return records


def fp16_both(
    rank: int, world: int, printed: str, growth_interval: int = 1, poisoned: int = 3, optimizer: str = "sgd"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """composetrain's records and the textbook loop's, on the same rank batches from the same weights."""
    mine = fp16_composetrain(rank, world, printed, growth_interval, poisoned, optimizer)
    theirs = fp16_textbook(rank, world, "clip_grad_norm" in printed, growth_interval, poisoned, optimizer)
    return mine, theirs
