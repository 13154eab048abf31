"""checkpoint_activations: recompute chosen submodules' activations in backward instead of keeping them."""

from __future__ import annotations

import contextlib
import difflib
import functools
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeAlias

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from composetrain.core.composition_rules import refused_inside
from composetrain.core.protocol import Context, Pass, TrainStep
from composetrain.core.state import RuntimeState, TrainState
from composetrain.core.steps import Transform, refuse_step, transform_factory
from composetrain.core.util import CHECKPOINT_ACTIVATIONS, name, show
from composetrain.transforms._recompute import Replay, refuse_cache, refuse_checkpointed_twice
from composetrain.transforms._shard_units import chosen_by, predicate_mismatch

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

    Buffers a chosen submodule's forward changes in place (BatchNorm's running
    statistics, a counter, an average) would be changed a second time when recomputed,
    and read changed; the recomputation computes with their values at the forward's
    start on copies, so buffers and gradients end exactly as without checkpointing
    (one copy of the chosen submodules' buffers per call, kept past the forward for
    those it changed).

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
    label = f"{CHECKPOINT_ACTIVATIONS}({', '.join(_show_spec(s) for s in specs)})"
    return Transform(label, lambda step: _CheckpointActivations(step, label, specs))


def _check_specs(modules: Any) -> tuple[Any, ...]:
    example = 'e.g. checkpoint_activations("blocks.0"), checkpoint_activations(nn.TransformerEncoderLayer)'
    plain = callable(modules) and not isinstance(modules, (type, nn.Module, TrainStep, Transform))
    wrong = predicate_mismatch(modules) if plain else None
    if wrong is not None and wrong[1] == 2:  # step(model, batch) used bare, or a predicate (name, module)
        raise TypeError(
            f"{CHECKPOINT_ACTIVATIONS}: modules is required, got a step instead: {wrong[0]}, a function of two "
            f"arguments; a predicate takes the module alone: {_PREDICATE}; give modules first, then the step: "
            "checkpoint_activations(Block)(step)"
        )
    refuse_step(modules, CHECKPOINT_ACTIVATIONS, "modules", "checkpoint_activations(Block)")
    single = isinstance(modules, (str, type)) or (callable(modules) and not isinstance(modules, nn.Module))
    specs = (modules,) if single else tuple(modules) if isinstance(modules, (list, tuple)) else None
    if specs is None:
        raise TypeError(
            f"{CHECKPOINT_ACTIVATIONS}: modules must be a submodule name, a module class, a predicate "
            f"fn(module) -> bool, or a list of names and classes, got {show(modules)}; {example}"
        )
    if not specs:
        raise ValueError(f"{CHECKPOINT_ACTIVATIONS}: modules is empty; say which submodules to checkpoint, {example}")
    for spec in specs:
        if isinstance(spec, str):
            if not spec:
                raise ValueError(
                    f"{CHECKPOINT_ACTIVATIONS}: the name '' is the whole model, whose inputs are all a checkpoint "
                    f"would keep anyway; name its submodules, {example}"
                )
        elif isinstance(spec, type):
            if not issubclass(spec, nn.Module):
                raise TypeError(f"{CHECKPOINT_ACTIVATIONS}: the class {spec.__name__} is not an nn.Module; {example}")
        elif callable(spec) and single:
            _check_predicate(spec)
        else:
            raise TypeError(
                f"{CHECKPOINT_ACTIVATIONS}: modules holds {show(spec)}; a list holds submodule names (str) and module "
                f"classes; pass a predicate alone; {example}"
            )
    seen = [s for s in specs if specs.count(s) > 1]
    if seen:
        raise ValueError(
            f"{CHECKPOINT_ACTIVATIONS}: {_show_spec(seen[0])} is given {specs.count(seen[0])} times; give each once"
        )
    return specs


def _check_predicate(fn: Callable[..., Any]) -> None:
    wrong = predicate_mismatch(fn)
    if wrong is not None:
        raise TypeError(
            f"{CHECKPOINT_ACTIVATIONS}: modules got the predicate {wrong[0]}, which takes {wrong[1]} arguments; "
            f"a predicate takes the module alone: {_PREDICATE}"
        )


def _show_spec(spec: Any) -> str:
    return repr(spec) if isinstance(spec, str) else spec.__name__ if isinstance(spec, type) else name(spec)


class _Chosen(RuntimeState):
    """The submodules chosen in the state's model, found at the first update (not checkpointed)."""

    def __init__(self) -> None:
        self.model: nn.Module | None = None
        self.specs: tuple[Any, ...] = ()  # whose choice it is: two steps may share one TrainState
        self.modules: list[nn.Module] = []


class _CheckpointActivations(TrainStep):
    role = "checkpoint_activations"
    refuses_inside = refused_inside(role)

    def __init__(self, inner: TrainStep, label: str, specs: tuple[Any, ...]) -> None:
        self.label = label
        self.specs = specs
        super().__init__(inner)

    def grads(self, state: TrainState, batch: Any, ctx: Context) -> Pass:
        chosen = state.transform_state(self.role, _Chosen)
        if chosen.model is not state.model or chosen.specs != self.specs:
            chosen.modules = _choose(state.model, self.specs, self)
            chosen.model, chosen.specs = state.model, self.specs
        refuse_checkpointed_twice(chosen.modules, self)  # every call: the flag may be set after the first
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
            module = named[spec] if spec in named else _shared_name(model, spec)  # a shared one is listed once
            if module is None:
                close = difflib.get_close_matches(spec, [k for k in named if k], n=3)
                hint = (
                    f"did you mean {', '.join(map(repr, close))}?" if close else "list them with model.named_modules()"
                )
                raise ValueError(f"{who!r}: {type(model).__name__} has no submodule {spec!r}; {hint}")
            found = [(spec, module)]
        else:
            if isinstance(spec, type):
                found = [(k, m) for k, m in named.items() if k and isinstance(m, spec)]
            else:
                found = [(k, named[k]) for k in chosen_by(spec, named, who)]
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
    # by identity, not by name: a submodule registered under two names may sit inside another chosen one
    for outer, module, _ in sorted(chosen.values(), key=lambda c: c[0]):
        for sub in itertools.islice(module.modules(), 1, None):
            if id(sub) in chosen:
                inner = chosen[id(sub)][0]
                raise ValueError(
                    f"{who!r}: {inner!r} lies inside {outer!r}, which is checkpointed whole; choose one of them"
                )
    return [module for _, module, _ in chosen.values()]


def _shared_name(model: nn.Module, spec: str) -> nn.Module | None:
    try:
        return model.get_submodule(spec)
    except AttributeError:
        return None


@contextlib.contextmanager
def _checkpointed(modules: list[nn.Module]) -> Iterator[None]:
    """Run each module's forward through checkpoint while the block runs; restore it afterwards."""
    patched: list[tuple[nn.Module, Any]] = []
    try:
        for module in modules:
            own = module.__dict__.get("forward")  # an instance-level forward someone set: kept, and restored
            original = own if own is not None else module.forward
            module.forward = functools.partial(_run_checkpointed, original, module)
            patched.append((module, own))
        yield
    finally:
        for module, own in reversed(patched):
            if own is None:
                del module.forward
            else:
                module.forward = own


# Under ct.compile, TorchDynamo cannot trace checkpoint's context_fn (the replay of random state and buffers,
# torch 2.14): a chosen submodule runs eagerly between the compiled graphs, recomputed exactly as without compile
@torch.compiler.disable
def _run_checkpointed(forward: Callable[..., Any], module: nn.Module, /, *args: Any, **kwargs: Any) -> Any:
    # forward and module positional-only: a module keyword of either name is the module's (module=, forward=)
    if not torch.is_grad_enabled():  # nothing is kept for backward anyway
        return forward(*args, **kwargs)
    refuse_cache(module, (*args, *kwargs.values()))
    # Every keyword is the module's: checkpoint would take early_stop=, debug=, use_reentrant=... as its own
    # options. So checkpoint gets every value positionally, and run gives the keywords their names back;
    # torch also finds the device whose generator and autocast state it replays from positional tensors
    # only (a module called as block(x=h) on CUDA would lose its dropout masks).
    names, count = tuple(kwargs), len(args)

    def run(*values: Any) -> Any:
        return forward(*values[:count], **dict(zip(names, values[count:], strict=True)))

    def contexts() -> tuple[Any, Any]:
        replay = Replay(module)
        return replay.original(), replay

    return checkpoint(run, *args, *kwargs.values(), use_reentrant=False, preserve_rng_state=True, context_fn=contexts)
