"""How ct.ema averages (internal): its options as one value checked when built, the decay of each averaging
update (timm's decay warmup), how it prints, and the settings a checkpoint records."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from composetrain.core.util import EMA, check_bool, check_int, check_real, show

__all__ = ["FORMULAS", "INTEGERS", "Rule"]

FORMULAS = ("lerp", "sum")
INTEGERS = ("average", "copy")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)  # the ones lerp and foreach add average


@dataclasses.dataclass(frozen=True)
class Rule:
    """ct.ema's options (see ``ct.ema``), checked; ``device`` and ``dtype`` as torch's types."""

    decay: float
    every: int = 1
    warmup: int = 0
    formula: str = "lerp"
    decay_warmup: bool = False
    warmup_gamma: float = 1.0
    warmup_power: float = 2 / 3
    min_decay: float = 0.0
    device: torch.device | None = None
    dtype: torch.dtype | None = None
    exclude_buffers: bool = False
    integers: str = "average"

    @classmethod
    def checked(cls, decay: Any, **options: Any) -> Rule:
        """The rule for ``ct.ema(decay, **options)``; every argument checked, with the fix, before anything runs."""
        given, decay = decay, check_real(decay, EMA, "decay", positive=False, example="ema(0.999)")
        if not 0.0 <= decay <= 1.0:
            raise ValueError(
                f"{EMA}: decay must be in [0, 1], got {show(given)}; e.g. ema(0.999), the old average's weight"
            )
        o = {**{f.name: f.default for f in dataclasses.fields(cls) if f.name != "decay"}, **options}
        every = check_int(o["every"], EMA, "every", example="ema(0.999, every=4)")
        warmup = check_int(o["warmup"], EMA, "warmup", minimum=0, example="ema(0.999, warmup=2 * updates_per_epoch)")
        formula = _choice(
            o["formula"],
            FORMULAS,
            "formula",
            "'lerp' (torch's get_ema_multi_avg_fn, timm's "
            "ModelEmaV3) or 'sum' (torchvision's ExponentialMovingAverage)",
        )
        integers = _choice(
            o["integers"],
            INTEGERS,
            "integers",
            "'average' (torch's AveragedModel: averaged, truncated) or 'copy' (timm's ModelEmaV3: the model's value)",
        )
        ramp = check_bool(o["decay_warmup"], EMA, "decay_warmup", example="ema(0.9998, decay_warmup=True)")
        gamma = check_real(o["warmup_gamma"], EMA, "warmup_gamma", example="warmup_gamma=1.0")
        power = check_real(o["warmup_power"], EMA, "warmup_power", example="warmup_power=0.75")
        min_decay = check_real(o["min_decay"], EMA, "min_decay", positive=False, example="min_decay=0.0")
        if not 0.0 <= min_decay <= 1.0:
            raise ValueError(f"{EMA}: min_decay must be a number in [0, 1], got {show(o['min_decay'])}")
        exclude = check_bool(o["exclude_buffers"], EMA, "exclude_buffers", example="exclude_buffers=True")
        if not ramp:
            for name, value, default, what in (
                ("min_decay", min_decay, 0.0, "bounds the decay warmup's decay from below"),
                ("warmup_gamma", gamma, 1.0, "shapes the decay warmup"),
                ("warmup_power", power, 2 / 3, "shapes the decay warmup"),
            ):
                if value != default:
                    raise ValueError(
                        f"{EMA}: {name}={value!r} {what}, which is off: it would do nothing; give decay_warmup=True "
                        f"(timm's use_warmup=True) or leave {name} out"
                    )
        elif min_decay > decay:
            raise ValueError(
                f"{EMA}: min_decay must be at most decay ({decay!r}), got {show(o['min_decay'])}: the warmup would "
                "hold the decay at min_decay throughout; give a min_decay below decay"
            )
        device, dtype = _device(o["device"]), _dtype(o["dtype"])
        if formula == "sum" and (device is not None or dtype is not None):
            shown = ", ".join(f"{k}={v!r}" for k, v in (("device", o["device"]), ("dtype", dtype)) if v is not None)
            raise ValueError(
                f"{EMA}: formula='sum' (torchvision's ExponentialMovingAverage, whose average lives as the model's "
                f"weights) with {shown}, timm's ModelEmaV3 options, which it lerps; use formula='lerp' with them"
            )
        if exclude and integers == "copy":
            raise ValueError(
                f"{EMA}: integers='copy' concerns integer buffers, and exclude_buffers=True copies every buffer "
                "already: give one of them"
            )
        return cls(decay, every, warmup, formula, ramp, gamma, power, min_decay, device, dtype, exclude, integers)

    def decay_at(self, n: int) -> float:
        """The decay of the averaging update that follows ``n`` averaging updates since the last copy (n >= 1):
        timm's ``ModelEmaV3.get_decay(step)`` with ``n = step - update_after_step - 1``."""
        if not self.decay_warmup:
            return self.decay
        decay = 1 - (1 + n / self.warmup_gamma) ** -self.warmup_power
        return max(min(decay, self.decay), self.min_decay)

    def settings(self) -> dict[str, Any]:
        """The options as plain values (a checkpoint holds no torch types: device and dtype as strings): decay,
        every, warmup and formula always, the others where they are not their default (as older checkpoints)."""
        plain = {"decay": self.decay, "every": self.every, "warmup": self.warmup, "formula": self.formula}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name not in plain and value != f.default:
                plain[f.name] = str(value) if f.name in ("device", "dtype") else value
        return plain

    @staticmethod
    def complete(settings: Mapping[str, Any]) -> dict[str, Any]:
        """Checkpointed settings with the defaults of the options they leave out (as ``settings()`` does)."""
        defaults = {f.name: f.default for f in dataclasses.fields(Rule) if f.name != "decay"}
        return {**defaults, **settings}

    def label(self) -> str:
        """``ema(0.999, every=4, ...)``: the decay and the options given other than their defaults."""
        shown = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "decay" and value != f.default:
                shown.append(f"{f.name}={str(value)!r}" if f.name == "device" else f"{f.name}={value!r}")
        return f"{EMA}({', '.join([repr(self.decay), *shown])})"


def _choice(value: Any, choices: tuple[str, ...], name: str, meaning: str) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{EMA}: {name} must be {meaning}, got {show(value)}")
    return choices[choices.index(value)]  # a plain str (not NumPy's), as it prints and as a checkpoint holds it


def _device(value: Any) -> torch.device | None:
    if value is None:
        return None
    hint = "e.g. device='cpu' to keep the average off the accelerator (timm's --model-ema-force-cpu)"
    if not isinstance(value, (str, torch.device)):
        raise TypeError(
            f"{EMA}: device must be a device torch knows (a str or torch.device) or None, got {show(value)}; {hint}"
        )
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{EMA}: device must be a device torch knows, got {show(value)}; {hint}") from None
    if device.type == "meta":  # no numbers: the run would train, and ct.ema_model give a model of none
        raise ValueError(f"{EMA}: device must be a device that holds data, got {show(value)}; {hint}")
    return device


def _dtype(value: Any) -> torch.dtype | None:
    if value is None:
        return None
    hint = "e.g. dtype=torch.float32 for the average of a bf16 model (timm's ModelEmaV3(dtype=torch.float32))"
    if not isinstance(value, torch.dtype):
        raise TypeError(f"{EMA}: dtype must be a floating-point torch.dtype or None, got {show(value)}; {hint}")
    if not value.is_floating_point:
        raise ValueError(f"{EMA}: dtype must be a floating-point torch.dtype or None, got {value}; {hint}")
    if value not in DTYPES:  # float8: no lerp, no promotion; found at the second update, after optimizer.step()
        shown = ", ".join(map(str, DTYPES))
        raise ValueError(f"{EMA}: dtype must be one the average can be kept in ({shown}) or None, got {value}; {hint}")
    return value
