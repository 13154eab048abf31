"""accumulate("auto"): out-of-memory errors injected by the step, exactness, memory of the size, ranks agreeing."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    assert_states_close,
    assert_states_equal,
    assert_untouched,
    case_state,
    classify,
    composed,
    counting_allreduce,
    global_batch,
    make_batch,
    make_state,
    shard,
    snapshot,
    syncs_per_update,
    without,
)
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import composetrain as ct

UPDATES = 3


def limited(limit, seen=None, *, error=None, late=False):
    """The classification step of tests/helpers.py, out of memory above ``limit`` samples (``late``: after the
    forward, which has drawn dropout masks and updated running statistics by then)."""
    from helpers import classify, get_xy

    def step(model, batch):
        size = get_xy(batch)[0].shape[0]
        if seen is not None:
            seen.append(size)
        out = classify(model, batch) if late else None
        if limit is not None and size > limit:
            raise error or torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} GiB")
        return out or classify(model, batch)

    return step


def final_n(size, limit):
    """The micro-batch count auto settles on: halving the largest micro-batch until it fits."""
    largest, n = size, 1
    while largest > limit:
        largest = math.ceil(largest / 2)
        n = math.ceil(size / largest)
    return n


@given(
    size=st.integers(1, 24),
    limit=st.integers(1, 24),
    optimizer=st.sampled_from(["sgd", "adamw"]),
    outer=st.sampled_from(["", "clip", "checkpoint"]),
    seed=st.integers(0, 999),
)
def test_the_update_is_the_whole_batch_update_whatever_n(size, limit, optimizer, outer, seed):
    """float64, 3 updates: equal to train_step on the whole batch, bit for bit equal to accumulate(n) with the
    n it settled on; one update per call; a size that failed is never tried again."""
    extra = {"": [], "clip": [ct.clip_grad_norm(0.5)], "checkpoint": [ct.checkpoint_activations("0")]}[outer]
    batches = [make_batch(size, seed=seed + i) for i in range(UPDATES)]
    seen = []
    auto, plain, split = make_state(seed, optimizer=optimizer), make_state(seed, optimizer=optimizer), None
    train = ct.compose(*extra, ct.accumulate("auto"))(limited(limit, seen))
    outs = [train(auto, b) for b in batches]
    n = final_n(size, limit)
    split = make_state(seed, optimizer=optimizer)
    for b in batches:
        ct.compose(*extra)(limited(None))(plain, b)
        ct.compose(*extra, ct.accumulate(n))(limited(None))(split, b)
    assert_states_close(auto, plain)
    assert_states_equal(auto, split)
    assert auto.step == UPDATES
    micro = math.ceil(size / n)
    assert [float(o.metrics["micro_batch"]) for o in outs] == [micro] * UPDATES
    assert sum(s > limit for s in seen) == (0 if size <= limit else len(set(s for s in seen if s > limit)))
    assert seen[-n * (UPDATES - 1) :] == [len(m) for m in torch.arange(size).tensor_split(n)] * (UPDATES - 1)


def test_nothing_of_a_failed_attempt_survives():
    """Dropout masks, BatchNorm statistics and gradients from before the call: after an out-of-memory retry they
    are exactly as if the final split had been chosen from the start."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Dropout(0.4), nn.Linear(8, 3)).double()

    def fresh():
        m = type(model)(*[__import__("copy").deepcopy(layer) for layer in model])
        opt = torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        for p in m.parameters():  # gradients present before the call are added into its update
            p.grad = torch.full_like(p, 0.01)
        return ct.TrainState(m, opt)

    batch = make_batch(12)
    results = []
    for train in (ct.accumulate("auto")(limited(3, late=True)), ct.accumulate(4)(limited(None))):
        state = fresh()
        torch.manual_seed(1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # accumulate's BatchNorm warning
            train(state, batch)
        results.append((state, torch.get_rng_state()))
    (auto, rng_auto), (split, rng_split) = results
    for (k, v), w in zip(auto.model.state_dict().items(), split.model.state_dict().values(), strict=True):
        assert torch.equal(v, w), k
    assert torch.equal(rng_auto, rng_split)


def test_fp16_loss_scaling_and_clipping_see_one_clean_update():
    """The loss scale, the scaler's growth tracker and the clipped update are those of accumulate(n)."""
    batch = make_batch(16, dtype=torch.float32)
    states = []
    for inner, limit in ((ct.accumulate("auto"), 4), (ct.accumulate(4), None)):
        torch.manual_seed(0)
        state = make_state(0, model=nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3)))
        train = ct.compose(ct.clip_grad_norm(0.1), ct.mixed_precision(dtype="fp16"), inner)(limited(limit))
        for _ in range(3):
            out = train(state, batch)
        states.append((state, out))
    (auto, out_auto), (split, out_split) = states
    assert_states_equal(auto, split)
    assert auto.state_dict()["transforms"]["mixed_precision"] == split.state_dict()["transforms"]["mixed_precision"]
    assert torch.equal(out_auto.metrics["grad_norm"], out_split.metrics["grad_norm"])


def test_a_single_sample_that_does_not_fit_is_a_clear_error_and_changes_nothing():
    state = make_state()
    train = ct.accumulate("auto")(limited(2))
    train(state, make_batch(8))  # learns micro-batches of 2
    before = snapshot(state)
    with pytest.raises(torch.OutOfMemoryError) as caught:
        ct.accumulate("auto")(limited(0))(state, make_batch(8))
    assert str(caught.value) == (
        "accumulate('auto')(step): one sample per micro-batch does not fit in memory here (OutOfMemoryError: CUDA "
        "out of memory. Tried to allocate 1 GiB); nothing was applied. Make the model's activations smaller "
        "(checkpoint_activations, mixed_precision), shorten the samples, or train on a device with more memory"
    )
    assert_untouched(state, before)
    assert state.state_dict()["transforms"]["accumulate_auto"] == {"micro_batch": 2}


def test_other_errors_pass_through_and_forget_the_sizes_of_their_call():
    state = make_state()
    calls = []

    def step(model, batch):
        calls.append(batch[0].shape[0])
        if len(calls) == 1:
            raise torch.OutOfMemoryError("out of memory")
        raise KeyError("a bug in the step")

    before = snapshot(state)
    with pytest.raises(KeyError, match="a bug in the step"):
        ct.accumulate("auto")(step)(state, make_batch(8))
    assert calls == [8, 4]
    assert_untouched(state, before)
    assert state.state_dict()["transforms"]["accumulate_auto"] == {"micro_batch": None}


def test_allocator_errors_of_other_devices_count_as_out_of_memory():
    for error in (
        RuntimeError("MPS backend out of memory"),
        RuntimeError("DefaultCPUAllocator: can't allocate memory"),
    ):
        state = make_state()
        out = ct.accumulate("auto")(limited(3, error=error))(state, make_batch(12))
        assert float(out.metrics["micro_batch"]) == 3 and state.step == 1


def test_the_size_is_checkpointed_and_resumed_without_retrying():
    seen = []
    state = make_state()
    ct.accumulate("auto")(limited(5, seen))(state, make_batch(20))
    assert seen == [20, 10, 5, 5, 5, 5]
    saved = state.state_dict()
    assert saved["transforms"]["accumulate_auto"] == {"micro_batch": 5}
    resumed = make_state()
    resumed.load_state_dict(saved)
    del seen[:]
    out = ct.accumulate("auto")(limited(5, seen))(resumed, make_batch(20, seed=1))
    assert seen == [5, 5, 5, 5] and float(out.metrics["micro_batch"]) == 5
    del seen[:]  # a larger batch later: as many micro-batches as keep them within the size that fits
    ct.accumulate("auto")(limited(5, seen))(resumed, make_batch(23, seed=2))
    assert seen == [5, 5, 5, 4, 4]
    bad = resumed.state_dict()
    bad["transforms"]["accumulate_auto"] = {"micro_batch": 0}
    fresh = make_state()
    fresh.load_state_dict(bad)
    with pytest.raises(ValueError, match="micro-batch size must be a positive int or None"):
        ct.accumulate("auto")(limited(None))(fresh, make_batch(4))


def test_orders_that_cannot_be_made_safe_are_refused_when_built():
    step = limited(None)
    with pytest.raises(ValueError, match=r"use mixed_precision\(accumulate\('auto'\)\(step\)\)"):
        ct.accumulate("auto")(ct.mixed_precision(step))
    with pytest.raises(ValueError, match=r"put accumulate\('auto'\) outside"):
        ct.accumulate(2)(ct.accumulate("auto")(step))
    with pytest.raises(ValueError, match=r"distributed\(accumulate\('auto'\)\(step\)\)"):
        ct.data_parallel(["cpu", "cpu"])(ct.accumulate("auto")(step))
    with pytest.raises(ValueError, match=r"distributed\(accumulate\('auto'\)\(step\)\)"):
        ct.accumulate("auto")(ct.data_parallel(["cpu", "cpu"])(step))
    with pytest.raises(ValueError, match="use accumulate_auto once"):
        ct.accumulate("auto")(ct.accumulate("auto")(step))
    with pytest.raises(TypeError, match=r"n must be a positive int, got 'big' \(str\).*or accumulate\('auto'\)"):
        ct.accumulate("big")
    assert repr(ct.accumulate("auto")(ct.accumulate(2)(step))) == "accumulate('auto')(accumulate(2)(step))"
    assert ct.accumulate("auto")(step) == ct.accumulate("auto")(step) != ct.accumulate(1)(step)


def test_token_weights_stay_exact_under_retries():
    pad = -100

    def tokens(model, batch):
        if batch["labels"].shape[0] > 3:
            raise torch.OutOfMemoryError("out of memory")
        logits = model(batch["x"])
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=pad)

    def real(batch):
        return (batch["labels"] != pad).sum()

    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (10, 6), generator=g)
    labels[torch.rand(10, 6, generator=g) < 0.4] = pad
    batch = {"x": torch.randn(10, 6, 5, generator=g, dtype=torch.float64), "labels": labels}
    a, b = make_state(), make_state()
    ct.accumulate("auto", weight=real)(tokens)(a, batch)
    big = {"x": batch["x"], "labels": batch["labels"]}
    ct.train_step(lambda m, bt: F.cross_entropy(m(bt["x"]).flatten(0, 1), bt["labels"].flatten(), ignore_index=pad))(
        b, big
    )
    assert_states_close(a, b)


# -- two gloo ranks, one of which runs out of memory ---------------------------------------------------
def assert_ranks_match_reference(results, reference):
    for r in results:
        assert all(torch.equal(p, q) for p, q in zip(r["params"], results[0]["params"], strict=True))
        assert r["step"] == reference["step"] and r["micro"] == results[0]["micro"]
    for p, q in zip(results[0]["params"], reference["params"], strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)
    for i, ref in enumerate(reference["losses"]):
        torch.testing.assert_close(torch.stack([r["losses"][i] for r in results]).mean(), ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize(
    "composition",
    [
        "distributed(accumulate('auto')(step))",
        "accumulate('auto')(distributed(step))",
        "clip_grad_norm(0.5)(distributed(accumulate('auto')(step)))",
        "distributed(checkpoint_activations('0')(accumulate('auto')(step)))",
    ],
)
def test_an_oom_on_one_rank_only_is_agreed_by_all_without_hanging(pool, composition):
    """Rank 1 runs out of memory above 3 samples, rank 0 never: both adopt micro-batches of 3, in one agreement
    per attempt, and the updates equal one process on the global batch (a hang fails the pool's timeout)."""
    case = {"composition": composition, "limits": [None, 3], "sizes": [[10, 10], [10, 10], [7, 7]], "seed": 3}
    results = pool.run(__name__, "run_auto", case, timeout=60)
    reference = train_auto(None, 2, case)
    assert_ranks_match_reference(results, reference)
    assert results[0]["micro"] == [3.0, 3.0, 3.0] == results[1]["micro"]
    assert results[0]["saved"] == {"micro_batch": 3} == results[1]["saved"]
    # rank 0 fits everything, but follows rank 1's sizes; rank 1 stops each failed attempt at its first micro-batch
    assert results[0]["seen"] == [10, 5, 5, 3, 3, 2, 2, 3, 3, 2, 2, 3, 2, 2]
    assert results[1]["seen"] == [10, 5, 3, 3, 2, 2, 3, 3, 2, 2, 3, 2, 2]


def test_a_hopeless_rank_fails_every_rank_cleanly(pool):
    results = pool.run(__name__, "hopeless", timeout=60)
    for rank, r in enumerate(results):
        where = "here (OutOfMemoryError" if rank == 1 else "on another process"
        assert where in r["error"] and r["untouched"] and all(g is None for g in r["grads"])
        assert r["step"] == 1  # and the next update worked on both
    assert all(torch.equal(p, q) for p, q in zip(results[0]["after"], results[1]["after"], strict=True))


def test_one_gradient_sync_per_update_also_with_retries(pool):
    """Counted by a DDP communication hook with one bucket per parameter: the same as distributed(accumulate(n))."""
    assert pool.run(__name__, "count_syncs_auto", [None, None], 3) == [[1, 4, 4]] * 2
    assert pool.run(__name__, "count_syncs_auto", [None, 2], 3) == [[1, 4, 4]] * 2


@pytest.mark.parametrize(
    "composition",
    [
        "distributed(checkpoint_activations('0')(accumulate(2)(step)))",
        "checkpoint_activations('0')(distributed(accumulate(2)(step)))",
        "distributed(accumulate(2)(checkpoint_activations('0')(step)))",
    ],
)
def test_checkpoint_activations_under_distributed_is_bit_identical(pool, composition):
    with_k = pool.run(__name__, "checkpointed", composition, 5, timeout=60)
    plain = without(composition, "checkpoint_activations('0')")
    without_k = pool.run(__name__, "checkpointed", plain, 5, timeout=60)
    for a, b in zip(with_k, without_k, strict=True):
        assert all(torch.equal(p, q) for p, q in zip(a, b, strict=True))


# -- a real out-of-memory error ------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_real_cuda_oom_under_a_memory_cap_is_retried():
    """A model whose whole-batch activations exceed a cap of the GPU's memory: auto settles on a micro-batch
    that fits, and the update equals train_step's on the whole batch (float32, computed without the cap)."""
    device = torch.device("cuda", torch.cuda.current_device())  # the memory cap wants an index
    total = torch.cuda.get_device_properties(device).total_memory
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(1024, 8192), nn.ReLU(), nn.Linear(8192, 10)).to(device)
    reference = __import__("copy").deepcopy(model)
    batch = (torch.randn(8192, 1024, device=device), torch.randint(0, 10, (8192,), device=device))

    def step(m, b):
        return F.cross_entropy(m(b[0]), b[1])

    ref_state = ct.TrainState(reference, torch.optim.SGD(reference.parameters(), lr=0.1))
    ct.train_step(step)(ref_state, batch)
    torch.cuda.empty_cache()
    cap = (torch.cuda.memory_allocated(device) + 256 * 2**20) / total  # ~256 MiB above what is held now
    torch.cuda.set_per_process_memory_fraction(cap, device)
    try:
        state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
        out = ct.accumulate("auto")(step)(state, batch)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    assert float(out.metrics["micro_batch"]) < 8192 and state.step == 1
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_auto_and_sharded_are_refused_together_in_either_order():
    """An out-of-memory retry under FSDP2 would need an agreement sharded does not arrange yet."""
    with pytest.raises(ValueError, match=r"cannot wrap a step that applies accumulate_auto: an out-of-memory retry"):
        ct.sharded(ct.accumulate("auto")(classify))
    with pytest.raises(ValueError, match=r"cannot wrap a step that applies sharded: an out-of-memory retry"):
        ct.accumulate("auto")(ct.sharded(classify))


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# accumulate("auto") and checkpoint_activations on every rank, with references. Out-of-memory errors are injected:
# the step raises torch.OutOfMemoryError when its micro-batch holds more samples than this rank's limit, so one rank
# can fail alone.


def limited_on_ranks(limit: int | None, seen: list[int] | None = None):
    """A classification step that runs out of memory above ``limit`` samples (and records the sizes it got)."""

    def step(model, batch):
        x, y = batch
        if seen is not None:
            seen.append(x.shape[0])
        if limit is not None and x.shape[0] > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected above {limit} samples)")
        logits = model(x)
        return F.cross_entropy(logits, y), {"acc": (logits.argmax(-1) == y).to(logits.dtype).mean()}

    return step


def build(printed: str, step, **distributed_options: Any) -> ct.TrainStep:
    """The composition ``printed`` (as the step prints: ``"distributed(accumulate('auto')(step))"``)."""
    parts = {
        "distributed": ct.distributed(**distributed_options),
        "mixed_precision(dtype='bf16')": ct.mixed_precision(dtype="bf16"),
        "accumulate('auto')": ct.accumulate("auto"),
        "clip_grad_norm(0.5)": ct.clip_grad_norm(0.5),
        "checkpoint_activations('0')": ct.checkpoint_activations("0"),
        "accumulate(2)": ct.accumulate(2),
    }
    return composed(printed, parts, step)


def train_auto(rank: int | None, world: int, case: dict[str, Any]) -> dict[str, Any]:
    """The case's updates; rank None runs the reference: the composition without distributed,
    accumulate('auto') and the limits,
    in one process on the global batches."""
    dtype = torch.float32 if "mixed_precision" in case["composition"] else torch.float64
    printed = case["composition"]
    if rank is None:
        printed = without(printed, "distributed", "accumulate('auto')")
    state = case_state("classify", case["seed"] + (rank or 0), dtype)
    seen: list[int] = []
    limit = case["limits"][rank] if rank is not None else None
    step = build(printed, limited_on_ranks(limit, seen), **case.get("options", {}))
    losses, micro = [], []
    for i, sizes in enumerate(case["sizes"]):
        batch = global_batch("classify", sizes, case["seed"] * 100 + i, dtype)
        out = step(state, batch if rank is None else shard(batch, sizes, rank))
        losses.append(out.loss)
        micro.append(out.metrics.get("micro_batch"))
    return {
        "params": [p.detach().clone() for p in state.model.parameters()],
        "losses": losses,
        "micro": micro,
        "seen": seen,
        "step": state.step,
        "saved": state.state_dict()["transforms"].get("accumulate_auto"),
    }


def run_auto(rank: int, world: int, case: dict[str, Any]) -> dict[str, Any]:
    return train_auto(rank, world, case)


def hopeless(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 cannot fit one sample: every rank raises, with its state untouched, and the ranks stay usable."""
    state = case_state("classify", 0, torch.float64)
    before = [p.detach().clone() for p in state.model.parameters()]
    step = build("distributed(accumulate('auto')(step))", limited_on_ranks(0 if rank == 1 else None))
    batch = shard(global_batch("classify", [4] * world, 0, torch.float64), [4] * world, rank)
    try:
        step(state, batch)
        error = None
    except torch.OutOfMemoryError as caught:
        error = str(caught)
    untouched = all(torch.equal(p, q) for p, q in zip(state.model.parameters(), before, strict=True))
    grads = [p.grad for p in state.model.parameters()]
    # the ranks are still in step: a normal update afterwards works and agrees
    build("distributed(accumulate('auto')(step))", limited_on_ranks(None))(state, batch)
    after = [p.detach().clone() for p in state.model.parameters()]
    return {"error": error, "untouched": untouched, "grads": grads, "after": after, "step": state.step}


def count_syncs_auto(rank: int, world: int, limits: list[int], updates: int) -> list[int]:
    """Gradient all-reduces per update through a counting DDP communication hook, one bucket per parameter."""

    calls, counting = counting_allreduce()
    state = case_state("classify", 0, torch.float64)
    step = build(
        "distributed(accumulate('auto')(step))", limited_on_ranks(limits[rank]), bucket_cap_mb=1e-6, comm_hook=counting
    )
    return syncs_per_update(step, state, calls, rank, world, updates)


def checkpointed(rank: int, world: int, printed: str, seed: int) -> list[torch.Tensor]:
    """A dropout model trained by the composition ``printed`` (with or without checkpoint_activations),
    three updates: final parameters."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Sequential(nn.Linear(5, 8), nn.Dropout(0.3), nn.Tanh()), nn.Linear(8, 3)).double()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = ct.TrainState(model, opt)
    step = build(printed, limited_on_ranks(None))
    torch.manual_seed(100 + rank)  # distinct dropout per rank, the same with and without checkpointing
    for i in range(3):
        step(state, shard(global_batch("classify", [6] * world, i, torch.float64), [6] * world, rank))
    return [p.detach().clone() for p in model.parameters()]
