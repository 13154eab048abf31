"""distributed(find_unused_parameters=True)(accumulate("auto")(step)) with a parameter the step never uses:
it stays as it is, with no gradient and no momentum, under SGD with momentum and weight decay, as under
plain distributed. A zero gradient instead of None would let weight decay and momentum move it."""

import pytest
import torch
from processes import Pool


@pytest.fixture(scope="module")
def results():
    pool = Pool(2)
    try:
        yield {inner: pool.run("auto_unused_workers", "train", inner, timeout=120) for inner in ("none", "auto")}
    finally:
        pool.close()


@pytest.mark.parametrize("inner", ["none", "auto"])
def test_an_unused_parameter_keeps_its_value_and_no_gradient(results, inner):
    for r in results[inner]:
        assert r["step"] == 3
        assert r["spare_unchanged"]
        assert r["spare_grads"] == [None, None]
        assert r["spare_momentum"] == [None, None]


def test_the_used_parameters_train_as_under_plain_distributed(results):
    for auto, plain in zip(results["auto"], results["none"], strict=True):
        for p, q in zip(auto["body"], plain["body"], strict=True):
            torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12)
