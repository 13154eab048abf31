"""The averages of ``ct.ema``: one per parameter and buffer, checked against the model, checkpointed."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from composetrain.core.util import EMA, check_int, show
from composetrain.transforms._ema_rule import Rule

__all__ = ["Averages", "model_tensors", "same_names"]


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters, then buffers, detached, by name: what AveragedModel(use_buffers=True) averages."""
    params, buffers = _parts(model)
    return {**params, **buffers}


def _parts(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    params = {k: p.detach() for k, p in model.named_parameters()}
    return params, {k: b.detach() for k, b in model.named_buffers()}


class Averages:
    """The averages (``tensors``, by parameter or buffer name) and ``n_averaged``, as AveragedModel's, kept and
    updated by ct.ema's ``rule`` (its settings checkpointed, compared at a resume)."""

    def __init__(
        self, tensors: dict[str, torch.Tensor], rule: Rule, params: frozenset[str], n_averaged: int = 0
    ) -> None:
        self.tensors, self.n_averaged, self.rule = tensors, n_averaged, rule
        self.params = params  # which of the tensors are parameters (the others buffers)
        self.settings = rule.settings()
        # this update's model tensors as checked: the parameters by ``prepare``, all of them by ``verify``
        self.prepared_params: dict[str, torch.Tensor] | None = None
        self.live: dict[str, torch.Tensor] | None = None

    @classmethod
    def of(cls, model: nn.Module, rule: Rule) -> Averages:
        """Copies of the model's tensors, in the rule's dtype (floating ones) and on its device."""
        tensors = model_tensors(model)
        if (rule.device is not None or rule.dtype is not None) and any(_sharded(t) for t in tensors.values()):
            raise ValueError(
                f"{rule.label()}: the model's weights are DTensor shards (ct.sharded), averaged shard by shard as "
                "they are laid out; device= and dtype= would keep them whole elsewhere: leave them out"
            )
        try:
            made = {k: t.to(device=rule.device, dtype=_dtype_for(rule, t), copy=True) for k, t in tensors.items()}
        except torch.OutOfMemoryError:
            raise
        except (RuntimeError, AssertionError) as error:  # torch's words name neither ct.ema nor its device
            if rule.device is None:
                raise
            raise ValueError(
                f"{rule.label()}: device={str(rule.device)!r} cannot hold the averages ({error}); give a device this "
                "process has, e.g. device='cpu', or leave device out (the averages stay beside their weights)"
            ) from error
        return cls(made, rule, frozenset(k for k, _ in model.named_parameters()))

    def matched(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """``model``'s tensors, checked against the averages (names, shapes, dtypes, kinds); nothing is
        written (an average on another device than its weight follows it in ``update``)."""
        return self._checked(model_tensors(model))

    def _alike(self, a: torch.Tensor, w: torch.Tensor) -> bool:
        """Whether average ``a`` is laid out as the rule keeps the average of ``w``."""
        device = self.rule.device if self.rule.device is not None else w.device
        return _same_kind(self.rule, a, w) and a.device == device

    def _checked(self, live: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        same_names(self.tensors, live, "the model's")
        mine = self.tensors
        for k in [k for k, w in live.items() if not self._alike(mine[k], w)]:  # one pass; a mismatch looked at after
            a, w = mine[k], live[k]
            if not _same_kind(self.rule, a, w):
                raise ValueError(
                    f"{EMA}: the model's {k!r} is {_described(w)}, its average {_described(a)}; average one model "
                    "throughout: a model changed after the EMA began needs a new TrainState"
                )
        return live

    def prepared(self, model: nn.Module) -> None:
        """Before the forward: the parameters match (a model changed since the last update is refused first)."""
        params, buffers = _parts(model)
        self._checked({**params, **buffers})
        self.prepared_params, self.live = params, None

    def verify(self, model: nn.Module) -> None:
        """After the forward, before the update: its buffers as they are now (a forward may have reassigned,
        cast or registered one), the parameters as ``prepared`` found them (views of the storage the optimizer
        steps in place), else checked now. Raises before anything changed; ``update`` averages these."""
        params, buffers = self.prepared_params, {k: b.detach() for k, b in model.named_buffers()}
        live = {**params, **buffers} if params is not None else {}
        mine = self.tensors
        if params is None or live.keys() != mine.keys() or not all(self._alike(mine[k], b) for k, b in buffers.items()):
            live = self.matched(model)  # raises
        self.prepared_params, self.live = None, live

    @torch.no_grad()
    def update(self, model: nn.Module, *, follow: bool) -> None:
        """Average ``model``'s tensors in, as ``verify`` found them in this update (else checked now); ``follow``:
        copy them instead, and start again (the warmup)."""
        live, self.live = (self.live if self.live is not None else self.matched(model)), None
        rule = self.rule
        if rule.device is None:
            for k, w in live.items():  # on another device only (checked): the average follows its weight
                if self.tensors[k].device != w.device:
                    self.tensors[k] = self.tensors[k].to(w.device)
        pairs = [(self.tensors[k], w, k) for k, w in live.items()]
        if self.n_averaged == 0:
            for a, w, _ in pairs:
                a.copy_(w)
        else:
            decay = rule.decay_at(self.n_averaged)
            averaged = []
            for a, w, k in pairs:
                floating = a.is_floating_point() or a.is_complex()
                if (rule.exclude_buffers and k not in self.params) or (not floating and rule.integers == "copy"):
                    a.copy_(w)  # timm's: buffers with exclude_buffers, integers always
                elif not floating:  # get_ema_multi_avg_fn's own path for integers: truncated
                    a.copy_(a * decay + w * (1 - decay))
                else:
                    averaged.append((a, w))
            _average(averaged, decay, rule.formula, per_tensor=rule.device is not None)
        self.n_averaged = 0 if follow else self.n_averaged + 1

    def state_dict(self) -> dict[str, Any]:
        return {"averages": dict(self.tensors), "n_averaged": self.n_averaged, "settings": dict(self.settings)}

    def load_state_dict(self, saved: Any) -> None:
        """All checked before anything is written; whole tensors are sharded as the live averages are."""
        if not (isinstance(saved, Mapping) and isinstance(saved.get("averages"), Mapping)):
            raise TypeError(f"{EMA}: the checkpoint's EMA state must come from ct.ema's state_dict, got {show(saved)}")
        n = check_int(saved.get("n_averaged"), EMA, "the checkpoint's n_averaged", minimum=0)
        theirs = saved["averages"]
        same_names(self.tensors, theirs, "the checkpoint's")
        saved_settings = saved.get("settings")  # older checkpoints lack them
        for k, mine in self.tensors.items():
            t = theirs[k]
            if not isinstance(t, torch.Tensor) or t.shape != mine.shape or t.dtype != mine.dtype:
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else show(t)
                raise ValueError(
                    f"{EMA}: the checkpoint's average of {k!r} is {got}, this run's {tuple(mine.shape)} "
                    f"{mine.dtype}; {_dtype_fix(saved_settings, self.settings, t, mine)}"
                )
        if isinstance(saved_settings, Mapping) and Rule.complete(saved_settings) != Rule.complete(self.settings):
            # a deliberate change (a higher decay late in training) is allowed, but never silent
            warnings.warn(
                f"{EMA}: the checkpoint's average was kept with {_settings(saved_settings)}, this run's ct.ema is "
                f"{_settings(self.settings)}: the resumed average continues with this run's settings from here on; "
                f"build ct.ema as {_settings(saved_settings)} to continue it as it was",
                UserWarning,
                stacklevel=2,
            )
        with torch.no_grad():
            for k, mine in self.tensors.items():
                mine.copy_(_laid_out(theirs[k], mine))
        self.n_averaged = n


def _dtype_fix(saved: Any, mine: Mapping[str, Any], theirs: Any, average: torch.Tensor) -> str:
    """The fix for an average of another shape or dtype than the checkpoint's: ct.ema's ``dtype=`` as saved, where
    that is what differs (the model is the same), else the same model."""
    kept = saved.get("dtype") if isinstance(saved, Mapping) else None
    same_shape = isinstance(theirs, torch.Tensor) and theirs.shape == average.shape
    if not (same_shape and theirs.is_floating_point() and kept != mine.get("dtype")):
        return "load a checkpoint of the same model, in the same dtype"
    then = f"dtype={kept}" if kept is not None else "no dtype (the model's)"
    now = f"dtype={mine['dtype']}" if "dtype" in mine else "none (the model's)"
    return f"the checkpoint's averages were kept with {then}, this run's ct.ema has {now}: build ct.ema with {then}"


def _average(pairs: list[tuple[torch.Tensor, torch.Tensor]], decay: float, formula: str, *, per_tensor: bool) -> None:
    """Average the floating-point ``(average, weight)`` pairs in, with the ops of the recipe each setting follows
    (the same ops give the same bits): per tensor, the weight cast to the average (timm's ModelEmaV3 with a device:
    ``lerp_``); weights of another dtype (timm's dtype=: ``_foreach_mul_`` then ``_foreach_add_`` over all of them);
    else one fused call per device and dtype, as AveragedModel (``lerp``) or torchvision (``sum``)."""
    if not pairs:
        return
    weight = 1.0 - decay
    if per_tensor:
        for a, w in pairs:
            a.lerp_(w.to(device=a.device).to(dtype=a.dtype), weight=weight)
        return
    if any(a.dtype != w.dtype for a, w in pairs):  # timm: one pair of another dtype puts all on this path
        averages, weights = [a for a, _ in pairs], [w for _, w in pairs]
        torch._foreach_mul_(averages, 1.0 - weight)
        torch._foreach_add_(averages, weights, alpha=weight)
        return
    groups: dict[tuple[Any, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for a, w in pairs:  # as AveragedModel: one fused call per device and dtype
        groups.setdefault((str(a.device), a.dtype, type(a)), []).append((a, w))
    for group in groups.values():
        averages, weights = [a for a, _ in group], [w for _, w in group]
        if formula == "lerp":
            torch._foreach_lerp_(averages, weights, weight)
        else:  # each product rounded, then the sum: torchvision's decay * a + (1 - decay) * w
            scaled = torch._foreach_mul(weights, weight)
            torch._foreach_mul_(averages, decay)
            torch._foreach_add_(averages, scaled)


def _dtype_for(rule: Rule, w: torch.Tensor) -> torch.dtype:
    """The dtype the rule keeps the average of ``w`` in: ``dtype`` for a floating-point weight, else its own."""
    return rule.dtype if rule.dtype is not None and w.is_floating_point() else w.dtype


def _same_kind(rule: Rule, a: torch.Tensor, w: torch.Tensor) -> bool:
    return a.shape == w.shape and a.dtype == _dtype_for(rule, w) and type(a) is type(w)


def _sharded(t: torch.Tensor) -> bool:
    return type(t).__name__ == "DTensor"


def _settings(settings: Mapping[str, Any]) -> str:
    """``decay=0.999, every=4, warmup=0, formula='lerp'``, whatever a checkpoint holds, as ct.ema's arguments."""
    return "ema(" + ", ".join(f"{k}={v!r}" for k, v in settings.items()) + ")"


def _laid_out(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` sharded as ``like`` when ``like`` is a DTensor and ``value`` is whole."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(like, DTensor) and not isinstance(value, DTensor):
        return distribute_tensor(value.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
    return value


def _described(t: torch.Tensor) -> str:
    kind = "" if type(t) is torch.Tensor else f" {type(t).__name__}"
    return f"{tuple(t.shape)} {t.dtype}{kind}"


def same_names(mine: Mapping[str, Any], theirs: Mapping[str, Any], whose: str) -> None:
    if mine.keys() != theirs.keys():
        missing, extra = sorted(mine.keys() - theirs.keys()), sorted(map(str, theirs.keys() - mine.keys()))
        raise ValueError(
            f"{EMA}: {whose} parameters and buffers differ from the averaged ones (missing {missing[:5]}, new "
            f"{extra[:5]}); average one model throughout: a model changed after the EMA began needs a new TrainState"
        )
