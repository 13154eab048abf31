"""composetrain: fast PyTorch training from small, pure transforms around a plain step.

>>> import composetrain as ct
>>> train = ct.accumulate(4)(step)                 # step(model, batch) -> loss
>>> out = train(ct.TrainState(model, optimizer), batch)
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

# The public names load on first use (PEP 562), so that ``python -m composetrain.plot`` draws a run's
# curves without importing torch (seconds, and a plotting machine may not have it). Type checkers read
# the same names from the imports below; at run time they come from ``_WHERE``.
if TYPE_CHECKING:
    from composetrain._sharded_checkpoint import full_state_dict, load_checkpoint
    from composetrain.accumulate import accumulate
    from composetrain.activation_checkpointing import checkpoint_activations
    from composetrain.batching import leading_size, samples, split_batch
    from composetrain.clip import clip_grad_norm
    from composetrain.core import Capabilities, Context, Pass, StepOutput, TrainStep, Update
    from composetrain.data_parallel import data_parallel
    from composetrain.distributed import distributed
    from composetrain.driver.run import RunResult, run
    from composetrain.hostlist import parse_nodelist
    from composetrain.lr_rules import scaled_lr, warmup
    from composetrain.pipeline import pipeline_split
    from composetrain.precision import mixed_precision
    from composetrain.rendezvous import Cluster, Process, detect, rendezvous
    from composetrain.sharded import apply_sharding, sharded
    from composetrain.state import RuntimeState, TrainState
    from composetrain.steps import PlainStep, Transform, compose, train_step

_WHERE = {
    "full_state_dict": "composetrain._sharded_checkpoint",
    "load_checkpoint": "composetrain._sharded_checkpoint",
    "accumulate": "composetrain.accumulate",
    "checkpoint_activations": "composetrain.activation_checkpointing",
    "leading_size": "composetrain.batching",
    "samples": "composetrain.batching",
    "split_batch": "composetrain.batching",
    "clip_grad_norm": "composetrain.clip",
    "Capabilities": "composetrain.core",
    "Context": "composetrain.core",
    "Pass": "composetrain.core",
    "StepOutput": "composetrain.core",
    "TrainStep": "composetrain.core",
    "Update": "composetrain.core",
    "data_parallel": "composetrain.data_parallel",
    "distributed": "composetrain.distributed",
    "RunResult": "composetrain.driver.run",
    "run": "composetrain.driver.run",
    "parse_nodelist": "composetrain.hostlist",
    "scaled_lr": "composetrain.lr_rules",
    "warmup": "composetrain.lr_rules",
    "pipeline_split": "composetrain.pipeline",
    "mixed_precision": "composetrain.precision",
    "Cluster": "composetrain.rendezvous",
    "Process": "composetrain.rendezvous",
    "detect": "composetrain.rendezvous",
    "rendezvous": "composetrain.rendezvous",
    "apply_sharding": "composetrain.sharded",
    "sharded": "composetrain.sharded",
    "RuntimeState": "composetrain.state",
    "TrainState": "composetrain.state",
    "PlainStep": "composetrain.steps",
    "Transform": "composetrain.steps",
    "compose": "composetrain.steps",
    "train_step": "composetrain.steps",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'composetrain' has no attribute {name!r}")
    for public, module in _WHERE.items():  # all at once: the package then reads as it did eagerly
        # setdefault: a name the user assigned on the package before (ct.run = fake) keeps that value
        globals().setdefault(public, getattr(importlib.import_module(module), public))
    return globals()[name]


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


class _Package(types.ModuleType):
    def __setattr__(self, name: str, value: Any) -> None:
        # importing a submodule binds it on its package; where a public function has the submodule's
        # name (accumulate, distributed, rendezvous, ...) the function keeps the name, as it did when
        # this file imported everything eagerly
        if name in _WHERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "Capabilities",
    "Cluster",
    "Context",
    "Pass",
    "PlainStep",
    "Process",
    "RunResult",
    "RuntimeState",
    "StepOutput",
    "TrainState",
    "TrainStep",
    "Transform",
    "Update",
    "accumulate",
    "apply_sharding",
    "checkpoint_activations",
    "clip_grad_norm",
    "compose",
    "data_parallel",
    "detect",
    "distributed",
    "full_state_dict",
    "leading_size",
    "load_checkpoint",
    "mixed_precision",
    "parse_nodelist",
    "pipeline_split",
    "rendezvous",
    "run",
    "samples",
    "scaled_lr",
    "sharded",
    "split_batch",
    "train_step",
    "warmup",
]

__version__ = "0.1.0"
