"""Which datasets are this layer's, asked without importing it: NumPy (which ``ct.cache`` and ``ct.hdf5`` need)
stays optional for a run over other data. No ``MappedDataset`` exists before its module is loaded, so a module
not yet in ``sys.modules`` answers "no" without being imported."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composetrain.data.hdf5 import HDF5Dataset
    from composetrain.data.mapped import MappedDataset

__all__ = ["as_hdf5", "as_mapped", "augmented_inside", "joined"]


def as_mapped(dataset: Any) -> MappedDataset | None:
    """``dataset`` if it is a ``MappedDataset`` (a ``ct.cache`` store, a ``ct.hdf5`` file), else None."""
    module = sys.modules.get("composetrain.data.mapped")
    return dataset if module is not None and isinstance(dataset, module.MappedDataset) else None


def as_hdf5(dataset: Any) -> HDF5Dataset | None:
    """``dataset`` if it is a ``ct.hdf5`` dataset, else None."""
    module = sys.modules.get("composetrain.data.hdf5")
    return dataset if module is not None and isinstance(dataset, module.HDF5Dataset) else None


def _wrapped(dataset: Any) -> list[Any]:
    """The datasets ``dataset`` holds where torch's wrappers keep them (``Subset.dataset``, ``ConcatDataset.datasets``);
    a wrapper of another library that keeps them so is seen too."""
    inner = getattr(dataset, "datasets", None)
    if isinstance(inner, list | tuple):
        return list(inner)
    inner = getattr(dataset, "dataset", None)
    return [] if inner is None or inner is dataset else [inner]


def augmented_inside(dataset: Any) -> list[MappedDataset]:
    """The augmented ``MappedDataset``s that ``dataset`` wraps (not itself), however deep: the epoch and rank that
    seed their augmentation must reach them through the wrappers (which pass neither on)."""
    if sys.modules.get("composetrain.data.mapped") is None:
        return []
    found: list[MappedDataset] = []
    todo, seen = _wrapped(dataset), {id(dataset)}
    while todo:
        d = todo.pop()
        if id(d) in seen:
            continue
        seen.add(id(d))
        if (store := as_mapped(d)) is not None:
            found += [store] if store.augment is not None else []
        else:
            todo += _wrapped(d)
    return found


def joined(dataset: Any) -> list[Any] | None:
    """The datasets under ``dataset``'s Subsets and ConcatDatasets (itself if it is neither), or None where
    another wrapper lies between (its reads cannot be followed)."""
    from torch.utils.data import ConcatDataset, Subset

    if isinstance(dataset, Subset):
        return joined(dataset.dataset)
    if isinstance(dataset, ConcatDataset):
        parts = [joined(d) for d in dataset.datasets]
        return None if any(p is None for p in parts) else [d for p in parts for d in p or ()]
    return None if as_mapped(dataset) is None and _wrapped(dataset) else [dataset]
