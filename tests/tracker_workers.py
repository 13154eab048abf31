"""ct.run's on_record on every rank of a processes.Pool (its ranks import this module by name)."""

import os
import tempfile

import run_script

import composetrain as ct


def _run(on_record, directory=None, **options):
    options = {"batch_size": 12, "num_workers": 0, "progress": False, "epochs": 1, "log_every": 1, **options}
    state = run_script.state()
    return state, ct.run(
        ct.distributed(run_script.step),
        state,
        run_script.dataset(),
        checkpoint_dir=directory,
        on_record=on_record,
        **options,
    )


def rank_zero_only(rank, world):
    """Every rank passes a tracker: rank 0's receives each record once, the others' none."""
    got = []
    _, result = _run(got.append)
    return {"got": got, "history": result.history}


def fails_on_rank_zero(rank, world):
    """Rank 0's tracker raises at update 2: every rank stops after it, saved there; rank 0 raises."""

    def tracker(record):
        if record["step"] == 2:
            raise ConnectionError("tracker offline")

    directory = f"{tempfile.gettempdir()}/ct-tracker-{os.getppid()}"
    try:
        state, result = _run(tracker, directory)
    except RuntimeError as e:
        return {"error": str(e), "steps": None, "saved": sorted(os.listdir(directory))}
    return {"error": None, "steps": state.step, "preempted": result.preempted, "saved": result.checkpoint.name}


def blocks_on_rank_zero(rank, world, directory):
    """Rank 0's tracker blocks 8 s on the record of update 2, past the job's timeout of 3 s: both errors name it."""
    import time

    def tracker(record):
        if record["step"] == 2:
            time.sleep(8)

    try:
        _run(tracker, directory, timeout=3.0)
    except RuntimeError as e:
        return str(e)
    return None
