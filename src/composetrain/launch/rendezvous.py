"""Rendezvous: find this process's place in a job (torchrun, SLURM, or explicit) and join it.

``rendezvous()`` reads the launcher's environment, initialises the
``torch.distributed`` process group (nccl on CUDA, gloo on CPU), picks one device
per local rank and returns a ``Process``; ``close()`` tears the group down. A
plain single process needs no setup at all.

Sources, in order of precedence:

- explicit arguments (``rank``, ``world_size``, ``master_addr``, ...);
- torchrun: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``;
- SLURM (``srun``): ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID``,
  ``SLURM_NNODES``, ``SLURM_JOB_NODELIST`` (bracketed host lists such as
  ``node[01-04,07]``; a step's own ``SLURM_STEP_NODELIST`` where srun sets it); the master is the
  first host, the port ``MASTER_PORT`` or one derived from ``SLURM_JOB_ID``.

Whatever else the library needs from the launcher is read here too, into the ``Cluster``: the
processes on this node (``LOCAL_WORLD_SIZE``, ``SLURM_NTASKS_PER_NODE``, or this node's entry of
``SLURM_TASKS_PER_NODE`` such as ``2(x3),1``, found by ``SLURM_NODEID``) and
the SLURM job to requeue (``SLURM_JOB_ID``). No other module reads launcher variables.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import importlib
import numbers
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist

from composetrain.core.util import check_real
from composetrain.launch import agree
from composetrain.launch.attempts import AttemptTimeout, join_attempt
from composetrain.launch.hostlist import nodelist_summary

__all__ = ["Cluster", "Process", "detect", "rendezvous"]


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where this process sits in its job, as its launcher described it.

    Attributes:
        rank: this process's rank among all processes.
        world_size: the number of processes.
        local_rank: this process's rank on its node (its device index).
        master_addr: the host of rank 0, where the rendezvous store listens.
        master_port: that store's port.
        source: "explicit", "torchrun", "slurm", "single", or "existing" (a process
            group initialised before ``rendezvous`` was called, with no launcher variables).
        local_world_size: processes on this node (torchrun's LOCAL_WORLD_SIZE, SLURM's tasks per
            node, else 1): they share its cores.
        job_id: the SLURM job this process runs in (``SLURM_JOB_ID``, also under torchrun or a
            single ``sbatch`` process), None outside SLURM: the job a pre-empted run requeues.
    """

    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int
    source: str
    local_world_size: int = 1
    job_id: str | None = None


def detect(env: Mapping[str, str] | None = None, **explicit: Any) -> Cluster:
    """Read this process's place from explicit values, torchrun's or SLURM's environment.

    Args:
        env: the environment to read (default ``os.environ``).
        **explicit: ``rank``, ``world_size``, ``local_rank``, ``master_addr``,
            ``master_port``; they override the environment.

    Returns:
        The Cluster; a plain process is rank 0 of 1.

    Raises:
        ValueError: inconsistent or malformed launcher variables (each named).
    """
    env = os.environ if env is None else env
    return dataclasses.replace(_place(env, explicit), **_node_and_job(env))


def _node_and_job(env: Mapping[str, str]) -> dict[str, Any]:
    """The Cluster's ``local_world_size`` and ``job_id``, whichever launcher started the process."""
    local = 1
    if "LOCAL_WORLD_SIZE" in env:
        text = env["LOCAL_WORLD_SIZE"]
        local = int(text) if re.fullmatch(r"\s*[0-9]+\s*", text) else 0
        if local < 1:
            raise ValueError(
                f"rendezvous: LOCAL_WORLD_SIZE must be a positive integer, got {text!r}: the processes on this "
                "node, as torchrun sets it; check the job's environment"
            )
    else:
        for name in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
            if name in env:
                local = _tasks_on_this_node(env, name)
                break
    return {"local_world_size": max(1, local), "job_id": env.get("SLURM_JOB_ID") or None}


def _tasks_on_this_node(env: Mapping[str, str], name: str) -> int:
    """This node's entry of SLURM's compressed task counts: ``"2(x3),1"`` is 2, 2, 2, 1 for nodes 0-3
    (``SLURM_NODEID``, needed only when the counts differ)."""
    text = env[name]
    counts: list[tuple[int, int]] = []  # (tasks, nodes)
    for group in text.split(","):
        match = re.fullmatch(r"\s*([0-9]+)\s*(?:\(x([0-9]+)\))?\s*", group)
        if match is None or int(match.group(1)) < 1 or int(match.group(2) or 1) < 1:
            raise ValueError(
                f"rendezvous: {name}={text!r} is not SLURM's list of tasks per node, like '2(x3),1'; check the "
                "job's environment"
            )
        counts.append((int(match.group(1)), int(match.group(2) or 1)))
    if name == "SLURM_TASKS_PER_NODE":  # one allocation (or one step) wrote these with its task counts
        total, nodes = sum(t * n for t, n in counts), sum(n for _, n in counts)
        for other, number, what in (
            ("SLURM_NTASKS", total, "places {} tasks"),
            ("SLURM_NNODES", nodes, "describes {} node(s)"),
        ):
            if other in env and _int(env[other], other) != number:
                raise ValueError(
                    f"rendezvous: {name}={text!r} {what.format(number)} but {other}={env[other]}; these come from "
                    "one allocation: check the job's environment"
                )
    if len({tasks for tasks, _ in counts}) == 1:
        return counts[0][0]
    if "SLURM_NODEID" not in env:
        raise ValueError(
            f"rendezvous: {name}={text!r} differs between nodes but SLURM_NODEID is not set, so this node's count "
            "is unknown; start the tasks with srun (it sets SLURM_NODEID), or set LOCAL_WORLD_SIZE"
        )
    node = _int(env["SLURM_NODEID"], "SLURM_NODEID")
    for tasks, nodes in counts:
        if 0 <= node < nodes:
            return tasks
        node -= nodes
    raise ValueError(
        f"rendezvous: SLURM_NODEID={env['SLURM_NODEID']} but {name}={text!r} describes "
        f"{sum(n for _, n in counts)} node(s); these come from one allocation: check the job's environment"
    )


def _place(env: Mapping[str, str], explicit: dict[str, Any]) -> Cluster:
    unknown = set(explicit) - {"rank", "world_size", "local_rank", "master_addr", "master_port"}
    if unknown:
        raise TypeError(f"rendezvous: unknown arguments {sorted(unknown)}")
    if "rank" in explicit or "world_size" in explicit:
        if "rank" not in explicit or "world_size" not in explicit:
            raise ValueError("rendezvous: give rank and world_size together, got only one of them")
        values = {
            "rank": explicit["rank"],
            "world_size": explicit["world_size"],
            "local_rank": explicit.get("local_rank", explicit["rank"]),
            "master_addr": explicit.get("master_addr", env.get("MASTER_ADDR", "127.0.0.1")),
            "master_port": explicit.get("master_port", env.get("MASTER_PORT", "29500")),
        }
        return _cluster(values, "explicit", "arguments")
    if "RANK" in env and "WORLD_SIZE" in env:
        values = {
            "rank": env["RANK"],
            "world_size": env["WORLD_SIZE"],
            "local_rank": env.get("LOCAL_RANK", "0"),
            "master_addr": env.get("MASTER_ADDR", "127.0.0.1"),
            "master_port": env.get("MASTER_PORT", "29500"),
        }
        return _cluster({**values, **explicit}, "torchrun", "RANK/WORLD_SIZE/LOCAL_RANK/MASTER_PORT")
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return _slurm(env, explicit)
    _check_not_half_torchrun(env)
    return Cluster(0, 1, 0, "127.0.0.1", 0, "single")


def _check_not_half_torchrun(env: Mapping[str, str]) -> None:
    """RANK or LOCAL_RANK without the rest of torchrun's variables is a launch that went half-way, as is
    WORLD_SIZE without RANK (``_check_not_half_launched``): running alone would train one replica of a job
    that expects several, so say what is there and what is missing instead."""
    present = [k for k in ("RANK", "LOCAL_RANK") if k in env]
    if not present:
        return
    missing = [k for k in ("RANK", "WORLD_SIZE") if k not in env]
    raise ValueError(
        f"rendezvous: {', '.join(present)} {'is' if len(present) == 1 else 'are'} set but {', '.join(missing)} "
        f"{'is' if len(missing) == 1 else 'are'} not: launch with torchrun, or set RANK, WORLD_SIZE, LOCAL_RANK, "
        "MASTER_ADDR, MASTER_PORT together (or unset RANK and LOCAL_RANK to run a single process)"
    )


def _slurm(env: Mapping[str, str], explicit: Mapping[str, Any]) -> Cluster:
    missing = [k for k in ("SLURM_LOCALID", "SLURM_JOB_NODELIST") if k not in env]
    if missing:
        raise ValueError(f"rendezvous: SLURM_PROCID is set but {missing} are not; start the job with srun")
    # srun's step may run on part of the job's nodes (srun -N1 in a two-node job): its own list, where rank 0 is
    if "SLURM_STEP_NODELIST" in env:
        hosts, count = "SLURM_STEP_NODELIST", "SLURM_STEP_NUM_NODES"
    else:
        hosts, count = "SLURM_JOB_NODELIST", "SLURM_NNODES" if "SLURM_NNODES" in env else "SLURM_JOB_NUM_NODES"
    first, nhosts = nodelist_summary(env[hosts])  # never expanded: only these are needed
    nnodes = env.get(count)
    if nnodes is not None and _int(nnodes, count) != nhosts:
        raise ValueError(
            f"rendezvous: {count}={nnodes} but {hosts}={env[hosts]!r} names {nhosts} hosts; these come from one "
            "allocation: check the job's environment"
        )
    if "MASTER_PORT" in env:
        port: Any = env["MASTER_PORT"]
    elif "SLURM_JOB_ID" in env:  # same for every task of the job, different for most jobs sharing a node
        # below Linux's ephemeral ports (32768+): a client retrying to connect could otherwise be given
        # the store's own port as its source port and connect to itself
        port = 15000 + _int(env["SLURM_JOB_ID"], "SLURM_JOB_ID") % 15000
    else:
        raise ValueError("rendezvous: under SLURM set MASTER_PORT, or SLURM_JOB_ID to derive a port from")
    values = {
        "rank": env["SLURM_PROCID"],
        "world_size": env["SLURM_NTASKS"],
        "local_rank": env["SLURM_LOCALID"],
        "master_addr": env.get("MASTER_ADDR", first),
        "master_port": port,
    }
    cluster = _cluster({**values, **explicit}, "slurm", "SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID")
    if cluster.world_size < nhosts:
        raise ValueError(
            f"rendezvous: SLURM_NTASKS={cluster.world_size} is fewer than the {nhosts} nodes allocated; "
            "ask for at least one task per node (--ntasks-per-node)"
        )
    return cluster


def _cluster(values: Mapping[str, Any], source: str, names: str) -> Cluster:
    rank = _int(values["rank"], "rank")
    world = _int(values["world_size"], "world_size")
    local = _int(values["local_rank"], "local_rank")
    port = _int(values["master_port"], "master_port")
    if world < 1 or not 0 <= rank < world or not 0 <= local <= rank or not 0 <= port < 65536:
        raise ValueError(
            f"rendezvous: inconsistent {source} values (from {names}): rank={rank}, world_size={world}, "
            f"local_rank={local}, master_port={port}; need 0 <= local_rank <= rank < world_size and a port "
            "below 65536"
        )
    addr = str(values["master_addr"])
    if world > 1 and not addr.strip():  # MASTER_ADDR=$HEAD with HEAD unset: the ranks would wait the whole timeout
        raise ValueError(
            f"rendezvous: MASTER_ADDR is empty (from the {source} values), so the {world} processes have no host "
            "to meet at; set it to rank 0's host name or address"
        )
    return Cluster(rank, world, local, addr, port, source)


def _int(value: Any, what: str) -> int:
    """An integer from a launcher variable (ASCII digits, as launchers write them: not ``'1_0'``, ``'+1'``
    nor ``'١'``, which ``int`` would take) or from an explicit argument (an int, never a float or a bool
    that ``int`` would truncate)."""
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]+\s*", value):
        return int(value)
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise ValueError(f"rendezvous: {what} must be an integer, got {value!r}")


@dataclasses.dataclass
class Process:
    """This process in its job: its cluster place, device and process group backend.

    ``close()`` (or leaving a ``with`` block) destroys the process group if
    ``rendezvous`` created it.
    """

    cluster: Cluster
    device: torch.device
    backend: str | None
    owns_group: bool
    attempt: int = 0  # under torchrun: which start of the job this is, agreed by every rank
    timeout: float = 300.0  # seconds the collectives wait for the other ranks

    @property
    def rank(self) -> int:
        return self.cluster.rank

    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def is_main(self) -> bool:
        return self.cluster.rank == 0

    @property
    def local_world_size(self) -> int:
        return self.cluster.local_world_size

    def fewest(self, count: int) -> int:
        """The smallest ``count`` over all ranks (one all-reduce; ``count`` itself when alone).

        Uneven data must not hang DDP (PyTorch issue 38174): truncate each epoch to
        this many updates and every rank runs the same number of them.
        """
        return agree.fewest(count)

    def differing(self, value: Any) -> list[Any] | None:
        """Every rank's ``value`` (by rank) when they differ, else None; on every rank (``agree.differing``).

        Checks that can fail on one rank go through it, so that every rank raises the same error together
        instead of one raising while the others wait in a collective.
        """
        return agree.differing(value)

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()
            self.owns_group = False

    def keep_until_exit(self, release: Callable[[], None]) -> None:
        """Leave the process group alive past ``close()``, for tensors that still need it: a model sharded
        over it, whose DTensors find their group by name whenever they gather (``ct.full_state_dict``, an
        evaluation, a save). It is destroyed when the interpreter exits instead, after ``release``, before
        Python tears its threads down; ``release`` (and what it is bound to) is kept until then, since torch's
        DTensor caches keep the model's meshes, and through them the group, even once the model is gone.
        ``close()`` then leaves the group alone; to end it earlier, call ``release`` and
        ``torch.distributed.destroy_process_group()`` yourself."""
        if not (self.owns_group and dist.is_initialized()):
            return
        # the group by its id: a reference held by atexit's list would keep it, and its threads, to the very end
        atexit.register(_destroy_at_exit, id(dist.group.WORLD), release)
        self.owns_group = False

    def __enter__(self) -> Process:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _destroy_at_exit(group: int, release: Callable[[], None]) -> None:
    """What ``close()`` would have done, at the interpreter's exit: unless the group was ended meanwhile."""
    if not (dist.is_initialized() and id(dist.group.WORLD) == group):
        return
    release()  # drop what holds the group (FSDP2's references), or its threads outlive it
    dist.destroy_process_group()


def rendezvous(
    *,
    backend: str | None = None,
    timeout: float = 300.0,
    env: Mapping[str, str] | None = None,
    **explicit: Any,
) -> Process:
    """Join the job this process belongs to; a plain process joins nothing.

    Args:
        backend: "nccl" or "gloo"; default nccl on CUDA, gloo on CPU.
        timeout: seconds to wait for the other processes, at the rendezvous and
            in every later collective, before failing with a clear error.
        env: the environment to read (default ``os.environ``).
        **explicit: ``rank``, ``world_size``, ``local_rank``, ``master_addr``,
            ``master_port``, overriding the environment.

    Returns:
        The Process: rank, world size, device (``cuda:local_rank`` or cpu), backend.

    Raises:
        ValueError: inconsistent launcher variables, or more local ranks than GPUs.
        RuntimeError: the rendezvous did not complete within ``timeout``.

    Example:
        >>> with ct.rendezvous() as proc:          # under torchrun, srun, or alone
        ...     model.to(proc.device)
        ...     ct.distributed(ct.accumulate(4)(step))(state, batch)
    """
    timeout = check_real(timeout, "rendezvous", "timeout", example="timeout=300 (seconds)")
    cluster = detect(env, **explicit)
    if dist.is_initialized() and cluster.source == "single":  # a group set up by hand: adopt it
        local = torch.cuda.current_device() if torch.cuda.is_available() else 0
        extras = _node_and_job(env if env is not None else os.environ)
        cluster = Cluster(dist.get_rank(), dist.get_world_size(), local, "", 0, "existing", **extras)
    if cluster.source == "single" and not dist.is_initialized():
        _check_not_half_launched(env if env is not None else os.environ)
    device = _device(cluster)
    if dist.is_initialized():  # someone else set the group up: use it, and leave it to them
        if dist.get_world_size() != cluster.world_size or dist.get_rank() != cluster.rank:
            raise ValueError(
                f"rendezvous: a process group is already initialised as rank {dist.get_rank()} of "
                f"{dist.get_world_size()}, but the {cluster.source} values say rank {cluster.rank} of "
                f"{cluster.world_size}"
            )
        return Process(cluster, device, dist.get_backend(), owns_group=False, timeout=timeout)
    if cluster.world_size == 1:
        return Process(cluster, device, None, owns_group=False)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    # torch.distributed.nn binds group.WORLD into default arguments when first imported
    # (DDP imports it through torch._dynamo): after init_process_group, that would keep the
    # group and its threads alive past destroy_process_group, into the interpreter's exit,
    # where a gloo thread freeing its last work aborts the process at random
    importlib.import_module("torch.distributed.nn")
    wait = datetime.timedelta(seconds=timeout)
    where = f"{cluster.master_addr}:{cluster.master_port}"
    attempt = 0
    try:
        if cluster.source == "torchrun":  # each attempt of an elastic job meets apart from the killed ones'
            store, attempt = _torchrun_store(cluster, env if env is not None else os.environ, timeout)
            dist.init_process_group(
                backend, store=store, rank=cluster.rank, world_size=cluster.world_size, timeout=wait
            )
        else:
            store = dist.TCPStore(
                cluster.master_addr,
                cluster.master_port,
                cluster.world_size,
                is_master=cluster.rank == 0,
                timeout=wait,
                wait_for_workers=True,
            )
            dist.init_process_group(
                backend, store=store, rank=cluster.rank, world_size=cluster.world_size, timeout=wait
            )
    except AttemptTimeout as e:
        raise RuntimeError(
            f"rendezvous: {e} at {where}; a rank that never came failed to start, hangs, or is still starting "
            f"(on a loaded machine importing torch alone takes a minute): see its log, or raise timeout= "
            f"({timeout:g}s now; torchrun restarts the job if --max-restarts allows)"
        ) from e
    except (RuntimeError, dist.DistError) as e:
        hint = " (under SLURM, start every task with srun)" if cluster.source == "slurm" else ""
        raise RuntimeError(
            f"rendezvous: rank {cluster.rank} of {cluster.world_size} could not meet the others at {where} "
            f"within {timeout:g}s ({type(e).__name__}: {str(e).splitlines()[0][:200]}); check that rank 0 "
            f"is running{hint}, that MASTER_ADDR/MASTER_PORT reach it, and that every process got the same values"
        ) from e
    return Process(cluster, device, backend, owns_group=True, attempt=attempt, timeout=timeout)


def _torchrun_store(cluster: Cluster, env: Mapping[str, str], timeout: float) -> tuple[Any, int]:
    """This attempt's own namespace in the job's store (``_attempts``): torchrun's agent hosts the store
    (TORCHELASTIC_USE_AGENT_STORE), or else rank 0 does, as ``init_method="env://"`` would."""
    agent = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        cluster.master_addr,
        cluster.master_port,
        cluster.world_size,
        is_master=not agent and cluster.rank == 0,
        timeout=datetime.timedelta(seconds=timeout),
        wait_for_workers=False,
        multi_tenant=True,  # as env:// does: a later rendezvous in this process may host it again
    )
    return join_attempt(store, cluster.rank, cluster.world_size, env.get("TORCHELASTIC_RUN_ID", "none"), timeout)


def group_world(group: Any, who: object) -> tuple[int, torch.device | None]:
    """For a transform that makes processes agree: the size of ``group`` (1 without a process group,
    after refusing a launch of several processes that never joined; see ``unjoined_launch``) and the
    device its collectives take tensors on (None: the CPU, for gloo).

    Raises:
        RuntimeError: ``"{who}: WORLD_SIZE=N is set but ..."``, saying what the launch is missing.
    """
    if not (dist.is_available() and dist.is_initialized()):
        problem = unjoined_launch()
        if problem is not None:
            raise RuntimeError(f"{who!r}: {problem}")
        return 1, None
    nccl = dist.get_backend(group) == "nccl"
    return dist.get_world_size(group), torch.device("cuda", torch.cuda.current_device()) if nccl else None


def unjoined_launch(env: Mapping[str, str] | None = None) -> str | None:
    """Why a transform that makes processes agree cannot run alone here, or None: the launcher
    started several processes (``WORLD_SIZE`` above 1) but no process group is initialised. The
    sentence completes "WORLD_SIZE=N is set but ..."; transforms raise it with their own name."""
    env = os.environ if env is None else env
    world = env.get("WORLD_SIZE", "1")
    if not re.fullmatch(r"[0-9]+", world) or int(world) <= 1 or (dist.is_available() and dist.is_initialized()):
        return None
    if "RANK" not in env:
        return (
            f"WORLD_SIZE={world} is set but RANK is not: launch with torchrun, or set RANK, LOCAL_RANK, "
            "MASTER_ADDR, MASTER_PORT, and call ct.rendezvous() first (ct.run does it for you)"
        )
    return (
        f"WORLD_SIZE={world} is set but no process group is initialised: call ct.rendezvous() first (ct.run "
        "does it for you)"
    )


def _check_not_half_launched(env: Mapping[str, str]) -> None:
    """A WORLD_SIZE above 1 without RANK (nor SLURM's variables) is a launch that went half-way: running
    alone would train one replica of a job that expects several, so say what is missing instead."""
    world = env.get("WORLD_SIZE")
    if world is not None and _int(world, "WORLD_SIZE") > 1:
        raise ValueError(
            f"rendezvous: WORLD_SIZE={world} is set but RANK is not: launch with torchrun, or set RANK, "
            "LOCAL_RANK, MASTER_ADDR, MASTER_PORT (or unset WORLD_SIZE to run a single process)"
        )


def _device(cluster: Cluster) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if cluster.local_rank >= count:
        raise ValueError(
            f"rendezvous: local rank {cluster.local_rank} but this node has {count} GPU(s); start one "
            "process per GPU (torchrun --nproc-per-node, or srun --ntasks-per-node / --gpus-per-task=1)"
        )
    torch.cuda.set_device(cluster.local_rank)
    return torch.device("cuda", cluster.local_rank)
