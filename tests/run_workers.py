"""ct.run on every rank of a processes.Pool (its process group already up: ct.run reuses it).

A module of its own, not folded into its test file, because the spawned ranks of ``processes.Pool`` import it by name.
"""

import run_script
import torch

import composetrain as ct


def evaluate(model, batch):
    x, y = batch
    return {"acc": (model(x).argmax(-1) == y).double().mean()}


def two_ranks(rank, world):
    micro_batches = []

    def spy(model, batch):  # accumulate(2): two micro-batches per update, 4 updates per epoch
        micro_batches.append(batch[0][:, 0].tolist())
        return run_script.step(model, batch)

    state = run_script.state()
    result = ct.run(
        ct.distributed(ct.accumulate(2)(spy)),
        state,
        run_script.dataset(),
        batch_size=12,
        epochs=3,
        num_workers=0,
        progress=False,
        eval_step=evaluate,
        eval_data=run_script.dataset(50),
        log_every=4,
        seed=5,
    )
    x, y = run_script.dataset(50).tensors
    state.model.eval()
    with torch.no_grad():
        single = (state.model(x).argmax(-1) == y).double().mean().item()
    return {
        "steps": state.step,
        "params": [p.detach().clone() for p in state.model.parameters()],
        "epoch_firsts": [micro_batches[8 * e] for e in range(3)],
        "evals": result.evals,
        "history": result.history,
        "single_process_eval": single,
    }


def logged_means(rank, world):
    """ct.run's history on every rank, with what each forward saw: the parameters and its micro-batch
    (a model without dropout, so that one process can recompute every loss from them)."""
    from torch import nn

    seen = []

    def spy(model, batch):
        seen.append(([p.detach().clone() for p in model.parameters()], batch))
        return run_script.step(model, batch)

    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 2)).double()
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9))
    result = ct.run(
        ct.distributed(ct.accumulate(2)(spy)),
        state,
        run_script.dataset(),
        batch_size=12,
        epochs=2,
        num_workers=0,
        progress=False,
        log_every=3,
        seed=5,
    )
    return {"history": result.history, "seen": seen, "model": model}


def not_distributed(rank, world):
    ct.run(run_script.step, run_script.state(), run_script.dataset(), batch_size=12, num_workers=0, progress=False)


def signal_one_rank(rank, world):
    """Rank 1 alone gets SIGTERM during its 6th update: both ranks must stop after the same one."""
    import os
    import signal
    import tempfile

    calls = []

    def step(model, batch):
        calls.append(1)
        if rank == 1 and len(calls) == 6:
            os.kill(os.getpid(), signal.SIGTERM)
        return run_script.step(model, batch)

    state = run_script.state()
    with tempfile.TemporaryDirectory() as shared:
        directory = f"{tempfile.gettempdir()}/ct-signal-{os.getppid()}"
        result = ct.run(
            ct.distributed(step),
            state,
            run_script.dataset(),
            batch_size=12,
            epochs=3,
            num_workers=0,
            progress=False,
            checkpoint_dir=directory,
        )
    del shared
    return {"steps": state.step, "preempted": result.preempted, "saved": result.checkpoint.name}


def uneven_loaders(rank, world):
    """Ranks given DataLoaders of different lengths agree on the fewest batches per epoch."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    x, y = run_script.dataset().tensors
    mine = TensorDataset(x[: 48 + 24 * rank], y[: 48 + 24 * rank])  # rank 0: 48 samples, rank 1: 72
    loader = DataLoader(mine, batch_size=12, sampler=DistributedSampler(mine, num_replicas=1, rank=0, seed=1))
    state = run_script.state()
    ct.run(ct.distributed(run_script.step), state, loader, epochs=2, progress=False)
    return state.step


def unwritable(rank, world):
    import tempfile
    from pathlib import Path

    blocker = Path(tempfile.gettempdir()) / f"ct-blocker-{rank}"
    blocker.write_text("")  # each rank names its own file: checkpoint_dir is rank 0's anyway
    try:
        ct.run(
            ct.distributed(run_script.step),
            run_script.state(),
            run_script.dataset(),
            batch_size=12,
            checkpoint_dir=Path(tempfile.gettempdir()) / "ct-blocker-0" / "runs",
            progress=False,
            num_workers=0,
        )
    except PermissionError as e:
        return str(e)
    return "no error"


def _outcome(call):
    """The error a call raised, as text (every rank must raise one, none may hang), or "no error"."""
    try:
        call()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def _run_two(step, **options):
    options = {"batch_size": 12, "num_workers": 0, "progress": False, "epochs": 1, **options}
    return ct.run(ct.distributed(step), run_script.state(), run_script.dataset(), **options)


def eval_names_differ(rank, world):
    def unequal(model, batch):
        return {**evaluate(model, batch), **({"extra": 1.0} if rank == 1 else {})}

    return _outcome(lambda: _run_two(run_script.step, eval_step=unequal, eval_data=run_script.dataset(50)))


def eval_fails_on_one_rank(rank, world):
    def fails(model, batch):
        if rank == 1:
            raise RuntimeError("the eval step broke")
        return evaluate(model, batch)

    return _outcome(lambda: _run_two(run_script.step, eval_step=fails, eval_data=run_script.dataset(50)))


def train_names_differ(rank, world):
    def unequal(model, batch):
        loss, metrics = run_script.step(model, batch)
        return loss, {**metrics, **({"extra": 1.0} if rank == 1 else {})}

    return _outcome(lambda: _run_two(unequal, log_every=2))


def stop_inside_a_window(rank, world):
    return _run_two(run_script.step, max_steps=3, log_every=50).history


def hang(rank, world):
    """A rank stuck for good (in a collective, say)."""
    import time

    time.sleep(600)


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
