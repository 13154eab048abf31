"""Devices and model placement for data_parallel and pipeline_split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from composetrain.core.util import show

__all__ = ["check_placement", "parse_device", "parse_devices"]


def parse_device(value: Any, who: str, what: str) -> torch.device:
    """A device that can train here, from a string or ``torch.device``.

    Refused when the transform is built, not at the first update with a raw torch
    error: ``meta`` (shapes without data), and a device whose backend this machine
    lacks (``mps`` off a Mac, ``xpu`` without an Intel GPU, ``cuda:7`` on 2 GPUs).
    An accelerator without an index is its current device (``cuda`` -> ``cuda:0``).
    """
    if not isinstance(value, (str, torch.device)):
        raise TypeError(f"{who}: {what} must be a device such as 'cpu' or 'cuda:0', got {show(value)}")
    try:
        device = torch.device(value)
    except (RuntimeError, ValueError):
        raise ValueError(f"{who}: {what} = {value!r} is not a device; use 'cpu', 'cuda:0', ...") from None
    if device.type == "cpu":
        return device
    if device.type == "meta":
        raise ValueError(
            f"{who}: {what} = {value!r} cannot train: a meta tensor has a shape but no data; use 'cpu' or "
            "'cuda:0' (build the model on meta, then materialise it with model.to_empty(device=...))"
        )
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.mps, torch.xpu, out-of-tree backends
    count = _device_count(backend)
    current = getattr(backend, "current_device", None)  # torch.mps has none: its one device is 0
    index = device.index if device.index is not None else (current() if count and callable(current) else 0)
    if index >= count:
        raise ValueError(
            f"{who}: {what} = {value!r} does not exist here: this machine has {count} {device.type.upper()} "
            "device(s); use 'cpu' or a device it has"
        )
    return torch.device(device.type, index)


def _device_count(backend: Any) -> int:
    """How many devices of a backend (``torch.cuda``, ``torch.mps``, ...) this process can use."""
    available = getattr(backend, "is_available", None)
    if not callable(available) or not available():
        return 0
    count = getattr(backend, "device_count", None)
    return int(count()) if callable(count) else 1


def parse_devices(devices: Any, who: str, what: str) -> list[torch.device]:
    if isinstance(devices, (list, tuple)) and not devices:
        raise ValueError(f"{who}: {what} must be a non-empty list of devices, e.g. ['cuda:0', 'cuda:1'], got []")
    if isinstance(devices, (str, torch.device)) or not isinstance(devices, (list, tuple)):
        raise TypeError(
            f"{who}: {what} must be a non-empty list of devices, e.g. ['cuda:0', 'cuda:1'], got {show(devices)}"
        )
    return [parse_device(d, who, f"{what}[{i}]") for i, d in enumerate(devices)]


def check_placement(model: nn.Module, placement: Mapping[str, torch.device], who: str) -> None:
    """Every parameter and buffer of ``model`` is in exactly one placed module, and no tensor is
    shared by modules placed on different devices. Checked before anything moves."""
    modules = dict(model.named_modules())
    unknown = [n for n in placement if n not in modules or n == ""]
    if unknown:
        children = [n for n, _ in model.named_children()]
        raise ValueError(f"{who}: the model has no submodule {unknown}; its children are {children}")
    owners: dict[int, set[str]] = {}
    names: dict[int, str] = {}
    tensors = [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]
    for name, tensor in tensors:
        names.setdefault(id(tensor), name)
        holders = [m for m in placement if name.startswith(m + ".")]
        if len(holders) > 1:
            raise ValueError(f"{who}: {name} is placed twice, by {holders}; place nested modules once")
        owners.setdefault(id(tensor), set()).update(holders)
    uncovered = [names[i] for i, placed in owners.items() if not placed]
    if uncovered:
        raise ValueError(
            f"{who}: the placement leaves {uncovered[:6]}{' ...' if len(uncovered) > 6 else ''} on no device; "
            "place every module that holds parameters or buffers"
        )
    for i, placed in owners.items():
        if len({placement[m] for m in placed}) > 1:
            where = {m: str(placement[m]) for m in sorted(placed)}
            raise ValueError(
                f"{who}: {names[i]} is shared (tied) by {where}; a tensor lives on one device: place those "
                "modules on the same device, or untie the weights"
            )
