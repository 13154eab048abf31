"""The README's main job must keep working: it really trains."""

import re
import sys
from pathlib import Path

import processes
import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_digits(*args: str) -> str:
    pytest.importorskip("sklearn")
    command = [sys.executable, str(ROOT / "examples" / "train_digits.py"), "--epochs", "6", *args]
    return processes.run(command, timeout=300)


def test_digits_example_trains_to_high_accuracy():
    out = run_digits()
    assert out.startswith("mixed_precision(dtype='fp32')(accumulate(4)(step))")
    assert out.count("epoch ") == 6
    losses = [float(x) for x in re.findall(r"train loss (\d+\.\d+)", out)]
    assert losses[-1] < losses[0] / 4
    assert float(re.search(r"test accuracy (\d\.\d+)", out).group(1)) > 0.9


def test_the_run_example_trains_evaluates_and_resumes(tmp_path):
    pytest.importorskip("sklearn")
    command = [sys.executable, str(ROOT / "examples" / "run_digits.py"), "--checkpoint-dir", str(tmp_path)]
    first = processes.run([*command, "--epochs", "3"], timeout=300)
    assert first.count("test acc") == 3
    again = processes.run([*command, "--epochs", "6"], timeout=300)
    accuracies = [float(a) for a in re.findall(r"test acc (\d\.\d+)", again)]
    assert len(accuracies) == 6 and accuracies[-1] > 0.85  # the first three came from the checkpoint
    assert (tmp_path / "metrics.jsonl").exists()


def test_digits_example_trains_in_bf16_with_clipping():
    out = run_digits("--precision", "bf16", "--clip", "1.0")
    assert out.startswith("clip_grad_norm(1.0)(mixed_precision(dtype='bf16')(accumulate(4)(step)))")
    assert float(re.search(r"test accuracy (\d\.\d+)", out).group(1)) > 0.9


def run_example(name: str, *args: str, torchrun: bool = False, timeout: float = 600) -> str:
    for module in ("sklearn", "torchvision", "einops"):
        pytest.importorskip(module)
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2"] if torchrun else [sys.executable]
    return processes.run([*launcher, str(ROOT / "examples" / name), *args], timeout=timeout)


def test_the_image_classifier_trains_evaluates_resumes_and_draws_its_curves(tmp_path):
    short = ["--run-dir", str(tmp_path), "--width", "8", "--batch-size", "32"]
    first = run_example("image_classifier.py", *short, "--epochs", "2")
    assert len(re.findall(r"test acc \d", first)) == 2
    again = run_example("image_classifier.py", *short, "--epochs", "4")  # resumes after epoch 2
    accuracies = [float(a) for a in re.findall(r"test acc (\d\.\d+)", again)]
    assert len(accuracies) == 4 and accuracies[-1] > 0.3  # 10 classes: well above chance after 4 short epochs
    assert again.splitlines()[-2].startswith("distributed(mixed_precision(accumulate(2)(step)))")
    png = tmp_path / "curves.png"
    assert f"curves: {png}" in again and png.read_bytes()[:4] == b"\x89PNG"
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert sum('"eval": {' in line for line in lines) == 4


def test_the_image_classifier_runs_unchanged_under_torchrun(tmp_path):
    out = run_example(
        "image_classifier.py",
        "--run-dir",
        str(tmp_path),
        "--width",
        "8",
        "--epochs",
        "1",
        "--batch-size",
        "32",
        torchrun=True,
    )
    assert len(re.findall(r"test acc \d", out)) == 1  # printed once, by rank 0


def test_the_language_model_trains_on_real_tokens_and_samples_text():
    out = run_example(
        "language_model.py",
        "--epochs",
        "1",
        "--samples",
        "256",
        "--batch-size",
        "32",
        "--context",
        "32",
        "--width",
        "32",
        "--sample-length",
        "40",
    )
    assert "accumulate(4, weight=real_tokens)" in out
    loss = float(re.search(r"held-out loss (\d+\.\d+)", out).group(1))
    assert loss < 4.5  # below the uniform guess over the ~90 characters (ln 90 = 4.5)
    sample = out.split("sample:\n", 1)[1]
    assert sample.startswith("The data") and len(sample) >= 40


def test_the_pretraining_example_writes_shards_trains_on_windows_resumes_and_trains_packed(tmp_path):
    short = ["--seq-len", "32", "--width", "16", "--batch-size", "8", "--eval-every", "2", "--sample-length", "20"]
    first = run_example("pretrain_tokens.py", "--run-dir", str(tmp_path / "windows"), *short, "--max-steps", "2")
    assert re.search(r"ct\.tokens\(.*train_000\.bin.*train_001\.bin'\], seq_len=32\): \d+ windows", first)
    assert sorted(p.name for p in (tmp_path / "windows" / "data").iterdir()) == [
        "train_000.bin",
        "train_001.bin",
        "val_000.bin",
    ]
    assert "resuming" not in first and "accumulate(2)(window_step))): step 2," in first
    again = run_example("pretrain_tokens.py", "--run-dir", str(tmp_path / "windows"), *short, "--max-steps", "4")
    assert "resuming from the checkpoint" in again and "step 4, final train loss" in again
    assert len(re.findall(r"held-out loss \d", again)) == 2  # step 2's, kept from the first run, and step 4's
    packed = run_example(
        "pretrain_tokens.py", "--run-dir", str(tmp_path / "packed"), *short, "--pack", "--max-steps", "2"
    )
    padding = re.search(r"rows of 32 positions, \d+ tokens, ([\d.]+)% padding; padded rows would be ([\d.]+)%", packed)
    assert float(padding.group(1)) < float(padding.group(2)) / 5
    assert "accumulate(2, weight=labelled)(packed_step))): step 2," in packed
    assert packed.split("sample:\n", 1)[1].startswith("The ")


def test_the_ema_schedule_example_warms_up_and_anneals_per_epoch_and_evaluates_both_models():
    pytest.importorskip("sklearn")
    import torch

    out = run_example("ema_schedule.py", "--epochs", "6", timeout=300)
    rates = [float(r) for r in re.findall(r"lr (\d\.\d+)", out)]
    model = torch.nn.Linear(1, 1)  # the recipe's own loop, stepped once per epoch: the rates it uses
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=0.01, total_iters=2)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=4)
    schedule = torch.optim.lr_scheduler.SequentialLR(opt, [warm, cosine], milestones=[2])
    expected = []
    for _ in range(6):
        expected.append(round(opt.param_groups[0]["lr"], 6))
        opt.step()
        schedule.step()
    assert rates == expected
    ema = [float(a) for a in re.findall(r"ema acc (\d\.\d+)", out)]
    assert len(ema) == 6 and ema[-1] > 0.9
    assert float(re.search(r"final EMA model test acc (\d\.\d+)", out).group(1)) == ema[-1]


def test_the_cached_images_example_decodes_png_files_once_and_reports_the_speedup(tmp_path):
    images, store = tmp_path / "images", tmp_path / "digits.cache"
    out = run_example(
        "cached_images.py", "--epochs", "2", "--workers", "0", "--images", str(images), "--cache", str(store)
    )
    assert len(list(images.rglob("*.png"))) == 1797 and (store / "manifest.json").exists()
    assert re.search(r"ct.cache wrote the store in \d+\.\d+ s", out)
    assert re.search(r"data path \d+\.\d+x faster; epoch \d+\.\d+x faster", out)
    assert float(re.search(r"train acc (\d\.\d+)", out).group(1)) > 0.5  # 10 classes, 2 short epochs, shifted


def test_the_hf_finetune_trains_in_bf16_and_resumes_bit_exactly(tmp_path, capsys):
    """In this process (transformers imports once): one epoch, then a rerun to two resumes; a straight
    two-epoch run ends at the same held-out loss."""
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import finetune_hf
    finally:
        sys.path.remove(str(ROOT / "examples"))
    short = [
        "--samples",
        "32",
        "--batch-size",
        "16",
        "--accumulate",
        "2",
        "--eval-samples",
        "16",
        "--warmup",
        "2",
        "--precision",
        "bf16",
        "--width",
        "32",
        "--layers",
        "1",
    ]
    first = finetune_hf.main([*short, "--epochs", "1", "--run-dir", str(tmp_path / "a")])
    resumed = finetune_hf.main([*short, "--epochs", "2", "--run-dir", str(tmp_path / "a")])
    straight = finetune_hf.main([*short, "--epochs", "2", "--run-dir", str(tmp_path / "b")])
    assert (first.steps, resumed.steps, straight.steps) == (2, 4, 4)
    assert len(resumed.evals) == 2 and resumed.evals[-1]["loss"] == straight.evals[-1]["loss"]
    assert straight.evals[-1]["loss"] < straight.evals[0]["loss"] < 2.6  # below the uniform guess (ln 13 = 2.56)
    printed = capsys.readouterr().out
    assert (
        "mixed_precision(dtype='bf16')(checkpoint_activations(GPT2Block)(accumulate(2, weight=shifted_tokens" in printed
    )
