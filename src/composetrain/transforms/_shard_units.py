"""Which submodules become FSDP2 sharding units, checked before anything is sharded (internal)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeAlias

from torch import nn

from composetrain.core.util import SHARDED, show
from composetrain.core.util import name as fn_name

__all__ = ["Units", "check_units_argument", "chosen_by", "describe_units", "predicate_mismatch", "select_units"]

Units: TypeAlias = "str | Sequence[str] | type | tuple[type, ...] | Callable[[nn.Module], bool] | None"


def predicate_mismatch(fn: Callable[..., Any]) -> tuple[str, int] | None:
    """``None`` when ``fn`` can be called with one module, the predicate convention shared by
    ``sharded(modules=)`` and ``checkpoint_activations``; else ``fn`` shown with its signature and the
    number of positional arguments it requires, for the caller's message.

    One argument, because a function of two given to ``checkpoint_activations`` could not be told
    from a ``step(model, batch)`` used bare (torch's own ``check_fn`` takes the module alone too).
    """
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return None
    try:
        signature.bind(nn.Identity())
    except TypeError:
        positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        required = [p for p in signature.parameters.values() if p.kind in positional and p.default is p.empty]
        return f"{fn_name(fn)}{signature}", len(required)
    return None


def chosen_by(fn: Callable[[nn.Module], Any], named: dict[str, nn.Module], who: object) -> list[str]:
    """The names of the submodules (the root left out) that predicate ``fn`` answers True for.

    The answer must be a bool (NumPy's too): a predicate that forgot its ``return`` would otherwise choose
    nothing, and a tensor's truth fails inside torch. Either failure, and an error the predicate raises,
    names the caller, the predicate and the submodule.
    """
    chosen = []
    for key, module in named.items():
        if not key:
            continue
        try:
            answer = fn(module)
        except Exception as error:
            raise RuntimeError(
                f"{who}: the predicate {fn_name(fn)} raised {error!r} on submodule {key!r} "
                f"({type(module).__name__}); it is called on every submodule: answer False for those it does "
                "not know, e.g. lambda module: isinstance(module, Block) and module.depth > 2"
            ) from error
        kind = type(answer)
        if not (kind is bool or (kind.__module__ == "numpy" and kind.__name__ in ("bool_", "bool"))):
            raise TypeError(
                f"{who}: the predicate {fn_name(fn)} answered {show(answer)} for submodule {key!r} "
                f"({type(module).__name__}); a predicate returns True or False, e.g. "
                "lambda module: isinstance(module, Block)"
            )
        if answer:
            chosen.append(key)
    return chosen


def check_units_argument(modules: Any) -> Any:
    """``modules`` normalised (names to a tuple), or a TypeError naming what arrived."""
    if isinstance(modules, nn.Module):
        raise TypeError(
            f"{SHARDED}: modules got an nn.Module instance, {show(modules)}; give its name in the model "
            f"(modules=['layers.0']) or its class (modules={type(modules).__name__})"
        )
    if callable(modules) and not isinstance(modules, type):
        wrong = predicate_mismatch(modules)
        if wrong is not None:
            raise TypeError(
                f"{SHARDED}: modules got the predicate {wrong[0]}, which takes {wrong[1]} arguments; a predicate "
                "takes the module alone: modules=lambda module: isinstance(module, Block) (to choose by name, "
                "give the names: modules=['layers.0', 'layers.1'])"
            )
        return modules
    if modules is None:
        return modules
    if isinstance(modules, type) or (
        isinstance(modules, (tuple, list)) and modules and all(isinstance(m, type) for m in modules)
    ):
        classes = tuple(modules) if isinstance(modules, (tuple, list)) else (modules,)
        if not all(issubclass(c, nn.Module) for c in classes):
            raise TypeError(f"{SHARDED}: modules classes must be nn.Module subclasses, got {show(modules)}")
        return classes
    names = (modules,) if isinstance(modules, str) else modules
    if isinstance(names, Sequence) and names and all(isinstance(n, str) for n in names):
        if "" in names:
            raise ValueError(
                f"{SHARDED}: modules names submodules; the root is always a unit of its own: drop '' from modules"
            )
        return tuple(names)
    raise TypeError(
        f"{SHARDED}: modules must be submodule names, nn.Module classes or a predicate fn(module) -> bool, "
        f"got {show(modules)}; e.g. modules=['layers.0', 'layers.1'], modules=TransformerBlock, or leave it out "
        "for the blocks of every nn.ModuleList"
    )


def describe_units(modules: Any) -> str:
    if modules is None:
        return ""
    if isinstance(modules, tuple) and all(isinstance(m, type) for m in modules):
        return ", ".join(m.__name__ for m in modules)
    if isinstance(modules, tuple):
        return repr(list(modules))
    return getattr(modules, "__name__", repr(modules))


def select_units(model: nn.Module, modules: Any, who: str) -> list[tuple[str, nn.Module]]:
    """The sharding units below the root, innermost first (FSDP2 shards children before parents).

    ``None`` takes the blocks of every ``nn.ModuleList`` (a transformer's layers); names must
    exist; classes and predicates must match at least one submodule. Parameters shared by two
    units (tied weights across units) are refused: each unit gathers and frees its own.
    """
    named = dict(model.named_modules())
    if modules is None:
        chosen = {
            f"{n}.{c}" if n else c
            for n, m in named.items()
            if isinstance(m, nn.ModuleList)
            for c, _ in m.named_children()
        }
    elif isinstance(modules, tuple) and all(isinstance(m, str) for m in modules):
        unknown = [n for n in modules if n not in named]
        if unknown:
            known = [n for n in named if n][:12]
            raise ValueError(
                f"{who}: modules names {unknown}, which the model does not have; its submodules include {known}"
                f"{' ...' if len(named) > 13 else ''}; name submodules as model.named_modules() does"
            )
        chosen = set(modules)
    elif isinstance(modules, tuple):
        chosen = {n for n, m in named.items() if n and isinstance(m, modules)}
        if not chosen:
            raise ValueError(f"{who}: modules={describe_units(modules)} matches no submodule of the model")
    else:
        chosen = set(chosen_by(modules, named, who))
        if not chosen:
            raise ValueError(f"{who}: modules={describe_units(modules)} selects no submodule of the model")
    units = [(n, named[n]) for n in reversed(list(named)) if n in chosen]  # post-order: children first
    containers = [n for n, m in units if type(m).forward is nn.Module.forward]
    if containers:
        raise ValueError(
            f"{who}: modules selects {containers}, which have no forward of their own (an nn.ModuleList or "
            "ModuleDict): FSDP2 gathers a unit's parameters around its forward; name the blocks inside instead "
            f"(e.g. '{containers[0]}.0')"
        )
    _refuse_tied_across(model, [n for n, _ in units], who)
    return units


def _refuse_tied_across(model: nn.Module, units: list[str], who: str) -> None:
    """Each parameter must be used inside one unit only (the root counts as the unit of the rest)."""
    owners: dict[int, set[str]] = {}
    names: dict[int, list[str]] = {}
    ordered = sorted(units, key=lambda n: -n.count("."))
    for name, p in model.named_parameters(remove_duplicate=False):
        owner = next((u for u in ordered if name.startswith(u + ".")), "")  # the innermost unit holding it
        owners.setdefault(id(p), set()).add(owner or "<root>")
        names.setdefault(id(p), []).append(name)
    for key, where in owners.items():
        if len(where) > 1:
            raise ValueError(
                f"{who}: parameters {names[key]} are one tensor (tied weights) used in units {sorted(where)}; "
                "each unit gathers and frees its own parameters, so a tied weight must sit in one unit: choose "
                "modules so that both uses fall in the same unit (e.g. leave the embedding and the output head "
                "to the root)"
            )
