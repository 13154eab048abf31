"""sharded() (FSDP2) across real gloo processes, against one process on the global batch."""

from __future__ import annotations

import itertools
import math
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers import (
    assert_states_equal,
    classify,
    classify_acc,
    composed,
    full,
    global_batch,
    make_batch,
    make_state,
    optimizer_state,
    outcome,
    shard,
    sharded_net,
    sharded_state,
    train_sharded,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import composetrain as ct


def run(pool, **case):
    case.setdefault("seed", 0)
    return pool.run(__name__, "run_case", case), train_sharded(case, rank=None)


def assert_matches_reference(results, reference, rtol=1e-10, atol=1e-12):
    for r in results:  # every rank holds the same full parameters: rank 0's initial ones, trained alike
        assert r["kinds"] == ["DTensor"], "the model was not sharded"
        for name, p in r["params"].items():
            assert torch.equal(p, results[0]["params"][name])
        assert r["step"] == reference["step"] and r["lr"] == reference["lr"]
    for name, p in reference["params"].items():
        torch.testing.assert_close(results[0]["params"][name], p, rtol=rtol, atol=atol, msg=name)
    for key, entries in reference["optimizer"].items():
        for name, v in entries.items():
            torch.testing.assert_close(results[0]["optimizer"][key][name], v, rtol=rtol, atol=atol)
    for i, ref_loss in enumerate(reference["losses"]):  # out.loss averaged over ranks is the global mean
        torch.testing.assert_close(
            torch.stack([r["losses"][i] for r in results]).mean(), ref_loss, rtol=rtol, atol=atol
        )
    if "grad_norm" in reference["metrics"][0]:
        for r in results:
            for mine, ref in zip(r["metrics"], reference["metrics"], strict=True):
                torch.testing.assert_close(mine["grad_norm"], ref["grad_norm"], rtol=rtol, atol=atol)


@settings(max_examples=10, deadline=None)
@given(
    data=st.data(),
    composition=st.sampled_from(
        [
            "sharded(accumulate(n)(step))",
            "accumulate(n)(sharded(step))",
            "sharded(sync_every_micro_batch=True)(accumulate(n)(step))",
            "accumulate(n)(sharded(sync_every_micro_batch=True)(step))",
            "sharded(clip_grad_norm(0.5)(accumulate(n)(step)))",
            "accumulate(n)(clip_grad_norm(0.5)(sharded(step)))",
            "clip_grad_norm(0.5)(sharded(accumulate(n)(step)))",
            "sharded(step)",
        ]
    ),
    n=st.integers(1, 4),
    optimizer=st.sampled_from(["sgd", "adamw"]),
    seed=st.integers(0, 999),
)
def test_sharded_is_one_process_on_the_global_batch(pool, data, composition, n, optimizer, seed):
    """float64, a scheduler, 3 updates, batches of any size (also fewer samples than n); accumulate in
    both orders, gradients reduced once per update or every micro-batch, clipping."""
    sizes = [[size, size] for size in data.draw(st.lists(st.integers(1, 9), min_size=3, max_size=3))]
    case = {
        "composition": composition,
        "n": n,
        "kind": "classify",
        "sizes": sizes,
        "seed": seed,
        "optimizer": optimizer,
    }
    assert_matches_reference(*run(pool, **case))


@pytest.mark.parametrize(
    "composition",
    [
        "sharded(accumulate(n)(step))",
        "accumulate(n)(sharded(step))",
        "sharded(sync_every_micro_batch=True)(accumulate(n)(step))",
    ],
)
def test_token_weights_are_normalised_over_every_rank(pool, composition):
    """Odd ranks hold sequences up to 9 tokens long, even ranks up to 3: the loss is the mean over
    every real token of the global batch, not a mean of per-rank means."""
    assert_matches_reference(*run(pool, composition=composition, n=2, kind="tokens", sizes=[[4, 4]] * 3, seed=7))


def test_bf16_runs_the_forward_in_bf16_and_keeps_sharded_fp32_weights_and_gradients(pool):
    for seen in pool.run(__name__, "dtypes_under_bf16"):
        assert seen == {
            "output": "torch.bfloat16",
            "params": ["torch.float32"],
            "grads": ["torch.float32"],
            "grad_kinds": ["DTensor"],
        }


def test_bf16_in_either_order_agrees_and_tracks_one_process(pool):
    runs = {
        c: run(pool, composition=c, n=2, kind="classify", sizes=[[6, 6]] * 3)
        for c in (
            "sharded(mixed_precision(dtype='bf16')(accumulate(n)(step)))",
            "mixed_precision(dtype='bf16')(sharded(accumulate(n)(step)))",
            "accumulate(n)(sharded(mixed_precision(dtype='bf16')(step)))",
        )
    }
    first = runs["sharded(mixed_precision(dtype='bf16')(accumulate(n)(step)))"][0][0]["params"]
    for results, _ in runs.values():
        for r in results:
            assert all(torch.equal(r["params"][k], first[k]) for k in first)
    for k, p in runs["sharded(mixed_precision(dtype='bf16')(accumulate(n)(step)))"][1]["params"].items():
        torch.testing.assert_close(first[k], p, rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_a_gradient_not_finite_on_one_rank_only_skips_the_update_on_every_rank(pool, dtype):
    """Each rank sees its own shard of the gradients: the skip decision must be the same on every rank
    (DTensor's unscale_ reduces GradScaler's found_inf flag over the mesh; this guards that it still does)."""
    assert pool.run(__name__, "found_inf_on_one_rank", dtype) == [{"skipped": True, "unchanged": True, "step": 1}] * 2


@pytest.mark.parametrize(
    ("composition", "optimizer"),
    [
        ("sharded(mixed_precision(dtype='fp16')(accumulate(2)(step)))", "sgd"),
        ("mixed_precision(dtype='fp16')(sharded(accumulate(2)(step)))", "adamw"),
        ("sharded(accumulate(2)(mixed_precision(dtype='fp16')(step)))", "sgd"),
        ("clip_grad_norm(0.5)(sharded(mixed_precision(dtype='fp16')(accumulate(2)(step))))", "sgd"),
    ],
)
def test_fp16_dynamic_loss_scaling_is_the_textbook_fsdp2_loop_bit_for_bit(pool, composition, optimizer):
    """sharded + mixed_precision('fp16') + accumulate(2), mixed_precision inside or outside sharded or
    accumulate, and under clip_grad_norm, against fully_shard + autocast + GradScaler written by hand (no
    gradient sync but for the last micro-batch, unscale_ and clip, scaler.step, update, zero_grad): the same
    parameters, optimizer state, loss, loss scale and skips after every update. The scale grows after each
    clean update (growth_interval=1, from a checkpoint), so it overflows fp16 by itself (updates 4 and 7),
    and the last rank's inputs overflow at update 3.

    Bit for bit, not within a tolerance: both run the same kernels in the same order (the loss scaled after
    its micro-batch share, unscaled once after the last backward, DTensor's unscale_ reducing found_inf
    over the ranks)."""
    results = pool.run(__name__, "fp16_both", composition, 1, 3, optimizer)
    for mine, theirs in results:
        assert [r["skipped"] for r in mine] == [r["skipped"] for r in theirs]
        assert [r["scale"] for r in mine] == [r["scale"] for r in theirs]
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            torch.testing.assert_close(a["loss"], b["loss"], rtol=0, atol=0, equal_nan=True)  # NaN where poisoned
            assert a["params"].keys() == b["params"].keys()
            for name, p in b["params"].items():
                assert torch.equal(a["params"][name], p), (i, name)
            assert a["optimizer"].keys() == b["optimizer"].keys()
            for key, entries in b["optimizer"].items():
                assert a["optimizer"][key].keys() == entries.keys()
                for what, v in entries.items():
                    assert torch.equal(a["optimizer"][key][what], v), (i, key, what)
    mine = results[0][0]
    for other, _ in results[1:]:  # every rank holds the same full parameters after every update
        for a, b in zip(mine, other, strict=True):
            assert all(torch.equal(a["params"][n], b["params"][n]) for n in a["params"])
    skipped, scales = [r["skipped"] for r in mine], [r["scale"] for r in mine]
    assert skipped[3] and sum(skipped) >= 2, skipped  # the poisoned update, and an overflow of the grown scale
    steps = list(itertools.pairwise(scales))
    assert any(b > a for a, b in steps) and any(b < a for a, b in steps), scales  # grown and backed off
    assert not all(torch.equal(mine[0]["params"][n], mine[-1]["params"][n]) for n in mine[0]["params"])


def test_each_rank_holds_half_the_parameters_gradients_and_optimizer_state(pool):
    whole = local_bytes(0, 1, sharded=False)
    for mine in pool.run(__name__, "local_bytes", True):
        for what in ("params", "grads", "optimizer"):
            assert mine[what] == whole[what] / 2, what  # 64 rows per layer split evenly over 2 ranks


def test_bad_inputs_are_clear_errors_that_change_nothing(pool):
    found = pool.run(__name__, "refusals")
    assert found[0] == found[1]
    found = found[0]
    assert found["unknown"].startswith(
        "ValueError: sharded(modules=['blocks.0', 'block.7'])(classify_acc): modules names ['block.7'], which the "
        "model does not have; its submodules include ['inp', 'blocks', 'blocks.0', "
    )
    assert found["unknown_untouched"] == "True"
    assert (
        found["class"]
        == "ValueError: sharded(modules=Conv2d)(classify_acc): modules=Conv2d matches no submodule of the model"
    )
    assert found["optimizer"].startswith(
        "ValueError: sharded(classify_acc): the optimizer already holds state (momentum, moments) for 8 unsharded "
        "parameter(s); sharding replaces the parameters"
    )
    assert found["tied"].startswith(
        "ValueError: sharded(classify_acc): parameters ['blocks.0.0.weight', 'blocks.1.0.weight'] are one tensor (tied "
        "weights) used in units ['blocks.0', 'blocks.1']"
    )
    assert found["tied_in_one_unit"] == "no error"
    assert found["container"].startswith(
        "ValueError: sharded(modules=['blocks'])(classify_acc): modules selects ['blocks'], which have no forward of "
        "their own (an nn.ModuleList or ModuleDict)"
    )
    assert found["unequal"].startswith(
        "ValueError: sharded(accumulate(2)(classify_acc)): the ranks' batches hold [4, 5] samples; under sharded every "
        "rank must run the same forward and backward passes"
    )


def test_compositions_with_replicas_are_refused_when_built():
    with pytest.raises(ValueError, match=r"sharded: cannot wrap a step that applies distributed: a model is either"):
        ct.sharded(ct.distributed(classify))
    with pytest.raises(ValueError, match=r"distributed: cannot wrap a step that applies sharded: a model is either"):
        ct.distributed(ct.accumulate(2)(ct.sharded(classify)))
    with pytest.raises(ValueError, match=r"data_parallel\(\['cpu', 'cpu'\]\): cannot wrap a step that applies sharded"):
        ct.data_parallel(["cpu", "cpu"])(ct.sharded(classify))
    with pytest.raises(ValueError, match=r"sharded: cannot wrap a step that applies data_parallel"):
        ct.sharded(ct.data_parallel(["cpu", "cpu"])(classify))
    with pytest.raises(ValueError, match=r"sharded: cannot wrap a step that applies pipeline_split"):
        ct.sharded(ct.pipeline_split({"0": "cpu", "2": "cpu"})(classify))
    with pytest.raises(ValueError, match=r"pipeline_split.*: cannot wrap a step that applies sharded"):
        ct.pipeline_split({"0": "cpu", "2": "cpu"})(ct.sharded(classify))
    with pytest.raises(ValueError, match="already applies sharded; use sharded once"):
        ct.sharded(ct.sharded(classify))


def test_options_are_checked_and_shown():
    with pytest.raises(TypeError, match=r"sharded: sync_every_micro_batch must be True or False, got 1 \(int\)"):
        ct.sharded(sync_every_micro_batch=1)
    with pytest.raises(TypeError, match=r"sharded: modules must be submodule names, nn.Module classes or a predicate"):
        ct.sharded(modules=3)
    with pytest.raises(ValueError, match="the root is always a unit of its own"):
        ct.sharded(modules=["", "blocks.0"])
    assert repr(ct.sharded(classify)) == "sharded(classify)"
    assert repr(ct.sharded(modules=torch.nn.Linear, sync_every_micro_batch=True)(classify)) == (
        "sharded(modules=Linear, sync_every_micro_batch=True)(classify)"
    )
    assert ct.sharded(modules="blocks.0")(classify) == ct.sharded(modules=["blocks.0"])(classify)


def test_world_size_one_is_the_plain_step_bit_for_bit():
    a, b = make_state(0), make_state(0)
    for i in range(3):
        ct.sharded(ct.accumulate(2)(classify))(a, make_batch(8, seed=i))
        ct.accumulate(2)(classify)(b, make_batch(8, seed=i))
    assert_states_equal(a, b)


def test_gradients_are_reduced_once_per_update_unless_asked_every_micro_batch(pool):
    """One reduce-scatter per unit for each backward that syncs; the others keep unsharded gradients."""
    units = 3  # blocks.0, blocks.1 and the root (inp, head)
    assert pool.run(__name__, "reduce_scatters", 1, False) == [[units, units]] * 2
    for n in (2, 4):
        assert pool.run(__name__, "reduce_scatters", n, False) == [[units, units]] * 2, n
        assert pool.run(__name__, "reduce_scatters", n, True) == [[n * units, n * units]] * 2, n


@pytest.mark.parametrize(
    "composition",
    [
        "sharded(checkpoint_activations(Sequential)(step))",
        "checkpoint_activations(Sequential)(sharded(step))",
        "sharded(checkpoint_activations(Sequential)(accumulate(n)(step)))",
        "accumulate(n)(sharded(checkpoint_activations(Sequential)(step)))",
    ],
)
def test_checkpoint_activations_composes(pool, composition):
    """Blocks recomputed in backward under FSDP2, in either order and with accumulate: one process's update."""
    sizes = [[5, 5], [3, 3], [4, 4]]
    assert_matches_reference(*run(pool, composition=composition, n=2, kind="classify", sizes=sizes, optimizer="sgd"))


def test_a_released_state_holds_no_reference_to_its_group_and_refuses_the_next_step(pool):
    found = pool.run(__name__, "released")
    assert found[0]["next_step"] == found[1]["next_step"]
    for r in found:
        assert r["held_before"] and not r["held_after"]  # FSDP2 held it; ct.run destroys it next
        assert r["next_step"].startswith(
            "RuntimeError: sharded(classify_acc): the TrainState's model was sharded over a process group that is "
            "gone, released (TrainState.release_runtime, which ct.run calls when the process exits) or another one"
        )
        assert r["untouched"]
        assert math.isfinite(r["fresh_loss"])  # the group itself was not harmed


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# Cases for ct.sharded on every rank (the composition cases themselves: helpers.train_sharded).


def run_case(rank: int, world: int, case: dict[str, Any]) -> dict[str, Any]:
    return train_sharded(case, rank)


def dtypes_under_bf16(rank: int, world: int) -> dict[str, Any]:
    """What sharded(mixed_precision(bf16)) computes in: the forward's output, parameters, gradients."""
    seen: dict[str, Any] = {}

    def step(model, batch):
        x, y = batch
        logits = model(x)
        seen["output"] = logits.dtype
        return torch.nn.functional.cross_entropy(logits.float(), y)

    class Spy(ct.TrainStep):
        def update(self, state, ctx):
            seen["grads"] = sorted({str(p.grad.dtype) for p in state.model.parameters()})
            seen["grad_kinds"] = sorted({type(p.grad).__name__ for p in state.model.parameters()})
            return self._inner().update(state, ctx)

    state = sharded_state("classify", 0, torch.float32)
    ct.sharded(ct.mixed_precision(dtype="bf16")(Spy(ct.train_step(step))))(
        state,
        shard(global_batch("classify", [4] * world, 0, torch.float32), [4] * world, rank),
    )
    seen["params"] = sorted({str(p.dtype) for p in state.model.parameters()})
    seen["output"] = str(seen["output"])
    return seen


def local_bytes(rank: int, world: int, sharded: bool) -> dict[str, int]:
    """This rank's bytes of parameters, gradients (at the update) and optimizer state, AdamW."""
    counted: dict[str, int] = {}

    def size(t: torch.Tensor) -> int:
        local = t.to_local() if hasattr(t, "to_local") else t
        return local.numel() * local.element_size()

    class Count(ct.TrainStep):
        def update(self, state, ctx):
            counted["grads"] = sum(size(p.grad) for p in state.model.parameters() if p.grad is not None)
            return self._inner().update(state, ctx)

    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(64, 64) for _ in range(4))).double()
    state = ct.TrainState(model, torch.optim.AdamW(model.parameters()))
    step = Count(ct.train_step(lambda m, b: m(b).pow(2).mean()))
    (ct.sharded(step, modules=nn.Linear) if sharded else step)(state, torch.randn(8, 64, dtype=torch.float64))
    counted["params"] = sum(size(p) for p in state.model.parameters())
    counted["optimizer"] = sum(
        size(v) for entries in state.optimizer.state.values() for v in entries.values() if v.dim() > 0
    )
    return counted


def found_inf_on_one_rank(rank: int, world: int, dtype: str) -> dict[str, Any]:
    """A gradient that is not finite in the last rank's shard only: every rank must skip the update."""

    class Poison(ct.TrainStep):  # after the last backward, gradients are sharded: poison one local entry
        def grads(self, state, batch, ctx):
            done = self._inner().grads(state, batch, ctx)
            if ctx.last_backward and rank == world - 1 and state.step == 1:
                state.model[1].weight.grad.to_local()[-1, 0] = float("nan")
            return done

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    train = ct.sharded(ct.mixed_precision(dtype=dtype)(Poison(ct.train_step(lambda m, b: m(b).float().pow(2).mean()))))
    train(state, torch.ones(2, 4))  # shards the model, one clean update
    before = {n: full(p) for n, p in state.model.named_parameters()}
    momentum = optimizer_state(state)
    out = train(state, torch.ones(2, 4))
    after = {n: full(p) for n, p in state.model.named_parameters()}
    later = optimizer_state(state)
    return {
        "skipped": bool(out.skipped),
        "unchanged": all(torch.equal(before[n], after[n]) for n in before)
        and all(torch.equal(momentum[k][s], later[k][s]) for k in momentum for s in momentum[k]),
        "step": state.step,
    }


def refusals(rank: int, world: int) -> dict[str, str]:
    """The errors bad inputs give at the first update (each state is left as it was)."""

    batch = shard(global_batch("classify", [4] * world, 0, torch.float64), [4] * world, rank)
    found = {}
    state = sharded_state("classify", 0, torch.float64)
    found["unknown"] = outcome(lambda: ct.sharded(modules=["blocks.0", "block.7"])(classify_acc)(state, batch))
    found["unknown_untouched"] = str(type(state.model).__name__ == "Net" and not state.optimizer.state)
    found["class"] = outcome(lambda: ct.sharded(modules=nn.Conv2d)(classify_acc)(state, batch))
    trained = sharded_state("classify", 0, torch.float64)
    ct.train_step(classify_acc)(trained, batch)  # momentum exists for the unsharded parameters
    found["optimizer"] = outcome(lambda: ct.sharded(classify_acc)(trained, batch))
    model = sharded_state("classify", 0, torch.float64).model
    model.blocks[1][0].weight = model.blocks[0][0].weight  # one tensor in two units
    tied = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    found["tied"] = outcome(lambda: ct.sharded(classify_acc)(tied, batch))
    found["tied_in_one_unit"] = outcome(lambda: ct.sharded(modules=["inp"])(classify_acc)(tied, batch))
    found["container"] = outcome(lambda: ct.sharded(modules=["blocks"])(classify_acc)(state, batch))
    uneven = shard(global_batch("classify", [4, 5], 0, torch.float64), [4, 5], rank)
    found["unequal"] = outcome(lambda: ct.sharded(ct.accumulate(2)(classify_acc))(state, uneven))
    return found


def reduce_scatters(rank: int, world: int, n: int, every: bool) -> list[int]:
    """FSDP2's gradient reduce-scatters per update, counted at torch.distributed's entry point."""
    calls: list[int] = []
    original = dist.reduce_scatter_single

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    state = sharded_state("classify", 0, torch.float64)
    step = ct.sharded(ct.accumulate(n)(classify_acc), sync_every_micro_batch=every)
    dist.reduce_scatter_single = counting
    try:
        per_update = []
        for i in range(2):
            before = len(calls)
            batch = global_batch("classify", [8] * world, i, torch.float64)
            step(state, shard(batch, [8] * world, rank))
            per_update.append(len(calls) - before)
    finally:
        dist.reduce_scatter_single = original
    return per_update


def holds(root: Any, target: Any) -> bool:
    """Whether ``target`` can be reached from ``root`` through object references (not through
    modules, classes or a function's globals, which reach everything)."""
    import gc
    import types

    todo, seen = [root], {id(root)}
    while todo:
        obj = todo.pop()
        if obj is target:
            return True
        if isinstance(obj, (types.ModuleType, type)):
            continue
        if isinstance(obj, types.FunctionType):
            found = [c.cell_contents for c in obj.__closure__ or () if c.cell_contents is not None]
            found += list(obj.__defaults__ or ())
        else:
            found = gc.get_referents(obj)
            if hasattr(obj, "__dict__"):
                found.append(vars(obj))
        for r in found:
            if id(r) not in seen:
                seen.add(id(r))
                todo.append(r)
    return False


def released(rank: int, world: int) -> dict[str, Any]:
    """A sharded state whose runtime is released (as ct.run does before destroying its group)."""
    batch = shard(global_batch("classify", [4] * world, 0, torch.float64), [4] * world, rank)
    state = sharded_state("classify", 0, torch.float64)
    step = ct.sharded(classify_acc)
    step(state, batch)
    found: dict[str, Any] = {"held_before": holds(state, dist.group.WORLD)}
    state.release_runtime()
    found["held_after"] = holds(state, dist.group.WORLD)
    before = {n: p.to_local().clone() for n, p in state.model.named_parameters()}
    try:
        step(state, batch)
        found["next_step"] = "no error"
    except Exception as e:
        found["next_step"] = f"{type(e).__name__}: {e}"
    found["untouched"] = all(torch.equal(p.to_local(), before[n]) for n, p in state.model.named_parameters())
    fresh = sharded_state("classify", 0, torch.float64)  # the group itself lives on: another state trains on it
    found["fresh_loss"] = float(step(fresh, batch).loss)
    return found


FP16_UPDATES = 8  # rank batches of 6, two micro-batches of 3 each


def fp16_batch(rank: int, world: int, i: int, poisoned: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s batch of update ``i``; at update ``poisoned`` the last rank's inputs are too large
    for fp16 (inf once autocast casts them, NaN after the first layer): the update must be skipped."""
    x, y = shard(global_batch("classify", [6] * world, 500 + i, torch.float32), [6] * world, rank)
    return (x * 1e6 if i == poisoned and rank == world - 1 else x), y


def fp16_scaling(growth_interval: int) -> dict[str, Any]:
    """mixed_precision's loss scaling as a checkpoint holds it: GradScaler's defaults (as
    composetrain's _scaling.DYNAMIC), but growing after ``growth_interval`` clean updates."""
    scaler = {"scale": 2.0**16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": growth_interval}
    return {"mode": ("fp16", None), "scaler": {**scaler, "_growth_tracker": 0}, "consecutive_skips": 0}


def fp16_record(model: nn.Module, optimizer: torch.optim.Optimizer, scale: float, skipped: bool, loss: Any) -> Any:
    return {
        "params": {n: full(p) for n, p in model.named_parameters()},
        "optimizer": {
            k: {name: full(v) for name, v in entries.items()} for k, entries in optimizer.state_dict()["state"].items()
        },
        "scale": scale,
        "skipped": bool(skipped),
        "loss": loss.detach().clone(),
    }


def fp16_composetrain(
    rank: int, world: int, printed: str, growth_interval: int, poisoned: int, optimizer: str
) -> list[dict[str, Any]]:
    """ct.sharded + ct.mixed_precision('fp16') + ct.accumulate(2) (+ clip_grad_norm(0.5)), nested as
    ``printed`` says (as the step prints: ``"sharded(mixed_precision(dtype='fp16')(accumulate(2)(step)))"``):
    one record per update."""
    parts = {
        "sharded": ct.sharded,
        "mixed_precision(dtype='fp16')": ct.mixed_precision(dtype="fp16"),
        "accumulate(2)": ct.accumulate(2),
        "clip_grad_norm(0.5)": ct.clip_grad_norm(0.5),
    }
    train = composed(printed, parts, classify_acc)
    state = fp16_state(optimizer)
    saved = state.state_dict()  # the scaler's growth interval arrives as a checkpoint would bring it
    state.load_state_dict({**saved, "transforms": {"mixed_precision": fp16_scaling(growth_interval)}})
    records = []
    for i in range(FP16_UPDATES):
        out = train(state, fp16_batch(rank, world, i, poisoned))
        scale = state.state_dict()["transforms"]["mixed_precision"]["scaler"]["scale"]
        records.append(fp16_record(state.model, state.optimizer, scale, bool(out.skipped), out.loss))
    return records


def fp16_state(optimizer: str) -> ct.TrainState:
    """float32 weights, the same on every rank; no scheduler (the textbook loop would step it on a skip too)."""
    torch.manual_seed(11)
    model = sharded_net()
    return ct.TrainState(model, fp16_optimizer(model, optimizer))


def fp16_optimizer(model: nn.Module, optimizer: str) -> torch.optim.Optimizer:
    if optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def fp16_textbook(rank: int, world: int, clip: bool, growth_interval: int, poisoned: int, optimizer: str) -> Any:
    """The FSDP2 + GradScaler loop as torch documents it, by hand: one record per update."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    model = fp16_state(optimizer).model
    mesh = DeviceMesh.from_group(dist.group.WORLD, "cpu")
    for block in reversed(model.blocks):  # sharded's default units, innermost (last) first, then the root
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = fp16_optimizer(model, optimizer)  # built on the sharded parameters
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=growth_interval
    )
    records = []
    for i in range(FP16_UPDATES):
        x, y = fp16_batch(rank, world, i, poisoned)
        micro = [(x[:3], y[:3]), (x[3:], y[3:])]
        shares = []
        for j, (mx, my) in enumerate(micro):
            model.set_requires_gradient_sync(j == len(micro) - 1)  # reduce-scatter after the last backward only
            with torch.autocast("cpu", dtype=torch.float16):
                loss, _ = classify_acc(model, (mx, my))
            share = loss * (len(mx) / len(x))
            scaler.scale(share).backward()
            shares.append(share.detach())
        model.set_requires_gradient_sync(True)
        if clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        total = sum(shares[1:], shares[0])
        records.append(fp16_record(model, opt, scaler.get_scale(), scaler.get_scale() < before, total))
    return records


def fp16_both(
    rank: int, world: int, printed: str, growth_interval: int = 1, poisoned: int = 3, optimizer: str = "sgd"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """composetrain's records and the textbook loop's, on the same rank batches from the same weights."""
    mine = fp16_composetrain(rank, world, printed, growth_interval, poisoned, optimizer)
    theirs = fp16_textbook(rank, world, "clip_grad_norm" in printed, growth_interval, poisoned, optimizer)
    return mine, theirs
