"""data_parallel(devices): one process, several devices, one replica each, one update."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import torch
from torch import nn

from composetrain.core.batching import split_weighted, to_device, warn_if_batchnorm
from composetrain.core.composition_rules import refused_inside
from composetrain.core.protocol import Context, Pass, TrainStep, combine
from composetrain.core.state import RuntimeState, TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import DATA_PARALLEL
from composetrain.transforms._placement import parse_devices

__all__ = ["data_parallel"]


@transform_factory
def data_parallel(devices: list[str | torch.device]) -> Transform:
    """Replicate the model on each device, split each batch across them, run the shards in
    parallel threads, sum the gradients onto ``devices[0]`` and update once.

    The model (the master copy, which the optimizer holds) lives on ``devices[0]``;
    every update first refreshes the replicas from its weights. Each shard's mean
    loss is weighted by its share of the batch's units, as in ``accumulate``, so the
    update equals the plain step's on the whole batch. A device may repeat
    (``["cpu", "cpu"]``), which is how it is tested without GPUs.

    Prefer ``ct.distributed`` with one process per device, also on one node: it
    runs every device at full speed with no Python threads contending for the GIL,
    no replica copies each update, and gradient all-reduce overlapped with backward
    (the recipe "DDP over DP"). ``data_parallel`` is for quick single-process use.

    Args:
        devices: the devices, e.g. ``["cuda:0", "cuda:1"]``; the first holds the master.

    Returns:
        A transform: ``data_parallel(devices)(step) -> TrainStep``.

    Example:
        >>> train = ct.mixed_precision(ct.data_parallel(["cuda:0", "cuda:1"])(ct.accumulate(2)(step)))

    Notes:
        Buffers (BatchNorm running statistics) keep the master's shard's updates, as
        with ``nn.DataParallel``. ``mixed_precision`` goes outside it (it must unscale
        after the gradients are summed); ``distributed`` does not compose with it.
    """
    refuse_step(devices, DATA_PARALLEL, "devices", 'data_parallel(["cuda:0", "cuda:1"])')
    parsed = parse_devices(devices, DATA_PARALLEL, "devices")
    label = f"{DATA_PARALLEL}({[str(d) for d in parsed]})"
    return Transform(label, lambda step: _DataParallel(step, label, parsed))


class _Replicas(RuntimeState):
    """Copies of the model on the other devices, and the threads that drive them (never checkpointed)."""

    def __init__(self) -> None:
        self.master: nn.Module | None = None
        self.copies: list[nn.Module] = []
        self.pool: ThreadPoolExecutor | None = None


class _DataParallel(TrainStep):
    role = "data_parallel"
    places_model = True  # one replica per device, placed by the transform
    refuses_inside = refused_inside(role)

    def __init__(self, inner: TrainStep, label: str, devices: list[torch.device]) -> None:
        self.label = label
        self.devices = devices
        super().__init__(inner)

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        replicas = state.transform_state(self.role, _Replicas)
        model = state.model
        if replicas.master is not model or len(replicas.copies) != len(self.devices) - 1:
            model.to(self.devices[0])
            replicas.master = model
            replicas.copies = [copy.deepcopy(model).to(d) for d in self.devices[1:]]
            replicas.pool = ThreadPoolExecutor(len(self.devices), thread_name_prefix="data_parallel")
        with torch.no_grad():  # every update starts from the master's weights, and no gradient
            sources = list(model.parameters()) + list(model.buffers())
            for replica in replicas.copies:
                replica.zero_grad(set_to_none=True)
                targets = list(replica.parameters()) + list(replica.buffers())
                torch._foreach_copy_(targets, sources)
                _follow(model, replica)
        return self._inner().prepare(state, batch, ctx)

    def check_batch_size(self, state: TrainState, size: int) -> None:
        pass  # its pieces are checked at the update (see TrainStep.check_batch_size)

    def forward_size(self, state: TrainState, size: int) -> int:
        return self._inner().forward_size(state, -(-size // min(len(self.devices), size)))  # the largest shard

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        who = self  # formatted only if an error needs it
        shards, weights = split_weighted(batch, len(self.devices), ctx, who, "shard")
        if len(shards) > 1:
            warn_if_batchnorm(state.model, who)
        replicas = state.transform_state(self.role, _Replicas)
        models = [state.model, *replicas.copies][: len(shards)]
        inner = self._inner()

        def run(i: int) -> Pass:
            shard = shards[i] if i == 0 else to_device(shards[i], self.devices[i])
            done = inner.grads(state, shard, ctx._replace(model=models[i], piece_weight=weights[i]))
            return done

        assert replicas.pool is not None
        futures = [replicas.pool.submit(run, i) for i in range(len(shards))]
        wait(futures)  # all shards finish before any error surfaces: none writes gradients later
        passes = [f.result() for f in futures]
        # sum the replicas' gradients onto the master, and clear theirs
        with torch.no_grad():
            for replica in models[1:]:
                for master, copy_ in zip(state.model.parameters(), replica.parameters(), strict=True):
                    if copy_.grad is None:
                        continue
                    grad = copy_.grad.to(master.device)
                    master.grad = grad if master.grad is None else master.grad.add_(grad)
                    copy_.grad = None
        first = self.devices[0]
        moved = [Pass(p.loss.to(first), {k: to_device(v, first) for k, v in p.metrics.items()}) for p in passes]
        return combine(moved, who)

    def _config(self) -> tuple[Any, ...]:
        return (tuple(self.devices),)


def _follow(master: nn.Module, replica: nn.Module) -> None:
    """Copy what besides weights changes between updates (pitfall 23): each submodule's train/eval
    mode (a frozen BatchNorm, a Dropout in eval) and each parameter's requires_grad (a frozen layer
    must get no gradient from any shard, an unfrozen one its gradient from every shard)."""
    for source, target in zip(master.modules(), replica.modules(), strict=True):
        target.training = source.training
    for p, q in zip(master.parameters(), replica.parameters(), strict=True):
        q.requires_grad_(p.requires_grad)
