"""The averages of ``ct.ema``: one per parameter and buffer, checked against the model, checkpointed."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from composetrain.core.util import EMA, check_int, show

__all__ = ["Averages", "model_tensors", "same_names"]


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Parameters, then buffers, detached, by name: what AveragedModel(use_buffers=True) averages."""
    params, buffers = _parts(model)
    return {**params, **buffers}


def _parts(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    params = {k: p.detach() for k, p in model.named_parameters()}
    return params, {k: b.detach() for k, b in model.named_buffers()}


class Averages:
    """The averages (``tensors``, by parameter or buffer name) and ``n_averaged``, as AveragedModel's."""

    def __init__(self, tensors: dict[str, torch.Tensor], settings: dict[str, Any], n_averaged: int = 0) -> None:
        self.tensors, self.n_averaged = tensors, n_averaged
        self.settings = settings  # ct.ema's decay, every, warmup and formula: checkpointed, compared at a resume
        # this update's model tensors as checked: the parameters by ``prepare``, all of them by ``verify``
        self.params: dict[str, torch.Tensor] | None = None
        self.live: dict[str, torch.Tensor] | None = None

    @classmethod
    def of(cls, model: nn.Module, settings: dict[str, Any]) -> Averages:
        return cls({k: t.clone() for k, t in model_tensors(model).items()}, settings)

    def matched(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """``model``'s tensors, checked against the averages (names, shapes, dtypes, kinds); nothing is
        written (an average on another device than its weight follows it in ``update``)."""
        return self._checked(model_tensors(model))

    def _checked(self, live: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        same_names(self.tensors, live, "the model's")
        mine = self.tensors
        for k in [k for k, w in live.items() if not _alike(mine[k], w)]:  # one pass; a mismatch looked at after
            a, w = mine[k], live[k]
            if a.shape != w.shape or a.dtype != w.dtype or type(a) is not type(w):
                raise ValueError(
                    f"{EMA}: the model's {k!r} is {_described(w)}, its average {_described(a)}; average one model "
                    "throughout: a model changed after the EMA began needs a new TrainState"
                )
        return live

    def prepared(self, model: nn.Module) -> None:
        """Before the forward: the parameters match (a model changed since the last update is refused first)."""
        params, buffers = _parts(model)
        self._checked({**params, **buffers})
        self.params, self.live = params, None

    def verify(self, model: nn.Module) -> None:
        """After the forward, before the update: its buffers as they are now (a forward may have reassigned,
        cast or registered one), the parameters as ``prepared`` found them (views of the storage the optimizer
        steps in place), else checked now. Raises before anything changed; ``update`` averages these."""
        params, buffers = self.params, {k: b.detach() for k, b in model.named_buffers()}
        live = {**params, **buffers} if params is not None else {}
        mine = self.tensors
        if params is None or live.keys() != mine.keys() or not all(_alike(mine[k], b) for k, b in buffers.items()):
            live = self.matched(model)  # raises
        self.params, self.live = None, live

    @torch.no_grad()
    def update(self, model: nn.Module, decay: float, formula: str, *, follow: bool) -> None:
        """Average ``model``'s tensors in, as ``verify`` found them in this update (else checked now)."""
        live, self.live = (self.live if self.live is not None else self.matched(model)), None
        for k, w in live.items():  # on another device only (checked): the average follows its weight
            if self.tensors[k].device != w.device:
                self.tensors[k] = self.tensors[k].to(w.device)
        pairs = [(self.tensors[k], w) for k, w in live.items()]
        if self.n_averaged == 0:
            for a, w in pairs:
                a.copy_(w)
        else:
            groups: dict[tuple[Any, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}
            for a, w in pairs:  # as AveragedModel: one fused call per device and dtype
                groups.setdefault((str(a.device), a.dtype, type(a)), []).append((a, w))
            for group in groups.values():
                averages, weights = [a for a, _ in group], [w for _, w in group]
                if not (averages[0].is_floating_point() or averages[0].is_complex()):
                    for a, w in group:  # get_ema_multi_avg_fn's own path for integers: truncated
                        a.copy_(a * decay + w * (1 - decay))
                elif formula == "lerp":
                    torch._foreach_lerp_(averages, weights, 1 - decay)
                else:  # each product rounded, then the sum: torchvision's decay * a + (1 - decay) * w
                    scaled = torch._foreach_mul(weights, 1 - decay)
                    torch._foreach_mul_(averages, decay)
                    torch._foreach_add_(averages, scaled)
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
        for k, mine in self.tensors.items():
            t = theirs[k]
            if not isinstance(t, torch.Tensor) or t.shape != mine.shape or t.dtype != mine.dtype:
                got = f"{tuple(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else show(t)
                raise ValueError(
                    f"{EMA}: the checkpoint's average of {k!r} is {got}, this model's {tuple(mine.shape)} "
                    f"{mine.dtype}; load a checkpoint of the same model, in the same dtype"
                )
        saved_settings = saved.get("settings")  # older checkpoints lack them
        if isinstance(saved_settings, Mapping) and dict(saved_settings) != self.settings:
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


def _settings(settings: Mapping[str, Any]) -> str:
    """``decay=0.999, every=4, warmup=0, formula='lerp'``, whatever a checkpoint holds, as ct.ema's arguments."""
    return "ema(" + ", ".join(f"{k}={v!r}" for k, v in settings.items()) + ")"


def _laid_out(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` sharded as ``like`` when ``like`` is a DTensor and ``value`` is whole."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if isinstance(like, DTensor) and not isinstance(value, DTensor):
        return distribute_tensor(value.to(like.device), like.device_mesh, like.placements, src_data_rank=None)
    return value


def _alike(a: torch.Tensor, w: torch.Tensor) -> bool:
    return a.shape == w.shape and a.dtype == w.dtype and a.device == w.device and type(a) is type(w)


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
