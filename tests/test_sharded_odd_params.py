"""ct.sharded with parameters FSDP2 leaves whole or cannot take, against one process on the global batch."""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import nn

import composetrain as ct


def test_a_complex_0_dim_parameter_is_averaged_whole(pool):
    """Its gradient was averaged through float64: the imaginary part was dropped, silently."""
    for r in pool.run(__name__, "complex_scalar_trains_as_one_process"):
        assert r["sharded"]["z"].dtype == torch.complex128
        for name, p in r["plain"].items():
            torch.testing.assert_close(r["sharded"][name], p, rtol=1e-12, atol=1e-14, msg=name)


def test_a_non_contiguous_parameter_is_refused_before_anything_is_sharded(pool):
    """FSDP2 refused it only when it reached its unit: the units before it were sharded (the state left
    unusable for good) and every rank's weights already replaced by rank 0's."""
    for r in pool.run(__name__, "non_contiguous_parameter"):
        assert r["error"].startswith("ValueError: sharded(_loss): parameters ['blocks.0.weight']"), r
        assert "contiguous" in r["error"] and ".contiguous()" in r["error"], r
        assert r == {**r, "sharded_units": 0, "values_kept": True, "unusable": None}


def test_ranks_that_would_shard_different_things_all_raise_before_sharding(pool):
    results = pool.run(__name__, "ranks_that_disagree")
    for r in results:
        assert not any(v for k, v in r.items() if k.endswith(" sharded")), r
        assert (
            r["modules"].startswith("ValueError: sharded(modules=[")
            and "the ranks disagree on what to shard: " in r["modules"]
        ), r
        assert "rank 0 would shard the units ['blocks.1'], rank 1 ['blocks.0']" in r["modules"], r
        assert (
            "parameters differ: rank 0 only [], rank 1 only [\"('temperature', (), 'torch.float64')\"]"
            in r["parameters"]
        ), r
    assert "modules names ['nope'], which the model does not have" in results[1]["one refuses"]
    assert "the ranks disagree on what to shard: rank 1 refused its model (ValueError" in results[0]["one refuses"]
    assert "the predicate <lambda> raised KeyError('boom') on submodule" in results[1]["one predicate raises"]
    assert "rank 1 refused its model (RuntimeError" in results[0]["one predicate raises"]


def test_0_dim_parameters_without_gradients_on_some_or_every_rank(pool):
    for r in pool.run(__name__, "scalars_without_gradients_train_as_one_process"):
        assert torch.equal(r["sharded"]["unused"], torch.tensor(0.8, dtype=torch.float64))  # never decayed
        for name, p in r["plain"].items():
            torch.testing.assert_close(r["sharded"][name], p, rtol=1e-12, atol=1e-14, msg=name)


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# Parameters FSDP2 leaves whole or cannot take, each against one process on the global batch (float64 / complex128).


class Phase(nn.Module):
    """A complex 0-dim parameter (a learned phase or gain), kept whole beside a sharded Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)
        self.z = nn.Parameter(torch.tensor(0.5 + 0.3j, dtype=torch.complex128))
        self.k = nn.Parameter(torch.tensor(0.7, dtype=torch.float64))  # a real one beside it

    def forward(self, x):
        return (self.lin(x).to(torch.complex128) * self.z).abs() * self.k


def _batch(i: int, size: int = 8) -> torch.Tensor:
    return torch.randn(size, 3, generator=torch.Generator().manual_seed(i), dtype=torch.float64)


def _loss(model, x):
    return model(x).pow(2).mean()


def complex_scalar_trains_as_one_process(rank: int, world: int) -> dict[str, Any]:
    """Three SGD updates sharded (B/W each) and in one process (B): the parameters, whole."""
    out = {}
    for name, train in (("sharded", ct.sharded(ct.train_step(_loss))), ("plain", ct.train_step(_loss))):
        torch.manual_seed(0 + (rank if name == "sharded" else 0))  # rank 0's initial weights are broadcast
        model = Phase()
        state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.5))
        for i in range(3):
            x = _batch(i)
            n = x.shape[0] // world
            with warnings.catch_warnings():
                warnings.simplefilter("error", UserWarning)  # no "casting complex values to real" either
                train(state, x[rank * n : (rank + 1) * n] if name == "sharded" else x)
        out[name] = {
            k: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for k, p in state.model.named_parameters()
        }
    return out


class Transposed(nn.Module):
    """Two units; the first (sharded last) holds a transposed (non-contiguous) weight, which FSDP2 cannot shard."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(3, 3, dtype=torch.float64), nn.Linear(3, 3, dtype=torch.float64)])
        self.blocks[0].weight = nn.Parameter(torch.randn(3, 3, dtype=torch.float64).t())

    def forward(self, x):
        return self.blocks[1](self.blocks[0](x).tanh())


def non_contiguous_parameter(rank: int, world: int) -> dict[str, Any]:
    """The error, and whether anything changed before it: sharded units, this rank's values, the state."""
    from torch.distributed.fsdp import FSDPModule

    torch.manual_seed(rank)  # ranks differ: a broadcast before the error would show
    model = Transposed()
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    try:
        ct.sharded(ct.train_step(_loss))(state, _batch(0, 4))
        error = "none"
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
    return {
        "error": error,
        "sharded_units": sum(isinstance(m, FSDPModule) for m in model.modules()),
        "values_kept": all(
            not hasattr(p, "full_tensor") and torch.equal(before[k], p) for k, p in model.named_parameters()
        ),
        "unusable": state.unusable,
    }


class Scaled(nn.Module):
    def __init__(self, extra: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(3, 3, dtype=torch.float64), nn.Linear(3, 3, dtype=torch.float64)])
        if extra:
            self.temperature = nn.Parameter(torch.tensor(1.0, dtype=torch.float64))

    def forward(self, x):
        return self.blocks[1](self.blocks[0](x).tanh())


def ranks_that_disagree(rank: int, world: int) -> dict[str, Any]:
    """Ranks that would shard different things: each case's error on this rank, and whether the model
    was left unsharded. They crashed the job (gloo abort), or refused on one rank while the others waited."""
    from torch.distributed.fsdp import FSDPModule

    last = rank == world - 1
    cases = {
        "modules": (Scaled(False), ["blocks.0"] if last else ["blocks.1"]),
        "parameters": (Scaled(extra=last), None),
        "one refuses": (Scaled(False), ["nope"] if last else None),
        "one predicate raises": (
            Scaled(False),
            (lambda m: {}["boom"]) if last else (lambda m: isinstance(m, nn.Linear)),
        ),
    }
    found = {}
    for name, (model, modules) in cases.items():
        state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
        try:
            ct.sharded(ct.train_step(_loss), modules=modules)(state, _batch(0, 4))
            found[name] = "none"
        except Exception as e:
            found[name] = f"{type(e).__name__}: {e}"
        found[name + " sharded"] = any(isinstance(m, FSDPModule) for m in model.modules())
    return found


class Sometimes(nn.Module):
    """A 0-dim parameter never used (its gradient None on every rank: AdamW must skip it, no weight decay)
    and one used only by batches holding a positive first feature (None on the ranks whose share has none)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 3, dtype=torch.float64)
        self.unused = nn.Parameter(torch.tensor(0.8, dtype=torch.float64))
        self.sometimes = nn.Parameter(torch.tensor(0.6, dtype=torch.float64))

    def forward(self, x):
        out = self.lin(x)
        mask = (x[:, :1] > 0).to(x.dtype)
        return out + self.sometimes * mask if mask.any() else out


def scalars_without_gradients_train_as_one_process(rank: int, world: int) -> dict[str, Any]:
    """AdamW with weight decay, 3 updates; rank 0's shares hold positive first features, the others' none."""
    out = {}
    x = torch.randn(3, 8, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64).abs()
    x[:, 4:, 0] *= -1  # the second half of each global batch: no positive first feature
    for name, train in (("sharded", ct.sharded(ct.train_step(_loss))), ("plain", ct.train_step(_loss))):
        torch.manual_seed(0 + (rank if name == "sharded" else 0))
        model = Sometimes()
        state = ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.5))
        for i in range(3):
            n = x.shape[1] // world
            train(state, x[i, rank * n : (rank + 1) * n] if name == "sharded" else x[i])
        out[name] = {
            k: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for k, p in state.model.named_parameters()
        }
    return out
