"""ct.sharded with parameters FSDP2 leaves whole or cannot take, against one process on the global batch."""

import pytest
import torch
from dist_pool import Pool


@pytest.fixture(scope="module")
def pool():
    p = Pool(2)
    yield p
    p.close()


def test_a_complex_0_dim_parameter_is_averaged_whole(pool):
    """Its gradient was averaged through float64: the imaginary part was dropped, silently."""
    for r in pool.run("shard_odd_param_cases", "complex_scalar_trains_as_one_process"):
        assert r["sharded"]["z"].dtype == torch.complex128
        for name, p in r["plain"].items():
            torch.testing.assert_close(r["sharded"][name], p, rtol=1e-12, atol=1e-14, msg=name)


def test_a_non_contiguous_parameter_is_refused_before_anything_is_sharded(pool):
    """FSDP2 refused it only when it reached its unit: the units before it were sharded (the state left
    unusable for good) and every rank's weights already replaced by rank 0's."""
    for r in pool.run("shard_odd_param_cases", "non_contiguous_parameter"):
        assert r["error"].startswith("ValueError: sharded(_loss): parameters ['blocks.0.weight']"), r
        assert "contiguous" in r["error"] and ".contiguous()" in r["error"], r
        assert r == {**r, "sharded_units": 0, "values_kept": True, "unusable": None}
