"""distributed() across real processes over gloo, against one process on the global batch."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from helpers import (
    CLASSES,
    IN,
    assert_states_equal,
    build_distributed,
    case_state,
    classify,
    classify_acc,
    counting_allreduce,
    global_batch,
    make_batch,
    make_state,
    shard,
    syncs_per_update,
    train_distributed,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from processes import Pool
from torch import nn

import composetrain as ct


@pytest.fixture(scope="module", params=[2, 3], ids=["2 ranks", "3 ranks"])
def pool(request):
    p = Pool(request.param)
    yield p
    p.close()


def run(pool, **case):
    case.setdefault("seed", 0)
    return pool.run(__name__, "run_case", case), train_distributed(case, rank=None)


def assert_matches_reference(results, reference, rtol=1e-10, atol=1e-12):
    for r in results:  # every rank holds the same parameters: rank 0's initial ones, trained identically
        for p, q in zip(r["params"], results[0]["params"], strict=True):
            assert torch.equal(p, q)
        assert r["step"] == reference["step"] and r["lr"] == reference["lr"]
    for p, q in zip(results[0]["params"], reference["params"], strict=True):
        torch.testing.assert_close(p, q, rtol=rtol, atol=atol)
    for i, ref_loss in enumerate(reference["losses"]):  # averaging out.loss over ranks gives the global mean
        mean = torch.stack([r["losses"][i] for r in results]).mean()
        torch.testing.assert_close(mean, ref_loss, rtol=rtol, atol=atol)


rank_sizes = st.integers(1, 9)


@settings(max_examples=12)
@given(
    data=st.data(),
    composition=st.sampled_from(
        [
            "distributed(accumulate(n)(step))",
            "accumulate(n)(distributed(step))",
            "distributed(clip_grad_norm(0.5)(accumulate(n)(step)))",
            "accumulate(n)(distributed(clip_grad_norm(0.5)(step)))",
        ]
    ),
    n=st.integers(1, 4),
    seed=st.integers(0, 999),
)
def test_distributed_accumulate_is_one_process_on_the_global_batch(pool, data, composition, n, seed):
    """float64, momentum SGD, a scheduler, 3 updates; ranks may hold different numbers of samples."""
    sizes = [data.draw(st.lists(rank_sizes, min_size=pool.world, max_size=pool.world)) for _ in range(3)]
    results, reference = run(pool, composition=composition, n=n, kind="classify", sizes=sizes, seed=seed)
    assert_matches_reference(results, reference)


@settings(max_examples=8)
@given(
    composition=st.sampled_from(["distributed(accumulate(n)(step))", "accumulate(n)(distributed(step))"]),
    n=st.integers(1, 3),
    seed=st.integers(0, 999),
)
def test_token_weighted_normalisation_is_global_across_ranks(pool, composition, n, seed):
    """Odd ranks hold sequences up to 9 tokens long, even ranks up to 3: the loss is still the
    mean over every real token of the global batch, not a mean of per-rank means."""
    sizes = [[4] * pool.world] * 3
    results, reference = run(pool, composition=composition, n=n, kind="tokens", sizes=sizes, seed=seed)
    assert_matches_reference(results, reference)


def test_ranks_with_very_different_batches_never_hang(pool):
    """One rank's batch is smaller than n: it runs fewer micro-batches, and still syncs once."""
    sizes = [[3] + [8] * (pool.world - 1), [1] + [5] * (pool.world - 1)]
    results, reference = run(pool, composition="distributed(accumulate(n)(step))", n=4, kind="classify", sizes=sizes)
    assert_matches_reference(results, reference)


@settings(max_examples=10)
@given(
    data=st.data(),
    composition=st.sampled_from(
        [
            "distributed(accumulate(micro_batch=n)(step))",
            "accumulate(micro_batch=n)(distributed(step))",
            "distributed(clip_grad_norm(0.5)(accumulate(micro_batch=n)(step)))",
        ]
    ),
    kind=st.sampled_from(["classify", "tokens"]),
    m=st.integers(1, 4),
    seed=st.integers(0, 999),
)
def test_micro_batch_size_follows_each_ranks_batch(pool, data, composition, kind, m, seed):
    """accumulate(micro_batch=m): ranks holding different numbers of samples run different numbers of micro-batches
    (the last one short), one gradient sync each, and the update is one process's on the global batch, token-weighted
    ones included."""
    sizes = [
        [s + 2 * r for r, s in enumerate(data.draw(st.lists(rank_sizes, min_size=pool.world, max_size=pool.world)))]
        for _ in range(3)
    ]
    results, reference = run(pool, composition=composition, n=m, kind=kind, sizes=sizes, seed=seed)
    assert_matches_reference(results, reference)


MP_ORDERS = [  # every nesting of distributed, mixed_precision and accumulate
    "".join(p + "(" for p in order) + "step" + ")" * 3
    for order in itertools.permutations(("distributed", "mixed_precision(dtype='bf16')", "accumulate(n)"))
]


def test_mixed_precision_in_every_order_agrees_and_tracks_one_process(pool):
    sizes = [[6] * pool.world] * 3
    runs = {c: run(pool, composition=c, n=2, kind="classify", sizes=sizes) for c in MP_ORDERS}
    first = runs[MP_ORDERS[0]][0]
    for results, _ in runs.values():  # every order: bit for bit the same on every rank
        for r, f in zip(results, first, strict=True):
            assert all(torch.equal(p, q) for p, q in zip(r["params"], f["params"], strict=True))
    # against one process on the global batch, in bf16: micro-batch boundaries differ, so rounding does
    _, reference = runs[MP_ORDERS[0]]
    for p, q in zip(first[0]["params"], reference["params"], strict=True):
        torch.testing.assert_close(p, q, rtol=2e-2, atol=2e-3)


def test_a_released_ddp_wrapper_is_rebuilt_and_training_continues_exactly(pool):
    sizes = [[3 + r for r in range(pool.world)]] * 4
    for release_after in (0, 2):
        results, reference = run(
            pool,
            composition="distributed(accumulate(n)(step))",
            n=2,
            kind="classify",
            sizes=sizes,
            release_after=release_after,
        )
        assert_matches_reference(results, reference)


def test_a_new_default_group_gets_a_new_ddp_wrapper(pool):
    """The wrapper of a destroyed group is never reused: training goes on, exactly, in the new one."""
    sizes = [[3 + r for r in range(pool.world)]] * 3
    results, reference = run(
        pool, composition="distributed(accumulate(n)(step))", n=2, kind="classify", sizes=sizes, regroup_after=0
    )
    assert_matches_reference(results, reference)


def test_one_gradient_sync_per_update_whatever_n(pool):
    """A counting DDP communication hook; buckets of one parameter each (4 of them) once DDP has
    rebuilt its buckets after its first iteration."""
    one_backward = pool.run(__name__, "count_syncs", 1, 3)
    assert one_backward == [[1, 4, 4]] * pool.world
    for n in (2, 4):
        assert pool.run(__name__, "count_syncs", n, 3) == one_backward, n
    # the loop that forgets no_sync pays one sync per micro-batch
    assert pool.run(__name__, "syncs_without_no_sync", 4) == [16] * pool.world


def test_ranks_agree_on_the_fewest_updates_so_uneven_data_cannot_hang(pool):
    assert pool.run(__name__, "fewest") == [10] * pool.world
    with ct.rendezvous(env={}) as alone:
        assert alone.fewest(7) == 7


def test_world_size_one_is_the_plain_step_bit_for_bit():
    a, b = make_state(0), make_state(0)
    for i in range(3):
        ct.distributed(ct.accumulate(2)(classify))(a, make_batch(8, seed=i))
        ct.accumulate(2)(classify)(b, make_batch(8, seed=i))
    assert_states_equal(a, b)


def test_a_launched_job_without_a_process_group_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(RuntimeError) as caught:  # says what the launch is missing
        ct.distributed(classify)(make_state(), make_batch(4))
    assert str(caught.value) == (
        "distributed(classify): WORLD_SIZE=2 is set but RANK is not: launch with torchrun, or set RANK, LOCAL_RANK, "
        "MASTER_ADDR, MASTER_PORT, and call ct.rendezvous() first (ct.run does it for you)"
    )
    monkeypatch.setenv("RANK", "0")
    expected = r"distributed\(classify\): WORLD_SIZE=2 is set but no process group is initialised: call ct.rendezvous"
    with pytest.raises(RuntimeError, match=expected):
        ct.distributed(classify)(make_state(), make_batch(4))


def test_options_are_checked_and_shown():
    with pytest.raises(TypeError, match=r"distributed: find_unused_parameters must be True or False, got 1 \(int\)"):
        ct.distributed(find_unused_parameters=1)
    with pytest.raises(ValueError, match=r"distributed: bucket_cap_mb must be a positive, finite number, got 0"):
        ct.distributed(bucket_cap_mb=0)
    with pytest.raises(TypeError, match="comm_hook must be a DDP communication hook"):
        ct.distributed(comm_hook="fp16")
    with pytest.raises(ValueError, match="already applies distributed; use distributed once"):
        ct.distributed(ct.accumulate(2)(ct.distributed(classify)))
    assert repr(ct.distributed(find_unused_parameters=True)(classify)) == (
        "distributed(find_unused_parameters=True)(classify)"
    )
    assert repr(ct.distributed(ct.mixed_precision(ct.accumulate(16)(classify)))) == (
        "distributed(mixed_precision(accumulate(16)(classify)))"
    )


def test_static_graph_with_micro_batches_is_refused_before_any_change_and_works_without_them(pool):
    """DDP's static_graph cannot skip the sync of accumulate's non-final micro-batches (no_sync): torch failed at
    the first update with "expect_autograd_hooks_ INTERNAL ASSERT FAILED" (found by the a-compile adversary). It is
    refused before the first forward, naming the fix; with one micro-batch static_graph trains as before."""
    for r in pool.run(__name__, "static_graph_updates", 2):
        assert r["said"] is not None and "static_graph=True" in r["said"] and "accumulate" in r["said"], r["said"]
        assert r["step"] == 0 and r["unchanged"]
    first, *others = pool.run(__name__, "static_graph_updates", 1)
    assert first["said"] is None and first["step"] == 2
    for other in others:
        assert all(torch.equal(p, q) for p, q in zip(first["params"], other["params"], strict=True))


@pytest.mark.parametrize("fault", ["metric", "metric-last-piece", "ema-buffer"])
def test_a_refusal_on_one_rank_is_a_refusal_on_every_rank(pool, fault):
    # rank 0 alone refuses its second update after the passes: had the others applied it, their models would
    # part from rank 0's silently, and train on apart
    results = pool.run(__name__, "refuse_on_one_rank", fault)
    expected = {
        "metric": "a transform reports as well",
        "metric-last-piece": "for piece 2 but",
        "ema-buffer": "ema: the",
    }
    assert len(results[0]["errors"]) == 1 and expected[fault] in results[0]["errors"][0], results[0]["errors"]
    for r in results[1:]:
        assert len(r["errors"]) == 1 and "another process refused this update" in r["errors"][0], r["errors"]
    for r in results:
        assert r["step"] == 2
        for p, q in zip(r["params"], results[0]["params"], strict=True):
            assert torch.equal(p, q)
        for k, t in results[0]["ema"].items():
            if "running" not in k and "num_batches" not in k:  # each rank's own buffers (README)
                assert torch.equal(r["ema"][k], t), k


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# The distributed cases' rank functions (the cases themselves: helpers.train_distributed).


def run_case(rank: int, world: int, case: dict[str, Any]) -> dict[str, Any]:
    return train_distributed(case, rank)


def count_syncs(rank: int, world: int, n: int, updates: int) -> list[int]:
    """All-reduces per update through a counting DDP communication hook, one bucket per parameter.

    DDP reduces its first iteration in one bucket and rebuilds its buckets after it, so
    the first update counts 1 whatever the parameters."""

    calls, counting = counting_allreduce()
    state = case_state("classify", 0, torch.float64)
    step = build_distributed("distributed(accumulate(n)(step))", n, "classify", bucket_cap_mb=1e-6, comm_hook=counting)
    return syncs_per_update(step, state, calls, rank, world, updates)


def syncs_without_no_sync(rank: int, world: int, n: int) -> int:
    """What a loop that forgets no_sync pays: a gradient all-reduce after every micro-batch."""
    from torch.nn.parallel import DistributedDataParallel

    calls, counting = counting_allreduce()
    state = case_state("classify", 0, torch.float64)
    ddp = DistributedDataParallel(state.model, bucket_cap_mb=1e-6)
    ddp.register_comm_hook(None, counting)
    x, y = shard(global_batch("classify", [8] * world, 0, torch.float64), [8] * world, rank)
    F.cross_entropy(ddp(x), y).backward()  # DDP's first iteration, after which it rebuilds its buckets
    del calls[:]
    for xb, yb in zip(x.tensor_split(n), y.tensor_split(n), strict=True):
        (F.cross_entropy(ddp(xb), yb) / n).backward()
    dist.barrier()
    return len(calls)


def fewest(rank: int, world: int) -> int:
    """Each rank offers a different count; all agree on the smallest."""
    proc = ct.rendezvous(rank=rank, world_size=world)  # the pool's group: reused, not re-created
    return proc.fewest(10 + 3 * rank)


def static_graph_updates(rank: int, world: int, n: int) -> dict[str, Any]:
    """Two updates of distributed(static_graph=True)(accumulate(n)(classify_acc)): what it said, or the parameters."""
    state = case_state("classify", 0, torch.float64)
    before = [p.detach().clone() for p in state.model.parameters()]
    batch = shard(global_batch("classify", [4] * world, 1, torch.float64), [4] * world, rank)
    train = ct.distributed(static_graph=True)(ct.accumulate(n)(classify_acc))
    try:
        for _ in range(2):
            train(state, batch)
    except (ValueError, RuntimeError) as e:
        unchanged = all(torch.equal(p, q) for p, q in zip(before, state.model.parameters(), strict=True))
        return {"said": str(e), "step": state.step, "unchanged": unchanged}
    return {"said": None, "step": state.step, "params": [p.detach().clone() for p in state.model.parameters()]}


def refuse_on_one_rank(rank: int, world: int, fault: str) -> dict[str, Any]:
    """Three updates; in the second, rank 0 alone refuses after its passes (``fault``: a metric name a transform
    reports, or a buffer re-registered in another dtype, which ct.ema refuses). Every rank must refuse it with
    rank 0, so that all train on alike."""
    state = case_state("classify", rank, torch.float64)
    state.model.append(
        nn.BatchNorm1d(CLASSES, dtype=torch.float64)
    )  # a buffer the forward changes, one ct.ema averages
    faulty = {"on": False, "pieces": 0}

    def step(model: nn.Module, batch: Any) -> Any:
        loss, metrics = classify_acc(model, batch)
        faulty["pieces"] += 1
        # the metric clash in every micro-batch, the other faults in the last only: an error in an earlier one's
        # forward would leave the others waiting in the last backward's gradient all-reduce (DDP cannot leave it)
        if faulty["on"] and rank == 0 and (fault == "metric" or faulty["pieces"] % 2 == 0):
            if fault == "metric":  # refused after the passes: in verify
                metrics = {**metrics, "grad_norm": loss.detach()}
            elif fault == "metric-last-piece":  # refused in the passes, after the last backward's all-reduce
                metrics = {**metrics, "late": loss.detach()}
            else:
                norm = model.module[-1]  # the DDP wrapper's module
                norm.running_mean = norm.running_mean.float()
        return loss, metrics

    train = ct.ema(0.9)(ct.distributed(ct.clip_grad_norm(0.5)(ct.accumulate(2)(step))))
    train.setup(state)
    errors = []
    for i in range(3):
        g = torch.Generator().manual_seed(10 * i + rank)
        batch = (torch.randn(6, IN, generator=g, dtype=torch.float64), torch.randint(0, CLASSES, (6,), generator=g))
        faulty["on"] = i == 1
        try:
            train(state, batch)
        except (ValueError, RuntimeError) as e:
            errors.append(str(e))
    return {
        "errors": errors,
        "step": state.step,
        "params": [p.detach().clone() for p in state.model.parameters()],
        "ema": {k: t.clone() for k, t in ct.ema_model(state).state_dict().items()},
    }
