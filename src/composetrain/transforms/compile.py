"""compile: torch.compile placed where it is right for the composition, the model left as it is."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from composetrain.core.composition_rules import FULLGRAPH, check_inside, refused_inside
from composetrain.core.protocol import Context, TrainStep
from composetrain.core.state import RuntimeState, TrainState
from composetrain.core.steps import PlainStep, Transform, transform_factory
from composetrain.core.util import COMPILE, check_bool, name, show

__all__ = ["compile"]

_MODES = (None, "default", "max-autotune-no-cudagraphs")
# CUDA graphs reuse their output buffers on the next replay: a micro-batch's loss share, kept until the update
# ends (and a StepOutput kept until the log point) would be overwritten under the caller
_CUDAGRAPHS = ("reduce-overhead", "max-autotune")


@transform_factory
def compile(
    step: PlainStep | TrainStep | None = None,
    *,
    mode: str | None = None,
    dynamic: bool | None = None,
    fullgraph: bool = False,
    backend: str | Callable[..., Any] = "inductor",
    cache: bool = True,
) -> Any:
    """Compile the plain step (forward and loss) with ``torch.compile``, where the composition calls it.

    The plain step is compiled as a function of ``(model, batch)`` and called with the model every
    other transform has set up by then: the ``DistributedDataParallel`` wrapper under ``ct.distributed``
    (torch's advice: wrap in DDP, then compile, so that TorchDynamo splits the graph at DDP's
    buckets and the gradient all-reduce still overlaps backward, once per update), the sharded
    model under ``ct.sharded`` (FSDP2's hooks run between the compiled graphs), under
    ``ct.mixed_precision``'s autocast; the submodules ``ct.checkpoint_activations`` recomputes run eagerly
    between the graphs (so ``fullgraph=True`` with them is refused when built). So the order of
    ``compile`` among the other transforms does not matter. Backward, the loss scaling and the optimizer
    step stay eager. The model itself is not wrapped or changed: its ``state_dict`` keys stay the same,
    and checkpoints move between compiled and eager runs. Inductor draws random numbers (dropout's masks)
    from its own generator, not eager's: ``torch._inductor.config.fallback_random = True`` makes them
    eager's, where a run must match an eager one (``ct.check``).

    Shapes: torch's automatic dynamic shapes apply (``dynamic=None``): the first call compiles for its
    shapes, and the first call with another batch size (``accumulate``'s short last micro-batch, the
    epoch's short last batch, ``accumulate("auto")``'s smaller pieces) compiles once more, for any size
    (a size of 1 is specialised by torch: one more). ``ct.run`` logs the compilations and their time.

    Warm restarts: with ``cache=True``, while ``ct.run`` trains with a ``checkpoint_dir``, torch's compile
    caches (TorchInductor's graphs and compiled kernels; TorchDynamo's shape profiles only where
    ``torch.compiler.config.job_id`` is set) live in ``checkpoint_dir/compile_cache/`` beside the checkpoints
    instead of the machine's ``/tmp`` (also instead of a ``TORCHINDUCTOR_CACHE_DIR`` of yours, put back
    afterwards), so a requeued job, on whichever node, compiles from them. They hold pickles and kernels
    that torch loads and runs: they are read from your own checkpoint_dir only; give ``cache=False`` where
    that folder is not yours alone.

    Args:
        step: the step to wrap; omit it to get a transform.
        mode: torch.compile's mode: None, "default" or "max-autotune-no-cudagraphs" (the modes that
            use CUDA graphs are refused, as is the "cudagraphs" backend: their outputs are overwritten by
            the next call, and a composition keeps outputs across micro-batches and updates).
        dynamic: torch.compile's ``dynamic``: None (automatic, the default), True (compile for any
            size at once), False (a compilation per size).
        fullgraph: fail on a graph break instead of running that part eagerly (refused with
            ``checkpoint_activations``, ``pipeline_split``, ``distributed`` and ``sharded``, whose hooks run
            between the graphs).
        backend: torch.compile's backend ("inductor", or "aot_eager", "eager" to debug).
        cache: keep torch's compile caches in ``ct.run``'s checkpoint_dir (warm restarts).

    Returns:
        The wrapped TrainStep, or a transform when ``step`` is omitted.

    Example:
        >>> train = ct.compile(ct.mixed_precision(ct.accumulate(4)(step)))
        >>> train = ct.distributed(ct.compile(backend="aot_eager")(ct.clip_grad_norm(1.0)(step)))
    """
    if isinstance(step, nn.Module):
        raise TypeError(
            f"{COMPILE}: step must be a function step(model, batch) or a TrainStep, got the model {show(step)}; "
            "ct.compile compiles the step and leaves the model as it is: ct.compile(step), with "
            "ct.TrainState(model, optimizer) on the plain model"
        )
    options = _check_options(mode, dynamic, fullgraph, backend, cache)
    shown = [f"{k}={v!r}" for k, v in options.items() if v != _DEFAULTS[k] and k != "backend"]
    if options["backend"] != "inductor":
        shown.insert(0, f"backend={options['backend']!r}" if isinstance(backend, str) else f"backend={name(backend)}")
    label = f"{COMPILE}({', '.join(shown)})" if shown else COMPILE
    transform = Transform(label, lambda inner: _Compile(inner, label, options))
    return transform if step is None else transform(step)


_COMPILE_OPTIONS = ("mode", "dynamic", "fullgraph", "backend")  # what torch.compile takes of them
_DEFAULTS: dict[str, Any] = {"mode": None, "dynamic": None, "fullgraph": False, "backend": "inductor", "cache": True}


def _check_options(mode: Any, dynamic: Any, fullgraph: Any, backend: Any, cache: Any) -> dict[str, Any]:
    """The options checked, before anything is built."""
    if mode in _CUDAGRAPHS:
        raise ValueError(
            f"{COMPILE}: mode={mode!r} replays CUDA graphs, whose outputs the next call overwrites, while a "
            "composition keeps each micro-batch's loss until the update ends; use mode="
            "'max-autotune-no-cudagraphs' (or the default)"
        )
    if isinstance(backend, str) and backend == "cudagraphs":
        raise ValueError(
            f"{COMPILE}: backend='cudagraphs' replays CUDA graphs, whose outputs the next call overwrites, while a "
            "composition keeps each micro-batch's loss until the update ends; use backend='inductor' (with "
            "mode='max-autotune-no-cudagraphs' to autotune)"
        )
    if mode not in _MODES:
        raise ValueError(f"{COMPILE}: mode must be one of {list(_MODES)}, got {show(mode)}")
    if dynamic is not None:
        check_bool(dynamic, COMPILE, "dynamic", example="dynamic=None (automatic), True or False")
    check_bool(fullgraph, COMPILE, "fullgraph")
    check_bool(cache, COMPILE, "cache", example="cache=False")
    if isinstance(backend, str):
        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            raise ValueError(f"{COMPILE}: backend must be one of {known} or a callable backend, got {backend!r}")
    elif not callable(backend) or isinstance(backend, (nn.Module, TrainStep)):
        raise TypeError(
            f"{COMPILE}: backend must be a backend name such as 'inductor', or a callable, got {show(backend)}"
        )
    if mode is not None and backend != "inductor":
        raise ValueError(
            f"{COMPILE}: mode={mode!r} is an inductor option, but backend={show(backend)}; drop one of them"
        )
    return {"mode": mode, "dynamic": dynamic, "fullgraph": fullgraph, "backend": backend, "cache": cache}


class _Compiled(RuntimeState):
    """The compiled plain steps, by step and options (not checkpointed): one torch.compile wrapper each, made at
    the first update rather than at every pass (torch keeps the compiled code with the step's code object and
    the backend, so a new wrapper would not recompile, but costs its making every pass)."""

    def __init__(self) -> None:
        self.steps: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self.plain: list[Callable[..., Any]] = []  # the steps keyed by id, kept alive so that no id is reused

    # torch.compile's wrappers do not pickle, and a copy (ct.check's deepcopy) would share them, keyed by the
    # ids of the original's steps: a copy starts without any (torch keeps the compiled code with the step's
    # code object, so its own wrappers compile nothing again)
    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        self.steps, self.plain = {}, []

    def get(self, step: Callable[..., Any], options: dict[str, Any]) -> Callable[..., Any]:
        # by identity: a plain step may be a callable object that is unhashable, or equal to another
        key = (id(step), *(id(options[k]) if k == "backend" else options[k] for k in _COMPILE_OPTIONS))
        found = self.steps.get(key)
        if found is None:
            settings = {k: options[k] for k in _COMPILE_OPTIONS}
            found = self.steps[key] = torch.compile(step, **settings)
            self.plain.append(step)
        return found


class _Compile(TrainStep):
    role = "compile"
    refuses_inside = refused_inside(role)  # none; a fullgraph one's are FULLGRAPH's

    def __init__(self, inner: TrainStep, label: str, options: dict[str, Any]) -> None:
        self.label = label
        self.options = options
        self.compile_cache = options["cache"]  # the driver keeps torch's caches beside the checkpoints
        if options["fullgraph"]:  # before the check of the role: as FULLGRAPH, it cannot wrap what breaks its graph
            check_inside(label, refused_inside(FULLGRAPH), inner.roles)
        super().__init__(inner)
        if options["fullgraph"]:
            self.roles = self.roles | {FULLGRAPH}

    def prepare(self, state: TrainState, batch: Any, ctx: Context) -> Context:
        compiled = state.transform_state(self.role, _Compiled)
        options = self.options
        # set before the inner steps prepare: a transform inside that must know (distributed) sees it
        return self._inner().prepare(state, batch, ctx._replace(call_step=lambda plain: compiled.get(plain, options)))

    def _config(self) -> tuple[Any, ...]:
        return tuple(self.options[k] for k in ("mode", "dynamic", "fullgraph", "backend", "cache"))
