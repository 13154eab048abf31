"""composetrain: fast PyTorch training from small, pure transforms around a plain step.

>>> import composetrain as ct
>>> train = ct.accumulate(4)(step)                 # step(model, batch) -> loss
>>> out = train(ct.TrainState(model, optimizer), batch)
"""

import importlib
from typing import TYPE_CHECKING, Any

# The public names load on first use (PEP 562), so that ``python -m composetrain.plot`` draws a run's
# curves without importing torch (seconds, and a plotting machine may not have it). Type checkers read
# the same names from the imports below; at run time they come from ``_WHERE``.
if TYPE_CHECKING:
    from composetrain.checking import CheckResult, check
    from composetrain.checkpoint.loading import full_state_dict, load_checkpoint
    from composetrain.core.batching import leading_size, samples, split_batch
    from composetrain.core.protocol import Capabilities, Context, Pass, StepOutput, TrainStep, Update
    from composetrain.core.state import RuntimeState, TrainState
    from composetrain.core.steps import PlainStep, Transform, compose, train_step
    from composetrain.core.tokens import shifted_tokens
    from composetrain.data.cache import CachedDataset, cache
    from composetrain.data.document_masks import document_block_mask, document_mask
    from composetrain.data.hdf5 import HDF5Dataset, hdf5
    from composetrain.data.packing import PackedDataset, pack
    from composetrain.data.token_files import TokenDataset, tokens
    from composetrain.data.token_writer import write_tokens
    from composetrain.driver.run import RunResult, run
    from composetrain.launch.hostlist import parse_nodelist
    from composetrain.launch.rendezvous import Cluster, Process, detect, rendezvous
    from composetrain.transforms.accumulate import accumulate
    from composetrain.transforms.activation_checkpointing import checkpoint_activations
    from composetrain.transforms.agc import adaptive_clip_grad
    from composetrain.transforms.clip import clip_grad_norm
    from composetrain.transforms.clip_value import clip_grad_value
    from composetrain.transforms.compile import compile
    from composetrain.transforms.data_parallel import data_parallel
    from composetrain.transforms.distributed import distributed
    from composetrain.transforms.ema import ema, ema_model
    from composetrain.transforms.lr_rules import scaled_lr, warmup
    from composetrain.transforms.pipeline import pipeline_split
    from composetrain.transforms.pipeline_parallel import pipeline
    from composetrain.transforms.precision import mixed_precision
    from composetrain.transforms.sharded import apply_sharding, sharded
    from composetrain.transforms.spikes import skip_spikes
    from composetrain.transforms.tensor_parallel import tensor_parallel

_WHERE = {
    "CheckResult": "composetrain.checking",
    "check": "composetrain.checking",
    "full_state_dict": "composetrain.checkpoint.loading",
    "load_checkpoint": "composetrain.checkpoint.loading",
    "accumulate": "composetrain.transforms.accumulate",
    "checkpoint_activations": "composetrain.transforms.activation_checkpointing",
    "leading_size": "composetrain.core.batching",
    "samples": "composetrain.core.batching",
    "split_batch": "composetrain.core.batching",
    "shifted_tokens": "composetrain.core.tokens",
    "clip_grad_norm": "composetrain.transforms.clip",
    "clip_grad_value": "composetrain.transforms.clip_value",
    "adaptive_clip_grad": "composetrain.transforms.agc",
    "compile": "composetrain.transforms.compile",
    "Capabilities": "composetrain.core.protocol",
    "Context": "composetrain.core.protocol",
    "Pass": "composetrain.core.protocol",
    "StepOutput": "composetrain.core.protocol",
    "TrainStep": "composetrain.core.protocol",
    "Update": "composetrain.core.protocol",
    "data_parallel": "composetrain.transforms.data_parallel",
    "distributed": "composetrain.transforms.distributed",
    "ema": "composetrain.transforms.ema",
    "ema_model": "composetrain.transforms.ema",
    "RunResult": "composetrain.driver.run",
    "run": "composetrain.driver.run",
    "parse_nodelist": "composetrain.launch.hostlist",
    "scaled_lr": "composetrain.transforms.lr_rules",
    "warmup": "composetrain.transforms.lr_rules",
    "pipeline_split": "composetrain.transforms.pipeline",
    "pipeline": "composetrain.transforms.pipeline_parallel",
    "tensor_parallel": "composetrain.transforms.tensor_parallel",
    "mixed_precision": "composetrain.transforms.precision",
    "Cluster": "composetrain.launch.rendezvous",
    "Process": "composetrain.launch.rendezvous",
    "detect": "composetrain.launch.rendezvous",
    "rendezvous": "composetrain.launch.rendezvous",
    "apply_sharding": "composetrain.transforms.sharded",
    "sharded": "composetrain.transforms.sharded",
    "skip_spikes": "composetrain.transforms.spikes",
    "RuntimeState": "composetrain.core.state",
    "TrainState": "composetrain.core.state",
    "PlainStep": "composetrain.core.steps",
    "Transform": "composetrain.core.steps",
    "compose": "composetrain.core.steps",
    "train_step": "composetrain.core.steps",
    "CachedDataset": "composetrain.data.cache",
    "cache": "composetrain.data.cache",
    "HDF5Dataset": "composetrain.data.hdf5",
    "hdf5": "composetrain.data.hdf5",
    "TokenDataset": "composetrain.data.token_files",
    "tokens": "composetrain.data.token_files",
    "write_tokens": "composetrain.data.token_writer",
    "PackedDataset": "composetrain.data.packing",
    "pack": "composetrain.data.packing",
    "document_mask": "composetrain.data.document_masks",
    "document_block_mask": "composetrain.data.document_masks",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'composetrain' has no attribute {name!r}")
    for public, module in _WHERE.items():  # all at once: the package then reads as it did eagerly
        try:
            value = getattr(importlib.import_module(module), public)
        except ImportError:  # the data layer needs NumPy, which the rest does not: only its own names fail
            if public == name or not module.startswith("composetrain.data."):
                raise
            continue
        # setdefault: a name the user assigned on the package before (ct.run = fake) keeps that value
        globals().setdefault(public, value)
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "CachedDataset",
    "Capabilities",
    "CheckResult",
    "Cluster",
    "Context",
    "HDF5Dataset",
    "PackedDataset",
    "Pass",
    "PlainStep",
    "Process",
    "RunResult",
    "RuntimeState",
    "StepOutput",
    "TokenDataset",
    "TrainState",
    "TrainStep",
    "Transform",
    "Update",
    "accumulate",
    "adaptive_clip_grad",
    "apply_sharding",
    "cache",
    "check",
    "checkpoint_activations",
    "clip_grad_norm",
    "clip_grad_value",
    "compile",
    "compose",
    "data_parallel",
    "detect",
    "distributed",
    "document_block_mask",
    "document_mask",
    "ema",
    "ema_model",
    "full_state_dict",
    "hdf5",
    "leading_size",
    "load_checkpoint",
    "mixed_precision",
    "pack",
    "parse_nodelist",
    "pipeline",
    "pipeline_split",
    "rendezvous",
    "run",
    "samples",
    "scaled_lr",
    "sharded",
    "shifted_tokens",
    "skip_spikes",
    "split_batch",
    "tensor_parallel",
    "tokens",
    "train_step",
    "warmup",
    "write_tokens",
]

__version__ = "0.1.0"
