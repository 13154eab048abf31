"""A step's Python-number metrics keep their value whatever torch's default dtype is."""

import pytest
import torch
from torch import nn

import composetrain as ct


@pytest.fixture
def default_dtype():
    saved = torch.get_default_dtype()
    yield torch.set_default_dtype
    torch.set_default_dtype(saved)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_python_number_metrics_are_not_rounded_to_the_default_dtype(default_dtype, dtype):
    default_dtype(dtype)
    model = nn.Linear(2, 1).to(torch.float64)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    value = 1 / 3 + 2**-30  # not representable in any 16- or 32-bit float

    def step(model, batch):
        return model(batch).pow(2).mean(), {"ratio": value, "count": 257, "flag": True}

    out = ct.train_step(step)(state, torch.ones(4, 2, dtype=torch.float64))
    assert out.metrics["ratio"].item() == value
    assert out.metrics["count"].item() == 257  # 257 is not a bfloat16 number
    assert out.metrics["flag"].item() == 1.0  # numbers are reported as floats: they are averaged


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_python_number_metrics_are_averaged_exactly_over_micro_batches(default_dtype, dtype):
    default_dtype(dtype)
    model = nn.Linear(2, 1).to(torch.float64)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))

    def step(model, batch):
        return model(batch).pow(2).mean(), {"third": 1 / 3}

    out = ct.accumulate(3)(step)(state, torch.ones(6, 2, dtype=torch.float64))
    assert out.metrics["third"].item() == pytest.approx(1 / 3, rel=1e-15)


def test_the_log_record_is_the_float64_mean_of_the_updates_it_covers():
    torch.manual_seed(0)
    model = nn.Linear(3, 1).to(torch.float64)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01))
    data = torch.utils.data.TensorDataset(
        torch.randn(24, 3, dtype=torch.float64), torch.randn(24, 1, dtype=torch.float64)
    )
    losses, tiny = [], []

    def step(model, batch):
        x, y = batch
        loss = (model(x) - y).pow(2).mean()
        losses.append(loss.item())
        tiny.append(1 + 8e-10 * len(tiny))
        return loss, {"tiny": torch.tensor(tiny[-1], dtype=torch.float64)}

    result = ct.run(step, state, data, batch_size=4, log_every=3, num_workers=0, progress=False)
    assert [r["step"] for r in result.history] == [3, 6]
    for record, window in zip(result.history, (slice(0, 3), slice(3, 6)), strict=True):
        assert record["loss"] == pytest.approx(sum(losses[window]) / 3, rel=1e-14)
        assert record["tiny"] == pytest.approx(sum(tiny[window]) / 3, rel=1e-14, abs=0)
        assert record["tiny"] != 1.0
