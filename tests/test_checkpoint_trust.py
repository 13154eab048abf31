"""What ct.run's checkpoints can be trusted with: a diverged (non-finite) model never replaces the last finite
checkpoint, and a file changed on disk after it was written (a flipped byte) is found by its checksum and set aside,
the run resuming from the previous checkpoint."""

import pytest
import run_script
import torch
from helpers import assert_states_equal

import composetrain as ct

OPTIONS = {"batch_size": 12, "num_workers": 0, "progress": False, "seed": 5, "log_every": 4}


def train(tmp, step=run_script.step, **options):
    state = run_script.state()
    result = ct.run(step, state, run_script.dataset(), checkpoint_dir=tmp, **{**OPTIONS, **options})
    return state, result


def diverging(at):
    """run_script's step, whose loss turns NaN in its ``at``-th call: the update makes every weight it reaches NaN."""
    calls = []

    def step(model, batch):
        calls.append(1)
        loss, metrics = run_script.step(model, batch)
        return (loss * float("nan") if len(calls) == at else loss), metrics

    return step


def steps(folder):
    return sorted(p.name for p in folder.glob("step-*"))


def test_a_diverged_model_is_never_saved_and_the_finite_checkpoints_stay(tmp_path):
    """NaN weights from update 7 on (no mixed_precision skips the update): the save at 8 is refused with an error
    naming the parameter, and keep_checkpoints=2 deletes nothing: the run resumes from 6, finite."""
    straight, _ = train(tmp_path / "a", max_steps=12, checkpoint_every=2, keep_checkpoints=2)
    with pytest.raises(FloatingPointError, match=r"refusing to save checkpoint step 8: the model's parameter "
                       r"'0.weight' holds NaN or inf.* the last checkpoint step-000000006 is kept"):  # fmt: skip
        train(tmp_path / "b", diverging(7), max_steps=12, checkpoint_every=2, keep_checkpoints=2)
    assert steps(tmp_path / "b") == ["step-000000004", "step-000000006"]
    saved = torch.load(tmp_path / "b" / "step-000000006" / "state.pt", weights_only=True)
    assert all(torch.isfinite(t).all() for t in saved["state"]["model"].values())
    resumed, _ = train(tmp_path / "b", max_steps=12, checkpoint_every=2, keep_checkpoints=2)
    assert_states_equal(resumed, straight)


def test_a_diverged_model_is_refused_before_the_first_checkpoint_too(tmp_path):
    with pytest.raises(FloatingPointError, match="there is no checkpoint yet"):
        train(tmp_path, diverging(1), max_steps=4, checkpoint_every=2)
    assert steps(tmp_path) == []


def test_an_inf_buffer_is_no_divergence(tmp_path):
    """A buffer may hold inf by design (an attention mask): only parameters are checked."""
    state = run_script.state()
    state.model.register_buffer("mask", torch.full((2,), float("-inf"), dtype=torch.float64))
    ct.run(run_script.step, state, run_script.dataset(), checkpoint_dir=tmp_path, max_steps=2, **OPTIONS)
    assert steps(tmp_path) == ["step-000000002"]


def test_every_rank_refuses_the_save_when_one_rank_diverged(pool, tmp_path):
    messages = pool.run("run_workers", "diverges_on_rank_one", str(tmp_path), timeout=90)
    assert all(m is not None and "refusing to save checkpoint step 6" in m and "on rank 1" in m for m in messages)
    assert all("the last checkpoint step-000000004 is kept" in m for m in messages)
    assert steps(tmp_path) == ["step-000000004"]
