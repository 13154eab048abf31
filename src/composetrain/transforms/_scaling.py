"""Loss scaling state for mixed_precision: a torch.amp.GradScaler kept in the TrainState."""

from __future__ import annotations

import warnings
from typing import Any

import torch

__all__ = ["LossScaling", "describe"]

# torch.amp.GradScaler's own defaults: start at 2**16, halve on overflow, double after 2000 clean updates
DYNAMIC: dict[str, Any] = {"init_scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}

Mode = tuple[str, "float | None"]  # ("fp16", None) dynamic, ("fp16", 1024.0) fixed, ("bf16", 1.0)


def describe(mode: Mode | None) -> str:
    if mode is None:
        return "nothing"
    dtype, fixed = mode
    if dtype == "bf16":
        return "bf16"
    return f"fp16 ({'dynamic loss scale' if fixed is None else f'loss scale {fixed:g}'})"


class LossScaling:
    """The GradScaler, what it was set up for, and the streak of skipped updates.

    A step or a checkpoint for another precision starts afresh, with a warning,
    rather than reusing a loss scale that belongs to another configuration; the
    same precision on another device carries the scale over.
    """

    def __init__(self) -> None:
        self.mode: Mode | None = None
        self.device: str | None = None
        self.scaler = torch.amp.GradScaler("cpu", enabled=False)  # replaced by configure()
        self.consecutive_skips = 0
        self.unscaled = False  # unscale_ ran and update() has not yet: the scaler's own stage
        self._saved: dict[str, Any] | None = None  # loaded, applied by the next configure()
        self._found: list[torch.Tensor] = []  # at scale 1: this update's flags, one per device
        self._ones: dict[torch.device, torch.Tensor] = {}  # at scale 1: the (inverse) scale, per device

    @property
    def fixed(self) -> float | None:
        return None if self.mode is None else self.mode[1]

    def configure(self, mode: Mode, device: str, who: object) -> None:
        if mode == self.mode and device == self.device:
            return
        settings = DYNAMIC if mode[1] is None else {**DYNAMIC, "init_scale": mode[1]}
        carried = self.scaler.state_dict() if mode == self.mode else None  # moved device: keep the scale
        if self.mode is not None and mode != self.mode:
            warnings.warn(
                f"{who}: the TrainState's loss scaling was set up for {describe(self.mode)}, this step runs "
                f"{describe(mode)}; starting afresh",
                stacklevel=2,
            )
            self.consecutive_skips = 0
        self.mode, self.device = mode, device
        self.scaler = torch.amp.GradScaler(device, **settings)
        if mode[1] == 1.0:  # a scale of 1 is never applied to a loss: create the scale that unscale_ reads
            self.scaler.scale(torch.ones((), dtype=torch.float32, device=device))
        self.unscaled = False
        saved, self._saved = self._saved, None
        if carried is not None:
            self.scaler.load_state_dict(carried)
        elif saved is not None and tuple(saved["mode"]) == mode:
            self.scaler.load_state_dict(saved["scaler"])
            self.consecutive_skips = saved["consecutive_skips"]
        elif saved is not None:
            warnings.warn(
                f"{who}: the checkpoint's loss scaling is for {describe(tuple(saved['mode']))}, this step runs "
                f"{describe(mode)}; starting afresh",
                stacklevel=2,
            )

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale the gradients in place and record whether they are finite: once per update.

        At a scale of 1 (bf16) the gradients are only checked, in one kernel per device, without
        the GradScaler's bookkeeping (a reciprocal of the scale, its copies, and a refill of the scale
        afterwards: five more small kernels per update).
        """
        if self.fixed == 1.0:
            self._found = self._check_finite(optimizer)
        else:
            self.scaler.unscale_(optimizer)
        self.unscaled = True

    def _check_finite(self, optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
        """GradScaler.unscale_'s check at scale 1: one flag per device, set if a gradient is not finite."""
        # DTensor gradients apart from plain ones (ct.sharded's whole 0-dim parameters): torch's DTensor
        # handler of this kernel takes every tensor of its list for a DTensor
        grads: dict[tuple[torch.device, torch.dtype, bool], list[torch.Tensor]] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                g = p.grad
                if g is not None:
                    g = g._values() if g.is_sparse else g
                    grads.setdefault((g.device, g.dtype, hasattr(g, "placements")), []).append(g)
        found: dict[torch.device, torch.Tensor] = {}
        with torch.no_grad():
            # float32 whatever torch's default dtype: the fused kernel refuses any other (PITFALLS 30)
            for (device, _, _), tensors in grads.items():
                if device not in found:
                    found[device] = torch.zeros(1, dtype=torch.float32, device=device)
                if device not in self._ones:
                    self._ones[device] = torch.ones(1, dtype=torch.float32, device=device)
                torch._amp_foreach_non_finite_check_and_unscale_(tensors, found[device], self._ones[device])
        return list(found.values())

    def found_inf(self, optimizer: torch.optim.Optimizer) -> bool | None:
        """Whether the unscaled gradients hold an inf or NaN; None if no parameter had a gradient.

        One host sync, whatever the number of devices. GradScaler has no public way
        to say whether its step() skipped (pytorch issue 55585), so this reads the
        checks unscale_ recorded.
        """
        flags = self._found if self.fixed == 1.0 else list(self.scaler._found_inf_per_device(optimizer).values())
        if not flags:
            return None
        first = flags[0]
        total = first if len(flags) == 1 else torch.stack([f.to(first.device, non_blocking=True) for f in flags]).sum()
        return bool(total.item())

    def state_dict(self) -> dict[str, Any] | None:
        if self.mode is None:
            return self._saved
        return {"mode": self.mode, "scaler": self.scaler.state_dict(), "consecutive_skips": self.consecutive_skips}

    def load_state_dict(self, saved: dict[str, Any] | None) -> None:
        self.mode, self.device, self._saved = None, None, saved  # the next update's configure() applies it
