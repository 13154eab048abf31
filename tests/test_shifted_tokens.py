"""ct.shifted_tokens: token weights for a loss that shifts its labels inside, against the textbook large batch.

The model here shifts as Hugging Face causal LMs do (``logits[:, :-1]`` against ``labels[:, 1:]``), without
needing transformers; tests/test_hf.py runs the same comparison on a real GPT-2, also across ranks.
"""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import composetrain as ct

VOCAB, LENGTH, PAD = 11, 9, -100


class ShiftingLM(nn.Module):
    """A causal LM whose forward, given labels, returns the mean loss over the shifted real labels (as HF's)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 6)
        self.mix = nn.Linear(6, 6)
        self.head = nn.Linear(6, VOCAB)

    def forward(self, input_ids, labels):
        h = self.emb(input_ids)
        h = torch.tanh(self.mix(h.cumsum(1)))  # each position sees the tokens before it
        logits = self.head(h)
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=PAD)


def step(model, batch):
    return model(batch["input_ids"], batch["labels"])


def padded_batch(lengths, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, VOCAB, (len(lengths), LENGTH), generator=g)
    labels = ids.clone()
    for i, n in enumerate(lengths):
        labels[i, n:] = PAD
    return {"input_ids": ids, "labels": labels}


def textbook(model, batches, lr):
    """One loss averaged over every predicted real token of the whole batch, one SGD step per batch."""
    for batch in batches:
        model.zero_grad(set_to_none=True)
        h = torch.tanh(model.mix(model.emb(batch["input_ids"]).cumsum(1)))
        logits = model.head(h)[:, :-1]
        targets = batch["labels"][:, 1:]
        real = targets != PAD
        losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none", ignore_index=PAD)
        (losses.sum() / real.sum()).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad


def twin(seed):
    torch.manual_seed(seed)
    model = ShiftingLM().double()
    ref = ShiftingLM().double()
    ref.load_state_dict(model.state_dict())
    return model, ref


@settings(max_examples=40, deadline=None)
@given(
    lengths=st.lists(st.integers(2, LENGTH), min_size=1, max_size=12),
    n=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_accumulate_with_shifted_tokens_is_the_textbook_large_batch_update(lengths, n, seed):
    batches = [padded_batch(lengths, seed + i) for i in range(2)]
    model, ref = twin(seed)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.5))
    train = ct.accumulate(n, weight=ct.shifted_tokens())(step)
    for batch in batches:
        train(state, batch)
    textbook(ref, batches, 0.5)
    for (key, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=key)


def test_counting_the_first_label_is_measurably_wrong():
    """The old recipe's count, (labels != -100).sum(), weighs uneven micro-batches wrongly: what the helper fixes."""
    batch = padded_batch([2, 2, 9, 9], seed=3)  # short sequences in the first micro-batch, long in the second
    model, ref = twin(0)
    naive, _ = twin(0)
    good = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.5))
    bad = ct.TrainState(naive, torch.optim.SGD(naive.parameters(), lr=0.5))
    ct.accumulate(2, weight=ct.shifted_tokens())(step)(good, batch)
    ct.accumulate(2, weight=lambda b: (b["labels"] != PAD).sum())(step)(bad, batch)
    textbook(ref, [batch], 0.5)
    start, _ = twin(0)
    moved = torch.cat([(q - s).flatten() for q, s in zip(ref.parameters(), start.parameters(), strict=True)])
    off = torch.cat([(p - q).flatten() for p, q in zip(naive.parameters(), ref.parameters(), strict=True)])
    exact = torch.cat([(p - q).flatten() for p, q in zip(model.parameters(), ref.parameters(), strict=True)])
    assert off.norm() / moved.norm() > 1e-2  # a visible error in the update
    assert exact.norm() / moved.norm() < 1e-12


def test_tuple_batches_take_an_index_and_other_ignore_indices():
    labels = torch.tensor([[5, 1, -1, -1], [2, 3, 4, -1]])
    assert ct.shifted_tokens(1, ignore_index=-1)((None, labels)).item() == 1 + 2
    assert ct.shifted_tokens()({"labels": labels}).item() == 3 + 3  # -1 is a token when -100 is ignored
    assert repr(ct.shifted_tokens(1, ignore_index=-1)) == "shifted_tokens(1, ignore_index=-1)"
    assert repr(ct.accumulate(2, weight=ct.shifted_tokens())) == "accumulate(2, weight=shifted_tokens('labels'))"


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((1.0,), {}, TypeError, r"shifted_tokens: labels_key must be a key \(str\).*got 1.0"),
        ((True,), {}, TypeError, "labels_key must be"),
        ((), {"ignore_index": -100.0}, TypeError, r"shifted_tokens: ignore_index must be an int.*got -100.0"),
    ],
)
def test_bad_arguments_are_refused_when_built(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        ct.shifted_tokens(*args, **kwargs)


@pytest.mark.parametrize(
    ("weight", "batch", "error", "match"),
    [
        (ct.shifted_tokens(), {"label": torch.zeros(2, 3, dtype=torch.long)}, KeyError, "no 'labels'; its keys are"),
        (ct.shifted_tokens(2), (torch.zeros(2, 3), torch.zeros(2, 3)), IndexError, "holds 2 items, no index 2"),
        (ct.shifted_tokens(), (torch.zeros(2, 3),), TypeError, "a dict batch takes a key"),
        (ct.shifted_tokens(), {"labels": torch.zeros(2, 3)}, TypeError, "must be an integer tensor"),
        (ct.shifted_tokens(), {"labels": torch.zeros(3, dtype=torch.long)}, ValueError, r"\(batch, sequence\)"),
        (
            ct.shifted_tokens(),
            {"labels": torch.ones(2, 3, dtype=torch.bool)},
            TypeError,
            r"integer tensor, got a torch.bool tensor",
        ),
    ],
)
def test_a_batch_without_usable_labels_is_refused_naming_the_fix(weight, batch, error, match):
    with pytest.raises(error, match=match):
        weight(batch)


def test_a_micro_batch_with_nothing_to_predict_is_refused_not_divided_by_zero():
    """Sequences of one real token predict nothing: the count is 0, which accumulate refuses before any forward."""
    batch = padded_batch([1, 1, 5, 5], seed=0)
    model, _ = twin(0)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.5))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match="weight"):
        ct.accumulate(2, weight=ct.shifted_tokens())(step)(state, batch)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])


def test_one_label_per_sequence_is_told_to_weigh_by_sequences_not_to_add_a_dimension():
    """(batch,) labels are a sequence classifier's: its loss is a mean over sequences, so accumulate(n) without a
    weight is exact; labels[None] would count a (1, batch) "sequence" and weigh micro-batches wrongly."""
    with pytest.raises(ValueError, match=r"one label per sequence .*leave weight out: accumulate\(n\)") as error:
        ct.shifted_tokens()({"labels": torch.tensor([0, 2, 1])})
    assert "labels[None]" not in str(error.value)


def test_a_negative_index_finds_the_labels_as_indexing_the_batch_does():
    """issue 30.7: labels last in a tuple batch, shifted_tokens(-1): batch[-1], through accumulate too."""
    padded = padded_batch([2, 3, 9, 9, 5], seed=4)
    batch = (padded["input_ids"], padded["input_ids"] != 0, padded["labels"])
    assert ct.shifted_tokens(-1)(batch).item() == ct.shifted_tokens(2)(batch).item() == (1 + 2 + 8 + 8 + 4)
    assert ct.shifted_tokens(-3, ignore_index=PAD)(batch[::-1]).item() == 1 + 2 + 8 + 8 + 4
    with pytest.raises(IndexError, match=r"shifted_tokens\(-4\): the batch holds 3 items, no index -4"):
        ct.shifted_tokens(-4)(batch)
    model, ref = twin(1)
    state = ct.TrainState(model, torch.optim.SGD(model.parameters(), lr=0.5))
    ct.accumulate(2, weight=ct.shifted_tokens(-1))(lambda m, b: m(b[0], b[-1]))(state, batch)
    textbook(ref, [padded], 0.5)
    for (key, p), q in zip(model.state_dict().items(), ref.state_dict().values(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-10, atol=1e-12, msg=key)
