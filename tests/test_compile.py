"""ct.compile: compiled compositions equal the eager ones; shapes, placement, checkpoints, arguments.

Most tests compile with backend="aot_eager" (TorchDynamo and AOTAutograd, as inductor sees them, without
generating code: seconds less per compile on a small CPU); test_compile_run.py has the inductor ones.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from helpers import (
    assert_states_close,
    classify,
    make_batch,
    make_state,
    mlp,
    train_sharded,
)
from torch import nn
from torch._dynamo.utils import counters

import composetrain as ct

AOT = ct.compile(backend="aot_eager")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest.py: each test compiles from nothing


def graphs() -> int:
    return counters["stats"]["unique_graphs"]


# one composition per transform, compiled inside and eager; float64, so that only float rounding differs
COMPOSITIONS = {
    "plain": lambda c: c(classify),
    "accumulate": lambda c: ct.accumulate(3)(c(classify)),
    "accumulate_outside": lambda c: c(ct.accumulate(3)(classify)),
    "clip": lambda c: ct.clip_grad_norm(0.05)(c(classify)),
    "checkpoint_activations": lambda c: ct.checkpoint_activations("0")(c(ct.accumulate(2)(classify))),
    "mixed_precision": lambda c: ct.mixed_precision(dtype="bf16")(c(classify)),
    "auto": lambda c: c(ct.accumulate("auto")(classify)),
    "data_parallel": lambda c: c(ct.data_parallel(["cpu", "cpu"])(classify)),
    "pipeline_split": lambda c: c(ct.pipeline_split({"0": "cpu", "2": "cpu"})(classify)),
}


@pytest.mark.parametrize("case", sorted(COMPOSITIONS))
def test_compiled_composition_equals_eager(case):
    """Measured: aot_eager runs the very kernels eager does, so bit-identical here (float32 and float64, also
    under bf16 autocast); asserted to 1e-12, float64 rounding after a few updates (inductor: test_compile_run)."""
    build = COMPOSITIONS[case]
    compiled, eager = make_state(3), make_state(3)
    fast, slow = build(AOT), build(ct.train_step)
    for i, size in enumerate((16, 16, 10)):  # the last batch is short: its micro-batches have new sizes
        batch = make_batch(size, seed=i)
        a, b = fast(compiled, batch), slow(eager, batch)
        torch.testing.assert_close(a.loss, b.loss, rtol=1e-12, atol=1e-14)
        assert a.metrics.keys() == b.metrics.keys()
    assert_states_close(compiled, eager, rtol=1e-12, atol=1e-14)
    assert graphs() >= 1, "nothing was compiled"


def test_new_sizes_recompile_once_not_per_size():
    """The first change of batch size compiles once more, for any size; later sizes reuse it (size 1 aside)."""
    state = make_state(0)
    for n, size in [(1, 16), (1, 16), (2, 16), (4, 16), (4, 10), (3, 13), (1, 7)]:  # pieces of 16, 8, 4, 3, 2, ...
        AOT(ct.accumulate(n)(classify))(state, make_batch(size))
    assert graphs() == 2


def test_accumulate_auto_halving_does_not_recompile_per_retry(monkeypatch):
    """accumulate("auto") retries on out of memory with twice as many, smaller micro-batches."""
    state = make_state(0)
    calls = []

    def tight(model, batch):  # out of memory for micro-batches above 4 samples, as a GPU would be
        calls.append(len(batch[0]))
        if len(batch[0]) > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return classify(model, batch)

    train = AOT(ct.accumulate("auto")(tight))
    for i in range(3):
        train(state, make_batch(32, seed=i))
    assert max(calls[-8:]) <= 4
    assert graphs() <= 2  # the first size that fit, then any size


def test_the_model_and_its_state_dict_keys_are_unchanged():
    state, plain = make_state(0), mlp(0)
    AOT(classify)(state, make_batch(8))
    assert type(state.model) is nn.Sequential and "_compiled_call_impl" not in vars(state.model)
    assert list(state.state_dict()["model"]) == list(plain.state_dict())


def test_checkpoints_move_between_compiled_and_eager_runs():
    """Two compiled updates, saved, loaded into an eager state, two more: as four eager updates."""
    compiled, straight = make_state(1), make_state(1)
    train = AOT(ct.accumulate(2)(classify))
    for i in range(2):
        train(compiled, make_batch(12, seed=i))
    eager = make_state(5)
    eager.load_state_dict(copy.deepcopy(compiled.state_dict()))
    back = make_state(6)  # and back into a compiled one
    for i in range(2, 4):
        ct.accumulate(2)(classify)(eager, make_batch(12, seed=i))
    back.load_state_dict(copy.deepcopy(eager.state_dict()))
    train(back, make_batch(12, seed=4))
    for i in range(5):
        ct.accumulate(2)(classify)(straight, make_batch(12, seed=i))
    assert_states_close(back, straight, rtol=1e-12, atol=1e-14)


def test_a_model_wrapped_by_torch_compile_is_refused_with_the_fix():
    """The issue's example: torch.compile(model) in a TrainState wrote '_orig_mod.' keys that did not resume."""
    model = mlp(0)
    wrapped = torch.compile(model, backend="aot_eager")
    with pytest.raises(TypeError, match=r"TrainState: model is torch.compile\(model\).*_orig_mod.*ct.compile\(step\)"):
        ct.TrainState(wrapped, torch.optim.SGD(model.parameters(), lr=0.1))


def test_a_model_compiled_in_place_keeps_its_keys_and_trains():
    model = mlp(0)
    model.compile(backend="aot_eager")
    state, eager = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1)), make_state(0, scheduler=False)
    eager.optimizer = torch.optim.SGD(eager.model.parameters(), lr=0.1)
    for i in range(2):
        ct.train_step(classify)(state, make_batch(8, seed=i))
        ct.train_step(classify)(eager, make_batch(8, seed=i))
    assert list(state.state_dict()["model"]) == list(mlp(0).state_dict())
    assert_states_close(state, eager, rtol=1e-12, atol=1e-14)


def test_bare_and_called_forms_print_compare_and_stay_independent():
    assert repr(ct.compile(classify)) == "compile(classify)"
    assert (
        repr(ct.compile(backend="aot_eager", dynamic=True)(classify))
        == "compile(backend='aot_eager', dynamic=True)(classify)"
    )
    assert (
        repr(ct.compile(mode="max-autotune-no-cudagraphs")(classify))
        == "compile(mode='max-autotune-no-cudagraphs')(classify)"
    )
    one, two = AOT(ct.accumulate(2)(classify)), AOT(ct.accumulate(2)(classify))
    assert one == two and hash(one) == hash(two)
    assert one != ct.compile(backend="aot_eager", fullgraph=True)(ct.accumulate(2)(classify))
    assert one != ct.compile(backend="aot_eager", cache=False)(ct.accumulate(2)(classify))
    a, b = make_state(2), make_state(2)
    one(a, make_batch(8))
    assert b.step == 0 and a.step == 1  # nothing of a's run is kept in the step
    two(b, make_batch(8))
    assert_states_close(a, b, rtol=0, atol=0)
    with pytest.raises(ValueError, match="use compile once in a composition"):
        AOT(ct.accumulate(2)(AOT(classify)))


def test_the_capability_says_the_driver_keeps_the_cache():
    assert AOT(classify).capabilities.compile_cache
    assert ct.distributed(AOT(classify)).capabilities.compile_cache
    assert not ct.compile(cache=False)(classify).capabilities.compile_cache
    assert not ct.accumulate(2)(classify).capabilities.compile_cache


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"mode": "reduce-overhead"},
            ValueError,
            r"compile: mode='reduce-overhead' replays CUDA graphs.*no-cudagraphs",
        ),
        ({"mode": "max-autotune"}, ValueError, r"compile: mode='max-autotune' replays CUDA graphs"),
        ({"backend": "cudagraphs"}, ValueError, r"compile: backend='cudagraphs' replays CUDA graphs.*inductor"),
        ({"mode": "fast"}, ValueError, r"compile: mode must be one of \[None, 'default', .*got 'fast'"),
        ({"dynamic": 1}, TypeError, r"compile: dynamic must be True or False, got 1 \(int\)"),
        ({"fullgraph": "yes"}, TypeError, r"compile: fullgraph must be True or False, got 'yes'"),
        ({"cache": None}, TypeError, r"compile: cache must be True or False, got None"),
        ({"backend": "nope"}, ValueError, r"compile: backend must be one of \[.*'inductor'.*got 'nope'"),
        ({"backend": 3}, TypeError, r"compile: backend must be a backend name .* got 3 \(int\)"),
        ({"backend": "aot_eager", "mode": "default"}, ValueError, r"compile: mode='default' is an inductor option"),
    ],
)
def test_arguments_are_checked_when_built(kwargs, error, match):
    with pytest.raises(error, match=match):
        ct.compile(**kwargs)


def test_a_model_in_the_steps_place_is_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"compile: step must be a function .* got the model .*ct.compile\(step\)"):
        ct.compile(mlp(0))
    with pytest.raises(TypeError, match=r"compile\(backend='aot_eager'\): step must be a function"):
        ct.compile(backend="aot_eager")(3)


@pytest.mark.parametrize("outside", [False, True])
def test_under_distributed_one_gradient_sync_per_update_and_the_one_process_update(pool, outside):
    """compile inside or outside distributed: DDP all-reduces once per update (not once per micro-batch, as a
    loop that forgets no_sync does), and the ranks' update is the eager one of one process on the whole batch."""
    from helpers import case_state, classify_acc, global_batch

    got = pool.run(__name__, "count_syncs", 4, 3, outside)
    assert [r["syncs"] for r in got] == [[1, 1, 1]] * pool.world  # one bucket (1 MiB) for the small model
    assert all(r["graphs"] >= 1 for r in got)
    alone = case_state("classify", 0, torch.float64)
    for i in range(3):
        ct.accumulate(4)(classify_acc)(alone, global_batch("classify", [8] * pool.world, i, torch.float64))
    for r in got:
        for mine, want in zip(r["params"], alone.model.parameters(), strict=True):
            torch.testing.assert_close(mine, want.detach(), rtol=1e-12, atol=1e-14)


def test_under_distributed_buckets_below_ddps_first_are_refused_with_the_fix(pool):
    """torch's DDPOptimizer asserts on them (an AssertionError from deep inside the first compile)."""
    for message in [m for said in pool.run(__name__, "refused_small_buckets") for m in said]:
        assert "bucket_cap_mb=1e-06 is below DDP's first bucket" in message and "bucket_cap_mb >= 1.0" in message


def test_under_sharded_the_ranks_update_is_the_one_process_update(pool):
    """FSDP2's hooks run between the compiled graphs (torch's skip_fsdp_hooks); the compiled ranks' update is the
    compiled one-process update on the whole batch, which equals the eager one (above)."""
    composition = "compile(backend='aot_eager')(sharded(clip_grad_norm(0.5)(accumulate(n)(step))))"
    case = {"composition": composition, "n": 2, "kind": "classify", "sizes": [[4, 4], [4, 4], [3, 3]], "seed": 0}
    results = pool.run(__name__, "run_sharded_case", case)
    torch._dynamo.reset()
    reference = train_sharded(case, rank=None)
    for r in results:
        assert r["kinds"] == ["DTensor"] and r["step"] == reference["step"] == 3
        for name, p in reference["params"].items():
            torch.testing.assert_close(r["params"][name], p, rtol=1e-12, atol=1e-14, msg=name)


def test_an_unhashable_callable_step_compiles():
    class Step:
        __hash__ = None  # an object with __eq__ and no hash, as a dataclass(eq=True) is

        def __call__(self, model, batch):
            return classify(model, batch)

    a, b = make_state(4), make_state(4)
    for i in range(2):
        AOT(Step())(a, make_batch(8, seed=i))
        ct.train_step(classify)(b, make_batch(8, seed=i))
    assert_states_close(a, b, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("dynamic", "expected"), [(True, 1), (False, 3)])
def test_dynamic_reaches_torch(dynamic, expected):
    """dynamic=True: one graph for every size; False: one per size (8, 6, 4)."""
    state = make_state(0)
    train = ct.compile(backend="aot_eager", dynamic=dynamic)(classify)
    for size in (8, 6, 4, 6):
        train(state, make_batch(size))
    assert graphs() == expected


def test_under_ct_run_every_rank_logs_the_same_compile_record(pool):
    """The compile counts and seconds are averaged over ranks in the record's one all-reduce, as the metrics."""
    first, second = pool.run(__name__, "compiled_run")
    fields = ("step", "loss", "compiles", "compile_s")  # the timings (updates_per_s, data_wait) are each rank's
    assert [[r[k] for k in fields] for r in first] == [[r[k] for k in fields] for r in second]
    assert first[0]["compiles"] >= 1 and first[0]["compile_s"] > 0 and first[-1]["compiles"] == 0


BREAK_GRAPHS = {  # transforms whose hooks run eagerly between the compiled graphs
    "checkpoint_activations": ct.checkpoint_activations("0"),
    "distributed": ct.distributed,
    "pipeline_split": ct.pipeline_split({"0": "cpu", "2": "cpu"}),
    "sharded": ct.sharded,
}


@pytest.mark.parametrize("role", sorted(BREAK_GRAPHS))
@pytest.mark.parametrize("outside", [False, True])
def test_fullgraph_with_a_transform_that_breaks_the_graph_is_refused_when_built(role, outside):
    """Their hooks run eagerly between the graphs, a graph break that fullgraph=True forbids: torch said so only at
    the first update ("Skip calling torch.compiler.disable()d function", hinting to remove it; "dict.copy";
    "Call to torch._dynamo.disable()" on every rank; "Avoid calling Logger.set_runtime_stats_and_log")."""
    full = ct.compile(backend="aot_eager", fullgraph=True)
    breaking = BREAK_GRAPHS[role]
    with pytest.raises(ValueError, match=rf"{role}.*eagerly.*fullgraph=True forbids.*fullgraph=False"):
        breaking(full(classify)) if outside else full(ct.accumulate(2)(breaking(classify)))
    ct.compile(backend="aot_eager")(breaking(classify))  # the default, fullgraph=False, composes
    breaking(ct.compile(backend="aot_eager")(classify))


def test_a_compiled_state_pickles_and_its_copies_compile_their_own_wrappers():
    """torch.compile's wrappers do not pickle (torch.save(state) failed once a compiled update ran), and a copy
    (ct.check's deepcopy) shared them; a copy gets none, and makes its own without compiling again."""
    import pickle

    state, eager = make_state(3), make_state(3)
    train = AOT(ct.accumulate(2)(classify))
    train(state, make_batch(8))
    ct.accumulate(2)(classify)(eager, make_batch(8))
    for copied in (pickle.loads(pickle.dumps(state)), copy.deepcopy(state)):
        assert copied.transform_state("compile", dict).steps == {}
        train(copied, make_batch(8, seed=1))
        assert len(copied.transform_state("compile", dict).steps) == 1
    train(state, make_batch(8, seed=1))
    ct.accumulate(2)(classify)(eager, make_batch(8, seed=1))
    assert_states_close(copied, eager, rtol=1e-12, atol=1e-14)
    assert_states_close(state, eager, rtol=1e-12, atol=1e-14)
    assert graphs() == 1  # the copies' wrappers found the code compiled for the first


def scaled(factor):
    """classify's loss times ``factor``: each one another step, all of one code object (closures differ)."""

    def step(model, batch):
        loss, metrics = classify(model, batch)
        return loss * factor, metrics

    return step


def test_compiled_compositions_of_different_plain_steps_on_one_state_each_run_their_own():
    """issue 30.3: one TrainState, a compiled train step and compiled steps with other losses, taken in turn: each
    runs its own forward and loss (the state's compiled wrappers are kept per plain step, never shared)."""
    plains = [classify, scaled(0.25), scaled(3.0)]
    fast = [AOT(ct.accumulate(2)(plain)) for plain in plains]
    slow = [ct.accumulate(2)(plain) for plain in plains]
    compiled, eager = make_state(3), make_state(3)
    for i in range(2):
        for a, b in zip(fast, slow, strict=True):
            batch = make_batch(8, seed=i)
            torch.testing.assert_close(a(compiled, batch).loss, b(eager, batch).loss, rtol=1e-12, atol=1e-14)
    assert_states_close(compiled, eager, rtol=1e-12, atol=1e-14)
    assert len(compiled.transform_state("compile", dict).steps) == len(plains)


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# ct.compile under ct.distributed and ct.sharded.


def count_syncs(rank: int, world: int, n: int, updates: int, outside: bool, bucket_mb: float = 1.0) -> dict[str, Any]:
    """All-reduces per update (a counting DDP communication hook) of a compiled composition, and
    its parameters after the updates, to compare with the eager composition's on one process."""
    from helpers import case_state, classify_acc, counting_allreduce, syncs_per_update
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    calls, counting = counting_allreduce()
    state = case_state("classify", 0, torch.float64)
    compiled = ct.compile(backend="aot_eager")
    distributed = ct.distributed(bucket_cap_mb=bucket_mb, comm_hook=counting)
    inner = ct.accumulate(n)(classify_acc)
    step = compiled(distributed(inner)) if outside else distributed(compiled(inner))
    per_update = syncs_per_update(step, state, calls, rank, world, updates)
    params = [p.detach().clone() for p in state.model.parameters()]
    torch._dynamo.reset()
    return {"syncs": per_update, "params": params, "graphs": counters["stats"]["unique_graphs"]}


def refused_small_buckets(rank: int, world: int) -> list[str]:
    """What compile inside, then outside, distributed with too small buckets says."""
    said = []
    for outside in (False, True):
        try:
            count_syncs(rank, world, 2, 1, outside, bucket_mb=1e-6)
            said.append("not refused")
        except ValueError as e:
            said.append(str(e))
    return said


def compiled_run(rank: int, world: int) -> list[dict[str, Any]]:
    """ct.run of a compiled distributed composition on every rank: its records."""
    import run_script

    torch._dynamo.reset()
    train = ct.distributed(ct.compile(backend="aot_eager")(ct.accumulate(2)(run_script.step)))
    result = ct.run(
        train,
        run_script.state(),
        run_script.dataset(),
        batch_size=12,
        epochs=1,
        num_workers=0,
        progress=False,
        log_every=2,
    )
    torch._dynamo.reset()
    return result.history


def run_sharded_case(rank: int, world: int, case: dict[str, Any]) -> dict[str, Any]:
    return train_sharded(case, rank)
