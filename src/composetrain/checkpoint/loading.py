"""Reading a ct.run checkpoint outside ct.run: ``load_checkpoint`` into a TrainState on any number of ranks, and
``full_state_dict``, a sharded model's whole state for inference or export."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from composetrain.checkpoint.checksums import mismatch, read_sums
from composetrain.checkpoint.folder import STATE_FILE, step_of
from composetrain.checkpoint.format import SHARED, read, shared_problem
from composetrain.checkpoint.objects import is_remote, local_path, read_remote
from composetrain.checkpoint.shards import ShardFiles
from composetrain.core.state import TrainState

__all__ = ["full_state_dict", "load_checkpoint"]


def load_checkpoint(state: TrainState, checkpoint: str | Path) -> None:
    """Load the TrainState saved in a ``ct.run`` checkpoint folder into ``state``, on any number of ranks.
    ``checkpoint`` may be in object storage (``"s3://bucket/runs/a/step-000000800"``: a URL, as ``result.checkpoint``
    gives it), where it must hold its marker.

    Model, optimizer, scheduler, step and transform state; not the loop's position or random
    states, which are per rank (``ct.run`` itself resumes those, with the same number of
    processes, or any number dividing ``global_batch_size`` for a run given it). Sharded tensors
    are read by DCP into the state's own layout: a checkpoint of
    W ranks loads into a plain state in one process (whole tensors), or into a state sharded
    over another number of ranks (shard it first: ``ct.apply_sharding(train_step, state)``);
    under a process group, every rank calls it. Files load without running code.

    Example:
        >>> state = ct.TrainState(model, optimizer)          # one process, for inference or export
        >>> ct.load_checkpoint(state, "runs/a/step-000000800")
        >>> torch.save(state.model.state_dict(), "model.pt")
    """
    if is_remote(checkpoint):  # object storage: state.pt checked against its marker
        url = str(checkpoint).rstrip("/")
        step = step_of(url.rsplit("/", 1)[-1])
        payload, problem = read_remote(url, SHARED, lambda v: shared_problem(v, step))
        if payload is None:
            raise ValueError(f"load_checkpoint: {url} is not a readable ct.run checkpoint: {problem}")
        state.load_state_dict(ShardFiles(state).load(Path(), payload)["state"])  # no shards: nothing read there
        return
    folder = Path(local_path(checkpoint)).expanduser()
    step = step_of(folder.name)  # a folder renamed by hand: its name says nothing
    sums, problem = read_sums(folder)  # a flipped byte loads silently: its checksum says so (state.pt's)
    problem = problem or mismatch(folder, STATE_FILE, sums)
    payload, problem = (
        (None, problem) if problem else read(folder / STATE_FILE, SHARED, lambda v: shared_problem(v, step))
    )
    if payload is None:
        raise ValueError(f"load_checkpoint: {folder} is not a readable ct.run checkpoint: {problem}")
    state.load_state_dict(ShardFiles(state).load(folder, payload)["state"])


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's whole, unsharded state dict on CPU, for inference or export (a collective: call it
    on every rank; rank 0 gets the tensors, the others an empty dict).

    Example:
        >>> weights = ct.full_state_dict(state.model)        # inside the job, every rank
        >>> if proc.is_main:
        ...     torch.save(weights, "model.pt")              # loads into the plain model
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not any(isinstance(p, DTensor) for p in model.parameters()):
        return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    gone = _group_gone(model)
    if gone is not None:
        raise RuntimeError(
            f"full_state_dict: the model is sharded over a process group that is gone ({gone}), and gathering "
            "its shards needs that group on every rank: call it inside the job, before the group is destroyed "
            "(ct.run keeps a group it created until the process exits when the model is sharded), or load a "
            "checkpoint whole in one process: ct.load_checkpoint(ct.TrainState(fresh_model, optimizer), folder), "
            "then fresh_model.state_dict()"
        )
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # gathered DTensors come back as new tensors, but what FSDP2 leaves whole (buffers, the 0-dim
    # parameters sharded keeps replicated) comes back as the live CPU tensor itself: copy those, or the
    # export would go on changing as training goes on (the unsharded branch above copies too)
    live = {
        t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()] if not isinstance(t, DTensor)
    }
    return {
        k: v.clone() if v.untyped_storage().data_ptr() in live else v
        for k, v in whole.items()
        if isinstance(v, torch.Tensor)
    }


def _group_gone(model: torch.nn.Module) -> str | None:
    """Why a process group of the model's DTensors cannot be reached, or None.

    Every dimension of each parameter's mesh is looked up (a 2-D mesh, HSDP's or tensor parallel's, has a group per
    dimension and none for the whole); only a group that no longer resolves counts as gone: any other error is not
    about a gone group and propagates as itself.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        return "no process group is initialised"
    meshes = {id(p.device_mesh): p.device_mesh for p in model.parameters() if isinstance(p, DTensor)}
    for mesh in meshes.values():
        for dim in range(mesh.ndim):
            try:
                mesh.get_group(dim)
            except RuntimeError as e:
                if "could not resolve the process group" not in str(e).lower():
                    raise
                return str(e).splitlines()[0]
    return None
