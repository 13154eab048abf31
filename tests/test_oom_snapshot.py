"""ct.run(oom_snapshot=True) on CUDA: an update that runs out of memory leaves the allocator's history in the run's
folder (torch.cuda.memory._dump_snapshot), which names the allocation that failed; without the option, none.
On the CPU: the option is accepted and records nothing (there is no allocator history to keep)."""

import pickle

import pytest
import run_script
import torch

import composetrain as ct


def _greedy_step(model, batch):
    """Asks for far more memory than any GPU has, in the forward."""
    x, _ = batch
    torch.empty(2**44, device=x.device)  # 64 TiB of floats: never fits
    return run_script.step(model, batch)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_an_out_of_memory_update_leaves_a_snapshot_in_the_run_folder(tmp_path):
    state = run_script.state()
    with pytest.raises(torch.OutOfMemoryError):
        ct.run(
            _greedy_step,
            state,
            run_script.dataset(),
            batch_size=8,
            max_steps=2,
            num_workers=0,
            progress=False,
            checkpoint_dir=tmp_path,
            oom_snapshot=True,
        )
    snapshots = list((tmp_path / "memory").glob("oom-rank0-update1.pickle"))
    assert len(snapshots) == 1
    snapshot = pickle.loads(snapshots[0].read_bytes())
    assert {"segments", "device_traces"} <= snapshot.keys()
    traces = [e for trace in snapshot["device_traces"] for e in trace]
    assert any(e["action"] == "oom" for e in traces)  # the failed request itself is in the history


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_without_the_option_no_history_is_recorded(tmp_path):
    with pytest.raises(torch.OutOfMemoryError):
        ct.run(
            _greedy_step,
            run_script.state(),
            run_script.dataset(),
            batch_size=8,
            max_steps=2,
            num_workers=0,
            progress=False,
            checkpoint_dir=tmp_path,
        )
    assert not (tmp_path / "memory").exists()


def test_on_the_cpu_the_option_records_nothing(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the CPU's case")
    _, result = run_script.train(tmp_path, max_steps=2, oom_snapshot=True)
    assert result.steps == 2 and not (tmp_path / "memory").exists()


def test_the_option_is_a_flag():
    with pytest.raises(TypeError, match=r"run: oom_snapshot must be True or False, got 1 \(int\)"):
        ct.run(run_script.step, run_script.state(), run_script.dataset(), batch_size=8, oom_snapshot=1)
