"""What sharding a TrainState must cope with (2 gloo ranks against a plain loop): 0-dim parameters, an
optimizer whose __init__ creates state, a failure half-way, a parameter outside the optimizer, and an
optimizer whose parameters are not in model order across a resume."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import CLASSES, IN, classify_acc, full, global_batch, outcome, shard, sharded_state
from torch import nn

import composetrain as ct


def assert_close_to(mine, reference):
    assert mine["params"].keys() == reference["params"].keys()
    for name, p in reference["params"].items():
        torch.testing.assert_close(mine["params"][name], p, rtol=1e-10, atol=1e-12, msg=name)
    assert mine["optimizer"].keys() == reference["optimizer"].keys()
    for key, entries in reference["optimizer"].items():
        assert mine["optimizer"][key].keys() == entries.keys()
        for what, v in entries.items():
            torch.testing.assert_close(mine["optimizer"][key][what], v, rtol=1e-10, atol=1e-12, msg=f"{key} {what}")


def assert_same(a, b):
    assert a["params"].keys() == b["params"].keys() and a["optimizer"].keys() == b["optimizer"].keys()
    for name, p in a["params"].items():
        assert torch.equal(p, b["params"][name]), name
    for key, entries in a["optimizer"].items():
        assert entries.keys() == b["optimizer"][key].keys()
        for what, v in entries.items():
            assert torch.equal(v, b["optimizer"][key][what]), (key, what)


@pytest.mark.parametrize("optimizer", ["adamw", "adagrad"])
def test_zero_dim_parameters_and_adagrad_give_the_plain_update(pool, optimizer):
    """CLIP's 0-dim logit_scale (and 0-dim gates inside the units) stay whole, replicated, with their
    gradients averaged over the ranks (one that only some ranks' batches use, too); Adagrad's state made in
    __init__ is made again for the shards.
    float64, clipping, accumulate(2), ranks starting from different weights: the plain loop's update."""
    reference = plain_loop(optimizer, 2)
    results = pool.run(__name__, "scalar_parameters", optimizer)
    for r in results:
        assert_close_to(r, reference)
        assert_same(r, results[0])  # every rank holds the same whole parameters
        scalars = {n for n, p in reference["params"].items() if p.dim() == 0}
        assert scalars == {"logit_scale", "rare", "blocks.0.gate", "blocks.1.gate"}
        assert {n: k for n, k in r["kinds"].items() if n in scalars} == dict.fromkeys(scalars, "Parameter")
        assert {k for n, k in r["kinds"].items() if n not in scalars} == {"DTensor"}


def test_a_failure_half_way_leaves_a_state_that_says_so(pool):
    found = pool.run(__name__, "half_sharded")
    assert found[0] == found[1]
    found = found[0]
    assert found["first"].startswith(
        "RuntimeError: sharded(classify_acc): fully_shard failed on the root module after 2 unit(s) were sharded "
        "(RuntimeError: injected failure at the root); the TrainState's model is half-sharded"
    ), found["first"]
    for use in ("retry", "distributed", "plain", "apply_sharding"):  # the same sentence, not torch's puzzle
        assert "the TrainState's model is half-sharded" in found[use], (use, found[use])
        assert "build a fresh model, optimizer and TrainState" in found[use], (use, found[use])


def test_a_parameter_outside_the_optimizer_unfrozen_later_has_its_gradient_cleared(pool):
    for left in pool.run(__name__, "unfrozen_outside_the_optimizer"):
        assert left == [[], [], []]


def test_resume_and_load_are_bit_exact_with_the_optimizer_in_another_order(pool, tmp_path):
    """AdamW with a no-decay group of biases first: ct.run stopped and resumed equals the straight run, and
    load_checkpoint after apply_sharding equals the state that saved the checkpoint, bit for bit."""
    results = pool.run(__name__, "resume_in_optimizer_order", str(tmp_path))
    for r in results:
        assert r["steps"] == [4, 4, 2]
        assert_same(r["resumed"], r["straight"])
        assert_same(r["loaded"], r["at_two"])
        assert not all(torch.equal(p, r["at_two"]["params"][n]) for n, p in r["straight"]["params"].items())


def test_full_state_dict_without_its_group_points_at_load_checkpoint(pool):
    for r in pool.run(__name__, "gathered_after_the_group_is_gone"):
        assert r["alive"] in ("True", "1")  # rank 0 gets the whole state dict, the others an empty one
        assert r["kinds"] == "['DTensor']"
        assert r["gone"].startswith("RuntimeError: full_state_dict: the model is sharded over a process group "), r
        assert "ct.load_checkpoint(" in r["gone"], r


def test_adagrad_state_made_by_training_is_refused_before_sharding(pool):
    for r in pool.run(__name__, "trained_adagrad"):
        assert r["error"].startswith(
            "ValueError: sharded(classify_acc): the optimizer already holds state (momentum, moments) for 12 unsharded "
            "parameter(s); sharding replaces the parameters"
        ), r
        assert "(the state an optimizer's __init__ makes, such as Adagrad's, is fine" in r["error"]
        assert r["untouched"] == "True"


def test_fp16_loss_scaling_with_zero_dim_parameters_is_refused_with_the_fix(pool):
    for said in pool.run(__name__, "fp16_with_scalars"):
        assert said.startswith(
            "ValueError: sharded(mixed_precision(dtype='fp16')(classify_acc)): fp16 loss scaling with the 0-dim "
            "parameters ['blocks.0.gate', 'blocks.1.gate', 'logit_scale', 'rare']"
        ), said
        assert "use mixed_precision(dtype='bf16')" in said, said


def test_bf16_with_zero_dim_parameters_tracks_one_process(pool):
    reference = bf16_with_scalars(None, 2)
    results = pool.run(__name__, "bf16_with_scalars")
    for r in results:
        assert all(torch.equal(r[n], results[0][n]) for n in r)
        for n, p in reference.items():
            torch.testing.assert_close(r[n], p, rtol=2e-2, atol=2e-3, msg=n)


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# Cases for the sharded fixes of issues 19 and 20; each returns what the test compares with a plain single-process
# loop on the global batch.


class Gated(nn.Module):
    """A block with a 0-dim parameter of its own (inside a sharding unit)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.gate = nn.Parameter(torch.tensor(0.3))

    def forward(self, x):
        return x + self.gate * self.lin(x).tanh()


class ClipLike(nn.Module):
    """CLIP's shape of the problem: a 0-dim ``logit_scale`` on the root, besides 0-dim gates in the blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(IN, 8)
        self.blocks = nn.ModuleList(Gated() for _ in range(2))
        self.head = nn.Linear(8, CLASSES)
        self.logit_scale = nn.Parameter(torch.tensor(0.5))
        self.rare = nn.Parameter(torch.tensor(0.2))  # used only by batches holding a rare sample

    def forward(self, x):
        rare = x[:, :1] > 1.5  # in these batches, on one rank at each update: its gradient None on the other
        x = self.inp(x).tanh()
        for block in self.blocks:
            x = block(x)
        logits = self.head(x) * self.logit_scale.exp()
        # on one class's logit: a constant added to every logit has no gradient under cross-entropy
        one_class = torch.zeros_like(logits)
        one_class[:, 0] = 1
        return logits + self.rare * rare.to(logits.dtype) * one_class if rare.any() else logits


SIZES = [[6, 6], [4, 4]]  # two updates, each rank's batch of the global one


def batches(rank: int | None, world: int) -> list[Any]:
    out = []
    for i, sizes in enumerate(SIZES):
        batch = global_batch("classify", sizes[:1] * world, 40 + i, torch.float64)
        out.append(batch if rank is None else shard(batch, sizes[:1] * world, rank))
    return out


def clip_like(seed: int) -> ClipLike:
    torch.manual_seed(seed)
    model = ClipLike().double()
    with torch.no_grad():  # 0-dim parameters that differ by seed too: rank 0's must win
        for p in model.parameters():
            if p.dim() == 0:
                p.add_(0.1 * seed)
    return model


def record(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {
        "params": {n: full(p) for n, p in model.named_parameters()},
        "kinds": {n: type(p).__name__ for n, p in model.named_parameters()},
        "optimizer": {
            k: {name: full(v) for name, v in entries.items()} for k, entries in optimizer.state_dict()["state"].items()
        },
    }


def plain_loop(kind: str, world: int) -> dict[str, Any]:
    """The reference, written out: one process, the global batches, forward, backward, clip, step."""
    model = clip_like(0)
    optimizer = make_optimizer(kind, model)
    for x, y in batches(None, world):
        x1, y1, x2, y2 = x[: len(x) // 2], y[: len(y) // 2], x[len(x) // 2 :], y[len(y) // 2 :]
        for xs, ys in ((x1, y1), (x2, y2)):  # accumulate(2) splits the global batch in halves
            (F.cross_entropy(model(xs), ys) * (len(xs) / len(x))).backward()
        torch.nn.utils.clip_grad_norm_(list(model.parameters()), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return record(model, optimizer)


def make_optimizer(kind: str, model: nn.Module) -> torch.optim.Optimizer:
    if kind == "adagrad":  # Adagrad creates its state (sum, step) in __init__
        return torch.optim.Adagrad(model.parameters(), lr=0.05, initial_accumulator_value=0.1)
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)


def scalar_parameters(rank: int, world: int, kind: str) -> dict[str, Any]:
    """sharded(clip_grad_norm(accumulate(2))) on a model with 0-dim parameters, from rank-specific weights."""
    model = clip_like(rank)  # rank 0's weights must win, as under DDP
    state = ct.TrainState(model, make_optimizer(kind, model))
    step = ct.sharded(ct.clip_grad_norm(0.5)(ct.accumulate(2)(classify_acc)))
    for batch in batches(rank, world):
        step(state, batch)
    return record(state.model, state.optimizer)


def half_sharded(rank: int, world: int) -> dict[str, str]:
    """fully_shard failing on the root after the units were sharded (injected): what every later use says."""
    import torch.distributed.fsdp as fsdp

    batch = batches(rank, world)[0]
    state = sharded_state("classify", 0, torch.float64)  # blocks (units), then the root
    real = fsdp.fully_shard

    def failing_at_root(module, **kwargs):
        if module is state.model:
            raise RuntimeError("injected failure at the root")
        return real(module, **kwargs)

    fsdp.fully_shard = failing_at_root
    try:
        found = {"first": outcome(lambda: ct.sharded(classify_acc)(state, batch))}
    finally:
        fsdp.fully_shard = real
    found["retry"] = outcome(lambda: ct.sharded(classify_acc)(state, batch))
    found["distributed"] = outcome(lambda: ct.distributed(classify_acc)(state, batch))
    found["plain"] = outcome(lambda: ct.train_step(classify_acc)(state, batch))
    found["apply_sharding"] = outcome(lambda: ct.apply_sharding(ct.sharded(classify_acc), state))
    return found


def unfrozen_outside_the_optimizer(rank: int, world: int) -> list[list[str]]:
    """A parameter frozen when the optimizer was built, unfrozen after: its .grad is cleared after each update
    like every other one (the names of parameters still holding a gradient after each of 3 updates)."""
    model = sharded_state("classify", 0, torch.float64).model
    frozen = model.head.weight
    frozen.requires_grad_(False)
    state = ct.TrainState(model, torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1))
    step = ct.sharded(classify_acc)
    left = []
    for i in range(3):
        if i == 1:
            state.model.head.weight.requires_grad_(True)
        step(state, batches(rank, world)[i % 2])
        left.append([n for n, p in state.model.named_parameters() if p.grad is not None])
    return left


def no_decay_first(model: nn.Module) -> torch.optim.Optimizer:
    """The common setup: biases (no weight decay) in a group before the weights, not model order."""
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    weights = [p for n, p in model.named_parameters() if not n.endswith("bias")]
    groups = [{"params": biases, "weight_decay": 0.0}, {"params": weights, "weight_decay": 0.1}]
    return torch.optim.AdamW(groups, lr=1e-2)


def order_state() -> ct.TrainState:
    torch.manual_seed(3)
    model = nn.Sequential(
        nn.Linear(IN, 8),
        nn.Tanh(),
        nn.Linear(8, 8),
        nn.Tanh(),
        nn.Linear(8, 8),
        nn.Tanh(),
        nn.Linear(8, CLASSES),
    ).double()
    return ct.TrainState(model, no_decay_first(model))


def order_data(world: int) -> torch.utils.data.TensorDataset:
    x, y = global_batch("classify", [24 * world], 9, torch.float64)
    return torch.utils.data.TensorDataset(x, y)


ORDER_STEP = ct.sharded(ct.accumulate(2)(classify_acc), modules=nn.Linear)


def resume_in_optimizer_order(rank: int, world: int, folder: str) -> dict[str, Any]:
    """ct.run stopped after 2 updates and resumed to 4, against 4 straight; and load_checkpoint of the
    2-update checkpoint after apply_sharding, against the state that saved it."""
    options = {"batch_size": 6, "num_workers": 0, "progress": False, "seed": 1, "log_every": 1}
    straight = order_state()
    ct.run(ORDER_STEP, straight, order_data(world), max_steps=4, checkpoint_dir=f"{folder}/a", **options)
    cut = order_state()
    ct.run(ORDER_STEP, cut, order_data(world), max_steps=2, checkpoint_dir=f"{folder}/b", **options)
    at_two = record(cut.model, cut.optimizer)
    saved = sorted(Path(folder, "b").glob("step-*"))[-1]
    resumed = order_state()
    ct.run(ORDER_STEP, resumed, order_data(world), max_steps=4, checkpoint_dir=f"{folder}/b", **options)
    loaded = order_state()
    ct.apply_sharding(ORDER_STEP, loaded)
    ct.load_checkpoint(loaded, saved)
    dist.barrier()
    return {
        "straight": record(straight.model, straight.optimizer),
        "resumed": record(resumed.model, resumed.optimizer),
        "at_two": at_two,
        "loaded": record(loaded.model, loaded.optimizer),
        "steps": [straight.step, resumed.step, loaded.step],
    }


def gathered_after_the_group_is_gone(rank: int, world: int) -> dict[str, str]:
    """full_state_dict of a sharded model whose group was destroyed since (as ct.run used to): what it says.
    The pool's group is then made again."""
    from processes import free_port

    state = sharded_state("classify", 0, torch.float64)
    ct.sharded(classify_acc)(state, batches(rank, world)[0])
    found = {"alive": str(sorted(ct.full_state_dict(state.model)) == sorted(state.model.state_dict()) or rank)}
    found["kinds"] = str(sorted({type(p).__name__ for p in state.model.parameters()}))
    state.release_runtime()
    port = torch.tensor(free_port() if rank == 0 else 0)
    dist.broadcast(port, src=0)
    dist.destroy_process_group()
    try:
        ct.full_state_dict(state.model)
        found["gone"] = "no error"
    except Exception as e:
        found["gone"] = f"{type(e).__name__}: {e}"
    finally:
        store = dist.TCPStore("127.0.0.1", int(port), world, is_master=rank == 0, wait_for_workers=True)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    return found


def trained_adagrad(rank: int, world: int) -> dict[str, str]:
    """Adagrad after one plain update (its sums no longer the initial ones): refused, the state untouched."""
    model = clip_like(0)
    state = ct.TrainState(model, make_optimizer("adagrad", model))
    ct.train_step(classify_acc)(state, batches(rank, world)[0])
    try:
        ct.sharded(classify_acc)(state, batches(rank, world)[1])
        found = {"error": "no error"}
    except Exception as e:
        found = {"error": f"{type(e).__name__}: {e}"}
    found["untouched"] = str(not any(type(p).__name__ == "DTensor" for p in state.model.parameters()))
    return found


def fp16_with_scalars(rank: int, world: int) -> str:
    """fp16 loss scaling with 0-dim parameters beside DTensors, which GradScaler cannot unscale: what it says."""
    model = clip_like(0).float()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batches(rank, world)[0]
    try:
        ct.sharded(ct.mixed_precision(dtype="fp16")(classify_acc))(state, (x.float(), y))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def bf16_with_scalars(rank: int | None, world: int) -> dict[str, Any]:
    """sharded(mixed_precision(bf16)(clip(accumulate(2)))) with 0-dim parameters; rank None: one process."""
    model = clip_like(rank or 0).float()
    state = ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
    inner = ct.mixed_precision(dtype="bf16")(ct.clip_grad_norm(0.5)(ct.accumulate(2)(classify_acc)))
    step = inner if rank is None else ct.sharded(inner)
    for x, y in batches(rank, world):
        step(state, (x.float(), y))
    return {n: full(p) for n, p in state.model.named_parameters()}


# -- parameters FSDP2 leaves whole or cannot take ---------------------------------------------------------------------


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
