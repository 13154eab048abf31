"""Ranks of a processes.Pool for tests/test_stragglers.py and tests/test_skip_spikes.py (3 gloo ranks): one rank
slowed in its data, then another in its step; a loss spike on one rank only, against a hand-written rank-agreed skip.

A module of its own, not folded into its test files, because the spawned ranks of ``processes.Pool`` import it by name.
"""

import copy
import math
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import Dataset
from torch.utils.flop_counter import FlopCounterMode

import composetrain as ct
from composetrain.transforms.spikes import SpikeStatistics

# -- stragglers ---------------------------------------------------------------------------------------------------

SLOW = 0.06  # seconds a slowed rank sleeps per update: far above the step's own few milliseconds


class Slowed(Dataset):
    """Regression samples; on rank ``slow_rank`` reading batch k (1-based) sleeps when k is in ``slow``."""

    def __init__(self, n, rank, slow_rank, slow):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 6, generator=g)
        self.y = self.x.sum(-1)
        self.rank, self.slow_rank, self.slow = rank, slow_rank, slow
        self.reads = 0

    def __len__(self):
        return len(self.x)

    def __getitems__(self, indices):
        self.reads += 1
        if self.rank == self.slow_rank and self.reads in self.slow:
            time.sleep(SLOW)
        return [(self.x[i], self.y[i]) for i in indices]

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def straggling(rank, world):
    """24 updates in windows of 4: rank 1 slow to read updates 5-12, rank 2 slow in its step in updates 13-20."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1))
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01))
    done = [0]

    def step(m, batch):
        done[0] += 1
        if rank == 2 and 13 <= done[0] <= 20:
            time.sleep(SLOW)
        x, y = batch
        return F.mse_loss(m(x).squeeze(-1), y)

    data = Slowed(24 * 4 * world, rank, 1, set(range(5, 13)))
    with FlopCounterMode(display=False) as counter:  # what this rank's update counts, on a copy
        step(copy.deepcopy(model), (data.x[:4], data.y[:4])).backward()
    done[0] = 0
    result = ct.run(
        ct.distributed(step),
        state,
        data,
        batch_size=4,
        epochs=1,
        log_every=4,
        num_workers=0,
        progress=False,
        shuffle=False,
        peak_flops=1e9,
    )
    return {
        "history": result.history,
        "bottleneck": result.bottleneck,
        "waited": ct.distributed(step).waited(state),
        "flops": counter.get_total_flops(),
    }


# -- a spike on one rank ------------------------------------------------------------------------------------------


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)).double()


def _state():
    m = _model()
    return ct.TrainState(m, torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))


def _step(m, batch):
    x, y = batch
    return F.mse_loss(m(x).squeeze(-1), y)


def _batches(rank, n=24, spike=(), spike_rank=1):
    """This rank's ``n`` batches; on ``spike_rank`` those at ``spike`` have targets 1000 times larger."""
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for i in range(n):
        x = torch.randn(6, 4, generator=g, dtype=torch.float64)
        y = x.sum(-1) + 0.1 * torch.randn(6, generator=g, dtype=torch.float64)
        out.append((x, y * 1000 if rank == spike_rank and i in spike else y))
    return out


SPIKES = {13, 19}  # on rank 1 only: a spike of its own loss lifts the global mean loss far above its average


def spike_on_one_rank(rank, world, order):
    """The guard inside (or outside) distributed: which updates each rank skipped, and its parameters."""
    state = _state()
    guard = ct.skip_spikes(warmup=5, sigmas=4.0)
    train = ct.distributed(guard(_step)) if order == "inside" else guard(ct.distributed(_step))
    skipped = [bool(train(state, b).skipped) for b in _batches(rank, spike=SPIKES)]
    state.release_runtime()
    return {"skipped": skipped, "params": [p.detach().clone() for p in state.model.parameters()]}


def hand_agreed_loop(rank, world):
    """The same by hand: DDP, each rank's loss gathered and averaged, the guard's rule written out again."""
    model = _model()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    n, mean, var, skipped = 0, 0.0, 0.0, []
    for batch in _batches(rank, spike=SPIKES):
        loss = _step(ddp, batch)
        loss.backward()
        every = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(every, loss.detach().reshape(1))
        value = sum(t.item() for t in every) / world
        skip = not math.isfinite(value)
        if not skip and n >= 5:
            skip = value > mean + 4.0 * math.sqrt(var / (1 - 0.99 ** (n - 1)))
        if not skip:
            if n == 0:
                mean = value
            else:
                d = value - mean
                mean += 0.01 * d
                var = 0.99 * (var + 0.01 * d * d)
            n += 1
            opt.step()
        opt.zero_grad(set_to_none=True)
        skipped.append(skip)
    del ddp
    return {"skipped": skipped, "params": [p.detach().clone() for p in model.parameters()]}


def local_decision_loop(rank, world):
    """What pitfall 46 warns of: each rank judging its own loss (rank 1 alone skips; the models part)."""
    model = _model()
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    skipped = []
    for i, batch in enumerate(_batches(rank, spike=SPIKES)):
        loss = _step(ddp, batch)
        loss.backward()
        skip = i in SPIKES and rank == 1  # each rank's own view of the spike
        if not skip:
            opt.step()
        opt.zero_grad(set_to_none=True)
        skipped.append(skip)
    del ddp
    return {"skipped": skipped, "params": [p.detach().clone() for p in model.parameters()]}


def resumed_run(rank, world, folder, stop, guarded=True):
    """ct.run over this rank's batches with the guard: straight (stop None), or stopped after ``stop`` updates and
    resumed from its checkpoint by a second call."""
    dataset = _dataset(world)
    options = {"batch_size": 6, "shuffle": False, "num_workers": 0, "progress": False, "log_every": 4}
    train = ct.distributed(ct.skip_spikes(warmup=5, sigmas=4.0)(_step) if guarded else _step)
    state = _state()
    if stop is not None:
        ct.run(train, state, dataset, max_steps=stop, checkpoint_dir=folder, **options)
        state = _state()
    result = ct.run(train, state, dataset, epochs=1, checkpoint_dir=folder, **options)
    stats = state.transform_state("skip_spikes", SpikeStatistics).state_dict() if guarded else None
    state.release_runtime()
    return {
        "history": [(r["step"], r["skipped"]) for r in result.history],
        "params": [p.detach().clone() for p in state.model.parameters()],
        "statistics": stats,
    }


def differing_guards(rank, world):
    """Rank 2 builds the guard with other settings: every rank refuses, naming them, before the first update."""
    sigmas = 3.0 if rank == 2 else 6.0
    state = _state()
    try:
        ct.run(
            ct.distributed(ct.skip_spikes(sigmas=sigmas)(_step)),
            state,
            _dataset(world),
            batch_size=6,
            max_steps=2,
            num_workers=0,
            progress=False,
        )
    except ValueError as e:
        return str(e), state.step
    return None, state.step


def _dataset(world):
    """Every rank's batches in one dataset, as DistributedSampler (shuffle=False) deals them: rank r gets r, r + 3..."""
    from torch.utils.data import TensorDataset

    x, y = torch.empty(world * 24 * 6, 4, dtype=torch.float64), torch.empty(world * 24 * 6, dtype=torch.float64)
    for r in range(world):
        data = _batches(r, spike=SPIKES)
        x[r::world], y[r::world] = torch.cat([b[0] for b in data]), torch.cat([b[1] for b in data])
    return TensorDataset(x, y)
