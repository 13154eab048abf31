"""composetrain: fast PyTorch training from small, pure transforms around a plain step.

>>> import composetrain as ct
>>> train = ct.accumulate(4)(step)                 # step(model, batch) -> loss
>>> out = train(ct.TrainState(model, optimizer), batch)
"""

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
