"""ct.sharded with parameters FSDP2 leaves whole or cannot take, against one process on the global batch."""

import torch


def test_a_complex_0_dim_parameter_is_averaged_whole(pool):
    """Its gradient was averaged through float64: the imaginary part was dropped, silently."""
    for r in pool.run("sharded_odd_param_workers", "complex_scalar_trains_as_one_process"):
        assert r["sharded"]["z"].dtype == torch.complex128
        for name, p in r["plain"].items():
            torch.testing.assert_close(r["sharded"][name], p, rtol=1e-12, atol=1e-14, msg=name)


def test_a_non_contiguous_parameter_is_refused_before_anything_is_sharded(pool):
    """FSDP2 refused it only when it reached its unit: the units before it were sharded (the state left
    unusable for good) and every rank's weights already replaced by rank 0's."""
    for r in pool.run("sharded_odd_param_workers", "non_contiguous_parameter"):
        assert r["error"].startswith("ValueError: sharded(_loss): parameters ['blocks.0.weight']"), r
        assert "contiguous" in r["error"] and ".contiguous()" in r["error"], r
        assert r == {**r, "sharded_units": 0, "values_kept": True, "unusable": None}


def test_ranks_that_would_shard_different_things_all_raise_before_sharding(pool):
    results = pool.run("sharded_odd_param_workers", "ranks_that_disagree")
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
    for r in pool.run("sharded_odd_param_workers", "scalars_without_gradients_train_as_one_process"):
        assert torch.equal(r["sharded"]["unused"], torch.tensor(0.8, dtype=torch.float64))  # never decayed
        for name, p in r["plain"].items():
            torch.testing.assert_close(r["sharded"][name], p, rtol=1e-12, atol=1e-14, msg=name)
