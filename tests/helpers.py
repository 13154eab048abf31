"""What several test files share: batches, steps, models (Net, Block), state comparisons, the multi-rank cases
run on a pool's ranks (distributed and sharded, with their one-process references) and a tiny Hugging Face GPT-2."""

from __future__ import annotations

import copy
import dataclasses
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

import composetrain as ct

IN, CLASSES = 5, 3


@dataclasses.dataclass
class Pair:
    x: torch.Tensor
    y: torch.Tensor
    tag: str = "pair"


class XY(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


STRUCTURES = ("tuple", "list", "dict", "ordered", "namedtuple", "dataclass", "nested")


def make_batch(size: int, structure: str = "tuple", seed: int = 0, dtype=torch.float64) -> Any:
    """A classification batch of ``size`` samples in the given nesting."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(size, IN, generator=g, dtype=dtype)
    y = torch.randint(0, CLASSES, (size,), generator=g)
    return {
        "tuple": lambda: (x, y),
        "list": lambda: [x, y],
        "dict": lambda: {"x": x, "y": y, "source": "synthetic"},
        "ordered": lambda: OrderedDict(y=y, x=x),
        "namedtuple": lambda: XY(x, y),
        "dataclass": lambda: Pair(x, y),
        # a 0-dim tensor and strings ride along unsplit
        "nested": lambda: {"inputs": (x, {"scale": torch.tensor(1.0, dtype=dtype)}), "meta": [y, "tag"]},
    }[structure]()


def get_xy(batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(batch, (Pair, XY)):
        return batch.x, batch.y
    if isinstance(batch, dict) and "inputs" in batch:
        x, extra = batch["inputs"]
        return x * extra["scale"], batch["meta"][0]
    if isinstance(batch, dict):
        return batch["x"], batch["y"]
    return batch[0], batch[1]


def classify(model: nn.Module, batch: Any):
    """A plain step: mean cross-entropy and accuracy over samples."""
    x, y = get_xy(batch)
    logits = model(x)
    acc = (logits.argmax(-1) == y).to(logits.dtype).mean()
    return F.cross_entropy(logits, y), {"acc": acc, "n_classes": float(CLASSES)}


def mlp(seed: int = 0, dtype=torch.float64) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(IN, 8), nn.Tanh(), nn.Linear(8, CLASSES)).to(dtype)


def make_state(seed: int = 0, *, model: nn.Module | None = None, optimizer: str = "sgd", scheduler: bool = True):
    model = mlp(seed) if model is None else model
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5) if scheduler else None
    return ct.TrainState(model, opt, sched)


def assert_states_close(a: ct.TrainState, b: ct.TrainState, *, rtol: float = 1e-10, atol: float = 1e-12) -> None:
    """Same params, optimizer state, scheduler and step (exact when rtol=atol=0)."""
    assert a.step == b.step
    for (na, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
        torch.testing.assert_close(pa, pb, rtol=rtol, atol=atol, msg=lambda m, n=na: f"param {n}: {m}")
    sa, sb = a.optimizer.state_dict(), b.optimizer.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for key in sa["state"]:
        for name, va in sa["state"][key].items():
            torch.testing.assert_close(va, sb["state"][key][name], rtol=rtol, atol=atol)
    if a.scheduler is not None:
        assert a.scheduler.state_dict() == b.scheduler.state_dict()


def assert_states_equal(a: ct.TrainState, b: ct.TrainState) -> None:
    assert_states_close(a, b, rtol=0, atol=0)


def snapshot(state: ct.TrainState) -> dict[str, Any]:
    """A deep copy of everything a failed call must leave unchanged, gradients included."""
    return {
        "state": copy.deepcopy(state.state_dict()),
        "grads": [None if p.grad is None else p.grad.clone() for p in state.model.parameters()],
    }


def assert_untouched(state: ct.TrainState, before: dict[str, Any]) -> None:
    now = snapshot(state)
    assert now["state"]["step"] == before["state"]["step"]
    assert now["state"]["scheduler"] == before["state"]["scheduler"]
    for k, v in before["state"]["model"].items():
        assert torch.equal(now["state"]["model"][k], v), k
    assert now["state"]["optimizer"]["param_groups"] == before["state"]["optimizer"]["param_groups"]
    assert now["state"]["optimizer"]["state"].keys() == before["state"]["optimizer"]["state"].keys()
    for key, entries in before["state"]["optimizer"]["state"].items():
        for name, v in entries.items():
            assert torch.equal(now["state"]["optimizer"]["state"][key][name], v)
    assert all(g is None for g in now["grads"]), "a failed call left gradients behind"


def slurm_env(procid: str, ntasks: str, localid: str, **overrides: str | None) -> dict[str, str]:
    """SLURM's variables for task ``procid`` of ``ntasks`` (``localid`` on its node) of job 123456 on the 2 nodes
    gpu[07-08]; ``overrides`` add or replace variables, None removes one."""
    env: dict[str, str | None] = {
        "SLURM_PROCID": procid,
        "SLURM_NTASKS": ntasks,
        "SLURM_LOCALID": localid,
        "SLURM_NNODES": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SLURM_JOB_ID": "123456",
    }
    env.update(overrides)
    return {k: v for k, v in env.items() if v is not None}


def outcome(call: Any) -> str:
    """The error ``call()`` raised, as text (``"ValueError: ..."``: every rank of a pool must raise one, none may
    hang), or "no error"."""
    try:
        call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def process_group_threads() -> list[str] | None:
    """Names of this process's threads that belong to a gloo process group or its store (Linux only).

    After the group is destroyed none may remain: one left running into the interpreter's
    exit can abort the process ("terminate called without an active exception")."""
    from pathlib import Path

    tasks = Path("/proc/self/task")
    if not tasks.is_dir():
        return None
    names = [(t / "comm").read_text().strip() for t in tasks.iterdir()]
    return [n for n in names if n.startswith(("pt_gloo", "gloo_", "pt_tcpstore"))]


def composed(printed: str, parts: dict[str, Any], step: Any) -> Any:
    """The composition written as the composed step prints, ``step`` standing for the step and ``n`` for the
    accumulation count: ``composed("distributed(accumulate(n)(step))", parts, classify)``. Each transform's
    printed prefix (``"distributed"``, ``"accumulate(n)"``) is a key of ``parts``, outermost first."""
    transforms = []
    rest = printed
    while rest != "step":
        fits = [k for k in parts if rest.startswith(k + "(") and rest.endswith(")")]
        if not fits:
            raise ValueError(f"composed: no transform of {sorted(parts)} begins {rest!r} (in {printed!r})")
        name = max(fits, key=len)
        transforms.append(parts[name])
        rest = rest[len(name) + 1 : -1]
    return ct.compose(*transforms)(step)


def without(printed: str, *names: str) -> str:
    """The printed composition with the transforms ``names`` left out (the single-process reference of a
    distributed one): ``without("distributed(accumulate(n)(step))", "distributed") == "accumulate(n)(step)"``."""
    for name in names:
        while name + "(" in printed:
            start = printed.index(name + "(")
            printed = printed[:start] + printed[start + len(name) + 1 : -1]
    return printed


def reseal(folder):
    """Record anew the checksums of a checkpoint folder's files that a test changed on purpose (state.pt rewritten
    to test what loading does with its content), as ct.run would have written them."""
    from pathlib import Path

    from composetrain.checkpoint.checksums import CHECKSUMS, digest, write_sums

    folder = Path(folder)
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != CHECKSUMS]
    write_sums(folder, {str(p.relative_to(folder)): digest(p) for p in files})


class Listed(Dataset[Any]):
    """The items of a list, as a map-style Dataset of a type of this module (a ct.cache store records its type)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def labelled(n: int = 12, seed: int = 0) -> list[Any]:
    """``n`` items ``(x, y)``: a float64 row of ``IN`` features drawn from ``seed``, and an int label."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(IN, dtype=torch.float64, generator=g), i % 3) for i in range(n)]


def reads_back(cached: Any, items: list[Any]) -> bool:
    """Whether every item reads back from ``cached`` (one by one, and with one ``__getitems__``) as ``items`` hold it:
    the same types, dtypes, shapes and bits."""
    from composetrain.data.equal import same_item

    together = cached.__getitems__(list(range(len(items))))
    return all(same_item(cached[i], x) and same_item(together[i], x) for i, x in enumerate(items))


class StopsAt(Dataset[Any]):
    """20 items ``(x, y)`` whose item 13 raises StopIteration (as ``next()`` on an exhausted iterator inside
    ``__getitem__`` would)."""

    def __len__(self) -> int:
        return 20

    def __getitem__(self, i: int) -> Any:
        if i == 13:
            raise StopIteration
        return torch.full((IN,), float(i), dtype=torch.float64), i % 3


def batches_seen(data: Any, epochs: int = 1, **options: Any) -> list[Any]:
    """The batches ``ct.run`` hands the step, in order (over a Dataset: batches of 4, unshuffled, by default)."""
    seen: list[Any] = []

    def record(model: nn.Module, batch: Any) -> Any:
        seen.append(batch)
        return classify(model, batch)

    if not isinstance(data, DataLoader):
        options = {"batch_size": 4, "shuffle": False, "num_workers": 0, **options}
    ct.run(ct.train_step(record), make_state(), data, epochs=epochs, progress=False, **options)
    return seen


# -- the multi-rank cases: a composition run on every rank of a processes.Pool, and its one-process reference -------
#
# A case names its composition as the composed step prints (``step`` for the step, ``n`` for the case's
# accumulation count, or micro-batch size): ``"distributed(clip_grad_norm(0.5)(accumulate(n)(step)))"``. The
# global batch of each update is the concatenation of the ranks' shards in rank order, so the reference is the
# composition without ``distributed`` (or ``sharded``) on the global batch, in one process.

VOCAB, PAD = 7, -100


def classify_acc(model, batch):
    """Mean cross-entropy and accuracy (the multi-rank cases' step: no other metric)."""
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).to(logits.dtype).mean()}


def token_step(model, batch):
    logits = model(batch["tokens"])
    return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=PAD)


def real_tokens(batch):
    return (batch["labels"] != PAD).sum()


def build_distributed(printed: str, n: int, kind: str, **distributed_options: Any) -> ct.TrainStep:
    """The composition ``printed`` (as the step prints: ``"distributed(accumulate(n)(step))"``)."""
    step = token_step if kind == "tokens" else classify_acc
    weight = real_tokens if kind == "tokens" else None
    parts = {
        "distributed": ct.distributed(**distributed_options),
        "mixed_precision(dtype='bf16')": ct.mixed_precision(dtype="bf16"),
        "accumulate(n)": ct.accumulate(n, weight=weight),
        "accumulate(micro_batch=n)": ct.accumulate(micro_batch=n, weight=weight),
        "clip_grad_norm(0.5)": ct.clip_grad_norm(0.5),
    }
    return composed(printed, parts, step)


def case_state(kind: str, seed: int, dtype: torch.dtype) -> ct.TrainState:
    """The distributed cases' model (a Sequential: an embedding for tokens), momentum SGD and a StepLR."""
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


def train_distributed(case: dict[str, Any], rank: int | None, **distributed_options: Any) -> dict[str, Any]:
    """Run the case's updates; rank None is the single-process reference on the global batches."""
    dtype = torch.float32 if "mixed_precision" in case["composition"] else torch.float64
    printed = case["composition"] if rank is not None else without(case["composition"], "distributed")
    # ranks start from different weights: DDP must broadcast rank 0's, the reference's
    state = case_state(case["kind"], case["seed"] + (rank or 0), dtype)
    step = build_distributed(printed, case["n"], case["kind"], **distributed_options)
    losses, skipped, released = [], [], None
    for i, sizes in enumerate(case["sizes"]):
        batch = global_batch(case["kind"], sizes, case["seed"] * 100 + i, dtype)
        out = step(state, batch if rank is None else shard(batch, sizes, rank))
        if i == case.get("release_after") and rank is not None:
            released = ddp_wrapper(state)
            state.release_runtime()  # the DDP wrapper goes; the next update builds a new one
            assert ddp_wrapper(state) is None
        if i == case.get("regroup_after") and rank is not None:
            regroup(rank)  # the old wrapper's group is gone; the next update must not use it
        losses.append(out.loss)
        skipped.append(bool(out.skipped))
    if released is not None:
        assert ddp_wrapper(state) not in (None, released), "no new DDP wrapper was built"
    if "regroup_after" in case and rank is not None:  # the wrapper in use is bound to the live group
        assert ddp_wrapper(state).process_group is dist.group.WORLD, "a DDP wrapper of a destroyed group was reused"
    return {
        "params": [p.detach().clone() for p in state.model.parameters()],
        "losses": losses,
        "skipped": skipped,
        "step": state.step,
        "lr": state.scheduler.get_last_lr(),
    }


def counting_allreduce() -> tuple[list[int], Callable[..., Any]]:
    """A DDP communication hook that all-reduces as DDP's default does and counts its calls: (calls, hook)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    calls: list[int] = []

    def counting(state, bucket):  # unannotated: DDP checks hook annotations against its own types
        calls.append(1)
        return allreduce_hook(state, bucket)

    return calls, counting


def syncs_per_update(
    step: Any, state: ct.TrainState, calls: list[int], rank: int, world: int, updates: int
) -> list[int]:
    """``updates`` updates of ``step`` on this rank's shards of classify batches of 8 per rank: how many times the
    counting hook (``counting_allreduce``'s ``calls``) ran in each."""
    per_update = []
    for i in range(updates):
        before = len(calls)
        step(state, shard(global_batch("classify", [8] * world, i, torch.float64), [8] * world, rank))
        per_update.append(len(calls) - before)
    return per_update


def ddp_wrapper(state: ct.TrainState) -> Any:
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


# -- models ----------------------------------------------------------------------------------------------------------


class Block(nn.Module):
    """``x + tanh(Linear(x))``, ``width`` wide (``residual=False``: ``tanh(Linear(x))``): the block the tests'
    module predicates, activation checkpointing and sharding units pick by class."""

    def __init__(self, width: int = 4, residual: bool = True) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)
        self.residual = residual

    def forward(self, x):
        return x + torch.tanh(self.lin(x)) if self.residual else torch.tanh(self.lin(x))


class Net(nn.Module):
    """An input layer ``inp`` (``inputs`` to ``width``), the ``parts`` in the order given (each made by its factory
    here, between the two layers, so that a seed gives the same weights; a ModuleList's members run one after the
    other), and an output layer (``width`` to ``outputs``) named ``last``. ``tanh_input`` applies tanh to the input
    layer's output.

        Net(layers=lambda: nn.ModuleList([Block(), Block()]))  # inp, layers.0, layers.1, out
        Net(width=8, output_layer="head", blocks=lambda: nn.ModuleList(Block(8) for _ in range(2)))
    """

    def __init__(
        self,
        inputs: int = IN,
        width: int = 4,
        outputs: int = CLASSES,
        *,
        input_layer: str = "inp",
        output_layer: str = "out",
        tanh_input: bool = False,
        **parts: Callable[[], nn.Module],
    ) -> None:
        super().__init__()
        setattr(self, input_layer, nn.Linear(inputs, width))
        for name, make in parts.items():
            setattr(self, name, make())
        setattr(self, output_layer, nn.Linear(width, outputs))
        self.order, self.tanh_input = [input_layer, *parts, output_layer], tanh_input

    def forward(self, x):
        first, *middle, last = (getattr(self, name) for name in self.order)
        x = first(x).tanh() if self.tanh_input else first(x)
        for part in middle:
            for layer in part if isinstance(part, nn.ModuleList) else [part]:
                x = layer(x)
        return last(x)


# -- the sharded cases (cases as above, the composition with ``sharded``) ------------------------------------------


def sharded_net() -> Net:
    """An input layer, a ModuleList of blocks (sharded's default units) and a head."""
    return Net(
        width=8,
        output_layer="head",
        tanh_input=True,
        blocks=lambda: nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2)),
    )


class TokenNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(6, 6), nn.Tanh())])
        self.head = nn.Linear(6, VOCAB)

    def forward(self, x):
        x = self.emb(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def sharded_state(kind: str, seed: int, dtype: torch.dtype, optimizer: str = "sgd") -> ct.TrainState:
    torch.manual_seed(seed)
    model = (TokenNet() if kind == "tokens" else sharded_net()).to(dtype)
    if optimizer == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return ct.TrainState(model, opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5))


def build_sharded(printed: str, n: int, kind: str) -> ct.TrainStep:
    """The composition ``printed`` (as the step prints: ``"sharded(accumulate(n)(step))"``)."""
    step = token_step if kind == "tokens" else classify_acc
    weight = real_tokens if kind == "tokens" else None
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


def train_sharded(case: dict[str, Any], rank: int | None) -> dict[str, Any]:
    """The case's updates; rank None is the single-process reference on the global batches."""
    dtype = torch.float32 if "mixed_precision" in case["composition"] else torch.float64
    printed = (
        case["composition"]
        if rank is not None
        else without(case["composition"], "sharded(sync_every_micro_batch=True)", "sharded")
    )
    # ranks start from different weights: sharded must broadcast rank 0's, the reference's
    state = sharded_state(case["kind"], case["seed"] + (rank or 0), dtype, case.get("optimizer", "sgd"))
    step = build_sharded(printed, case["n"], case["kind"])
    losses, metrics = [], []
    for i, sizes in enumerate(case["sizes"]):
        batch = global_batch(case["kind"], sizes, case["seed"] * 100 + i, dtype)
        out = step(state, batch if rank is None else shard(batch, sizes, rank))
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


# -- a tiny Hugging Face GPT-2 (built from a config, no download) and padded SFT batches ---------------------------

GPT2_VOCAB, LENGTH = 100, 16


def gpt2(seed: int = 0, dtype: torch.dtype = torch.float64, **overrides: Any) -> Any:
    """The issue's tiny GPT-2, without dropout (so that ranks and micro-batches are exactly comparable)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the config's token ids lie outside the tiny vocabulary: a warning per model
    torch.manual_seed(seed)
    options: dict[str, Any] = {
        "n_layer": 2,
        "n_head": 2,
        "n_embd": 64,
        "vocab_size": GPT2_VOCAB,
        "n_positions": 32,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "use_cache": False,
    }
    options.update(overrides)
    return GPT2LMHeadModel(GPT2Config(**options)).to(dtype)


def sft_batch(size: int, seed: int, lengths: tuple[int, int] = (4, LENGTH)) -> dict[str, torch.Tensor]:
    """``size`` right-padded sequences of ``lengths`` real tokens; labels -100 on the padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, GPT2_VOCAB, (size, LENGTH), generator=g)
    real = torch.randint(lengths[0], lengths[1] + 1, (size,), generator=g)
    mask = (torch.arange(LENGTH)[None] < real[:, None]).long()
    ids = ids * mask  # pad id 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, PAD)}


def lm_loss(model, batch):
    """The usual Hugging Face step. Its loss is computed in float32 (transformers upcasts the logits), so it
    agrees with the float64 textbook to float32 rounding; test_hf's ``exact_step`` keeps the model's dtype."""
    return model(**batch).loss
