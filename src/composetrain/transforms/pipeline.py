"""pipeline_split(placement, chunks): a model split across devices, micro-batches pipelined."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from composetrain.core.batching import concat_batches, leading_size, leaves, split_batch, to_device, warn_if_batchnorm
from composetrain.core.composition_rules import refused_inside
from composetrain.core.protocol import Context, Pass, TrainStep
from composetrain.core.state import RuntimeState, TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import PIPELINE_SPLIT, check_int, show
from composetrain.transforms._placement import check_placement, parse_device

__all__ = ["pipeline_split"]


@transform_factory
def pipeline_split(placement: Mapping[str, str | torch.device], *, chunks: int = 1) -> Transform:
    """Place the model's submodules on devices; with ``chunks > 1``, pipeline micro-batches through them.

    ``placement`` maps submodule names (as in ``model.named_modules()``) to devices,
    in the order the model runs them: ``{"encoder": "cuda:0", "decoder": "cuda:1"}``.
    Every parameter and buffer must fall in exactly one placed module. The model's
    own forward keeps working: each placed module moves its inputs to its device
    (a forward pre-hook), so activations hop from stage to stage. The batch goes to
    the last stage's device, where the outputs come out and the loss is computed.

    With ``chunks > 1`` each forward splits its inputs into that many micro-batches
    and runs them through the stages one after the other (GPipe's fill-and-drain
    schedule), concatenating the outputs: on CUDA, kernels are queued
    asynchronously, so stage 1 works on micro-batch 2 while stage 2 works on
    micro-batch 1. The loss and the update are those of the whole batch (exactly,
    but for BatchNorm, which sees micro-batches; a warning says so).

    Args:
        placement: submodule name -> device, in execution order.
        chunks: micro-batches per forward (1: no pipelining, only placement).

    Returns:
        A transform: ``pipeline_split(placement, chunks=4)(step) -> TrainStep``.

    Example:
        >>> split = ct.pipeline_split({"encoder": "cuda:0", "decoder": "cuda:1"}, chunks=4)
        >>> train = ct.distributed(split(step))      # mix both: each rank splits its model over its GPUs

    Notes:
        With ``chunks > 1`` the step receives a wrapper: reach the model's attributes
        as ``model.module`` (as under DDP). A tensor shared by stages on different
        devices (tied weights) is refused: place those modules together.
    """
    refuse_step(placement, PIPELINE_SPLIT, "placement", 'pipeline_split({"encoder": "cuda:0", "decoder": "cuda:1"})')
    if isinstance(placement, Mapping) and not placement:
        raise ValueError(
            f"{PIPELINE_SPLIT}: placement must name at least one submodule, e.g. {{'encoder': 'cuda:0'}}, got {{}}"
        )
    if not isinstance(placement, Mapping):
        raise TypeError(
            f"{PIPELINE_SPLIT}: placement must map submodule names to devices, e.g. "
            f"{{'encoder': 'cuda:0', 'decoder': 'cuda:1'}}, got {show(placement)}"
        )
    for key in placement:
        if not isinstance(key, str):
            raise TypeError(f"{PIPELINE_SPLIT}: placement keys must be submodule names, got {show(key)}")
    parsed = {k: parse_device(v, PIPELINE_SPLIT, f"placement[{k!r}]") for k, v in placement.items()}
    chunks = check_int(chunks, PIPELINE_SPLIT, "chunks", example="chunks=4, or chunks=1 for no pipelining")
    shown = {k: str(v) for k, v in parsed.items()}
    label = f"{PIPELINE_SPLIT}({shown})" if chunks == 1 else f"{PIPELINE_SPLIT}({shown}, chunks={chunks})"
    return Transform(label, lambda step: _Pipeline(step, label, parsed, chunks))


class _Chunked(nn.Module):
    """Runs the model on ``chunks`` micro-batches of its inputs, one after the other, and
    concatenates the outputs: the fill-and-drain schedule of GPipe."""

    def __init__(self, module: nn.Module, chunks: int, who: str) -> None:
        super().__init__()
        self.module = module
        self.chunks = chunks
        self.who = who

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        pieces = split_batch((args, kwargs), self.chunks, self.who)
        outputs = [self.module(*a, **k) for a, k in pieces]
        _check_chunk_outputs(outputs, [leading_size(piece) for piece in pieces], self.who)
        return concat_batches(outputs)


def _check_chunk_outputs(outputs: list[Any], sizes: list[int | None], who: str) -> None:
    """Outputs are concatenated along their first dimension, which is right only for per-sample
    outputs. A 0-dim output (a model's own mean loss) is one value per chunk, and how those combine
    (a mean over samples, over tokens, a sum) only the model knows; an output whose first size is
    not its chunk's batch size (a mean over the batch, a transposed one) would be stacked, not
    joined. Either is refused rather than silently taken from the first chunk (pitfall 24)."""
    if len(outputs) == 1:  # a batch too small to split: its outputs are the whole batch's
        return
    columns = zip(*(leaves(out) for out in outputs), strict=True)
    for i, column in enumerate(columns):
        first = column[0]
        if first.dim() == 0:
            if any(t.requires_grad for t in column) or not all(torch.equal(first, t) for t in column[1:]):
                raise ValueError(
                    f"{who}: the model returns a 0-dim tensor (output leaf {i}, such as its own mean loss) "
                    f"that differs between the {len(outputs)} chunks; each chunk computes its own, and whether "
                    "they combine as a mean over samples, over tokens or as a sum only the model knows: return "
                    "per-sample outputs (logits) and compute the loss in the step, or use chunks=1"
                )
        elif [t.shape[0] for t in column] != sizes:
            raise ValueError(
                f"{who}: output leaf {i} of the model has first sizes {[t.shape[0] for t in column]} for chunks "
                f"of {sizes} samples; chunks are joined along the batch dimension, so every output must be per "
                "sample with the batch first (not reduced over the batch, not transposed): reduce in the step, "
                "or use chunks=1"
            )


class _Placed(RuntimeState):
    """The model as placed: hooks, and the chunking wrapper (never checkpointed)."""

    def __init__(self) -> None:
        self.model: nn.Module | None = None
        self.key: tuple[Any, ...] = ()
        self.hooks: list[Any] = []
        self.chunked: nn.Module | None = None


class _Pipeline(TrainStep):
    role = "pipeline_split"
    places_model = True  # each stage on its own device, placed by the transform
    refuses_inside = refused_inside(role)

    def __init__(self, inner: TrainStep, label: str, placement: dict[str, torch.device], chunks: int) -> None:
        self.label = label
        self.placement = placement
        self.chunks = chunks
        self.last = list(placement.values())[-1]
        super().__init__(inner)

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        placed = state.transform_state(self.role, _Placed)
        key = (id(state.model), self._config())
        if placed.model is not state.model or placed.key != key:
            self._place(state, placed)
            placed.model, placed.key = state.model, key
        if self.chunks > 1:
            warn_if_batchnorm(state.model, self)
        model = placed.chunked if placed.chunked is not None else ctx.model
        return self._inner().prepare(state, batch, ctx._replace(model=model))

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        # the targets meet the outputs on the last stage; inputs hop to the first stage by its hook
        return self._inner().grads(state, to_device(batch, self.last), ctx)

    def _place(self, state: TrainState, placed: _Placed) -> None:
        model = state.model
        check_placement(model, self.placement, repr(self))
        for handle in placed.hooks:
            handle.remove()
        placed.hooks = []
        modules = dict(model.named_modules())
        for name, device in self.placement.items():
            modules[name].to(device)
            placed.hooks.append(modules[name].register_forward_pre_hook(_mover(device), with_kwargs=True))
        _move_optimizer_state(state.optimizer)
        placed.chunked = _Chunked(model, self.chunks, repr(self)) if self.chunks > 1 else None

    def _config(self) -> tuple[Any, ...]:
        return (tuple(self.placement.items()), self.chunks)


def _mover(device: torch.device) -> Any:
    def move_inputs(module: nn.Module, args: Any, kwargs: Any) -> tuple[Any, Any]:
        return to_device(args, device), to_device(kwargs, device)

    return move_inputs


def _move_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Optimizer state follows its parameters (moments shaped like them; step counters stay put)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            for k, v in optimizer.state.get(p, {}).items():
                if isinstance(v, torch.Tensor) and v.shape == p.shape and v.device != p.device:
                    optimizer.state[p][k] = v.to(p.device)
