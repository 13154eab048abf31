"""What sharding a TrainState must cope with (2 gloo ranks against a plain loop): 0-dim parameters, an
optimizer whose __init__ creates state, a failure half-way, a parameter outside the optimizer, and an
optimizer whose parameters are not in model order across a resume."""

import pytest
import sharded_setup_workers
import torch


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
    reference = sharded_setup_workers.plain_loop(optimizer, 2)
    results = pool.run("sharded_setup_workers", "scalar_parameters", optimizer)
    for r in results:
        assert_close_to(r, reference)
        assert_same(r, results[0])  # every rank holds the same whole parameters
        scalars = {n for n, p in reference["params"].items() if p.dim() == 0}
        assert scalars == {"logit_scale", "rare", "blocks.0.gate", "blocks.1.gate"}
        assert {n: k for n, k in r["kinds"].items() if n in scalars} == dict.fromkeys(scalars, "Parameter")
        assert {k for n, k in r["kinds"].items() if n not in scalars} == {"DTensor"}


def test_a_failure_half_way_leaves_a_state_that_says_so(pool):
    found = pool.run("sharded_setup_workers", "half_sharded")
    assert found[0] == found[1]
    found = found[0]
    assert found["first"].startswith(
        "RuntimeError: sharded(classify): fully_shard failed on the root module after 2 unit(s) were sharded "
        "(RuntimeError: injected failure at the root); the TrainState's model is half-sharded"
    ), found["first"]
    for use in ("retry", "distributed", "plain", "apply_sharding"):  # the same sentence, not torch's puzzle
        assert "the TrainState's model is half-sharded" in found[use], (use, found[use])
        assert "build a fresh model, optimizer and TrainState" in found[use], (use, found[use])


def test_a_parameter_outside_the_optimizer_unfrozen_later_has_its_gradient_cleared(pool):
    for left in pool.run("sharded_setup_workers", "unfrozen_outside_the_optimizer"):
        assert left == [[], [], []]


def test_resume_and_load_are_bit_exact_with_the_optimizer_in_another_order(pool, tmp_path):
    """AdamW with a no-decay group of biases first: ct.run stopped and resumed equals the straight run, and
    load_checkpoint after apply_sharding equals the state that saved the checkpoint, bit for bit."""
    results = pool.run("sharded_setup_workers", "resume_in_optimizer_order", str(tmp_path))
    for r in results:
        assert r["steps"] == [4, 4, 2]
        assert_same(r["resumed"], r["straight"])
        assert_same(r["loaded"], r["at_two"])
        assert not all(torch.equal(p, r["at_two"]["params"][n]) for n, p in r["straight"]["params"].items())


def test_full_state_dict_without_its_group_points_at_load_checkpoint(pool):
    for r in pool.run("sharded_setup_workers", "gathered_after_the_group_is_gone"):
        assert r["alive"] in ("True", "1")  # rank 0 gets the whole state dict, the others an empty one
        assert r["kinds"] == "['DTensor']"
        assert r["gone"].startswith("RuntimeError: full_state_dict: the model is sharded over a process group "), r
        assert "ct.load_checkpoint(" in r["gone"], r


def test_adagrad_state_made_by_training_is_refused_before_sharding(pool):
    for r in pool.run("sharded_setup_workers", "trained_adagrad"):
        assert r["error"].startswith(
            "ValueError: sharded(classify): the optimizer already holds state (momentum, moments) for 12 unsharded "
            "parameter(s); sharding replaces the parameters"
        ), r
        assert "(the state an optimizer's __init__ makes, such as Adagrad's, is fine" in r["error"]
        assert r["untouched"] == "True"


def test_fp16_loss_scaling_with_zero_dim_parameters_is_refused_with_the_fix(pool):
    for said in pool.run("sharded_setup_workers", "fp16_with_scalars"):
        assert said.startswith(
            "ValueError: sharded(mixed_precision(dtype='fp16')(classify)): fp16 loss scaling with the 0-dim "
            "parameters ['blocks.0.gate', 'blocks.1.gate', 'logit_scale', 'rare']"
        ), said
        assert "use mixed_precision(dtype='bf16')" in said, said


def test_bf16_with_zero_dim_parameters_tracks_one_process(pool):
    reference = sharded_setup_workers.bf16_with_scalars(None, 2)
    results = pool.run("sharded_setup_workers", "bf16_with_scalars")
    for r in results:
        assert all(torch.equal(r[n], results[0][n]) for n in r)
        for n, p in reference.items():
            torch.testing.assert_close(r[n], p, rtol=2e-2, atol=2e-3, msg=n)
