"""What ct.run's records say of throughput: FLOPs counted once, the peak FLOP/s that MFU divides by, peak memory.

The model's FLOPs per update are counted, not estimated: ``torch.utils.flop_counter.FlopCounterMode`` watches the
first update of a ``ct.run`` call (its forward and backward as torch dispatches them: recomputed activations
included, the optimizer's elementwise work not, as the counter counts), once; the records scale that count by
the samples each update holds. MFU divides the FLOP/s achieved by a peak: one given as a number, or read from
``PEAK_FLOPS`` for this process's GPU and a precision.
"""

from __future__ import annotations

import contextlib
import re
import weakref
from collections.abc import Hashable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from composetrain.core.util import RUN

__all__ = ["PEAK_FLOPS", "PRECISIONS", "FlopCount", "mfu", "peak_flops", "peak_memory", "resolve_peak"]

PRECISIONS = ("bf16", "fp16", "tf32", "fp32")

_T = 1e12
# Dense peak FLOP/s of one GPU by its name as torch.cuda.get_device_name reports it, from NVIDIA's datasheets: the
# figures without sparsity (half of "with sparsity"), tensor cores for bf16, fp16 and tf32, plain fp32 otherwise;
# None where the GPU has no such tensor cores. The longest name contained in the device's name wins ("H100 PCIe"
# before "H100").
_PEAKS: dict[str, tuple[float | None, float | None, float | None, float]] = {
    #                      bf16       fp16       tf32       fp32
    "H200 NVL": (835.5 * _T, 835.5 * _T, 417.5 * _T, 60.0 * _T),
    "H200": (989.5 * _T, 989.5 * _T, 494.5 * _T, 67.0 * _T),
    "H100 PCIe": (756.0 * _T, 756.0 * _T, 378.0 * _T, 51.0 * _T),
    "H100 NVL": (835.5 * _T, 835.5 * _T, 417.5 * _T, 60.0 * _T),
    "H100": (989.5 * _T, 989.5 * _T, 494.5 * _T, 67.0 * _T),  # SXM ("H100 80GB HBM3")
    "GH200": (989.5 * _T, 989.5 * _T, 494.5 * _T, 67.0 * _T),
    "A100": (312.0 * _T, 312.0 * _T, 156.0 * _T, 19.5 * _T),  # SXM4 and PCIe, 40 and 80 GB alike
    "L40S": (362.05 * _T, 362.05 * _T, 183.0 * _T, 91.6 * _T),
    "L4": (121.0 * _T, 121.0 * _T, 60.0 * _T, 30.3 * _T),
    "A10": (125.0 * _T, 125.0 * _T, 62.5 * _T, 31.2 * _T),
    "V100": (None, 125.0 * _T, None, 15.7 * _T),  # SXM2; no bf16 or tf32 tensor cores
    "T4": (None, 65.0 * _T, None, 8.1 * _T),
}
PEAK_FLOPS: Mapping[str, Mapping[str, float | None]] = MappingProxyType(
    {gpu: MappingProxyType(dict(zip(PRECISIONS, peaks, strict=True))) for gpu, peaks in _PEAKS.items()}
)


def peak_flops(device_name: str, precision: str) -> float | None:
    """The table's dense peak FLOP/s for a GPU named ``device_name`` at ``precision``, or None where the table
    has none (an unknown GPU, or a precision it lacks).

    Example:
        >>> peak_flops("NVIDIA H100 80GB HBM3", "bf16")
        989500000000000.0
    """
    words = set(re.split(r"[\s\-_]+", device_name.lower()))
    known = [gpu for gpu in PEAK_FLOPS if set(gpu.lower().split()) <= words]
    if not known:
        return None
    return PEAK_FLOPS[max(known, key=len)][precision]


def resolve_peak(peak: float | str | None, device: torch.device) -> float | None:
    """``ct.run``'s ``peak_flops`` for this process's device: a number as given, a precision looked up for its GPU
    (refused where the table has none: MFU would be against a guess), None: no MFU."""
    if peak is None or isinstance(peak, float):
        return peak
    if device.type != "cuda":
        raise ValueError(
            f"{RUN}: peak_flops={peak!r} looks the peak up for a GPU, but this process runs on {device}; give the "
            "peak FLOP/s of one device as a number, e.g. peak_flops=2e12, or leave it out (no MFU)"
        )
    name = torch.cuda.get_device_name(device)
    found = peak_flops(name, peak)
    if found is None:
        raise ValueError(
            f"{RUN}: peak_flops={peak!r}: the table of peaks (composetrain.driver.throughput.PEAK_FLOPS: "
            f"{', '.join(PEAK_FLOPS)}) has no {peak} figure for {name!r}; give its dense peak FLOP/s as a number, "
            "e.g. peak_flops=312e12"
        )
    return found


class FlopCount:
    """The FLOPs of one update, counted by ``FlopCounterMode`` on the first update of a ``ct.run`` call, per unit
    of its batch (samples), so that an update of another size scales it; None until counted.

    A later call in this process on the same model (the same object, its parameters' names, shapes, dtypes and
    devices, its training mode), with the same composition (the same object) and a first batch laid out alike
    (its tensors' shapes, dtypes and devices) takes the count made then instead of counting again: the counter
    slows the update it watches down, which a run of short calls (a benchmark's rounds, an evaluation loop
    between ``ct.run`` calls) would pay each time."""

    def __init__(self) -> None:
        self.total: int | None = None  # the first update's FLOPs
        self.samples: float | None = None  # the samples of that update, as ct.run counts them
        self.done = False

    @contextlib.contextmanager
    def counting(self, model: nn.Module | None = None, step: Any = None, batch: Any = None) -> Iterator[None]:
        """Around the first update only: count its FLOPs (the counter slows that update down), unless the count
        of an update alike is kept (``model``, ``step`` and ``batch`` given)."""
        self.done = True
        if model is None or step is None:
            layout, kept = None, None
        else:
            layout, kept = _layout(model, batch), _COUNTED.get(model)
        if kept is not None and kept[0]() is step and kept[1] == layout:
            self.total = kept[2]
            yield
            return
        counter = FlopCounterMode(display=False)
        with counter:
            yield
        self.total = counter.get_total_flops()
        if model is not None and step is not None:
            _COUNTED[model] = (weakref.ref(step), layout, self.total)

    def of(self, samples: float) -> float | None:
        """The FLOPs of an update of ``samples``: the count itself for an update of the counted one's size (exact),
        scaled by the samples otherwise; None before the count."""
        if self.total is None or not self.samples:
            return None
        return float(self.total) if samples == self.samples else self.total * samples / self.samples


# The last count made for a model (held weakly), with the composition (weakly: it may hold the model) and the
# layouts it was made for
_COUNTED: weakref.WeakKeyDictionary[nn.Module, tuple[weakref.ref[Any], Hashable, int]] = weakref.WeakKeyDictionary()


class _Unknown:
    """A batch leaf whose layout cannot be told: equal to nothing, so that no kept count is taken for it."""

    def __eq__(self, other: object) -> bool:
        return False

    def __hash__(self) -> int:
        return id(self)


def _layout(model: nn.Module, batch: Any) -> Hashable:
    """What an update's FLOPs depend on besides the composition, as a value: the model's parameters (which of them
    need gradients: a frozen one has no weight gradient to compute) and every submodule's mode (a forward may run a
    part only while training), the batch's structure and tensors' shapes (an object inside it that is neither is
    taken as unknown)."""
    params = tuple((name, tuple(p.shape), p.dtype, p.device, p.requires_grad) for name, p in model.named_parameters())
    modes = tuple(m.training for m in model.modules())
    return (type(model), modes, params, _leaf_layout(batch))


def _leaf_layout(value: Any) -> Hashable:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_leaf_layout(v) for v in value))
    if isinstance(value, Mapping):
        return (type(value), tuple((k, _leaf_layout(v)) for k, v in value.items()))
    if value is None or type(value) in (bool, int, float, str):
        return (type(value), value)
    return _Unknown()


def peak_memory(device: torch.device) -> float:
    """MiB: the most this process held since the last call, which starts the next period: on CUDA what the caching
    allocator had allocated (``max_memory_allocated``) on ``device``; elsewhere the process's peak resident memory
    (VmHWM, reset through ``/proc/self/clear_refs``; without it, the peak since the process started)."""
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        return peak / 2**20
    try:
        with open("/proc/self/status") as f:
            found = re.search(r"VmHWM:\s+(\d+)\s+kB", f.read())
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current resident size
    except OSError:
        found = None
    if found is not None:
        return int(found.group(1)) / 1024
    return _max_rss_kib() / 1024


def _max_rss_kib() -> float:
    try:
        import resource
    except ImportError:  # not on POSIX
        return float("nan")
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def mfu(flops_per_update: float | None, updates_per_s: float, peak: float | None, world: int) -> float | None:
    """The model FLOP utilisation: FLOP/s achieved by all processes over what their devices could do at peak."""
    if flops_per_update is None or peak is None or not updates_per_s > 0:
        return None
    return flops_per_update * updates_per_s / (peak * world)
