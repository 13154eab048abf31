"""What ct.run's checkpoints can be trusted with: a diverged (non-finite) model never replaces the last finite
checkpoint, and a file changed on disk after it was written (a flipped byte) is found by its checksum and set aside,
the run resuming from the previous checkpoint."""

import math

import pytest
import run_script
import torch
from helpers import assert_states_equal
from hypothesis import given
from hypothesis import strategies as st

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
    with pytest.raises(
        FloatingPointError,
        match=r"refusing to save checkpoint step 8: the model's parameter "
        r"'0.weight' holds NaN or inf.* the last checkpoint step-000000006 is kept",
    ):
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
    messages = pool.run(__name__, "diverges_on_rank_one", str(tmp_path), timeout=90)
    assert all(m is not None and "refusing to save checkpoint step 6" in m and "on rank 1" in m for m in messages)
    assert all("the last checkpoint step-000000004 is kept" in m for m in messages)
    assert steps(tmp_path) == ["step-000000004"]


def flip_a_bit_of(path, tensor):
    """Flip the lowest bit of ``tensor``'s first element where its bytes lie in ``path`` (torch.load notices not)."""
    data = bytearray(path.read_bytes())
    raw = tensor.contiguous().numpy().tobytes()
    at = data.find(raw)
    assert at >= 0 and data.find(raw, at + 1) < 0
    data[at] ^= 1
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damaged", ["state.pt", "rank-0.pt"])
def test_a_flipped_bit_in_a_checkpoint_file_is_found_and_the_previous_checkpoint_resumes(tmp_path, damaged):
    """One bit of a momentum buffer (state.pt) or of the Python generator's state (rank-0.pt) changed after the
    save: the file still loads, but its checksum does not match: set aside, with a warning, and the run resumes
    exactly from the checkpoint before."""
    straight, _ = train(tmp_path / "a", epochs=3, log_every=3)
    train(tmp_path / "b", epochs=2, log_every=3)
    newest = tmp_path / "b" / "step-000000016"
    saved = torch.load(newest / damaged, weights_only=True)
    tensor = saved["state"]["optimizer"]["state"][0]["momentum_buffer"] if damaged == "state.pt" else None
    tensor = tensor if tensor is not None else saved["rng"]["python"]["words"]
    flip_a_bit_of(newest / damaged, tensor)
    assert torch.load(newest / damaged, weights_only=True) is not None  # loads, silently off
    with pytest.warns(
        UserWarning,
        match=rf"skipping unreadable checkpoint .*step-000000016: {damaged} does not "
        "match the checksum written with it",
    ):
        resumed, _ = train(tmp_path / "b", epochs=3, log_every=3)
    assert_states_equal(resumed, straight)
    assert [p.name for p in (tmp_path / "b").glob("corrupt-*")] == ["corrupt-step-000000016"]


def test_load_checkpoint_refuses_a_flipped_bit(tmp_path):
    train(tmp_path, epochs=1)
    folder = tmp_path / "step-000000008"
    saved = torch.load(folder / "state.pt", weights_only=True)
    flip_a_bit_of(folder / "state.pt", saved["state"]["model"]["0.weight"])
    with pytest.raises(ValueError, match=r"not a readable ct\.run checkpoint: state\.pt does not match the checksum"):
        ct.load_checkpoint(run_script.state(), folder)


def test_a_checkpoint_of_format_2_loads_without_checksums_and_one_of_format_3_needs_them(tmp_path):
    """Format 2 was written before checksums: it resumes as it did. Format 3 without its checksums.json: corrupt."""
    straight, _ = train(tmp_path / "a", epochs=2)
    train(tmp_path / "b", epochs=1)
    folder = tmp_path / "b" / "step-000000008"
    saved = torch.load(folder / "state.pt", weights_only=True)
    torch.save({**saved, "format": 2}, folder / "state.pt")
    (folder / "checksums.json").unlink()
    resumed, _ = train(tmp_path / "b", epochs=2)
    assert_states_equal(resumed, straight)
    train(tmp_path / "c", epochs=1)
    (tmp_path / "c" / "step-000000008" / "checksums.json").unlink()
    with (
        pytest.warns(UserWarning, match="step-000000008: it lacks checksums.json, which every checkpoint of format 3"),
        pytest.raises(RuntimeError, match=r"no checkpoint in .* could be read"),  # the only one: not started over
    ):
        train(tmp_path / "c", epochs=1)


def test_a_checksum_list_nested_too_deep_for_json_is_a_corrupt_checkpoint(tmp_path):
    """``[[[[...`` makes json.loads raise RecursionError, no ValueError: the checkpoint is corrupt, set aside, and
    the run resumes from the one before, exactly (no RecursionError out of ct.run)."""
    straight, _ = train(tmp_path / "a", epochs=3)
    train(tmp_path / "b", epochs=2)
    (tmp_path / "b" / "step-000000016" / "checksums.json").write_text("[" * 100_000)
    with pytest.warns(UserWarning, match=r"step-000000016: its checksums.json is unreadable \(RecursionError\)"):
        resumed, _ = train(tmp_path / "b", epochs=3)
    assert_states_equal(resumed, straight)
    assert [p.name for p in (tmp_path / "b").glob("corrupt-*")] == ["corrupt-step-000000016"]


# -- run on every rank of the pool (its ranks import this module by name) ----------------------------------------


def diverges_on_rank_one(rank, world, directory):
    """Rank 1 alone finds a NaN parameter from update 5 on (as a sharded rank finds its shard alone): every rank
    refuses the save at 6 alike, none hangs in the save's collectives."""
    import composetrain.driver.run as driver

    state = run_script.state()
    original = driver._nonfinite
    if rank == 1:
        driver._nonfinite = lambda model: "0.weight" if state.step >= 5 else None
    try:
        ct.run(
            ct.distributed(run_script.step),
            state,
            run_script.dataset(),
            batch_size=12,
            max_steps=8,
            num_workers=0,
            progress=False,
            checkpoint_dir=f"{directory}",
            checkpoint_every=2,
            keep_checkpoints=1,
        )
    except FloatingPointError as e:
        return str(e)
    finally:
        driver._nonfinite = original  # the pool's ranks run the file's other cases next
    return None


@given(
    shape=st.lists(st.integers(0, 4), max_size=3),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.complex64]),
    bad=st.lists(st.tuples(st.integers(0, 63), st.sampled_from([math.nan, math.inf, -math.inf])), max_size=2),
    imaginary=st.booleans(),
)
def test_the_save_time_finiteness_check_is_isfinite_all(shape, dtype, bad, imaginary):
    """The check a save makes of every parameter (its smallest and largest values) says what isfinite().all() says."""
    from composetrain.driver.run import _finite

    t = torch.randn(shape, generator=torch.Generator().manual_seed(len(bad))).to(dtype)
    flat = t.view(-1)
    for at, value in bad:
        if flat.numel():
            flat[at % flat.numel()] = complex(0, value) if imaginary and dtype.is_complex else value
    assert bool(_finite(t)) == bool(torch.isfinite(t).all())
