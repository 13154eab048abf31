"""mixed_precision under every default dtype (torch.set_default_dtype), against the plain autocast/GradScaler loop.

Scientific code and exactness tests set ``torch.set_default_dtype(torch.float64)``; a constant the transforms
create without an explicit dtype then lands in float64 (or float16...), and a fused AMP kernel refuses it
(PITFALLS 30). Every precision, with accumulate and clip_grad_norm, must still give the hand-written loop's
update, bit for bit.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from helpers import case_state, classify_acc, global_batch, make_batch, shard
from processes import Pool
from torch import nn

import composetrain as ct
from composetrain.transforms._scaling import LossScaling


def settable(dtype):
    """Whether this torch lets ``dtype`` be the default (float16 and bfloat16 only in newer releases)."""
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
    except (TypeError, RuntimeError):
        return False
    torch.set_default_dtype(previous)
    return True


DEFAULTS = [d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16) if settable(d)]
LOW = {"bf16": torch.bfloat16, "fp16": torch.float16, "auto": torch.bfloat16, "fp32": None}  # auto: bf16 on a CPU


@contextlib.contextmanager
def default_dtype(dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def classify(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def state_of(param_dtype, seed=0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).to(param_dtype)
    return ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3))


def hand_written(state, scaler, batch, low, n, clip):
    """The PyTorch AMP recipe: autocast forward and scaled backward per micro-batch, unscale_ once after the
    last, clip, step, update. ``low`` None: plain fp32. bf16 needs no scaler."""
    size = batch[0].shape[0]
    for x, y in zip(*(t.tensor_split(n) for t in batch), strict=True):
        with torch.autocast("cpu", dtype=low) if low is not None else contextlib.nullcontext():
            loss = classify(state.model, (x, y))
        loss = loss * (x.shape[0] / size) if n > 1 else loss
        (scaler.scale(loss) if scaler is not None else loss).backward()
    if scaler is not None:
        scaler.unscale_(state.optimizer)
    if clip:
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), 0.5)
    if scaler is not None:
        scaler.step(state.optimizer)
        scaler.update()
    else:
        state.optimizer.step()
    state.optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("default", DEFAULTS, ids=str)
@pytest.mark.parametrize("precision", list(LOW))
@pytest.mark.parametrize(("n", "clip"), [(1, False), (3, True)])
def test_every_precision_under_every_default_dtype_is_the_hand_written_loop(default, precision, n, clip):
    low = LOW[precision]
    batches = [make_batch(12, seed=i, dtype=torch.float32) for i in range(3)]
    with default_dtype(default):
        ours, theirs = state_of(torch.float32), state_of(torch.float32)
        train = ct.mixed_precision(dtype=precision)(ct.accumulate(n)(classify))
        if clip:
            train = ct.clip_grad_norm(0.5)(train)
        scaler = torch.amp.GradScaler("cpu") if low is torch.float16 else None
        for batch in batches:
            out = train(ours, batch)
            hand_written(theirs, scaler, batch, low, n, clip)
            assert out.skipped is False
        for p, q in zip(ours.model.parameters(), theirs.model.parameters(), strict=True):
            assert p.dtype is torch.float32
            torch.testing.assert_close(p, q, rtol=0, atol=0)
        if scaler is not None:
            saved = ours.state_dict()["transforms"]["mixed_precision"]["scaler"]
            assert saved["scale"] == scaler.get_scale() and saved["_growth_tracker"] == 3


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_a_float64_model_under_a_float64_default_trains_in_mixed_precision(precision):
    """Scientific code's case: everything float64 by default, the forward autocast to 16 bits."""
    batches = [make_batch(12, seed=i) for i in range(3)]
    with default_dtype(torch.float64):
        ours, theirs = state_of(torch.float64), state_of(torch.float64)
        train = ct.clip_grad_norm(0.5)(ct.mixed_precision(dtype=precision)(ct.accumulate(2)(classify)))
        scaler = torch.amp.GradScaler("cpu") if precision == "fp16" else None
        for batch in batches:
            assert train(ours, batch).skipped is False
            hand_written(theirs, scaler, batch, LOW[precision], 2, True)
        for p, q in zip(ours.model.parameters(), theirs.model.parameters(), strict=True):
            assert p.dtype is torch.float64
            torch.testing.assert_close(p, q, rtol=0, atol=0)


@pytest.mark.parametrize("default", DEFAULTS, ids=str)
def test_the_bf16_finite_check_still_skips_under_every_default_dtype(default):
    """The one-kernel check at scale 1 (whose constants once followed the default dtype) still sees an inf."""

    def poisoned(model, batch):
        return classify(model, batch) * torch.inf

    with default_dtype(default):
        state = state_of(torch.float32)
        before = copy.deepcopy(state.model.state_dict())
        out = ct.mixed_precision(dtype="bf16")(ct.accumulate(2)(poisoned))(state, make_batch(8, dtype=torch.float32))
        assert out.skipped is True and state.step == 0
        assert all(torch.equal(v, before[k]) for k, v in state.model.state_dict().items())


@pytest.mark.parametrize("default", DEFAULTS, ids=str)
def test_the_scaling_constants_are_float32_whatever_the_default(default):
    """Every tensor LossScaling creates for the AMP kernels (found-inf flags, the scale of 1) is float32."""
    with default_dtype(default):
        scaling = LossScaling()
        scaling.configure(("bf16", 1.0), "cpu", "test")
        model = nn.Linear(3, 2).float()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(4, 3, dtype=torch.float32)).sum().backward()
        scaling.unscale(opt)
        assert [f.dtype for f in scaling._found] == [torch.float32]
        assert [t.dtype for t in scaling._ones.values()] == [torch.float32]
        assert scaling.found_inf(opt) is False


# -- two gloo ranks, once ----------------------------------------------------------------------------
def test_distributed_mixed_precision_under_a_float64_default_matches_one_process():
    pool = Pool(2)
    try:
        results = pool.run(__name__, "train_float64_default", timeout=120)
    finally:
        pool.close()
    reference = train_float64_default(None, 2)
    for name, expected in reference.items():
        for r in results:
            assert r[name]["skipped"] == expected["skipped"] == [False] * 3, name
            # 16-bit forwards of the same micro-batches, their gradients weighted per rank rather than per
            # global batch before rounding: a few bf16 roundings of the distance moved, as test_precision's
            for p, q, p0 in zip(r[name]["params"], expected["params"], expected["start"], strict=True):
                assert p.dtype is q.dtype
                assert (p - q).norm() <= 2e-2 * (q - p0).norm() + 1e-7, name
        for p, q in zip(results[0][name]["params"], results[1][name]["params"], strict=True):
            assert torch.equal(p, q), name


@pytest.mark.parametrize("default", DEFAULTS, ids=str)
def test_the_micro_batch_metric_is_exact_whatever_the_default(default):
    """accumulate('auto') reports its micro-batch as a number: 257 samples are 257, not bf16's 256."""
    with default_dtype(default):
        state = state_of(torch.float32)
        out = ct.accumulate("auto")(classify)(state, make_batch(257, dtype=torch.float32))
        assert float(out.metrics["micro_batch"]) == 257.0


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------
# distributed(mixed_precision(...)) under torch.set_default_dtype(torch.float64) on every rank. Rank None runs
# the reference: the same composition without distributed, in one process, on the global batches, split into the same
# micro-batches as the ranks'.


CASES = {  # name: (precision, parameter dtype, accumulate: n or "auto", step's OOM limit on rank 1)
    "bf16-fp32-weights": ("bf16", torch.float32, 2, None),
    "fp16-fp32-weights": ("fp16", torch.float32, 2, None),
    "bf16-fp64-weights-auto": ("bf16", torch.float64, "auto", 3),
}
SIZES = [[6, 6]] * 3  # micro-batches of 3 on the ranks, and in the reference


def limited(limit: int | None):
    def step(model, batch):
        if limit is not None and batch[0].shape[0] > limit:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected above {limit} samples)")
        return classify_acc(model, batch)

    return step


def train_float64_default(rank: int | None, world: int) -> dict[str, Any]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        results = {}
        for name, (precision, dtype, n, limit) in CASES.items():
            state = case_state("classify", 7 + (rank or 0), dtype)
            # the reference splits the global batch into the ranks' micro-batches: only the sums' order differs
            inner = ct.accumulate(n if rank is not None else 2 * world)
            parts = [ct.clip_grad_norm(0.5), ct.mixed_precision(dtype=precision), inner]
            plain = limited(limit if rank == 1 else None)
            step = ct.compose(ct.distributed, *parts)(plain) if rank is not None else ct.compose(*parts)(plain)
            start = [p.detach().clone() for p in state.model.parameters()]  # rank 0's: DDP broadcasts them
            skipped = []
            for i, sizes in enumerate(SIZES):
                batch = global_batch("classify", sizes, 50 + i, dtype)
                out = step(state, batch if rank is None else shard(batch, sizes, rank))
                skipped.append(bool(out.skipped))
            params = [p.detach().clone() for p in state.model.parameters()]
            results[name] = {"start": start, "params": params, "skipped": skipped}
        return results
    finally:
        torch.set_default_dtype(previous)
