"""What each rank of a 2-process pool runs for test_checkpoint_folder_hostile.py (module name and function)."""

import errno
from pathlib import Path

import run_script

import composetrain as ct
from composetrain.checkpoint import files as checkpoint


def save_fails_on(rank, world, folder, bad_rank, code):
    """ct.run on ``folder``, where ``bad_rank``'s writes fail with OSError ``code``: (error text, errno)."""
    real = checkpoint._write

    def failing(obj, path):
        if rank == bad_rank and code is None:
            raise RuntimeError("odd")
        if rank == bad_rank:
            raise OSError(code, "refused", str(path))
        return real(obj, path)

    checkpoint._write = failing
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
    except OSError as e:
        return str(e), e.errno
    except RuntimeError as e:
        return f"RuntimeError: {e}", None
    finally:
        checkpoint._write = real
    return "no error", None


def read_denied_on(rank, world, folder, bad_rank):
    """ct.run twice on ``folder``; the second's ``bad_rank`` may not read its rank file: the error text."""
    import torch

    def run():
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

    run()
    real = torch.load

    def denied(path, *args, **kwargs):
        if rank == bad_rank and str(path).endswith(f"rank-{rank}.pt"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, *args, **kwargs)

    torch.load = denied
    try:
        run()
    except PermissionError as e:
        return str(e)
    finally:
        torch.load = real
    return "no error"
