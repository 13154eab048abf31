"""sharded() (FSDP2) across real gloo processes, against one process on the global batch."""

import itertools
import math

import pytest
import sharded_workers
import torch
from helpers import assert_states_equal, classify, make_batch, make_state
from hypothesis import given, settings
from hypothesis import strategies as st

import composetrain as ct


def run(pool, **case):
    case.setdefault("seed", 0)
    return pool.run("sharded_workers", "run_case", case), sharded_workers.train(case, rank=None)


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
    for seen in pool.run("sharded_workers", "dtypes_under_bf16"):
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
    assert (
        pool.run("sharded_workers", "found_inf_on_one_rank", dtype)
        == [{"skipped": True, "unchanged": True, "step": 1}] * 2
    )


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
    results = pool.run("sharded_workers", "fp16_both", composition, 1, 3, optimizer)
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
    whole = sharded_workers.local_bytes(0, 1, sharded=False)
    for mine in pool.run("sharded_workers", "local_bytes", True):
        for what in ("params", "grads", "optimizer"):
            assert mine[what] == whole[what] / 2, what  # 64 rows per layer split evenly over 2 ranks


def test_bad_inputs_are_clear_errors_that_change_nothing(pool):
    found = pool.run("sharded_workers", "refusals")
    assert found[0] == found[1]
    found = found[0]
    assert found["unknown"].startswith(
        "ValueError: sharded(modules=['blocks.0', 'block.7'])(classify): modules names ['block.7'], which the model "
        "does not have; its submodules include ['inp', 'blocks', 'blocks.0', "
    )
    assert found["unknown_untouched"] == "True"
    assert (
        found["class"]
        == "ValueError: sharded(modules=Conv2d)(classify): modules=Conv2d matches no submodule of the model"
    )
    assert found["optimizer"].startswith(
        "ValueError: sharded(classify): the optimizer already holds state (momentum, moments) for 8 unsharded "
        "parameter(s); sharding replaces the parameters"
    )
    assert found["tied"].startswith(
        "ValueError: sharded(classify): parameters ['blocks.0.0.weight', 'blocks.1.0.weight'] are one tensor (tied "
        "weights) used in units ['blocks.0', 'blocks.1']"
    )
    assert found["tied_in_one_unit"] == "no error"
    assert found["container"].startswith(
        "ValueError: sharded(modules=['blocks'])(classify): modules selects ['blocks'], which have no forward of "
        "their own (an nn.ModuleList or ModuleDict)"
    )
    assert found["unequal"].startswith(
        "ValueError: sharded(accumulate(2)(classify)): the ranks' batches hold [4, 5] samples; under sharded every "
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
    assert pool.run("sharded_workers", "reduce_scatters", 1, False) == [[units, units]] * 2
    for n in (2, 4):
        assert pool.run("sharded_workers", "reduce_scatters", n, False) == [[units, units]] * 2, n
        assert pool.run("sharded_workers", "reduce_scatters", n, True) == [[n * units, n * units]] * 2, n


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
    found = pool.run("sharded_workers", "released")
    assert found[0]["next_step"] == found[1]["next_step"]
    for r in found:
        assert r["held_before"] and not r["held_after"]  # FSDP2 held it; ct.run destroys it next
        assert r["next_step"].startswith(
            "RuntimeError: sharded(classify): the TrainState's model was sharded over a process group that is "
            "gone, released (TrainState.release_runtime, which ct.run calls when the process exits) or another one"
        )
        assert r["untouched"]
        assert math.isfinite(r["fresh_loss"])  # the group itself was not harmed
