"""Throughput in ct.run's records: the FLOPs of an update as FlopCounterMode counts them (once, on the first
update), samples and tokens per second, MFU against a peak (given, or from the table of GPUs, tested as a table),
and each record's peak memory."""

import copy
import math

import pytest
import run_script
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset
from torch.utils.flop_counter import FlopCounterMode

import composetrain as ct
from composetrain.driver import throughput
from composetrain.driver.throughput import PEAK_FLOPS, PRECISIONS, peak_flops

OPTIONS = {"num_workers": 0, "progress": False, "shuffle": False}


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in self.qkv(self.ln1(x)).split(c, 2))
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.ln2(x))))


class GPT(nn.Module):
    """A small decoder: token and position embeddings, two blocks, a tied head."""

    def __init__(self, vocab=64, context=16, width=32, depth=2, heads=4):
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)
        self.head.weight = self.tokens.weight

    def forward(self, idx):
        x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def lm_step(model, batch):
    x, y = batch
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)


def corpus(n=64, context=16, vocab=64):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, vocab, (n, context + 1), generator=g)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def gpt_state():
    torch.manual_seed(0)
    model = GPT()
    return ct.TrainState(model, torch.optim.AdamW(model.parameters(), lr=1e-3))


def test_the_flops_of_an_update_are_flop_counter_modes_on_a_small_gpt():
    state = gpt_state()
    reference = copy.deepcopy(state.model)
    data = corpus()
    result = ct.run(ct.accumulate(2)(lm_step), state, data, batch_size=16, max_steps=8, log_every=4, **OPTIONS)
    batch = data[0:16]
    with FlopCounterMode(display=False) as counter:
        lm_step(reference, batch).backward()  # forward and backward of one whole batch, as the counter sees them
    expected = counter.get_total_flops()
    assert [r["flops_per_update"] for r in result.history] == [expected, expected]
    # a sanity figure only, not the claim: 6 N per token (N without the embeddings), attention's own on top
    n = sum(p.numel() for name, p in reference.named_parameters() if "tokens" not in name and "positions" not in name)
    print(f"counted {expected:.3g} FLOPs per update; 6 * N * tokens = {6 * n * 16 * 16:.3g}")
    assert 0.5 < expected / (6 * n * 16 * 16) < 2


def test_the_flops_are_counted_on_the_first_update_only(monkeypatch):
    entered = []

    class Counting(FlopCounterMode):
        def __enter__(self):
            entered.append(1)
            return super().__enter__()

    monkeypatch.setattr(throughput, "FlopCounterMode", Counting)
    _, result = run_script.train(max_steps=12)
    assert len(entered) == 1
    assert len({r["flops_per_update"] for r in result.history}) == 1 and result.history[0]["flops_per_update"] > 0


def counted_calls(monkeypatch):
    """How many times FlopCounterMode watched an update, from now on."""
    entered = []

    class Counting(FlopCounterMode):
        def __enter__(self):
            entered.append(1)
            return super().__enter__()

    monkeypatch.setattr(throughput, "FlopCounterMode", Counting)
    return entered


def test_a_later_call_on_the_same_model_composition_and_batch_layout_takes_the_count_made(monkeypatch):
    """ct.run called again (a benchmark's rounds, training between evaluations) counts no second time, and logs the
    same FLOPs; another batch layout, another composition or a changed model is counted again."""
    entered = counted_calls(monkeypatch)
    state, train, data = run_script.state(), ct.accumulate(2)(run_script.step), run_script.dataset()
    first = ct.run(train, state, data, batch_size=12, max_steps=4, log_every=2, **OPTIONS)
    again = ct.run(train, state, data, batch_size=12, max_steps=8, log_every=2, **OPTIONS)
    assert len(entered) == 1
    assert {r["flops_per_update"] for r in first.history + again.history} == {first.history[0]["flops_per_update"]}
    ct.run(train, state, data, batch_size=6, max_steps=10, **OPTIONS)  # batches of 6: another layout
    ct.run(train, state, data, batch_size=6, max_steps=12, **OPTIONS)
    assert len(entered) == 2
    other = ct.accumulate(2)(run_script.step)  # the same settings, another object
    ct.run(other, state, data, batch_size=6, max_steps=14, **OPTIONS)
    assert len(entered) == 3
    state.model.append(torch.nn.Linear(2, 2).double())  # another model: a layer more
    changed = ct.run(other, state, data, batch_size=6, max_steps=16, log_every=2, **OPTIONS)
    assert len(entered) == 4 and changed.history[0]["flops_per_update"] > first.history[0]["flops_per_update"] / 2
    state.model.eval()  # another mode
    ct.run(other, state, data, batch_size=6, max_steps=18, **OPTIONS)
    assert len(entered) == 5


class Gated(nn.Module):
    """A model whose forward runs its wide head only while its submodule ``gate`` is in training mode."""

    def __init__(self):
        super().__init__()
        self.narrow, self.wide, self.gate = nn.Linear(6, 2), nn.Linear(6, 256), nn.Module()

    def forward(self, x):
        out = self.narrow(x)
        return out + 0 * self.wide(x).sum(-1, keepdim=True) if self.gate.training else out


@pytest.mark.parametrize("change", ["freeze", "submodule_eval"])
def test_a_later_call_after_freezing_or_a_submodules_mode_change_is_counted_again(change):
    """The kept count is taken only for an update alike: frozen parameters need no weight gradients (fine-tuning
    unfreezes between calls), and a submodule's mode can change what the forward runs."""
    torch.manual_seed(0)
    model = Gated().double()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.01))
    train, data = ct.accumulate(2)(run_script.step), run_script.dataset()
    ct.run(train, state, data, batch_size=12, max_steps=2, **OPTIONS)
    if change == "freeze":
        model.wide.requires_grad_(False)
    else:
        model.gate.eval()
    again = ct.run(train, state, data, batch_size=12, max_steps=4, log_every=2, **OPTIONS)
    with FlopCounterMode(display=False) as counter:
        run_script.step(copy.deepcopy(model), data[0:12])[0].backward()
    assert again.history[-1]["flops_per_update"] == counter.get_total_flops()


def test_a_head_swapped_for_a_wider_one_is_counted_again(monkeypatch):
    """The same model object, as many submodules, one of them replaced by another shape: counted anew."""
    entered = counted_calls(monkeypatch)
    model = nn.Sequential(nn.Linear(2, 4), nn.Linear(4, 1))
    batch = torch.zeros(3, 2)

    def step(m, b):
        return m(b).sum()

    totals = []
    for width in (4, 8):
        model[0], model[1] = nn.Linear(2, width), nn.Linear(width, 1)
        count = throughput.FlopCount()
        with count.counting(model, step, batch):
            step(model, batch).backward()
        totals.append(count.total)
    assert len(entered) == 2 and totals[1] == 2 * totals[0]


def test_a_data_parallel_composition_is_not_counted():
    """data_parallel runs its replicas in threads, which FlopCounterMode (a dispatch mode of the calling thread)
    does not see: no count, rather than 0."""
    step = ct.data_parallel(["cpu", "cpu"])(run_script.step)
    result = ct.run(step, run_script.state(), run_script.dataset(24), batch_size=12, epochs=1, log_every=1, **OPTIONS)
    assert all(r.get("flops_per_update") is None for r in result.history)
    assert all(
        r.get("mfu") is None
        for r in ct.run(
            step,
            run_script.state(),
            run_script.dataset(24),
            batch_size=12,
            epochs=1,
            log_every=1,
            peak_flops=1e12,
            **OPTIONS,
        ).history
    )


class Opaque:
    """An object of the user's in a batch: the count's layout cannot look into it."""

    def __init__(self, x):
        self.x = x


@pytest.mark.parametrize(("batch", "counts"), [((torch.zeros(3, 2), 7, "a"), 1), ((torch.zeros(3, 2), Opaque(1)), 2)])
def test_a_batch_holding_an_object_of_the_users_is_counted_every_time(monkeypatch, batch, counts):
    entered = counted_calls(monkeypatch)
    model = nn.Linear(2, 2)

    def step(m, b):
        return m(b[0]).sum()

    for _ in range(2):
        count = throughput.FlopCount()
        with count.counting(model, step, batch):
            step(model, batch).backward()
        assert count.total == 2 * (2 * 3 * 2 * 2)  # the forward product, and the weight gradient's (x needs none)
    assert len(entered) == counts


def test_a_count_kept_holds_neither_the_model_nor_the_composition():
    import gc
    import weakref

    state = run_script.state()

    def step(model, batch, held=state.model):  # a step that holds its model
        assert model is held
        return run_script.step(model, batch)

    train = ct.accumulate(2)(step)
    ct.run(train, state, run_script.dataset(), batch_size=12, max_steps=2, **OPTIONS)
    model, composed = weakref.ref(state.model), weakref.ref(train)
    del state, step, train
    gc.collect()
    assert model() is None and composed() is None


def test_an_update_of_another_size_is_scaled_by_its_samples():
    """24 samples in batches of 10: the last update holds 4, and its FLOPs are the count scaled by 4/10."""
    state = run_script.state()
    data = run_script.dataset(24)
    result = ct.run(run_script.step, state, data, batch_size=10, epochs=1, log_every=2, **OPTIONS)
    full = result.history[0]["flops_per_update"]
    assert result.history[1]["flops_per_update"] == pytest.approx(full * 4 / 10, rel=1e-12)


def test_a_compiled_composition_is_compiled_at_its_first_update_and_not_counted():
    """FlopCounterMode keeps torch.compile from compiling the update it watches: a compiled composition's first
    update compiles (one compilation there, none after), and its records carry no FLOP count."""
    step = ct.compile(backend="aot_eager")(run_script.step)
    result = ct.run(step, run_script.state(), run_script.dataset(24), batch_size=12, epochs=1, log_every=1, **OPTIONS)
    assert [r.get("compiles") for r in result.history] == [1, 0]
    assert all("flops_per_update" not in r or r["flops_per_update"] is None for r in result.history)


def test_samples_and_tokens_per_second_are_the_weights_units_over_the_windows_time():
    state = gpt_state()
    data = corpus()
    masked = TensorDataset(data.tensors[0], torch.where(torch.arange(16) < 12, data.tensors[1], -100))  # 12 of 16

    def tokens(b):
        return (b[1] != -100).sum()

    train = ct.accumulate(2, weight=tokens)(lm_step)
    result = ct.run(train, state, masked, batch_size=8, max_steps=4, log_every=2, **OPTIONS)
    for r in result.history:
        assert r["samples_per_s"] / r["updates_per_s"] == pytest.approx(8, rel=1e-9)
        assert r["tokens_per_s"] / r["samples_per_s"] == pytest.approx(12, rel=1e-12)
    _, plain = run_script.train(max_steps=4)  # no weight: no tokens_per_s
    assert "tokens_per_s" not in plain.history[0] and "mfu" not in plain.history[0]


def test_mfu_is_the_flops_achieved_over_the_peak_given():
    _, result = run_script.train(max_steps=8, peak_flops=1e9)
    for r in result.history:
        assert r["mfu"] == pytest.approx(r["flops_per_update"] * r["updates_per_s"] / 1e9, rel=1e-9)


def test_each_record_holds_its_own_peak_memory():
    """A step that holds 256 MiB more during updates 5-8 only: that record's peak shows it, the next one's not."""
    done = [0]

    def heavy(model, batch):
        done[0] += 1
        held = torch.ones(64 * 2**20) if 5 <= done[0] <= 8 else None  # touched pages: resident
        loss, metrics = run_script.step(model, batch)
        del held
        return loss, metrics

    result = ct.run(heavy, run_script.state(), run_script.dataset(), batch_size=8, max_steps=12, log_every=4, **OPTIONS)
    first, second, third = (r["peak_memory_mib"] for r in result.history)
    assert second - first > 200 and second - third > 200, (first, second, third)


# -- the table of peaks ------------------------------------------------------------------------------------------


def test_the_table_holds_every_precision_of_every_gpu_in_a_sane_order():
    for gpu, peaks in PEAK_FLOPS.items():
        assert tuple(peaks) == PRECISIONS, gpu
        assert peaks["fp32"] > 1e12, gpu
        assert peaks["fp16"] is not None and peaks["fp16"] > peaks["fp32"], gpu
        if peaks["bf16"] is not None:  # Ampere and later: bf16 as fast as fp16, tf32 at half of it, above fp32
            assert peaks["bf16"] == peaks["fp16"], gpu
            assert peaks["tf32"] == pytest.approx(peaks["bf16"] / 2, rel=0.02), gpu
            assert peaks["fp32"] < peaks["tf32"], gpu
        else:
            assert peaks["tf32"] is None, gpu


@pytest.mark.parametrize(
    ("name", "precision", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989.5e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),
        ("NVIDIA H200", "fp32", 67e12),
        ("NVIDIA H200 NVL", "bf16", 835.5e12),
        ("NVIDIA A100-SXM4-80GB", "tf32", 156e12),
        ("NVIDIA A100 80GB PCIe", "bf16", 312e12),
        ("NVIDIA L4", "fp16", 121e12),
        ("NVIDIA L40S", "bf16", 362.05e12),
        ("Tesla V100-SXM2-32GB", "fp16", 125e12),
        ("Tesla V100-SXM2-32GB", "bf16", None),
        ("Tesla T4", "fp32", 8.1e12),
        ("NVIDIA A10G", "bf16", None),  # not the A10: unknown, never a guess
        ("NVIDIA GeForce RTX 4090", "bf16", None),
    ],
)
def test_a_gpu_is_found_by_the_name_torch_gives_it(name, precision, expected):
    assert peak_flops(name, precision) == (None if expected is None else pytest.approx(expected))


def test_a_precision_to_look_up_is_refused_on_the_cpu_before_the_first_update():
    state = run_script.state()
    before = copy.deepcopy(state.model.state_dict())
    with pytest.raises(ValueError, match=r"run: peak_flops='bf16' looks the peak up for a GPU, but this process runs"):
        ct.run(run_script.step, state, run_script.dataset(), batch_size=8, peak_flops="bf16", **OPTIONS)
    assert state.step == 0 and all(
        torch.equal(a, b) for a, b in zip(state.model.state_dict().values(), before.values(), strict=True)
    )


def test_a_precision_to_look_up_is_refused_before_a_resume_loads_the_checkpoint_or_a_file_is_made(tmp_path):
    """Refused with the user's TrainState as it was given: not the checkpoint's, loaded before the refusal."""
    ct.run(
        run_script.step,
        run_script.state(),
        run_script.dataset(),
        batch_size=8,
        max_steps=2,
        checkpoint_dir=tmp_path / "a",
        **OPTIONS,
    )
    for folder in (tmp_path / "a", tmp_path / "fresh"):
        state = run_script.state()
        before = copy.deepcopy(state.model.state_dict())
        made = sorted(folder.iterdir()) if folder.exists() else None
        with pytest.raises(ValueError, match=r"run: peak_flops='bf16' looks the peak up for a GPU, but this process"):
            ct.run(
                run_script.step,
                state,
                run_script.dataset(),
                batch_size=8,
                max_steps=4,
                peak_flops="bf16",
                checkpoint_dir=folder,
                **OPTIONS,
            )
        assert state.step == 0 and all(
            torch.equal(a, b) for a, b in zip(state.model.state_dict().values(), before.values(), strict=True)
        )
        assert (sorted(folder.iterdir()) if folder.exists() else None) == made


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        ("fp8", ValueError, r"run: peak_flops must be a number \(FLOP/s of one device\) or one of \['bf16', 'fp16'"),
        (-1.0, ValueError, r"run: peak_flops must be a positive, finite number, got -1.0"),
        (True, TypeError, r"run: peak_flops must be a positive, finite number, got True \(bool\)"),
        (math.inf, ValueError, r"run: peak_flops must be a positive, finite number, got inf"),
    ],
)
def test_peak_flops_is_checked_before_anything_runs(value, error, message):
    with pytest.raises(error, match=message):
        ct.run(run_script.step, run_script.state(), run_script.dataset(), batch_size=8, peak_flops=value)
