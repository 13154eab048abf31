"""examples/cached_images.py: a store kept with --cache is not reused for another --size, and the printed epoch
speed-up compares like with like (one epoch each, after a warm-up), whatever --epochs says."""

import re
import sys
import types

import numpy as np
import pytest
from test_example_args import load

import composetrain as ct


def few_digits(monkeypatch, module, n=40):
    """The example's digits cut to ``n`` images, so that it decodes and trains in a moment."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    small = types.SimpleNamespace(images=digits.images[:n], target=digits.target[:n])
    monkeypatch.setattr(module, "load_digits", lambda: small)


def test_a_store_of_another_size_is_a_usage_error_not_a_shape_error(monkeypatch, capsys, tmp_path):
    module = load("cached_images")
    few_digits(monkeypatch, module)
    common = ["--epochs", "1", "--workers", "0", "--batch-size", "16", "--images", str(tmp_path / "png")]
    common += ["--cache", str(tmp_path / "store")]
    monkeypatch.setattr(sys, "argv", ["cached_images.py", *common, "--size", "8"])
    module.main()
    assert "ct.cache wrote the store" in capsys.readouterr().out
    monkeypatch.setattr(sys, "argv", ["cached_images.py", *common, "--size", "12"])
    with pytest.raises(SystemExit) as stopped:  # was: "mat1 and mat2 shapes cannot be multiplied" from the model
        module.main()
    assert stopped.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert re.search(r"--cache .*store: cache: the store at .* was made from something else", last), last
    monkeypatch.setattr(sys, "argv", ["cached_images.py", *common, "--size", "8"])
    module.main()
    assert "ct.cache mapped the store written before" in capsys.readouterr().out


@pytest.mark.parametrize("epochs", [1, 5])
def test_the_epoch_speedup_counts_the_fixed_costs_of_a_run_alike(monkeypatch, capsys, tmp_path, epochs):
    """On a clock where a process's first ct.run costs 1 s more, every run 0.2 s, an epoch 0.5 s decoded and
    0.05 s cached, an epoch is (0.2 + 0.5) / (0.2 + 0.05) = 2.8 times faster, for any --epochs (it printed
    18.9x for --epochs 5: the first run's cost on the decoded side, the cached run's fixed cost divided by 5)."""
    module = load("cached_images")
    few_digits(monkeypatch, module, n=20)
    now, calls = [0.0], []

    def run(step, state, data, *, epochs, **options):
        cached = isinstance(data, ct.CachedDataset)
        now[0] += (0 if calls else 1.0) + 0.2 + epochs * (0.05 if cached else 0.5)
        calls.append(epochs)
        return types.SimpleNamespace(steps=epochs, data_wait=0.1, history=[{"loss": 1.0, "acc": 0.5}])

    monkeypatch.setattr(module, "ct", types.SimpleNamespace(run=run, cache=ct.cache, TrainState=ct.TrainState))
    monkeypatch.setattr(module, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    monkeypatch.setattr(sys, "argv", ["cached_images.py", "--epochs", str(epochs), "--workers", "0"])
    module.main()
    out = capsys.readouterr().out
    speedup = float(re.search(r"epoch (\d+\.\d+)x faster", out).group(1))
    assert np.isclose(speedup, 0.7 / 0.25, atol=0.05), out


@pytest.mark.parametrize("option", ["--images", "--cache"])
def test_a_file_where_a_folder_belongs_is_a_usage_error_before_any_work(monkeypatch, capsys, tmp_path, option):
    module = load("cached_images")
    (tmp_path / "plain.txt").write_text("not a folder")
    monkeypatch.setattr(module, "load_digits", lambda: pytest.fail("read the digits before refusing"))
    monkeypatch.setattr(sys, "argv", ["cached_images.py", option, str(tmp_path / "plain.txt")])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert f"{option}: " in last and "plain.txt is a file, not a folder" in last, last


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--rounds", "0"], r"--rounds: must be at least 1, got 0"),
        (["--batches", "0"], r"--batches: must be at least 1, got 0"),
        (["--batch", "-3"], r"--batch: must be at least 1, got -3"),
        (["--features", "x"], r"--features: 'x' is not an integer"),
        (["--mb", "0"], r"--mb: must be a positive number of MB, got '0'"),
        (["--mb", "nan"], r"--mb: must be a positive number of MB, got 'nan'"),
        (["--mb", "0.000001"], r"--mb 1e-06 holds no row of 784 float32 features"),
    ],
)
def test_the_cache_benchmark_refuses_sizes_it_cannot_measure(args, said, monkeypatch, capsys):
    """bench_cache.py's odd sizes are usage errors before any data is made (were tracebacks from NumPy)."""
    import importlib.util
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "benchmarks"
    monkeypatch.syspath_prepend(str(bench))  # its `common`, beside it
    spec = importlib.util.spec_from_file_location("bench_cache", bench / "bench_cache.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setattr(sys, "argv", ["bench_cache.py", "--parts", "hdf5", *args])
    with pytest.raises(SystemExit) as stopped:
        module.main()
    assert stopped.value.code == 2
    last = capsys.readouterr().err.splitlines()[-1]
    assert re.search(said, last), last
