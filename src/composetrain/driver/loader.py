"""ct.run's loader: a DataLoader given, checked and used as given, or a ``Reader`` over a Dataset with its resumable
distributed sampler (``batch_size``: per process) or its share of each global update (``global_batch_size``:
``GlobalBatches``) and seeded workers (``build_loader``); an epoch's batches from where a run stopped
(``epoch_batches``); what a given DataLoader draws an epoch's order from, so that a resume replays it
(``epoch_order``, ``order_problem``)."""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sized
from typing import Any

import torch
from torch.utils.data import (
    DataLoader,
    DistributedSampler,
)

from composetrain.checkpoint.format import Order
from composetrain.core.rng import capture_rng, derive_seed, restore_rng, seed_everything
from composetrain.core.util import RUN
from composetrain.data.kinds import as_mapped, augmented_inside
from composetrain.driver.global_batches import GlobalBatches, global_problem
from composetrain.driver.options import LoaderOptions
from composetrain.driver.prefetch import device_batches
from composetrain.driver.reader import Reader, ResumableSampler, auto_workers, mapped, worker_loader

__all__ = [
    "ResumableSampler",
    "build_loader",
    "epoch_batches",
    "epoch_order",
    "generator_states",
    "order_problem",
    "set_generator_states",
]


def _seed_worker(seed: int, rank: int) -> Any:
    """The workers' init function: a partial of a module-level function, so that it pickles to workers started
    by "spawn" or "forkserver" (a closure would not, and no worker could start)."""
    return functools.partial(_init_worker, seed, rank)


def _init_worker(seed: int, rank: int, worker_id: int) -> None:
    # (seed, rank, worker): every worker of every rank draws differently (PyTorch issue 5059)
    seed_everything(derive_seed(seed, "worker", rank=rank, worker=worker_id))


def build_loader(
    options: LoaderOptions,
    *,
    pin_memory: bool,
    rank: int,
    world_size: int,
    local_world_size: int,
    equal_shares: bool = False,
) -> tuple[DataLoader[Any] | Reader, ResumableSampler | GlobalBatches | None]:
    """The loader of ``options.data``: a DataLoader given, used as given (no sampler), or ct.run's ``Reader``
    over a Dataset, and its sampler (``num_workers``: an int, or "auto": chosen by measurement). The options
    were checked when built; what is checked here needs the job (its world size) or the data's length
    (``equal_shares``: every rank must read as many samples in each update, as under ``ct.sharded``).

    Raises:
        TypeError / ValueError: what ``data`` cannot give this job, named.
    """
    data = options.data
    if isinstance(data, DataLoader):
        if world_size > 1 and not isinstance(data.sampler, DistributedSampler | ResumableSampler):
            raise ValueError(
                f"{RUN}: the DataLoader given has a {type(data.sampler).__name__}, so every rank would see "
                "the same data; pass the Dataset (ct.run builds a loader with a DistributedSampler) or give "
                "the DataLoader a DistributedSampler"
            )
        augmented = (mapped_data := as_mapped(data.dataset)) is not None and mapped_data.augment is not None
        augmented = augmented or bool(augmented_inside(data.dataset))  # in a Subset: set_epoch reaches it
        if augmented and data.num_workers > 0 and data.persistent_workers:
            raise ValueError(
                f"{RUN}: the DataLoader given has persistent workers over a dataset that augments its batches: "
                "their copies never see the epoch, so every epoch would draw the same augmentation; give it "
                "persistent_workers=False, or pass the dataset (ct.run's loader hands each batch its epoch)"
            )
        _check_not_empty(data.dataset)
        return data, None
    batch_size, drop_last, seed, collate_fn = options.batch_size, options.drop_last, options.seed, options.collate_fn
    size = _check_not_empty(data)
    if augmented_inside(data):  # loaded: the data holds one of its MappedDatasets
        from composetrain.data.wrapped import check_wrapped

        check_wrapped(data, RUN)  # a wrapper it cannot read with each batch's epoch is refused
    sampler: ResumableSampler | GlobalBatches
    if options.global_batch_size is not None:  # the run is its global sequence, whatever the world size
        problem = global_problem(size, options.global_batch_size, world_size, drop_last, equal_shares)
        if problem is not None:
            raise ValueError(f"{RUN}: {problem}")
        sampler = GlobalBatches(
            size,
            options.global_batch_size,
            shuffle=options.shuffle,
            seed=seed,
            drop_last=drop_last,
            rank=rank,
            world_size=world_size,
        )
        batch_size = sampler.per_rank
    else:
        assert batch_size is not None  # for the type checker: LoaderOptions requires one of them for a Dataset
        if drop_last and batch_size * world_size > size:
            raise ValueError(
                f"{RUN}: batch_size={batch_size} on {world_size} process(es) needs {batch_size * world_size} "
                f"samples per update, but the dataset has {size} and drop_last=True would leave no batch; "
                "lower batch_size or set drop_last=False"
            )
        sampler = ResumableSampler(
            DistributedSampler(
                data, num_replicas=world_size, rank=rank, shuffle=options.shuffle, seed=seed, drop_last=drop_last
            )
        )

    # a ct.cache store's workers read whole batches, each with its epoch (which seeds its augmentation)
    whole = mapped(data, collate_fn)
    workers = functools.partial(
        worker_loader,
        dataset=data,
        sampler=sampler,
        batch_size=batch_size,
        drop_last=drop_last,
        collate_fn=collate_fn,
        pin_memory=pin_memory,
        worker_init_fn=_seed_worker(seed, rank),
        seed=derive_seed(seed, "loader", rank=rank),
        whole=whole,
    )

    workers_now = None if options.auto_workers else int(options.num_workers)
    reader = Reader(
        data, sampler, batch_size, drop_last, collate_fn, workers_now, workers, auto_workers(local_world_size)
    )
    return reader, sampler


def _check_not_empty(dataset: Any) -> int:
    if not isinstance(dataset, Sized):
        return 1
    size = len(dataset)
    if size == 0:
        raise ValueError(f"{RUN}: the dataset is empty: there is nothing to train on")
    return size


def epoch_order(
    loader: DataLoader[Any] | Reader, sampler: ResumableSampler | GlobalBatches | None
) -> dict[str, Any] | None:
    """What a given DataLoader draws this epoch's order from, taken at the epoch's start: the
    random states (global, and the loader's and sampler's own generators) and a
    ``DistributedSampler``'s seed. None for ct.run's own sampler, which starts part-way by itself."""
    if sampler is not None:
        return None
    assert isinstance(loader, DataLoader)  # for the type checker: only ct.run's own has a sampler
    _start_workers(loader)
    seed = getattr(loader.sampler, "seed", None)
    return Order(capture_rng(), generator_states(loader), seed).to_file()


def generator_states(loader: DataLoader[Any]) -> list[torch.Tensor]:
    return [g.get_state() for g in _generators(loader)]


def set_generator_states(loader: DataLoader[Any], states: list[torch.Tensor]) -> None:
    for g, state in zip(_generators(loader), states, strict=True):
        g.set_state(state)


def _generators(loader: DataLoader[Any]) -> list[torch.Generator]:
    """The generators a given DataLoader draws from (workers' base seed, shuffle), each once."""
    found: list[torch.Generator] = []
    batch_sampler = loader.batch_sampler
    for owner in (loader, loader.sampler, batch_sampler, getattr(batch_sampler, "sampler", None)):
        g = getattr(owner, "generator", None)
        if isinstance(g, torch.Generator) and g.device.type == "cpu" and all(g is not h for h in found):
            found.append(g)
    return found


def order_problem(
    given: DataLoader[Any] | None, position: int, order: dict[str, Any] | None, generators: list[torch.Tensor]
) -> str | None:
    """Why a checkpoint's data order cannot continue on this loader (``given``: a DataLoader given
    as is; None: ct.run's own), or None. ``order`` and ``generators`` are what the checkpoint saved."""
    if given is None:
        if position and order is not None:
            return "stopped inside an epoch of a DataLoader given as is, and this run got a Dataset; pass it again"
        return None
    if position and order is None:
        return "stopped inside an epoch of a loader ct.run built, and this run got a DataLoader; pass the Dataset"
    now = len(_generators(given))
    saved = [len(generators)] + ([len(order["generators"])] if order else [])
    if any(n != now for n in saved):
        return (
            f"continues a DataLoader that drew from {saved[0]} generator(s) of its own, and this one has {now}; "
            "give it the same generator= and sampler"
        )
    return None


def _start_workers(loader: DataLoader[Any]) -> None:
    """Start a given loader's persistent workers, once, leaving every random state as it was.

    The first iterator of such a loader draws its workers' base seed and then the order; later
    epochs reuse the workers and draw only the order. Started ahead of the first epoch, every
    epoch draws alike, so an epoch resumed in a fresh process draws its order as it first did.
    """
    if loader.persistent_workers and loader.num_workers > 0 and loader._iterator is None:
        rng, generators = capture_rng(), generator_states(loader)
        iter(loader)  # the prefetched batches are dropped when the first epoch resets it
        restore_rng(rng)
        set_generator_states(loader, generators)


def epoch_batches(
    loader: DataLoader[Any] | Reader,
    sampler: ResumableSampler | GlobalBatches | None,
    epoch: int,
    start: int,
    order: dict[str, Any] | None,
    device: torch.device,
    end: int,
) -> Iterator[tuple[int, Any, float]]:
    """This epoch's batches from batch ``start`` to ``end``: (batches done after this one, batch, seconds waited).

    Nothing is read past ``end``, not even the read that would find the loader exhausted: a
    sampler may draw more when asked past its last index (``RandomSampler`` does), and a run
    stopped after an epoch's last batch must leave its generators as the run that went on did.

    Our own sampler starts part-way by itself. A DataLoader given as is gets replayed: its
    order is drawn again from the states the epoch began with (``order``, from
    ``epoch_order``), then the batches already trained on are read and dropped. Reading them
    (rather than only drawing their indices) also replays the random draws of the dataset
    and of non-persistent workers, which reading alone reproduces; the process's own random
    state is then put back as it was.
    """
    if sampler is not None:  # GlobalBatches too: batch_size is G/W, and a run stops before an epoch's short update
        sampler.set_epoch(epoch, start=start * (loader.batch_size or 1))
        batches = iter(loader)
    elif not isinstance(loader, DataLoader):  # for the type checker: only ct.run's own has a sampler
        raise TypeError(f"epoch_batches: a {type(loader).__name__} needs its sampler")
    elif start and order is not None:
        _start_workers(loader)
        now = capture_rng()
        restore_rng(order["rng"])
        set_generator_states(loader, order["generators"])
        if order["sampler_seed"] is not None:
            loader.sampler.seed = order["sampler_seed"]  # type: ignore[attr-defined]
        _set_epoch(loader, epoch)
        batches = iter(loader)
        for _ in range(start):
            next(batches)
        restore_rng(now)
    else:
        _set_epoch(loader, epoch)
        batches = iter(loader)
    for position, (batch, waited) in enumerate(device_batches(batches, device, end - start), start + 1):
        yield position, batch, waited


def _set_epoch(loader: DataLoader[Any], epoch: int) -> None:
    """The epoch for a given DataLoader's sampler and, over a ct.cache store, for its dataset: the epoch seeds
    the store's augmentation (its workers see it when they start; persistent ones keep their first epoch's)."""
    if hasattr(loader.sampler, "set_epoch"):
        loader.sampler.set_epoch(epoch)
    if (mapped_data := as_mapped(loader.dataset)) is not None:
        mapped_data.set_epoch(epoch)
    for store in augmented_inside(loader.dataset):  # in a Subset or ConcatDataset, which pass no epoch on
        store.set_epoch(epoch)
