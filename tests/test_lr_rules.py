"""The learning-rate rule: scaled_lr, warmup with torch schedulers, and ct.run logging the global batch."""

import math

import pytest
import torch
from helpers import classify, mlp
from torch.utils.data import TensorDataset

import composetrain as ct


def test_linear_and_square_root_scaling():
    assert ct.scaled_lr(0.1, 1024, 256) == pytest.approx(0.4)
    assert ct.scaled_lr(0.1, 64, 256) == pytest.approx(0.025)
    assert ct.scaled_lr(1e-3, 1024, 256, rule="sqrt") == pytest.approx(2e-3)
    assert ct.scaled_lr(0.1, 256, 256, rule="sqrt") == 0.1


def test_scaled_lr_arguments_are_checked():
    with pytest.raises(ValueError, match=r"scaled_lr: rule must be 'linear' or 'sqrt', got 'cubic' \(str\)"):
        ct.scaled_lr(0.1, 512, 256, rule="cubic")
    with pytest.raises(ValueError, match=r"scaled_lr: batch must be a positive int, got 0 \(int\)"):
        ct.scaled_lr(0.1, 0, 256)
    with pytest.raises(TypeError, match=r"scaled_lr: base_batch must be a positive int, got 2.5 \(float\)"):
        ct.scaled_lr(0.1, 512, 2.5)
    with pytest.raises(ValueError, match=r"scaled_lr: base_lr must be a positive, finite number, got -0.1"):
        ct.scaled_lr(-0.1, 512, 256)


def test_warmup_through_lambda_lr_rises_linearly_then_hands_over():
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=ct.scaled_lr(0.1, 1024, 256))
    cosine = lambda i: 0.5 * (1 + math.cos(math.pi * min(i, 4) / 4))  # noqa: E731
    state = ct.TrainState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, ct.warmup(4, then=cosine)))
    lrs = []
    x, y = torch.randn(8, 5, dtype=torch.float64), torch.randint(0, 3, (8,))
    for _ in range(9):
        lrs.append(opt.param_groups[0]["lr"])
        ct.train_step(classify)(state, (x, y))
    assert lrs == pytest.approx(
        [0.1, 0.2, 0.3, 0.4, 0.4, 0.2 * (1 + math.cos(math.pi / 4)), 0.2, 0.2 * (1 - math.cos(math.pi / 4)), 0.0]
    )
    # the scheduler's position is in the checkpoint; the function itself is configuration
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.4)
    resumed = ct.TrainState(model, opt, torch.optim.lr_scheduler.LambdaLR(opt, ct.warmup(4, then=cosine)))
    resumed.load_state_dict(torch.load(_saved(state), weights_only=True))
    assert opt.param_groups[0]["lr"] == state.optimizer.param_groups[0]["lr"] and resumed.step == 9


def _saved(state):
    import io

    buffer = io.BytesIO()
    torch.save(state.state_dict(), buffer)
    buffer.seek(0)
    return buffer


def test_warmup_with_a_start_and_in_sequential_lr():
    f = ct.warmup(2, start=0.5)
    assert [f(i) for i in range(4)] == [0.75, 1.0, 1.0, 1.0]
    assert ct.warmup(0)(0) == 1.0
    assert repr(ct.warmup(3).__name__) == "'warmup(3)'"
    opt = torch.optim.SGD(mlp().parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt,
        [torch.optim.lr_scheduler.LambdaLR(opt, ct.warmup(2)), torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)],
        milestones=[2],
    )
    lrs = []
    for _ in range(4):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs == pytest.approx([0.5, 1.0, 1.0, 0.5])


def test_warmup_arguments_are_checked():
    with pytest.raises(ValueError, match=r"warmup: steps must be a non-negative int, got -1"):
        ct.warmup(-1)
    with pytest.raises(ValueError, match=r"warmup: start must be in \[0, 1\), got 1.0"):
        ct.warmup(10, start=1.0)
    with pytest.raises(TypeError, match="warmup: then must be a function"):
        ct.warmup(10, then=0.5)


def test_run_logs_the_global_batch_and_the_micro_batch_in_use():
    """One process: the global batch is the batch; accumulate('auto') reports the micro-batch it settled on."""

    def step(model, batch):
        if batch[0].shape[0] > 4:
            raise torch.OutOfMemoryError("CUDA out of memory (injected)")
        return classify(model, batch)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 5, generator=g, dtype=torch.float64), torch.randint(0, 3, (64,), generator=g))
    model = mlp()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.1))
    result = ct.run(ct.accumulate("auto")(step), state, data, batch_size=16, epochs=1, log_every=2, progress=False)
    assert [r["global_batch"] for r in result.history] == [16, 16]
    assert [r["micro_batch"] for r in result.history] == [4.0, 4.0]
