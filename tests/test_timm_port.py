"""timm's train.py ported without adapters, bit for bit: its train_one_epoch (micro-batches of --batch-size,
--grad-accum-steps, the short last update of an epoch on the micro-batches that remain, its Mixup and
SoftTargetCrossEntropy, --clip-grad in each --clip-mode, ModelEmaV3 with warmup, a per-update cosine schedule
stepped by step_update and step(epoch), --mixup-off-epoch) against ct.run with accumulate(micro_batch=),
ct.clip_grad_*, ct.ema's timm options, the timm scheduler in the TrainState and on_epoch_start; fp32 and bf16."""

import warnings

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import composetrain as ct

timm_data = pytest.importorskip("timm.data")
timm_loss = pytest.importorskip("timm.loss")
timm_scheduler = pytest.importorskip("timm.scheduler")
timm_utils = pytest.importorskip("timm.utils")

MICRO, ACCUM, LOADER_BATCHES, EPOCHS = 4, 3, 8, 3  # 8 micro-batches an epoch in 3s: updates of 3, 3 and 2
CLASSES, MIXUP_OFF, SEED = 3, 2, 1234


def data():
    g = torch.Generator().manual_seed(0)
    n = MICRO * LOADER_BATCHES  # timm's train loader drops the last partial batch: a whole number of them
    return TensorDataset(torch.randn(n, 6, generator=g), torch.randint(0, CLASSES, (n,), generator=g))


def parts():
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 16), nn.BatchNorm1d(16), nn.GELU(), nn.Linear(16, CLASSES))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
    updates_per_epoch = (LOADER_BATCHES + ACCUM - 1) // ACCUM  # timm's, with the short last update
    scheduler, _ = timm_scheduler.create_scheduler_v2(
        optimizer,
        sched="cosine",
        num_epochs=EPOCHS,
        warmup_epochs=1,
        warmup_lr=1e-3,
        step_on_epochs=False,
        updates_per_epoch=updates_per_epoch,
    )
    mixup = timm_data.Mixup(mixup_alpha=0.8, label_smoothing=0.1, num_classes=CLASSES)
    return model, optimizer, scheduler, mixup, timm_loss.SoftTargetCrossEntropy()


CLIPS = {"norm": 0.5, "value": 0.05, "agc": 0.05}


def timm_train(clip_mode, amp_dtype):
    """timm's train.py (its main loop and train_one_epoch), as it runs without a prefetcher or loss scaler."""
    model, optimizer, lr_scheduler, mixup_fn, loss_fn = parts()
    model_ema = timm_utils.ModelEmaV3(model, decay=0.9, use_warmup=True)
    loader = [(x.clone(), y.clone()) for x, y in torch.utils.data.DataLoader(data(), batch_size=MICRO)]
    np.random.seed(SEED)
    rates = []
    for epoch in range(EPOCHS):
        if epoch >= MIXUP_OFF:  # --mixup-off-epoch
            mixup_fn.mixup_enabled = False
        accum_steps = ACCUM
        last_accum_steps = len(loader) % accum_steps
        updates_per_epoch = (len(loader) + accum_steps - 1) // accum_steps
        num_updates = epoch * updates_per_epoch
        last_batch_idx = len(loader) - 1
        last_batch_idx_to_accum = len(loader) - last_accum_steps
        optimizer.zero_grad()
        for batch_idx, (input, target) in enumerate(loader):
            last_batch = batch_idx == last_batch_idx
            need_update = last_batch or (batch_idx + 1) % accum_steps == 0
            if batch_idx >= last_batch_idx_to_accum:
                accum_steps = last_accum_steps
            input, target = mixup_fn(input.clone(), target)
            with torch.autocast("cpu", dtype=amp_dtype, enabled=amp_dtype is not None):
                output = model(input)
                loss = loss_fn(output, target)
            if accum_steps > 1:
                loss /= accum_steps
            loss.backward()
            if need_update:
                params = list(model.parameters())
                head = clip_mode == "agc"  # model_parameters(model, exclude_head='agc' in args.clip_mode)
                timm_utils.dispatch_clip_grad(params[:-2] if head else params, CLIPS[clip_mode], mode=clip_mode)
                rates.append([g["lr"] for g in optimizer.param_groups])
                optimizer.step()
            if not need_update:
                continue
            num_updates += 1
            optimizer.zero_grad()
            model_ema.update(model, step=num_updates)
            lr_scheduler.step_update(num_updates=num_updates)
        lr_scheduler.step(epoch + 1)
    return model, model_ema, rates


def ct_train(clip_mode, amp_dtype):
    model, optimizer, scheduler, mixup, loss_fn = parts()
    rates = []

    def step(model, batch):
        x, y = mixup(*batch)
        return loss_fn(model(x), y)

    def on_epoch_start(state, epoch):
        if epoch == 0:
            np.random.seed(SEED)  # after ct.run seeded its own: Mixup draws from NumPy's global generator
        mixup.mixup_enabled = epoch < MIXUP_OFF  # a function of the epoch: right after a resume too

    head = [n for n, _ in model.named_parameters()][-2:]
    clip = {
        "norm": ct.clip_grad_norm(CLIPS["norm"]),
        "value": ct.clip_grad_value(CLIPS["value"]),
        "agc": ct.adaptive_clip_grad(CLIPS["agc"], exclude=head),
    }[clip_mode]
    precision = ct.mixed_precision("bf16") if amp_dtype is not None else (lambda s: s)
    train = ct.compose(
        ct.ema(0.9, decay_warmup=True, integers="copy"), clip, precision, ct.accumulate(micro_batch=MICRO)
    )(step)
    state = ct.TrainState(model, optimizer, scheduler)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "accumulate.*BatchNorm")  # per micro-batch statistics, as timm's
        ct.run(
            _Recording(train, rates),
            state,
            data(),
            batch_size=MICRO * ACCUM,  # an update's samples: ct.run's batch; accumulate cuts it into MICRO
            shuffle=False,
            drop_last=False,  # the epoch's short last update is kept, as timm's
            num_workers=0,
            epochs=EPOCHS,
            progress=False,
            on_epoch_start=on_epoch_start,
        )
    return state, rates


class _Recording(ct.TrainStep):
    """The composition, recording the rates each update uses (before the update: the scheduler steps in it)."""

    def __init__(self, inner, rates):
        self.rates = rates
        super().__init__(inner)

    def prepare(self, state, batch, ctx):
        self.rates.append([g["lr"] for g in state.optimizer.param_groups])
        return super().prepare(state, batch, ctx)


@pytest.mark.parametrize("amp", [None, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("clip_mode", sorted(CLIPS))
def test_timms_train_loop_with_its_short_last_update_is_reproduced_bit_for_bit(clip_mode, amp):
    model, model_ema, rates = timm_train(clip_mode, amp)
    state, ct_rates = ct_train(clip_mode, amp)
    assert state.step == EPOCHS * 3 and state.epoch == EPOCHS  # 8 micro-batches an epoch: 3 + 3 + 2
    assert ct_rates == rates and len({r[0] for r in rates}) > 3
    for (k, a), b in zip(state.model.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(a, b), k
    averages = state.state_dict()["transforms"]["ema"]["averages"]
    for k, v in model_ema.module.state_dict().items():
        assert torch.equal(averages[k], v), k


def test_the_short_last_update_is_what_makes_it_exact():
    """Weighting the 2 micro-batches of the short update by 1/3 (timm's accum_steps before it becomes 2) is another
    update: the comparison above sees the short update's weights."""
    model_a, opt_a, *_ = parts()
    model_b, opt_b, *_ = parts()
    x, y = data().tensors
    short = (x[-2 * MICRO :], y[-2 * MICRO :])
    state = ct.TrainState(model_a, opt_a)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "accumulate.*BatchNorm")
        ct.accumulate(micro_batch=MICRO)(lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1]))(state, short)
    for i in range(2):  # timm's loop with the count of a full update
        xi, yi = short[0][i * MICRO : (i + 1) * MICRO], short[1][i * MICRO : (i + 1) * MICRO]
        (nn.functional.cross_entropy(model_b(xi), yi) / ACCUM).backward()
    opt_b.step()
    assert any(not torch.equal(a, b) for a, b in zip(model_a.parameters(), model_b.parameters(), strict=True))
