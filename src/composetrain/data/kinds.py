"""Which datasets are this layer's, asked without importing it: NumPy (which ``ct.cache`` and ``ct.hdf5`` need)
stays optional for a run over other data. No ``MappedDataset`` exists before its module is loaded, so a module
not yet in ``sys.modules`` answers "no" without being imported."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from composetrain.data.hdf5 import HDF5Dataset
    from composetrain.data.mapped import MappedDataset

__all__ = ["as_hdf5", "as_mapped"]


def as_mapped(dataset: Any) -> MappedDataset | None:
    """``dataset`` if it is a ``MappedDataset`` (a ``ct.cache`` store, a ``ct.hdf5`` file), else None."""
    module = sys.modules.get("composetrain.data.mapped")
    return dataset if module is not None and isinstance(dataset, module.MappedDataset) else None


def as_hdf5(dataset: Any) -> HDF5Dataset | None:
    """``dataset`` if it is a ``ct.hdf5`` dataset, else None."""
    module = sys.modules.get("composetrain.data.hdf5")
    return dataset if module is not None and isinstance(dataset, module.HDF5Dataset) else None
