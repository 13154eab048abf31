"""What each rank of a 2-process pool runs for test_checkpoint_folder_hostile.py (module name and function)."""

import errno
from pathlib import Path

import run_script

import composetrain as ct
from composetrain.driver import checkpoint


def save_fails_on(rank, world, folder, bad_rank, code):
    """ct.run on ``folder``, where ``bad_rank``'s writes fail with OSError ``code``: (error text, errno)."""
    real = checkpoint._write

    def failing(obj, path):
        if rank == bad_rank:
            raise OSError(code, "refused", str(path))
        return real(obj, path)

    checkpoint._write = failing
    try:
        ct.run(
            ct.distributed(run_script.step), run_script.state(), run_script.dataset(), batch_size=12,
            checkpoint_dir=Path(folder), progress=False, num_workers=0, max_steps=2,
        )  # fmt: skip
    except OSError as e:
        return str(e), e.errno
    finally:
        checkpoint._write = real
    return "no error", None


__all__ = ["errno", "save_fails_on"]
