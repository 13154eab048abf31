"""checkpoint_activations: recompute chosen submodules' activations in backward instead of keeping them."""

from __future__ import annotations

import contextlib
import difflib
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from types import MappingProxyType
from typing import Any, TypeAlias

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from composetrain.core.protocol import Context, Pass, TrainStep
from composetrain.core.state import RuntimeState, TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import name, show
from composetrain.transforms._recompute import Replay, keep_running_stats, running_stats
from composetrain.transforms._shard_units import predicate_mismatch

__all__ = ["checkpoint_activations"]

_PREDICATE = "checkpoint_activations(lambda module: isinstance(module, Block))"

Selector: TypeAlias = "str | type[nn.Module] | Callable[[nn.Module], bool]"


@transform_factory
def checkpoint_activations(modules: Selector | Sequence[str | type[nn.Module]]) -> Transform:
    """Recompute the activations of the chosen submodules in backward instead of keeping them.

    Each chosen submodule's forward runs under ``torch.utils.checkpoint.checkpoint``
    (non-reentrant, random state preserved), so only its inputs are kept for
    backward; its activations are recomputed there. The update is bit-identical to
    the one without checkpointing, also with dropout or a random layer drop (the
    recomputation replays the numbers drawn from torch's, Python's ``random`` and NumPy's
    global generators, and all three streams afterwards are as without checkpointing). The
    model's code is not edited and nothing stays on it: the submodules are chosen
    at the first update and wrapped only while a call runs, so evaluation and other
    steps on the same model are unaffected. Costs about one extra forward of the
    chosen submodules per update, in exchange for their activation memory.

    BatchNorm (and other layers with running statistics) inside a chosen submodule
    would update their statistics a second time when recomputed; their running
    statistics are restored after each recomputation, so buffers too end exactly as
    without checkpointing. Other buffers a forward changes in place are changed again.

    Args:
        modules: which submodules: a qualified name (``"blocks.0"``), a module class
            (``nn.TransformerEncoderLayer``: every submodule of that class), a
            predicate ``fn(module) -> bool``, or a list of names and classes. Chosen
            submodules may not overlap (one inside another).

    Returns:
        A transform: ``checkpoint_activations(modules)(step) -> TrainStep``.

    Example:
        >>> train = ct.compose(ct.mixed_precision, ct.checkpoint_activations(Block), ct.accumulate(4))(step)
        >>> train = ct.checkpoint_activations(["encoder.layers.0", "encoder.layers.1"])(step)
    """
    specs = _check_specs(modules)
    label = f"checkpoint_activations({', '.join(_show_spec(s) for s in specs)})"
    return Transform(label, lambda step: _CheckpointActivations(step, label, specs))


def _check_specs(modules: Any) -> tuple[Any, ...]:
    example = 'e.g. checkpoint_activations("blocks.0"), checkpoint_activations(nn.TransformerEncoderLayer)'
    plain = callable(modules) and not isinstance(modules, (type, nn.Module, TrainStep, Transform))
    wrong = predicate_mismatch(modules) if plain else None
    if wrong is not None and wrong[1] == 2:  # step(model, batch) used bare, or a predicate (name, module)
        raise TypeError(
            f"checkpoint_activations: modules is required, got a step instead: {wrong[0]}, a function of two "
            f"arguments; a predicate takes the module alone: {_PREDICATE}; give modules first, then the step: "
            "checkpoint_activations(Block)(step)"
        )
    refuse_step(modules, "checkpoint_activations", "modules", "checkpoint_activations(Block)")
    single = isinstance(modules, (str, type)) or (callable(modules) and not isinstance(modules, nn.Module))
    specs = (modules,) if single else tuple(modules) if isinstance(modules, (list, tuple)) else None
    if specs is None:
        raise TypeError(
            f"checkpoint_activations: modules must be a submodule name, a module class, a predicate "
            f"fn(module) -> bool, or a list of names and classes, got {show(modules)}; {example}"
        )
    if not specs:
        raise ValueError(f"checkpoint_activations: modules is empty; say which submodules to checkpoint, {example}")
    for spec in specs:
        if isinstance(spec, str):
            if not spec:
                raise ValueError(
                    "checkpoint_activations: the name '' is the whole model, whose inputs are all a checkpoint would "
                    f"keep anyway; name its submodules, {example}"
                )
        elif isinstance(spec, type):
            if not issubclass(spec, nn.Module):
                raise TypeError(f"checkpoint_activations: the class {spec.__name__} is not an nn.Module; {example}")
        elif callable(spec) and single:
            _check_predicate(spec)
        else:
            raise TypeError(
                f"checkpoint_activations: modules holds {show(spec)}; a list holds submodule names (str) and module "
                f"classes; pass a predicate alone; {example}"
            )
    seen = [s for s in specs if specs.count(s) > 1]
    if seen:
        raise ValueError(
            f"checkpoint_activations: {_show_spec(seen[0])} is given {specs.count(seen[0])} times; give each once"
        )
    return specs


def _check_predicate(fn: Callable[..., Any]) -> None:
    wrong = predicate_mismatch(fn)
    if wrong is not None:
        raise TypeError(
            f"checkpoint_activations: modules got the predicate {wrong[0]}, which takes {wrong[1]} arguments; "
            f"a predicate takes the module alone: {_PREDICATE}"
        )


def _show_spec(spec: Any) -> str:
    return repr(spec) if isinstance(spec, str) else spec.__name__ if isinstance(spec, type) else name(spec)


class _Chosen(RuntimeState):
    """The submodules chosen in the state's model, found at the first update (not checkpointed)."""

    def __init__(self) -> None:
        self.model: nn.Module | None = None
        self.modules: list[nn.Module] = []


class _CheckpointActivations(TrainStep):
    role = "checkpoint_activations"
    refuses_inside = MappingProxyType(
        {
            "data_parallel": "data_parallel's replicas are copies of the model that the chosen submodules are not "
            "part of; run one process per device with distributed instead: "
            "distributed(checkpoint_activations(modules)(step))"
        }
    )

    def __init__(self, inner: TrainStep, label: str, specs: tuple[Any, ...]) -> None:
        self.label = label
        self.specs = specs
        super().__init__(inner)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        chosen = state.transform_state(self.role, _Chosen)
        if chosen.model is not state.model:
            chosen.modules = _choose(state.model, self.specs, self)
            chosen.model = state.model
        with _checkpointed(chosen.modules):
            return self._inner().grads(state, batch, ctx)

    def _config(self) -> tuple[Any, ...]:
        return self.specs


def _choose(model: nn.Module, specs: tuple[Any, ...], who: object) -> list[nn.Module]:
    """The submodules the specs select, checked: every spec selects something, none overlap."""
    named = dict(model.named_modules())
    chosen: dict[int, tuple[str, nn.Module, Any]] = {}
    for spec in specs:
        if isinstance(spec, str):
            if spec not in named:
                close = difflib.get_close_matches(spec, [k for k in named if k], n=3)
                hint = (
                    f"did you mean {', '.join(map(repr, close))}?" if close else "list them with model.named_modules()"
                )
                raise ValueError(f"{who!r}: {type(model).__name__} has no submodule {spec!r}; {hint}")
            found = [(spec, named[spec])]
        else:
            test = (lambda m, cls=spec: isinstance(m, cls)) if isinstance(spec, type) else spec
            found = [(k, m) for k, m in named.items() if k and test(m)]
            if not found:
                raise ValueError(
                    f"{who!r}: no submodule of {type(model).__name__} is selected by {_show_spec(spec)}; "
                    "check the class or predicate against model.named_modules()"
                )
        for key, module in found:
            if id(module) in chosen:
                first, _, by = chosen[id(module)]
                raise ValueError(
                    f"{who!r}: submodule {key!r} is chosen twice (as {first!r} by {_show_spec(by)}, and by "
                    f"{_show_spec(spec)}); choose each submodule once"
                )
            chosen[id(module)] = (key, module, spec)
    keys = sorted(key for key, _, _ in chosen.values())
    for outer, inner in itertools.pairwise(keys):
        if inner.startswith(outer + "."):
            raise ValueError(
                f"{who!r}: {inner!r} lies inside {outer!r}, which is checkpointed whole; choose one of them"
            )
    return [module for _, module, _ in chosen.values()]


@contextlib.contextmanager
def _checkpointed(modules: list[nn.Module]) -> Iterator[None]:
    """Run each module's forward through checkpoint while the block runs; restore it afterwards."""
    patched: list[tuple[nn.Module, Any]] = []
    try:
        for module in modules:
            own = module.__dict__.get("forward")  # an instance-level forward someone set: kept, and restored
            original = own if own is not None else module.forward
            stats = functools.partial(keep_running_stats, running_stats(module))
            module.forward = functools.partial(_run_checkpointed, original, stats)
            patched.append((module, own))
        yield
    finally:
        for module, own in reversed(patched):
            if own is None:
                del module.forward
            else:
                module.forward = own


def _run_checkpointed(forward: Callable[..., Any], stats: Callable[[], Any], *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():  # nothing is kept for backward anyway
        return forward(*args, **kwargs)
    # Every keyword is the module's: checkpoint would take early_stop=, debug=, use_reentrant=... as its own
    # options. So checkpoint gets every value positionally, and run gives the keywords their names back;
    # torch also finds the device whose generator and autocast state it replays from positional tensors
    # only (a module called as block(x=h) on CUDA would lose its dropout masks).
    names, count = tuple(kwargs), len(args)

    def run(*values: Any) -> Any:
        return forward(*values[:count], **dict(zip(names, values[count:], strict=True)))

    def contexts() -> tuple[Any, Any]:
        replay = Replay(stats)
        return replay.original(), replay

    return checkpoint(run, *args, *kwargs.values(), use_reentrant=False, preserve_rng_state=True, context_fn=contexts)
