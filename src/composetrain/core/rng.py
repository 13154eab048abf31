"""The random generators of a process: seeded in one place (``seed_everything``) from seeds derived in one
place (``derive_seed``), snapshotted in memory in one place (``Generators``), and their states as tensors and
plain types, for checkpoints that load with ``weights_only=True`` (nothing in them can run
code); checked on fresh generators before use."""

from __future__ import annotations

import random
import sys
from collections.abc import Collection
from typing import Any

import torch

__all__ = [
    "EVERY",
    "HOST",
    "SEEDS",
    "Generators",
    "capture_rng",
    "derive_seed",
    "generators_problem",
    "restore_rng",
    "rng_problem",
    "seed_everything",
]


EVERY = ("torch", "cuda", "python", "numpy")  # the generators of a process, as Generators names them
HOST = ("python", "numpy")  # those torch.utils.checkpoint does not replay (it replays torch's own)


class Generators:
    """This process's generator states in memory, for putting back what an attempt drew (no checkpoint:
    unlike ``capture_rng``, nothing is converted). The one snapshot of them: the refused call's put-back,
    ``accumulate("auto")``'s undo, and activation checkpointing's replay of Python's and NumPy's draws.

    Args:
        kinds: which generators, of ``EVERY``: ``"torch"`` (torch's CPU generator), ``"cuda"`` (every
            GPU's, once CUDA is initialised), ``"python"`` (``random``), ``"numpy"`` (NumPy's global one,
            once NumPy is imported: a step that never imported it cannot have drawn from it).

    Example:
        >>> taken = Generators()
        >>> torch.rand(3), random.random()  # an attempt that fails
        >>> taken.restore()                 # every stream as if it never ran
    """

    def __init__(self, kinds: Collection[str] = EVERY) -> None:
        unknown = sorted(set(kinds) - set(EVERY))
        if unknown:
            raise ValueError(f"Generators: kinds must be among {EVERY}, got {unknown}")
        self.rng = torch.get_rng_state() if "torch" in kinds else None
        initialised = "cuda" in kinds and torch.cuda.is_initialized()
        self.cuda_rng = torch.cuda.get_rng_state_all() if initialised else None
        self.py_rng = random.getstate() if "python" in kinds else None
        numpy = sys.modules.get("numpy") if "numpy" in kinds else None
        self.np_rng = (numpy, numpy.random.get_state()) if numpy is not None else None

    def restore(self) -> None:
        """Every generator taken as it was when this snapshot was taken (again and again, if called so)."""
        if self.rng is not None:
            torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)
        if self.py_rng is not None:
            random.setstate(self.py_rng)
        if self.np_rng is not None:
            numpy, saved = self.np_rng
            numpy.random.set_state(saved)


SEEDS = ("fresh start", "loader", "worker", "order", "resume", "stream pass")  # what derive_seed derives a seed for


def derive_seed(seed: int, purpose: str, *, rank: int = 0, worker: int = 0, epoch: int = 0, step: int = 0) -> int:
    """The seed of one of a run's random streams, from the run's ``seed``: the one place each is derived.

    The values are part of every run's checkpoints (a resumed run continues the streams these started), so
    they never change (a resumed run's, which seed streams anew where no saved state applies, were changed once:
    see ``"resume"``):

    - ``"fresh start"``: a rank's global generators when no checkpoint is resumed, ``seed * 1000003 + rank``
      (each rank its own: dropout masks and augmentations differ between ranks);
    - ``"loader"``: a rank's DataLoader generator (its workers' base seed), ``seed * 7919 + rank``;
    - ``"worker"``: a loader worker's generators, ``(seed * 7919 + rank * 104729 + 1009 * worker) % 2**32``
      (every worker of every rank draws differently: PyTorch issue 5059; below 2**32 for NumPy); in a run resumed
      at update ``step`` (> 0), ``mixed(seed, 2, rank, worker, step) % 2**32``: new streams, not the fresh start's
      again (each requeue would replay its augmentations), and any two resumes there draw alike;
    - ``"order"``: the generator of epoch ``epoch``'s order of a run defined by its global batch, ``seed + epoch``,
      the same on every rank and for any number of ranks (``DistributedSampler``'s: on one process the order is
      that of ``batch_size=`` runs);
    - ``"resume"``: a rank's global generators when a run defined by its global batch resumes on another number
      of processes at update ``step`` (the saved streams were per rank of another job), ``mixed(seed, 1, rank,
      step) % 2**63``: from the run's seed, the rank and the global position alone, so any two resumes there draw
      alike; mixed (SplitMix64's finaliser over the numbers in turn), since a sum of multiples lines streams up
      (``(seed * 1000003 + rank) * 1000033 + step + 1`` gave rank 0 resumed after update 1 of seed 0 the fresh
      start's rank 2's stream). Its values are never in a checkpoint (a resumed run saves the states they start);
    - ``"stream pass"``: the generator of the StatefulDataLoader ct.run builds to read a stream with workers, set
      before pass ``epoch`` begins, ``mixed(seed, 3, rank, epoch) % 2**63``: its workers' base seed, so that a pass
      resumed at its start draws as the uninterrupted run's (a generator seeded once drew one base seed per pass
      read in this process, another in a resumed one).

    Example:
        >>> seed_everything(derive_seed(5, "fresh start", rank=1))  # 5000016
    """
    if purpose == "fresh start":
        return seed * 1000003 + rank
    if purpose == "loader":
        return seed * 7919 + rank
    if purpose == "worker" and step:
        return _mixed(seed, 2, rank, worker, step) % 2**32
    if purpose == "worker":
        return (seed * 7919 + rank * 104729 + 1009 * worker) % 2**32
    if purpose == "order":
        return seed + epoch
    if purpose == "resume":
        return _mixed(seed, 1, rank, step) % 2**63
    if purpose == "stream pass":
        return _mixed(seed, 3, rank, epoch) % 2**63
    raise ValueError(f"derive_seed: purpose must be one of {SEEDS}, got {purpose!r}")


def _mixed(*numbers: int) -> int:
    """A 64-bit value of non-negative ints, each folded in with SplitMix64's step and finaliser: nearby inputs give
    unrelated values, so seeds derived from (seed, rank, step) never line up as sums of multiples do."""
    mask, state = 2**64 - 1, 0
    for n in numbers:
        z = state = (state + n + 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        state = z ^ (z >> 31)
    return state


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's (if installed) and torch's generators with ``seed`` (NumPy's modulo 2**32)."""
    random.seed(seed)
    torch.manual_seed(seed)
    np = _numpy()
    if np is not None:
        np.random.seed(seed % 2**32)


def capture_rng() -> dict[str, Any]:
    """Python, NumPy, torch CPU and CUDA generator states of this process, as tensors and plain
    types (a checkpoint loads with ``weights_only=True``: nothing in it can run code)."""
    version, words, gauss = random.getstate()
    states: dict[str, Any] = {
        "python": {"version": version, "words": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
        "torch": torch.get_rng_state(),
    }
    np = _numpy()
    if np is not None:
        kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
        states["numpy"] = {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng(states: dict[str, Any]) -> None:
    """Set this process's generators to what ``capture_rng`` returned (checked by ``rng_problem``)."""
    random.setstate(_python_state(states["python"]))
    torch.set_rng_state(states["torch"])
    np = _numpy()
    if "numpy" in states and np is not None:  # without NumPy nothing can draw from its generator
        np.random.set_state(_numpy_state(states["numpy"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _python_state(saved: dict[str, Any]) -> tuple[Any, ...]:
    return saved["version"], tuple(saved["words"].tolist()), saved["gauss"]


def _numpy() -> Any:
    try:
        import numpy

        return numpy
    except ImportError:  # NumPy is optional
        return None


def _numpy_state(saved: dict[str, Any]) -> tuple[Any, ...]:
    import numpy as np

    keys = saved["keys"].numpy()
    if keys.min(initial=0) < 0 or keys.max(initial=0) >= 2**32:
        raise ValueError("NumPy generator keys out of range")
    return saved["kind"], keys.astype(np.uint32), saved["pos"], saved["has_gauss"], saved["cached_gaussian"]


def rng_problem(states: Any) -> str | None:
    """What is wrong with saved generator states, or None: each is set on a fresh generator, so
    that a bad one is found before anything of this process changes."""
    try:
        if not isinstance(states, dict) or not {"python", "torch"} <= states.keys():
            raise ValueError(f"expected a dict with 'python' and 'torch', got {type(states).__name__}")
        random.Random().setstate(_python_state(states["python"]))
        torch.Generator().set_state(states["torch"])
        np = _numpy()
        if "numpy" in states and np is not None:
            np.random.RandomState().set_state(_numpy_state(states["numpy"]))
        cuda = states.get("cuda", [])
        if not isinstance(cuda, list) or not all(_is_byte_state(s) for s in cuda):
            raise ValueError("CUDA states must be a list of uint8 tensors")
        if cuda and torch.cuda.is_available() and len(cuda) > torch.cuda.device_count():
            raise ValueError(f"states of {len(cuda)} CUDA devices, this process sees {torch.cuda.device_count()}")
    except Exception as e:  # whatever a malformed state raises: it is the checkpoint's fault
        return f"bad random state ({type(e).__name__}: {e})"
    return None


def generators_problem(states: Any) -> str | None:
    """What is wrong with saved ``torch.Generator`` states (a list of them), or None."""
    if not isinstance(states, list) or not all(_is_byte_state(s) for s in states):
        return "generator states must be a list of uint8 tensors"
    try:
        for s in states:
            torch.Generator().set_state(s)
    except RuntimeError as e:
        return f"bad generator state ({e})"
    return None


def _is_byte_state(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.dtype == torch.uint8 and value.dim() == 1
