"""ct.run with ct.compile: compilations in the records and the bottleneck, checkpoints across compiled and eager
runs, and the warm restart from torch's compile caches kept in checkpoint_dir (the one inductor test)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import assert_states_close, classify, make_state
from torch._dynamo.utils import counters
from torch.utils.data import TensorDataset

import composetrain as ct
from composetrain.driver.compiling import CACHE_DIR

AOT = ct.compile(backend="aot_eager")


pytestmark = pytest.mark.usefixtures("fresh_dynamo")  # conftest.py: each test compiles from nothing


def data(n: int = 20) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(n, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (n,), generator=g))


def go(step, state, folder=None, **options):
    options = {"batch_size": 8, "shuffle": False, "progress": False, "num_workers": 0, **options}
    return ct.run(step, state, data(), checkpoint_dir=folder, **options)


def test_records_count_compilations_and_their_time_and_the_bottleneck_names_them():
    """Batches of 8, 8 and a short 4: one compilation, then one more for the new size, then none."""
    result = go(AOT(classify), make_state(0), epochs=2, log_every=1)
    compiles = [r["compiles"] for r in result.history]
    assert compiles == [1, 0, 1, 0, 0, 0]
    assert all(r["compile_s"] > 0 for r in result.history if r["compiles"]) and result.history[1]["compile_s"] == 0
    assert result.bottleneck.startswith("torch.compile took ")  # a 6-update run: compiling is most of it
    assert "(2 compilation(s))" in result.bottleneck
    eager = go(classify, make_state(0), epochs=1, log_every=1)
    assert "compiles" not in eager.history[0] and not eager.bottleneck.startswith("torch.compile")


def test_a_compiled_runs_checkpoint_resumes_eager_and_back(tmp_path):
    straight = make_state(0)
    go(ct.accumulate(2)(classify), straight, epochs=3)
    resumed = make_state(0)
    go(AOT(ct.accumulate(2)(classify)), resumed, tmp_path, max_steps=4)
    eager = make_state(0)
    go(ct.accumulate(2)(classify), eager, tmp_path, max_steps=7)
    again = make_state(0)
    go(AOT(ct.accumulate(2)(classify)), again, tmp_path, epochs=3)
    assert again.step == straight.step == 9
    assert_states_close(again, straight, rtol=1e-12, atol=1e-14)


def test_a_restarted_run_compiles_from_the_caches_kept_beside_its_checkpoints(tmp_path):
    """Each process starts with empty local caches (a new machine, or a cleared /tmp): the resumed one's compile
    hits the FX graph cache only because ct.run kept torch's caches in checkpoint_dir; afterwards the process's
    own cache folder is back in place."""
    import os

    from torch._inductor.utils import fresh_cache

    train = ct.compile(ct.accumulate(2)(classify))  # inductor
    with fresh_cache():
        before = os.environ["TORCHINDUCTOR_CACHE_DIR"]
        go(train, make_state(0), tmp_path, max_steps=1)
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == before
        assert not any(Path(before).iterdir()), "compiled into the machine's cache, not checkpoint_dir's"
    assert counters["inductor"]["fxgraph_cache_miss"] >= 1 and any((tmp_path / CACHE_DIR).rglob("*.so"))
    torch._dynamo.reset()
    counters.clear()
    with fresh_cache():
        state = make_state(0)
        go(train, state, tmp_path, max_steps=2)
    assert state.step == 2
    assert counters["inductor"]["fxgraph_cache_hit"] >= 1 and counters["inductor"]["fxgraph_cache_miss"] == 0
    # and inductor's kernels (fused, reordered) train as eager does, to float64 rounding
    eager = make_state(0)
    go(ct.accumulate(2)(classify), eager, max_steps=2)
    # measured: largest relative difference 2.1e-16 after the 2 updates
    assert_states_close(state, eager, rtol=1e-12, atol=1e-14)


def test_without_cache_torchs_own_cache_folder_is_used(tmp_path):
    import os

    seen = []

    def step(model, batch):
        seen.append(os.environ.get("TORCHINDUCTOR_CACHE_DIR"))
        return classify(model, batch)

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    go(ct.compile(backend="eager", cache=False)(step), make_state(0), tmp_path, max_steps=1)
    assert seen == [before] and not (tmp_path / CACHE_DIR).exists()
    go(ct.compile(backend="eager")(step), make_state(0), tmp_path / "b", max_steps=1)
    assert seen[-1] == str(tmp_path / "b" / CACHE_DIR) and os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before


def test_a_run_that_fails_gives_the_cache_folder_back_at_once(tmp_path):
    """Also while the traceback (which holds the driver) is kept, as a notebook keeps it."""
    import os

    def failing_eval(model, batch):
        raise ZeroDivisionError("the evaluation fails")

    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    train = ct.compile(backend="eager")(classify)
    with pytest.raises(ZeroDivisionError) as failed:
        go(train, make_state(0), tmp_path, max_steps=2, eval_step=failing_eval, eval_data=data(4), eval_every=1)
    assert failed.traceback and os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before


def test_compile_seconds_include_the_backward_compiled_at_the_first_backward():
    """AOTAutograd compiles a graph's backward lazily, in the first backward, outside the frame's compilation: a
    backend whose backward compiler takes 1 s shows that second in compile_s and in the bottleneck."""
    import time

    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def forward_compiler(graph, inputs):
        return make_boxed_func(graph.forward)

    def slow_backward_compiler(graph, inputs):
        time.sleep(1.0)
        return make_boxed_func(graph.forward)

    backend = aot_autograd(fw_compiler=forward_compiler, bw_compiler=slow_backward_compiler)
    result = go(ct.compile(backend=backend)(classify), make_state(0), max_steps=1, log_every=1)
    assert result.history[0]["compiles"] == 1 and result.history[0]["compile_s"] >= 1.0
    assert result.bottleneck.startswith("torch.compile took ")


@pytest.mark.parametrize("kind", ["file", "dangling link"])
def test_a_compile_cache_that_is_no_folder_is_refused_with_the_fix(tmp_path, kind):
    """It was a bare FileExistsError from mkdir."""
    import os

    cache = tmp_path / CACHE_DIR
    if kind == "file":
        cache.write_text("not a folder")
    else:
        cache.symlink_to(tmp_path / "gone")
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    state = make_state(0)
    with pytest.raises(FileExistsError, match=r"run: .*compile_cache is not a folder.*ct.compile.*cache=False"):
        go(ct.compile(backend="eager")(classify), state, tmp_path, max_steps=1)
    assert state.step == 0 and os.environ.get("TORCHINDUCTOR_CACHE_DIR") == before
    go(ct.compile(backend="eager", cache=False)(classify), state, tmp_path, max_steps=1)  # the fix it names
    assert state.step == 1


def test_a_train_step_given_as_eval_step_is_refused_before_training():
    """ct.compile(eval_fn) as eval_step trained a whole epoch, then failed in the evaluation with 'state must be a
    ct.TrainState, got Sequential'."""
    state = make_state(0)
    refused = r"run: eval_step must be a function .*got the TrainStep compile.*torch\.compile"
    with pytest.raises(TypeError, match=refused):
        go(AOT(classify), state, eval_step=AOT(classify), eval_data=data(4), epochs=1)
    assert state.step == 0
