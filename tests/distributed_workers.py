"""Cases run on every rank of a processes.Pool, and their single-process references.

A case names its composition as the composed step prints (``step`` for the step, ``n`` for the case's
accumulation count, or micro-batch size): ``"distributed(clip_grad_norm(0.5)(accumulate(n)(step)))"``. The global
batch of each update is the concatenation of the ranks' shards in rank order, so
the reference is the composition without ``distributed`` on the global batch, in one process.

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import composed, without
from torch import nn

import composetrain as ct

IN, CLASSES, VOCAB, PAD = 5, 3, 7, -100


def classify(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).to(logits.dtype).mean()}


def token_step(model, batch):
    logits = model(batch["tokens"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=PAD)


def real_tokens(batch):
    return (batch["labels"] != PAD).sum()


def build(printed: str, n: int, kind: str, **distributed_options: Any) -> ct.TrainStep:
    """The composition ``printed`` (as the step prints: ``"distributed(accumulate(n)(step))"``)."""
    step = token_step if kind == "tokens" else classify
    weight = real_tokens if kind == "tokens" else None
    parts = {
        "distributed": ct.distributed(**distributed_options),
        "mixed_precision(dtype='bf16')": ct.mixed_precision(dtype="bf16"),
        "accumulate(n)": ct.accumulate(n, weight=weight),
        "accumulate(micro_batch=n)": ct.accumulate(micro_batch=n, weight=weight),
        "clip_grad_norm(0.5)": ct.clip_grad_norm(0.5),
    }
    return composed(printed, parts, step)


def make_state(kind: str, seed: int, dtype: torch.dtype) -> ct.TrainState:
    torch.manual_seed(seed)
    if kind == "tokens":
        model = nn.Sequential(nn.Embedding(VOCAB, 6), nn.Tanh(), nn.Linear(6, VOCAB))
    else:
        model = nn.Sequential(nn.Linear(IN, 8), nn.Tanh(), nn.Linear(8, CLASSES))
    model.to(dtype)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))


def global_batch(kind: str, sizes: list[int], seed: int, dtype: torch.dtype) -> Any:
    """The global batch: ``sizes[r]`` samples for rank r, concatenated in rank order.

    Token batches give rank r sequences of rank-dependent lengths, so ranks hold
    different numbers of real tokens.
    """
    g = torch.Generator().manual_seed(seed)
    total = sum(sizes)
    if kind == "tokens":
        tokens = torch.randint(0, VOCAB, (total, 10), generator=g)
        labels = torch.randint(0, VOCAB, (total, 10), generator=g)
        row = 0
        for rank, size in enumerate(sizes):
            for _ in range(size):
                length = int(torch.randint(1, 4 + 6 * (rank % 2), (), generator=g))
                labels[row, length:] = PAD
                row += 1
        return {"tokens": tokens, "labels": labels}
    return torch.randn(total, IN, generator=g, dtype=dtype), torch.randint(0, CLASSES, (total,), generator=g)


def shard(batch: Any, sizes: list[int], rank: int) -> Any:
    start, stop = sum(sizes[:rank]), sum(sizes[: rank + 1])
    if isinstance(batch, dict):
        return {k: v[start:stop] for k, v in batch.items()}
    return tuple(t[start:stop] for t in batch)


def train(case: dict[str, Any], rank: int | None, **distributed_options: Any) -> dict[str, Any]:
    """Run the case's updates; rank None is the single-process reference on the global batches."""
    dtype = torch.float32 if "mixed_precision" in case["composition"] else torch.float64
    printed = case["composition"] if rank is not None else without(case["composition"], "distributed")
    # ranks start from different weights: DDP must broadcast rank 0's, the reference's
    state = make_state(case["kind"], case["seed"] + (rank or 0), dtype)
    step = build(printed, case["n"], case["kind"], **distributed_options)
    losses, skipped, released = [], [], None
    for i, sizes in enumerate(case["sizes"]):
        batch = global_batch(case["kind"], sizes, case["seed"] * 100 + i, dtype)
        out = step(state, batch if rank is None else shard(batch, sizes, rank))
        if i == case.get("release_after") and rank is not None:
            released = wrapper(state)
            state.release_runtime()  # the DDP wrapper goes; the next update builds a new one
            assert wrapper(state) is None
        if i == case.get("regroup_after") and rank is not None:
            regroup(rank)  # the old wrapper's group is gone; the next update must not use it
        losses.append(out.loss)
        skipped.append(bool(out.skipped))
    if released is not None:
        assert wrapper(state) not in (None, released), "no new DDP wrapper was built"
    if "regroup_after" in case and rank is not None:  # the wrapper in use is bound to the live group
        assert wrapper(state).process_group is dist.group.WORLD, "a DDP wrapper of a destroyed group was reused"
    return {
        "params": [p.detach().clone() for p in state.model.parameters()],
        "losses": losses,
        "skipped": skipped,
        "step": state.step,
        "lr": state.scheduler.get_last_lr(),
    }


def wrapper(state: ct.TrainState) -> Any:
    """The DDP wrapper that ``distributed`` keeps in the state (None before the first update)."""
    return state.transform_state("distributed", lambda: None).ddp


def regroup(rank: int) -> None:
    """Destroy the default process group and make a new one of the same ranks."""
    from processes import free_port

    world = dist.get_world_size()
    port = torch.tensor(free_port() if rank == 0 else 0)
    dist.broadcast(port, src=0)
    dist.destroy_process_group()
    store = dist.TCPStore("127.0.0.1", int(port), world, is_master=rank == 0, wait_for_workers=True)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)


def run_case(rank: int, world: int, case: dict[str, Any]) -> dict[str, Any]:
    return train(case, rank)


def count_syncs(rank: int, world: int, n: int, updates: int) -> list[int]:
    """All-reduces per update through a counting DDP communication hook, one bucket per parameter.

    DDP reduces its first iteration in one bucket and rebuilds its buckets after it, so
    the first update counts 1 whatever the parameters."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls: list[int] = []

    def counting(state, bucket):  # unannotated: DDP checks hook annotations against its own types
        calls.append(1)
        return allreduce_hook(state, bucket)

    state = make_state("classify", 0, torch.float64)
    step = build("distributed(accumulate(n)(step))", n, "classify", bucket_cap_mb=1e-6, comm_hook=counting)
    per_update = []
    for i in range(updates):
        before = len(calls)
        step(state, shard(global_batch("classify", [8] * world, i, torch.float64), [8] * world, rank))
        per_update.append(len(calls) - before)
    return per_update


def syncs_without_no_sync(rank: int, world: int, n: int) -> int:
    """What a loop that forgets no_sync pays: a gradient all-reduce after every micro-batch."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    from torch.nn.parallel import DistributedDataParallel

    calls: list[int] = []

    def counting(state, bucket):  # unannotated: DDP checks hook annotations against its own types
        calls.append(1)
        return allreduce_hook(state, bucket)

    state = make_state("classify", 0, torch.float64)
    ddp = DistributedDataParallel(state.model, bucket_cap_mb=1e-6)
    ddp.register_comm_hook(None, counting)
    x, y = shard(global_batch("classify", [8] * world, 0, torch.float64), [8] * world, rank)
    F.cross_entropy(ddp(x), y).backward()  # DDP's first iteration, after which it rebuilds its buckets
    del calls[:]
    for xb, yb in zip(x.tensor_split(n), y.tensor_split(n), strict=True):
        (F.cross_entropy(ddp(xb), yb) / n).backward()
    dist.barrier()
    return len(calls)


def fewest(rank: int, world: int) -> int:
    """Each rank offers a different count; all agree on the smallest."""
    proc = ct.rendezvous(rank=rank, world_size=world)  # the pool's group: reused, not re-created
    return proc.fewest(10 + 3 * rank)


def static_graph_updates(rank: int, world: int, n: int) -> dict[str, Any]:
    """Two updates of distributed(static_graph=True)(accumulate(n)(classify)): what it said, or the parameters."""
    state = make_state("classify", 0, torch.float64)
    before = [p.detach().clone() for p in state.model.parameters()]
    batch = shard(global_batch("classify", [4] * world, 1, torch.float64), [4] * world, rank)
    train = ct.distributed(static_graph=True)(ct.accumulate(n)(classify))
    try:
        for _ in range(2):
            train(state, batch)
    except (ValueError, RuntimeError) as e:
        unchanged = all(torch.equal(p, q) for p, q in zip(before, state.model.parameters(), strict=True))
        return {"said": str(e), "step": state.step, "unchanged": unchanged}
    return {"said": None, "step": state.step, "params": [p.detach().clone() for p in state.model.parameters()]}


def refuse_on_one_rank(rank: int, world: int, fault: str) -> dict[str, Any]:
    """Three updates; in the second, rank 0 alone refuses after its passes (``fault``: a metric name a transform
    reports, or a buffer re-registered in another dtype, which ct.ema refuses). Every rank must refuse it with
    rank 0, so that all train on alike."""
    state = make_state("classify", rank, torch.float64)
    state.model.append(
        nn.BatchNorm1d(CLASSES, dtype=torch.float64)
    )  # a buffer the forward changes, one ct.ema averages
    faulty = {"on": False, "pieces": 0}

    def step(model: nn.Module, batch: Any) -> Any:
        loss, metrics = classify(model, batch)
        faulty["pieces"] += 1
        # the metric clash in every micro-batch, the other faults in the last only: an error in an earlier one's
        # forward would leave the others waiting in the last backward's gradient all-reduce (DDP cannot leave it)
        if faulty["on"] and rank == 0 and (fault == "metric" or faulty["pieces"] % 2 == 0):
            if fault == "metric":  # refused after the passes: in verify
                metrics = {**metrics, "grad_norm": loss.detach()}
            elif fault == "metric-last-piece":  # refused in the passes, after the last backward's all-reduce
                metrics = {**metrics, "late": loss.detach()}
            else:
                norm = model.module[-1]  # the DDP wrapper's module
                norm.running_mean = norm.running_mean.float()
        return loss, metrics

    train = ct.ema(0.9)(ct.distributed(ct.clip_grad_norm(0.5)(ct.accumulate(2)(step))))
    train.setup(state)
    errors = []
    for i in range(3):
        g = torch.Generator().manual_seed(10 * i + rank)
        batch = (torch.randn(6, IN, generator=g, dtype=torch.float64), torch.randint(0, CLASSES, (6,), generator=g))
        faulty["on"] = i == 1
        try:
            train(state, batch)
        except (ValueError, RuntimeError) as e:
            errors.append(str(e))
    return {
        "errors": errors,
        "step": state.step,
        "params": [p.detach().clone() for p in state.model.parameters()],
        "ema": {k: t.clone() for k, t in ct.ema_model(state).state_dict().items()},
    }
