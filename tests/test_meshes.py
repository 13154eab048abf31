"""HSDP (``sharded(replicate=R)``), ``tensor_parallel`` and multi-process ``pipeline`` on 4 spawned gloo processes,
each against the one-process large-batch update in float64 on a small transformer (tied embeddings, LayerNorm,
padded sequences with token weights), with clipping active; checkpoints saved on one mesh shape and resumed on
another (and in one process); and bad input: meshes that do not divide, plans that name no layer, ranks that
disagree, a killed rank.

One pool of 4 ranks serves the whole module (starting processes that import torch is the slow part here); its
rank functions live in this file (``pool.run("test_meshes", name, ...)``). The last test kills ranks: it runs last.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
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


def sequence_plan() -> dict[str, Any]:
    """Tensor parallel with sequence parallel between the splits (Megatron-SP, as torchtitan plans it): the residual
    stream sharded over the sequence from the embedding's output to the head's input, the LayerNorms run on their
    shard (SequenceParallel), each Colwise layer gathering the sequence and each Rowwise one reduce-scattering it."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
    )

    gather, scatter = (
        ColwiseParallel(input_layouts=Shard(1)),
        RowwiseParallel(output_layouts=Shard(1), use_local_output=False),
    )
    per_block = {"norm1": SequenceParallel(), "q": gather, "k": gather, "v": gather, "out": scatter}
    per_block |= {"norm2": SequenceParallel(), "up": gather, "down": scatter}
    found = {f"[12].{name}": style for name, style in per_block.items()}
    found["0"] = PrepareModuleOutput(
        output_layouts=Replicate(), desired_output_layouts=Shard(1), use_local_output=False
    )
    found["3"] = PrepareModuleInput(input_layouts=Shard(1), desired_input_layouts=Replicate(), use_local_output=True)
    return found


def apply_plan(model: nn.Module, tp_mesh: Any) -> None:
    """A plan given as a function: it applies parallelize_module itself."""
    from torch.distributed.tensor.parallel import parallelize_module

    parallelize_module(model, tp_mesh, plan())


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
        "tp_sp_fsdp": ct.sharded(ct.tensor_parallel(sequence_plan(), size=2)(clip(weighted(step))), modules=Block),
        # bf16 autocast leaves float64 alone: its finite check and the order of the transforms are what is tested;
        # the plan a function that applies one
        "tp_ddp": ct.distributed(
            ct.mixed_precision("bf16")(clip(ct.tensor_parallel(apply_plan, size=2)(weighted(step))))
        ),
        "pp_ddp_1f1b": ct.distributed(
            ct.mixed_precision("bf16")(clip(weighted(ct.pipeline(STAGES, microbatches=2)(step))))
        ),
        "pp_ddp_gpipe": ct.distributed(clip(weighted(ct.pipeline(STAGES, microbatches=2, schedule="gpipe")(step)))),
        "pp_fsdp": ct.sharded(
            ct.checkpoint_activations(Block)(clip(weighted(ct.pipeline(STAGES, microbatches=2)(step)))), modules=Block
        ),
        "hsdp_4x1": ct.sharded(ct.ema(0.5)(clip(weighted(step))), modules=Block, replicate=4),
        "fsdp4": ct.sharded(clip(weighted(step)), modules=Block),
        "ddp": ct.distributed(clip(weighted(step))),
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
    if name in ("hsdp", "tp_fsdp", "tp_sp_fsdp"):  # the whole model on rank 0, gathered from every shard and piece
        found["full"] = ct.full_state_dict(state.model)
    found["shard"] = (index, count)
    found["kinds"] = sorted({type(p).__name__ for p in state.model.parameters()})
    state.release_runtime()
    return found


RUN = {"shuffle": False, "num_workers": 0, "progress": False, "seed": 0, "log_every": 1}


def run_for(name: str, state: ct.TrainState, folder: str, updates: int) -> ct.RunResult:
    """``ct.run`` of ``name``'s composition up to ``updates`` updates in all (a global batch of BATCH samples per
    update: the processes of a data shard read theirs alike), checkpointing into ``folder``."""
    train = compositions()[name]
    _, shards = train.capabilities.data_shard(0, WORLD)
    return ct.run(train, state, dataset(), batch_size=BATCH // shards, max_steps=updates, checkpoint_dir=folder, **RUN)


def saved_then_resumed(rank: int, world: int, folder: str, first: str, then: str) -> dict[str, Any]:
    """``first``'s layout for UPDATES - 1 updates through ``ct.run`` (a checkpoint each update), then ``ct.run``
    again with ``then``'s layout on the same folder: it resumes from the checkpoint, resharded, to UPDATES."""
    first_run = run_for(first, fresh_state(seed=rank), folder, UPDATES - 1)
    state = fresh_state(seed=rank)
    resumed = run_for(then, state, folder, UPDATES)
    found = {"params": {k: whole(v) for k, v in state.state_dict()["model"].items()}, "step": state.step}
    assert [r["step"] for r in first_run.history] == list(range(1, UPDATES))
    found["norms"] = [r["grad_norm"] for r in resumed.history]  # the checkpoint's records and the resumed one's
    found["global_batch"] = {r["global_batch"] for r in resumed.history}
    if "ema" in compositions()[then].roles:
        found["ema"] = {k: whole(v) for k, v in ct.ema_model(state, into=gpt()).state_dict().items()}
    return found


def global_batch_across_meshes(rank: int, world: int, folder: str) -> dict[str, Any]:
    """``ct.run(global_batch_size=BATCH)``: PP 2 x DP 2 (rank r reads shard r % 2) for the first update, resumed on
    TP 2 x FSDP 2 (shard r // 2) for the second, then on FSDP 4 (shard r of 4) for the third; then a run given
    ``batch_size`` (per process) saved on PP 2 x DP 2 and resumed on TP 2 x FSDP 2. What each run logged, the
    random state each left, the parameters at the end, what the batch_size resume raised."""
    found: dict[str, Any] = {"global_batch": [], "norms": [], "rng": []}
    for updates, name in enumerate(["pp_ddp_gpipe", "tp_fsdp", "fsdp4"], 1):
        state = fresh_state(seed=rank)
        train = compositions()[name]
        result = ct.run(
            train, state, dataset(), global_batch_size=BATCH, max_steps=updates, checkpoint_dir=folder, **RUN
        )
        found["global_batch"].append({r["global_batch"] for r in result.history})
        found["norms"] = [r["grad_norm"] for r in result.history]
        found["rng"].append(torch.get_rng_state())  # none of the steps draws: as the resume left it
    found["params"] = {k: whole(v) for k, v in state.state_dict()["model"].items()}
    found["step"] = state.step
    per_process = f"{folder}-batch-size"
    run_for("pp_ddp_gpipe", fresh_state(seed=rank), per_process, 1)
    try:
        run_for("tp_fsdp", fresh_state(seed=rank), per_process, 2)
        found["refused"] = "no error"
    except ValueError as e:
        found["refused"] = str(e)
    return found


def loaded_then_trained(rank: int, world: int, checkpoint: str, name: str) -> dict[str, Any]:
    """``name``'s layout: its state laid out (``ct.apply_sharding``), a checkpoint of another layout loaded into
    it (``ct.load_checkpoint``), then the last update by hand."""
    train = compositions()[name]
    state = fresh_state(seed=rank)
    assert ct.apply_sharding(train, state) is (name != "ddp")  # distributed has nothing to lay out
    ct.load_checkpoint(state, checkpoint)
    index, count = shard_index(train, rank)
    out = train(state, shard_of(global_batch(UPDATES - 1), index, count))
    return {
        "params": {k: whole(v) for k, v in state.state_dict()["model"].items()},
        "step": state.step,
        "norms": [float(whole(out.metrics["grad_norm"]))],
    }


def one_process_from(checkpoint: str, ema: bool = False) -> dict[str, Any]:
    """A checkpoint of any layout loaded in this (the test's) process into the plain model, then the last update
    of the plain step: the one-process continuation."""
    state = fresh_state()
    ct.load_checkpoint(state, checkpoint)
    train = ct.clip_grad_norm(MAX_NORM)(step)
    train = ct.ema(0.5)(train) if ema else train
    out = train(state, global_batch(UPDATES - 1))
    found = record(state, [out])
    if ema:
        found["ema"] = {k: whole(v) for k, v in ct.ema_model(state).state_dict().items()}
    return found


def refusal(rank: int, world: int, case: str) -> str:
    """What one update of a bad layout or plan raises on this rank (its type and message)."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    weighted = ct.accumulate(2, weight=tokens)
    bad_plan = {
        "plan_missing": {**plan(), "[12].nope": ColwiseParallel()},
        "plan_kind": {"1.norm1": ColwiseParallel()},
        "plan_disagree": plan() if rank != 1 else {k: v for k, v in plan().items() if not k.endswith("down")},
        "plan_unpaired": {"1.up": ColwiseParallel()},
        "plan_a_step": step,  # a function of two arguments, called as plan(model, tp_mesh): it splits nothing
        "dropout": plan(),
    }
    stages = {
        "stages_disagree": STAGES if rank != 2 else [["0"], ["1", "2", "3"]],
        "stages_missing": [["0", "1"], ["2"]],
        "pp_3": [["0"], ["1"], ["2", "3"]],
    }
    build = {
        "replicate_3": lambda: ct.sharded(weighted(step), replicate=3),
        "tp_3": lambda: ct.sharded(ct.tensor_parallel(plan(), size=3)(weighted(step))),
        "tp_alone": lambda: ct.tensor_parallel(plan(), size=2)(weighted(step)),
        "plan_unpaired": lambda: ct.tensor_parallel(bad_plan[case], size=4)(weighted(step)),
        "pp_3": lambda: ct.distributed(ct.pipeline(stages[case], microbatches=3)(step)),
        "pipeline_batch": lambda: ct.distributed(ct.pipeline(STAGES, microbatches=3)(step)),
    }
    if case in bad_plan and case not in build:
        build[case] = lambda: ct.sharded(ct.tensor_parallel(bad_plan[case], size=2)(weighted(step)))
    if case in stages and case not in build:
        build[case] = lambda: ct.distributed(ct.pipeline(stages[case], microbatches=2)(step))
    state = fresh_state(seed=rank)
    if case == "global_batch_tp":  # 5 samples per update over the 2 data shards of TP 2 x FSDP 2
        try:
            ct.run(compositions()["tp_fsdp"], state, dataset(), global_batch_size=5, max_steps=1, **RUN)
        except ValueError as e:
            return f"{type(e).__name__}: {e}"
        return "no error"
    if case == "dropout":
        state.model[1].drop = nn.Dropout(0.1)  # registered, in training mode
    train = build[case]()
    try:
        try:
            index, count = train.capabilities.data_shard(rank, WORLD)
        except ValueError:
            index, count = 0, 1
        train(state, shard_of(global_batch(0), index, count))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    finally:
        state.release_runtime()
    return "no error"


def mesh_timeouts(rank: int, world: int) -> list[float]:
    """The timeouts of the job's group and of every group of a TP 2 x FSDP 2 mesh, in seconds."""
    from composetrain.transforms._mesh import KEY, _timeout

    state = fresh_state(seed=rank)
    train = compositions()["tp_fsdp"]
    index, count = shard_index(train, rank)
    train(state, shard_of(global_batch(0), index, count))
    place = state.transform_state(KEY, lambda: None).place
    groups = [place.world_group, place.data_group, place.group("shard"), place.group("tp")]
    found = [_timeout(g).total_seconds() for g in groups]
    state.release_runtime()
    return found


KILL = {"armed": False}


def dying_step(model: nn.Module, batch: Any) -> torch.Tensor:
    """The plain step, but the process running it exits at once while armed (a node lost mid-update)."""
    if KILL["armed"]:
        os._exit(1)
    return step(model, batch)


def killed_mid_pipeline(rank: int, world: int) -> dict[str, Any]:
    """PP 2 x DP 2: one update, then rank 3 (the last stage of the second replica) dies inside the next one's
    loss. Each other rank reports what it raised and after how long; then exits too, two seconds later, as a
    failed job's processes do (their peers see the connection close)."""
    train = ct.distributed(ct.pipeline(STAGES, microbatches=2)(dying_step))
    state = fresh_state(seed=rank)
    index, count = shard_index(train, rank)
    train(state, shard_of(global_batch(0), index, count))
    KILL["armed"] = rank == 3
    start = time.monotonic()
    try:
        train(state, shard_of(global_batch(1), index, count))
        found = {"error": None}
    except Exception as e:
        found = {"error": f"{type(e).__name__}: {e}"}
    found["seconds"] = time.monotonic() - start
    threading.Timer(2.0, os._exit, (0,)).start()
    return found


# -- the tests -------------------------------------------------------------------------------------------------------
# one process first (cheap): how ranks map onto the mesh, and what is refused when built


@settings(max_examples=60, deadline=None)
@given(stages=st.integers(1, 4), shards=st.integers(1, 4), tp=st.integers(1, 4), data=st.data())
def test_each_rank_reads_the_data_shard_of_its_mesh_coordinate(stages, shards, tp, data):
    """The driver's channel (Capabilities.data_shard) agrees with the mesh: pp outermost, tp innermost, so rank r
    reads shard (r // T) % D; the T ranks of a tensor-parallel group and the P stages read one shard alike."""
    world = stages * shards * tp
    rank = data.draw(st.integers(0, world - 1))
    coordinate = (torch.arange(world).reshape(stages, shards, tp) == rank).nonzero()[0].tolist()
    assert ct.Capabilities(data_ranks=(stages, tp)).data_shard(rank, world) == (coordinate[1], shards)


def test_the_splitting_transforms_tell_the_driver_how_many_ranks_share_a_batch():
    pp, tp = ct.pipeline(STAGES, microbatches=2)(step), ct.tensor_parallel(plan(), size=2)(step)
    assert ct.distributed(ct.clip_grad_norm(1.0)(pp)).capabilities.data_ranks == (2, 1)
    assert ct.sharded(ct.ema(0.5)(tp), replicate=2).capabilities.data_ranks == (1, 2)
    assert ct.sharded(step, replicate=2).capabilities.data_ranks == (1, 1)
    with pytest.raises(ValueError, match=r"2 pipeline stage.*x 1 tensor-parallel.*does not divide the 3 processes"):
        pp.capabilities.data_shard(0, 3)


def test_mesh_layouts_name_every_size_and_the_choices_when_they_do_not_divide():
    from composetrain.transforms._mesh import data_layout

    assert data_layout(8, (("replicate", 2), ("shard", None)), (1, 2), "who") == (
        ("replicate", 2),
        ("shard", 2),
        ("tp", 2),
    )
    assert data_layout(4, (("dp", None),), (2, 1), "who") == (("pp", 2), ("dp", 2))
    with pytest.raises(
        ValueError, match=r"pp=2 x replicate=3 x tp=2 = 12 does not divide the 8 processes.*\[1, 2, 4, 8\]"
    ):
        data_layout(8, (("replicate", 3), ("shard", None)), (2, 2), "who")


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: ct.tensor_parallel({}, size=2), ValueError, "plan must name at least one submodule"),
        (lambda: ct.tensor_parallel({"0": "colwise"}, size=2), TypeError, r"plan\['0'\] must be a ParallelStyle"),
        (lambda: ct.tensor_parallel({1: _colwise()}, size=2), TypeError, "plan's keys must be submodule names"),
        (lambda: ct.tensor_parallel(_colwise(), size=2), TypeError, "got the style ColwiseParallel alone"),
        (lambda: ct.tensor_parallel(ct.train_step(step), size=2), TypeError, "plan is required, got a step instead"),
        (lambda: ct.tensor_parallel(nn.Linear(2, 2), size=2), TypeError, "or be a function plan"),
        (lambda: ct.tensor_parallel(plan(), size=0), ValueError, "size must be a positive int, got 0"),
        (lambda: ct.tensor_parallel(plan(), size=True), TypeError, "size must be a positive int"),
        (lambda: ct.pipeline("0,1", microbatches=2), TypeError, "stages must be a list of stages"),
        (lambda: ct.pipeline([["0"], []], microbatches=2), TypeError, r"stages\[1\] must be a non-empty list"),
        (lambda: ct.pipeline([["0"], [1]], microbatches=2), TypeError, r"stages\[1\] holds 1 \(int\)"),
        (lambda: ct.pipeline(STAGES, microbatches=1), ValueError, "'1f1b' needs at least as many micro-batches as"),
        (lambda: ct.pipeline(STAGES, microbatches=2, schedule="zb"), ValueError, "schedule must be '1f1b' or 'gpipe'"),
        (lambda: ct.sharded(replicate=0), ValueError, "replicate must be a positive int, got 0"),
        (lambda: ct.sharded(replicate=2, process_group=object()), ValueError, "cannot shard over process_group"),
        (
            lambda: ct.sharded(ct.tensor_parallel(plan(), size=2)(step), process_group=object()),
            ValueError,
            "splits its model across processes",
        ),
    ],
)
def test_bad_arguments_are_refused_when_built(build, error, message):
    with pytest.raises(error, match=message):
        build()


def _colwise() -> Any:
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel()


class NotAChain(nn.Module):
    """A model whose forward adds a skip around its children: not the chain of them."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) + x)


def test_one_process_runs_the_stages_as_a_chain_so_check_finds_a_forward_that_is_not():
    def regress(model: nn.Module, batch: Any) -> torch.Tensor:
        return model(batch[0]).pow(2).mean()

    batch = (torch.randn(8, 4, dtype=torch.float64),)
    for model, agrees in ((nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 3)), True), (NotAChain(), False)):
        names = [["0", "1"], ["2"]] if agrees else [["a"], ["b"]]
        state = ct.TrainState(model.double(), torch.optim.SGD(model.parameters(), lr=0.1))
        result = ct.check(ct.pipeline(names, microbatches=2)(regress), state, batch)
        assert bool(result) is agrees, result
        assert "forward" not in model.__dict__  # the model's own forward is back


def test_a_pipeline_split_covers_every_parameter_once_but_for_tied_weights():
    from composetrain.transforms._stages import check_stages

    model = gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    split = check_stages(model, optimizer, tuple(map(tuple, STAGES)), "pipeline")
    assert split.tied() == ["0.tokens.weight"] and split.holders["0.tokens.weight"] == (0, 1)
    assert split.canonical["3.proj.weight"] == "0.tokens.weight"
    for stages, message in [
        ((("0", "1"), ("2",)), "parameter '3.norm.weight' lies in no stage"),
        ((("0", "1"), ("1.q", "2", "3")), "stages name '1.q' inside '1'"),
        ((("0", "1"), ("2", "9")), "stages name '9', which is not a submodule"),
        ((("0", "0"), ("2", "3")), "stages name '0' twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            check_stages(model, optimizer, stages, "pipeline")


def test_a_plan_names_submodules_as_parallelize_module_matches_them():
    from composetrain.transforms.tensor_parallel import _resolved

    model = gpt()
    assert [n for n, _ in _resolved(model, "[12].q")] == ["1.q", "2.q"]
    assert [n for n, _ in _resolved(model, "*.up")] == ["1.up", "2.up"]
    assert _resolved(model, "1.nope") == [] and _resolved(model, "4.q") == []


def test_full_state_dict_gathers_a_model_on_a_2d_mesh_and_says_gone_only_when_its_group_is(tmp_path):
    """A 2-D mesh has a group per dimension and none for the whole: full_state_dict looks each up, gathers, and
    names a group gone only once it is (one process, a 1 x 1 HSDP mesh)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = gpt()
        fully_shard(model, mesh=init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard")))
        assert {p.device_mesh.ndim for p in model.parameters()} == {2}
        found = ct.full_state_dict(model)
        assert found.keys() == gpt().state_dict().keys()
        for k, v in gpt().state_dict().items():
            assert type(found[k]) is torch.Tensor and torch.equal(found[k], v), k
        group = dist.new_group([0])  # a mesh over a group of its own, destroyed while the job's lives on
        other = nn.Linear(2, 2)
        fully_shard(other, mesh=DeviceMesh.from_group(group, "cpu"))
        dist.destroy_process_group(group)
        with pytest.raises(RuntimeError, match=r"a process group that is gone \(Could not resolve the process group"):
            ct.full_state_dict(other)
    finally:
        dist.destroy_process_group()
    with pytest.raises(
        RuntimeError, match=r"sharded over a process group that is gone \(no process group is initialised\)"
    ):
        ct.full_state_dict(model)


# several processes


@pytest.fixture(scope="module")
def pool():
    from processes import Pool

    p = Pool(WORLD)
    yield p
    if p.broken is None:
        p.close()
    else:  # the last test kills ranks: whatever is left goes
        p.kill()


def assert_close_to(found: dict[str, Any], ref: dict[str, Any], rtol: float = 1e-12) -> str:
    """Every parameter within ``rtol`` of the reference's, relative to its largest magnitude; the largest relative
    gap and the largest absolute difference, said."""
    worst = largest = 0.0
    for name, p in ref["params"].items():
        difference = float((found["params"][name] - p).abs().max())
        gap = difference / float(p.abs().max().clamp_min(1e-300))
        worst, largest = max(worst, gap), max(largest, difference)
        assert gap <= rtol, (name, gap)
    return f"largest relative gap {worst:.2e}, largest absolute difference {largest:.2e}"


@pytest.mark.parametrize("name", ["hsdp", "tp_fsdp", "tp_sp_fsdp", "tp_ddp", "pp_ddp_1f1b", "pp_ddp_gpipe", "pp_fsdp"])
def test_each_layout_is_the_one_process_large_batch_update(pool, name):
    results = pool.run("test_meshes", "train_by_hand", name, timeout=300)
    ref = reference(ema=0.5 if name == "hsdp" else None)
    for rank, found in enumerate(results):
        print(f"{name} rank {rank}: {assert_close_to(found, ref)}")
        assert found["norms"] == pytest.approx(ref["norms"], rel=1e-12)
        assert min(found["norms"]) > MAX_NORM  # clipping was active in every update
        assert found["step"] == UPDATES
    if name == "hsdp":
        for k, v in ref["ema"].items():
            torch.testing.assert_close(results[0]["ema"][k], v, rtol=1e-12, atol=1e-14)
    if "full" in results[0]:
        assert results[0]["full"].keys() == ref["params"].keys() and all(r["full"] == {} for r in results[1:])
        for k, v in ref["params"].items():
            torch.testing.assert_close(results[0]["full"][k], v, rtol=1e-12, atol=1e-14)


def checkpoint_of(folder: Any, updates: int) -> str:
    return str(folder / f"step-{updates:09d}")


def test_hsdp_saved_on_2x2_resumes_on_4x1_and_in_one_process(pool, tmp_path):
    """2 replicas x 2 shards for 2 updates, resumed as 4 replicas x 1 shard (ct.run, DCP resharding) for the third;
    and the 2x2 checkpoint loaded into plain distributed, into TP 2 x FSDP 2 (its pieces resharded from whole
    tensors) and in one process, unsharded, for the third: each equal to the uninterrupted run."""
    results = pool.run("test_meshes", "saved_then_resumed", str(tmp_path), "hsdp", "hsdp_4x1", timeout=300)
    ref = reference(ema=0.5)
    for found in results:
        assert found["step"] == UPDATES and found["global_batch"] == {BATCH}
        print(f"hsdp 2x2 -> 4x1: {assert_close_to(found, ref)}")
        assert found["norms"] == pytest.approx(ref["norms"], rel=1e-12) and min(found["norms"]) > MAX_NORM
    for name in ("ddp", "tp_fsdp"):  # plain distributed, and tensor parallel degree 1 -> 2 (under FSDP 2)
        for found in pool.run("test_meshes", "loaded_then_trained", checkpoint_of(tmp_path, UPDATES - 1), name):
            print(f"hsdp 2x2 -> {name}: {assert_close_to(found, ref)}")
            assert found["norms"] == pytest.approx(ref["norms"][-1:], rel=1e-12)
    one = one_process_from(checkpoint_of(tmp_path, UPDATES - 1), ema=True)
    print(f"hsdp 2x2 -> 1 process: {assert_close_to(one, ref)}")
    for k, v in ref["ema"].items():
        torch.testing.assert_close(one["ema"][k], v, rtol=1e-12, atol=1e-14)
        torch.testing.assert_close(results[0]["ema"][k], v, rtol=1e-12, atol=1e-14)


def test_tensor_parallel_checkpoints_load_at_another_degree_and_in_one_process(pool, tmp_path):
    """TP 2 x FSDP 2 through ct.run (each TP pair reads one data shard), its checkpoint loaded into FSDP 4 (TP
    degree 1) and in one process: the third update equal to the uninterrupted run's."""
    results = pool.run("test_meshes", "saved_then_resumed", str(tmp_path), "tp_fsdp", "tp_fsdp", timeout=300)
    ref = reference()
    for found in results:
        assert found["step"] == UPDATES and found["global_batch"] == {BATCH}  # 2 shards of 8, not 4 of 8
        print(f"tp 2 x fsdp 2 through ct.run: {assert_close_to(found, ref)}")
    step2 = checkpoint_of(tmp_path, UPDATES - 1)
    for found in pool.run("test_meshes", "loaded_then_trained", step2, "fsdp4", timeout=300):
        print(f"tp 2 x fsdp 2 -> fsdp 4: {assert_close_to(found, ref)}")
        assert found["norms"] == pytest.approx(ref["norms"][-1:], rel=1e-12)
    print(f"tp 2 x fsdp 2 -> 1 process: {assert_close_to(one_process_from(step2), ref)}")


def test_pipeline_checkpoints_hold_the_unsplit_model_and_resume_on_another_schedule(pool, tmp_path):
    """PP 2 x DP 2 (1F1B) through ct.run for 2 updates, resumed with GPipe; its checkpoint holds the whole model
    under the unsplit names, and loads in one process for the third update."""
    results = pool.run("test_meshes", "saved_then_resumed", str(tmp_path), "pp_ddp_1f1b", "pp_ddp_gpipe", timeout=300)
    ref = reference()
    for found in results:
        assert found["step"] == UPDATES and found["global_batch"] == {BATCH}
        print(f"pp 2 x dp 2, 1f1b -> gpipe: {assert_close_to(found, ref)}")
    step2 = checkpoint_of(tmp_path, UPDATES - 1)
    saved = torch.load(f"{step2}/state.pt", weights_only=True)["state"]
    assert set(saved["model"]) == set(gpt().state_dict())  # every stage's, by the unsplit model's names
    print(f"pp 2 x dp 2 -> 1 process: {assert_close_to(one_process_from(step2), ref)}")


def test_a_global_batch_run_splits_it_over_data_shards_and_resumes_on_another_mesh(pool, tmp_path):
    """ct.run(global_batch_size=16) splits the 16 over the data shards, not the processes (a TP pair or a
    pipeline's stages read one shard alike), resumes across meshes of other shard counts and rank-to-shard maps
    (PP 2 x DP 2 -> TP 2 x FSDP 2 -> FSDP 4) equal to the uninterrupted one-process run, the ranks of one data
    shard leaving it with one random stream (the rank files of another layout are another shard's: not restored);
    a run given batch_size (per process: its random states per rank) refuses another layout."""
    results = pool.run("test_meshes", "global_batch_across_meshes", str(tmp_path / "run"), timeout=600)
    ref = reference()
    for rank, found in enumerate(results):
        assert found["global_batch"] == [{BATCH}] * 3 and found["step"] == UPDATES
        print(f"global batch, pp 2 x dp 2 -> tp 2 x fsdp 2 -> fsdp 4: {assert_close_to(found, ref)}")
        assert found["norms"] == pytest.approx(ref["norms"], rel=1e-12)
        assert "resume with the same layout" in found["refused"], (rank, found["refused"])
        assert "data shards [0, 1, 0, 1]" in found["refused"] and "[0, 0, 1, 1]" in found["refused"]
    rng = [[found["rng"][i] for found in results] for i in range(3)]
    same = [[bool(torch.equal(a, b)) for b in states] for states in rng for a in states]
    assert same[0:4] == [[r % 2 == q % 2 for q in range(4)] for r in range(4)]  # pp 2 x dp 2: shard r % 2
    assert same[4:8] == [[r // 2 == q // 2 for q in range(4)] for r in range(4)]  # tp 2 x fsdp 2: shard r // 2
    assert same[8:12] == [[r == q for q in range(4)] for r in range(4)]  # fsdp 4: shard r


REFUSALS = {
    "replicate_3": "ValueError: sharded(replicate=3)(accumulate(2, weight=tokens)(step)): replicate=3 = 3 does not "
    "divide the 4 processes of the job; each size must divide W=4 and their product too (divisors of 4: [1, 2, 4])",
    "tp_3": "tp=3 = 3 does not divide the 4 processes of the job",
    "pp_3": "pp=3 = 3 does not divide the 4 processes of the job",
    "tp_alone": "4 processes make 2 tensor-parallel groups of 2, each reading its own data, but nothing synchronises",
    "plan_missing": "plan names '[12].nope', which matches no submodule of the model (Sequential)",
    "plan_kind": "plan['1.norm1'] is ColwiseParallel, which splits an nn.Linear or nn.Embedding only",
    "plan_unpaired": "the first forward since the plan split the model failed",
    "plan_disagree": "the ranks disagree on the plan",
    "plan_a_step": "tensor_parallel: the plan step raised",
    "dropout": "the model has dropout in training mode (['1.drop'])",
    "stages_disagree": "the ranks disagree on the pipeline: rank 2",
    "stages_missing": "parameter '3.norm.weight' lies in no stage (0, 1 | 2)",
    "pipeline_batch": "the batch holds 8 samples, which do not split into microbatches=3 equal micro-batches",
    "global_batch_tp": "global_batch_size=5 cannot be shared evenly among 2 data shards (5 / 2 is not whole); run it "
    "on a number of data shards that divides 5 (1, 5), or choose a global_batch_size that 2 divides (e.g. 4 or 6)",
    "global_batch_tp, why": "(the composition splits its model over 2 processes per data shard, which read one shard "
    "alike: the job's 4 processes make 2 data shards",
}


def pipeline_batch_in_run(rank: int, world: int, folder: str) -> dict[str, Any]:
    """ct.run of PP 2 x DP 2 with microbatches=3 and a global batch of 16 (8 per data shard): what it raises, and
    what it left in the checkpoint folder."""
    train = ct.distributed(ct.pipeline(STAGES, microbatches=3)(step))
    state = fresh_state(seed=0)
    try:
        ct.run(train, state, dataset(), global_batch_size=BATCH, max_steps=1, checkpoint_dir=folder, **RUN)
        said = "no error"
    except ValueError as e:
        said = f"{type(e).__name__}: {e}"
    finally:
        state.release_runtime()
    return {"said": said, "left": os.path.exists(folder), "step": state.step}


def test_a_global_batch_the_pipeline_cannot_split_is_refused_before_the_folder_is_made(pool, tmp_path):
    """The refusal of 8 samples per data shard in microbatches=3 comes before ct.run makes the checkpoint folder,
    its lock files or metrics.jsonl (issue 34's adversary: it came at the first update, after them)."""
    folder = str(tmp_path / "run")
    for rank, found in enumerate(pool.run("test_meshes", "pipeline_batch_in_run", folder, timeout=120)):
        assert REFUSALS["pipeline_batch"] in found["said"], (rank, found)
        assert not found["left"] and found["step"] == 0, (rank, found)
    assert not os.path.exists(folder)


@pytest.mark.parametrize("case", sorted(c for c in REFUSALS if ", " not in c))
def test_bad_layouts_and_plans_are_refused_on_every_rank_alike(pool, case):
    """Meshes that do not divide, plans that name no layer (or the wrong kind), a Colwise layer left unpaired, ranks
    that disagree, dropout under TP, stages that miss a parameter, batches that do not split: each rank raises the
    same clear error, naming the numbers and the fix, and the pool goes on (no rank was left in a collective)."""
    said = pool.run("test_meshes", "refusal", case, timeout=120)
    for rank, message in enumerate(said):
        assert REFUSALS[case] in message, (rank, message)
        assert REFUSALS.get(f"{case}, why", "") in message, (rank, message)  # the layout's account, after any advice


def test_every_group_of_the_mesh_waits_as_long_as_the_job_does(pool):
    """init_device_mesh would give the mesh's groups torch's 30 minutes; gloo's send and receive honour only the
    timeout a group was made with."""
    for found in pool.run("test_meshes", "mesh_timeouts", timeout=120):
        assert found == [found[0]] * 4 and found[0] == 300  # the pool's rendezvous timeout


def test_zz_a_killed_rank_fails_the_others_with_a_clear_error_and_no_hang(pool):
    """Last: it kills the pool. Rank 3 dies in the middle of a pipeline's update: every other rank raises within
    seconds (the gloo connections close), none waits for the timeout."""
    said = pool.run("test_meshes", "killed_mid_pipeline", timeout=120, deaths=True)
    assert said[3] is None  # died without a word
    for rank in (0, 1, 2):
        found = said[rank]
        assert isinstance(found, dict) and found["error"] is not None, (rank, found)
        assert found["seconds"] < 60, (rank, found)
        print(f"rank {rank} after {found['seconds']:.1f}s: {found['error'][:160]}")
