"""What each rank of a 2-process pool runs for test_checkpoint_folder.py (module name and function).

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

from pathlib import Path

import run_script

import composetrain as ct


def run_in(rank, world, folder):
    """ct.run on ``folder`` on every rank: the error each rank raised, as text, or "no error"."""
    try:
        ct.run(
            ct.distributed(run_script.step),
            run_script.state(),
            run_script.dataset(),
            batch_size=12,
            checkpoint_dir=Path(folder),
            progress=False,
            num_workers=0,
            max_steps=2,
        )
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"
