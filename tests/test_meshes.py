"""HSDP (``sharded(replicate=R)``), ``tensor_parallel`` and multi-process ``pipeline`` on 4 spawned gloo processes,
each against the one-process large-batch update in float64 on a small transformer (tied embeddings, LayerNorm,
padded sequences with token weights), with clipping active; checkpoints saved on one mesh shape and resumed on
another (and in one process); and bad input: meshes that do not divide, plans that name no layer, ranks that
disagree, a killed rank.

One pool of 4 ranks serves the whole module (starting processes that import torch is the slow part here); its
rank functions live in this file (``pool.run("test_meshes", name, ...)``). The last test kills ranks: it runs last.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import composetrain as ct

WORLD = 4
VOCAB, WIDTH, CONTEXT, HEAD = 16, 8, 6, 4
MAX_NORM = 0.05  # below every update's gradient norm here: clipping is active in every case
BATCH = 16  # the global batch
UPDATES = 3
STAGES = [["0", "1"], ["2", "3"]]  # embed + block | block + head (the head's weight is the embedding's)


class Block(nn.Module):
    """Pre-norm causal attention and MLP; q, k, v separate so that a column split keeps whole heads."""

    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.q, self.k, self.v = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)
        self.up, self.down = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        h = self.norm1(x)
        q, k, v = (f(h).view(b, t, -1, HEAD).transpose(1, 2) for f in (self.q, self.k, self.v))  # local heads
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        x = x + self.out(a)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.positions = nn.Embedding(CONTEXT, WIDTH)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.tokens(ids) + self.positions(torch.arange(ids.shape[1], device=ids.device))


class Head(nn.Module):
    def __init__(self, embed: Embed) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.proj = nn.Linear(WIDTH, VOCAB, bias=False)
        self.proj.weight = embed.tokens.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))


def gpt(seed: int = 0) -> nn.Sequential:
    """The model: its forward is the chain of its four children, so it splits into pipeline stages."""
    torch.manual_seed(seed)
    embed = Embed()
    return nn.Sequential(embed, Block(), Block(), Head(embed)).double()


def plan() -> dict[str, Any]:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    per_block = {"q": ColwiseParallel(), "k": ColwiseParallel(), "v": ColwiseParallel(), "out": RowwiseParallel()}
    per_block |= {"up": ColwiseParallel(), "down": RowwiseParallel()}
    return {f"[12].{name}": style for name, style in per_block.items()}  # both blocks, by pattern


def tokens(batch: Any) -> torch.Tensor:
    """The units the loss averages over: the labels that are not padding."""
    return (batch[1] != -100).sum()


def step(model: nn.Module, batch: Any) -> torch.Tensor:
    ids, labels = batch
    logits = model(ids)
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)  # mean over real tokens


def dataset(n: int = BATCH * UPDATES, seed: int = 0) -> torch.utils.data.TensorDataset:
    """Padded sequences of 1..CONTEXT real tokens: the shards of a batch hold different token counts."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (n, CONTEXT), generator=g)
    labels = torch.randint(0, VOCAB, (n, CONTEXT), generator=g)
    lengths = torch.randint(1, CONTEXT + 1, (n,), generator=g)
    labels[torch.arange(CONTEXT)[None] >= lengths[:, None]] = -100
    return torch.utils.data.TensorDataset(ids, labels)


def global_batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = dataset()
    return data.tensors[0][i * BATCH : (i + 1) * BATCH], data.tensors[1][i * BATCH : (i + 1) * BATCH]


def shard_of(batch: Any, index: int, count: int) -> Any:
    size = BATCH // count
    return tuple(t[index * size : (index + 1) * size] for t in batch)


def fresh_state(seed: int = 0) -> ct.TrainState:
    model = gpt(seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=1e-3)
    return ct.TrainState(model, optimizer, torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9))


def whole(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().clone()


def record(state: ct.TrainState, outs: list[Any]) -> dict[str, Any]:
    """What a run ends with, as whole tensors on every rank: parameters by name, the gradient norms, the losses."""
    return {
        "params": {k: whole(v) for k, v in state.state_dict()["model"].items()},  # whole: all stages too
        "norms": [float(whole(o.metrics["grad_norm"])) for o in outs],
        "losses": [float(o.loss) for o in outs],
        "step": state.step,
    }


def reference(updates: int = UPDATES, ema: float | None = None) -> dict[str, Any]:
    """The one-process large-batch update: the plain step on every global batch, clipped."""
    state = fresh_state()
    inner = ct.clip_grad_norm(MAX_NORM)(step)
    train = ct.ema(ema)(inner) if ema is not None else inner
    outs = [train(state, global_batch(i)) for i in range(updates)]
    found = record(state, outs)
    if ema is not None:
        found["ema"] = {k: whole(v) for k, v in ct.ema_model(state).state_dict().items()}
    return found


# -- rank functions (pool.run("test_meshes", ...)) ---------------------------------------------------------------


def compositions() -> dict[str, Any]:
    weighted = ct.accumulate(2, weight=tokens)  # token-level means, exact across ranks and micro-batches
    clip = ct.clip_grad_norm(MAX_NORM)
    return {
        "hsdp": ct.sharded(ct.ema(0.5)(clip(weighted(step))), modules=Block, replicate=2),
        "tp_fsdp": ct.sharded(ct.tensor_parallel(plan(), size=2)(clip(weighted(step))), modules=Block),
        "tp_ddp": ct.distributed(clip(ct.tensor_parallel(plan(), size=2)(weighted(step)))),
        "pp_ddp_1f1b": ct.distributed(clip(weighted(ct.pipeline(STAGES, microbatches=2)(step)))),
        "pp_ddp_gpipe": ct.distributed(clip(weighted(ct.pipeline(STAGES, microbatches=2, schedule="gpipe")(step)))),
        "pp_fsdp": ct.sharded(clip(weighted(ct.pipeline(STAGES, microbatches=2)(step))), modules=Block),
    }


def shard_index(train: ct.TrainStep, rank: int) -> tuple[int, int]:
    return train.capabilities.data_shard(rank, WORLD)


def train_by_hand(rank: int, world: int, name: str) -> dict[str, Any]:
    """``name``'s composition for UPDATES updates on this rank's shard of each global batch."""
    train = compositions()[name]
    state = fresh_state(seed=rank)  # each rank builds its own weights: the transforms start them all from rank 0's
    index, count = shard_index(train, rank)
    outs = [train(state, shard_of(global_batch(i), index, count)) for i in range(UPDATES)]
    found = record(state, outs)
    if name == "hsdp":
        into = gpt()
        found["ema"] = {k: whole(v) for k, v in ct.ema_model(state, into=into).state_dict().items()}
    found["shard"] = (index, count)
    found["kinds"] = sorted({type(p).__name__ for p in state.model.parameters()})
    state.release_runtime()
    return found


# -- the tests -------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pool():
    from processes import Pool

    p = Pool(WORLD)
    yield p
    if p.broken is None:
        p.close()


def assert_close_to(found: dict[str, Any], ref: dict[str, Any], rtol: float = 1e-12) -> float:
    """Every parameter within ``rtol`` of the reference's, relative to its largest magnitude; the largest gap."""
    worst = 0.0
    for name, p in ref["params"].items():
        gap = float((found["params"][name] - p).abs().max() / p.abs().max().clamp_min(1e-300))
        worst = max(worst, gap)
        assert gap <= rtol, (name, gap)
    return worst


@pytest.mark.parametrize("name", ["hsdp", "tp_fsdp", "tp_ddp", "pp_ddp_1f1b", "pp_ddp_gpipe", "pp_fsdp"])
def test_each_layout_is_the_one_process_large_batch_update(pool, name):
    results = pool.run("test_meshes", "train_by_hand", name, timeout=300)
    ref = reference(ema=0.5 if name == "hsdp" else None)
    for rank, found in enumerate(results):
        worst = assert_close_to(found, ref)
        print(f"{name} rank {rank}: largest relative gap {worst:.2e}")
        assert found["norms"] == pytest.approx(ref["norms"], rel=1e-12)
        assert min(found["norms"]) > MAX_NORM  # clipping was active in every update
        assert found["step"] == UPDATES
    if name == "hsdp":
        for k, v in ref["ema"].items():
            torch.testing.assert_close(results[0]["ema"][k], v, rtol=1e-12, atol=1e-14)
