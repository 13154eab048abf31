"""eval_data that ct.run cannot batch or split is refused before anything is set up, naming the fix."""

import pytest
import run_script
from helpers import snapshot
from run_script import accuracy
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

import composetrain as ct


class Stream(IterableDataset):
    def __init__(self, data):
        self.data = data

    def __iter__(self):
        return iter(self.data)


def run(data, eval_data, **options):
    state = run_script.state()
    before = snapshot(state)
    options = {"max_steps": 2, "eval_every": 2, "num_workers": 0, "progress": False, "eval_step": accuracy, **options}
    return state, before, lambda: ct.run(run_script.step, state, data, eval_data=eval_data, **options)


def test_an_iterable_eval_dataset_is_refused_with_the_fix():
    state, before, call = run(run_script.dataset(), Stream(run_script.dataset(24)), batch_size=12)
    with pytest.raises(TypeError, match=r"run: eval_data is a Stream \(an IterableDataset, without a length\)") as e:
        call()
    assert "DataLoader(eval_data, batch_size=" in str(e.value)
    assert snapshot(state).keys() == before.keys() and state.step == 0


def test_an_iterable_eval_dataset_in_a_dataloader_is_evaluated():
    eval_set = run_script.dataset(24)
    _, _, call = run(run_script.dataset(), DataLoader(Stream(eval_set), batch_size=12), batch_size=12)
    result = call()
    _, _, plain = run(run_script.dataset(), eval_set, batch_size=12)
    assert result.evals == plain().evals


def test_an_eval_dataset_beside_a_batch_sampler_dataloader_is_refused_with_the_fix():
    data = run_script.dataset()
    loader = DataLoader(data, batch_sampler=BatchSampler(SequentialSampler(data), 12, drop_last=False))
    _, _, call = run(loader, run_script.dataset(24))
    with pytest.raises(ValueError, match=r"run: eval_data is a Dataset, which ct.run batches by the training") as e:
        call()
    message = str(e.value)
    assert "batch_sampler=" in message and "give eval_data as a DataLoader" in message
    assert "batch_size" not in message.split(";")[-1] or "DataLoader(" in message.split(";")[-1]
    # the fix works
    _, _, call = run(loader, DataLoader(run_script.dataset(24), batch_size=12))
    assert len(call().evals) == 1
