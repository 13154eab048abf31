"""ct.run on every rank of a dist_pool.Pool (its process group already up: ct.run reuses it)."""

import run_script
import torch

import composetrain as ct


def evaluate(model, batch):
    x, y = batch
    return {"acc": (model(x).argmax(-1) == y).double().mean()}


def two_ranks(rank, world):
    first_batches = []

    def spy(model, batch):
        if len(first_batches) < 3 and (not first_batches or spy.calls % 4 == 0):
            first_batches.append(batch[0][:, 0].tolist())
        spy.calls += 1
        return run_script.step(model, batch)

    spy.calls = 0
    state = run_script.state()
    result = ct.run(
        ct.distributed(ct.accumulate(2)(spy)), state, run_script.dataset(), batch_size=12, epochs=3, num_workers=0,
        progress=False, eval_step=evaluate, eval_data=run_script.dataset(50), log_every=4, seed=5,
    )  # fmt: skip
    x, y = run_script.dataset(50).tensors
    state.model.eval()
    with torch.no_grad():
        single = (state.model(x).argmax(-1) == y).double().mean().item()
    return {
        "steps": state.step,
        "params": [p.detach().clone() for p in state.model.parameters()],
        "first_batches": first_batches,
        "evals": result.evals,
        "history": result.history,
        "single_process_eval": single,
    }


def not_distributed(rank, world):
    ct.run(run_script.step, run_script.state(), run_script.dataset(), batch_size=12, num_workers=0, progress=False)
